//! The login driver: ONE loop that runs every login, whatever its transport, on a thread of
//! its own (blocking on the transport with the login's deadline).
//!
//! RFC 5047's login-phase events, in order: Login PDUs in and out through the
//! [`LoginTransport`]; Allocate_Connection_Resources once the login got past any security
//! stage; the final Login Response; Enable_Datamover ([`IscsiServer::enable`]). Policy (target
//! lookup, ACLs, session decisions with reinstatement) comes from the configuration and the
//! session table through [`Policy`].

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use riser_config::{AuthDecision, AuthMode, Denied, TargetNode};
use riser_iscsi::chap::{ChapSecret, ChapTarget};
use riser_iscsi::login::{
    AuthPolicy, Login, LoginContext, LoginEvent, LoginIdentity, LoginOutput, LoginPolicy, LoginRx,
    LoginTransport, PortalSpec, ResourceKeys, SessionDecision, TargetInfo, TargetLookup, TransportError,
};
use riser_iscsi::negotiate::{iser_max_outstanding_unexpected_pdus, DigestPolicy, TargetConfig, Transport};
use riser_iscsi::pdu::{LoginStatus, Op};
use riser_iscsi::serial::Itt;

use crate::stats::LoginFailure;
use crate::IscsiServer;

/// A login that has not finished in this time is dropped (a stalled login must not hold
/// resources forever). The same for every transport.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(15);
/// Most logins in progress at once; more connections are closed at once.
pub const MAX_LOGINS_IN_PROGRESS: usize = 1024;
/// Stack of a login thread: it only parses text.
const LOGIN_STACK: usize = 256 * 1024;

