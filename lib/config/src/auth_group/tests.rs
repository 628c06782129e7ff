//! Tests of auth groups, the CHAP policies of nodes and discovery, and the query login code
//! asks.

use serde_json::json;

use super::*;
use crate::testing::*;
use crate::{LunSpec, NodeParams};

fn z(s: &str) -> Zeroizing<String> {
    Zeroizing::new(s.to_string())
}

fn param(user: &str, secret: &str) -> AuthSecretParam {
    AuthSecretParam { user: user.into(), secret: z(secret), ..Default::default() }
}

fn mutual(user: &str, secret: &str, muser: &str, msecret: &str) -> AuthSecretParam {
    AuthSecretParam {
        user: user.into(),
        secret: z(secret),
        muser: Some(muser.into()),
        msecret: Some(z(msecret)),
        initiator_group: None,
    }
}

fn bound(user: &str, secret: &str, ig: u32) -> AuthSecretParam {
    AuthSecretParam { initiator_group: Some(ig), ..param(user, secret) }
}

fn secret(user: &str, secret: &str) -> AuthSecret {
    AuthSecret { user: user.into(), secret: z(secret), muser: None, msecret: None, initiator_group: None }
}

fn no_secrets(mode: AuthMode) -> AuthDecision {
    AuthDecision { mode, mutual: false, secrets: vec![], initiator_groups: vec![] }
}

fn chap(disable_chap: bool, require_chap: bool, mutual_chap: bool, chap_group: u32) -> Chap {
    Chap { disable_chap, require_chap, mutual_chap, chap_group }
}

#[test]
fn secrets_are_checked_and_errors_never_show_them() {
    let long = "x".repeat(MAX_CHAP_SECRET_LEN);
    assert!(AuthSecret::from_param(param(&"u".repeat(MAX_CHAP_USER_LEN), &long), "").is_ok());
    let s = AuthSecret::from_param(mutual("u", "SECRET-one-1", "tgt", "SECRET-two-2"), "").unwrap();
    assert!(s.is_mutual());
    assert!(!AuthSecret::from_param(param("u", "SECRET-one-1"), "").unwrap().is_mutual());
    let cases = [
        (param("", "SECRET-one-1"), "secrets[2].user: must be 1..=255 bytes"),
        (param(&"u".repeat(256), "SECRET-one-1"), "secrets[2].user: must be 1..=255 bytes"),
        (param("u\n", "SECRET-one-1"), "secrets[2].user: must not contain control characters"),
        (param("u", ""), "secrets[2].secret: must be 12..=255 bytes"),
        (param("u", &format!("SECRET-{}", "y".repeat(250))), "secrets[2].secret: must be 12..=255 bytes"),
        (param("u", "SECRET\0one-1"), "secrets[2].secret: must not contain control characters"),
        (
            AuthSecretParam { muser: Some("tgt".into()), ..param("u", "SECRET-one-1") },
            "secrets[2].msecret: required with muser",
        ),
        (
            AuthSecretParam { msecret: Some(z("SECRET-two-2")), ..param("u", "SECRET-one-1") },
            "secrets[2].muser: required with msecret",
        ),
        (mutual("u", "SECRET-one-1", "", "SECRET-two-2"), "secrets[2].muser: must be 1..=255 bytes"),
        (mutual("u", "SECRET-one-1", "tgt", ""), "secrets[2].msecret: must be 12..=255 bytes"),
        (mutual("u", "SECRET-one-1", "tgt", "SECRET-one-1"), "secrets[2].msecret: must differ from secret"),
        (bound("u", "SECRET-one-1", 0), "secrets[2].initiator_group: 0 is out of range (1..)"),
    ];
    for (p, want) in cases {
        let e = AuthSecret::from_param(p, "secrets[2].").expect_err(want);
        assert!(matches!(&e, TargetError::Invalid(m) if m.starts_with(want)), "{e:?} is not {want:?}");
        assert!(!e.to_string().contains("SECRET"), "{e}");
    }
}

