//! The login driver: ONE loop that runs every login, whatever its transport, on a thread of
//! its own (blocking on the transport with the login's deadline).
//!
//! RFC 5047's login-phase events, in order: Login PDUs in and out through the
//! [`LoginTransport`]; Allocate_Connection_Resources once the login got past any security
//! stage; the final Login Response; Enable_Datamover ([`IscsiServer::enable`]). Policy (target
//! lookup, ACLs, session decisions with reinstatement) comes from the configuration and the
//! session table through [`Policy`]: the session is only checked at the first key list and
//! committed when the login completes, and a committed session whose connection is never
//! enabled is removed again (the policy's drop).
//!
//! What a peer that has not logged in can hold is bounded: `max_logins` logins in progress,
//! `max_logins_per_source` of them from one address, each for at most `login_timeout`
//! seconds, sending included (options of `iscsi_set_options`). An address is a [`Source`]:
//! an IPv6 /64 counts as one, as a host is usually given a whole /64.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use riser_config::recheck::SessionAuth;
use riser_config::{AuthDecision, AuthMode, Denied, TargetNode};
use riser_iscsi::chap::{ChapSecret, ChapTarget};
use riser_iscsi::login::{
    AuthPolicy, Login, LoginContext, LoginEvent, LoginIdentity, LoginOutput, LoginPolicy, LoginRx, LoginTransport,
    PortalSpec, ResourceKeys, SessionCheck, SessionDecision, TargetInfo, TargetLookup, TransportError,
};
use riser_iscsi::negotiate::{iser_max_outstanding_unexpected_pdus, DigestPolicy, TargetConfig, Transport};
use riser_iscsi::pdu::{LoginStatus, Op};
use riser_iscsi::serial::Itt;

use crate::stats::{LoginFailure, Refusal};
use crate::IscsiServer;

/// Stack of a login thread: it only parses text.
const LOGIN_STACK: usize = 256 * 1024;

/// The source address a per-source limit counts by: an IPv4 address (an IPv4-mapped IPv6
/// one too, as what it is), or an IPv6 /64. A host usually has a whole /64 to itself (SLAAC,
/// privacy addresses) and can pick any address in it, so counting IPv6 addresses one by one
/// would give one host as many sources as it likes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Source(IpAddr);

impl Source {
    pub(crate) fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                Source(IpAddr::V6(Ipv6Addr::from(prefix)))
            }
            v4 => Source(v4),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}"),
            IpAddr::V6(a) => write!(f, "{a}/64"),
        }
    }
}

/// Logins in progress, in all and by source address: each holds a thread until its deadline,
/// so both are bounded (options `max_logins`, `max_logins_per_source`), and a few hosts
/// cannot take every slot.
#[derive(Debug, Default)]
pub(crate) struct LoginSlots {
    inner: Mutex<SlotCounts>,
}

#[derive(Debug, Default)]
struct SlotCounts {
    total: usize,
    by_source: HashMap<Source, usize>,
}

/// Why no slot was given: the limit that is full, and how many hold it.
enum NoSlot {
    Total(usize),
    Source(usize),
}

/// A login's slot; given back when dropped (the login ended, however).
pub(crate) struct LoginSlot {
    slots: Arc<LoginSlots>,
    source: Source,
}

impl LoginSlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotCounts> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a login from `source`, if both limits allow.
    fn take(self: &Arc<Self>, source: Source, max: usize, per_source: usize) -> Result<LoginSlot, NoSlot> {
        let mut c = self.lock();
        if c.total >= max {
            return Err(NoSlot::Total(c.total));
        }
        let mine = c.by_source.get(&source).copied().unwrap_or(0);
        if mine >= per_source {
            return Err(NoSlot::Source(mine));
        }
        c.total += 1;
        *c.by_source.entry(source).or_insert(0) += 1;
        Ok(LoginSlot { slots: self.clone(), source })
    }

    pub(crate) fn in_progress(&self) -> usize {
        self.lock().total
    }
}

impl Drop for LoginSlot {
    fn drop(&mut self) {
        let mut c = self.slots.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                c.by_source.remove(&self.source);
            }
        }
    }
}

