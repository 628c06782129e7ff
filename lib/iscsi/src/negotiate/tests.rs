//! Unit tests of the key negotiation: result functions, the key rules of RFC 7143 §6, iSER keys, offers.

use super::*;

fn pairs(list: &[(&str, &str)]) -> Pairs {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn get<'a>(out: &'a Pairs, key: &str) -> Option<&'a str> {
    out.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn normal() -> Negotiator {
    Negotiator::new(
        TargetConfig::default(),
        Transport::Tcp,
        SessionType::Normal,
        true,
        None,
    )
}

#[test]
fn linux_initiator_operational_keys() {
    let mut n = normal();
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("MaxRecvDataSegmentLength", "262144"),
                ("InitialR2T", "No"),
                ("ImmediateData", "Yes"),
                ("MaxBurstLength", "16776192"),
                ("FirstBurstLength", "262144"),
                ("DefaultTime2Wait", "0"),
                ("DefaultTime2Retain", "0"),
                ("MaxOutstandingR2T", "1"),
                ("DataPDUInOrder", "Yes"),
                ("DataSequenceInOrder", "Yes"),
                ("ErrorRecoveryLevel", "0"),
                ("MaxConnections", "1"),
                ("IFMarker", "No"),
                ("OFMarker", "No"),
            ]),
        )
        .unwrap();
    assert_eq!(get(&out, "HeaderDigest"), Some("None"));
    // OR: our Yes wins
    assert_eq!(get(&out, "InitialR2T"), Some("Yes"));
    // AND
    assert_eq!(get(&out, "ImmediateData"), Some("Yes"));
    // Min
    assert_eq!(get(&out, "MaxBurstLength"), Some("1048576"));
    assert_eq!(get(&out, "FirstBurstLength"), Some("65536"));
    // Max
    assert_eq!(get(&out, "DefaultTime2Wait"), Some("2"));
    assert_eq!(get(&out, "DefaultTime2Retain"), Some("0"));
    assert_eq!(get(&out, "MaxConnections"), Some("1"));
    // markers: obsolete, answered No (RFC 7143 §6.2 allows No, forbids NotUnderstood)
    assert_eq!(get(&out, "IFMarker"), Some("No"));
    // declarative: the initiator's value is not echoed, ours is declared once
    assert_eq!(get(&out, "MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(
        out.iter()
            .filter(|(k, _)| k == "MaxRecvDataSegmentLength")
            .count(),
        1
    );
    let s = n.session();
    assert!(s.initial_r2t && s.immediate_data);
    assert_eq!(
        (s.max_burst_length, s.first_burst_length),
        (1_048_576, 65_536)
    );
    assert_eq!(n.connection().max_send_data_segment_length, 262_144);
    assert_eq!(n.connection().max_recv_data_segment_length, 262_144);
    assert!(n.declarations().is_empty());
    assert!(n.offers().is_empty());
    assert!(n.finish().is_ok());
}

#[test]
fn every_result_function() {
    let cfg = TargetConfig {
        initial_r2t: false,
        immediate_data: false,
        max_burst_length: 65536,
        default_time2wait: 5,
        ..TargetConfig::default()
    };
    let mut n = Negotiator::new(cfg, Transport::Tcp, SessionType::Normal, true, None);
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[
                ("InitialR2T", "No"),          // OR(No, No) = No
                ("ImmediateData", "Yes"),      // AND(Yes, No) = No
                ("MaxBurstLength", "131072"),  // Min
                ("DefaultTime2Wait", "1"),     // Max
                ("DataDigest", "CRC32C,None"), // list selection: first we support
                ("TaskReporting", "FastAbort,RFC3720"),
            ]),
        )
        .unwrap();
    assert_eq!(get(&out, "InitialR2T"), Some("No"));
    assert_eq!(get(&out, "ImmediateData"), Some("No"));
    assert_eq!(get(&out, "MaxBurstLength"), Some("65536"));
    assert_eq!(get(&out, "DefaultTime2Wait"), Some("5"));
    assert_eq!(get(&out, "DataDigest"), Some("CRC32C"));
    assert_eq!(get(&out, "TaskReporting"), Some("RFC3720"));
    assert!(n.connection().data_digest);
    assert!(!n.session().initial_r2t && !n.session().immediate_data);
    assert_eq!(n.session().max_unsolicited_data(), 65536);
}

