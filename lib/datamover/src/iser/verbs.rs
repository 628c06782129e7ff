//! The iSER datamover on real verbs: [`IserQp`] over an rdma_cm id's queue pair and its
//! completion queue, and [`RegisteredMemory`] over a registered memory region. No `unsafe`
//! here: it all lives in `bindings/` (crate riser-rdma).

use std::sync::Arc;

use riser_bdev::IoBuf;
use riser_rdma::{
    sys, Access, CmId, CompletionChannel, CompletionQueue, DeviceAttr, MemoryRegion, ProtectionDomain, RecvWr, SendOp as RSendOp,
    SendWr as RSendWr, WorkCompletion, WrData,
};

use super::pool::{Pool, RegisteredMemory};
use super::wr::{Completion, IserQp, ReadSink, SendOp, SendWr, Sge};
use super::error::IserError;
use super::shared_cq::{CqMember, CqSource, ROUTE_MASK};

impl RegisteredMemory for MemoryRegion {
    fn base(&self) -> u64 {
        self.addr()
    }
    fn len(&self) -> usize {
        MemoryRegion::len(self)
    }
    fn lkey(&self) -> u32 {
        MemoryRegion::lkey(self)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        if let Err(e) = MemoryRegion::read_at(self, offset, dst) {
            log::error!("iSER: read from registered memory failed: {e}");
        }
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) {
        if let Err(e) = MemoryRegion::write_at(self, offset, src) {
            log::error!("iSER: write to registered memory failed: {e}");
        }
    }
}

/// The vendor id soft-iWARP (siw) reports: "bmt" in ASCII (its author's initials).
pub const SIW_VENDOR_ID: u32 = 0x62_6d_74;

/// Whether the device can post Send with Invalidate (IBV_WR_SEND_WITH_INV): it needs the
/// memory management extensions (IBV_DEVICE_MEM_MGT_EXTENSIONS in `device_cap_flags`), which
/// Linux isert checks too before offering it.
///
/// Not on soft-iWARP (siw), although it sets the flag: its user-space provider (rdma-core's
/// libsiw, `push_send_wqe`) copies `wr.rdma.rkey` into the work request's STag for every
/// opcode and never reads `invalidate_rkey`, so the STag to invalidate goes out as 0; the
/// initiator's siw cannot invalidate it and ends the connection with a TERMINATE (Linux
/// ib_iser: "task_rsp failure: remote invalid request error"; dmesg "got TERMINATE. layer 0,
/// type 2, code 9", RDMAP Cannot Invalidate). Declining it (private data 0x40) has the
/// initiator invalidate its own keys instead.
pub fn supports_send_with_invalidate(attr: &DeviceAttr) -> bool {
    attr.device_cap_flags & sys::ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS.0 != 0
        && attr.vendor_id != SIW_VENDOR_ID
}

/// A pool over freshly registered memory: `count` slots of `slot` bytes, local write only
/// (receives land here, SENDs go out from here; no peer may name it).
pub fn registered_pool(pd: &Arc<ProtectionDomain>, count: usize, slot: usize) -> Result<Pool, IserError> {
    let bytes = count * slot;
    let mr = MemoryRegion::zeroed(pd, bytes, Access::LOCAL_WRITE).map_err(|source| {
        note_refused(pd, bytes, &source);
        IserError::Registration { bytes, source }
    })?;
    Ok(Pool::new(Box::new(mr), count, slot))
}

/// Whether `ctx` is soft-iWARP, which counts registrations against RLIMIT_MEMLOCK whatever
/// the process's capabilities.
pub fn is_siw(ctx: &riser_rdma::Context) -> bool {
    ctx.query_device().is_ok_and(|a| a.vendor_id == SIW_VENDOR_ID)
}

/// A registration was refused: the first time in the process that RLIMIT_MEMLOCK can be the
/// cause, say so with the fix ([`super::memlock`]).
fn note_refused(pd: &ProtectionDomain, bytes: usize, e: &riser_rdma::RdmaError) {
    if e.errno() == Some(12) {
        let facts = super::memlock::facts(super::portal::per_connection_bytes() as u64, is_siw(pd.context()));
        super::memlock::note_refused(&facts, bytes, e.errno());
    }
}

