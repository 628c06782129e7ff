//! Completion queues, completion channels and the safe `WorkCompletion`.

use std::mem::MaybeUninit;
use std::os::unix::io::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use crate::device::Context;
use crate::error::{last_errno, RdmaError, Result};

/// Most completions one [`CompletionQueue::poll`] call takes (design.md: up to 32 per pass).
pub const POLL_BATCH: usize = 32;

/// Status of a work completion (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    #[default]
    Success,
    LocLenErr,
    LocQpOpErr,
    LocEecOpErr,
    LocProtErr,
    /// The QP went to the error state (disconnect, `set_error`, an earlier error) and this
    /// request was flushed without running: the normal end of every outstanding request.
    WrFlushErr,
    MwBindErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    LocRddViolErr,
    RemInvRdReqErr,
    RemAbortErr,
    InvEecnErr,
    InvEecStateErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
    TmErr,
    TmRndvIncomplete,
    Unknown(u32),
}

impl WcStatus {
    pub fn from_raw(v: u32) -> Self {
        use sys::ibv_wc_status::*;
        use WcStatus::*;
        match v {
            IBV_WC_SUCCESS => Success,
            IBV_WC_LOC_LEN_ERR => LocLenErr,
            IBV_WC_LOC_QP_OP_ERR => LocQpOpErr,
            IBV_WC_LOC_EEC_OP_ERR => LocEecOpErr,
            IBV_WC_LOC_PROT_ERR => LocProtErr,
            IBV_WC_WR_FLUSH_ERR => WrFlushErr,
            IBV_WC_MW_BIND_ERR => MwBindErr,
            IBV_WC_BAD_RESP_ERR => BadRespErr,
            IBV_WC_LOC_ACCESS_ERR => LocAccessErr,
            IBV_WC_REM_INV_REQ_ERR => RemInvReqErr,
            IBV_WC_REM_ACCESS_ERR => RemAccessErr,
            IBV_WC_REM_OP_ERR => RemOpErr,
            IBV_WC_RETRY_EXC_ERR => RetryExcErr,
            IBV_WC_RNR_RETRY_EXC_ERR => RnrRetryExcErr,
            IBV_WC_LOC_RDD_VIOL_ERR => LocRddViolErr,
            IBV_WC_REM_INV_RD_REQ_ERR => RemInvRdReqErr,
            IBV_WC_REM_ABORT_ERR => RemAbortErr,
            IBV_WC_INV_EECN_ERR => InvEecnErr,
            IBV_WC_INV_EEC_STATE_ERR => InvEecStateErr,
            IBV_WC_FATAL_ERR => FatalErr,
            IBV_WC_RESP_TIMEOUT_ERR => RespTimeoutErr,
            IBV_WC_GENERAL_ERR => GeneralErr,
            IBV_WC_TM_ERR => TmErr,
            IBV_WC_TM_RNDV_INCOMPLETE => TmRndvIncomplete,
            other => Unknown(other),
        }
    }

    pub fn as_raw(self) -> u32 {
        use sys::ibv_wc_status::*;
        use WcStatus::*;
        match self {
            Success => IBV_WC_SUCCESS,
            LocLenErr => IBV_WC_LOC_LEN_ERR,
            LocQpOpErr => IBV_WC_LOC_QP_OP_ERR,
            LocEecOpErr => IBV_WC_LOC_EEC_OP_ERR,
            LocProtErr => IBV_WC_LOC_PROT_ERR,
            WrFlushErr => IBV_WC_WR_FLUSH_ERR,
            MwBindErr => IBV_WC_MW_BIND_ERR,
            BadRespErr => IBV_WC_BAD_RESP_ERR,
            LocAccessErr => IBV_WC_LOC_ACCESS_ERR,
            RemInvReqErr => IBV_WC_REM_INV_REQ_ERR,
            RemAccessErr => IBV_WC_REM_ACCESS_ERR,
            RemOpErr => IBV_WC_REM_OP_ERR,
            RetryExcErr => IBV_WC_RETRY_EXC_ERR,
            RnrRetryExcErr => IBV_WC_RNR_RETRY_EXC_ERR,
            LocRddViolErr => IBV_WC_LOC_RDD_VIOL_ERR,
            RemInvRdReqErr => IBV_WC_REM_INV_RD_REQ_ERR,
            RemAbortErr => IBV_WC_REM_ABORT_ERR,
            InvEecnErr => IBV_WC_INV_EECN_ERR,
            InvEecStateErr => IBV_WC_INV_EEC_STATE_ERR,
            FatalErr => IBV_WC_FATAL_ERR,
            RespTimeoutErr => IBV_WC_RESP_TIMEOUT_ERR,
            GeneralErr => IBV_WC_GENERAL_ERR,
            TmErr => IBV_WC_TM_ERR,
            TmRndvIncomplete => IBV_WC_TM_RNDV_INCOMPLETE,
            Unknown(v) => v,
        }
    }

    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }

    /// A flushed request: expected while draining; anything else that is not success is a
    /// real error (iser-wire.md: disconnect and tear down).
    pub fn is_flush(self) -> bool {
        self == WcStatus::WrFlushErr
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: ibv_wc_status_str returns a static string for any value ("unknown" for
        // values it does not know).
        let s = unsafe { std::ffi::CStr::from_ptr(sys::ibv_wc_status_str(self.as_raw())) };
        write!(f, "{} ({})", s.to_string_lossy(), self.as_raw())
    }
}