#[test]
fn not_understood_reject_and_irrelevant() {
    let mut n = normal();
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[
                ("X-com.example.Foo", "1"),
                ("FancyNewKey", "Yes"),
                ("MaxBurstLength", "100"),         // below 512
                ("FirstBurstLength", "0x1000000"), // 2^24: above the range
                ("ErrorRecoveryLevel", "3"),
                ("InitialR2T", "Maybe"),
                ("HeaderDigest", "MD5"),
                ("OFMarkInt", "2048~8192"),
                ("TargetRecvDataSegmentLength", "65536"), // iSER key on TCP
                ("TargetAlias", "me"),                    // target-only key
                ("SendTargets", "All"),                   // full feature only
            ]),
        )
        .unwrap();
    assert_eq!(get(&out, "X-com.example.Foo"), Some("NotUnderstood"));
    assert_eq!(get(&out, "FancyNewKey"), Some("NotUnderstood"));
    for k in [
        "MaxBurstLength",
        "FirstBurstLength",
        "ErrorRecoveryLevel",
        "InitialR2T",
        "HeaderDigest",
        "OFMarkInt",
    ] {
        assert_eq!(get(&out, k), Some("Reject"), "{k}");
    }
    assert_eq!(get(&out, "TargetRecvDataSegmentLength"), Some("Irrelevant"));
    assert_eq!(get(&out, "TargetAlias"), Some("Reject"));
    assert_eq!(get(&out, "SendTargets"), Some("Reject"));
    // rejected keys keep their defaults
    assert_eq!(n.session().max_burst_length, 262_144);
    assert_eq!(n.session().error_recovery_level, 0);
}

#[test]
fn duplicates_are_protocol_errors() {
    let mut n = normal();
    n.respond(
        KeyPhase::Operational,
        &pairs(&[("MaxBurstLength", "65536")]),
    )
    .unwrap();
    assert_eq!(
        n.respond(
            KeyPhase::Operational,
            &pairs(&[("MaxBurstLength", "65536")])
        ),
        Err(NegotiationError::Duplicate("MaxBurstLength".into()))
    );
    let mut n = normal();
    assert!(n
        .respond(
            KeyPhase::Operational,
            &pairs(&[("ImmediateData", "Yes"), ("ImmediateData", "No")])
        )
        .is_err());
    // re-declarations allowed
    let mut n = normal();
    n.respond(
        KeyPhase::Operational,
        &pairs(&[("MaxRecvDataSegmentLength", "8192")]),
    )
    .unwrap();
    n.respond(
        KeyPhase::Operational,
        &pairs(&[("MaxRecvDataSegmentLength", "16384")]),
    )
    .unwrap();
    assert_eq!(n.connection().max_send_data_segment_length, 16384);
    // a new text negotiation in FFP starts afresh
    n.begin_text_negotiation();
    n.respond(
        KeyPhase::FullFeature,
        &pairs(&[("MaxRecvDataSegmentLength", "4096")]),
    )
    .unwrap();
}

#[test]
fn first_burst_never_exceeds_max_burst() {
    let mut n = normal();
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[("FirstBurstLength", "65536"), ("MaxBurstLength", "16384")]),
        )
        .unwrap();
    assert_eq!(get(&out, "MaxBurstLength"), Some("16384"));
    assert_eq!(get(&out, "FirstBurstLength"), Some("16384"));
    assert_eq!(n.session().first_burst_length, 16384);
    // MaxBurstLength lowered, FirstBurstLength not offered: the target offers it
    let mut n = normal();
    n.respond(
        KeyPhase::Operational,
        &pairs(&[("MaxBurstLength", "16384")]),
    )
    .unwrap();
    let offers = n.offers();
    assert_eq!(get(&offers, "FirstBurstLength"), Some("16384"));
    assert!(n.awaiting_answers());
    n.respond(
        KeyPhase::Operational,
        &pairs(&[("FirstBurstLength", "8192")]),
    )
    .unwrap();
    assert!(!n.awaiting_answers());
    assert_eq!(n.session().first_burst_length, 8192);
}

