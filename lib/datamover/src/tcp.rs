//! The TCP datamover: iSCSI PDUs on a non-blocking byte stream.
//!
//! Put_Data becomes Data-In PDUs cut at the initiator's MaxRecvDataSegmentLength, with a
//! GOOD status folded into the last one (phase collapse, RFC 7143 §11.7.3). Get_Data
//! becomes R2Ts (at most MaxOutstandingR2T, each at most MaxBurstLength) and the solicited
//! Data-Out PDUs that answer them land directly in the task's buffer. Read data is never
//! copied on the way out: the send queue holds slices of the task's buffer. Immediate data
//! of a write that is partly immediate goes straight into the task's write buffer too when
//! the budget has room for it ([`WriteBuffers`]): received into it from the socket, or
//! copied there once from the framer's buffer.
//!
//! A large read may come in pieces (several Put_Data of one task, the last with the
//! response) and a large write may be fetched in pieces (several Get_Data, each with
//! `more` but the last): DataSN and R2TSN go on across a task's pieces, bursts (Data-In
//! sequences) are cut on the command's buffer offsets, and each piece's buffer goes as soon
//! as its own bytes are sent or received.

pub mod portal;

#[cfg(test)]
mod copy_tests;

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use riser_bdev::IoBuf;
use riser_iscsi::ffp::{CopyStats, Datamover, DatamoverParams, DmEvent, GetData, PutData, SnState, TxBacklog, TxLimit, WriteBuffers};
use riser_iscsi::framer::{ErrorAction, Framer, FramerLimits};
use riser_iscsi::pdu::{Bhs, DataIn, DataOut, Digests, Lun, Op, Pdu, R2t, RejectReason, BHS_LEN, MAX_AHS_LENGTH};
use riser_iscsi::serial::{Itt, Sn, TagMap, Ttt};

/// Most bytes read from the socket in one poll, so one busy connection cannot starve the
/// others on its reactor.
const MAX_READ_PER_POLL: usize = 1 << 20;
/// Room offered to each read from the socket.
const READ_CHUNK: usize = 64 * 1024;
/// Most iovecs in one writev.
const MAX_IOV: usize = 64;

/// The byte stream under iSCSI: a TCP socket, or an in-memory pipe in tests
/// (`crate::mem`). Blocking reads with a timeout during login, non-blocking in full-feature
/// phase.
pub trait ByteStream: Read + Write + Send + 'static {
    /// Blocking reads that give up after `timeout` (login phase).
    fn set_read_timeout(&mut self, timeout: Duration) -> std::io::Result<()>;
    /// Reads and writes that never block (full-feature phase, on a reactor).
    fn set_nonblocking(&mut self) -> std::io::Result<()>;
    /// Closes both directions.
    fn shutdown(&mut self);
    fn peer_addr(&self) -> Option<SocketAddr>;
    /// A descriptor readable when data comes in (a socket), registered with the reactor so
    /// that data ends its adaptive sleep; none for in-memory streams.
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

impl ByteStream for TcpStream {
    fn set_read_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        TcpStream::set_read_timeout(self, Some(timeout))
    }
    fn set_nonblocking(&mut self) -> std::io::Result<()> {
        TcpStream::set_nonblocking(self, true)?;
        let _ = self.set_nodelay(true);
        Ok(())
    }
    fn shutdown(&mut self) {
        let _ = TcpStream::shutdown(self, Shutdown::Both);
    }
    fn peer_addr(&self) -> Option<SocketAddr> {
        TcpStream::peer_addr(self).ok()
    }
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(self))
    }
}

/// The longest inline chunk: a BHS and its header digest.
const SMALL: usize = BHS_LEN + 4;

/// A piece of the send queue.
enum Chunk {
    /// A header (and its digest) or a data segment's padding and digest, inline.
    Small { bytes: [u8; SMALL], len: u8 },
    Owned(Vec<u8>),
    /// Bytes `off..off+len` of the held read buffer in slot `slot`.
    Held { slot: u32, off: usize, len: usize },
}

impl Chunk {
    fn small(b: &[u8]) -> Chunk {
        let mut bytes = [0u8; SMALL];
        bytes[..b.len()].copy_from_slice(b);
        Chunk::Small { bytes, len: b.len() as u8 }
    }

    /// Its bytes, and whether they live in a budgeted I/O buffer (a held read buffer).
    fn size(&self) -> (usize, bool) {
        match self {
            Chunk::Small { len, .. } => (*len as usize, false),
            Chunk::Owned(v) => (v.len(), false),
            Chunk::Held { len, .. } => (*len, true),
        }
    }
}

/// Read buffers whose bytes are queued for sending, each with the number of chunks that
/// still point into it; slots are reused, so queuing read data allocates nothing.
#[derive(Default)]
struct Held {
    slots: Vec<Option<(IoBuf, u32)>>,
    free: Vec<u32>,
}

impl Held {
    fn hold(&mut self, buf: IoBuf) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some((buf, 0));
                i
            }
            None => {
                self.slots.push(Some((buf, 0)));
                (self.slots.len() - 1) as u32
            }
        }
    }

    fn add_ref(&mut self, slot: u32) {
        if let Some(Some((_, n))) = self.slots.get_mut(slot as usize) {
            *n += 1;
        }
    }

    /// One chunk of `slot` is sent: the buffer goes when its last chunk has.
    fn release(&mut self, slot: u32) {
        if let Some(entry) = self.slots.get_mut(slot as usize) {
            if let Some((_, n)) = entry {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    *entry = None;
                    self.free.push(slot);
                }
            }
        }
    }

    fn bytes(&self, slot: u32, off: usize, len: usize) -> &[u8] {
        match self.slots.get(slot as usize) {
            Some(Some((b, _))) => b.as_slice().get(off..off + len).unwrap_or_default(),
            _ => &[],
        }
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
    }
}

fn chunk_bytes<'a>(c: &'a Chunk, held: &'a Held) -> &'a [u8] {
    match c {
        Chunk::Small { bytes, len } => &bytes[..*len as usize],
        Chunk::Owned(v) => v,
        Chunk::Held { slot, off, len } => held.bytes(*slot, *off, *len),
    }
}

/// One outstanding R2T (RFC 7143 §11.8).
struct R2tState {
    ttt: Ttt,
    offset: u32,
    len: u32,
    received: u32,
    next_data_sn: Sn,
}

/// A Get_Data in progress.
struct Solicit {
    lun: Lun,
    buf: IoBuf,
    /// The command's buffer offset of `buf[0]`.
    base: u32,
    /// More Get_Data of the task follow this one: its R2TSN is kept when it completes.
    more: bool,
    /// Next byte to ask for, and the end of what was asked.
    next_offset: u32,
    end: u32,
    remaining: u32,
    r2t_sn: Sn,
    r2ts: Vec<R2tState>,
    sn: SnState,
}

impl R2tState {
    /// Whether a Data-Out of `len` bytes is the next piece of this R2T's sequence (DataSN
    /// and offset in order, within the length asked for).
    fn continues(&self, d: &DataOut, len: u32) -> bool {
        d.data_sn == self.next_data_sn && d.buffer_offset == self.offset + self.received && self.received + len <= self.len
    }
}

