//! The login exchange of the initiator (RFC 7143 §6), free of I/O: [`LoginExchange`] makes
//! the Login Requests and takes the Login Responses, stage by stage, with a
//! [`KeyNegotiation`](super::KeyNegotiation) for the keys and, when [`LoginParams::chap`] is
//! set, a [`ChapInitiator`] for the security stage (RFC 7143 §12.1.3). The transports drive it
//! over their own I/O ([`super::login`]); [`super::PduSession`] hands its PDUs to the caller.

use std::time::Duration;

use riser_iscsi::chap::{ChapInitiator, ChapInitiatorConfig};
use riser_iscsi::pdu::{Isid, LoginRequest, LoginStatus, Op, Stage};
use riser_iscsi::serial::Itt;
use riser_iscsi::text::{encode_pairs, parse_pairs};

use super::negotiate::{login_status_text, KeyNegotiation};
use super::{SessionState, MGMT_ITT};
use crate::url::TargetUrl;

/// The InitiatorName riser-perf logs in with by default.
pub const INITIATOR_NAME: &str = "iqn.2024-01.io.riser:perf";
/// Data segment limit while logging in (RFC 7143 §13.12): the most login text one PDU may
/// carry, either way.
pub const LOGIN_MAX_RECV_DSL: u32 = 8192;
/// Login rounds (request and response, continuations not counted) before giving up.
const MAX_ROUNDS: u32 = 16;

/// Login options of one connection of riser-perf's initiator.
#[derive(Clone, Debug)]
pub struct LoginOptions {
    pub initiator_name: String,
    pub header_digest: bool,
    pub data_digest: bool,
    /// For connect, login, setup commands and logout, each.
    pub timeout: Duration,
    pub isid: [u8; 6],
    /// Log in with CHAP (`--chap`, `--chap-mutual`, `--chap-digest`); None: AuthMethod=None.
    pub chap: Option<ChapInitiatorConfig>,
}

/// SessionType (RFC 7143 §13.21).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionType {
    Normal,
    /// SendTargets only: no TargetName, and only the keys that apply to it are proposed.
    Discovery,
}

/// Who logs in, to what, as which session and connection: the fixed part of the Login
/// Requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginParams {
    pub initiator_name: String,
    /// TargetName (a normal session needs one; a discovery session sends none).
    pub target_name: Option<String>,
    pub session_type: SessionType,
    /// The initiator part of the session id.
    pub isid: [u8; 6],
    /// 0 for a new session; an existing session's TSIH to add a connection to it, or to
    /// reinstate it.
    pub tsih: u16,
    /// The connection id.
    pub cid: u16,
    /// AuthMethod=CHAP with these credentials (and mutual CHAP if they say so); None:
    /// AuthMethod=None.
    pub chap: Option<ChapInitiatorConfig>,
}

impl LoginParams {
    /// A new normal session with `target_name` (TSIH 0, CID 0).
    pub fn normal(initiator_name: &str, target_name: &str, isid: [u8; 6]) -> LoginParams {
        LoginParams {
            initiator_name: initiator_name.to_string(),
            target_name: Some(target_name.to_string()),
            session_type: SessionType::Normal,
            isid,
            tsih: 0,
            cid: 0,
            chap: None,
        }
    }

    /// The same login with CHAP.
    pub fn with_chap(self, chap: ChapInitiatorConfig) -> LoginParams {
        LoginParams {
            chap: Some(chap),
            ..self
        }
    }

    /// What riser-perf's transports log in as: a new normal session to the URL's target.
    pub fn for_url(url: &TargetUrl, opts: &LoginOptions) -> LoginParams {
        LoginParams {
            chap: opts.chap.clone(),
            ..LoginParams::normal(&opts.initiator_name, &url.iqn, opts.isid)
        }
    }
}

/// What to do after a Login Response.
#[derive(Debug)]
pub enum LoginStep {
    /// Send this Login Request, with this data segment (login text), and wait for the next
    /// response.
    Send(LoginRequest, Vec<u8>),
    /// The full-feature phase is reached: the negotiation's outcome (`result`,
    /// `iser_result`). The session state has the first CmdSN and the window.
    Done(KeyNegotiation),
}