#[test]
fn discovery_session_irrelevant_keys() {
    let mut n = Negotiator::new(
        TargetConfig::default(),
        Transport::Tcp,
        SessionType::Discovery,
        true,
        None,
    );
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[
                ("HeaderDigest", "None"),
                ("MaxBurstLength", "65536"),
                ("InitialR2T", "No"),
                ("DataSequenceInOrder", "Yes"),
                ("MaxConnections", "1"),
                ("RDMAExtensions", "Yes"),
                ("ErrorRecoveryLevel", "0"),
                ("DefaultTime2Wait", "2"),
            ]),
        )
        .unwrap();
    assert_eq!(get(&out, "HeaderDigest"), Some("None"));
    for k in [
        "MaxBurstLength",
        "InitialR2T",
        "DataSequenceInOrder",
        "MaxConnections",
        "RDMAExtensions",
    ] {
        assert_eq!(get(&out, k), Some("Irrelevant"), "{k}");
    }
    assert_eq!(get(&out, "ErrorRecoveryLevel"), Some("0"));
    assert_eq!(get(&out, "DefaultTime2Wait"), Some("2"));
    assert!(n.offers().is_empty());
}

#[test]
fn leading_only_keys_on_a_second_connection() {
    let existing = SessionParams {
        max_burst_length: 65536,
        ..SessionParams::default()
    };
    let mut n = Negotiator::new(
        TargetConfig::default(),
        Transport::Tcp,
        SessionType::Normal,
        false,
        Some(existing),
    );
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[("MaxBurstLength", "4096"), ("HeaderDigest", "CRC32C")]),
        )
        .unwrap();
    assert_eq!(get(&out, "MaxBurstLength"), Some("Irrelevant"));
    assert_eq!(get(&out, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(n.session().max_burst_length, 65536);
}

#[test]
fn iser_keys_and_digests() {
    let cfg = TargetConfig {
        target_recv_data_segment_length: 16384,
        ..TargetConfig::default()
    };
    let mut n = Negotiator::new(cfg, Transport::Iser, SessionType::Normal, true, None);
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[
                ("RDMAExtensions", "Yes"),
                ("HeaderDigest", "CRC32C,None"),
                ("DataDigest", "CRC32C"),
                ("TargetRecvDataSegmentLength", "262144"),
                ("InitiatorRecvDataSegmentLength", "262144"),
                ("MaxOutstandingUnexpectedPDUs", "0"),
                ("MaxRecvDataSegmentLength", "262144"),
            ]),
        )
        .unwrap();
    assert_eq!(get(&out, "RDMAExtensions"), Some("Yes"));
    // RFC 7145 §6.1: digests are None under iSER
    assert_eq!(get(&out, "HeaderDigest"), Some("None"));
    assert_eq!(get(&out, "DataDigest"), Some("Reject"));
    assert_eq!(get(&out, "TargetRecvDataSegmentLength"), Some("16384"));
    assert_eq!(get(&out, "InitiatorRecvDataSegmentLength"), Some("262144"));
    // the initiator's "no limit" meets the target's real one (the receive ring)
    assert_eq!(get(&out, "MaxOutstandingUnexpectedPDUs"), Some("144"));
    // MaxRecvDataSegmentLength is still declared but the iSER keys rule
    assert_eq!(get(&out, "MaxRecvDataSegmentLength"), Some("262144"));
    let c = n.connection();
    assert!(!c.header_digest && !c.data_digest);
    assert!(n.session().rdma_extensions);
    assert_eq!(c.recv_limit(true), 16384);
    assert_eq!(c.send_limit(true), 262_144);
    assert!(n.finish().is_ok());
}

