//! The transport-independent part of one initiator session, free of I/O: the sequence
//! numbers and the CmdSN window ([`SessionState`]), the management task (setup commands,
//! logout), the task slots of the data path ([`Tasks`]), the login exchange
//! ([`LoginExchange`], with [`KeyNegotiation`]), the Data-Out PDUs of a write, and what a
//! received PDU asks for (Data-In, R2T, SCSI Response, NOP-In, Async Message, Reject,
//! Logout / Text / Task Management responses).
//!
//! It serves riser-perf's TCP connection (`riser_perf::conn::Conn`) and iSER one
//! (`riser_perf::iser::IserConn`), which keep their own I/O (socket reads and writes, RDMA
//! posts) and plug it in through the [`Transport`] trait; and
//! [`PduSession`], the same initiator over whole [`Pdu`](riser_iscsi::pdu::Pdu)s that the
//! caller carries, for tests that drive a target without sockets.

mod abort;
mod login;
mod negotiate;
mod pdu;

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

use riser_iscsi::pdu::{
    logout, Bhs, DataIn, DataOut, LogoutRequest, Lun, NopOut, Op, R2t, ScsiCommand,
    TaskMgmtRequest,
};
use riser_iscsi::serial::{Itt, Sn, Ttt};

pub use abort::{AbortStats, Aborter, MAX_PENDING_ABORTS};
pub use login::{
    LoginExchange, LoginOptions, LoginParams, LoginStep, SessionType, INITIATOR_NAME,
    LOGIN_MAX_RECV_DSL,
};
pub use negotiate::{
    login_status_text, IserKeys, KeyNegotiation, Negotiated, Proposal, OUR_INITIATOR_RECV_DSL,
    OUR_MAX_RECV_DSL, OUR_TARGET_RECV_DSL,
};
pub use pdu::{Completed, Event, LoginProgress, PduSession, Unsolicited};

use crate::scsi::{status, status_name, Completion, Dir, IoError, ScsiExec, Sense};

/// Management tasks (TUR, READ CAPACITY, logout; login; a [`PduSession`]'s NOP-Outs and
/// task management requests) use ITTs with the top bit set; I/O tasks use
/// `(sequence << 16) | slot`, top bit clear.
pub const MGMT_ITT: u32 = 0x8000_0000;
/// Largest queue depth of one riser-perf connection (the slot lives in the low 16 bits of
/// the ITT).
pub const MAX_QD: usize = 4096;

/// The one management command in flight (setup and teardown only).
#[derive(Default)]
pub(crate) struct Mgmt {
    pub itt: u32,
    /// Data-In received (TCP; on iSER the target RDMA-Writes it into a registered buffer).
    pub data: Vec<u8>,
    pub want: usize,
    /// (status, sense, bytes transferred)
    pub done: Option<(u8, Option<Sense>, usize)>,
    pub logout: Option<u8>,
}

/// Sequence numbers (RFC 7143 §4.2.2), CmdSN window and management task of one session.
pub struct SessionState {
    /// The CmdSN of the next non-immediate command.
    pub cmd_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    /// The StatSN after the highest one received: what requests acknowledge.
    pub exp_stat_sn: Sn,
    /// The LUN of every command and task management request.
    pub lun: Lun,
    next_mgmt: u32,
    pub(crate) mgmt: Mgmt,
    /// riser-perf's transports: logout was tried already.
    pub(crate) logged_out: bool,
}

/// What a received PDU other than Data-In and R2T means, once [`SessionState::take`] has
/// taken its sequence numbers.
#[derive(Debug)]
pub enum Received {
    /// Nothing more to do (a NOP-In answering a ping, a response to the management task, a
    /// Text, Logout or Task Management response, a SCSI asynchronous event).
    Done,
    /// A ping from the target: send this NOP-Out (its TTT), echoing the ping's data.
    Ping(NopOut),
    /// The SCSI Response of an I/O task.
    Complete(Outcome),
    /// The target rejected a PDU: the reason code.
    Reject(u8),
    /// The target asks for logout (Async Message, event 1).
    LogoutRequested,
    /// The target is dropping the connection or the session (Async Message, this event).
    Dropping(u8),
}

