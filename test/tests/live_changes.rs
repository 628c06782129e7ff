//! Changes to a live target are safe: the real `riser`, configured through the real
//! `riser-rpc`, changed while initiators are logged in (LUN added or removed, null and
//! malloc bdevs resized, target node deleted, session reinstated), and the iSCSI
//! configuration surviving save_config and a restart.
//! Needs `cargo build --workspace` first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use riser_iscsi::pdu::{AsyncMessage, Isid, LogoutRequest, Lun, Op, Pdu, Stage};
use riser_iscsi::text::{parse_pairs, Pairs};
use riser_tests::iscsi::{Client, Reply, INITIATOR};
use riser_tests::*;

/// SCSI status CHECK CONDITION.
const CHECK_CONDITION: u8 = 0x02;
/// Sense key UNIT ATTENTION.
const UNIT_ATTENTION: u8 = 0x6;
/// UNIT ATTENTION, REPORTED LUNS DATA HAS CHANGED (SPC-4 §6.33).
const REPORTED_LUNS_CHANGED: (u8, u8, u8) = (UNIT_ATTENTION, 0x3f, 0x0e);
/// UNIT ATTENTION, CAPACITY DATA HAS CHANGED (SBC-3).
const CAPACITY_CHANGED: (u8, u8, u8) = (UNIT_ATTENTION, 0x2a, 0x09);
/// ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED (SPC-4 §6.6.2).
const LUN_NOT_SUPPORTED: (u8, u8, u8) = (0x5, 0x25, 0x00);

/// The 8-byte LUN field for LUN `id` (SAM peripheral / flat addressing, id < 16384).
fn lun_field(id: u16) -> Lun {
    let b0 = if id < 256 { 0 } else { 0x40 | (id >> 8) as u8 };
    Lun(u64::from_be_bytes([b0, id as u8, 0, 0, 0, 0, 0, 0]))
}

/// Sends a SCSI command to LUN `lun` and collects Data-In and the status.
fn command(c: &mut Client, lun: u16, cdb: &[u8], read: bool, edtl: u32, data_out: Vec<u8>) -> Option<Reply> {
    let mut pdu = c.scsi_command(cdb, read, !data_out.is_empty(), edtl, data_out);
    if let Op::ScsiCommand(cmd) = &mut pdu.bhs.op {
        cmd.lun = lun_field(lun);
    }
    c.send(&pdu).ok()?;
    c.reply()
}

fn test_unit_ready(c: &mut Client, lun: u16) -> Option<Reply> {
    command(c, lun, &[0u8; 6], false, 0, Vec::new())
}

/// TEST UNIT READY on `lun` until GOOD (a new I_T nexus first sees POWER ON).
fn clear_unit_attentions(c: &mut Client, lun: u16) {
    for _ in 0..8 {
        match test_unit_ready(c, lun) {
            Some(r) if r.status == 0 => return,
            Some(_) => continue,
            None => panic!("connection lost during TEST UNIT READY on LUN {lun}"),
        }
    }
    panic!("LUN {lun} never became ready");
}

/// REPORT LUNS (SPC-4 §6.33): the LUN ids listed, decoded from peripheral/flat addressing.
fn report_luns(c: &mut Client) -> Reply {
    let alloc: u32 = 4096;
    let mut cdb = [0u8; 12];
    cdb[0] = 0xa0;
    cdb[6..10].copy_from_slice(&alloc.to_be_bytes());
    command(c, 0, &cdb, true, alloc, Vec::new()).expect("REPORT LUNS: connection lost")
}

fn reported_ids(data: &[u8]) -> Vec<u16> {
    assert!(data.len() >= 8, "REPORT LUNS data too short: {data:?}");
    let list_len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
    data[8..]
        .chunks_exact(8)
        .take(list_len / 8)
        .map(|e| (u16::from(e[0] & 0x3f) << 8) | u16::from(e[1]))
        .collect()
}

fn write10(c: &mut Client, lun: u16, lba: u32, data: &[u8]) -> Reply {
    let mut cdb = [0u8; 10];
    cdb[0] = 0x2a;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&((data.len() / 512) as u16).to_be_bytes());
    command(c, lun, &cdb, false, data.len() as u32, data.to_vec()).expect("WRITE(10): connection lost")
}

fn read10(c: &mut Client, lun: u16, lba: u32, blocks: u16) -> Reply {
    let mut cdb = [0u8; 10];
    cdb[0] = 0x28;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    command(c, lun, &cdb, true, u32::from(blocks) * 512, Vec::new()).expect("READ(10): connection lost")
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(131) ^ seed.wrapping_mul(7)) as u8).collect()
}

/// Writes a pattern to `lun` at `lba` and reads it back.
fn write_and_verify(c: &mut Client, lun: u16, lba: u32, seed: u32) {
    let data = pattern(seed, 4096);
    let w = write10(c, lun, lba, &data);
    assert_eq!(w.status, 0, "WRITE(10) to LUN {lun}: {w:?}");
    let r = read10(c, lun, lba, 8);
    assert_eq!(r.status, 0, "READ(10) from LUN {lun}: status {}, sense {:?}", r.status, r.sense());
    assert!(r.data == data, "LUN {lun} LBA {lba}: read back differs from what was written");
}

/// A logged-in session on `iqn`, unit attentions of LUN 0 cleared.
fn session(riser: &Riser, port: u16, iqn: &str) -> Client {
    let mut c = Client::connect(port);
    c.login(iqn, &[]).unwrap_or_else(|s| panic!("login to {iqn} failed: {s:?}\nriser log:\n{}", riser.log()));
    assert!(c.clear_unit_attentions(), "TEST UNIT READY on {iqn} never succeeded");
    c
}

