//! riser-perf's own iSER initiator (iser:// URLs) in the soft-RoCE VM
//! (`scripts/rxe-vm.sh run scripts/vm/perf-iser.sh`, see that script): `--verify` over iSER
//! against riser and against the kernel's LIO/isert in the same boot, with 4 KiB and 256 KiB
//! I/Os, zero mismatches; then a block of a LIO fileio LUN overwritten behind riser-perf's
//! back must be reported by a `--verify-only` pass, with its LBA, and a non-zero exit. The
//! script also prints riser-perf's 4 KiB random read QD 32 IOPS against both targets (for the
//! notes, not asserted).
//!
//! Slow: a few minutes under TCG. Run with
//! `cargo test -p riser-tests --test rxe_vm_perf -- --nocapture` (builds nothing: the
//! host-built riser, riser-rpc and riser-perf must be in target/debug or $RISER_BIN_DIR).

use riser_tests::perf_out::abort_counts;
use riser_tests::vm::vm_run;

/// Two vCPUs: riser's reactor on one, riser-perf's client thread on the other.
const SMP: u32 = 2;

#[test]
fn rxe_vm_perf_iser_verify_riser_and_lio() {
    let run = vm_run("scripts/vm/perf-iser.sh", SMP, &["riser", "riser-rpc", "riser-perf"]);
    let out = run.expect_ok("PERF ISER OK");
    let lines: Vec<&str> = out.lines().collect();
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    for (target, kib) in [("riser", 4), ("riser", 256), ("riser", 1024), ("riser", 16384), ("riser", 32768), ("LIO", 4), ("LIO", 256)] {
        let p = format!("perf-iser: {target} verify {kib}k: PASSED, ");
        assert!(has(&p), "no `{p}...` line:\n{out}");
    }
    assert!(has("perf-iser: LIO-fileio verify 4k: PASSED, "), "{out}");
    assert!(has("perf-iser: 16 and 32 MiB I/Os over iSER streamed: "), "{out}");
    assert!(
        has("perf-iser: injected mismatch reported: MISMATCH LBA 5000: "),
        "the injected mismatch was not reported with its LBA:\n{out}"
    );
    let iops = lines
        .iter()
        .find(|l| l.starts_with("perf-iser: IOPS riser-perf iser:// randread 4 KiB QD 32"))
        .unwrap_or_else(|| panic!("no IOPS line:\n{out}"));
    println!("{iops}");
}

/// iSER by the book (issue "iSER by the book"): a queue-depth-256 session at full depth with
/// immediate data, 4 KiB and 64 KiB verified, without one RNR NAK (the receive ring is sized
/// from the negotiated queue depth); LOGICAL UNIT RESETs from the Linux initiator with its
/// writes in flight over iSER (ITTs reused after) while riser-perf loads and verifies LUN 1;
/// everything read back identical afterwards. Then ABORT TASK under load over iSER:
/// riser-perf's randread QD 32 with an ABORT TASK right after every 7th command
/// (`--abort-every`, the aborted tasks' ITTs reused): every one answered, at least one
/// Function complete, never a response for an aborted task; 16 MiB written and verified after.
#[test]
fn rxe_vm_iser_full_depth_and_lun_reset_under_load() {
    let run = vm_run("scripts/vm/iser-tmf.sh", SMP, &["riser", "riser-rpc", "riser-perf"]);
    let out = run.expect_ok("ISER TMF OK");
    assert!(out.contains("RNR NAKs during the QD 256 runs: 0"), "{out}");
    assert!(out.contains("16 MiB written through LUN resets over iSER, read back identical"), "{out}");
    for label in [
        "qd256-4k",
        "qd256-64k",
        "after-tmf-lun1",
        "after-tmf-lun0",
        "after-abort-16m",
        "after-abort-readback",
    ] {
        assert!(out.contains(&format!("{label}: verify: ")), "no {label} verify line:\n{out}");
    }
    let c = abort_counts(&out, "abort-iser: aborts: ");
    println!("ABORT TASK over iSER: {c:?}");
    let n = |name: &str| c.get(name);
    assert!(n("sent") > 0, "no ABORT TASK sent:\n{out}");
    assert_eq!(n("sent"), n("function complete") + n("task does not exist"), "{out}");
    assert!(n("function complete") >= 1, "no ABORT TASK answered Function complete:\n{out}");
    assert_eq!(n("responses for aborted tasks"), 0, "{out}");
    assert_eq!(n("errors"), 0, "{out}");
}