/// The datamover of one connection over a byte stream (a TCP socket by default).
pub struct TcpDatamover<S: ByteStream = TcpStream> {
    sock: S,
    framer: Framer,
    params: DatamoverParams,
    digests: Digests,
    tx: VecDeque<Chunk>,
    held: Held,
    /// Bytes of the front chunk already written.
    tx_pos: usize,
    solicits: TagMap<Itt, Solicit>,
    next_ttt: u32,
    terminating: bool,
    dead: bool,
    /// Payload copies: out of the framer's buffer into a PDU segment or a task's buffer
    /// (what the kernel reads straight into a task's buffer is not copied by riser); read
    /// data goes out from the task's buffer.
    copies: CopyStats,
    /// Where write buffers for immediate data come from (none: immediate data comes in
    /// the PDU's segment).
    write_bufs: Option<WriteBuffers>,
    /// The write buffer the SCSI Command being received has its immediate data placed in,
    /// until that PDU is delivered ([`DmEvent::Command`]).
    placed: Option<(Itt, IoBuf)>,
    /// Emptied R2T lists of finished Get_Data, for the next ones.
    spare_r2ts: Vec<Vec<R2tState>>,
    /// The next DataSN of each read being sent in pieces (a Put_Data without response came;
    /// the final piece forgets it). A read sent whole never enters it.
    streams: TagMap<Itt, Sn>,
    /// The next R2TSN of each write fetched in pieces, between a Get_Data with `more` and
    /// the next one.
    r2t_sns: TagMap<Itt, Sn>,
    /// Get_Data settled without any R2T, reported by the next poll: ready (None) or failed.
    settled: crate::Settled,
    /// The socket in its reactor's wake set (registered at the first poll, on the reactor).
    wake: Wake,
    /// What `tx` holds: bytes outside budgeted buffers, bytes in all (counted whole until a
    /// chunk is popped); and bytes written to the socket so far.
    tx_unbudgeted: usize,
    tx_total: usize,
    tx_sent: u64,
    /// Receiving stops while `tx` holds more than this ([`Datamover::limit_tx_queue`]).
    tx_limit: TxLimit,
    /// Receiving stopped for a full send queue: the initiator sends and does not read.
    rx_paused: bool,
    /// How many times receiving stopped so far (the first is logged at info).
    rx_pauses: u32,
}

/// Whether the socket is in the reactor's wake set yet.
enum Wake {
    NotYet,
    In(riser_reactor::WakeId),
    /// Not on a reactor (tests), no descriptor, or the registration failed (logged): the
    /// reactor notices data when its sleep times out.
    Never,
}

/// Most R2T lists kept for reuse.
const MAX_SPARE_R2T_LISTS: usize = 64;

impl<S: ByteStream> TcpDatamover<S> {
    /// Takes over a logged-in connection. `leftover`: bytes read past the final login PDU.
    pub fn new(mut sock: S, leftover: &[u8]) -> std::io::Result<TcpDatamover<S>> {
        sock.set_nonblocking()?;
        let mut framer = Framer::new();
        framer.feed(leftover);
        Ok(TcpDatamover {
            sock,
            framer,
            params: DatamoverParams::default(),
            digests: Digests::default(),
            tx: VecDeque::new(),
            held: Held::default(),
            tx_pos: 0,
            solicits: TagMap::default(),
            next_ttt: 0x100,
            terminating: false,
            dead: false,
            copies: CopyStats::default(),
            write_bufs: None,
            placed: None,
            spare_r2ts: Vec::new(),
            streams: TagMap::default(),
            r2t_sns: TagMap::default(),
            settled: VecDeque::new(),
            wake: Wake::NotYet,
            tx_unbudgeted: 0,
            tx_total: 0,
            tx_sent: 0,
            tx_limit: TxLimit::default(),
            rx_paused: false,
            rx_pauses: 0,
        })
    }

    /// Puts the socket in the wake set of the reactor polling it.
    fn join_wake_set(&mut self) {
        self.wake = match self.sock.wake_fd().map(|fd| riser_reactor::add_wake_fd(fd, || {})) {
            Some(Ok(Some(id))) => Wake::In(id),
            Some(Err(e)) => {
                log::warn!("connection socket: cannot wake its reactor ({e}); data waits for the reactor's next pass");
                Wake::Never
            }
            _ => Wake::Never,
        };
    }

    /// Takes the socket out of the wake set (a shut-down socket stays readable: EOF).
    fn leave_wake_set(&mut self) {
        if let Wake::In(id) = std::mem::replace(&mut self.wake, Wake::Never) {
            riser_reactor::remove_wake_fd(id);
        }
    }

    pub fn peer(&self) -> Option<std::net::SocketAddr> {
        self.sock.peer_addr()
    }

    fn push_pdu(&mut self, pdu: &Pdu) {
        if pdu.ahs.is_empty() && pdu.data.is_empty() {
            // Header only (a SCSI Response without sense, an R2T, a NOP-In): inline.
            match pdu.header_bytes() {
                Ok(h) => return self.push_header_bytes(&h),
                Err(e) => return log::error!("cannot encode PDU {:?}: {e}", pdu.opcode()),
            }
        }
        let mut v = Vec::with_capacity(pdu.encoded_len(self.digests));
        match pdu.encode(self.digests, &mut v) {
            Ok(()) => self.enqueue(Chunk::Owned(v)),
            Err(e) => log::error!("cannot encode PDU {:?}: {e}", pdu.opcode()),
        }
    }

    /// Header (+ header digest) of a PDU whose data segment is sent from a held buffer.
    fn push_header(&mut self, bhs: &Bhs) {
        self.push_header_bytes(&bhs.to_bytes());
    }

    fn push_header_bytes(&mut self, h: &[u8; BHS_LEN]) {
        let mut b = [0u8; SMALL];
        b[..BHS_LEN].copy_from_slice(h);
        let mut n = BHS_LEN;
        if self.digests.header {
            let crc = crc32c::crc32c(&b[..BHS_LEN]);
            b[BHS_LEN..].copy_from_slice(&crc.to_le_bytes());
            n += 4;
        }
        self.enqueue(Chunk::small(&b[..n]));
    }

    /// Data segment from held buffer `slot`, with padding and data digest.
    fn push_data(&mut self, slot: u32, off: usize, len: usize) {
        self.held.add_ref(slot);
        self.enqueue(Chunk::Held { slot, off, len });
        let pad = (4 - len % 4) % 4;
        let mut tail = [0u8; 7];
        let mut n = pad;
        if self.digests.data {
            let data = self.held.bytes(slot, off, len);
            let crc = crc32c::crc32c_append(crc32c::crc32c(data), &tail[..pad]);
            tail[pad..pad + 4].copy_from_slice(&crc.to_le_bytes());
            n += 4;
        }
        if n > 0 {
            self.enqueue(Chunk::small(&tail[..n]));
        }
    }

    /// Queues a chunk for sending, counted in the backlog.
    fn enqueue(&mut self, c: Chunk) {
        let (len, budgeted) = c.size();
        self.tx_total += len;
        if !budgeted {
            self.tx_unbudgeted += len;
        }
        self.tx.push_back(c);
    }

    /// The front chunk is sent.
    fn pop_front(&mut self) {
        if let Some(c) = self.tx.pop_front() {
            let (len, budgeted) = c.size();
            self.tx_total -= len.min(self.tx_total);
            if !budgeted {
                self.tx_unbudgeted -= len.min(self.tx_unbudgeted);
            }
            if let Chunk::Held { slot, .. } = c {
                self.held.release(slot);
            }
        }
        self.tx_pos = 0;
    }

    fn clear_tx(&mut self) {
        self.tx.clear();
        self.held.clear();
        self.tx_pos = 0;
        self.tx_unbudgeted = 0;
        self.tx_total = 0;
    }

    /// Whether receiving waits for the initiator to take what is queued for it (its send
    /// queue is over [`TxLimit`]); while it waits the socket leaves the reactor's wake set
    /// (data waiting in it would end every sleep) and comes back once receiving goes on.
    fn rx_must_wait(&mut self) -> bool {
        let over = self.tx_limit.exceeded_by(&self.tx_backlog());
        if over != self.rx_paused {
            self.rx_paused = over;
            let b = self.tx_backlog();
            if over {
                // Said once per connection at info (a peer reading slowly would make it
                // come and go), then at debug.
                let level = if self.rx_pauses == 0 { log::Level::Info } else { log::Level::Debug };
                self.rx_pauses = self.rx_pauses.saturating_add(1);
                log::log!(
                    level,
                    "connection {:?}: {} bytes queued for sending ({} outside I/O buffers, limit {}): receiving waits until the initiator reads",
                    self.peer(),
                    b.total,
                    b.unbudgeted,
                    self.tx_limit.unbudgeted
                );
            } else {
                log::debug!("connection {:?}: send queue down to {} bytes: receiving goes on", self.peer(), b.total);
            }
        }
        if over {
            if let Wake::In(id) = self.wake {
                riser_reactor::remove_wake_fd(id);
                self.wake = Wake::NotYet;
            }
        } else if matches!(self.wake, Wake::NotYet) {
            self.join_wake_set();
        }
        over
    }

