//! Access rules changed under live sessions (issue 26, item 2): an initiator group's netmask,
//! CHAP secrets and policy, a portal group's discovery authentication, a portal group deleted.
//! A session the new rules shut out is asked to log out (Async Message, then dropped after the
//! wait) and the log says which and why; the others are left alone.

use std::net::{Ipv4Addr, TcpStream};

use riser_tests::iscsi::connect_from;

use super::*;

/// Logs out as asked (Logout Request, close the session), and checks the target answered.
fn log_out(c: &mut Client) {
    let itt = c.itt();
    let l = LogoutRequest { immediate: true, reason_code: 0, itt, cid: c.cid, cmd_sn: c.cmd_sn, exp_stat_sn: c.exp_stat_sn };
    c.send(&Pdu::new(Op::LogoutRequest(l))).expect("send Logout");
    let r = loop {
        let p = c.recv().expect("a Logout Response");
        if !matches!(p.bhs.op, Op::NopIn(_) | Op::AsyncMessage(_)) {
            break p;
        }
    };
    assert!(matches!(&r.bhs.op, Op::LogoutResponse(l) if l.response == 0), "{:?}", r.bhs.op);
    assert!(c.closed_within(Duration::from_secs(5)));
}

/// A client connected from `source` (another host, as far as riser can tell).
fn client_from(source: &str, port: u16) -> Client {
    let ip: Ipv4Addr = source.parse().expect("IPv4");
    Client::over(connect_from(ip, port, None).unwrap_or_else(|e| panic!("connect from {source}: {e}")))
}

/// Lines of the log that say a connection was asked to log out.
fn asked_lines(riser: &Riser) -> Vec<String> {
    riser.log().lines().filter(|l| l.contains("asked to log out within")).map(str::to_string).collect()
}

/// A discovery login (SessionType=Discovery, no CHAP) up to full-feature phase.
pub(super) fn discovery_login(c: &mut Client) -> Result<(), (u8, u8)> {
    let keys = [("InitiatorName", INITIATOR), ("SessionType", "Discovery"), ("AuthMethod", "None")];
    let req = c.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, true, &keys);
    c.login_step(&req)?;
    let keys = [("HeaderDigest", "None"), ("DataDigest", "None"), ("MaxRecvDataSegmentLength", "65536")];
    let mut req = c.login_request(Stage::LoginOperationalNegotiation, Stage::FullFeaturePhase, true, &keys);
    for _ in 0..4 {
        c.send(&req).expect("send login");
        let resp = c.recv().ok_or((0xff, 0xff))?;
        let Op::LoginResponse(r) = &resp.bhs.op else { panic!("expected a Login Response, got {:?}", resp.bhs.op) };
        if r.status.class != 0 {
            return Err((r.status.class, r.status.detail));
        }
        if r.transit_bit && r.nsg == Stage::FullFeaturePhase {
            c.cmd_sn = r.exp_cmd_sn;
            return Ok(());
        }
        let offered: Pairs = parse_pairs(&resp.data).unwrap_or_default();
        let offered: Vec<(&str, &str)> = offered.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        req = c.login_request(Stage::LoginOperationalNegotiation, Stage::FullFeaturePhase, true, &offered);
    }
    Err((0xfe, 0))
}

#[test]
fn a_netmask_change_asks_only_the_session_it_shuts_out_to_log_out() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("netmask", port, &[8]);
    let mut here = session(&riser, port, &iqn);
    let mut there = client_from("127.0.0.2", port);
    there.login(&iqn, &[]).unwrap_or_else(|s| panic!("login from 127.0.0.2: {s:?}\nriser log:\n{}", riser.log()));
    assert!(there.clear_unit_attentions());
    write_and_verify(&mut there, 0, 0, 60);
    assert_eq!(wait_connections(&riser, 2).len(), 2);

    // A netmask that admits both changes nothing.
    assert_eq!(riser.rpc(&["iscsi_initiator_group_add_initiators", "1", "-m", "127.0.0.1/32"]).json(), json!(true));
    assert!(asked_lines(&riser).is_empty(), "{:?}", asked_lines(&riser));
    // ANY goes: 127.0.0.2 is no longer admitted; its session is asked to log out.
    assert_eq!(riser.rpc(&["iscsi_initiator_group_remove_initiators", "1", "-m", "ANY"]).json(), json!(true));
    let msg = async_message(&riser, &mut there);
    assert_eq!((msg.async_event, msg.parameter3), (1, 30), "logout requested, within 30 s: {msg:?}");
    let asked = asked_lines(&riser);
    assert_eq!(asked.len(), 1, "only the session from 127.0.0.2 is asked: {asked:?}");
    assert!(
        asked[0].contains("from 127.0.0.2:")
            && asked[0].contains(&iqn)
            && asked[0].contains("initiator 127.0.0.2 not in initiator group 1's netmasks")
            && asked[0].contains("iscsi_initiator_group_remove_initiators on initiator group 1"),
        "the log names the session, the target and why: {asked:?}"
    );
    // Another change while it is on its way out: it is not asked (nor logged) twice.
    assert_eq!(riser.rpc(&["iscsi_initiator_group_add_initiators", "1", "-m", "10.0.0.0/8"]).json(), json!(true));
    assert_eq!(asked_lines(&riser).len(), 1, "{:?}", asked_lines(&riser));
    log_out(&mut there);
    // The session still admitted was left alone and keeps working.
    write_and_verify(&mut here, 0, 8, 61);
    assert_eq!(wait_connections(&riser, 1).len(), 1);

    // A new login from 127.0.0.2 is refused (Authorization failure), one from 127.0.0.1 is not.
    let mut again = client_from("127.0.0.2", port);
    assert_eq!(again.login(&iqn, &[]).err(), Some((2, 2)), "the shut-out initiator logs in again");
    let mut new = session(&riser, port, &iqn);
    write_and_verify(&mut new, 0, 16, 62);
    write_and_verify(&mut here, 0, 24, 63);
    assert_eq!(asked_lines(&riser).len(), 1);
}

