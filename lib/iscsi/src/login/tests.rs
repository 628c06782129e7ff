//! Login state machine tests: each is a scripted conversation, no sockets.

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
fn unsupported_version() {
    let mut login = Login::new(LoginContext::default());
    let mut p = pdu(req(true, OP, FFP, &[("InitiatorName", INITIATOR)]));
    if let Op::LoginRequest(r) = &mut p.bhs.op {
        r.version_max = 2;
        r.version_min = 1;
    }
    let out = run(&mut login, &mut Policy::default(), p);
    assert_eq!(out.order, "RF");
    assert_eq!(out.failed, Some(LoginStatus::UNSUPPORTED_VERSION));
    assert_eq!(
        only_response(&out).0.status,
        LoginStatus::UNSUPPORTED_VERSION
    );
    assert_eq!(only_response(&out).0.version_max, 0);
}

#[test]
fn target_not_found_and_missing_names() {
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(
            true,
            SEC,
            OP,
            &[("InitiatorName", INITIATOR), ("TargetName", "iqn.nope")],
        )),
    );
    assert_eq!(out.failed, Some(LoginStatus::NOT_FOUND));
    assert_eq!(out.allocate, 0);
    assert!(login.is_finished());

    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(true, SEC, OP, &[("TargetName", TARGET)])),
    );
    assert_eq!(out.failed, Some(LoginStatus::MISSING_PARAMETER));

    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(true, SEC, OP, &[("InitiatorName", INITIATOR)])),
    );
    assert_eq!(out.failed, Some(LoginStatus::MISSING_PARAMETER));

    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(
            true,
            SEC,
            OP,
            &[("InitiatorName", INITIATOR), ("SessionType", "Bogus")],
        )),
    );
    assert_eq!(out.failed, Some(LoginStatus::SESSION_TYPE_NOT_SUPPORTED));
}

#[test]
fn wrong_stage_transitions() {
    let first = || {
        pdu(req(
            true,
            SEC,
            OP,
            &[("InitiatorName", INITIATOR), ("TargetName", TARGET)],
        ))
    };
    // first PDU in full feature phase
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(false, FFP, FFP, &[("InitiatorName", INITIATOR)])),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // CSG that is not the current stage
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy::default();
    run(&mut login, &mut policy, first());
    let out = run(&mut login, &mut policy, pdu(req(false, SEC, SEC, &[])));
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // backwards
    let mut login = Login::new(LoginContext::default());
    run(&mut login, &mut policy, first());
    let out = run(&mut login, &mut policy, pdu(req(true, OP, SEC, &[])));
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // reserved stage
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            SEC,
            Stage::Reserved,
            &[("InitiatorName", INITIATOR)],
        )),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // ISID changes mid-login
    let mut login = Login::new(LoginContext::default());
    run(&mut login, &mut policy, first());
    let mut p = pdu(req(true, OP, FFP, &[]));
    if let Op::LoginRequest(r) = &mut p.bhs.op {
        r.isid = Isid([0; 6]);
    }
    let out = run(&mut login, &mut policy, p);
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
}

#[test]
fn scsi_command_during_login() {
    use crate::pdu::{Lun, ScsiCommand};
    let mut login = Login::new(LoginContext::default());
    let cmd = Pdu::new(Op::ScsiCommand(ScsiCommand {
        immediate: false,
        final_bit: true,
        read: true,
        write: false,
        attr: 1,
        lun: Lun(0),
        itt: Itt(0x99),
        expected_data_transfer_length: 512,
        cmd_sn: Sn(1),
        exp_stat_sn: Sn(0),
        cdb: [0; 16],
    }));
    let out = run(&mut login, &mut Policy::default(), cmd);
    assert_eq!(out.failed, Some(LoginStatus::INVALID_DURING_LOGIN));
    assert_eq!(only_response(&out).0.itt, Itt(0x99));
}

#[test]
fn malformed_header_during_login() {
    let mut login = Login::new(LoginContext::default());
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x43;
    raw[1] = 0xc0;
    raw[19] = 5;
    login.handle_malformed(&raw);
    let out = drain(&mut login);
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    assert_eq!(only_response(&out).0.itt, Itt(5));
}

