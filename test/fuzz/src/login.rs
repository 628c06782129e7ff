//! The whole target-side login: the TCP framer at login limits feeding `Login::handle`
//! (`handle_malformed` for headers it cannot parse), with a policy whose targets require
//! CHAP (`ChapTarget`) unless the mode says otherwise.
//!
//! Input: `mode`, then the byte stream an initiator sends during login (Login Requests,
//! or anything else), without digests.
//! - `mode` bits 0-1: the target's authentication: 0 CHAP required, 1 CHAP required with
//!   mutual CHAP, 2 CHAP optional, 3 none; bit 2: discovery requires CHAP too; bits 3-4:
//!   the session decision (new, reinstatement, added connection, refused: at the first key
//!   list, or at completion when bit 0x10 of the ISID's last byte is set); bit 5: iSER;
//!   bit 6: digests required; bit 7: CHAP with MD5 only.
//!
//! The fuzzer cannot compute a CHAP response, so the harness does it for these values
//! (each a whole key=value of a Login Request's data):
//! - `CHAP_R=*` / `CHAP_R=#`: the right response (hex / base64) to the target's last
//!   challenge for the CHAP_N of the same PDU (or the first user);
//! - `CHAP_R=~`: the response made with that user's *mutual* secret (a reused secret);
//! - `CHAP_C=@`: the target's own last challenge (a reflection).
//!
//! The target's challenges are deterministic (a counter, not the OS CSPRNG), so a crash
//! replays the same exchange.
//!
//! Checks: every response is a Login Response that encodes and fits 8192 bytes; nothing
//! comes out after the login ended; where authentication is required, resources are never
//! allocated and the login never completes before the authenticator said Success.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use riser_iscsi::chap::{encode_binary, ChapAlgorithm, ChapSecret, ChapTarget, Encoding};
use riser_iscsi::login::{SessionCheck, LOGIN_MAX_DATA_SEGMENT_LENGTH};
use riser_iscsi::negotiate::{DigestPolicy, TargetConfig, Transport};
use riser_iscsi::params::{SessionParams, SessionType};
use riser_iscsi::pdu::Op;
use riser_iscsi::text::{parse_binary, parse_number};
use riser_iscsi::{
    AuthPolicy, AuthStep, Authenticator, Digests, Framer, Login, LoginContext, LoginEvent,
    LoginIdentity, LoginOutput, LoginPolicy, LoginStatus, Pdu, SessionDecision, Sn, TargetInfo,
    TargetLookup,
};

/// The auth group of every fuzzed target.
pub fn secrets() -> Vec<ChapSecret> {
    vec![
        ChapSecret {
            user: "alice".into(),
            secret: "alice-secret-123".into(),
            muser: Some("riser".into()),
            msecret: Some("riser-secret-456".into()),
        },
        ChapSecret {
            user: "bob".into(),
            secret: "bob-secret-7890".into(),
            muser: None,
            msecret: None,
        },
    ]
}

/// The CHAP target, with a counter for a random source.
fn chap(mutual_required: bool, md5_only: bool) -> ChapTarget {
    let mut n: u8 = 0;
    let random = move |buf: &mut [u8]| {
        for b in buf {
            n = n.wrapping_add(0x3b);
            *b = n;
        }
    };
    let t = ChapTarget::with_random(secrets(), mutual_required, Box::new(random));
    if md5_only {
        t.with_algorithms(vec![ChapAlgorithm::Md5])
    } else {
        t
    }
}

/// An authenticator that remembers whether it ever said Success.
struct Watched {
    inner: ChapTarget,
    ok: Arc<AtomicBool>,
}

impl Authenticator for Watched {
    fn method(&self) -> &'static str {
        self.inner.method()
    }

    fn step(&mut self, keys: &[(String, String)], out: &mut riser_iscsi::Pairs) -> AuthStep {
        let s = self.inner.step(keys, out);
        if s == AuthStep::Success {
            self.ok.store(true, Ordering::Relaxed);
        }
        s
    }

    fn failure_reason(&self) -> Option<String> {
        self.inner.failure_reason()
    }
}

struct Policy {
    mode: u8,
    /// Set once an authenticator handed out said Success.
    auth_ok: Arc<AtomicBool>,
    /// Whether the target (or discovery) this login went to requires CHAP.
    required: Option<bool>,
}

