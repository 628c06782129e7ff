//! A failed login over TCP leaves the close to the initiator: after its last Login Response
//! the target keeps the socket open until the initiator closes it, bounded (a peer that never
//! closes holds it a second, not longer). Closing at once raced the Linux initiator's own
//! teardown of the failed login (a guest oops in iscsi_sw_tcp_release_conn, seen in rxe_vm's
//! wrong-password step). Over riser's real TCP portal.

mod common;

use std::io::ErrorKind;
use std::time::Duration;

use riser_iscsi::chap::{ChapCredentials, ChapInitiatorConfig};
use riser_iscsi::pdu::Lun;
use riser_initiator::session::{LoginParams, PduSession, INITIATOR_NAME};
use serde_json::json;

use common::*;

/// A wrong CHAP secret over TCP: the reject comes, then the target does not close first;
/// a client that never closes finds its socket closed by the target later (the bound).
#[test]
fn a_failed_tcp_login_waits_for_the_initiator_to_close_within_a_bound() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let addr = format!("127.0.0.1:{port}");
    let env = Env::tcp(&addr);
    env.call("iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": "alice", "secret": "alice-secret-1"}]}));
    env.call("iscsi_target_node_set_auth", json!({"name": TARGET, "chap_group": 1, "require_chap": true}));

    let wire = TcpWire::connect(addr.parse().expect("address"));
    let mut c = Client { s: PduSession::new("bad chap".to_string(), Lun(0)), c: wire };
    let cfg = ChapInitiatorConfig::new(ChapCredentials::new("alice", "not-alice-secret"));
    let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, 1]).with_chap(cfg);
    let err = c.login_as(&params, keys(true, false, 65536)).expect_err("a wrong secret logged in");
    assert!(err.contains("status class 0x02, detail 0x01"), "{err}");

    // The target has not closed right after its response (before: an EOF at once).
    match c.c.recv(Duration::from_millis(300)) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("the target closed (or sent) right after the failed login: {other:?}"),
    }
    // This client never closes: the target does, at its bound (1 s; 20 s is only the test's
    // patience on a loaded machine).
    match c.c.recv(Duration::from_secs(20)) {
        Ok(None) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("the target kept a failed login's socket open: {other:?}"),
    }
}