fn completion(wc: &WorkCompletion) -> Completion {
    if !wc.is_success() && !wc.is_flush() {
        log::warn!("iSER: work request {:#x} completed with {} (vendor error {:#x})", wc.wr_id, wc.status, wc.vendor_err);
    }
    Completion { wr_id: wc.wr_id, error: if wc.is_success() { None } else { Some(wc.is_flush()) }, byte_len: wc.byte_len }
}

/// The poll side of a verbs CQ shared by the QPs of one reactor on one device: held by its
/// [`super::shared_cq::CqPoller`] alone (see [`super::shared_cq`]).
pub struct VerbsCq {
    cq: Arc<CompletionQueue>,
    wcs: [WorkCompletion; 32],
    /// The CQ's completion channel, in its reactor's wake set from the first poll on.
    channel: Option<Arc<CompletionChannel>>,
    wake: Option<riser_reactor::WakeId>,
    registered: bool,
}

impl VerbsCq {
    /// `channel`: the one `cq` was created on, if any; its events end the adaptive sleep of
    /// the reactor that polls the CQ.
    pub fn new(cq: Arc<CompletionQueue>, channel: Option<Arc<CompletionChannel>>) -> VerbsCq {
        VerbsCq { cq, wcs: [WorkCompletion::default(); 32], channel, wake: None, registered: false }
    }

    /// On the reactor that polls the CQ: before it sleeps, the channel's events are taken
    /// (each acknowledged) and the CQ asks for the next one.
    fn join_wake_set(&mut self) {
        self.registered = true;
        let Some(ch) = self.channel.clone() else { return };
        // SAFETY: the channel's descriptor lives as long as the channel, which this VerbsCq
        // holds until it leaves the wake set (Drop).
        #[allow(unsafe_code)]
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(ch.fd()) };
        let cq = self.cq.clone();
        let ch2 = ch.clone();
        match riser_reactor::add_wake_fd(fd, move || {
            while let Ok(Some(_)) = ch2.get_event() {}
            if let Err(e) = cq.req_notify(false) {
                log::warn!("iSER: cannot arm the shared CQ ({e}); completions wait for the reactor's next pass");
            }
        }) {
            Ok(id) => self.wake = id,
            Err(e) => log::warn!("iSER: the shared CQ cannot wake its reactor ({e}); completions wait for its next pass"),
        }
    }
}

impl Drop for VerbsCq {
    fn drop(&mut self) {
        if let Some(id) = self.wake.take() {
            riser_reactor::remove_wake_fd(id);
        }
    }
}

impl CqSource for VerbsCq {
    fn poll_into(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize, IserError> {
        if !self.registered {
            self.join_wake_set();
        }
        let max = max.min(self.wcs.len());
        let n = self.cq.poll(&mut self.wcs[..max])?;
        out.extend(self.wcs[..n].iter().map(completion));
        Ok(n)
    }
}

/// A QP's slot on its reactor's shared CQ.
pub type VerbsCqMember = CqMember<Arc<CompletionQueue>>;

/// An rdma_cm id with its RC queue pair, whose queues complete on a shared CQ that its
/// reactor polls: every work request carries the QP's route ([`CqMember::route`]) in its
/// `wr_id`, and the QP takes its completions out of its inbox.
pub struct VerbsQp {
    // Dropped in this order: the QP (with the id) before its slot on the shared CQ.
    id: CmId,
    member: VerbsCqMember,
    disconnected: bool,
    /// The device is iWARP: an RDMA Read's sink STag goes on the wire and must allow remote
    /// write (see [`IserQp::register_read_sink`]).
    iwarp: bool,
}

impl VerbsQp {
    /// `id` must already own its QP, created on `member`'s shared CQ.
    pub fn shared(id: CmId, member: VerbsCqMember) -> VerbsQp {
        let iwarp = id.context().ok().flatten().is_some_and(|c| c.is_iwarp());
        VerbsQp { id, member, disconnected: false, iwarp }
    }

