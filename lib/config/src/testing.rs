//! Helpers for the tests of every concept file: a target over a few bdevs, called directly or
//! through its registered RPC methods.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use riser_bdev::BdevRegistry;
use riser_rpc::{RpcError, RpcRegistry};
use serde_json::{json, Value};

use crate::portal_group::PortParam;
use crate::{IscsiTarget, LunSpec, NodeParams, PgIgMap, PortalParam, TargetNode};

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(crate) fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn portal(host: &str, port: u16) -> PortalParam {
    PortalParam { host: host.into(), port: PortParam(port.to_string()), iser: false }
}

/// A target over null bdevs Null0..Null3.
pub(crate) fn target() -> (Arc<Mutex<BdevRegistry>>, Arc<IscsiTarget>) {
    let mut b = BdevRegistry::new();
    for i in 0..4 {
        b.create_null(&format!("Null{i}"), 1024, 512, None).unwrap();
    }
    let bdevs = Arc::new(Mutex::new(b));
    (bdevs.clone(), Arc::new(IscsiTarget::new(bdevs)))
}

pub(crate) fn node(t: &IscsiTarget, name: &str, maps: &[(u32, u32)], bdev: &str) -> Arc<TargetNode> {
    t.create_target_node(NodeParams {
        name: name.into(),
        pg_ig_maps: maps.iter().map(|&(pg_tag, ig_tag)| PgIgMap { pg_tag, ig_tag }).collect(),
        luns: vec![LunSpec::new(0, bdev)],
        ..Default::default()
    })
    .unwrap()
}

/// pg 1: 10.0.0.1:3260 and [fd00::1]:3260; pg 2: 0.0.0.0:3261; pg 3 (private): 10.0.0.1:3262.
/// ig 1: `iqn.1994-05.com.redhat:a` from 10.0.0.0/8; ig 2: anyone but
/// `iqn.1994-05.com.redhat:b` from anywhere.
pub(crate) fn acl_setup() -> Arc<IscsiTarget> {
    let (_, t) = target();
    t.create_portal_group(1, &[portal("10.0.0.1", 3260), portal("[fd00::1]", 3260)], false, false).unwrap();
    t.create_portal_group(2, &[portal("0.0.0.0", 3261)], false, false).unwrap();
    t.create_portal_group(3, &[portal("10.0.0.1", 3262)], true, false).unwrap();
    t.create_initiator_group(1, &strings(&["iqn.1994-05.com.redhat:a"]), &strings(&["10.0.0.0/8"])).unwrap();
    t.create_initiator_group(2, &strings(&["ANY", "!iqn.1994-05.com.redhat:b"]), &strings(&["ANY"])).unwrap();
    t
}

/// A target over malloc bdevs Malloc0..Malloc3 with the iSCSI methods registered.
pub(crate) struct Env {
    pub bdevs: Arc<Mutex<BdevRegistry>>,
    pub target: Arc<IscsiTarget>,
    pub reg: RpcRegistry,
}

pub(crate) fn env() -> Env {
    let mut b = BdevRegistry::new();
    for i in 0..4 {
        b.create_malloc(Some(&format!("Malloc{i}")), 64, 512, None).unwrap();
    }
    let bdevs = Arc::new(Mutex::new(b));
    let target = Arc::new(IscsiTarget::new(bdevs.clone()));
    let mut reg = RpcRegistry::new();
    crate::rpc::register(&mut reg, target.clone());
    Env { bdevs, target, reg }
}

impl Env {
    pub fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.reg.call(method, params)
    }
    pub fn ok(&self, method: &str, params: Value) -> Value {
        self.call(method, params).unwrap_or_else(|e| panic!("{method}: {e}"))
    }
    /// The error's code, checking the message contains `needle`.
    pub fn err(&self, method: &str, params: Value, needle: &str) -> i64 {
        let e = self.call(method, params).expect_err(method);
        assert!(e.message.contains(needle), "{method}: {:?} lacks {needle:?}", e.message);
        e.code
    }
    pub fn claimed_by(&self, bdev: &str) -> Option<String> {
        self.bdevs.lock().unwrap().claimed_by(bdev).map(str::to_string)
    }
}

/// A state with every kind of object, built through the RPC methods.
pub(crate) fn populate(e: &Env) {
    e.ok("iscsi_set_options", json!({"node_base": "iqn.2024-01.com.example", "first_burst_length": 16384, "max_queue_depth": 128}));
    e.ok("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3260"}, {"host": "[::1]", "port": 3260, "iser": true}]}));
    e.ok("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "0.0.0.0", "port": "3261"}], "private": true, "wait": true}));
    e.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["127.0.0.0/8", "[::1]/128"]}));
    e.ok("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["iqn.1994-05.com.redhat:a", "!iqn.1994-05.com.redhat:b"], "netmasks": ["ANY"]}));
    e.ok("iscsi_initiator_group_add_initiators", json!({"tag": 2, "initiators": ["iqn.1994-05.com.redhat:c"], "netmasks": ["10.0.0.0/8"]}));
    e.ok("iscsi_initiator_group_remove_initiators", json!({"tag": 2, "netmasks": ["ANY"]}));
    e.ok("iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": "disc", "secret": "disc-secret-1"}]}));
    e.ok("iscsi_create_auth_group", json!({"tag": 2, "secrets": [
        {"user": "alice", "secret": "alice-secret-1", "muser": "tgt", "msecret": "tgt-secret-1"},
        {"user": "bob", "secret": "bob-secret-1"}
    ]}));
    e.ok("iscsi_auth_group_add_secret", json!({"tag": 2, "user": "carol", "secret": "carol-secret-1", "muser": "t2", "msecret": "t2-secret-123", "initiator_group": 2}));
    e.ok("iscsi_auth_group_remove_secret", json!({"tag": 2, "user": "bob"}));
    e.ok("iscsi_set_discovery_auth", json!({"require_chap": true, "chap_group": 1}));
    e.ok("iscsi_create_target_node", json!({
        "name": "disk1", "alias_name": "Disk one",
        "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 2, "ig_tag": 2}],
        "luns": [{"bdev_name": "Malloc0", "lun_id": 0}],
        "queue_depth": 96, "header_digest": true
    }));
    e.ok("iscsi_target_node_add_lun", json!({"name": "iqn.2024-01.com.example:disk1", "bdev_name": "Malloc1"}));
    e.ok("iscsi_target_node_add_lun", json!({"name": "disk1", "bdev_name": "Malloc2", "lun_id": 7}));
    e.ok("iscsi_target_node_add_pg_ig_maps", json!({"name": "disk1", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}]}));
    e.ok("iscsi_target_node_set_redirect", json!({"name": "disk1", "pg_tag": 1, "redirect_host": "10.1.1.1", "redirect_port": "3262"}));
    e.ok("iscsi_create_target_node", json!({
        "name": "eui.02004567A425678D",
        "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
        "luns": [{"bdev_name": "Malloc3", "lun_id": 3}],
        "queue_depth": 1, "require_chap": true, "mutual_chap": true, "chap_group": 2
    }));
    e.ok("iscsi_target_node_remove_pg_ig_maps", json!({"name": "eui.02004567A425678D", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}]}));
}
