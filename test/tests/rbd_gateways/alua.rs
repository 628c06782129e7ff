//! ALUA across two gateways (issue 15, item 2): two riser processes export one RBD image
//! (same bdev uuid, so one logical unit) through portal groups 1 and 2, both told the same
//! ALUA description. REPORT TARGET PORT GROUPS through each lists both groups with their
//! states; a state change by RPC raises ASYMMETRIC ACCESS STATE CHANGED and a standby group
//! answers NOT READY to media access; then libiscsi's MultipathIO tests run with one URL per
//! gateway.

use riser_tests::ceph::CephCluster;
use riser_tests::compliance::run_tests;
use riser_tests::iscsi::{Client, Reply};
use riser_tests::{json, Value};

use super::{create_image, Gateway, TARGET};

/// ALUA that follows the gateways' liveness (issue 23), run after this check.
#[path = "alua_fencing.rs"]
mod alua_fencing;

const UUID: &str = "6c0b7a1e-15a2-4a10-9a5e-0000000a1a01";

/// Sends one CDB to LUN 0 (a read of `edtl` bytes when `edtl` > 0) and waits for its end.
fn cmd(c: &mut Client, cdb: &[u8], edtl: u32) -> Reply {
    let pdu = c.scsi_command(cdb, edtl > 0, false, edtl, Vec::new());
    c.send(&pdu).expect("send the command");
    c.reply().expect("the command's status")
}

/// One group of REPORT TARGET PORT GROUPS data: (id, state code, PREF, status code, ports).
#[derive(Debug, PartialEq, Eq)]
struct Group {
    id: u16,
    state: u8,
    pref: bool,
    status: u8,
    ports: Vec<u16>,
}

/// REPORT TARGET PORT GROUPS (length-only format, and the extended one, which must carry
/// the same descriptors) through `c`.
fn rtpg(c: &mut Client) -> Vec<Group> {
    let r = cmd(c, &[0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], 1024);
    assert_eq!(r.status, 0, "RTPG: {:?}", r.sense());
    let ext = cmd(c, &[0xA3, 0x2A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], 1024);
    assert_eq!(ext.status, 0, "RTPG extended: {:?}", ext.sense());
    assert_eq!(ext.data[4], 0x10, "FORMAT TYPE 001b");
    assert_eq!(&ext.data[8..], &r.data[4..], "both formats describe the same groups");
    let d = &r.data;
    let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    assert_eq!(len + 4, d.len(), "RETURN DATA LENGTH");
    let mut groups = Vec::new();
    let mut i = 4;
    while i + 8 <= d.len() {
        assert_eq!(d[i + 1], 0x8F, "supported states: T, U, S, AN, AO");
        let n = d[i + 7] as usize;
        let ports = (0..n).map(|k| u16::from_be_bytes([d[i + 10 + 4 * k], d[i + 11 + 4 * k]])).collect();
        groups.push(Group { id: u16::from_be_bytes([d[i + 2], d[i + 3]]), state: d[i] & 0x0F, pref: d[i] & 0x80 != 0, status: d[i + 5], ports });
        i += 8 + 4 * n;
    }
    assert_eq!(i, d.len(), "descriptors fill the data: {d:02x?}");
    groups
}

/// The TARGET PORT GROUP designator of VPD page 0x83 through `c`.
fn vpd_tpg(c: &mut Client) -> u16 {
    let r = cmd(c, &[0x12, 1, 0x83, 1, 0, 0], 256);
    assert_eq!(r.status, 0);
    let d = &r.data;
    let mut i = 4;
    while i + 4 <= d.len() {
        let len = d[i + 3] as usize;
        if d[i + 1] & 0x3F == 0x15 {
            // association target port, type 5
            return u16::from_be_bytes([d[i + 6], d[i + 7]]);
        }
        i += 4 + len;
    }
    panic!("no target port group designator: {d:02x?}")
}

fn login(gw: &Gateway) -> Client {
    let mut c = Client::connect(gw.port);
    c.login(TARGET, &[]).unwrap_or_else(|e| panic!("login to gateway {}: {e:?}\n{}", gw.pg_tag, gw.riser.log()));
    assert!(c.clear_unit_attentions(), "gateway {} did not become ready", gw.pg_tag);
    c
}

fn set_state(gws: &[&Gateway], tpg: u32, state: &str) {
    for gw in gws {
        let r = gw.riser.call("iscsi_target_node_set_alua_state", Some(json!({"name": TARGET, "tpg_id": tpg, "state": state})));
        assert_eq!(r.ok(), Some(Value::Bool(true)), "set_alua_state on gateway {}", gw.pg_tag);
    }
}

