//! The SCSI layer's events for a task ([`TaskEvent`]), and a read's data and a command's
//! completion (RFC 7143 §11.4, §11.7): streamed read pieces (Put_Data without status, the
//! latest held back for the end) and the SCSI completion, which sends the last Data-In with
//! the status or a SCSI Response.

use riser_buf::IoBuf;
use riser_scsi::task::{Residual, ScsiResult, TaskEvent};

use super::command::scsi_response;
use super::{Action, Ffp, ReadOut, TaskState};
use crate::ffp::datamover::{Datamover, PutData};
use crate::pdu::Pdu;
use crate::serial::Itt;

impl Ffp {
    /// What the SCSI layer reports about a task (its tag is the ITT, see
    /// [`super::ScsiRequest::into_task`]): a streamed read's piece, a streamed write's want,
    /// the end, or the abort. Events of a task this layer no longer has (aborted, failed
    /// meanwhile) are dropped.
    pub fn on_scsi(&mut self, mut ev: TaskEvent) {
        self.on_scsi_with(&mut ev, None)
    }

    /// [`on_scsi`](Self::on_scsi) for a driver that lets the read data and responses this
    /// makes ([`Action::PutData`], [`Action::Send`]) go to its datamover `dm` at once,
    /// instead of through the queue, while no other action waits there (so actions keep
    /// their order: once one is queued, the rest queue behind it). It saves a large
    /// action's trip through the queue per command. The driver must be free to carry
    /// actions out (no reset waits to be settled).
    pub fn on_scsi_now(&mut self, mut ev: TaskEvent, dm: &mut dyn Datamover) {
        self.on_scsi_with(&mut ev, Some(dm))
    }

    /// [`on_scsi_now`](Self::on_scsi_now) of an event read where it lies (in the driver's
    /// list of events): what it carries (its buffer, its sense) is taken out of it, the rest
    /// is not moved (an event is large); the driver clears the list afterwards.
    pub fn on_scsi_in_place(&mut self, ev: &mut TaskEvent, dm: Option<&mut dyn Datamover>) {
        self.on_scsi_with(ev, dm)
    }

    fn on_scsi_with(&mut self, ev: &mut TaskEvent, now: Option<&mut dyn Datamover>) {
        let itt = Itt(ev.tag() as u32);
        match ev {
            TaskEvent::Data(p) => {
                let buf = std::mem::replace(&mut p.buf, IoBuf::empty());
                self.on_scsi_data(itt, p.offset, buf, p.len, now)
            }
            TaskEvent::Want(w) => self.on_scsi_want(itt, w.offset, w.len),
            TaskEvent::Done(r) => self.on_scsi_done(r, now),
            TaskEvent::Aborted { .. } => self.scsi_gave_back(itt),
        }
    }

    /// A Put_Data of a SCSI event: to the datamover while the queue is empty, else queued
    /// (as it is, not wrapped in an action first: a PutData is large).
    ///
    /// `p` makes the Put_Data where it goes (the datamover's argument or the queue's
    /// action), so that it is built there, not built first and then moved.
    #[inline(always)]
    fn emit(&mut self, p: impl FnOnce() -> PutData, dm: &mut Option<&mut dyn Datamover>) {
        match dm {
            Some(dm) if self.actions.is_empty() => dm.put_data(p()),
            _ => self.actions.push_back(Action::PutData(p())),
        }
    }

    /// A response of a SCSI event, like [`emit`](Self::emit).
    fn emit_send(&mut self, pdu: Pdu, dm: &mut Option<&mut dyn Datamover>) {
        match dm {
            Some(dm) if self.actions.is_empty() => dm.send_control(pdu),
            _ => self.actions.push_back(Action::Send(pdu)),
        }
    }