#[test]
fn debug_never_shows_secrets() {
    let s = AuthSecret::from_param(mutual("alice", "SECRET-one-1", "tgt", "SECRET-two-2"), "").unwrap();
    let mut g = AuthGroup::new(1);
    g.add(vec![mutual("alice", "SECRET-one-1", "tgt", "SECRET-two-2"), param("bob", "SECRET-three")], |_| String::new())
        .unwrap();
    let d = AuthDecision { mode: AuthMode::Required, mutual: true, secrets: g.secrets().to_vec(), initiator_groups: vec![] };
    for text in [format!("{s:?}"), format!("{s:#?}"), format!("{g:?}"), format!("{g:#?}"), format!("{d:?}")] {
        assert!(!text.contains("SECRET"), "{text}");
        assert!(text.contains("alice"), "{text}");
    }
    assert!(format!("{d:?}").contains("<redacted>"));
    assert!(format!("{g:?}").contains("bob"));
}

#[test]
fn groups_change_all_or_nothing() {
    let mut g = AuthGroup::new(3);
    let at = |i: usize| format!("secrets[{i}].");
    g.add(vec![param("a", "SECRET-a-123")], at).unwrap();
    // A user already in the group, or given twice: Exists, and nothing added.
    let e = g.add(vec![param("b", "SECRET-b-123"), param("a", "SECRET-x-123")], at).unwrap_err();
    assert_eq!(e, TargetError::Exists("secrets[1].user: a is already in auth group 3".into()));
    let e = g.add(vec![param("b", "SECRET-b-123"), param("b", "SECRET-c-123")], at).unwrap_err();
    assert!(matches!(e, TargetError::Exists(_)));
    // An invalid one refuses the valid ones before it.
    assert!(g.add(vec![param("b", "SECRET-b-123"), param("", "SECRET-c-123")], at).is_err());
    assert_eq!(g.secrets(), [secret("a", "SECRET-a-123")]);
    // Users compare exactly (CHAP_N), as SPDK's strcmp.
    g.add(vec![param("A", "SECRET-A-123")], at).unwrap();
    assert_eq!(g.remove("b"), Err(TargetError::NotFound("user: b is not in auth group 3".into())));
    g.remove("a").unwrap();
    assert_eq!(g.secrets(), [secret("A", "SECRET-A-123")]);
    // At most MAX_SECRETS, so save_config replays in SPDK too.
    let many: Vec<_> = (1..MAX_SECRETS).map(|i| param(&format!("u{i}"), "SECRET-u-123")).collect();
    g.add(many, at).unwrap();
    assert_eq!(g.secrets().len(), MAX_SECRETS);
    let e = g.add(vec![param("one-more", "SECRET-u-123")], at).unwrap_err();
    assert_eq!(e, TargetError::Invalid(format!("secrets: an auth group holds at most {MAX_SECRETS} secrets")));
}

