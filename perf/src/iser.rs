//! One iSER connection (= one session) of the initiator (RFC 7145, initiator side, as Linux
//! ib_iser does it on InfiniBand / RoCE), over riser's safe verbs wrapper (crate riser-rdma;
//! no `unsafe` here).
//!
//! Setup: rdma_cm resolves the address and the route, an RC QP is created on one CQ, the
//! whole receive ring is posted, then `rdma_connect` with the iSER CM private data (no
//! zero-based VA, no Send with Invalidate: our STag covers every task buffer and must not be
//! invalidated by the target) and our IRD as responder resources. Login runs in RC SENDs
//! behind the 28-byte iSER header (RDMAExtensions=Yes, InitiatorRecvDataSegmentLength,
//! TargetRecvDataSegmentLength, MaxOutstandingUnexpectedPDUs, no digests, InitialR2T=Yes).
//!
//! Full-feature phase: every task's data buffer lives in one registered region (registered
//! once, in [`IserConn::start_io`], never on the data path). A read advertises its buffer as
//! the Read STag + VA in the iSER header (the target RDMA-Writes the data, then SENDs the SCSI
//! Response); a write advertises the part after the immediate data as the Write STag + VA (the
//! target RDMA-Reads it); immediate data rides in the command's SEND as a second SGE pointing
//! into the task buffer (no copy). Commands queued in a pass go out in one `ibv_post_send`
//! chain ([`IserConn::flush`]); the client thread busy-polls the CQ ([`IserConn::poll`]) and
//! reposts consumed receives in one chain per pass.
//!
//! The task buffers seen by the caller ([`IserConn::buf`], [`IserConn::buf_mut`]) are plain
//! memory: a write's buffer is copied into the registered region at submit if it was touched,
//! a read's data is copied out at completion only when asked for (verify mode): the safe
//! wrapper gives no Rust reference into memory the device may write.

use std::collections::VecDeque;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use riser_datamover::iser::header::{cm, IserHeader, TaggedBuffer};
use riser_iscsi::pdu::{Bhs, Lun, Op, MAX_AHS_LENGTH};
use riser_iscsi::serial::Itt;
use riser_rdma::{
    Access, CmEvent, CmEventType, CmId, CompletionChannel, CompletionQueue, ConnParam,
    EventChannel, MemoryRegion, ProtectionDomain, QpCaps, QpInitAttr, RecvWr, SendOp, SendWr, Sge,
    WorkCompletion, WrData,
};

use riser_initiator::scsi::{self, rw_cdb, status, CmdResult, Completion, Dir, IoError, ScsiExec};
use riser_initiator::session::{
    self, AbortStats, IserKeys, KeyNegotiation, LoginOptions, LoginParams, Negotiated, Outcome, Received,
    SessionState, TaskState, Tasks, Transport, LOGIN_MAX_RECV_DSL, MAX_QD, OUR_INITIATOR_RECV_DSL,
};
use crate::sys::wait_fd;
use riser_initiator::url::TargetUrl;

mod wire;
pub use wire::{encode_headers, parse_message, rw_header, HDRS};

/// One receive buffer: the largest PDU the target may send (login text or a full-feature
/// data segment, whichever limit is higher, plus a maximal AHS).
const RECV_SLOT: usize =
    HDRS + MAX_AHS_LENGTH + max_usize(LOGIN_MAX_RECV_DSL, OUR_INITIATOR_RECV_DSL);
/// The SEND buffer of one task's command (headers only; immediate data is a second SGE).
const CMD_SLOT: usize = 128;
/// Control SENDs (login, management commands, NOP-Out, logout), each up to 8 KiB of data.
const CTRL_SLOTS: usize = 8;
const CTRL_SLOT: usize = HDRS + 8192;
/// Where management commands (READ CAPACITY) get their data RDMA-Written.
const MGMT_BUF: usize = 4096;
/// Receives beyond the queue depth: management responses, NOP-Ins, Async Messages, Rejects.
const EXTRA_RECVS: usize = 16;

const WR_RECV: u64 = 1 << 56;
const WR_CMD: u64 = 2 << 56;
const WR_CTRL: u64 = 3 << 56;
const WR_KIND: u64 = 0xff << 56;

const fn max_usize(a: u32, b: u32) -> usize {
    if a > b {
        a as usize
    } else {
        b as usize
    }
}

/// A SEND queued for the next [`IserConn::flush`].
struct PendingSend {
    wr_id: u64,
    sges: [Sge; 2],
    n: usize,
}