    /// Ends the Get_Data of `itt`: its buffer; its list of R2Ts is kept for the next one
    /// (no allocation per write).
    fn end_solicit(&mut self, itt: Itt) -> Option<IoBuf> {
        let mut s = self.solicits.remove(&itt)?;
        if self.spare_r2ts.len() < MAX_SPARE_R2T_LISTS {
            s.r2ts.clear();
            self.spare_r2ts.push(std::mem::take(&mut s.r2ts));
        }
        Some(s.buf)
    }

    /// Forgets the DataSN and R2TSN kept between the pieces of task `itt` (nothing to do, and
    /// no hashing, when no task is in pieces).
    fn forget_pieces(&mut self, itt: Itt) {
        if !self.streams.is_empty() {
            self.streams.remove(&itt);
        }
        if !self.r2t_sns.is_empty() {
            self.r2t_sns.remove(&itt);
        }
    }

    /// Issues R2Ts for `itt` while MaxOutstandingR2T allows.
    fn issue_r2ts(&mut self, itt: Itt) {
        let max_out = self.params.max_outstanding_r2t.max(1) as usize;
        let burst = self.params.max_burst_length.max(512);
        loop {
            let Some(s) = self.solicits.get_mut(&itt) else { return };
            if s.r2ts.len() >= max_out || s.next_offset >= s.end {
                return;
            }
            {
                let len = (s.end - s.next_offset).min(burst);
                // TTTs are unique per connection; 0xffffffff is reserved.
                self.next_ttt = self.next_ttt.wrapping_add(1);
                if self.next_ttt == u32::MAX {
                    self.next_ttt = 1;
                }
                let ttt = Ttt(self.next_ttt);
                let r2t = Pdu::new(Op::R2t(R2t {
                    lun: s.lun,
                    itt,
                    ttt,
                    stat_sn: s.sn.stat_sn,
                    exp_cmd_sn: s.sn.exp_cmd_sn,
                    max_cmd_sn: s.sn.max_cmd_sn,
                    r2t_sn: s.r2t_sn,
                    buffer_offset: s.next_offset,
                    desired_data_transfer_length: len,
                }));
                log::trace!("R2T itt {:#x} ttt {:#x} offset {} len {len}", itt.0, ttt.0, s.next_offset);
                s.r2ts.push(R2tState { ttt, offset: s.next_offset, len, received: 0, next_data_sn: Sn(0) });
                s.r2t_sn = s.r2t_sn.next();
                s.next_offset += len;
                // Header only: queued inline, nothing allocated.
                self.push_pdu(&r2t);
            }
        }
    }

    /// A solicited Data-Out: check it against its R2T, copy it into the task's buffer
    /// (unless the framer already `placed` it there, see [`place_solicited`]).
    fn on_solicited_data(&mut self, pdu: Pdu, placed: bool, events: &mut Vec<DmEvent>) {
        let Op::DataOut(d) = pdu.op().clone() else { return };
        let itt = d.itt;
        let Some(s) = self.solicits.get_mut(&itt) else {
            // Unknown task (aborted or failed): let the iSCSI layer decide.
            events.push(DmEvent::Control(pdu));
            return;
        };
        let len = if placed { pdu.bhs.data_segment_length } else { pdu.data.len() as u32 };
        log::trace!("Data-Out itt {:#x} ttt {:#x} DataSN {} offset {} len {len} F {}", itt.0, d.ttt.0, d.data_sn.get(), d.buffer_offset, d.final_bit);
        let Some(ri) = s.r2ts.iter().position(|r| r.ttt == d.ttt) else {
            events.push(DmEvent::Reject { header: pdu.bhs.to_bytes(), reason: RejectReason::InvalidPduField });
            return;
        };
        let r = &mut s.r2ts[ri];
        // DataPDUInOrder=Yes (riser's answer): each PDU continues where the last ended.
        if !r.continues(&d, len) {
            let reason = if d.data_sn != r.next_data_sn { "DataSN out of order" } else { "bad buffer offset" };
            if let Some(buf) = self.end_solicit(itt) {
                events.push(DmEvent::DataFailed { itt, buf, reason });
            }
            return;
        }
        // In order within the R2T, so at or past the Get_Data's offset, itself at or past `base`.
        let off = d.buffer_offset.saturating_sub(s.base) as usize;
        if !placed {
            if let Some(dst) = s.buf.as_mut_slice().get_mut(off..off + len as usize) {
                dst.copy_from_slice(&pdu.data);
                self.copies.solicited_bytes += len as u64;
            }
            self.framer.recycle(pdu.data);
        }
        r.received += len;
        r.next_data_sn = r.next_data_sn.next();
        s.remaining -= len.min(s.remaining);
        let burst_done = r.received == r.len;
        if burst_done {
            s.r2ts.swap_remove(ri);
        } else if d.final_bit {
            // F before the burst is complete: the initiator gave up on this R2T.
            if let Some(buf) = self.end_solicit(itt) {
                events.push(DmEvent::DataFailed { itt, buf, reason: "Data-Out sequence ended early" });
            }
            return;
        }
        if s.remaining == 0 {
            // A write fetched in pieces: its next Get_Data goes on with this R2TSN.
            let next_r2t_sn = s.more.then_some(s.r2t_sn);
            if let Some(buf) = self.end_solicit(itt) {
                if let Some(sn) = next_r2t_sn {
                    self.r2t_sns.insert(itt, sn);
                }
                events.push(DmEvent::DataReady { itt, buf });
            }
        } else if burst_done {
            self.issue_r2ts(itt);
        }
    }

