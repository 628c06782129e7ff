//! Tests of target nodes: names and maps, then the node's life through the target and its
//! RPC methods.

use serde_json::json;

use super::*;
use crate::testing::*;

#[test]
fn node_base_is_prefixed_only_to_names_without_a_type() {
    let base = "iqn.2016-06.io.riser";
    assert_eq!(full_name(base, "disk1"), "iqn.2016-06.io.riser:disk1");
    assert_eq!(full_name(base, "iqn.2001-04.com.example:d"), "iqn.2001-04.com.example:d");
    assert_eq!(full_name(base, "IQN.2001-04.com.example:d"), "IQN.2001-04.com.example:d");
    assert_eq!(full_name(base, "eui.02004567A425678D"), "eui.02004567A425678D");
    assert_eq!(full_name(base, "naa.52004567BA64678D"), "naa.52004567BA64678D");
    assert_eq!(full_name(base, "iq"), "iqn.2016-06.io.riser:iq");
    assert_eq!(full_name(base, "éé"), "iqn.2016-06.io.riser:éé");
}

#[test]
fn iscsi_names_are_checked() {
    for ok in [
        "iqn.2016-06.io.riser:disk1",
        "iqn.1991-05.com.microsoft:host.domain",
        "iqn.2001-04.com.example",
        "eui.02004567A425678D",
        "naa.52004567BA64678D",
        "naa.52004567BA64678D52004567BA64678D",
        "iqn.2016-06.io.riser:ünïcode",
    ] {
        assert_eq!(check_iscsi_name(ok), Ok(()), "{ok}");
    }
    for bad in [
        "",
        "iqn.2016-06.io.riser:has space",
        "iqn.2016-06.io.riser:a/b",
        "iqn.2016-06.io.riser:a_b",
        "iqn.16-06.io.riser:x",
        "iqn.2016-6.io.riser:x",
        "iqn.2016-06.",
        "eui.1234",
        "naa.xyz4567BA64678D",
    ] {
        assert!(check_iscsi_name(bad).is_err(), "{bad:?} accepted");
    }
    assert!(check_iscsi_name(&format!("iqn.2016-06.io.riser:{}", "a".repeat(210))).is_err());
}

#[test]
fn maps_group_by_portal_group_as_spdk_shows_them() {
    let mut maps = Vec::new();
    for (pg, ig) in [(1, 1), (2, 2), (1, 3)] {
        add_map(&mut maps, PgIgMap { pg_tag: pg, ig_tag: ig });
    }
    let flat: Vec<(u32, u32)> = flatten(&maps).iter().map(|m| (m.pg_tag, m.ig_tag)).collect();
    assert_eq!(flat, [(1, 1), (1, 3), (2, 2)]);
    assert!(has_map(&maps, PgIgMap { pg_tag: 1, ig_tag: 3 }));
    remove_map(&mut maps, PgIgMap { pg_tag: 2, ig_tag: 2 });
    assert_eq!(maps, vec![(1, vec![1, 3])]);
}