/// How an I/O task ended (its status), for the transport to complete it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub slot: usize,
    /// The iSCSI response (0: command completed at target; then `status` is valid).
    pub response: u8,
    pub status: u8,
    pub sense: Option<Sense>,
    /// A residual on a GOOD status.
    pub residual: bool,
    pub underflow: bool,
    pub overflow: bool,
    pub residual_count: u32,
}

impl SessionState {
    /// Before login: CmdSN 1, an empty window, ExpStatSN 0.
    pub fn new(lun: Lun) -> Self {
        SessionState {
            cmd_sn: Sn(1),
            exp_cmd_sn: Sn(1),
            max_cmd_sn: Sn(1),
            exp_stat_sn: Sn(0),
            lun,
            next_mgmt: 0,
            mgmt: Mgmt::default(),
            logged_out: false,
        }
    }

    /// Takes the ExpCmdSN and MaxCmdSN of a response (never moving backwards).
    pub fn update_window(&mut self, exp: Sn, max: Sn) {
        // RFC 7143 §4.2.2.1: MaxCmdSN < ExpCmdSN - 1 means both are to be ignored.
        if max.lt(exp.add(u32::MAX)) {
            return;
        }
        if exp.gt(self.exp_cmd_sn) {
            self.exp_cmd_sn = exp;
        }
        if max.gt(self.max_cmd_sn) {
            self.max_cmd_sn = max;
        }
    }

    /// Takes the StatSN of a response: ExpStatSN moves past it.
    pub fn saw_stat_sn(&mut self, stat_sn: Sn) {
        let next = stat_sn.next();
        if next.gt(self.exp_stat_sn) {
            self.exp_stat_sn = next;
        }
    }

