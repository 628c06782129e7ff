//! Tests of the re-check of live sessions against changed rules, and of the hooks that start it.

use std::sync::{Arc, Mutex};

use serde_json::json;

use super::*;
use crate::testing::*;
use crate::{PgIgMap, TargetError};

const A: &str = "iqn.1994-05.com.redhat:a";

fn no_chap() -> SessionAuth {
    SessionAuth::default()
}

fn as_user(u: &str) -> SessionAuth {
    SessionAuth { chap_user: Some(u.into()), mutual: false }
}

fn s<'a>(node: Option<&'a str>, addr: &str, pg: u32, auth: &'a SessionAuth) -> SessionOf<'a> {
    SessionOf { node, initiator_name: A, addr: ip(addr), pg_tag: pg, auth }
}

/// Records the access-changed hook's calls.
fn recorder(t: &IscsiTarget) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    t.on_access_changed(move |cause| s2.lock().unwrap().push(cause.to_string()));
    seen
}

#[test]
fn a_netmask_or_name_removed_shuts_out_the_session_it_admitted_and_says_why() {
    let t = acl_setup();
    let seen = recorder(&t);
    let n = node(&t, "d1", &[(1, 1)], "Null0");
    let name = n.name().to_string();
    let auth = no_chap();
    assert_eq!(t.recheck(s(Some(&name), "10.0.0.5", 1, &auth)), Ok(()));
    // Another netmask that still holds 10.0.0.5: still in.
    t.initiator_group_add(1, &[], &strings(&["10.0.0.0/24"])).unwrap();
    t.initiator_group_remove(1, &[], &strings(&["10.0.0.0/8"])).unwrap();
    assert_eq!(t.recheck(s(Some(&name), "10.0.0.5", 1, &auth)), Ok(()));
    assert_eq!(
        t.recheck(s(Some(&name), "10.1.0.5", 1, &auth)),
        Err("initiator 10.1.0.5 not in initiator group 1's netmasks".into())
    );
    // IPv4-mapped addresses are shown as IPv4.
    assert_eq!(
        t.recheck(s(Some(&name), "::ffff:10.1.0.5", 1, &auth)),
        Err("initiator 10.1.0.5 not in initiator group 1's netmasks".into())
    );
    // A deny entry added: the name is shut out whatever the address.
    t.initiator_group_add(1, &strings(&["!iqn.1994-05.com.redhat:a"]), &[]).unwrap();
    assert_eq!(t.recheck(s(Some(&name), "10.0.0.5", 1, &auth)), Err(format!("initiator {A} is denied by initiator group 1")));
    // Each change ran the hook, with what changed.
    assert_eq!(
        *seen.lock().unwrap(),
        strings(&[
            "iscsi_initiator_group_add_initiators on initiator group 1",
            "iscsi_initiator_group_remove_initiators on initiator group 1",
            "iscsi_initiator_group_add_initiators on initiator group 1",
        ])
    );
    // A refused change runs nothing.
    assert!(t.initiator_group_remove(1, &[], &strings(&["192.168.0.0/16"])).is_err());
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[test]
fn maps_removed_or_the_node_gone_shut_out_its_sessions() {
    let t = acl_setup();
    let seen = recorder(&t);
    let n = node(&t, "d1", &[(1, 1), (2, 2)], "Null0");
    let name = n.name().to_string();
    let auth = no_chap();
    t.target_node_remove_pg_ig_maps(&name, &[PgIgMap { pg_tag: 1, ig_tag: 1 }]).unwrap();
    assert_eq!(
        t.recheck(s(Some(&name), "10.0.0.5", 1, &auth)),
        Err("target node iqn.2016-06.io.riser:d1 is not mapped to portal group 1".into())
    );
    // Through the other portal group, the same initiator is still in.
    assert_eq!(t.recheck(s(Some(&name), "10.0.0.5", 2, &auth)), Ok(()));
    t.target_node_add_pg_ig_maps(&name, &[PgIgMap { pg_tag: 1, ig_tag: 2 }]).unwrap();
    assert_eq!(t.recheck(s(Some(&name), "10.0.0.5", 1, &auth)), Ok(()));
    assert_eq!(
        *seen.lock().unwrap(),
        strings(&[
            "iscsi_target_node_remove_pg_ig_maps on target node iqn.2016-06.io.riser:d1",
            "iscsi_target_node_add_pg_ig_maps on target node iqn.2016-06.io.riser:d1",
        ])
    );
    t.delete_target_node(&name, false).unwrap();
    assert_eq!(t.recheck(s(Some(&name), "10.0.0.5", 2, &auth)), Err(format!("target node {name} is gone")));
}

#[test]
fn chap_changes_shut_out_sessions_without_it_or_with_a_removed_secret() {
    let e = env();
    let t = e.target.clone();
    t.create_portal_group(1, &[portal("127.0.0.1", 3260)], false, false).unwrap();
    t.create_initiator_group(1, &strings(&["ANY"]), &strings(&["ANY"])).unwrap();
    e.ok("iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": "u1", "secret": "s1s1s1s1s1s1"}, {"user": "u2", "secret": "s2s2s2s2s2s2"}]}));
    let n = node(&t, "d", &[(1, 1)], "Malloc0");
    let name = n.name().to_string();
    let seen = recorder(&t);
    let (none, u1, u2) = (no_chap(), as_user("u1"), as_user("u2"));
    // CHAP optional with group 1: everyone is in.
    e.ok("iscsi_target_node_set_auth", json!({"name": name, "chap_group": 1}));
    for a in [&none, &u1, &u2] {
        assert_eq!(t.recheck(s(Some(&name), "127.0.0.1", 1, a)), Ok(()), "{a:?}");
    }
    // Required: the session without CHAP is out, the CHAP ones stay.
    e.ok("iscsi_target_node_set_auth", json!({"name": name, "chap_group": 1, "require_chap": true}));
    assert_eq!(
        t.recheck(s(Some(&name), "127.0.0.1", 1, &none)),
        Err(format!("target node {name} now requires CHAP; the session logged in without it"))
    );
    assert_eq!(t.recheck(s(Some(&name), "127.0.0.1", 1, &u1)), Ok(()));
    // u1's secret removed: u1's session is out, u2's stays.
    e.ok("iscsi_auth_group_remove_secret", json!({"tag": 1, "user": "u1"}));
    let err = t.recheck(s(Some(&name), "127.0.0.1", 1, &u1)).unwrap_err();
    assert!(err.contains("CHAP user u1 has no secret in auth group 1"), "{err}");
    assert_eq!(t.recheck(s(Some(&name), "127.0.0.1", 1, &u2)), Ok(()));
    // Mutual now required: a session that logged in without it is out.
    e.ok("iscsi_target_node_set_auth", json!({"name": name, "chap_group": 1, "require_chap": true, "mutual_chap": true}));
    let err = t.recheck(s(Some(&name), "127.0.0.1", 1, &u2)).unwrap_err();
    assert!(err.contains("now requires mutual CHAP"), "{err}");
    assert_eq!(t.recheck(s(Some(&name), "127.0.0.1", 1, &SessionAuth { chap_user: Some("u2".into()), mutual: true })), Ok(()));
    // The group deleted: every CHAP session is out.
    e.ok("iscsi_delete_auth_group", json!({"tag": 1}));
    assert!(t.recheck(s(Some(&name), "127.0.0.1", 1, &u2)).is_err());
    assert_eq!(
        *seen.lock().unwrap(),
        strings(&[
            "iscsi_target_node_set_auth on target node iqn.2016-06.io.riser:d",
            "iscsi_target_node_set_auth on target node iqn.2016-06.io.riser:d",
            "iscsi_auth_group_remove_secret of user u1 from auth group 1",
            "iscsi_target_node_set_auth on target node iqn.2016-06.io.riser:d",
            "iscsi_delete_auth_group 1",
        ])
    );
}