    pub fn cm_id(&self) -> &CmId {
        &self.id
    }

    fn routed(&self, wr_id: u64) -> u64 {
        debug_assert_eq!(wr_id & ROUTE_MASK, 0, "the low bits of a wr_id are the route");
        (wr_id & !ROUTE_MASK) | self.member.route()
    }
}

/// An RDMA Read sink's registration for one transfer: dropping it revokes its STag.
struct SinkRegistration(riser_rdma::TransferRegistration);

impl Drop for SinkRegistration {
    fn drop(&mut self) {
        log::debug!("iSER: RDMA Read sink {:#x}+{}: STag {:#x} revoked", self.0.addr(), self.0.len(), self.0.rkey());
    }
}

fn sge(s: Sge) -> riser_rdma::Sge {
    riser_rdma::Sge::new(s.addr, s.len, s.lkey)
}

impl IserQp for VerbsQp {
    fn post_recv(&mut self, wr_id: u64, s: Sge) -> Result<(), IserError> {
        let qp = self.id.qp().ok_or(IserError::NoQueuePair)?;
        Ok(qp.post_recv(self.routed(wr_id), &[sge(s)])?)
    }

    fn post_recvs(&mut self, wrs: &[(u64, Sge)]) -> Result<(), IserError> {
        let qp = self.id.qp().ok_or(IserError::NoQueuePair)?;
        let sges: Vec<[riser_rdma::Sge; 1]> = wrs.iter().map(|&(_, s)| [sge(s)]).collect();
        let chain: Vec<RecvWr<'_>> = wrs.iter().zip(sges.iter()).map(|(&(wr_id, _), s)| RecvWr { wr_id: self.routed(wr_id), sges: s }).collect();
        Ok(qp.post_recvs(&chain)?)
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), IserError> {
        let qp = self.id.qp().ok_or(IserError::NoQueuePair)?;
        let sges: Vec<[riser_rdma::Sge; 1]> = wrs.iter().map(|w| [sge(w.sge)]).collect();
        let chain: Vec<RSendWr<'_>> = wrs
            .iter()
            .zip(sges.iter())
            .map(|(w, s)| {
                let op = match w.op {
                    SendOp::Send => RSendOp::Send,
                    SendOp::SendInvalidate(rkey) => RSendOp::SendWithInv { rkey: rkey.get() },
                    SendOp::RdmaWrite { remote_addr, rkey } => RSendOp::RdmaWrite { remote_addr, rkey: rkey.get() },
                    SendOp::RdmaRead { remote_addr, rkey } => RSendOp::RdmaRead { remote_addr, rkey: rkey.get() },
                };
                let wr = RSendWr::new(self.routed(w.wr_id), op, WrData::Sges(s));
                if w.signaled {
                    wr.signaled()
                } else {
                    wr
                }
            })
            .collect();
        Ok(qp.post_send(&chain)?)
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.member.poll(out, max)
    }

    fn register(&mut self, buf: &mut IoBuf) -> Result<u32, IserError> {
        let qp = self.id.qp().ok_or(IserError::NoQueuePair)?;
        // Local access only, on every transport: these registrations last as long as the
        // pooled mapping and live on the PD every connection of the device shares, so no
        // peer may name them (RDMA Writes are sourced here; RDMA Read sinks on iWARP get a
        // registration of their own per transfer, register_read_sink). InfiniBand and RoCE
        // sinks need only local write.
        let access = Access::LOCAL_WRITE;
        let known = buf.reg_key(riser_rdma::iobuf_domain(qp.pd())).is_some();
        // Registrations stay with pooled mappings, so locked memory grows with the pool; when
        // the device (or RLIMIT_MEMLOCK) refuses one, the idle mappings and their
        // registrations are let go and it is tried once more.
        let lkey = riser_rdma::register_iobuf(qp.pd(), buf, access)
            .or_else(|e| {
                log::warn!("iSER: registering a {} byte I/O buffer failed ({e}); releasing idle registered buffers and retrying", buf.capacity());
                riser_rdma::release_idle_iobuf_registrations();
                riser_rdma::register_iobuf(qp.pd(), buf, access)
            })
            .map_err(|source| {
                note_refused(qp.pd(), buf.capacity(), &source);
                IserError::Registration { bytes: buf.capacity(), source }
            })?;
        if !known {
            log::debug!(
                "iSER: I/O buffer {:#x}+{} registered: lkey {lkey:#x}, local access only",
                buf.mapping_ptr() as usize,
                buf.capacity()
            );
        }
        Ok(lkey)
    }