impl IscsiServer {
    /// Starts the login of a new connection on a thread of its own. False: too many logins
    /// are in progress (the caller drops the connection).
    pub fn start_login(self: &Arc<Self>, portal: PortalSpec, conn: Box<dyn LoginTransport>) -> bool {
        if self.logins.load(Ordering::Acquire) >= MAX_LOGINS_IN_PROGRESS {
            return false;
        }
        self.logins.fetch_add(1, Ordering::AcqRel);
        let me = self.clone();
        let spawned = thread::Builder::new().name("login".into()).stack_size(LOGIN_STACK).spawn(move || {
            me.run_login(portal, conn);
            me.logins.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            log::error!("cannot start a login thread: {e}");
            self.logins.fetch_sub(1, Ordering::AcqRel);
        }
        true
    }

    /// Runs one login to completion, then hands the connection to a reactor.
    pub fn run_login(self: &Arc<Self>, portal: PortalSpec, mut t: Box<dyn LoginTransport>) {
        let peer = t.peer();
        let what = match t.kind() {
            Transport::Tcp => "login",
            Transport::Iser => "iSER login",
        };
        let deadline = Instant::now() + LOGIN_TIMEOUT;
        let mut login = Login::new(LoginContext {
            initiator_address: Some(peer.ip()),
            portal_group_tag: portal.portal_group_tag,
            transport: t.kind(),
            ..Default::default()
        });
        let mut policy = Policy::new(self, peer.ip(), portal.portal_group_tag as u32, t.reactor_hint(), t.kind());
        // The ITT of the last Login Request, for a response the driver itself causes.
        let mut last_itt = Itt(0);
        loop {
            // Answer what is pending.
            while let Some(out) = login.poll_output() {
                match out {
                    LoginOutput::Transmit(pdu) => {
                        if let Err(e) = t.send_login(pdu) {
                            log::info!("{what} from {peer}{}: {e}", policy.who());
                            self.login_stats.failure(LoginFailure::Transport);
                            return;
                        }
                    }
                    LoginOutput::Event(LoginEvent::AllocateDatamoverResources) => {
                        let keys = ResourceKeys { queue_depth: policy.queue_depth };
                        if let Err(e) = t.allocate_connection_resources(&keys) {
                            // Answered with Target Error / Out of Resources (0x0302), then the
                            // Failed event below logs and counts it.
                            let reason = format!("cannot allocate connection resources: {e}");
                            login.resources_failed(last_itt, LoginStatus::OUT_OF_RESOURCES, reason);
                        }
                    }
                    LoginOutput::Event(LoginEvent::Failed { status, reason }) => {
                        // One line: who, from where, to what, why; never a secret.
                        log::warn!(
                            "{what} from {peer}{} failed ({:#04x}{:02x}): {reason}",
                            policy.who(),
                            status.class,
                            status.detail
                        );
                        self.login_stats.failure(LoginFailure::of_status(status));
                        t.linger();
                        return;
                    }
                    LoginOutput::Event(LoginEvent::Complete(outcome)) => {
                        if self.enable(t, *outcome).is_none() {
                            log::warn!("{what} from {peer}{}: could not enable the datamover", policy.who());
                            self.login_stats.failure(LoginFailure::TargetError);
                        } else {
                            self.login_stats.success();
                        }
                        return;
                    }
                }
            }
            match t.recv_login(deadline) {
                Ok(LoginRx::Pdu(pdu)) => {
                    if let Op::LoginRequest(r) = pdu.op() {
                        last_itt = r.itt;
                    }
                    login.handle(&pdu, &mut policy)
                }
                Ok(LoginRx::Malformed { header, reason }) => {
                    log::warn!("{what} from {peer}: {reason}");
                    match header {
                        Some(h) => login.handle_malformed(&h),
                        // Not a PDU at all: the login ends now (Initiator Error to the last
                        // Login Request, if any), not at its timeout.
                        None => login.handle_unexpected(reason),
                    }
                }
                Err(TransportError::TimedOut) => {
                    log::warn!("{what} from {peer}{}: timed out after {LOGIN_TIMEOUT:?}", policy.who());
                    self.login_stats.failure(LoginFailure::Timeout);
                    return;
                }
                Err(TransportError::Closed) => {
                    log::debug!("{what} from {peer}{}: closed by the initiator", policy.who());
                    self.login_stats.failure(LoginFailure::Transport);
                    return;
                }
                Err(e) => {
                    log::info!("{what} from {peer}{}: {e}", policy.who());
                    self.login_stats.failure(LoginFailure::Transport);
                    return;
                }
            }
        }
    }
}

/// The login policy: target lookup and ACLs from the configuration, sessions from the
/// server's table.
pub(crate) struct Policy<'a> {
    server: &'a Arc<IscsiServer>,
    peer: IpAddr,
    pg_tag: u32,
    /// The reactor a new session goes to; None: the least loaded one.
    reactor: Option<usize>,
    /// The connection's transport: a connection joins only a session of its own kind.
    transport: Transport,
    /// The queue depth of the target found (Allocate_Connection_Resources sizes by it).
    queue_depth: u32,
    /// Who is logging in to what, once the first key list told (for log lines).
    initiator: Option<String>,
    target: Option<String>,
}

impl<'a> Policy<'a> {
    pub(crate) fn new(
        server: &'a Arc<IscsiServer>,
        peer: IpAddr,
        pg_tag: u32,
        reactor: Option<usize>,
        transport: Transport,
    ) -> Self {
        Policy { server, peer, pg_tag, reactor, transport, queue_depth: DISCOVERY_QUEUE_DEPTH, initiator: None, target: None }
    }

    fn saw(&mut self, who: &LoginIdentity) {
        self.initiator = Some(who.initiator_name.clone());
        self.target = Some(who.target_name.clone().unwrap_or_else(|| "discovery".into()));
    }

    /// " (INITIATOR to TARGET)" once known, for log lines.
    fn who(&self) -> String {
        match (&self.initiator, &self.target) {
            (Some(i), Some(t)) => format!(" ({i} to {t})"),
            _ => String::new(),
        }
    }

