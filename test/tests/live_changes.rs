//! Changes to a live target are safe: the real `riser`, configured through the real
//! `riser-rpc`, changed while initiators are logged in (LUN added, target node deleted,
//! session reinstated), and the iSCSI configuration surviving save_config and a restart.
//! Needs `cargo build --workspace` first.

use std::time::{Duration, Instant};

use riser_iscsi::pdu::{Isid, Lun, Op, Pdu, Stage};
use riser_iscsi::text::{parse_pairs, Pairs};
use riser_tests::iscsi::{Client, Reply, INITIATOR};
use riser_tests::*;

/// SCSI status CHECK CONDITION.
const CHECK_CONDITION: u8 = 0x02;
/// Sense key UNIT ATTENTION.
const UNIT_ATTENTION: u8 = 0x6;

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

    let t0 = Instant::now();
    let out = riser.rpc(&["iscsi_delete_target_node", &gone]);
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
