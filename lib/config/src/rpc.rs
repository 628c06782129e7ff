//! The iSCSI JSON-RPC methods: SPDK's names, parameters and result shapes. Creating and
//! deleting return `true`; getters return SPDK's objects. Errors: -32602 for a bad value
//! (the message names the field), -17 exists, -19 not found, -16 in use.

use std::sync::Arc;

use riser_rpc::{RpcError, RpcRegistry};
use serde::Deserialize;
use serde_json::Value;

use crate::{Chap, IscsiTarget, LunOptions, LunSpec, NodeParams, OptionsUpdate, PgIgMap, PortalParam};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ByTag {
    tag: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ByName {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreatePortalGroup {
    tag: u32,
    portals: Vec<PortalParam>,
    #[serde(default)]
    private: bool,
    #[serde(default)]
    wait: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateInitiatorGroup {
    tag: u32,
    initiators: Vec<String>,
    netmasks: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeInitiatorGroup {
    tag: u32,
    #[serde(default)]
    initiators: Vec<String>,
    #[serde(default)]
    netmasks: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunParam {
    bdev_name: String,
    lun_id: u32,
    /// riser's extensions (see [`LunOptions`]).
    #[serde(default)]
    removable: bool,
    #[serde(default)]
    read_only: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTargetNode {
    name: String,
    /// Required by SPDK; optional here (no alias).
    alias_name: Option<String>,
    pg_ig_maps: Vec<PgIgMap>,
    luns: Vec<LunParam>,
    /// Required by SPDK; defaults here to the max_queue_depth option.
    queue_depth: Option<u32>,
    #[serde(default)]
    disable_chap: bool,
    #[serde(default)]
    require_chap: bool,
    #[serde(default)]
    mutual_chap: bool,
    #[serde(default)]
    chap_group: u32,
    #[serde(default)]
    header_digest: bool,
    #[serde(default)]
    data_digest: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddLun {
    name: String,
    bdev_name: String,
    /// Absent or -1 (SPDK's "any"): the lowest free id.
    lun_id: Option<i64>,
    /// riser's extensions (see [`LunOptions`]).
    #[serde(default)]
    removable: bool,
    #[serde(default)]
    read_only: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeMaps {
    name: String,
    pg_ig_maps: Vec<PgIgMap>,
}

fn ok(r: Result<(), crate::TargetError>) -> Result<Value, RpcError> {
    r.map(|()| Value::Bool(true)).map_err(RpcError::from)
}

/// Registers the iSCSI methods on `reg`, all acting on `target`.
pub fn register(reg: &mut RpcRegistry, target: Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_set_options", move |p: OptionsUpdate| ok(t.set_options(p)));
    let t = target.clone();
    reg.add("iscsi_get_options", move |_: NoParams| Ok(t.options_json()));

    let t = target.clone();
    reg.add("iscsi_create_portal_group", move |p: CreatePortalGroup| {
        ok(t.create_portal_group(p.tag, &p.portals, p.private, p.wait))
    });
    let t = target.clone();
    reg.add("iscsi_start_portal_group", move |p: ByTag| ok(t.start_portal_group(p.tag)));
    let t = target.clone();
    reg.add("iscsi_delete_portal_group", move |p: ByTag| ok(t.delete_portal_group(p.tag)));
    let t = target.clone();
    reg.add("iscsi_get_portal_groups", move |_: NoParams| Ok(t.portal_groups_json()));

    let t = target.clone();
    reg.add("iscsi_create_initiator_group", move |p: CreateInitiatorGroup| {
        ok(t.create_initiator_group(p.tag, &p.initiators, &p.netmasks))
    });
    let t = target.clone();
    reg.add("iscsi_initiator_group_add_initiators", move |p: ChangeInitiatorGroup| {
        ok(t.initiator_group_add(p.tag, &p.initiators, &p.netmasks))
    });
    let t = target.clone();
    reg.add("iscsi_initiator_group_remove_initiators", move |p: ChangeInitiatorGroup| {
        ok(t.initiator_group_remove(p.tag, &p.initiators, &p.netmasks))
    });
    let t = target.clone();
    reg.add("iscsi_delete_initiator_group", move |p: ByTag| ok(t.delete_initiator_group(p.tag)));
    let t = target.clone();
    reg.add("iscsi_get_initiator_groups", move |_: NoParams| Ok(t.initiator_groups_json()));

    let t = target.clone();
    reg.add("iscsi_create_target_node", move |p: CreateTargetNode| {
        let params = NodeParams {
            name: p.name,
            alias_name: p.alias_name,
            pg_ig_maps: p.pg_ig_maps,
            luns: p
                .luns
                .into_iter()
                .map(|l| LunSpec {
                    lun_id: l.lun_id,
                    bdev_name: l.bdev_name,
                    options: LunOptions { removable: l.removable, read_only: l.read_only },
                })
                .collect(),
            queue_depth: p.queue_depth,
            chap: Chap {
                disable_chap: p.disable_chap,
                require_chap: p.require_chap,
                mutual_chap: p.mutual_chap,
                chap_group: p.chap_group,
            },
            header_digest: p.header_digest,
            data_digest: p.data_digest,
        };
        ok(t.create_target_node(params).map(|_| ()))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_add_lun", move |p: AddLun| {
        let lun_id = match p.lun_id {
            None | Some(-1) => None,
            Some(id) => match u32::try_from(id) {
                Ok(id) => Some(id),
                Err(_) => return Err(RpcError::invalid_params(format!("lun_id: {id} is out of range (0..=1023, or -1 for any)"))),
            },
        };
        let options = LunOptions { removable: p.removable, read_only: p.read_only };
        ok(t.target_node_add_lun(&p.name, &p.bdev_name, lun_id, options).map(|_| ()))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_add_pg_ig_maps", move |p: NodeMaps| {
        ok(t.target_node_add_pg_ig_maps(&p.name, &p.pg_ig_maps))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_remove_pg_ig_maps", move |p: NodeMaps| {
        ok(t.target_node_remove_pg_ig_maps(&p.name, &p.pg_ig_maps))
    });
    let t = target.clone();
    reg.add("iscsi_delete_target_node", move |p: ByName| ok(t.delete_target_node(&p.name)));
    let t = target;
    reg.add("iscsi_get_target_nodes", move |_: NoParams| Ok(t.target_nodes_json()));
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use riser_bdev::{BdevRegistry, RegistryError};
    use serde_json::json;

    use super::*;

    struct Env {
        bdevs: Arc<Mutex<BdevRegistry>>,
        target: Arc<IscsiTarget>,
        reg: RpcRegistry,
    }

    fn env() -> Env {
        let mut b = BdevRegistry::new();
        for i in 0..4 {
            b.create_malloc(Some(&format!("Malloc{i}")), 64, 512, None).unwrap();
        }
        let bdevs = Arc::new(Mutex::new(b));
        let target = Arc::new(IscsiTarget::new(bdevs.clone()));
        let mut reg = RpcRegistry::new();
        register(&mut reg, target.clone());
        Env { bdevs, target, reg }
    }

    impl Env {
        fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
            self.reg.call(method, params)
        }
        fn ok(&self, method: &str, params: Value) -> Value {
            self.call(method, params).unwrap_or_else(|e| panic!("{method}: {e}"))
        }
        /// The error's code, checking the message contains `needle`.
        fn err(&self, method: &str, params: Value, needle: &str) -> i64 {
            let e = self.call(method, params).expect_err(method);
            assert!(e.message.contains(needle), "{method}: {:?} lacks {needle:?}", e.message);
            e.code
        }
        fn claimed_by(&self, bdev: &str) -> Option<String> {
            self.bdevs.lock().unwrap().claimed_by(bdev).map(str::to_string)
        }
    }

    /// A state with every kind of object, built through the RPC methods.
    fn populate(e: &Env) {
        e.ok("iscsi_set_options", json!({"node_base": "iqn.2024-01.com.example", "first_burst_length": 16384, "max_queue_depth": 128}));
        e.ok("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3260"}, {"host": "[::1]", "port": 3260, "iser": true}]}));
        e.ok("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "0.0.0.0", "port": "3261"}], "private": true, "wait": true}));
        e.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["127.0.0.0/8", "[::1]/128"]}));
        e.ok("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["iqn.1994-05.com.redhat:a", "!iqn.1994-05.com.redhat:b"], "netmasks": ["ANY"]}));
        e.ok("iscsi_initiator_group_add_initiators", json!({"tag": 2, "initiators": ["iqn.1994-05.com.redhat:c"], "netmasks": ["10.0.0.0/8"]}));
        e.ok("iscsi_initiator_group_remove_initiators", json!({"tag": 2, "netmasks": ["ANY"]}));
        e.ok("iscsi_create_target_node", json!({
            "name": "disk1", "alias_name": "Disk one",
            "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 2, "ig_tag": 2}],
            "luns": [{"bdev_name": "Malloc0", "lun_id": 0}],
            "queue_depth": 96, "header_digest": true
        }));
        e.ok("iscsi_target_node_add_lun", json!({"name": "iqn.2024-01.com.example:disk1", "bdev_name": "Malloc1"}));
        e.ok("iscsi_target_node_add_lun", json!({"name": "disk1", "bdev_name": "Malloc2", "lun_id": 7}));
        e.ok("iscsi_target_node_add_pg_ig_maps", json!({"name": "disk1", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}]}));
        e.ok("iscsi_create_target_node", json!({
            "name": "eui.02004567A425678D",
            "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
            "luns": [{"bdev_name": "Malloc3", "lun_id": 3}],
            "queue_depth": 1, "require_chap": true, "mutual_chap": true, "chap_group": 2
        }));
        e.ok("iscsi_target_node_remove_pg_ig_maps", json!({"name": "eui.02004567A425678D", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}]}));
    }

    #[test]
    fn getters_return_spdk_shapes() {
        let e = env();
        populate(&e);
        let pgs = e.ok("iscsi_get_portal_groups", Value::Null);
        assert_eq!(pgs, json!([
            {"tag": 1, "private": false, "portals": [{"host": "127.0.0.1", "port": "3260"}, {"host": "[::1]", "port": "3260", "iser": true}]},
            {"tag": 2, "private": true, "portals": [{"host": "0.0.0.0", "port": "3261"}]}
        ]));
        let igs = e.ok("iscsi_get_initiator_groups", json!({}));
        assert_eq!(igs, json!([
            {"tag": 1, "initiators": ["ANY"], "netmasks": ["127.0.0.0/8", "[::1]/128"]},
            {"tag": 2, "initiators": ["iqn.1994-05.com.redhat:a", "!iqn.1994-05.com.redhat:b", "iqn.1994-05.com.redhat:c"], "netmasks": ["10.0.0.0/8"]}
        ]));
        let nodes = e.ok("iscsi_get_target_nodes", Value::Null);
        assert_eq!(nodes, json!([
            {
                "name": "iqn.2024-01.com.example:disk1", "alias_name": "Disk one",
                "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 1, "ig_tag": 2}, {"pg_tag": 2, "ig_tag": 2}],
                "luns": [{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1}, {"bdev_name": "Malloc2", "lun_id": 7}],
                "queue_depth": 96, "disable_chap": false, "require_chap": false, "mutual_chap": false,
                "chap_group": 0, "header_digest": true, "data_digest": false
            },
            {
                "name": "eui.02004567A425678D", "pg_ig_maps": [],
                "luns": [{"bdev_name": "Malloc3", "lun_id": 3}],
                "queue_depth": 1, "disable_chap": false, "require_chap": true, "mutual_chap": true,
                "chap_group": 2, "header_digest": false, "data_digest": false
            }
        ]));
        let o = e.ok("iscsi_get_options", Value::Null);
        assert_eq!(o["node_base"], "iqn.2024-01.com.example");
        assert_eq!(o["first_burst_length"], 16384);
        assert_eq!(o["max_sessions"], 128);
        assert_eq!(o["immediate_data"], true);
        assert_eq!(o.as_object().map(|m| m.len()), Some(21));
        assert_eq!(e.claimed_by("Malloc1").as_deref(), Some("iqn.2024-01.com.example:disk1:lun1"));
    }

    #[test]
    fn save_config_replays_to_the_same_state() {
        let a = env();
        populate(&a);
        let dump = a.target.config_json();
        let methods: Vec<&str> = dump.iter().filter_map(|c| c["method"].as_str()).collect();
        assert_eq!(methods, [
            "iscsi_set_options",
            "iscsi_create_portal_group", "iscsi_create_portal_group",
            "iscsi_create_initiator_group", "iscsi_create_initiator_group",
            "iscsi_create_target_node", "iscsi_create_target_node",
        ]);
        let b = env();
        for c in &dump {
            b.ok(c["method"].as_str().unwrap(), c["params"].clone());
        }
        assert_eq!(b.target.config_json(), dump);
        for m in ["iscsi_get_portal_groups", "iscsi_get_initiator_groups", "iscsi_get_target_nodes", "iscsi_get_options"] {
            assert_eq!(a.ok(m, Value::Null), b.ok(m, Value::Null), "{m}");
        }
        // The waiting portal group came back waiting.
        assert_eq!(b.target.portal_groups().iter().map(|g| g.started).collect::<Vec<_>>(), [true, false]);
        // An empty state dumps only the options.
        assert_eq!(env().target.config_json().len(), 1);
    }

    #[test]
    fn set_options_validates_and_names_the_field() {
        let e = env();
        let cases = [
            (json!({"first_burst_length": 511}), "first_burst_length: 511 is out of range (512..=262144)"),
            (json!({"first_burst_length": 262145}), "first_burst_length:"),
            (json!({"first_burst_length": 16777215}), "first_burst_length:"),
            (json!({"error_recovery_level": 3}), "error_recovery_level: 3 is out of range (0..=2)"),
            (json!({"max_queue_depth": 0}), "max_queue_depth: 0"),
            (json!({"max_queue_depth": 257}), "max_queue_depth: 257"),
            (json!({"max_sessions": 0}), "max_sessions"),
            (json!({"max_connections_per_session": 65536}), "max_connections_per_session"),
            (json!({"default_time2wait": 3601}), "default_time2wait"),
            (json!({"nop_in_interval": 61}), "nop_in_interval"),
            (json!({"max_r2t_per_connection": 0}), "max_r2t_per_connection"),
            (json!({"node_base": "not a name"}), "node_base:"),
            (json!({"disable_chap": true, "require_chap": true}), "mutually exclusive"),
            (json!({"first_burst_length": -1}), "first_burst_length"),
            (json!({"immediate_data": "yes"}), "immediate_data"),
            (json!({"no_such_option": 1}), "no_such_option"),
        ];
        for (p, needle) in cases {
            assert_eq!(e.err("iscsi_set_options", p.clone(), needle), -32602, "{p}");
        }
        // Nothing changed by the refused calls.
        assert_eq!(e.target.options(), crate::Options::default());
        e.ok("iscsi_set_options", json!({"first_burst_length": 262144, "error_recovery_level": 2, "pdu_pool_size": 1024, "auth_file": "/x"}));
        let o = e.target.options();
        assert_eq!((o.first_burst_length, o.error_recovery_level, o.pdu_pool_size), (262144, 2, 1024));
        assert_eq!(e.err("iscsi_get_options", json!({"x": 1}), "x"), -32602);
    }

    #[test]
    fn portal_group_errors() {
        let e = env();
        let pg = |tag: u32, host: &str| json!({"tag": tag, "portals": [{"host": host, "port": "3260"}]});
        e.ok("iscsi_create_portal_group", pg(1, "127.0.0.1"));
        assert_eq!(e.err("iscsi_create_portal_group", pg(1, "127.0.0.2"), "portal group 1 already exists"), -17);
        assert_eq!(e.err("iscsi_create_portal_group", pg(2, "127.0.0.1"), "portals[0]: 127.0.0.1:3260 is already in portal group 1"), -17);
        assert_eq!(e.err("iscsi_create_portal_group", pg(0, "127.0.0.2"), "tag: 0 is out of range"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", pg(65536, "127.0.0.2"), "tag:"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", pg(2, "example.com"), "portals[0].host:"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", json!({"tag": 2, "portals": []}), "portals: at least one"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "1.2.3.4", "port": "x"}]}), "portals[0].port:"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "1.2.3.4"}]}), "port"), -32602);
        let twice = json!({"tag": 2, "portals": [{"host": "1.2.3.4", "port": "1"}, {"host": "1.2.3.4", "port": 1}]});
        assert_eq!(e.err("iscsi_create_portal_group", twice, "portals[1]: 1.2.3.4:1 is given twice"), -17);
        // The same address may carry a TCP and an iSER portal.
        e.ok("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "127.0.0.1", "port": "3260", "iser": true}]}));
        assert_eq!(e.err("iscsi_delete_portal_group", json!({"tag": 9}), "portal group 9 not found"), -19);
        assert_eq!(e.err("iscsi_start_portal_group", json!({"tag": 9}), "portal group 9 not found"), -19);
        e.ok("iscsi_start_portal_group", json!({"tag": 2}));
        e.ok("iscsi_delete_portal_group", json!({"tag": 2}));
        assert_eq!(e.target.portal_groups().len(), 1);
    }

    #[test]
    fn initiator_group_errors() {
        let e = env();
        e.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ALL"], "netmasks": ["any"]}));
        assert_eq!(e.ok("iscsi_get_initiator_groups", Value::Null)[0]["initiators"], json!(["ANY"]));
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 1, "initiators": [], "netmasks": []}), "initiator group 1 already exists"), -17);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 0, "initiators": [], "netmasks": []}), "tag: 0"), -32602);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["ANY"], "netmasks": ["300.0.0.0/8"]}), "netmasks[0]:"), -32602);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["a b"], "netmasks": []}), "initiators[0]:"), -32602);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["ANY", "any"], "netmasks": []}), "initiators[1]: ANY is already"), -17);
        assert_eq!(e.err("iscsi_initiator_group_add_initiators", json!({"tag": 5, "initiators": ["ANY"]}), "initiator group 5 not found"), -19);
        assert_eq!(e.err("iscsi_initiator_group_add_initiators", json!({"tag": 1, "initiators": ["ANY"]}), "already in initiator group 1"), -17);
        assert_eq!(e.err("iscsi_initiator_group_remove_initiators", json!({"tag": 1, "netmasks": ["10.0.0.0/8"]}), "netmasks[0]: 10.0.0.0/8 is not in initiator group 1"), -19);
        assert_eq!(e.err("iscsi_delete_initiator_group", json!({"tag": 5}), "initiator group 5 not found"), -19);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["ANY"]}), "netmasks"), -32602);
    }

    #[test]
    fn target_node_errors() {
        let e = env();
        e.ok("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3260"}]}));
        e.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
        let node = |name: &str, maps: Value, luns: Value| json!({"name": name, "pg_ig_maps": maps, "luns": luns, "queue_depth": 32});
        let m11 = json!([{"pg_tag": 1, "ig_tag": 1}]);
        let l0 = json!([{"bdev_name": "Malloc0", "lun_id": 0}]);
        let cases = [
            (node("d", json!([{"pg_tag": 2, "ig_tag": 1}]), l0.clone()), "pg_ig_maps[0].pg_tag: portal group 2 not found", -19),
            (node("d", json!([{"pg_tag": 1, "ig_tag": 3}]), l0.clone()), "pg_ig_maps[0].ig_tag: initiator group 3 not found", -19),
            (node("d", json!([{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 1, "ig_tag": 1}]), l0.clone()), "pg_ig_maps[1]:", -17),
            (node("d", m11.clone(), json!([{"bdev_name": "Nope", "lun_id": 0}])), "luns[0].bdev_name: bdev Nope not found", -19),
            (node("d", m11.clone(), json!([{"bdev_name": "Malloc0", "lun_id": 1024}])), "luns[0].lun_id: 1024 is out of range (0..=1023)", -32602),
            (node("d", m11.clone(), json!([{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 0}])), "luns[1].lun_id: LUN 0 is given twice", -32602),
            (node("d", m11.clone(), json!([{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc0", "lun_id": 1}])), "luns[1].bdev_name: bdev Malloc0 is already claimed by iqn.2016-06.io.riser:d:lun0", -16),
            (node("d", m11.clone(), json!([])), "luns: at least one LUN", -32602),
            (node("bad name", m11.clone(), l0.clone()), "name:", -32602),
            (node("iqn.2016-6.x:y", m11.clone(), l0.clone()), "name:", -32602),
            (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "queue_depth": 65}), "queue_depth: 65 is out of range (1..=64", -32602),
            (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "queue_depth": 0}), "queue_depth: 0", -32602),
            (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "disable_chap": true, "require_chap": true}), "mutually exclusive", -32602),
            (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "mutual_chap": true}), "mutual_chap requires require_chap", -32602),
            (json!({"name": "d", "pg_ig_maps": m11, "luns": [{"bdev_name": "Malloc0", "lun_id": 0, "x": 1}]}), "luns[0]", -32602),
            (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "cpumask": "0x1"}), "cpumask", -32602),
        ];
        for (p, needle, code) in cases {
            assert_eq!(e.err("iscsi_create_target_node", p.clone(), needle), code, "{p}");
        }
        // Refused creations claimed nothing and left nothing.
        assert_eq!(e.claimed_by("Malloc0"), None);
        assert!(e.target.target_nodes().is_empty());

        e.ok("iscsi_create_target_node", node("d", m11.clone(), l0.clone()));
        let n = e.target.find_node("iqn.2016-06.io.riser:d").expect("prefixed with node_base");
        assert_eq!(n.queue_depth(), 32);
        assert_eq!(e.err("iscsi_create_target_node", node("d", m11.clone(), json!([{"bdev_name": "Malloc1", "lun_id": 0}])), "already exists"), -17);
        assert_eq!(e.err("iscsi_create_target_node", node("IQN.2016-06.IO.RISER:D", m11.clone(), json!([{"bdev_name": "Malloc1", "lun_id": 0}])), "already exists"), -17);
        // No queue_depth: the max_queue_depth option.
        e.ok("iscsi_create_target_node", json!({"name": "q", "pg_ig_maps": [], "luns": [{"bdev_name": "Malloc3", "lun_id": 0}]}));
        assert_eq!(e.target.find_node("iqn.2016-06.io.riser:q").map(|n| n.queue_depth()), Some(64));

        // add_lun
        let add = |p: Value| e.call("iscsi_target_node_add_lun", p);
        assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "zz", "bdev_name": "Malloc1"}), "target node zz not found"), -19);
        assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1", "lun_id": 0}), "LUN 0 already exists on target node iqn.2016-06.io.riser:d"), -17);
        assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1", "lun_id": 1024}), "lun_id: 1024"), -32602);
        assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1", "lun_id": -2}), "lun_id: -2"), -32602);
        assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc0"}), "bdev_name: bdev Malloc0 is already claimed"), -16);
        assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Nope"}), "bdev_name: bdev Nope not found"), -19);
        add(json!({"name": "d", "bdev_name": "Malloc1", "lun_id": -1})).unwrap();
        let (_, luns) = n.luns();
        assert_eq!(luns.iter().map(|l| (l.id, l.bdev_name.as_str())).collect::<Vec<_>>(), [(0, "Malloc0"), (1, "Malloc1")]);

        // maps
        assert_eq!(e.err("iscsi_target_node_add_pg_ig_maps", json!({"name": "d", "pg_ig_maps": m11}), "portal group 1 is already mapped to initiator group 1"), -17);
        assert_eq!(e.err("iscsi_target_node_add_pg_ig_maps", json!({"name": "d", "pg_ig_maps": []}), "pg_ig_maps: at least one"), -32602);
        assert_eq!(e.err("iscsi_target_node_remove_pg_ig_maps", json!({"name": "d", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}]}), "pg_ig_maps[0]: portal group 1 is not mapped to initiator group 2"), -19);
        assert_eq!(e.err("iscsi_target_node_remove_pg_ig_maps", json!({"name": "nope", "pg_ig_maps": m11}), "not found"), -19);

        // Groups in use cannot go.
        assert_eq!(e.err("iscsi_delete_portal_group", json!({"tag": 1}), "portal group 1 is mapped by target node iqn.2016-06.io.riser:d"), -16);
        assert_eq!(e.err("iscsi_delete_initiator_group", json!({"tag": 1}), "initiator group 1 is mapped by target node iqn.2016-06.io.riser:d"), -16);
        e.ok("iscsi_target_node_remove_pg_ig_maps", json!({"name": "d", "pg_ig_maps": m11}));
        e.ok("iscsi_delete_initiator_group", json!({"tag": 1}));
        e.ok("iscsi_delete_portal_group", json!({"tag": 1}));

        // max_queue_depth may not drop below a node's queue_depth.
        assert_eq!(e.err("iscsi_set_options", json!({"max_queue_depth": 16}), "max_queue_depth: 16 is below queue_depth 32"), -32602);

        assert_eq!(e.err("iscsi_delete_target_node", json!({"name": "nope"}), "target node nope not found"), -19);
        e.ok("iscsi_delete_target_node", json!({"name": "iqn.2016-06.io.riser:d"}));
        assert!(e.target.find_node("iqn.2016-06.io.riser:d").is_none());
        assert!(n.is_deleted());
    }

    #[test]
    fn luns_claim_their_bdevs_until_the_node_goes() {
        let e = env();
        e.ok("iscsi_create_target_node", json!({"name": "d", "pg_ig_maps": [], "luns": [{"bdev_name": "Malloc0", "lun_id": 0}], "queue_depth": 8}));
        e.ok("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1"}));
        {
            let mut b = e.bdevs.lock().unwrap();
            assert_eq!(
                b.delete("Malloc0", None),
                Err(RegistryError::Claimed { name: "Malloc0".into(), owner: "iqn.2016-06.io.riser:d:lun0".into() })
            );
            assert!(matches!(b.delete("Malloc1", None), Err(RegistryError::Claimed { .. })));
        }
        // A claimed bdev cannot serve a second node.
        assert_eq!(
            e.err("iscsi_create_target_node", json!({"name": "e", "pg_ig_maps": [], "luns": [{"bdev_name": "Malloc2", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1}]}), "Malloc1 is already claimed"),
            -16
        );
        // ... and the refused node released what it had claimed first.
        assert_eq!(e.claimed_by("Malloc2"), None);
        e.ok("iscsi_delete_target_node", json!({"name": "d"}));
        assert_eq!(e.claimed_by("Malloc0"), None);
        let mut b = e.bdevs.lock().unwrap();
        assert_eq!(b.delete("Malloc0", None), Ok(()));
        assert_eq!(b.delete("Malloc1", None), Ok(()));
    }

    #[test]
    fn every_method_is_registered() {
        let e = env();
        let want = [
            "iscsi_set_options", "iscsi_get_options",
            "iscsi_create_portal_group", "iscsi_start_portal_group", "iscsi_delete_portal_group", "iscsi_get_portal_groups",
            "iscsi_create_initiator_group", "iscsi_initiator_group_add_initiators", "iscsi_initiator_group_remove_initiators",
            "iscsi_delete_initiator_group", "iscsi_get_initiator_groups",
            "iscsi_create_target_node", "iscsi_target_node_add_lun", "iscsi_target_node_add_pg_ig_maps",
            "iscsi_target_node_remove_pg_ig_maps", "iscsi_delete_target_node", "iscsi_get_target_nodes",
        ];
        assert_eq!(e.reg.methods(), want);
    }
}