pub struct IserConn {
    // Field order is drop order: the id (and its QP) goes before the CQ and the memory.
    id: CmId,
    channel: EventChannel,
    cq: Arc<CompletionQueue>,
    /// Completion events of `cq`, to sleep on when idle (adaptive polling).
    comp: Arc<CompletionChannel>,
    /// Completions taken while arming the CQ for a sleep, handled by the next poll.
    stash: Vec<WorkCompletion>,
    /// Receive ring, command SEND slots, control SEND slots.
    ctrl: MemoryRegion,
    mgmt_mr: MemoryRegion,
    data: Option<MemoryRegion>,
    _pd: Arc<ProtectionDomain>,
    /// "iser://host:port/iqn/lun" for messages.
    pub label: String,
    nrecv: usize,
    cmd_base: usize,
    ctrl_base: usize,
    qd_cap: usize,
    send_cap: usize,
    ctrl_busy: [bool; CTRL_SLOTS],
    wcs: Vec<WorkCompletion>,
    pending: Vec<PendingSend>,
    reposts: Vec<usize>,
    recv_posted: usize,
    sends_outstanding: usize,
    scratch: Vec<u8>,
    pub neg: Negotiated,
    pub iser: IserKeys,
    s: SessionState,
    pub block_size: u32,
    pub num_blocks: u64,
    t: Tasks,
    bs: usize,
    copy_reads: bool,
    timeout: Duration,
    in_login: bool,
    login_rx: VecDeque<(Bhs, Vec<u8>)>,
    /// The target's HelloReply, once it came (iWARP, [`IserOptions::hello`]).
    hello_reply: Option<IserHeader>,
    /// The IRD we announced (responder resources in the CM request; the Hello's iSER-IRD).
    ird: u16,
    /// The data of the Text Response that came ([`IserOptions::text_sendtargets`]).
    text_rx: Option<Vec<u8>>,
}

/// Options of the iSER transport beside the login options, set once by riser-perf's flags
/// ([`set_options`]) before any session starts.
#[derive(Clone, Debug, Default)]
pub struct IserOptions {
    /// `--iser-hello`: offer iSERHelloRequired=Yes and, once logged in, send the iSER Hello
    /// (RFC 7145 §5.1.4, §9.3: iWARP) with these versions (max, min) before anything else;
    /// the HelloReply must accept it, else the session fails with the target's answer.
    pub hello: Option<(u8, u8)>,
    /// Hidden (tests): after login, send a Text Request SendTargets=All in the normal session
    /// (full-feature phase) and print the answer's keys, one `text: KEY=VALUE` line each.
    pub text_sendtargets: bool,
    /// Hidden (tests): log in as a new connection (CID 1) of the existing session with this
    /// TSIH and ISID instead of a new session (multiple connections per session).
    pub join: Option<(u16, [u8; 6])>,
    /// Hidden (tests), a hostile peer: before logging in, RDMA-Write [`ATTACK_LEN`] bytes to
    /// this (STag, address) of the target's; then the login tells whether the target took it.
    pub attack_write: Option<(u32, u64)>,
}

/// The bytes `--iser-attack-write` writes.
const ATTACK_LEN: usize = 512;

static OPTIONS: std::sync::OnceLock<IserOptions> = std::sync::OnceLock::new();

/// Sets the [`IserOptions`] of every iSER session of this process (once; later calls are
/// ignored).
pub fn set_options(o: IserOptions) {
    let _ = OPTIONS.set(o);
}

fn options() -> IserOptions {
    OPTIONS.get().cloned().unwrap_or_default()
}

/// Waits on the CM channel for `want`; any failure event is an error that says what failed.
fn wait_cm(
    ch: &EventChannel,
    label: &str,
    want: CmEventType,
    deadline: Instant,
    what: &str,
) -> Result<CmEvent, String> {
    loop {
        match ch.poll_event() {
            Ok(Some(ev)) if ev.event_type == want => return Ok(ev),
            Ok(Some(ev))
                if ev.event_type.is_failure() || ev.event_type == CmEventType::Disconnected =>
            {
                let hint = match ev.event_type {
                    CmEventType::AddrError => " (no RDMA device reaches this address?)",
                    CmEventType::RouteError => " (no route over RDMA)",
                    CmEventType::Rejected => {
                        " (no iSER portal there, or the target refused the connection)"
                    }
                    CmEventType::Unreachable | CmEventType::ConnectError => {
                        " (is an iSER portal listening there?)"
                    }
                    _ => "",
                };
                return Err(format!(
                    "{label}: {what} failed: {:?}, status {}{hint}",
                    ev.event_type, ev.status
                ));
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(format!("{label}: timed out waiting for {what}"));
                }
                wait_fd(ch.fd(), false, left.min(Duration::from_millis(100)))?;
            }
            Err(e) => return Err(format!("{label}: rdma_cm: {e}")),
        }
    }
}

fn resolve(url: &TargetUrl, label: &str) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = url
        .socket_addr()
        .to_socket_addrs()
        .map_err(|e| format!("{label}: cannot resolve {}: {e}", url.host))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{label}: {} resolves to no address", url.host))
}