/// Login with a chosen ISID (the test client picks its own), otherwise like
/// [`Client::login`]: security stage skipped, then operational negotiation to full feature.
/// Returns the final Login Response's TSIH.
fn login_with_isid(c: &mut Client, target: &str, isid: [u8; 6]) -> Result<u16, (u8, u8)> {
    let with_isid = |mut p: Pdu| {
        if let Op::LoginRequest(r) = &mut p.bhs.op {
            r.isid = Isid(isid);
        }
        p
    };
    let mut keys: Vec<(String, String)> = [
        ("InitiatorName", INITIATOR),
        ("TargetName", target),
        ("SessionType", "Normal"),
        ("AuthMethod", "None"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut stage = Stage::SecurityNegotiation;
    loop {
        let refs: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let nsg = match stage {
            Stage::SecurityNegotiation => Stage::LoginOperationalNegotiation,
            _ => Stage::FullFeaturePhase,
        };
        let req = with_isid(c.login_request(stage, nsg, true, &refs));
        c.send(&req).expect("send login");
        let resp = c.recv().ok_or((0xff, 0xff))?;
        let Op::LoginResponse(r) = &resp.bhs.op else { panic!("expected a Login Response, got {:?}", resp.bhs.op) };
        if r.status.class != 0 {
            return Err((r.status.class, r.status.detail));
        }
        if r.transit_bit && r.nsg == Stage::FullFeaturePhase {
            c.cmd_sn = r.exp_cmd_sn;
            return Ok(r.tsih);
        }
        let answered: Pairs = parse_pairs(&resp.data).unwrap_or_default();
        if stage == Stage::SecurityNegotiation {
            stage = Stage::LoginOperationalNegotiation;
            keys = [
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("ImmediateData", "Yes"),
                ("InitialR2T", "Yes"),
                ("MaxRecvDataSegmentLength", "262144"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        } else {
            // The target offered keys of its own: accept its values.
            let sent: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
            keys = answered.into_iter().filter(|(k, _)| !sent.contains(k)).collect();
        }
    }
}

fn connections(riser: &Riser) -> Vec<Value> {
    riser.rpc_json(&["iscsi_get_connections"]).as_array().cloned().unwrap_or_else(|| panic!("iscsi_get_connections is not an array"))
}

/// Waits until `iscsi_get_connections` lists `n` connections (they leave the list once
/// their reactor has torn them down).
fn wait_connections(riser: &Riser, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let list = connections(riser);
        if list.len() == n || Instant::now() >= deadline {
            return list;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn lun_added_to_a_live_session_raises_reported_luns_changed() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("addlun", port, &[8]);
    let mut c = session(&riser, port, &iqn);
    write_and_verify(&mut c, 0, 0, 1);
    let before = report_luns(&mut c);
    assert_eq!((before.status, reported_ids(&before.data)), (0, vec![0]));

    riser.rpc_json(&["bdev_malloc_create", "-b", "AddedLater", "4", "512"]);
    let out = riser.rpc(&["iscsi_target_node_add_lun", &iqn, "AddedLater"]);
    assert_eq!(out.json(), json!(true), "{out:?}");
    let node = &riser.rpc_json(&["iscsi_get_target_nodes"])[0];
    assert_eq!(node["luns"], json!([{"bdev_name": "addlun_m0", "lun_id": 0}, {"bdev_name": "AddedLater", "lun_id": 1}]));

    // The next command of the session reports the change (SPC-4 §6.33, SAM-5 §5.14).
    let r = test_unit_ready(&mut c, 0).expect("connection lost after iscsi_target_node_add_lun");
    assert_eq!(r.status, CHECK_CONDITION, "expected CHECK CONDITION, got {r:?}\nriser log:\n{}", riser.log());
    assert_eq!(
        r.sense(),
        Some((UNIT_ATTENTION, 0x3f, 0x0e)),
        "expected UNIT ATTENTION / REPORTED LUNS DATA HAS CHANGED, sense segment {:02x?}",
        r.sense_segment
    );

    // REPORT LUNS lists both, and clears the unit attention.
    let after = report_luns(&mut c);
    assert_eq!(after.status, 0, "REPORT LUNS: {after:?}");
    assert_eq!(
        reported_ids(&after.data),
        vec![0, 1],
        "REPORT LUNS right after the unit attention must list the new LUN\nriser log:\n{}",
        riser.log()
    );
    let r = test_unit_ready(&mut c, 0).expect("connection lost");
    assert_eq!((r.status, r.sense()), (0, None), "the unit attention was reported once");

    // The new LUN serves the same session; LUN 0 still does.
    clear_unit_attentions(&mut c, 1);
    let r = read10(&mut c, 1, 0, 8);
    assert_eq!(r.status, 0, "READ(10) from the new LUN: {r:?}");
    assert_eq!(r.data, vec![0u8; 4096], "a fresh malloc bdev reads zeroes");
    write_and_verify(&mut c, 1, 16, 2);
    write_and_verify(&mut c, 0, 16, 3);
    let capacity = command(&mut c, 1, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], true, 8, Vec::new()).expect("READ CAPACITY(10)");
    assert_eq!(capacity.status, 0);
    assert_eq!(&capacity.data[..4], &(4u32 * 2048 - 1).to_be_bytes(), "the new LUN is the 4 MiB bdev");

    // A second session logging in now sees both LUNs.
    let mut c2 = session(&riser, port, &iqn);
    let r = report_luns(&mut c2);
    assert_eq!((r.status, reported_ids(&r.data)), (0, vec![0, 1]));

    // The bdev is claimed by the node now.
    let out = riser.rpc(&["bdev_malloc_delete", "AddedLater"]);
    assert_eq!(out.code(), Some(1), "a LUN's bdev cannot be deleted: {out:?}");
}

#[test]
fn deleting_a_target_node_closes_its_sessions_and_frees_its_bdevs() {
    let riser = Riser::start();
    let port = free_port();
    let gone = riser.add_iscsi_target("gone", port, &[8]);
    let stays = riser.add_iscsi_target("stays", port, &[8]);
    let mut a = session(&riser, port, &gone);
    let mut b = session(&riser, port, &stays);
    write_and_verify(&mut a, 0, 0, 10);
    write_and_verify(&mut b, 0, 0, 11);
    assert_eq!(wait_connections(&riser, 2).len(), 2);

    // A node with a session is refused without --force, and keeps serving.
    refused(&riser, &["iscsi_delete_target_node", &gone], "has 1 session(s)");
    write_and_verify(&mut a, 0, 8, 12);
    let t0 = Instant::now();
    let out = riser.rpc(&["iscsi_delete_target_node", &gone, "--force"]);
    let took = t0.elapsed();
    assert_eq!(out.json(), json!(true), "{out:?}");
    assert!(took < Duration::from_secs(5), "iscsi_delete_target_node took {took:?}");
    assert!(a.closed_within(Duration::from_secs(5)), "the deleted node's session is still open\nriser log:\n{}", riser.log());

    // Only the other node's connection is left.
    let conns = wait_connections(&riser, 1);
    assert_eq!(conns.len(), 1, "{conns:?}");
    assert_eq!(conns[0]["target_node_name"], json!(stays));
    assert!(conns.iter().all(|c| c["target_node_name"] != json!(gone)), "{conns:?}");
    let nodes = riser.rpc_json(&["iscsi_get_target_nodes"]);
    let names: Vec<&str> = nodes.as_array().unwrap().iter().filter_map(|n| n["name"].as_str()).collect();
    assert_eq!(names, [stays.as_str()]);

    // Its bdev is released: it can be deleted; the other node's is still claimed.
    let out = riser.rpc(&["bdev_malloc_delete", "gone_m0"]);
    assert!(out.status.success(), "the deleted node's bdev is still claimed: {out:?}");
    let out = riser.rpc(&["bdev_malloc_delete", "stays_m0"]);
    assert_eq!(out.code(), Some(1), "{out:?}");

    // The node is gone for new logins too.
    let mut again = Client::connect(port);
    assert!(again.login(&gone, &[]).is_err(), "login to a deleted node succeeded");

    // The other node's session did not notice.
    for round in 0..8 {
        write_and_verify(&mut b, 0, 64 + round * 8, 100 + round);
    }
    assert_eq!(b.nop(b"still here").as_deref(), Some(&b"still here"[..]));

    // After all sessions are gone the list is empty.
    drop(b);
    assert_eq!(wait_connections(&riser, 0), Vec::<Value>::new());
    assert_eq!(riser.rpc_json(&["iscsi_get_stats"])["running"], json!(0));
}

#[test]
fn a_second_login_with_the_same_isid_reinstates_the_session() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("reinstate", port, &[8]);
    let isid = [0x80, 0x12, 0x34, 0x56, 0x78, 0x9a];

    let mut first = Client::connect(port);
    let tsih1 = login_with_isid(&mut first, &iqn, isid).unwrap_or_else(|s| panic!("first login: {s:?}\n{}", riser.log()));
    clear_unit_attentions(&mut first, 0);
    write_and_verify(&mut first, 0, 0, 20);
    let conns = wait_connections(&riser, 1);
    assert_eq!(conns[0]["isid"], json!("0x80123456789a"), "{conns:?}");

    // Same initiator name, same ISID, TSIH 0: a session reinstatement (RFC 7143 §6.3.5).
    let mut second = Client::connect(port);
    let tsih2 = login_with_isid(&mut second, &iqn, isid).unwrap_or_else(|s| panic!("second login: {s:?}\n{}", riser.log()));
    assert_ne!(tsih1, tsih2, "the new session has a new TSIH");
    assert!(first.closed_within(Duration::from_secs(5)), "the reinstated session's connection is still open\nriser log:\n{}", riser.log());

    clear_unit_attentions(&mut second, 0);
    let r = read10(&mut second, 0, 0, 8);
    assert_eq!(r.status, 0, "{r:?}");
    assert!(r.data == pattern(20, 4096), "the data written by the old session is there");
    write_and_verify(&mut second, 0, 8, 21);

    let conns = wait_connections(&riser, 1);
    assert_eq!(conns.len(), 1, "only the new session is left: {conns:?}");
    assert_eq!(conns[0]["tsih"], json!(tsih2));

    // A different ISID is a second session, not a reinstatement.
    let mut third = Client::connect(port);
    login_with_isid(&mut third, &iqn, [0x80, 0x12, 0x34, 0x56, 0x78, 0x9b]).expect("login with another ISID");
    clear_unit_attentions(&mut third, 0);
    assert!(!second.closed_within(Duration::from_millis(300)), "another ISID closed the session");
    second.sock.set_read_timeout(Some(Duration::from_secs(10))).ok();
    assert_eq!(wait_connections(&riser, 2).len(), 2);
    write_and_verify(&mut second, 0, 16, 22);
}

#[test]
fn get_connections_and_iscsi_config_survive_save_and_restart() {
    let dir = TempDir::new("live-cfg");
    let cfg = dir.join("config.json");
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let (nodes, pgs, igs, options);
    {
        let mut riser = Riser::start();
        // Everything through riser-rpc, in rpc.py's syntax.
        let ok = |args: &[&str]| {
            let v = riser.rpc_json(args);
            assert_eq!(v, json!(true), "{args:?}");
        };
        ok(&["iscsi_set_options", "-s", "16384", "-q", "128", "-n", "20", "-x", "32"]);
        ok(&["iscsi_create_portal_group", "1", &format!("127.0.0.1:{p1}")]);
        ok(&["iscsi_create_portal_group", "2", &format!("127.0.0.1:{p2} [::1]:{p3}"), "192.0.2.1:3260@iser", "-p", "-w"]);
        ok(&["iscsi_create_initiator_group", "1", "ANY", "127.0.0.1/32 [::1]/128"]);
        ok(&["iscsi_create_initiator_group", "2", "iqn.2024-01.io.riser.test:a !iqn.2024-01.io.riser.test:b", "ANY"]);
        ok(&["iscsi_initiator_group_add_initiators", "2", "-n", "iqn.2024-01.io.riser.test:c", "-m", "10.0.0.0/8"]);
        ok(&["iscsi_initiator_group_remove_initiators", "2", "-m", "ANY"]);
        for (b, mib) in [("Malloc0", "8"), ("Malloc1", "4"), ("Malloc2", "4"), ("Malloc3", "2")] {
            riser.rpc_json(&["bdev_malloc_create", "-b", b, mib, "512"]);
        }
        ok(&["iscsi_create_target_node", "disk1", "Disk one", "Malloc0:0 Malloc1:3", "1:1", "32"]);
        ok(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "-i", "5"]);
        ok(&["iscsi_target_node_add_pg_ig_maps", "disk1", "2:2 1:2"]);
        ok(&["iscsi_create_target_node", "-H", "iqn.2024-01.io.riser.test:disk2", "Disk two", "Malloc3:0", "1:1 2:1", "16"]);
        ok(&["iscsi_target_node_remove_pg_ig_maps", "iqn.2024-01.io.riser.test:disk2", "2:1"]);

        let iqn1 = "iqn.2016-06.io.riser:disk1";
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", p1)).is_err() {
            assert!(Instant::now() < deadline, "riser did not listen on {p1}:\n{}", riser.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut c = Client::connect(p1);
        c.login(iqn1, &[]).unwrap_or_else(|s| panic!("login: {s:?}\n{}", riser.log()));
        assert!(c.clear_unit_attentions());
        write_and_verify(&mut c, 0, 0, 30);

        // The live connection as riser-rpc shows it.
        let conns = wait_connections(&riser, 1);
        let conn = &conns[0];
        assert_eq!(conn["transport"], json!("tcp"), "{conn}");
        assert_eq!(conn["target_node_name"], json!(iqn1), "{conn}");
        assert_eq!(conn["initiator_name"], json!(INITIATOR), "{conn}");
        assert_eq!(conn["target_addr"], json!(format!("127.0.0.1:{p1}")), "{conn}");
        assert!(conn["initiator_addr"].as_str().is_some_and(|a| a.starts_with("127.0.0.1:")), "{conn}");
        assert!(conn["reactor"].is_u64() && conn["lcore_id"].is_u64(), "{conn}");
        assert!(conn["tsih"].as_u64().is_some_and(|t| t > 0), "{conn}");
        let n = &conn["negotiated"];
        assert_eq!(n["SessionType"], json!("Normal"), "{conn}");
        assert_eq!(n["HeaderDigest"], json!("None"), "{conn}");
        assert_eq!(n["DataDigest"], json!("None"), "{conn}");
        assert_eq!(n["ImmediateData"], json!(true), "{conn}");
        assert_eq!(n["InitialR2T"], json!(true), "{conn}");
        assert_eq!(n["FirstBurstLength"], json!(16384), "the first_burst_length set above: {conn}");
        assert_eq!(n["InitiatorMaxRecvDataSegmentLength"], json!(262144), "{conn}");
        assert_eq!(n["QueueDepth"], json!(32), "the node's queue depth: {conn}");
        assert!(n["MaxBurstLength"].is_u64() && n["MaxRecvDataSegmentLength"].is_u64(), "{conn}");
        assert_eq!(riser.rpc_json(&["iscsi_get_stats"])["running"], json!(1));

        // The header digest node refuses a login without one.
        let mut d = Client::connect(p1);
        assert!(d.login("iqn.2024-01.io.riser.test:disk2", &[]).is_err(), "disk2 requires HeaderDigest");

        nodes = riser.rpc_json(&["iscsi_get_target_nodes"]);
        pgs = riser.rpc_json(&["iscsi_get_portal_groups"]);
        igs = riser.rpc_json(&["iscsi_get_initiator_groups"]);
        options = riser.rpc_json(&["iscsi_get_options"]);
        assert_eq!(
            nodes,
            json!([
                {
                    "name": iqn1, "alias_name": "Disk one",
                    "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 1, "ig_tag": 2}, {"pg_tag": 2, "ig_tag": 2}],
                    "luns": [
                        {"bdev_name": "Malloc0", "lun_id": 0},
                        {"bdev_name": "Malloc1", "lun_id": 3},
                        {"bdev_name": "Malloc2", "lun_id": 5}
                    ],
                    "queue_depth": 32, "disable_chap": false, "require_chap": false, "mutual_chap": false,
                    "chap_group": 0, "header_digest": false, "data_digest": false
                },
                {
                    "name": "iqn.2024-01.io.riser.test:disk2", "alias_name": "Disk two",
                    "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
                    "luns": [{"bdev_name": "Malloc3", "lun_id": 0}],
                    "queue_depth": 16, "disable_chap": false, "require_chap": false, "mutual_chap": false,
                    "chap_group": 0, "header_digest": true, "data_digest": false
                }
            ])
        );
        assert_eq!(
            pgs,
            json!([
                {"tag": 1, "private": false, "portals": [{"host": "127.0.0.1", "port": p1.to_string()}]},
                {"tag": 2, "private": true, "portals": [
                    {"host": "127.0.0.1", "port": p2.to_string()},
                    {"host": "[::1]", "port": p3.to_string()},
                    {"host": "192.0.2.1", "port": "3260", "iser": true}
                ]}
            ])
        );
        assert_eq!(
            igs,
            json!([
                {"tag": 1, "initiators": ["ANY"], "netmasks": ["127.0.0.1/32", "[::1]/128"]},
                {"tag": 2, "netmasks": ["10.0.0.0/8"], "initiators": [
                    "iqn.2024-01.io.riser.test:a", "!iqn.2024-01.io.riser.test:b", "iqn.2024-01.io.riser.test:c"
                ]}
            ])
        );
        assert_eq!(
            [
                &options["first_burst_length"],
                &options["max_queue_depth"],
                &options["nop_in_interval"],
                &options["max_large_datain_per_connection"]
            ],
            [&json!(16384), &json!(128), &json!(20), &json!(32)]
        );

        let out = riser.rpc(&["save_config"]);
        let saved = out.json();
        let iscsi = saved["subsystems"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["subsystem"] == "iscsi"))
            .unwrap_or_else(|| panic!("no iscsi subsystem in {saved}"));
        let methods: Vec<&str> = iscsi["config"].as_array().unwrap().iter().filter_map(|c| c["method"].as_str()).collect();
        assert_eq!(
            methods,
            [
                "iscsi_set_options",
                "iscsi_create_portal_group",
                "iscsi_create_portal_group",
                "iscsi_create_initiator_group",
                "iscsi_create_initiator_group",
                "iscsi_create_target_node",
                "iscsi_create_target_node"
            ]
        );
        std::fs::write(&cfg, &out.stdout).unwrap();
        drop(c);
        assert!(riser.terminate(Duration::from_secs(10)).is_some(), "riser ignored SIGTERM\n{}", riser.log());
    }

    let riser = Riser::start_with(&["--json", cfg.to_str().unwrap()]);
    assert_eq!(riser.rpc_json(&["iscsi_get_target_nodes"]), nodes, "target nodes after restart");
    assert_eq!(riser.rpc_json(&["iscsi_get_portal_groups"]), pgs, "portal groups after restart");
    assert_eq!(riser.rpc_json(&["iscsi_get_initiator_groups"]), igs, "initiator groups after restart");
    assert_eq!(riser.rpc_json(&["iscsi_get_options"]), options, "options after restart");
    assert_eq!(connections(&riser), Vec::<Value>::new());

    // The restored target serves (the malloc bdev is new, so it reads zeroes), on the
    // restored portal; the waiting portal group is not listening.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", p1)).is_err() {
        assert!(Instant::now() < deadline, "restored riser did not listen on {p1}:\n{}", riser.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(std::net::TcpStream::connect(("127.0.0.1", p2)).is_err(), "portal group 2 was created with --wait");
    let mut c = session(&riser, p1, "iqn.2016-06.io.riser:disk1");
    clear_unit_attentions(&mut c, 5);
    let r = report_luns(&mut c);
    assert_eq!((r.status, reported_ids(&r.data)), (0, vec![0, 3, 5]));
    write_and_verify(&mut c, 5, 0, 31);
    assert_eq!(riser.rpc_json(&["iscsi_start_portal_group", "2"]), json!(true));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", p2)).is_err() {
        assert!(Instant::now() < deadline, "portal group 2 did not start listening on {p2}:\n{}", riser.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cli_refuses_bad_iscsi_syntax_and_reports_server_errors() {
    let riser = Riser::start();
    for (args, needle) in [
        (&["iscsi_create_portal_group", "one", "127.0.0.1:3260"][..], "is not a tag"),
        (&["iscsi_create_portal_group", "1", "127.0.0.1"][..], "is not HOST:PORT"),
        (&["iscsi_create_portal_group", "1", "::1:3260"][..], "in brackets"),
        (&["iscsi_create_initiator_group", "1", "ANY"][..], "required"),
        (&["iscsi_create_target_node", "d", "a", "Malloc0", "1:1", "8"][..], "is not BDEV:LUN_ID"),
        (&["iscsi_create_target_node", "d", "a", "Malloc0:0", "1", "8"][..], "is not PG_TAG:IG_TAG"),
        (&["iscsi_target_node_add_pg_ig_maps", "d", "x:1"][..], "is not PG_TAG:IG_TAG"),
        (&["iscsi_delete_initiator_group", "-3"][..], "-3"),
    ] {
        let out = riser.rpc(args);
        assert_eq!(out.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stderr.contains(needle), "{args:?}: {:?} lacks {needle:?}", out.stderr);
        assert!(out.stdout.is_empty(), "{out:?}");
    }
    // Nothing reached the server.
    assert_eq!(riser.rpc_json(&["iscsi_get_portal_groups"]), json!([]));

    // Well-formed but refused by riser: exit 1, method and code named.
    let out = riser.rpc(&["iscsi_create_target_node", "d", "a", "Nope:0", "9:9", "8"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("iscsi_create_target_node") && out.stderr.contains("(code -19)"), "{out:?}");
    let out = riser.rpc(&["iscsi_delete_portal_group", "7"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("portal group 7 not found"), "{out:?}");

    let out = riser.rpc(&["iscsi_create_target_node", "--help"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.stdout.contains("BDEV:LUN") && out.stdout.contains("--header-digest"), "{}", out.stdout);
}

/// READ CAPACITY(16) of `lun`: (blocks, block length).
fn read_capacity16(c: &mut Client, lun: u16) -> (u64, u32) {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[10..14].copy_from_slice(&32u32.to_be_bytes());
    let r = command(c, lun, &cdb, true, 32, Vec::new()).expect("READ CAPACITY(16): connection lost");
    assert_eq!(r.status, 0, "READ CAPACITY(16) of LUN {lun}: {r:?}");
    let last = u64::from_be_bytes(r.data[..8].try_into().expect("8 bytes"));
    (last + 1, u32::from_be_bytes(r.data[8..12].try_into().expect("4 bytes")))
}

/// Runs `f` again while it answers a unit attention (what an initiator does); returns the
/// answer and the unit attentions seen.
fn retrying_uas(c: &mut Client, mut f: impl FnMut(&mut Client) -> Reply) -> (Reply, Vec<(u8, u8, u8)>) {
    let mut seen = Vec::new();
    for _ in 0..8 {
        let r = f(c);
        match r.sense() {
            Some(s) if r.status == CHECK_CONDITION && s.0 == UNIT_ATTENTION => seen.push(s),
            _ => return (r, seen),
        }
    }
    panic!("unit attentions never end: {seen:?}");
}

/// The error line riser-rpc printed for a refused call (exit 1), checked to contain `needle`.
fn refused(riser: &Riser, args: &[&str], needle: &str) {
    let out = riser.rpc(args);
    assert_eq!(out.code(), Some(1), "{args:?} was not refused: {out:?}");
    assert!(out.stderr.contains(needle), "{args:?}: {:?} lacks {needle:?}", out.stderr);
}

#[test]
fn a_lun_removed_while_another_session_does_io_on_lun_0() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("rmlun", port, &[8]);
    let mut a = session(&riser, port, &iqn);
    let mut b = session(&riser, port, &iqn);

    // A LUN added, written and read back.
    riser.rpc_json(&["bdev_malloc_create", "-b", "Leaving", "4", "512"]);
    assert_eq!(riser.rpc(&["iscsi_target_node_add_lun", &iqn, "Leaving", "-i", "1"]).json(), json!(true));
    let r = test_unit_ready(&mut a, 0).expect("connection lost");
    assert_eq!(r.sense(), Some(REPORTED_LUNS_CHANGED), "adding a LUN is announced: {r:?}");
    clear_unit_attentions(&mut a, 1);
    write_and_verify(&mut a, 1, 0, 40);
    write_and_verify(&mut a, 1, 8184, 41);
    clear_unit_attentions(&mut b, 0);

    // B writes and verifies LUN 0 all along.
    let stop = Arc::new(AtomicBool::new(false));
    let io = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut rounds, mut uas) = (0u32, Vec::new());
            while !stop.load(Ordering::Acquire) || rounds < 4 {
                let lba = (rounds % 64) * 8;
                let data = pattern(1000 + rounds, 4096);
                let (w, mut seen) = retrying_uas(&mut b, |c| write10(c, 0, lba, &data));
                assert_eq!((w.status, w.sense()), (0, None), "B: WRITE(10) to LUN 0, round {rounds}");
                let (r, seen2) = retrying_uas(&mut b, |c| read10(c, 0, lba, 8));
                assert_eq!((r.status, r.sense()), (0, None), "B: READ(10) from LUN 0, round {rounds}");
                assert!(r.data == data, "B: LUN 0 LBA {lba} reads back other data, round {rounds}");
                seen.extend(seen2);
                uas.extend(seen);
                rounds += 1;
            }
            (b, rounds, uas)
        })
    };
    std::thread::sleep(Duration::from_millis(150));
    let t0 = Instant::now();
    let out = riser.rpc(&["iscsi_target_node_remove_lun", &iqn, "1"]);
    assert_eq!(out.json(), json!(true), "{out:?}\nriser log:\n{}", riser.log());
    let took = t0.elapsed();
    std::thread::sleep(Duration::from_millis(150));
    stop.store(true, Ordering::Release);
    let (mut b, rounds, uas) = io.join().expect("B's I/O failed");
    assert!(rounds >= 4, "B did {rounds} rounds");
    assert_eq!(uas, [REPORTED_LUNS_CHANGED], "B's nexus is told once, and of nothing else");
    assert!(took < Duration::from_secs(5), "iscsi_target_node_remove_lun took {took:?}");

    // A's nexus is told too; REPORT LUNS lists LUN 0 only; LUN 1 is a LUN that never was.
    let r = test_unit_ready(&mut a, 0).expect("connection lost");
    assert_eq!((r.status, r.sense()), (CHECK_CONDITION, Some(REPORTED_LUNS_CHANGED)), "{r:?}");
    let r = report_luns(&mut a);
    assert_eq!((r.status, reported_ids(&r.data)), (0, vec![0]));
    for reply in [test_unit_ready(&mut a, 1).expect("connection lost"), read10(&mut a, 1, 0, 8)] {
        assert_eq!((reply.status, reply.sense()), (CHECK_CONDITION, Some(LUN_NOT_SUPPORTED)), "{reply:?}");
    }
    let inquiry = command(&mut a, 1, &[0x12, 0, 0, 0, 36, 0], true, 36, Vec::new()).expect("INQUIRY");
    assert_eq!((inquiry.status, inquiry.data.first()), (0, Some(&0x7f)), "peripheral qualifier 011b: no LUN here");
    let node = &riser.rpc_json(&["iscsi_get_target_nodes"])[0];
    assert_eq!(node["luns"], json!([{"bdev_name": "rmlun_m0", "lun_id": 0}]));

    // The bdev was released: it can be deleted; LUN 0's cannot.
    let out = riser.rpc(&["bdev_malloc_delete", "Leaving"]);
    assert!(out.status.success(), "the removed LUN's bdev is still claimed: {out:?}");
    refused(&riser, &["bdev_malloc_delete", "rmlun_m0"], "claimed");

    // Bad requests are refused, and the target serves on.
    refused(&riser, &["iscsi_target_node_remove_lun", "iqn.2016-06.io.riser:nope", "1"], "not found");
    refused(&riser, &["iscsi_target_node_remove_lun", &iqn, "1"], "has no LUN 1");
    refused(&riser, &["iscsi_target_node_remove_lun", &iqn, "0"], "last LUN");
    write_and_verify(&mut a, 0, 512, 42);
    write_and_verify(&mut b, 0, 520, 43);
    assert_eq!(wait_connections(&riser, 2).len(), 2, "no session was dropped");

    // save_config holds the LUN map as it is now.
    let saved = riser.rpc(&["save_config"]).json();
    let iscsi = saved["subsystems"].as_array().and_then(|s| s.iter().find(|s| s["subsystem"] == "iscsi")).expect("iscsi subsystem");
    let create = iscsi["config"].as_array().and_then(|c| c.iter().find(|c| c["method"] == "iscsi_create_target_node")).expect("node");
    assert_eq!(create["params"]["luns"], json!([{"bdev_name": "rmlun_m0", "lun_id": 0}]));
}

#[test]
fn null_and_malloc_resizes_raise_capacity_data_has_changed_on_every_nexus() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("resize", port, &[8]);
    riser.rpc_json(&["bdev_null_create", "Grows0", "4", "512"]);
    riser.rpc_json(&["bdev_malloc_create", "-b", "Grows1", "4", "512"]);
    for (bdev, id) in [("Grows0", "1"), ("Grows1", "2")] {
        assert_eq!(riser.rpc(&["iscsi_target_node_add_lun", &iqn, bdev, "-i", id]).json(), json!(true));
    }
    let mut c = session(&riser, port, &iqn);
    let mut d = session(&riser, port, &iqn);
    for s in [&mut c, &mut d] {
        for lun in 0..3 {
            clear_unit_attentions(s, lun);
        }
    }
    assert_eq!(read_capacity16(&mut c, 1), (8192, 512));
    assert_eq!(read_capacity16(&mut c, 2), (8192, 512));
    write_and_verify(&mut c, 2, 8184, 50);

    // The null device grows: both nexuses are told, once; the new size shows.
    assert_eq!(riser.rpc(&["bdev_null_resize", "Grows0", "8"]).json(), json!(true));
    for s in [&mut c, &mut d] {
        let r = test_unit_ready(s, 1).expect("connection lost");
        assert_eq!((r.status, r.sense()), (CHECK_CONDITION, Some(CAPACITY_CHANGED)), "{r:?}\nriser log:\n{}", riser.log());
        assert_eq!(read_capacity16(s, 1), (16384, 512));
        assert_eq!(test_unit_ready(s, 1).map(|r| r.status), Some(0));
    }
    let r = read10(&mut c, 1, 16376, 8);
    assert_eq!((r.status, r.data.len()), (0, 4096), "the grown null device serves its new blocks");

    // The malloc device grows: the same, the data kept, the new blocks usable.
    assert_eq!(riser.rpc(&["bdev_malloc_resize", "Grows1", "12"]).json(), json!(true));
    for s in [&mut d, &mut c] {
        let r = test_unit_ready(s, 2).expect("connection lost");
        assert_eq!((r.status, r.sense()), (CHECK_CONDITION, Some(CAPACITY_CHANGED)), "{r:?}");
        assert_eq!(read_capacity16(s, 2), (24576, 512));
    }
    let r = read10(&mut c, 2, 8184, 8);
    assert!(r.status == 0 && r.data == pattern(50, 4096), "data written before the growth is kept");
    write_and_verify(&mut c, 2, 24568, 51);
    write_and_verify(&mut d, 2, 8188, 52);

    // Bad requests get a JSON-RPC error and change nothing.
    refused(&riser, &["bdev_null_resize", "Grows0", "0"], "num_blocks must be greater than 0");
    refused(&riser, &["bdev_null_resize", "Grows0", "4"], "null bdevs only grow");
    refused(&riser, &["bdev_null_resize", "Grows1", "16"], "not found");
    refused(&riser, &["bdev_null_resize", "Nope", "16"], "not found");
    refused(&riser, &["bdev_malloc_resize", "Grows1", "4"], "while iqn.2016-06.io.riser:resize:lun2 uses it");
    refused(&riser, &["bdev_malloc_resize", "Grows1", "1073741824"], "bytes of memory");
    refused(&riser, &["bdev_malloc_resize", "Grows1", "0"], "num_blocks must be greater than 0");
    assert_eq!(read_capacity16(&mut c, 1), (16384, 512));
    assert_eq!(read_capacity16(&mut c, 2), (24576, 512));
    assert_eq!(test_unit_ready(&mut c, 2).map(|r| (r.status, r.sense())), Some((0, None)), "a refused resize raises nothing");
    write_and_verify(&mut c, 0, 64, 53);
    write_and_verify(&mut d, 2, 100, 54);

    // save_config has the new sizes.
    let saved = riser.rpc(&["save_config"]).json();
    let bdev = saved["subsystems"].as_array().and_then(|s| s.iter().find(|s| s["subsystem"] == "bdev")).expect("bdev subsystem");
    let size = |name: &str| {
        bdev["config"].as_array().and_then(|c| c.iter().find(|c| c["params"]["name"] == name)).map(|c| c["params"]["num_blocks"].clone())
    };
    assert_eq!((size("Grows0"), size("Grows1")), (Some(json!(16384)), Some(json!(24576))), "{bdev}");

    // SPDK's rpc.py drives bdev_null_resize unchanged (its arguments: NAME NEW_SIZE in MiB).
    let dir = TempDir::new("spdk");
    let rpc_py = spdk_rpc_py(&dir);
    let sock = riser.socket().to_string_lossy().to_string();
    let rpc_py = |args: &[&str]| {
        let out = std::process::Command::new("python3").arg(&rpc_py).args(["-s", &sock]).args(args).output().expect("python3");
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let (ok, text) = rpc_py(&["bdev_null_resize", "Grows0", "16"]);
    assert!(ok && text.trim() == "true", "rpc.py bdev_null_resize: {text}\nriser log:\n{}", riser.log());
    let r = test_unit_ready(&mut d, 1).expect("connection lost");
    assert_eq!(r.sense(), Some(CAPACITY_CHANGED), "{r:?}");
    assert_eq!(read_capacity16(&mut d, 1), (32768, 512));
    let (ok, text) = rpc_py(&["bdev_null_resize", "Grows0", "8"]);
    assert!(!ok && text.contains("only grow"), "rpc.py shows riser's refusal: {text}");

    // Once its LUN is removed, the malloc device may shrink.
    assert_eq!(riser.rpc(&["iscsi_target_node_remove_lun", &iqn, "2"]).json(), json!(true));
    assert_eq!(riser.rpc(&["bdev_malloc_resize", "Grows1", "2"]).json(), json!(true));
    let b = riser.rpc_json(&["bdev_get_bdevs", "-b", "Grows1"]);
    assert_eq!(b[0]["num_blocks"], json!(4096), "{b}");
}

/// SPDK's rpc.py (from ../shared's SPDK v24.01 tarball) against `riser`: (succeeded, output).
fn rpc_py(riser: &Riser, dir: &TempDir) -> impl Fn(&[&str]) -> (bool, String) {
    let script = spdk_rpc_py(dir);
    let sock = riser.socket().to_string_lossy().to_string();
    move |args: &[&str]| {
        let out = std::process::Command::new("python3").arg(&script).args(["-s", &sock]).args(args).output().expect("python3");
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

#[test]
fn a_requested_logout_sends_the_async_message_then_drops_a_session_that_ignores_it() {
    let riser = Riser::start();
    let port = free_port();
    let leaving = riser.add_iscsi_target("leaving", port, &[8]);
    let staying = riser.add_iscsi_target("staying", port, &[8]);
    let mut a = session(&riser, port, &leaving);
    let mut polite = session(&riser, port, &leaving);
    let mut b = session(&riser, port, &staying);
    assert_eq!(wait_connections(&riser, 3).len(), 3);

    // Another portal group's connections only: nobody here is asked.
    assert_eq!(riser.rpc(&["iscsi_target_node_request_logout", &leaving, "-t", "7", "-w", "2"]).json(), json!(true));
    assert_eq!(riser.rpc(&["iscsi_target_node_request_logout", &leaving, "-t", "1", "-w", "2"]).json(), json!(true));
    let t0 = Instant::now();
    for c in [&mut a, &mut polite] {
        let msg = async_message(&riser, c);
        assert_eq!((msg.async_event, msg.parameter3), (1, 2), "logout requested, within 2 s: {msg:?}");
    }
    // A session that does as asked logs out cleanly.
    let itt = polite.itt();
    let l = LogoutRequest { immediate: true, reason_code: 0, itt, cid: polite.cid, cmd_sn: polite.cmd_sn, exp_stat_sn: polite.exp_stat_sn };
    polite.send(&Pdu::new(Op::LogoutRequest(l))).expect("send Logout");
    let r = polite.recv().expect("a Logout Response");
    assert!(matches!(&r.bhs.op, Op::LogoutResponse(l) if l.response == 0), "{:?}", r.bhs.op);
    assert!(polite.closed_within(Duration::from_secs(5)));
    // The session ignores it: dropped once the 2 s are up (not before).
    assert!(a.closed_within(Duration::from_secs(10)), "the session that ignored the request is still open\nriser log:\n{}", riser.log());
    assert!(t0.elapsed() >= Duration::from_millis(1500), "dropped after {:?}, before the time it was given", t0.elapsed());
    // The log says which and why: only the session that ignored it.
    assert_eq!(riser.log().matches("no Logout within 2 s of the logout request").count(), 1, "riser log:\n{}", riser.log());
    // The other target's session saw nothing and keeps working.
    let conns = wait_connections(&riser, 1);
    assert_eq!(conns.len(), 1, "{conns:?}");
    assert_eq!(conns[0]["target_node_name"], json!(staying));
    write_and_verify(&mut b, 0, 0, 21);

    // Bad input: unknown node, a wait out of range.
    refused(&riser, &["iscsi_target_node_request_logout", "iqn.2016-06.io.riser:nope"], "not found");
    refused(&riser, &["iscsi_target_node_request_logout", &staying, "-w", "0"], "logout_timeout");

    // SPDK's rpc.py drives it unchanged (a node without sessions: nothing to ask).
    let dir = TempDir::new("spdk");
    let rpc_py = rpc_py(&riser, &dir);
    let (ok, text) = rpc_py(&["iscsi_target_node_request_logout", &leaving, "-t", "1"]);
    // (rpc.py prints nothing for this method.)
    assert!(ok, "rpc.py iscsi_target_node_request_logout: {text}");
    let (ok, _) = rpc_py(&["iscsi_target_node_request_logout", "iqn.2016-06.io.riser:nope"]);
    assert!(!ok, "rpc.py: an unknown node is refused");
    write_and_verify(&mut b, 0, 8, 22);
}

/// The next Async Message on `c` (NOP-In pings skipped).
fn async_message(riser: &Riser, c: &mut Client) -> AsyncMessage {
    c.set_read_timeout(Duration::from_secs(5));
    loop {
        let p = c.recv().unwrap_or_else(|| panic!("no Async Message; the connection closed\nriser log:\n{}", riser.log()));
        match p.bhs.op {
            Op::AsyncMessage(m) => return m,
            Op::NopIn(_) => continue,
            other => panic!("expected an Async Message, got {other:?}"),
        }
    }
}

/// The first Login Response to a login to `iqn`: (status class, detail, keys).
fn first_login_answer(port: u16, iqn: &str) -> (u8, u8, Pairs) {
    let mut c = Client::connect(port);
    let keys = [("InitiatorName", INITIATOR), ("TargetName", iqn), ("SessionType", "Normal"), ("AuthMethod", "None")];
    let req = c.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, true, &keys);
    c.send(&req).expect("send login");
    let resp = c.recv().expect("a Login Response");
    let Op::LoginResponse(r) = &resp.bhs.op else { panic!("expected a Login Response, got {:?}", resp.bhs.op) };
    (r.status.class, r.status.detail, parse_pairs(&resp.data).unwrap_or_default())
}

#[test]
fn a_redirect_answers_new_logins_with_target_moved_and_leaves_sessions_alone() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("moved", port, &[8]);
    let mut old = session(&riser, port, &iqn);

    assert_eq!(riser.rpc(&["iscsi_target_node_set_redirect", &iqn, "1", "-a", "127.0.0.2", "-p", "3261"]).json(), json!(true));
    let (class, detail, keys) = first_login_answer(port, &iqn);
    assert_eq!((class, detail), (1, 1), "Target moved temporarily: {keys:?}");
    assert!(keys.contains(&("TargetAddress".into(), "127.0.0.2:3261,1".into())), "{keys:?}");
    // The session logged in before keeps doing I/O.
    write_and_verify(&mut old, 0, 0, 31);
    // Shown, and saved as its own call.
    let nodes = riser.rpc_json(&["iscsi_get_target_nodes"]);
    assert_eq!(nodes[0]["redirects"], json!([{"pg_tag": 1, "redirect_host": "127.0.0.2", "redirect_port": "3261"}]), "{nodes}");
    let saved = riser.rpc(&["save_config"]).json();
    let iscsi = saved["subsystems"].as_array().and_then(|s| s.iter().find(|s| s["subsystem"] == "iscsi")).expect("iscsi subsystem");
    let call = iscsi["config"].as_array().and_then(|c| c.iter().find(|c| c["method"] == "iscsi_target_node_set_redirect"));
    assert_eq!(call.map(|c| c["params"].clone()), Some(json!({"name": iqn, "pg_tag": 1, "redirect_host": "127.0.0.2", "redirect_port": "3261"})));

    // Bad input: its own portal, an unknown portal group, not an IP address.
    refused(&riser, &["iscsi_target_node_set_redirect", &iqn, "1", "-a", "127.0.0.1", "-p", &port.to_string()], "portal of portal group 1");
    refused(&riser, &["iscsi_target_node_set_redirect", &iqn, "7", "-a", "127.0.0.2"], "portal group 7 not found");
    refused(&riser, &["iscsi_target_node_set_redirect", &iqn, "1", "-a", "somewhere"], "numeric IP");

    // Cleared (riser-rpc without -a): logins succeed again.
    assert_eq!(riser.rpc(&["iscsi_target_node_set_redirect", &iqn, "1"]).json(), json!(true));
    let mut new = session(&riser, port, &iqn);
    write_and_verify(&mut new, 0, 16, 32);
    assert!(riser.rpc_json(&["iscsi_get_target_nodes"])[0].get("redirects").is_none());

    // SPDK's rpc.py drives it unchanged: set, then clear.
    let dir = TempDir::new("spdk");
    let rpc_py = rpc_py(&riser, &dir);
    let (ok, text) = rpc_py(&["iscsi_target_node_set_redirect", &iqn, "1", "-a", "127.0.0.3", "-p", "3262"]);
    // (rpc.py prints nothing for this method.)
    assert!(ok, "rpc.py iscsi_target_node_set_redirect: {text}\nriser log:\n{}", riser.log());
    let (class, detail, keys) = first_login_answer(port, &iqn);
    assert_eq!((class, detail), (1, 1));
    assert!(keys.contains(&("TargetAddress".into(), "127.0.0.3:3262,1".into())), "{keys:?}");
    let (ok, text) = rpc_py(&["iscsi_target_node_set_redirect", &iqn, "1"]);
    assert!(ok, "rpc.py clearing the redirect: {text}");
    let (class, detail, _) = first_login_answer(port, &iqn);
    assert_eq!((class, detail), (0, 0), "after clearing, the login goes on");
    write_and_verify(&mut old, 0, 24, 33);
    write_and_verify(&mut new, 0, 32, 34);
}

#[path = "live_changes/access.rs"]
mod access;
#[path = "live_changes/acceptance.rs"]
mod acceptance;
