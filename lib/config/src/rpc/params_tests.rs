//! The iSCSI methods' parameter types (defined beside their handlers): what they encode
//! leaves the server's defaults out and decodes back; absent is not null; secrets never show.

use serde_json::{json, Value};

use riser_rpc::params::{NoParams, Secret, Zeroizing};
use riser_rpc::server::decode_params;
use serde::Serialize;

use crate::auth_group::{AuthSecretParam, IscsiAuthGroupAddSecret, IscsiAuthGroupRemoveSecret, IscsiCreateAuthGroup};
use crate::initiator_group::IscsiChangeInitiatorGroup;
use crate::options::{IscsiSetDiscoveryAuth, IscsiSetOptions};
use crate::portal_group::{IscsiCreatePortalGroup, PortParam, PortalParam};
use crate::target_node::{IscsiCreateTargetNode, IscsiTargetNodeSetAuth, LunParam};

fn encode<T: Serialize>(p: &T) -> Value {
    serde_json::to_value(p).unwrap()
}

#[test]
fn port_accepts_string_or_number() {
    let a: PortalParam = serde_json::from_value(json!({"host": "1.2.3.4", "port": "3260"})).unwrap();
    let b: PortalParam = serde_json::from_value(json!({"host": "1.2.3.4", "port": 3260, "iser": true})).unwrap();
    assert_eq!(a.port, b.port);
    assert!(b.iser);
    assert!(serde_json::from_value::<PortalParam>(json!({"host": "1.2.3.4", "port": true})).is_err());
    assert!(serde_json::from_value::<PortalParam>(json!({"host": "h", "port": 1, "cpumask": "0x1"})).is_err());
}

/// What is encoded leaves the server's defaults out and decodes back to the same value.
#[test]
fn encoding_leaves_defaults_out_and_round_trips() {
    let pg = IscsiCreatePortalGroup {
        tag: 1,
        portals: vec![PortalParam { host: "[::1]".into(), port: PortParam("3260".into()), iser: true }],
        ..Default::default()
    };
    assert_eq!(encode(&pg), json!({"tag": 1, "portals": [{"host": "[::1]", "port": "3260", "iser": true}]}));
    let node = IscsiCreateTargetNode {
        name: "d".into(),
        luns: vec![LunParam { bdev_name: "M0".into(), lun_id: 0, ..Default::default() }],
        chap_group: Some(0),
        ..Default::default()
    };
    assert_eq!(
        encode(&node),
        json!({"name": "d", "pg_ig_maps": [], "luns": [{"bdev_name": "M0", "lun_id": 0}], "chap_group": 0})
    );
    assert_eq!(encode(&IscsiSetOptions::default()), json!({}));
    assert_eq!(encode(&IscsiChangeInitiatorGroup { tag: 2, netmasks: Some(vec![]), ..Default::default() }), json!({"tag": 2, "netmasks": []}));

    assert_eq!(decode_params::<IscsiCreatePortalGroup>(encode(&pg)), Ok(pg));
    assert_eq!(decode_params::<IscsiCreateTargetNode>(encode(&node)), Ok(node));
}

/// Fields that may be absent but were never nullable stay so; plain options take null.
#[test]
fn absent_is_not_null() {
    let p: IscsiChangeInitiatorGroup = decode_params(json!({"tag": 1})).unwrap();
    assert_eq!((p.initiators, p.netmasks), (None, None));
    let e = decode_params::<IscsiChangeInitiatorGroup>(json!({"tag": 1, "initiators": null})).unwrap_err();
    assert!(e.message.contains("initiators"), "{e}");
    let base = json!({"name": "d", "pg_ig_maps": [], "luns": []});
    let mut with_null = base.clone();
    with_null["chap_group"] = Value::Null;
    assert!(decode_params::<IscsiCreateTargetNode>(with_null).unwrap_err().message.contains("chap_group"));
    let mut alias_null = base;
    alias_null["alias_name"] = Value::Null;
    assert_eq!(decode_params::<IscsiCreateTargetNode>(alias_null).map(|p| p.alias_name), Ok(None));
    assert_eq!(decode_params::<IscsiSetOptions>(json!({"max_sessions": null})), Ok(IscsiSetOptions::default()));
    assert!(decode_params::<NoParams>(json!({"x": 1})).is_err());
    assert_eq!(decode_params::<NoParams>(Value::Null), Ok(NoParams {}));
}