#[test]
fn max_outstanding_unexpected_pdus_is_the_receive_ring() {
    assert_eq!(TargetConfig::default().max_outstanding_unexpected_pdus, 128 + 16);
    assert_eq!(iser_max_outstanding_unexpected_pdus(256), 272);
    let cfg = TargetConfig {
        queue_depth: 256,
        max_outstanding_unexpected_pdus: iser_max_outstanding_unexpected_pdus(256),
        ..TargetConfig::default()
    };
    let answer = |offer: &str| {
        let mut n = Negotiator::new(cfg.clone(), Transport::Iser, SessionType::Normal, true, None);
        let out = n.respond(KeyPhase::Operational, &pairs(&[("MaxOutstandingUnexpectedPDUs", offer)])).unwrap();
        (get(&out, "MaxOutstandingUnexpectedPDUs").map(str::to_owned), n.session().max_outstanding_unexpected_pdus)
    };
    // RFC 7145 §6.7: 0 is "no limit"; the target's real limit is never 0
    assert_eq!(answer("0"), (Some("272".into()), 272));
    assert_eq!(answer("100000"), (Some("272".into()), 272));
    assert_eq!(answer("8"), (Some("8".into()), 8));
    assert_eq!(answer("1").0.as_deref(), Some("Reject"));
    // not declared to an initiator that does not send it (open-iscsi refuses unknown keys)
    let mut n = Negotiator::new(cfg.clone(), Transport::Iser, SessionType::Normal, true, None);
    n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")])).unwrap();
    let all: Pairs = n.offers().into_iter().chain(n.declarations()).collect();
    assert_eq!(get(&all, "MaxOutstandingUnexpectedPDUs"), None);
}

#[test]
fn iser_connection_offers_rdma_extensions() {
    let mut n = Negotiator::new(
        TargetConfig::default(),
        Transport::Iser,
        SessionType::Normal,
        true,
        None,
    );
    n.respond(
        KeyPhase::Operational,
        &pairs(&[("MaxOutstandingUnexpectedPDUs", "8")]),
    )
    .unwrap();
    assert_eq!(n.session().max_outstanding_unexpected_pdus, 8);
    let offers = n.offers();
    assert_eq!(get(&offers, "RDMAExtensions"), Some("Yes"));
    assert!(n.awaiting_answers());
    n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "No")]))
        .unwrap();
    assert_eq!(n.finish(), Err(NegotiationError::RdmaExtensionsRequired));
    // the other way round
    let mut n = Negotiator::new(
        TargetConfig::default(),
        Transport::Iser,
        SessionType::Normal,
        true,
        None,
    );
    n.offers();
    n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")]))
        .unwrap();
    assert!(n.finish().is_ok());
    // RDMAExtensions=Yes offered on TCP is answered No
    let mut n = normal();
    let out = n
        .respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")]))
        .unwrap();
    assert_eq!(get(&out, "RDMAExtensions"), Some("No"));
}

#[test]
fn rdma_extensions_is_an_operational_offer_on_iser() {
    let iser = |session_type, leading| {
        Negotiator::new(TargetConfig::default(), Transport::Iser, session_type, leading, None)
    };
    let mut n = iser(SessionType::Normal, true);
    n.respond(KeyPhase::Operational, &pairs(&[("MaxBurstLength", "65536")])).unwrap();
    assert_eq!(n.operational_offers(), pairs(&[("RDMAExtensions", "Yes")]));
    assert!(n.awaiting_answers());
    assert!(n.operational_offers().is_empty(), "offered once");
    assert_eq!(get(&n.offers(), "RDMAExtensions"), None);
    n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")])).unwrap();
    assert!(!n.awaiting_answers() && n.session().rdma_extensions);
    // the initiator offered it first: answered, not offered
    let mut n = iser(SessionType::Normal, true);
    n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")])).unwrap();
    assert!(n.operational_offers().is_empty());
    // not in discovery sessions, on added connections or on TCP
    assert!(iser(SessionType::Discovery, true).operational_offers().is_empty());
    assert!(iser(SessionType::Normal, false).operational_offers().is_empty());
    assert!(normal().operational_offers().is_empty());
}

