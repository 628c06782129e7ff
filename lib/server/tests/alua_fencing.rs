//! A gateway fenced from its device's group (issue 23), with the real server over the
//! in-memory datamover and a fake gateway group (`riser_bdev::testing`): the node's
//! sessions are dropped, new logins are let in and find the port unavailable (NOT READY,
//! LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE), and once the gateway
//! has rejoined they hear ASYMMETRIC ACCESS STATE CHANGED and do I/O again.

mod common;

use std::time::{Duration, Instant};

use riser_bdev::testing::FakeGatewayGroup;
use riser_bdev::MemberState;
use riser_iscsi::pdu::Lun;
use riser_initiator::session::{Completed, LoginParams, PduSession, Unsolicited, INITIATOR_NAME};

use common::*;

fn tur(c: &mut Client) -> Completed {
    let (itt, pdus) = c.s.scsi_command(&[0u8; 6], 0, &[], Unsolicited::Negotiated).expect("TEST UNIT READY");
    c.send(pdus);
    c.completion(itt)
}

fn sense(d: &Completed) -> Option<(u8, u8, u8)> {
    d.sense.as_ref().map(|s| (s.key, s.asc, s.ascq))
}

/// Waits until the target closes `c`'s connection.
fn closed(c: &mut Client) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        match c.c.recv(Duration::from_millis(200)) {
            Ok(None) => return true,
            Ok(Some(_)) => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn a_fenced_gateway_drops_its_sessions_and_lets_new_ones_find_the_port_unavailable() {
    let g = FakeGatewayGroup::new(1, "a:1");
    let env = Env::grouped(g.clone());
    let (mut c, _) = Client::login(&env, 1, keys(true, false, 65536));
    good(&c.read(0, 4096));
    g.set_peer(2, "b:2", &[2], MemberState::Live);
    good(&tur(&mut c));

    // Fenced: the session goes.
    g.fence_me();
    assert!(closed(&mut c), "the target closes the fenced node's connection");
    env.wait_connections(0);

    // A new login is let in; media access gets NOT READY, unavailable.
    let mut n = Client { s: PduSession::new("client 2".to_string(), Lun(0)), c: env.connect(2) };
    let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, 2]);
    n.login_as(&params, keys(true, false, 65536)).expect("a login while fenced is let in");
    assert_eq!(sense(&tur(&mut n)), Some((6, 0x29, 0x00)), "POWER ON first");
    assert_eq!(sense(&tur(&mut n)), Some((2, 0x04, 0x0C)), "TARGET PORT IN UNAVAILABLE STATE");
    let r = n.read(0, 4096);
    assert_eq!((r.status, sense(&r)), (2, Some((2, 0x04, 0x0C))));
    let nodes = env.call("iscsi_get_target_nodes", serde_json::json!(null));
    assert_eq!(nodes[0]["alua_groups"][0]["state"], "unavailable");

    // Rejoined: the session hears of it and reads again.
    g.rejoin_me(3);
    assert_eq!(sense(&tur(&mut n)), Some((6, 0x2A, 0x06)), "ASYMMETRIC ACCESS STATE CHANGED");
    good(&tur(&mut n));
    good(&n.read(0, 4096));
    n.logout();
}
