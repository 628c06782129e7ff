//! Target-side login of one connection, sans IO (RFC 7143 §6.3, §11.12, §11.13).
//!
//! Feed every PDU received during login to [`Login::handle`] and drain
//! [`Login::poll_output`]: Login Response PDUs to send and events, in the order they must
//! happen. The machine walks the stages (SecurityNegotiation → LoginOperationalNegotiation
//! → FullFeaturePhase) following the CSG/NSG fields and the T (transit) and C (continue)
//! bits, assembles keys that span PDUs, negotiates them ([`crate::negotiate`]) and asks the
//! caller, through [`LoginPolicy`], for what it cannot know: which target the name means
//! for this initiator, and whether the connection starts a new session, joins one or
//! reinstates one. The session is only checked at the first key list
//! ([`LoginPolicy::check_session`]) and committed when the final Login Response is built
//! ([`LoginPolicy::commit_session`]): a login that has not passed its security stage changes
//! no session. Authentication plugs in through [`Authenticator`] (AuthMethod=None
//! needs none; [`crate::chap::ChapTarget`] is CHAP).
//!
//! Events (RFC 5047 / RFC 7145 datamover rules):
//! - [`LoginEvent::AllocateDatamoverResources`] once the login has reached operational
//!   negotiation, i.e. after the security stage if there is one and never before: the
//!   datamover (iSER) may then allocate its QP resources and post the receive ring;
//! - then the final Login Response is output, then [`LoginEvent::Complete`]: the caller
//!   sends that response, then enables the datamover (full feature phase);
//! - on failure, the Login Response carrying the status is output, then
//!   [`LoginEvent::Failed`]: the caller sends it and closes the connection (§11.13.5).

use std::collections::VecDeque;
use std::fmt;
use std::net::IpAddr;

use crate::negotiate::{KeyPhase, Negotiator, TargetConfig, Transport};
use crate::params::{ConnectionParams, SessionParams, SessionType};
use crate::pdu::{
    raw_itt, Isid, LoginRequest, LoginResponse, LoginStatus, Op, Pdu, Stage, BHS_LEN,
};
use crate::serial::{Itt, Sn};
use crate::text::{
    encode_pairs, Pairs, TextAssembler, TextOutbox, DEFAULT_MAX_TEXT_BYTES, DEFAULT_MAX_TEXT_PDUS,
};

/// Largest data segment of a Login PDU (RFC 7143 §13.12: 8192 during login).
pub const LOGIN_MAX_DATA_SEGMENT_LENGTH: usize = 8192;
/// The only iSCSI version there is (RFC 7143 §11.12.4).
pub const ISCSI_VERSION: u8 = 0x00;
/// Longest iSCSI name (RFC 7143 §4.2.7.1).
pub const MAX_ISCSI_NAME_LEN: usize = 223;
/// The Login Request opcode (RFC 7143 §11.2.1.2), for headers that did not decode.
const LOGIN_REQUEST_OPCODE: u8 = 0x03;

/// Limits that make a hostile login fail cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginLimits {
    /// Login Requests per login, all stages together.
    pub max_pdus: usize,
    /// Text bytes of one key list (a C=1 sequence).
    pub max_text_bytes: usize,
    /// PDUs of one C=1 sequence.
    pub max_text_pdus: usize,
}

impl Default for LoginLimits {
    fn default() -> Self {
        LoginLimits {
            max_pdus: 64,
            max_text_bytes: DEFAULT_MAX_TEXT_BYTES,
            max_text_pdus: DEFAULT_MAX_TEXT_PDUS,
        }
    }
}

/// What the caller knows about the connection before the first PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginContext {
    pub initiator_address: Option<IpAddr>,
    /// Target Portal Group Tag of the portal the connection came in on.
    pub portal_group_tag: u16,
    pub transport: Transport,
    /// StatSN of the first Login Response: the connection's starting StatSN (§11.13.4).
    pub initial_stat_sn: Sn,
    pub limits: LoginLimits,
}

impl Default for LoginContext {
    fn default() -> Self {
        LoginContext {
            initiator_address: None,
            portal_group_tag: 1,
            transport: Transport::Tcp,
            initial_stat_sn: Sn(0),
            limits: LoginLimits::default(),
        }
    }
}

/// Who is logging in, known once the first key list is complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginIdentity {
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// None in discovery sessions.
    pub target_name: Option<String>,
    pub session_type: SessionType,
    pub isid: Isid,
    /// 0: a new session (or a reinstatement); otherwise the session to join.
    pub tsih: u16,
    pub cid: u16,
    pub initiator_address: Option<IpAddr>,
    pub portal_group_tag: u16,
    pub transport: Transport,
}

/// One authentication method (RFC 7143 §12). CHAP implements this.
pub trait Authenticator: Send {
    /// The AuthMethod value, e.g. "CHAP".
    fn method(&self) -> &'static str;

