//! RC queue pairs (created through rdma_cm, see [`crate::CmId::create_qp`]), the shared
//! receive queue, and work-request posting: receives, and send chains (several work requests
//! linked and posted with one doorbell).
//!
//! Posting is safe: the work requests are copied into the send/receive queue during the call
//! (inline data included), and an SGE can only make the device touch memory registered under
//! its lkey, which [`crate::MemoryRegion`] never frees while registered.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use crate::cq::CompletionQueue;
use crate::device::ProtectionDomain;
use crate::error::{RdmaError, Result};
use crate::mr::Sge;

/// Work requests linked into one `ibv_post_send` / `ibv_post_recv` call. A longer list is
/// posted as several calls of this many (same order on the queue, one doorbell per call).
pub const MAX_CHAIN: usize = 32;

/// Queue sizes of a QP: asked for at creation, and what the device granted (see
/// [`QueuePair::caps`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    /// Largest inline payload (bytes) a SEND may carry; 0 for none.
    pub max_inline_data: u32,
}

impl QpCaps {
    fn to_raw(self) -> sys::ibv_qp_cap {
        sys::ibv_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
        }
    }

    fn from_raw(c: &sys::ibv_qp_cap) -> Self {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// What a new RC queue pair is made of.
#[derive(Clone, Debug)]
pub struct QpInitAttr {
    pub send_cq: Arc<CompletionQueue>,
    pub recv_cq: Arc<CompletionQueue>,
    /// Receives come from this SRQ instead of the QP's own receive queue.
    pub srq: Option<Arc<SharedReceiveQueue>>,
    pub caps: QpCaps,
    /// Every send is signaled, whatever its `signaled` flag (leave false for iSER).
    pub sq_sig_all: bool,
}

/// The operation of a send-queue work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    Send,
    /// SEND with 32-bit immediate data (host byte order here).
    SendWithImm { imm: u32 },
    /// SEND that also invalidates `rkey` at the peer (iSER: the command's STag).
    SendWithInv { rkey: u32 },
    /// Write the local SGEs to `remote_addr` under the peer's `rkey`.
    RdmaWrite { remote_addr: u64, rkey: u32 },
    RdmaWriteWithImm { remote_addr: u64, rkey: u32, imm: u32 },
    /// Read from `remote_addr` under the peer's `rkey` into the local SGEs.
    RdmaRead { remote_addr: u64, rkey: u32 },
}

/// The local data of a send-queue work request.
#[derive(Clone, Copy, Debug)]
pub enum WrData<'a> {
    /// Registered memory: the device reads (or, for RDMA Read, writes) it after the post
    /// returns, so it must stay registered until the request completes.
    Sges(&'a [Sge]),
    /// Bytes copied into the send queue during the post (IBV_SEND_INLINE): no registration,
    /// reusable as soon as the post returns; at most `max_inline_data` bytes; not for RDMA Read.
    Inline(&'a [u8]),
}

/// One send-queue work request. Unsignaled by default: an unsignaled request produces no
/// completion unless it fails, and its queue slot is released only when a later signaled
/// request completes, so signal at least every `max_send_wr`-th request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp,
    pub data: WrData<'a>,
    pub signaled: bool,
    /// Raise a solicited event at the receiver (SENDs only).
    pub solicited: bool,
    /// Wait for earlier RDMA Reads of this QP to finish before starting.
    pub fence: bool,
}