#[test]
fn generation_moves_on_every_change_and_snapshots_follow() {
    let t = acl_setup();
    let n = node(&t, "d", &[(1, 1)], "Null0");
    let g0 = n.generation();
    let (g, luns) = n.luns();
    assert_eq!((g, luns.len()), (g0, 1));
    t.target_node_add_lun("d", "Null1", None, LunOptions::default()).unwrap();
    let g1 = n.generation();
    assert!(g1 > g0);
    // An old snapshot stays valid; a new one shows the LUN.
    assert_eq!(luns.len(), 1);
    let (g, luns) = n.luns();
    assert_eq!(g, g1);
    assert_eq!(luns.iter().map(|l| l.id).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(luns[1].bdev.info().name, "Null1");
    t.target_node_add_pg_ig_maps("d", &[PgIgMap { pg_tag: 2, ig_tag: 2 }]).unwrap();
    let g2 = n.generation();
    assert!(g2 > g1);
    t.target_node_remove_pg_ig_maps("d", &[PgIgMap { pg_tag: 2, ig_tag: 2 }]).unwrap();
    assert!(n.generation() > g2);
    // A refused change does not move it.
    let g3 = n.generation();
    assert!(t.target_node_add_lun("d", "Null1", None, LunOptions::default()).is_err());
    assert_eq!(n.generation(), g3);
}

#[test]
fn a_node_being_deleted_refuses_changes_and_its_name() {
    let (_, t) = target();
    let n = node(&t, "d", &[], "Null0");
    let t2 = Arc::downgrade(&t);
    t.on_node_deleting(move |node| {
        let t = t2.upgrade().unwrap();
        assert!(matches!(t.target_node_add_lun(node.name(), "Null1", None, LunOptions::default()), Err(TargetError::Busy(_))));
        assert!(matches!(t.delete_target_node(node.name(), false), Err(TargetError::Busy(_))));
        let again = NodeParams { name: "d".into(), luns: vec![LunSpec::new(0, "Null2")], ..Default::default() };
        assert!(matches!(t.create_target_node(again), Err(TargetError::Busy(_))));
        assert!(t.config_json().iter().all(|c| c["method"] != "iscsi_create_target_node"));
    });
    t.delete_target_node("d", false).unwrap();
    assert!(n.is_deleted());
    // The name is free again.
    node(&t, "d", &[], "Null0");
}

/// riser's LUN options reach the SCSI layer and show (only when set) in the node's JSON,
/// which is what save_config replays.
#[test]
fn lun_options_reach_the_lun_and_the_saved_config() {
    let (_, t) = target();
    let removable = LunOptions { removable: true, read_only: false };
    let node = t
        .create_target_node(NodeParams {
            name: "d".into(),
            luns: vec![LunSpec::new(0, "Null0"), LunSpec { lun_id: 1, bdev_name: "Null1".into(), options: removable }],
            ..Default::default()
        })
        .unwrap();
    t.target_node_add_lun("d", "Null2", Some(2), LunOptions { removable: false, read_only: true }).unwrap();
    let (_, luns) = node.luns();
    assert!(!luns[0].scsi.config().removable && !luns[0].scsi.config().read_only);
    assert!(luns[1].scsi.config().removable && !luns[1].scsi.config().read_only);
    assert!(luns[2].scsi.config().read_only && !luns[2].scsi.config().removable);
    let cfg = node.config_json();
    assert_eq!(
        cfg["params"]["luns"],
        serde_json::json!([
            {"bdev_name": "Null0", "lun_id": 0},
            {"bdev_name": "Null1", "lun_id": 1, "removable": true},
            {"bdev_name": "Null2", "lun_id": 2, "read_only": true}
        ])
    );
}

#[test]
fn target_node_errors() {
    let e = env();
    e.ok("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3260"}]}));
    e.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
    let node = |name: &str, maps: Value, luns: Value| json!({"name": name, "pg_ig_maps": maps, "luns": luns, "queue_depth": 32});
    let m11 = json!([{"pg_tag": 1, "ig_tag": 1}]);
    let l0 = json!([{"bdev_name": "Malloc0", "lun_id": 0}]);
    let cases = [
        (node("d", json!([{"pg_tag": 2, "ig_tag": 1}]), l0.clone()), "pg_ig_maps[0].pg_tag: portal group 2 not found", -19),
        (node("d", json!([{"pg_tag": 1, "ig_tag": 3}]), l0.clone()), "pg_ig_maps[0].ig_tag: initiator group 3 not found", -19),
        (node("d", json!([{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 1, "ig_tag": 1}]), l0.clone()), "pg_ig_maps[1]:", -17),
        (node("d", m11.clone(), json!([{"bdev_name": "Nope", "lun_id": 0}])), "luns[0].bdev_name: bdev Nope not found", -19),
        (node("d", m11.clone(), json!([{"bdev_name": "Malloc0", "lun_id": 1024}])), "luns[0].lun_id: 1024 is out of range (0..=1023)", -32602),
        (node("d", m11.clone(), json!([{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 0}])), "luns[1].lun_id: LUN 0 is given twice", -32602),
        (node("d", m11.clone(), json!([{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc0", "lun_id": 1}])), "luns[1].bdev_name: bdev Malloc0 is already claimed by iqn.2016-06.io.riser:d:lun0", -16),
        (node("d", m11.clone(), json!([])), "luns: at least one LUN", -32602),
        (node("bad name", m11.clone(), l0.clone()), "name:", -32602),
        (node("iqn.2016-6.x:y", m11.clone(), l0.clone()), "name:", -32602),
        (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "queue_depth": 65}), "queue_depth: 65 is out of range (1..=64", -32602),
        (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "queue_depth": 0}), "queue_depth: 0", -32602),
        (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "disable_chap": true, "require_chap": true}), "mutually exclusive", -32602),
        (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "mutual_chap": true}), "mutual_chap requires require_chap", -32602),
        (json!({"name": "d", "pg_ig_maps": m11, "luns": [{"bdev_name": "Malloc0", "lun_id": 0, "x": 1}]}), "luns[0]", -32602),
        (json!({"name": "d", "pg_ig_maps": m11, "luns": l0, "cpumask": "0x1"}), "cpumask", -32602),
    ];
    for (p, needle, code) in cases {
        assert_eq!(e.err("iscsi_create_target_node", p.clone(), needle), code, "{p}");
    }
    // Refused creations claimed nothing and left nothing.
    assert_eq!(e.claimed_by("Malloc0"), None);
    assert!(e.target.target_nodes().is_empty());

    e.ok("iscsi_create_target_node", node("d", m11.clone(), l0.clone()));
    let n = e.target.find_node("iqn.2016-06.io.riser:d").expect("prefixed with node_base");
    assert_eq!(n.queue_depth(), 32);
    assert_eq!(e.err("iscsi_create_target_node", node("d", m11.clone(), json!([{"bdev_name": "Malloc1", "lun_id": 0}])), "already exists"), -17);
    assert_eq!(e.err("iscsi_create_target_node", node("IQN.2016-06.IO.RISER:D", m11.clone(), json!([{"bdev_name": "Malloc1", "lun_id": 0}])), "already exists"), -17);
    // No queue_depth: the max_queue_depth option.
    e.ok("iscsi_create_target_node", json!({"name": "q", "pg_ig_maps": [], "luns": [{"bdev_name": "Malloc3", "lun_id": 0}]}));
    assert_eq!(e.target.find_node("iqn.2016-06.io.riser:q").map(|n| n.queue_depth()), Some(64));

    // add_lun
    let add = |p: Value| e.call("iscsi_target_node_add_lun", p);
    assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "zz", "bdev_name": "Malloc1"}), "target node zz not found"), -19);
    assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1", "lun_id": 0}), "LUN 0 already exists on target node iqn.2016-06.io.riser:d"), -17);
    assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1", "lun_id": 1024}), "lun_id: 1024"), -32602);
    assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1", "lun_id": -2}), "lun_id: -2"), -32602);
    assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc0"}), "bdev_name: bdev Malloc0 is already claimed"), -16);
    assert_eq!(e.err("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Nope"}), "bdev_name: bdev Nope not found"), -19);
    add(json!({"name": "d", "bdev_name": "Malloc1", "lun_id": -1})).unwrap();
    let (_, luns) = n.luns();
    assert_eq!(luns.iter().map(|l| (l.id, l.bdev_name.as_str())).collect::<Vec<_>>(), [(0, "Malloc0"), (1, "Malloc1")]);

    // maps
    assert_eq!(e.err("iscsi_target_node_add_pg_ig_maps", json!({"name": "d", "pg_ig_maps": m11}), "portal group 1 is already mapped to initiator group 1"), -17);
    assert_eq!(e.err("iscsi_target_node_add_pg_ig_maps", json!({"name": "d", "pg_ig_maps": []}), "pg_ig_maps: at least one"), -32602);
    assert_eq!(e.err("iscsi_target_node_remove_pg_ig_maps", json!({"name": "d", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}]}), "pg_ig_maps[0]: portal group 1 is not mapped to initiator group 2"), -19);
    assert_eq!(e.err("iscsi_target_node_remove_pg_ig_maps", json!({"name": "nope", "pg_ig_maps": m11}), "not found"), -19);

    // An initiator group in use cannot go (a portal group can: it leaves the maps, as in SPDK).
    assert_eq!(e.err("iscsi_delete_initiator_group", json!({"tag": 1}), "initiator group 1 is mapped by target node iqn.2016-06.io.riser:d"), -16);
    e.ok("iscsi_target_node_remove_pg_ig_maps", json!({"name": "d", "pg_ig_maps": m11}));
    e.ok("iscsi_delete_initiator_group", json!({"tag": 1}));
    e.ok("iscsi_delete_portal_group", json!({"tag": 1}));

    // max_queue_depth may not drop below a node's queue_depth.
    assert_eq!(e.err("iscsi_set_options", json!({"max_queue_depth": 16}), "max_queue_depth: 16 is below queue_depth 32"), -32602);

    assert_eq!(e.err("iscsi_delete_target_node", json!({"name": "nope"}), "target node nope not found"), -19);
    e.ok("iscsi_delete_target_node", json!({"name": "iqn.2016-06.io.riser:d"}));
    assert!(e.target.find_node("iqn.2016-06.io.riser:d").is_none());
    assert!(n.is_deleted());
}

