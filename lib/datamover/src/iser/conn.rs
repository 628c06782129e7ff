//! The iSER datamover of one connection in full-feature phase (RFC 7145 §7, §9).
//!
//! It is written against [`IserQp`], the few verbs it needs (post receive, post a chain of
//! sends / RDMA operations with one doorbell, poll the completion queue), so the protocol
//! logic is unit-tested with an in-memory queue pair and runs on real verbs through
//! `bindings/`. Control messages use two pools carved from buffers registered once: the
//! receive ring and the send buffers. Data never passes through them: the task's own
//! [`IoBuf`] is registered with the QP's protection domain ([`IserQp::register`]; once per
//! pooled mapping, which keeps its registration from one I/O to the next) and the RDMA
//! operations name it directly: zero copies of read and solicited write data. Those lasting
//! registrations allow local access only: the protection domain is shared by every
//! connection of the device, so no peer may name them. On iWARP an RDMA Read's sink STag
//! goes on the wire and needs remote write: there each Get_Data's sink gets a registration of
//! its own ([`IserQp::register_read_sink`]), dropped once its reads have completed.
//!
//! * Put_Data: RDMA Writes from the task's buffer to the initiator's Read STag, chained with
//!   the SCSI Response SEND; only the SEND is signaled (RC completes in order, so its
//!   completion proves the writes done) and the buffer is kept until then. A Put_Data that
//!   does not fit the send queue's free room goes out in batches, each ended by a signaled
//!   RDMA Write. A read streamed in pieces: each piece is written at the Read STag's base +
//!   its command offset; a piece with more to follow has its last write signaled and its
//!   buffer goes back with that completion (not with the response); the final piece's writes
//!   are chained with the response SEND as above.
//! * Get_Data: RDMA Reads from the Write STag straight into the task's buffer at the
//!   solicited offset, at most the negotiated initiator depth outstanding (the rest waits in
//!   a queue, never fails); the buffer is handed back when the last read has completed. A
//!   write fetched in pieces: each Get_Data's buffer holds the command's bytes from `base`.
//! * Every work request on the send queue has a sequence number; a signaled completion
//!   retires it and every unsignaled one before it (RC), so the send queue never overflows
//!   and a buffer is released only once the last work request naming it has retired (a task
//!   deallocated with RDMA in flight keeps its buffer until then).
//! * Every received PDU's buffer is reposted at the end of the pass that decoded it, unless
//!   more than the connection's [`TxLimit`] is queued for the initiator (it sends requests and
//!   does not take the answers: a peer that posts no receives, so that our SENDs never
//!   complete): then the handled receives are held, the initiator runs out of receive credits
//!   and its next SEND waits (RNR: RDMA's own flow control) until the backlog has drained and
//!   they are reposted. What is queued ([`Datamover::tx_backlog`]) is the pending sends and
//!   the SENDs and RDMA Writes posted and not yet completed; `sent` counts the bytes of those
//!   completed, so a queue the initiator takes nothing of is seen as stalled (and closed by
//!   the connection at nop_timeout). A healthy initiator cannot deadlock on it: the backlog
//!   drains through completions of our sends, which need nothing of our receives, and a
//!   SNACK, TMF or Logout goes through once they are reposted.
//! * Immediate data and unsolicited Data-Out are copied out of the receive buffer once
//!   (counted in [`Datamover::copies`]), the header alone read first: the immediate data of
//!   a write partly immediate straight into the task's write buffer when the budget has room
//!   for it ([`WriteBuffers`], delivered as [`DmEvent::Command`]), anything else into the
//!   PDU's segment.
//! * Hello (RFC 7145 §5.1, iWARP): valid only as the first message of full-feature phase
//!   when iSERHelloRequired=Yes; answered with a HelloReply (our version, the ORD capped by
//!   the initiator's IRD), or rejected and the connection closed. Anything else about a
//!   Hello is a protocol error that closes the connection.
//! * Deallocate_Task_Resources (RFC 5047 §8.9, ABORT TASK, LUN RESET): the task's queued
//!   Put_Data, Get_Data and response are dropped. Work already on the wire cannot be
//!   recalled, so every task gets a generation when its SCSI Command arrives, carried in the
//!   work request id of its RDMA Reads: a completion whose generation is not the live task's
//!   (aborted, and maybe its ITT reused since, as Linux and libiscsi do) only frees what the
//!   work request held.

use std::collections::VecDeque;

use riser_bdev::IoBuf;
use riser_iscsi::ffp::{CopyStats, Datamover, DatamoverParams, DmEvent, GetData, PutData, TxBacklog, TxLimit, WriteBuffers};
use riser_iscsi::pdu::{Bhs, Op, Pdu, PduError, RejectReason, Stage, BHS_LEN};
use riser_iscsi::serial::{Itt, TagMap};

use super::error::IserError;
use super::header::{IserHeader, Stag, TaggedBuffer, ISER_HDR_LEN, ISER_VERSION};

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

/// Memory registered with the device (or plain memory in tests). Access is by copy: the
/// device may read or write it at any time while a work request names it.
pub trait RegisteredMemory: Send {
    /// Address of the first byte as the device sees it (the SGE address).
    fn base(&self) -> u64;
    fn len(&self) -> usize;
    fn lkey(&self) -> u32;
    fn read_at(&self, offset: usize, dst: &mut [u8]);
    fn write_at(&mut self, offset: usize, src: &[u8]);
}

/// Plain memory: for unit tests, where an in-memory queue pair plays the device.
impl RegisteredMemory for Box<[u8]> {
    fn base(&self) -> u64 {
        self.as_ptr() as u64
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn lkey(&self) -> u32 {
        0
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        if let Some(src) = self.get(offset..offset + dst.len()) {
            dst.copy_from_slice(src);
        }
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) {
        if let Some(dst) = self.get_mut(offset..offset + src.len()) {
            dst.copy_from_slice(src);
        }
    }
}

/// A pool of fixed-size slots in one registered region.
pub struct Pool {
    mem: Box<dyn RegisteredMemory>,
    slot: usize,
    free: Vec<u32>,
    /// Which slots are handed out: a completion naming a slot that is not (a bogus or
    /// repeated work request id) frees nothing twice.
    busy: Vec<bool>,
}

impl Pool {
    /// `count` slots of `slot` bytes over `mem` (at least `count * slot` bytes).
    pub fn new(mem: Box<dyn RegisteredMemory>, count: usize, slot: usize) -> Pool {
        let count = count.min(mem.len() / slot.max(1));
        Pool { mem, slot, free: (0..count as u32).rev().collect(), busy: vec![false; count] }
    }

    /// A pool over plain memory (tests).
    pub fn plain(count: usize, slot: usize) -> Pool {
        Pool::new(Box::new(vec![0u8; count * slot].into_boxed_slice()), count, slot)
    }

    pub fn slot_size(&self) -> usize {
        self.slot
    }

    fn alloc(&mut self) -> Option<u32> {
        let i = self.free.pop()?;
        if let Some(b) = self.busy.get_mut(i as usize) {
            *b = true;
        }
        Some(i)
    }

    fn release(&mut self, i: u32) {
        match self.busy.get_mut(i as usize) {
            Some(b) if *b => {
                *b = false;
                self.free.push(i);
            }
            _ => log::debug!("iSER: slot {i} freed but not in use; ignored"),
        }
    }

    /// Bytes `off..off + dst.len()` of slot `i` into `dst` (nothing past the slot).
    pub fn read_into(&self, i: u32, off: usize, dst: &mut [u8]) {
        if off + dst.len() <= self.slot {
            self.mem.read_at(i as usize * self.slot + off, dst);
        }
    }

    /// The first `len` bytes of slot `i`.
    pub fn read(&self, i: u32, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len.min(self.slot)];
        self.mem.read_at(i as usize * self.slot, &mut v);
        v
    }

    /// Writes `src` at the start of slot `i`.
    pub fn write(&mut self, i: u32, src: &[u8]) {
        let n = src.len().min(self.slot);
        self.mem.write_at(i as usize * self.slot, &src[..n]);
    }

    /// The SGE of the first `len` bytes of slot `i`.
    pub fn sge(&self, i: u32, len: usize) -> Sge {
        Sge { addr: self.mem.base() + (i as usize * self.slot) as u64, len: len as u32, lkey: self.mem.lkey() }
    }

    pub fn count(&self) -> usize {
        self.mem.len() / self.slot.max(1)
    }
}

/// Unexpected PDUs (RFC 7145 §6.7) an initiator may have in flight beside the commands of
/// its CmdSN window: what RFC 7143 delivers immediately, outside the window (NOP-Out pings,
/// TMF requests such as ABORT TASK and LUN RESET, a Text request, a Logout, immediate SCSI
/// commands). Linux isert keeps 6 receives for the same list: NOP-Out (2), Text, TMF (2),
/// Logout. The negotiation declares MaxOutstandingUnexpectedPDUs with the same margin
/// ([`riser_iscsi::negotiate::iser_max_outstanding_unexpected_pdus`]): one constant for both.
pub const IMMEDIATE_PDU_ROOM: usize = riser_iscsi::negotiate::ISER_UNEXPECTED_PDU_MARGIN as usize;
/// Receives for expected PDUs: the NOP-Out answers to the target's own NOP-In pings.
pub const EXPECTED_PDU_ROOM: usize = 2;
/// Send slots beside one SCSI Response per command: NOP-In, Async Message, TMF / Text /
/// Logout responses, Reject.
pub const SEND_ROOM: usize = 8;
/// Data bytes a small send slot takes: a SCSI Response's sense data (2 + 252 bytes), a
/// Reject's quoted header, a short NOP-In echo. Larger PDUs (Text, Login and NOP-In
/// responses with more data) take one of the [`SEND_ROOM`] large slots.
pub const SMALL_SEND_DATA: usize = 512;

/// Sizes of a connection's resources, from the negotiated keys.
#[derive(Clone, Copy, Debug)]
pub struct IserConfig {
    /// Receive buffers: the CmdSN window plus room for immediate PDUs (NOP-Out, TMF,
    /// Logout, Text) and unsolicited Data-Out ([`IserConfig::for_queue_depth`]).
    pub recv_slots: usize,
    /// TargetRecvDataSegmentLength: the largest data segment a received PDU may carry.
    pub target_recv_data_segment_length: usize,
    pub send_slots: usize,
    /// Largest data segment of a PDU the target sends.
    pub initiator_recv_data_segment_length: usize,
    /// RDMA Reads outstanding at once (the initiator depth from the CM exchange).
    pub max_rdma_reads: u32,
    /// The most bytes one RDMA Read or Write moves: larger transfers are split. Well below
    /// any port's max_msg_sz (soft-RoCE: 8 MiB) and the initiators' registrations.
    pub max_rdma_len: usize,
    /// Work requests the send queue holds (the QP's max_send_wr): SENDs, RDMA Writes and
    /// RDMA Reads outstanding together never exceed it.
    pub send_queue_depth: usize,
    /// Both sides allowed Send with Invalidate (iSER CM private data): each SCSI Response
    /// invalidates the STag its command advertised, sparing the initiator a local
    /// invalidation per I/O.
    pub send_invalidate: bool,
    /// iSERHelloRequired=Yes was negotiated (RFC 7145 §6.10; iWARP): the first message of
    /// full-feature phase must be a Hello. No on IB/RoCE, where nobody sends one. Set from
    /// `DatamoverParams::iser_hello_required` by Notice_Key_Values.
    pub hello_required: bool,
    /// TaggedBufferForSolicitedDataOnly as the initiator declared it (RFC 7145 §6.9), None
    /// when it did not send the key (or when that is not known: see
    /// [`Datamover::notice_key_values`]). It says where the Write STag's buffer starts, so where
    /// the RDMA Reads of solicited data go:
    ///
    /// * `Some(false)`, the RFC's default: the buffer holds all the write data, immediate and
    ///   unsolicited included: solicited byte N (of the whole data) is at Write Base Offset + N.
    /// * `Some(true)`: it holds the solicited data only: byte N is at Write Base Offset +
    ///   N - (immediate and unsolicited bytes received).
    /// * `None`: as `Some(true)`. Linux ib_iser, libiscsi and riser-perf never send the key
    ///   yet advertise the solicited-only layout (write_va = buffer + unsolicited length);
    ///   reading their silence as the RFC's No would shift every write with immediate data.
    pub tagged_buffer_for_solicited_data_only: Option<bool>,
}

impl IserConfig {
    /// The resources of a connection whose session may have `queue_depth` commands
    /// outstanding (the CmdSN window MaxCmdSN - ExpCmdSN + 1 the target opens: the login's
    /// `ResourceKeys::queue_depth`), with `unsolicited_data_out` Data-Out PDUs each command
    /// may send unsolicited (0 with InitialR2T=Yes, which riser always negotiates; else
    /// ceil((FirstBurstLength - immediate data) / TargetRecvDataSegmentLength)). Every SEND
    /// of the initiator must find a posted receive (else RNR NAKs and stalls), so
    ///
    /// * receive ring = queue_depth × (1 + unsolicited_data_out) (a command's immediate data
    ///   rides in its own SEND) + [`IMMEDIATE_PDU_ROOM`] + [`EXPECTED_PDU_ROOM`];
    /// * send slots = queue_depth + [`SEND_ROOM`] (a response per command in one pass).
    ///
    /// The rest is [`IserConfig::default`]; the caller sets what the CM exchange decided
    /// (`max_rdma_reads`, `send_invalidate`, `send_queue_depth`).
    pub fn for_queue_depth(queue_depth: u32, unsolicited_data_out: u32) -> IserConfig {
        let qd = queue_depth.max(1) as usize;
        let unexpected = qd.saturating_mul(1 + unsolicited_data_out as usize).saturating_add(IMMEDIATE_PDU_ROOM);
        IserConfig { recv_slots: unexpected + EXPECTED_PDU_ROOM, send_slots: qd + SEND_ROOM, ..IserConfig::default() }
    }

    /// What the target can declare as MaxOutstandingUnexpectedPDUs (RFC 7145 §6.7) with this
    /// receive ring: every receive but those kept for expected PDUs. With
    /// [`IserConfig::for_queue_depth`] that is queue_depth × (1 + unsolicited_data_out) +
    /// [`IMMEDIATE_PDU_ROOM`].
    pub fn max_outstanding_unexpected_pdus(&self) -> u32 {
        u32::try_from(self.recv_slots.saturating_sub(EXPECTED_PDU_ROOM).max(2)).unwrap_or(u32::MAX)
    }

    /// Receive work requests the QP must allow: the ring, plus the login receive that may
    /// still be posted when the ring goes in (Allocate_Connection_Resources happens during
    /// login).
    pub fn recv_wr(&self) -> u32 {
        u32::try_from(self.recv_slots + 1).unwrap_or(u32::MAX)
    }
}

impl Default for IserConfig {
    fn default() -> Self {
        IserConfig {
            recv_slots: 160,
            target_recv_data_segment_length: 8192,
            send_slots: 160,
            initiator_recv_data_segment_length: 8192,
            max_rdma_reads: 16,
            max_rdma_len: 1 << 20,
            send_queue_depth: 1024,
            send_invalidate: false,
            hello_required: false,
            tagged_buffer_for_solicited_data_only: None,
        }
    }
}

/// Work request ids: the kind in the top byte, a task generation in the next three bytes
/// (RDMA Reads; zero elsewhere), the slot or read index in the next two; the low two bytes
/// stay zero: the QP puts its route on the shared CQ there
/// ([`super::shared_cq::ROUTE_BITS`]). Unsignaled RDMA Writes have kind 0 (they complete
/// only in error).
const KIND_RECV: u64 = 1 << 56;
const KIND_SEND: u64 = 2 << 56;
const KIND_READ: u64 = 3 << 56;
/// The signaled last RDMA Write of a batch of a Put_Data larger than the send queue's room.
const KIND_WRITE: u64 = 4 << 56;
const KIND_MASK: u64 = 0xff << 56;
const GEN_SHIFT: u32 = 32;
const GEN_MASK: u32 = 0xff_ffff;
const IDX_SHIFT: u32 = super::shared_cq::ROUTE_BITS;
/// Slot and read indexes are 16 bits: pools hold far fewer slots, and fewer than 2^16 RDMA
/// Reads are ever in flight on one QP (at most its initiator depth, 255).
const IDX_MASK: u32 = 0xffff;

