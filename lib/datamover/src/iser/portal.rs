//! iSER portals: an rdma_cm listener per portal, connection setup as Linux ib_iser expects,
//! and the [`LoginTransport`] of a connection logging in over RC SENDs (RFC 7145, the IB
//! generalization). The login itself is run by the server's login driver, like any other.
//!
//! One control-plane thread per portal owns the CM event channel. A connection's life:
//! 1. CONNECT_REQUEST: rejected at once if the server would not start a login from the peer
//!    (its login slots, in all and per source address: [`LoginSink::may_accept`]) or the
//!    portal has `max_logins` connections logging in; nothing is built for it. Else a
//!    reactor is chosen for the connection (the server's placement: the least loaded) and
//!    its RC QP created on that reactor's shared CQ for the device (see
//!    [`super::shared_cq`]: one CQ per reactor and device, owned and polled by that reactor
//!    alone, which routes each completion to its QP's inbox by the route in its `wr_id`; a
//!    new CQ's poller is attached to the reactor here). From then on the QP is the reactor's:
//!    the login thread only reads its inbox. ONE login receive buffer is posted, then accept
//!    (initiator depth = min(the peer's responder resources, the device's limit); private
//!    data: no zero-based VA, Send with Invalidate when the initiator supports it). The
//!    connection goes to the server's login driver as an [`IserLogin`]; the portal thread
//!    keeps only its CM state (established, closed).
//! 2. Login PDUs arrive in RC SENDs behind the 28-byte iSER header; the login receive is
//!    reposted before each non-final response.
//! 3. Allocate_Connection_Resources (when the login reaches operational negotiation, after any
//!    security stage: the rule against denial of service): receive ring and send buffers,
//!    registered once (data moves between the tasks' own buffers and the initiator's, each
//!    registered with the PD on first use and for the life of its pooled mapping, local
//!    access only; on iWARP an RDMA Read's sink is also registered with remote write for
//!    that transfer alone, see [`super::conn`]); the whole
//!    receive ring is posted before the final Login Response goes out through the datamover.
//! 4. Enable_Datamover: the datamover moves to the session's reactor: the one chosen at
//!    connect for a new session (the reactor that polls its CQ), the session's own for a
//!    connection joining one (its CQ's reactor still routes its completions, into an inbox
//!    the connection reads from its session's reactor: inboxes are lock-free queues).
//!
//! Discovery sessions are accepted on an iSER portal (tested: open-iscsi's discovery through
//! an iser iface, scripts/vm/iser-fault.sh). RFC 7145 has discovery run over the normal iSCSI
//! transport and makes RDMAExtensions irrelevant to a discovery session (§6.3), but forbids
//! none on an iSER-capable connection, and on InfiniBand / RoCE the portal has no streaming
//! mode to fall back to: refusing would leave an initiator that discovers through its iSER
//! iface with nothing. Its Login and Text PDUs go in RC SENDs behind the iSER header.
//!
//! DISCONNECTED and other CM events mark the connection's CM state closed: a login ends, a
//! connection in full-feature phase terminates (its datamover sees the mark).
//! DEVICE_REMOVAL (the RDMA device went away, e.g. `rdma link delete`): the kernel cannot
//! finish removing a soft-RoCE device while a process holds anything on it, so the portal
//! drops its listener and cached PD, the connections on the device close, the idle task
//! buffers registered with the device's PD are unmapped (their registrations hold the PD),
//! librdmacm is asked to re-read its device list (it then closes its own context of the
//! device), and the portal listens again once the address has a device.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use riser_bdev::IoBuf;
use riser_iscsi::ffp::{Datamover, DatamoverParams, DmEvent, GetData, PutData};
use riser_iscsi::login::{
    EnableDatamover, LoginRx, LoginSink, LoginTransport, PollerStatus, PortalSpec, PortalTransport, ResourceKeys,
    TransportError,
};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::pdu::{Op, Pdu, Stage, BHS_LEN};
use riser_iscsi::serial::Itt;
use riser_rdma::{
    CmEventType, CmId, CmIdKey, CompletionChannel, CompletionQueue, ConnParam, Context, EventChannel, ProtectionDomain, QpCaps, QpInitAttr,
};