    /// One security-stage step: `keys` are the method's keys from the initiator (for CHAP,
    /// the CHAP_* keys; empty on the step that selected the method); keys to send go to
    /// `out`.
    fn step(&mut self, keys: &[(String, String)], out: &mut Pairs) -> AuthStep;

    /// After [`AuthStep::Failure`]: why, for the log line (never a secret).
    fn failure_reason(&self) -> Option<String> {
        None
    }

    /// After [`AuthStep::Failure`]: the Login Response status. Authentication Failure
    /// (0x0201) unless the method knows better (e.g. Authorization Failure, 0x0202, for a
    /// user that proved its secret but may not log in as this initiator).
    fn failure_status(&self) -> LoginStatus {
        LoginStatus::AUTHENTICATION_FAILURE
    }
}

/// Progress of an [`Authenticator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStep {
    /// More exchanges are needed.
    Continue,
    /// The initiator is authenticated (and the target, for mutual CHAP).
    Success,
    /// Login fails with Authentication Failure (0x0201).
    Failure,
}

/// How a target authenticates initiators.
pub enum AuthPolicy {
    /// AuthMethod=None only.
    None,
    /// The method if the initiator offers it, else None.
    Optional(Box<dyn Authenticator>),
    /// The method or no login.
    Required(Box<dyn Authenticator>),
}

impl fmt::Debug for AuthPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthPolicy::None => write!(f, "None"),
            AuthPolicy::Optional(a) => write!(f, "Optional({})", a.method()),
            AuthPolicy::Required(a) => write!(f, "Required({})", a.method()),
        }
    }
}

/// The target a login goes to, as the caller's policy found it.
#[derive(Debug)]
pub struct TargetInfo {
    /// The target's iSCSI name; empty for discovery.
    pub name: String,
    pub alias: Option<String>,
    pub config: TargetConfig,
    pub auth: AuthPolicy,
}

impl TargetInfo {
    /// What a discovery session runs with when the policy has no special settings.
    pub fn discovery() -> TargetInfo {
        TargetInfo {
            name: String::new(),
            alias: None,
            config: TargetConfig::default(),
            auth: AuthPolicy::None,
        }
    }
}

/// The policy's answer for a target name.
#[derive(Debug)]
pub enum TargetLookup {
    Found(TargetInfo),
    /// Login Response 0x0101 / 0x0102 with `TargetAddress` (RFC 7143 §11.13.5).
    Redirect {
        target_address: String,
        permanent: bool,
    },
    /// Login fails with this status (0x0203 not found, 0x0202 not authorized, ...).
    Refused(LoginStatus),
}

/// Where the connection goes, decided by the caller who knows all sessions
/// (RFC 7143 §6.3.1 - §6.3.5: ISID and TSIH rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionDecision {
    /// TSIH=0 and no session with this ISID to this target: a new session with `tsih`.
    New { tsih: u16 },
    /// TSIH=0 and a session with this ISID exists: session reinstatement; the caller
    /// closes `old_tsih` (ERL 0, RFC 7143 §6.3.5) and the new session gets `tsih`.
    Reinstate { tsih: u16, old_tsih: u16 },
    /// TSIH≠0: the connection joins that session (or replaces a connection with the same
    /// CID: connection reinstatement). Its parameters and CmdSN window are the session's.
    AddConnection {
        tsih: u16,
        session: SessionParams,
        exp_cmd_sn: Sn,
        max_cmd_sn: Sn,
    },
}

impl SessionDecision {
    pub fn tsih(&self) -> u16 {
        match self {
            SessionDecision::New { tsih }
            | SessionDecision::Reinstate { tsih, .. }
            | SessionDecision::AddConnection { tsih, .. } => *tsih,
        }
    }
}

/// What the first key list may lead to, as [`LoginPolicy::check_session`] sees it before any
/// authentication: the negotiation needs to know whether the connection leads a session or
/// joins one (and then that session's parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCheck {
    /// TSIH=0: the connection leads a new session (or one that will reinstate an old one).
    Leading,
    /// TSIH≠0: the connection joins this existing session, with its parameters.
    Join { session: SessionParams },
}

/// What the caller decides during login.
///
/// The session is decided in two steps, so that a login that has not passed its security
/// stage changes nothing (LIO's rule; RFC 7143 §6.3.5 leaves the moment open): at the first
/// key list [`Self::check_session`] only looks (target found, session to join exists,
/// limits: a login that cannot succeed fails early), and when the final Login Response is
/// built (security and operational stages passed) [`Self::commit_session`] acts: it creates,
/// reinstates (closing the old session's connections) or joins (closing a connection with the
/// same CID).
pub trait LoginPolicy {
    /// A normal session names a target: find it and check this initiator (name, address,
    /// portal group) may reach it.
    fn lookup_target(&mut self, who: &LoginIdentity) -> TargetLookup;

