//! Task management (RFC 7143 §11.5): aborts of one task, of a LUN's tasks or of all of them,
//! the resets, QUERY TASK / QUERY TASK SET, and the bookkeeping of aborted tasks the SCSI
//! layer has not given back yet.

use super::{Action, Ffp};
use crate::pdu::{tmf, Lun, Op, Pdu, TaskMgmtResponse};
use crate::serial::Itt;

impl Ffp {
    /// Asks the driver to abort task `itt` (out of the task table already); its ITT stays
    /// in use until the driver takes the action (see [`Action::Abort`]). `in_scsi`: the
    /// task is in the SCSI layer, which gives it back with a result.
    pub(super) fn abort_action(&mut self, itt: Itt, lun: Lun, in_scsi: bool) {
        self.aborting.push(itt);
        if in_scsi && self.aborted_results {
            self.aborted_in_scsi.push(itt);
        }
        self.actions.push_back(Action::Abort { itt, lun });
    }

    /// The driver promises to hand over every [`TaskEvent::Aborted`] with [`Self::on_scsi`]:
    /// an aborted task then counts against the task cap until the SCSI layer gives it back,
    /// not only until the abort is sent.
    ///
    /// [`TaskEvent::Aborted`]: riser_scsi::TaskEvent::Aborted
    pub fn set_aborted_results(&mut self, on: bool) {
        self.aborted_results = on;
        if !on {
            self.aborted_in_scsi.clear();
        }
    }

    /// An aborted task `itt` is out of the SCSI layer.
    pub(super) fn scsi_gave_back(&mut self, itt: Itt) {
        if let Some(i) = self.aborted_in_scsi.iter().position(|x| *x == itt) {
            self.aborted_in_scsi.swap_remove(i);
        }
    }

    /// Tasks counted against the cap: live ones, and aborted ones still in the SCSI layer.
    pub(super) fn tasks_held(&self) -> usize {
        self.tasks.len() + self.aborted_in_scsi.len()
    }

    pub(super) fn abort_all(&mut self, lun: Option<Lun>) {
        let itts: Vec<Itt> = self
            .tasks
            .iter()
            .filter(|(_, t)| lun.is_none_or(|l| t.lun == l))
            .map(|(i, _)| *i)
            .collect();
        for itt in itts {
            if let Some(t) = self.tasks.remove(&itt) {
                if !t.cmd.immediate {
                    self.slot_freed();
                }
                self.abort_action(itt, t.lun, t.state.in_scsi());
            }
        }
    }

    pub(super) fn on_tmf(&mut self, t: crate::pdu::TaskMgmtRequest) {
        let function = t.function & 0x7f;
        let resp = match function {
            tmf::ABORT_TASK => {
                let itt = t.referenced_task_tag;
                match self.tasks.remove(&itt) {
                    Some(task) => {
                        if !task.cmd.immediate {
                            self.slot_freed();
                        }
                        self.abort_action(itt, task.lun, task.state.in_scsi());
                        tmf::response::FUNCTION_COMPLETE
                    }
                    // RFC 7143 §11.5.1 b): a command not received yet (RefCmdSN within the
                    // window and before the TMF's own CmdSN) is considered received, and
                    // aborted: Function complete. c): otherwise, a task riser does not have
                    // (one that already completed: its CmdSN is below ExpCmdSN, outside the
                    // window) does not exist. libiscsi's iSCSITMF.AbortTaskSimpleAsync expects
                    // exactly that when the WRITE it aborts has already been answered GOOD.
                    None if t.ref_cmd_sn.in_window(self.exp(), self.max()) && t.ref_cmd_sn.lt(t.cmd_sn) => {
                        tmf::response::FUNCTION_COMPLETE
                    }
                    None => tmf::response::TASK_DOES_NOT_EXIST,
                }
            }
            tmf::ABORT_TASK_SET | tmf::CLEAR_TASK_SET => {
                self.abort_all(Some(t.lun));
                tmf::response::FUNCTION_COMPLETE
            }
            tmf::LOGICAL_UNIT_RESET => {
                self.abort_all(Some(t.lun));
                self.actions.push_back(Action::ResetLun(t.lun));
                tmf::response::FUNCTION_COMPLETE
            }
            tmf::TARGET_WARM_RESET | tmf::TARGET_COLD_RESET => {
                self.abort_all(None);
                self.actions.push_back(Action::ResetTarget);
                tmf::response::FUNCTION_COMPLETE
            }
            // QUERY TASK and QUERY TASK SET (RFC 7144 §5.2, SAM-5): FUNCTION SUCCEEDED (7) when
            // the task, or a task of this session on the LUN, is in the task set; FUNCTION
            // COMPLETE (0) when not.
            tmf::QUERY_TASK => {
                if self.tasks.contains_key(&t.referenced_task_tag) {
                    tmf::response::FUNCTION_SUCCEEDED
                } else {
                    tmf::response::FUNCTION_COMPLETE
                }
            }
            tmf::QUERY_TASK_SET => {
                if self.tasks.values().any(|task| task.lun == t.lun) {
                    tmf::response::FUNCTION_SUCCEEDED
                } else {
                    tmf::response::FUNCTION_COMPLETE
                }
            }
            tmf::CLEAR_ACA | tmf::TASK_REASSIGN | tmf::I_T_NEXUS_RESET | tmf::QUERY_ASYNCHRONOUS_EVENT => {
                tmf::response::FUNCTION_NOT_SUPPORTED
            }
            _ => tmf::response::FUNCTION_REJECTED,
        };
        let s = self.next_stat_sn();
        self.actions.push_back(Action::Send(Pdu::new(Op::TaskMgmtResponse(TaskMgmtResponse {
            response: resp,
            itt: t.itt,
            stat_sn: s.stat_sn,
            exp_cmd_sn: s.exp_cmd_sn,
            max_cmd_sn: s.max_cmd_sn,
        }))));
        if function == tmf::TARGET_COLD_RESET {
            self.close("target cold reset", false);
        }
    }
}
