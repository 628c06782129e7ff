//! The session table: TSIH allocation, new sessions, session reinstatement (RFC 7143
//! §6.3.5), connections joining a session (§6.3.3) and connection reinstatement (§6.3.4).

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Weak;
use std::sync::{Mutex, MutexGuard};

use riser_iscsi::ffp::CmdWindow;
use riser_iscsi::login::{LoginIdentity, SessionDecision};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::params::{SessionParams, SessionType};
use riser_iscsi::pdu::LoginStatus;

use crate::IscsiServer;

pub(crate) struct Session {
    pub tsih: u16,
    pub initiator_name: String,
    pub isid: u64,
    pub target_name: String,
    /// Every connection of a session runs on this reactor (they share its CmdSN window).
    pub reactor: usize,
    /// The leading connection's negotiated session parameters, for connections that join.
    pub params: Option<SessionParams>,
}

/// Every session with a connection logged in or logging in.
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

    /// A TSIH no session in `sessions` has (never 0).
    fn new_tsih(&self, sessions: &[Session]) -> u16 {
        let mut next = self.next_tsih.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            *next = next.wrapping_add(1);
            if *next != 0 && !sessions.iter().any(|s| s.tsih == *next) {
                break *next;
            }
        }
    }
}

/// Per reactor: the CmdSN windows of the sessions living there, by TSIH.
#[derive(Default)]
pub(crate) struct SessionWindows(pub HashMap<u16, Weak<Cell<CmdWindow>>>);

pub(crate) fn isid_u64(b: &[u8; 6]) -> u64 {
    b.iter().fold(0u64, |acc, x| (acc << 8) | *x as u64)
}

impl IscsiServer {
    /// The session a login creates, reinstates or joins. `reactor`: where a new session goes
    /// (None: the least loaded reactor); `transport`: the connection's.
    pub(crate) fn decide_session(
        &self,
        who: &LoginIdentity,
        target_name: &str,
        reactor: Option<usize>,
        transport: Transport,
    ) -> Result<SessionDecision, LoginStatus> {
        let isid = isid_u64(&who.isid.0);
        let opts = self.target.options();
        if who.tsih != 0 {
            let iser = transport == Transport::Iser;
            return self.add_connection(who, isid, target_name, opts.max_connections_per_session as usize, iser);
        }
        let mut sessions = self.sessions.lock();
        let old = sessions
            .iter()
            .position(|s| s.isid == isid && s.initiator_name == who.initiator_name && s.target_name == target_name);
        if old.is_none() && who.session_type == SessionType::Normal && sessions.len() >= opts.max_sessions as usize {
            return Err(LoginStatus::OUT_OF_RESOURCES);
        }
        let tsih = self.sessions.new_tsih(&sessions);
        let decision = match old {
            Some(i) => {
                // Session reinstatement (RFC 7143 §6.3.5): the old session's connections end.
                let old = sessions.remove(i);
                let killed = self.conns.kill_where(|c| c.tsih == old.tsih);
                log::info!("session {:#x} of {} reinstated: closing {killed} old connection(s)", isid, who.initiator_name);
                SessionDecision::Reinstate { tsih, old_tsih: old.tsih }
            }
            None => SessionDecision::New { tsih },
        };
        if who.session_type == SessionType::Normal {
            sessions.push(Session {
                tsih,
                initiator_name: who.initiator_name.clone(),
                isid,
                target_name: target_name.to_string(),
                reactor: reactor.unwrap_or_else(|| self.reactors.least_loaded()),
                params: None,
            });
        }
        Ok(decision)
    }

    /// A connection joins session `tsih` (RFC 7143 §6.3.3), or replaces the connection with
    /// the same CID (connection reinstatement, §6.3.4).
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
    fn add_connection(
        &self,
        who: &LoginIdentity,
        isid: u64,
        target: &str,
        max: usize,
        iser: bool,
    ) -> Result<SessionDecision, LoginStatus> {
        let (reactor, params) = {
            let sessions = self.sessions.lock();
            let Some(s) = sessions.iter().find(|s| s.tsih == who.tsih) else {
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
        if same_cid {
            let n = self.conns.kill_where(|c| c.tsih == who.tsih && c.cid == who.cid);
            log::info!("session {:#x}: connection {} reinstated ({n} closed)", who.tsih, who.cid);
        } else if live >= max.max(1) {
            return Err(LoginStatus::TOO_MANY_CONNECTIONS);
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
    /// reaches full-feature phase (`leading`). None: not in the table (discovery sessions).
    pub(crate) fn session_reactor(&self, tsih: u16, leading: Option<&SessionParams>) -> Option<usize> {
        let mut sessions = self.sessions.lock();
        let s = sessions.iter_mut().find(|s| s.tsih == tsih)?;
        if let Some(p) = leading {
            s.params = Some(p.clone());
        }
        Some(s.reactor)
    }
}
