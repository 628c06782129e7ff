//! NVMe in the soft-RoCE VM (qemu's emulated NVMe controller, `-device nvme`, backed by a file
//! with cache=none; the guest's nvme driver with `nvme.poll_queues=2`): scripts/vm/nvme.sh in
//! two boots that share the backing file and the results directory.
//!
//! First boot: riser attaches the controller (bdev_nvme_attach_controller by PCI address) and
//! serves its namespace over iSER and TCP; (a) riser-perf --verify over iSER, and proof that
//! the I/O went by io_uring passthrough on the driver's poll queues (riser's log and
//! bdev_get_bdevs: io_path passthrough+iopoll, every command reaped by polling; the kernel's
//! I/O queues' interrupts do not move); (b) libiscsi's compliance suite on the NVMe LUN, the
//! suites that reach the device, one CDB size of each family (16 of 51 suites, 93 of 230
//! tests: reads, writes, verify, compare, write same, unmap, LBA status, sanitize, copy; the
//! rest test the layers above the bdev or other CDB sizes of the same calls and run in full on
//! the host, and all of it takes too long under TCG): 0 failed, skips not
//! above the malloc LUN's (23, test/tests/compliance.rs);
//! (c) Linux ib_iser, ext4, a file tree, `sync`, save_config, then the VM is cut off with
//! sysrq b while unsynced writes run. Second boot: riser from the saved config, mount and
//! fsck clean, every synced file's checksum identical.
//!
//! Slow (two boots under TCG and the whole compliance suite); never skips: a VM without NVMe
//! or poll queues fails with the reason.

use riser_tests::vm::vm_run;

const BINS: &[&str] = &["riser", "riser-rpc", "riser-perf"];

/// Skips of libiscsi's suite on a malloc LUN with the defaults (test/tests/compliance.rs).
const MALLOC_SKIPS: usize = 23;

#[test]
fn rxe_vm_nvme_passthrough_compliance_and_crash() {
    // Both boots use one results directory: the NVMe backing file and what the first boot
    // saved for the second. rxe-vm.sh reads it from the environment; this is the only test
    // of this binary, so setting it here races with nothing.
    let dir = std::env::temp_dir().join(format!("riser-vm-nvme.{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("results directory");
    std::env::set_var("RISER_VM_OUT", &dir);
    // 128 MiB: riser's GET LBA STATUS on a device without an allocation map (NVMe) reads at
    // most 128 MiB per command (lib/scsi LBA_STATUS_MAX_SCAN_BYTES), and libiscsi's
    // Sanitize.BlockErase wants one answer that covers the whole LUN.
    std::env::set_var("RISER_VM_NVME_MIB", "128");
    // The compliance subset alone takes several minutes under TCG.
    if std::env::var_os("RISER_VM_TIMEOUT").is_none() {
        std::env::set_var("RISER_VM_TIMEOUT", "2400");
    }

    let first = vm_run("scripts/vm/nvme.sh first", 2, BINS);
    let t = &first.text;
    assert!(first.success, "first boot failed ({}):\n{t}", first.status);
    first.expect_line("NVME FIRST OK");
    for bs in [4096, 262144, 1048576] {
        assert!(t.contains(&format!("nvme: verify {bs}: PASSED")), "verify {bs}:\n{t}");
    }
    assert!(t.contains("nvme: I/O path passthrough+iopoll: "), "{t}");
    let line = t
        .lines()
        .find(|l| l.starts_with("nvme compliance: ran "))
        .unwrap_or_else(|| panic!("no compliance summary:\n{t}"));
    let num = |key: &str| -> i64 {
        let after = line.split(key).nth(1).unwrap_or_else(|| panic!("no {key} in {line}"));
        after.trim_start().split(|c: char| !c.is_ascii_digit() && c != '-').next().and_then(|s| s.parse().ok()).unwrap_or(-1)
    };
    assert!(num("ran ") >= 90, "the suite did not run: {line}\n{t}");
    assert_eq!(num("failed "), 0, "{line}\n{t}");
    let skipped = num("skipped ");
    assert!((0..=MALLOC_SKIPS as i64).contains(&skipped), "{skipped} skips (the malloc LUN has {MALLOC_SKIPS}): {line}");
    assert!(t.contains("files synced on /dev/"), "{t}");

    let second = vm_run("scripts/vm/nvme.sh second", 2, BINS);
    let t2 = &second.text;
    assert!(second.success, "second boot failed ({}):\n{t2}", second.status);
    second.expect_line("NVME CRASH OK");
    assert!(t2.contains("after the cut: fsck clean,"), "{t2}");
    let _ = std::fs::remove_dir_all(&dir);
}