impl IscsiServer {
    /// A login slot for a connection from `peer`, if `max_logins` and
    /// `max_logins_per_source` allow; a refusal is counted and logged here (rate-limited).
    fn login_slot(self: &Arc<Self>, peer: SocketAddr) -> Option<LoginSlot> {
        let o = self.target.options();
        let source = Source::of(peer.ip());
        match self.logins.take(source, o.max_logins as usize, o.max_logins_per_source as usize) {
            Ok(slot) => Some(slot),
            Err(NoSlot::Total(n)) => {
                self.refusals.refused(Refusal::Logins, || {
                    format!(
                        "connection from {peer} refused: {n} logins in progress, the limit (max_logins {}); \
                         raise it with iscsi_set_options {{\"max_logins\": N}}",
                        o.max_logins
                    )
                });
                None
            }
            Err(NoSlot::Source(n)) => {
                self.refusals.refused(Refusal::LoginsPerSource, || {
                    format!(
                        "connection from {peer} refused: {n} logins in progress from {source}, the limit per source \
                         address (max_logins_per_source {}); raise it with iscsi_set_options \
                         {{\"max_logins_per_source\": N}}",
                        o.max_logins_per_source
                    )
                });
                None
            }
        }
    }

    /// Whether a connection from `peer` would get a login slot now: what a transport that
    /// spends resources on a connection before its login starts (an iSER QP) asks first, so
    /// that stalled logins from a few sources cannot make it hold resources for everyone's
    /// connects. A refusal is counted and logged as [`Self::start_login`]'s; a yes reserves
    /// nothing ([`Self::start_login`] decides).
    pub fn may_start_login(self: &Arc<Self>, peer: SocketAddr) -> bool {
        self.login_slot(peer).is_some()
    }

    /// Starts the login of a new connection on a thread of its own. False: refused, because
    /// `max_logins` logins are in progress, or `max_logins_per_source` from the connection's
    /// source address (the caller drops the connection; the refusal is logged here,
    /// rate-limited).
    pub fn start_login(self: &Arc<Self>, portal: PortalSpec, conn: Box<dyn LoginTransport>) -> bool {
        let o = self.target.options();
        let Some(slot) = self.login_slot(conn.peer()) else {
            return false;
        };
        let me = self.clone();
        let timeout = Duration::from_secs(o.login_timeout as u64);
        let spawned = thread::Builder::new().name("login".into()).stack_size(LOGIN_STACK).spawn(move || {
            // Given back when the login ends, however it ends.
            let _slot = slot;
            me.run_login(portal, conn, timeout);
        });
        if let Err(e) = spawned {
            // The closure, and the slot with it, is dropped.
            log::error!("cannot start a login thread: {e}");
        }
        true
    }

