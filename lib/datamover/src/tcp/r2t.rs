//! R2T tracking: the Get_Data in progress of each task, its outstanding R2Ts (RFC 7143
//! §11.8), the R2Ts issued within MaxOutstandingR2T, and the solicited Data-Out checked
//! against them and placed in the task's buffer.

use riser_bdev::IoBuf;
use riser_iscsi::ffp::{DmEvent, SnState};
use riser_iscsi::pdu::{Bhs, DataOut, Lun, Op, Pdu, R2t, RejectReason};
use riser_iscsi::serial::{Itt, Sn, TagMap, Ttt};

use super::{ByteStream, TcpDatamover};

/// One outstanding R2T (RFC 7143 §11.8).
pub(super) struct R2tState {
    ttt: Ttt,
    offset: u32,
    len: u32,
    received: u32,
    next_data_sn: Sn,
}

/// A Get_Data in progress.
pub(super) struct Solicit {
    pub(super) lun: Lun,
    pub(super) buf: IoBuf,
    /// The command's buffer offset of `buf[0]`.
    pub(super) base: u32,
    /// More Get_Data of the task follow this one: its R2TSN is kept when it completes.
    pub(super) more: bool,
    /// Next byte to ask for, and the end of what was asked.
    pub(super) next_offset: u32,
    pub(super) end: u32,
    pub(super) remaining: u32,
    pub(super) r2t_sn: Sn,
    pub(super) r2ts: Vec<R2tState>,
    pub(super) sn: SnState,
}

impl R2tState {
    /// Whether a Data-Out of `len` bytes is the next piece of this R2T's sequence (DataSN
    /// and offset in order, within the length asked for).
    fn continues(&self, d: &DataOut, len: u32) -> bool {
        d.data_sn == self.next_data_sn && d.buffer_offset == self.offset + self.received && self.received + len <= self.len
    }
}

/// Most R2T lists kept for reuse.
const MAX_SPARE_R2T_LISTS: usize = 64;

impl<S: ByteStream> TcpDatamover<S> {
    /// Ends the Get_Data of `itt`: its buffer; its list of R2Ts is kept for the next one
    /// (no allocation per write).
    pub(super) fn end_solicit(&mut self, itt: Itt) -> Option<IoBuf> {
        let mut s = self.solicits.remove(&itt)?;
        if self.spare_r2ts.len() < MAX_SPARE_R2T_LISTS {
            s.r2ts.clear();
            self.spare_r2ts.push(std::mem::take(&mut s.r2ts));
        }
        Some(s.buf)
    }

    /// Forgets the DataSN and R2TSN kept between the pieces of task `itt` (nothing to do, and
    /// no hashing, when no task is in pieces).
    pub(super) fn forget_pieces(&mut self, itt: Itt) {
        if !self.streams.is_empty() {
            self.streams.remove(&itt);
        }
        if !self.r2t_sns.is_empty() {
            self.r2t_sns.remove(&itt);
        }
    }

    /// Issues R2Ts for `itt` while MaxOutstandingR2T allows.
    pub(super) fn issue_r2ts(&mut self, itt: Itt) {
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
    pub(super) fn on_solicited_data(&mut self, pdu: Pdu, placed: bool, events: &mut Vec<DmEvent>) {
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
}

/// Where a solicited Data-Out's segment of `len` bytes belongs in its task's buffer, if it
/// is exactly the next piece of one of the task's outstanding R2Ts (the checks
/// [`TcpDatamover::on_solicited_data`] makes, so anything it would refuse stays out of the
/// buffer).
pub(super) fn solicited_slice<'a>(solicits: &'a mut TagMap<Itt, Solicit>, bhs: &Bhs, len: usize) -> Option<&'a mut [u8]> {
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

/// Copies a solicited Data-Out's segment into its task's buffer if it belongs there
/// ([`solicited_slice`]); true if it did.
pub(super) fn place_solicited(solicits: &mut TagMap<Itt, Solicit>, bhs: &Bhs, data: &[u8]) -> bool {
    match solicited_slice(solicits, bhs, data.len()) {
        Some(dst) => {
            dst.copy_from_slice(data);
            true
        }
        None => false,
    }
}
