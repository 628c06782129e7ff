//! A write's data (RFC 7143 §11.7, §13.10, §13.14): unsolicited data (immediate data and
//! unsolicited Data-Out), the solicited rest asked for with Get_Data (R2Ts on TCP, RDMA
//! Reads on iSER) once the buffer budget grants its memory, and streamed writes, whose data
//! the SCSI layer asks for piece by piece ([`riser_scsi::TaskEvent::Want`]).

use riser_buf::IoBuf;

use super::{gather, Action, BufferWait, Ffp, TaskState, Want, WantStep, MAX_SPARE, SENSE_DATA_PHASE_ERROR};
use crate::ffp::datamover::GetData;
use crate::pdu::{Op, Pdu, RejectReason};
use crate::serial::Itt;

impl Ffp {
    /// Moves a write on once its unsolicited data is in: wait for buffer memory and fetch
    /// the rest, or execute.
    pub(super) fn after_unsolicited(&mut self, itt: Itt) {
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        let d = &mut t.data;
        if d.expected > 0 {
            return;
        }
        let edtl = t.cmd.expected_data_transfer_length;
        if d.received < edtl && d.buf.is_some() {
            // The buffer came with the immediate data (the datamover placed it there): the
            // budget granted it already.
            return self.fetch(itt);
        }
        let plain_write = t.ext_cdb.is_empty() && matches!(t.cdb[0], 0x0a | 0x2a | 0xaa | 0x8a);
        let plain_write = plain_write && d.received < edtl;
        if plain_write && self.write_stream_chunk > 0 && edtl - d.received > self.write_stream_chunk {
            // A large WRITE: to the SCSI layer now, which asks for the data piece by piece
            // once the command has passed its checks (on_scsi_want).
            return self.execute(itt, true);
        }
        if let Some(first) = d.first_piece.take() {
            // Placed as a first piece, but the write does not stream after all (not a plain
            // WRITE): its immediate data waits with the rest, copied once more.
            let imm = d.staged_from as usize;
            d.staged.insert(0, first.as_slice()[..imm.min(first.len())].to_vec());
            d.staged_from = 0;
        }
        if d.received < edtl {
            // Solicited data follows: first the memory for it, in turn with every other
            // write of every connection (grant_buffers), then Get_Data.
            t.state = TaskState::WaitingBuffer(BufferWait::new(edtl));
            self.waiting_buf.push_back(itt);
            if self.waiting_buf.len() == 1 {
                self.grant_buffers();
            }
            return;
        }
        if d.buf.is_none() {
            // All of it came unsolicited, in segments: one segment is the buffer as it is;
            // several are copied into one (the memory they hold is freed as it is used).
            d.buf = Some(if d.staged.len() == 1 && d.staged[0].len() == edtl as usize {
                IoBuf::from_vec(d.staged.remove(0))
            } else {
                let mut buf = IoBuf::alloc(edtl as usize);
                self.staged_bytes += gather(&mut d.staged, &mut buf, &mut self.spare);
                buf
            });
        }
        self.execute(itt, false);
    }

    /// Get_Data for a write whose buffer is there.
    pub(super) fn fetch(&mut self, itt: Itt) {
        let sn = self.sn();
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        let edtl = t.cmd.expected_data_transfer_length;
        let Some(buf) = t.data.buf.take() else { return };
        t.state = TaskState::Fetching { since: None };
        self.actions.push_back(Action::GetData(GetData {
            itt,
            lun: t.lun,
            buf,
            offset: t.data.received,
            len: edtl - t.data.received,
            base: 0,
            more: false,
            sn,
        }));
    }