fn wr_id(kind: u64, gen: u32, idx: u32) -> u64 {
    kind | (u64::from(gen & GEN_MASK) << GEN_SHIFT) | (u64::from(idx & IDX_MASK) << IDX_SHIFT)
}

fn wr_gen(wr_id: u64) -> u32 {
    (wr_id >> GEN_SHIFT) as u32 & GEN_MASK
}

fn wr_idx(wr_id: u64) -> u32 {
    (wr_id >> IDX_SHIFT) as u32 & IDX_MASK
}

/// What the datamover knows of a task, from its SCSI Command until its response goes out
/// or it is deallocated.
struct Task {
    /// Fences this task's work requests from a later task with the same ITT.
    gen: u32,
    write: Option<TaggedBuffer>,
    read: Option<TaggedBuffer>,
    /// Unsolicited bytes received: immediate data and unsolicited Data-Out.
    unsolicited: u64,
}

/// Bytes for the initiator, by where they live: outside budgeted I/O buffers (control PDUs
/// in send slots) or in the tasks' buffers (read data).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct TxBytes {
    unbudgeted: u64,
    budgeted: u64,
}

/// Bytes of the iSER message that carries `pdu` (iSER header, BHS, AHS, data segment).
fn message_len(pdu: &Pdu) -> usize {
    ISER_HDR_LEN + BHS_LEN + pdu.ahs.len() + pdu.data.len()
}

/// A send waiting for a send slot or data chunks.
enum Pending {
    /// A PDU, and the STag its SEND invalidates (a SCSI Response with Send with Invalidate).
    Control(Pdu, Option<Stag>),
    /// A Put_Data, the generation of its task when it was asked for (None: a task the
    /// datamover never saw a command of: no Read STag), the bytes already written, and the
    /// send-queue sequence number of the last work request that named its buffer (batches).
    Put { put: PutData, gen: Option<u32>, sent: usize, fence: Option<u64> },
    /// The answer to the initiator's Hello.
    HelloReply(IserHeader),
}

impl Pending {
    /// `(unbudgeted, budgeted)`: bytes of its PDU (a Put_Data's response), and read data
    /// still to be written from the task's buffer.
    fn size(&self) -> (usize, usize) {
        match self {
            Pending::Control(pdu, _) => (message_len(pdu), 0),
            Pending::Put { put, sent, .. } => {
                let len = (put.len as usize).min(put.buf.len());
                (put.response.as_ref().map_or(0, message_len), len - (*sent).min(len))
            }
            Pending::HelloReply(h) => (h.wire_len(), 0),
        }
    }
}

/// A Get_Data in progress.
struct Fetch {
    gen: u32,
    buf: IoBuf,
    /// The buffer's first byte as the device sees it, and the lkey of the reads' sink.
    addr: u64,
    lkey: u32,
    /// The sink's registration for this transfer alone (iWARP), dropped once no RDMA Read
    /// can land in it any more: before the buffer is handed on.
    transfer: Option<Box<dyn Send>>,
    /// RDMA Reads still to complete (queued or in flight).
    outstanding: usize,
    /// The send-queue sequence number of the last RDMA Read posted into the buffer.
    fence: Option<u64>,
    /// Why the Get_Data fails, once something went wrong.
    failed: Option<&'static str>,
}

/// One RDMA Read not yet posted, or in flight.
#[derive(Clone, Copy)]
struct ReadJob {
    itt: Itt,
    gen: u32,
    remote_addr: u64,
    rkey: Stag,
    /// Where in the task's buffer the bytes go.
    buf_offset: usize,
    len: usize,
}

/// The iSER datamover of one connection.
pub struct IserDatamover<Q: IserQp> {
    qp: Q,
    cfg: IserConfig,
    recv: Pool,
    /// Send slots for small control PDUs (one per command: its SCSI Response), and the few
    /// large ones for PDUs with more data.
    send: Pool,
    send_large: Pool,
    /// The tasks whose SCSI Command arrived, by ITT.
    tasks: TagMap<Itt, Task>,
    next_gen: u32,
    /// Send-queue work requests staged so far; the sequence number of the last one.
    sq_posted: u64,
    /// Every work request up to this sequence number has completed (retired).
    sq_retired: u64,
    /// Sequence numbers of the signaled work requests not yet completed, in posting order
    /// (the order an RC send queue completes them in), each with [`Self::posted`] as it was
    /// once that work request was staged: what its completion proves taken.
    signaled: VecDeque<(u64, TxBytes)>,
    /// Bytes staged for the initiator so far (SENDs, RDMA Writes), and those whose work
    /// requests have completed ([`Datamover::tx_backlog`]).
    posted: TxBytes,
    completed: TxBytes,
    /// Bytes in `pending`: outside budgeted I/O buffers (PDUs), and read data still to be
    /// written from the tasks' buffers.
    pending_unbudgeted: usize,
    pending_budgeted: usize,
    /// Receives are held while more than this is queued for the initiator.
    tx_limit: TxLimit,
    /// Receive slots handled and not yet reposted: reposted at the end of the pass, or held
    /// while the backlog is over `tx_limit`.
    rx_handled: Vec<u32>,
    /// Receives are held for the backlog (for the log line at each change).
    rx_paused: bool,
    /// Buffers the device may still read or write: released once the send queue has
    /// retired the sequence number they are paired with.
    held: Vec<(u64, IoBuf)>,
    /// Transfer registrations of RDMA Read sinks whose task went away with reads in flight:
    /// dropped (deregistered) once the send queue has retired the sequence number.
    held_transfers: Vec<(u64, Box<dyn Send>)>,
    pending: VecDeque<Pending>,
    fetches: TagMap<Itt, Fetch>,
    /// Get_Data requests settled without any RDMA Read, reported by the next poll: ready
    /// (None) or failed (the reason).
    settled: crate::Settled,
    read_queue: VecDeque<ReadJob>,
    /// In-flight reads by their index in the work request id.
    reads: TagMap<u32, ReadJob>,
    next_read: u32,
    /// Payload bytes copied by the CPU (immediate data and unsolicited Data-Out only).
    copies: CopyStats,
    /// Where write buffers for immediate data come from (none: in the PDU's segment).
    write_bufs: Option<WriteBuffers>,
    /// Data segments handed back ([`Datamover::recycle`]), for the next PDUs' data.
    spare: Vec<Vec<u8>>,
    wcs: Vec<Completion>,
    /// Work requests of this poll pass, posted together at its end: one doorbell per pass
    /// for the send queue, one for the receive queue.
    tx: Vec<SendWr>,
    rx: Vec<(u64, Sge)>,
    terminating: bool,
    dead: bool,
    /// The final Login Response went out: full-feature phase.
    ffp: bool,
    /// A message arrived in full-feature phase (the Hello, when required, must be the first).
    ffp_rx: bool,
    /// Why the connection closes once what is queued has gone out (a rejected Hello);
    /// nothing received meanwhile is taken.
    closing: Option<String>,
}

impl<Q: IserQp> IserDatamover<Q> {
    /// Takes a connected QP whose memory pools are registered (`pools` = receive ring, small
    /// and large send slots, sized by [`IserDatamover::pool_sizes`]) and posts the whole
    /// receive ring (RFC 7145: before the final Login Response is sent).
    pub fn new(qp: Q, cfg: IserConfig, pools: (Pool, Pool, Pool)) -> Result<Self, IserError> {
        let (recv, send, send_large) = pools;
        debug_assert!(recv.count() <= IDX_MASK as usize && send.count().max(send_large.count()) < Self::LARGE_SLOT as usize);
        let mut dm = IserDatamover {
            qp,
            cfg,
            recv,
            send,
            send_large,
            tasks: TagMap::default(),
            next_gen: 0,
            sq_posted: 0,
            sq_retired: 0,
            signaled: VecDeque::new(),
            posted: TxBytes::default(),
            completed: TxBytes::default(),
            pending_unbudgeted: 0,
            pending_budgeted: 0,
            tx_limit: TxLimit::default(),
            rx_handled: Vec::new(),
            rx_paused: false,
            held: Vec::new(),
            held_transfers: Vec::new(),
            pending: VecDeque::new(),
            fetches: TagMap::default(),
            settled: VecDeque::new(),
            read_queue: VecDeque::new(),
            reads: TagMap::default(),
            next_read: 0,
            copies: CopyStats::default(),
            write_bufs: None,
            spare: Vec::new(),
            wcs: Vec::with_capacity(32),
            tx: Vec::with_capacity(64),
            rx: Vec::with_capacity(32),
            terminating: false,
            dead: false,
            ffp: false,
            ffp_rx: false,
            closing: None,
        };
        let ring: Vec<(u64, Sge)> =
            (0..dm.recv.count() as u32).map(|i| (wr_id(KIND_RECV, 0, i), dm.recv.sge(i, dm.recv.slot_size()))).collect();
        dm.qp.post_recvs(&ring)?;
        // All receive slots are owned by the QP from here on.
        dm.recv.free.clear();
        Ok(dm)
    }

    /// Slot counts and sizes of the three pools: the receive ring (each receive takes the
    /// largest PDU the initiator may send: TargetRecvDataSegmentLength of immediate data),
    /// small send slots (`send_slots`), and [`SEND_ROOM`] large ones (a PDU of
    /// InitiatorRecvDataSegmentLength). Data has no pool: it moves between the tasks' own
    /// buffers and the initiator's.
    pub fn pool_sizes(cfg: &IserConfig) -> [(usize, usize); 3] {
        [
            (cfg.recv_slots, ISER_HDR_LEN + BHS_LEN + 1020 + cfg.target_recv_data_segment_length),
            (cfg.send_slots, ISER_HDR_LEN + BHS_LEN + SMALL_SEND_DATA),
            (SEND_ROOM, ISER_HDR_LEN + BHS_LEN + cfg.initiator_recv_data_segment_length.max(SMALL_SEND_DATA)),
        ]
    }

    /// The pools over plain memory (tests).
    pub fn plain_pools(cfg: &IserConfig) -> (Pool, Pool, Pool) {
        let [r, s, l] = Self::pool_sizes(cfg);
        (Pool::plain(r.0, r.1), Pool::plain(s.0, s.1), Pool::plain(l.0, l.1))
    }

    pub fn qp_mut(&mut self) -> &mut Q {
        &mut self.qp
    }

    /// Sets whether the first message of full-feature phase must be a Hello (negotiated
    /// iSERHelloRequired; [`IserConfig::hello_required`]); call it before that message.
    pub fn set_hello_required(&mut self, required: bool) {
        self.cfg.hello_required = required;
    }

    /// Sets TaggedBufferForSolicitedDataOnly as the initiator declared it (None: not sent);
    /// see [`IserConfig::tagged_buffer_for_solicited_data_only`]. Applies to the Get_Data
    /// asked for from then on.
    pub fn set_tagged_buffer_for_solicited_data_only(&mut self, declared: Option<bool>) {
        self.cfg.tagged_buffer_for_solicited_data_only = declared;
    }

    /// Full-feature phase starts now. The datamover sees the final Login Response go out
    /// through [`Datamover::send_control`] and needs this only when the login ran elsewhere
    /// (iWARP's login in TCP streaming mode, before the switch to RDMA mode).
    pub fn enter_full_feature_phase(&mut self) {
        self.ffp = true;
    }

    fn fail(&mut self, why: String, events: &mut Vec<DmEvent>) {
        if !self.dead {
            log::warn!("iSER: {why}; the connection closes");
            self.dead = true;
            self.tx.clear();
            self.rx.clear();
            self.qp.disconnect();
            events.push(DmEvent::Terminated(why));
        }
    }

    /// A fresh task generation (24 bits wrap: a work request would have to outlive 16 M
    /// later tasks to be mistaken for a live one).
    fn new_gen(&mut self) -> u32 {
        self.next_gen = self.next_gen.wrapping_add(1) & GEN_MASK;
        self.next_gen
    }

    /// Builds the SEND of a control PDU into a send slot; None when no slot is free.
    /// The slot ids of large send slots have this bit set.
    const LARGE_SLOT: u32 = 1 << 15;

    /// Builds the SEND of a control PDU into a send slot (a small one if it fits, else a
    /// large one); None when no slot is free. Returns the slot id and its SGE.
    fn stage_control(&mut self, pdu: &Pdu) -> Option<Result<(u32, Sge), IserError>> {
        let mut msg = Vec::with_capacity(ISER_HDR_LEN + BHS_LEN + pdu.data.len());
        msg.extend_from_slice(&IserHeader::TARGET_CONTROL);
        if let Err(e) = pdu.encode_message(&mut msg) {
            return Some(Err(IserError::Encode { opcode: pdu.opcode(), source: e }));
        }
        let (pool, tag) = if msg.len() <= self.send.slot_size() {
            (&mut self.send, 0)
        } else {
            (&mut self.send_large, Self::LARGE_SLOT)
        };
        let slot = pool.alloc()?;
        let room = pool.slot_size();
        if msg.len() > room {
            // Full-feature PDUs to the initiator stay small (sense data, NOP echo); a larger
            // one is cut to what the initiator accepts rather than overrunning its buffer.
            msg.truncate(room);
        }
        let n = msg.len();
        pool.write(slot, &msg);
        Some(Ok((slot | tag, pool.sge(slot, n))))
    }

    /// Free entries of the send queue.
    fn sq_room(&self) -> usize {
        let in_flight = usize::try_from(self.sq_posted - self.sq_retired).unwrap_or(usize::MAX);
        self.cfg.send_queue_depth.saturating_sub(in_flight)
    }

    /// Stages a send-queue work request for this pass's doorbell; returns its sequence number.
    fn push_tx(&mut self, wr: SendWr) -> u64 {
        self.sq_posted += 1;
        match wr.op {
            SendOp::Send | SendOp::SendInvalidate(_) => self.posted.unbudgeted += u64::from(wr.sge.len),
            SendOp::RdmaWrite { .. } => self.posted.budgeted += u64::from(wr.sge.len),
            SendOp::RdmaRead { .. } => {}
        }
        if wr.signaled {
            self.signaled.push_back((self.sq_posted, self.posted));
        }
        self.tx.push(wr);
        self.sq_posted
    }

    /// Keeps `buf` until the send queue has retired `fence` (None: nothing names it).
    fn hold(&mut self, fence: Option<u64>, buf: IoBuf) -> Option<IoBuf> {
        match fence {
            Some(f) if f > self.sq_retired => {
                self.held.push((f, buf));
                None
            }
            _ => Some(buf),
        }
    }

    /// Keeps a read sink's transfer registration until the send queue has retired `fence`
    /// (None: no read names it; it is dropped, deregistered, at once).
    fn hold_transfer(&mut self, fence: Option<u64>, transfer: Option<Box<dyn Send>>) {
        match (fence, transfer) {
            (Some(f), Some(t)) if f > self.sq_retired => self.held_transfers.push((f, t)),
            _ => {}
        }
    }

    /// A signaled send-queue work request completed: it and everything posted before it
    /// are done; the buffers they named go back.
    fn retire_signaled(&mut self) {
        if let Some((seq, posted)) = self.signaled.pop_front() {
            self.sq_retired = seq;
            self.completed = posted;
            let retired = self.sq_retired;
            self.held.retain(|(f, _)| *f > retired);
            self.held_transfers.retain(|(f, _)| *f > retired);
        }
    }