#[test]
fn chap_changes_ask_sessions_without_chap_or_with_a_removed_secret_to_log_out() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("chapchange", port, &[8]);
    let call = |m: &str, p: Value| riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", riser.log()));
    call(
        "iscsi_create_auth_group",
        json!({"tag": 1, "secrets": [{"user": "u1", "secret": "u1-secret-0123"}, {"user": "u2", "secret": "u2-secret-0123"}]}),
    );
    assert_eq!(riser.rpc(&["iscsi_target_node_set_auth", &iqn, "-g", "1"]).json(), json!(true));
    let chap_session = |user: &str, secret: &str| {
        let mut c = Client::connect(port);
        c.login_chap(INITIATOR, &iqn, user, secret).unwrap_or_else(|s| panic!("CHAP login as {user}: {s:?}\nriser log:\n{}", riser.log()));
        assert!(c.clear_unit_attentions());
        c
    };
    let mut plain = session(&riser, port, &iqn);
    let mut c1 = chap_session("u1", "u1-secret-0123");
    let mut c2 = chap_session("u2", "u2-secret-0123");
    assert_eq!(wait_connections(&riser, 3).len(), 3);

    // u1's secret goes: only u1's session is asked.
    assert_eq!(riser.rpc(&["iscsi_auth_group_remove_secret", "1", "-u", "u1"]).json(), json!(true));
    let msg = async_message(&riser, &mut c1);
    assert_eq!(msg.async_event, 1, "{msg:?}");
    let asked = asked_lines(&riser);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].contains("CHAP user u1 has no secret in auth group 1"), "{asked:?}");
    log_out(&mut c1);
    let mut c1 = Client::connect(port);
    assert!(c1.login_chap(INITIATOR, &iqn, "u1", "u1-secret-0123").is_err(), "u1 logs in without a secret");

    // CHAP becomes required: the session that logged in without it is asked, u2's is not.
    assert_eq!(riser.rpc(&["iscsi_target_node_set_auth", &iqn, "-g", "1", "-r"]).json(), json!(true));
    let msg = async_message(&riser, &mut plain);
    assert_eq!(msg.async_event, 1, "{msg:?}");
    let asked = asked_lines(&riser);
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(asked[1].contains(&format!("target node {iqn} now requires CHAP; the session logged in without it")), "{asked:?}");
    assert!(asked[1].contains("iscsi_target_node_set_auth"), "{asked:?}");
    log_out(&mut plain);
    assert!(Client::connect(port).login(&iqn, &[]).is_err(), "a login without CHAP is refused now");
    write_and_verify(&mut c2, 0, 0, 70);
    assert_eq!(wait_connections(&riser, 1).len(), 1, "u2's session stays");
    assert_eq!(asked_lines(&riser).len(), 2);
}