    /// The Data-In of the management command (TCP; taken, for its [`CmdResult`]).
    ///
    /// [`CmdResult`]: crate::scsi::CmdResult
    pub fn take_mgmt_data(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.mgmt.data)
    }

    /// Whether the Logout Response came.
    pub fn logout_answered(&self) -> bool {
        self.mgmt.logout.is_some()
    }

    /// Whether the next non-immediate command may go out (CmdSN <= MaxCmdSN).
    pub fn window_open(&self) -> bool {
        self.cmd_sn.le(self.max_cmd_sn)
    }

    /// A new ITT for a management-type task (top bit set).
    pub fn next_mgmt_itt(&mut self) -> Itt {
        self.next_mgmt = self.next_mgmt.wrapping_add(1) & 0x7fff_ffff;
        Itt(MGMT_ITT | self.next_mgmt)
    }

    /// Makes a new management task (reading `want` bytes) the one in flight; its ITT.
    fn new_mgmt(&mut self, want: usize) -> u32 {
        let itt = self.next_mgmt_itt().0;
        self.mgmt = Mgmt {
            itt,
            want,
            ..Mgmt::default()
        };
        itt
    }

    /// A SCSI command (simple task attribute) with the next CmdSN, which it uses up.
    pub fn command(
        &mut self,
        itt: Itt,
        read: bool,
        write: bool,
        len: u32,
        cdb: [u8; 16],
        final_bit: bool,
    ) -> ScsiCommand {
        let cmd = ScsiCommand {
            immediate: false,
            final_bit,
            read,
            write,
            attr: 1,
            lun: self.lun,
            itt,
            expected_data_transfer_length: len,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb,
        };
        self.cmd_sn = self.cmd_sn.next();
        cmd
    }

    /// The command of a new management task: no data out, `read_len` bytes in.
    fn mgmt_command(&mut self, cdb: &[u8], read_len: u32) -> ScsiCommand {
        let itt = self.new_mgmt(read_len as usize);
        let mut c = [0u8; 16];
        c[..cdb.len().min(16)].copy_from_slice(&cdb[..cdb.len().min(16)]);
        self.command(Itt(itt), read_len > 0, false, read_len, c, true)
    }

    /// An immediate NOP-Out: a ping asking for a NOP-In (`itt`, TTT reserved), or the
    /// answer to the target's ping `ttt` (ITT reserved).
    pub fn nop_out(&self, itt: Itt, ttt: Ttt, lun: Lun) -> NopOut {
        NopOut {
            immediate: true,
            lun,
            itt,
            ttt,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        }
    }

    /// An immediate Task Management Function Request on the session's LUN (see
    /// [`riser_iscsi::pdu::tmf`]); `referenced`, `ref_cmd_sn`: the task it is about
    /// (ABORT TASK), else reserved and 0.
    pub fn task_mgmt(
        &self,
        itt: Itt,
        function: u8,
        referenced: Itt,
        ref_cmd_sn: Sn,
    ) -> TaskMgmtRequest {
        TaskMgmtRequest {
            immediate: true,
            function,
            lun: self.lun,
            itt,
            referenced_task_tag: referenced,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            ref_cmd_sn,
            exp_data_sn: Sn(0),
        }
    }

    /// The (immediate) Logout Request for `reason_code` (see [`riser_iscsi::pdu::logout`]),
    /// as a new management task.
    pub fn logout_request(&mut self, reason_code: u8) -> LogoutRequest {
        let itt = self.new_mgmt(0);
        LogoutRequest {
            immediate: true,
            reason_code,
            itt: Itt(itt),
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        }
    }

    /// Takes a received PDU other than Data-In and R2T: its sequence numbers, the window,
    /// the management task, and what it means. `data`: its data segment; `slot_of`: the I/O
    /// task slot of an ITT, or the error (an answer to an unknown task).
    pub fn take(
        &mut self,
        label: &str,
        op: &Op,
        data: &[u8],
        slot_of: impl FnOnce(Itt) -> Result<usize, String>,
    ) -> Result<Received, String> {
        match op {
            Op::ScsiResponse(r) => {
                self.update_window(r.exp_cmd_sn, r.max_cmd_sn);
                self.saw_stat_sn(r.stat_sn);
                let sense = if r.status == status::CHECK_CONDITION {
                    Sense::parse(data)
                } else {
                    None
                };
                if r.itt.0 & MGMT_ITT != 0 {
                    if r.itt.0 == self.mgmt.itt {
                        let st = if r.response != 0 { 0xff } else { r.status };
                        let n = if r.residual_underflow {
                            self.mgmt.want.saturating_sub(r.residual_count as usize)
                        } else {
                            self.mgmt.want
                        };
                        self.mgmt.done = Some((st, sense, n));
                    }
                    return Ok(Received::Done);
                }
                let slot = slot_of(r.itt)?;
                let residual =
                    (r.residual_underflow || r.residual_overflow) && r.status == status::GOOD;
                return Ok(Received::Complete(Outcome {
                    slot,
                    response: r.response,
                    status: r.status,
                    sense,
                    residual,
                    underflow: r.residual_underflow,
                    overflow: r.residual_overflow,
                    residual_count: r.residual_count,
                }));
            }
            Op::NopIn(n) => {
                self.update_window(n.exp_cmd_sn, n.max_cmd_sn);
                if !n.itt.is_reserved() {
                    self.saw_stat_sn(n.stat_sn);
                }
                if !n.ttt.is_reserved() {
                    // A ping from the target: answer with its TTT and the same data.
                    return Ok(Received::Ping(self.nop_out(Itt::RESERVED, n.ttt, n.lun)));
                }
            }
            Op::AsyncMessage(a) => {
                self.update_window(a.exp_cmd_sn, a.max_cmd_sn);
                self.saw_stat_sn(a.stat_sn);
                match a.async_event {
                    // A SCSI asynchronous event (sense data), or parameter renegotiation:
                    // nothing to do for a load generator.
                    0 | 4 => {}
                    1 => return Ok(Received::LogoutRequested),
                    e => return Ok(Received::Dropping(e)),
                }
            }
            Op::Reject(r) => {
                self.saw_stat_sn(r.stat_sn);
                return Ok(Received::Reject(r.reason));
            }
            Op::LogoutResponse(l) => {
                self.saw_stat_sn(l.stat_sn);
                if l.itt.0 == self.mgmt.itt {
                    self.mgmt.logout = Some(l.response);
                }
            }
            Op::TextResponse(t) => self.saw_stat_sn(t.stat_sn),
            Op::TaskMgmtResponse(t) => {
                self.update_window(t.exp_cmd_sn, t.max_cmd_sn);
                self.saw_stat_sn(t.stat_sn);
            }
            other => {
                return Err(format!(
                    "{label}: unexpected PDU from the target: {:?}",
                    other.opcode()
                ))
            }
        }
        Ok(Received::Done)
    }

    /// [`Self::take`] for riser-perf's transports: a Reject, an Async Message asking for
    /// logout or dropping the connection, and an iSCSI response other than "completed" to
    /// an I/O end the run (Err).
    pub fn receive(
        &mut self,
        label: &str,
        op: &Op,
        data: &[u8],
        slot_of: impl FnOnce(Itt) -> Result<usize, String>,
    ) -> Result<Received, String> {
        match self.take(label, op, data, slot_of)? {
            Received::Complete(o) if o.response != 0 => Err(format!(
                "{label}: the target failed a command (iSCSI response {:#04x})",
                o.response
            )),
            Received::Reject(reason) => Err(format!(
                "{label}: the target rejected a PDU (reason {reason:#04x})"
            )),
            Received::LogoutRequested => Err(format!(
                "{label}: the target asked for logout (Async Message)"
            )),
            Received::Dropping(e) => Err(format!(
                "{label}: the target is dropping the connection (Async Message event {e})"
            )),
            r => Ok(r),
        }
    }
}

