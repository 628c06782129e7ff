//! The security stage with the toy authenticator: the exchange and its failures.

use super::*;

#[test]
fn authentication_exchange() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy {
        auth: Some((true, toy)),
        ..Policy::default()
    };
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            false,
            SEC,
            SEC,
            &[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("AuthMethod", "None,CHAP"),
            ],
        )),
    );
    let (r, keys) = only_response(&out);
    assert!(!r.transit_bit);
    assert_eq!(key(keys, "AuthMethod"), Some("CHAP"));
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(false, SEC, SEC, &[("CHAP_A", "5")])),
    );
    let (_, keys) = only_response(&out);
    assert_eq!(key(keys, "CHAP_C"), Some("0x0102"));
    assert_eq!(
        out.allocate, 0,
        "nothing allocated during the security stage"
    );
    // T=1 with the response: authentication succeeds and the login moves on
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, SEC, OP, &[("CHAP_N", "ok"), ("CHAP_R", "0xab")])),
    );
    assert_eq!(out.order, "AR");
    assert!(only_response(&out).0.transit_bit);
    let out = run(&mut login, &mut policy, pdu(req(true, OP, FFP, &[])));
    assert_eq!(out.order, "RC");
    assert_eq!(
        out.complete.unwrap().connection.auth_method.as_deref(),
        Some("CHAP")
    );
}

#[test]
fn authentication_failures() {
    // wrong response
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy {
        auth: Some((true, toy)),
        ..Policy::default()
    };
    run(
        &mut login,
        &mut policy,
        pdu(req(
            false,
            SEC,
            SEC,
            &[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("AuthMethod", "CHAP"),
            ],
        )),
    );
    run(
        &mut login,
        &mut policy,
        pdu(req(false, SEC, SEC, &[("CHAP_A", "5")])),
    );
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, SEC, OP, &[("CHAP_N", "bad")])),
    );
    assert_eq!(out.failed, Some(LoginStatus::AUTHENTICATION_FAILURE));
    assert_eq!(out.allocate, 0);
    // security stage skipped while required
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
    assert_eq!(out.failed, Some(LoginStatus::AUTHENTICATION_FAILURE));
    assert_eq!(out.allocate, 0);
    // only None offered while required: AuthMethod=Reject, then no transit possible
    let mut login = Login::new(LoginContext::default());
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
    assert_eq!(out.failed, Some(LoginStatus::AUTHENTICATION_FAILURE));
    // CHAP keys without AuthMethod
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            false,
            SEC,
            SEC,
            &[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("CHAP_A", "5"),
            ],
        )),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // optional auth: None is fine
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy {
        auth: Some((false, toy)),
        ..Policy::default()
    };
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            SEC,
            FFP,
            &[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("AuthMethod", "None"),
            ],
        )),
    );
    assert_eq!(out.order, "ARC");
}
