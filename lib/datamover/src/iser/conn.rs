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

use super::config::{IserConfig, SEND_ROOM, SMALL_SEND_DATA};
use super::error::IserError;
use super::header::{IserHeader, Stag, TaggedBuffer, ISER_HDR_LEN, ISER_VERSION};
use super::pool::Pool;
use super::wr::{
    wr_gen, wr_id, wr_idx, Completion, IserQp, ReadSink, SendOp, SendWr, Sge, GEN_MASK, IDX_MASK, KIND_MASK, KIND_READ, KIND_RECV, KIND_SEND,
    KIND_WRITE,
};

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
    /// The sink's registration for this transfer alone (iWARP), dropped once no RDMA Read
    /// can land in it any more: before the buffer is handed on (declared before `buf`, so
    /// also when a fetch is dropped whole).
    transfer: Option<Box<dyn Send>>,
    buf: IoBuf,
    /// The buffer's first byte as the device sees it, and the lkey of the reads' sink.
    addr: u64,
    lkey: u32,
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
    /// Transfer registrations of RDMA Read sinks whose task went away with reads in flight:
    /// dropped (deregistered) once the send queue has retired the sequence number. Declared
    /// before `held`, so also dropped before the buffers they name.
    held_transfers: Vec<(u64, Box<dyn Send>)>,
    /// Buffers the device may still read or write: released once the send queue has
    /// retired the sequence number they are paired with.
    held: Vec<(u64, IoBuf)>,
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
            // Registrations first: a buffer goes back to the pool (where anyone may take it)
            // only once no remote write key names it any more.
            self.held_transfers.retain(|(f, _)| *f > retired);
            self.held.retain(|(f, _)| *f > retired);
        }
    }

    /// Tries to send one pending item; gives it back when resources are short (it stays
    /// queued). A PDU that cannot be encoded fails the connection: its task (or the
    /// exchange it answers) could never complete, and the queue behind it would stall.
    // The item comes back by move to stay queued; boxing it would allocate on the data path.
    #[allow(clippy::result_large_err)]
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
        // The source of RDMA Writes: the device only reads it, so a buffer known to be zero
        // (a null LUN's) stays known (IoBuf::as_ptr would forget it).
        let base = put.buf.as_slice().as_ptr() as u64;
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
mod tests;