    /// Runs one login to completion, then hands the connection to a reactor. The login ends
    /// at `timeout` from now whatever it waits for, receiving or sending.
    pub fn run_login(self: &Arc<Self>, portal: PortalSpec, mut t: Box<dyn LoginTransport>, timeout: Duration) {
        let peer = t.peer();
        // What summaries of failed logins name.
        let ip = peer.ip();
        let what = match t.kind() {
            Transport::Tcp => "login",
            Transport::Iser => "iSER login",
        };
        let deadline = Instant::now() + timeout;
        let mut login = Login::new(LoginContext {
            initiator_address: Some(peer.ip()),
            portal_group_tag: portal.portal_group_tag,
            transport: t.kind(),
            ..Default::default()
        });
        // Removes the session the login committed, on every path but a connection enabled.
        let mut policy = Policy::new(self, peer.ip(), portal.portal_group_tag as u32, t.reactor_hint(), t.kind());
        // The ITT of the last Login Request, for a response the driver itself causes.
        let mut last_itt = Itt(0);
        loop {
            // Answer what is pending.
            while let Some(out) = login.poll_output() {
                match out {
                    LoginOutput::Transmit(pdu) => match t.send_login(pdu, deadline) {
                        Ok(()) => {}
                        Err(TransportError::TimedOut) => {
                            self.login_stats.log.failed(LoginFailure::Timeout, &ip, || {
                                format!(
                                    "{what} from {peer}{}: timed out after {timeout:?} sending (the initiator does not read)",
                                    policy.who()
                                )
                            });
                            self.login_stats.failure(LoginFailure::Timeout);
                            return;
                        }
                        Err(e) => {
                            log::info!("{what} from {peer}{}: {e}", policy.who());
                            self.login_stats.failure(LoginFailure::Transport);
                            return;
                        }
                    },
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
                        // One line: who, from where, to what, why; never a secret. A peer
                        // can fail logins at will: rate-limited per kind.
                        let kind = LoginFailure::of_status(status);
                        self.login_stats.log.failed(kind, &ip, || {
                            format!(
                                "{what} from {peer}{} failed ({:#04x}{:02x}): {reason}",
                                policy.who(),
                                status.class,
                                status.detail
                            )
                        });
                        self.login_stats.failure(kind);
                        t.linger();
                        return;
                    }
                    LoginOutput::Event(LoginEvent::Complete(outcome)) => {
                        if self.enable(t, *outcome, policy.session_auth()).is_none() {
                            log::warn!("{what} from {peer}{}: could not enable the datamover", policy.who());
                            self.login_stats.failure(LoginFailure::TargetError);
                        } else {
                            // The connection owns the session now (it is forgotten with its
                            // last connection).
                            policy.committed = None;
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
                    self.login_stats.log.failed(LoginFailure::InitiatorError, &ip, || format!("{what} from {peer}: {reason}"));
                    match header {
                        Some(h) => login.handle_malformed(&h),
                        // Not a PDU at all: the login ends now (Initiator Error to the last
                        // Login Request, if any), not at its timeout.
                        None => login.handle_unexpected(reason),
                    }
                }
                Err(TransportError::TimedOut) => {
                    self.login_stats.log.failed(LoginFailure::Timeout, &ip, || {
                        format!("{what} from {peer}{}: timed out after {timeout:?}", policy.who())
                    });
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
    /// The session this login created (new or reinstating) when it completed: removed from
    /// the table when the policy is dropped, unless the driver cleared it because the
    /// connection reached full-feature phase (then the session ends with its connections).
    committed: Option<u16>,
    /// The CHAP user the initiator proved to be, once it has (set by the authorizer).
    auth: Arc<Mutex<SessionAuth>>,
}

impl<'a> Policy<'a> {
    pub(crate) fn new(
        server: &'a Arc<IscsiServer>,
        peer: IpAddr,
        pg_tag: u32,
        reactor: Option<usize>,
        transport: Transport,
    ) -> Self {
        Policy {
            server,
            peer,
            pg_tag,
            reactor,
            transport,
            queue_depth: DISCOVERY_QUEUE_DEPTH,
            initiator: None,
            target: None,
            committed: None,
            auth: Arc::default(),
        }
    }

    /// What the login proved: its CHAP user, if it authenticated with CHAP.
    fn session_auth(&self) -> SessionAuth {
        self.auth.lock().unwrap_or_else(|p| p.into_inner()).clone()
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
            header_digest: digest(node.is_some_and(|n| n.header_digest())),
            data_digest: digest(node.is_some_and(|n| n.data_digest())),
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
        // Redirected for maintenance (iscsi_target_node_set_redirect): checked after the
        // access rules, as SPDK does, so only an initiator allowed in learns the address.
        if let Some(target_address) = node.redirect_for(self.pg_tag) {
            log::info!("login of {} to {} through portal group {}: redirected to {target_address}", who.initiator_name, node.name(), self.pg_tag);
            return TargetLookup::Redirect { target_address, permanent: false };
        }
        self.queue_depth = node.queue_depth();
        TargetLookup::Found(TargetInfo {
            name: node.name().to_string(),
            alias: node.alias_name().map(str::to_string),
            config: self.target_config(Some(&node)),
            auth: auth_policy(self.server.target.node_auth(&node), &who.initiator_name, &self.auth),
        })
    }

    fn discovery(&mut self, who: &LoginIdentity) -> TargetLookup {
        self.saw(who);
        let mut info = TargetInfo::discovery();
        info.config = self.target_config(None);
        info.auth = auth_policy(self.server.target.discovery_auth_for(self.pg_tag), &who.initiator_name, &self.auth);
        TargetLookup::Found(info)
    }

    fn check_session(&mut self, who: &LoginIdentity, target: &TargetInfo) -> Result<SessionCheck, LoginStatus> {
        self.server.check_session(who, &target.name, self.transport, Source::of(self.peer))
    }

    fn commit_session(&mut self, who: &LoginIdentity, target: &TargetInfo) -> Result<SessionDecision, LoginStatus> {
        let d = self.server.commit_session(who, &target.name, self.reactor, self.transport, Source::of(self.peer))?;
        if !matches!(d, SessionDecision::AddConnection { .. }) {
            self.committed = Some(d.tsih());
        }
        Ok(d)
    }
}

impl Drop for Policy<'_> {
    /// A login that committed its session but did not reach full-feature phase (the final
    /// response could not be sent, the datamover not enabled, the thread panicked) leaves
    /// nothing in the table.
    fn drop(&mut self) {
        if let Some(tsih) = self.committed.take() {
            log::debug!("login from {}{}: session {tsih:#x} forgotten (never enabled)", self.peer, self.who());
            self.server.sessions.forget(tsih);
        }
    }
}

/// The login's authentication from the configuration's CHAP policy (SPDK's semantics:
/// disable_chap → AuthMethod=None only; require_chap → CHAP only; neither → either; mutual
/// implies require) and the secrets of the policy's auth group. A user bound to an initiator
/// group (riser's `initiator_group`) that does not admit `initiator_name` fails once its
/// response checked out, with Authorization Failure (0x0202), and the login's log line says
/// why ([`AuthDecision::authorize`]). A user that checked out is recorded in `proved`.
fn auth_policy(d: AuthDecision, initiator_name: &str, proved: &Arc<Mutex<SessionAuth>>) -> AuthPolicy {
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
        let proved = proved.clone();
        let authorize = move |user: &str| {
            let r = d.authorize(user, &initiator_name);
            if r.is_ok() {
                *proved.lock().unwrap_or_else(|p| p.into_inner()) = SessionAuth { chap_user: Some(user.to_string()), mutual };
            }
            r
        };
        Box::new(ChapTarget::new(secrets, mutual).with_authorizer(Box::new(authorize)))
    };
    match mode {
        AuthMode::None => AuthPolicy::None,
        AuthMode::Optional => AuthPolicy::Optional(chap(d)),
        AuthMode::Required => AuthPolicy::Required(chap(d)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source address gets at most its share of the slots, the others the rest up to the
    /// total; a slot comes back when its login ends (the guard is dropped).
    #[test]
    fn login_slots_are_bounded_per_source_and_in_all() {
        let slots = Arc::new(LoginSlots::default());
        let source = |a: &str| Source::of(a.parse().expect("addr"));
        let (a, b, c) = (source("10.0.0.1"), source("10.0.0.2"), source("10.0.0.3"));
        let a1 = slots.take(a, 4, 2).ok().expect("a 1");
        let _a2 = slots.take(a, 4, 2).ok().expect("a 2");
        assert!(matches!(slots.take(a, 4, 2), Err(NoSlot::Source(2))));
        let _b1 = slots.take(b, 4, 2).ok().expect("b 1");
        let _b2 = slots.take(b, 4, 2).ok().expect("b 2");
        assert!(matches!(slots.take(c, 4, 2), Err(NoSlot::Total(4))));
        assert_eq!(slots.in_progress(), 4);
        drop(a1);
        assert_eq!(slots.in_progress(), 3);
        let c1 = slots.take(c, 4, 2).ok().expect("c after a's slot came back");
        let a3 = slots.take(a, 5, 2).ok().expect("a again, below its share");
        assert_eq!(slots.lock().by_source.len(), 3);
        drop((_a2, _b1, _b2, c1, a3));
        assert_eq!(slots.in_progress(), 0);
        assert!(slots.lock().by_source.is_empty(), "no entry left for an address with no login");
    }

    /// The addresses of one IPv6 /64 are one source (a host picks any of them), those of
    /// different /64s are not; IPv4, mapped into IPv6 or not, counts by address.
    #[test]
    fn ipv6_sources_count_by_their_64_prefix() {
        let source = |a: &str| Source::of(a.parse().expect("addr"));
        assert_eq!(source("2001:db8:1:2::1"), source("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_eq!(source("2001:db8:1:2:abcd::7"), source("2001:db8:1:2::"));
        assert_ne!(source("2001:db8:1:2::1"), source("2001:db8:1:3::1"));
        assert_eq!(source("::ffff:10.0.0.1"), source("10.0.0.1"), "IPv4-mapped is IPv4");
        assert_ne!(source("::ffff:10.0.0.1"), source("::ffff:10.0.0.2"), "IPv4 is not masked");
        assert_eq!(source("2001:db8:1:2::1").to_string(), "2001:db8:1:2::/64");
        assert_eq!(source("::ffff:10.0.0.1").to_string(), "10.0.0.1");

        // 40 logins from 40 addresses of one /64 share its per-source slots.
        let slots = Arc::new(LoginSlots::default());
        let mut held = Vec::new();
        for i in 1..=40u16 {
            let a = source(&format!("2001:db8:1:2::{i:x}"));
            match slots.take(a, 1024, 32) {
                Ok(s) => held.push(s),
                Err(NoSlot::Source(n)) => assert!(i > 32 && n == 32, "login {i} refused with {n} held"),
                Err(NoSlot::Total(_)) => panic!("not the total"),
            }
        }
        assert_eq!(held.len(), 32);
        assert!(slots.take(source("2001:db8:1:3::1"), 1024, 32).is_ok(), "another /64 is another source");
    }
}