#[test]
fn target_offers_when_defaults_are_wrong() {
    let cfg = TargetConfig {
        immediate_data: false,
        max_burst_length: 131072,
        first_burst_length: 16384,
        header_digest: DigestPolicy::Required,
        ..TargetConfig::default()
    };
    let mut n = Negotiator::new(cfg, Transport::Tcp, SessionType::Normal, true, None);
    n.respond(
        KeyPhase::Operational,
        &pairs(&[("ErrorRecoveryLevel", "0")]),
    )
    .unwrap();
    let offers = n.offers();
    assert_eq!(get(&offers, "ImmediateData"), Some("No"));
    assert_eq!(get(&offers, "MaxBurstLength"), Some("131072"));
    assert_eq!(get(&offers, "FirstBurstLength"), Some("16384"));
    assert_eq!(get(&offers, "HeaderDigest"), Some("CRC32C"));
    assert!(n.offers().is_empty(), "offered once");
    assert!(!n.session().immediate_data);
    assert!(n.awaiting_answers());
    n.respond(
        KeyPhase::Operational,
        &pairs(&[
            ("MaxBurstLength", "65536"),
            ("FirstBurstLength", "16384"),
            ("HeaderDigest", "CRC32C"),
        ]),
    )
    .unwrap();
    assert!(!n.awaiting_answers());
    assert_eq!(n.session().max_burst_length, 65536);
    assert!(n.connection().header_digest);
    assert!(n.finish().is_ok());
}

#[test]
fn required_digest_refused() {
    let cfg = TargetConfig {
        data_digest: DigestPolicy::Required,
        ..TargetConfig::default()
    };
    let mut n = Negotiator::new(cfg, Transport::Tcp, SessionType::Normal, true, None);
    let out = n
        .respond(KeyPhase::Operational, &pairs(&[("DataDigest", "None")]))
        .unwrap();
    assert_eq!(get(&out, "DataDigest"), Some("Reject"));
    assert_eq!(
        n.finish(),
        Err(NegotiationError::DigestRequired("DataDigest"))
    );
}

#[test]
fn security_keys_and_phases() {
    let mut n = normal();
    n.set_auth_methods(["CHAP", "None"]);
    let out = n
        .respond(
            KeyPhase::Security,
            &pairs(&[
                ("InitiatorName", "iqn.1994-05.com.redhat:abc"),
                ("SessionType", "Normal"),
                ("TargetName", "iqn.2016-06.io.spdk:disk1"),
                ("AuthMethod", "KRB5,CHAP,None"),
                ("CHAP_A", "5"),
            ]),
        )
        .unwrap();
    assert_eq!(out, pairs(&[("AuthMethod", "CHAP")]));
    assert_eq!(n.auth_method(), Some("CHAP"));
    assert_eq!(n.session().initiator_name, "iqn.1994-05.com.redhat:abc");
    assert_eq!(
        n.session().target_name.as_deref(),
        Some("iqn.2016-06.io.spdk:disk1")
    );
    // no acceptable method
    let mut n = normal();
    let out = n
        .respond(KeyPhase::Security, &pairs(&[("AuthMethod", "CHAP")]))
        .unwrap();
    assert_eq!(get(&out, "AuthMethod"), Some("Reject"));
    // security keys in the operational stage
    let mut n = normal();
    assert_eq!(
        n.respond(KeyPhase::Operational, &pairs(&[("AuthMethod", "None")])),
        Err(NegotiationError::SecurityKeyOutOfStage("AuthMethod".into()))
    );
    // login-only keys in full feature phase are rejected
    let mut n = normal();
    let out = n
        .respond(
            KeyPhase::FullFeature,
            &pairs(&[("MaxBurstLength", "4096"), ("HeaderDigest", "None")]),
        )
        .unwrap();
    assert_eq!(
        out,
        pairs(&[("MaxBurstLength", "Reject"), ("HeaderDigest", "Reject")])
    );
}

#[test]
fn numbers_in_every_encoding() {
    let mut n = normal();
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[
                ("MaxBurstLength", "0x10000"),
                ("FirstBurstLength", "0bAAEAAA=="),
            ]),
        )
        .unwrap();
    assert_eq!(get(&out, "MaxBurstLength"), Some("65536"));
    assert_eq!(get(&out, "FirstBurstLength"), Some("65536"));
}

#[test]
fn special_values_as_offers_are_ignored() {
    let mut n = normal();
    let out = n
        .respond(
            KeyPhase::Operational,
            &pairs(&[("MaxBurstLength", "Irrelevant")]),
        )
        .unwrap();
    assert!(out.is_empty());
}