    /// A discovery session: allowed? with which settings and authentication?
    fn discovery(&mut self, _who: &LoginIdentity) -> TargetLookup {
        TargetLookup::Found(TargetInfo::discovery())
    }

    /// At the first key list, before authentication: could this login lead or join a session
    /// (0x0206 too many connections, 0x0208 can't include in session, 0x020a session does
    /// not exist, 0x0302 out of resources)? MUST have no side effect: the peer is not
    /// authenticated yet.
    fn check_session(
        &mut self,
        who: &LoginIdentity,
        target: &TargetInfo,
    ) -> Result<SessionCheck, LoginStatus>;

    /// The login completes (its final Login Response is being built): new session, session
    /// reinstatement or added connection, now; the same statuses as `check_session` when
    /// things changed since. The decision must be of the kind the check announced
    /// ([`SessionCheck::Leading`]: New or Reinstate; [`SessionCheck::Join`]: AddConnection).
    fn commit_session(
        &mut self,
        who: &LoginIdentity,
        target: &TargetInfo,
    ) -> Result<SessionDecision, LoginStatus>;
}

/// The result of a successful login: everything the connection needs in full feature phase.
#[derive(Debug)]
pub struct LoginOutcome {
    pub identity: LoginIdentity,
    pub target_alias: Option<String>,
    pub decision: SessionDecision,
    pub session: SessionParams,
    pub connection: ConnectionParams,
    /// The negotiator, kept for Text negotiations in full feature phase.
    pub negotiator: Negotiator,
    /// StatSN of the next PDU the target sends on this connection.
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
}

impl LoginOutcome {
    pub fn tsih(&self) -> u16 {
        self.decision.tsih()
    }
}

/// Events for the caller.
#[derive(Debug)]
pub enum LoginEvent {
    /// Allocate_Connection_Resources (RFC 5047 §7.1): the login got past any security
    /// stage; allocate QP/receive resources before the final Login Response.
    AllocateDatamoverResources,
    /// The final Login Response has been output: send it, then Enable_Datamover.
    Complete(Box<LoginOutcome>),
    /// The Login Response with this status has been output: send it and close.
    Failed { status: LoginStatus, reason: String },
}

/// Output of the state machine, in order.
#[derive(Debug)]
pub enum LoginOutput {
    Transmit(Pdu),
    Event(LoginEvent),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Negotiating,
    Done,
    Failed,
}

/// Fields that must not change between the Login Requests of one login.
#[derive(Debug, Clone, Copy)]
struct FirstRequest {
    isid: Isid,
    tsih: u16,
    cid: u16,
    cmd_sn: Sn,
}

/// The login state machine of one connection.
pub struct Login {
    ctx: LoginContext,
    state: State,
    /// The current stage: CSG of the next request must equal it.
    stage: Stage,
    first: Option<FirstRequest>,
    pdus: usize,
    text: TextAssembler,
    /// Response text not yet sent (our C=1 sequence).
    outbox: TextOutbox,
    /// Transit accepted but held back while the outbox drains.
    deferred_transit: Option<Stage>,
    identity: Option<LoginIdentity>,
    target: Option<TargetInfo>,
    /// What `check_session` said at the first key list; the decision itself comes at
    /// completion (`commit_session`).
    check: Option<SessionCheck>,
    negotiator: Option<Negotiator>,
    auth_done: bool,
    resources_announced: bool,
    stat_sn: Sn,
    /// ITT of the last Login Request, for an answer to something that is no PDU.
    last_itt: Option<Itt>,
    output: VecDeque<LoginOutput>,
}

impl fmt::Debug for Login {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Login")
            .field("state", &self.state)
            .field("stage", &self.stage)
            .field("pdus", &self.pdus)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// A failure: the status and a line for the log.
struct Fail(LoginStatus, String);

fn fail<T>(status: LoginStatus, reason: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(status, reason.into()))
}

impl Login {
    pub fn new(ctx: LoginContext) -> Login {
        let text = TextAssembler::new(ctx.limits.max_text_bytes, ctx.limits.max_text_pdus);
        Login {
            stat_sn: ctx.initial_stat_sn,
            ctx,
            state: State::Negotiating,
            stage: Stage::SecurityNegotiation,
            first: None,
            pdus: 0,
            text,
            outbox: TextOutbox::default(),
            deferred_transit: None,
            identity: None,
            target: None,
            check: None,
            negotiator: None,
            auth_done: false,
            resources_announced: false,
            last_itt: None,
            output: VecDeque::new(),
        }
    }

    /// The next response to send or event to act on.
    pub fn poll_output(&mut self) -> Option<LoginOutput> {
        self.output.pop_front()
    }

