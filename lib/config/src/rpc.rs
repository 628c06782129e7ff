//! The iSCSI JSON-RPC methods: SPDK's names, parameters and result shapes. Each concept file
//! registers its own methods (options, portal groups, initiator groups, auth groups, target
//! nodes), each with its parameter types beside its handlers, shared with the `riser-rpc` CLI.
//! Creating and deleting return `true`; getters return SPDK's objects. Errors: -32602 for a
//! bad value (the message names the field), -17 exists, -19 not found, -16 in use.

use std::sync::Arc;

use riser_rpc::{RpcError, RpcRegistry};
use serde_json::Value;

use crate::{auth_group, initiator_group, options, portal_group, target_node, IscsiTarget, TargetError};

/// A change's result as the RPC answers it: `true`, or the error with its SPDK code.
pub(crate) fn ok(r: Result<(), TargetError>) -> Result<Value, RpcError> {
    r.map(|()| Value::Bool(true)).map_err(RpcError::from)
}

/// Registers the iSCSI methods on `reg`, all acting on `target`.
pub fn register(reg: &mut RpcRegistry, target: Arc<IscsiTarget>) {
    options::register(reg, &target);
    portal_group::register(reg, &target);
    initiator_group::register(reg, &target);
    auth_group::register(reg, &target);
    target_node::register(reg, &target);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::*;

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
                "chap_group": 0, "header_digest": true, "data_digest": false,
                "redirects": [{"pg_tag": 1, "redirect_host": "10.1.1.1", "redirect_port": "3262"}]
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
        // SPDK's 21, and riser's max_tx_queue_bytes, data_out_timeout, login_timeout,
        // max_logins, max_logins_per_source, max_discovery_sessions and
        // max_discovery_sessions_per_source, discovery_idle_timeout.
        assert_eq!(o.as_object().map(|m| m.len()), Some(29));
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
            "iscsi_create_auth_group", "iscsi_create_auth_group",
            "iscsi_create_target_node", "iscsi_target_node_set_redirect", "iscsi_create_target_node",
        ]);
        let b = env();
        for c in &dump {
            b.ok(c["method"].as_str().unwrap(), c["params"].clone());
        }
        assert_eq!(b.target.config_json(), dump);
        for m in ["iscsi_get_portal_groups", "iscsi_get_initiator_groups", "iscsi_get_auth_groups", "iscsi_get_target_nodes", "iscsi_get_options"] {
            assert_eq!(a.ok(m, Value::Null), b.ok(m, Value::Null), "{m}");
        }
        // Auth groups (secrets included), discovery and node CHAP came back.
        assert_eq!(b.target.discovery_auth(), a.target.discovery_auth());
        assert_eq!(b.target.discovery_auth().secrets.len(), 1);
        let (na, nb) = (a.target.target_nodes(), b.target.target_nodes());
        assert_eq!(b.target.node_auth(&nb[1]), a.target.node_auth(&na[1]));
        assert_eq!(b.target.node_auth(&nb[1]).secrets.len(), 2);
        // The waiting portal group came back waiting.
        assert_eq!(b.target.portal_groups().iter().map(|g| g.started).collect::<Vec<_>>(), [true, false]);
        // An empty state dumps only the options.
        assert_eq!(env().target.config_json().len(), 1);
    }

    #[test]
    fn every_method_is_registered() {
        let e = env();
        let want = [
            "iscsi_set_options", "iscsi_get_options", "iscsi_set_discovery_auth",
            "iscsi_create_portal_group", "iscsi_start_portal_group", "iscsi_delete_portal_group", "iscsi_get_portal_groups",
            "iscsi_portal_group_set_auth",
            "iscsi_create_initiator_group", "iscsi_initiator_group_add_initiators", "iscsi_initiator_group_remove_initiators",
            "iscsi_delete_initiator_group", "iscsi_get_initiator_groups",
            "iscsi_create_auth_group", "iscsi_delete_auth_group", "iscsi_get_auth_groups",
            "iscsi_auth_group_add_secret", "iscsi_auth_group_remove_secret",
            "iscsi_create_target_node", "iscsi_target_node_add_lun", "iscsi_target_node_remove_lun", "iscsi_target_node_add_pg_ig_maps",
            "iscsi_target_node_remove_pg_ig_maps", "iscsi_target_node_set_auth", "iscsi_delete_target_node",
            "iscsi_get_target_nodes", "iscsi_target_node_set_alua", "iscsi_target_node_set_alua_state",
            "iscsi_target_node_alua_failback", "iscsi_target_node_set_redirect",
            "iscsi_target_node_set_qos_limit",
        ];
        assert_eq!(e.reg.methods(), want);
    }
}

#[cfg(test)]
mod params_tests;