use super::config::IserConfig;
use super::conn::IserDatamover;
use super::error::IserError;
use super::header::{cm, IserHeader, ISER_HDR_LEN};
use super::memlock;
use super::pool::Pool;
use super::shared_cq::{CqSet, PollerPass};
use super::verbs::{is_siw, registered_pool, supports_send_with_invalidate, VerbsCq, VerbsQp};
use super::wr::{Completion, IserQp, SendOp, SendWr};

const LOGIN_SLOT: usize = ISER_HDR_LEN + BHS_LEN + 1024 + 8192;
const WR_LOGIN_RECV: u64 = 0xA1 << 56;
const WR_LOGIN_SEND: u64 = 0xA2 << 56;
/// The deepest session queue depth a target node can be given (`iscsi_create_target_node`).
const MAX_QUEUE_DEPTH: u32 = 256;
/// Entries of a shared CQ (at most; less if the device allows less).
const SHARED_CQ_ENTRIES: u32 = 16384;
/// How long a login waiting for its next PDU sleeps between polls of its QP.
const LOGIN_POLL_IDLE: Duration = Duration::from_micros(500);
/// How long the portal thread waits for a CM event before it looks at its stop flag and its
/// relisten timer again (an event ends the wait at once).
const PORTAL_WAIT: Duration = Duration::from_millis(10);
/// How long a failed login waits for the initiator to close after its last response, at most,
/// before the QP is destroyed (on the login's own thread).
const FAILED_LINGER: Duration = Duration::from_secs(2);

/// The shared CQs of every iSER portal, by (device, reactor).
static CQS: std::sync::LazyLock<CqSet<Arc<CompletionQueue>>> = std::sync::LazyLock::new(CqSet::default);

/// What the portal thread learns of a connection from the CM, for whoever holds the
/// connection (the login driver, then the connection's reactor).
#[derive(Debug, Default)]
struct CmState {
    established: AtomicBool,
    closed: AtomicBool,
    /// Enable_Datamover has not happened yet: the connection is still logging in.
    logging_in: AtomicBool,
}

/// Most connections of one portal still logging in, when the server does not say its
/// `max_logins` ([`LoginSink::max_logins`]): each holds a QP, CQ entries and a login buffer
/// before anything is known about it (RFC 7145: resources only once login has got far
/// enough), so connects beyond this are rejected until logins finish or time out.
const DEFAULT_PENDING_LOGINS: usize = 64;

/// Why a connect request is rejected before anything is built for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reject {
    /// The portal has `pending` connections logging in, its cap.
    Pending { pending: usize, cap: usize },
    /// The server would not start a login from the peer now (`max_logins`,
    /// `max_logins_per_source`); it logged why.
    Refused,
    /// The CM did not say where the connect came from.
    NoPeer,
}

/// Whether the portal takes a connect request from `peer` while `pending` of its
/// connections are logging in. Decided BEFORE [`setup`] builds the QP: the server's login
/// slots (in all and per source address) are asked first, so that a few sources stalling
/// their logins hold no more QPs than their own slots, and cannot make the portal reject
/// everyone else's connects. The portal's own cap follows the server's `max_logins` (a
/// fixed, lower cap would be a limit shared by all sources, that two of them could fill).
fn admit(pending: usize, peer: Option<SocketAddr>, sink: &dyn LoginSink) -> Result<SocketAddr, Reject> {
    let peer = peer.ok_or(Reject::NoPeer)?;
    // The server first: its refusal lines are rate-limited, and its slots are what a flood
    // fills before the portal's own count (which only its own late bookkeeping can exceed).
    if !sink.may_accept(peer) {
        return Err(Reject::Refused);
    }
    let cap = sink.max_logins().unwrap_or(DEFAULT_PENDING_LOGINS).max(1);
    if pending >= cap {
        return Err(Reject::Pending { pending, cap });
    }
    Ok(peer)
}

/// The memory a connection registers beside the I/O buffers, at most: its login buffer and
/// its control pools at the deepest queue depth.
pub fn per_connection_bytes() -> usize {
    let pools: usize =
        IserDatamover::<VerbsQp>::pool_sizes(&IserConfig::for_queue_depth(MAX_QUEUE_DEPTH, 0)).iter().map(|(count, slot)| count * slot).sum();
    2 * LOGIN_SLOT + pools
}

/// iSER portals: one rdma_cm listener thread per portal.
#[derive(Debug, Default, Clone, Copy)]
pub struct IserPortal;

impl PortalTransport for IserPortal {
    fn kind(&self) -> Transport {
        Transport::Iser
    }