/// The state of an I/O task slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    Idle,
    /// Waiting for the CmdSN window to open.
    Blocked,
    InFlight,
}

/// One I/O task slot.
pub struct Task {
    pub state: TaskState,
    pub itt: u32,
    pub seq: u16,
    pub dir: Dir,
    pub lba: u64,
    pub blocks: u32,
    /// The expected data transfer length.
    pub len: u32,
    /// TCP: Data-In bytes received.
    pub received: u32,
    /// The caller's view of the data (TCP: where Data-In lands and Data-Out comes from).
    pub buf: Vec<u8>,
    /// iSER: `buf` changed since it was last copied into the registered region.
    pub dirty: bool,
}

impl Task {
    fn idle(slot: usize, buf: Vec<u8>) -> Task {
        Task {
            state: TaskState::Idle,
            itt: slot as u32,
            seq: 0,
            dir: Dir::Read,
            lba: 0,
            blocks: 0,
            len: 0,
            received: 0,
            buf,
            dirty: false,
        }
    }

    /// The error of a command that ended with a status other than GOOD.
    pub fn status_error(&self, status: u8, sense: Option<Sense>) -> IoError {
        IoError {
            status,
            sense,
            what: format!(
                "{} of {} blocks at LBA {}: {}",
                self.op_name(),
                self.blocks,
                self.lba,
                status_name(status)
            ),
        }
    }

    pub fn op_name(&self) -> &'static str {
        if self.dir == Dir::Read {
            "READ"
        } else {
            "WRITE"
        }
    }
}

/// The I/O task slots of a connection, the ones waiting for the CmdSN window, and the count
/// in flight.
pub struct Tasks {
    pub slots: Vec<Task>,
    blocked: VecDeque<usize>,
    pub inflight: usize,
    /// `--abort-every` ([`Self::abort_every`]); a slot's ITT is then its number.
    pub abort: Option<Box<Aborter>>,
}

