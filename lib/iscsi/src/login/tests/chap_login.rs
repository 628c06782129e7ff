//! CHAP (crate::chap) through the login: one-way and mutual logins, failures.

use super::*;
use crate::chap::{ChapAlgorithm, ChapCredentials, ChapInitiator, ChapInitiatorConfig, ChapSecret, ChapTarget};

const USER: &str = "iqn.1994-05.com.redhat:client";
const SECRET: &str = "client-secret-1";
const MUSER: &str = "iqn.2016-06.io.riser:disk1";
const MSECRET: &str = "target-secret-22";

fn secrets() -> Vec<ChapSecret> {
    vec![ChapSecret {
        user: USER.into(),
        secret: SECRET.into(),
        muser: Some(MUSER.into()),
        msecret: Some(MSECRET.into()),
    }]
}

fn one_way() -> Box<dyn Authenticator> {
    Box::new(ChapTarget::new(secrets(), false))
}

fn mutual() -> Box<dyn Authenticator> {
    Box::new(ChapTarget::new(secrets(), true))
}

fn initiator(secret: &str, mutual: Option<&str>) -> ChapInitiator {
    ChapInitiator::new(ChapInitiatorConfig {
        mutual: mutual.map(|s| ChapCredentials::new(MUSER, s)),
        ..ChapInitiatorConfig::new(ChapCredentials::new(USER, secret))
    })
}

fn chap_keys(keys: &Pairs) -> Pairs {
    keys.iter().filter(|(k, _)| k.starts_with("CHAP_")).cloned().collect()
}

fn as_refs(p: &Pairs) -> Vec<(&str, &str)> {
    p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Up to the target's challenge: the login, the initiator and the challenge keys.
fn to_challenge(policy: &mut Policy, i: &mut ChapInitiator) -> (Login, Pairs) {
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        policy,
        pdu(req(
            true,
            SEC,
            OP,
            &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "CHAP,None")],
        )),
    );
    let (r, keys) = only_response(&out);
    assert!(!r.transit_bit, "no transit before CHAP is done");
    assert_eq!(key(keys, "AuthMethod"), Some("CHAP"));
    let offer = i.offer().unwrap();
    let out = run(&mut login, policy, pdu(req(false, SEC, SEC, &as_refs(&offer))));
    let (r, keys) = only_response(&out);
    assert!(!r.transit_bit);
    assert_eq!(out.allocate, 0, "nothing allocated during the security stage");
    (login, chap_keys(keys))
}

#[test]
fn one_way_and_mutual_logins() {
    for (make, mutual_secret) in [(one_way as MakeAuthenticator, None), (mutual, Some(MSECRET))] {
        let mut policy = Policy {
            auth: Some((true, make)),
            ..Policy::default()
        };
        let mut i = initiator(SECRET, mutual_secret);
        let (mut login, challenge) = to_challenge(&mut policy, &mut i);
        assert_eq!(key(&challenge, "CHAP_A"), Some("7"), "SHA-256, the initiator's first choice");
        let answer = i.respond(&challenge).unwrap();
        let out = run(&mut login, &mut policy, pdu(req(true, SEC, OP, &as_refs(&answer))));
        assert_eq!(out.order, "AR", "{out:?}");
        let (r, keys) = only_response(&out);
        assert!(r.transit_bit && r.status == LoginStatus::SUCCESS);
        i.verify(&chap_keys(keys)).unwrap();
        assert!(i.is_done());
        assert_eq!(key(keys, "CHAP_N").is_some(), mutual_secret.is_some());
        let out = run(&mut login, &mut policy, pdu(req(true, OP, FFP, &[])));
        assert_eq!(out.order, "RC");
        assert_eq!(out.complete.unwrap().connection.auth_method.as_deref(), Some("CHAP"));
    }
}

/// The last CHAP step with `answer`: the status and the reason of the failure.
fn fail_with(login: &mut Login, policy: &mut Policy, answer: &Pairs) -> (LoginStatus, String) {
    login.handle(&pdu(req(true, SEC, OP, &as_refs(answer))), policy);
    let mut failed = None;
    while let Some(o) = login.poll_output() {
        if let LoginOutput::Event(LoginEvent::Failed { status, reason }) = o {
            failed = Some((status, reason));
        }
    }
    failed.expect("the login failed")
}

