//! Unit tests of the apply plan: from two configurations in save_config's shape (and the
//! live sessions) to ordered steps and refusals, without a daemon.

use serde_json::{json, Value};

use super::plan::{make_plan, Config, Phase, Plan, Session};

/// A configuration as the running node's save_config writes it.
fn base() -> Value {
    json!({"subsystems": [
        {"subsystem": "iobuf", "config": []},
        {"subsystem": "bdev", "config": [
            {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 131072, "block_size": 512, "uuid": "2462ff3a-ab3b-44ff-b51d-d225baa7da83"}},
            {"method": "bdev_malloc_create", "params": {"name": "M0", "num_blocks": 32768, "block_size": 512, "uuid": "adc8c28f-4727-43db-a150-eb5ffe7b7700"}},
            {"method": "bdev_malloc_create", "params": {"name": "Spare", "num_blocks": 2048, "block_size": 512, "uuid": "bdc8c28f-4727-43db-a150-eb5ffe7b7700"}}
        ]},
        {"subsystem": "iscsi", "config": [
            {"method": "iscsi_set_options", "params": {"node_base": "iqn.2016-06.io.riser", "max_sessions": 128, "max_queue_depth": 64}},
            {"method": "iscsi_create_portal_group", "params": {"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3299"}], "private": false}},
            {"method": "iscsi_create_portal_group", "params": {"tag": 2, "portals": [{"host": "127.0.0.1", "port": "3300"}], "private": false}},
            {"method": "iscsi_create_initiator_group", "params": {"tag": 1, "initiators": ["ANY"], "netmasks": ["127.0.0.1/32"]}},
            {"method": "iscsi_create_auth_group", "params": {"tag": 2, "secrets": [{"user": "u", "secret": "s12345678901"}]}},
            {"method": "iscsi_create_target_node", "params": {
                "name": "iqn.2016-06.io.riser:t1", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
                "luns": [{"bdev_name": "Null0", "lun_id": 0}, {"bdev_name": "M0", "lun_id": 1}],
                "queue_depth": 64, "disable_chap": false, "require_chap": false, "mutual_chap": false,
                "chap_group": 0, "header_digest": false, "data_digest": false, "alias_name": "a1"}}
        ]}
    ]})
}

fn cfg(v: &Value) -> Config {
    Config::from_json(v).expect("a valid configuration")
}

/// The config array of subsystem `i` (0 iobuf, 1 bdev, 2 iscsi).
fn calls(v: &mut Value, i: usize) -> &mut Vec<Value> {
    v["subsystems"][i]["config"].as_array_mut().expect("config array")
}

/// The params of the first call of `method` whose `key` is `val`.
fn params<'a>(v: &'a mut Value, method: &str, key: &str, val: Value) -> &'a mut Value {
    v["subsystems"]
        .as_array_mut()
        .into_iter()
        .flatten()
        .flat_map(|s| s["config"].as_array_mut().into_iter().flatten())
        .find(|c| c["method"] == method && c["params"][key] == val)
        .map(|c| &mut c["params"])
        .unwrap_or_else(|| panic!("no {method} with {key} {val}"))
}

fn session(target: &str, in_flight: u64) -> Session {
    Session { target: target.into(), initiator: "iqn.2000-01.x:host".into(), addr: "127.0.0.1".into(), tsih: 3, pg_tag: 1, in_flight }
}

/// `method what` of each step, in order.
fn steps(p: &Plan) -> Vec<String> {
    p.steps.iter().map(|s| format!("{} {}", s.method, s.what)).collect()
}

fn plan(cur: &Value, want: &Value, sessions: &[Session]) -> Plan {
    let p = make_plan(&cfg(cur), &cfg(want), sessions);
    let phases: Vec<Phase> = p.steps.iter().map(|s| s.phase).collect();
    assert!(phases.windows(2).all(|w| w[0] <= w[1]), "steps in phase order: {phases:?}");
    p
}