    fn target_config(&self, node: Option<&TargetNode>) -> TargetConfig {
        let o = self.server.target.options();
        let digest = |required: bool| if required { DigestPolicy::Required } else { DigestPolicy::Allowed };
        let queue_depth = node.map_or(DISCOVERY_QUEUE_DEPTH, |n| n.queue_depth());
        TargetConfig {
            first_burst_length: o.first_burst_length,
            immediate_data: o.immediate_data,
            max_connections: o.max_connections_per_session.clamp(1, 65535) as u16,
            max_outstanding_r2t: o.max_r2t_per_connection.clamp(1, 65535) as u16,
            default_time2wait: o.default_time2wait as u16,
            default_time2retain: o.default_time2retain as u16,
            error_recovery_level: 0,
            header_digest: digest(node.map_or(false, |n| n.header_digest())),
            data_digest: digest(node.map_or(false, |n| n.data_digest())),
            queue_depth,
            // What the iSER receive ring holds beyond the commands (RFC 7145 §6.4).
            max_outstanding_unexpected_pdus: iser_max_outstanding_unexpected_pdus(queue_depth),
            ..TargetConfig::default()
        }
    }
}

/// The queue depth of a discovery session.
pub(crate) const DISCOVERY_QUEUE_DEPTH: u32 = 8;

impl LoginPolicy for Policy<'_> {
    fn lookup_target(&mut self, who: &LoginIdentity) -> TargetLookup {
        self.saw(who);
        let Some(name) = who.target_name.as_deref() else {
            return TargetLookup::Refused(LoginStatus::MISSING_PARAMETER);
        };
        let Some(node) = self.server.target.find_node(name) else {
            return TargetLookup::Refused(LoginStatus::NOT_FOUND);
        };
        match self.server.target.login_allowed(&node, &who.initiator_name, self.peer, self.pg_tag) {
            Ok(()) => {}
            Err(Denied::NotFound) => return TargetLookup::Refused(LoginStatus::NOT_FOUND),
            Err(Denied::NotAuthorized) => return TargetLookup::Refused(LoginStatus::AUTHORIZATION_FAILURE),
        }
        self.queue_depth = node.queue_depth();
        TargetLookup::Found(TargetInfo {
            name: node.name().to_string(),
            alias: node.alias_name().map(str::to_string),
            config: self.target_config(Some(&node)),
            auth: auth_policy(self.server.target.node_auth(&node), &who.initiator_name),
        })
    }

    fn discovery(&mut self, who: &LoginIdentity) -> TargetLookup {
        self.saw(who);
        let mut info = TargetInfo::discovery();
        info.config = self.target_config(None);
        info.auth = auth_policy(self.server.target.discovery_auth(), &who.initiator_name);
        TargetLookup::Found(info)
    }

    fn session(&mut self, who: &LoginIdentity, target: &TargetInfo) -> Result<SessionDecision, LoginStatus> {
        self.server.decide_session(who, &target.name, self.reactor, self.transport)
    }
}

/// The login's authentication from the configuration's CHAP policy (SPDK's semantics:
/// disable_chap → AuthMethod=None only; require_chap → CHAP only; neither → either; mutual
/// implies require) and the secrets of the policy's auth group. A user bound to an initiator
/// group (riser's `initiator_group`) that does not admit `initiator_name` fails once its
/// response checked out, with Authorization Failure (0x0202), and the login's log line says
/// why ([`AuthDecision::authorize`]).
fn auth_policy(d: AuthDecision, initiator_name: &str) -> AuthPolicy {
    let mode = d.mode;
    let chap = |d: AuthDecision| {
        let secrets = d
            .secrets
            .iter()
            .map(|s| ChapSecret {
                user: s.user.clone(),
                secret: s.secret.to_string(),
                muser: s.muser.clone(),
                msecret: s.msecret.as_ref().map(|m| m.to_string()),
            })
            .collect();
        let mutual = d.mutual;
        let initiator_name = initiator_name.to_string();
        let authorize = move |user: &str| d.authorize(user, &initiator_name);
        Box::new(ChapTarget::new(secrets, mutual).with_authorizer(Box::new(authorize)))
    };
    match mode {
        AuthMode::None => AuthPolicy::None,
        AuthMode::Optional => AuthPolicy::Optional(chap(d)),
        AuthMode::Required => AuthPolicy::Required(chap(d)),
    }
}