impl Policy {
    fn auth(&mut self, discovery: bool) -> AuthPolicy {
        let watched = |mutual: bool, ok: &Arc<AtomicBool>| -> Box<dyn Authenticator> {
            Box::new(Watched {
                inner: chap(mutual, self.mode & 0x80 != 0),
                ok: ok.clone(),
            })
        };
        let (policy, required) = if discovery {
            if self.mode & 4 != 0 {
                (AuthPolicy::Required(watched(false, &self.auth_ok)), true)
            } else {
                (AuthPolicy::None, false)
            }
        } else {
            match self.mode & 3 {
                0 => (AuthPolicy::Required(watched(false, &self.auth_ok)), true),
                1 => (AuthPolicy::Required(watched(true, &self.auth_ok)), true),
                2 => (AuthPolicy::Optional(watched(false, &self.auth_ok)), false),
                _ => (AuthPolicy::None, false),
            }
        };
        self.required = Some(required);
        policy
    }

    fn config(&self) -> TargetConfig {
        let digest = if self.mode & 0x40 != 0 {
            DigestPolicy::Required
        } else {
            DigestPolicy::Allowed
        };
        TargetConfig {
            header_digest: digest,
            data_digest: digest,
            ..TargetConfig::default()
        }
    }
}

impl LoginPolicy for Policy {
    fn lookup_target(&mut self, who: &LoginIdentity) -> TargetLookup {
        let name = who.target_name.clone().unwrap_or_default();
        if name.ends_with(":moved") {
            return TargetLookup::Redirect {
                target_address: "192.0.2.1:3260,1".into(),
                permanent: name.len() % 2 == 0,
            };
        }
        if name.ends_with(":missing") {
            return TargetLookup::Refused(LoginStatus::NOT_FOUND);
        }
        TargetLookup::Found(TargetInfo {
            name,
            alias: Some("fuzz".into()),
            config: self.config(),
            auth: self.auth(false),
        })
    }

    fn discovery(&mut self, _who: &LoginIdentity) -> TargetLookup {
        TargetLookup::Found(TargetInfo {
            name: String::new(),
            alias: None,
            config: self.config(),
            auth: self.auth(true),
        })
    }

    fn check_session(
        &mut self,
        who: &LoginIdentity,
        _target: &TargetInfo,
    ) -> Result<SessionCheck, LoginStatus> {
        match (self.mode >> 3) & 3 {
            2 => Ok(SessionCheck::Join {
                session: SessionParams {
                    session_type: who.session_type,
                    initiator_name: who.initiator_name.clone(),
                    target_name: who.target_name.clone(),
                    ..SessionParams::default()
                },
            }),
            // Refused early or, with bit 0x10 of the ISID's last byte, only at completion.
            3 if who.isid.0[5] & 0x10 == 0 => Err(LoginStatus::TOO_MANY_CONNECTIONS),
            _ => Ok(SessionCheck::Leading),
        }
    }

    fn commit_session(
        &mut self,
        who: &LoginIdentity,
        _target: &TargetInfo,
    ) -> Result<SessionDecision, LoginStatus> {
        match (self.mode >> 3) & 3 {
            0 => Ok(SessionDecision::New { tsih: 0x11 }),
            1 => Ok(SessionDecision::Reinstate {
                tsih: 0x12,
                old_tsih: 0x11,
            }),
            2 => Ok(SessionDecision::AddConnection {
                tsih: who.tsih.max(1),
                session: SessionParams {
                    session_type: who.session_type,
                    initiator_name: who.initiator_name.clone(),
                    target_name: who.target_name.clone(),
                    ..SessionParams::default()
                },
                exp_cmd_sn: Sn(7),
                max_cmd_sn: Sn(70),
            }),
            _ => Err(LoginStatus::TOO_MANY_CONNECTIONS),
        }
    }
}

/// The CHAP keys the target sent last.
#[derive(Default)]
struct Challenge {
    alg: Option<ChapAlgorithm>,
    id: Option<u8>,
    challenge: Option<Vec<u8>>,
    /// The CHAP_C value as sent.
    text: Option<String>,
}

