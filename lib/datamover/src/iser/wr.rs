//! Work requests as the datamover sees them: the SGE, send-queue work requests and
//! completions, the [`IserQp`] trait it posts them through, and the layout of work request
//! ids (kind, task generation, slot or read index).

use riser_bdev::IoBuf;

use super::error::IserError;
use super::header::Stag;

/// A local buffer for a work request: address, length, local key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// What a send-queue work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    Send,
    /// SEND with Invalidate of the initiator's STag (both sides allowed it).
    SendInvalidate(Stag),
    RdmaWrite { remote_addr: u64, rkey: Stag },
    RdmaRead { remote_addr: u64, rkey: Stag },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sge: Sge,
    pub signaled: bool,
}

/// A completion, reduced to what the datamover needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// None: success. Some(flushed): an error; flushed = the QP was already in error.
    pub error: Option<bool>,
    pub byte_len: u32,
}

/// The verbs the datamover uses on its queue pair.
pub trait IserQp {
    fn post_recv(&mut self, wr_id: u64, sge: Sge) -> Result<(), IserError>;
    /// Posts several receives as one chain (one doorbell).
    fn post_recvs(&mut self, wrs: &[(u64, Sge)]) -> Result<(), IserError> {
        wrs.iter().try_for_each(|&(id, sge)| self.post_recv(id, sge))
    }
    /// Posts `wrs` as one chain (one doorbell).
    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), IserError>;
    /// Appends up to `max` completions.
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize;
    /// Moves the QP to the error state (flushes everything outstanding) and disconnects.
    fn disconnect(&mut self);
    /// Registers `buf`'s memory so that work requests on this QP may name it, and returns
    /// its lkey. Registration stays with the buffer's pooled mapping: a buffer registered
    /// before costs a lookup.
    fn register(&mut self, buf: &mut IoBuf) -> Result<u32, IserError>;
    /// Makes `len` bytes of `buf` from `offset` the sink of RDMA Reads on this QP. Where the
    /// sink needs nothing the peer could use (InfiniBand, RoCE: local write), that is the
    /// buffer's lasting registration ([`Self::register`]). On iWARP the sink's STag goes on
    /// the wire and must allow remote write: there the range gets a registration of its own
    /// for this transfer, which the datamover drops once the reads into it have completed,
    /// so no buffer is open to remote write outside the RDMA Read that fills it.
    fn register_read_sink(&mut self, buf: &mut IoBuf, offset: usize, len: usize) -> Result<ReadSink, IserError> {
        let _ = (offset, len);
        Ok(ReadSink { lkey: self.register(buf)?, transfer: None })
    }
}

/// The sink of a Get_Data's RDMA Reads ([`IserQp::register_read_sink`]): the key its work
/// requests name and, when the sink was registered for this transfer alone, that
/// registration, which ends when dropped.
pub struct ReadSink {
    pub lkey: u32,
    pub transfer: Option<Box<dyn Send>>,
}

/// Work request ids: the kind in the top byte, a task generation in the next three bytes
/// (RDMA Reads; zero elsewhere), the slot or read index in the next two; the low two bytes
/// stay zero: the QP puts its route on the shared CQ there
/// ([`super::shared_cq::ROUTE_BITS`]). Unsignaled RDMA Writes have kind 0 (they complete
/// only in error).
pub(super) const KIND_RECV: u64 = 1 << 56;
pub(super) const KIND_SEND: u64 = 2 << 56;
pub(super) const KIND_READ: u64 = 3 << 56;
/// The signaled last RDMA Write of a batch of a Put_Data larger than the send queue's room.
pub(super) const KIND_WRITE: u64 = 4 << 56;
pub(super) const KIND_MASK: u64 = 0xff << 56;
const GEN_SHIFT: u32 = 32;
pub(super) const GEN_MASK: u32 = 0xff_ffff;
const IDX_SHIFT: u32 = super::shared_cq::ROUTE_BITS;
/// Slot and read indexes are 16 bits: pools hold far fewer slots, and fewer than 2^16 RDMA
/// Reads are ever in flight on one QP (at most its initiator depth, 255).
pub(super) const IDX_MASK: u32 = 0xffff;

pub(super) fn wr_id(kind: u64, gen: u32, idx: u32) -> u64 {
    kind | (u64::from(gen & GEN_MASK) << GEN_SHIFT) | (u64::from(idx & IDX_MASK) << IDX_SHIFT)
}

pub(super) fn wr_gen(wr_id: u64) -> u32 {
    (wr_id >> GEN_SHIFT) as u32 & GEN_MASK
}

pub(super) fn wr_idx(wr_id: u64) -> u32 {
    (wr_id >> IDX_SHIFT) as u32 & IDX_MASK
}