    /// Reads what the socket has, up to `budget` bytes; returns the bytes read and whether
    /// it stopped early because a segment received in place is complete (the caller
    /// delivers, then reads on).
    fn read_socket(&mut self, events: &mut Vec<DmEvent>, budget: &mut usize) -> (usize, bool) {
        let mut total = 0;
        while total < *budget {
            // A solicited Data-Out segment still to come goes straight into its task's
            // buffer; everything else into the framer's buffer.
            let read = match self.framer.segment_ahead() {
                Some((bhs, dsl)) => {
                    let dst = match solicited_slice(&mut self.solicits, &bhs, dsl) {
                        Some(dst) => Some(dst),
                        None => immediate_slice(&mut self.placed, self.write_bufs.as_ref(), &bhs, dsl),
                    };
                    self.framer.read_routed(&mut self.sock, READ_CHUNK, dst)
                }
                None => self.framer.read_from(&mut self.sock, READ_CHUNK),
            };
            match read {
                Ok(0) => {
                    self.leave_wake_set();
                    self.dead = true;
                    events.push(DmEvent::Terminated("connection closed by the initiator".into()));
                    break;
                }
                Ok(n) => {
                    total += n;
                    if self.framer.segment_done() {
                        *budget -= total.min(*budget);
                        return (total, true);
                    }
                    if n < READ_CHUNK {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.leave_wake_set();
                    self.dead = true;
                    events.push(DmEvent::Terminated(format!("receive failed: {e}")));
                    break;
                }
            }
        }
        *budget -= total.min(*budget);
        (total, false)
    }

    fn deliver(&mut self, events: &mut Vec<DmEvent>) -> usize {
        let mut n = 0;
        loop {
            // Solicited data that continues its R2T's sequence, and the immediate data of a
            // write partly immediate whose buffer the budget grants now, are copied from the
            // framer's buffer straight into the task's buffer; anything else (an error to
            // report, a control PDU) comes as a PDU with its segment.
            let (solicits, placed_imm, wb) = (&mut self.solicits, &mut self.placed, self.write_bufs.as_ref());
            let next = self
                .framer
                .next_pdu_routed(|bhs, data| place_solicited(solicits, bhs, data) || place_immediate(placed_imm, wb, bhs, data));
            match next {
                Ok(Some((pdu, placed))) => {
                    n += 1;
                    // One copy out of the framer's buffer, into a segment or into a task's
                    // buffer (counted by the framer; what the kernel read straight into the
                    // task's buffer is not a copy of riser's).
                    let copied = self.framer.take_copied() + pdu.data.len() as u64;
                    let placed_buf = self.placed.take();
                    match pdu.op() {
                        Op::DataOut(d) if !d.ttt.is_reserved() => self.copies.solicited_bytes += copied,
                        Op::DataOut(_) | Op::ScsiCommand(_) => self.copies.unsolicited_bytes += copied,
                        _ => {}
                    }
                    match (pdu.op(), placed_buf) {
                        (Op::DataOut(d), _) if !d.ttt.is_reserved() => self.on_solicited_data(pdu, placed, events),
                        (Op::ScsiCommand(c), Some((itt, buf))) if placed && itt == c.itt => {
                            events.push(DmEvent::Command { pdu, buf })
                        }
                        (Op::ScsiCommand(_), _) if placed => {
                            // Not reached: a command is placed only with its buffer.
                            log::error!("connection {:?}: immediate data placed without a buffer", self.peer());
                            events.push(DmEvent::Reject { header: pdu.bhs.to_bytes(), reason: RejectReason::ProtocolError });
                        }
                        _ => events.push(DmEvent::Control(pdu)),
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    n += 1;
                    // A buffer placed for the PDU that failed goes back.
                    self.placed = None;
                    let header = e.header().copied();
                    match e.action() {
                        ErrorAction::RejectAndContinue(reason) => {
                            log::warn!("connection {:?}: {e}", self.peer());
                            if let Some(h) = header {
                                // A digest error on solicited data fails that task too.
                                if let Ok(bhs) = Bhs::parse(&h) {
                                    if let Op::DataOut(d) = &bhs.op {
                                        if let Some(buf) = self.end_solicit(d.itt) {
                                            events.push(DmEvent::DataFailed { itt: d.itt, buf, reason: "data digest error" });
                                        }
                                    }
                                }
                                events.push(DmEvent::Reject { header: h, reason });
                            }
                        }
                        ErrorAction::RejectAndDrop(reason) => {
                            if let Some(h) = header {
                                events.push(DmEvent::Reject { header: h, reason });
                            }
                            self.leave_wake_set();
                            self.dead = true;
                            events.push(DmEvent::Terminated(format!("protocol error: {e}")));
                            break;
                        }
                        ErrorAction::Drop => {
                            self.leave_wake_set();
                            self.dead = true;
                            events.push(DmEvent::Terminated(format!("protocol error: {e}")));
                            break;
                        }
                    }
                }
            }
        }
        n
    }

    fn write_socket(&mut self, events: &mut Vec<DmEvent>) -> usize {
        let mut written = 0;
        while !self.tx.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut n_iov = 0;
            for (i, c) in self.tx.iter().take(MAX_IOV).enumerate() {
                let b = chunk_bytes(c, &self.held);
                let b = if i == 0 { b.get(self.tx_pos..).unwrap_or_default() } else { b };
                if !b.is_empty() {
                    iov[n_iov] = IoSlice::new(b);
                    n_iov += 1;
                }
            }
            if n_iov == 0 {
                self.clear_tx();
                break;
            }
            match self.sock.write_vectored(&iov[..n_iov]) {
                Ok(0) => break,
                Ok(mut n) => {
                    written += n;
                    self.tx_sent += n as u64;
                    while n > 0 {
                        let Some(front) = self.tx.front() else { break };
                        let left = chunk_bytes(front, &self.held).len() - self.tx_pos;
                        if n >= left {
                            n -= left;
                            self.pop_front();
                        } else {
                            self.tx_pos += n;
                            n = 0;
                        }
                    }
                    // Drop any empty chunks at the front.
                    while self.tx.front().map_or(false, |c| chunk_bytes(c, &self.held).len() == self.tx_pos) {
                        self.pop_front();
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    if !self.dead {
                        self.leave_wake_set();
                        self.dead = true;
                        events.push(DmEvent::Terminated(format!("send failed: {e}")));
                    }
                    self.clear_tx();
                    break;
                }
            }
        }
        written
    }
}

/// Where a solicited Data-Out's segment of `len` bytes belongs in its task's buffer, if it
/// is exactly the next piece of one of the task's outstanding R2Ts (the checks
/// [`TcpDatamover::on_solicited_data`] makes, so anything it would refuse stays out of the
/// buffer).
fn solicited_slice<'a>(solicits: &'a mut TagMap<Itt, Solicit>, bhs: &Bhs, len: usize) -> Option<&'a mut [u8]> {
    let Op::DataOut(d) = &bhs.op else { return None };
    if d.ttt.is_reserved() {
        return None;
    }
    let s = solicits.get_mut(&d.itt)?;
    let r = s.r2ts.iter().find(|r| r.ttt == d.ttt)?;
    if !r.continues(d, u32::try_from(len).ok()?) {
        return None;
    }
    let off = d.buffer_offset.checked_sub(s.base)? as usize;
    s.buf.as_mut_slice().get_mut(off..off.checked_add(len)?)
}

/// Where a SCSI Command's immediate data of `len` bytes goes: the start of the task's write
/// buffer, taken from the budget now ([`WriteBuffers::take_now`]) when the write is partly
/// immediate and the budget has room, and kept in `placed` until the PDU is delivered.
fn immediate_slice<'a>(placed: &'a mut Option<(Itt, IoBuf)>, wb: Option<&WriteBuffers>, bhs: &Bhs, len: usize) -> Option<&'a mut [u8]> {
    let (edtl, imm) = wb?.wants(bhs)?;
    let Op::ScsiCommand(c) = &bhs.op else { return None };
    if imm as usize != len {
        return None;
    }
    // Read straight from the socket in several pieces: the buffer taken for the first.
    let have = matches!(placed, Some((itt, b)) if *itt == c.itt && b.len() == edtl as usize);
    if !have {
        *placed = None;
        *placed = Some((c.itt, wb?.take_now(edtl)?));
    }
    placed.as_mut().and_then(|(_, b)| b.as_mut_slice().get_mut(..len))
}

/// Copies a SCSI Command's immediate data into its task's write buffer if the budget has
/// room for the buffer now ([`immediate_slice`]); true if it did.
fn place_immediate(placed: &mut Option<(Itt, IoBuf)>, wb: Option<&WriteBuffers>, bhs: &Bhs, data: &[u8]) -> bool {
    match immediate_slice(placed, wb, bhs, data.len()) {
        Some(dst) => {
            dst.copy_from_slice(data);
            true
        }
        None => false,
    }
}

/// Copies a solicited Data-Out's segment into its task's buffer if it belongs there
/// ([`solicited_slice`]); true if it did.
fn place_solicited(solicits: &mut TagMap<Itt, Solicit>, bhs: &Bhs, data: &[u8]) -> bool {
    match solicited_slice(solicits, bhs, data.len()) {
        Some(dst) => {
            dst.copy_from_slice(data);
            true
        }
        None => false,
    }
}

impl<S: ByteStream> Datamover for TcpDatamover<S> {
    fn send_control(&mut self, pdu: Pdu) {
        if let Op::ScsiResponse(r) = pdu.op() {
            // The task is over (a write that failed between two Get_Data, say): what its
            // pieces kept must not carry over to a later task with its ITT.
            self.forget_pieces(r.itt);
        }
        self.push_pdu(&pdu);
    }