    /// Tries to send one pending item; gives it back when resources are short (it stays
    /// queued). A PDU that cannot be encoded fails the connection: its task (or the
    /// exchange it answers) could never complete, and the queue behind it would stall.
    fn try_send(&mut self, item: Pending, events: &mut Vec<DmEvent>) -> Result<(), Pending> {
        match item {
            Pending::Control(pdu, inv) => {
                if self.sq_room() == 0 {
                    return Err(Pending::Control(pdu, inv));
                }
                match self.stage_control(&pdu) {
                    None => Err(Pending::Control(pdu, inv)),
                    Some(Err(e)) => {
                        self.fail(e.to_string(), events);
                        Ok(())
                    }
                    Some(Ok((slot, sge))) => {
                        let op = inv.map_or(SendOp::Send, SendOp::SendInvalidate);
                        self.push_tx(SendWr { wr_id: wr_id(KIND_SEND, 0, slot), op, sge, signaled: true });
                        Ok(())
                    }
                }
            }
            Pending::HelloReply(h) => {
                if self.sq_room() == 0 {
                    return Err(Pending::HelloReply(h));
                }
                let Some(slot) = self.send.alloc() else { return Err(Pending::HelloReply(h)) };
                let mut b = [0u8; ISER_HDR_LEN];
                h.write(&mut b);
                self.send.write(slot, &b[..h.wire_len()]);
                let sge = self.send.sge(slot, h.wire_len());
                self.push_tx(SendWr { wr_id: wr_id(KIND_SEND, 0, slot), op: SendOp::Send, sge, signaled: true });
                Ok(())
            }
            Pending::Put { mut put, gen, sent, fence } => {
                let read = match gen {
                    Some(g) => match self.tasks.get(&put.itt) {
                        Some(t) if t.gen == g => t.read,
                        // Deallocated meanwhile (and maybe its ITT reused): never sent.
                        _ => {
                            log::debug!("iSER: Put_Data of task {:#x} dropped (task gone)", put.itt.0);
                            self.hold(fence, put.buf);
                            return Ok(());
                        }
                    },
                    None => None,
                };
                let Some(read) = read else {
                    // A read without a Read STag: nothing can be written; the response
                    // (with its residual) still goes out after the final piece.
                    log::warn!("iSER: task {:#x} has data but no Read STag", put.itt.0);
                    self.hold(fence, put.buf);
                    let Some(response) = put.response else { return Ok(()) };
                    let inv = gen.and_then(|_| self.invalidate(put.itt));
                    if gen.is_some() {
                        self.tasks.remove(&put.itt);
                    }
                    return self.try_send(Pending::Control(response, inv), events);
                };
                let len = (put.len as usize).min(put.buf.len());
                let wrs = (len - sent.min(len)).div_ceil(self.cfg.max_rdma_len.max(1));
                let lkey = if wrs == 0 {
                    0
                } else {
                    match self.qp.register(&mut put.buf) {
                        Ok(k) => k,
                        Err(e) => {
                            // The data cannot reach the initiator, and a response without it
                            // would report a read that never happened.
                            self.hold(fence, put.buf);
                            self.fail(format!("cannot register the read data of task {:#x}: {e}", put.itt.0), events);
                            return Ok(());
                        }
                    }
                };
                let Some(response) = put.response.take() else {
                    // A piece with more to follow: its writes alone, the last one signaled so
                    // that its buffer goes back once they are done, not with the response.
                    let room = self.sq_room().min(wrs);
                    if room == 0 && wrs > 0 {
                        return Err(Pending::Put { put, gen, sent, fence });
                    }
                    let (sent, last) = self.rdma_writes(&put, lkey, read, sent, len, room, true);
                    let fence = last.or(fence);
                    if sent < len {
                        return Err(Pending::Put { put, gen, sent, fence });
                    }
                    self.hold(fence, put.buf);
                    return Ok(());
                };
                let room = self.sq_room();
                if room < wrs + 1 {
                    // More than the send queue has room for: write what fits now, the last
                    // write signaled so that its completion makes room again.
                    put.response = Some(response);
                    if room == 0 || wrs == 0 {
                        return Err(Pending::Put { put, gen, sent, fence });
                    }
                    let (sent, last) = self.rdma_writes(&put, lkey, read, sent, len, room, true);
                    return Err(Pending::Put { put, gen, sent, fence: last.or(fence) });
                }
                // The response first: if it cannot be encoded, no data goes out either.
                let (slot, sge) = match self.stage_control(&response) {
                    None => {
                        put.response = Some(response);
                        return Err(Pending::Put { put, gen, sent, fence });
                    }
                    Some(Err(e)) => {
                        self.hold(fence, put.buf);
                        self.fail(e.to_string(), events);
                        return Ok(());
                    }
                    Some(Ok(s)) => s,
                };
                self.rdma_writes(&put, lkey, read, sent, len, wrs, false);
                let op = if self.cfg.send_invalidate { SendOp::SendInvalidate(read.stag()) } else { SendOp::Send };
                let seq = self.push_tx(SendWr { wr_id: wr_id(KIND_SEND, 0, slot), op, sge, signaled: true });
                // RC completes in order: the response's completion proves the writes done.
                self.hold(Some(seq), put.buf);
                self.tasks.remove(&put.itt);
                Ok(())
            }
        }
    }

    /// Up to `max_wrs` RDMA Writes of `put`'s bytes from `from` (below `len`) straight from
    /// its buffer (registered under `lkey`) to the Read STag; the last one signaled if
    /// `signal_last`. Returns the bytes written so far and the last write's sequence number.
    #[allow(clippy::too_many_arguments)]
    fn rdma_writes(
        &mut self,
        put: &PutData,
        lkey: u32,
        read: TaggedBuffer,
        from: usize,
        len: usize,
        max_wrs: usize,
        signal_last: bool,
    ) -> (usize, Option<u64>) {
        let base = put.buf.as_ptr() as u64;
        let mut off = from;
        let mut last = None;
        for i in 0..max_wrs {
            if off >= len {
                break;
            }
            let n = (len - off).min(self.cfg.max_rdma_len.max(1));
            let signaled = signal_last && (i + 1 == max_wrs || off + n >= len);
            last = Some(self.push_tx(SendWr {
                wr_id: if signaled { wr_id(KIND_WRITE, 0, 0) } else { 0 },
                // The piece's bytes at their place in the command's data (RFC 7145 §7.3.5).
                op: SendOp::RdmaWrite { remote_addr: read.base_offset.wrapping_add(u64::from(put.offset) + off as u64), rkey: read.stag() },
                sge: Sge { addr: base + off as u64, len: n as u32, lkey },
                signaled,
            }));
            off += n;
        }
        (off, last)
    }

    /// Queues a send behind the others (`front`: before them), counted in the backlog.
    fn enqueue(&mut self, item: Pending, front: bool) {
        let (u, b) = item.size();
        self.pending_unbudgeted += u;
        self.pending_budgeted += b;
        if front {
            self.pending.push_front(item);
        } else {
            self.pending.push_back(item);
        }
    }

    /// Takes the first queued send out of the backlog's count.
    fn dequeue(&mut self) -> Option<Pending> {
        let item = self.pending.pop_front()?;
        let (u, b) = item.size();
        self.pending_unbudgeted = self.pending_unbudgeted.saturating_sub(u);
        self.pending_budgeted = self.pending_budgeted.saturating_sub(b);
        Some(item)
    }

    /// Counts `pending` again (after it was filtered).
    fn recount_pending(&mut self) {
        let (u, b) = self.pending.iter().map(Pending::size).fold((0, 0), |(u, b), (pu, pb)| (u + pu, b + pb));
        self.pending_unbudgeted = u;
        self.pending_budgeted = b;
    }

    /// Hands the handled receive slots back to the QP with this pass's doorbell, unless more
    /// than the limit is queued for the initiator: then they are held (it can send no more
    /// than the receives still posted) until it has taken enough of the backlog.
    fn repost_receives(&mut self) {
        if self.rx_handled.is_empty() {
            return;
        }
        let b = self.tx_backlog();
        let over = self.tx_limit.exceeded_by(&b);
        if over != self.rx_paused {
            self.rx_paused = over;
            if over {
                log::debug!(
                    "iSER: {} bytes queued for the initiator ({} outside I/O buffers, {} sends waiting): its receives are held until it takes them",
                    b.total,
                    b.unbudgeted,
                    self.pending.len()
                );
            } else {
                log::debug!("iSER: send backlog down to {} bytes: {} receives reposted", b.total, self.rx_handled.len());
            }
        }
        if over {
            return;
        }
        for slot in self.rx_handled.drain(..) {
            self.rx.push((wr_id(KIND_RECV, 0, slot), self.recv.sge(slot, self.recv.slot_size())));
        }
    }

    fn flush_pending(&mut self, events: &mut Vec<DmEvent>) -> usize {
        let mut n = 0;
        while let Some(item) = self.dequeue() {
            match self.try_send(item, events) {
                Ok(()) => n += 1,
                Err(item) => {
                    self.enqueue(item, true);
                    break;
                }
            }
            if self.dead {
                break;
            }
        }
        n
    }

    /// Whether `gen` is the generation of the live Get_Data of task `itt`.
    fn fetch_is_live(&self, itt: Itt, gen: u32) -> bool {
        self.fetches.get(&itt).is_some_and(|f| f.gen == gen)
    }

    /// Posts queued RDMA Reads, straight into the tasks' buffers, while the initiator depth
    /// and the send queue allow.
    fn start_reads(&mut self) -> usize {
        let mut n = 0;
        // `reads` already holds the ones posted in this loop.
        while self.reads.len() < self.cfg.max_rdma_reads as usize && self.sq_room() > 0 {
            let Some(job) = self.read_queue.pop_front() else { break };
            let Some((addr, lkey)) = self.fetches.get(&job.itt).filter(|f| f.gen == job.gen).map(|f| (f.addr, f.lkey)) else {
                // Its task was deallocated (the queue is purged then; this is a safety net).
                continue;
            };
            self.next_read = self.next_read.wrapping_add(1) & IDX_MASK;
            let idx = self.next_read;
            let seq = self.push_tx(SendWr {
                wr_id: wr_id(KIND_READ, job.gen, idx),
                op: SendOp::RdmaRead { remote_addr: job.remote_addr, rkey: job.rkey },
                sge: Sge { addr: addr + job.buf_offset as u64, len: job.len as u32, lkey },
                signaled: true,
            });
            if let Some(f) = self.fetches.get_mut(&job.itt) {
                f.fence = Some(seq);
            }
            self.reads.insert(idx, job);
            n += 1;
        }
        n
    }

    /// Decodes the PDU received in slot `slot` (`len` bytes with the iSER header), reading
    /// the header first and then the data segment once, straight to where it goes: the
    /// task's write buffer (returned with the PDU) for the immediate data of a write partly
    /// immediate when the budget has room for it, else the PDU's segment.
    fn decode_pdu(&mut self, slot: u32, len: usize) -> Result<(Pdu, Option<IoBuf>), PduError> {
        let max = self.cfg.target_recv_data_segment_length;
        let mut raw = [0u8; BHS_LEN];
        let body = len.saturating_sub(ISER_HDR_LEN);
        let header = (body >= BHS_LEN)
            .then(|| {
                self.recv.read_into(slot, ISER_HDR_LEN, &mut raw);
                Bhs::parse(&raw).ok()
            })
            .flatten();
        let Some(bhs) = header else {
            // Short or malformed: the codec names the error.
            let msg = self.recv.read(slot, len);
            return Pdu::decode_message(msg.get(ISER_HDR_LEN..).unwrap_or_default(), max).map(|p| (p, None));
        };
        let ahs_len = bhs.total_ahs_length as usize * 4;
        let dsl = bhs.data_segment_length as usize;
        let rest = body - BHS_LEN;
        if dsl > max || rest < ahs_len + dsl || rest - ahs_len - dsl >= 4 {
            let msg = self.recv.read(slot, len);
            return Pdu::decode_message(msg.get(ISER_HDR_LEN..).unwrap_or_default(), max).map(|p| (p, None));
        }
        let mut ahs = vec![0u8; ahs_len];
        self.recv.read_into(slot, ISER_HDR_LEN + BHS_LEN, &mut ahs);
        let at = ISER_HDR_LEN + BHS_LEN + ahs_len;
        let placed = match self.write_bufs.as_ref().and_then(|wb| wb.wants(&bhs).and_then(|(edtl, _)| wb.take_now(edtl))) {
            Some(mut buf) => {
                if let Some(dst) = buf.as_mut_slice().get_mut(..dsl) {
                    self.recv.read_into(slot, at, dst);
                }
                Some(buf)
            }
            None => None,
        };
        let mut data = Vec::new();
        if placed.is_none() && dsl > 0 {
            data = match self.spare.iter().rposition(|v| v.capacity() >= dsl) {
                Some(i) => self.spare.swap_remove(i),
                None => riser_buf::take_vec(dsl),
            };
            data.resize(dsl, 0);
            self.recv.read_into(slot, at, &mut data);
        }
        Ok((Pdu { bhs, ahs, data }, placed))
    }

    fn on_recv(&mut self, slot: u32, len: usize, events: &mut Vec<DmEvent>) {
        let mut head = [0u8; ISER_HDR_LEN];
        let head_len = len.min(ISER_HDR_LEN);
        self.recv.read_into(slot, 0, &mut head[..head_len]);
        let msg = &head[..head_len];
        let first_of_ffp = self.ffp && !self.ffp_rx;
        self.ffp_rx |= self.ffp;
        let header = if self.closing.is_some() { None } else { Some(IserHeader::parse(msg)) };
        match header {
            // Closing after a rejected Hello: nothing more is taken.
            None => {}
            Some(Ok(IserHeader::Control { .. })) if first_of_ffp && self.cfg.hello_required => {
                let why = "iSERHelloRequired=Yes, but the first message of full-feature phase is not a Hello";
                self.fail(why.into(), events);
                return;
            }
            Some(Ok(IserHeader::Control { write, read })) => {
                match self.decode_pdu(slot, len) {
                    Ok((pdu, placed)) => {
                        // The data segment's bytes were copied once out of the receive buffer.
                        let segment = pdu.bhs.data_segment_length as u64;
                        match pdu.op() {
                            Op::ScsiCommand(c) => {
                                // A new task, even under an ITT seen before: whatever is still
                                // on the wire for the old one can no longer reach this one.
                                let gen = self.new_gen();
                                self.copies.unsolicited_bytes += segment;
                                self.tasks.insert(c.itt, Task { gen, write, read, unsolicited: segment });
                            }
                            Op::DataOut(d) if d.ttt.is_reserved() => {
                                self.copies.unsolicited_bytes += segment;
                                if let Some(t) = self.tasks.get_mut(&d.itt) {
                                    t.unsolicited += segment;
                                }
                            }
                            _ => {}
                        }
                        events.push(match placed {
                            Some(buf) => DmEvent::Command { pdu, buf },
                            None => DmEvent::Control(pdu),
                        });
                    }
                    Err(e) => {
                        log::warn!("iSER: malformed PDU: {e}");
                        let mut h = [0u8; BHS_LEN];
                        let n = len.saturating_sub(ISER_HDR_LEN).min(BHS_LEN);
                        self.recv.read_into(slot, ISER_HDR_LEN, &mut h[..n]);
                        events.push(DmEvent::Reject { header: h, reason: RejectReason::ProtocolError });
                    }
                }
            }
            Some(Ok(IserHeader::Hello { max_ver, min_ver, ird })) => {
                self.on_hello(max_ver, min_ver, ird, first_of_ffp, events)
            }
            Some(Ok(IserHeader::HelloReply { .. }) | Err(_)) => {
                self.fail(format!("protocol error: bad iSER header (unexpected message of {len} bytes)"), events);
            }
        }
        if self.dead {
            return;
        }
        // The PDU was copied out: the buffer goes back to the QP with this pass's doorbell,
        // or waits while the initiator leaves too much unread ([`Self::repost_receives`]).
        self.rx_handled.push(slot);
    }

