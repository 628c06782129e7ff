//! CHAP logins of the initiator: against riser's own login state machine in memory
//! ([`PduSession`]) and a target that misbehaves, scripted (over TCP against a fake target:
//! riser-perf's `fake_target` tests).

use riser_iscsi::chap::{ChapAlgorithm, ChapCredentials, ChapInitiatorConfig, ChapSecret, ChapTarget};
use riser_iscsi::login::{
    AuthPolicy, Login, LoginContext, LoginEvent, LoginIdentity, LoginOutput, LoginPolicy, SessionCheck, SessionDecision, TargetInfo,
    TargetLookup,
};
use riser_iscsi::negotiate::TargetConfig;
use riser_iscsi::pdu::{LoginResponse, LoginStatus, Lun};
use riser_iscsi::serial::Sn;
use riser_iscsi::text::{encode_pairs, parse_pairs};

use super::*;
use crate::session::{Negotiated, PduSession, SessionState, INITIATOR_NAME};

const TARGET: &str = "iqn.2016-06.io.riser:chap";
const USER: &str = "perf-user";
const SECRET: &str = "perf-secret-0123";
const MUSER: &str = "riser-target";
const MSECRET: &str = "target-secret-4567";

fn secrets() -> Vec<ChapSecret> {
    vec![ChapSecret {
        user: USER.into(),
        secret: SECRET.into(),
        muser: Some(MUSER.into()),
        msecret: Some(MSECRET.into()),
    }]
}

/// What riser-perf's flags make: `--chap USER:secret [--chap-mutual MUSER:msecret]`.
fn chap(secret: &str, msecret: Option<&str>) -> ChapInitiatorConfig {
    ChapInitiatorConfig {
        mutual: msecret.map(|m| ChapCredentials::new(MUSER, m)),
        ..ChapInitiatorConfig::new(ChapCredentials::new(USER, secret))
    }
}

/// riser's login policy, reduced to one target with this authentication.
struct Riser(Option<AuthPolicy>);

impl LoginPolicy for Riser {
    fn lookup_target(&mut self, _who: &LoginIdentity) -> TargetLookup {
        TargetLookup::Found(TargetInfo {
            name: TARGET.into(),
            alias: None,
            config: TargetConfig::default(),
            auth: self.0.take().unwrap_or(AuthPolicy::None),
        })
    }

    fn check_session(&mut self, _who: &LoginIdentity, _t: &TargetInfo) -> Result<SessionCheck, LoginStatus> {
        Ok(SessionCheck::Leading)
    }

    fn commit_session(&mut self, _who: &LoginIdentity, _t: &TargetInfo) -> Result<SessionDecision, LoginStatus> {
        Ok(SessionDecision::New { tsih: 1 })
    }
}

/// A [`PduSession`] login to riser's [`Login`]: the initiator's result, and the target's
/// failure (status, reason) if it failed the login.
fn login_to_riser(
    chap: Option<ChapInitiatorConfig>,
    auth: AuthPolicy,
) -> (Result<Negotiated, String>, Option<(LoginStatus, String)>) {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Riser(Some(auth));
    let mut s = PduSession::new("riser", Lun(0));
    let mut params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, 1]);
    if let Some(c) = chap {
        params = params.with_chap(c);
    }
    let mut failed = None;
    let r = s.login_via(&params, KeyNegotiation::new(false, false), |req| {
        login.handle(&req, &mut policy);
        let mut resp = None;
        while let Some(o) = login.poll_output() {
            match o {
                LoginOutput::Transmit(p) => resp = Some(p),
                LoginOutput::Event(LoginEvent::Failed { status, reason }) => failed = Some((status, reason)),
                LoginOutput::Event(_) => {}
            }
        }
        resp.ok_or_else(|| "no Login Response".to_string())
    });
    assert_eq!(r.is_ok(), s.logged_in());
    (r, failed)
}

fn required(mutual: bool) -> AuthPolicy {
    AuthPolicy::Required(Box::new(ChapTarget::new(secrets(), mutual)))
}

#[test]
fn chap_logins_to_riser() {
    for alg in ChapAlgorithm::ALL {
        for msecret in [None, Some(MSECRET)] {
            let c = ChapInitiatorConfig {
                algorithms: vec![alg],
                ..chap(SECRET, msecret)
            };
            let (r, failed) = login_to_riser(Some(c), required(msecret.is_some()));
            assert!(
                r.is_ok() && failed.is_none(),
                "{alg} mutual={}: {r:?} {failed:?}",
                msecret.is_some()
            );
        }
    }
    // Optional CHAP on the target, taken.
    let optional = AuthPolicy::Optional(Box::new(ChapTarget::new(secrets(), false)));
    let (r, _) = login_to_riser(Some(chap(SECRET, Some(MSECRET))), optional);
    r.unwrap();
    // No credentials and no CHAP: today's login.
    login_to_riser(None, AuthPolicy::None).0.unwrap();
}