#[test]
fn identical_configurations_give_an_empty_plan() {
    let p = plan(&base(), &base(), &[session("iqn.2016-06.io.riser:t1", 5)]);
    assert!(p.is_empty(), "{:?} {:?}", steps(&p), p.refusals);
    // Order does not matter, nor a uuid left out, nor a short node name, nor SPDK's no-ops.
    let mut w = base();
    calls(&mut w, 1).reverse();
    params(&mut w, "bdev_null_create", "name", json!("Null0")).as_object_mut().unwrap().remove("uuid");
    params(&mut w, "iscsi_create_target_node", "alias_name", json!("a1"))["name"] = json!("t1");
    calls(&mut w, 1).push(json!({"method": "bdev_wait_for_examine"}));
    let p = plan(&base(), &w, &[]);
    assert!(p.is_empty(), "{:?} {:?}", steps(&p), p.refusals);
}

#[test]
fn additions_come_in_a_safe_order() {
    let mut w = base();
    calls(&mut w, 1).push(json!({"method": "bdev_null_create", "params": {"name": "Null1", "num_blocks": 2048, "block_size": 512}}));
    params(&mut w, "bdev_malloc_create", "name", json!("M0"))["num_blocks"] = json!(65536);
    let node = params(&mut w, "iscsi_create_target_node", "alias_name", json!("a1"));
    node["luns"].as_array_mut().unwrap().push(json!({"bdev_name": "Null1", "lun_id": 2}));
    node["pg_ig_maps"].as_array_mut().unwrap().push(json!({"pg_tag": 2, "ig_tag": 3}));
    node["chap_group"] = json!(2);
    let ig = params(&mut w, "iscsi_create_initiator_group", "tag", json!(1));
    ig["initiators"] = json!(["ANY", "iqn.x:y"]);
    ig["netmasks"] = json!(["127.0.0.0/8"]);
    calls(&mut w, 2).push(json!({"method": "iscsi_create_initiator_group", "params": {"tag": 3, "initiators": ["ANY"], "netmasks": ["ANY"]}}));
    calls(&mut w, 2).push(json!({"method": "iscsi_create_target_node", "params": {"name": "t2", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 3}], "luns": [{"bdev_name": "Spare", "lun_id": 0}]}}));
    let p = plan(&base(), &w, &[session("iqn.2016-06.io.riser:t1", 0)]);
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    assert_eq!(
        steps(&p),
        [
            "bdev_null_create bdev Null1",
            "iscsi_create_initiator_group initiator group 3",
            "bdev_malloc_resize bdev M0 (size 16 MiB to 32 MiB)",
            "iscsi_initiator_group_add_initiators initiator group 1 (add)",
            "iscsi_create_target_node target node iqn.2016-06.io.riser:t2",
            "iscsi_target_node_add_lun LUN 2 of iqn.2016-06.io.riser:t1 (bdev Null1)",
            "iscsi_target_node_add_pg_ig_maps maps 2:3 of iqn.2016-06.io.riser:t1",
            "iscsi_target_node_set_auth CHAP of target node iqn.2016-06.io.riser:t1",
            "iscsi_initiator_group_remove_initiators initiator group 1 (remove)",
        ]
    );
    let resize = &p.steps[2];
    assert_eq!(resize.params, json!({"name": "M0", "new_size": 32}));
    assert_eq!(resize.sessions.len(), 1, "the session on t1 sees the capacity change");
    assert_eq!(p.steps[3].params, json!({"tag": 1, "initiators": ["iqn.x:y"], "netmasks": ["127.0.0.0/8"]}));
    assert_eq!(p.steps[8].params, json!({"tag": 1, "netmasks": ["127.0.0.1/32"]}));
    assert_eq!(p.steps[7].params["chap_group"], 2);
    assert!(p.needs_force().next().is_none(), "adding needs no --force");
}