    fn put_data(&mut self, req: PutData) {
        let PutData { itt, lun, buf, len, offset, response, sn } = req;
        let len = (len as usize).min(buf.as_slice().len());
        let seg = self.params.initiator_max_recv_data_segment_length.max(512) as usize;
        let burst = self.params.max_burst_length.max(512) as usize;
        // A piece after the first continues its task's DataSN; a read sent whole (or a
        // first piece) starts at 0 without touching the map.
        let mut data_sn = if offset == 0 || self.streams.is_empty() { Sn(0) } else { self.streams.get(&itt).copied().unwrap_or(Sn(0)) };
        let resp = match &response {
            Some(r) => match &r.bhs.op {
                Op::ScsiResponse(resp) => Some(resp),
                _ => {
                    // Not a SCSI Response (not how the iSCSI layer asks): no data goes out.
                    self.streams.remove(&itt);
                    self.push_pdu(r);
                    return;
                }
            },
            None => None,
        };
        // Phase collapse: a status without sense rides in the task's last Data-In.
        let collapse = response.as_ref().is_some_and(|r| r.data.is_empty());
        // Held while chunks point into it; a piece without data never is.
        let slot = if len > 0 { self.held.hold(buf) } else { 0 };
        let mut off = 0usize;
        while off < len {
            // Bursts (Data-In sequences) are cut on the command's buffer offset.
            let abs = offset as usize + off;
            let n = (len - off).min(seg).min(burst - abs % burst);
            let last = off + n == len;
            let end_of_burst = (abs + n).is_multiple_of(burst) || (last && resp.is_some());
            let status = resp.filter(|_| last && collapse);
            let di = DataIn {
                final_bit: end_of_burst,
                acknowledge: false,
                residual_overflow: status.is_some_and(|r| r.residual_overflow),
                residual_underflow: status.is_some_and(|r| r.residual_underflow),
                status_present: status.is_some(),
                status: status.map_or(0, |r| r.status),
                lun,
                itt,
                ttt: Ttt::RESERVED,
                stat_sn: status.map_or(sn.stat_sn, |r| r.stat_sn),
                exp_cmd_sn: sn.exp_cmd_sn,
                max_cmd_sn: sn.max_cmd_sn,
                data_sn,
                buffer_offset: abs as u32,
                residual_count: status.map_or(0, |r| r.residual_count),
            };
            let bhs = Bhs { total_ahs_length: 0, data_segment_length: n as u32, op: Op::DataIn(di) };
            self.push_header(&bhs);
            self.push_data(slot, off, n);
            data_sn = data_sn.next();
            off += n;
        }
        let Some(mut response) = response else {
            // More pieces follow: they continue this DataSN.
            self.streams.insert(itt, data_sn);
            return;
        };
        if !self.streams.is_empty() {
            self.streams.remove(&itt);
        }
        if !collapse || len == 0 {
            if let Op::ScsiResponse(r) = &mut response.bhs.op {
                // The task's Data-In count (RFC 7143 §11.4.8).
                r.exp_data_sn = data_sn;
            }
            self.push_pdu(&response);
        }
    }

    fn get_data(&mut self, req: GetData) {
        let GetData { itt, lun, buf, offset, len, base, more, sn } = req;
        // The task's R2TSN goes on from its previous Get_Data if that one said more follow.
        let r2t_sn = self.r2t_sns.remove(&itt).unwrap_or(Sn(0));
        let end = offset.checked_add(len);
        let fits = offset.checked_sub(base).zip(end).is_some_and(|(at, _)| at as usize + len as usize <= buf.as_slice().len());
        let (Some(end), true) = (end, fits) else {
            log::warn!("Get_Data of task {:#x}: [{offset}, +{len}) outside its buffer (base {base}, {} bytes)", itt.0, buf.as_slice().len());
            self.settled.push_back((itt, buf, Some("solicited data outside the task's buffer")));
            return;
        };
        if len == 0 {
            if more {
                self.r2t_sns.insert(itt, r2t_sn);
            }
            self.settled.push_back((itt, buf, None));
            return;
        }
        let r2ts = self.spare_r2ts.pop().unwrap_or_default();
        self.solicits.insert(itt, Solicit { lun, buf, base, more, next_offset: offset, end, remaining: len, r2t_sn, r2ts, sn });
        self.issue_r2ts(itt);
    }

    fn notice_key_values(&mut self, params: DatamoverParams) {
        self.params = params;
        self.digests = Digests { header: params.header_digest, data: params.data_digest };
        self.framer.set_digests(self.digests);
        self.framer.set_limits(FramerLimits {
            max_recv_data_segment_length: params.target_max_recv_data_segment_length as usize,
            max_ahs_length: MAX_AHS_LENGTH,
        });
    }

    fn deallocate_task_resources(&mut self, itt: Itt) -> Option<IoBuf> {
        self.forget_pieces(itt);
        let buf = self.end_solicit(itt);
        let settled = crate::take_settled(&mut self.settled, itt);
        buf.or(settled)
    }

    fn connection_terminate(&mut self) {
        self.terminating = true;
    }

    fn poll(&mut self, events: &mut Vec<DmEvent>) -> usize {
        let mut work = 0;
        while let Some((itt, buf, failed)) = self.settled.pop_front() {
            events.push(match failed {
                Some(reason) => DmEvent::DataFailed { itt, buf, reason },
                None => DmEvent::DataReady { itt, buf },
            });
            work += 1;
        }
        if !self.dead && !self.terminating && !self.rx_must_wait() {
            let mut budget = MAX_READ_PER_POLL;
            loop {
                let (n, more) = self.read_socket(events, &mut budget);
                work += n + self.deliver(events);
                if !more || self.dead {
                    break;
                }
            }
        }
        work + self.flush(events)
    }

    fn flush(&mut self, events: &mut Vec<DmEvent>) -> usize {
        let mut work = 0;
        if !self.tx.is_empty() {
            work += self.write_socket(events);
        }
        if self.terminating && self.tx.is_empty() && !self.dead {
            self.sock.shutdown();
            self.leave_wake_set();
            self.dead = true;
            events.push(DmEvent::Terminated("connection closed".into()));
            work += 1;
        }
        work
    }

    fn set_write_buffers(&mut self, wb: WriteBuffers) {
        self.write_bufs = Some(wb);
    }

    fn copies(&self) -> CopyStats {
        self.copies
    }

    fn recycle(&mut self, segment: Vec<u8>) {
        self.framer.recycle(segment);
    }

    fn idle(&self) -> bool {
        self.tx.is_empty()
    }

    fn tx_backlog(&self) -> TxBacklog {
        TxBacklog { unbudgeted: self.tx_unbudgeted, total: self.tx_total, sent: self.tx_sent }
    }

    fn limit_tx_queue(&mut self, limit: TxLimit) {
        self.tx_limit = limit;
    }
}