impl Challenge {
    /// Notes CHAP_A, CHAP_I and CHAP_C of a Login Response.
    fn learn(&mut self, data: &[u8]) {
        for item in data.split(|b| *b == 0) {
            let Ok(item) = std::str::from_utf8(item) else {
                continue;
            };
            let Some((k, v)) = item.split_once('=') else {
                continue;
            };
            match k {
                "CHAP_A" => {
                    self.alg = parse_number(v).ok().and_then(ChapAlgorithm::from_id);
                }
                "CHAP_I" => self.id = parse_number(v).ok().and_then(|n| u8::try_from(n).ok()),
                "CHAP_C" => {
                    self.challenge = parse_binary(v).ok();
                    self.text = Some(v.to_string());
                }
                _ => {}
            }
        }
    }

    /// Replaces the placeholder values of a Login Request (see the module docs).
    fn fill_in(&self, data: &[u8]) -> Option<Vec<u8>> {
        let has = |token: &[u8]| data.split(|b| *b == 0).any(|i| i == token);
        let tokens: [&[u8]; 4] = [b"CHAP_R=*", b"CHAP_R=#", b"CHAP_R=~", b"CHAP_C=@"];
        if !tokens.iter().any(|t| has(t)) {
            return None;
        }
        let user = data
            .split(|b| *b == 0)
            .find_map(|i| i.strip_prefix(b"CHAP_N="))
            .and_then(|n| std::str::from_utf8(n).ok())
            .unwrap_or("alice")
            .to_string();
        let all = secrets();
        let entry = all.iter().find(|s| s.user == user).or(all.first());
        let respond = |secret: Option<&str>, enc: Encoding| -> Option<Vec<u8>> {
            let (alg, id, challenge) = (self.alg?, self.id?, self.challenge.as_ref()?);
            let r = alg.response(id, secret?.as_bytes(), challenge);
            Some(encode_binary(&r, enc).into_bytes())
        };
        let mut out: Vec<Vec<u8>> = Vec::new();
        for item in data.split(|b| *b == 0) {
            let value = match item {
                b"CHAP_R=*" => respond(entry.map(|e| e.secret.as_str()), Encoding::Hex),
                b"CHAP_R=#" => respond(entry.map(|e| e.secret.as_str()), Encoding::Base64),
                b"CHAP_R=~" => respond(entry.and_then(|e| e.msecret.as_deref()), Encoding::Hex),
                b"CHAP_C=@" => self.text.clone().map(String::into_bytes),
                _ => None,
            };
            match value {
                Some(v) => {
                    let mut kv = item.get(..7).unwrap_or_default().to_vec();
                    kv.extend_from_slice(&v);
                    out.push(kv);
                }
                None => out.push(item.to_vec()),
            }
        }
        Some(out.join(&0u8))
    }
}

pub fn run(data: &[u8]) {
    drive(data);
}

/// How a login ended: `Some(true)` completed, `Some(false)` failed, `None` still going.
pub fn drive(data: &[u8]) -> Option<bool> {
    let mut data = data;
    let mode = crate::take_u8(&mut data);
    let ctx = LoginContext {
        initiator_address: Some(std::net::IpAddr::from([192, 0, 2, 7])),
        portal_group_tag: 1,
        transport: if mode & 0x20 != 0 {
            Transport::Iser
        } else {
            Transport::Tcp
        },
        initial_stat_sn: Sn(0x1000),
        ..LoginContext::default()
    };
    let mut login = Login::new(ctx);
    let mut policy = Policy {
        mode,
        auth_ok: Arc::new(AtomicBool::new(false)),
        required: None,
    };
    let mut seen = Seen::default();
    let mut framer = Framer::new();
    framer.feed(data);
    loop {
        match framer.next_pdu() {
            Ok(Some(mut pdu)) => {
                if let Some(filled) = seen.challenge.fill_in(&pdu.data) {
                    pdu.bhs.data_segment_length = filled.len() as u32;
                    pdu.data = filled;
                }
                let finished = login.is_finished();
                login.handle(&pdu, &mut policy);
                seen.drain(&mut login, &policy, finished);
            }
            Ok(None) => break,
            Err(e) => {
                let finished = login.is_finished();
                if let Some(h) = e.header() {
                    login.handle_malformed(h);
                    seen.drain(&mut login, &policy, finished);
                }
                if !e.connection_can_continue() {
                    break;
                }
            }
        }
    }
    seen.result
}

#[derive(Default)]
struct Seen {
    challenge: Challenge,
    allocated: bool,
    ended: bool,
    result: Option<bool>,
}

