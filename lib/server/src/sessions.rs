//! The session table: TSIH allocation, new sessions, session reinstatement (RFC 7143
//! §6.3.5), connections joining a session (§6.3.3) and connection reinstatement (§6.3.4).
//!
//! A login only looks at the table until it completes ([`IscsiServer::check_session`]); the
//! session is created, reinstated or joined when the final Login Response is built
//! ([`IscsiServer::commit_session`]), so a peer that has not passed the security stage leaves
//! nothing behind and ends no one else's session or connection. The login driver removes a
//! committed session again if the connection never reaches full-feature phase.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Weak;
use std::sync::{Mutex, MutexGuard};

use riser_iscsi::ffp::CmdWindow;
use riser_config::Options;
use riser_iscsi::login::{LoginIdentity, SessionCheck, SessionDecision};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::params::{SessionParams, SessionType};
use riser_iscsi::pdu::LoginStatus;

use crate::login::Source;
use crate::stats::Refusal;
use crate::IscsiServer;

pub(crate) struct Session {
    pub tsih: u16,
    /// Discovery sessions are in the table too (their TSIH is unique and they count against
    /// `max_discovery_sessions`), but are never reinstated or joined.
    pub session_type: SessionType,
    pub initiator_name: String,
    pub isid: u64,
    /// Empty for a discovery session.
    pub target_name: String,
    /// Where the leading connection's login came from (discovery sessions are bounded per
    /// source: `max_discovery_sessions_per_source`).
    pub source: Source,
    /// Every connection of a session runs on this reactor (they share its CmdSN window).
    pub reactor: usize,
    /// The leading connection's negotiated session parameters, for connections that join.
    pub params: Option<SessionParams>,
}

/// Every session with a connection logged in, or whose leading connection's login has just
/// completed (a session enters the table only when its login completes: see
/// [`IscsiServer::commit_session`]).
#[derive(Default)]
pub(crate) struct Sessions {
    list: Mutex<Vec<Session>>,
    next_tsih: Mutex<u16>,
}

impl Sessions {
    pub fn lock(&self) -> MutexGuard<'_, Vec<Session>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn forget(&self, tsih: u16) {
        self.lock().retain(|s| s.tsih != tsih);
    }

    pub fn forget_target(&self, name: &str) {
        self.lock().retain(|s| s.target_name != name);
    }

    /// A TSIH no session in `sessions` has (never 0); None when all 65535 are taken. One
    /// pass over the table and at most one over the TSIH space, whatever the table holds.
    fn new_tsih(&self, sessions: &[Session]) -> Option<u16> {
        let mut used = vec![0u64; 1 << 10];
        for s in sessions {
            used[s.tsih as usize >> 6] |= 1 << (s.tsih & 63);
        }
        let mut next = self.next_tsih.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..=u16::MAX as u32 {
            *next = next.wrapping_add(1);
            if *next != 0 && used[*next as usize >> 6] & (1 << (*next & 63)) == 0 {
                return Some(*next);
            }
        }
        None
    }
}

/// A discovery session that gives way to a newcomer's ([`IscsiServer::commit_session`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Victim {
    tsih: u16,
    /// Discovery sessions its source holds.
    held: usize,
    idle_ms: u64,
}

/// Per reactor: the CmdSN windows of the sessions living there, by TSIH.
#[derive(Default)]
pub(crate) struct SessionWindows(pub HashMap<u16, Weak<Cell<CmdWindow>>>);

pub(crate) fn isid_u64(b: &[u8; 6]) -> u64 {
    b.iter().fold(0u64, |acc, x| (acc << 8) | *x as u64)
}

/// Counts of the table's sessions by type.
fn counts(sessions: &[Session]) -> (usize, usize) {
    let discovery = sessions.iter().filter(|s| s.session_type == SessionType::Discovery).count();
    (sessions.len() - discovery, discovery)
}

impl IscsiServer {
    /// At the first key list, before authentication: could `who` lead or join a session of
    /// `target_name`? Looks only: the peer is not authenticated yet, so nothing changes (no
    /// session entry, no reinstatement, no connection closed). A login that cannot succeed
    /// (limits, no session to join) fails here, early.
    pub(crate) fn check_session(
        &self,
        who: &LoginIdentity,
        target_name: &str,
        transport: Transport,
        source: Source,
    ) -> Result<SessionCheck, LoginStatus> {
        let isid = isid_u64(&who.isid.0);
        let opts = self.target.options();
        if who.session_type == SessionType::Discovery {
            if who.tsih != 0 {
                // A discovery session takes one connection; none is ever joined.
                return Err(LoginStatus::SESSION_DOES_NOT_EXIST);
            }
            // Looks only: a discovery session that would give way is closed at the commit.
            self.session_room(&self.sessions.lock(), who, source, &opts, false)?;
            return Ok(SessionCheck::Leading);
        }
        if who.tsih != 0 {
            let iser = transport == Transport::Iser;
            let (_, session) =
                self.joinable(who, isid, target_name, opts.max_connections_per_session as usize, iser)?;
            return Ok(SessionCheck::Join { session });
        }
        let sessions = self.sessions.lock();
        let reinstates = sessions.iter().any(|s| s.is_instance(who, isid, target_name));
        self.session_room(&sessions, who, source, &opts, reinstates)?;
        Ok(SessionCheck::Leading)
    }