/// The CHAP methods: SPDK's shapes, defaults left out, absent optional fields but no nulls.
#[test]
fn auth_params_round_trip_with_spdk_defaults() {
    let group = IscsiCreateAuthGroup {
        tag: 1,
        secrets: vec![
            AuthSecretParam { user: "u".into(), secret: sec("s"), ..Default::default() },
            AuthSecretParam {
                user: "u2".into(),
                secret: sec("s2"),
                muser: Some("mu".into()),
                msecret: Some(sec("ms")),
                initiator_group: Some(3),
            },
        ],
    };
    let v = encode(&group);
    assert_eq!(
        v,
        json!({"tag": 1, "secrets": [
            {"user": "u", "secret": "s"},
            {"user": "u2", "secret": "s2", "muser": "mu", "msecret": "ms", "initiator_group": 3}
        ]})
    );
    assert_eq!(decode_params::<IscsiCreateAuthGroup>(v), Ok(group));
    assert_eq!(encode(&IscsiCreateAuthGroup { tag: 3, secrets: vec![] }), json!({"tag": 3}));
    assert_eq!(decode_params::<IscsiCreateAuthGroup>(json!({"tag": 3})).map(|p| p.secrets.len()), Ok(0));
    for (bad, field) in [
        (json!({"tag": 1, "secrets": null}), "secrets"),
        (json!({"tag": 1, "secrets": [{"user": "u"}]}), "secret"),
        (json!({"tag": 1, "secrets": [{"user": "u", "secret": "s", "muser": null}]}), "muser"),
        (json!({"tag": 1, "secrets": [{"user": "u", "secret": "s", "initiator_group": null}]}), "initiator_group"),
        (json!({"tag": 1, "secrets": [{"user": "u", "secret": "s", "initiator_group": -1}]}), "initiator_group"),
        (json!({"tag": 1, "secrets": [{"user": "u", "secret": "s", "x": 1}]}), "x"),
        (json!({"tag": -1}), "tag"),
    ] {
        let e = decode_params::<IscsiCreateAuthGroup>(bad.clone()).expect_err("refused");
        assert!(e.message.contains(field), "{bad}: {e}");
    }

    let add = IscsiAuthGroupAddSecret {
        tag: 2,
        user: "u".into(),
        secret: sec("s"),
        muser: Some("m".into()),
        msecret: None,
        initiator_group: Some(4),
    };
    assert_eq!(encode(&add), json!({"tag": 2, "user": "u", "secret": "s", "muser": "m", "initiator_group": 4}));
    assert_eq!(decode_params::<IscsiAuthGroupAddSecret>(encode(&add)), Ok(add.clone()));
    let p = add.secret_param();
    assert_eq!((p.muser.as_deref(), p.initiator_group), (Some("m"), Some(4)));
    assert!(decode_params::<IscsiAuthGroupAddSecret>(json!({"tag": 2, "user": "u"})).is_err());
    let rm = IscsiAuthGroupRemoveSecret { tag: 2, user: "u".into() };
    assert_eq!(decode_params::<IscsiAuthGroupRemoveSecret>(encode(&rm)), Ok(rm));

    // Both set_auth methods replace the whole policy: absent is false / 0.
    assert_eq!(decode_params::<IscsiSetDiscoveryAuth>(Value::Null), Ok(IscsiSetDiscoveryAuth::default()));
    let d = IscsiSetDiscoveryAuth { require_chap: true, mutual_chap: true, chap_group: 4, ..Default::default() };
    assert_eq!(encode(&d), json!({"require_chap": true, "mutual_chap": true, "chap_group": 4}));
    assert_eq!(decode_params::<IscsiSetDiscoveryAuth>(encode(&d)), Ok(d));
    assert!(decode_params::<IscsiSetDiscoveryAuth>(json!({"chap_group": null})).is_err());
    let n = IscsiTargetNodeSetAuth { name: "d".into(), disable_chap: true, ..Default::default() };
    assert_eq!(encode(&n), json!({"name": "d", "disable_chap": true}));
    assert_eq!(decode_params::<IscsiTargetNodeSetAuth>(encode(&n)), Ok(n));
    assert!(decode_params::<IscsiTargetNodeSetAuth>(json!({"chap_group": 1})).unwrap_err().message.contains("name"));
}

#[test]
fn debug_never_shows_secrets() {
    let group = IscsiCreateAuthGroup {
        tag: 1,
        secrets: vec![AuthSecretParam {
            user: "alice".into(),
            secret: sec("TOPSECRET1"),
            muser: Some("tgt".into()),
            msecret: Some(sec("TOPSECRET2")),
            initiator_group: Some(2),
        }],
    };
    let add = IscsiAuthGroupAddSecret { tag: 1, user: "bob".into(), secret: sec("TOPSECRET3"), ..Default::default() };
    for text in [format!("{group:?}"), format!("{group:#?}"), format!("{add:?}")] {
        assert!(!text.contains("TOPSECRET"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
    }
    assert!(format!("{group:?}").contains("alice") && format!("{group:?}").contains("tgt"));
    assert!(format!("{add:?}").contains("bob"));
    assert!(format!("{group:?}").contains("initiator_group: 2"));
}

fn sec(s: &str) -> Secret {
    Zeroizing::new(s.to_string())
}