#[test]
fn chap_failures_against_riser() {
    // A wrong secret: riser answers 0x0201.
    let (r, failed) = login_to_riser(Some(chap("wrong-secret-000", None)), required(false));
    let e = r.unwrap_err();
    assert!(e.contains("authentication failed") && e.contains("0x01"), "{e}");
    let (status, reason) = failed.unwrap();
    assert_eq!(status, LoginStatus::AUTHENTICATION_FAILURE);
    assert!(reason.contains("wrong CHAP response"), "{reason}");
    // Mutual CHAP with a wrong target secret: riser-perf refuses riser.
    let (r, failed) = login_to_riser(Some(chap(SECRET, Some("not-the-target-secret"))), required(true));
    let e = r.unwrap_err();
    assert!(e.contains("CHAP: the target's mutual CHAP response is wrong"), "{e}");
    assert!(!e.contains(MSECRET) && !e.contains("not-the-target-secret"), "{e}");
    assert!(failed.is_none(), "the target thought all was well");
    // Mutual CHAP required, one-way offered.
    let (r, failed) = login_to_riser(Some(chap(SECRET, None)), required(true));
    assert!(r.unwrap_err().contains("authentication failed"));
    assert!(failed.unwrap().1.contains("mutual CHAP required"));
    // CHAP required, no credentials given.
    let (r, _) = login_to_riser(None, required(false));
    let e = r.unwrap_err();
    assert!(e.contains("--chap"), "{e}");
    // Credentials given, the target does not do CHAP.
    let (r, _) = login_to_riser(Some(chap(SECRET, None)), AuthPolicy::None);
    let e = r.unwrap_err();
    assert!(e.contains("refused AuthMethod=CHAP"), "{e}");
    // Nothing in common.
    let md5_only = ChapInitiatorConfig {
        algorithms: vec![ChapAlgorithm::Md5],
        ..chap(SECRET, None)
    };
    let sha256_only = ChapTarget::new(secrets(), false).with_algorithms(vec![ChapAlgorithm::Sha256]);
    let (r, failed) = login_to_riser(Some(md5_only), AuthPolicy::Required(Box::new(sha256_only)));
    assert!(r.is_err());
    assert!(failed.unwrap().1.contains("no CHAP algorithm in common"));
}

fn response(transit: bool, nsg: Stage, keys: &[(&str, &str)]) -> (Op, Vec<u8>) {
    let r = LoginResponse {
        transit_bit: transit,
        continue_bit: false,
        csg: Stage::SecurityNegotiation,
        nsg,
        version_max: 0,
        version_active: 0,
        isid: Isid([0x80, 0, 0, 0, 0, 6]),
        tsih: 0,
        itt: Itt(crate::session::MGMT_ITT),
        stat_sn: Sn(1),
        exp_cmd_sn: Sn(1),
        max_cmd_sn: Sn(1),
        status: LoginStatus::SUCCESS,
    };
    (Op::LoginResponse(r), encode_pairs(keys))
}

fn start(chap_config: Option<ChapInitiatorConfig>) -> (LoginExchange, SessionState, LoginRequest, Vec<u8>) {
    let s = SessionState::new(Lun(0));
    let mut params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, 6]);
    params.chap = chap_config;
    let (ex, req, text) = LoginExchange::start(&params, KeyNegotiation::new(false, false), &s).unwrap();
    (ex, s, req, text)
}

fn keys(text: &[u8]) -> Vec<(String, String)> {
    parse_pairs(text).unwrap()
}