#[test]
fn auth_group_methods_have_spdk_shapes_and_codes() {
    let e = env();
    e.ok(
        "iscsi_create_auth_group",
        json!({"tag": 1, "secrets": [
            {"user": "alice", "secret": "alice-secret"},
            {"user": "bob", "secret": "bob-secret-1", "muser": "tgt", "msecret": "tgt-secret-1"}
        ]}),
    );
    e.ok("iscsi_create_auth_group", json!({"tag": 2}));
    e.ok("iscsi_auth_group_add_secret", json!({"tag": 2, "user": "carol", "secret": "carol-secret"}));
    e.ok("iscsi_auth_group_add_secret", json!({"tag": 2, "user": "dave", "secret": "d-secret-123", "muser": "t", "msecret": "m-secret-123"}));
    e.ok("iscsi_auth_group_remove_secret", json!({"tag": 2, "user": "carol"}));
    assert_eq!(
        e.ok("iscsi_get_auth_groups", Value::Null),
        json!([
            {"tag": 1, "secrets": [
                {"user": "alice", "secret": "alice-secret"},
                {"user": "bob", "secret": "bob-secret-1", "muser": "tgt", "msecret": "tgt-secret-1"}
            ]},
            {"tag": 2, "secrets": [{"user": "dave", "secret": "d-secret-123", "muser": "t", "msecret": "m-secret-123"}]}
        ])
    );
    let cases = [
        ("iscsi_create_auth_group", json!({"tag": 1}), "auth group 1 already exists", -17),
        ("iscsi_create_auth_group", json!({"tag": 0}), "tag: 0 is out of range", -32602),
        (
            "iscsi_create_auth_group",
            json!({"tag": 3, "secrets": [{"user": "u", "secret": "s-secret-123"}, {"user": "u", "secret": "t-secret-123"}]}),
            "secrets[1].user: u is already in auth group 3",
            -17,
        ),
        (
            "iscsi_create_auth_group",
            json!({"tag": 3, "secrets": [{"user": "u", "secret": "s-secret-123", "muser": "m"}]}),
            "secrets[0].msecret: required with muser",
            -32602,
        ),
        ("iscsi_create_auth_group", json!({"tag": 3, "secrets": [{"user": "u"}]}), "secret", -32602),
        (
            "iscsi_create_auth_group",
            json!({"tag": 3, "secrets": [{"user": "u", "secret": "s-secret-123", "chap_a": 5}]}),
            "chap_a",
            -32602,
        ),
        ("iscsi_auth_group_add_secret", json!({"tag": 9, "user": "u", "secret": "s-secret-123"}), "auth group 9 not found", -19),
        (
            "iscsi_auth_group_add_secret",
            json!({"tag": 1, "user": "alice", "secret": "s-secret-123"}),
            "user: alice is already in auth group 1",
            -17,
        ),
        (
            "iscsi_auth_group_add_secret",
            json!({"tag": 1, "user": "eve", "secret": "s-secret-123", "msecret": "m-secret-123"}),
            "muser: required with msecret",
            -32602,
        ),
        (
            "iscsi_auth_group_add_secret",
            json!({"tag": 1, "user": "eve", "secret": "s-secret-123", "muser": "m", "msecret": "s-secret-123"}),
            "msecret: must differ from secret",
            -32602,
        ),
        ("iscsi_auth_group_remove_secret", json!({"tag": 1, "user": "eve"}), "user: eve is not in auth group 1", -19),
        ("iscsi_auth_group_remove_secret", json!({"tag": 9, "user": "alice"}), "auth group 9 not found", -19),
        ("iscsi_delete_auth_group", json!({"tag": 9}), "auth group 9 not found", -19),
        ("iscsi_get_auth_groups", json!({"tag": 1}), "tag", -32602),
    ];
    for (m, p, needle, code) in cases {
        assert_eq!(e.err(m, p.clone(), needle), code, "{m} {p}");
    }
    // The refused calls changed nothing.
    assert_eq!(e.target.auth_groups().iter().map(|g| g.tag).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(e.target.auth_groups()[0].secrets().len(), 2);
    e.ok("iscsi_delete_auth_group", json!({"tag": 1}));
    assert_eq!(e.ok("iscsi_get_auth_groups", json!({})).as_array().map(Vec::len), Some(1));
}

#[test]
fn node_auth_follows_the_node_policy_and_its_group() {
    let (_, t) = target();
    t.create_auth_group(1, vec![param("alice", "alice-secret"), mutual("bob", "bob-secret-1", "tgt", "tgt-secret-1")])
        .unwrap();
    t.create_auth_group(2, vec![param("carol", "carol-secret")]).unwrap();
    // The discovery group is not a default for nodes.
    t.set_discovery_auth(chap(false, true, false, 2)).unwrap();
    let make = |name: &str, bdev: &str, c: Chap| {
        t.create_target_node(NodeParams {
            name: name.into(),
            luns: vec![LunSpec::new(0, bdev)],
            chap: c,
            ..Default::default()
        })
        .unwrap()
    };
    let open = make("open", "Null0", chap(false, false, false, 0));
    let none = make("none", "Null1", chap(true, false, false, 1));
    let req = make("req", "Null2", chap(false, true, true, 1));
    let opt = make("opt", "Null3", chap(false, false, false, 1));

    let d = t.node_auth(&open);
    assert_eq!((d.mode, d.mutual, d.secrets.len()), (AuthMode::Optional, false, 0), "chap_group 0: no secrets");
    let d = t.node_auth(&none);
    assert_eq!((d.mode, d.mutual, d.secrets.len()), (AuthMode::None, false, 0), "no secrets handed out without CHAP");
    let d = t.node_auth(&req);
    assert_eq!((d.mode, d.mutual), (AuthMode::Required, true));
    assert_eq!(d.secrets, t.auth_groups()[0].secrets());
    assert_eq!(d.secret_for("bob").and_then(|s| s.msecret.as_ref()).map(|m| m.as_str()), Some("tgt-secret-1"));
    assert!(d.secret_for("Bob").is_none() && d.secret_for("carol").is_none());
    let d = t.node_auth(&opt);
    assert_eq!((d.mode, d.mutual, d.secrets.len()), (AuthMode::Optional, false, 2));

    // A snapshot: later changes show in later calls only.
    let before = t.node_auth(&req);
    t.auth_group_add_secret(1, param("dan", "dan-secret-1")).unwrap();
    assert_eq!(before.secrets.len(), 2);
    assert!(t.node_auth(&req).secret_for("dan").is_some());

    // set_auth replaces the whole policy and moves the generation.
    let g = req.generation();
    t.set_target_node_auth("req", chap(false, false, false, 2)).unwrap();
    assert!(req.generation() > g);
    assert_eq!(req.chap(), chap(false, false, false, 2));
    let d = t.node_auth(&req);
    assert_eq!((d.mode, d.mutual), (AuthMode::Optional, false));
    assert_eq!(d.secrets, [secret("carol", "carol-secret")]);
    // A group that does not exist (yet): no secrets, so no CHAP login; created later, used.
    t.set_target_node_auth("iqn.2016-06.io.riser:req", chap(false, true, false, 7)).unwrap();
    assert_eq!(t.node_auth(&req), no_secrets(AuthMode::Required));
    t.create_auth_group(7, vec![param("erin", "erin-secret-1")]).unwrap();
    assert_eq!(t.node_auth(&req).secrets, [secret("erin", "erin-secret-1")]);
    // Deleting a named group is allowed (SPDK): CHAP fails closed, the mode stays.
    t.delete_auth_group(7).unwrap();
    assert_eq!(t.node_auth(&req), no_secrets(AuthMode::Required));
    assert_eq!(req.chap().chap_group, 7);
}

#[test]
fn node_auth_methods() {
    let e = env();
    e.ok("iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": "u", "secret": "s-secret-123"}]}));
    // require_chap is accepted now that CHAP exists; the group may be named before it exists.
    e.ok(
        "iscsi_create_target_node",
        json!({
            "name": "d", "pg_ig_maps": [], "luns": [{"bdev_name": "Malloc0", "lun_id": 0}],
            "require_chap": true, "mutual_chap": true, "chap_group": 5
        }),
    );
    let n = e.target.find_node("iqn.2016-06.io.riser:d").unwrap();
    assert_eq!(n.chap(), chap(false, true, true, 5));
    e.ok("iscsi_target_node_set_auth", json!({"name": "d", "chap_group": 1, "disable_chap": true}));
    assert_eq!(n.chap(), chap(true, false, false, 1));
    // Absent flags are false: the whole policy is replaced.
    e.ok("iscsi_target_node_set_auth", json!({"name": "d"}));
    assert_eq!(n.chap(), Chap::default());
    let node = e.ok("iscsi_get_target_nodes", Value::Null);
    assert_eq!(
        (&node[0]["disable_chap"], &node[0]["require_chap"], &node[0]["mutual_chap"], &node[0]["chap_group"]),
        (&json!(false), &json!(false), &json!(false), &json!(0))
    );
    let cases = [
        (json!({"name": "d", "disable_chap": true, "require_chap": true}), "mutually exclusive", -32602),
        (json!({"name": "d", "mutual_chap": true}), "mutual_chap requires require_chap", -32602),
        (json!({"name": "d", "disable_chap": true, "mutual_chap": true}), "mutual_chap", -32602),
        (json!({"name": "d", "chap_group": -1}), "chap_group", -32602),
        (json!({"name": "d", "chap_group": null}), "chap_group", -32602),
        (json!({"name": "nope", "require_chap": true}), "target node nope not found", -19),
        (json!({"require_chap": true}), "name", -32602),
        (json!({"name": "d", "auth_group": 1}), "auth_group", -32602),
    ];
    for (p, needle, code) in cases {
        assert_eq!(e.err("iscsi_target_node_set_auth", p.clone(), needle), code, "{p}");
    }
    assert_eq!(n.chap(), Chap::default(), "refused calls changed nothing");
}