#[test]
fn removals_go_before_what_they_use_is_deleted() {
    let mut w = base();
    // t1 goes, and so do M0 (its LUN 1), portal group 2, initiator group 1 and auth group 2;
    // a new t1 in name only would be created again: here it is just gone.
    calls(&mut w, 2).retain(|c| c["method"] != "iscsi_create_target_node" && c["method"] != "iscsi_create_auth_group");
    calls(&mut w, 2).retain(|c| !(c["method"] == "iscsi_create_portal_group" && c["params"]["tag"] == 2));
    calls(&mut w, 2).retain(|c| c["method"] != "iscsi_create_initiator_group");
    calls(&mut w, 1).retain(|c| c["params"]["name"] != "M0");
    let p = plan(&base(), &w, &[]);
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    assert_eq!(
        steps(&p),
        [
            "iscsi_delete_target_node target node iqn.2016-06.io.riser:t1",
            "iscsi_delete_auth_group auth group 2",
            "iscsi_delete_initiator_group initiator group 1",
            "iscsi_delete_portal_group portal group 2",
            "bdev_malloc_delete bdev M0",
        ]
    );
    assert_eq!(p.steps[0].params, json!({"name": "iqn.2016-06.io.riser:t1", "force": false}));
}

#[test]
fn removing_a_lun_or_target_with_sessions_needs_force_and_names_them() {
    let mut w = base();
    let node = params(&mut w, "iscsi_create_target_node", "alias_name", json!("a1"));
    node["luns"].as_array_mut().unwrap().retain(|l| l["lun_id"] != 1);
    node["pg_ig_maps"] = json!([]);
    calls(&mut w, 1).retain(|c| c["params"]["name"] != "M0");
    let live = [session("iqn.2016-06.io.riser:t1", 7), session("iqn.2016-06.io.riser:other", 1)];
    let p = plan(&base(), &w, &live);
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    assert_eq!(
        steps(&p),
        [
            "iscsi_target_node_remove_pg_ig_maps maps 1:1 of iqn.2016-06.io.riser:t1",
            "iscsi_target_node_remove_lun LUN 1 of iqn.2016-06.io.riser:t1 (bdev M0)",
            "bdev_malloc_delete bdev M0",
        ]
    );
    let forced: Vec<_> = p.needs_force().collect();
    assert_eq!(forced.len(), 1);
    let why = forced[0].force.as_deref().unwrap();
    assert!(why.contains("TSIH 3") && why.contains("7 command(s) in flight"), "{why}");
    assert!(!why.contains(":other"), "only the sessions of t1: {why}");
    assert_eq!(p.steps[0].sessions.len(), 1, "the unmapped session is named");
    // Without sessions the same plan needs no --force.
    assert!(plan(&base(), &w, &[]).needs_force().next().is_none());
    // A whole target with sessions.
    let mut w = base();
    calls(&mut w, 2).retain(|c| c["method"] != "iscsi_create_target_node");
    let p = plan(&base(), &w, &live);
    assert_eq!(p.steps[0].params, json!({"name": "iqn.2016-06.io.riser:t1", "force": true}));
    assert!(p.steps[0].force.is_some());
}

#[test]
fn a_change_without_a_live_call_is_replaced_when_unused_and_refused_otherwise() {
    // Spare (no LUN uses it) changes block size: deleted, then created again.
    let mut w = base();
    params(&mut w, "bdev_malloc_create", "name", json!("Spare"))["block_size"] = json!(4096);
    let p = plan(&base(), &w, &[]);
    assert_eq!(steps(&p), ["bdev_malloc_delete bdev Spare (to create it again)", "bdev_malloc_create bdev Spare"]);
    assert_eq!(p.steps[0].phase, Phase::ReplaceDelete);
    // M0 (LUN 1 of t1) changes block size: refused, naming the field and the user.
    let mut w = base();
    params(&mut w, "bdev_malloc_create", "name", json!("M0"))["block_size"] = json!(4096);
    let p = plan(&base(), &w, &[]);
    assert!(p.steps.is_empty());
    assert_eq!(p.refusals.len(), 1);
    assert!(p.refusals[0].contains("block_size") && p.refusals[0].contains("iqn.2016-06.io.riser:t1"), "{}", p.refusals[0]);
    // Portal group 1 (mapped) changes portals: refused; portal group 2 (unused): replaced.
    let mut w = base();
    params(&mut w, "iscsi_create_portal_group", "tag", json!(1))["portals"] = json!([{"host": "127.0.0.1", "port": "4000"}]);
    params(&mut w, "iscsi_create_portal_group", "tag", json!(2))["portals"] = json!([{"host": "127.0.0.1", "port": "4001"}]);
    let p = plan(&base(), &w, &[]);
    assert_eq!(p.refusals.len(), 1);
    assert!(p.refusals[0].starts_with("portal group 1: portals"), "{}", p.refusals[0]);
    assert_eq!(steps(&p), ["iscsi_delete_portal_group portal group 2 (to create it again)", "iscsi_create_portal_group portal group 2"]);
    // A node's queue depth: deleted and created again, with --force while it has sessions.
    let mut w = base();
    params(&mut w, "iscsi_create_target_node", "alias_name", json!("a1"))["queue_depth"] = json!(32);
    let p = plan(&base(), &w, &[session("iqn.2016-06.io.riser:t1", 0)]);
    assert_eq!(p.steps.len(), 2);
    assert_eq!((p.steps[0].method, p.steps[1].method), ("iscsi_delete_target_node", "iscsi_create_target_node"));
    assert!(p.steps[0].force.as_deref().unwrap_or_default().contains("queue_depth"));
}

