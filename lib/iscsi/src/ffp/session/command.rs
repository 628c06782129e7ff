//! A SCSI Command's way in (RFC 7143 §11.3): checks of its tag, the task cap, its AHS, its
//! flags and its immediate data, the task it becomes, its hand-over to the SCSI layer
//! ([`Action::Execute`]), and the responses of commands that fail in this layer.

use std::collections::VecDeque;

use riser_buf::IoBuf;
use riser_scsi::task::{DataOut, Residual};
use riser_scsi::Sense;

use super::{
    Action, Ffp, Immediate, ReadOut, ScsiRequest, Task, TaskState, WriteIn, SENSE_DATA_PHASE_ERROR, SENSE_WRITE_TOO_LARGE, STATUS_CHECK_CONDITION,
    STATUS_TASK_SET_FULL,
};
use crate::ffp::datamover::SnState;
use crate::pdu::{response, Bhs, Op, Pdu, RejectReason, ScsiCommand, ScsiResponse, BHS_LEN};
use crate::serial::{Itt, Sn};

impl Ffp {
    /// `lens`: the command's TotalAHSLength and DataSegmentLength as received (with `cmd`,
    /// the header a Reject quotes).
    pub(super) fn on_scsi_command(&mut self, cmd: ScsiCommand, lens: (u8, u32), ahs: Vec<u8>, data: Immediate) {
        let header = |cmd: &ScsiCommand| -> [u8; BHS_LEN] {
            Bhs { total_ahs_length: lens.0, data_segment_length: lens.1, op: Op::ScsiCommand(cmd.clone()) }.to_bytes()
        };
        let immediate = cmd.immediate;
        let release_slot = |s: &mut Ffp| {
            if !immediate {
                s.slot_freed()
            }
        };
        if self.tasks.contains_key(&cmd.itt) || cmd.itt.is_reserved() || self.aborting.contains(&cmd.itt) {
            // A tag already in use (by a live task, or by an aborted one whose abort has not
            // reached the SCSI layer and the datamover yet: the old task's completion or data
            // could still come under it), or the reserved tag: Reject, Invalid PDU field
            // (RFC 7143 §11.17.1; an ITT is unique among the initiator's outstanding tasks).
            // A reused tag never gets another command's completion.
            log::warn!("task {:#x}: a command with a tag still in use: rejected", cmd.itt.0);
            release_slot(self);
            self.reject(&header(&cmd), RejectReason::InvalidPduField);
            return;
        }
        if self.tasks_held() >= self.cfg.queue_depth.max(1) as usize {
            // The connection holds as many tasks as the session's queue depth. The CmdSN
            // window keeps non-immediate commands to that many a session, but immediate ones
            // bypass it (RFC 7143 §3.2.2.1), and each may hold unsolicited data in segments
            // outside the buffer budget: the cap bounds both.
            if immediate {
                // RFC 7143 §11.17.1: reason 0x06, "Immediate command reject - too many
                // immediate commands"; a rejected command has no response and used no CmdSN.
                log::warn!("task {:#x}: an immediate command beyond the connection's {} tasks: rejected", cmd.itt.0, self.tasks_held());
                self.reject(&header(&cmd), RejectReason::ImmediateCommandReject);
            } else {
                // Within the window (it took a CmdSN, so it is answered): SCSI status TASK
                // SET FULL (SAM-5 5.3.1), for a command the task set has no room for.
                log::warn!("task {:#x}: a command beyond the connection's {} tasks: TASK SET FULL", cmd.itt.0, self.tasks_held());
                self.respond_status(cmd.itt, immediate, STATUS_TASK_SET_FULL, cmd.expected_data_transfer_length);
            }
            return;
        }
        let mut ext_cdb = Vec::new();
        if !ahs.is_empty() {
            match crate::pdu::ahs_segments(&ahs) {
                Ok(segs) => {
                    for seg in segs {
                        if seg.ahs_type == 1 {
                            // Extended CDB AHS: the CDB continues (RFC 7143 §11.2.2.3).
                            if ext_cdb.is_empty() {
                                ext_cdb.extend_from_slice(&cmd.cdb);
                            }
                            ext_cdb.extend_from_slice(seg.specific.get(1..).unwrap_or_default());
                        }
                    }
                }
                Err(_) => {
                    release_slot(self);
                    self.reject(&header(&cmd), RejectReason::InvalidPduField);
                    return;
                }
            }
        }
        let edtl = cmd.expected_data_transfer_length;
        if edtl > 0 && !cmd.read && !cmd.write {
            // RFC 7143 §11.3.1.1: R and W MUST NOT both be 0 when data is to be transferred.
            // Rejected as Invalid PDU field, as LIO and SPDK do; a rejected command gets no
            // response (§11.17.1).
            release_slot(self);
            self.reject(&header(&cmd), RejectReason::InvalidPduField);
            return;
        }
        let imm = data.len();
        if imm > 0 && (!cmd.write || !self.cfg.immediate_data || imm > self.cfg.first_burst_length || imm > edtl) {
            // Immediate data the session did not allow, or more than promised.
            release_slot(self);
            self.reject(&header(&cmd), RejectReason::ProtocolError);
            return;
        }
        if cmd.write && edtl > self.cfg.largest_write {
            release_slot(self);
            self.respond_check(cmd.itt, immediate, SENSE_WRITE_TOO_LARGE, edtl, true);
            return;
        }
        // The task is built in its slot of the table, where it stays until it ends.
        let itt = cmd.itt;
        let write = cmd.write && edtl > 0;
        let t = self.tasks.insert(
            itt,
            Task {
                lun: cmd.lun,
                cdb: cmd.cdb,
                ext_cdb,
                data: WriteIn { received: imm, ..WriteIn::default() },
                state: TaskState::Unsolicited { since: None },
                cmd,
            },
        );
        if !write {
            // Straight on to the SCSI layer: the task is handed over where it was inserted
            // (no second lookup).
            Self::execute_task(&mut self.actions, itt, t, false);
            return;
        }
        // Unsolicited Data-Out may follow unless F is set or InitialR2T=Yes
        // (RFC 7143 §13.10, §13.14).
        if !self.cfg.initial_r2t && !t.cmd.final_bit {
            let first_burst = self.cfg.first_burst_length.min(edtl);
            t.data.expected = first_burst.saturating_sub(imm);
        }
        match data {
            // The datamover had the budget's room for the task's buffer and copied the
            // immediate data straight into it: the one copy; the rest is asked for at once.
            Immediate::Placed { buf, .. } if buf.len() == edtl as usize => t.data.buf = Some(buf),
            // The first piece of a write that streams: the immediate data is at its start.
            Immediate::Placed { buf, len } if len as usize <= buf.len() && buf.len() < edtl as usize => {
                t.data.first_piece = Some(buf);
                t.data.staged_from = len;
            }
            Immediate::Placed { buf, .. } => {
                log::error!("task {:#x}: placed write buffer of {} bytes for EDTL {edtl}", itt.0, buf.len());
                self.tasks.free(&itt);
                release_slot(self);
                self.respond_check(itt, immediate, SENSE_DATA_PHASE_ERROR, edtl, true);
                return;
            }
            // All of it came as immediate data: the segment itself becomes the write
            // buffer, no copy (at most FirstBurstLength per command, within the window).
            Immediate::Segment(data) if imm == edtl => t.data.buf = Some(IoBuf::from_vec(data)),
            // More follows (unsolicited Data-Out, or solicited) and the datamover did not
            // place it (no room in the budget then): no buffer yet, the immediate data
            // waits in its segment, copied into the buffer when the budget grants it.
            Immediate::Segment(data) if imm > 0 => t.data.staged.push(data),
            Immediate::Segment(_) => {}
        }
        let d = &t.data;
        if d.expected == 0 && d.received == edtl && d.buf.is_some() && d.first_piece.is_none() {
            // All of it came with the command, in its buffer (the usual small write):
            // straight on to the SCSI layer, where it was inserted (what
            // `after_unsolicited` would do, without its lookups).
            Self::execute_task(&mut self.actions, itt, t, false);
        } else {
            self.after_unsolicited(itt);
        }
    }

