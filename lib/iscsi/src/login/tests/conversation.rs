//! Logins that succeed: discovery and normal sessions, key lists over several PDUs, long answers, redirects, the target's own offers.

use super::*;

#[test]
fn discovery_in_one_pdu() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy::default();
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            OP,
            FFP,
            &[
                ("InitiatorName", INITIATOR),
                ("SessionType", "Discovery"),
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("DefaultTime2Wait", "2"),
                ("DefaultTime2Retain", "0"),
                ("IFMarker", "No"),
                ("OFMarker", "No"),
                ("ErrorRecoveryLevel", "0"),
                ("MaxRecvDataSegmentLength", "32768"),
            ],
        )),
    );
    assert_eq!(out.order, "ARC");
    let (r, keys) = only_response(&out);
    assert!(r.transit_bit && !r.continue_bit);
    assert_eq!((r.csg, r.nsg), (OP, FFP));
    assert_eq!(r.status, LoginStatus::SUCCESS);
    assert_eq!(r.tsih, 7);
    assert_eq!(r.itt, Itt(0x10));
    assert_eq!(r.stat_sn, Sn(0));
    assert_eq!(key(keys, "HeaderDigest"), Some("None"));
    assert_eq!(key(keys, "MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(
        key(keys, "TargetPortalGroupTag"),
        None,
        "only for normal sessions"
    );
    let c = out.complete.unwrap();
    assert_eq!(c.identity.session_type, SessionType::Discovery);
    assert_eq!(c.identity.target_name, None);
    assert_eq!(c.connection.max_send_data_segment_length, 32768);
    assert_eq!(c.stat_sn, Sn(1));
    assert_eq!(policy.lookups, 0);
    assert!(login.is_finished());
}

#[test]
fn normal_session_two_stages() {
    let mut login = Login::new(LoginContext {
        initial_stat_sn: Sn(500),
        ..LoginContext::default()
    });
    let mut policy = Policy::default();
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            SEC,
            OP,
            &[
                ("InitiatorName", INITIATOR),
                ("InitiatorAlias", "client"),
                ("TargetName", TARGET),
                ("SessionType", "Normal"),
                ("AuthMethod", "None"),
            ],
        )),
    );
    // resources only once the security stage is over: here, with the transit to OP
    assert_eq!(out.order, "AR");
    let (r, keys) = only_response(&out);
    assert!(r.transit_bit);
    assert_eq!((r.csg, r.nsg), (SEC, OP));
    assert_eq!(r.tsih, 0, "TSIH only in the final response");
    assert_eq!(r.stat_sn, Sn(500));
    assert_eq!((r.exp_cmd_sn, r.max_cmd_sn), (Sn(100), Sn(100)));
    assert_eq!(key(keys, "AuthMethod"), Some("None"));
    assert_eq!(key(keys, "TargetPortalGroupTag"), Some("1"));
    assert_eq!(key(keys, "TargetAlias"), Some("disk1"));
    assert_eq!(
        key(keys, "MaxRecvDataSegmentLength"),
        None,
        "no operational keys in a security-stage response"
    );
    assert_eq!(login.stage(), OP);

    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            OP,
            FFP,
            &[
                ("HeaderDigest", "CRC32C,None"),
                ("DataDigest", "None"),
                ("MaxRecvDataSegmentLength", "262144"),
                ("InitialR2T", "Yes"),
                ("ImmediateData", "Yes"),
                ("MaxBurstLength", "16776192"),
                ("FirstBurstLength", "262144"),
                ("MaxConnections", "1"),
            ],
        )),
    );
    assert_eq!(out.order, "RC");
    let (r, keys) = only_response(&out);
    assert!(r.transit_bit);
    assert_eq!((r.csg, r.nsg), (OP, FFP));
    assert_eq!(r.tsih, 7);
    assert_eq!(r.stat_sn, Sn(501));
    assert_eq!(r.exp_cmd_sn, Sn(100));
    assert_eq!(r.max_cmd_sn, Sn(100 + 128 - 1));
    assert_eq!(key(keys, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(key(keys, "MaxBurstLength"), Some("1048576"));
    assert_eq!(key(keys, "MaxRecvDataSegmentLength"), Some("262144"));
    let c = out.complete.unwrap();
    assert_eq!(c.tsih(), 7);
    assert_eq!(c.identity.initiator_name, INITIATOR);
    assert_eq!(c.identity.initiator_alias.as_deref(), Some("client"));
    assert_eq!(c.session.target_name.as_deref(), Some(TARGET));
    assert!(c.connection.header_digest && !c.connection.data_digest);
    assert_eq!(
        c.connection.framer_limits().max_recv_data_segment_length,
        262_144
    );
    assert_eq!(
        (c.exp_cmd_sn, c.max_cmd_sn, c.stat_sn),
        (Sn(100), Sn(227), Sn(502))
    );
    // nothing more happens
    let out = run(&mut login, &mut policy, pdu(req(false, OP, OP, &[])));
    assert!(out.order.is_empty());
}

#[test]
fn keys_spanning_pdus_with_c_bit() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy::default();
    let text = encode_pairs(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("SessionType", "Normal"),
        ("MaxBurstLength", "65536"),
    ]);
    let (a, b) = text.split_at(20); // split inside "TargetName=..."
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: OP,
            nsg: SEC,
            keys: a.to_vec(),
        }),
    );
    let (r, keys) = only_response(&out);
    assert!(!r.transit_bit && !r.continue_bit && keys.is_empty());
    assert_eq!(out.allocate, 0);
    // C=1 with no data at all must be harmless
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: OP,
            nsg: SEC,
            keys: vec![],
        }),
    );
    assert!(only_response(&out).1.is_empty());
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: true,
            c: false,
            csg: OP,
            nsg: FFP,
            keys: b.to_vec(),
        }),
    );
    assert_eq!(out.order, "ARC");
    let (r, keys) = only_response(&out);
    assert_eq!(r.stat_sn, Sn(2));
    assert_eq!(key(keys, "MaxBurstLength"), Some("65536"));
    assert_eq!(out.complete.unwrap().session.max_burst_length, 65536);
}

