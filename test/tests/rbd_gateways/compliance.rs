//! One logical unit, whatever gateway answers (issue 23, item 5): libiscsi's whole suite
//! (`iscsi-test-cu --dataloss --allow-sanitize -t ALL`) with one URL per gateway, two riser
//! processes on one 256 MiB RBD image whose bdevs were created WITHOUT a `uuid`.
//!
//! * Identity: each gateway derives the device's uuid from the image (cluster fsid, pool id,
//!   image id), so both present the same unit serial and VPD 0x83 NAA designator: libiscsi
//!   takes the two URLs as two paths of one LU (it refuses them otherwise: "unit serial
//!   mismatch"). The two uuids in `bdev_get_bdevs` are checked equal first, and save_config
//!   does not pin the derived one (loading it derives it again).
//! * State of the LU shared through the cluster (lib/scsi/src/lu_shared.rs): SPC-2
//!   RESERVE/RELEASE (Reserve6.2Initiators, Reserve6.Logout, Reserve6.ITNexusLoss: the
//!   second initiator logs in through gateway B), software write protect
//!   (Sanitize.Readonly), reservations seen by SANITIZE (Sanitize.Reservations), and what
//!   GET LBA STATUS reports after a BLOCK ERASE (Sanitize.BlockErase).
//!
//! Zero failures, and no more skips than the suite through one gateway: that count is the
//! constant [`SINGLE_GATEWAY_SKIPS`], measured with this same image and configuration
//! through gateway A alone (`RBD_GW_SINGLE=1` runs that too and prints it): 23, the tests
//! that need a removable medium (PreventAllow.*, StartStopUnit.Simple), a write-protected
//! LUN (ReadOnly), SANITIZE OVERWRITE (off by default: it would write every block), a
//! second URL (MultipathIO.*, which run here) and a few that skip on any riser LUN. One URL
//! per gateway skips 19 (the MultipathIO ones run). test/tests/rbd.rs caps its own
//! single-gateway run of the suite on RBD at the same 23. A constant rather than a second run of
//! the suite in every `make test`: that run takes as long again (about 1.5 min here) and
//! says nothing about sharing.

use std::time::Instant;

use riser_tests::ceph::CephCluster;
use riser_tests::json;
use riser_tests::compliance::{run_tests, Outcome};

use super::{create_image, Gateway};

const IMAGE: &str = "gw-compliance";
const IMAGE_MIB: u64 = 256;
/// The suite's skips through gateway A alone (see the module's comment).
const SINGLE_GATEWAY_SKIPS: usize = 23;

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A gateway's warnings and errors (the last `n`), without the iSCSIdatasn tests' expected
/// protocol warnings: what a failure in the middle of the suite left in the log, which a tail
/// of the whole log does not reach.
fn notable(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| (l.contains(" WARN ") || l.contains(" ERROR ")) && !l.contains("DataSN")).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn report(label: &str, o: &Outcome, t: Instant) {
    eprintln!(
        "rbd_gateways compliance [{label}] in {:?}: ran {}, passed {}, failed {} {:?}, skipped {} {:?}",
        t.elapsed(),
        o.ran,
        o.passed,
        o.failed,
        o.failed_tests,
        o.skipped.len(),
        o.skipped
    );
    if !o.failed_tests.is_empty() {
        eprintln!("rbd_gateways compliance [{label}]: output of the failed tests:\n{}", o.failed_output());
    }
}

fn uuid_of(gw: &Gateway) -> String {
    let v = gw.riser.call("bdev_get_bdevs", Some(riser_tests::json!({"name": "Rbd0"}))).expect("bdev_get_bdevs");
    v[0]["uuid"].as_str().unwrap_or_else(|| panic!("no uuid in {v}")).to_string()
}

pub fn check(ceph: &CephCluster) {
    create_image(ceph, IMAGE, IMAGE_MIB);
    let a = Gateway::start_opts(ceph, ceph.conf(), IMAGE, None, 1, &[], json!({}));
    let b = Gateway::start_opts(ceph, ceph.conf(), IMAGE, None, 2, &[], json!({}));
    assert_eq!(uuid_of(&a), uuid_of(&b), "two gateways on one image, no uuid given: one identity");
    let cfg = a.riser.call("framework_get_config", Some(riser_tests::json!({"name": "bdev"}))).expect("framework_get_config");
    let rbd0 = cfg.as_array().and_then(|c| c.iter().find(|c| c["params"]["name"] == "Rbd0")).expect("Rbd0 in save_config");
    assert!(rbd0["params"].get("uuid").is_none(), "a derived uuid is derived again, not saved: {rbd0}");
    if std::env::var_os("RBD_GW_SINGLE").is_some() {
        let t = Instant::now();
        let single = run_tests("ALL", &[&a.url()]);
        report("gateway A alone", &single, t);
    }
    let t = Instant::now();
    let (ua, ub) = (a.url(), b.url());
    let o = run_tests("ALL", &[&ua, &ub]);
    report("one URL per gateway", &o, t);
    assert!(o.ran >= 200, "the suite did not run (ran {}):\n{}", o.ran, tail(&o.output, 60));
    assert_eq!(
        o.failed,
        0,
        "failed tests {:?}\n--- their output ---\n{}\n--- suite output (tail) ---\n{}\n--- gateway A: warnings and errors ---\n{}\n--- gateway B: warnings and errors ---\n{}\n--- gateway A log (tail) ---\n{}\n--- gateway B log (tail) ---\n{}",
        o.failed_tests,
        o.failed_output(),
        tail(&o.output, 60),
        notable(&a.riser.log(), 80),
        notable(&b.riser.log(), 80),
        tail(&a.riser.log(), 30),
        tail(&b.riser.log(), 30)
    );
    assert!(
        o.skipped.len() <= SINGLE_GATEWAY_SKIPS,
        "{} tests skipped, more than through one gateway ({SINGLE_GATEWAY_SKIPS}): {:?}",
        o.skipped.len(),
        o.skipped
    );
}