    /// True once the login has completed or failed; later PDUs are ignored.
    pub fn is_finished(&self) -> bool {
        self.state != State::Negotiating
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Handle one PDU received during login.
    pub fn handle(&mut self, pdu: &Pdu, policy: &mut dyn LoginPolicy) {
        if self.is_finished() {
            log::debug!(
                "login: PDU {:?} after the login ended, ignored",
                pdu.opcode()
            );
            return;
        }
        let Op::LoginRequest(req) = pdu.op() else {
            // RFC 7143 §11.13.5: 0x020b "invalid request type during login".
            let itt = pdu.itt();
            self.fail(
                itt,
                None,
                Fail(
                    LoginStatus::INVALID_DURING_LOGIN,
                    format!("{:?} during login", pdu.opcode()),
                ),
            );
            return;
        };
        self.last_itt = Some(req.itt);
        if let Err(f) = self.request(req, &pdu.data, policy) {
            self.fail(req.itt, Some(req), f);
        }
    }

    /// A header the framer or the transport could not decode during login (e.g. T and C both
    /// set, RFC 7143 §11.12.2): answer at once and end the login. A Login Request gets
    /// Initiator Error (0x0200); any other opcode Invalid During Login (0x020b, §11.13.5), as
    /// a decodable one does in [`Self::handle`].
    pub fn handle_malformed(&mut self, header: &[u8; BHS_LEN]) {
        if self.is_finished() {
            return;
        }
        let opcode = header[0] & 0x3f;
        let itt = raw_itt(header);
        if opcode != LOGIN_REQUEST_OPCODE {
            let reason = format!("undecodable PDU (opcode {opcode:#04x}) during login");
            self.fail(itt, None, Fail(LoginStatus::INVALID_DURING_LOGIN, reason));
            return;
        }
        // The response names the session the request named (its ISID and TSIH, RFC 7143
        // §11.13), also when this is the first request.
        let isid = Isid([header[8], header[9], header[10], header[11], header[12], header[13]]);
        let tsih = u16::from_be_bytes([header[14], header[15]]);
        self.fail_as(itt, Some((isid, tsih)), None, Fail(LoginStatus::INITIATOR_ERROR, "malformed Login Request".into()));
    }

    /// Something that is no iSCSI PDU arrived during login (an iSER Hello on InfiniBand or
    /// RoCE, a message too short for a header): the login ends at once, with Initiator Error
    /// (0x0200) answering the last Login Request, or with no response if none came yet.
    pub fn handle_unexpected(&mut self, reason: impl Into<String>) {
        if self.is_finished() {
            return;
        }
        let reason = reason.into();
        match self.last_itt {
            Some(itt) => self.fail(itt, None, Fail(LoginStatus::INITIATOR_ERROR, reason)),
            None => {
                log::info!("login failed: {reason} (no Login Request to answer)");
                self.state = State::Failed;
                self.output.push_back(LoginOutput::Event(LoginEvent::Failed { status: LoginStatus::INITIATOR_ERROR, reason }));
            }
        }
    }

    fn request(
        &mut self,
        req: &LoginRequest,
        data: &[u8],
        policy: &mut dyn LoginPolicy,
    ) -> Result<(), Fail> {
        self.pdus += 1;
        if self.pdus > self.ctx.limits.max_pdus {
            return fail(LoginStatus::INITIATOR_ERROR, "too many Login Requests");
        }
        self.check_header(req)?;

        // Our own C=1 sequence: the initiator fetches the rest with empty requests.
        if !self.outbox.is_empty() {
            if !data.is_empty() {
                return fail(
                    LoginStatus::INITIATOR_ERROR,
                    "data while the target's text continues",
                );
            }
            let transit = self
                .deferred_transit
                .filter(|nsg| req.transit_bit && req.nsg == *nsg);
            self.send_text(req, transit, policy);
            return Ok(());
        }

        // RFC 7143 §11.12.2: keys may span PDUs with C=1; each such PDU gets an empty
        // Login Response and the keys are processed when C=0 arrives.
        let pairs = match self.text.push(data, req.continue_bit) {
            Ok(Some(pairs)) => pairs,
            Ok(None) => {
                self.respond_with(req, None, Vec::new(), policy);
                return Ok(());
            }
            Err(e) => return fail(LoginStatus::INITIATOR_ERROR, format!("login text: {e}")),
        };

        let mut out: Pairs = Vec::new();
        if self.identity.is_none() {
            self.establish(req, &pairs, policy, &mut out)?;
        }
        let phase = KeyPhase::from_stage(self.stage);
        let (auth_keys, keys): (Pairs, Pairs) =
            pairs.into_iter().partition(|(k, _)| k.starts_with("CHAP_"));
        let Some(neg) = self.negotiator.as_mut() else {
            return fail(LoginStatus::TARGET_ERROR, "no negotiator");
        };
        let answers = neg
            .respond(phase, &keys)
            .map_err(|e| Fail(LoginStatus::INITIATOR_ERROR, e.to_string()))?;
        out.extend(answers);

        if self.stage == Stage::SecurityNegotiation {
            self.authenticate(&auth_keys, &mut out)?;
        } else if !auth_keys.is_empty() {
            return fail(
                LoginStatus::INITIATOR_ERROR,
                "CHAP keys outside the security stage",
            );
        }

        if self.stage == Stage::LoginOperationalNegotiation {
            // RFC 7145 §6.3: on iSER, RDMAExtensions=Yes goes in the first operational-stage
            // response, not only once the initiator asks for full-feature phase.
            if let Some(neg) = self.negotiator.as_mut() {
                out.extend(neg.operational_offers());
            }
        }
        let transit = if req.transit_bit {
            self.may_transit(req.nsg, &mut out)?
        } else {
            None
        };
        if self.stage == Stage::LoginOperationalNegotiation {
            // Only operational-stage responses carry our declarations: initiators refuse
            // operational keys in a security-stage response (open-iscsi does).
            if let Some(neg) = self.negotiator.as_mut() {
                out.extend(neg.declarations());
            }
        }
        self.outbox = TextOutbox::new(encode_pairs(&out));
        self.deferred_transit = transit;
        self.send_text(req, transit, policy);
        Ok(())
    }

    /// Header checks of RFC 7143 §11.12: version, stages, fields that must not change.
    fn check_header(&mut self, req: &LoginRequest) -> Result<(), Fail> {
        match self.first {
            None => {
                // RFC 7143 §11.12.4: version 0x00 is the only one; 0x0205 otherwise.
                if req.version_min > ISCSI_VERSION {
                    return fail(
                        LoginStatus::UNSUPPORTED_VERSION,
                        format!("Version-min {}", req.version_min),
                    );
                }
                match req.csg {
                    Stage::SecurityNegotiation | Stage::LoginOperationalNegotiation => {
                        self.stage = req.csg
                    }
                    _ => {
                        return fail(
                            LoginStatus::INITIATOR_ERROR,
                            format!("first CSG {:?}", req.csg),
                        )
                    }
                }
                self.first = Some(FirstRequest {
                    isid: req.isid,
                    tsih: req.tsih,
                    cid: req.cid,
                    cmd_sn: req.cmd_sn,
                });
            }
            Some(first) => {
                if first.isid != req.isid || first.tsih != req.tsih || first.cid != req.cid {
                    return fail(
                        LoginStatus::INITIATOR_ERROR,
                        "ISID, TSIH or CID changed during login",
                    );
                }
                if req.csg != self.stage {
                    return fail(
                        LoginStatus::INITIATOR_ERROR,
                        format!("CSG {:?} but the login is in {:?}", req.csg, self.stage),
                    );
                }
            }
        }
        if req.transit_bit {
            // Stages only move forward (RFC 7143 §6.3, §11.12.3).
            let forward = matches!(
                (req.csg, req.nsg),
                (
                    Stage::SecurityNegotiation,
                    Stage::LoginOperationalNegotiation
                ) | (Stage::SecurityNegotiation, Stage::FullFeaturePhase)
                    | (Stage::LoginOperationalNegotiation, Stage::FullFeaturePhase)
            );
            if !forward {
                return fail(
                    LoginStatus::INITIATOR_ERROR,
                    format!("transit {:?} -> {:?}", req.csg, req.nsg),
                );
            }
        }
        if req.transit_bit && req.continue_bit {
            return fail(LoginStatus::INITIATOR_ERROR, "T and C both set");
        }
        Ok(())
    }

    /// First complete key list: who is this, which target, which session.
    fn establish(
        &mut self,
        req: &LoginRequest,
        pairs: &Pairs,
        policy: &mut dyn LoginPolicy,
        out: &mut Pairs,
    ) -> Result<(), Fail> {
        let find = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        // RFC 7143 §13.6: InitiatorName MUST be in the first Login Request.
        let Some(initiator_name) = find("InitiatorName").filter(|n| !n.is_empty()) else {
            return fail(LoginStatus::MISSING_PARAMETER, "no InitiatorName");
        };
        if initiator_name.len() > MAX_ISCSI_NAME_LEN {
            return fail(
                LoginStatus::INITIATOR_ERROR,
                "InitiatorName longer than 223 bytes",
            );
        }
        let session_type = match find("SessionType") {
            None => SessionType::Normal,
            Some(v) => match SessionType::parse(&v) {
                Some(t) => t,
                None => {
                    return fail(
                        LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
                        format!("SessionType={v}"),
                    )
                }
            },
        };
        let target_name = find("TargetName");
        // RFC 7143 §13.4: TargetName MUST be sent for a normal session.
        let named = matches!(target_name.as_deref(), Some(n) if !n.is_empty());
        if session_type == SessionType::Normal && !named {
            return fail(
                LoginStatus::MISSING_PARAMETER,
                "no TargetName in a normal session",
            );
        }
        let identity = LoginIdentity {
            initiator_name,
            initiator_alias: find("InitiatorAlias"),
            target_name: if session_type == SessionType::Normal {
                target_name
            } else {
                None
            },
            session_type,
            isid: req.isid,
            tsih: req.tsih,
            cid: req.cid,
            initiator_address: self.ctx.initiator_address,
            portal_group_tag: self.ctx.portal_group_tag,
            transport: self.ctx.transport,
        };
        let lookup = match session_type {
            SessionType::Normal => policy.lookup_target(&identity),
            SessionType::Discovery => policy.discovery(&identity),
        };
        let target = match lookup {
            TargetLookup::Found(t) => t,
            TargetLookup::Refused(status) => return fail(status, "refused by policy"),
            TargetLookup::Redirect {
                target_address,
                permanent,
            } => {
                let status = if permanent {
                    LoginStatus::TARGET_MOVED_PERMANENTLY
                } else {
                    LoginStatus::TARGET_MOVED_TEMPORARILY
                };
                self.redirect(req, status, target_address);
                return Err(Fail(status, "redirected".into()));
            }
        };
        // Only a look at the session table: nothing changes before the login completes.
        let check = policy
            .check_session(&identity, &target)
            .map_err(|s| Fail(s, "session refused".into()))?;
        let (leading, existing) = match &check {
            SessionCheck::Join { session } => (false, Some(session.clone())),
            SessionCheck::Leading => (true, None),
        };
        if matches!(target.auth, AuthPolicy::Required(_))
            && self.stage != Stage::SecurityNegotiation
        {
            // Authentication is required and the initiator skipped the security stage.
            return fail(
                LoginStatus::AUTHENTICATION_FAILURE,
                "security stage skipped",
            );
        }
        let mut neg = Negotiator::new(
            target.config.clone(),
            self.ctx.transport,
            session_type,
            leading,
            existing,
        );
        neg.set_auth_methods(match &target.auth {
            AuthPolicy::None => vec!["None"],
            AuthPolicy::Optional(a) => vec![a.method(), "None"],
            AuthPolicy::Required(a) => vec![a.method()],
        });
        // RFC 7143 §13.9: the target returns TargetPortalGroupTag in the first Login
        // Response of a normal session; TargetAlias may go with it.
        if session_type == SessionType::Normal {
            out.push((
                "TargetPortalGroupTag".into(),
                self.ctx.portal_group_tag.to_string(),
            ));
            if let Some(alias) = &target.alias {
                out.push(("TargetAlias".into(), alias.clone()));
            }
        }
        self.identity = Some(identity);
        self.target = Some(target);
        self.check = Some(check);
        self.negotiator = Some(neg);
        if self.stage == Stage::LoginOperationalNegotiation {
            // No security stage: the login has reached operational negotiation now.
            self.announce_resources();
        }
        Ok(())
    }

    /// Security stage: run the chosen method (RFC 7143 §12).
    fn authenticate(&mut self, auth_keys: &Pairs, out: &mut Pairs) -> Result<(), Fail> {
        if self.auth_done {
            if !auth_keys.is_empty() {
                return fail(
                    LoginStatus::INITIATOR_ERROR,
                    "CHAP keys after authentication",
                );
            }
            return Ok(());
        }
        let method = self
            .negotiator
            .as_ref()
            .and_then(|n| n.auth_method())
            .map(str::to_owned);
        match method.as_deref() {
            None => {
                if !auth_keys.is_empty() {
                    return fail(LoginStatus::INITIATOR_ERROR, "CHAP keys before AuthMethod");
                }
            }
            Some("None") => {
                if !auth_keys.is_empty() {
                    return fail(
                        LoginStatus::INITIATOR_ERROR,
                        "CHAP keys with AuthMethod=None",
                    );
                }
                self.auth_done = true;
            }
            Some(m) => {
                let auth = match self.target.as_mut().map(|t| &mut t.auth) {
                    Some(AuthPolicy::Optional(a)) | Some(AuthPolicy::Required(a))
                        if a.method() == m =>
                    {
                        a
                    }
                    _ => {
                        return fail(
                            LoginStatus::TARGET_ERROR,
                            format!("no authenticator for {m}"),
                        )
                    }
                };
                match auth.step(auth_keys, out) {
                    AuthStep::Continue => {}
                    AuthStep::Success => self.auth_done = true,
                    AuthStep::Failure => {
                        let reason = match auth.failure_reason() {
                            Some(why) => format!("{m} failed: {why}"),
                            None => format!("{m} failed"),
                        };
                        return fail(auth.failure_status(), reason);
                    }
                }
            }
        }
        Ok(())
    }

    /// The initiator asks to move to `nsg`: allowed now, not yet (None), or never (error).
    fn may_transit(&mut self, nsg: Stage, out: &mut Pairs) -> Result<Option<Stage>, Fail> {
        if self.stage == Stage::SecurityNegotiation && !self.auth_done {
            let required = matches!(
                self.target.as_ref().map(|t| &t.auth),
                Some(AuthPolicy::Required(_))
            );
            let method = self.negotiator.as_ref().and_then(|n| n.auth_method());
            match method {
                // An exchange is under way: stay (T=0) until it ends.
                Some(m) if m != "None" => return Ok(None),
                _ if required => {
                    return fail(
                        LoginStatus::AUTHENTICATION_FAILURE,
                        "authentication required",
                    )
                }
                _ => self.auth_done = true,
            }
        }
        if nsg == Stage::FullFeaturePhase {
            let operational = self.stage == Stage::LoginOperationalNegotiation;
            let Some(neg) = self.negotiator.as_mut() else {
                return fail(LoginStatus::TARGET_ERROR, "no negotiator");
            };
            // Offers go in the operational stage only; an initiator that jumps from the
            // security stage straight to full feature phase gets the defaults, checked
            // by finish().
            if operational {
                out.extend(neg.offers());
                if neg.awaiting_answers() {
                    // Our offers must be answered before full feature phase.
                    return Ok(None);
                }
            }
            neg.finish()
                .map_err(|e| Fail(LoginStatus::INITIATOR_ERROR, e.to_string()))?;
        }
        Ok(Some(nsg))
    }

    fn announce_resources(&mut self) {
        if !self.resources_announced {
            self.resources_announced = true;
            self.output
                .push_back(LoginOutput::Event(LoginEvent::AllocateDatamoverResources));
        }
    }

    /// Send the next piece of the outbox; transit only with its last piece.
    fn send_text(&mut self, req: &LoginRequest, transit: Option<Stage>, policy: &mut dyn LoginPolicy) {
        let (data, more) = self.outbox.next_segment(LOGIN_MAX_DATA_SEGMENT_LENGTH);
        if more {
            let pdu = self.response(req, None, true, data, LoginStatus::SUCCESS);
            self.output.push_back(LoginOutput::Transmit(pdu));
            return;
        }
        self.deferred_transit = None;
        self.respond_with(req, transit, data, policy);
    }

    fn respond_with(&mut self, req: &LoginRequest, transit: Option<Stage>, data: Vec<u8>, policy: &mut dyn LoginPolicy) {
        if let Some(nsg) = transit {
            if self.stage == Stage::SecurityNegotiation {
                // Leaving the security stage: now, and not before, the datamover may
                // allocate connection resources (RFC 7145 §10.1.3.1, iser-wire.md).
                self.announce_resources();
            }
            if nsg == Stage::FullFeaturePhase {
                self.complete(req, data, policy);
                return;
            }
        }
        let pdu = self.response(req, transit, false, data, LoginStatus::SUCCESS);
        if let Some(nsg) = transit {
            self.stage = nsg;
        }
        self.output.push_back(LoginOutput::Transmit(pdu));
    }

    /// The final Login Response and the outcome. The session is committed here, and not
    /// before: the login has passed its security stage and negotiated everything, so a peer
    /// that has not authenticated never creates, reinstates or joins a session.
    fn complete(&mut self, req: &LoginRequest, data: Vec<u8>, policy: &mut dyn LoginPolicy) {
        let (Some(identity), Some(check), Some(negotiator), Some(first), Some(target)) = (
            self.identity.clone(),
            self.check.clone(),
            self.negotiator.clone(),
            self.first,
            self.target.as_ref(),
        ) else {
            self.fail(
                req.itt,
                Some(req),
                Fail(LoginStatus::TARGET_ERROR, "login state incomplete".into()),
            );
            return;
        };
        let decision = match policy.commit_session(&identity, target) {
            Ok(d) => d,
            Err(status) => {
                self.fail(req.itt, Some(req), Fail(status, "session refused".into()));
                return;
            }
        };
        let consistent = matches!(
            (&check, &decision),
            (SessionCheck::Leading, SessionDecision::New { .. } | SessionDecision::Reinstate { .. })
                | (SessionCheck::Join { .. }, SessionDecision::AddConnection { .. })
        );
        if !consistent {
            let reason = format!("session decision {decision:?} does not match the check at the first key list");
            self.fail(req.itt, Some(req), Fail(LoginStatus::TARGET_ERROR, reason));
            return;
        }
        let (exp_cmd_sn, max_cmd_sn) = match &decision {
            SessionDecision::AddConnection {
                exp_cmd_sn,
                max_cmd_sn,
                ..
            } => (*exp_cmd_sn, *max_cmd_sn),
            _ => {
                // Login does not advance CmdSN (it is immediate); open the session's window.
                let depth = negotiator.config().queue_depth.max(1);
                (first.cmd_sn, first.cmd_sn.add(depth - 1))
            }
        };
        let mut pdu = self.response(
            req,
            Some(Stage::FullFeaturePhase),
            false,
            data,
            LoginStatus::SUCCESS,
        );
        if let Op::LoginResponse(r) = &mut pdu.bhs.op {
            // RFC 7143 §11.13.3: a new session's TSIH goes in the final response only.
            r.tsih = decision.tsih();
            r.exp_cmd_sn = exp_cmd_sn;
            r.max_cmd_sn = max_cmd_sn;
        }
        self.stage = Stage::FullFeaturePhase;
        self.state = State::Done;
        self.output.push_back(LoginOutput::Transmit(pdu));
        let outcome = LoginOutcome {
            identity,
            target_alias: self.target.as_ref().and_then(|t| t.alias.clone()),
            decision,
            session: negotiator.session().clone(),
            connection: negotiator.connection().clone(),
            negotiator,
            stat_sn: self.stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
        };
        self.output
            .push_back(LoginOutput::Event(LoginEvent::Complete(Box::new(outcome))));
    }

    /// A Login Response for `req`; StatSN advances with every response (RFC 7143 §11.13.4).
    fn response(
        &mut self,
        req: &LoginRequest,
        transit: Option<Stage>,
        continue_bit: bool,
        data: Vec<u8>,
        status: LoginStatus,
    ) -> Pdu {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.next();
        let cmd_sn = self.first.map_or(req.cmd_sn, |f| f.cmd_sn);
        Pdu::with_data(
            Op::LoginResponse(LoginResponse {
                transit_bit: transit.is_some(),
                continue_bit,
                csg: self.stage,
                // NSG is reserved when T=0 (RFC 7143 §11.13.1).
                nsg: transit.unwrap_or(Stage::SecurityNegotiation),
                version_max: ISCSI_VERSION,
                version_active: ISCSI_VERSION,
                isid: req.isid,
                tsih: req.tsih,
                itt: req.itt,
                stat_sn,
                exp_cmd_sn: cmd_sn,
                max_cmd_sn: cmd_sn,
                status,
            }),
            data,
        )
    }

    fn redirect(&mut self, req: &LoginRequest, status: LoginStatus, address: String) {
        let data = encode_pairs(&[("TargetAddress", address)]);
        let pdu = self.response(req, None, false, data, status);
        self.output.push_back(LoginOutput::Transmit(pdu));
        self.state = State::Failed;
        self.output
            .push_back(LoginOutput::Event(LoginEvent::Failed {
                status,
                reason: "redirected".into(),
            }));
    }

    fn fail(&mut self, itt: Itt, req: Option<&LoginRequest>, f: Fail) {
        self.fail_as(itt, req.map(|r| (r.isid, r.tsih)), req, f)
    }

    /// The failing Login Response, for `session` (ISID, TSIH) when known from the request.
    fn fail_as(&mut self, itt: Itt, session: Option<(Isid, u16)>, req: Option<&LoginRequest>, Fail(status, reason): Fail) {
        if self.state == State::Failed {
            // a redirect already produced its response
            return;
        }
        log::info!(
            "login failed: {reason} (status {:#04x}{:02x})",
            status.class,
            status.detail
        );
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.next();
        let cmd_sn = self
            .first
            .map(|f| f.cmd_sn)
            .or(req.map(|r| r.cmd_sn))
            .unwrap_or_default();
        let pdu = Pdu::new(Op::LoginResponse(LoginResponse {
            transit_bit: false,
            continue_bit: false,
            csg: self.stage,
            nsg: Stage::SecurityNegotiation,
            version_max: ISCSI_VERSION,
            version_active: ISCSI_VERSION,
            isid: session
                .map(|(isid, _)| isid)
                .or(self.first.map(|f| f.isid))
                .unwrap_or_default(),
            tsih: session
                .map(|(_, tsih)| tsih)
                .or(self.first.map(|f| f.tsih))
                .unwrap_or_default(),
            itt,
            stat_sn,
            exp_cmd_sn: cmd_sn,
            max_cmd_sn: cmd_sn,
            status,
        }));
        self.state = State::Failed;
        self.output.push_back(LoginOutput::Transmit(pdu));
        self.output
            .push_back(LoginOutput::Event(LoginEvent::Failed { status, reason }));
    }
}

pub mod transport;

pub use transport::{
    EnableDatamover, LoginRx, LoginSink, LoginTransport, PollerStatus, PortalSpec, PortalTransport, ReactorPoller,
    ResourceKeys, TransportError,
};

#[cfg(test)]
mod tests;
