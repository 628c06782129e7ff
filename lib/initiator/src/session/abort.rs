//! `--abort-every N` (hidden; tests): an ABORT TASK (RFC 7143 §11.5, function 1; RefCmdSN
//! the command's CmdSN, Referenced Task Tag its ITT) right after every Nth command, and the
//! checks of what the target does about it.
//!
//! Two outcomes are right (§11.5.1): the task was answered already (its SCSI Response came;
//! the TMF response is "Task does not exist" or "Function complete"), or it is aborted
//! ("Function complete" before any SCSI Response: none may come for it ever). An aborted
//! task's slot is freed only by the TMF response, then held back until `quarantine` more
//! commands have completed (a late response for it still finds its ITT unused and is
//! caught), then handed back to the caller; its next command reuses the aborted task's ITT
//! (with aborts on, a slot's ITT is its number: every command of a slot reuses it).
//!
//! Violations are counted and remembered, not fatal at once, so that the counts still print:
//! a SCSI Response, Data-In or R2T for an aborted task, an unexpected response code, a TMF
//! response to no request of ours. A hang shows as I/Os (and ABORT TASKs) never answered.

use riser_iscsi::pdu::{tmf, TaskMgmtRequest, TaskMgmtResponse};
use riser_iscsi::serial::{Itt, Sn};
use serde::Serialize;

use super::SessionState;

/// ABORT TASKs awaiting their response at once, at most: the command due for one while
/// that many are out goes without, and the next command is aborted instead.
pub const MAX_PENDING_ABORTS: usize = 4;

/// What the target answered to `--abort-every`'s ABORT TASKs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AbortStats {
    pub sent: u64,
    /// "Function complete" for a task whose SCSI Response had come already.
    pub complete_answered: u64,
    /// "Function complete" for a task not answered yet: aborted.
    pub aborted: u64,
    /// "Task does not exist".
    pub not_exist: u64,
    /// ... of which for a task whose SCSI Response had not come yet (it must come later).
    pub not_exist_early: u64,
    /// SCSI Responses, Data-In or R2Ts for aborted tasks (each a violation).
    pub stale: u64,
    /// Commands that reused the ITT of an aborted task.
    pub reused: u64,
    /// Protocol violations (stale answers included).
    pub errors: u64,
}

impl AbortStats {
    pub fn add(&mut self, o: &AbortStats) {
        self.sent += o.sent;
        self.complete_answered += o.complete_answered;
        self.aborted += o.aborted;
        self.not_exist += o.not_exist;
        self.not_exist_early += o.not_exist_early;
        self.stale += o.stale;
        self.reused += o.reused;
        self.errors += o.errors;
    }

    /// The line riser-perf prints (tests parse it).
    pub fn line(&self) -> String {
        format!(
            "aborts: sent {}, function complete {} (answered before {}, aborted {}), task does not exist {} (before its response {}), responses for aborted tasks {}, ITTs reused {}, errors {}",
            self.sent,
            self.complete_answered + self.aborted,
            self.complete_answered,
            self.aborted,
            self.not_exist,
            self.not_exist_early,
            self.stale,
            self.reused,
            self.errors
        )
    }
}

struct Pending {
    tmf_itt: u32,
    slot: usize,
    itt: u32,
    cmd_sn: Sn,
    answered: bool,
}

struct Dead {
    itt: u32,
    slot: usize,
    /// Completions of other tasks still to see before the slot goes back.
    left: usize,
}

/// The bookkeeping of `--abort-every` for one session (see the module documentation).
pub struct Aborter {
    every: u32,
    quarantine: usize,
    since: u32,
    pending: Vec<Pending>,
    dead: Vec<Dead>,
    released: Vec<usize>,
    /// Aborted tasks' slots handed back, not used again yet: (slot, ITT). A PDU for such
    /// an ITT is still one for an aborted task.
    reuse: Vec<(usize, u32)>,
    /// The ITT of our NOP-Out ping, once nothing else is in flight: its NOP-In hands every
    /// aborted task's slot back (what the target sent before it has come).
    ping: Option<u32>,
    pub stats: AbortStats,
    first_error: Option<String>,
}