impl<'a> SendWr<'a> {
    pub fn new(wr_id: u64, op: SendOp, data: WrData<'a>) -> Self {
        SendWr { wr_id, op, data, signaled: false, solicited: false, fence: false }
    }
    pub fn send(wr_id: u64, sges: &'a [Sge]) -> Self {
        Self::new(wr_id, SendOp::Send, WrData::Sges(sges))
    }
    pub fn send_inline(wr_id: u64, data: &'a [u8]) -> Self {
        Self::new(wr_id, SendOp::Send, WrData::Inline(data))
    }
    pub fn send_with_inv(wr_id: u64, sges: &'a [Sge], rkey: u32) -> Self {
        Self::new(wr_id, SendOp::SendWithInv { rkey }, WrData::Sges(sges))
    }
    pub fn rdma_write(wr_id: u64, sges: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        Self::new(wr_id, SendOp::RdmaWrite { remote_addr, rkey }, WrData::Sges(sges))
    }
    pub fn rdma_read(wr_id: u64, sges: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        Self::new(wr_id, SendOp::RdmaRead { remote_addr, rkey }, WrData::Sges(sges))
    }
    /// Ask for a completion.
    pub fn signaled(mut self) -> Self {
        self.signaled = true;
        self
    }
    pub fn solicited(mut self) -> Self {
        self.solicited = true;
        self
    }
    pub fn fence(mut self) -> Self {
        self.fence = true;
        self
    }
}

/// One receive work request: the SGEs an incoming SEND is scattered into.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sges: &'a [Sge],
}

