//! iSER portals: an rdma_cm listener per portal, connection setup as Linux ib_iser expects,
//! login over RC SENDs, and Enable_Datamover to a reactor (RFC 7145, the IB generalization).
//!
//! One control-plane thread per portal owns the CM event channel and every connection
//! still logging in. A connection's life:
//! 1. CONNECT_REQUEST: a reactor is chosen for the connection (the least loaded) and its RC
//!    QP created on that reactor's shared CQ for the device (see
//!    riser_datamover::iser::shared_cq: one CQ per reactor and device, polled in batches);
//!    ONE login receive buffer is posted, then accept (initiator depth = min(the peer's
//!    responder resources, the device's limit); private data: no zero-based VA, Send with
//!    Invalidate when the initiator supports it). The login is polled here, through the same
//!    shared CQ.
//! 2. Login PDUs arrive in RC SENDs behind the 28-byte iSER header; the login receive is
//!    reposted before each non-final response.
//! 3. When the login reaches operational negotiation (after any security stage, the rule
//!    against denial of service) the datamover resources are allocated: receive ring, send
//!    buffers, data chunks, all registered once; the whole receive ring is posted before
//!    the final Login Response goes out through the datamover.
//! 4. Enable_Datamover: the datamover moves to the session's reactor: the one chosen at
//!    connect for a new session (so its completions are polled where they arrive), the
//!    session's own for a connection joining one (its CQ is then polled from both).
//!
//! DISCONNECTED and other CM events for live connections close them through the registry.
//! DEVICE_REMOVAL (the RDMA device went away, e.g. `rdma link delete`): the kernel cannot
//! finish removing a soft-RoCE device while a process holds anything on it, so the portal
//! drops its listener and cached PD, the connections on the device close, librdmacm is asked
//! to re-read its device list (it then closes its own context of the device), and the portal
//! listens again once the address has a device.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use riser_datamover::iser::conn::{Completion, IserConfig, IserDatamover, IserQp, Pool, SendOp, SendWr};
use riser_datamover::iser::header::{cm, IserHeader, ISER_HDR_LEN};
use riser_datamover::iser::shared_cq::CqSet;
use riser_datamover::iser::verbs::{registered_pool, VerbsCq, VerbsQp};
use riser_iscsi::ffp::{Datamover, DmEvent};
use riser_iscsi::login::{Login, LoginContext, LoginEvent, LoginOutput};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::pdu::{Op, Pdu, BHS_LEN};
use riser_rdma::{CmEventType, CmId, CmIdKey, CompletionQueue, ConnParam, Context, EventChannel, ProtectionDomain, QpCaps, QpInitAttr};

use crate::server::{IscsiServer, Policy};

const LOGIN_SLOT: usize = ISER_HDR_LEN + BHS_LEN + 1024 + 8192;
const WR_LOGIN_RECV: u64 = 0xA1 << 56;
const WR_LOGIN_SEND: u64 = 0xA2 << 56;
const LOGIN_TIMEOUT: Duration = Duration::from_secs(15);
/// Entries of a shared CQ (at most; less if the device allows less).
const SHARED_CQ_ENTRIES: u32 = 16384;

/// The shared CQs of every iSER portal, by (device, reactor).
static CQS: std::sync::LazyLock<CqSet<VerbsCq>> = std::sync::LazyLock::new(CqSet::default);

/// A connection that has not finished login.
struct Pending {
    /// Until the datamover exists the portal drives the QP itself.
    qp: Option<VerbsQp>,
    dm: Option<IserDatamover<VerbsQp>>,
    pd: Arc<ProtectionDomain>,
    login_buf: Pool,
    login: Login,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    rdma_reads: u32,
    /// Both sides agreed to Send with Invalidate (CM private data).
    send_invalidate: bool,
    /// The reactor whose CQ the QP completes on: a new session goes there.
    reactor: usize,
    established: bool,
    started: Instant,
    done: bool,
    /// The connection's id once it is in full-feature phase.
    conn_id: Option<u64>,
}

/// Starts the listener thread of one iSER portal; `stop` ends it.
pub(crate) fn spawn(server: Arc<IscsiServer>, addr: SocketAddr, tag: u16, stop: Arc<AtomicBool>) -> Result<(), String> {
    let channel = EventChannel::new().map_err(|e| format!("rdma_cm event channel: {e}"))?;
    let listener = listen(&channel, addr)?;
    thread::Builder::new()
        .name(format!("iser-{}", addr.port()))
        .spawn(move || run(server, channel, listener, addr, tag, stop))
        .map_err(|e| format!("cannot start the iSER portal thread: {e}"))?;
    Ok(())
}

