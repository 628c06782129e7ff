//! libiscsi's compliance suite (`iscsi-test-cu --dataloss -t ALL`) against the real riser
//! over TCP, run exactly as a user would: one URL, the same URL twice (MultipathIO), and a
//! LUN other than 0 of a two-LUN target. Zero failures everywhere.
//!
//! LUN 0 is a malloc LUN with riser's `removable` option (as tgt's `removable=1`), which is
//! what the suite's removable-medium tests (PreventAllow.*, StartStopUnit.*) need to run
//! rather than skip: on it fewer than 20 tests skip. LUN 1 is a malloc LUN with the defaults,
//! the way most people export one: zero failures there too, with one URL and with two. The
//! number of skips of each run is capped at what it is today, so a test that starts skipping
//! is noticed. Then, on the same riser, the suite on a file LUN (`bdev_uring_create` on a
//! sparse file): O_DIRECT I/O, holes punched by UNMAP and reported by GET LBA STATUS.

use riser_tests::compliance::{run_tests, Outcome};
use riser_tests::files::DiskDir;
use riser_tests::{free_port, json, Riser};

fn run_suite(urls: &[&str]) -> Outcome {
    run_tests("ALL", urls)
}

fn check(label: &str, o: &Outcome, riser: &Riser, max_skipped: usize) {
    eprintln!(
        "compliance [{label}]: ran {}, passed {}, failed {}, skipped {} {:?}",
        o.ran,
        o.passed,
        o.failed,
        o.skipped.len(),
        o.skipped
    );
    fn check_ran(label: &str, o: &Outcome, at_least: u32) {
        assert!(o.ran >= at_least, "[{label}] the suite did not run (ran {}):\n{}", o.ran, o.output);
    }
    check_ran(label, o, if label.contains("ReadOnly") { 1 } else { 200 });
    assert_eq!(
        o.failed, 0,
        "[{label}] failed tests {:?}\n--- suite output (tail) ---\n{}\n--- riser log (tail) ---\n{}",
        o.failed_tests,
        tail(&o.output, 150),
        tail(&riser.log(), 80)
    );
    // The skips left need a write-protected LUN (ReadOnly), SANITIZE OVERWRITE (off: it would
    // write every block of the LUN), more than one logical block per physical block, or two
    // URLs (MultipathIO).
    assert!(o.skipped.len() <= max_skipped, "[{label}] {} tests skipped (at most {max_skipped}): {:?}", o.skipped.len(), o.skipped);
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn libiscsi_compliance_suite_passes() {
    let riser = Riser::start();
    let port = free_port();
    // Malloc LUNs (512-byte blocks, physically too: riser does not claim a larger physical
    // block than the device has); LUN 0 removable, LUN 1 with the defaults.
    let iqn = riser.add_iscsi_target_luns("compliance", port, &[(64, json!({"removable": true})), (64, json!({}))]);
    // A write-protected LUN on a target of its own, for the ReadOnly suite (it skips on a
    // writable LUN).
    let ro_iqn = riser.add_iscsi_target_luns("compliance-ro", port, &[(16, json!({"read_only": true}))]);
    let lun0 = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let lun1 = format!("iscsi://127.0.0.1:{port}/{iqn}/1");

    // On the removable LUN the 9 removable-medium tests run (on LUN 1 they skip: 23 skips).
    let single = run_suite(&[&lun0]);
    check("LUN 0, removable", &single, &riser, 14);
    // MultipathIO on the default LUN: on the removable one, PreventAllow.2ITNexuses cannot
    // pass in an ALL run with two URLs, because libiscsi keeps the second session logged in
    // through the suite: PreventAllow.LUNReset, just before, leaves it the LUN reset unit
    // attention that SAM-5 requires on every I_T nexus (and that MultipathIO.Reset checks
    // for), and 2ITNexuses expects its first command there to see no unit attention.
    let multipath = run_suite(&[&lun1, &lun1]);
    check("LUN 1 twice (MultipathIO)", &multipath, &riser, 19);
    let other = run_suite(&[&lun1]);
    check("LUN 1 of two, defaults", &other, &riser, 23);
    let ro = format!("iscsi://127.0.0.1:{port}/{ro_iqn}/0");
    let read_only = run_tests("ALL.ReadOnly", &[&ro]);
    check("ReadOnly on a read_only LUN", &read_only, &riser, 0);
    // A file LUN (bdev_uring_create, 512-byte blocks, defaults) on the same riser: zero
    // failures, no more skips than the malloc LUN with the defaults.
    let disk = DiskDir::new("compliance");
    let file = disk.sparse_file("lun.img", 64 << 20);
    let filename = file.to_str().expect("a UTF-8 path");
    riser
        .call("bdev_uring_create", Some(json!({"name": "CompFile0", "filename": filename})))
        .unwrap_or_else(|e| panic!("bdev_uring_create: {e}\n{}", riser.log()));
    let file_iqn = riser.add_iscsi_target_on("compliance-file", port, vec![json!({"bdev_name": "CompFile0", "lun_id": 0})]);
    let on_file = run_suite(&[&format!("iscsi://127.0.0.1:{port}/{file_iqn}/0")]);
    check("file LUN (bdev_uring)", &on_file, &riser, 23);
    let conns = riser.call("iscsi_get_connections", None).unwrap();
    assert!(conns.as_array().is_some_and(|a| a.is_empty()), "connections left after the suite: {conns}");
}