    /// A Hello (RFC 7145 §5.1, §9): valid only as the first message of full-feature phase
    /// when iSERHelloRequired=Yes. Answered with a HelloReply carrying our version and our
    /// ORD, capped by the initiator's IRD (and used from now on); a version range without
    /// ours is rejected (REJ) and the connection closes once the reply is out.
    fn on_hello(&mut self, max_ver: u8, min_ver: u8, ird: u16, first_of_ffp: bool, events: &mut Vec<DmEvent>) {
        let wrong = if !self.cfg.hello_required {
            Some("iSER Hello, but iSERHelloRequired=No")
        } else if !self.ffp {
            Some("iSER Hello during login")
        } else if !first_of_ffp {
            Some("iSER Hello after the start of full-feature phase")
        } else {
            None
        };
        if let Some(why) = wrong {
            return self.fail(why.into(), events);
        }
        let reply = if (min_ver..=max_ver).contains(&ISER_VERSION) {
            let ord = self.cfg.max_rdma_reads.min(u32::from(ird));
            self.cfg.max_rdma_reads = ord;
            log::debug!("iSER Hello: versions {min_ver}..={max_ver}, IRD {ird}; ORD {ord}");
            IserHeader::HelloReply { reject: false, max_ver: ISER_VERSION, cur_ver: ISER_VERSION, ord: ord as u16 }
        } else {
            let why = format!("iSER Hello for versions {min_ver}..={max_ver}, not {ISER_VERSION}: rejected");
            log::warn!("iSER: {why}; the connection closes");
            self.closing = Some(why);
            self.terminating = true;
            IserHeader::HelloReply { reject: true, max_ver: ISER_VERSION, cur_ver: ISER_VERSION, ord: 0 }
        };
        self.enqueue(Pending::HelloReply(reply), true);
    }

    /// The STag a response to task `itt` may invalidate: the Read STag, else the Write STag
    /// (as Linux isert does), when Send with Invalidate was agreed.
    fn invalidate(&self, itt: Itt) -> Option<Stag> {
        if !self.cfg.send_invalidate {
            return None;
        }
        let t = self.tasks.get(&itt)?;
        t.read.or(t.write).map(|t| t.stag())
    }

    /// Posts what this pass queued: receives first (the initiator may answer a response at
    /// once), then the sends, each as one chain.
    fn doorbell(&mut self, events: &mut Vec<DmEvent>) {
        if !self.rx.is_empty() {
            let rx = std::mem::take(&mut self.rx);
            let r = self.qp.post_recvs(&rx);
            self.rx = rx;
            self.rx.clear();
            if let Err(e) = r {
                self.fail(format!("repost receives failed: {e}"), events);
                return;
            }
        }
        if !self.tx.is_empty() {
            let tx = std::mem::take(&mut self.tx);
            let r = self.qp.post_send(&tx);
            self.tx = tx;
            self.tx.clear();
            if let Err(e) = r {
                self.fail(format!("post send failed: {e}"), events);
            }
        }
    }

    fn on_send_done(&mut self, slot: u32) {
        if slot & Self::LARGE_SLOT != 0 {
            self.send_large.release(slot & !Self::LARGE_SLOT);
        } else {
            self.send.release(slot);
        }
        self.retire_signaled();
    }

    /// An RDMA Read (`idx`) completed (`ok`) or failed. It counts towards its Get_Data only
    /// if it belongs to the live Get_Data of its task (`gen`); the last one hands the
    /// buffer back.
    fn on_read_done(&mut self, idx: u32, gen: u32, ok: bool, events: &mut Vec<DmEvent>) {
        self.retire_signaled();
        let Some(job) = self.reads.remove(&idx) else { return };
        if job.gen != gen || !self.fetch_is_live(job.itt, gen) {
            // Its task was deallocated: its buffer is held until this read retired (above).
            log::debug!("iSER: RDMA Read of deallocated task {:#x} completed; dropped", job.itt.0);
            return;
        }
        let Some(f) = self.fetches.get_mut(&job.itt) else { return };
        if !ok {
            f.failed.get_or_insert("RDMA Read failed");
        }
        f.outstanding = f.outstanding.saturating_sub(1);
        if f.outstanding == 0 {
            if let Some(mut f) = self.fetches.remove(&job.itt) {
                // Every read into the buffer is done: its sink closes before it is handed on.
                drop(f.transfer.take());
                match f.failed {
                    Some(reason) => events.push(DmEvent::DataFailed { itt: job.itt, buf: f.buf, reason }),
                    None => events.push(DmEvent::DataReady { itt: job.itt, buf: f.buf }),
                }
            }
        }
    }

    /// A Get_Data that fails without any RDMA Read; reported by the next poll.
    fn fail_fetch(&mut self, itt: Itt, buf: IoBuf, reason: &'static str) {
        log::warn!("iSER: Get_Data of task {:#x} fails: {reason}", itt.0);
        self.settled.push_back((itt, buf, Some(reason)));
    }
}

impl<Q: IserQp> Datamover for IserDatamover<Q> {
    fn send_control(&mut self, pdu: Pdu) {
        let inv = match pdu.op() {
            Op::ScsiResponse(r) => {
                let itt = r.itt;
                let inv = self.invalidate(itt);
                self.tasks.remove(&itt);
                inv
            }
            Op::LoginResponse(r) => {
                if r.transit_bit && r.nsg == Stage::FullFeaturePhase && r.status.class == 0 {
                    self.ffp = true;
                }
                None
            }
            _ => None,
        };
        self.enqueue(Pending::Control(pdu, inv), false);
    }

    fn put_data(&mut self, req: PutData) {
        let gen = self.tasks.get(&req.itt).map(|t| t.gen);
        self.enqueue(Pending::Put { put: req, gen, sent: 0, fence: None }, false);
    }

    fn get_data(&mut self, req: GetData) {
        // `more` needs nothing here: RDMA Reads have no sequence number to keep going.
        let GetData { itt, mut buf, offset, len, base, .. } = req;
        let Some((gen, Some(write), unsolicited)) = self.tasks.get(&itt).map(|t| (t.gen, t.write, t.unsolicited)) else {
            // No Write STag: the initiator cannot be asked for data.
            return self.fail_fetch(itt, buf, "no Write STag");
        };
        // Where solicited byte `offset` lies in the Write STag's buffer (RFC 7145 §6.9).
        let start = match self.cfg.tagged_buffer_for_solicited_data_only {
            Some(false) => Some(u64::from(offset)),
            Some(true) | None => u64::from(offset).checked_sub(unsolicited),
        };
        let Some(start) = start.and_then(|s| write.base_offset.checked_add(s)) else {
            return self.fail_fetch(itt, buf, "solicited data outside the Write STag's buffer");
        };
        if self.cfg.max_rdma_reads == 0 {
            return self.fail_fetch(itt, buf, "the initiator takes no RDMA Read (iSER-IRD 0)");
        }
        let total = len as usize;
        // Where the solicited bytes go in the buffer: at `offset - base`.
        let at = offset.checked_sub(base).map(|a| a as usize);
        let Some(at) = at.filter(|a| a.checked_add(total).is_some_and(|end| end <= buf.as_slice().len())) else {
            return self.fail_fetch(itt, buf, "solicited data outside the task's buffer");
        };
        let chunk = self.cfg.max_rdma_len.max(1);
        let n = total.div_ceil(chunk);
        if n == 0 {
            // Nothing to read: ready at once (reported by the next poll).
            self.settled.push_back((itt, buf, None));
            return;
        }
        let ReadSink { lkey, transfer } = match self.qp.register_read_sink(&mut buf, at, total) {
            Ok(s) => s,
            Err(e) => {
                log::warn!("iSER: cannot register the buffer of task {:#x}: {e}", itt.0);
                return self.fail_fetch(itt, buf, "cannot register the task's buffer for RDMA");
            }
        };
        let addr = buf.as_ptr() as u64;
        let fetch = Fetch { gen, buf, addr, lkey, transfer, outstanding: n, failed: None, fence: None };
        if let Some(old) = self.fetches.insert(itt, fetch) {
            // Not how the iSCSI layer asks (one Get_Data per task at a time); should it, the
            // older one's reads may still be landing in its buffer.
            log::warn!("iSER: a second Get_Data for task {:#x}; the first is dropped", itt.0);
            self.read_queue.retain(|j| j.itt != itt);
            self.hold_transfer(old.fence, old.transfer);
            self.hold(old.fence, old.buf);
        }
        let mut done = 0;
        while done < total {
            let l = (total - done).min(chunk);
            self.read_queue.push_back(ReadJob {
                itt,
                gen,
                remote_addr: start.wrapping_add(done as u64),
                rkey: write.stag(),
                buf_offset: at + done,
                len: l,
            });
            done += l;
        }
    }

    fn notice_key_values(&mut self, params: DatamoverParams) {
        // Sizes were fixed when the pools were built; keep the initiator's receive limit.
        self.cfg.initiator_recv_data_segment_length = params.initiator_max_recv_data_segment_length as usize;
        self.cfg.hello_required = params.iser_hello_required;
        // A negotiated Yes is the initiator's declaration. A No cannot be told from a key
        // never sent, and Linux, libiscsi and riser-perf never send it yet lay their buffers
        // out the Yes way: reading their silence as the RFC's No would shift every write
        // with immediate data. So No leaves the layout as configured (None: theirs).
        if params.tagged_buffer_for_solicited_data_only {
            self.cfg.tagged_buffer_for_solicited_data_only = Some(true);
        }
    }

    fn deallocate_task_resources(&mut self, itt: Itt) -> Option<IoBuf> {
        self.tasks.remove(&itt);
        self.read_queue.retain(|j| j.itt != itt);
        // In-flight reads finish into the void (their generation is no live task's), but
        // into this buffer: it is kept until they have completed.
        let mut buf = self.fetches.remove(&itt).and_then(|f| {
            self.hold_transfer(f.fence, f.transfer);
            self.hold(f.fence, f.buf)
        });
        if let Some(b) = crate::take_settled(&mut self.settled, itt) {
            buf.get_or_insert(b);
        }
        // Nothing queued for the task may reach the initiator after the TMF Response: not
        // its data, not its SCSI Response.
        let mut kept = VecDeque::with_capacity(self.pending.len());
        for p in std::mem::take(&mut self.pending) {
            match p {
                Pending::Put { put, fence, .. } if put.itt == itt => {
                    // RDMA Writes of a batch may still be reading it.
                    if let Some(b) = self.hold(fence, put.buf) {
                        buf.get_or_insert(b);
                    }
                }
                Pending::Control(pdu, _) if matches!(pdu.op(), Op::ScsiResponse(r) if r.itt == itt) => {}
                p => kept.push_back(p),
            }
        }
        self.pending = kept;
        self.recount_pending();
        buf
    }

    fn connection_terminate(&mut self) {
        self.terminating = true;
    }

    fn poll(&mut self, events: &mut Vec<DmEvent>) -> usize {
        if self.dead {
            return 0;
        }
        let mut work = 0;
        while let Some((itt, buf, failed)) = self.settled.pop_front() {
            events.push(match failed {
                Some(reason) => DmEvent::DataFailed { itt, buf, reason },
                None => DmEvent::DataReady { itt, buf },
            });
            work += 1;
        }
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let n = self.qp.poll(&mut wcs, 32);
        work += n;
        for wc in wcs.iter().copied() {
            let (idx, gen) = (wr_idx(wc.wr_id), wr_gen(wc.wr_id));
            if let Some(flushed) = wc.error {
                // Whatever the error, what the work request held is free again.
                match wc.wr_id & KIND_MASK {
                    KIND_SEND => self.on_send_done(idx),
                    KIND_WRITE => self.retire_signaled(),
                    KIND_READ => self.on_read_done(idx, gen, false, events),
                    _ => {}
                }
                if flushed {
                    // The QP is in error (the peer disconnected, or we did): a flushed
                    // receive says so at once; nothing more will arrive. So does a flushed
                    // send when no receive is posted (all held for the backlog).
                    let says_so = wc.wr_id & KIND_MASK == KIND_RECV || self.rx_handled.len() == self.recv.count();
                    if says_so && !self.terminating {
                        self.fail("connection lost (receive queue flushed)".into(), events);
                    }
                    continue;
                }
                self.fail(format!("completion error on work request {:#x}", wc.wr_id), events);
                continue;
            }
            match wc.wr_id & KIND_MASK {
                KIND_RECV => self.on_recv(idx, wc.byte_len as usize, events),
                KIND_SEND => self.on_send_done(idx),
                KIND_WRITE => self.retire_signaled(),
                KIND_READ => self.on_read_done(idx, gen, true, events),
                _ => {}
            }
        }
        self.wcs = wcs;
        if self.dead {
            return work;
        }
        work += self.start_reads();
        work += self.flush_pending(events);
        if self.dead {
            return work;
        }
        self.repost_receives();
        self.doorbell(events);
        let quiet = self.send.free.len() == self.send.count()
            && self.send_large.free.len() == self.send_large.count()
            && self.sq_retired == self.sq_posted;
        if self.terminating && self.pending.is_empty() && quiet {
            self.dead = true;
            self.qp.disconnect();
            events.push(DmEvent::Terminated(self.closing.take().unwrap_or_else(|| "connection closed".into())));
            work += 1;
        }
        work
    }

    fn idle(&self) -> bool {
        self.pending.is_empty()
    }

    fn copies(&self) -> CopyStats {
        self.copies
    }

    fn set_write_buffers(&mut self, wb: WriteBuffers) {
        self.write_bufs = Some(wb);
    }

    fn recycle(&mut self, segment: Vec<u8>) {
        if self.spare.len() < 64 && segment.capacity() <= riser_buf::MAX_SPARE_VEC {
            self.spare.push(segment);
        }
    }

    /// The sends waiting for a send-queue entry or a send slot, and the SENDs and RDMA
    /// Writes posted whose completion has not come: the initiator has not taken them yet
    /// (an RC SEND completes once the initiator's receive has it). `sent`: bytes of those
    /// completed.
    fn tx_backlog(&self) -> TxBacklog {
        let in_flight = |p: u64, c: u64| usize::try_from(p.saturating_sub(c)).unwrap_or(usize::MAX);
        let unbudgeted = self.pending_unbudgeted.saturating_add(in_flight(self.posted.unbudgeted, self.completed.unbudgeted));
        let budgeted = self.pending_budgeted.saturating_add(in_flight(self.posted.budgeted, self.completed.budgeted));
        TxBacklog { unbudgeted, total: unbudgeted.saturating_add(budgeted), sent: self.completed.unbudgeted + self.completed.budgeted }
    }

