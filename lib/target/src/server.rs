//! The iSCSI server on the control plane: TCP listeners per portal, login on a thread per
//! connection (blocking, with timeouts), session bookkeeping (TSIH, reinstatement), and
//! Enable_Datamover: the logged-in connection moves to the least-loaded reactor.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::cell::Cell;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use riser_datamover::TcpDatamover;
use riser_iscsi::ffp::{CmdWindow, Datamover, DatamoverParams, Ffp, FfpConfig, TextResponder};
use riser_iscsi::framer::{Framer, FramerLimits};
use riser_iscsi::login::{
    AuthPolicy, Login, LoginContext, LoginEvent, LoginIdentity, LoginOutcome, LoginOutput, LoginPolicy,
    SessionDecision, TargetInfo, TargetLookup,
};
use riser_iscsi::negotiate::{DigestPolicy, TargetConfig, Transport};
use riser_iscsi::params::{SessionParams, SessionType};
use riser_iscsi::pdu::{Digests, LoginStatus};
use riser_iscsi::text::Pairs;
use riser_reactor::ReactorHandle;
use riser_scsi::Nexus;
use serde_json::json;

use crate::conn::{ConnInfo, ConnRegistry, Connection};
use crate::{Denied, IscsiTarget, SendTargets, TargetNode};

/// A login that has not finished in this time is dropped (a stalled login must not hold
/// resources forever).
const LOGIN_TIMEOUT: Duration = Duration::from_secs(15);
/// Most logins in progress at once; more connections are closed at once.
const MAX_LOGINS_IN_PROGRESS: usize = 1024;
/// Stack of a login thread: it only parses text.
const LOGIN_STACK: usize = 256 * 1024;

struct Session {
    tsih: u16,
    initiator_name: String,
    isid: u64,
    target_name: String,
    /// Every connection of a session runs on this reactor (they share its CmdSN window).
    reactor: usize,
    /// The leading connection's negotiated session parameters, for connections that join.
    params: Option<SessionParams>,
}

/// Per reactor: the CmdSN windows of the sessions living there, by TSIH.
#[derive(Default)]
struct SessionWindows(HashMap<u16, Weak<Cell<CmdWindow>>>);

/// Everything the listeners and login threads share.
pub struct IscsiServer {
    target: Arc<IscsiTarget>,
    reactors: ReactorHandle,
    conns: Arc<ConnRegistry>,
    sessions: Mutex<Vec<Session>>,
    next_tsih: Mutex<u16>,
    /// Running listeners by (address, iSER?).
    listeners: Mutex<HashMap<(SocketAddr, bool), Arc<AtomicBool>>>,
    logins: AtomicUsize,
    stopping: AtomicBool,
}