#[test]
fn sizes_and_unknown_methods_that_cannot_be_applied_are_refused() {
    // A null device only grows; a size that is not whole MiB has no resize call.
    let mut w = base();
    params(&mut w, "bdev_null_create", "name", json!("Null0"))["num_blocks"] = json!(2048);
    params(&mut w, "bdev_malloc_create", "name", json!("M0"))["num_blocks"] = json!(32769);
    let p = plan(&base(), &w, &[]);
    assert!(p.steps.is_empty());
    assert_eq!(p.refusals.len(), 2, "{:?}", p.refusals);
    assert!(p.refusals.iter().any(|r| r.contains("only grow")));
    assert!(p.refusals.iter().any(|r| r.contains("whole number of MiB")));
    // A method no section owns: the same on both sides, or refused (and secrets hidden).
    let mut w = base();
    calls(&mut w, 1).push(json!({"method": "bdev_made_up", "params": {"name": "X", "secret": "hidden!"}}));
    let p = plan(&base(), &w, &[]);
    assert_eq!(p.refusals.len(), 1);
    assert!(p.refusals[0].contains("bdev_made_up") && !p.refusals[0].contains("hidden!"), "{}", p.refusals[0]);
    assert!(plan(&w, &w, &[]).is_empty());
    // A LUN on a device the file does not create.
    let mut w = base();
    params(&mut w, "iscsi_create_target_node", "alias_name", json!("a1"))["luns"][0]["bdev_name"] = json!("Nope");
    let p = plan(&base(), &w, &[]);
    assert!(p.refusals.iter().any(|r| r.contains("bdev Nope")), "{:?}", p.refusals);
}

#[test]
fn auth_secrets_and_options_change_in_place_and_are_never_printed() {
    let mut w = base();
    params(&mut w, "iscsi_create_auth_group", "tag", json!(2))["secrets"] =
        json!([{"user": "u", "secret": "changed12345"}, {"user": "v", "secret": "another12345"}]);
    params(&mut w, "iscsi_set_options", "max_sessions", json!(128))["max_sessions"] = json!(64);
    calls(&mut w, 0).push(json!({"method": "iobuf_set_options", "params": {"max_bytes": 1 << 26}}));
    let p = plan(&base(), &w, &[]);
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    assert_eq!(
        steps(&p),
        [
            "iobuf_set_options I/O buffer options",
            "iscsi_set_options iSCSI options (max_sessions)",
            "iscsi_auth_group_remove_secret auth group 2, user u (changed)",
            "iscsi_auth_group_add_secret auth group 2, user u",
            "iscsi_auth_group_add_secret auth group 2, user v",
        ]
    );
    assert_eq!(p.steps[1].params, json!({"max_sessions": 64}), "only what changed");
    assert_eq!(p.steps[3].params["secret"], "changed12345", "sent as is");
    let shown: String = p.steps.iter().map(|s| s.to_string()).collect();
    assert!(!shown.contains("changed12345") && !shown.contains("another12345"), "{shown}");
    // The node has iobuf options the file lacks: refused rather than guessing the defaults.
    let p = plan(&w, &base(), &[]);
    assert!(p.refusals.iter().any(|r| r.starts_with("iobuf_set_options")), "{:?}", p.refusals);
}