impl Default for Tasks {
    fn default() -> Self {
        Self::new()
    }
}

impl Tasks {
    pub fn new() -> Self {
        Tasks {
            slots: Vec::new(),
            blocked: VecDeque::new(),
            inflight: 0,
            abort: None,
        }
    }

    /// `--abort-every N` (after [`Self::start`]): an ABORT TASK after every Nth command (see
    /// [`Aborter`]); from now on every command of a slot reuses the slot's ITT.
    pub fn abort_every(&mut self, n: u32) {
        self.abort = Some(Box::new(Aborter::new(n, self.slots.len().max(1))));
    }

    /// Tasks in flight plus ABORT TASKs awaiting their response.
    pub fn busy(&self) -> usize {
        self.inflight + self.abort.as_ref().map_or(0, |a| a.pending())
    }

    /// `--abort-every`: after the command of `slot` (CmdSN `cmd_sn`) went out, the ABORT
    /// TASK to send right after it, if one is due and `room`.
    pub fn abort_after(
        &mut self,
        s: &mut SessionState,
        slot: usize,
        cmd_sn: Sn,
        room: bool,
    ) -> Option<TaskMgmtRequest> {
        let itt = self.slots[slot].itt;
        self.abort.as_mut()?.on_sent(s, slot, itt, cmd_sn, room)
    }

    /// `--abort-every`: whether `op` (a SCSI Response, Data-In or R2T) is for an aborted
    /// task; if so it is counted as a violation and dropped here, its sequence numbers taken.
    pub fn stale(&mut self, s: &mut SessionState, op: &Op) -> bool {
        let Some(a) = self.abort.as_mut() else {
            return false;
        };
        let (itt, what) = match op {
            Op::ScsiResponse(r) => (r.itt, "SCSI Response"),
            Op::DataIn(d) => (d.itt, "Data-In"),
            Op::R2t(r) => (r.itt, "R2T"),
            _ => return false,
        };
        if itt.0 & MGMT_ITT != 0 || !a.stale(itt, what) {
            return false;
        }
        match op {
            Op::ScsiResponse(r) => {
                s.update_window(r.exp_cmd_sn, r.max_cmd_sn);
                s.saw_stat_sn(r.stat_sn);
            }
            Op::DataIn(d) => {
                s.update_window(d.exp_cmd_sn, d.max_cmd_sn);
                if d.status_present {
                    s.saw_stat_sn(d.stat_sn);
                }
            }
            Op::R2t(r) => s.update_window(r.exp_cmd_sn, r.max_cmd_sn),
            _ => {}
        }
        true
    }

    /// `--abort-every`: takes a Task Management Function Response (its sequence numbers are
    /// [`SessionState::take`]'s); an aborted task's slot is freed, held back for a while.
    pub fn tmf_response(&mut self, r: &riser_iscsi::pdu::TaskMgmtResponse) {
        let Some(a) = self.abort.as_mut() else {
            return;
        };
        if let Some(slot) = a.on_response(r) {
            let t = &mut self.slots[slot];
            if t.state == TaskState::InFlight {
                t.state = TaskState::Idle;
                self.inflight -= 1;
            }
        }
    }

    /// `--abort-every`: the slots of aborted tasks that go back to the caller now; and, when
    /// nothing else is in flight and `room`, the NOP-Out ping to send whose NOP-In hands the
    /// rest back ([`Self::nop_in`]).
    pub fn released(
        &mut self,
        s: &mut SessionState,
        room: bool,
        mut each: impl FnMut(usize),
    ) -> Option<NopOut> {
        let idle = self.inflight == 0;
        let a = self.abort.as_mut()?;
        for slot in a.take_released() {
            each(slot);
        }
        if !idle || !room {
            return None;
        }
        let itt = a.ping_due(s)?;
        Some(s.nop_out(itt, Ttt::RESERVED, s.lun))
    }