impl IserConn {
    /// Connects over RDMA and logs in (normal session, AuthMethod=None). `queue_depth` sizes
    /// the receive ring and the send queue: at most that many I/Os later ([`Self::start_io`]).
    pub fn login(
        url: &TargetUrl,
        opts: &LoginOptions,
        queue_depth: usize,
    ) -> Result<IserConn, String> {
        let label = url.to_string();
        let dst = resolve(url, &label)?;
        let rdma = |what: &str, e: riser_rdma::RdmaError| format!("{label}: {what}: {e}");
        let channel = EventChannel::new().map_err(|e| {
            format!("{label}: cannot use RDMA (rdma_cm event channel: {e}); is there an RDMA device (ibv_devices)?")
        })?;
        let mut id = CmId::new(&channel).map_err(|e| rdma("rdma_create_id", e))?;
        let deadline = Instant::now() + opts.timeout;
        id.resolve_addr(None, dst, opts.timeout)
            .map_err(|e| rdma(&format!("cannot resolve {dst} over RDMA"), e))?;
        wait_cm(
            &channel,
            &label,
            CmEventType::AddrResolved,
            deadline,
            "address resolution",
        )?;
        id.resolve_route(opts.timeout)
            .map_err(|e| rdma("route resolution", e))?;
        wait_cm(
            &channel,
            &label,
            CmEventType::RouteResolved,
            deadline,
            "route resolution",
        )?;
        let ctx = id
            .context()
            .map_err(|e| rdma("device", e))?
            .ok_or_else(|| format!("{label}: no RDMA device for {dst}"))?;
        let attr = ctx
            .query_device()
            .map_err(|e| rdma("ibv_query_device", e))?;
        let pd = ProtectionDomain::new(&ctx).map_err(|e| rdma("ibv_alloc_pd", e))?;

        let qd = queue_depth.clamp(1, MAX_QD);
        let nrecv = qd + EXTRA_RECVS;
        let max_wr = attr.max_qp_wr.max(64) as usize;
        if nrecv > max_wr {
            return Err(format!(
                "{label}: a queue depth of {qd} needs {nrecv} receive work requests; {} allows {max_wr}",
                ctx.name()
            ));
        }
        let send_cap = (2 * qd + CTRL_SLOTS + 8).min(max_wr);
        let cqe = ((send_cap + nrecv + 16) as u32).min(attr.max_cqe.max(256) as u32);
        let comp = CompletionChannel::new(&ctx).map_err(|e| rdma("ibv_create_comp_channel", e))?;
        let cq = CompletionQueue::new(&ctx, cqe, Some(&comp), 0)
            .map_err(|e| rdma("ibv_create_cq", e))?;
        id.create_qp(
            &pd,
            &QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                srq: None,
                caps: QpCaps {
                    max_send_wr: send_cap as u32,
                    max_recv_wr: nrecv as u32,
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .map_err(|e| rdma("rdma_create_qp", e))?;
        let cmd_base = nrecv * RECV_SLOT;
        let ctrl_base = cmd_base + qd * CMD_SLOT;
        let ctrl_len = ctrl_base + CTRL_SLOTS * CTRL_SLOT;
        let ctrl = MemoryRegion::zeroed(&pd, ctrl_len, Access::LOCAL_WRITE)
            .map_err(|e| rdma(&format!("cannot register {ctrl_len} bytes"), e))?;
        let mgmt_mr =
            MemoryRegion::zeroed(&pd, MGMT_BUF, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .map_err(|e| rdma("cannot register the management buffer", e))?;
        let mut c = IserConn {
            id,
            channel,
            cq,
            comp,
            stash: Vec::with_capacity(riser_rdma::POLL_BATCH),
            ctrl,
            mgmt_mr,
            data: None,
            _pd: pd,
            label,
            nrecv,
            cmd_base,
            ctrl_base,
            qd_cap: qd,
            send_cap,
            ctrl_busy: [false; CTRL_SLOTS],
            wcs: vec![WorkCompletion::default(); riser_rdma::POLL_BATCH],
            pending: Vec::with_capacity(qd + CTRL_SLOTS),
            reposts: Vec::with_capacity(nrecv),
            recv_posted: 0,
            sends_outstanding: 0,
            scratch: Vec::with_capacity(RECV_SLOT),
            neg: Negotiated::default(),
            iser: IserKeys::default(),
            s: SessionState::new(Lun(url.lun_field())),
            block_size: 0,
            num_blocks: 0,
            t: Tasks::new(),
            bs: 0,
            copy_reads: true,
            timeout: opts.timeout,
            in_login: true,
            login_rx: VecDeque::new(),
            hello_reply: None,
            ird: attr.max_qp_rd_atom.clamp(1, 255) as u16,
            text_rx: None,
        };
        // The whole ring before connecting: the target may send as soon as it accepts.
        c.reposts.extend(0..nrecv);
        c.repost()?;
        let private = [
            cm::ZBVA_NOT_SUPPORTED | cm::SEND_W_INV_NOT_SUPPORTED,
            0,
            0,
            0,
        ];
        c.id.connect(&ConnParam {
            private_data: &private,
            // Our IRD: the target's RDMA Reads of write data in flight at once.
            responder_resources: c.ird as u8,
            // We issue no RDMA Reads (Linux ib_iser says 1 too).
            initiator_depth: 1,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .map_err(|e| format!("{}: rdma_connect to {dst}: {e}", c.label))?;
        wait_cm(
            &c.channel,
            &c.label,
            CmEventType::Established,
            deadline,
            "the RDMA connection",
        )?;
        if let Some((stag, addr)) = options().attack_write {
            return Err(c.attack_write(url, opts, stag, addr));
        }
        c.do_login(url, opts)?;
        Ok(c)
    }

    /// `--iser-attack-write`: an RDMA Write of [`ATTACK_LEN`] bytes (0xa5) to `stag` at
    /// `addr` on the connection, before any login, then a login. RC delivers in order: the
    /// target handles the write before the Login Request, so a login that completes means the
    /// write landed, and a refused write (iWARP: the target's RNIC answers a TERMINATE and the
    /// connection fails) means no Login Response ever comes. The outcome, as an error.
    fn attack_write(&mut self, url: &TargetUrl, opts: &LoginOptions, stag: u32, addr: u64) -> String {
        let what = format!("RDMA Write of {ATTACK_LEN} bytes to STag {stag:#x} at {addr:#x}");
        let posted = (|| -> Result<(), String> {
            self.mgmt_mr.write_at(0, &[0xa5; ATTACK_LEN]).map_err(|e| e.to_string())?;
            let sge = self.mgmt_mr.sge(0, ATTACK_LEN).map_err(|e| e.to_string())?;
            let wr = SendWr::new(
                WR_CTRL | 0xffff,
                SendOp::RdmaWrite { remote_addr: addr, rkey: stag },
                WrData::Sges(std::slice::from_ref(&sge)),
            )
            .signaled();
            self.id.qp().ok_or("no queue pair")?.post_send(&[wr]).map_err(|e| e.to_string())?;
            self.sends_outstanding += 1;
            Ok(())
        })();
        if let Err(e) = posted {
            return format!("{}: attack: cannot post the {what}: {e}", self.label);
        }
        match self.do_login(url, opts) {
            Ok(()) => format!("{}: attack: ACCEPTED: the target took the {what} (the login after it completed)", self.label),
            Err(e) => format!("{}: attack: REFUSED: the {what} failed the connection before the login completed ({e})", self.label),
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    fn cmd_off(&self, slot: usize) -> usize {
        self.cmd_base + slot * CMD_SLOT
    }

    fn ctrl_off(&self, i: usize) -> usize {
        self.ctrl_base + i * CTRL_SLOT
    }

    fn repost(&mut self) -> Result<(), String> {
        if self.reposts.is_empty() {
            return Ok(());
        }
        let sges: Vec<Sge> = self
            .reposts
            .iter()
            .map(|&s| self.ctrl.sge(s * RECV_SLOT, RECV_SLOT))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", self.label))?;
        let wrs: Vec<RecvWr<'_>> = self
            .reposts
            .iter()
            .zip(&sges)
            .map(|(&s, sge)| RecvWr {
                wr_id: WR_RECV | s as u64,
                sges: std::slice::from_ref(sge),
            })
            .collect();
        let qp = self.id.qp().ok_or("no queue pair")?;
        qp.post_recvs(&wrs)
            .map_err(|e| format!("{}: posting receives: {e}", self.label))?;
        self.recv_posted += wrs.len();
        drop(wrs);
        self.reposts.clear();
        Ok(())
    }

    /// Queues a control SEND (login, management command, NOP-Out, logout).
    fn send_ctrl(&mut self, hdr: IserHeader, op: Op, data: &[u8]) -> Result<(), String> {
        if data.len() > CTRL_SLOT - HDRS {
            return Err(format!(
                "{}: a {}-byte data segment is too long for a control SEND",
                self.label,
                data.len()
            ));
        }
        let i = self
            .ctrl_busy
            .iter()
            .position(|b| !b)
            .ok_or_else(|| format!("{}: every control send buffer is busy", self.label))?;
        let off = self.ctrl_off(i);
        let head = encode_headers(hdr, op, data.len());
        let err = |e: riser_rdma::RdmaError| format!("{}: {e}", self.label);
        self.ctrl.write_at(off, &head).map_err(err)?;
        self.ctrl.write_at(off + HDRS, data).map_err(err)?;
        let sge = self.ctrl.sge(off, HDRS + data.len()).map_err(err)?;
        self.ctrl_busy[i] = true;
        self.pending.push(PendingSend {
            wr_id: WR_CTRL | i as u64,
            sges: [sge, sge],
            n: 1,
        });
        Ok(())
    }

    /// Posts the queued SENDs in one chain (as many as the send queue has room for); true if
    /// none is left waiting.
    pub fn flush(&mut self) -> Result<bool, String> {
        if self.pending.is_empty() {
            return Ok(true);
        }
        let room = self.send_cap.saturating_sub(self.sends_outstanding);
        let n = self.pending.len().min(room);
        if n == 0 {
            return Ok(false);
        }
        let wrs: Vec<SendWr<'_>> = self.pending[..n]
            .iter()
            .map(|p| SendWr::new(p.wr_id, SendOp::Send, WrData::Sges(&p.sges[..p.n])).signaled())
            .collect();
        let qp = self.id.qp().ok_or("no queue pair")?;
        let r = qp.post_send(&wrs);
        drop(wrs);
        r.map_err(|e| format!("{}: posting SENDs: {e}", self.label))?;
        self.sends_outstanding += n;
        self.pending.drain(..n);
        Ok(self.pending.is_empty())
    }

    // ---- login -----------------------------------------------------------------------

    fn do_login(&mut self, url: &TargetUrl, opts: &LoginOptions) -> Result<(), String> {
        let deadline = self.deadline();
        let o = options();
        let mut params = LoginParams::for_url(url, opts);
        if let Some((tsih, isid)) = o.join {
            params.tsih = tsih;
            params.isid = isid;
            params.cid = 1;
        }
        let neg = if o.hello.is_some() {
            KeyNegotiation::new_iser_with(vec![("iSERHelloRequired".into(), "Yes".into())])
        } else {
            KeyNegotiation::new_iser()
        };
        let neg = session::login(self, &params, neg, deadline)?;
        if !neg.iser_result.rdma_extensions {
            return Err(format!(
                "{}: the target did not accept RDMAExtensions=Yes (not an iSER portal?)",
                self.label
            ));
        }
        if neg.result.header_digest || neg.result.data_digest {
            return Err(format!(
                "{}: the target chose digests on an iSER connection",
                self.label
            ));
        }
        self.neg = neg.result;
        self.iser = neg.iser_result;
        self.in_login = false;
        if let Some((max_ver, min_ver)) = o.hello {
            self.hello(max_ver, min_ver)?;
        }
        if o.text_sendtargets {
            self.text_sendtargets()?;
        }
        Ok(())
    }

    /// The iSER Hello exchange (RFC 7145 §5.1.4, §9.3), the first message of full-feature
    /// phase when iSERHelloRequired=Yes was negotiated: our versions and IRD out, the
    /// target's HelloReply (its version and ORD, or a reject) back.
    fn hello(&mut self, max_ver: u8, min_ver: u8) -> Result<(), String> {
        if !self.iser.hello_required {
            return Err(format!(
                "{}: the target answered iSERHelloRequired=No to our Yes",
                self.label
            ));
        }
        let ird = self.ird;
        let h = IserHeader::Hello { max_ver, min_ver, ird };
        let mut b = [0u8; riser_datamover::iser::ISER_HDR_LEN];
        h.write(&mut b);
        self.send_raw(&b[..h.wire_len()])?;
        self.flush()?;
        let deadline = self.deadline();
        while self.hello_reply.is_none() {
            self.wait_progress(deadline, "the iSER HelloReply")?;
        }
        match self.hello_reply {
            Some(IserHeader::HelloReply { reject: false, max_ver: t_max, cur_ver, ord }) => {
                if !(min_ver..=max_ver).contains(&cur_ver) {
                    return Err(format!(
                        "{}: the HelloReply chose iSER version {cur_ver}, outside our {min_ver}..={max_ver}",
                        self.label
                    ));
                }
                if ord > ird {
                    return Err(format!(
                        "{}: the HelloReply's ORD {ord} exceeds our IRD {ird}",
                        self.label
                    ));
                }
                eprintln!(
                    "{}: iSER Hello: versions {min_ver}..={max_ver}, IRD {ird}; HelloReply: version {cur_ver} (target's highest {t_max}), ORD {ord}",
                    self.label
                );
                Ok(())
            }
            Some(IserHeader::HelloReply { max_ver: t_max, cur_ver, .. }) => Err(format!(
                "{}: the target rejected our iSER Hello (versions {min_ver}..={max_ver}): HelloReply with the reject bit, its versions {cur_ver}..={t_max}",
                self.label
            )),
            _ => Err(format!("{}: internal: no HelloReply", self.label)),
        }
    }

    /// A Text Request SendTargets=All in full-feature phase (immediate, F=1), and its answer
    /// printed as `text: KEY=VALUE` lines on stderr.
    fn text_sendtargets(&mut self) -> Result<(), String> {
        use riser_iscsi::pdu::TextRequest;
        use riser_iscsi::serial::Ttt;
        let req = TextRequest {
            immediate: true,
            final_bit: true,
            continue_bit: false,
            lun: Lun(0),
            itt: Itt(session::MGMT_ITT | 0x7e47),
            ttt: Ttt::RESERVED,
            cmd_sn: self.s.cmd_sn,
            exp_stat_sn: self.s.exp_stat_sn,
        };
        let plain = IserHeader::Control { write: None, read: None };
        self.send_ctrl(plain, Op::TextRequest(req), b"SendTargets=All\0")?;
        self.flush()?;
        let deadline = self.deadline();
        while self.text_rx.is_none() {
            self.wait_progress(deadline, "the Text Response")?;
        }
        let data = self.text_rx.take().unwrap_or_default();
        let n = data.split(|&b| b == 0).filter(|kv| !kv.is_empty()).count();
        for kv in data.split(|&b| b == 0).filter(|kv| !kv.is_empty()) {
            eprintln!("text: {}", String::from_utf8_lossy(kv));
        }
        eprintln!("{}: Text Response in full-feature phase: {n} key(s)", self.label);
        Ok(())
    }

    /// Queues a SEND of `msg` as it is (an iSER Hello) from a control slot.
    fn send_raw(&mut self, msg: &[u8]) -> Result<(), String> {
        let i = self
            .ctrl_busy
            .iter()
            .position(|b| !b)
            .ok_or_else(|| format!("{}: every control send buffer is busy", self.label))?;
        let off = self.ctrl_off(i);
        let err = |e: riser_rdma::RdmaError| format!("{}: {e}", self.label);
        self.ctrl.write_at(off, msg).map_err(err)?;
        let sge = self.ctrl.sge(off, msg.len()).map_err(err)?;
        self.ctrl_busy[i] = true;
        self.pending.push(PendingSend {
            wr_id: WR_CTRL | i as u64,
            sges: [sge, sge],
            n: 1,
        });
        Ok(())
    }

    fn wait_login_pdu(&mut self, deadline: Instant) -> Result<(Bhs, Vec<u8>), String> {
        loop {
            if let Some(p) = self.login_rx.pop_front() {
                return Ok(p);
            }
            self.wait_progress(deadline, "a Login Response")?;
        }
    }

    // ---- management commands -----------------------------------------------------------

    /// Takes what the CQ has, or waits a little (`what`: for the messages).
    fn wait_progress(&mut self, deadline: Instant, what: &str) -> Result<(), String> {
        let mut none = Vec::new();
        let got = self
            .poll(&mut none)
            .map_err(|e| format!("{e} while waiting for {what}"))?;
        self.flush()?;
        if !got {
            if Instant::now() >= deadline {
                return Err(format!(
                    "{}: timed out after {:?} waiting for {what}",
                    self.label, self.timeout
                ));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Runs one SCSI command (no data out, at most 4 KiB in) and waits for its status.
    pub fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<CmdResult, String> {
        if read_len as usize > MGMT_BUF {
            return Err(format!(
                "{}: internal: management read of {read_len} bytes",
                self.label
            ));
        }
        let deadline = self.deadline();
        let (status, sense, n) = session::run_mgmt(self, cdb, read_len, deadline)?;
        let mut data = vec![0u8; n.min(MGMT_BUF)];
        self.mgmt_mr
            .read_at(0, &mut data)
            .map_err(|e| format!("{}: {e}", self.label))?;
        Ok(CmdResult {
            status,
            sense,
            data,
        })
    }

    pub fn wait_ready(&mut self) -> Result<(), String> {
        scsi::wait_ready(self)
    }

    pub fn read_capacity(&mut self) -> Result<(), String> {
        let (bs, n) = scsi::read_capacity(self)?;
        self.block_size = bs;
        self.num_blocks = n;
        Ok(())
    }

    /// Logout (close the session) and disconnect.
    pub fn logout(&mut self) -> Result<(), String> {
        let deadline = self.deadline();
        session::logout(self, deadline, |c| {
            let _ = c.id.disconnect();
        })
    }

    // ---- the data path -------------------------------------------------------------------

    /// Registers `qd` task buffers of `bs` bytes (one region). `copy_reads`: copy each read's
    /// data out of the region at completion, for [`Self::buf`] (verify); a benchmark skips it.
    pub fn start_io(&mut self, qd: usize, bs: usize, copy_reads: bool) -> Result<(), String> {
        if qd > self.qd_cap {
            return Err(format!(
                "{}: internal: queue depth {qd} above the {} the connection was sized for",
                self.label, self.qd_cap
            ));
        }
        let len = qd * bs;
        // A recognisable non-zero pattern, so benchmark writes carry real data.
        let mut init = vec![0u8; len];
        for (s, chunk) in init.chunks_mut(bs.max(1)).enumerate() {
            chunk.fill((s as u8) | 1);
        }
        let mr = MemoryRegion::register(self.ctrl.pd(), init, Access::DATA).map_err(|e| {
            format!(
                "{}: cannot register {len} bytes of task buffers: {e}",
                self.label
            )
        })?;
        self.data = Some(mr);
        self.bs = bs;
        self.copy_reads = copy_reads;
        self.t.start(qd, bs);
        Ok(())
    }

    /// I/Os in flight (and `--abort-every`'s ABORT TASKs awaiting their response).
    pub fn inflight(&self) -> usize {
        self.t.busy()
    }

    /// `--abort-every N` (after [`Self::start_io`]; see [`riser_initiator::session::Aborter`]).
    pub fn abort_every(&mut self, n: u32) {
        self.t.abort_every(n);
    }

    /// `--abort-every`: what the target answered, and the first violation.
    pub fn abort_stats(&self) -> Option<(AbortStats, Result<(), String>)> {
        self.t.abort.as_ref().map(|a| (a.stats, a.result()))
    }

    pub fn buf(&self, slot: usize) -> &[u8] {
        &self.t.slots[slot].buf
    }

    pub fn buf_mut(&mut self, slot: usize) -> &mut [u8] {
        let t = &mut self.t.slots[slot];
        t.dirty = true;
        &mut t.buf
    }

    pub fn lba(&self, slot: usize) -> u64 {
        self.t.slots[slot].lba
    }

    /// Queues one I/O on an idle slot; it goes out with the next [`Self::flush`], or waits
    /// for the CmdSN window.
    pub fn submit(&mut self, slot: usize, dir: Dir, lba: u64, blocks: u32) {
        let open = self.s.window_open();
        if self.t.submit(slot, dir, lba, blocks, self.block_size, open) {
            self.send_command(slot);
        }
    }

    fn send_command(&mut self, slot: usize) {
        let neg = self.neg;
        let target_recv = self.iser.target_recv_dsl;
        let (bs, cmd_off) = (self.bs, self.cmd_off(slot));
        let Some(data) = self.data.as_mut() else {
            return;
        };
        let t = &mut self.t.slots[slot];
        t.state = TaskState::InFlight;
        let write = t.dir == Dir::Write;
        let len = t.len.min(bs as u32);
        if write && t.dirty {
            // Cannot fail: the range is inside the region (len <= bs).
            let _ = data.write_at(slot * bs, &t.buf[..len as usize]);
            t.dirty = false;
        }
        let immediate = if write && neg.immediate_data {
            len.min(neg.first_burst).min(target_recv)
        } else {
            0
        };
        let va = data.addr() + (slot * bs) as u64;
        let hdr = rw_header(t.dir, len, immediate, data.rkey(), va);
        let cmd = self.s.command(
            Itt(t.itt),
            !write,
            write,
            len,
            rw_cdb(t.dir, t.lba, t.blocks),
            true,
        );
        let cmd_sn = cmd.cmd_sn;
        let head = encode_headers(hdr, Op::ScsiCommand(cmd), immediate as usize);
        let _ = self.ctrl.write_at(cmd_off, &head);
        let (Ok(s0), Ok(s1)) = (
            self.ctrl.sge(cmd_off, HDRS),
            data.sge(slot * bs, immediate as usize),
        ) else {
            return;
        };
        self.pending.push(PendingSend {
            wr_id: WR_CMD | slot as u64,
            sges: [s0, s1],
            n: if immediate > 0 { 2 } else { 1 },
        });
        // --abort-every: the ABORT TASK goes in the same chain, right after the command (a
        // control SEND slot is kept free for NOP-Out answers).
        let room = self.ctrl_busy.iter().filter(|b| !**b).count() > 1;
        if let Some(req) = self.t.abort_after(&mut self.s, slot, cmd_sn, room) {
            let plain = IserHeader::Control {
                write: None,
                read: None,
            };
            // Cannot fail: a control slot is free and the PDU has no data.
            let _ = self.send_ctrl(plain, Op::TaskMgmtRequest(req), &[]);
        }
    }

    fn complete(&mut self, o: Outcome, out: &mut Vec<Completion>) {
        let Outcome {
            slot,
            status,
            sense,
            residual,
            ..
        } = o;
        let bs = self.bs;
        let t = self.t.finish(slot);
        let result = if status != status::GOOD {
            Err(t.status_error(status, sense))
        } else if residual {
            Err(IoError {
                status,
                sense: None,
                what: format!(
                    "{} of {} blocks at LBA {}: the target reports a residual",
                    t.op_name(),
                    t.blocks,
                    t.lba
                ),
            })
        } else {
            if t.dir == Dir::Read && self.copy_reads {
                if let Some(d) = self.data.as_ref() {
                    let _ = d.read_at(slot * bs, &mut t.buf[..t.len as usize]);
                }
            }
            Ok(())
        };
        out.push(Completion {
            slot,
            result,
            aborted: false,
        });
    }

    /// Takes what the CQ has: completions of I/Os are appended to `out`. Returns whether
    /// anything completed. Commands waiting for the CmdSN window are queued as it opens.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<bool, String> {
        let mut got = !self.stash.is_empty();
        if got {
            let stash = std::mem::take(&mut self.stash);
            for wc in &stash {
                self.on_wc(wc, out)?;
            }
            self.stash = stash;
            self.stash.clear();
        }
        loop {
            let n = self
                .cq
                .poll(&mut self.wcs)
                .map_err(|e| format!("{}: polling the CQ: {e}", self.label))?;
            for i in 0..n {
                let wc = self.wcs[i];
                self.on_wc(&wc, out)?;
            }
            got |= n > 0;
            if n < self.wcs.len() {
                break;
            }
        }
        self.repost()?;
        let room = self.ctrl_busy.iter().filter(|b| !**b).count() > 1;
        let ping = self.t.release_aborted(&mut self.s, room, out);
        if let Some(nop) = ping {
            let plain = IserHeader::Control {
                write: None,
                read: None,
            };
            self.send_ctrl(plain, Op::NopOut(nop), &[])?;
        }
        while let Some(slot) = self.t.unblock(self.s.window_open()) {
            self.send_command(slot);
        }
        Ok(got)
    }

    fn on_wc(&mut self, wc: &WorkCompletion, out: &mut Vec<Completion>) -> Result<(), String> {
        let kind = wc.wr_id & WR_KIND;
        let idx = (wc.wr_id & 0xffff_ffff) as usize;
        if kind == WR_RECV {
            self.recv_posted = self.recv_posted.saturating_sub(1);
        } else {
            self.sends_outstanding = self.sends_outstanding.saturating_sub(1);
            if kind == WR_CTRL && idx < CTRL_SLOTS {
                self.ctrl_busy[idx] = false;
            }
        }
        if !wc.is_success() {
            if wc.is_flush() && matches!(self.hello_reply, Some(IserHeader::HelloReply { reject: true, .. })) {
                // The target closes after rejecting our Hello (RFC 7145 §9.3): the reject
                // is the answer, reported by hello().
                return Ok(());
            }
            if wc.is_flush() && self.s.logout_answered() {
                // The target closes after its Logout Response; on iWARP the close flushes
                // the receives still posted, maybe in the same batch as that response.
                return Ok(());
            }
            return Err(if wc.is_flush() {
                format!(
                    "{}: the connection is closed (work requests flushed)",
                    self.label
                )
            } else {
                format!(
                    "{}: a {} failed: {} (vendor error {:#x})",
                    self.label,
                    if kind == WR_RECV { "receive" } else { "SEND" },
                    wc.status,
                    wc.vendor_err
                )
            });
        }
        if kind != WR_RECV {
            return Ok(());
        }
        if idx >= self.nrecv {
            return Err(format!("{}: internal: receive slot {idx}", self.label));
        }
        let off = idx * RECV_SLOT;
        let len = (wc.byte_len as usize).min(RECV_SLOT);
        let mut head = [0u8; HDRS];
        self.ctrl
            .read_at(off, &mut head[..len.min(HDRS)])
            .map_err(|e| format!("{}: {e}", self.label))?;
        if let Ok(reply @ IserHeader::HelloReply { .. }) = IserHeader::parse(&head[..len.min(HDRS)]) {
            // The answer to our Hello (iWARP): the whole message.
            self.reposts.push(idx);
            if self.in_login || self.hello_reply.is_some() {
                return Err(format!("{}: an unexpected iSER HelloReply", self.label));
            }
            self.hello_reply = Some(reply);
            return Ok(());
        }
        let (bhs, ds, dl) =
            parse_message(&head, len).map_err(|e| format!("{}: {e}", self.label))?;
        let mut data = std::mem::take(&mut self.scratch);
        data.clear();
        data.resize(dl, 0);
        if dl > 0 {
            self.ctrl
                .read_at(off + ds, &mut data)
                .map_err(|e| format!("{}: {e}", self.label))?;
        }
        self.reposts.push(idx);
        let r = if self.in_login {
            self.login_rx.push_back((bhs, data.clone()));
            Ok(())
        } else {
            self.handle(bhs, &data, out)
        };
        self.scratch = data;
        r
    }

    fn handle(&mut self, h: Bhs, data: &[u8], out: &mut Vec<Completion>) -> Result<(), String> {
        if self.t.stale(&mut self.s, &h.op) {
            return Ok(());
        }
        match &h.op {
            Op::TaskMgmtResponse(r) => self.t.tmf_response(r),
            Op::NopIn(n) => self.t.nop_in(n.itt),
            _ => {}
        }
        if let Op::DataIn(_) | Op::R2t(_) = h.op {
            return Err(format!(
                "{}: the target sent a {:?} PDU on an iSER connection (data moves by RDMA)",
                self.label,
                h.op.opcode()
            ));
        }
        if let Op::TextResponse(_) = h.op {
            self.text_rx = Some(data.to_vec());
        }
        let (tasks, label) = (&self.t, self.label.as_str());
        match self
            .s
            .receive(label, &h.op, data, |itt| tasks.slot_of(label, itt))?
        {
            Received::Ping(reply) => {
                let plain = IserHeader::Control {
                    write: None,
                    read: None,
                };
                let echo = data.len().min(self.iser.target_recv_dsl as usize);
                self.send_ctrl(plain, Op::NopOut(reply), &data[..echo])?;
            }
            Received::Complete(o) => self.complete(o, out),
            // Done (Reject, LogoutRequested and Dropping are errors from receive()).
            _ => {}
        }
        Ok(())
    }
}

impl Transport for IserConn {
    fn state(&mut self) -> &mut SessionState {
        &mut self.s
    }

    /// A management command that reads gets its data RDMA-Written into the management buffer.
    fn send_control(&mut self, op: Op, data: &[u8], _deadline: Instant) -> Result<(), String> {
        let read = matches!(&op, Op::ScsiCommand(c) if c.read);
        let hdr = IserHeader::Control {
            write: None,
            read: read.then(|| TaggedBuffer {
                stag: self.mgmt_mr.rkey(),
                base_offset: self.mgmt_mr.addr(),
            }),
        };
        self.send_ctrl(hdr, op, data)?;
        self.flush()?;
        Ok(())
    }

    fn recv_login(&mut self, deadline: Instant, text: &mut Vec<u8>) -> Result<Bhs, String> {
        let (h, data) = self.wait_login_pdu(deadline)?;
        text.extend_from_slice(&data);
        Ok(h)
    }

    fn progress(&mut self, deadline: Instant, what: &str) -> Result<(), String> {
        self.wait_progress(deadline, what)
    }
}

impl IserConn {
    /// Before sleeping: arms the CQ and returns the completion channel's fd to wait on, or
    /// None when completions came in meanwhile (kept for the next [`Self::poll`]): no sleep.
    pub fn arm(&mut self) -> Option<i32> {
        if !self.stash.is_empty() || self.cq.req_notify(false).is_err() {
            return None;
        }
        // Completions that arrived before arming raise no event: look once more.
        match self.cq.poll(&mut self.wcs) {
            Ok(0) => Some(self.comp.fd()),
            Ok(n) => {
                self.stash.extend_from_slice(&self.wcs[..n]);
                None
            }
            Err(_) => None,
        }
    }

    /// After a sleep: takes (and acknowledges) the completion events.
    pub fn disarm(&mut self) {
        while let Ok(Some(_)) = self.comp.get_event() {}
    }
}

impl ScsiExec for IserConn {
    fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<CmdResult, String> {
        IserConn::exec(self, cdb, read_len)
    }
    fn label(&self) -> &str {
        &self.label
    }
}

impl Drop for IserConn {
    /// Disconnects and drains the QP (every posted request completes or flushes) before the
    /// id, the CQ and the registered memory go, so no request fails on freed buffers.
    fn drop(&mut self) {
        let _ = self.id.disconnect();
        if let Some(qp) = self.id.qp() {
            let _ = qp.set_error();
        }
        let end = Instant::now() + Duration::from_secs(2);
        while (self.recv_posted > 0 || self.sends_outstanding > 0) && Instant::now() < end {
            match self.cq.poll(&mut self.wcs) {
                Ok(0) => std::thread::sleep(Duration::from_millis(1)),
                Ok(n) => {
                    for wc in &self.wcs[..n] {
                        if wc.wr_id & WR_KIND == WR_RECV {
                            self.recv_posted = self.recv_posted.saturating_sub(1);
                        } else {
                            self.sends_outstanding = self.sends_outstanding.saturating_sub(1);
                        }
                    }
                }
                Err(_) => break,
            }
        }
    }
}