#[test]
fn discovery_auth_follows_set_discovery_auth_and_set_options() {
    let e = env();
    let d = e.target.discovery_auth();
    assert_eq!(
        (d.mode, d.mutual, d.secrets.len()),
        (AuthMode::Optional, false, 0),
        "SPDK's default: CHAP optional, no group"
    );
    e.ok(
        "iscsi_create_auth_group",
        json!({"tag": 4, "secrets": [{"user": "u", "secret": "s-secret-123", "muser": "m", "msecret": "t-secret-123"}]}),
    );
    e.ok("iscsi_set_discovery_auth", json!({"require_chap": true, "mutual_chap": true, "chap_group": 4}));
    let d = e.target.discovery_auth();
    assert_eq!((d.mode, d.mutual), (AuthMode::Required, true));
    assert_eq!(d.secret_for("u").map(AuthSecret::is_mutual), Some(true));
    let o = e.ok("iscsi_get_options", Value::Null);
    assert_eq!(
        (&o["require_chap"], &o["mutual_chap"], &o["chap_group"], &o["disable_chap"]),
        (&json!(true), &json!(true), &json!(4), &json!(false))
    );
    // Absent flags are false, an absent group 0.
    e.ok("iscsi_set_discovery_auth", json!({"disable_chap": true}));
    assert_eq!(e.target.options().discovery_chap(), chap(true, false, false, 0));
    assert_eq!(e.target.discovery_auth(), no_secrets(AuthMode::None));
    e.ok("iscsi_set_discovery_auth", Value::Null);
    assert_eq!(e.target.options().discovery_chap(), Chap::default());
    // iscsi_set_options sets the same four (and is what save_config writes).
    e.ok("iscsi_set_options", json!({"require_chap": true, "chap_group": 4}));
    assert_eq!(e.target.discovery_auth().mode, AuthMode::Required);
    assert_eq!(e.target.discovery_auth().secrets.len(), 1);
    for (p, needle) in [
        (json!({"disable_chap": true, "require_chap": true}), "mutually exclusive"),
        (json!({"mutual_chap": true}), "mutual_chap requires require_chap"),
        (json!({"chap_group": -4}), "chap_group"),
        (json!({"name": "x"}), "name"),
    ] {
        assert_eq!(e.err("iscsi_set_discovery_auth", p.clone(), needle), -32602, "{p}");
    }
    assert_eq!(e.target.options().discovery_chap(), chap(false, true, false, 4), "refused calls changed nothing");
    // Deleting the discovery group is allowed (SPDK); discovery CHAP then fails closed.
    e.ok("iscsi_delete_auth_group", json!({"tag": 4}));
    assert_eq!(e.target.discovery_auth(), no_secrets(AuthMode::Required));
}

