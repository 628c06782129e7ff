//! Hostile CHAP: an initiator that knows a CHAP user's secret but is not the initiator that
//! user is bound to (riser's `initiator_group` on an auth-group secret, as LIO binds CHAP
//! credentials to an ACL). Over the in-memory datamover: the login driver, the login policy
//! and CHAP as riser runs them.

mod common;

use riser_iscsi::chap::{ChapAlgorithm, ChapCredentials, ChapInitiatorConfig};
use riser_iscsi::pdu::Lun;
use riser_initiator::session::{LoginParams, Negotiated, PduSession, SessionType, INITIATOR_NAME};
use serde_json::json;

use common::*;

/// Another initiator, which the node's ACL (initiator group 1: ANY) lets in.
const MALLORY: &str = "iqn.1994-05.com.example:mallory";
/// The status text of an Authorization Failure (0x0202) as the client reports it.
const AUTHORIZATION_FAILURE: &str = "status class 0x02, detail 0x02";

/// Initiator group 2 admits only riser-perf's own name; in auth group 1, alice is bound to it
/// (mutual with `riser`), bob is not. The node and discovery require CHAP from group 1.
fn bind_alice(env: &Env) {
    env.call("iscsi_create_initiator_group", json!({"tag": 2, "initiators": [INITIATOR_NAME], "netmasks": ["ANY"]}));
    env.call(
        "iscsi_create_auth_group",
        json!({"tag": 1, "secrets": [
            {"user": "alice", "secret": "alice-secret-1", "muser": "riser", "msecret": "riser-secret-2", "initiator_group": 2},
            {"user": "bob", "secret": "bob-secret-123"}
        ]}),
    );
    env.call("iscsi_target_node_set_auth", json!({"name": TARGET, "chap_group": 1, "require_chap": true}));
    env.call("iscsi_set_discovery_auth", json!({"require_chap": true, "chap_group": 1}));
}

fn chap(user: &str, secret: &str) -> ChapInitiatorConfig {
    let mut cfg = ChapInitiatorConfig::new(ChapCredentials::new(user, secret));
    cfg.algorithms = vec![ChapAlgorithm::Sha256];
    cfg
}

/// A normal-session login as `initiator` with `cfg`, from initiator port `n`.
fn login(env: &Env, n: u8, initiator: &str, cfg: ChapInitiatorConfig) -> (Client, Result<Negotiated, String>) {
    let mut c = Client { s: PduSession::new(format!("chap {n}"), Lun(0)), c: env.connect(n) };
    let params = LoginParams::normal(initiator, TARGET, [0x80, 0, 0, 0, 0, n]).with_chap(cfg);
    let r = c.login_as(&params, keys(true, false, 65536));
    (c, r)
}

fn authorization_failures(env: &Env) -> u64 {
    env.call("iscsi_get_stats", json!({}))["logins"]["failed"]["authorization"].as_u64().unwrap_or(0)
}

#[test]
fn a_bound_chap_user_logs_in_only_as_its_initiator() {
    let env = Env::new();
    bind_alice(&env);

    // The right secret, the wrong InitiatorName: Authorization Failure, nothing logged in.
    let (mut c, r) = login(&env, 1, MALLORY, chap("alice", "alice-secret-1"));
    let err = r.expect_err("alice's secret logged in as another initiator");
    assert!(err.contains(AUTHORIZATION_FAILURE), "{err}");
    // Closed once counted (the count follows the response).
    assert!(matches!(c.c.recv(WAIT), Ok(None)), "closed after the refusal");
    assert_eq!(authorization_failures(&env), 1);
    // Asking for mutual CHAP does not get the target's answer either.
    let mut mutual = chap("alice", "alice-secret-1");
    mutual.mutual = Some(ChapCredentials::new("riser", "riser-secret-2"));
    let (mut c, r) = login(&env, 2, MALLORY, mutual.clone());
    assert!(r.expect_err("refused").contains(AUTHORIZATION_FAILURE));
    // Closed once counted (the count follows the response).
    assert!(matches!(c.c.recv(WAIT), Ok(None)), "closed after the refusal");
    assert_eq!(authorization_failures(&env), 2);
    assert!(env.connections().is_empty());

    // The bound name logs in, one-way and mutual, and does I/O.
    for (n, cfg) in [(3, chap("alice", "alice-secret-1")), (4, mutual)] {
        let (mut c, r) = login(&env, n, INITIATOR_NAME, cfg);
        r.expect("alice as her own initiator");
        c.clear_unit_attention();
        good(&c.read(0, 512));
        c.logout();
    }
    // An unbound user logs in as anyone the node's ACL admits.
    let (c, r) = login(&env, 5, MALLORY, chap("bob", "bob-secret-123"));
    r.expect("bob is not bound");
    c.logout();
    assert_eq!(authorization_failures(&env), 2);
}

#[test]
fn a_bound_chap_user_is_bound_in_discovery_too() {
    let env = Env::new();
    bind_alice(&env);
    let discovery = |n: u8, initiator: &str| {
        let mut c = Client { s: PduSession::new(format!("discovery {n}"), Lun(0)), c: env.connect(n) };
        let params = LoginParams {
            target_name: None,
            session_type: SessionType::Discovery,
            ..LoginParams::normal(initiator, TARGET, [0x80, 0, 0, 0, 1, n])
        }
        .with_chap(chap("alice", "alice-secret-1"));
        c.login_as(&params, keys(true, false, 65536))
    };
    let err = discovery(1, MALLORY).expect_err("alice's secret opened discovery as another initiator");
    assert!(err.contains(AUTHORIZATION_FAILURE), "{err}");
    discovery(2, INITIATOR_NAME).expect("alice's discovery as her own initiator");
}

/// A bound group deleted while the binding stays: the user fails closed, with a reason.
#[test]
fn the_initiator_group_a_user_is_bound_to_cannot_be_deleted_under_it() {
    let env = Env::new();
    bind_alice(&env);
    // Refused (-16): the binding would point at nothing, and save_config's auth group would no
    // longer load at the next start.
    let e = env.rpc.call("iscsi_delete_initiator_group", json!({"tag": 2})).expect_err("a bound group is in use");
    assert!(format!("{e:?}").contains("binds CHAP user alice"), "{e:?}");
    let (_, r) = login(&env, 1, INITIATOR_NAME, chap("alice", "alice-secret-1"));
    assert!(r.is_ok(), "the binding still holds: {r:?}");
}
