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
mod r2t;
mod recv;
mod send;

#[cfg(test)]
mod copy_tests;
#[cfg(test)]
mod ready_tests;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use riser_bdev::IoBuf;
use riser_iscsi::ffp::{CopyStats, Datamover, DatamoverParams, DmEvent, GetData, PutData, TxBacklog, TxLimit, WriteBuffers};
use riser_iscsi::framer::{Framer, FramerLimits};
use riser_iscsi::pdu::{Bhs, DataIn, Digests, Op, Pdu, MAX_AHS_LENGTH};
use riser_iscsi::serial::{Itt, Sn, TagMap, Ttt};

use r2t::{R2tState, Solicit};
use recv::MAX_READ_PER_POLL;
use send::{Chunk, Held};

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

    /// Puts the socket in the wake set of the reactor polling it, whose readiness check at
    /// the start of each pass says whether the socket has anything to read.
    fn join_wake_set(&mut self) {
        self.wake = match self.sock.wake_fd().map(|fd| riser_reactor::add_ready_fd(fd, || {})) {
            Some(Ok(Some(id))) => Wake::In(id),
            Some(Err(e)) => {
                log::warn!("connection socket: cannot wake its reactor ({e}); data waits for the reactor's next pass");
                Wake::Never
            }
            _ => Wake::Never,
        };
    }

    /// Whether reading the socket can find anything this pass: not if it is in the
    /// reactor's wake set and the pass's readiness check found it unreadable (no data, no
    /// EOF, no error). Off a reactor, or not in its set: always (as before the check).
    fn may_read(&self) -> bool {
        match self.wake {
            Wake::In(id) => riser_reactor::fd_readable(id) != Some(false),
            _ => true,
        }
    }

    /// The socket was found empty (a read returned `EAGAIN` or fewer bytes than asked):
    /// the reactor's readiness check reports it unreadable until data comes in again.
    pub(super) fn drained(&self) {
        if let Wake::In(id) = self.wake {
            riser_reactor::fd_drained(id);
        }
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

    fn put_data(&mut self, mut req: PutData) {
        // Used in place (a PutData is large): only the buffer is moved out.
        let (itt, lun, len, offset, sn) = (req.itt, req.lun, req.len, req.offset, req.sn);
        let buf = std::mem::replace(&mut req.buf, IoBuf::empty());
        let len = (len as usize).min(buf.as_slice().len());
        let seg = self.params.initiator_max_recv_data_segment_length.max(512) as usize;
        let burst = self.params.max_burst_length.max(512) as usize;
        // A piece after the first continues its task's DataSN; a read sent whole (or a
        // first piece) starts at 0 without touching the map.
        let mut data_sn = if offset == 0 || self.streams.is_empty() { Sn(0) } else { self.streams.get(&itt).copied().unwrap_or(Sn(0)) };
        let resp = match &req.response {
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
        let collapse = req.response.as_ref().is_some_and(|r| r.data.is_empty());
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
        let Some(response) = req.response.as_mut() else {
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
            self.push_pdu(response);
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
            if !self.may_read() {
                // Nothing in the socket: only what the framer holds already (bytes read
                // while receiving was paused, or with the last login PDU).
                return work + self.deliver(events) + self.flush(events);
            }
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

    fn quiet(&self) -> bool {
        // Only a socket in the reactor's wake set whose readiness check said "nothing":
        // off a reactor, paused or not yet in the set, poll as always.
        matches!(self.wake, Wake::In(_))
            && !self.may_read()
            && self.framer.buffered() == 0
            && self.settled.is_empty()
            && self.tx.is_empty()
            && !self.terminating
            && !self.dead
            && !self.rx_paused
    }
}

impl<S: ByteStream> Drop for TcpDatamover<S> {
    fn drop(&mut self) {
        self.leave_wake_set();
    }
}
