//! Failed logins are logged rate-limited (issue #22's leftovers): a peer can fail as many
//! logins as it likes (a wrong CHAP secret, an unknown target, an ACL refusal, malformed
//! PDUs), and each used to log a line of its own. Now the first lines of each second are
//! logged per kind, the rest summed up in one line. Over the in-memory datamover, with a
//! logger that keeps the server's lines.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use riser_iscsi::chap::{ChapCredentials, ChapInitiatorConfig};
use riser_iscsi::pdu::Lun;
use riser_initiator::session::{LoginParams, PduSession, INITIATOR_NAME};
use serde_json::json;

use common::*;

/// Every line logged, at any level.
static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        LINES.lock().unwrap_or_else(|p| p.into_inner()).push(format!("{}", r.args()));
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture;

fn authentication_failures(env: &Env) -> u64 {
    env.call("iscsi_get_stats", json!({}))["logins"]["failed"]["authentication"].as_u64().unwrap_or(0)
}

/// One login with a wrong CHAP secret from initiator port `n` (source 127.0.0.1n).
fn bad_chap(env: &Env, n: u8) {
    let mut c = Client { s: PduSession::new(format!("bad chap {n}"), Lun(0)), c: env.connect(n) };
    let cfg = ChapInitiatorConfig::new(ChapCredentials::new("alice", "not-alice-secret"));
    let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, n]).with_chap(cfg);
    let err = c.login_as(&params, keys(true, false, 65536)).expect_err("a wrong secret logged in");
    assert!(err.contains("status class 0x02, detail 0x01"), "{err}");
}

/// 300 logins with a wrong CHAP secret, from 8 addresses, as fast as they go: at most
/// [`FAILED_LOGIN_LINES`] lines of their own and one summary per second, and the lines and
/// summaries together account for every failure (the summary of the last second comes with
/// the next failure). Before, 300 lines.
#[test]
fn failed_chap_logins_are_logged_at_a_bounded_rate() {
    log::set_logger(&CAPTURE).expect("the test's logger");
    log::set_max_level(log::LevelFilter::Info);
    let env = Env::new();
    env.call("iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": "alice", "secret": "alice-secret-1"}]}));
    env.call("iscsi_target_node_set_auth", json!({"name": TARGET, "chap_group": 1, "require_chap": true}));
    let t0 = Instant::now();
    for i in 0..300u32 {
        bad_chap(&env, (i % 8) as u8 + 1);
    }
    let secs = t0.elapsed().as_secs();
    // A quiet second, then one more: it brings the summary of the last window.
    std::thread::sleep(Duration::from_millis(1100));
    bad_chap(&env, 9);
    let deadline = Instant::now() + WAIT;
    while authentication_failures(&env) < 301 {
        assert!(Instant::now() < deadline, "the failures are counted");
        std::thread::sleep(Duration::from_millis(10));
    }
    let lines = LINES.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let own: Vec<&String> = lines.iter().filter(|l| l.contains("failed (0x0201)")).collect();
    let summaries: Vec<&String> = lines.iter().filter(|l| l.contains("more failed logins (authentication)")).collect();
    let summed: u64 = summaries
        .iter()
        .map(|l| l.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or_else(|| panic!("no count: {l}")))
        .sum();
    assert_eq!(own.len() as u64 + summed, 301, "every failure is in a line or a summary:\n{}", lines.join("\n"));
    // One window a second, and one for the last login.
    let windows = secs + 2;
    assert!(
        own.len() as u64 <= riser_server::stats::FAILED_LOGIN_LINES as u64 * windows && summaries.len() as u64 <= windows,
        "{} lines of their own and {} summaries in {secs} s:\n{}",
        own.len(),
        summaries.len(),
        lines.join("\n")
    );
    assert!(!summaries.is_empty(), "300 failures in {secs} s and none summed up");
    assert!(summaries.iter().all(|l| l.contains("127.0.0.1")), "summaries name the sources: {summaries:?}");
    // The log says who, never the secret.
    assert!(lines.iter().all(|l| !l.contains("not-alice-secret") && !l.contains("alice-secret-1")));
    // Healthy logins go on.
    let (c, _) = {
        let mut c = Client { s: PduSession::new("alice", Lun(0)), c: env.connect(20) };
        let cfg = ChapInitiatorConfig::new(ChapCredentials::new("alice", "alice-secret-1"));
        let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, 20]).with_chap(cfg);
        let neg = c.login_as(&params, keys(true, false, 65536)).expect("alice");
        (c, neg)
    };
    c.logout();
}