#[test]
fn long_target_text_goes_out_with_c_bit() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy::default();
    // 150 unknown keys: 150 NotUnderstood answers of ~78 bytes > 8192
    let names: Vec<String> = (0..150)
        .map(|i| format!("X-com.example.{i:03}.{}", "k".repeat(40)))
        .collect();
    let mut keys: Vec<(&str, &str)> = vec![("InitiatorName", INITIATOR), ("TargetName", TARGET)];
    keys.extend(names.iter().map(|n| (n.as_str(), "1")));
    let text = encode_pairs(&keys);
    let (a, b) = text.split_at(6000);
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: OP,
            nsg: SEC,
            keys: a.to_vec(),
        }),
    );
    assert_eq!(out.responses.len(), 1);
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: true,
            c: false,
            csg: OP,
            nsg: FFP,
            keys: b.to_vec(),
        }),
    );
    let (r, _) = only_response(&out);
    assert!(r.continue_bit && !r.transit_bit, "more text follows");
    assert!(out.complete.is_none());
    // the initiator fetches the rest with an empty request
    let out = run(&mut login, &mut policy, pdu(req(true, OP, FFP, &[])));
    assert_eq!(out.order, "RC");
    let (r, _) = only_response(&out);
    assert!(r.transit_bit && !r.continue_bit);
}

#[test]
fn redirect() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy {
        redirect: true,
        ..Policy::default()
    };
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            SEC,
            OP,
            &[("InitiatorName", INITIATOR), ("TargetName", TARGET)],
        )),
    );
    assert_eq!(out.order, "RF");
    let (r, keys) = only_response(&out);
    assert_eq!(r.status, LoginStatus::TARGET_MOVED_TEMPORARILY);
    assert_eq!(key(keys, "TargetAddress"), Some("10.0.0.2:3260,1"));
}

#[test]
fn target_offers_before_leaving_login() {
    let mut policy = Policy {
        config: TargetConfig {
            immediate_data: false,
            max_burst_length: 65536,
            ..TargetConfig::default()
        },
        ..Policy::default()
    };
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            OP,
            FFP,
            &[("InitiatorName", INITIATOR), ("TargetName", TARGET)],
        )),
    );
    let (r, keys) = only_response(&out);
    assert!(!r.transit_bit);
    assert_eq!(key(keys, "ImmediateData"), Some("No"));
    assert_eq!(key(keys, "MaxBurstLength"), Some("65536"));
    assert_eq!(
        key(keys, "FirstBurstLength"),
        None,
        "65536 default already fits"
    );
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            OP,
            FFP,
            &[("MaxBurstLength", "32768"), ("ImmediateData", "No")],
        )),
    );
    // MaxBurstLength came back below the default FirstBurstLength: offer that too;
    // the answers themselves are not answered again
    let (r, keys) = only_response(&out);
    assert!(!r.transit_bit);
    assert_eq!(
        keys,
        &vec![("FirstBurstLength".to_string(), "32768".to_string())]
    );
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, OP, FFP, &[("FirstBurstLength", "32768")])),
    );
    assert_eq!(out.order, "RC");
    assert!(only_response(&out).1.is_empty());
    let c = out.complete.unwrap();
    assert_eq!(c.session.max_burst_length, 32768);
    assert_eq!(c.session.first_burst_length, 32768);
    assert!(!c.session.immediate_data);
}