    /// The login completed (its security stage passed): the session it creates, reinstates
    /// or joins, now. `reactor`: where a new session goes (None: the least loaded reactor);
    /// `transport`: the connection's. The limits are checked again (the table may have
    /// changed since [`Self::check_session`]).
    pub(crate) fn commit_session(
        &self,
        who: &LoginIdentity,
        target_name: &str,
        reactor: Option<usize>,
        transport: Transport,
        source: Source,
    ) -> Result<SessionDecision, LoginStatus> {
        let isid = isid_u64(&who.isid.0);
        let opts = self.target.options();
        if who.tsih != 0 && who.session_type == SessionType::Normal {
            let iser = transport == Transport::Iser;
            return self.add_connection(who, isid, target_name, opts.max_connections_per_session as usize, iser);
        }
        if who.tsih != 0 {
            return Err(LoginStatus::SESSION_DOES_NOT_EXIST);
        }
        let mut sessions = self.sessions.lock();
        let old = sessions.iter().position(|s| s.is_instance(who, isid, target_name));
        let victim = self.session_room(&sessions, who, source, &opts, old.is_some())?;
        let Some(tsih) = self.sessions.new_tsih(&sessions) else {
            log::warn!(
                "login of {} refused: all 65535 TSIHs are in use ({} sessions in the table)",
                who.initiator_name,
                sessions.len()
            );
            return Err(LoginStatus::OUT_OF_RESOURCES);
        };
        if let Some(v) = victim {
            // The table is full of discovery sessions and this source holds none: the
            // longest-idle one of the source holding the most gives way, now that this login
            // has passed its security stage.
            if let Some(i) = sessions.iter().position(|s| s.tsih == v.tsih) {
                let gone = sessions.remove(i);
                self.conns.kill_where(|c| c.tsih == v.tsih);
                let limit = opts.max_discovery_sessions;
                self.conns.evict_log.warn(|| {
                    format!(
                        "discovery session {:#x} of {} from {} (idle {:.1} s; {} discovery sessions from that source, \
                         the most) closed to make room for a discovery login of {} from {source}, which holds none: \
                         the discovery sessions fill max_discovery_sessions {limit}",
                        gone.tsih,
                        gone.initiator_name,
                        gone.source,
                        v.idle_ms as f64 / 1000.0,
                        v.held,
                        who.initiator_name
                    )
                });
            }
        }
        let decision = match old {
            Some(i) => {
                // Session reinstatement (RFC 7143 §6.3.5): the old session's connections end,
                // now that the new login has authenticated and completed.
                let old = sessions.remove(i);
                let killed = self.conns.kill_where(|c| c.tsih == old.tsih);
                log::info!("session {:#x} of {} reinstated: closing {killed} old connection(s)", isid, who.initiator_name);
                SessionDecision::Reinstate { tsih, old_tsih: old.tsih }
            }
            None => SessionDecision::New { tsih },
        };
        sessions.push(Session {
            tsih,
            session_type: who.session_type,
            initiator_name: who.initiator_name.clone(),
            isid,
            target_name: target_name.to_string(),
            source,
            reactor: reactor.unwrap_or_else(|| self.reactors.least_loaded()),
            params: None,
        });
        Ok(decision)
    }

