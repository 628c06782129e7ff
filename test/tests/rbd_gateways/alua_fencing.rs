//! ALUA follows liveness (issue 23, item 2), with two real gateways on one RBD image: A
//! (target port group 1, preferred active/optimized) and B (group 2, preferred standby).
//!
//! * A stopped (SIGSTOP) beyond the lease: B fences it, and B's view moves on its own:
//!   group 1 unavailable (served only by a fenced gateway), group 2 active/optimized
//!   (taking over); B's session gets ASYMMETRIC ACCESS STATE CHANGED, REPORT TARGET PORT
//!   GROUPS shows the new states with STATUS CODE 02h, and media access through B works.
//! * A continued (SIGCONT): it finds itself fenced, drops its sessions, rejoins; with the
//!   default failback (auto) B returns to the preferred states (group 2 standby again).
//!
//! Run as part of the `alua` check (after it). Needs the device side of issue 23 (the RBD
//! gateway group, lib/bdev/src/modules/rbd/group.rs): where the RBD bdev has none it says so and
//! returns (this branch alone); once merged it always runs.

use std::process::Command;
use std::time::{Duration, Instant};

use riser_tests::ceph::CephCluster;
use riser_tests::iscsi::{Client, Reply};
use riser_tests::{json, Value};

use crate::{create_image, Gateway, TARGET};

const UUID: &str = "6c0b7a1e-15a2-4a10-9a5e-0000000a1af0";
const IMAGE: &str = "gw-alua-fencing";
/// The default lease and what a fence may take beyond it on a loaded machine.
const BOUND: Duration = Duration::from_secs(10 + 40);

fn cmd(c: &mut Client, cdb: &[u8], edtl: u32) -> Reply {
    let pdu = c.scsi_command(cdb, edtl > 0, false, edtl, Vec::new());
    c.send(&pdu).expect("send the command");
    c.reply().expect("the command's status")
}

/// (group, state code, STATUS CODE) of REPORT TARGET PORT GROUPS through `c`.
fn rtpg(c: &mut Client) -> Vec<(u16, u8, u8)> {
    let r = cmd(c, &[0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], 1024);
    assert_eq!(r.status, 0, "RTPG: {:?}", r.sense());
    let d = &r.data;
    let mut out = Vec::new();
    let mut i = 4;
    while i + 8 <= d.len() {
        out.push((u16::from_be_bytes([d[i + 2], d[i + 3]]), d[i] & 0x0F, d[i + 5]));
        i += 8 + 4 * d[i + 7] as usize;
    }
    out
}

