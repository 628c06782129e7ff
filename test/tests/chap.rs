//! CHAP against the real riser over TCP with real clients: libiscsi's tools log in with
//! one-way and mutual CHAP (right and wrong secrets), discovery authentication, and SPDK's
//! own `scripts/rpc.py` (from ../shared/peers/spdk) building an auth group and a CHAP target
//! that libiscsi then logs in to. Secrets never reach riser's log.

use std::process::Command;

use riser_tests::{free_port, spdk_rpc_py, Riser, TempDir};
use serde_json::{json, Value};

/// Runs a libiscsi tool; panics (loudly, no skipping) if it is not installed.
fn tool(name: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(name)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{name} is not installed ({e}): run `scripts/setup.sh test` (Debian package libiscsi-bin)"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn call(riser: &Riser, method: &str, params: Value) -> Value {
    riser.call(method, Some(params)).unwrap_or_else(|e| panic!("{method}: {e}\nriser log:\n{}", riser.log()))
}

fn login_failures(riser: &Riser, reason: &str) -> u64 {
    call(riser, "iscsi_get_stats", json!({}))["logins"]["failed"][reason].as_u64().unwrap_or(0)
}

/// A target `chap` on a fresh port, its node requiring CHAP with auth group 1.
fn chap_target(mutual: bool) -> (Riser, u16, String) {
    let riser = Riser::start_with(&["--log-level", "debug"]);
    let port = free_port();
    let iqn = riser.add_iscsi_target("chap", port, &[8]);
    let secret = if mutual {
        json!({"user": "alice", "secret": "alice-secret-1", "muser": "riser", "msecret": "riser-secret-2"})
    } else {
        json!({"user": "alice", "secret": "alice-secret-1"})
    };
    call(&riser, "iscsi_create_auth_group", json!({"tag": 1, "secrets": [secret]}));
    call(
        &riser,
        "iscsi_target_node_set_auth",
        json!({"name": iqn, "chap_group": 1, "require_chap": true, "mutual_chap": mutual}),
    );
    (riser, port, iqn)
}

fn no_secret_in_log(riser: &Riser) {
    let log = riser.log();
    for s in ["alice-secret-1", "riser-secret-2", "wrong-secret"] {
        assert!(!log.contains(s), "riser's log shows a secret ({s}):\n{log}");
    }
}

#[test]
fn libiscsi_one_way_chap() {
    let (riser, port, iqn) = chap_target(false);
    let url = |auth: &str| format!("iscsi://{auth}127.0.0.1:{port}/{iqn}/0");
    let (ok, inq) = tool("iscsi-inq", &[&url("alice%alice-secret-1@")]);
    assert!(ok && inq.contains("Vendor:RISER"), "the right secret logs in:\n{inq}\n{}", riser.log());
    let (ok, out) = tool("iscsi-inq", &[&url("alice%wrong-secret@")]);
    assert!(!ok, "a wrong secret must not log in:\n{out}");
    let (ok, out) = tool("iscsi-inq", &[&url("mallory%alice-secret-1@")]);
    assert!(!ok, "an unknown user must not log in:\n{out}");
    let (ok, out) = tool("iscsi-inq", &[&url("")]);
    assert!(!ok, "CHAP is required:\n{out}");
    assert!(login_failures(&riser, "authentication") >= 3, "{}", call(&riser, "iscsi_get_stats", json!({})));
    // One line per failure, naming initiator, address and target.
    let log = riser.log();
    assert!(
        log.lines().any(|l| l.contains("failed (0x0201)") && l.contains("127.0.0.1") && l.contains(&iqn)),
        "a failure line names who, from where and to what:\n{log}"
    );
    no_secret_in_log(&riser);
}