#[test]
fn luns_claim_their_bdevs_until_the_node_goes() {
    let e = env();
    e.ok("iscsi_create_target_node", json!({"name": "d", "pg_ig_maps": [], "luns": [{"bdev_name": "Malloc0", "lun_id": 0}], "queue_depth": 8}));
    e.ok("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1"}));
    {
        let mut b = e.bdevs.lock().unwrap();
        assert_eq!(
            b.delete("Malloc0", None),
            Err(RegistryError::Claimed { name: "Malloc0".into(), owner: "iqn.2016-06.io.riser:d:lun0".into() })
        );
        assert!(matches!(b.delete("Malloc1", None), Err(RegistryError::Claimed { .. })));
    }
    // A claimed bdev cannot serve a second node.
    assert_eq!(
        e.err("iscsi_create_target_node", json!({"name": "e", "pg_ig_maps": [], "luns": [{"bdev_name": "Malloc2", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1}]}), "Malloc1 is already claimed"),
        -16
    );
    // ... and the refused node released what it had claimed first.
    assert_eq!(e.claimed_by("Malloc2"), None);
    e.ok("iscsi_delete_target_node", json!({"name": "d"}));
    assert_eq!(e.claimed_by("Malloc0"), None);
    let mut b = e.bdevs.lock().unwrap();
    assert_eq!(b.delete("Malloc0", None), Ok(()));
    assert_eq!(b.delete("Malloc1", None), Ok(()));
}

