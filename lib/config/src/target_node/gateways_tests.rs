//! A node over a device with a gateway group (issue 23), driven through a fake group
//! (`riser_bdev::testing`): what the node publishes, ALUA that follows the members,
//! failback by policy, this gateway fenced, and the RPC side (validation, save_config).

use std::sync::{Arc, Mutex};

use riser_bdev::testing::{FakeGatewayGroup, GroupedBdev};
use riser_bdev::GatewayGroup;
use riser_bdev::MemberState::{Fenced, Live};
use riser_scsi::cdb::Cdb;
use riser_scsi::{Asc, Nexus};
use serde_json::{json, Value};

use crate::testing::*;
use crate::TargetNode;

const NODE: &str = "iqn.2016-06.io.riser:gw";
const RTPG: [u8; 12] = [0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];

/// `Malloc0` replaced by the same device with a fake group in which this gateway is
/// member 1 ("a:1"); portal group 1 and initiator group 1 for the node `gw` on it.
fn setup() -> (Env, Arc<FakeGatewayGroup>) {
    let e = env();
    let g = FakeGatewayGroup::new(1, "a:1");
    {
        let mut b = e.bdevs.lock().unwrap();
        let inner = b.get("Malloc0").unwrap();
        b.delete("Malloc0", None).unwrap();
        b.register(GroupedBdev::new(inner, g.clone())).unwrap();
    }
    e.ok("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3260"}]}));
    e.ok("iscsi_create_portal_group", json!({"tag": 3, "portals": [{"host": "127.0.0.1", "port": "3262"}]}));
    e.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
    e.ok(
        "iscsi_create_target_node",
        json!({"name": "gw", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
        "luns": [{"bdev_name": "Malloc0", "lun_id": 0}]}),
    );
    (e, g)
}

fn node(e: &Env) -> Arc<TargetNode> {
    e.target.find_node(NODE).unwrap()
}

/// A nexus through target port group `tpg`, known to LUN 0 with no unit attention pending.
fn nexus(e: &Env, tpg: u16) -> Nexus {
    let n = node(e);
    let nx = Nexus::new("iqn.1994-05.com.redhat:x", 0x0023_0000_0000 + tpg as u64, NODE, tpg).with_alua(n.alua().clone());
    let lun = n.luns().1[0].scsi.clone();
    lun.establish_ua(&nx, Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET);
    lun.clear_ua(&nx, Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET);
    assert!(lun.pending_ua(&nx).is_empty());
    nx
}

/// The unit attentions pending for `nx` on LUN 0, cleared.
fn take_ua(e: &Env, nx: &Nexus) -> Vec<Asc> {
    let lun = node(e).luns().1[0].scsi.clone();
    let ua = lun.pending_ua(nx);
    for a in &ua {
        lun.clear_ua(nx, *a);
    }
    ua
}

/// (group, state code, PREF, STATUS CODE) of REPORT TARGET PORT GROUPS through `nx`.
fn rtpg(nx: &Nexus) -> Vec<(u16, u8, bool, u8)> {
    let d = riser_scsi::alua::report_target_port_groups(nx, &Cdb::new(&RTPG));
    let mut out = Vec::new();
    let mut i = 4;
    while i + 8 <= d.len() {
        out.push((u16::from_be_bytes([d[i + 2], d[i + 3]]), d[i] & 0x0F, d[i] & 0x80 != 0, d[i + 5]));
        i += 8 + 4 * d[i + 7] as usize;
    }
    out
}

/// (tpg_id, state, preferred_state, reason) of `iscsi_get_target_nodes`.
fn shown(e: &Env) -> Vec<(u64, String, String, String)> {
    let nodes = e.ok("iscsi_get_target_nodes", json!(null));
    nodes[0]["alua_groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let s = |k: &str| g[k].as_str().unwrap_or("").to_string();
            (g["tpg_id"].as_u64().unwrap(), s("state"), s("preferred_state"), s("reason"))
        })
        .collect()
}

fn row(id: u64, state: &str, pref: &str, reason: &str) -> (u64, String, String, String) {
    (id, state.into(), pref.into(), reason.into())
}

const AASC: Asc = Asc::ASYMMETRIC_ACCESS_STATE_CHANGED;