#[test]
fn malformed_header_of_another_opcode_is_invalid_during_login() {
    // A SCSI Command header that did not decode: the same answer as a decodable one (0x020b).
    let mut login = Login::new(LoginContext::default());
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x01;
    raw[1] = 0x60; // R and W without F
    raw[19] = 9;
    login.handle_malformed(&raw);
    let out = drain(&mut login);
    assert_eq!(out.failed, Some(LoginStatus::INVALID_DURING_LOGIN));
    assert_eq!(only_response(&out).0.itt, Itt(9));
    assert!(login.is_finished());
}

#[test]
fn malformed_first_login_request_is_answered_for_its_session() {
    let mut login = Login::new(LoginContext::default());
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x43;
    raw[1] = 0xc0; // T and C both set
    raw[8..14].copy_from_slice(&[0x80, 0, 0, 0x12, 0x34, 0x56]);
    raw[14..16].copy_from_slice(&7u16.to_be_bytes());
    raw[19] = 5;
    login.handle_malformed(&raw);
    let out = drain(&mut login);
    assert_eq!(out.order, "RF");
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    let r = &only_response(&out).0;
    assert_eq!((r.itt, r.isid, r.tsih), (Itt(5), Isid([0x80, 0, 0, 0x12, 0x34, 0x56]), 7));
}

#[test]
fn any_other_pdu_ends_the_login_at_once() {
    use crate::pdu::{DataOut, LogoutRequest, SnackRequest, TaskMgmtRequest};
    use crate::testing::{nop_out, scsi_command, text_request};
    let itt = Itt(0x77);
    let others = || {
        vec![
            Op::NopOut(nop_out(itt, Sn(100))),
            Op::ScsiCommand(scsi_command(itt, Sn(100), true, false, 512, &[0x28; 10])),
            Op::TaskMgmtRequest(TaskMgmtRequest {
                immediate: true,
                function: 0x81,
                lun: Default::default(),
                itt,
                referenced_task_tag: Itt(1),
                cmd_sn: Sn(100),
                exp_stat_sn: Sn(0),
                ref_cmd_sn: Sn(100),
                exp_data_sn: Sn(0),
            }),
            Op::TextRequest(text_request(itt, Sn(100), false)),
            Op::DataOut(DataOut {
                final_bit: true,
                lun: Default::default(),
                itt,
                ttt: crate::serial::Ttt::RESERVED,
                exp_stat_sn: Sn(0),
                data_sn: Sn(0),
                buffer_offset: 0,
            }),
            Op::LogoutRequest(LogoutRequest { immediate: true, reason_code: 0, itt, cid: 0, cmd_sn: Sn(100), exp_stat_sn: Sn(0) }),
            Op::SnackRequest(SnackRequest { snack_type: 0, lun: Default::default(), itt, ttt_or_snack_tag: 0, exp_stat_sn: Sn(0), beg_run: 0, run_length: 0 }),
        ]
    };
    let first = || pdu(req(true, SEC, OP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None")]));
    // Before any Login Request; after the security stage; in the middle of the initiator's
    // C=1 key list; while the target's long answer is still being fetched.
    for when in 0..4 {
        for op in others() {
            let mut login = Login::new(LoginContext::default());
            let mut policy = Policy::default();
            match when {
                0 => {}
                1 => assert!(run(&mut login, &mut policy, first()).failed.is_none()),
                2 => {
                    let mut r = req(false, SEC, SEC, &[("InitiatorName", INITIATOR)]);
                    r.c = true;
                    assert!(run(&mut login, &mut policy, pdu(r)).failed.is_none());
                }
                _ => {
                    // 150 NotUnderstood answers of ~78 bytes: more than one Login Response
                    let names: Vec<String> = (0..150).map(|i| format!("X-com.example.{i:03}.{}", "k".repeat(40))).collect();
                    let mut keys = vec![("InitiatorName", INITIATOR), ("TargetName", TARGET)];
                    keys.extend(names.iter().map(|k| (k.as_str(), "1")));
                    let out = run(&mut login, &mut policy, pdu(req(false, OP, OP, &keys)));
                    assert!(out.responses[0].0.continue_bit, "the answer continues");
                }
            }
            let opcode = format!("{:?}", op);
            let out = run(&mut login, &mut policy, Pdu::new(op));
            assert_eq!(out.order, "RF", "{when} {opcode}");
            assert_eq!(out.failed, Some(LoginStatus::INVALID_DURING_LOGIN));
            assert_eq!(only_response(&out).0.itt, itt);
            assert!(login.is_finished());
            assert!(run(&mut login, &mut policy, first()).order.is_empty(), "nothing after the end");
        }
    }
}

#[test]
fn a_message_that_is_no_pdu_ends_the_login_at_once() {
    // An iSER Hello during login: Initiator Error, answering the last Login Request.
    let mut login = Login::new(LoginContext { transport: Transport::Iser, ..LoginContext::default() });
    let mut policy = Policy::default();
    run(&mut login, &mut policy, pdu(req(true, SEC, OP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None")])));
    login.handle_unexpected("iSER Hello during login");
    let out = drain(&mut login);
    assert_eq!(out.order, "RF");
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    assert_eq!(only_response(&out).0.itt, Itt(0x10));
    assert!(login.is_finished());
    // before any Login Request there is nothing to answer: the login just ends
    let mut login = Login::new(LoginContext::default());
    login.handle_unexpected("iSER Hello during login");
    let out = drain(&mut login);
    assert_eq!((out.order.as_str(), out.failed), ("F", Some(LoginStatus::INITIATOR_ERROR)));
    assert!(login.is_finished());
}

#[test]
fn too_many_pdus_and_too_much_text() {
    let ctx = LoginContext {
        limits: LoginLimits {
            max_pdus: 3,
            ..LoginLimits::default()
        },
        ..LoginContext::default()
    };
    let mut login = Login::new(ctx);
    let mut policy = Policy::default();
    for _ in 0..3 {
        let out = run(
            &mut login,
            &mut policy,
            pdu(Req {
                t: false,
                c: true,
                csg: SEC,
                nsg: SEC,
                keys: vec![],
            }),
        );
        assert!(out.failed.is_none());
    }
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: SEC,
            nsg: SEC,
            keys: vec![],
        }),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));

    let ctx = LoginContext {
        limits: LoginLimits {
            max_text_bytes: 10_000,
            ..LoginLimits::default()
        },
        ..LoginContext::default()
    };
    let mut login = Login::new(ctx);
    let chunk = vec![b'a'; 8192];
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: SEC,
            nsg: SEC,
            keys: chunk.clone(),
        }),
    );
    assert!(out.failed.is_none());
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: SEC,
            nsg: SEC,
            keys: chunk,
        }),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
}