/// What a successful completion did (`enum ibv_wc_opcode`). Not meaningful for an error
/// completion (verbs leaves it undefined then).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    #[default]
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    BindMw,
    LocalInv,
    Tso,
    Recv,
    RecvRdmaWithImm,
    Unknown(u32),
}

impl WcOpcode {
    pub fn from_raw(v: u32) -> Self {
        use sys::ibv_wc_opcode::*;
        match v {
            IBV_WC_SEND => WcOpcode::Send,
            IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
            IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
            IBV_WC_BIND_MW => WcOpcode::BindMw,
            IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
            IBV_WC_TSO => WcOpcode::Tso,
            IBV_WC_RECV => WcOpcode::Recv,
            IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Unknown(other),
        }
    }

    /// A receive-side completion (a posted receive was consumed).
    pub fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// One work completion, copied out of the CQ (`struct ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The `wr_id` the request was posted with.
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (receives) or read (RDMA Read); undefined for sends.
    pub byte_len: u32,
    /// Immediate data (host byte order) when the peer sent one.
    pub imm_data: Option<u32>,
    /// The rkey the peer invalidated with a Send with Invalidate.
    pub invalidated_rkey: Option<u32>,
    pub qp_num: u32,
    pub vendor_err: u32,
}

impl WorkCompletion {
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }

    pub fn is_flush(&self) -> bool {
        self.status.is_flush()
    }

    pub(crate) fn from_raw(wc: &sys::ibv_wc) -> Self {
        let flags = sys::ibv_wc_flags(wc.wc_flags);
        let zero = sys::ibv_wc_flags(0);
        // SAFETY: the union is two u32 views of the same 4 bytes, every bit pattern is
        // valid; wc_flags says which one the device filled.
        let imm_data = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
        // SAFETY: as above (the other view of the same 4 bytes).
        let invalidated_rkey = unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey };
        let imm = (flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM != zero).then(|| u32::from_be(imm_data));
        let inv = (flags & sys::ibv_wc_flags::IBV_WC_WITH_INV != zero).then_some(invalidated_rkey);
        WorkCompletion {
            wr_id: wc.wr_id,
            status: WcStatus::from_raw(wc.status),
            opcode: WcOpcode::from_raw(wc.opcode),
            byte_len: wc.byte_len,
            imm_data: imm,
            invalidated_rkey: inv,
            qp_num: wc.qp_num,
            vendor_err: wc.vendor_err,
        }
    }
}

/// A completion event channel (`ibv_comp_channel`): a file descriptor that becomes readable
/// when an armed CQ gets a completion, for reactors that sleep when idle. The fd is
/// non-blocking.
pub struct CompletionChannel {
    raw: NonNull<sys::ibv_comp_channel>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread safe; the channel is destroyed once, after every CQ using it
// (each holds an Arc of it).
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: `ctx` is a live context.
        let raw = unsafe { sys::ibv_create_comp_channel(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_create_comp_channel"))?;
        let ch = CompletionChannel { raw, ctx: ctx.clone() };
        set_nonblocking(ch.fd(), "fcntl(comp_channel fd)")?;
        Ok(Arc::new(ch))
    }

    /// Poll/epoll this for readability.
    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel; fd is set at creation and never changes.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Takes one completion event, if any: returns the `token` of the CQ that fired (given at
    /// [`CompletionQueue::new`]). The event is acknowledged here. The CQ is disarmed by the
    /// event: poll it empty, then [`CompletionQueue::req_notify`] again.
    pub fn get_event(&self) -> Result<Option<u64>> {
        let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointers; the fd is non-blocking, so this returns -1
        // with EAGAIN when no event is queued.
        let ret = unsafe { sys::ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut cq_ctx) };
        if ret != 0 {
            let errno = last_errno();
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return Err(RdmaError::Call { call: "ibv_get_cq_event", errno });
        }
        // SAFETY: the event names a live CQ: ibv_destroy_cq waits for every reported event to
        // be acknowledged, so the CQ cannot be freed before this ack.
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        Ok(Some(cq_ctx as u64))
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel and destroyed once; every CQ on it holds
        // an Arc of this channel, so none is left.
        let ret = unsafe { sys::ibv_destroy_comp_channel(self.raw.as_ptr()) };
        if ret != 0 {
            log::error!("ibv_destroy_comp_channel failed: errno {}", last_errno());
        }
    }
}

pub(crate) fn set_nonblocking(fd: RawFd, call: &'static str) -> Result<()> {
    // SAFETY: fcntl on an fd we own; F_GETFL/F_SETFL touch only its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(RdmaError::last(call));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(RdmaError::last(call));
    }
    Ok(())
}