#[test]
fn deleting_a_portal_group_closes_only_its_connections() {
    let riser = Riser::start();
    let (p1, p2) = (free_port(), free_port());
    let iqn = riser.add_iscsi_target("twopg", p1, &[8]);
    let call = |m: &str, p: Value| riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", riser.log()));
    call("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "127.0.0.1", "port": p2.to_string()}]}));
    call("iscsi_target_node_add_pg_ig_maps", json!({"name": iqn, "pg_ig_maps": [{"pg_tag": 2, "ig_tag": 1}]}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", p2)).is_err() {
        assert!(Instant::now() < deadline, "riser does not listen on {p2}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut one = session(&riser, p1, &iqn);
    let mut two = session(&riser, p2, &iqn);
    let mut disc = Client::connect(p2);
    discovery_login(&mut disc).expect("discovery through portal group 2");
    write_and_verify(&mut two, 0, 0, 80);
    assert_eq!(wait_connections(&riser, 3).len(), 3);

    assert_eq!(riser.rpc(&["iscsi_delete_portal_group", "2"]).json(), json!(true), "{}", riser.log());
    assert!(two.closed_within(Duration::from_secs(5)), "the session through portal group 2 is still open");
    assert!(disc.closed_within(Duration::from_secs(5)), "the discovery session through portal group 2 is still open");
    // The same target's session through portal group 1 goes on.
    write_and_verify(&mut one, 0, 8, 81);
    let conns = wait_connections(&riser, 1);
    assert_eq!(conns.len(), 1, "{conns:?}");
    assert_eq!(conns[0]["pg_tag"], json!(1));
    let log = riser.log();
    let line = log.lines().find(|l| l.contains("portal group 2 deleted: closing 2 connection(s)")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("to discovery through portal group 2") && line.contains(&format!("to {iqn} through portal group 2")), "{line}");
    // The node is no longer mapped to it; nothing listens there any more.
    assert_eq!(riser.rpc_json(&["iscsi_get_target_nodes"])[0]["pg_ig_maps"], json!([{"pg_tag": 1, "ig_tag": 1}]));
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", p2)).is_ok() {
        assert!(Instant::now() < deadline, "portal group 2's portal still accepts connections");
        std::thread::sleep(Duration::from_millis(20));
    }
    refused(&riser, &["iscsi_delete_portal_group", "2"], "portal group 2 not found");
    write_and_verify(&mut one, 0, 16, 82);
}

#[test]
fn portal_group_auth_governs_discovery_through_that_group() {
    let riser = Riser::start();
    let (p1, p2) = (free_port(), free_port());
    riser.add_iscsi_target("discauth", p1, &[8]);
    let call = |m: &str, p: Value| riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", riser.log()));
    call("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "127.0.0.1", "port": p2.to_string()}]}));
    call("iscsi_create_auth_group", json!({"tag": 5, "secrets": [{"user": "d", "secret": "discovery-0123"}]}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", p2)).is_err() {
        assert!(Instant::now() < deadline, "riser does not listen on {p2}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut d1 = Client::connect(p1);
    discovery_login(&mut d1).expect("discovery through portal group 1");
    let mut d2 = Client::connect(p2);
    discovery_login(&mut d2).expect("discovery through portal group 2");

    // CHAP required for discovery through portal group 1: its session (no CHAP) is asked to
    // log out; the one through portal group 2 is not.
    assert_eq!(riser.rpc(&["iscsi_portal_group_set_auth", "1", "-r", "-g", "5"]).json(), json!(true));
    let msg = async_message(&riser, &mut d1);
    assert_eq!(msg.async_event, 1, "{msg:?}");
    let asked = asked_lines(&riser);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].contains("discovery through portal group 1 now requires CHAP"), "{asked:?}");
    log_out(&mut d1);
    assert!(discovery_login(&mut Client::connect(p1)).is_err(), "discovery without CHAP through portal group 1");
    discovery_login(&mut Client::connect(p2)).expect("portal group 2 keeps the global policy");
    assert!(d2.nop(b"still here").is_some(), "the discovery session through portal group 2 is left alone");

    // Shown and saved.
    let groups = riser.rpc_json(&["iscsi_get_portal_groups"]);
    assert_eq!((groups[0]["require_chap"].clone(), groups[0]["chap_group"].clone()), (json!(true), json!(5)), "{groups}");
    let saved = riser.rpc(&["save_config"]).json();
    let iscsi = saved["subsystems"].as_array().and_then(|s| s.iter().find(|s| s["subsystem"] == "iscsi")).expect("iscsi subsystem");
    let set = iscsi["config"].as_array().and_then(|c| c.iter().find(|c| c["method"] == "iscsi_portal_group_set_auth"));
    assert_eq!(set.map(|c| c["params"].clone()), Some(json!({"tag": 1, "require_chap": true, "chap_group": 5})));

    // SPDK's checks; the node serves on.
    refused(&riser, &["iscsi_portal_group_set_auth", "9"], "portal group 9 not found");
    refused(&riser, &["iscsi_portal_group_set_auth", "1", "-m"], "mutual_chap requires require_chap");
    let out = riser.rpc(&["iscsi_portal_group_set_auth", "1", "-d", "-r"]);
    assert!(!out.status.success(), "--disable-chap with --require-chap: {out:?}");
    assert!(riser.rpc(&["iscsi_portal_group_set_auth", "--help"]).stdout.contains("--require-chap"));
    // Back to no CHAP, through SPDK's rpc.py: discovery without it works again.
    let dir = TempDir::new("spdk");
    let rpc_py = rpc_py(&riser, &dir);
    let (ok, text) = rpc_py(&["iscsi_portal_group_set_auth", "1", "-d"]);
    assert!(ok, "rpc.py iscsi_portal_group_set_auth: {text}\nriser log:\n{}", riser.log());
    discovery_login(&mut Client::connect(p1)).expect("discovery with CHAP disabled");
    assert_eq!(riser.rpc_json(&["iscsi_get_portal_groups"])[0]["disable_chap"], json!(true));
    let (ok, _) = rpc_py(&["iscsi_portal_group_set_auth", "1", "-d", "-r"]);
    assert!(!ok, "rpc.py: disable and require together are refused");
}