impl<S: ByteStream> Drop for TcpDatamover<S> {
    fn drop(&mut self) {
        self.leave_wake_set();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_iscsi::pdu::ScsiResponse;
    use riser_iscsi::testing::{data_out, scsi_response};
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    fn pair() -> (TcpDatamover, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (TcpDatamover::new(s, &[]).unwrap(), c)
    }

    fn read_pdus(c: &mut TcpStream, framer: &mut Framer, n: usize) -> Vec<Pdu> {
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        while out.len() < n {
            if let Some(p) = framer.next_pdu().unwrap() {
                out.push(p);
                continue;
            }
            let k = c.read(&mut buf).unwrap();
            assert!(k > 0, "closed early");
            framer.feed(&buf[..k]);
        }
        out
    }

    fn response(status: u8, sense: bool) -> Pdu {
        let sn = SnState { stat_sn: Sn(77), exp_cmd_sn: Sn(3), max_cmd_sn: Sn(9) };
        Pdu::with_data(
            Op::ScsiResponse(ScsiResponse { residual_underflow: true, residual_count: 512, ..scsi_response(Itt(5), status, sn) }),
            if sense { vec![0, 2, 0x70, 0] } else { Vec::new() },
        )
    }

    #[test]
    fn put_data_cuts_data_in_and_folds_good_status() {
        let (mut dm, mut c) = pair();
        dm.notice_key_values(DatamoverParams { initiator_max_recv_data_segment_length: 4096, data_digest: true, header_digest: true, ..Default::default() });
        let data: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
        dm.put_data(PutData { itt: Itt(5), lun: Lun(0), buf: riser_bdev::IoBuf::from(data.clone()), len: 10000, offset: 0, response: Some(response(0, false)), sn: SnState::default() });
        let mut ev = Vec::new();
        while !dm.idle() {
            dm.poll(&mut ev);
        }
        let mut f = Framer::with_limits(FramerLimits { max_recv_data_segment_length: 8192, max_ahs_length: 1020 });
        f.set_digests(Digests { header: true, data: true });
        let pdus = read_pdus(&mut c, &mut f, 3);
        let mut got = Vec::new();
        for (i, p) in pdus.iter().enumerate() {
            let Op::DataIn(d) = &p.bhs.op else { panic!("expected Data-In") };
            assert_eq!(d.data_sn, Sn(i as u32));
            assert_eq!(d.buffer_offset as usize, got.len());
            assert_eq!(d.status_present, i == 2, "status only in the last Data-In");
            got.extend_from_slice(&p.data);
        }
        let Op::DataIn(last) = &pdus[2].bhs.op else { unreachable!() };
        assert!(last.final_bit && last.residual_underflow && last.residual_count == 512 && last.stat_sn == Sn(77));
        assert_eq!(got, data);
        // With sense data the response travels separately, after the data.
        dm.put_data(PutData { itt: Itt(5), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![1u8; 100]), len: 100, offset: 0, response: Some(response(2, true)), sn: SnState::default() });
        while !dm.idle() {
            dm.poll(&mut ev);
        }
        let pdus = read_pdus(&mut c, &mut f, 2);
        assert!(matches!(&pdus[0].bhs.op, Op::DataIn(d) if !d.status_present));
        assert!(matches!(&pdus[1].bhs.op, Op::ScsiResponse(r) if r.status == 2 && r.exp_data_sn == Sn(1)));
        assert_eq!(dm.copies().read_bytes, 0, "read data goes out from the task's buffer");
    }