#[test]
fn libiscsi_mutual_chap() {
    let (riser, port, iqn) = chap_target(true);
    let url = |target_pw: &str| {
        format!("iscsi://alice%alice-secret-1@127.0.0.1:{port}/{iqn}/0?target_user=riser&target_password={target_pw}")
    };
    let (ok, inq) = tool("iscsi-inq", &[&url("riser-secret-2")]);
    assert!(ok && inq.contains("Vendor:RISER"), "mutual CHAP logs in:\n{inq}\n{}", riser.log());
    // The initiator refuses a target that does not know the secret it expects.
    let (ok, out) = tool("iscsi-inq", &[&url("wrong-secret")]);
    assert!(!ok, "libiscsi must refuse riser's answer to a different target secret:\n{out}");
    // Mutual CHAP is required: one-way is refused.
    let (ok, out) = tool("iscsi-inq", &[&format!("iscsi://alice%alice-secret-1@127.0.0.1:{port}/{iqn}/0")]);
    assert!(!ok, "one-way CHAP must not satisfy mutual_chap:\n{out}");
    no_secret_in_log(&riser);
}

#[test]
fn discovery_authentication() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("disc", port, &[8]);
    call(&riser, "iscsi_create_auth_group", json!({"tag": 7, "secrets": [{"user": "bob", "secret": "bob-secret-123"}]}));
    call(&riser, "iscsi_set_discovery_auth", json!({"require_chap": true, "chap_group": 7}));
    let (ok, ls) = tool("iscsi-ls", &[&format!("iscsi://bob%bob-secret-123@127.0.0.1:{port}")]);
    assert!(ok && ls.contains(&iqn), "authenticated discovery lists the target:\n{ls}\n{}", riser.log());
    let (ok, out) = tool("iscsi-ls", &[&format!("iscsi://127.0.0.1:{port}")]);
    assert!(!ok, "discovery without CHAP is refused:\n{out}");
    let (ok, out) = tool("iscsi-ls", &[&format!("iscsi://bob%nope@127.0.0.1:{port}")]);
    assert!(!ok, "discovery with a wrong secret is refused:\n{out}");
    // The normal session's own policy is separate: no CHAP on the node.
    let (ok, inq) = tool("iscsi-inq", &[&format!("iscsi://127.0.0.1:{port}/{iqn}/0")]);
    assert!(ok, "{inq}");
}

#[test]
fn spdk_rpc_py_builds_a_chap_target_that_libiscsi_logs_in_to() {
    let riser = Riser::start();
    let dir = TempDir::new("spdk");
    let rpc_py = spdk_rpc_py(&dir);
    let sock = riser.socket().to_string_lossy().to_string();
    let port = free_port().to_string();
    let rpc = |args: &[&str]| {
        let out = Command::new("python3")
            .arg(&rpc_py)
            .args(["-s", &sock])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("python3: {e}"));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "rpc.py {args:?}: {text}\nriser log:\n{}", riser.log());
        text
    };
    rpc(&["bdev_malloc_create", "-b", "Malloc0", "8", "512"]);
    rpc(&["iscsi_create_portal_group", "1", &format!("127.0.0.1:{port}")]);
    rpc(&["iscsi_create_initiator_group", "2", "ANY", "ANY"]);
    rpc(&["iscsi_create_auth_group", "1", "-c", "user:carol secret:carol-secret-9"]);
    rpc(&["iscsi_create_target_node", "spdk", "spdk", "Malloc0:0", "1:2", "64", "-r", "-g", "1"]);
    let groups = rpc(&["iscsi_get_auth_groups"]);
    assert!(groups.contains("carol"), "{groups}");
    let url = |auth: &str| format!("iscsi://{auth}127.0.0.1:{port}/iqn.2016-06.io.riser:spdk/0");
    let mut ok = false;
    let mut inq = String::new();
    // The portal's listener starts on the RPC thread: give it a moment.
    for _ in 0..50 {
        (ok, inq) = tool("iscsi-inq", &[&url("carol%carol-secret-9@")]);
        if ok {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(ok && inq.contains("Vendor:RISER"), "{inq}\n{}", riser.log());
    let (ok, out) = tool("iscsi-inq", &[&url("")]);
    assert!(!ok, "rpc.py's -r requires CHAP:\n{out}");
}