#[test]
fn chap_describe_for_log_lines() {
    assert_eq!(chap(true, false, false, 3).describe(), "no CHAP");
    assert_eq!(chap(false, true, true, 2).describe(), "CHAP required, mutual, auth group 2");
    assert_eq!(chap(false, false, false, 0).describe(), "CHAP optional, no auth group");
}

#[test]
fn secrets_shorter_than_96_bits_are_refused() {
    let e = env();
    let eleven = "0123456789a";
    let twelve = "0123456789ab";
    let cases = [
        (
            "iscsi_create_auth_group",
            json!({"tag": 1, "secrets": [{"user": "u", "secret": twelve}, {"user": "v", "secret": eleven}]}),
            "secrets[1].secret: must be 12..=255 bytes (RFC 7143 §12.1.3: at least 96 bits)",
        ),
        (
            "iscsi_create_auth_group",
            json!({"tag": 1, "secrets": [{"user": "u", "secret": twelve, "muser": "t", "msecret": eleven}]}),
            "secrets[0].msecret: must be 12..=255 bytes",
        ),
        ("iscsi_auth_group_add_secret", json!({"tag": 2, "user": "u", "secret": eleven}), "secret: must be 12..=255 bytes"),
        (
            "iscsi_auth_group_add_secret",
            json!({"tag": 2, "user": "u", "secret": twelve, "muser": "t", "msecret": "x"}),
            "msecret: must be 12..=255 bytes",
        ),
    ];
    e.ok("iscsi_create_auth_group", json!({"tag": 2}));
    for (m, p, needle) in cases {
        assert_eq!(e.err(m, p.clone(), needle), -32602, "{m} {p}");
    }
    assert_eq!(e.target.auth_groups().len(), 1, "nothing created");
    assert!(e.target.auth_groups()[0].secrets().is_empty(), "nothing added");
    // 12 bytes, both ways, are enough.
    e.ok("iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": "u", "secret": twelve, "muser": "t", "msecret": "ba9876543210"}]}));
    e.ok("iscsi_auth_group_add_secret", json!({"tag": 2, "user": "u", "secret": "twelve-bytes"}));
}