#[test]
fn alua_and_redirects_follow_the_file() {
    let mut w = base();
    calls(&mut w, 2).push(json!({"method": "iscsi_target_node_set_redirect", "params": {"name": "iqn.2016-06.io.riser:t1", "pg_tag": 1, "redirect_host": "10.0.0.2", "redirect_port": "3260"}}));
    calls(&mut w, 2).push(json!({"method": "iscsi_target_node_set_alua", "params": {"name": "iqn.2016-06.io.riser:t1", "groups": [{"id": 1, "state": "active_optimized"}]}}));
    let p = plan(&base(), &w, &[]);
    assert_eq!(
        steps(&p),
        [
            "iscsi_target_node_set_alua ALUA of iqn.2016-06.io.riser:t1",
            "iscsi_target_node_set_redirect redirect of iqn.2016-06.io.riser:t1 through portal group 1",
        ]
    );
    let back = plan(&w, &base(), &[]);
    assert_eq!(back.steps.len(), 2);
    assert_eq!(back.steps[0].params, json!({"name": "iqn.2016-06.io.riser:t1", "pg_tag": 1}), "cleared first");
    assert_eq!(back.steps[1].params, json!({"name": "iqn.2016-06.io.riser:t1", "groups": []}));
}

#[test]
fn a_ceph_cluster_is_registered_before_its_devices_and_unregistered_after() {
    let mut w = base();
    calls(&mut w, 1).push(json!({"method": "bdev_rbd_create", "params": {"name": "Rbd0", "pool_name": "rbd", "rbd_name": "img", "block_size": 512, "cluster_name": "ceph"}}));
    calls(&mut w, 1).push(
        json!({"method": "bdev_rbd_register_cluster", "params": {"name": "ceph", "config_param": {"mon_host": "10.0.0.1", "key": "AQD-not-shown"}}}),
    );
    let p = plan(&base(), &w, &[]);
    assert_eq!(steps(&p), ["bdev_rbd_register_cluster cluster ceph", "bdev_rbd_create bdev Rbd0"]);
    assert!(!p.steps[0].to_string().contains("AQD-not-shown"), "{}", p.steps[0]);
    let back = plan(&w, &base(), &[]);
    assert_eq!(steps(&back), ["bdev_rbd_delete bdev Rbd0", "bdev_rbd_unregister_cluster cluster ceph"]);
}

#[test]
fn sections_own_distinct_methods() {
    let mut seen = std::collections::BTreeSet::new();
    for s in super::plan::SECTIONS {
        for m in s.methods {
            assert!(seen.insert(*m), "{m} owned by two sections ({})", s.name);
        }
    }
}

#[test]
fn a_portal_groups_discovery_chap_is_set_after_its_auth_group_and_never_dropped_silently() {
    let cur = base();
    let mut want = base();
    calls(&mut want, 2).push(json!({"method": "iscsi_create_auth_group", "params": {"tag": 3, "secrets": [{"user": "d", "secret": "d12345678901"}]}}));
    let auth = json!({"method": "iscsi_portal_group_set_auth", "params": {"tag": 2, "disable_chap": false, "require_chap": true, "mutual_chap": false, "chap_group": 3}});
    calls(&mut want, 2).push(auth.clone());
    let p = make_plan(&cfg(&cur), &cfg(&want), &[]);
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    assert_eq!(steps(&p), ["iscsi_create_auth_group auth group 3", "iscsi_portal_group_set_auth discovery CHAP of portal group 2"]);
    // The same again: nothing to do.
    assert!(make_plan(&cfg(&want), &cfg(&want), &[]).is_empty());
    // Dropped from the file while the group stays: refused (no RPC goes back to the global policy).
    let p = make_plan(&cfg(&want), &cfg(&cur), &[]);
    assert!(p.refusals.iter().any(|r| r.contains("portal group 2") && r.contains("global policy")), "{:?}", p.refusals);
    // A group created again (its portals changed) gets its policy again.
    let mut moved = want.clone();
    params(&mut moved, "iscsi_create_portal_group", "tag", json!(2))["portals"][0]["port"] = json!("3301");
    let p = make_plan(&cfg(&want), &cfg(&moved), &[]);
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    let s = steps(&p);
    assert_eq!(s.last().map(String::as_str), Some("iscsi_portal_group_set_auth discovery CHAP of portal group 2"), "{s:?}");
    // For a group the file does not have: refused.
    let mut orphan = base();
    calls(&mut orphan, 2).push(json!({"method": "iscsi_portal_group_set_auth", "params": {"tag": 9, "disable_chap": true}}));
    assert!(make_plan(&cfg(&cur), &cfg(&orphan), &[]).refusals.iter().any(|r| r.contains("portal group 9")));
}

