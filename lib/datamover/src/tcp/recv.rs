//! The receive side: reading the socket (solicited data and immediate data straight into
//! the task's buffer where they belong), delivering the framed PDUs as events, and
//! pausing while the initiator does not take what is queued for it.

use std::io::ErrorKind;

use riser_bdev::IoBuf;
use riser_iscsi::ffp::{Datamover, DmEvent, WriteBuffers};
use riser_iscsi::framer::ErrorAction;
use riser_iscsi::pdu::{Bhs, Op, RejectReason};
use riser_iscsi::serial::Itt;

use super::r2t::{place_solicited, solicited_slice};
use super::{ByteStream, TcpDatamover, Wake};

/// Most bytes read from the socket in one poll, so one busy connection cannot starve the
/// others on its reactor.
pub(super) const MAX_READ_PER_POLL: usize = 1 << 20;
/// Room offered to each read from the socket.
const READ_CHUNK: usize = 64 * 1024;

impl<S: ByteStream> TcpDatamover<S> {
    /// Whether receiving waits for the initiator to take what is queued for it (its send
    /// queue is over [`TxLimit`](riser_iscsi::ffp::TxLimit)); while it waits the socket
    /// leaves the reactor's wake set (data waiting in it would end every sleep) and comes
    /// back once receiving goes on.
    pub(super) fn rx_must_wait(&mut self) -> bool {
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

    /// Reads what the socket has, up to `budget` bytes; returns the bytes read and whether
    /// it stopped early because a segment received in place is complete (the caller
    /// delivers, then reads on).
    pub(super) fn read_socket(&mut self, events: &mut Vec<DmEvent>, budget: &mut usize) -> (usize, bool) {
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
                        // Fewer bytes than asked (a read into the framer asks at least
                        // READ_CHUNK; one into a task's segment that did not complete it
                        // got less than the segment's rest): the socket is empty.
                        self.drained();
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.drained();
                    break;
                }
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

    pub(super) fn deliver(&mut self, events: &mut Vec<DmEvent>) -> usize {
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