    /// A piece of a streamed read's data (`len` bytes of `buf`, from the command's buffer
    /// offset `offset`): the piece before it goes out (Put_Data without status) and this one
    /// waits for the next or the end; the task goes on. Pieces come in order; the last one
    /// comes with the task's result.
    fn on_scsi_data(&mut self, itt: Itt, offset: u32, buf: IoBuf, len: u32, mut now: Option<&mut dyn Datamover>) {
        let sn = self.sn();
        let Some(t) = self.tasks.get_mut(&itt) else {
            return; // aborted meanwhile
        };
        let edtl = t.cmd.expected_data_transfer_length;
        let TaskState::Executing(out) = &mut t.state else {
            return; // not a read in the SCSI layer
        };
        if !t.cmd.read || offset != out.sent || offset >= edtl {
            // Data-In for a command without the R bit is never sent (see on_scsi_done).
            return;
        }
        let len = len.min(edtl - offset);
        out.sent = offset + len;
        if let Some((offset, buf, len)) = out.held.replace((offset, buf, len)) {
            let lun = t.lun;
            self.emit(move || PutData { itt, lun, buf, len, offset, response: None, sn }, &mut now);
        }
    }

    /// A SCSI completion.
    fn on_scsi_done(&mut self, done: &mut ScsiResult, mut now: Option<&mut dyn Datamover>) {
        let itt = Itt(done.tag as u32);
        let Some(t) = self.tasks.get_mut(&itt) else {
            // Aborted meanwhile, and finished before the abort reached the SCSI layer.
            self.scsi_gave_back(itt);
            return;
        };
        // What the response needs is read where the task lies, which is then dropped there
        // (a task is large: it is not moved out).
        let (data_in_len, data_in_offset) = (done.data_len as u32, done.data_offset as u32);
        let (immediate, lun, read, edtl) = (t.cmd.immediate, t.lun, t.cmd.read, t.cmd.expected_data_transfer_length);
        let wanting = matches!(t.state, TaskState::Streaming { want: Some(_) });
        let out = match &mut t.state {
            TaskState::Executing(out) => std::mem::take(out),
            _ => ReadOut::default(),
        };
        self.tasks.free(&itt);
        if !immediate {
            self.slot_freed();
        }
        if wanting {
            // The write ended (an error) while a piece was asked for: the datamover forgets
            // its Get_Data (the SCSI layer has nothing left of the task).
            self.abort_action(itt, lun, false);
        }
        let s = self.next_stat_sn();
        let mut residual = done.residual;
        if data_in_len > 0 && !read {
            // Data-In for a command without the R bit (a READ sent as a write, or with no
            // data expected): its Data-In EDTL is 0, so nothing is sent and the whole
            // SCSI-presented length is a residual overflow (RFC 7143 §11.4.5.2), GOOD or not.
            // libiscsi's iSCSIResiduals.Read10Invalid expects the status to stay as it is.
            let shown = data_in_offset.saturating_add(data_in_len);
            let presented = match done.residual {
                Residual::Overflow(n) => shown.saturating_add(n),
                _ => shown,
            };
            log::debug!("task {:#x}: {presented} bytes of Data-In without the R bit, not sent", itt.0);
            residual = Residual::Overflow(presented);
        }
        let response = scsi_response(itt, done.status.code(), done.sense_bytes(), residual, s);
        let last_ok = done.data_in.is_some() && data_in_len > 0 && read && data_in_offset == out.sent && data_in_offset < edtl;
        if let Some((offset, buf, len)) = out.held {
            if !last_ok {
                // The read ended without a last piece (it failed on the way): the held one
                // is the last Data-In, the response follows it.
                self.emit(move || PutData { itt, lun, buf, len, offset, response: Some(response), sn: s }, &mut now);
                return;
            }
            self.emit(move || PutData { itt, lun, buf, len, offset, response: None, sn: s }, &mut now);
        }
        match done.data_in.take() {
            // The data (whole, or a streamed read's last piece, right after the others).
            Some(buf) if data_in_len > 0 && read && data_in_offset == out.sent && data_in_offset < edtl => self.emit(
                move || PutData {
                    itt,
                    lun,
                    buf,
                    len: data_in_len.min(edtl - data_in_offset),
                    offset: data_in_offset,
                    response: Some(response),
                    sn: s,
                },
                &mut now,
            ),
            // Pieces went out but the last brings no data (the read failed on the way): the
            // response still closes the stream in the datamover (TCP's ExpDataSN).
            _ if out.sent > 0 => {
                self.emit(move || PutData { itt, lun, buf: IoBuf::empty(), len: 0, offset: out.sent, response: Some(response), sn: s }, &mut now)
            }
            _ => self.emit_send(response, &mut now),
        }
    }
}
