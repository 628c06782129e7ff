//! The soft-RoCE VM harness end to end: `scripts/rxe-vm.sh run scripts/vm/smoke.sh` boots
//! Debian's kernel in qemu (TCG), brings up rxe0, runs rping, starts the host-built riser in
//! the guest and has the Linux kernel initiator log in to it over iSCSI/TCP and verify 4 MiB
//! written and read back through /dev/sdX.
//!
//! Slow (tens of seconds warm; the first run also installs packages and fetches the kernel,
//! which needs root and Debian's package registry). It never skips: a missing qemu, kernel or
//! package is a failure with the reason in the output.

use std::process::Command;
use std::time::Instant;

use riser_tests::{bin, bin_dir, workspace_root};

#[test]
fn rxe_vm_smoke() {
    let root = workspace_root();
    // The guest runs the host-built binaries: fail here, with the fix, if they are missing.
    bin("riser");
    bin("riser-rpc");
    let bins = bin_dir().canonicalize().expect("the binaries' directory");

    let start = Instant::now();
    // One stream (2>&1) so rxe-vm.sh's own messages stay in order with the guest's console.
    let out = Command::new("bash")
        .args(["-c", "exec scripts/rxe-vm.sh run scripts/vm/smoke.sh 2>&1"])
        .current_dir(&root)
        .env("RISER_BIN_DIR", &bins)
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash scripts/rxe-vm.sh: {e}"));
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);

    assert!(
        out.status.success(),
        "scripts/rxe-vm.sh run scripts/vm/smoke.sh failed ({}) after {took:.0?}:\n{text}",
        out.status
    );
    // Belt and braces: a zero status must come with the script's own last word.
    assert!(text.contains("\nSMOKE OK\n"), "no SMOKE OK in the guest's output after {took:.0?}:\n{text}");
    // Shown with --nocapture.
    println!("{text}\nrxe_vm_smoke: {took:.1?}");
}