/// (tpg_id, effective state, reason) of the node on `gw`.
fn groups(gw: &Gateway) -> Vec<(u64, String, String)> {
    let nodes = gw.riser.rpc_json(&["iscsi_get_target_nodes"]);
    nodes[0]["alua_groups"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|g| {
                    (g["tpg_id"].as_u64().unwrap_or(0), g["state"].as_str().unwrap_or("").to_string(), g["reason"].as_str().unwrap_or("").to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn g(id: u64, state: &str, reason: &str) -> (u64, String, String) {
    (id, state.to_string(), reason.to_string())
}

fn wait_for(what: &str, gws: &[&Gateway], mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        if t.elapsed() > BOUND {
            let logs: Vec<String> = gws.iter().map(|g| format!("--- gateway pg {} log:\n{}", g.pg_tag, g.riser.log())).collect();
            panic!("alua_fencing: {what} did not happen within {BOUND:?}\n{}", logs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    t.elapsed()
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
    assert!(st.is_ok_and(|s| s.success()), "kill -{sig} {pid} failed");
}

pub fn check(ceph: &CephCluster) {
    create_image(ceph, IMAGE, 16);
    let a = Gateway::start(ceph, IMAGE, UUID, 1, &[]);
    let bdev = a.riser.call("bdev_get_bdevs", Some(json!({"name": "Rbd0"}))).unwrap_or_else(|e| panic!("bdev_get_bdevs: {e}"));
    assert!(
        bdev[0]["driver_specific"]["rbd"].get("gateways").is_some(),
        "the RBD bdev shows no gateway group (bdev_get_bdevs driver_specific.rbd.gateways): {bdev}"
    );
    let b = Gateway::start(ceph, IMAGE, UUID, 2, &[]);
    let members_live = |gw: &Gateway| -> usize {
        let n = gw.riser.rpc_json(&["iscsi_get_target_nodes"]);
        n[0]["gateways"][0]["members"].as_array().map_or(0, |m| m.iter().filter(|m| m["state"] == "live").count())
    };
    wait_for("both gateways seeing each other live", &[&a, &b], || members_live(&a) == 2 && members_live(&b) == 2);

    let mut cb = Client::connect(b.port);
    cb.login(TARGET, &[]).unwrap_or_else(|e| panic!("login to B: {e:?}\n{}", b.riser.log()));
    assert!(cb.clear_unit_attentions());
    for gw in [&a, &b] {
        let groups = json!([{"tpg_id": 1, "state": "active_optimized", "pref": true}, {"tpg_id": 2, "state": "standby"}]);
        let r = gw.riser.call("iscsi_target_node_set_alua", Some(json!({"name": TARGET, "groups": groups})));
        assert_eq!(r.ok(), Some(Value::Bool(true)), "set_alua on gateway {}", gw.pg_tag);
    }
    assert_eq!(cmd(&mut cb, &[0; 6], 0).sense(), Some((6, 0x2A, 0x06)));
    assert_eq!(cmd(&mut cb, &[0; 6], 0).sense(), Some((2, 0x04, 0x0B)), "B is standby");
    assert_eq!(groups(&b), [g(1, "active_optimized", ""), g(2, "standby", "")]);

    // 1. A stopped: B fences it and takes over.
    let a_pid = a.riser.pid().expect("A runs");
    signal(a_pid, "STOP");
    let took =
        wait_for("B taking over from the fenced A", &[&b], || groups(&b) == [g(1, "unavailable", "fenced"), g(2, "active_optimized", "taking_over")]);
    eprintln!("alua_fencing: B took over {took:?} after A stopped");
    assert_eq!(cmd(&mut cb, &[0; 6], 0).sense(), Some((6, 0x2A, 0x06)), "ASYMMETRIC ACCESS STATE CHANGED through B");
    assert_eq!(rtpg(&mut cb), [(1, 3, 2), (2, 0, 2)], "RTPG through B: 1 unavailable, 2 active/optimized, implicit changes");
    assert_eq!(cb.read10(0, 1).map(|r| r.0), Some(0), "READ through B");
    let log = b.riser.log();
    assert!(log.contains("target port group 1: active_optimized -> unavailable"), "B logs the change:\n{log}");
    assert!(
        log.contains("target port group 2: standby -> transitioning") && log.contains("target port group 2: transitioning -> active_optimized"),
        "{log}"
    );

    // 2. A continued: fenced, it drops its sessions and rejoins; B fails back (auto).
    signal(a_pid, "CONT");
    wait_for("A finding itself fenced and dropping its sessions", &[&a], || a.riser.log().contains("this gateway was fenced from"));
    wait_for("B failing back once A serves again", &[&a, &b], || groups(&b) == [g(1, "active_optimized", ""), g(2, "standby", "")]);
    wait_for("A back to its preferred states", &[&a], || groups(&a) == [g(1, "active_optimized", ""), g(2, "standby", "")]);
    let mut saw_ua = false;
    for _ in 0..3 {
        match cmd(&mut cb, &[0; 6], 0).sense() {
            Some((6, 0x2A, 0x06)) => saw_ua = true,
            Some((2, 0x04, 0x0B)) => break,
            other => panic!("TUR through B after failback: {other:?}"),
        }
    }
    assert!(saw_ua, "B's session heard of the failback");
    let mut ca = Client::connect(a.port);
    ca.login(TARGET, &[]).unwrap_or_else(|e| panic!("login to A after it rejoined: {e:?}\n{}", a.riser.log()));
    assert!(ca.clear_unit_attentions(), "A serves again:\n{}", a.riser.log());
    assert_eq!(ca.read10(0, 1).map(|r| r.0), Some(0));
}
