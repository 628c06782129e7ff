//! A gateway stopped while its Ceph cluster does not answer: SIGTERM (as the service manager
//! stops it) must still end riser, with status 0 and a log line that says the devices were
//! not all closed, within the service unit's stop timeout (`TimeoutStopSec=30` in
//! scripts/systemd/riser.service.in), not be left to its SIGKILL.
//!
//! librados waits for the cluster when an image's watches and handles close. Each of riser's
//! waits for it is bounded (a shared-state watch thread 2 s, the group thread 5 s:
//! lib/bdev/src/modules/rbd/pr.rs, group.rs), about 11 s per RBD LUN, but LUNs close one after
//! another: the three LUNs here would take some 33 s. riser's teardown watchdog
//! (app/src/main.rs, 15 s after the reactors stopped) ends the process instead.
//!
//! The cluster is stopped (SIGSTOP) for the time of the check and continued before it returns,
//! so the checks that follow find it as it was.

use std::time::{Duration, Instant};

use riser_tests::ceph::CephCluster;
use riser_tests::{json, Value};

use super::{create_image, Gateway, TARGET};

const UUID: &str = "6c0b7a1e-15a2-4a10-9a5e-00000000fe0d";
const IMAGE: &str = "gw-shutdown";
/// RBD LUNs of the gateway (LUN 0 on IMAGE, the others on images of their own).
const LUNS: u32 = 3;
/// The service unit's `TimeoutStopSec`: past it, systemd kills riser without a word.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Continues the cluster when the check ends, however it ends.
struct Continue<'a>(&'a CephCluster);

impl Drop for Continue<'_> {
    fn drop(&mut self) {
        self.0.signal_all("CONT");
    }
}

pub fn check(ceph: &CephCluster) {
    create_image(ceph, IMAGE, 16);
    let mut a = Gateway::start(ceph, IMAGE, UUID, 1, &[]);
    for lun in 1..LUNS {
        let (image, bdev) = (format!("{IMAGE}-{lun}"), format!("Rbd{lun}"));
        create_image(ceph, &image, 16);
        let call = |m: &str, p: Value| a.riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\n{}", a.riser.log()));
        call("bdev_rbd_create", json!({"name": bdev, "pool_name": "rbd", "rbd_name": image, "block_size": 512, "cluster_name": "c0"}));
        call("iscsi_target_node_add_lun", json!({"name": TARGET, "bdev_name": bdev, "lun_id": lun}));
    }
    // The gateway has joined its group and watches its shared objects: what waits for the
    // cluster when it closes.
    let joined = Instant::now();
    while a.riser.log().matches("joined as client").count() < LUNS as usize {
        assert!(joined.elapsed() < Duration::from_secs(30), "the gateway did not join its group:\n{}", a.riser.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let cont = Continue(ceph);
    ceph.signal_all("STOP");
    let t = Instant::now();
    let status = a.riser.terminate(STOP_TIMEOUT);
    let took = t.elapsed();
    drop(cont);
    let log = a.riser.log();
    let status = status.unwrap_or_else(|| panic!("riser still running {STOP_TIMEOUT:?} after SIGTERM with its cluster stopped:\n{log}"));
    eprintln!("rbd_gateways shutdown: riser exited {took:?} after SIGTERM with the cluster stopped ({status})");
    assert_eq!(status.code(), Some(0), "riser's exit status on SIGTERM:\n{log}");
    assert!(log.contains("riser stopped"), "the reactors stopped first:\n{log}");
    assert!(log.contains("closing the devices did not finish within 15 s"), "the watchdog ended the teardown and said so:\n{log}");
}