    /// The SCSI layer asks for a piece of a streamed write's data (the command's bytes
    /// `[offset, offset+len)`): its buffer from the budget (in turn with every other write),
    /// then the unsolicited bytes it covers, then Get_Data for the rest.
    pub(super) fn on_scsi_want(&mut self, itt: Itt, offset: u32, len: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return; // aborted or failed meanwhile
        };
        let edtl = t.cmd.expected_data_transfer_length;
        let idle_stream = matches!(t.state, TaskState::Streaming { want: None });
        if !idle_stream || len == 0 || offset.checked_add(len).is_none_or(|end| end > edtl) {
            // Not a want this layer can serve: the command fails rather than waits forever.
            log::error!("task {:#x}: the SCSI layer asked for data [{offset}, +{len}) it cannot have: the command fails", itt.0);
            let (lun, immediate) = (t.lun, t.cmd.immediate);
            self.tasks.remove(&itt);
            self.abort_action(itt, lun, true);
            self.respond_check(itt, immediate, SENSE_DATA_PHASE_ERROR, edtl, false);
            return;
        }
        let d = &mut t.data;
        if let Some(first) = d.first_piece.take() {
            if offset == 0 && first.len() == len as usize {
                // Its buffer came with the command (taken from the budget then).
                t.state = TaskState::Streaming { want: Some(Want { offset, len, step: WantStep::Fetching { since: None } }) };
                return self.serve_want(itt, first);
            }
            // Not the piece it was taken for: its immediate data waits with the rest.
            let imm = d.staged_from as usize;
            d.staged.insert(0, first.as_slice()[..imm.min(first.len())].to_vec());
            d.staged_from = 0;
        }
        t.state = TaskState::Streaming { want: Some(Want { offset, len, step: WantStep::WaitingBuffer(BufferWait::new(len)) }) };
        self.waiting_buf.push_back(itt);
        if self.waiting_buf.len() == 1 {
            self.grant_buffers();
        }
    }

    /// A streamed write's piece has its buffer: the unsolicited bytes it covers, then
    /// Get_Data for the rest (or straight to the SCSI layer when there is none).
    pub(super) fn serve_want(&mut self, itt: Itt, mut buf: IoBuf) {
        let sn = self.sn();
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        let TaskState::Streaming { want: Some(want) } = &mut t.state else { return };
        let (offset, len) = (want.offset, want.len);
        let end = offset + len;
        // Unsolicited bytes [staged_from, received) wait in their segments, in order (those
        // before staged_from are in the first piece already).
        let d = &t.data;
        let mut at = d.staged_from;
        for seg in &d.staged {
            let seg_end = at + seg.len() as u32;
            let (from, to) = (at.max(offset), seg_end.min(end));
            if from < to {
                let dst = &mut buf.as_mut_slice()[(from - offset) as usize..(to - offset) as usize];
                dst.copy_from_slice(&seg[(from - at) as usize..(to - at) as usize]);
                self.staged_bytes += u64::from(to - from);
            }
            at = seg_end;
        }
        let edtl = t.cmd.expected_data_transfer_length;
        if end <= d.received {
            t.state = TaskState::Streaming { want: None };
            let lun = t.lun;
            self.actions.push_back(Action::WriteData { itt, lun, offset, buf });
            return;
        }
        let from = offset.max(d.received);
        want.step = WantStep::Fetching { since: None };
        self.actions.push_back(Action::GetData(GetData { itt, lun: t.lun, buf, offset: from, len: end - from, base: offset, more: end < edtl, sn }));
    }

    pub(super) fn on_data_out(&mut self, pdu: Pdu) {
        let Op::DataOut(d) = pdu.op().clone() else { return };
        let Some(t) = self.tasks.get_mut(&d.itt) else {
            // Data for a task we do not know (aborted, or bogus): drop it quietly
            // unless the tag is reserved, which is a protocol error.
            if d.itt.is_reserved() {
                self.reject(&pdu.bhs.to_bytes(), RejectReason::InvalidPduField);
            }
            return;
        };
        if !d.ttt.is_reserved() || !matches!(t.state, TaskState::Unsolicited { .. }) || t.data.expected == 0 {
            // Solicited data is the datamover's; unsolicited data beyond FirstBurstLength or
            // for a task not expecting it is a protocol error (RFC 7143 §13.14).
            return self.reject(&pdu.bhs.to_bytes(), RejectReason::ProtocolError);
        }
        let len = pdu.data.len() as u32;
        let edtl = t.cmd.expected_data_transfer_length;
        let w = &mut t.data;
        let in_order = d.data_sn == w.next_data_sn && d.buffer_offset == w.received;
        if !in_order || len > w.expected || d.buffer_offset.saturating_add(len) > edtl {
            // ERL 0: the command fails, the connection lives.
            let itt = d.itt;
            let t = self.tasks.remove(&itt);
            if let Some(t) = t {
                self.respond_check(itt, t.cmd.immediate, SENSE_DATA_PHASE_ERROR, edtl, false);
            }
            return;
        }
        match w.buf.as_mut() {
            Some(buf) => {
                let off = d.buffer_offset as usize;
                if let Some(dst) = buf.as_mut_slice().get_mut(off..off + len as usize) {
                    dst.copy_from_slice(&pdu.data);
                    self.staged_bytes += len as u64;
                }
                if self.spare.len() < MAX_SPARE && pdu.data.capacity() <= riser_buf::MAX_SPARE_VEC {
                    self.spare.push(pdu.data);
                }
            }
            // In order from offset 0 (checked above): kept as it came until the buffer is.
            None => w.staged.push(pdu.data),
        }
        w.received += len;
        w.expected -= len;
        w.next_data_sn = w.next_data_sn.next();
        if d.final_bit || w.expected == 0 {
            w.expected = 0;
            self.after_unsolicited(d.itt);
        }
    }

    /// Data_Completion_Notify for a Get_Data.
    pub fn on_data_ready(&mut self, itt: Itt, buf: IoBuf) {
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        if let TaskState::Streaming { want } = &mut t.state {
            // A streamed write's piece: on to the SCSI layer, which asks for the next.
            if let Some(w) = want.take() {
                let lun = t.lun;
                self.actions.push_back(Action::WriteData { itt, lun, offset: w.offset, buf });
            }
            return;
        }
        t.data.received = t.cmd.expected_data_transfer_length;
        t.data.buf = Some(buf);
        self.execute(itt, false);
    }

    /// Get_Data failed: the command ends with CHECK CONDITION.
    pub fn on_data_failed(&mut self, itt: Itt, reason: &str) {
        if let Some(t) = self.tasks.remove(&itt) {
            log::warn!("task {:#x}: write data failed: {reason}", itt.0);
            if let TaskState::Streaming { .. } = t.state {
                // The command is in the SCSI layer already, waiting for this piece.
                self.abort_action(itt, t.lun, true);
            }
            self.respond_check(itt, t.cmd.immediate, SENSE_DATA_PHASE_ERROR, t.cmd.expected_data_transfer_length, false);
        }
    }
}