/// `iscsi_target_node_remove_lun`: the map, the unit attention of the LUNs that stay, the
/// claim, LUN 0, the last LUN, and the errors.
#[test]
fn remove_lun_changes_the_map_raises_reported_luns_changed_and_releases_the_bdev() {
    let e = env();
    e.ok("iscsi_create_target_node", json!({"name": "d", "pg_ig_maps": [], "luns": [{"bdev_name": "Malloc0", "lun_id": 0}], "queue_depth": 8}));
    e.ok("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc1", "lun_id": 3}));
    e.ok("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc2", "lun_id": 5}));
    let n = e.target.find_node("iqn.2016-06.io.riser:d").unwrap();
    let (_, luns) = n.luns();
    let (l0, l3) = (luns[0].scsi.clone(), luns[1].scsi.clone());
    // A nexus that used LUN 0, its unit attentions consumed.
    let nexus = riser_scsi::Nexus::new("iqn.2024-01.test:i", 1, n.name(), 1);
    l0.establish_ua(&nexus, riser_scsi::Asc::CAPACITY_DATA_HAS_CHANGED);
    l0.clear_ua(&nexus, riser_scsi::Asc::CAPACITY_DATA_HAS_CHANGED);
    l0.clear_ua(&nexus, riser_scsi::Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET);
    assert_eq!(l0.pending_ua(&nexus), []);

    // Errors first: nothing changes.
    let g = n.generation();
    assert_eq!(e.err("iscsi_target_node_remove_lun", json!({"name": "zz", "lun_id": 3}), "target node zz not found"), -19);
    assert_eq!(e.err("iscsi_target_node_remove_lun", json!({"name": "d", "lun_id": 4}), "target node iqn.2016-06.io.riser:d has no LUN 4"), -19);
    assert_eq!(e.err("iscsi_target_node_remove_lun", json!({"name": "d", "lun_id": -1}), "lun_id"), -32602);
    assert_eq!(e.err("iscsi_target_node_remove_lun", json!({"name": "d"}), "lun_id"), -32602);
    assert_eq!(n.generation(), g);

    e.ok("iscsi_target_node_remove_lun", json!({"name": "d", "lun_id": 3}));
    assert!(n.generation() > g);
    let (_, luns) = n.luns();
    assert_eq!(luns.iter().map(|l| l.id).collect::<Vec<_>>(), [0, 5]);
    assert_eq!(l0.target_luns(), [0, 5]);
    assert_eq!(l0.pending_ua(&nexus), [riser_scsi::Asc::REPORTED_LUNS_DATA_HAS_CHANGED]);
    assert_eq!(l3.open_channels(), 0);
    assert_eq!(e.claimed_by("Malloc1"), None, "the removed LUN's bdev is released");
    assert_eq!(e.claimed_by("Malloc2").as_deref(), Some("iqn.2016-06.io.riser:d:lun5"));
    assert_eq!(e.bdevs.lock().unwrap().delete("Malloc1", None), Ok(()));
    assert_eq!(e.err("iscsi_target_node_remove_lun", json!({"name": "d", "lun_id": 3}), "has no LUN 3"), -19);
    assert_eq!(n.config_json()["params"]["luns"], json!([{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc2", "lun_id": 5}]));

    // LUN 0 may go too (LIO allows it); the last LUN may not.
    e.ok("iscsi_target_node_remove_lun", json!({"name": "iqn.2016-06.io.riser:d", "lun_id": 0}));
    assert_eq!(e.claimed_by("Malloc0"), None);
    assert_eq!(e.err("iscsi_target_node_remove_lun", json!({"name": "d", "lun_id": 5}), "is the last LUN of target node"), -32602);
    let (_, luns) = n.luns();
    assert_eq!(luns.iter().map(|l| l.id).collect::<Vec<_>>(), [5]);
    assert_eq!(luns[0].scsi.target_luns(), [5]);
    // Its number can be used again, by another bdev.
    e.ok("iscsi_target_node_add_lun", json!({"name": "d", "bdev_name": "Malloc3", "lun_id": 0}));
    assert_eq!(n.config_json()["params"]["luns"], json!([{"bdev_name": "Malloc3", "lun_id": 0}, {"bdev_name": "Malloc2", "lun_id": 5}]));
}

/// `iscsi_target_node_set_redirect`: SPDK's checks, set, shown, cleared (also when the
/// portal group's maps go).
#[test]
fn redirects_are_checked_set_shown_and_cleared() {
    let t = acl_setup();
    let n = node(&t, "r", &[(1, 1), (2, 2)], "Null0");
    assert!(matches!(t.set_target_node_redirect("r", 9, Some("10.0.0.9"), Some("3260")), Err(TargetError::NotFound(_))));
    // Private group 3, an unmapped group, a group's own portal, a bad address.
    assert!(t.set_target_node_redirect("r", 3, Some("10.0.0.9"), Some("3260")).is_err());
    let m = node(&t, "m", &[(2, 2)], "Null1");
    assert!(t.set_target_node_redirect(m.name(), 1, Some("10.0.0.9"), Some("3260")).is_err());
    assert!(t.set_target_node_redirect("r", 1, Some("10.0.0.1"), Some("3260")).is_err());
    assert!(t.set_target_node_redirect("r", 1, Some("nowhere"), Some("3260")).is_err());
    assert_eq!(n.redirect_for(1), None);
    let g = n.generation();
    t.set_target_node_redirect("r", 1, Some("10.0.0.9"), Some("3262")).unwrap();
    assert!(n.generation() > g);
    assert_eq!(n.redirect_for(1).as_deref(), Some("10.0.0.9:3262,1"));
    assert_eq!(n.redirect_for(2), None);
    assert_eq!(n.info_json()["redirects"], json!([{"pg_tag": 1, "redirect_host": "10.0.0.9", "redirect_port": "3262"}]));
    // save_config: create_target_node without it, then the redirect call.
    let calls = n.config_calls();
    assert!(calls[0]["params"].get("redirects").is_none());
    assert!(calls.iter().any(|c| c["method"] == "iscsi_target_node_set_redirect" && c["params"]["pg_tag"] == 1));
    t.set_target_node_redirect("r", 1, Some(""), None).unwrap();
    assert_eq!(n.redirect_for(1), None);
    assert!(n.info_json().get("redirects").is_none());
    t.set_target_node_redirect("r", 1, Some("10.0.0.9"), None).unwrap();
    t.target_node_remove_pg_ig_maps("r", &[PgIgMap { pg_tag: 1, ig_tag: 1 }]).unwrap();
    assert_eq!(n.redirect_for(1), None);
}

/// A node with sessions is deleted only when forced.
#[test]
fn deleting_a_node_with_sessions_needs_force() {
    let (_, t) = target();
    let n = node(&t, "s", &[], "Null0");
    t.on_node_sessions(|_| 2);
    let e = t.delete_target_node("s", false).unwrap_err();
    assert!(matches!(e, TargetError::Busy(_)));
    assert!(e.to_string().contains("2 session(s)"), "{e}");
    assert!(!n.is_deleted());
    t.delete_target_node("s", true).unwrap();
    assert!(n.is_deleted());
}