pub fn check(ceph: &CephCluster) {
    create_image(ceph, "alua", 64);
    let a = Gateway::start(ceph, "alua", UUID, 1, &[]);
    let b = Gateway::start(ceph, "alua", UUID, 2, &[]);

    // Sessions that exist before the description: they get the change as a unit attention.
    let mut early = login(&a);
    assert_eq!(rtpg(&mut early), [Group { id: 1, state: 0, pref: true, status: 0, ports: vec![1] }], "no description yet");

    // The same description on both gateways: once through riser-rpc, once as JSON.
    a.riser.rpc_json(&["iscsi_target_node_set_alua", TARGET, "1:active_optimized:pref", "2:active_non_optimized"]);
    let groups = json!([{"tpg_id": 1, "state": "active_optimized", "pref": true}, {"tpg_id": 2, "state": "active_non_optimized"}]);
    b.riser.call("iscsi_target_node_set_alua", Some(json!({"name": TARGET, "groups": groups}))).expect("set_alua on gateway 2");
    let shown = b.riser.rpc_json(&["iscsi_get_target_nodes"]);
    assert_eq!(
        shown[0]["alua_groups"],
        json!([{"tpg_id": 1, "state": "active_optimized", "preferred_state": "active_optimized", "pref": true, "local": false},
               {"tpg_id": 2, "state": "active_non_optimized", "preferred_state": "active_non_optimized", "pref": false, "local": true}])
    );
    // Group 2 went from (implicitly) active/optimized to active/non-optimized.
    let r = cmd(&mut early, &[0, 0, 0, 0, 0, 0], 0);
    assert_eq!(r.sense(), Some((6, 0x2A, 0x06)), "ASYMMETRIC ACCESS STATE CHANGED");

    let want = |s2: u8, st2: u8| {
        vec![Group { id: 1, state: 0, pref: true, status: 0, ports: vec![1] }, Group { id: 2, state: s2, pref: false, status: st2, ports: vec![2] }]
    };
    let mut ca = login(&a);
    let mut cb = login(&b);
    assert_eq!(rtpg(&mut ca), want(1, 2));
    assert_eq!(rtpg(&mut cb), want(1, 2));
    assert_eq!(vpd_tpg(&mut ca), 1);
    assert_eq!(vpd_tpg(&mut cb), 2);
    let (st, _) = cb.read10(0, 1).expect("READ through the non-optimized group");
    assert_eq!(st, 0);

    // Group 2 to standby (the administrator tells both gateways).
    set_state(&[&a, &b], 2, "standby");
    let r = cmd(&mut cb, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512);
    assert_eq!(r.sense(), Some((6, 0x2A, 0x06)), "the change is reported first");
    let r = cmd(&mut cb, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512);
    assert_eq!((r.status, r.sense()), (2, Some((2, 0x04, 0x0B))), "READ through a standby port");
    let r = cmd(&mut cb, &[0, 0, 0, 0, 0, 0], 0);
    assert_eq!(r.sense(), Some((2, 0x04, 0x0B)), "TEST UNIT READY through a standby port");
    let r = cmd(&mut cb, &[0x12, 0, 0, 0, 96, 0], 96);
    assert_eq!(r.status, 0, "INQUIRY through a standby port");
    let r = cmd(&mut cb, &[0x5E, 0, 0, 0, 0, 0, 0, 0, 8, 0], 8);
    assert_eq!(r.status, 0, "PERSISTENT RESERVE IN through a standby port");
    assert_eq!(rtpg(&mut cb), want(2, 2));
    // Gateway 1 hears of it too, and still serves.
    let r = cmd(&mut ca, &[0, 0, 0, 0, 0, 0], 0);
    assert_eq!(r.sense(), Some((6, 0x2A, 0x06)));
    assert_eq!(rtpg(&mut ca), want(2, 2));
    assert_eq!(ca.read10(0, 1).map(|r| r.0), Some(0));

    // save_config keeps the description, after the node.
    let saved = b.riser.rpc_json(&["save_config"]);
    let iscsi = saved["subsystems"].as_array().and_then(|s| s.iter().find(|s| s["subsystem"] == "iscsi")).expect("iscsi subsystem");
    let calls = iscsi["config"].as_array().expect("calls");
    let i = calls.iter().position(|c| c["method"] == "iscsi_target_node_set_alua").expect("set_alua saved");
    assert_eq!(calls[i - 1]["method"], "iscsi_create_target_node");
    assert_eq!(calls[i]["params"]["groups"][1], json!({"tpg_id": 2, "state": "standby", "pref": false}));

    // Back to active/non-optimized; the sessions drain the unit attention.
    set_state(&[&a, &b], 2, "active_non_optimized");
    assert!(cb.clear_unit_attentions() && ca.clear_unit_attentions() && early.clear_unit_attentions());
    assert_eq!(cb.read10(0, 1).map(|r| r.0), Some(0));
    drop((ca, cb, early));

    // libiscsi's multipath tests, one URL per gateway.
    let (ua, ub) = (a.url(), b.url());
    let o = run_tests("ALL.MultipathIO", &[&ua, &ub]);
    let tail: Vec<&str> = o.output.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
    eprintln!("alua: MultipathIO: ran {} passed {} failed {} skipped {:?}", o.ran, o.passed, o.failed, o.skipped);
    assert!(
        o.ran >= 4 && o.failed == 0 && o.skipped.is_empty(),
        "MultipathIO failed {:?}:\n{}\ngateway 1:\n{}\ngateway 2:\n{}",
        o.failed_tests,
        tail.join("\n"),
        a.riser.log(),
        b.riser.log()
    );
    // MultipathIO.Reset resets the LUN through each path in turn and expects the unit
    // attention on the other: each gateway applied the other's reset.
    for gw in [&a, &b] {
        assert!(gw.riser.log().contains("lun reset by another gateway"), "gateway {} never heard of a peer's reset:\n{}", gw.pg_tag, gw.riser.log());
    }
    drop((a, b));
    let t = std::time::Instant::now();
    alua_fencing::check(ceph);
    eprintln!("alua: alua_fencing done in {:?}", t.elapsed());
}