    fn listen(&self, portal: PortalSpec, sink: Arc<dyn LoginSink>, stop: Arc<AtomicBool>) -> Result<(), String> {
        let addr = portal.addr;
        let channel = EventChannel::new().map_err(|e| format!("rdma_cm event channel: {e}"))?;
        let listener = listen(&channel, addr).map_err(|e| e.to_string())?;
        // Registrations count against RLIMIT_MEMLOCK: say now, once, if it cannot hold the
        // I/O buffer budget, rather than leave initiators with refused connections.
        let siw = listener.context().ok().flatten().is_some_and(|c| is_siw(&c));
        memlock::check_at_start(addr, &memlock::facts(per_connection_bytes() as u64, siw));
        thread::Builder::new()
            .name(format!("iser-{}", addr.port()))
            .spawn(move || run(channel, listener, portal, sink, stop))
            .map_err(|e| format!("cannot start the iSER portal thread: {e}"))?;
        Ok(())
    }
}

/// A listening id on `addr` (bound to the device that has the address).
fn listen(channel: &EventChannel, addr: SocketAddr) -> Result<CmId, IserError> {
    let listener = CmId::new(channel)?;
    listener.bind_addr(addr).map_err(|source| IserError::Bind { addr, source })?;
    listener.listen(128).map_err(|source| IserError::Listen { addr, source })?;
    Ok(listener)
}

/// How often a portal whose device went away tries to listen again.
const RELISTEN_EVERY: Duration = Duration::from_secs(1);
/// How long after a device removal the portal keeps asking librdmacm to re-read the device
/// list (see [`riser_rdma::refresh_cm_devices`]), once per [`RELISTEN_EVERY`].
const REFRESH_FOR: Duration = Duration::from_secs(120);