    /// [`Tasks::released`] for a connection's poll: each released slot becomes an aborted
    /// completion in `out`.
    pub fn release_aborted(&mut self, s: &mut SessionState, room: bool, out: &mut Vec<Completion>) -> Option<NopOut> {
        self.released(s, room, |slot| out.push(Completion { slot, result: Ok(()), aborted: true }))
    }

    /// `--abort-every`: a NOP-In answering `itt`.
    pub fn nop_in(&mut self, itt: Itt) {
        if let Some(a) = self.abort.as_mut() {
            a.on_nop_in(itt);
        }
    }

    /// `qd` idle slots with `bs`-byte buffers.
    pub fn start(&mut self, qd: usize, bs: usize) {
        // A recognisable non-zero pattern, so benchmark writes carry real data.
        self.slots = (0..qd)
            .map(|slot| Task::idle(slot, vec![(slot as u8) | 1; bs]))
            .collect();
        self.blocked = VecDeque::with_capacity(qd);
    }

    /// Makes an idle slot's task the next I/O (a new ITT), counted in flight.
    fn arm(&mut self, slot: usize, dir: Dir, lba: u64, blocks: u32, len: u32) -> &mut Task {
        let t = &mut self.slots[slot];
        debug_assert_eq!(t.state, TaskState::Idle);
        match self.abort.as_mut() {
            // --abort-every: the slot's ITT, always (aborted tasks' ITTs get reused).
            Some(a) => a.on_arm(slot),
            None => t.seq = (t.seq + 1) & 0x7fff,
        }
        t.itt = ((t.seq as u32) << 16) | slot as u32;
        t.dir = dir;
        t.lba = lba;
        t.blocks = blocks;
        t.len = len;
        t.received = 0;
        self.inflight += 1;
        t
    }

    /// Makes an idle slot's task the next I/O (a new ITT). True: its command may go out now;
    /// false: it waits (queued) for the window.
    pub fn submit(
        &mut self,
        slot: usize,
        dir: Dir,
        lba: u64,
        blocks: u32,
        block_size: u32,
        window_open: bool,
    ) -> bool {
        let go = self.blocked.is_empty() && window_open;
        let t = self.arm(slot, dir, lba, blocks, blocks * block_size);
        if !go {
            t.state = TaskState::Blocked;
            self.blocked.push_back(slot);
        }
        go
    }

    /// A new task in flight at once, in an idle slot or a new one, with `buf` for its data
    /// (a write's data, or room for a read's), `buf.len()` its transfer length: its slot.
    /// For callers that make every command themselves ([`PduSession`]).
    pub fn open(&mut self, dir: Dir, buf: Vec<u8>) -> Result<usize, String> {
        let slot = match self.slots.iter().position(|t| t.state == TaskState::Idle) {
            Some(s) => s,
            None if self.slots.len() < 1 << 16 => {
                self.slots.push(Task::idle(self.slots.len(), Vec::new()));
                self.slots.len() - 1
            }
            None => return Err("65536 tasks in flight already".into()),
        };
        let len = u32::try_from(buf.len()).map_err(|_| "a task of 4 GiB or more")?;
        let t = self.arm(slot, dir, 0, 0, len);
        t.buf = buf;
        t.state = TaskState::InFlight;
        Ok(slot)
    }

    /// The next task waiting for the window, if the window is open.
    pub fn unblock(&mut self, window_open: bool) -> Option<usize> {
        if window_open {
            self.blocked.pop_front()
        } else {
            None
        }
    }

    /// The slot of the I/O task in flight with this ITT.
    pub fn slot_of(&self, label: &str, itt: Itt) -> Result<usize, String> {
        let slot = (itt.0 & 0xffff) as usize;
        match self.slots.get(slot) {
            Some(t)
                if t.itt == itt.0 && t.state == TaskState::InFlight && itt.0 & MGMT_ITT == 0 =>
            {
                Ok(slot)
            }
            _ => Err(format!(
                "{label}: the target answered an unknown task (ITT {:#x})",
                itt.0
            )),
        }
    }