#[test]
fn failures_are_0x0201() {
    let mut policy = Policy {
        auth: Some((true, one_way)),
        ..Policy::default()
    };
    // A wrong secret.
    let mut i = initiator("wrong-secret-000", None);
    let (mut login, challenge) = to_challenge(&mut policy, &mut i);
    let answer = i.respond(&challenge).unwrap();
    let (status, reason) = fail_with(&mut login, &mut policy, &answer);
    assert_eq!(status, LoginStatus::AUTHENTICATION_FAILURE);
    assert_eq!(reason, format!("CHAP failed: wrong CHAP response for user \"{USER}\""));
    assert!(!reason.contains(SECRET) && !reason.contains("wrong-secret-000"));
    assert!(login.is_finished());
    // An unknown user.
    let mut i = ChapInitiator::new(ChapInitiatorConfig::new(ChapCredentials::new("nobody", SECRET)));
    let (mut login, challenge) = to_challenge(&mut policy, &mut i);
    let answer = i.respond(&challenge).unwrap();
    let (status, reason) = fail_with(&mut login, &mut policy, &answer);
    assert_eq!(status, LoginStatus::AUTHENTICATION_FAILURE);
    assert!(reason.contains("unknown CHAP user"), "{reason}");
    // A reflected challenge.
    let mut i = initiator(SECRET, Some(MSECRET));
    let (mut login, challenge) = to_challenge(&mut policy, &mut i);
    let mut answer = i.respond(&challenge).unwrap();
    for kv in answer.iter_mut().filter(|(k, _)| k == "CHAP_C") {
        kv.1 = key(&challenge, "CHAP_C").unwrap().to_string();
    }
    assert_eq!(fail_with(&mut login, &mut policy, &answer).0, LoginStatus::AUTHENTICATION_FAILURE);
    // Mutual required, one-way offered.
    let mut policy = Policy {
        auth: Some((true, mutual)),
        ..Policy::default()
    };
    let mut i = initiator(SECRET, None);
    let (mut login, challenge) = to_challenge(&mut policy, &mut i);
    let answer = i.respond(&challenge).unwrap();
    assert_eq!(fail_with(&mut login, &mut policy, &answer).0, LoginStatus::AUTHENTICATION_FAILURE);
    // Nothing in common.
    let mut i = ChapInitiator::new(ChapInitiatorConfig {
        algorithms: vec![ChapAlgorithm::Md5],
        ..ChapInitiatorConfig::new(ChapCredentials::new(USER, SECRET))
    });
    let mut policy = Policy {
        auth: Some((true, || {
            Box::new(ChapTarget::new(secrets(), false).with_algorithms(vec![ChapAlgorithm::Sha256]))
        })),
        ..Policy::default()
    };
    let mut login = Login::new(LoginContext::default());
    run(
        &mut login,
        &mut policy,
        pdu(req(false, SEC, SEC, &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "CHAP")])),
    );
    let offer = i.offer().unwrap();
    let out = run(&mut login, &mut policy, pdu(req(false, SEC, SEC, &as_refs(&offer))));
    assert_eq!(out.failed, Some(LoginStatus::AUTHENTICATION_FAILURE));
}

/// A 1 MiB CHAP_C is refused by the text limits before CHAP sees it: Initiator Error.
#[test]
fn huge_chap_c_is_an_initiator_error() {
    let mut policy = Policy {
        auth: Some((true, one_way)),
        ..Policy::default()
    };
    let mut i = initiator(SECRET, Some(MSECRET));
    let (mut login, challenge) = to_challenge(&mut policy, &mut i);
    let mut answer = i.respond(&challenge).unwrap();
    let huge = format!("0x{}", "ab".repeat(1 << 19));
    for kv in answer.iter_mut().filter(|(k, _)| k == "CHAP_C") {
        kv.1 = huge.clone();
    }
    let out = run(&mut login, &mut policy, pdu(req(true, SEC, OP, &as_refs(&answer))));
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // Within the text limits but over CHAP's 1024 bytes: Authentication Failure.
    let mut i = initiator(SECRET, Some(MSECRET));
    let (mut login, challenge) = to_challenge(&mut policy, &mut i);
    let mut answer = i.respond(&challenge).unwrap();
    for kv in answer.iter_mut().filter(|(k, _)| k == "CHAP_C") {
        kv.1 = crate::text::encode_hex(&[1; 2000]);
    }
    let (status, reason) = fail_with(&mut login, &mut policy, &answer);
    assert_eq!(status, LoginStatus::AUTHENTICATION_FAILURE);
    assert_eq!(reason, "CHAP failed: CHAP_C: too long");
}
