//! iSER logins: RDMAExtensions asked for, offered, refused (RFC 7145 §6.3).

use super::*;

#[test]
fn iser_login() {
    let ctx = LoginContext {
        transport: Transport::Iser,
        ..LoginContext::default()
    };
    let mut login = Login::new(ctx);
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
                ("TargetName", TARGET),
                ("AuthMethod", "None"),
            ],
        )),
    );
    assert_eq!(out.order, "AR", "allocate once the security stage is left");
    // Linux ib_iser sends RDMAExtensions=Yes in the operational stage
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            OP,
            FFP,
            &[
                ("RDMAExtensions", "Yes"),
                ("HeaderDigest", "None"),
                ("InitiatorRecvDataSegmentLength", "262144"),
            ],
        )),
    );
    assert_eq!(out.order, "RC");
    let (_, keys) = only_response(&out);
    assert_eq!(key(keys, "RDMAExtensions"), Some("Yes"));
    let c = out.complete.unwrap();
    assert!(c.session.rdma_extensions);
    assert!(!c.connection.header_digest);
    assert_eq!(c.connection.send_limit(true), 262_144);
}

#[test]
fn iser_login_without_rdma_extensions_gets_an_offer() {
    let ctx = LoginContext {
        transport: Transport::Iser,
        ..LoginContext::default()
    };
    let mut login = Login::new(ctx);
    let mut policy = Policy::default();
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
    assert_eq!(out.order, "AR");
    let (r, keys) = only_response(&out);
    assert!(!r.transit_bit, "waits for the answer");
    assert_eq!(key(keys, "RDMAExtensions"), Some("Yes"));
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, OP, FFP, &[("RDMAExtensions", "Yes")])),
    );
    assert_eq!(out.order, "RC");
    // answered No: the login fails
    let mut login = Login::new(LoginContext {
        transport: Transport::Iser,
        ..LoginContext::default()
    });
    run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            OP,
            FFP,
            &[("InitiatorName", INITIATOR), ("TargetName", TARGET)],
        )),
    );
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, OP, FFP, &[("RDMAExtensions", "No")])),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
}

#[test]
fn iser_rdma_extensions_offered_in_the_first_operational_response() {
    // RFC 7145 §6.3: in the first Login Response of the operational stage, even when the
    // initiator does not ask for full-feature phase yet (T=0) and whatever it sent.
    let ctx = LoginContext { transport: Transport::Iser, ..LoginContext::default() };
    let mut login = Login::new(ctx);
    let mut policy = Policy::default();
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, SEC, OP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None")])),
    );
    let (r, keys) = only_response(&out);
    assert_eq!((r.csg, r.transit_bit), (SEC, true));
    assert_eq!(key(keys, "RDMAExtensions"), None, "not in a security-stage response");
    let out = run(&mut login, &mut policy, pdu(req(false, OP, OP, &[("MaxBurstLength", "262144")])));
    let (r, keys) = only_response(&out);
    assert_eq!((r.csg, r.transit_bit), (OP, false));
    assert_eq!(key(keys, "RDMAExtensions"), Some("Yes"), "{keys:?}");
    assert_eq!(key(keys, "MaxBurstLength"), Some("262144"));
    // answered in the next request; offered once
    let out = run(&mut login, &mut policy, pdu(req(true, OP, FFP, &[("RDMAExtensions", "Yes")])));
    assert_eq!(out.order, "RC");
    assert_eq!(key(&only_response(&out).1, "RDMAExtensions"), None);
    assert!(out.complete.unwrap().session.rdma_extensions);
    // a discovery session over iSER gets no offer (RDMAExtensions is irrelevant there)
    let mut login = Login::new(LoginContext { transport: Transport::Iser, ..LoginContext::default() });
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(false, OP, OP, &[("InitiatorName", INITIATOR), ("SessionType", "Discovery")])),
    );
    assert_eq!(key(&only_response(&out).1, "RDMAExtensions"), None);
    // nor a TCP connection
    let mut login = Login::new(LoginContext::default());
    let out = run(&mut login, &mut policy, pdu(req(false, OP, OP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET)])));
    assert_eq!(key(&only_response(&out).1, "RDMAExtensions"), None);
}