fn run(channel: EventChannel, listener: CmId, portal: PortalSpec, sink: Arc<dyn LoginSink>, stop: Arc<AtomicBool>) {
    let (addr, tag) = (portal.addr, portal.portal_group_tag);
    log::info!("iSER portal {addr} (portal group {tag}): listening");
    // None while the portal's device is gone (DEVICE_REMOVAL): retried every RELISTEN_EVERY.
    let mut listener = Some(listener);
    let mut listener_key = listener.as_ref().map(CmId::key);
    // After a device removal: when to retry / refresh next, and until when to refresh.
    let mut next_retry = Instant::now();
    let mut refresh_until: Option<Instant> = None;
    let mut pds: HashMap<String, Arc<ProtectionDomain>> = HashMap::new();
    // Every connection of this portal still held by a login or a reactor, by CM id.
    let mut conns: HashMap<CmIdKey, Arc<CmState>> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let mut busy = false;
        loop {
            match channel.poll_event() {
                Ok(Some(ev)) => {
                    busy = true;
                    // Connections whose login or reactor let them go get no more events.
                    conns.retain(|_, c| Arc::strong_count(c) > 1);
                    if ev.event_type == CmEventType::DeviceRemoval {
                        // Everything on the device must go for its removal to complete: the
                        // cached PD now (connections hold their own until they are freed),
                        // the listener and the connections below (each id gets this event).
                        pds.clear();
                        // Task buffers registered with the device's PD hold it too.
                        riser_rdma::release_idle_iobuf_registrations();
                        refresh_until = Some(Instant::now() + REFRESH_FOR);
                        next_retry = Instant::now() + RELISTEN_EVERY;
                        if listener_key == Some(ev.id) {
                            log::warn!(
                                "iSER portal {addr}: RDMA device removed; {} connection(s) on it close, listening again once the address has a device",
                                conns.len()
                            );
                            listener = None;
                            listener_key = None;
                            continue;
                        }
                    }
                    match ev.event_type {
                        CmEventType::ConnectRequest => {
                            if let Some(id) = ev.new_id {
                                let pending = conns.values().filter(|c| c.logging_in.load(Ordering::Acquire)).count();
                                if let Err(why) = admit(pending, id.peer_addr(), &*sink) {
                                    let from = id.peer_addr().map_or_else(|| "?".to_string(), |a| a.to_string());
                                    match why {
                                        Reject::Pending { pending, cap } => log::warn!(
                                            "iSER portal {addr}: {pending} logins in progress, the portal's limit ({cap}, max_logins); rejecting a connect from {from}"
                                        ),
                                        // The server logged why (rate-limited).
                                        Reject::Refused => log::debug!("iSER portal {addr}: login refused; rejecting a connect from {from}"),
                                        Reject::NoPeer => log::warn!("iSER portal {addr}: a connect without a peer address; rejected"),
                                    }
                                    if let Err(e) = id.reject(&[]) {
                                        log::debug!("iSER portal {addr}: reject: {e}");
                                    }
                                    continue;
                                }
                                let key = id.key();
                                match setup(id, &mut pds, &ev.private_data, ev.responder_resources, ev.initiator_depth, &*sink) {
                                    Ok(login) => {
                                        let state = login.cm.clone();
                                        let peer = login.peer;
                                        conns.insert(key, state);
                                        if !sink.accept(portal, Box::new(login)) {
                                            // The server logged why (rate-limited).
                                            log::debug!("iSER portal {addr}: login refused; dropping {peer}");
                                            conns.remove(&key);
                                        }
                                    }
                                    Err(e) => log::warn!("iSER portal {addr}: connection refused: {e}"),
                                }
                            }
                        }
                        CmEventType::Established => {
                            if let Some(c) = conns.get(&ev.id) {
                                c.established.store(true, Ordering::Release);
                            }
                        }
                        t => {
                            if let Some(c) = conns.remove(&ev.id) {
                                log::info!("iSER portal {addr}: {t:?}: the connection closes");
                                c.closed.store(true, Ordering::Release);
                            }
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    log::error!("iSER portal {addr}: CM event channel failed: {e}");
                    thread::sleep(Duration::from_millis(100));
                    break;
                }
            }
        }
        if (listener.is_none() || refresh_until.is_some()) && Instant::now() >= next_retry {
            next_retry = Instant::now() + RELISTEN_EVERY;
            if refresh_until.is_some_and(|t| Instant::now() < t) {
                // The buffers the closing connections held come back registered: let them go.
                riser_rdma::release_idle_iobuf_registrations();
                if let Err(e) = riser_rdma::refresh_cm_devices() {
                    log::debug!("iSER portal {addr}: {e}");
                }
            } else {
                refresh_until = None;
            }
            if listener.is_none() {
                match listen(&channel, addr) {
                    Ok(l) => {
                        log::info!("iSER portal {addr} (portal group {tag}): listening again");
                        listener_key = Some(l.key());
                        listener = Some(l);
                    }
                    Err(e) => log::debug!("iSER portal {addr}: not listening yet: {e}"),
                }
            }
        }
        if !busy {
            // Blocks on the channel rather than polling it: an idle portal wakes 100 times a
            // second, not 2000 (each wake-up an unpinned thread that may land on a reactor's
            // core), and a connect request is handled as it comes.
            if let Err(e) = channel.wait(PORTAL_WAIT) {
                log::error!("iSER portal {addr}: cannot wait for CM events: {e}");
                thread::sleep(PORTAL_WAIT);
            }
        }
    }
    drop(listener);
    log::info!("iSER portal {addr}: stopped");
}

/// CONNECT_REQUEST: QP on the shared CQ of the reactor `sink` places it on (the CQ opened
/// and its poller attached to that reactor if it has none with room), one login receive,
/// accept.
fn setup(
    mut id: CmId,
    pds: &mut HashMap<String, Arc<ProtectionDomain>>,
    private_data: &[u8],
    peer_responder_resources: u8,
    peer_initiator_depth: u8,
    sink: &dyn LoginSink,
) -> Result<IserLogin, IserError> {
    let reactor = sink.place();
    let ctx: Arc<Context> = id.context()?.ok_or(IserError::NoDevice)?;
    let attr = ctx.query_device()?;
    let pd = match pds.get(ctx.name()).filter(|pd| pd.context().as_raw() == ctx.as_raw()) {
        Some(pd) => pd.clone(),
        None => {
            let pd = ProtectionDomain::new(&ctx)?;
            pds.insert(ctx.name().to_string(), pd.clone());
            pd
        }
    };
    let max_wr = attr.max_qp_wr.max(64) as u32;
    let send_wr = 1024u32.min(max_wr);
    // The queue depth is negotiated later: room for the receive ring of the deepest session.
    let recv_wr = IserConfig::for_queue_depth(MAX_QUEUE_DEPTH, 0).recv_wr().min(max_wr);
    let depth = send_wr + recv_wr;
    let cap = SHARED_CQ_ENTRIES.min(attr.max_cqe.max(128) as u32).max(depth);
    let (shared, poller) = CQS.cq_for(ctx.as_raw() as usize, reactor, depth, || {
        // A completion channel lets an adaptive reactor sleep until a completion comes.
        let channel = CompletionChannel::new(&ctx)
            .map_err(|e| log::warn!("iSER: no completion channel ({e}); an idle reactor notices completions when it wakes"))
            .ok();
        let cq = CompletionQueue::new(&ctx, cap, channel.as_ref(), 0)
            .map_err(|source| IserError::CreateCq { entries: cap, source })?;
        Ok((VerbsCq::new(cq.clone(), channel), cq, cap))
    })?;
    if let Some(mut poller) = poller {
        // The reactor owns the new CQ: it alone polls it, from now on.
        let attached = sink.attach_poller(
            reactor,
            Box::new(move || match poller.pass() {
                PollerPass::Busy => PollerStatus::Busy,
                PollerPass::Idle => PollerStatus::Idle,
                PollerPass::Done => PollerStatus::Done,
            }),
        );
        if !attached {
            return Err(IserError::NoReactor(reactor));
        }
    }
    id.create_qp(
        &pd,
        &QpInitAttr {
            send_cq: shared.handle().clone(),
            recv_cq: shared.handle().clone(),
            srq: None,
            caps: QpCaps { max_send_wr: send_wr, max_recv_wr: recv_wr, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            sq_sig_all: false,
        },
    )?;
    let qp_num = id.qp().map(|q| q.qp_num()).ok_or(IserError::NoQueuePair)?;
    let member = shared.join(depth)?;
    let peer = id.peer_addr().ok_or(IserError::NoPeerAddress)?;
    let local = id.local_addr();
    // Our RDMA Reads are bounded by what the peer can answer (its responder resources).
    let rd_depth = peer_responder_resources.min(attr.max_qp_init_rd_atom.min(255) as u8).max(1);
    let login_buf = registered_pool(&pd, 2, LOGIN_SLOT)?;
    let mut qp = VerbsQp::shared(id, member);
    qp.post_recv(WR_LOGIN_RECV, login_buf.sge(0, LOGIN_SLOT))?;
    let flags = cm::flags(private_data);
    log::debug!(
        "iSER connect from {peer}: private data flags {flags:#04x}, peer IRD {peer_responder_resources} ORD {peer_initiator_depth}, reactor {reactor}, QP {qp_num}"
    );
    // Send with Invalidate only when the initiator said it takes it (Linux ib_iser does when
    // it registers every task's memory, its default; no private data: not) and the device can
    // post it (memory management extensions, as Linux isert checks).
    let send_invalidate = cm::use_send_with_invalidate(private_data, supports_send_with_invalidate(&attr));
    let reply = cm::reply(send_invalidate);
    qp.cm_id().accept(&ConnParam {
        private_data: &reply,
        responder_resources: peer_initiator_depth.min(attr.max_qp_rd_atom.min(255) as u8),
        initiator_depth: rd_depth,
        rnr_retry_count: 7,
        ..Default::default()
    })?;
    Ok(IserLogin {
        qp: Some(qp),
        dm: None,
        pd,
        login_buf,
        peer,
        local,
        rdma_reads: rd_depth as u32,
        send_wr,
        send_invalidate,
        reactor,
        cm: Arc::new(CmState { logging_in: AtomicBool::new(true), ..CmState::default() }),
        rx: VecDeque::new(),
        early: Vec::new(),
    })
}

/// One iSER connection during login. Until Allocate_Connection_Resources it drives its QP
/// itself (one login receive, one send slot); after, through its datamover.
pub struct IserLogin {
    qp: Option<VerbsQp>,
    dm: Option<IserDatamover<VerbsQp>>,
    pd: Arc<ProtectionDomain>,
    login_buf: Pool,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    rdma_reads: u32,
    /// The send queue's depth (max_send_wr as asked; the device may grant more).
    send_wr: u32,
    /// Both sides agreed to Send with Invalidate (CM private data).
    send_invalidate: bool,
    /// The reactor whose CQ the QP completes on: a new session goes there.
    reactor: usize,
    cm: Arc<CmState>,
    /// Login PDUs received and not yet handed out.
    rx: VecDeque<LoginRx>,
    /// Events of full-feature phase that arrived while the last Login Response went out:
    /// the connection gets them first.
    early: Vec<DmEvent>,
}

impl IserLogin {
    /// Polls the QP (or the datamover) once; received login PDUs go to `rx`.
    fn poll(&mut self) -> Result<(), TransportError> {
        if let Some(dm) = self.dm.as_mut() {
            let mut ev = Vec::new();
            dm.poll(&mut ev);
            for e in ev {
                match e {
                    DmEvent::Control(pdu) => self.rx.push_back(LoginRx::Pdu(pdu)),
                    DmEvent::Terminated(why) => return Err(TransportError::Failed(why)),
                    _ => {}
                }
            }
        } else if let Some(qp) = self.qp.as_mut() {
            let mut wcs: Vec<Completion> = Vec::new();
            qp.poll(&mut wcs, 8);
            for wc in wcs {
                if wc.error.is_some() {
                    return Err(TransportError::Failed("connection lost".into()));
                }
                if wc.wr_id == WR_LOGIN_RECV {
                    let msg = self.login_buf.read(0, wc.byte_len as usize);
                    let rx = match IserHeader::parse(&msg) {
                        Ok(IserHeader::Control { .. }) => match Pdu::decode_message(&msg[ISER_HDR_LEN..], 8192) {
                            Ok(pdu) => LoginRx::Pdu(pdu),
                            // With its header the login answers Initiator Error at once;
                            // without, nothing can be answered: the connection ends.
                            Err(e) => match msg.get(ISER_HDR_LEN..ISER_HDR_LEN + BHS_LEN) {
                                Some(h) => {
                                    let mut header = [0u8; BHS_LEN];
                                    header.copy_from_slice(h);
                                    LoginRx::Malformed { header: Some(header), reason: format!("bad PDU: {e}") }
                                }
                                None => LoginRx::Malformed { header: None, reason: format!("bad PDU during login: {e}") },
                            },
                        },
                        // IB and RoCE have no Hello (RFC 7145's IB generalization); anything but
                        // a control-type message ends the login at once (the login driver
                        // answers Initiator Error to the last Login Request, if there was one).
                        Ok(other) => LoginRx::Malformed {
                            header: None,
                            reason: format!("unexpected iSER message during login: {other:?}"),
                        },
                        Err(e) => LoginRx::Malformed { header: None, reason: format!("undecodable message during login: {e}") },
                    };
                    self.rx.push_back(rx);
                }
            }
        } else {
            return Err(TransportError::Closed);
        }
        Ok(())
    }
}

impl LoginTransport for IserLogin {
    fn kind(&self) -> Transport {
        Transport::Iser
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn local(&self) -> Option<SocketAddr> {
        self.local
    }

    fn reactor_hint(&self) -> Option<usize> {
        Some(self.reactor)
    }

    fn recv_login(&mut self, deadline: Instant) -> Result<LoginRx, TransportError> {
        loop {
            if let Some(rx) = self.rx.pop_front() {
                return Ok(rx);
            }
            if self.cm.closed.load(Ordering::Acquire) {
                return Err(TransportError::Closed);
            }
            if self.cm.established.load(Ordering::Acquire) {
                self.poll()?;
                if !self.rx.is_empty() {
                    continue;
                }
            }
            if Instant::now() >= deadline {
                return Err(TransportError::TimedOut);
            }
            thread::sleep(LOGIN_POLL_IDLE);
        }
    }

    /// Posting never blocks (a full send queue is an error), so the deadline holds as it is.
    fn send_login(&mut self, pdu: Pdu, _deadline: Instant) -> Result<(), TransportError> {
        let last = matches!(&pdu.bhs.op, Op::LoginResponse(r) if r.status.class != 0 || (r.transit_bit && r.nsg == Stage::FullFeaturePhase));
        if let Some(dm) = self.dm.as_mut() {
            dm.send_control(pdu);
            // Push it out now; what arrives meanwhile is kept for later.
            let mut ev = Vec::new();
            dm.poll(&mut ev);
            for e in ev {
                match e {
                    DmEvent::Control(pdu) if !last => self.rx.push_back(LoginRx::Pdu(pdu)),
                    e => self.early.push(e),
                }
            }
            return Ok(());
        }
        let qp = self.qp.as_mut().ok_or(TransportError::Closed)?;
        if !last {
            qp.post_recv(WR_LOGIN_RECV, self.login_buf.sge(0, LOGIN_SLOT))
                .map_err(|e| TransportError::Failed(e.to_string()))?;
        }
        let mut msg = IserHeader::TARGET_CONTROL.to_vec();
        pdu.encode_message(&mut msg).map_err(|e| TransportError::Failed(format!("cannot encode response: {e}")))?;
        self.login_buf.write(1, &msg);
        let wr = SendWr { wr_id: WR_LOGIN_SEND, op: SendOp::Send, sge: self.login_buf.sge(1, msg.len()), signaled: true };
        qp.post_send(&[wr]).map_err(|e| TransportError::Failed(e.to_string()))
    }

    fn allocate_connection_resources(&mut self, keys: &ResourceKeys) -> Result<(), TransportError> {
        // The receive ring from the session's queue depth (InitialR2T=Yes: no unsolicited
        // Data-Out), which is also what the target declared as MaxOutstandingUnexpectedPDUs.
        // Data moves straight between the tasks' buffers and the initiator's (registered
        // in place): the pools hold control messages only.
        let cfg = IserConfig {
            max_rdma_reads: self.rdma_reads,
            send_invalidate: self.send_invalidate,
            send_queue_depth: self.send_wr as usize,
            ..IserConfig::for_queue_depth(keys.queue_depth.clamp(1, MAX_QUEUE_DEPTH), 0)
        };
        let [r, s, l] = IserDatamover::<VerbsQp>::pool_sizes(&cfg);
        let pools = (|| -> Result<(Pool, Pool, Pool), IserError> {
            Ok((
                registered_pool(&self.pd, r.0, r.1)?,
                registered_pool(&self.pd, s.0, s.1)?,
                registered_pool(&self.pd, l.0, l.1)?,
            ))
        })()
        .map_err(|e| TransportError::Failed(e.to_string()))?;
        let qp = self.qp.take().ok_or(TransportError::Closed)?;
        let dm = IserDatamover::new(qp, cfg, pools)
            .map_err(|e| TransportError::Failed(format!("cannot post the receive ring: {e}")))?;
        self.dm = Some(dm);
        Ok(())
    }

    fn enable_datamover(self: Box<Self>) -> Result<EnableDatamover, TransportError> {
        let me = *self;
        let dm = me
            .dm
            .ok_or_else(|| TransportError::Failed("login completed without datamover resources".into()))?;
        let (cm, early) = (me.cm, me.early);
        cm.logging_in.store(false, Ordering::Release);
        Ok(Box::new(move || Ok(Box::new(IserConnection { dm, cm, early, cm_closed: false }) as Box<dyn Datamover>)))
    }

    fn linger(&mut self) {
        // Push the last response out, then give the initiator the time to read it and close
        // (bounded): destroying the QP at once can reach it as a disconnect before the
        // response it has received is handled (libiscsi then reports an event failure, not
        // the status).
        let until = Instant::now() + FAILED_LINGER;
        while !self.cm.closed.load(Ordering::Acquire) && Instant::now() < until {
            if let Some(dm) = self.dm.as_mut() {
                let mut ev = Vec::new();
                dm.poll(&mut ev);
            } else if let Some(qp) = self.qp.as_mut() {
                let mut wcs: Vec<Completion> = Vec::new();
                qp.poll(&mut wcs, 8);
            }
            thread::sleep(LOGIN_POLL_IDLE);
        }
    }
}

/// The datamover of an iSER connection in full-feature phase, with what its CM says: a
/// DISCONNECTED (or device removal) terminates it.
struct IserConnection {
    dm: IserDatamover<VerbsQp>,
    cm: Arc<CmState>,
    early: Vec<DmEvent>,
    cm_closed: bool,
}

impl Datamover for IserConnection {
    fn send_control(&mut self, pdu: Pdu) {
        self.dm.send_control(pdu)
    }
    fn put_data(&mut self, req: PutData) {
        self.dm.put_data(req)
    }
    fn get_data(&mut self, req: GetData) {
        self.dm.get_data(req)
    }
    fn notice_key_values(&mut self, params: DatamoverParams) {
        self.dm.notice_key_values(params)
    }
    fn deallocate_task_resources(&mut self, itt: Itt) -> Option<IoBuf> {
        self.dm.deallocate_task_resources(itt)
    }
    fn connection_terminate(&mut self) {
        self.dm.connection_terminate()
    }
    fn poll(&mut self, events: &mut Vec<DmEvent>) -> usize {
        let early = self.early.len();
        events.append(&mut self.early);
        if !self.cm_closed && self.cm.closed.load(Ordering::Acquire) {
            // The peer or the device is gone: nothing queued can reach it any more.
            self.cm_closed = true;
            self.dm.connection_terminate();
            events.push(DmEvent::Terminated("disconnected (RDMA CM event)".into()));
            return early + 1;
        }
        early + self.dm.poll(events)
    }
    fn idle(&self) -> bool {
        self.early.is_empty() && self.dm.idle()
    }
    fn copies(&self) -> riser_iscsi::ffp::CopyStats {
        self.dm.copies()
    }
    fn set_write_buffers(&mut self, wb: riser_iscsi::ffp::WriteBuffers) {
        self.dm.set_write_buffers(wb)
    }
    fn recycle(&mut self, segment: Vec<u8>) {
        self.dm.recycle(segment)
    }
    fn tx_backlog(&self) -> riser_iscsi::ffp::TxBacklog {
        self.dm.tx_backlog()
    }
    fn limit_tx_queue(&mut self, limit: riser_iscsi::ffp::TxLimit) {
        self.dm.limit_tx_queue(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_iscsi::login::ReactorPoller;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A server's side as the portal sees it: `per_source` logins per address, `max` in all,
    /// counting the connections it accepted.
    struct Slots {
        max: usize,
        per_source: usize,
        held: Mutex<HashMap<std::net::IpAddr, usize>>,
    }

    impl Slots {
        fn hold(&self, peer: SocketAddr) {
            *self.held.lock().expect("lock").entry(peer.ip()).or_insert(0) += 1;
        }
    }

    impl LoginSink for Slots {
        fn accept(&self, _: PortalSpec, _: Box<dyn LoginTransport>) -> bool {
            unreachable!("the test accepts through hold")
        }
        fn may_accept(&self, peer: SocketAddr) -> bool {
            let held = self.held.lock().expect("lock");
            held.values().sum::<usize>() < self.max && held.get(&peer.ip()).copied().unwrap_or(0) < self.per_source
        }
        fn max_logins(&self) -> Option<usize> {
            Some(self.max)
        }
        fn place(&self) -> usize {
            0
        }
        fn attach_poller(&self, _: usize, _: ReactorPoller) -> bool {
            false
        }
    }

    fn at(a: &str) -> Option<SocketAddr> {
        Some(a.parse().expect("addr"))
    }

    /// Two sources stalling logins up to their per-source limit (32 each, 64 in all) do not
    /// lock out a third: a source at its limit is rejected before a QP is built, and the
    /// portal's own cap is the server's max_logins (1024), not 64.
    #[test]
    fn stalled_sources_are_rejected_before_setup_and_leave_room() {
        let sink = Slots { max: 1024, per_source: 32, held: Mutex::new(HashMap::new()) };
        let mut pending = 0;
        for a in ["10.0.0.1:1000", "10.0.0.2:1000"] {
            for _ in 0..40 {
                match admit(pending, at(a), &sink) {
                    Ok(peer) => {
                        sink.hold(peer);
                        pending += 1;
                    }
                    Err(why) => assert_eq!(why, Reject::Refused, "{a} over its share"),
                }
            }
        }
        assert_eq!(pending, 64, "32 QPs for each stalling source, no more");
        assert_eq!(admit(pending, at("10.0.0.3:1000"), &sink), Ok("10.0.0.3:1000".parse().expect("addr")));
        assert_eq!(admit(pending, None, &sink), Err(Reject::NoPeer));
        // The portal's cap is the server's max_logins.
        assert_eq!(admit(1024, at("10.0.0.4:1000"), &sink), Err(Reject::Pending { pending: 1024, cap: 1024 }));
    }

    /// A sink that does not say its limits gets the default cap, and every peer may come.
    #[test]
    fn without_the_servers_limits_the_default_cap_holds() {
        struct Any;
        impl LoginSink for Any {
            fn accept(&self, _: PortalSpec, _: Box<dyn LoginTransport>) -> bool {
                true
            }
            fn place(&self) -> usize {
                0
            }
            fn attach_poller(&self, _: usize, _: ReactorPoller) -> bool {
                false
            }
        }
        assert!(admit(DEFAULT_PENDING_LOGINS - 1, at("10.0.0.1:1"), &Any).is_ok());
        assert_eq!(
            admit(DEFAULT_PENDING_LOGINS, at("10.0.0.1:1"), &Any),
            Err(Reject::Pending { pending: DEFAULT_PENDING_LOGINS, cap: DEFAULT_PENDING_LOGINS })
        );
    }
}
