//! Several riser gateways in front of one Ceph RBD image (issue 15: ALUA, persistent
//! reservations across gateways, failover). One single-node cluster
//! (scripts/ceph-test-cluster.sh) is started for the whole file and shared by its checks,
//! which run one after another in one test (two riser processes at a time on this 2-core
//! machine). Each check lives in its own module under rbd_gateways/ and makes its own image.
//!
//! `RBD_GW_ONLY=alua,pr` runs only the named checks (for development); `make test` runs all.

use std::time::Instant;

use riser_tests::ceph::CephCluster;
use riser_tests::{free_port, json, Riser, Value};

#[path = "rbd_gateways/alua.rs"]
mod alua;
#[path = "rbd_gateways/compliance.rs"]
mod compliance;
#[path = "rbd_gateways/failover.rs"]
mod failover;
#[path = "rbd_gateways/fencing.rs"]
mod fencing;
#[path = "rbd_gateways/pr.rs"]
mod pr;
#[path = "rbd_gateways/pr_diverge.rs"]
mod pr_diverge;
#[path = "rbd_gateways/shutdown.rs"]
mod shutdown;

/// The target node every gateway exports (the same name on each: one SCSI target device
/// reached through several target port groups).
pub const TARGET: &str = "iqn.2016-06.io.riser:gw";

/// One riser process exporting an RBD image as LUN 0 of [`TARGET`], through a portal group
/// whose tag is the gateway's target port group (and relative target port) identifier.
pub struct Gateway {
    pub riser: Riser,
    pub port: u16,
    pub pg_tag: u32,
}

impl Gateway {
    /// Starts riser with `extra` arguments, registers the cluster as `c0`, creates bdev `Rbd0`
    /// on `pool/image` with `uuid` (the same on every gateway, so the LUN has one identity),
    /// and exports it on a free port of 127.0.0.1 in portal group `pg_tag`.
    pub fn start(ceph: &CephCluster, image: &str, uuid: &str, pg_tag: u32, extra: &[&str]) -> Gateway {
        Gateway::start_opts(ceph, ceph.conf(), image, Some(uuid), pg_tag, extra, json!({}))
    }

    /// [`Gateway::start`] with the cluster configuration file `conf` (the cluster's, with
    /// client options of its own) and more `bdev_rbd_create` parameters (`{"lease_s": 30}`).
    pub fn start_conf(ceph: &CephCluster, conf: &std::path::Path, image: &str, uuid: &str, pg_tag: u32, extra: &[&str], bdev_extra: Value) -> Gateway {
        Gateway::start_opts(ceph, conf, image, Some(uuid), pg_tag, extra, bdev_extra)
    }

    /// As [`Gateway::start`] with configuration file `conf`; `uuid` `None` creates the bdev
    /// without one (the device's identity then derives from the image: the same on every
    /// gateway).
    pub fn start_opts(
        ceph: &CephCluster,
        conf: &std::path::Path,
        image: &str,
        uuid: Option<&str>,
        pg_tag: u32,
        extra: &[&str],
        bdev_extra: Value,
    ) -> Gateway {
        let riser = Riser::start_with(extra);
        let port = free_port();
        let call = |m: &str, p: Value| riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", riser.log()));
        let conf = conf.to_str().expect("utf-8 path");
        let keyring = ceph.keyring().to_str().expect("utf-8 path");
        call("bdev_rbd_register_cluster", json!({"name": "c0", "config_file": conf, "key_file": keyring, "user_id": "admin"}));
        let mut bdev = json!({"name": "Rbd0", "pool_name": "rbd", "rbd_name": image, "block_size": 512, "cluster_name": "c0"});
        if let Some(u) = uuid {
            bdev["uuid"] = json!(u);
        }
        if let (Some(b), Some(x)) = (bdev.as_object_mut(), bdev_extra.as_object()) {
            b.extend(x.clone());
        }
        call("bdev_rbd_create", bdev);
        call("iscsi_create_portal_group", json!({"tag": pg_tag, "portals": [{"host": "127.0.0.1", "port": port.to_string()}]}));
        call("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
        call(
            "iscsi_create_target_node",
            json!({"name": TARGET, "alias_name": "gw", "pg_ig_maps": [{"pg_tag": pg_tag, "ig_tag": 1}],
                   "luns": [{"bdev_name": "Rbd0", "lun_id": 0}], "queue_depth": 64}),
        );
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "riser did not listen on port {port}:\n{}", riser.log());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Gateway { riser, port, pg_tag }
    }

    /// The gateway's URL for LUN 0 (`iscsi://127.0.0.1:PORT/TARGET/0`).
    pub fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{TARGET}/0", self.port)
    }
}

/// Creates `rbd/NAME` of `mib` MiB without the exclusive-lock feature (several gateways write
/// it; riser caches no data).
pub fn create_image(ceph: &CephCluster, name: &str, mib: u64) {
    ceph.rbd_ok(&["create", "--image-feature", "layering", "--size", &format!("{mib}M"), &format!("rbd/{name}")]);
}

#[test]
fn gateways_in_front_of_one_rbd_image() {
    let only = std::env::var("RBD_GW_ONLY").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o.split(',').any(|w| w.trim() == name));
    let t0 = Instant::now();
    let ceph = CephCluster::start("gw");
    eprintln!("rbd_gateways: cluster up in {:?}", t0.elapsed());
    type Check = (&'static str, fn(&CephCluster));
    let checks: [Check; 7] = [
        ("alua", alua::check),
        ("pr", pr::check),
        ("pr_diverge", pr_diverge::check),
        ("failover", failover::check),
        ("fencing", fencing::check),
        ("compliance", compliance::check),
        ("shutdown", shutdown::check),
    ];
    for (name, check) in checks {
        if wanted(name) {
            let t = Instant::now();
            check(&ceph);
            eprintln!("rbd_gateways: {name} passed in {:?}", t.elapsed());
        }
    }
}