#[test]
fn portal_group_auth_governs_discovery_through_that_group_only() {
    let e = env();
    let t = e.target.clone();
    t.create_portal_group(1, &[portal("127.0.0.1", 3260)], false, false).unwrap();
    t.create_portal_group(2, &[portal("127.0.0.1", 3261)], false, false).unwrap();
    e.ok("iscsi_create_auth_group", json!({"tag": 3, "secrets": [{"user": "d", "secret": "dddddddddddd"}]}));
    let seen = recorder(&t);
    let none = no_chap();
    assert_eq!(t.recheck(s(None, "127.0.0.1", 1, &none)), Ok(()));
    e.ok("iscsi_portal_group_set_auth", json!({"tag": 1, "require_chap": true, "chap_group": 3}));
    assert_eq!(
        t.recheck(s(None, "127.0.0.1", 1, &none)),
        Err("discovery through portal group 1 now requires CHAP; the session logged in without it".into())
    );
    assert_eq!(t.recheck(s(None, "127.0.0.1", 2, &none)), Ok(()), "group 2 keeps the global policy");
    assert_eq!(t.discovery_auth_for(1).mode, AuthMode::Required);
    assert_eq!(t.discovery_auth_for(1).secrets.len(), 1);
    assert_eq!(t.discovery_auth_for(2).mode, AuthMode::Optional);
    assert_eq!(*seen.lock().unwrap(), strings(&["iscsi_portal_group_set_auth on portal group 1"]));
    // The global policy through iscsi_set_options governs the other group's discovery.
    e.ok("iscsi_set_options", json!({"first_burst_length": 16384}));
    e.ok("iscsi_set_options", json!({"require_chap": true, "chap_group": 3}));
    assert!(t.recheck(s(None, "127.0.0.1", 2, &none)).is_err());
    assert_eq!(
        *seen.lock().unwrap(),
        strings(&["iscsi_portal_group_set_auth on portal group 1", "iscsi_set_options (discovery CHAP)"]),
        "only a change of the discovery CHAP options re-checks"
    );
    e.ok("iscsi_set_discovery_auth", json!({}));
    seen.lock().unwrap().clear();

    // Shown, and saved after the auth groups; the saved calls replay to the same state.
    let groups = e.ok("iscsi_get_portal_groups", json!(null));
    assert_eq!(groups[0]["require_chap"], json!(true));
    assert_eq!(groups[0]["chap_group"], json!(3));
    assert!(groups[1].get("require_chap").is_none(), "{groups}");
    let saved = t.config_json();
    let at = |m: &str| saved.iter().position(|c| c["method"] == m).unwrap_or_else(|| panic!("{m} not saved"));
    assert!(at("iscsi_portal_group_set_auth") > at("iscsi_create_auth_group"));
    assert_eq!(saved[at("iscsi_portal_group_set_auth")]["params"], json!({"tag": 1, "require_chap": true, "chap_group": 3}));
    assert!(saved[at("iscsi_create_portal_group")]["params"].get("require_chap").is_none());
    let e2 = env();
    for c in &saved {
        e2.ok(c["method"].as_str().unwrap(), c["params"].clone());
    }
    assert_eq!(e2.target.config_json(), saved);

    // SPDK's checks and errors.
    assert_eq!(e.err("iscsi_portal_group_set_auth", json!({"tag": 9}), "portal group 9 not found"), -19);
    let both = json!({"tag": 1, "disable_chap": true, "require_chap": true});
    assert_eq!(e.err("iscsi_portal_group_set_auth", both, "mutually exclusive"), -32602);
    assert_eq!(e.err("iscsi_portal_group_set_auth", json!({"tag": 1, "mutual_chap": true}), "mutual_chap requires require_chap"), -32602);
    assert_eq!(e.err("iscsi_portal_group_set_auth", json!({"tag": 1, "chap_group": -1}), ""), -32602);
    assert!(seen.lock().unwrap().is_empty(), "refused changes run nothing");
}

#[test]
fn deleting_a_mapped_portal_group_unmaps_it_and_names_it_to_the_hook() {
    let t = acl_setup();
    let n = node(&t, "d1", &[(1, 1), (2, 2)], "Null0");
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let d2 = deleted.clone();
    t.on_portal_group_deleted(move |tag| d2.lock().unwrap().push(tag));
    t.delete_portal_group(1).unwrap();
    assert_eq!(n.pg_ig_maps(), vec![PgIgMap { pg_tag: 2, ig_tag: 2 }]);
    assert_eq!(*deleted.lock().unwrap(), vec![1]);
    assert_eq!(t.delete_portal_group(1), Err(TargetError::NotFound("portal group 1 not found".into())));
    assert_eq!(*deleted.lock().unwrap(), vec![1]);
}