#[test]
fn the_node_publishes_what_it_serves_and_a_fenced_peer_moves_the_local_group_to_optimized() {
    let (e, g) = setup();
    assert_eq!(g.served_calls(), [vec![1]], "the LUN's export publishes the local target port group");
    assert_eq!(g.subscribers(), 1);
    // This gateway (group 1) standby, the peer's group 2 active/optimized and preferred.
    e.ok(
        "iscsi_target_node_set_alua",
        json!({"name": "gw", "groups": [
        {"tpg_id": 1, "state": "standby"}, {"tpg_id": 2, "state": "active_optimized", "pref": true}]}),
    );
    let nx = nexus(&e, 1);
    g.set_peer(2, "b:2", &[2], Live);
    assert!(take_ua(&e, &nx).is_empty(), "a live peer changes nothing");
    assert_eq!(rtpg(&nx), [(1, 2, false, 2), (2, 0, true, 0)]);

    // The peer is fenced: its group unavailable, ours takes over.
    g.set_peer(2, "b:2", &[2], Fenced);
    assert_eq!(take_ua(&e, &nx), [AASC], "ASYMMETRIC ACCESS STATE CHANGED");
    assert_eq!(rtpg(&nx), [(1, 0, false, 2), (2, 3, true, 2)], "RTPG: 1 active/optimized, 2 unavailable, implicit changes");
    assert_eq!(shown(&e), [row(1, "active_optimized", "standby", "taking_over"), row(2, "unavailable", "active_optimized", "fenced")]);
    let nodes = e.ok("iscsi_get_target_nodes", json!(null));
    assert_eq!(nodes[0]["alua_failback"], "auto");
    assert_eq!(nodes[0]["alua_groups"][1]["reason_text"], "served only by fenced gateway(s) b:2");
    assert_eq!(
        nodes[0]["gateways"],
        json!([{"lun_id": 0, "bdev_name": "Malloc0", "group": "fake group", "fenced": false, "members": [
            {"id": 1, "name": "a:1", "addr": "10.0.0.1:0/1", "served": [1], "state": "live", "self": true},
            {"id": 2, "name": "b:2", "addr": "10.0.0.2:0/2", "served": [2], "state": "fenced", "self": false}]}])
    );
    // Media access through group 1 works again, the RPC view keeps the preferred states.
    let read = Cdb::new(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(node(&e).alua().check(1, &read), Ok(()));
    let saved = e.target.config_json();
    let set = saved.iter().find(|c| c["method"] == "iscsi_target_node_set_alua").unwrap();
    assert_eq!(set["params"]["groups"][0]["state"], "standby", "save_config keeps the preferred states");

    // The peer rejoins (a new member serving group 2): auto failback.
    g.set_peer(3, "b:3", &[2], Live);
    assert_eq!(take_ua(&e, &nx), [AASC]);
    assert_eq!(rtpg(&nx), [(1, 2, false, 2), (2, 0, true, 2)]);
    assert_eq!(shown(&e), [row(1, "standby", "standby", ""), row(2, "active_optimized", "active_optimized", "")]);

    // Maps follow: another local portal group is published, and none once the node goes.
    e.ok("iscsi_target_node_add_pg_ig_maps", json!({"name": "gw", "pg_ig_maps": [{"pg_tag": 3, "ig_tag": 1}]}));
    assert_eq!(g.served_calls().last(), Some(&vec![1, 3]));
    e.ok("iscsi_target_node_remove_pg_ig_maps", json!({"name": "gw", "pg_ig_maps": [{"pg_tag": 3, "ig_tag": 1}]}));
    assert_eq!(g.served_calls().last(), Some(&vec![1]));
    let alua = node(&e).alua().clone();
    e.ok("iscsi_delete_target_node", json!({"name": "gw"}));
    assert_eq!(g.served_calls().last(), Some(&vec![]));
    g.set_peer(3, "b:3", &[2], Fenced);
    assert_eq!(alua.state_of(2), riser_scsi::AccessState::ActiveOptimized, "a deleted node no longer follows the group");
}

#[test]
fn manual_failback_keeps_the_failed_over_states_until_the_administrator_fails_back() {
    let (e, g) = setup();
    e.ok(
        "iscsi_target_node_set_alua",
        json!({"name": "gw", "failback": "manual", "groups": [
        {"tpg_id": 1, "state": "standby"}, {"tpg_id": 2, "state": "active_optimized", "pref": true}]}),
    );
    let nx = nexus(&e, 1);
    g.set_peer(2, "b:2", &[2], Live);
    g.set_peer(2, "b:2", &[2], Fenced);
    assert_eq!(take_ua(&e, &nx), [AASC]);
    // Rejoined: nothing moves.
    g.set_peer(3, "b:3", &[2], Live);
    assert!(take_ua(&e, &nx).is_empty());
    assert_eq!(rtpg(&nx), [(1, 0, false, 2), (2, 3, true, 2)]);
    assert_eq!(shown(&e), [row(1, "active_optimized", "standby", "taking_over"), row(2, "unavailable", "active_optimized", "held")]);
    assert_eq!(e.ok("iscsi_get_target_nodes", json!(null))[0]["alua_failback"], "manual");
    // The administrator fails back.
    assert_eq!(e.ok("iscsi_target_node_alua_failback", json!({"name": "gw"})), json!(true));
    assert_eq!(take_ua(&e, &nx), [AASC]);
    assert_eq!(rtpg(&nx), [(1, 2, false, 2), (2, 0, true, 2)]);
    // Again, and this time setting the held group's state ends it.
    g.set_peer(3, "b:3", &[2], Fenced);
    g.set_peer(4, "b:4", &[2], Live);
    assert_eq!(shown(&e)[1], row(2, "unavailable", "active_optimized", "held"));
    e.ok("iscsi_target_node_set_alua_state", json!({"name": "gw", "tpg_id": 2, "state": "active_optimized"}));
    assert_eq!(shown(&e), [row(1, "standby", "standby", ""), row(2, "active_optimized", "active_optimized", "")]);
    // Omitting failback keeps the policy.
    e.ok("iscsi_target_node_set_alua", json!({"name": "gw", "groups": [{"tpg_id": 1, "state": "active_optimized"}]}));
    assert_eq!(node(&e).alua_failback(), riser_scsi::Failback::Manual);
}

#[test]
fn a_fenced_gateway_drops_its_sessions_and_reports_its_groups_unavailable_until_it_rejoins() {
    let (e, g) = setup();
    let dropped = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let d = dropped.clone();
    e.target.on_node_fenced(move |n, why| d.lock().unwrap().push((n.name().to_string(), why.to_string())));
    // No ALUA description at all: the group reports active/optimized, alone.
    let nx = nexus(&e, 1);
    g.set_peer(2, "b:2", &[2], Live);
    assert_eq!(rtpg(&nx), [(1, 0, true, 0)]);
    g.fence_me();
    assert_eq!(dropped.lock().unwrap().len(), 1, "the session layer is told once");
    let (name, why) = dropped.lock().unwrap()[0].clone();
    assert_eq!(name, NODE);
    assert!(why.contains("this gateway was fenced from fake group (LUN 0, bdev Malloc0)"), "{why}");
    assert_eq!(take_ua(&e, &nx), [AASC]);
    assert_eq!(rtpg(&nx), [(1, 3, false, 2)], "unavailable, implicit change");
    let read = Cdb::new(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    let err = node(&e).alua().check(1, &read).expect_err("no media access while fenced");
    assert_eq!(err, riser_scsi::CmdError::check(riser_scsi::SenseKey::NotReady, Asc::LUN_NOT_ACCESSIBLE_UNAVAILABLE));
    let nodes = e.ok("iscsi_get_target_nodes", json!(null));
    assert_eq!(nodes[0]["gateways"][0]["fenced"], true);
    assert_eq!(
        nodes[0]["alua_groups"],
        json!([{"tpg_id": 1, "state": "unavailable", "preferred_state": "active_optimized", "pref": false, "local": true,
                "described": false, "reason": "self_fenced", "reason_text": "this gateway is fenced"}])
    );
    // Nothing of this is configuration.
    assert!(!e.target.config_json().iter().any(|c| c["method"] == "iscsi_target_node_set_alua"));
    // Rejoined: publishes what it serves as the new member, back to active/optimized.
    let before = g.served_calls().len();
    g.rejoin_me(7);
    assert_eq!(g.served_calls()[before..], [vec![1]]);
    assert_eq!(g.me().served, [1]);
    assert_eq!(take_ua(&e, &nx), [AASC]);
    assert_eq!(rtpg(&nx), [(1, 0, true, 0)]);
    assert!(e.ok("iscsi_get_target_nodes", json!(null))[0].get("alua_groups").is_none());
    assert_eq!(dropped.lock().unwrap().len(), 1);
}

#[test]
fn failback_is_validated_saved_and_replayed() {
    let (e, _g) = setup();
    let m = "iscsi_target_node_set_alua";
    let groups = json!([{"tpg_id": 1, "state": "active_optimized"}]);
    let c =
        e.err(m, json!({"name": "gw", "groups": groups, "failback": "sometimes"}), "failback: unknown policy \"sometimes\" (one of auto, manual)");
    assert_eq!(c, -32602);
    assert_eq!(e.err(m, json!({"name": "gw", "groups": groups, "failback": 1}), "failback"), -32602);
    assert_eq!(e.err("iscsi_target_node_alua_failback", json!({"name": "nope"}), "not found"), -19);
    assert_eq!(e.err("iscsi_target_node_alua_failback", json!({"name": "gw", "x": 1}), "x"), -32602);
    // A refused call changed nothing.
    assert!(e.ok("iscsi_get_target_nodes", json!(null))[0].get("alua_groups").is_none());
    e.ok(m, json!({"name": "gw", "groups": groups, "failback": "manual"}));
    let dump = e.target.config_json();
    let set = dump.iter().find(|c| c["method"] == m).expect("saved");
    assert_eq!(set["params"], json!({"name": NODE, "groups": [{"tpg_id": 1, "state": "active_optimized", "pref": false}], "failback": "manual"}));
    // Replayed into a fresh target (plain bdevs: the policy is configuration, not liveness).
    let b = env();
    for c in &dump {
        b.ok(c["method"].as_str().unwrap(), c["params"].clone());
    }
    assert_eq!(b.target.config_json(), dump);
    // Manual failback with no groups is still saved; auto with none is not.
    e.ok(m, json!({"name": "gw", "groups": []}));
    let set: Vec<Value> = e.target.config_json().into_iter().filter(|c| c["method"] == m).collect();
    assert_eq!(set[0]["params"], json!({"name": NODE, "groups": [], "failback": "manual"}));
    e.ok(m, json!({"name": "gw", "groups": [], "failback": "auto"}));
    assert!(!e.target.config_json().iter().any(|c| c["method"] == m));
}