    /// Ends a slot's task: the slot is idle again.
    pub fn finish(&mut self, slot: usize) -> &mut Task {
        self.inflight -= 1;
        let t = &mut self.slots[slot];
        t.state = TaskState::Idle;
        if let Some(a) = self.abort.as_mut() {
            a.on_answered(t.itt);
        }
        t
    }

    /// Takes a Data-In (`data`: its data segment): its sequence numbers, and its data into
    /// the buffer of its task (an I/O task's, or the management task's). The outcome when it
    /// carries the status (phase collapse).
    pub fn data_in(
        &mut self,
        s: &mut SessionState,
        label: &str,
        d: &DataIn,
        data: &[u8],
    ) -> Result<Option<Outcome>, String> {
        s.update_window(d.exp_cmd_sn, d.max_cmd_sn);
        if d.status_present {
            s.saw_stat_sn(d.stat_sn);
        }
        let dl = data.len();
        if d.itt.0 & MGMT_ITT != 0 {
            let mgmt = &mut s.mgmt;
            if d.itt.0 != mgmt.itt {
                return Err(format!("{label}: Data-In for an unknown task"));
            }
            let off = d.buffer_offset as usize;
            let end = (off + dl).min(mgmt.want);
            if mgmt.data.len() < end {
                mgmt.data.resize(end, 0);
            }
            if off < end {
                mgmt.data[off..end].copy_from_slice(&data[..end - off]);
            }
            if d.status_present {
                mgmt.done = Some((d.status, None, mgmt.data.len()));
            }
            return Ok(None);
        }
        let slot = self.slot_of(label, d.itt)?;
        let t = &mut self.slots[slot];
        let off = d.buffer_offset as usize;
        if t.dir != Dir::Read || off + dl > t.len as usize {
            return Err(format!(
                "{label}: Data-In of {dl} bytes at offset {off} for a {}-byte {:?}",
                t.len, t.dir
            ));
        }
        t.buf[off..off + dl].copy_from_slice(data);
        t.received += dl as u32;
        if !d.status_present {
            return Ok(None);
        }
        let residual = d.residual_overflow || d.residual_underflow;
        Ok(Some(Outcome {
            slot,
            response: 0,
            status: d.status,
            sense: None,
            residual: residual && d.status == status::GOOD,
            underflow: d.residual_underflow,
            overflow: d.residual_overflow,
            residual_count: d.residual_count,
        }))
    }

    /// Takes an R2T: its window, and checks it against its task (a write, asking for
    /// something inside its length). The task's slot: the transport sends the Data-Out
    /// ([`data_outs`]).
    pub fn r2t(&self, s: &mut SessionState, label: &str, r: &R2t) -> Result<usize, String> {
        s.update_window(r.exp_cmd_sn, r.max_cmd_sn);
        let slot = self.slot_of(label, r.itt)?;
        let t = &self.slots[slot];
        let end = r.buffer_offset as u64 + r.desired_data_transfer_length as u64;
        if t.dir != Dir::Write || end > t.len as u64 || r.desired_data_transfer_length == 0 {
            return Err(format!(
                "{label}: R2T for {} bytes at offset {} of a {}-byte {:?}",
                r.desired_data_transfer_length, r.buffer_offset, t.len, t.dir
            ));
        }
        Ok(slot)
    }
}