/// Checks a send list against the QP's granted caps before anything is posted.
pub(crate) fn validate_send(wrs: &[SendWr<'_>], caps: &QpCaps) -> Result<()> {
    for (i, wr) in wrs.iter().enumerate() {
        match wr.data {
            WrData::Sges(s) if s.len() > caps.max_send_sge as usize => {
                return Err(RdmaError::invalid(
                    "ibv_post_send",
                    format!("work request {i}: {} SGEs > max_send_sge {}", s.len(), caps.max_send_sge),
                ))
            }
            WrData::Inline(d) => {
                if matches!(wr.op, SendOp::RdmaRead { .. }) {
                    return Err(RdmaError::invalid("ibv_post_send", format!("work request {i}: RDMA Read cannot be inline")));
                }
                if d.len() > caps.max_inline_data as usize {
                    return Err(RdmaError::invalid(
                        "ibv_post_send",
                        format!("work request {i}: {} inline bytes > max_inline_data {}", d.len(), caps.max_inline_data),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Stack storage for one linked chain of at most MAX_CHAIN send work requests.
pub(crate) struct SendChain {
    wrs: [MaybeUninit<sys::ibv_send_wr>; MAX_CHAIN],
    inline: [sys::ibv_sge; MAX_CHAIN],
    len: usize,
}

impl SendChain {
    pub(crate) fn new() -> Self {
        SendChain {
            // SAFETY: an array of MaybeUninit needs no initialisation.
            wrs: unsafe { MaybeUninit::uninit().assume_init() },
            inline: [sys::ibv_sge { addr: 0, length: 0, lkey: 0 }; MAX_CHAIN],
            len: 0,
        }
    }

    /// Translates `wrs` (at most MAX_CHAIN, already validated) into linked `ibv_send_wr`s.
    /// The result points into `self` and into the slices `wrs` borrow: post it before either
    /// moves or ends.
    pub(crate) fn fill(&mut self, wrs: &[SendWr<'_>]) {
        assert!(wrs.len() <= MAX_CHAIN, "chain longer than MAX_CHAIN");
        for (i, wr) in wrs.iter().enumerate() {
            // SAFETY: ibv_send_wr is integers, raw pointers and unions of those: all-zero is
            // a valid value (NULL pointers, no flags).
            let mut raw: sys::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
            raw.wr_id = wr.wr_id;
            let mut flags = 0u32;
            if wr.signaled {
                flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if wr.solicited {
                flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
            }
            if wr.fence {
                flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
            }
            match wr.op {
                SendOp::Send => raw.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
                SendOp::SendWithImm { imm } => {
                    raw.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                    raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                }
                SendOp::SendWithInv { rkey } => {
                    raw.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                    raw.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
                }
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    raw.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                    raw.wr.rdma = sys::rdma_t { remote_addr, rkey };
                }
                SendOp::RdmaWriteWithImm { remote_addr, rkey, imm } => {
                    raw.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                    raw.wr.rdma = sys::rdma_t { remote_addr, rkey };
                    raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    raw.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
                    raw.wr.rdma = sys::rdma_t { remote_addr, rkey };
                }
            }
            match wr.data {
                WrData::Sges(sges) => {
                    raw.num_sge = sges.len() as i32;
                    // Sge is repr(transparent) over ibv_sge; verbs only reads the list.
                    raw.sg_list = if sges.is_empty() { std::ptr::null_mut() } else { sges.as_ptr() as *mut sys::ibv_sge };
                }
                WrData::Inline(data) => {
                    flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
                    self.inline[i] = sys::ibv_sge { addr: data.as_ptr() as u64, length: data.len() as u32, lkey: 0 };
                    raw.num_sge = 1;
                    raw.sg_list = &mut self.inline[i];
                }
            }
            raw.send_flags = flags;
            self.wrs[i] = MaybeUninit::new(raw);
        }
        self.len = wrs.len();
        let base = self.wrs.as_mut_ptr() as *mut sys::ibv_send_wr;
        for i in 0..self.len {
            // SAFETY: entries 0..len were written above; `base.add(i + 1)` is only formed for
            // i + 1 < len <= MAX_CHAIN, inside the array.
            unsafe {
                (*base.add(i)).next = if i + 1 < self.len { base.add(i + 1) } else { std::ptr::null_mut() };
            }
        }
    }

    pub(crate) fn head(&mut self) -> *mut sys::ibv_send_wr {
        self.wrs.as_mut_ptr() as *mut sys::ibv_send_wr
    }

    /// Index in this chain of a `bad_wr` pointer the provider returned (0 if it is not one of
    /// ours).
    pub(crate) fn index_of(&mut self, bad: *const sys::ibv_send_wr) -> usize {
        let base = self.head() as usize;
        let b = bad as usize;
        let sz = std::mem::size_of::<sys::ibv_send_wr>();
        if b >= base && b < base + self.len * sz {
            (b - base) / sz
        } else {
            0
        }
    }

    #[cfg(test)]
    pub(crate) fn get(&self, i: usize) -> &sys::ibv_send_wr {
        assert!(i < self.len);
        // SAFETY: entries below len were initialised by fill.
        unsafe { self.wrs[i].assume_init_ref() }
    }
}

/// Stack storage for one linked chain of at most MAX_CHAIN receive work requests.
pub(crate) struct RecvChain {
    wrs: [MaybeUninit<sys::ibv_recv_wr>; MAX_CHAIN],
    len: usize,
}

impl RecvChain {
    pub(crate) fn new() -> Self {
        // SAFETY: an array of MaybeUninit needs no initialisation.
        RecvChain { wrs: unsafe { MaybeUninit::uninit().assume_init() }, len: 0 }
    }

    pub(crate) fn fill(&mut self, wrs: &[RecvWr<'_>]) {
        assert!(wrs.len() <= MAX_CHAIN, "chain longer than MAX_CHAIN");
        let base = self.wrs.as_mut_ptr() as *mut sys::ibv_recv_wr;
        for (i, wr) in wrs.iter().enumerate() {
            let next = if i + 1 < wrs.len() {
                // SAFETY: i + 1 < len <= MAX_CHAIN: inside the array.
                unsafe { base.add(i + 1) }
            } else {
                std::ptr::null_mut()
            };
            let sg_list = if wr.sges.is_empty() { std::ptr::null_mut() } else { wr.sges.as_ptr() as *mut sys::ibv_sge };
            self.wrs[i] = MaybeUninit::new(sys::ibv_recv_wr { wr_id: wr.wr_id, next, sg_list, num_sge: wr.sges.len() as i32 });
        }
        self.len = wrs.len();
    }

    pub(crate) fn head(&mut self) -> *mut sys::ibv_recv_wr {
        self.wrs.as_mut_ptr() as *mut sys::ibv_recv_wr
    }

    pub(crate) fn index_of(&mut self, bad: *const sys::ibv_recv_wr) -> usize {
        let base = self.head() as usize;
        let b = bad as usize;
        let sz = std::mem::size_of::<sys::ibv_recv_wr>();
        if b >= base && b < base + self.len * sz {
            (b - base) / sz
        } else {
            0
        }
    }

    #[cfg(test)]
    pub(crate) fn get(&self, i: usize) -> &sys::ibv_recv_wr {
        assert!(i < self.len);
        // SAFETY: entries below len were initialised by fill.
        unsafe { self.wrs[i].assume_init_ref() }
    }
}

fn validate_recv(call: &'static str, wrs: &[RecvWr<'_>], max_sge: u32) -> Result<()> {
    for (i, wr) in wrs.iter().enumerate() {
        if wr.sges.len() > max_sge as usize {
            return Err(RdmaError::invalid(call, format!("work request {i}: {} SGEs > max_recv_sge {max_sge}", wr.sges.len())));
        }
    }
    Ok(())
}

/// Posts `wrs` in chains of MAX_CHAIN through `post` (ibv_post_recv or ibv_post_srq_recv).
fn post_recv_chains(
    call: &'static str,
    wrs: &[RecvWr<'_>],
    mut post: impl FnMut(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> i32,
) -> Result<()> {
    for (c, chunk) in wrs.chunks(MAX_CHAIN).enumerate() {
        let mut chain = RecvChain::new();
        chain.fill(chunk);
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        let ret = post(chain.head(), &mut bad);
        if ret != 0 {
            let errno = RdmaError::from_ret(call, ret).errno().unwrap_or(libc::EIO);
            return Err(RdmaError::Post { call, errno, index: c * MAX_CHAIN + chain.index_of(bad) });
        }
    }
    Ok(())
}

/// A QP state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
    Unknown(u32),
}

impl QpState {
    pub fn from_raw(v: u32) -> Self {
        use sys::ibv_qp_state::*;
        match v {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::Rtr,
            IBV_QPS_RTS => QpState::Rts,
            IBV_QPS_SQD => QpState::Sqd,
            IBV_QPS_SQE => QpState::Sqe,
            IBV_QPS_ERR => QpState::Err,
            other => QpState::Unknown(other),
        }
    }
}

/// An RC queue pair, owned by the [`crate::CmId`] it was created on (rdma_cm ties the QP to
/// the id: the id destroys it, before itself). Holds its PD, CQs and SRQ, so those outlive it.
///
/// Teardown rule (Linux isert's): disconnect (or [`Self::set_error`]), poll the CQs until every
/// outstanding request has completed or flushed, then drop the id (and with it the QP), then
/// the buffers. Dropping buffers earlier is memory safe (see [`crate::MemoryRegion`]) but makes
/// the outstanding requests fail with protection errors.
pub struct QueuePair {
    raw: NonNull<sys::ibv_qp>,
    qp_num: u32,
    caps: QpCaps,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
}

// SAFETY: verbs objects are thread safe (providers lock the queues); the QP is destroyed only
// by its owning CmId, once.
unsafe impl Send for QueuePair {}
// SAFETY: as above; posting takes &self and the providers serialise posts per queue.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Creates the QP on `id` with `rdma_create_qp`. The caller (CmId) owns the result and
    /// must call rdma_destroy_qp before rdma_destroy_id.
    pub(crate) fn create(id: *mut sys::rdma_cm_id, pd: &Arc<ProtectionDomain>, attr: &QpInitAttr) -> Result<QueuePair> {
        let call = "rdma_create_qp";
        if attr.send_cq.context().as_raw() != pd.context().as_raw() {
            return Err(RdmaError::invalid(call, "send CQ belongs to another device context than the PD"));
        }
        if attr.recv_cq.context().as_raw() != pd.context().as_raw() {
            return Err(RdmaError::invalid(call, "receive CQ belongs to another device context than the PD"));
        }
        // SAFETY: ibv_qp_init_attr is pointers and integers: all-zero is valid.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = attr.send_cq.as_raw();
        init.recv_cq = attr.recv_cq.as_raw();
        init.srq = attr.srq.as_ref().map_or(std::ptr::null_mut(), |s| s.raw.as_ptr());
        init.cap = attr.caps.to_raw();
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = attr.sq_sig_all as i32;
        // SAFETY: `id` is a live cm id bound to a device (checked by the caller to match the
        // PD's context); the CQs, SRQ and PD are live and held by the QueuePair we return.
        let ret = unsafe { sys::rdma_create_qp(id, pd.as_raw(), &mut init) };
        if ret != 0 {
            return Err(RdmaError::last(call));
        }
        // SAFETY: on success rdma_create_qp stored the new QP in id->qp.
        let raw = NonNull::new(unsafe { (*id).qp }).ok_or_else(|| RdmaError::invalid(call, "no QP on the id after success"))?;
        // SAFETY: live QP.
        let qp_num = unsafe { (*raw.as_ptr()).qp_num };
        Ok(QueuePair {
            raw,
            qp_num,
            caps: QpCaps::from_raw(&init.cap),
            pd: pd.clone(),
            send_cq: attr.send_cq.clone(),
            recv_cq: attr.recv_cq.clone(),
            srq: attr.srq.clone(),
        })
    }

    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// What the device granted (may exceed what was asked).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.srq.as_ref()
    }

    /// Posts one receive.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.post_recvs(&[RecvWr { wr_id, sges }])
    }

    /// Posts several receives, linked (one doorbell per MAX_CHAIN).
    pub fn post_recvs(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let call = "ibv_post_recv";
        if self.srq.is_some() {
            return Err(RdmaError::invalid(call, "this QP receives from an SRQ: post to the SRQ"));
        }
        validate_recv(call, wrs, self.caps.max_recv_sge)?;
        let qp = self.raw.as_ptr();
        post_recv_chains(call, wrs, |head, bad| {
            // SAFETY: live QP; `head` is a linked, NULL-terminated chain whose SGE lists live
            // for this call; the provider copies them into the receive queue.
            unsafe { sys::ibv_post_recv(qp, head, bad) }
        })
    }

    /// Posts `wrs` linked in order: one `ibv_post_send` (one doorbell) per MAX_CHAIN requests.
    /// Typical iSER read: RDMA Write(s) unsignaled, then the response SEND signaled; RC
    /// ordering means the SEND's completion implies the writes are done.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let call = "ibv_post_send";
        validate_send(wrs, &self.caps)?;
        for (c, chunk) in wrs.chunks(MAX_CHAIN).enumerate() {
            let mut chain = SendChain::new();
            chain.fill(chunk);
            let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: live QP; `chain` is a linked, NULL-terminated list whose SGE lists and
            // inline bytes (borrowed by `wrs`) live for this call; the provider copies the
            // requests (and inline data) into the send queue before returning. Non-inline SGEs
            // can only reach memory registered under their lkey (checked by the device).
            let ret = unsafe { sys::ibv_post_send(self.raw.as_ptr(), chain.head(), &mut bad) };
            if ret != 0 {
                let errno = RdmaError::from_ret(call, ret).errno().unwrap_or(libc::EIO);
                return Err(RdmaError::Post { call, errno, index: c * MAX_CHAIN + chain.index_of(bad) });
            }
        }
        Ok(())
    }

    /// Moves the QP to the error state: every outstanding request completes with
    /// [`crate::WcStatus::WrFlushErr`]. The first step of a drain.
    pub fn set_error(&self) -> Result<()> {
        // SAFETY: ibv_qp_attr is integers and plain structs: all-zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: live QP; only the state field is read (mask IBV_QP_STATE).
        let ret = unsafe { sys::ibv_modify_qp(self.raw.as_ptr(), &mut attr, sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_modify_qp", ret));
        }
        Ok(())
    }

    /// The QP's current state (`ibv_query_qp`).
    pub fn state(&self) -> Result<QpState> {
        // SAFETY: plain data: all-zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live QP, valid out-structs.
        let ret = unsafe {
            sys::ibv_query_qp(self.raw.as_ptr(), &mut attr, sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &mut init)
        };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_query_qp", ret));
        }
        Ok(QpState::from_raw(attr.qp_state))
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("qp_num", &self.qp_num).field("caps", &self.caps).finish()
    }
}

/// A shared receive queue (`ibv_srq`): one pool of posted receives for many QPs (optionally one
/// per reactor). QPs using it hold an `Arc`, so it is destroyed after them.
pub struct SharedReceiveQueue {
    raw: NonNull<sys::ibv_srq>,
    pd: Arc<ProtectionDomain>,
    max_wr: u32,
    max_sge: u32,
}

// SAFETY: verbs objects are thread safe; destroyed once, after every QP using it.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    pub fn new(pd: &Arc<ProtectionDomain>, max_wr: u32, max_sge: u32) -> Result<Arc<Self>> {
        let mut init = sys::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: sys::ibv_srq_attr { max_wr, max_sge, srq_limit: 0 },
        };
        // SAFETY: live PD, valid init struct (the provider writes back the granted sizes).
        let raw = unsafe { sys::ibv_create_srq(pd.as_raw(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_create_srq"))?;
        Ok(Arc::new(SharedReceiveQueue { raw, pd: pd.clone(), max_wr: init.attr.max_wr, max_sge: init.attr.max_sge }))
    }

    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.post_recvs(&[RecvWr { wr_id, sges }])
    }

    pub fn post_recvs(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let call = "ibv_post_srq_recv";
        validate_recv(call, wrs, self.max_sge)?;
        let srq = self.raw.as_ptr();
        post_recv_chains(call, wrs, |head, bad| {
            // SAFETY: live SRQ; linked NULL-terminated chain valid for this call; the provider
            // copies it into the queue.
            unsafe { sys::ibv_post_srq_recv(srq, head, bad) }
        })
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_srq, destroyed once, after every QP holding it.
        let ret = unsafe { sys::ibv_destroy_srq(self.raw.as_ptr()) };
        if ret != 0 {
            log::error!("ibv_destroy_srq failed: errno {ret}");
        }
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue").field("max_wr", &self.max_wr).field("max_sge", &self.max_sge).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::ibv_send_flags as F;
    use sys::ibv_wr_opcode as Op;

    const CAPS: QpCaps = QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 1, max_inline_data: 128 };

    #[test]
    fn chain_of_writes_then_signaled_send() {
        let data = [Sge::new(0x10_000, 4096, 7), Sge::new(0x20_000, 4096, 7)];
        let more = [Sge::new(0x30_000, 100, 7)];
        let resp = [Sge::new(0x40_000, 76, 9)];
        let wrs = [
            SendWr::rdma_write(1, &data, 0xdead_0000, 0x1111),
            SendWr::rdma_write(2, &more, 0xdead_2000, 0x1111),
            SendWr::send(3, &resp).signaled(),
        ];
        validate_send(&wrs, &CAPS).unwrap();
        let mut chain = SendChain::new();
        chain.fill(&wrs);
        let head = chain.head();

        let w0 = chain.get(0);
        assert_eq!(w0.wr_id, 1);
        assert_eq!(w0.opcode, Op::IBV_WR_RDMA_WRITE);
        assert_eq!(w0.num_sge, 2);
        assert_eq!(w0.sg_list as *const Sge, data.as_ptr(), "SGE list is the caller's, not a copy");
        assert_eq!(w0.send_flags, 0, "writes unsignaled");
        // SAFETY: test reads the union arm fill() wrote for RDMA ops.
        let rdma = unsafe { w0.wr.rdma };
        assert_eq!((rdma.remote_addr, rdma.rkey), (0xdead_0000, 0x1111));

        let w1 = chain.get(1);
        // SAFETY: as above.
        assert_eq!(unsafe { w1.wr.rdma.remote_addr }, 0xdead_2000);

        let w2 = chain.get(2);
        assert_eq!(w2.opcode, Op::IBV_WR_SEND);
        assert_eq!(w2.send_flags, F::IBV_SEND_SIGNALED.0);
        assert_eq!(w2.num_sge, 1);

        // Linked in order, NULL-terminated: one doorbell.
        assert_eq!(w0.next, head.wrapping_add(1));
        assert_eq!(w1.next, head.wrapping_add(2));
        assert!(w2.next.is_null());
        let (i2, i_null) = (chain.index_of(head.wrapping_add(2)), chain.index_of(std::ptr::null()));
        assert_eq!((i2, i_null), (2, 0));
    }

    #[test]
    fn send_with_invalidate_read_and_inline() {
        let sge = [Sge::new(0x1000, 8192, 3)];
        let hdr = [0x10u8; 76];
        let wrs = [
            SendWr::rdma_read(10, &sge, 0xbeef_0000, 0x2222).signaled().fence(),
            SendWr::send_with_inv(11, &sge[..0], 0x3333).solicited(),
            SendWr::send_inline(12, &hdr).signaled(),
            SendWr::new(13, SendOp::SendWithImm { imm: 0x0102_0304 }, WrData::Sges(&[])),
        ];
        validate_send(&wrs, &CAPS).unwrap();
        let mut chain = SendChain::new();
        chain.fill(&wrs);

        let rd = chain.get(0);
        assert_eq!(rd.opcode, Op::IBV_WR_RDMA_READ);
        assert_eq!(rd.send_flags, F::IBV_SEND_SIGNALED.0 | F::IBV_SEND_FENCE.0);
        // SAFETY: RDMA arm written by fill().
        assert_eq!(unsafe { (rd.wr.rdma.remote_addr, rd.wr.rdma.rkey) }, (0xbeef_0000, 0x2222));

        let inv = chain.get(1);
        assert_eq!(inv.opcode, Op::IBV_WR_SEND_WITH_INV);
        // SAFETY: the invalidate arm written by fill().
        assert_eq!(unsafe { inv.imm_data_invalidated_rkey_union.invalidated_rkey }, 0x3333);
        assert_eq!(inv.send_flags, F::IBV_SEND_SOLICITED.0);
        assert_eq!(inv.num_sge, 0);
        assert!(inv.sg_list.is_null());

        let inl = chain.get(2);
        assert_eq!(inl.send_flags, F::IBV_SEND_SIGNALED.0 | F::IBV_SEND_INLINE.0);
        assert_eq!(inl.num_sge, 1);
        // SAFETY: sg_list points into the chain's inline array, written by fill().
        let s = unsafe { *inl.sg_list };
        assert_eq!((s.addr, s.length), (hdr.as_ptr() as u64, 76));

        let imm = chain.get(3);
        assert_eq!(imm.opcode, Op::IBV_WR_SEND_WITH_IMM);
        // SAFETY: the imm arm written by fill().
        assert_eq!(unsafe { imm.imm_data_invalidated_rkey_union.imm_data }, 0x0102_0304u32.to_be());
    }

    #[test]
    fn validation_rejects_before_posting() {
        let five = [Sge::new(0, 1, 1); 5];
        let e = validate_send(&[SendWr::send(1, &[]), SendWr::send(2, &five)], &CAPS).unwrap_err();
        assert!(matches!(e, RdmaError::InvalidArgument { .. }));
        assert!(e.to_string().contains("work request 1"), "{e}");

        let big = [0u8; 129];
        assert!(validate_send(&[SendWr::send_inline(1, &big)], &CAPS).is_err());
        let small = [0u8; 8];
        let read_inline = SendWr::new(1, SendOp::RdmaRead { remote_addr: 0, rkey: 0 }, WrData::Inline(&small));
        assert!(validate_send(&[read_inline], &CAPS).is_err());

        let two = [Sge::new(0, 1, 1); 2];
        assert!(validate_recv("t", &[RecvWr { wr_id: 0, sges: &two }], 1).is_err());
        assert!(validate_recv("t", &[RecvWr { wr_id: 0, sges: &two[..1] }], 1).is_ok());
    }

    #[test]
    fn recv_chain_links_and_chunks() {
        let sges: Vec<[Sge; 1]> = (0..40u64).map(|i| [Sge::new(i * 8256, 8256, 5)]).collect();
        let wrs: Vec<RecvWr<'_>> = sges.iter().enumerate().map(|(i, s)| RecvWr { wr_id: i as u64, sges: s }).collect();
        let mut chain = RecvChain::new();
        chain.fill(&wrs[..MAX_CHAIN]);
        assert_eq!(chain.get(0).wr_id, 0);
        assert_eq!(chain.get(0).num_sge, 1);
        let head = chain.head();
        assert_eq!(chain.get(0).next, head.wrapping_add(1));
        assert!(chain.get(MAX_CHAIN - 1).next.is_null());

        // post_recv_chains splits 40 into 32 + 8 and reports a failing index globally.
        let mut calls = Vec::new();
        let err = post_recv_chains("ibv_post_recv", &wrs, |head, bad| {
            let mut n = 0;
            let mut p = head;
            while !p.is_null() {
                n += 1;
                // SAFETY: walking the NULL-terminated chain built by post_recv_chains.
                p = unsafe { (*p).next };
            }
            calls.push(n);
            if calls.len() == 2 {
                // SAFETY: fail at the 3rd request of the second chain, as a provider would.
                unsafe { *bad = head.add(3) };
                return libc::ENOMEM;
            }
            0
        })
        .unwrap_err();
        assert_eq!(calls, vec![32, 8]);
        assert_eq!(err, RdmaError::Post { call: "ibv_post_recv", errno: libc::ENOMEM, index: 35 });
    }

    #[test]
    fn send_wr_layouts_match_c() {
        // Measured from rdma-core 44's headers with gcc (sizeof/offsetof); rdma-sys writes these
        // structs by hand, so a mismatch would corrupt every post.
        assert_eq!(std::mem::size_of::<sys::ibv_send_wr>(), 128);
        assert_eq!(std::mem::size_of::<sys::ibv_recv_wr>(), 32);
        let mut chain = SendChain::new();
        let sge = [Sge::new(1, 1, 1)];
        chain.fill(&[SendWr::rdma_write(1, &sge, 2, 3)]);
        let w = chain.get(0);
        let base = w as *const _ as usize;
        assert_eq!(&w.imm_data_invalidated_rkey_union as *const _ as usize - base, 36);
        // SAFETY: the rdma arm was written by fill().
        unsafe {
            assert_eq!(&w.wr.rdma.remote_addr as *const u64 as usize - base, 40);
            assert_eq!(&w.wr.rdma.rkey as *const u32 as usize - base, 48);
        }
        assert_eq!(&w.qp_type as *const _ as usize - base, 72);
        assert_eq!(&w.bind_mw_tso_union as *const _ as usize - base, 80);
    }

    #[test]
    fn qp_state_decoding() {
        assert_eq!(QpState::from_raw(sys::ibv_qp_state::IBV_QPS_RTS), QpState::Rts);
        assert_eq!(QpState::from_raw(sys::ibv_qp_state::IBV_QPS_ERR), QpState::Err);
        assert_eq!(QpState::from_raw(42), QpState::Unknown(42));
    }
}