impl IscsiServer {
    pub fn new(target: Arc<IscsiTarget>, reactors: ReactorHandle) -> Arc<IscsiServer> {
        let conns = Arc::new(ConnRegistry::with_reactors(reactors.clone()));
        let server = Arc::new(IscsiServer {
            target: target.clone(),
            reactors,
            conns,
            sessions: Mutex::new(Vec::new()),
            next_tsih: Mutex::new(0),
            listeners: Mutex::new(HashMap::new()),
            logins: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&server);
        target.on_portals_changed(move || {
            if let Some(s) = weak.upgrade() {
                s.sync_listeners();
            }
        });
        let weak = Arc::downgrade(&server);
        server.conns.on_gone(move |c| {
            if let Some(s) = weak.upgrade() {
                s.connection_gone(c.tsih);
            }
        });
        let weak = Arc::downgrade(&server);
        target.on_node_deleting(move |node| {
            if let Some(s) = weak.upgrade() {
                s.close_node(node);
            }
        });
        server
    }

    pub fn connections(&self) -> &Arc<ConnRegistry> {
        &self.conns
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, Vec<Session>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts listeners for every TCP portal of every started portal group and stops the
    /// ones no longer configured.
    pub fn sync_listeners(self: &Arc<Self>) {
        if self.stopping.load(Ordering::Acquire) {
            return;
        }
        let mut want: HashMap<(SocketAddr, bool), u16> = HashMap::new();
        for pg in self.target.portal_groups() {
            if !pg.started {
                continue;
            }
            for p in &pg.portals {
                want.insert((p.addr, p.iser), pg.tag as u16);
            }
        }
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners.retain(|key, stop| {
            let keep = want.contains_key(key);
            if !keep {
                stop.store(true, Ordering::Release);
                log::info!("{} portal {}: listener stopped", if key.1 { "iSER" } else { "iSCSI" }, key.0);
            }
            keep
        });
        for ((addr, iser), tag) in want {
            if listeners.contains_key(&(addr, iser)) {
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            if iser {
                match crate::iser_portal::spawn(self.clone(), addr, tag, stop.clone()) {
                    Ok(()) => {
                        listeners.insert((addr, true), stop);
                    }
                    Err(e) => log::error!("iSER portal {addr} (portal group {tag}): {e}"),
                }
                continue;
            }
            match TcpListener::bind(addr) {
                Ok(l) => {
                    listeners.insert((addr, false), stop.clone());
                    let me = self.clone();
                    let spawned = thread::Builder::new()
                        .name(format!("portal-{}", addr.port()))
                        .spawn(move || me.accept_loop(l, addr, tag, stop));
                    match spawned {
                        Ok(_) => log::info!("iSCSI portal {addr} (portal group {tag}): listening"),
                        Err(e) => log::error!("iSCSI portal {addr}: cannot start listener: {e}"),
                    }
                }
                Err(e) => log::error!("iSCSI portal {addr}: cannot listen: {e}"),
            }
        }
    }

    /// Stops listening and closes every connection.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        for stop in self.listeners.lock().unwrap_or_else(|p| p.into_inner()).values() {
            stop.store(true, Ordering::Release);
        }
        self.conns.kill_where(|_| true);
    }

    fn close_node(&self, node: &Arc<TargetNode>) {
        let name = node.name().to_string();
        let n = self.conns.kill_where(|c| c.target_node_name == name);
        if n > 0 {
            log::info!("target node {name} deleted: closing {n} connection(s)");
            // Let the reactors see the kill flag and tear down before the node goes.
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && self.conns.list().iter().any(|c| c.target_node_name == name) {
                thread::sleep(Duration::from_millis(20));
            }
        }
        self.sessions().retain(|s| s.target_name != name);
    }

    fn accept_loop(self: Arc<Self>, l: TcpListener, addr: SocketAddr, tag: u16, stop: Arc<AtomicBool>) {
        if let Err(e) = l.set_nonblocking(true) {
            log::error!("iSCSI portal {addr}: {e}");
            return;
        }
        while !stop.load(Ordering::Acquire) {
            match l.accept() {
                Ok((sock, peer)) => {
                    if self.logins.load(Ordering::Acquire) >= MAX_LOGINS_IN_PROGRESS {
                        log::warn!("iSCSI portal {addr}: {MAX_LOGINS_IN_PROGRESS} logins in progress; refusing {peer}");
                        continue;
                    }
                    self.logins.fetch_add(1, Ordering::AcqRel);
                    let me = self.clone();
                    let spawned = thread::Builder::new().name("login".into()).stack_size(LOGIN_STACK).spawn(move || {
                        me.login(sock, peer, tag);
                        me.logins.fetch_sub(1, Ordering::AcqRel);
                    });
                    if let Err(e) = spawned {
                        log::error!("cannot start a login thread: {e}");
                        self.logins.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(10)),
                Err(e) => {
                    log::warn!("iSCSI portal {addr}: accept: {e}");
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Runs one login to completion, then hands the connection to a reactor.
    fn login(self: &Arc<Self>, mut sock: TcpStream, peer: SocketAddr, tag: u16) {
        let local = sock.local_addr().ok();
        let _ = sock.set_nodelay(true);
        let deadline = Instant::now() + LOGIN_TIMEOUT;
        let mut login = Login::new(LoginContext {
            initiator_address: Some(peer.ip()),
            portal_group_tag: tag,
            transport: Transport::Tcp,
            ..Default::default()
        });
        let mut policy = Policy::new(self, peer.ip(), tag as u32);
        let mut framer = Framer::with_limits(FramerLimits::LOGIN);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            // Answer what is pending.
            while let Some(out) = login.poll_output() {
                match out {
                    LoginOutput::Transmit(pdu) => match pdu.to_bytes(Digests::default()) {
                        Ok(bytes) => {
                            if let Err(e) = sock.write_all(&bytes) {
                                log::info!("login from {peer}: send failed: {e}");
                                return;
                            }
                        }
                        Err(e) => {
                            log::error!("login from {peer}: cannot encode response: {e}");
                            return;
                        }
                    },
                    LoginOutput::Event(LoginEvent::AllocateDatamoverResources) => {}
                    LoginOutput::Event(LoginEvent::Failed { status, reason }) => {
                        log::warn!("login from {peer} failed ({:#04x}{:02x}): {reason}", status.class, status.detail);
                        return;
                    }
                    LoginOutput::Event(LoginEvent::Complete(outcome)) => {
                        self.enable_datamover(sock, peer, local, *outcome);
                        return;
                    }
                }
            }
            // Read exactly what the next PDU needs, so nothing of full-feature phase is
            // read here and lost.
            let now = Instant::now();
            if now >= deadline {
                log::warn!("login from {peer}: timed out after {LOGIN_TIMEOUT:?}");
                return;
            }
            let _ = sock.set_read_timeout(Some(deadline - now));
            let want = framer.bytes_needed().clamp(1, buf.len());
            match sock.read(&mut buf[..want]) {
                Ok(0) => {
                    log::debug!("login from {peer}: closed by the initiator");
                    return;
                }
                Ok(n) => framer.feed(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    log::warn!("login from {peer}: timed out after {LOGIN_TIMEOUT:?}");
                    return;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::info!("login from {peer}: {e}");
                    return;
                }
            }
            loop {
                match framer.next_pdu() {
                    Ok(Some(pdu)) => login.handle(&pdu, &mut policy),
                    Ok(None) => break,
                    Err(e) => {
                        log::warn!("login from {peer}: {e}");
                        match e.header() {
                            Some(h) => login.handle_malformed(h),
                            None => return,
                        }
                        break;
                    }
                }
            }
        }
    }

    /// Enable_Datamover: the final Login Response is out; move the connection to a reactor.
    fn enable_datamover(self: &Arc<Self>, sock: TcpStream, peer: SocketAddr, local: Option<SocketAddr>, o: LoginOutcome) {
        self.enable(peer, local, o, "tcp", move || TcpDatamover::new(sock, &[]).map_err(|e| e.to_string()));
    }

    /// The reactor a connection that is logging in should be prepared for.
    pub(crate) fn least_loaded_reactor(&self) -> usize {
        self.reactors.least_loaded()
    }

    /// Enable_Datamover for any transport: `make_dm` runs on the chosen reactor (a TCP
    /// datamover is built there; an iSER one arrives ready). Returns the connection's id.
    pub(crate) fn enable<D, F>(self: &Arc<Self>, peer: SocketAddr, local: Option<SocketAddr>, o: LoginOutcome, transport: &'static str, make_dm: F) -> Option<u64>
    where
        D: Datamover + 'static,
        F: FnOnce() -> Result<D, String> + Send + 'static,
    {
        let iser = transport == "iser";
        let opts = self.target.options();
        let s = &o.session;
        let c = &o.connection;
        let discovery = s.session_type == SessionType::Discovery;
        let node = s.target_name.as_deref().and_then(|n| self.target.find_node(n));
        if !discovery && node.is_none() {
            log::warn!("login from {peer}: target vanished during login");
            return None;
        }
        let queue_depth = node.as_ref().map_or(8, |n| n.queue_depth());
        let ffp_cfg = FfpConfig {
            cid: o.identity.cid,
            queue_depth,
            immediate_data: s.immediate_data,
            initial_r2t: s.initial_r2t,
            first_burst_length: s.first_burst_length,
            max_burst_length: s.max_burst_length,
            // iSER initiators post 128-byte receive buffers for full-feature data (Linux,
            // libiscsi): keep what the target sends within that.
            initiator_mrdsl: if iser { c.send_limit(true).min(128) } else { c.send_limit(false) },
            target_mrdsl: c.recv_limit(iser),
            nop_in_interval: Duration::from_secs(opts.nop_in_interval as u64),
            nop_timeout: Duration::from_secs(opts.nop_timeout as u64),
            discovery,
            largest_write: riser_scsi::MAX_TRANSFER_BYTES as u32,
        };
        let dm_params = DatamoverParams {
            initiator_max_recv_data_segment_length: c.send_limit(iser),
            target_max_recv_data_segment_length: c.recv_limit(iser),
            max_burst_length: s.max_burst_length,
            first_burst_length: s.first_burst_length,
            max_outstanding_r2t: s.max_outstanding_r2t as u32,
            header_digest: c.header_digest,
            data_digest: c.data_digest,
        };
        let isid = isid_u64(&o.identity.isid.0);
        let target_name = s.target_name.clone().unwrap_or_default();
        let tsih = o.tsih();
        let joining = matches!(o.decision, SessionDecision::AddConnection { .. });
        let reactor = {
            let mut sessions = self.sessions();
            match sessions.iter_mut().find(|s| s.tsih == tsih) {
                Some(sess) => {
                    if !joining {
                        sess.params = Some(s.clone());
                    }
                    sess.reactor
                }
                None => self.reactors.least_loaded(),
            }
        };
        let lcore = self.reactors.stats().get(reactor).map_or(0, |s| s.core);
        let info = Arc::new(ConnInfo {
            id: self.conns.next_id(),
            cid: o.identity.cid,
            tsih: o.tsih(),
            isid,
            reactor,
            lcore,
            initiator_name: s.initiator_name.clone(),
            initiator_addr: peer.to_string(),
            target_addr: local.map(|l| l.to_string()).unwrap_or_default(),
            target_node_name: target_name.clone(),
            transport,
            params: json!({
                "SessionType": if discovery { "Discovery" } else { "Normal" },
                "HeaderDigest": if c.header_digest { "CRC32C" } else { "None" },
                "DataDigest": if c.data_digest { "CRC32C" } else { "None" },
                "MaxRecvDataSegmentLength": c.max_recv_data_segment_length,
                "InitiatorMaxRecvDataSegmentLength": c.max_send_data_segment_length,
                "MaxBurstLength": s.max_burst_length,
                "FirstBurstLength": s.first_burst_length,
                "InitialR2T": s.initial_r2t,
                "ImmediateData": s.immediate_data,
                "MaxOutstandingR2T": s.max_outstanding_r2t,
                "MaxConnections": s.max_connections,
                "ErrorRecoveryLevel": s.error_recovery_level,
                "QueueDepth": queue_depth,
                "RDMAExtensions": s.rdma_extensions,
                "TargetRecvDataSegmentLength": c.target_recv_data_segment_length,
                "InitiatorRecvDataSegmentLength": c.initiator_recv_data_segment_length,
            }),
            kill: AtomicBool::new(false),
            pdus_in: Default::default(),
            tasks_done: Default::default(),
        });
        let nexus = Arc::new(Nexus::new(&s.initiator_name, isid, &target_name, o.identity.portal_group_tag));
        let responder = SendTargetsResponder {
            target: self.target.clone(),
            initiator_name: s.initiator_name.clone(),
            initiator_addr: peer.ip(),
            local_addr: local.map(|l| l.ip()).unwrap_or(peer.ip()),
        };
        let registry = self.conns.clone();
        let conn_id = info.id;
        let (exp_cmd_sn, stat_sn) = (o.exp_cmd_sn, o.stat_sn);
        self.reactors.add_load(reactor, 1);
        log::info!(
            "connection {} from {peer} ({}) to {} logged in (TSIH {}, reactor {reactor})",
            info.id,
            s.initiator_name,
            if discovery { "discovery" } else { &target_name },
            o.tsih()
        );
        let sent = self.reactors.send_blocking(reactor, move |ctx| {
            let now = ctx.now();
            let mut dm = match make_dm() {
                Ok(dm) => dm,
                Err(e) => {
                    log::error!("connection {}: cannot switch to full-feature phase: {e}", info.id);
                    ctx.handle().add_load(reactor, -1);
                    return;
                }
            };
            dm.notice_key_values(dm_params);
            let windows = ctx.local(SessionWindows::default);
            windows.0.retain(|_, w| w.strong_count() > 0);
            let mut ffp = if joining {
                match windows.0.get(&tsih).and_then(Weak::upgrade) {
                    Some(w) => Ffp::join(ffp_cfg, w, stat_sn, now),
                    None => {
                        log::warn!("connection {}: session {tsih} ended during login", info.id);
                        ctx.handle().add_load(reactor, -1);
                        return;
                    }
                }
            } else {
                let ffp = Ffp::new(ffp_cfg, exp_cmd_sn, stat_sn, now);
                windows.0.insert(tsih, Rc::downgrade(&ffp.window()));
                ffp
            };
            ffp.set_responder(Box::new(responder));
            Connection::new(info, registry, dm, ffp, node, nexus, now).start(ctx);
        });
        if sent.is_err() {
            log::warn!("connection from {peer}: reactors are stopping");
            return None;
        }
        Some(conn_id)
    }
}

fn isid_u64(b: &[u8; 6]) -> u64 {
    b.iter().fold(0u64, |acc, x| (acc << 8) | *x as u64)
}

/// Answers SendTargets from the target configuration, for this initiator.
struct SendTargetsResponder {
    target: Arc<IscsiTarget>,
    initiator_name: String,
    initiator_addr: IpAddr,
    local_addr: IpAddr,
}

impl TextResponder for SendTargetsResponder {
    fn respond(&mut self, request: &Pairs) -> Pairs {
        let mut out = Pairs::new();
        for (_, v) in request {
            let which = if v == "All" { SendTargets::All } else { SendTargets::One(v) };
            for (name, addrs) in self.target.send_targets(&self.initiator_name, self.initiator_addr, self.local_addr, which) {
                out.push(("TargetName".into(), name));
                out.extend(addrs.into_iter().map(|a| ("TargetAddress".to_string(), a)));
            }
        }
        out
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
}

impl<'a> Policy<'a> {
    pub(crate) fn new(server: &'a Arc<IscsiServer>, peer: IpAddr, pg_tag: u32) -> Self {
        Policy { server, peer, pg_tag, reactor: None }
    }

    /// A new session lives on `reactor` (an iSER connection whose QP already completes on
    /// that reactor's CQ).
    pub(crate) fn with_reactor(mut self, reactor: usize) -> Self {
        self.reactor = Some(reactor);
        self
    }

    fn target_config(&self, node: Option<&TargetNode>) -> TargetConfig {
        let o = self.server.target.options();
        let digest = |required: bool| if required { DigestPolicy::Required } else { DigestPolicy::Allowed };
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
            queue_depth: node.map_or(8, |n| n.queue_depth()),
            ..TargetConfig::default()
        }
    }
}

impl LoginPolicy for Policy<'_> {
    fn lookup_target(&mut self, who: &LoginIdentity) -> TargetLookup {
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
        if node.chap().require_chap {
            // CHAP is not implemented yet: refuse rather than let anyone in.
            return TargetLookup::Refused(LoginStatus::AUTHENTICATION_FAILURE);
        }
        TargetLookup::Found(TargetInfo {
            name: node.name().to_string(),
            alias: node.alias_name().map(str::to_string),
            config: self.target_config(Some(&node)),
            auth: AuthPolicy::None,
        })
    }

    fn discovery(&mut self, _who: &LoginIdentity) -> TargetLookup {
        let mut info = TargetInfo::discovery();
        info.config = self.target_config(None);
        TargetLookup::Found(info)
    }

    fn session(&mut self, who: &LoginIdentity, target: &TargetInfo) -> Result<SessionDecision, LoginStatus> {
        let isid = isid_u64(&who.isid.0);
        let server = self.server;
        let opts = server.target.options();
        if who.tsih != 0 {
            return server.add_connection(who, isid, &target.name, opts.max_connections_per_session as usize);
        }
        let mut sessions = server.sessions();
        let old = sessions
            .iter()
            .position(|s| s.isid == isid && s.initiator_name == who.initiator_name && s.target_name == target.name);
        if old.is_none() && who.session_type == SessionType::Normal && sessions.len() >= opts.max_sessions as usize {
            return Err(LoginStatus::OUT_OF_RESOURCES);
        }
        let tsih = {
            let mut next = server.next_tsih.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                *next = next.wrapping_add(1);
                if *next != 0 && !sessions.iter().any(|s| s.tsih == *next) {
                    break *next;
                }
            }
        };
        let decision = match old {
            Some(i) => {
                // Session reinstatement (RFC 7143 §6.3.5): the old session's connections end.
                let old = sessions.remove(i);
                let killed = server.conns.kill_where(|c| c.tsih == old.tsih);
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
                target_name: target.name.clone(),
                reactor: self.reactor.unwrap_or_else(|| server.reactors.least_loaded()),
                params: None,
            });
        }
        Ok(decision)
    }
}

impl IscsiServer {
    /// A connection joins session `tsih` (RFC 7143 §6.3.3), or replaces the connection with
    /// the same CID (connection reinstatement, §6.3.4).
    fn add_connection(&self, who: &LoginIdentity, isid: u64, target: &str, max: usize) -> Result<SessionDecision, LoginStatus> {
        let (reactor, params) = {
            let sessions = self.sessions();
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

    /// Forgets a session once its last connection is gone.
    pub fn connection_gone(&self, tsih: u16) {
        if !self.conns.list().iter().any(|c| c.tsih == tsih) {
            self.sessions().retain(|s| s.tsih != tsih);
        }
    }

    pub fn sessions_count(&self) -> usize {
        self.sessions().len()
    }
}