/// One login in progress, initiator side: the security stage (AuthMethod=None, or CHAP:
/// CHAP_A, then CHAP_N and CHAP_R, and the target's mutual answer checked), then the
/// operational stage with [`KeyNegotiation::operational_proposal`], answering every key the
/// target offers, following C=1 continuations, up to the full-feature phase.
#[derive(Debug)]
pub struct LoginExchange {
    neg: KeyNegotiation,
    /// CHAP, when the login uses it.
    chap: Option<ChapInitiator>,
    /// The last request sent (a continuation repeats it with T=0 and no text).
    req: LoginRequest,
    /// The text of the response being collected (several PDUs when C=1).
    text: Vec<u8>,
    rounds: u32,
}

impl LoginExchange {
    /// Starts a login: the exchange and the first Login Request (security stage, asking to
    /// go on to the operational stage) with its text. Its CmdSN and ExpStatSN are the
    /// session's.
    pub fn start(
        params: &LoginParams,
        mut neg: KeyNegotiation,
        s: &SessionState,
    ) -> Result<(LoginExchange, LoginRequest, Vec<u8>), String> {
        let mut keys: Vec<(String, String)> =
            vec![("InitiatorName".into(), params.initiator_name.clone())];
        if let Some(t) = &params.target_name {
            keys.push(("TargetName".into(), t.clone()));
        }
        let session_type = match params.session_type {
            SessionType::Normal => "Normal",
            SessionType::Discovery => "Discovery",
        };
        keys.push(("SessionType".into(), session_type.into()));
        // With credentials, CHAP only: a target that does not authenticate us (or, for mutual
        // CHAP, itself) is refused rather than silently used without.
        let method = if params.chap.is_some() { "CHAP" } else { "None" };
        keys.push(("AuthMethod".into(), method.into()));
        neg.proposed.push("AuthMethod".into());
        neg.chap = params.chap.is_some();
        neg.discovery = params.session_type == SessionType::Discovery;
        let req = LoginRequest {
            transit_bit: true,
            continue_bit: false,
            csg: Stage::SecurityNegotiation,
            nsg: Stage::LoginOperationalNegotiation,
            version_max: 0,
            version_min: 0,
            isid: Isid(params.isid),
            tsih: params.tsih,
            itt: Itt(MGMT_ITT),
            cid: params.cid,
            cmd_sn: s.cmd_sn,
            exp_stat_sn: s.exp_stat_sn,
        };
        let mut ex = LoginExchange {
            neg,
            chap: params.chap.clone().map(ChapInitiator::new),
            req,
            text: Vec::new(),
            rounds: 0,
        };
        let (req, text) = ex.round(Stage::SecurityNegotiation, true, &keys, s)?;
        Ok((ex, req, text))
    }

    /// The request of a new round in stage `csg` offering `keys`, asking to go on to the
    /// next stage if `transit`.
    fn round(
        &mut self,
        csg: Stage,
        transit: bool,
        keys: &[(String, String)],
        s: &SessionState,
    ) -> Result<(LoginRequest, Vec<u8>), String> {
        self.rounds += 1;
        self.text.clear();
        let r = &mut self.req;
        r.transit_bit = transit;
        r.csg = csg;
        r.nsg = if csg == Stage::SecurityNegotiation {
            Stage::LoginOperationalNegotiation
        } else {
            Stage::FullFeaturePhase
        };
        r.cmd_sn = s.cmd_sn;
        r.exp_stat_sn = s.exp_stat_sn;
        let text = encode_pairs(keys);
        if text.len() > LOGIN_MAX_RECV_DSL as usize {
            return Err("login text too long".into());
        }
        Ok((r.clone(), text))
    }