/// The Data-Out PDUs for `[offset, offset + len)` of task `itt`'s data: one sequence
/// (DataSN from 0; F on the last), each PDU at most `max` bytes (the target's
/// MaxRecvDataSegmentLength). `emit` gets each header and the range of the task's data it
/// carries.
pub fn data_outs(
    s: &SessionState,
    itt: Itt,
    ttt: Ttt,
    offset: u32,
    len: u32,
    max: u32,
    mut emit: impl FnMut(DataOut, Range<usize>),
) {
    let mut sent = 0u32;
    let mut sn = 0u32;
    while sent < len {
        let n = (len - sent).min(max.max(1));
        let off = offset + sent;
        let d = DataOut {
            final_bit: sent + n == len,
            lun: s.lun,
            itt,
            ttt,
            exp_stat_sn: s.exp_stat_sn,
            data_sn: Sn(sn),
            buffer_offset: off,
        };
        emit(d, off as usize..(off + n) as usize);
        sent += n;
        sn += 1;
    }
}

/// A transport's part of login, management commands and logout.
pub trait Transport: ScsiExec {
    fn state(&mut self) -> &mut SessionState;
    /// Sends a control PDU (Login Request, management command, Logout Request) and waits
    /// until it is out.
    fn send_control(&mut self, op: Op, data: &[u8], deadline: Instant) -> Result<(), String>;
    /// During login: waits for the next PDU; appends its data segment to `text`.
    fn recv_login(&mut self, deadline: Instant, text: &mut Vec<u8>) -> Result<Bhs, String>;
    /// Waits for and handles what the target sends next (`what`: for the timeout message).
    fn progress(&mut self, deadline: Instant, what: &str) -> Result<(), String>;
}

/// Logs in with `params` ([`LoginExchange`]) negotiating with `neg`, up to the full-feature
/// phase, whose first CmdSN and window it takes. Returns the negotiation, for the transport
/// to check and apply.
pub fn login<T: Transport>(
    io: &mut T,
    params: &LoginParams,
    neg: KeyNegotiation,
    deadline: Instant,
) -> Result<KeyNegotiation, String> {
    let label = io.label().to_string();
    let labelled = |e: String| format!("{label}: {e}");
    let (mut ex, mut req, mut text) =
        LoginExchange::start(params, neg, io.state()).map_err(labelled)?;
    loop {
        io.send_control(Op::LoginRequest(req), &text, deadline)?;
        let mut data = Vec::new();
        let h = io.recv_login(deadline, &mut data)?;
        match ex.on_response(io.state(), &h.op, &data).map_err(labelled)? {
            LoginStep::Send(r, t) => (req, text) = (r, t),
            LoginStep::Done(neg) => return Ok(neg),
        }
    }
}

/// Runs one management SCSI command (no data out, `read_len` bytes in) once the window
/// allows it, and waits for its status: (status, sense, bytes transferred). The data is the
/// transport's to fetch.
pub fn run_mgmt<T: Transport>(
    io: &mut T,
    cdb: &[u8],
    read_len: u32,
    deadline: Instant,
) -> Result<(u8, Option<Sense>, usize), String> {
    while !io.state().window_open() {
        io.progress(deadline, "the CmdSN window to open")?;
    }
    let cmd = io.state().mgmt_command(cdb, read_len);
    io.send_control(Op::ScsiCommand(cmd), &[], deadline)?;
    while io.state().mgmt.done.is_none() {
        io.progress(deadline, "a SCSI response")?;
    }
    Ok(io.state().mgmt.done.take().unwrap_or((0xff, None, 0)))
}

/// Logs out (close the session), once: the Logout Request, its response, then `close`
/// (the transport closes the connection), then the outcome. Later calls do nothing.
pub fn logout<T: Transport>(
    io: &mut T,
    deadline: Instant,
    close: impl FnOnce(&mut T),
) -> Result<(), String> {
    if io.state().logged_out {
        return Ok(());
    }
    io.state().logged_out = true;
    let req = io.state().logout_request(logout::CLOSE_SESSION);
    io.send_control(Op::LogoutRequest(req), &[], deadline)?;
    while io.state().mgmt.logout.is_none() {
        io.progress(deadline, "the Logout Response")?;
    }
    close(io);
    match io.state().mgmt.logout {
        Some(0) | None => Ok(()),
        Some(r) => Err(format!("{}: logout answered with response {r}", io.label())),
    }
}