    #[test]
    fn get_data_solicits_with_r2t_and_fails_bad_datasn() {
        let (mut dm, mut c) = pair();
        dm.notice_key_values(DatamoverParams { max_burst_length: 4096, max_outstanding_r2t: 1, target_max_recv_data_segment_length: 8192, ..Default::default() });
        dm.get_data(GetData { itt: Itt(9), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; 8192]), offset: 0, len: 8192, base: 0, more: false, sn: SnState::default() });
        let mut ev = Vec::new();
        let mut f = Framer::new();
        let answer = |c: &mut TcpStream, ttt: Ttt, sn: u32, off: u32, fill: u8| {
            let p = Pdu::with_data(
                Op::DataOut(data_out(Itt(9), ttt, Sn(sn), off)),
                vec![fill; 4096],
            );
            c.write_all(&p.to_bytes(Digests::default()).unwrap()).unwrap();
        };
        for (burst, fill) in [(0u32, 1u8), (4096, 2)] {
            while !dm.idle() {
                dm.poll(&mut ev);
            }
            let r2t = read_pdus(&mut c, &mut f, 1).remove(0);
            let Op::R2t(r) = r2t.bhs.op else { panic!("expected R2T") };
            assert_eq!((r.buffer_offset, r.desired_data_transfer_length), (burst, 4096), "one burst at a time");
            answer(&mut c, r.ttt, 0, burst, fill);
            if burst == 0 {
                // Poll until the next R2T is on the wire.
                c.set_nonblocking(true).unwrap();
                let t0 = Instant::now();
                while c.peek(&mut [0u8; 1]).is_err() && t0.elapsed() < Duration::from_secs(5) {
                    dm.poll(&mut ev);
                }
                c.set_nonblocking(false).unwrap();
            }
        }
        let t0 = Instant::now();
        while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) && t0.elapsed() < Duration::from_secs(5) {
            dm.poll(&mut ev);
        }
        let Some(DmEvent::DataReady { itt, buf }) = std::mem::take(&mut ev).into_iter().find(|e| matches!(e, DmEvent::DataReady { .. })) else { panic!("no DataReady") };
        assert_eq!(itt, Itt(9));
        assert!(buf.as_slice()[..4096].iter().all(|&b| b == 1) && buf.as_slice()[4096..].iter().all(|&b| b == 2));
        // One copy: from the framer's buffer (where the socket's bytes land) into the task's.
        assert_eq!(dm.copies(), CopyStats { solicited_bytes: 8192, ..Default::default() });

        // A Data-Out with the wrong DataSN fails the task, not the connection.
        dm.get_data(GetData { itt: Itt(10), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; 4096]), offset: 0, len: 4096, base: 0, more: false, sn: SnState::default() });
        while !dm.idle() {
            dm.poll(&mut ev);
        }
        let r2t = read_pdus(&mut c, &mut f, 1).remove(0);
        let Op::R2t(r) = r2t.bhs.op else { panic!("expected R2T") };
        let p = Pdu::with_data(
            Op::DataOut(data_out(Itt(10), r.ttt, Sn(5), 0)),
            vec![0u8; 4096],
        );
        c.write_all(&p.to_bytes(Digests::default()).unwrap()).unwrap();
        let mut ev = Vec::new();
        let t0 = Instant::now();
        while ev.is_empty() && t0.elapsed() < Duration::from_secs(5) {
            dm.poll(&mut ev);
        }
        assert!(matches!(ev.as_slice(), [DmEvent::DataFailed { itt: Itt(10), .. }]));
    }

    /// An initiator that sends and does not read: once more than the limit is queued for
    /// it outside the I/O buffers, the datamover stops reading its PDUs (they wait in the
    /// socket, which leaves the reactor's wake set), and reads them again once the
    /// initiator has taken enough; the backlog counts what is queued and what was sent.
    #[test]
    fn receiving_waits_while_the_send_queue_is_over_its_limit_and_resumes_when_drained() {
        use riser_iscsi::pdu::NopIn;
        use riser_iscsi::testing::nop_out;
        let (mut dm, mut c) = pair();
        let limit = TxLimit::new(1 << 20);
        dm.limit_tx_queue(limit);
        let mut ev = Vec::new();
        let ping = |c: &mut TcpStream, itt: u32| {
            let p = Pdu::new(Op::NopOut(nop_out(Itt(itt), Sn(itt))));
            c.write_all(&p.to_bytes(Digests::default()).unwrap()).unwrap();
        };
        let wait_ping = |dm: &mut TcpDatamover, ev: &mut Vec<DmEvent>, within: Duration| {
            let t0 = Instant::now();
            while t0.elapsed() < within {
                dm.poll(ev);
                if let Some(i) = ev.iter().position(|e| matches!(e, DmEvent::Control(_))) {
                    let DmEvent::Control(p) = ev.remove(i) else { unreachable!() };
                    return Some(p);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            None
        };
        // Under the limit: read at once.
        ping(&mut c, 1);
        assert!(wait_ping(&mut dm, &mut ev, Duration::from_secs(5)).is_some(), "a ping is read while the queue is empty");

        // 32 MiB of NOP-In echoes (outside the I/O buffers): more than the socket buffers
        // take, so the queue stays over the limit while the initiator does not read.
        let echo = || {
            Pdu::with_data(
                Op::NopIn(NopIn { lun: Lun(0), itt: Itt(1), ttt: Ttt::RESERVED, stat_sn: Sn(0), exp_cmd_sn: Sn(0), max_cmd_sn: Sn(0) }),
                vec![7u8; 1 << 20],
            )
        };
        let pdu_len = (BHS_LEN + (1 << 20)) as u64;
        for _ in 0..32 {
            dm.send_control(echo());
        }
        let b = dm.tx_backlog();
        assert_eq!((b.total as u64, b.unbudgeted as u64, b.sent), (32 * pdu_len, 32 * pdu_len, 0));
        ping(&mut c, 2);
        assert!(wait_ping(&mut dm, &mut ev, Duration::from_millis(300)).is_none(), "receiving waits while the queue is over the limit");
        let b = dm.tx_backlog();
        // (A chunk partly written counts whole until it is all out.)
        let accounted = b.sent + b.total as u64;
        assert!(limit.exceeded_by(&b) && b.sent > 0 && accounted >= 32 * pdu_len && accounted < 33 * pdu_len, "{b:?}");
        assert!(dm.rx_paused && !matches!(dm.wake, Wake::In(_)));

        // The initiator reads everything: the queue drains and the ping is read.
        let mut reader = c.try_clone().unwrap();
        let drain = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0u64;
            while got < 32 * pdu_len {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n as u64,
                }
            }
            got
        });
        let p = wait_ping(&mut dm, &mut ev, Duration::from_secs(10)).expect("receiving goes on once the queue drains");
        assert!(matches!(p.bhs.op, Op::NopOut(n) if n.itt == Itt(2)));
        assert!(!dm.rx_paused);
        let t0 = Instant::now();
        while !dm.idle() && t0.elapsed() < Duration::from_secs(10) {
            dm.poll(&mut ev);
        }
        assert_eq!(drain.join().unwrap(), 32 * pdu_len);
        assert_eq!(dm.tx_backlog(), TxBacklog { unbudgeted: 0, total: 0, sent: 32 * pdu_len });

        // Read data in held buffers counts in the total only.
        dm.put_data(PutData { itt: Itt(5), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![1u8; 8192]), len: 8192, offset: 0, response: Some(response(0, false)), sn: SnState::default() });
        let b = dm.tx_backlog();
        assert_eq!((b.total - b.unbudgeted, b.unbudgeted), (8192, BHS_LEN), "{b:?}");
    }

    /// Polls the datamover until the initiator's end has a whole PDU, and returns it.
    fn next_pdu(dm: &mut TcpDatamover, c: &mut TcpStream, f: &mut Framer, ev: &mut Vec<DmEvent>) -> Pdu {
        TcpStream::set_nonblocking(c, true).unwrap();
        let t0 = Instant::now();
        let mut buf = [0u8; 65536];
        loop {
            if let Some(p) = f.next_pdu().unwrap() {
                TcpStream::set_nonblocking(c, false).unwrap();
                return p;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "no PDU from the target");
            dm.poll(ev);
            match c.read(&mut buf) {
                Ok(0) => panic!("closed early"),
                Ok(n) => f.feed(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Polls until an event about Get_Data comes (DataReady or DataFailed), and returns it.
    fn data_event(dm: &mut TcpDatamover, ev: &mut Vec<DmEvent>) -> DmEvent {
        let t0 = Instant::now();
        loop {
            if let Some(i) = ev.iter().position(|e| matches!(e, DmEvent::DataReady { .. } | DmEvent::DataFailed { .. })) {
                return ev.remove(i);
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "no DataReady / DataFailed");
            dm.poll(ev);
        }
    }

    /// `data[range]` as one piece of a streamed read (its own buffer, as the SCSI layer
    /// gives each piece).
    fn piece(data: &[u8], from: usize, to: usize, response: Option<Pdu>) -> PutData {
        let buf = riser_bdev::IoBuf::from(data[from..to].to_vec());
        PutData { itt: Itt(5), lun: Lun(0), buf, len: (to - from) as u32, offset: from as u32, response, sn: SnState::default() }
    }

    /// Checks the Data-In of one task against the rules of RFC 7143 §11.7 for a read of
    /// `total` bytes with MaxRecvDataSegmentLength `seg` and MaxBurstLength `burst`: DataSN
    /// 0, 1, ...; absolute, contiguous buffer offsets; no PDU across a burst boundary; the F
    /// bit exactly at each burst's end and at the very end; status only where `status_last`
    /// says. Returns the data.
    fn check_data_in(pdus: &[Pdu], total: usize, seg: usize, burst: usize, status_last: bool) -> Vec<u8> {
        let mut got = Vec::new();
        for (i, p) in pdus.iter().enumerate() {
            let Op::DataIn(d) = &p.bhs.op else { panic!("expected Data-In, got {:?}", p.opcode()) };
            let (start, n) = (d.buffer_offset as usize, p.data.len());
            let end = start + n;
            assert_eq!(d.data_sn, Sn(i as u32), "DataSN goes on across the pieces");
            assert_eq!(start, got.len(), "BufferOffset absolute and contiguous");
            assert!(n > 0 && n <= seg, "segment of {n} bytes");
            assert_eq!(start / burst, (end - 1) / burst, "Data-In [{start}, {end}) crosses a burst boundary");
            assert_eq!(d.final_bit, end % burst == 0 || end == total, "F bit of Data-In [{start}, {end})");
            let last = i + 1 == pdus.len();
            assert_eq!(d.status_present, last && status_last, "status only in the task's last Data-In");
            assert_eq!(d.itt, Itt(5));
            got.extend_from_slice(&p.data);
        }
        assert_eq!(got.len(), total);
        got
    }

    /// A read streamed in three pieces (10000 + 10000 + 5000 bytes, MaxRecvDataSegmentLength
    /// 4096, MaxBurstLength 8192) goes out as one task's Data-In: DataSN and offsets go on
    /// across the pieces, bursts are cut on the command's offsets, a GOOD status rides in the
    /// last Data-In of the final piece; with sense the response follows with ExpDataSN = the
    /// Data-In count; a final piece of 0 bytes sends the response alone. Each piece's buffer
    /// goes once it is sent.
    #[test]
    fn put_data_in_pieces_continues_data_sn_and_cuts_bursts_on_the_command_offset() {
        let (mut dm, mut c) = pair();
        dm.notice_key_values(DatamoverParams { initiator_max_recv_data_segment_length: 4096, max_burst_length: 8192, ..Default::default() });
        let data: Vec<u8> = (0..25_000u32).map(|i| (i % 251) as u8).collect();
        let mut f = Framer::with_limits(FramerLimits { max_recv_data_segment_length: 8192, max_ahs_length: 1020 });
        let mut ev = Vec::new();

        // GOOD: phase collapse in the last Data-In of the final piece.
        dm.put_data(piece(&data, 0, 10_000, None));
        // The first piece goes out before the next exists, and its buffer goes with it.
        let first: Vec<Pdu> = (0..3).map(|_| next_pdu(&mut dm, &mut c, &mut f, &mut ev)).collect();
        while !dm.idle() {
            dm.poll(&mut ev);
        }
        assert!(dm.held.slots.iter().all(Option::is_none), "the piece's buffer went once sent");
        assert_eq!(dm.streams.get(&Itt(5)), Some(&Sn(3)), "the task's next DataSN is kept");
        dm.put_data(piece(&data, 10_000, 20_000, None));
        dm.put_data(piece(&data, 20_000, 25_000, Some(response(0, false))));
        let mut pdus = first;
        // 0-4096, 4096-8192 F, 8192-10000 | 10000-14096, 14096-16384 F, 16384-20000 |
        // 20000-24096, 24096-24576 F, 24576-25000 F+S.
        pdus.extend((0..6).map(|_| next_pdu(&mut dm, &mut c, &mut f, &mut ev)));
        assert!(check_data_in(&pdus, 25_000, 4096, 8192, true) == data, "the data, in order");
        let Op::DataIn(last) = &pdus[8].bhs.op else { unreachable!() };
        assert!(last.residual_underflow && last.residual_count == 512 && last.stat_sn == Sn(77) && last.status == 0);
        assert!(dm.streams.is_empty(), "the final piece forgets the task");

        // With sense: the status travels in the response, ExpDataSN = the Data-In count.
        dm.put_data(piece(&data, 0, 10_000, None));
        dm.put_data(piece(&data, 10_000, 20_000, None));
        dm.put_data(piece(&data, 20_000, 25_000, Some(response(2, true))));
        let pdus: Vec<Pdu> = (0..10).map(|_| next_pdu(&mut dm, &mut c, &mut f, &mut ev)).collect();
        assert!(check_data_in(&pdus[..9], 25_000, 4096, 8192, false) == data, "the data, in order");
        let Op::ScsiResponse(r) = &pdus[9].bhs.op else { panic!("expected the SCSI Response") };
        assert_eq!((r.status, r.exp_data_sn), (2, Sn(9)));
        assert_eq!(pdus[9].data, vec![0, 2, 0x70, 0], "sense data");

        // A final piece of 0 bytes: the response alone, ExpDataSN = the Data-In sent before.
        dm.put_data(piece(&data, 0, 10_000, None));
        dm.put_data(piece(&data, 10_000, 20_000, None));
        dm.put_data(piece(&data, 20_000, 20_000, Some(response(0, false))));
        let pdus: Vec<Pdu> = (0..7).map(|_| next_pdu(&mut dm, &mut c, &mut f, &mut ev)).collect();
        for (i, p) in pdus[..6].iter().enumerate() {
            let Op::DataIn(d) = &p.bhs.op else { panic!("expected Data-In") };
            assert_eq!(d.data_sn, Sn(i as u32));
            assert!(!d.status_present);
        }
        let Op::ScsiResponse(r) = &pdus[6].bhs.op else { panic!("expected the SCSI Response") };
        assert_eq!((r.status, r.exp_data_sn, r.residual_count), (0, Sn(6), 512));
        assert!(dm.streams.is_empty());

        // Deallocate_Task_Resources drops a streamed read's state: the task's next read (its
        // ITT reused) starts at DataSN 0 even if it came in pieces again from offset 0.
        dm.put_data(piece(&data, 0, 10_000, None));
        assert!(dm.deallocate_task_resources(Itt(5)).is_none(), "TCP holds no buffer of a read");
        assert!(dm.streams.is_empty());
        assert_eq!(dm.copies().read_bytes, 0, "read data goes out from the pieces' buffers");
    }

    /// A write fetched in two Get_Data (more = true, then false), each with its own buffer
    /// (base = its first byte's command offset): R2TSN goes on across them, R2Ts carry the
    /// command's offsets, Data-Out lands at buf[BufferOffset - base]; a fresh task starts at
    /// R2TSN 0; a Data-Out outside the current piece fails the task.
    #[test]
    fn get_data_in_pieces_continues_r2t_sn_and_places_data_at_offset_minus_base() {
        let (mut dm, mut c) = pair();
        dm.notice_key_values(DatamoverParams { max_burst_length: 4096, max_outstanding_r2t: 1, target_max_recv_data_segment_length: 8192, ..Default::default() });
        let mut ev = Vec::new();
        let mut f = Framer::new();
        let send = |c: &mut TcpStream, itt: u32, ttt: Ttt, off: u32, data: Vec<u8>| {
            let p = Pdu::with_data(Op::DataOut(data_out(Itt(itt), ttt, Sn(0), off)), data);
            c.write_all(&p.to_bytes(Digests::default()).unwrap()).unwrap();
        };
        // The command's bytes 8192.. (the first 8 KiB came as immediate data): 24 KiB.
        let cmd: Vec<u8> = (0..32_768u32).map(|i| (i % 239) as u8).collect();
        let mut r2t_sns = Vec::new();
        for (k, (offset, len, more)) in [(8192u32, 8192u32, true), (16_384, 16_384, false)].into_iter().enumerate() {
            let buf = riser_bdev::IoBuf::from(vec![0u8; len as usize]);
            dm.get_data(GetData { itt: Itt(9), lun: Lun(0), buf, offset, len, base: offset, more, sn: SnState::default() });
            let mut burst = offset;
            while burst < offset + len {
                let p = next_pdu(&mut dm, &mut c, &mut f, &mut ev);
                let Op::R2t(r) = p.bhs.op else { panic!("expected R2T") };
                assert_eq!((r.buffer_offset, r.desired_data_transfer_length), (burst, 4096), "R2T at the command's offset");
                r2t_sns.push(r.r2t_sn.get());
                send(&mut c, 9, r.ttt, burst, cmd[burst as usize..burst as usize + 4096].to_vec());
                burst += 4096;
            }
            let DmEvent::DataReady { itt, buf } = data_event(&mut dm, &mut ev) else { panic!("expected DataReady") };
            assert_eq!(itt, Itt(9));
            assert!(buf.as_slice() == &cmd[offset as usize..(offset + len) as usize], "piece {k} at buf[BufferOffset - base]");
            assert_eq!(dm.r2t_sns.get(&Itt(9)).is_some(), more, "R2TSN kept only while more pieces follow");
        }
        assert_eq!(r2t_sns, vec![0, 1, 2, 3, 4, 5], "R2TSN numbers every R2T of the task");

        // The ITT reused by a new write: R2TSN from 0 again.
        dm.get_data(GetData { itt: Itt(9), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; 4096]), offset: 4096, len: 4096, base: 4096, more: true, sn: SnState::default() });
        let Op::R2t(r) = next_pdu(&mut dm, &mut c, &mut f, &mut ev).bhs.op else { panic!("expected R2T") };
        assert_eq!((r.r2t_sn, r.buffer_offset), (Sn(0), 4096));
        // Data-Out for the current R2T but at an offset of an earlier piece: the task fails.
        send(&mut c, 9, r.ttt, 0, vec![1u8; 4096]);
        let DmEvent::DataFailed { itt, buf, reason } = data_event(&mut dm, &mut ev) else { panic!("expected DataFailed") };
        assert_eq!((itt, reason), (Itt(9), "bad buffer offset"));
        assert!(buf.as_slice().iter().all(|&b| b == 0), "nothing of it landed in the buffer");
        assert!(dm.solicits.is_empty());
        assert!(dm.deallocate_task_resources(Itt(9)).is_none());
        assert!(dm.r2t_sns.is_empty(), "Deallocate_Task_Resources forgets the task's R2TSN");

        // A write that ends (its response goes out) between two Get_Data: its R2TSN is
        // forgotten, the next task with its ITT starts at 0.
        let buf = riser_bdev::IoBuf::from(vec![0u8; 4096]);
        dm.get_data(GetData { itt: Itt(12), lun: Lun(0), buf, offset: 0, len: 4096, base: 0, more: true, sn: SnState::default() });
        let Op::R2t(r) = next_pdu(&mut dm, &mut c, &mut f, &mut ev).bhs.op else { panic!("expected R2T") };
        send(&mut c, 12, r.ttt, 0, vec![2u8; 4096]);
        assert!(matches!(data_event(&mut dm, &mut ev), DmEvent::DataReady { itt: Itt(12), .. }));
        assert!(dm.r2t_sns.contains_key(&Itt(12)));
        dm.send_control(Pdu::new(Op::ScsiResponse(scsi_response(Itt(12), 2, SnState::default()))));
        assert!(dm.r2t_sns.is_empty(), "the response ends the task's pieces");
        assert!(matches!(next_pdu(&mut dm, &mut c, &mut f, &mut ev).bhs.op, Op::ScsiResponse(_)));
        let buf = riser_bdev::IoBuf::from(vec![0u8; 4096]);
        dm.get_data(GetData { itt: Itt(12), lun: Lun(0), buf, offset: 0, len: 4096, base: 0, more: false, sn: SnState::default() });
        let Op::R2t(r) = next_pdu(&mut dm, &mut c, &mut f, &mut ev).bhs.op else { panic!("expected R2T") };
        assert_eq!(r.r2t_sn, Sn(0), "a new task's R2TSN starts at 0");
        assert!(dm.deallocate_task_resources(Itt(12)).is_some(), "the Get_Data's buffer comes back");

        // A piece outside its buffer fails at once, without an R2T.
        for (offset, len, base) in [(4096u32, 4096u32, 8192u32), (8192, 8192, 4096)] {
            let buf = riser_bdev::IoBuf::from(vec![0u8; 8192]);
            dm.get_data(GetData { itt: Itt(11), lun: Lun(0), buf, offset, len, base, more: false, sn: SnState::default() });
            let DmEvent::DataFailed { itt, reason, .. } = data_event(&mut dm, &mut ev) else { panic!("expected DataFailed") };
            assert_eq!((itt, reason), (Itt(11), "solicited data outside the task's buffer"));
        }
        assert!(dm.idle(), "no R2T for a piece that does not fit its buffer");
    }
}