    /// Hands the task to the SCSI layer, with its data gathered (in `data.buf`), or, when
    /// `streamed`, to be asked for piece by piece.
    pub(super) fn execute(&mut self, itt: Itt, streamed: bool) {
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        Self::execute_task(&mut self.actions, itt, t, streamed);
    }

    /// [`execute`](Self::execute) of task `t` (tag `itt`), its action queued in `actions`.
    fn execute_task(actions: &mut VecDeque<Action>, itt: Itt, t: &mut Task, streamed: bool) {
        let data_out = match t.data.buf.take() {
            Some(buf) => DataOut::Whole(buf),
            None if streamed => DataOut::Streamed,
            None => DataOut::None,
        };
        t.state = if streamed { TaskState::Streaming { want: None } } else { TaskState::Executing(ReadOut::default()) };
        actions.push_back(Action::Execute(ScsiRequest {
            itt,
            lun: t.lun,
            cdb: t.cdb,
            ext_cdb: std::mem::take(&mut t.ext_cdb),
            edtl: t.cmd.expected_data_transfer_length,
            read: t.cmd.read,
            write: t.cmd.write,
            attr: t.cmd.attr,
            data_out,
        }));
    }

    /// A response without sense data (TASK SET FULL) for a command that never became a task.
    pub(super) fn respond_status(&mut self, itt: Itt, immediate: bool, status: u8, edtl: u32) {
        if !immediate {
            self.slot_freed();
        }
        let s = self.next_stat_sn();
        let residual = if edtl > 0 { Residual::Underflow(edtl) } else { Residual::None };
        self.actions.push_back(Action::Send(scsi_response(itt, status, &[], residual, s)));
    }

