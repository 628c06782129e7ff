//! The login and its session: added connections, reinstatement, the check and commit of the session table, Send.

use super::*;

#[test]
fn added_connection_uses_the_session() {
    let existing = SessionParams {
        max_burst_length: 65536,
        ..SessionParams::default()
    };
    let mut policy = Policy {
        decision: Some(SessionDecision::AddConnection {
            tsih: 3,
            session: existing,
            exp_cmd_sn: Sn(900),
            max_cmd_sn: Sn(931),
        }),
        ..Policy::default()
    };
    let mut login = Login::new(LoginContext::default());
    let mut p = pdu(req(
        true,
        OP,
        FFP,
        &[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("MaxBurstLength", "4096"),
            ("DataDigest", "None"),
        ],
    ));
    if let Op::LoginRequest(r) = &mut p.bhs.op {
        r.tsih = 3;
        r.cid = 1;
    }
    let out = run(&mut login, &mut policy, p);
    assert_eq!(out.order, "ARC");
    let (r, keys) = only_response(&out);
    assert_eq!(key(keys, "MaxBurstLength"), Some("Irrelevant"));
    assert_eq!((r.tsih, r.exp_cmd_sn, r.max_cmd_sn), (3, Sn(900), Sn(931)));
    let c = out.complete.unwrap();
    assert_eq!(c.session.max_burst_length, 65536);
    assert_eq!(c.identity.cid, 1);
}

#[test]
fn reinstatement_is_passed_through() {
    let mut policy = Policy {
        decision: Some(SessionDecision::Reinstate {
            tsih: 9,
            old_tsih: 4,
        }),
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
    assert_eq!(only_response(&out).0.tsih, 9);
    let c = out.complete.unwrap();
    assert_eq!(
        c.decision,
        SessionDecision::Reinstate {
            tsih: 9,
            old_tsih: 4
        }
    );
    assert!(!c.negotiator.awaiting_answers());
}

/// The session is only looked at before authentication: committed (created, reinstated or
/// joined) once, when the final Login Response is built, never for a login that fails its
/// security stage (a peer without the secret must not end the session it names).
#[test]
fn the_session_is_committed_only_when_the_login_completes() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy {
        auth: Some((true, toy)),
        decision: Some(SessionDecision::Reinstate { tsih: 9, old_tsih: 4 }),
        ..Policy::default()
    };
    let first = &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "CHAP")];
    run(&mut login, &mut policy, pdu(req(false, SEC, SEC, first)));
    assert_eq!((policy.checks, policy.commits), (1, 0), "checked at the first key list, nothing committed");
    run(&mut login, &mut policy, pdu(req(false, SEC, SEC, &[("CHAP_A", "5")])));
    let out = run(&mut login, &mut policy, pdu(req(true, SEC, OP, &[("CHAP_N", "ok")])));
    assert_eq!(out.order, "AR");
    assert_eq!(policy.commits, 0, "authenticated, but the login goes on");
    let out = run(&mut login, &mut policy, pdu(req(true, OP, FFP, &[])));
    assert_eq!(out.order, "RC");
    assert_eq!((policy.checks, policy.commits), (1, 1));
    assert_eq!(only_response(&out).0.tsih, 9, "the committed TSIH in the final response");
    assert_eq!(out.complete.unwrap().decision, SessionDecision::Reinstate { tsih: 9, old_tsih: 4 });

    // A wrong response: nothing committed.
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy { auth: Some((true, toy)), ..Policy::default() };
    run(&mut login, &mut policy, pdu(req(false, SEC, SEC, first)));
    run(&mut login, &mut policy, pdu(req(false, SEC, SEC, &[("CHAP_A", "5")])));
    let out = run(&mut login, &mut policy, pdu(req(true, SEC, FFP, &[("CHAP_N", "bad")])));
    assert_eq!(out.failed, Some(LoginStatus::AUTHENTICATION_FAILURE));
    assert_eq!((policy.checks, policy.commits), (1, 0));
    // Nor for one that skips the required security stage, nor one that stops early.
    let mut login = Login::new(LoginContext::default());
    let out = run(&mut login, &mut policy, pdu(req(true, OP, FFP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET)])));
    assert_eq!(out.failed, Some(LoginStatus::AUTHENTICATION_FAILURE));
    let mut login = Login::new(LoginContext::default());
    run(&mut login, &mut policy, pdu(req(false, SEC, SEC, first)));
    assert_eq!((policy.checks, policy.commits), (3, 0));

    // Without a security stage: committed with the final response, in the same step.
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy::default();
    let out = run(&mut login, &mut policy, pdu(req(true, OP, FFP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET)])));
    assert_eq!(out.order, "ARC");
    assert_eq!((policy.checks, policy.commits), (1, 1));
}

/// The table changed between the check and the completion (the session limit was reached,
/// the session to join ended): the login fails with the commit's status, answering the last
/// request, and no TSIH is given.
#[test]
fn a_session_refused_at_completion_fails_the_login() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy { refuse_commit: Some(LoginStatus::OUT_OF_RESOURCES), ..Policy::default() };
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, SEC, OP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None")])),
    );
    assert_eq!(out.order, "AR");
    let out = run(&mut login, &mut policy, pdu(req(true, OP, FFP, &[])));
    assert_eq!(out.order, "RF");
    assert_eq!(out.failed, Some(LoginStatus::OUT_OF_RESOURCES));
    let (r, _) = only_response(&out);
    assert_eq!((r.status, r.tsih, r.transit_bit), (LoginStatus::OUT_OF_RESOURCES, 0, false));
    assert!(out.complete.is_none() && login.is_finished());
    assert_eq!(policy.commits, 1);
}

/// A policy whose commit is not of the kind its check announced (a leading connection
/// cannot become an added one: its keys were negotiated as leading): Target Error.
#[test]
fn a_commit_of_another_kind_than_the_check_is_a_target_error() {
    struct Mismatch;
    impl LoginPolicy for Mismatch {
        fn lookup_target(&mut self, _who: &LoginIdentity) -> TargetLookup {
            TargetLookup::Found(TargetInfo { name: TARGET.into(), ..TargetInfo::discovery() })
        }
        fn check_session(&mut self, _who: &LoginIdentity, _t: &TargetInfo) -> Result<SessionCheck, LoginStatus> {
            Ok(SessionCheck::Leading)
        }
        fn commit_session(&mut self, _who: &LoginIdentity, _t: &TargetInfo) -> Result<SessionDecision, LoginStatus> {
            Ok(SessionDecision::AddConnection {
                tsih: 3,
                session: SessionParams::default(),
                exp_cmd_sn: Sn(1),
                max_cmd_sn: Sn(2),
            })
        }
    }
    let mut login = Login::new(LoginContext::default());
    login.handle(&pdu(req(true, OP, FFP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET)])), &mut Mismatch);
    let out = drain(&mut login);
    assert_eq!(out.failed, Some(LoginStatus::TARGET_ERROR));
    assert!(out.complete.is_none());
}

#[test]
fn login_moves_between_threads() {
    fn is_send<T: Send>() {}
    is_send::<Login>();
    is_send::<LoginOutcome>();
}