impl Seen {
    fn drain(&mut self, login: &mut Login, policy: &Policy, was_finished: bool) {
        while let Some(out) = login.poll_output() {
            assert!(!was_finished, "output after the login ended: {out:?}");
            assert!(!self.ended, "output after Complete or Failed: {out:?}");
            let authenticated = policy.auth_ok.load(Ordering::Relaxed);
            let required = policy.required == Some(true);
            match out {
                LoginOutput::Transmit(pdu) => self.response(&pdu),
                LoginOutput::Event(LoginEvent::AllocateDatamoverResources) => {
                    assert!(!self.allocated, "resources allocated twice");
                    assert!(
                        !required || authenticated,
                        "resources allocated before authentication"
                    );
                    self.allocated = true;
                }
                LoginOutput::Event(LoginEvent::Complete(outcome)) => {
                    assert!(
                        !required || authenticated,
                        "login completed without authentication: {outcome:?}"
                    );
                    assert!(self.allocated, "completed without allocating resources");
                    if required {
                        assert_eq!(outcome.negotiator.auth_method(), Some("CHAP"));
                    }
                    if outcome.identity.session_type == SessionType::Normal {
                        assert!(outcome.identity.target_name.is_some());
                    }
                    self.ended = true;
                    self.result = Some(true);
                }
                LoginOutput::Event(LoginEvent::Failed { status, .. }) => {
                    assert!(!status.is_success(), "failed with status success");
                    self.ended = true;
                    self.result = Some(false);
                }
            }
        }
    }

    fn response(&mut self, pdu: &Pdu) {
        let Op::LoginResponse(_) = pdu.op() else {
            panic!("the login sent something else than a Login Response: {pdu:?}");
        };
        assert!(
            pdu.data.len() <= LOGIN_MAX_DATA_SEGMENT_LENGTH,
            "Login Response with {} bytes of data",
            pdu.data.len()
        );
        pdu.to_bytes(Digests::default())
            .expect("a Login Response encodes");
        self.challenge.learn(&pdu.data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_iscsi::pdu::{Isid, LoginRequest, Stage};
    use riser_iscsi::text::encode_pairs;
    use riser_iscsi::Itt;

    fn req(t: bool, csg: Stage, nsg: Stage, keys: &[(&str, &str)]) -> Vec<u8> {
        Pdu::with_data(
            Op::LoginRequest(LoginRequest {
                transit_bit: t,
                continue_bit: false,
                csg,
                nsg,
                version_max: 0,
                version_min: 0,
                isid: Isid([0x80, 0, 0, 0x12, 0x34, 0x56]),
                tsih: 0,
                itt: Itt(1),
                cid: 0,
                cmd_sn: Sn(1),
                exp_stat_sn: Sn(0),
            }),
            encode_pairs(keys),
        )
        .to_bytes(Digests::default())
        .unwrap()
    }

    /// A CHAP login with the placeholders: mode 0 (CHAP required), then mutual (mode 1).
    fn chap_login(r: &str, mutual: bool) -> Vec<u8> {
        use Stage::{LoginOperationalNegotiation as Op_, SecurityNegotiation as Sec};
        let mut s = vec![u8::from(mutual)];
        s.extend(req(false, Sec, Sec, &[
            ("InitiatorName", "iqn.1994-05.com.redhat:client"),
            ("TargetName", "iqn.2016-06.io.riser:disk1"),
            ("SessionType", "Normal"),
            ("AuthMethod", "CHAP"),
        ]));
        s.extend(req(false, Sec, Sec, &[("CHAP_A", "7")]));
        let mut keys = vec![("CHAP_N", "alice"), ("CHAP_R", r)];
        if mutual {
            keys.extend([("CHAP_I", "9"), ("CHAP_C", "0x00112233445566778899aabbccddeeff")]);
        }
        s.extend(req(true, Sec, Op_, &keys));
        s.extend(req(true, Op_, Stage::FullFeaturePhase, &[("HeaderDigest", "None")]));
        s
    }

    #[test]
    fn placeholders_reach_full_feature_phase() {
        assert_eq!(drive(&chap_login("*", false)), Some(true));
        assert_eq!(drive(&chap_login("#", false)), Some(true));
        assert_eq!(drive(&chap_login("*", true)), Some(true));
        // A made-up response, the target's mutual secret, a reflected challenge: refused.
        assert_eq!(drive(&chap_login("0x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", false)), Some(false));
        assert_eq!(drive(&chap_login("~", false)), Some(false));
    }
}