#[test]
fn rate_limits_follow_the_file_and_come_back_with_a_device_or_lun_created_again() {
    let t1 = "iqn.2016-06.io.riser:t1";
    let mut cur = base();
    calls(&mut cur, 1).push(json!({"method": "bdev_set_qos_limit", "params": {"name": "Null0", "rw_ios_per_sec": 2000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0}}));
    calls(&mut cur, 2).push(json!({"method": "iscsi_target_node_set_qos_limit", "params": {"name": t1, "initiator_name": "iqn.2000-01.x:host", "lun_id": 0, "rw_ios_per_sec": 1000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0}}));
    assert!(make_plan(&cfg(&cur), &cfg(&cur), &[]).is_empty());
    // Changed, added on another device, removed for the initiator (all four set, 0 removes).
    let mut want = cur.clone();
    params(&mut want, "bdev_set_qos_limit", "name", json!("Null0"))["rw_ios_per_sec"] = json!(3000);
    calls(&mut want, 1).push(json!({"method": "bdev_set_qos_limit", "params": {"name": "M0", "w_mbytes_per_sec": 40}}));
    calls(&mut want, 2).retain(|c| c["method"] != "iscsi_target_node_set_qos_limit");
    let p = make_plan(&cfg(&cur), &cfg(&want), &[]);
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    assert_eq!(
        steps(&p),
        [
            "bdev_set_qos_limit rate limits of bdev M0",
            "bdev_set_qos_limit rate limits of bdev Null0",
            "iscsi_target_node_set_qos_limit rate limits of iqn.2000-01.x:host on LUN 0 of iqn.2016-06.io.riser:t1",
        ]
    );
    assert_eq!(p.steps[0].params["w_mbytes_per_sec"], 40);
    assert_eq!(p.steps[0].params["rw_ios_per_sec"], 0);
    assert_eq!(p.steps[2].params["rw_ios_per_sec"], 0);
    assert!(p.steps.iter().all(|s| s.phase >= Phase::Qos));
    // A device created again (new block size, unused) gets its limit again, after it exists.
    let mut cur2 = base();
    calls(&mut cur2, 1).push(json!({"method": "bdev_set_qos_limit", "params": {"name": "Spare", "rw_ios_per_sec": 5000}}));
    let mut want2 = cur2.clone();
    params(&mut want2, "bdev_malloc_create", "name", json!("Spare"))["block_size"] = json!(4096);
    params(&mut want2, "bdev_malloc_create", "name", json!("Spare"))["num_blocks"] = json!(256);
    let p = make_plan(&cfg(&cur2), &cfg(&want2), &[]);
    assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    let s = steps(&p);
    let create = s.iter().position(|x| x.starts_with("bdev_malloc_create")).expect("created again");
    let qos = s.iter().position(|x| x.starts_with("bdev_set_qos_limit")).expect("limit set again");
    assert!(create < qos, "{s:?}");
    // A limit on a device or a LUN the file does not have: refused.
    let mut orphan = base();
    calls(&mut orphan, 1).push(json!({"method": "bdev_set_qos_limit", "params": {"name": "Nope", "rw_ios_per_sec": 1000}}));
    calls(&mut orphan, 2).push(json!({"method": "iscsi_target_node_set_qos_limit", "params": {"name": t1, "initiator_name": "x", "lun_id": 7, "rw_ios_per_sec": 1000}}));
    let p = make_plan(&cfg(&base()), &cfg(&orphan), &[]);
    assert_eq!(p.refusals.len(), 2, "{:?}", p.refusals);
}