/// RFC 7143 §12.1.3: a secret that authenticates initiators must not be one the target answers
/// with, anywhere: within an entry, across entries of a group, and across groups (the node's
/// and the discovery group, or any two, since a node may be pointed at any group).
#[test]
fn a_one_way_secret_is_never_any_entrys_msecret() {
    let e = env();
    let (a, b) = ("alice-secret-1", "target-secret-1");
    e.ok("iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": "alice", "secret": a, "muser": "tgt", "msecret": b}]}));
    e.ok("iscsi_create_auth_group", json!({"tag": 2}));
    e.ok("iscsi_set_discovery_auth", json!({"require_chap": true, "chap_group": 2}));
    let cases = [
        // Another entry of the same group answers with alice's secret, or uses the target's.
        (
            "iscsi_auth_group_add_secret",
            json!({"tag": 1, "user": "bob", "secret": "bob-secret-12", "muser": "t2", "msecret": a}),
            "msecret: is the secret of user alice in auth group 1",
        ),
        (
            "iscsi_auth_group_add_secret",
            json!({"tag": 1, "user": "bob", "secret": b}),
            "secret: is the msecret of user alice in auth group 1",
        ),
        // The discovery group, against the node's.
        (
            "iscsi_auth_group_add_secret",
            json!({"tag": 2, "user": "disc", "secret": b}),
            "secret: is the msecret of user alice in auth group 1",
        ),
        (
            "iscsi_auth_group_add_secret",
            json!({"tag": 2, "user": "disc", "secret": "disc-secret-1", "muser": "t3", "msecret": a}),
            "msecret: is the secret of user alice in auth group 1",
        ),
        // A new group, and within the secrets of one call.
        (
            "iscsi_create_auth_group",
            json!({"tag": 3, "secrets": [{"user": "carol", "secret": b}]}),
            "secrets[0].secret: is the msecret of user alice in auth group 1",
        ),
        (
            "iscsi_create_auth_group",
            json!({"tag": 3, "secrets": [
                {"user": "carol", "secret": "carol-secret-1"},
                {"user": "dave", "secret": "dave-secret-1", "muser": "t4", "msecret": "carol-secret-1"}
            ]}),
            "secrets[0].secret: is the msecret of user dave in auth group 3",
        ),
    ];
    for (m, p, needle) in cases {
        assert_eq!(e.err(m, p.clone(), needle), -32602, "{m} {p}");
        let msg = e.call(m, p).unwrap_err().message;
        assert!(!msg.contains(a) && !msg.contains(b), "a secret in {msg}");
    }
    assert_eq!(e.target.auth_groups().iter().map(|g| g.secrets().len()).collect::<Vec<_>>(), [1, 0]);
    // The same one-way secret for two users, or the same msecret twice, is not reflection.
    e.ok("iscsi_auth_group_add_secret", json!({"tag": 2, "user": "disc", "secret": a, "muser": "tgt", "msecret": b}));
    // Once the entry that answered with it is gone, the secret is free.
    e.ok("iscsi_auth_group_remove_secret", json!({"tag": 2, "user": "disc"}));
    e.ok("iscsi_auth_group_remove_secret", json!({"tag": 1, "user": "alice"}));
    e.ok("iscsi_auth_group_add_secret", json!({"tag": 2, "user": "disc", "secret": b}));
}