    /// Whether the table has room for the session `who` leads from `source` (`reinstates`: it
    /// replaces one, so the count does not grow). A discovery session also needs room among
    /// its source's: one host must not hold every discovery session and shut everyone else
    /// out of SendTargets. A refusal says why in the log (rate-limited).
    ///
    /// When the discovery sessions fill `max_discovery_sessions`, a discovery login from a
    /// source that holds none gets in all the same: `Ok(Some(victim))` names the discovery
    /// session to close for it ([`Self::discovery_victim`]), which the commit does.
    fn session_room(
        &self,
        sessions: &[Session],
        who: &LoginIdentity,
        source: Source,
        opts: &Options,
        reinstates: bool,
    ) -> Result<Option<Victim>, LoginStatus> {
        if reinstates {
            return Ok(None);
        }
        let (normal, discovery) = counts(sessions);
        let (refusal, n, limit, option) = match who.session_type {
            SessionType::Normal => (Refusal::Sessions, normal, opts.max_sessions, "max_sessions"),
            SessionType::Discovery => {
                (Refusal::DiscoverySessions, discovery, opts.max_discovery_sessions, "max_discovery_sessions")
            }
        };
        let kind = if who.session_type == SessionType::Discovery { "discovery session" } else { "session" };
        if n >= limit as usize {
            if who.session_type == SessionType::Discovery {
                if let Some(victim) = self.discovery_victim(sessions, source) {
                    return Ok(Some(victim));
                }
            }
            self.refusals.refused(refusal, || {
                format!(
                    "login of {} refused with Out of resources: {n} {kind}s, the limit ({option} {limit}); \
                     raise it with iscsi_set_options {{\"{option}\": N}}",
                    who.initiator_name
                )
            });
            return Err(LoginStatus::OUT_OF_RESOURCES);
        }
        if who.session_type == SessionType::Discovery {
            let mine =
                sessions.iter().filter(|s| s.session_type == SessionType::Discovery && s.source == source).count();
            let limit = opts.max_discovery_sessions_per_source;
            if mine >= limit as usize {
                let option = Refusal::DiscoverySessionsPerSource.option();
                self.refusals.refused(Refusal::DiscoverySessionsPerSource, || {
                    format!(
                        "login of {} refused with Out of resources: {mine} discovery sessions from {source}, the \
                         limit per source address ({option} {limit}); raise it with iscsi_set_options \
                         {{\"{option}\": N}}",
                        who.initiator_name
                    )
                });
                return Err(LoginStatus::OUT_OF_RESOURCES);
            }
        }
        Ok(None)
    }

    /// The discovery session that gives way to a discovery login from `source` when the
    /// table is full: none if `source` holds one already (it has its share); otherwise the
    /// longest-idle one of the source that holds the most (a newcomer always gets in, and a
    /// host holding many loses one of its own first).
    fn discovery_victim(&self, sessions: &[Session], source: Source) -> Option<Victim> {
        let discovery = || sessions.iter().filter(|s| s.session_type == SessionType::Discovery);
        if discovery().any(|s| s.source == source) {
            return None;
        }
        let mut by_source: HashMap<Source, usize> = HashMap::new();
        for s in discovery() {
            *by_source.entry(s.source).or_insert(0) += 1;
        }
        let idle: HashMap<u16, u64> =
            self.conns.list().iter().map(|c| (c.tsih, c.idle_ms.load(std::sync::atomic::Ordering::Relaxed))).collect();
        let idle_of = |s: &Session| idle.get(&s.tsih).copied().unwrap_or(0);
        // The source holding the most; among those, the session idle the longest.
        discovery()
            .max_by_key(|s| (by_source.get(&s.source).copied().unwrap_or(0), idle_of(s)))
            .map(|s| Victim { tsih: s.tsih, held: by_source.get(&s.source).copied().unwrap_or(0), idle_ms: idle_of(s) })
    }

    /// Whether a connection may join session `tsih` (RFC 7143 §6.3.3), or replace the
    /// connection with the same CID (connection reinstatement, §6.3.4): the session's reactor
    /// and parameters. Looks only.
    ///
    /// No mixing of transports in a session (MC/S over TCP and iSER): RFC 7145 §6.3 makes
    /// RDMAExtensions a LeadingOnly key, so the leading connection's value holds for the whole
    /// session (RFC 7143 §13: an LO key is negotiated on the leading connection only and applies
    /// to the session): a session that negotiated RDMAExtensions=Yes is iSER-assisted on every
    /// connection, one that did not (TCP) has no iSER connection. A connection of the other kind
    /// would run with keys negotiated for the other transport (an iSER connection without
    /// RDMAExtensions, or TCP with the iSER data segment limits), so it is refused with
    /// Can't include in session (0x0208, RFC 7143 §11.13.5) before it disturbs the session (no
    /// reinstatement of a connection with its CID).
    fn joinable(
        &self,
        who: &LoginIdentity,
        isid: u64,
        target: &str,
        max: usize,
        iser: bool,
    ) -> Result<(usize, SessionParams), LoginStatus> {
        let (reactor, params) = {
            let sessions = self.sessions.lock();
            let Some(s) = sessions.iter().find(|s| s.tsih == who.tsih && s.session_type == SessionType::Normal) else {
                return Err(LoginStatus::SESSION_DOES_NOT_EXIST);
            };
            if s.isid != isid || s.initiator_name != who.initiator_name || s.target_name != target {
                return Err(LoginStatus::SESSION_DOES_NOT_EXIST);
            }
            let Some(params) = s.params.clone() else {
                // The leading connection has not reached full-feature phase yet.
                return Err(LoginStatus::SERVICE_UNAVAILABLE);
            };
            if params.rdma_extensions != iser {
                let (kind, session) = if iser { ("iSER", "iSCSI/TCP") } else { ("iSCSI/TCP", "iSER") };
                log::warn!(
                    "session {:#x} of {}: an {kind} connection cannot join an {session} session (RFC 7145: RDMAExtensions is LeadingOnly); refused with Can't include in session",
                    who.tsih,
                    who.initiator_name
                );
                return Err(LoginStatus::CANT_INCLUDE_IN_SESSION);
            }
            (s.reactor, params)
        };
        let conns = self.conns.list();
        let same_cid = conns.iter().any(|c| c.tsih == who.tsih && c.cid == who.cid);
        let live = conns.iter().filter(|c| c.tsih == who.tsih).count();
        if !same_cid && live >= max.max(1) {
            return Err(LoginStatus::TOO_MANY_CONNECTIONS);
        }
        Ok((reactor, params))
    }