    fn register_read_sink(&mut self, buf: &mut IoBuf, offset: usize, len: usize) -> Result<ReadSink, IserError> {
        if !self.iwarp {
            return Ok(ReadSink { lkey: self.register(buf)?, transfer: None });
        }
        // iWARP: the sink STag travels in the RDMA Read Request and the responses land on it
        // as tagged (remotely written) data, so the sink must allow remote write (hardware
        // iWARP enforces it; Linux's rdma_rw does the same). A registration with remote write
        // for this transfer alone, over the solicited range only, revoked once the reads are
        // done (the datamover drops it): the key is worth nothing to a peer before or after,
        // as with Linux isert's fast registration, where user-space verbs on siw offer no
        // memory windows (siw: max_mw 0).
        let qp = self.id.qp().ok_or(IserError::NoQueuePair)?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let reg = riser_rdma::register_iobuf_range(qp.pd(), buf, offset, len, access)
            .or_else(|e| {
                log::warn!("iSER: registering a {len} byte RDMA Read sink failed ({e}); releasing idle registered buffers and retrying");
                riser_rdma::release_idle_iobuf_registrations();
                riser_rdma::register_iobuf_range(qp.pd(), buf, offset, len, access)
            })
            .map_err(|source| {
                note_refused(qp.pd(), len, &source);
                IserError::Registration { bytes: len, source }
            })?;
        log::debug!("iSER: RDMA Read sink {:#x}+{len}: STag {:#x}, open for this transfer only", reg.addr(), reg.rkey());
        Ok(ReadSink { lkey: reg.lkey(), transfer: Some(Box::new(SinkRegistration(reg))) })
    }

    fn disconnect(&mut self) {
        if !self.disconnected {
            self.disconnected = true;
            if let Some(qp) = self.id.qp() {
                let _ = qp.set_error();
            }
            let _ = self.id.disconnect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(device_cap_flags: u32) -> DeviceAttr {
        DeviceAttr {
            fw_ver: String::new(),
            node_guid: 0,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_mr_size: 0,
            max_qp: 0,
            max_qp_wr: 0,
            max_sge: 0,
            max_sge_rd: 0,
            max_cq: 0,
            max_cqe: 0,
            max_mr: 0,
            max_pd: 0,
            max_qp_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            max_res_rd_atom: 0,
            max_srq: 0,
            max_srq_wr: 0,
            max_srq_sge: 0,
            max_mw: 0,
            phys_port_cnt: 1,
            device_cap_flags,
        }
    }

    /// siw advertises the memory management extensions, but its user-space provider posts
    /// Send with Invalidate with a zero STag (see [`supports_send_with_invalidate`]).
    #[test]
    fn no_send_with_invalidate_on_soft_iwarp() {
        let mut a = attr(1 << 21);
        a.vendor_id = SIW_VENDOR_ID;
        assert!(!supports_send_with_invalidate(&a));
        assert_eq!(SIW_VENDOR_ID.to_be_bytes()[1..], *b"bmt");
        // soft-RoCE (rxe) reports 0XFFFFFF and keeps it.
        a.vendor_id = 0xff_ffff;
        assert!(supports_send_with_invalidate(&a));
    }

    #[test]
    fn send_with_invalidate_needs_the_memory_management_extensions() {
        assert!(supports_send_with_invalidate(&attr(1 << 21)), "IBV_DEVICE_MEM_MGT_EXTENSIONS is bit 21");
        assert!(supports_send_with_invalidate(&attr(u32::MAX)));
        assert!(!supports_send_with_invalidate(&attr(!(1 << 21))));
    }
}