/// A completion queue (`ibv_cq`). One per reactor per device in riser; queue pairs hold an
/// `Arc` of their CQs, so a CQ is destroyed only after its QPs.
pub struct CompletionQueue {
    raw: NonNull<sys::ibv_cq>,
    ctx: Arc<Context>,
    channel: Option<Arc<CompletionChannel>>,
    token: u64,
    capacity: u32,
}

// SAFETY: verbs objects are thread safe (providers lock the CQ); destroyed once in Drop after
// every QP using it (they hold Arcs).
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Creates a CQ with at least `cqe` entries, optionally attached to `channel`; `token` is
    /// what [`CompletionChannel::get_event`] returns for it.
    pub fn new(ctx: &Arc<Context>, cqe: u32, channel: Option<&Arc<CompletionChannel>>, token: u64) -> Result<Arc<Self>> {
        if cqe == 0 || cqe > i32::MAX as u32 {
            return Err(RdmaError::invalid("ibv_create_cq", format!("bad CQ size {cqe}")));
        }
        if let Some(ch) = channel {
            if ch.context().as_raw() != ctx.as_raw() {
                return Err(RdmaError::invalid("ibv_create_cq", "completion channel belongs to another device context"));
            }
        }
        let ch_raw = channel.map_or(std::ptr::null_mut(), |c| c.raw.as_ptr());
        // SAFETY: live context; `ch_raw` is NULL or a live channel of the same context;
        // cq_context is an opaque integer verbs hands back and never dereferences.
        let raw = unsafe { sys::ibv_create_cq(ctx.as_raw(), cqe as i32, token as *mut libc::c_void, ch_raw, 0) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_create_cq"))?;
        // SAFETY: live CQ; cqe is the size the provider actually allocated.
        let capacity = unsafe { (*raw.as_ptr()).cqe }.max(0) as u32;
        Ok(Arc::new(CompletionQueue { raw, ctx: ctx.clone(), channel: channel.cloned(), token, capacity }))
    }

    /// Entries the device allocated (>= the size asked for).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn channel(&self) -> Option<&Arc<CompletionChannel>> {
        self.channel.as_ref()
    }

    pub(crate) fn as_raw(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }

    /// Takes up to `min(out.len(), 32)` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let want = out.len().min(POLL_BATCH);
        if want == 0 {
            return Ok(0);
        }
        // SAFETY: an array of MaybeUninit needs no initialisation.
        let mut wcs: [MaybeUninit<sys::ibv_wc>; POLL_BATCH] = unsafe { MaybeUninit::uninit().assume_init() };
        // SAFETY: live CQ; `wcs` has room for `want` <= 32 entries; the provider writes only the
        // first `n` it returns.
        let n = unsafe { sys::ibv_poll_cq(self.raw.as_ptr(), want as i32, wcs.as_mut_ptr() as *mut sys::ibv_wc) };
        if n < 0 {
            return Err(RdmaError::from_ret("ibv_poll_cq", n));
        }
        let n = n as usize;
        for (dst, src) in out.iter_mut().zip(&wcs[..n]) {
            // SAFETY: the first `n` entries were written by ibv_poll_cq.
            *dst = WorkCompletion::from_raw(unsafe { src.assume_init_ref() });
        }
        Ok(n)
    }

    /// Arms the CQ: the next completion (or the next solicited one) raises an event on its
    /// channel. Poll once more after arming to close the race with completions that came in
    /// between.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: live CQ.
        let ret = unsafe { sys::ibv_req_notify_cq(self.raw.as_ptr(), solicited_only as i32) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_req_notify_cq", ret));
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq and destroyed once; QPs hold Arcs of their CQs, so
        // none is left; channel events are acked as soon as they are read.
        let ret = unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
        if ret != 0 {
            log::error!("ibv_destroy_cq failed: errno {ret}");
        }
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.ctx.name())
            .field("capacity", &self.capacity)
            .field("token", &self.token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw_wc(status: u32, opcode: u32, flags: u32, imm_or_rkey: u32) -> sys::ibv_wc {
        sys::ibv_wc {
            wr_id: 0xfeed,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 76,
            imm_data_invalidated_rkey_union: sys::imm_data_invalidated_rkey_union_t { imm_data: imm_or_rkey },
            qp_num: 17,
            src_qp: 0,
            wc_flags: flags,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }

    #[test]
    fn status_round_trips_and_classifies() {
        for v in 0..=23u32 {
            let s = WcStatus::from_raw(v);
            assert!(!matches!(s, WcStatus::Unknown(_)), "code {v} should be known");
            assert_eq!(s.as_raw(), v);
        }
        assert_eq!(WcStatus::from_raw(99), WcStatus::Unknown(99));
        assert_eq!(WcStatus::Unknown(99).as_raw(), 99);
        assert!(WcStatus::from_raw(sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR).is_flush());
        assert!(WcStatus::from_raw(0).is_success());
        assert!(!WcStatus::RemAccessErr.is_flush());
        assert!(!WcStatus::WrFlushErr.is_success());
        assert_eq!(WcStatus::from_raw(5), WcStatus::WrFlushErr);
        assert_eq!(WcStatus::from_raw(10), WcStatus::RemAccessErr);
        assert_eq!(WcStatus::from_raw(13), WcStatus::RnrRetryExcErr);
        // libibverbs' own text for the code is part of the message.
        assert!(WcStatus::WrFlushErr.to_string().contains("(5)"));
    }

    #[test]
    fn opcode_decoding() {
        assert_eq!(WcOpcode::from_raw(0), WcOpcode::Send);
        assert_eq!(WcOpcode::from_raw(1), WcOpcode::RdmaWrite);
        assert_eq!(WcOpcode::from_raw(2), WcOpcode::RdmaRead);
        assert_eq!(WcOpcode::from_raw(128), WcOpcode::Recv);
        assert!(WcOpcode::from_raw(129).is_recv());
        assert_eq!(WcOpcode::from_raw(1000), WcOpcode::Unknown(1000));
    }

    #[test]
    fn work_completion_from_raw() {
        let ok = WorkCompletion::from_raw(&raw_wc(0, sys::ibv_wc_opcode::IBV_WC_RECV, 0, 0));
        assert_eq!(ok.wr_id, 0xfeed);
        assert_eq!(ok.byte_len, 76);
        assert_eq!(ok.qp_num, 17);
        assert!(ok.is_success() && ok.opcode.is_recv());
        assert_eq!((ok.imm_data, ok.invalidated_rkey), (None, None));

        let imm = WorkCompletion::from_raw(&raw_wc(0, 129, 2, 0x1234_5678u32.to_be()));
        assert_eq!(imm.imm_data, Some(0x1234_5678));
        assert_eq!(imm.invalidated_rkey, None);

        let inv = WorkCompletion::from_raw(&raw_wc(0, 128, 8, 0xabcd));
        assert_eq!(inv.invalidated_rkey, Some(0xabcd));
        assert_eq!(inv.imm_data, None);

        let flushed = WorkCompletion::from_raw(&raw_wc(5, 0, 0, 0));
        assert!(flushed.is_flush() && !flushed.is_success());
    }

    #[test]
    fn ibv_wc_layout_matches_c() {
        // Measured from rdma-core 44's <infiniband/verbs.h> with gcc (sizeof/offsetof).
        assert_eq!(std::mem::size_of::<sys::ibv_wc>(), 48);
        assert_eq!(std::mem::align_of::<sys::ibv_wc>(), 8);
        let wc = raw_wc(0, 0, 0, 0);
        let base = &wc as *const _ as usize;
        let off = |p: *const u8| p as usize - base;
        assert_eq!(off(&wc.byte_len as *const u32 as *const u8), 20);
        assert_eq!(off(&wc.imm_data_invalidated_rkey_union as *const _ as *const u8), 24);
        assert_eq!(off(&wc.qp_num as *const u32 as *const u8), 28);
        assert_eq!(off(&wc.wc_flags as *const u32 as *const u8), 36);
        assert_eq!(off(&wc.dlid_path_bits as *const u8), 45);
    }
}