impl Aborter {
    /// An ABORT TASK after every `every`th command; an aborted task's slot goes back after
    /// `quarantine` other completions (or when nothing else is in flight).
    pub fn new(every: u32, quarantine: usize) -> Aborter {
        Aborter {
            every: every.max(1),
            quarantine,
            since: 0,
            pending: Vec::new(),
            dead: Vec::new(),
            released: Vec::new(),
            reuse: Vec::new(),
            ping: None,
            stats: AbortStats::default(),
            first_error: None,
        }
    }

    fn violation(&mut self, what: String) {
        self.stats.errors += 1;
        self.first_error.get_or_insert(what);
    }

    /// The first violation seen, if any.
    pub fn result(&self) -> Result<(), String> {
        match &self.first_error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// ABORT TASKs (and the ping) awaiting their response.
    pub fn pending(&self) -> usize {
        self.pending.len() + self.ping.is_some() as usize
    }

    /// Nothing else in flight: the ITT of a ping to send now (a NOP-Out whose NOP-In hands
    /// the aborted tasks' slots back), if some are held back and none is out.
    pub fn ping_due(&mut self, s: &mut SessionState) -> Option<Itt> {
        if self.dead.is_empty() || self.ping.is_some() || !self.pending.is_empty() {
            return None;
        }
        let itt = s.next_mgmt_itt();
        self.ping = Some(itt.0);
        Some(itt)
    }

    /// A NOP-In answering `itt`: if our ping, every aborted task's slot goes back.
    pub fn on_nop_in(&mut self, itt: Itt) {
        if self.ping == Some(itt.0) {
            self.ping = None;
            self.release(|_| true);
        }
    }

    /// Command `itt` (in `slot`, CmdSN `cmd_sn`) went out: the ABORT TASK to send right
    /// after it, when it is due and `room` (the transport can send one now).
    pub fn on_sent(
        &mut self,
        s: &mut SessionState,
        slot: usize,
        itt: u32,
        cmd_sn: Sn,
        room: bool,
    ) -> Option<TaskMgmtRequest> {
        self.since = self.since.saturating_add(1);
        if self.since < self.every || self.pending.len() >= MAX_PENDING_ABORTS || !room {
            return None;
        }
        self.since = 0;
        let tmf_itt = s.next_mgmt_itt();
        self.pending.push(Pending {
            tmf_itt: tmf_itt.0,
            slot,
            itt,
            cmd_sn,
            answered: false,
        });
        self.stats.sent += 1;
        Some(s.task_mgmt(tmf_itt, tmf::ABORT_TASK, Itt(itt), cmd_sn))
    }

    /// A new command in `slot` (ITT = slot): counts the reuse of an aborted task's ITT.
    pub fn on_arm(&mut self, slot: usize) {
        if let Some(i) = self.reuse.iter().position(|&(s, _)| s == slot) {
            self.reuse.swap_remove(i);
            self.stats.reused += 1;
        }
    }

    /// Task `itt` was answered (its status came).
    pub fn on_answered(&mut self, itt: u32) {
        // (A slot's next command reuses the ITT at once: an ABORT TASK of the task before
        // may still be out; it was answered too.)
        for p in self.pending.iter_mut().filter(|p| p.itt == itt) {
            p.answered = true;
        }
        for d in &mut self.dead {
            d.left = d.left.saturating_sub(1);
        }
        self.release(|d| d.left == 0);
    }

    fn release(&mut self, pick: impl Fn(&Dead) -> bool) {
        let mut i = 0;
        while i < self.dead.len() {
            if pick(&self.dead[i]) {
                let d = self.dead.swap_remove(i);
                self.released.push(d.slot);
                self.reuse.push((d.slot, d.itt));
            } else {
                i += 1;
            }
        }
    }

    /// Slots of aborted tasks to hand back to the caller (free for new commands).
    pub fn take_released(&mut self) -> std::vec::Drain<'_, usize> {
        self.released.drain(..)
    }

    /// A SCSI Response, Data-In or R2T (`what`) for task `itt`: true if that task was aborted
    /// (a violation, counted; the PDU is to be dropped).
    pub fn stale(&mut self, itt: Itt, what: &str) -> bool {
        let aborted = self.dead.iter().any(|d| d.itt == itt.0)
            || self.reuse.iter().any(|&(_, i)| i == itt.0);
        if !aborted {
            return false;
        }
        self.stats.stale += 1;
        self.violation(format!(
            "the target sent a {what} for task ITT {:#x} after answering its ABORT TASK with Function complete (RFC 7143 §11.5.1: an aborted task gets no response)",
            itt.0
        ));
        true
    }