#[test]
fn duplicate_key_fails_login() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy::default();
    run(
        &mut login,
        &mut policy,
        pdu(req(
            false,
            OP,
            OP,
            &[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("MaxBurstLength", "65536"),
            ],
        )),
    );
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, OP, FFP, &[("MaxBurstLength", "65536")])),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
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

#[test]
fn random_login_pdus_never_panic() {
    let mut seed = 0x9e37_79b9u32;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    let stages = [SEC, OP, Stage::Reserved, FFP];
    let texts: [&[u8]; 6] = [
        b"InitiatorName=iqn.x\0TargetName=iqn.2016-06.io.riser:disk1\0",
        b"AuthMethod=None\0",
        b"\0\0=\0",
        b"CHAP_A=5\0",
        b"MaxBurstLength=0x\0HeaderDigest=\0",
        b"\xff\xfe",
    ];
    for _ in 0..500 {
        let mut login = Login::new(LoginContext::default());
        let mut policy = Policy::default();
        for _ in 0..6 {
            let r = next();
            let t = r & 1 != 0;
            let c = !t && r & 2 != 0;
            let keys = texts[(r as usize >> 4) % texts.len()].to_vec();
            let p = pdu(Req {
                t,
                c,
                csg: stages[(r >> 8) as usize % 4],
                nsg: stages[(r >> 10) as usize % 4],
                keys,
            });
            login.handle(&p, &mut policy);
            drain(&mut login);
        }
    }
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

// ---- CHAP (crate::chap) through the login ------------------------------------------------

mod chap_login {
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
}