    /// A CHECK CONDITION response for a task that never reached the SCSI layer.
    pub(super) fn respond_check(&mut self, itt: Itt, immediate: bool, sense: Sense, edtl: u32, slot_already_freed: bool) {
        if !immediate && !slot_already_freed {
            self.slot_freed();
        }
        let s = self.next_stat_sn();
        let residual = if edtl > 0 { Residual::Underflow(edtl) } else { Residual::None };
        let sense = sense.fixed();
        self.actions.push_back(Action::Send(scsi_response(itt, STATUS_CHECK_CONDITION, sense.as_slice(), residual, s)));
    }
}

/// A SCSI Response PDU (RFC 7143 §11.4); sense data travels with a 2-byte length
/// (§11.4.7.2).
pub(super) fn scsi_response(itt: Itt, status: u8, sense: &[u8], residual: Residual, s: SnState) -> Pdu {
    let (o, u, count) = match residual {
        Residual::None => (false, false, 0),
        Residual::Overflow(n) => (true, false, n),
        Residual::Underflow(n) => (false, true, n),
    };
    let mut data = Vec::new();
    if !sense.is_empty() {
        data.extend_from_slice(&(sense.len() as u16).to_be_bytes());
        data.extend_from_slice(sense);
    }
    Pdu::with_data(
        Op::ScsiResponse(ScsiResponse {
            bidi_read_residual_overflow: false,
            bidi_read_residual_underflow: false,
            residual_overflow: o,
            residual_underflow: u,
            response: response::COMMAND_COMPLETED_AT_TARGET,
            status,
            itt,
            snack_tag: 0,
            stat_sn: s.stat_sn,
            exp_cmd_sn: s.exp_cmd_sn,
            max_cmd_sn: s.max_cmd_sn,
            exp_data_sn: Sn(0),
            bidi_read_residual_count: 0,
            residual_count: count,
        }),
        data,
    )
}