/// The requests of a CHAP login, and the targets it refuses.
#[test]
fn chap_requests_and_misbehaving_targets() {
    const SEC: Stage = Stage::SecurityNegotiation;
    const OP: Stage = Stage::LoginOperationalNegotiation;
    let (mut ex, mut s, req, text) = start(Some(chap(SECRET, Some(MSECRET))));
    assert!(keys(&text).contains(&("AuthMethod".into(), "CHAP".into())), "CHAP only");
    assert!(req.transit_bit && req.csg == SEC && req.nsg == OP);
    let (op, data) = response(false, SEC, &[("AuthMethod", "CHAP")]);
    let LoginStep::Send(req, text) = ex.on_response(&mut s, &op, &data).unwrap() else {
        panic!()
    };
    assert_eq!(keys(&text), [("CHAP_A".to_string(), "7,8,6,5".to_string())]);
    assert!(!req.transit_bit && req.csg == SEC, "T=0 while CHAP goes on");
    let mut target = ChapTarget::new(secrets(), true);
    let mut challenge = Vec::new();
    use riser_iscsi::login::Authenticator;
    target.step(&keys(&text), &mut challenge);
    let c: Vec<(&str, &str)> = challenge.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (op, data) = response(false, SEC, &c);
    let LoginStep::Send(req, text) = ex.on_response(&mut s, &op, &data).unwrap() else {
        panic!()
    };
    let answer = keys(&text);
    let names: Vec<&str> = answer.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["CHAP_N", "CHAP_R", "CHAP_I", "CHAP_C"]);
    assert!(
        req.transit_bit && req.csg == SEC && req.nsg == OP,
        "T=1 with the response"
    );
    let mut last = Vec::new();
    target.step(&answer, &mut last);
    let l: Vec<(&str, &str)> = last.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (op, data) = response(true, OP, &l);
    let LoginStep::Send(req, text) = ex.on_response(&mut s, &op, &data).unwrap() else {
        panic!()
    };
    assert!(req.csg == OP && keys(&text).iter().any(|(k, _)| k == "MaxRecvDataSegmentLength"));

    // The target ends the security stage before CHAP.
    let (mut ex, mut s, _, _) = start(Some(chap(SECRET, None)));
    let (op, data) = response(true, OP, &[("AuthMethod", "CHAP")]);
    let e = ex.on_response(&mut s, &op, &data).unwrap_err();
    assert!(e.contains("before CHAP was done"), "{e}");
    // ... or after the challenge.
    let (mut ex, mut s, _, _) = start(Some(chap(SECRET, None)));
    let (op, data) = response(false, SEC, &[("AuthMethod", "CHAP")]);
    ex.on_response(&mut s, &op, &data).unwrap();
    let (op, data) = response(true, OP, &[("CHAP_A", "5"), ("CHAP_I", "1"), ("CHAP_C", "0x0102")]);
    assert!(ex
        .on_response(&mut s, &op, &data)
        .unwrap_err()
        .contains("before CHAP was done"));
    // No AuthMethod answer.
    let (mut ex, mut s, _, _) = start(Some(chap(SECRET, None)));
    let (op, data) = response(false, SEC, &[]);
    assert!(ex
        .on_response(&mut s, &op, &data)
        .unwrap_err()
        .contains("did not answer AuthMethod=CHAP"));
    // AuthMethod=None when only CHAP was offered.
    let (mut ex, mut s, _, _) = start(Some(chap(SECRET, None)));
    let (op, data) = response(true, OP, &[("AuthMethod", "None")]);
    assert!(ex
        .on_response(&mut s, &op, &data)
        .unwrap_err()
        .contains("refused AuthMethod=CHAP"));
    // A malformed challenge.
    let (mut ex, mut s, _, _) = start(Some(chap(SECRET, None)));
    let (op, data) = response(false, SEC, &[("AuthMethod", "CHAP")]);
    ex.on_response(&mut s, &op, &data).unwrap();
    let (op, data) = response(false, SEC, &[("CHAP_A", "5"), ("CHAP_I", "1"), ("CHAP_C", "0x123")]);
    let e = ex.on_response(&mut s, &op, &data).unwrap_err();
    assert_eq!(e, "CHAP: CHAP_C: odd number of hex digits");
    // Mutual CHAP asked for, the target says nothing.
    let (mut ex, mut s, _, _) = start(Some(chap(SECRET, Some(MSECRET))));
    let (op, data) = response(false, SEC, &[("AuthMethod", "CHAP")]);
    ex.on_response(&mut s, &op, &data).unwrap();
    let (op, data) = response(false, SEC, &[("CHAP_A", "7"), ("CHAP_I", "1"), ("CHAP_C", "0x0102")]);
    ex.on_response(&mut s, &op, &data).unwrap();
    let (op, data) = response(true, OP, &[]);
    assert!(ex
        .on_response(&mut s, &op, &data)
        .unwrap_err()
        .contains("CHAP_N missing"));
    // CHAP keys without credentials.
    let (mut ex, mut s, _, _) = start(None);
    let (op, data) = response(false, SEC, &[("AuthMethod", "None"), ("CHAP_A", "5")]);
    assert!(ex
        .on_response(&mut s, &op, &data)
        .unwrap_err()
        .contains("no CHAP credentials"));
}