    /// The login of a connection joining session `tsih` completed: it replaces the connection
    /// with the same CID, if any (connection reinstatement, closed now and not before), and
    /// takes the session's CmdSN window as it is now.
    fn add_connection(
        &self,
        who: &LoginIdentity,
        isid: u64,
        target: &str,
        max: usize,
        iser: bool,
    ) -> Result<SessionDecision, LoginStatus> {
        let (reactor, params) = self.joinable(who, isid, target, max, iser)?;
        let n = self.conns.kill_where(|c| c.tsih == who.tsih && c.cid == who.cid);
        if n > 0 {
            log::info!("session {:#x}: connection {} reinstated ({n} closed)", who.tsih, who.cid);
        }
        // The window lives on the session's reactor: ask it.
        let tsih = who.tsih;
        let window = self
            .reactors
            .call(reactor, move |ctx| ctx.local(SessionWindows::default).0.get(&tsih).and_then(Weak::upgrade).map(|w| w.get()))
            .ok()
            .flatten()
            .ok_or(LoginStatus::SESSION_DOES_NOT_EXIST)?;
        Ok(SessionDecision::AddConnection { tsih, session: params, exp_cmd_sn: window.exp_cmd_sn, max_cmd_sn: window.max_cmd_sn })
    }

    /// The reactor of session `tsih`, recording the leading connection's parameters when it
    /// reaches full-feature phase (`leading`). None: not in the table.
    pub(crate) fn session_reactor(&self, tsih: u16, leading: Option<&SessionParams>) -> Option<usize> {
        let mut sessions = self.sessions.lock();
        let s = sessions.iter_mut().find(|s| s.tsih == tsih)?;
        if let Some(p) = leading {
            s.params = Some(p.clone());
        }
        Some(s.reactor)
    }

    /// Sessions in the table: (normal, discovery).
    pub fn session_counts(&self) -> (usize, usize) {
        counts(&self.sessions.lock())
    }
}

impl Session {
    /// Whether this is the normal session `who` (TSIH 0) would reinstate: the same
    /// InitiatorName, ISID and target (RFC 7143 §6.3.5).
    fn is_instance(&self, who: &LoginIdentity, isid: u64, target_name: &str) -> bool {
        who.session_type == SessionType::Normal
            && self.session_type == SessionType::Normal
            && self.isid == isid
            && self.initiator_name == who.initiator_name
            && self.target_name == target_name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(tsih: u16) -> Session {
        Session {
            tsih,
            session_type: SessionType::Normal,
            initiator_name: "iqn.x".into(),
            isid: tsih as u64,
            target_name: "iqn.t".into(),
            source: Source::of(std::net::Ipv4Addr::LOCALHOST.into()),
            reactor: 0,
            params: None,
        }
    }

    /// With every TSIH taken the allocation says so (the login gets Out of resources)
    /// instead of looping forever with the lock held; one freed TSIH is found wherever the
    /// counter stands.
    #[test]
    fn new_tsih_with_a_full_table_returns_none() {
        let sessions = Sessions::default();
        let mut list: Vec<Session> = (1..=u16::MAX).map(session).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let table = std::sync::Arc::new(sessions);
        let t = table.clone();
        let full: Vec<Session> = std::mem::take(&mut list);
        std::thread::spawn(move || {
            let _ = tx.send((t.new_tsih(&full), full));
        });
        let (got, mut full) = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("new_tsih returns");
        assert_eq!(got, None);
        full.retain(|s| s.tsih != 40000);
        assert_eq!(table.new_tsih(&full), Some(40000));
        full.push(session(40000));
        full.retain(|s| s.tsih != 7);
        assert_eq!(table.new_tsih(&full), Some(7), "found after the counter wrapped");
        assert_eq!(Sessions::default().new_tsih(&[]), Some(1), "never 0");
    }
}