    /// Takes one PDU received during login (`data`: its data segment): the next request to
    /// send, or the end of the login. Sets the session's ExpStatSN, and at the end its
    /// CmdSN and window. Err: why the login failed (a refusal, a protocol error).
    pub fn on_response(
        &mut self,
        s: &mut SessionState,
        op: &Op,
        data: &[u8],
    ) -> Result<LoginStep, String> {
        let Op::LoginResponse(resp) = op else {
            return Err(format!("expected a Login Response, got {:?}", op.opcode()));
        };
        if resp.status.class != 0 {
            let mut e = login_status_text(resp.status.class, resp.status.detail);
            if resp.status == LoginStatus::AUTHENTICATION_FAILURE && self.chap.is_none() {
                e.push_str(": does the target require CHAP? (--chap USER:SECRET)");
            }
            return Err(e);
        }
        s.exp_stat_sn = resp.stat_sn.next();
        self.text.extend_from_slice(data);
        if resp.continue_bit {
            // The target continues its text in further responses (C=1): ask for the next.
            self.text.truncate(64 * 1024);
            self.req.transit_bit = false;
            self.req.exp_stat_sn = s.exp_stat_sn;
            return Ok(LoginStep::Send(self.req.clone(), Vec::new()));
        }
        let pairs =
            parse_pairs(&self.text).map_err(|e| format!("bad login text from the target: {e}"))?;
        let (chap_keys, pairs): (Vec<_>, Vec<_>) =
            pairs.into_iter().partition(|(k, _)| k.starts_with("CHAP_"));
        let mut answers = self.neg.take_response(&pairs)?;
        self.req.tsih = resp.tsih;
        if self.req.csg == Stage::SecurityNegotiation {
            if let Some(keys) = self.chap_step(&pairs, &chap_keys, resp.transit_bit)? {
                // CHAP goes on: stay in the security stage until our response is out.
                answers.extend(keys);
                if self.rounds >= MAX_ROUNDS {
                    return Err(format!("login did not finish in {MAX_ROUNDS} rounds"));
                }
                let transit = self.chap.as_ref().is_some_and(ChapInitiator::answered);
                let (req, text) = self.round(Stage::SecurityNegotiation, transit, &answers, s)?;
                return Ok(LoginStep::Send(req, text));
            }
        } else if !chap_keys.is_empty() {
            return Err("the target sent CHAP keys outside the security stage".into());
        }
        let csg = if resp.transit_bit {
            match resp.nsg {
                Stage::FullFeaturePhase => {
                    if !answers.is_empty() {
                        return Err(format!(
                            "the target ended login while offering keys {:?}",
                            answers.iter().map(|(k, _)| k).collect::<Vec<_>>()
                        ));
                    }
                    s.cmd_sn = resp.exp_cmd_sn;
                    s.exp_cmd_sn = resp.exp_cmd_sn;
                    s.max_cmd_sn = resp.max_cmd_sn;
                    let neg = std::mem::replace(&mut self.neg, KeyNegotiation::new(false, false));
                    return Ok(LoginStep::Done(neg));
                }
                Stage::LoginOperationalNegotiation => {
                    answers.extend(self.neg.operational_proposal());
                    Stage::LoginOperationalNegotiation
                }
                other => return Err(format!("the target moved login to stage {other:?}")),
            }
        } else {
            // The target stays in this stage: answer what it offered.
            self.req.csg
        };
        if self.rounds >= MAX_ROUNDS {
            return Err(format!("login did not finish in {MAX_ROUNDS} rounds"));
        }
        let (req, text) = self.round(csg, true, &answers, s)?;
        Ok(LoginStep::Send(req, text))
    }

    /// CHAP in a security-stage response (`pairs`: its other keys; `transit`: its T bit):
    /// the CHAP keys to send next while the exchange goes on, None once it is over (or
    /// without CHAP).
    fn chap_step(
        &mut self,
        pairs: &[(String, String)],
        chap_keys: &[(String, String)],
        transit: bool,
    ) -> Result<Option<Vec<(String, String)>>, String> {
        let Some(chap) = self.chap.as_mut() else {
            if !chap_keys.is_empty() {
                return Err("the target sent CHAP keys but no CHAP credentials were given (--chap)".into());
            }
            return Ok(None);
        };
        let chap_err = |e: riser_iscsi::chap::ChapError| format!("CHAP: {e}");
        if chap.is_done() {
            if !chap_keys.is_empty() {
                return Err("the target sent CHAP keys after CHAP ended".into());
            }
            return Ok(None);
        }
        if chap.answered() {
            // The target's answer to our response: its own (mutual CHAP), or nothing.
            chap.verify(chap_keys).map_err(chap_err)?;
            return Ok(None);
        }
        if transit {
            return Err("the target left the security stage before CHAP was done".into());
        }
        if !chap.offered() {
            if !pairs.iter().any(|(k, v)| k == "AuthMethod" && v == "CHAP") {
                return Err("the target did not answer AuthMethod=CHAP".into());
            }
            if !chap_keys.is_empty() {
                return Err("the target sent CHAP keys before CHAP_A".into());
            }
            return chap.offer().map(Some).map_err(chap_err);
        }
        chap.respond(chap_keys).map(Some).map_err(chap_err)
    }
}

#[cfg(test)]
mod tests;