    /// A Task Management Function Response: the slot of the task it aborted (to be freed by
    /// the caller), if it did.
    pub fn on_response(&mut self, r: &TaskMgmtResponse) -> Option<usize> {
        let Some(i) = self.pending.iter().position(|p| p.tmf_itt == r.itt.0) else {
            self.violation(format!(
                "a Task Management Function Response (response {}) for ITT {:#x}, which no ABORT TASK of ours has",
                r.response, r.itt.0
            ));
            return None;
        };
        let p = self.pending.swap_remove(i);
        match r.response {
            tmf::response::FUNCTION_COMPLETE if p.answered => {
                self.stats.complete_answered += 1;
                None
            }
            tmf::response::FUNCTION_COMPLETE => {
                self.stats.aborted += 1;
                self.dead.push(Dead {
                    itt: p.itt,
                    slot: p.slot,
                    left: self.quarantine,
                });
                Some(p.slot)
            }
            tmf::response::TASK_DOES_NOT_EXIST => {
                self.stats.not_exist += 1;
                if !p.answered {
                    // Its response must still come (else the run hangs, and says so).
                    self.stats.not_exist_early += 1;
                }
                None
            }
            code => {
                self.violation(format!(
                    "ABORT TASK of ITT {:#x} (RefCmdSN {}) answered with response {code}: expected Function complete (0) or Task does not exist (1)",
                    p.itt, p.cmd_sn.0
                ));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scsi::Dir;
    use crate::session::{TaskState, Tasks};
    use riser_iscsi::pdu::{Lun, Op, ScsiResponse};

    fn tmf_resp(itt: Itt, response: u8) -> TaskMgmtResponse {
        TaskMgmtResponse {
            response,
            itt,
            stat_sn: Sn(0),
            exp_cmd_sn: Sn(1),
            max_cmd_sn: Sn(64),
        }
    }

    fn scsi_resp(itt: u32) -> Op {
        Op::ScsiResponse(ScsiResponse {
            bidi_read_residual_overflow: false,
            bidi_read_residual_underflow: false,
            residual_overflow: false,
            residual_underflow: false,
            response: 0,
            status: 0,
            itt: Itt(itt),
            snack_tag: 0,
            stat_sn: Sn(0),
            exp_cmd_sn: Sn(1),
            max_cmd_sn: Sn(64),
            exp_data_sn: Sn(0),
            bidi_read_residual_count: 0,
            residual_count: 0,
        })
    }

    /// Sends the command of `slot`: the ABORT TASK after it, if due.
    fn send(t: &mut Tasks, s: &mut SessionState, slot: usize) -> Option<TaskMgmtRequest> {
        assert!(t.submit(slot, Dir::Read, 0, 1, 512, true));
        t.slots[slot].state = TaskState::InFlight;
        let cmd = s.command(Itt(t.slots[slot].itt), true, false, 512, [0; 16], true);
        t.abort_after(s, slot, cmd.cmd_sn, true)
    }

    /// Every outcome of ABORT TASK: answered before (Function complete or Task does not
    /// exist), aborted (slot freed by the TMF response only, held back, then its ITT reused),
    /// a late response for an aborted task and an unexpected code (violations).
    #[test]
    fn abort_bookkeeping() {
        let mut s = SessionState::new(Lun(0));
        s.max_cmd_sn = Sn(1000);
        let mut t = Tasks::new();
        t.start(4, 512);
        t.abort_every(2);
        let mut released = Vec::new();
        // Slot 0: no abort; slot 1: aborted (the 2nd command).
        assert!(send(&mut t, &mut s, 0).is_none());
        let a1 = send(&mut t, &mut s, 1).expect("abort due");
        assert_eq!(a1.function, tmf::ABORT_TASK);
        assert_eq!((a1.referenced_task_tag, a1.ref_cmd_sn), (Itt(1), Sn(2)));
        assert!(a1.immediate && a1.cmd_sn == Sn(3));
        assert_eq!(t.busy(), 3);
        // Slot 1 answered, then Function complete: answered before.
        t.finish(1);
        t.tmf_response(&tmf_resp(a1.itt, tmf::response::FUNCTION_COMPLETE));
        // Slot 1 again (same ITT), slot 2: abort of slot 2; Task does not exist before its
        // response: it stays in flight and must be answered.
        assert!(send(&mut t, &mut s, 1).is_none());
        let a2 = send(&mut t, &mut s, 2).expect("abort due");
        assert_eq!(t.slots[1].itt, 1, "a slot's ITT is reused");
        t.tmf_response(&tmf_resp(a2.itt, tmf::response::TASK_DOES_NOT_EXIST));
        assert_eq!(t.slots[2].state, TaskState::InFlight);
        t.finish(2);
        // Slot 3 aborted before its response: Function complete frees it (not before).
        assert!(send(&mut t, &mut s, 2).is_none());
        let a3 = send(&mut t, &mut s, 3).expect("abort due");
        assert_eq!(t.inflight, 4);
        assert!(t.released(&mut s, true, |slot| released.push(slot)).is_none());
        assert!(released.is_empty());
        t.tmf_response(&tmf_resp(a3.itt, tmf::response::FUNCTION_COMPLETE));
        assert_eq!((t.inflight, t.slots[3].state), (3, TaskState::Idle));
        // Held back until 4 other completions (or nothing else in flight); a late response
        // for it meanwhile is caught and dropped.
        assert!(t.stale(&mut s, &scsi_resp(3)));
        assert!(!t.stale(&mut s, &scsi_resp(0)));
        t.finish(0);
        t.finish(1);
        assert!(t.released(&mut s, true, |slot| released.push(slot)).is_none());
        assert!(released.is_empty());
        // Nothing else in flight: a ping, whose answer hands the slot back (a late response
        // before it is still caught).
        t.finish(2);
        let ping = t.released(&mut s, true, |slot| released.push(slot)).expect("a ping");
        assert!(released.is_empty() && t.busy() == 1);
        assert!(t.released(&mut s, true, |slot| released.push(slot)).is_none(), "one ping");
        assert!(t.stale(&mut s, &scsi_resp(3)));
        t.nop_in(ping.itt);
        assert!(t.released(&mut s, true, |slot| released.push(slot)).is_none());
        assert_eq!(released, vec![3], "handed back");
        assert!(t.stale(&mut s, &scsi_resp(3)), "not reused yet");
        // Its next command reuses ITT 3.
        assert!(send(&mut t, &mut s, 3).is_none());
        assert_eq!(t.slots[3].itt, 3);
        assert!(!t.stale(&mut s, &scsi_resp(3)));
        // An unexpected response code, a response to no request.
        let a4 = send(&mut t, &mut s, 0).expect("abort due");
        t.tmf_response(&tmf_resp(a4.itt, tmf::response::FUNCTION_REJECTED));
        t.tmf_response(&tmf_resp(Itt(0x8000_7777), 0));
        let a = t.abort.as_ref().unwrap();
        assert_eq!(
            a.stats,
            AbortStats {
                sent: 4,
                complete_answered: 1,
                aborted: 1,
                not_exist: 1,
                not_exist_early: 1,
                stale: 3,
                reused: 1,
                errors: 5,
            }
        );
        let e = a.result().unwrap_err();
        assert!(e.contains("ITT 0x3 after answering its ABORT TASK with Function complete"), "{e}");
        assert!(a.stats.line().starts_with("aborts: sent 4, function complete 2 (answered before 1, aborted 1), task does not exist 1 (before its response 1), responses for aborted tasks 3, ITTs reused 1, errors 5"), "{}", a.stats.line());
    }

    /// At most MAX_PENDING_ABORTS out at once; the one skipped goes to the next command.
    #[test]
    fn aborts_in_flight_are_capped() {
        let mut s = SessionState::new(Lun(0));
        s.max_cmd_sn = Sn(1000);
        let mut t = Tasks::new();
        t.start(16, 512);
        t.abort_every(1);
        let sent: Vec<_> = (0..6).map(|slot| send(&mut t, &mut s, slot)).collect();
        assert_eq!(sent.iter().filter(|a| a.is_some()).count(), MAX_PENDING_ABORTS);
        let first = sent[0].clone().unwrap();
        t.finish(0);
        t.tmf_response(&tmf_resp(first.itt, tmf::response::TASK_DOES_NOT_EXIST));
        assert!(send(&mut t, &mut s, 6).is_some());
        assert_eq!(t.busy(), 6 + MAX_PENDING_ABORTS);
    }
}