/// A listening id on `addr` (bound to the device that has the address).
fn listen(channel: &EventChannel, addr: SocketAddr) -> Result<CmId, String> {
    let listener = CmId::new(channel).map_err(|e| format!("rdma_cm id: {e}"))?;
    listener.bind_addr(addr).map_err(|e| format!("bind {addr} (is there an RDMA device with this address?): {e}"))?;
    listener.listen(128).map_err(|e| format!("listen on {addr}: {e}"))?;
    Ok(listener)
}

/// How often a portal whose device went away tries to listen again.
const RELISTEN_EVERY: Duration = Duration::from_secs(1);
/// How long after a device removal the portal keeps asking librdmacm to re-read the device
/// list (see [`riser_rdma::refresh_cm_devices`]), once per [`RELISTEN_EVERY`].
const REFRESH_FOR: Duration = Duration::from_secs(120);

fn run(server: Arc<IscsiServer>, channel: EventChannel, listener: CmId, addr: SocketAddr, tag: u16, stop: Arc<AtomicBool>) {
    log::info!("iSER portal {addr} (portal group {tag}): listening");
    // None while the portal's device is gone (DEVICE_REMOVAL): retried every RELISTEN_EVERY.
    let mut listener = Some(listener);
    let mut listener_key = listener.as_ref().map(CmId::key);
    // After a device removal: when to retry / refresh next, and until when to refresh.
    let mut next_retry = Instant::now();
    let mut refresh_until: Option<Instant> = None;
    let mut pds: HashMap<String, Arc<ProtectionDomain>> = HashMap::new();
    let mut pending: HashMap<CmIdKey, Pending> = HashMap::new();
    // Connections in full-feature phase, by CM id, to close them on CM events.
    let mut live: HashMap<CmIdKey, u64> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let mut busy = false;
        loop {
            match channel.poll_event() {
                Ok(Some(ev)) => {
                    busy = true;
                    if ev.event_type == CmEventType::DeviceRemoval {
                        // Everything on the device must go for its removal to complete: the
                        // cached PD now (connections hold their own until they are freed),
                        // the listener and the connections below (each id gets this event).
                        pds.clear();
                        refresh_until = Some(Instant::now() + REFRESH_FOR);
                        next_retry = Instant::now() + RELISTEN_EVERY;
                        if listener_key == Some(ev.id) {
                            log::warn!(
                                "iSER portal {addr}: RDMA device removed; {} login(s) and {} connection(s) on it close, listening again once the address has a device",
                                pending.len(),
                                live.len()
                            );
                            listener = None;
                            listener_key = None;
                            continue;
                        }
                    }
                    match ev.event_type {
                        CmEventType::ConnectRequest => {
                            if let Some(id) = ev.new_id {
                                let key = id.key();
                                match setup(&server, id, &mut pds, &ev.private_data, ev.responder_resources, ev.initiator_depth, tag) {
                                    Ok(p) => {
                                        pending.insert(key, p);
                                    }
                                    Err(e) => log::warn!("iSER portal {addr}: connection refused: {e}"),
                                }
                            }
                        }
                        CmEventType::Established => {
                            if let Some(p) = pending.get_mut(&ev.id) {
                                p.established = true;
                            }
                        }
                        t => {
                            if let Some(p) = pending.remove(&ev.id) {
                                log::info!("iSER login from {}: {t:?} before login completed", p.peer);
                            }
                            if let Some(conn) = live.remove(&ev.id) {
                                log::info!("iSER connection {conn}: {t:?}");
                                server.connections().kill_where(|c| c.id == conn);
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
        let keys: Vec<CmIdKey> = pending.keys().copied().collect();
        for key in keys {
            let Some(p) = pending.get_mut(&key) else { continue };
            if p.started.elapsed() > LOGIN_TIMEOUT {
                log::warn!("iSER login from {}: timed out", p.peer);
                pending.remove(&key);
                continue;
            }
            if !p.established {
                continue;
            }
            busy |= step(&server, p, tag);
            if p.done || (p.dm.is_none() && p.qp.is_none()) {
                if let Some(id) = p.conn_id {
                    // Connections that ended on their own (logout, errors) never get another
                    // CM event once their id is destroyed: forget them here.
                    let ids: Vec<u64> = server.connections().list().iter().map(|c| c.id).collect();
                    live.retain(|_, c| ids.contains(c));
                    live.insert(key, id);
                }
                pending.remove(&key);
            }
        }
        if (listener.is_none() || refresh_until.is_some()) && Instant::now() >= next_retry {
            next_retry = Instant::now() + RELISTEN_EVERY;
            if refresh_until.is_some_and(|t| Instant::now() < t) {
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
            thread::sleep(Duration::from_micros(500));
        }
    }
    drop(listener);
    log::info!("iSER portal {addr}: stopped");
}

/// CONNECT_REQUEST: QP, one login receive, accept.
fn setup(
    server: &Arc<IscsiServer>,
    mut id: CmId,
    pds: &mut HashMap<String, Arc<ProtectionDomain>>,
    private_data: &[u8],
    peer_responder_resources: u8,
    peer_initiator_depth: u8,
    tag: u16,
) -> Result<Pending, String> {
    let ctx: Arc<Context> = id.context().map_err(|e| e.to_string())?.ok_or("no device for the connection")?;
    let attr = ctx.query_device().map_err(|e| e.to_string())?;
    let pd = match pds.get(ctx.name()).filter(|pd| pd.context().as_raw() == ctx.as_raw()) {
        Some(pd) => pd.clone(),
        None => {
            let pd = ProtectionDomain::new(&ctx).map_err(|e| e.to_string())?;
            pds.insert(ctx.name().to_string(), pd.clone());
            pd
        }
    };
    let cfg = IserConfig::default();
    let max_wr = attr.max_qp_wr.max(64) as u32;
    let send_wr = 1024u32.min(max_wr);
    let recv_wr = (cfg.recv_slots as u32 + 8).min(max_wr);
    let depth = send_wr + recv_wr;
    let reactor = server.least_loaded_reactor();
    let cap = SHARED_CQ_ENTRIES.min(attr.max_cqe.max(128) as u32).max(depth);
    let shared = CQS.cq_for(ctx.as_raw() as usize, reactor, depth, || {
        let cq = CompletionQueue::new(&ctx, cap, None, 0).map_err(|e| format!("cannot create a CQ of {cap} entries: {e}"))?;
        Ok((VerbsCq::new(cq), cap))
    })?;
    id.create_qp(
        &pd,
        &QpInitAttr {
            send_cq: shared.source().cq().clone(),
            recv_cq: shared.source().cq().clone(),
            srq: None,
            caps: QpCaps { max_send_wr: send_wr, max_recv_wr: recv_wr, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            sq_sig_all: false,
        },
    )
    .map_err(|e| e.to_string())?;
    let qp_num = id.qp().map(|q| q.qp_num()).ok_or("no queue pair")?;
    let member = shared.join(qp_num, depth)?;
    let peer = id.peer_addr().ok_or("no peer address")?;
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
    // it registers every task's memory, its default); no private data: not.
    let send_invalidate = private_data.len() >= 4 && flags & cm::SEND_W_INV_NOT_SUPPORTED == 0;
    let reply = cm::reply(send_invalidate);
    qp.cm_id()
        .accept(&ConnParam {
            private_data: &reply,
            responder_resources: peer_initiator_depth.min(attr.max_qp_rd_atom.min(255) as u8),
            initiator_depth: rd_depth,
            rnr_retry_count: 7,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let _ = server;
    Ok(Pending {
        qp: Some(qp),
        dm: None,
        pd,
        login_buf,
        login: Login::new(LoginContext {
            initiator_address: Some(peer.ip()),
            portal_group_tag: tag,
            transport: Transport::Iser,
            ..Default::default()
        }),
        peer,
        local,
        rdma_reads: rd_depth as u32,
        send_invalidate,
        reactor,
        established: false,
        started: Instant::now(),
        done: false,
        conn_id: None,
    })
}

/// Moves one login forward; true if anything happened.
fn step(server: &Arc<IscsiServer>, p: &mut Pending, tag: u16) -> bool {
    let mut pdus = Vec::new();
    let mut work = false;
    if let Some(dm) = p.dm.as_mut() {
        let mut ev = Vec::new();
        dm.poll(&mut ev);
        for e in ev {
            work = true;
            match e {
                DmEvent::Control(pdu) => pdus.push(pdu),
                DmEvent::Terminated(why) => {
                    log::info!("iSER login from {}: {why}", p.peer);
                    p.dm = None;
                    return true;
                }
                _ => {}
            }
        }
    } else if let Some(qp) = p.qp.as_mut() {
        let mut wcs: Vec<Completion> = Vec::new();
        qp.poll(&mut wcs, 8);
        for wc in wcs {
            work = true;
            if wc.error.is_some() {
                log::info!("iSER login from {}: connection lost", p.peer);
                p.qp = None;
                return true;
            }
            if wc.wr_id == WR_LOGIN_RECV {
                let msg = p.login_buf.read(0, wc.byte_len as usize);
                match IserHeader::parse(&msg) {
                    Ok(IserHeader::Control { .. }) => match Pdu::decode_message(&msg[ISER_HDR_LEN..], 8192) {
                        Ok(pdu) => pdus.push(pdu),
                        Err(e) => log::warn!("iSER login from {}: bad PDU: {e}", p.peer),
                    },
                    _ => log::warn!("iSER login from {}: unexpected message", p.peer),
                }
            }
        }
    }
    let mut policy = Policy::new(server, p.peer.ip(), tag as u32).with_reactor(p.reactor);
    for pdu in pdus {
        p.login.handle(&pdu, &mut policy);
    }
    while let Some(out) = p.login.poll_output() {
        work = true;
        match out {
            LoginOutput::Transmit(pdu) => {
                let last = matches!(&pdu.bhs.op, Op::LoginResponse(r) if r.status.class != 0 || (r.transit_bit && r.nsg == riser_iscsi::pdu::Stage::FullFeaturePhase));
                if let Some(dm) = p.dm.as_mut() {
                    dm.send_control(pdu);
                    let mut ev = Vec::new();
                    dm.poll(&mut ev);
                } else if let Some(qp) = p.qp.as_mut() {
                    if !last {
                        if let Err(e) = qp.post_recv(WR_LOGIN_RECV, p.login_buf.sge(0, LOGIN_SLOT)) {
                            log::warn!("iSER login from {}: {e}", p.peer);
                        }
                    }
                    let mut msg = IserHeader::TARGET_CONTROL.to_vec();
                    if pdu.encode_message(&mut msg).is_ok() {
                        p.login_buf.write(1, &msg);
                        let wr = SendWr { wr_id: WR_LOGIN_SEND, op: SendOp::Send, sge: p.login_buf.sge(1, msg.len()), signaled: true };
                        if let Err(e) = qp.post_send(&[wr]) {
                            log::warn!("iSER login from {}: {e}", p.peer);
                        }
                    }
                }
            }
            LoginOutput::Event(LoginEvent::AllocateDatamoverResources) => {
                let cfg = IserConfig {
                    max_rdma_reads: p.rdma_reads,
                    data_chunks: 64,
                    send_invalidate: p.send_invalidate,
                    ..IserConfig::default()
                };
                let [r, s, d] = IserDatamover::<VerbsQp>::pool_sizes(&cfg);
                let pools = (|| -> Result<(Pool, Pool, Pool), String> {
                    Ok((registered_pool(&p.pd, r.0, r.1)?, registered_pool(&p.pd, s.0, s.1)?, registered_pool(&p.pd, d.0, d.1)?))
                })();
                match (pools, p.qp.take()) {
                    (Ok(pools), Some(qp)) => match IserDatamover::new(qp, cfg, pools) {
                        Ok(dm) => p.dm = Some(dm),
                        Err(e) => log::error!("iSER login from {}: cannot post the receive ring: {e}", p.peer),
                    },
                    (Err(e), _) => log::error!("iSER login from {}: {e}", p.peer),
                    (Ok(_), None) => {}
                }
            }
            LoginOutput::Event(LoginEvent::Failed { status, reason }) => {
                log::warn!("iSER login from {} failed ({:#04x}{:02x}): {reason}", p.peer, status.class, status.detail);
                // Let the response go out, then drop everything.
                if let Some(dm) = p.dm.as_mut() {
                    let mut ev = Vec::new();
                    dm.poll(&mut ev);
                }
                thread::sleep(Duration::from_millis(20));
                p.dm = None;
                p.qp = None;
            }
            LoginOutput::Event(LoginEvent::Complete(outcome)) => {
                if let Some(dm) = p.dm.take() {
                    p.conn_id = server.enable(p.peer, p.local, *outcome, "iser", move || Ok(dm));
                    if p.conn_id.is_none() {
                        log::warn!("iSER login from {}: could not enable the datamover", p.peer);
                    }
                } else {
                    log::error!("iSER login from {}: login completed without datamover resources", p.peer);
                }
                p.done = true;
            }
        }
    }
    work
}