#[test]
fn a_user_bound_to_an_initiator_group_logs_in_only_as_its_names() {
    let e = env();
    let (a, b) = ("iqn.1994-05.com.redhat:a", "iqn.1994-05.com.redhat:b");
    e.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": [a], "netmasks": ["10.0.0.0/8"]}));
    e.ok("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["ANY", format!("!{b}")], "netmasks": ["ANY"]}));
    // The group must exist, and 0 is no tag.
    let cases = [
        (
            "iscsi_create_auth_group",
            json!({"tag": 1, "secrets": [{"user": "alice", "secret": "alice-secret-1", "initiator_group": 9}]}),
            "secrets[0].initiator_group: initiator group 9 not found",
            -19,
        ),
        (
            "iscsi_create_auth_group",
            json!({"tag": 1, "secrets": [{"user": "alice", "secret": "alice-secret-1", "initiator_group": 0}]}),
            "secrets[0].initiator_group: 0 is out of range",
            -32602,
        ),
        (
            "iscsi_create_auth_group",
            json!({"tag": 1, "secrets": [{"user": "alice", "secret": "alice-secret-1", "initiator_group": "1"}]}),
            "initiator_group",
            -32602,
        ),
    ];
    for (m, p, needle, code) in cases {
        assert_eq!(e.err(m, p.clone(), needle), code, "{m} {p}");
    }
    assert!(e.target.auth_groups().is_empty());
    e.ok(
        "iscsi_create_auth_group",
        json!({"tag": 1, "secrets": [
            {"user": "alice", "secret": "alice-secret-1", "initiator_group": 1},
            {"user": "bob", "secret": "bob-secret-123"}
        ]}),
    );
    assert_eq!(
        e.err("iscsi_auth_group_add_secret", json!({"tag": 1, "user": "carol", "secret": "carol-secret-1", "initiator_group": 3}), "initiator_group: initiator group 3 not found"),
        -19
    );
    e.ok("iscsi_auth_group_add_secret", json!({"tag": 1, "user": "carol", "secret": "carol-secret-1", "initiator_group": 2}));
    // Shown by iscsi_get_auth_groups and save_config (riser's extension, only when set).
    let shown = json!({"tag": 1, "secrets": [
        {"user": "alice", "secret": "alice-secret-1", "initiator_group": 1},
        {"user": "bob", "secret": "bob-secret-123"},
        {"user": "carol", "secret": "carol-secret-1", "initiator_group": 2}
    ]});
    assert_eq!(e.ok("iscsi_get_auth_groups", Value::Null), json!([shown.clone()]));
    assert!(e.target.config_json().contains(&json!({"method": "iscsi_create_auth_group", "params": shown})));

    e.ok("iscsi_set_discovery_auth", json!({"require_chap": true, "chap_group": 1}));
    let d = e.target.discovery_auth();
    assert_eq!(d.initiator_groups.iter().map(|g| g.tag).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(d.authorize("alice", a), Ok(()));
    // By name only: the node's ACL checks addresses.
    let e1 = d.authorize("alice", b).unwrap_err();
    assert_eq!(e1, format!("CHAP user alice is bound to initiator group 1, which does not admit InitiatorName {b}"));
    assert!(d.authorize("alice", "IQN.1994-05.com.redhat:A").is_ok(), "names compare as the ACL does");
    assert_eq!(d.authorize("bob", b), Ok(()), "an unbound user logs in as anyone");
    assert_eq!(d.authorize("carol", a), Ok(()));
    assert!(d.authorize("carol", b).is_err(), "a deny entry of the bound group refuses");
    // A group a user is bound to cannot be deleted: save_config's auth group would no longer
    // load at the next start.
    assert_eq!(e.err("iscsi_delete_initiator_group", json!({"tag": 1}), "binds CHAP user alice of auth group 1"), -16);
    assert_eq!(e.target.discovery_auth().authorize("alice", a), Ok(()), "nothing changed");
    // Once the binding is gone, it can; and the saved configuration loads as it is.
    e.ok("iscsi_auth_group_remove_secret", json!({"tag": 1, "user": "alice"}));
    e.ok("iscsi_delete_initiator_group", json!({"tag": 1}));
    assert_eq!(e.err("iscsi_delete_initiator_group", json!({"tag": 2}), "carol"), -16);
}
