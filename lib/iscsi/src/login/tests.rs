//! Login state machine tests: each is a scripted conversation, no sockets.
//!
//! This file holds the harness (a policy, a toy authenticator, request builders, the output
//! of a step); the tests are in the modules at its end, by topic.

use super::*;
use crate::pdu::Opcode;
use crate::text::parse_pairs;

const INITIATOR: &str = "iqn.1994-05.com.redhat:client";
const TARGET: &str = "iqn.2016-06.io.riser:disk1";

type MakeAuthenticator = fn() -> Box<dyn Authenticator>;

#[derive(Default)]
struct Policy {
    /// Authenticator to hand out for TARGET.
    auth: Option<(bool, MakeAuthenticator)>,
    redirect: bool,
    decision: Option<SessionDecision>,
    config: TargetConfig,
    lookups: usize,
    /// Calls of check_session and of commit_session.
    checks: usize,
    commits: usize,
    /// commit_session refuses with this status (things changed since the check).
    refuse_commit: Option<LoginStatus>,
}

impl LoginPolicy for Policy {
    fn lookup_target(&mut self, who: &LoginIdentity) -> TargetLookup {
        self.lookups += 1;
        if self.redirect {
            return TargetLookup::Redirect {
                target_address: "10.0.0.2:3260,1".into(),
                permanent: false,
            };
        }
        if who.target_name.as_deref() != Some(TARGET) {
            return TargetLookup::Refused(LoginStatus::NOT_FOUND);
        }
        let auth = match self.auth {
            None => AuthPolicy::None,
            Some((true, make)) => AuthPolicy::Required(make()),
            Some((false, make)) => AuthPolicy::Optional(make()),
        };
        TargetLookup::Found(TargetInfo {
            name: TARGET.into(),
            alias: Some("disk1".into()),
            config: self.config.clone(),
            auth,
        })
    }

    fn check_session(
        &mut self,
        _who: &LoginIdentity,
        _t: &TargetInfo,
    ) -> Result<SessionCheck, LoginStatus> {
        self.checks += 1;
        Ok(match &self.decision {
            Some(SessionDecision::AddConnection { session, .. }) => SessionCheck::Join {
                session: session.clone(),
            },
            _ => SessionCheck::Leading,
        })
    }

    fn commit_session(
        &mut self,
        _who: &LoginIdentity,
        _t: &TargetInfo,
    ) -> Result<SessionDecision, LoginStatus> {
        self.commits += 1;
        if let Some(status) = self.refuse_commit {
            return Err(status);
        }
        Ok(self
            .decision
            .clone()
            .unwrap_or(SessionDecision::New { tsih: 7 }))
    }
}

/// A toy method standing in for CHAP: expects CHAP_A, answers CHAP_C, then expects
/// CHAP_N=ok.
struct Toy {
    step: u8,
}

impl Authenticator for Toy {
    fn method(&self) -> &'static str {
        "CHAP"
    }

    fn step(&mut self, keys: &[(String, String)], out: &mut Pairs) -> AuthStep {
        let has = |k: &str, v: &str| keys.iter().any(|(a, b)| a == k && b == v);
        match self.step {
            0 if keys.is_empty() => AuthStep::Continue,
            0 if has("CHAP_A", "5") => {
                self.step = 1;
                out.push(("CHAP_A".into(), "5".into()));
                out.push(("CHAP_C".into(), "0x0102".into()));
                AuthStep::Continue
            }
            1 if has("CHAP_N", "ok") => AuthStep::Success,
            _ => AuthStep::Failure,
        }
    }
}

fn toy() -> Box<dyn Authenticator> {
    Box::new(Toy { step: 0 })
}

struct Req {
    t: bool,
    c: bool,
    csg: Stage,
    nsg: Stage,
    keys: Vec<u8>,
}

fn req(t: bool, csg: Stage, nsg: Stage, keys: &[(&str, &str)]) -> Req {
    Req {
        t,
        c: false,
        csg,
        nsg,
        keys: encode_pairs(keys),
    }
}

fn pdu(r: Req) -> Pdu {
    Pdu::with_data(
        Op::LoginRequest(LoginRequest {
            transit_bit: r.t,
            continue_bit: r.c,
            csg: r.csg,
            nsg: r.nsg,
            version_max: 0,
            version_min: 0,
            isid: Isid([0x80, 0, 0, 0x12, 0x34, 0x56]),
            tsih: 0,
            itt: Itt(0x10),
            cid: 0,
            cmd_sn: Sn(100),
            exp_stat_sn: Sn(0),
        }),
        r.keys,
    )
}

const SEC: Stage = Stage::SecurityNegotiation;
const OP: Stage = Stage::LoginOperationalNegotiation;
const FFP: Stage = Stage::FullFeaturePhase;

/// Everything the machine output after one PDU.
#[derive(Debug, Default)]
struct Out {
    responses: Vec<(LoginResponse, Pairs)>,
    allocate: usize,
    complete: Option<Box<LoginOutcome>>,
    failed: Option<LoginStatus>,
    /// Order of outputs: 'A'llocate, 'R'esponse, 'C'omplete, 'F'ailed.
    order: String,
}

fn run(login: &mut Login, policy: &mut Policy, p: Pdu) -> Out {
    login.handle(&p, policy);
    drain(login)
}

fn drain(login: &mut Login) -> Out {
    let mut out = Out::default();
    while let Some(o) = login.poll_output() {
        match o {
            LoginOutput::Transmit(p) => {
                // every response encodes and decodes cleanly
                let bytes = p.to_bytes(Default::default()).unwrap();
                assert!(p.data.len() <= LOGIN_MAX_DATA_SEGMENT_LENGTH);
                let back = crate::pdu::Bhs::parse_slice(&bytes).unwrap();
                assert_eq!(back.opcode(), Some(Opcode::LoginResponse));
                let Op::LoginResponse(r) = p.bhs.op else {
                    panic!("not a login response")
                };
                // a C=1 piece may end inside a pair
                let keys = if r.continue_bit {
                    Vec::new()
                } else {
                    parse_pairs(&p.data).unwrap()
                };
                out.responses.push((r, keys));
                out.order.push('R');
            }
            LoginOutput::Event(LoginEvent::AllocateDatamoverResources) => {
                out.allocate += 1;
                out.order.push('A');
            }
            LoginOutput::Event(LoginEvent::Complete(c)) => {
                out.complete = Some(c);
                out.order.push('C');
            }
            LoginOutput::Event(LoginEvent::Failed { status, .. }) => {
                out.failed = Some(status);
                out.order.push('F');
            }
        }
    }
    out
}

fn key<'a>(pairs: &'a Pairs, k: &str) -> Option<&'a str> {
    pairs.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
}

fn only_response(out: &Out) -> &(LoginResponse, Pairs) {
    assert_eq!(out.responses.len(), 1, "{out:?}");
    &out.responses[0]
}

mod chap_login;
mod conversation;
mod errors;
mod iser;
mod security;
mod session;