    fn limit_tx_queue(&mut self, limit: TxLimit) {
        self.tx_limit = limit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_iscsi::ffp::SnState;
    use riser_iscsi::pdu::Lun;
    use riser_iscsi::serial::Sn;
    use riser_iscsi::testing::{scsi_command, scsi_response};

    /// An in-memory "initiator" at the other end of the QP: it owns a read buffer and a
    /// write buffer (registered as STags 0x11 / 0x22). Work requests are only recorded;
    /// [`wire`] carries them out against the datamover's pools.
    #[derive(Default)]
    struct FakeQp {
        recvs: VecDeque<(u64, Sge)>,
        done: VecDeque<Completion>,
        queued: Vec<SendWr>,
        sent: Vec<Vec<u8>>,
        read_buf: Vec<u8>,
        write_buf: Vec<u8>,
        chains: Vec<usize>,
        disconnected: bool,
        registrations: usize,
        /// Plays iWARP: RDMA Read sinks get a registration of their own per transfer
        /// ([`IserQp::register_read_sink`]); the ranges asked for, and how many are live.
        per_transfer_sinks: bool,
        sink_ranges: Vec<(usize, usize)>,
        live_sinks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    /// A transfer registration of FakeQp: counted live until dropped.
    struct FakeSink(std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for FakeSink {
        fn drop(&mut self) {
            self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// The lkey FakeQp gives every task buffer: SGEs under it name an IoBuf the datamover
    /// holds (zero copy), those under 0 its pools.
    const IOBUF_LKEY: u32 = 0x10b0f;

    impl IserQp for FakeQp {
        fn post_recv(&mut self, wr_id: u64, sge: Sge) -> Result<(), IserError> {
            // The QP's route on the shared CQ goes there: every test checks it stays clear.
            assert_eq!(wr_id & super::super::shared_cq::ROUTE_MASK, 0, "receive {wr_id:#x} uses the route bits");
            self.recvs.push_back((wr_id, sge));
            Ok(())
        }
        fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), IserError> {
            for w in wrs {
                assert_eq!(w.wr_id & super::super::shared_cq::ROUTE_MASK, 0, "{:?} uses the route bits", w.op);
            }
            self.chains.push(wrs.len());
            self.queued.extend_from_slice(wrs);
            Ok(())
        }
        fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
            let n = self.done.len().min(max);
            out.extend(self.done.drain(..n));
            n
        }
        fn disconnect(&mut self) {
            self.disconnected = true;
        }
        fn register(&mut self, buf: &mut IoBuf) -> Result<u32, IserError> {
            assert!(!buf.is_empty(), "nothing to register");
            self.registrations += 1;
            Ok(IOBUF_LKEY)
        }
        fn register_read_sink(&mut self, buf: &mut IoBuf, offset: usize, len: usize) -> Result<ReadSink, IserError> {
            if !self.per_transfer_sinks {
                return Ok(ReadSink { lkey: self.register(buf)?, transfer: None });
            }
            assert!(len > 0 && offset + len <= buf.len(), "sink {offset}+{len} outside the {}-byte buffer", buf.len());
            self.sink_ranges.push((offset, len));
            self.live_sinks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(ReadSink { lkey: IOBUF_LKEY, transfer: Some(Box::new(FakeSink(self.live_sinks.clone()))) })
        }
    }

    fn live_sinks(d: &IserDatamover<FakeQp>) -> usize {
        d.qp.live_sinks.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The pool and offset an SGE names.
    fn locate(d: &mut IserDatamover<FakeQp>, sge: Sge) -> (&mut Pool, usize) {
        assert_eq!(sge.lkey, 0, "pool memory");
        for pool in [&mut d.recv, &mut d.send, &mut d.send_large] {
            let base = pool.mem.base();
            if sge.addr >= base && sge.addr + sge.len as u64 <= base + pool.mem.len() as u64 {
                return (pool, (sge.addr - base) as usize);
            }
        }
        panic!("SGE {sge:?} outside every registered pool");
    }

    /// The bytes of the task buffer an SGE under [`IOBUF_LKEY`] names: a buffer the datamover
    /// holds while the device may use it (queued or batched Put_Data, a Get_Data, a buffer
    /// kept until its work requests retire). Panics otherwise: the device would touch memory
    /// nobody keeps.
    fn iobuf_bytes(d: &mut IserDatamover<FakeQp>, sge: Sge) -> &mut [u8] {
        assert_eq!(sge.lkey, IOBUF_LKEY);
        let mut bufs: Vec<&mut IoBuf> = d.held.iter_mut().map(|(_, b)| b).collect();
        bufs.extend(d.fetches.values_mut().map(|f| &mut f.buf));
        bufs.extend(d.pending.iter_mut().filter_map(|p| match p {
            Pending::Put { put, .. } => Some(&mut put.buf),
            _ => None,
        }));
        for b in bufs {
            let base = b.as_ptr() as u64;
            if sge.addr >= base && sge.addr + sge.len as u64 <= base + b.len() as u64 {
                let o = (sge.addr - base) as usize;
                return &mut b.as_mut_slice()[o..o + sge.len as usize];
            }
        }
        panic!("SGE {sge:?} names no buffer the datamover holds");
    }

    fn read_sge(d: &mut IserDatamover<FakeQp>, sge: Sge) -> Vec<u8> {
        if sge.lkey == IOBUF_LKEY {
            return iobuf_bytes(d, sge).to_vec();
        }
        let (pool, off) = locate(d, sge);
        let mut v = vec![0u8; sge.len as usize];
        pool.mem.read_at(off, &mut v);
        v
    }

    fn write_sge(d: &mut IserDatamover<FakeQp>, sge: Sge, src: &[u8]) {
        if sge.lkey == IOBUF_LKEY {
            return iobuf_bytes(d, sge).copy_from_slice(src);
        }
        let (pool, off) = locate(d, sge);
        pool.mem.write_at(off, src);
    }

    /// The "wire": executes queued work requests in order and completes the signaled ones.
    fn wire(d: &mut IserDatamover<FakeQp>) {
        for wr in std::mem::take(&mut d.qp.queued) {
            let bytes = match wr.op {
                SendOp::RdmaRead { .. } => vec![0u8; wr.sge.len as usize],
                _ => read_sge(d, wr.sge),
            };
            match wr.op {
                SendOp::Send | SendOp::SendInvalidate(_) => d.qp.sent.push(bytes),
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    assert_eq!(rkey, Stag(0x11));
                    let o = remote_addr as usize;
                    d.qp.read_buf[o..o + bytes.len()].copy_from_slice(&bytes);
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    assert_eq!(rkey, Stag(0x22));
                    let o = remote_addr as usize;
                    let src = d.qp.write_buf[o..o + bytes.len()].to_vec();
                    write_sge(d, wr.sge, &src);
                }
            }
            if wr.signaled {
                d.qp.done.push_back(Completion { wr_id: wr.wr_id, error: None, byte_len: wr.sge.len });
            }
        }
    }

    /// The initiator SENDs `msg` into the next posted receive.
    fn deliver(d: &mut IserDatamover<FakeQp>, msg: &[u8]) {
        let (wr_id, sge) = d.qp.recvs.pop_front().expect("a posted receive (else RNR)");
        write_sge(d, sge, msg);
        d.qp.done.push_back(Completion { wr_id, error: None, byte_len: msg.len() as u32 });
    }

    fn dm(cfg: IserConfig) -> IserDatamover<FakeQp> {
        let qp = FakeQp { read_buf: vec![0; 1 << 20], write_buf: (0..1 << 20).map(|i| (i * 7) as u8).collect(), ..Default::default() };
        let pools = IserDatamover::<FakeQp>::plain_pools(&cfg);
        IserDatamover::new(qp, cfg, pools).unwrap()
    }

    fn command(itt: u32, read: bool, write: bool, edtl: u32, imm: Vec<u8>) -> Vec<u8> {
        let h = IserHeader::Control {
            write: write.then_some(TaggedBuffer { stag: 0x22, base_offset: 0 }),
            read: read.then_some(TaggedBuffer { stag: 0x11, base_offset: 0 }),
        };
        let mut msg = [0u8; ISER_HDR_LEN].to_vec();
        let mut hb = [0u8; ISER_HDR_LEN];
        h.write(&mut hb);
        msg.copy_from_slice(&hb);
        let pdu = Pdu::with_data(Op::ScsiCommand(scsi_command(Itt(itt), Sn(1), read, write, edtl, &[])), imm);
        pdu.encode_message(&mut msg).unwrap();
        msg
    }

    fn response(itt: u32) -> Pdu {
        let sn = SnState { stat_sn: Sn(5), exp_cmd_sn: Sn(2), max_cmd_sn: Sn(9) };
        Pdu::new(Op::ScsiResponse(scsi_response(Itt(itt), 0, sn)))
    }

    #[test]
    fn read_is_rdma_written_and_chained_with_the_response() {
        let mut d = dm(IserConfig { max_rdma_len: 64 * 1024, ..Default::default() });
        assert_eq!(d.qp.recvs.len(), IserConfig::default().recv_slots, "the whole ring is posted up front");
        deliver(&mut d, &command(1, true, false, 200_000, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert!(matches!(ev.as_slice(), [DmEvent::Control(p)] if matches!(p.op(), Op::ScsiCommand(_))));
        assert_eq!(d.qp.recvs.len(), IserConfig::default().recv_slots, "receive reposted at once");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        d.put_data(PutData { itt: Itt(1), lun: Lun(0), buf: riser_bdev::IoBuf::from(data.clone()), len: 200_000, offset: 0, response: Some(response(1)), sn: SnState::default() });
        d.poll(&mut ev);
        assert!(d.qp.queued[..4].iter().all(|w| w.sge.lkey == IOBUF_LKEY), "written from the task's own buffer");
        wire(&mut d);
        assert_eq!(d.qp.chains, vec![5], "4 RDMA Writes and the SEND in one post");
        assert_eq!(d.held.len(), 1, "the buffer is kept until the response's completion");
        assert_eq!(&d.qp.read_buf[..200_000], &data[..]);
        let sent = &d.qp.sent[0];
        assert_eq!(sent[0], 0x10, "target header: control, no STags");
        assert!(matches!(Pdu::decode_message(&sent[ISER_HDR_LEN..], 8192).unwrap().op(), Op::ScsiResponse(_)));
        d.poll(&mut ev);
        assert!(d.held.is_empty(), "the buffer went back with the SEND completion");
        assert_eq!(d.send.free.len(), d.send.count());
        assert_eq!(d.copies(), CopyStats::default(), "no byte copied");
    }

    /// Everything one pass produces goes out in one chain: the responses of three reads (one
    /// with data) and a control PDU, and, with Send with Invalidate agreed, each response
    /// invalidates its command's STag (the Read STag, else the Write STag).
    #[test]
    fn one_doorbell_per_pass_and_send_with_invalidate() {
        let mut d = dm(IserConfig { max_rdma_len: 64 * 1024, send_invalidate: true, ..Default::default() });
        deliver(&mut d, &command(1, true, false, 4096, vec![]));
        deliver(&mut d, &command(2, false, false, 0, vec![]));
        deliver(&mut d, &command(3, false, true, 4096, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert_eq!(ev.len(), 3);
        assert_eq!(d.qp.chains.len(), 0, "receives only: no send posted");
        d.put_data(PutData { itt: Itt(1), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![5u8; 4096]), len: 4096, offset: 0, response: Some(response(1)), sn: SnState::default() });
        d.send_control(response(2));
        d.send_control(response(3));
        d.poll(&mut ev);
        assert_eq!(d.qp.chains, vec![4], "RDMA Write + 3 SENDs in one post");
        let ops: Vec<SendOp> = d.qp.queued.iter().map(|w| w.op).collect();
        assert_eq!(
            ops,
            vec![
                SendOp::RdmaWrite { remote_addr: 0, rkey: Stag(0x11) },
                SendOp::SendInvalidate(Stag(0x11)),
                SendOp::Send,
                SendOp::SendInvalidate(Stag(0x22))
            ]
        );
        wire(&mut d);
        // Without the agreement, plain SENDs.
        let mut d = dm(IserConfig::default());
        deliver(&mut d, &command(1, true, false, 4096, vec![]));
        d.poll(&mut ev);
        d.send_control(response(1));
        d.poll(&mut ev);
        assert_eq!(d.qp.queued.iter().map(|w| w.op).collect::<Vec<_>>(), vec![SendOp::Send]);
    }

    #[test]
    fn write_is_rdma_read_within_the_initiator_depth() {
        let mut d = dm(IserConfig { max_rdma_len: 4096, max_rdma_reads: 2, ..Default::default() });
        deliver(&mut d, &command(2, false, true, 8192 + 20_000, vec![9u8; 8192]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        ev.clear();
        d.get_data(GetData { itt: Itt(2), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; 28_192]), offset: 8192, len: 20_000, base: 0, more: false, sn: SnState::default() });
        let mut rounds = 0;
        while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) {
            d.poll(&mut ev);
            assert!(d.reads.len() <= 2, "never more reads in flight than the initiator depth");
            wire(&mut d);
            rounds += 1;
            assert!(rounds < 50);
        }
        let Some(DmEvent::DataReady { buf, .. }) = ev.pop() else { unreachable!() };
        let want: Vec<u8> = (0..20_000usize).map(|i| (i * 7) as u8).collect();
        assert_eq!(&buf.as_slice()[8192..], &want[..], "solicited data starts at the Write STag's base");
        assert!(d.qp.chains.iter().all(|&n| n <= 2));
    }

    fn put(itt: u32, data: Vec<u8>, response: Pdu) -> PutData {
        let len = data.len() as u32;
        PutData { itt: Itt(itt), lun: Lun(0), buf: riser_bdev::IoBuf::from(data), len, offset: 0, response: Some(response), sn: SnState::default() }
    }

    fn get(itt: u32, buf_len: usize, offset: u32, len: u32) -> GetData {
        GetData { itt: Itt(itt), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; buf_len]), offset, len, base: 0, more: false, sn: SnState::default() }
    }

    type DataEvents = (Vec<(Itt, Vec<u8>)>, Vec<(Itt, &'static str)>);

    /// The buffers of the DataReady / DataFailed events in `ev`, by kind.
    fn data_events(ev: &[DmEvent]) -> DataEvents {
        let mut ready = Vec::new();
        let mut failed = Vec::new();
        for e in ev {
            match e {
                DmEvent::DataReady { itt, buf } => ready.push((*itt, buf.as_slice().to_vec())),
                DmEvent::DataFailed { itt, reason, .. } => failed.push((*itt, *reason)),
                _ => {}
            }
        }
        (ready, failed)
    }

    /// RFC 5047 §8.9: after Deallocate_Task_Resources nothing of the task reaches the
    /// initiator; a Put_Data still queued (here: no send slot yet) is dropped and its buffer
    /// comes back.
    #[test]
    fn deallocate_drops_a_queued_put_data() {
        let mut d = dm(IserConfig { send_slots: 1, ..Default::default() });
        deliver(&mut d, &command(1, true, false, 4096, vec![]));
        deliver(&mut d, &command(2, true, false, 4096, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        d.send_control(response(2));
        d.put_data(put(1, vec![7u8; 4096], response(1)));
        d.poll(&mut ev);
        assert_eq!(d.pending.len(), 1, "the Put_Data waits for the only send slot");
        let buf = d.deallocate_task_resources(Itt(1));
        assert!(buf.is_some_and(|b| b.as_slice() == [7u8; 4096]), "its buffer comes back");
        wire(&mut d);
        d.poll(&mut ev);
        wire(&mut d);
        assert_eq!(d.qp.sent.len(), 1, "only task 2's response went out");
        assert!(d.qp.read_buf[..4096].iter().all(|&b| b == 0), "no RDMA Write of the aborted task");
        assert!(d.pending.is_empty());
    }

    /// ABORT TASK with RDMA Reads in flight, then the initiator reuses the ITT (Linux and
    /// libiscsi do): the old reads' completions are recognised by their generation and
    /// dropped; they neither write into the new task's buffer nor complete its Get_Data.
    #[test]
    fn rdma_reads_of_an_aborted_task_never_reach_a_new_task_with_its_itt() {
        let mut d = dm(IserConfig { max_rdma_len: 4096, ..Default::default() });
        deliver(&mut d, &command(5, false, true, 8192, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        d.get_data(get(5, 8192, 0, 8192));
        d.poll(&mut ev);
        let stale = std::mem::take(&mut d.qp.queued);
        assert_eq!(stale.len(), 2, "two RDMA Reads in flight");
        assert!(d.deallocate_task_resources(Itt(5)).is_none(), "reads are landing in it: kept");
        assert_eq!(d.held.len(), 1);
        // The new WRITE with the same ITT, and its own reads.
        deliver(&mut d, &command(5, false, true, 8192, vec![]));
        d.poll(&mut ev);
        d.get_data(get(5, 8192, 0, 8192));
        d.poll(&mut ev);
        let fresh = std::mem::take(&mut d.qp.queued);
        assert_eq!(fresh.len(), 2);
        // The old reads complete first, with what the initiator's buffer held then.
        d.qp.write_buf[..8192].fill(0xaa);
        d.qp.queued = stale;
        wire(&mut d);
        ev.clear();
        d.poll(&mut ev);
        let (ready, failed) = data_events(&ev);
        assert!(ready.is_empty() && failed.is_empty(), "stale completions complete nothing: {} {failed:?}", ready.len());
        d.qp.write_buf[..8192].fill(0x55);
        d.qp.queued = fresh;
        wire(&mut d);
        d.poll(&mut ev);
        let (ready, _) = data_events(&ev);
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].0, Itt(5));
        assert!(ready[0].1.iter().all(|&b| b == 0x55), "only the new reads' data lands in the new buffer");
        assert!(d.held.is_empty(), "the aborted task's buffer went once its reads completed");
    }

    /// A response that cannot be encoded fails the connection cleanly instead of staying at
    /// the head of the send queue forever (every later send stalled behind it).
    #[test]
    fn a_response_that_cannot_be_encoded_fails_the_connection() {
        let mut d = dm(IserConfig::default());
        deliver(&mut d, &command(1, true, false, 4096, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        ev.clear();
        let mut bad = response(1);
        bad.ahs = vec![1, 2, 3];
        d.put_data(put(1, vec![1u8; 4096], bad));
        d.send_control(response(9));
        d.poll(&mut ev);
        assert!(matches!(ev.as_slice(), [DmEvent::Terminated(why)] if why.contains("encode")), "{}", ev.len());
        assert!(d.qp.disconnected);
        assert!(d.held.is_empty(), "no buffer kept");
    }

    /// Read data that would fall outside the task's buffer is not silently skipped: the
    /// Get_Data fails.
    #[test]
    fn read_data_outside_the_task_buffer_fails_the_get_data() {
        let mut d = dm(IserConfig { max_rdma_len: 4096, ..Default::default() });
        deliver(&mut d, &command(3, false, true, 8192, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        ev.clear();
        d.get_data(get(3, 100, 0, 8192));
        for _ in 0..10 {
            d.poll(&mut ev);
            wire(&mut d);
        }
        let (ready, failed) = data_events(&ev);
        assert!(ready.is_empty(), "no DataReady with data missing");
        assert_eq!(failed.len(), 1);
        assert!(d.held.is_empty() && d.fetches.is_empty());
    }

    /// A session at queue depth 256 (the most riser allows) with immediate data: all its
    /// commands, the immediate PDUs beside them and the answers to our NOP-In pings arrive
    /// before the target polls once, and every SEND finds a posted receive (FakeQp panics
    /// otherwise: an RNR NAK on a real QP). The ring was a fixed 160.
    #[test]
    fn the_receive_ring_holds_a_full_queue_depth_and_the_unexpected_pdus_beside_it() {
        let cfg = IserConfig::for_queue_depth(256, 0);
        assert_eq!(cfg.recv_slots, 256 + IMMEDIATE_PDU_ROOM + EXPECTED_PDU_ROOM);
        assert_eq!(cfg.max_outstanding_unexpected_pdus(), 256 + IMMEDIATE_PDU_ROOM as u32);
        for qd in [1, 64, 128, 256] {
            assert_eq!(
                IserConfig::for_queue_depth(qd, 0).max_outstanding_unexpected_pdus(),
                riser_iscsi::negotiate::iser_max_outstanding_unexpected_pdus(qd),
                "the ring holds what the negotiation declares"
            );
        }
        assert_eq!(cfg.send_slots, 256 + SEND_ROOM);
        assert_eq!(cfg.recv_wr(), cfg.recv_slots as u32 + 1);
        let mut d = dm(IserConfig { ..cfg });
        assert_eq!(d.qp.recvs.len(), cfg.recv_slots);
        for itt in 0..256 {
            deliver(&mut d, &command(itt, false, true, 8192, vec![3u8; 512]));
        }
        let nop = |itt: u32| {
            let mut m = IserHeader::TARGET_CONTROL.to_vec();
            Pdu::new(Op::NopOut(riser_iscsi::testing::nop_out(Itt(itt), Sn(1)))).encode_message(&mut m).unwrap();
            m
        };
        for i in 0..(IMMEDIATE_PDU_ROOM + EXPECTED_PDU_ROOM) as u32 {
            deliver(&mut d, &nop(1000 + i));
        }
        let mut ev = Vec::new();
        while !d.qp.done.is_empty() {
            d.poll(&mut ev);
        }
        assert_eq!(ev.iter().filter(|e| matches!(e, DmEvent::Control(_))).count(), 256 + IMMEDIATE_PDU_ROOM + EXPECTED_PDU_ROOM);
        assert_eq!(d.qp.recvs.len(), cfg.recv_slots, "every receive reposted");
        // With unsolicited Data-Out allowed, the ring grows by their number.
        let cfg = IserConfig::for_queue_depth(32, 8);
        assert_eq!(cfg.max_outstanding_unexpected_pdus(), 32 * 9 + IMMEDIATE_PDU_ROOM as u32);
    }

    /// The final Login Response, as the login sends it through the datamover.
    fn final_login_response() -> Pdu {
        use riser_iscsi::pdu::{Isid, LoginResponse, LoginStatus};
        Pdu::new(Op::LoginResponse(LoginResponse {
            transit_bit: true,
            continue_bit: false,
            csg: Stage::LoginOperationalNegotiation,
            nsg: Stage::FullFeaturePhase,
            version_max: 0,
            version_active: 0,
            isid: Isid::default(),
            tsih: 1,
            itt: Itt(0),
            stat_sn: Sn(0),
            exp_cmd_sn: Sn(1),
            max_cmd_sn: Sn(64),
            status: LoginStatus::SUCCESS,
        }))
    }

    fn hello(max_ver: u8, min_ver: u8, ird: u16) -> Vec<u8> {
        let mut b = [0u8; ISER_HDR_LEN];
        IserHeader::Hello { max_ver, min_ver, ird }.write(&mut b);
        b[..crate::iser::header::HELLO_LEN].to_vec()
    }

    /// A datamover in full-feature phase (its final Login Response went out).
    fn ffp_dm(cfg: IserConfig) -> IserDatamover<FakeQp> {
        let mut d = dm(cfg);
        d.send_control(final_login_response());
        let mut ev = Vec::new();
        d.poll(&mut ev);
        wire(&mut d);
        d.poll(&mut ev);
        d.qp.sent.clear();
        assert!(ev.is_empty());
        d
    }

    fn terminated(ev: &[DmEvent]) -> Option<&str> {
        ev.iter().find_map(|e| match e {
            DmEvent::Terminated(why) => Some(why.as_str()),
            _ => None,
        })
    }

    /// RFC 7145 §5.1 with iSERHelloRequired=Yes: the Hello (12 bytes) is the first message of
    /// full-feature phase; the HelloReply carries our version and an ORD capped by the
    /// initiator's IRD, which then bounds our RDMA Reads. A second Hello is an error.
    #[test]
    fn a_required_hello_is_answered_with_the_ord_capped_by_the_ird() {
        let mut d = ffp_dm(IserConfig { hello_required: true, max_rdma_reads: 16, max_rdma_len: 4096, ..Default::default() });
        deliver(&mut d, &hello(ISER_VERSION, ISER_VERSION, 2));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        wire(&mut d);
        assert!(ev.is_empty());
        assert_eq!(d.qp.sent, vec![vec![0x30, 0xaa, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0]], "HelloReply: version 10, ORD 2");
        // The ORD bounds the RDMA Reads from now on.
        deliver(&mut d, &command(1, false, true, 6 * 4096, vec![]));
        d.poll(&mut ev);
        d.get_data(get(1, 6 * 4096, 0, 6 * 4096));
        d.poll(&mut ev);
        assert_eq!(d.qp.queued.len(), 2, "as many reads in flight as the initiator's IRD, no more");
        // A second Hello is a protocol error.
        deliver(&mut d, &hello(ISER_VERSION, ISER_VERSION, 2));
        ev.clear();
        d.poll(&mut ev);
        assert!(terminated(&ev).is_some_and(|w| w.contains("Hello")), "{:?}", terminated(&ev));
        assert!(d.qp.disconnected);
    }

    /// A Hello where none is expected closes the connection: with iSERHelloRequired=No (all
    /// of IB/RoCE), during login, or after other messages. It used to be answered at any time.
    #[test]
    fn an_unexpected_hello_closes_the_connection() {
        // iSERHelloRequired=No (a 28-byte Hello, which the old code parsed and answered).
        let mut d = ffp_dm(IserConfig::default());
        let mut h = [0u8; ISER_HDR_LEN];
        IserHeader::Hello { max_ver: ISER_VERSION, min_ver: ISER_VERSION, ird: 4 }.write(&mut h);
        deliver(&mut d, &h);
        let mut ev = Vec::new();
        d.poll(&mut ev);
        wire(&mut d);
        assert!(d.qp.sent.is_empty(), "no HelloReply");
        assert!(terminated(&ev).is_some_and(|w| w.contains("iSERHelloRequired=No")));
        // Required, but during login.
        let mut d = dm(IserConfig { hello_required: true, ..Default::default() });
        deliver(&mut d, &hello(ISER_VERSION, ISER_VERSION, 4));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert!(terminated(&ev).is_some_and(|w| w.contains("during login")));
        // Required, and the first message of full-feature phase is something else.
        let mut d = ffp_dm(IserConfig { hello_required: true, ..Default::default() });
        deliver(&mut d, &command(1, true, false, 512, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert!(matches!(ev.as_slice(), [DmEvent::Terminated(w)] if w.contains("not a Hello")));
    }

    /// A Hello whose version range does not hold ours gets a HelloReply with REJ, then the
    /// connection closes; what arrives meanwhile is not taken.
    #[test]
    fn a_hello_without_our_version_is_rejected() {
        let mut d = ffp_dm(IserConfig { hello_required: true, ..Default::default() });
        d.set_hello_required(true);
        deliver(&mut d, &hello(2, 1, 8));
        deliver(&mut d, &command(1, true, false, 512, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert!(ev.is_empty(), "the reply goes out first, and the command is not taken");
        wire(&mut d);
        assert_eq!(d.qp.sent, vec![vec![0x31, 0xaa, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], "HelloReply with REJ");
        d.poll(&mut ev);
        assert!(terminated(&ev).is_some_and(|w| w.contains("versions 1..=2")), "{:?}", terminated(&ev));
        assert!(d.qp.disconnected);
    }

    /// A WRITE with 4 KiB immediate data and 4 KiB unsolicited Data-Out, then 12 KiB
    /// solicited (offset 8 KiB), against a Write STag whose base is 0x1000 into the
    /// initiator's buffer. Returns where the solicited data was read from, in that buffer.
    fn solicited_read_source(tagged_buffer_for_solicited_data_only: Option<bool>) -> usize {
        let mut d = dm(IserConfig { max_rdma_len: 4096, tagged_buffer_for_solicited_data_only, ..Default::default() });
        let h = IserHeader::Control { write: Some(TaggedBuffer { stag: 0x22, base_offset: 0x1000 }), read: None };
        let mut msg = [0u8; ISER_HDR_LEN];
        h.write(&mut msg);
        let mut msg = msg.to_vec();
        let mut cmd = scsi_command(Itt(4), Sn(1), false, true, 20480, &[]);
        cmd.final_bit = false;
        Pdu::with_data(Op::ScsiCommand(cmd), vec![1u8; 4096]).encode_message(&mut msg).unwrap();
        deliver(&mut d, &msg);
        let mut msg = IserHeader::TARGET_CONTROL.to_vec();
        let dout = riser_iscsi::testing::data_out(Itt(4), riser_iscsi::serial::Ttt::RESERVED, Sn(0), 4096);
        Pdu::with_data(Op::DataOut(dout), vec![2u8; 4096]).encode_message(&mut msg).unwrap();
        deliver(&mut d, &msg);
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert_eq!(ev.len(), 2);
        d.get_data(get(4, 20480, 8192, 12288));
        d.poll(&mut ev);
        let read_at = |w: &SendWr| match w.op {
            SendOp::RdmaRead { remote_addr, .. } => Some(remote_addr),
            _ => None,
        };
        let addrs: Vec<u64> = d.qp.queued.iter().filter_map(read_at).collect();
        assert_eq!(addrs.len(), 3);
        assert!(addrs.windows(2).all(|w| w[1] == w[0] + 4096), "{addrs:?}");
        let mut rounds = 0;
        while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) {
            wire(&mut d);
            d.poll(&mut ev);
            rounds += 1;
            assert!(rounds < 10);
        }
        let (ready, _) = data_events(&ev);
        let want = addrs[0] as usize;
        let pattern: Vec<u8> = (want..want + 12288).map(|i| (i * 7) as u8).collect();
        assert_eq!(&ready[0].1[8192..], &pattern[..], "the solicited data lands at its offset in the task's buffer");
        want
    }

    /// RFC 7145 §6.9: with TaggedBufferForSolicitedDataOnly=No (the RFC's default, declared)
    /// the Write STag's buffer holds all the write data, so the RDMA Reads start at the base
    /// plus the immediate and unsolicited bytes; with Yes, and with the key not sent (Linux,
    /// libiscsi), at the base itself. The old code always read at the base.
    #[test]
    fn rdma_read_offsets_follow_tagged_buffer_for_solicited_data_only() {
        assert_eq!(solicited_read_source(Some(false)), 0x1000 + 8192);
        assert_eq!(solicited_read_source(Some(true)), 0x1000);
        assert_eq!(solicited_read_source(None), 0x1000);
        // Yes, and a Get_Data starting inside the unsolicited part: the buffer does not
        // hold it.
        let mut d = dm(IserConfig { tagged_buffer_for_solicited_data_only: Some(true), ..Default::default() });
        deliver(&mut d, &command(6, false, true, 8192, vec![5u8; 4096]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        d.get_data(get(6, 8192, 0, 8192));
        ev.clear();
        d.poll(&mut ev);
        assert_eq!(data_events(&ev).1, vec![(Itt(6), "solicited data outside the Write STag's buffer")]);
    }

    /// A READ needing more RDMA Writes than the send queue holds goes out in batches, each
    /// ended by a signaled write whose completion makes room, then the response; the send
    /// queue never holds more than its depth.
    #[test]
    fn a_read_larger_than_the_send_queue_goes_out_in_batches() {
        let mut d = dm(IserConfig { max_rdma_len: 4096, send_queue_depth: 4, ..Default::default() });
        deliver(&mut d, &command(1, true, false, 10 * 4096 + 100, vec![]));
        deliver(&mut d, &command(2, false, false, 0, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let data: Vec<u8> = (0..10 * 4096 + 100u32).map(|i| (i % 253) as u8).collect();
        d.put_data(put(1, data.clone(), response(1)));
        d.send_control(response(2));
        for _ in 0..20 {
            d.poll(&mut ev);
            assert!(d.sq_posted - d.sq_retired <= 4, "never more work requests than the send queue holds");
            wire(&mut d);
        }
        assert!(d.qp.read_buf[..data.len()] == data[..], "all the data was written");
        assert_eq!(d.qp.sent.len(), 2, "both responses went out");
        assert!(d.qp.chains.len() >= 3, "two batches of 4 RDMA Writes, then the last 3 with the response");
        assert!(d.held.is_empty() && d.pending.is_empty());
        assert_eq!(d.send.free.len(), d.send.count());
    }

    /// Notice_Key_Values carries the negotiated iSER keys into the datamover: a Hello becomes
    /// required; TaggedBufferForSolicitedDataOnly=Yes is applied, while a negotiated No (also
    /// what an initiator that never sends the key gets, like Linux) keeps the peers' layout,
    /// so a Linux write with immediate data is still read from the Write STag's base.
    #[test]
    fn notice_key_values_applies_the_iser_keys() {
        let mut d = dm(IserConfig::default());
        let keys = DatamoverParams { iser_hello_required: true, tagged_buffer_for_solicited_data_only: true, ..Default::default() };
        d.notice_key_values(keys);
        assert!(d.cfg.hello_required);
        assert_eq!(d.cfg.tagged_buffer_for_solicited_data_only, Some(true));
        let mut d = dm(IserConfig { max_rdma_len: 4096, ..Default::default() });
        d.notice_key_values(DatamoverParams::default());
        assert!(!d.cfg.hello_required);
        assert_eq!(d.cfg.tagged_buffer_for_solicited_data_only, None);
        deliver(&mut d, &command(2, false, true, 8192 + 4096, vec![9u8; 8192]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        d.get_data(get(2, 8192 + 4096, 8192, 4096));
        d.poll(&mut ev);
        assert!(matches!(d.qp.queued.as_slice(), [w] if w.op == SendOp::RdmaRead { remote_addr: 0, rkey: Stag(0x22) }));
    }

    #[test]
    fn completion_error_terminates_and_bad_header_closes() {
        let mut d = dm(IserConfig::default());
        d.qp.done.push_back(Completion { wr_id: KIND_SEND, error: Some(false), byte_len: 0 });
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert!(matches!(ev.as_slice(), [DmEvent::Terminated(_)]));
        assert!(d.qp.disconnected);
        let mut d = dm(IserConfig::default());
        deliver(&mut d, &[0x70; 40]);
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert!(matches!(ev.as_slice(), [DmEvent::Terminated(_)]));
        // A flushed receive means the peer is gone: one Terminated, then quiet.
        let mut d = dm(IserConfig::default());
        d.qp.done.push_back(Completion { wr_id: KIND_RECV, error: Some(true), byte_len: 0 });
        d.qp.done.push_back(Completion { wr_id: KIND_RECV | 1, error: Some(true), byte_len: 0 });
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert!(matches!(ev.as_slice(), [DmEvent::Terminated(_)]), "{}", ev.len());
        d.poll(&mut ev);
        assert_eq!(ev.len(), 1);
    }

    /// A 32 MiB READ (the largest transfer riser takes; four times the old per-connection
    /// data pool): RDMA Writes straight from the task's buffer (1 MiB each, its lkey, no
    /// copy) chained with the response; the buffer is kept until the response's completion
    /// proves the writes done, and released then.
    #[test]
    fn a_32_mib_read_is_written_from_the_task_buffer_and_released_after_completion() {
        const LEN: usize = 32 << 20;
        let mut d = dm(IserConfig::default());
        d.qp.read_buf = vec![0; LEN];
        deliver(&mut d, &command(1, true, false, LEN as u32, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let data: Vec<u8> = (0..LEN).map(|i| (i % 249) as u8).collect();
        let buf = IoBuf::from(data.as_slice());
        let addr = buf.as_ptr() as u64;
        d.put_data(PutData { itt: Itt(1), lun: Lun(0), buf, len: LEN as u32, offset: 0, response: Some(response(1)), sn: SnState::default() });
        d.poll(&mut ev);
        assert_eq!(d.qp.chains, vec![33], "32 RDMA Writes and the response in one post");
        let writes: Vec<SendWr> = d.qp.queued.iter().filter(|w| matches!(w.op, SendOp::RdmaWrite { .. })).copied().collect();
        assert_eq!(writes.len(), 32);
        for (i, w) in writes.iter().enumerate() {
            assert_eq!(w.sge, Sge { addr: addr + (i << 20) as u64, len: 1 << 20, lkey: IOBUF_LKEY }, "write {i}");
            assert!(!w.signaled, "only the response is signaled");
        }
        wire(&mut d);
        assert!(d.qp.read_buf == data, "the initiator got the data");
        assert_eq!(d.held.len(), 1, "kept until the response completes");
        assert_eq!(d.held[0].1.as_ptr() as u64, addr);
        d.poll(&mut ev);
        assert!(d.held.is_empty(), "released by the response's completion");
        assert_eq!(d.sq_posted, d.sq_retired);
        assert_eq!(d.qp.registrations, 1);
        assert_eq!(d.copies(), CopyStats::default(), "no byte copied");
    }

    /// iWARP (issue #22, item 11): the sink of a Get_Data's RDMA Reads is registered for that
    /// transfer alone, over exactly the solicited range, never as the buffer's lasting
    /// registration, and the registration ends (its STag revoked) once the last read has
    /// completed, before the buffer is handed on.
    #[test]
    fn an_iwarp_read_sink_is_registered_for_its_transfer_alone() {
        let mut d = dm(IserConfig { max_rdma_len: 16 * 1024, max_rdma_reads: 2, ..Default::default() });
        d.qp.per_transfer_sinks = true;
        deliver(&mut d, &command(7, false, true, 64 * 1024, vec![0xee; 8192]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        ev.clear();
        let buf = IoBuf::zeroed(64 * 1024);
        d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf, offset: 8192, len: 56 * 1024, base: 0, more: false, sn: SnState::default() });
        assert_eq!(d.qp.sink_ranges, [(8192, 56 * 1024)], "the solicited range only");
        let mut rounds = 0;
        while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) {
            assert_eq!(live_sinks(&d), 1, "open while its reads run");
            d.poll(&mut ev);
            wire(&mut d);
            rounds += 1;
            assert!(rounds < 20);
        }
        assert_eq!(live_sinks(&d), 0, "closed before the buffer was handed on");
        assert_eq!(d.qp.registrations, 0, "no lasting registration of the sink");
        let (ready, _) = data_events(&ev);
        let pattern: Vec<u8> = (0..56 * 1024usize).map(|i| (i * 7) as u8).collect();
        assert_eq!(&ready[0].1[8192..], &pattern[..]);
    }

    /// iWARP: a task aborted with RDMA Reads in flight keeps its sink's registration, like its
    /// buffer, until those reads have completed, then it ends; a failed read ends it too.
    #[test]
    fn an_iwarp_read_sink_of_an_aborted_task_ends_when_its_reads_do() {
        let mut d = dm(IserConfig { max_rdma_len: 4096, ..Default::default() });
        d.qp.per_transfer_sinks = true;
        deliver(&mut d, &command(5, false, true, 8192, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        d.get_data(get(5, 8192, 0, 8192));
        d.poll(&mut ev);
        assert_eq!(d.qp.queued.len(), 2, "two RDMA Reads in flight");
        assert!(d.deallocate_task_resources(Itt(5)).is_none(), "reads are landing in it: kept");
        assert_eq!(live_sinks(&d), 1, "the sink stays open while reads may land");
        wire(&mut d);
        d.poll(&mut ev);
        assert_eq!(live_sinks(&d), 0, "closed once they completed");
        assert!(d.held.is_empty() && d.held_transfers.is_empty());
        // Not yet posted when the task goes: closed at once.
        deliver(&mut d, &command(6, false, true, 8192, vec![]));
        d.poll(&mut ev);
        d.get_data(get(6, 8192, 0, 8192));
        assert_eq!(live_sinks(&d), 1);
        assert!(d.deallocate_task_resources(Itt(6)).is_some(), "no read posted: the buffer comes back");
        assert_eq!(live_sinks(&d), 0);
        // A failed read: the Get_Data fails and its sink closes.
        deliver(&mut d, &command(8, false, true, 4096, vec![]));
        d.poll(&mut ev);
        d.get_data(get(8, 4096, 0, 4096));
        d.poll(&mut ev);
        let wr = d.qp.queued.pop().expect("the read");
        d.qp.done.push_back(Completion { wr_id: wr.wr_id, error: Some(false), byte_len: 0 });
        ev.clear();
        d.poll(&mut ev);
        assert_eq!(live_sinks(&d), 0);
        assert!(ev.iter().any(|e| matches!(e, DmEvent::DataFailed { .. })));
    }

    /// Get_Data lands straight in the task's buffer at the solicited offset: RDMA Reads of
    /// at most max_rdma_len bytes each, under the buffer's lkey, within the initiator depth;
    /// the bytes before the offset (the immediate data the iSCSI layer put there) stay.
    /// Only the immediate data was copied (out of its receive buffer).
    #[test]
    fn get_data_reads_into_the_task_buffer_at_its_offset() {
        let mut d = dm(IserConfig { max_rdma_len: 16 * 1024, max_rdma_reads: 2, ..Default::default() });
        deliver(&mut d, &command(7, false, true, 64 * 1024, vec![0xee; 8192]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        ev.clear();
        let mut buf = IoBuf::zeroed(64 * 1024);
        buf[..8192].fill(0xee);
        let addr = buf.as_ptr() as u64;
        d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf, offset: 8192, len: 56 * 1024, base: 0, more: false, sn: SnState::default() });
        let mut sges = Vec::new();
        let mut rounds = 0;
        while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) {
            d.poll(&mut ev);
            assert!(d.reads.len() <= 2, "never more reads in flight than the initiator depth");
            sges.extend(d.qp.queued.iter().filter(|w| matches!(w.op, SendOp::RdmaRead { .. })).map(|w| w.sge));
            wire(&mut d);
            rounds += 1;
            assert!(rounds < 20);
        }
        let want: Vec<Sge> =
            (0..4u64).map(|i| Sge { addr: addr + 8192 + i * 16384, len: if i < 3 { 16384 } else { 8192 }, lkey: IOBUF_LKEY }).collect();
        assert_eq!(sges, want, "into the buffer at offset 8 KiB, in pieces of at most 16 KiB");
        let (ready, failed) = data_events(&ev);
        assert!(failed.is_empty());
        let got = &ready[0].1;
        assert!(got[..8192].iter().all(|&b| b == 0xee), "the bytes before the offset are untouched");
        let pattern: Vec<u8> = (0..56 * 1024usize).map(|i| (i * 7) as u8).collect();
        assert_eq!(&got[8192..], &pattern[..]);
        assert_eq!(d.copies(), CopyStats { unsolicited_bytes: 8192, ..Default::default() });
        assert!(d.held.is_empty() && d.fetches.is_empty());
    }

    /// With write buffers from a pool (as the server gives them): the immediate data of a
    /// write partly immediate is read out of the receive buffer once, straight into the
    /// task's write buffer (delivered with the command); with the budget spent it comes in
    /// the PDU's segment (the iSCSI layer queues the task); a write all immediate keeps its
    /// segment. Each immediate byte is copied once.
    #[test]
    fn immediate_data_is_read_once_straight_into_the_task_buffer_when_the_budget_has_room() {
        let pool: &'static riser_buf::Pool = Box::leak(Box::new(riser_buf::Pool::new(riser_buf::MIN_MAX_BYTES)));
        let account = riser_buf::Account::new();
        let mut d = dm(IserConfig::default());
        d.set_write_buffers(WriteBuffers { pool, account: account.clone(), largest_write: 32 << 20, stream_above: 0 });
        let imm: Vec<u8> = (0..8192u32).map(|i| (i * 13) as u8).collect();
        deliver(&mut d, &command(7, false, true, 64 * 1024, imm.clone()));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let Some(DmEvent::Command { pdu, buf }) = ev.pop() else { panic!("expected the command with its buffer") };
        assert!(matches!(pdu.op(), Op::ScsiCommand(c) if c.itt == Itt(7)));
        assert_eq!((pdu.bhs.data_segment_length, pdu.data.len()), (8192, 0));
        assert_eq!(buf.len(), 64 * 1024);
        assert_eq!(&buf[..8192], &imm[..]);
        assert_eq!(account.held(), buf.capacity(), "budgeted, charged to the connection");
        assert_eq!(d.copies(), CopyStats { unsolicited_bytes: 8192, ..Default::default() });
        // The buffer is the one Get_Data then fills: zero copies of the solicited part.
        d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf, offset: 8192, len: 56 * 1024, base: 0, more: false, sn: SnState::default() });
        for _ in 0..10 {
            d.poll(&mut ev);
            wire(&mut d);
        }
        let (ready, failed) = data_events(&ev);
        assert!(failed.is_empty());
        assert_eq!(&ready[0].1[..8192], &imm[..]);
        assert_eq!(d.copies(), CopyStats { unsolicited_bytes: 8192, ..Default::default() });
        drop(ready);
        ev.clear();
        // The budget spent elsewhere: the immediate data comes in the segment, copied once.
        let hog = pool.try_alloc(riser_buf::MIN_MAX_BYTES, &mut None).expect("the whole budget");
        deliver(&mut d, &command(8, false, true, 64 * 1024, imm.clone()));
        d.poll(&mut ev);
        let Some(DmEvent::Control(pdu)) = ev.pop() else { panic!("expected the command with its segment") };
        assert_eq!(pdu.data, imm);
        assert_eq!(pool.stats().waiting, 0, "no place taken in the queue");
        drop(hog);
        // All immediate: in the segment (it becomes the buffer as it is).
        deliver(&mut d, &command(9, false, true, 8192, imm.clone()));
        d.poll(&mut ev);
        let Some(DmEvent::Control(pdu)) = ev.pop() else { panic!("expected the command with its segment") };
        assert_eq!(pdu.data, imm);
        assert_eq!(d.copies(), CopyStats { unsolicited_bytes: 3 * 8192, ..Default::default() });
        assert_eq!(d.qp.recvs.len(), IserConfig::default().recv_slots, "every receive reposted");
    }

    /// A 32 MiB WRITE: RDMA Reads straight into the task's buffer, 1 MiB each, the initiator
    /// depth (16) at most in flight; the buffer comes back whole, nothing copied.
    #[test]
    fn a_32_mib_write_is_read_into_the_task_buffer() {
        const LEN: usize = 32 << 20;
        let mut d = dm(IserConfig::default());
        d.qp.write_buf = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
        deliver(&mut d, &command(9, false, true, LEN as u32, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        ev.clear();
        d.get_data(get(9, LEN, 0, LEN as u32));
        let mut rounds = 0;
        while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. } | DmEvent::DataFailed { .. })) {
            d.poll(&mut ev);
            assert!(d.reads.len() <= 16);
            wire(&mut d);
            rounds += 1;
            assert!(rounds < 10);
        }
        let Some(DmEvent::DataReady { buf, .. }) = ev.pop() else { panic!("the Get_Data failed") };
        assert!(buf.as_slice() == d.qp.write_buf.as_slice());
        assert_eq!(d.qp.registrations, 1);
        assert_eq!(d.copies(), CopyStats::default());
        assert_eq!(d.sq_posted, d.sq_retired);
    }

    /// A control PDU with more data than a small send slot takes (a Text or NOP-In response)
    /// goes whole in a large slot; a SCSI Response in a small one; both slots come back.
    #[test]
    fn large_control_pdus_take_a_large_send_slot() {
        let mut d = ffp_dm(IserConfig::default());
        let big = Pdu::with_data(response(1).bhs.op.clone(), vec![0x5a; 4000]);
        d.send_control(big);
        d.send_control(response(2));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let sends: Vec<SendWr> = d.qp.queued.clone();
        assert_eq!(sends.len(), 2);
        assert_ne!(wr_idx(sends[0].wr_id) & IserDatamover::<FakeQp>::LARGE_SLOT, 0, "a large slot");
        assert_eq!(sends[0].sge.len as usize, ISER_HDR_LEN + BHS_LEN + 4000, "not truncated");
        assert_eq!(wr_idx(sends[1].wr_id) & IserDatamover::<FakeQp>::LARGE_SLOT, 0, "a small slot");
        wire(&mut d);
        d.poll(&mut ev);
        assert_eq!(d.send.free.len(), d.send.count());
        assert_eq!(d.send_large.free.len(), d.send_large.count());
        let p = Pdu::decode_message(&d.qp.sent[0][ISER_HDR_LEN..], 8192).unwrap();
        assert_eq!(p.data.len(), 4000);
    }

    /// A READ command whose Read STag's buffer starts at `base_offset` of the initiator's
    /// read buffer.
    fn read_command_at(itt: u32, edtl: u32, base_offset: u64) -> Vec<u8> {
        let h = IserHeader::Control { write: None, read: Some(TaggedBuffer { stag: 0x11, base_offset }) };
        let mut hb = [0u8; ISER_HDR_LEN];
        h.write(&mut hb);
        let mut msg = hb.to_vec();
        let pdu = Pdu::new(Op::ScsiCommand(scsi_command(Itt(itt), Sn(1), true, false, edtl, &[])));
        pdu.encode_message(&mut msg).unwrap();
        msg
    }

    /// One piece of a streamed read of task 1: `data[from..to]` in its own buffer.
    fn piece(data: &[u8], from: usize, to: usize, response: Option<Pdu>) -> PutData {
        let buf = IoBuf::from(data[from..to].to_vec());
        PutData { itt: Itt(1), lun: Lun(0), buf, len: (to - from) as u32, offset: from as u32, response, sn: SnState::default() }
    }

    /// A read streamed in pieces: each piece is RDMA-Written at the Read STag's base + its
    /// command offset; a piece with more to follow has its last write signaled and its
    /// buffer goes back with that completion, not with the response; the task (its Read
    /// STag) stays known until the final piece, whose writes are chained with the response
    /// (Send with Invalidate of the Read STag).
    #[test]
    fn a_read_in_pieces_is_written_at_each_offset_and_each_piece_freed_once_written() {
        let mut d = dm(IserConfig { max_rdma_len: 4096, send_invalidate: true, ..Default::default() });
        deliver(&mut d, &read_command_at(1, 25_000, 0x1000));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let data: Vec<u8> = (0..25_000u32).map(|i| (i % 241) as u8).collect();
        for (from, to) in [(0usize, 10_000usize), (10_000, 20_000)] {
            d.put_data(piece(&data, from, to, None));
            d.poll(&mut ev);
            let wrs = d.qp.queued.clone();
            let remote: Vec<u64> = wrs.iter().map(|w| match w.op {
                SendOp::RdmaWrite { remote_addr, .. } => remote_addr,
                op => panic!("a piece with more to follow sends {op:?}"),
            }).collect();
            let want: Vec<u64> = (from..to).step_by(4096).map(|o| 0x1000 + o as u64).collect();
            assert_eq!(remote, want, "written at the Read STag's base + the piece's command offset");
            let signaled: Vec<bool> = wrs.iter().map(|w| w.signaled).collect();
            assert_eq!(signaled, [false, false, true], "only the piece's last write is signaled");
            assert_eq!(d.held.len(), 1, "the piece's buffer is held while its writes are in flight");
            wire(&mut d);
            d.poll(&mut ev);
            assert!(d.held.is_empty(), "the piece's buffer went with its last write's completion");
            assert!(d.tasks.contains_key(&Itt(1)), "the task stays known until its final piece");
            assert!(d.qp.sent.is_empty(), "no response before the final piece");
        }
        d.put_data(piece(&data, 20_000, 25_000, Some(response(1))));
        d.poll(&mut ev);
        let ops: Vec<SendOp> = d.qp.queued.iter().map(|w| w.op).collect();
        assert_eq!(
            ops,
            vec![
                SendOp::RdmaWrite { remote_addr: 0x1000 + 20_000, rkey: Stag(0x11) },
                SendOp::RdmaWrite { remote_addr: 0x1000 + 24_096, rkey: Stag(0x11) },
                SendOp::SendInvalidate(Stag(0x11)),
            ]
        );
        wire(&mut d);
        assert_eq!(d.held.len(), 1, "the final piece's buffer is kept until the response's completion");
        d.poll(&mut ev);
        assert!(d.held.is_empty() && d.pending.is_empty() && !d.tasks.contains_key(&Itt(1)));
        assert!(d.qp.read_buf[0x1000..0x1000 + 25_000] == data[..], "every piece in its place");
        assert_eq!(d.qp.sent.len(), 1, "one response");
        assert!(matches!(Pdu::decode_message(&d.qp.sent[0][ISER_HDR_LEN..], 8192).unwrap().op(), Op::ScsiResponse(_)));
        assert_eq!(d.copies(), CopyStats::default(), "no byte copied");
    }

    /// Pieces larger than the send queue go out in batches (each ended by a signaled write),
    /// the send queue never over-full; a final piece of 0 bytes sends the response alone.
    #[test]
    fn pieces_larger_than_the_send_queue_go_out_in_batches_and_a_final_piece_may_be_empty() {
        let mut d = dm(IserConfig { max_rdma_len: 4096, send_queue_depth: 4, ..Default::default() });
        deliver(&mut d, &read_command_at(1, 14 * 4096, 0));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let data: Vec<u8> = (0..14 * 4096u32).map(|i| (i % 233) as u8).collect();
        d.put_data(piece(&data, 0, 10 * 4096, None));
        d.put_data(piece(&data, 10 * 4096, 14 * 4096, None));
        d.put_data(piece(&data, 14 * 4096, 14 * 4096, Some(response(1))));
        for _ in 0..20 {
            d.poll(&mut ev);
            assert!(d.sq_posted - d.sq_retired <= 4, "never more work requests than the send queue holds");
            wire(&mut d);
        }
        assert!(d.qp.read_buf[..data.len()] == data[..], "all the pieces were written in place");
        assert_eq!(d.qp.sent.len(), 1, "the response went out, once");
        assert!(d.held.is_empty() && d.pending.is_empty() && d.tasks.is_empty());
        assert_eq!(d.send.free.len(), d.send.count());
    }

    /// Deallocate_Task_Resources between pieces: the queued pieces are dropped; a piece whose
    /// writes are on the wire keeps its buffer until they complete.
    #[test]
    fn deallocate_between_pieces_drops_what_is_queued() {
        let mut d = dm(IserConfig { max_rdma_len: 4096, send_queue_depth: 2, ..Default::default() });
        deliver(&mut d, &read_command_at(1, 16 * 4096, 0));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let data = vec![3u8; 16 * 4096];
        d.put_data(piece(&data, 0, 4 * 4096, None));
        d.put_data(piece(&data, 4 * 4096, 8 * 4096, None));
        d.poll(&mut ev);
        assert_eq!(d.qp.queued.len(), 2, "the first batch of the first piece");
        assert_eq!(d.pending.len(), 2);
        assert!(d.deallocate_task_resources(Itt(1)).is_some(), "a queued piece's buffer comes back");
        assert!(d.pending.is_empty() && !d.tasks.contains_key(&Itt(1)));
        assert_eq!(d.held.len(), 1, "the first piece's buffer waits for its writes on the wire");
        wire(&mut d);
        d.poll(&mut ev);
        wire(&mut d);
        assert!(d.held.is_empty() && d.qp.sent.is_empty());
        assert!(d.qp.read_buf[2 * 4096..16 * 4096].iter().all(|&b| b == 0), "nothing more written");
    }

    /// A write fetched in pieces, each Get_Data with its own buffer (`base` = the command
    /// offset of its first byte): RDMA Reads from the Write STag at the command's offsets,
    /// into buf[offset - base ..]; a piece outside its buffer fails at once.
    #[test]
    fn get_data_in_pieces_reads_into_offset_minus_base() {
        let mut d = dm(IserConfig { max_rdma_len: 16 * 1024, ..Default::default() });
        deliver(&mut d, &command(7, false, true, 64 * 1024, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        ev.clear();
        let pattern: Vec<u8> = (0..64 * 1024usize).map(|i| (i * 7) as u8).collect();
        for (offset, len, more) in [(0u32, 24 * 1024u32, true), (24 * 1024, 40 * 1024, false)] {
            let buf = IoBuf::zeroed(len as usize);
            let addr = buf.as_ptr() as u64;
            d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf, offset, len, base: offset, more, sn: SnState::default() });
            d.poll(&mut ev);
            let reads: Vec<(u64, Sge)> = d.qp.queued.iter().map(|w| match w.op {
                SendOp::RdmaRead { remote_addr, .. } => (remote_addr, w.sge),
                op => panic!("expected RDMA Reads, got {op:?}"),
            }).collect();
            let want: Vec<(u64, Sge)> = (0..len.div_ceil(16 * 1024))
                .map(|i| {
                    let o = i * 16 * 1024;
                    (u64::from(offset + o), Sge { addr: addr + u64::from(o), len: (len - o).min(16 * 1024), lkey: IOBUF_LKEY })
                })
                .collect();
            assert_eq!(reads, want, "from the command's offset into the piece's buffer at offset - base");
            wire(&mut d);
            ev.clear();
            d.poll(&mut ev);
            let (ready, failed) = data_events(&ev);
            assert!(failed.is_empty(), "{failed:?}");
            assert_eq!(ready.len(), 1);
            assert!(ready[0].1 == pattern[offset as usize..(offset + len) as usize], "the piece at buf[offset - base]");
            assert!(d.tasks.contains_key(&Itt(7)), "the task stays known for its next piece");
        }
        for (offset, len, base) in [(4096u32, 4096u32, 8192u32), (8192, 8192, 4096)] {
            d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf: IoBuf::zeroed(8192), offset, len, base, more: false, sn: SnState::default() });
            ev.clear();
            d.poll(&mut ev);
            let (_, failed) = data_events(&ev);
            assert_eq!(failed, vec![(Itt(7), "solicited data outside the task's buffer")]);
        }
        assert!(d.qp.queued.is_empty(), "no RDMA Read for a piece outside its buffer");
    }

    /// A NOP-Out ping (immediate, TTT reserved) with `data` bytes of ping data.
    fn ping(itt: u32, data: usize) -> Vec<u8> {
        let mut m = IserHeader::TARGET_CONTROL.to_vec();
        let pdu = Pdu::with_data(Op::NopOut(riser_iscsi::testing::nop_out(Itt(itt), Sn(1))), vec![0x77; data]);
        pdu.encode_message(&mut m).unwrap();
        m
    }

    /// One pass as the connection makes it: poll, answer each NOP-Out with its NOP-In echo
    /// (ping data included), flush. Returns the PDUs received.
    fn echo_pass(d: &mut IserDatamover<FakeQp>) -> usize {
        use riser_iscsi::pdu::NopIn;
        use riser_iscsi::serial::Ttt;
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let mut n = 0;
        for e in ev {
            let DmEvent::Control(p) = e else { panic!("only pings arrive") };
            let Op::NopOut(o) = p.op() else { panic!("only pings arrive") };
            let nop_in = NopIn { lun: Lun(0), itt: o.itt, ttt: Ttt::RESERVED, stat_sn: Sn(0), exp_cmd_sn: Sn(0), max_cmd_sn: Sn(0) };
            d.send_control(Pdu::with_data(Op::NopIn(nop_in), p.data.clone()));
            n += 1;
        }
        let mut ev = Vec::new();
        d.flush(&mut ev);
        assert!(ev.is_empty());
        n
    }

    /// Ping data of the flood: each echo takes a large send slot (8 of them).
    const FLOOD_PING: usize = 4000;
    const FLOOD_ECHO: usize = ISER_HDR_LEN + BHS_LEN + FLOOD_PING;

    /// An initiator that posts no receives (none of our SENDs completes) and sends NOP-Out
    /// pings with data as long as it has receive credits, under a limit of `limit` bytes.
    /// Returns the pings it could send.
    fn flood(d: &mut IserDatamover<FakeQp>, limit: TxLimit) -> usize {
        d.limit_tx_queue(limit);
        let s0 = d.tx_backlog().sent;
        let mut delivered = 0;
        while !d.qp.recvs.is_empty() && delivered < 5000 {
            deliver(d, &ping(delivered as u32, FLOOD_PING));
            delivered += 1;
            assert_eq!(echo_pass(d), 1);
        }
        let ring = d.recv.count();
        assert!(d.qp.recvs.is_empty(), "the initiator runs out of receive credits ({delivered} pings sent)");
        assert_eq!(d.rx_handled.len(), ring, "every handled receive held");
        // The backlog reached the limit, then the initiator could only use the receives
        // still posted: at most a ring's worth of answers beyond it.
        assert!(delivered <= limit.unbudgeted / FLOOD_ECHO + 1 + ring, "{delivered} pings");
        let b = d.tx_backlog();
        assert_eq!(b, TxBacklog { unbudgeted: delivered * FLOOD_ECHO, total: delivered * FLOOD_ECHO, sent: s0 });
        assert!(b.unbudgeted <= limit.unbudgeted + (ring + 1) * FLOOD_ECHO && limit.exceeded_by(&b));
        assert_eq!(d.pending.len(), delivered - SEND_ROOM, "all but the SENDs posted wait, bounded");
        // More passes without a completion repost nothing.
        for _ in 0..10 {
            assert_eq!(echo_pass(d), 0);
        }
        assert!(d.qp.recvs.is_empty());
        delivered
    }

    /// A peer that never posts receives, so that none of our SENDs completes (rnr_retry_count
    /// 7 retries for ever), and floods NOP-Outs with ping data, each answered by a NOP-In
    /// echo: once more than the limit is queued for it, its receive slots are held, not
    /// reposted, so the pending sends stay bounded by the limit and the ring. When its SENDs
    /// complete the backlog drains, every echo goes out in order, `sent` advances with the
    /// completions, and the receives are reposted: the next request gets through. (Before
    /// the bound, every receive was reposted at once and the flood ran to its 5000 pings.)
    #[test]
    fn a_flood_of_pings_that_nobody_takes_holds_the_receives_until_the_answers_complete() {
        let limit = TxLimit::new(64 << 10);
        let mut d = ffp_dm(IserConfig::default());
        let ring = d.recv.count();
        let s0 = d.tx_backlog().sent;
        let delivered = flood(&mut d, limit);

        // The initiator takes the SENDs: the first 8 complete, `sent` moves.
        wire(&mut d);
        echo_pass(&mut d);
        assert_eq!(d.tx_backlog().sent, s0 + (SEND_ROOM * FLOOD_ECHO) as u64, "sent advances with the completions");
        let mut passes = 0;
        while d.qp.sent.len() < delivered || !d.qp.queued.is_empty() || !d.qp.done.is_empty() {
            wire(&mut d);
            assert_eq!(echo_pass(&mut d), 0);
            passes += 1;
            assert!(passes < 10_000, "the backlog drains");
        }
        assert_eq!(d.tx_backlog(), TxBacklog { unbudgeted: 0, total: 0, sent: s0 + (delivered * FLOOD_ECHO) as u64 });
        assert!(d.pending.is_empty() && d.idle());
        for (i, m) in d.qp.sent.iter().enumerate() {
            let p = Pdu::decode_message(&m[ISER_HDR_LEN..], 8192).unwrap();
            assert!(matches!(p.op(), Op::NopIn(n) if n.itt == Itt(i as u32)), "echo {i} in order");
            assert_eq!(p.data, vec![0x77; FLOOD_PING]);
        }
        assert_eq!(d.qp.recvs.len(), ring, "every receive reposted");
        assert!(d.rx_handled.is_empty() && !d.rx_paused);
        // The initiator's next request (a Logout, a TMF, a SNACK: here a ping) gets through.
        deliver(&mut d, &ping(9999, 16));
        assert_eq!(echo_pass(&mut d), 1);
        assert_eq!(d.qp.recvs.len(), ring);
    }

    /// With every receive held for the backlog, a QP that goes to error still tears the
    /// connection down: no receive is posted to flush, so the flushed SENDs say so.
    #[test]
    fn a_qp_in_error_with_every_receive_held_terminates() {
        let mut d = ffp_dm(IserConfig::default());
        flood(&mut d, TxLimit::new(64 << 10));
        let flushed: Vec<Completion> =
            d.qp.queued.iter().filter(|w| w.signaled).map(|w| Completion { wr_id: w.wr_id, error: Some(true), byte_len: 0 }).collect();
        assert_eq!(flushed.len(), SEND_ROOM);
        d.qp.done.extend(flushed);
        let mut ev = Vec::new();
        d.poll(&mut ev);
        assert_eq!(terminated(&ev), Some("connection lost (receive queue flushed)"));
        assert!(d.qp.disconnected && d.dead);
        let mut ev = Vec::new();
        assert_eq!(d.poll(&mut ev), 0);
        assert!(ev.is_empty());
    }

    /// Read data counts in the total backlog (it lives in the task's budgeted buffer), its
    /// response outside the I/O buffers, from Put_Data until the response SEND completes.
    #[test]
    fn read_data_counts_in_the_backlog_until_its_writes_complete() {
        let mut d = ffp_dm(IserConfig::default());
        let before = d.tx_backlog().sent;
        deliver(&mut d, &command(1, true, false, 200_000, vec![]));
        let mut ev = Vec::new();
        d.poll(&mut ev);
        let r = response(1);
        let r_len = message_len(&r);
        d.put_data(PutData {
            itt: Itt(1),
            lun: Lun(0),
            buf: riser_bdev::IoBuf::from(vec![1u8; 200_000]),
            len: 200_000,
            offset: 0,
            response: Some(r),
            sn: SnState::default(),
        });
        let queued = TxBacklog { unbudgeted: r_len, total: r_len + 200_000, sent: before };
        assert_eq!(d.tx_backlog(), queued);
        d.poll(&mut ev);
        assert!(!d.qp.queued.is_empty());
        assert_eq!(d.tx_backlog(), queued, "posted, not yet completed");
        wire(&mut d);
        d.poll(&mut ev);
        assert_eq!(d.tx_backlog(), TxBacklog { unbudgeted: 0, total: 0, sent: before + (r_len + 200_000) as u64 });
    }
}
