//! The full-feature phase of one connection (RFC 7143 §4, §11), sans-IO.
//!
//! [`Ffp`] takes received PDUs, datamover events, SCSI completions and the time, and
//! returns [`Action`]s for the connection driver: PDUs to send, Put_Data / Get_Data requests
//! for the datamover, SCSI commands to execute, aborts, and the end of the connection.
//! It owns the CmdSN window, StatSN, the task table, NOP-In keep-alives, Text, Logout and
//! task management. Error recovery level 0: a protocol error ends the connection.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use riser_buf::{Account, IoBuf, Pool, Waiter};
pub use riser_scsi::task::{DataOut, Residual, ScsiResult, TaskEvent};
use riser_scsi::task::{Nexus, ScsiTask, TaskAttr};
use riser_scsi::{Asc, LunId, Sense, SenseKey, Status};

use super::config::FfpConfig;
use super::datamover::{GetData, PutData, SnState};
use crate::pdu::{logout, AsyncMessage, Bhs, LogoutResponse, Lun, NopIn, Op, Pdu, Reject, RejectReason, ScsiCommand, BHS_LEN};
use crate::serial::{Itt, Sn, Ttt};
use crate::text::{Pairs, TextAssembler};
use table::TaskTable;

/// SCSI status GOOD / CHECK CONDITION (SAM-5), as the `u8` of a SCSI Response.
pub const STATUS_GOOD: u8 = Status::Good as u8;
pub const STATUS_CHECK_CONDITION: u8 = Status::CheckCondition as u8;
/// SCSI status TASK SET FULL (SAM-5 5.3.1): a command the task set has no room for.
pub const STATUS_TASK_SET_FULL: u8 = Status::TaskSetFull as u8;

/// The CmdSN window of a session (RFC 7143 §3.2.2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdWindow {
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
}

/// A session's window, shared by its connections on one reactor.
pub type SharedWindow = Rc<Cell<CmdWindow>>;

/// A SCSI command for the SCSI layer (the I_T_L nexus is the driver's business).
pub struct ScsiRequest {
    pub itt: Itt,
    pub lun: Lun,
    /// The CDB's first 16 bytes (the whole CDB unless [`ext_cdb`](Self::ext_cdb) is set).
    pub cdb: [u8; 16],
    /// The whole CDB when an Extended CDB AHS makes it longer than 16 bytes, else empty.
    pub ext_cdb: Vec<u8>,
    pub edtl: u32,
    pub read: bool,
    pub write: bool,
    pub attr: u8,
    /// Write data: all of it (EDTL bytes), or streamed (the SCSI layer asks for it piece by
    /// piece with [`TaskEvent::Want`] and gets each piece through [`Action::WriteData`]).
    pub data_out: DataOut,
}

impl ScsiRequest {
    /// The whole CDB.
    pub fn cdb(&self) -> &[u8] {
        if self.ext_cdb.is_empty() {
            &self.cdb
        } else {
            &self.ext_cdb
        }
    }

    /// Bytes of write data handed over with the command (0 when streamed or none).
    pub fn data_out_len(&self) -> u32 {
        self.data_out.buf().map_or(0, |b| b.len() as u32)
    }

    /// The SCSI task for this command on the I_T nexus `nexus` (the session's), tagged with
    /// the ITT: every [`TaskEvent`] of it comes back with that tag ([`Ffp::on_scsi`]).
    pub fn into_task(self, nexus: &Arc<Nexus>) -> ScsiTask<'_> {
        let mut task = ScsiTask::new(u64::from(self.itt.0), lun_id(self.lun).get(), self.cdb(), self.edtl, nexus);
        task.read = self.read;
        task.write = self.write;
        task.data_out = self.data_out;
        task.attr = TaskAttr::from_iscsi(self.attr);
        task
    }
}

/// The SCSI layer's LUN number for a PDU's LUN field.
pub fn lun_id(lun: Lun) -> LunId {
    LunId::from_field(lun.0.to_be_bytes())
}

/// What the connection driver must do.
pub enum Action {
    /// Send_Control.
    Send(Pdu),
    PutData(PutData),
    GetData(GetData),
    Execute(ScsiRequest),
    /// A piece of a streamed write's data for the SCSI layer: the command's bytes from
    /// `offset` (as asked for with a [`TaskEvent::Want`]).
    WriteData { itt: Itt, lun: Lun, offset: u32, buf: IoBuf },
    /// Abort a task in the SCSI layer (its completion must be dropped) and free the
    /// datamover's resources for it (Deallocate_Task_Resources). The driver carries it out
    /// when it takes it from [`Ffp::poll_action`]; until then the aborted task's ITT stays in
    /// use (a new command with it is rejected). From then on the datamover has forgotten the
    /// task and the SCSI layer reports it only as aborted (which the driver drops), except a
    /// result the SCSI layer finished before the abort, which the driver must hand over
    /// before it hands over any new PDU (the connection glue does: a result made while it
    /// carries out actions is collected in the same pass). So a completion of the old task
    /// is never taken for one of a new task that reuses the ITT.
    Abort { itt: Itt, lun: Lun },
    /// Reset a LUN for every session (LUN RESET) or the whole target (warm/cold reset).
    ResetLun(Lun),
    ResetTarget,
    /// Flush what is queued and close the connection. `logout`: a clean logout;
    /// `whole_session`: the initiator logged the whole session out, so the session's other
    /// connections close too.
    Close { reason: String, logout: bool, whole_session: bool },
}

/// Answers Text requests in full-feature phase (SendTargets).
pub trait TextResponder {
    /// The key=value pairs answering `request` (e.g. SendTargets=All).
    fn respond(&mut self, request: &Pairs) -> Pairs;
}

/// Where a task is, with what it holds there.
enum TaskState {
    /// Collecting unsolicited data (immediate data done; Data-Out with TTT 0xffffffff).
    Unsolicited { since: Option<Instant> },
    /// Waiting for budgeted buffer memory before its solicited data is asked for.
    WaitingBuffer(BufferWait),
    /// Solicited data requested from the datamover.
    Fetching { since: Option<Instant> },
    /// In the SCSI layer; a read's data goes out from here.
    Executing(ReadOut),
    /// A streamed write in the SCSI layer, which asks for its data piece by piece: the piece
    /// asked for and not handed over yet, if any.
    Streaming { want: Option<Want> },
}

impl TaskState {
    /// Handed to the SCSI layer ([`Action::Execute`]): an abort of it comes back as a result.
    fn in_scsi(&self) -> bool {
        matches!(self, TaskState::Executing(_) | TaskState::Streaming { .. })
    }

    /// The Data-Out timeout's clock of the data now due (see `timeouts`): write data asked
    /// for, or unsolicited data promised; `None` when no data is due.
    fn data_out_clock(&mut self) -> Option<&mut Option<Instant>> {
        match self {
            TaskState::Unsolicited { since }
            | TaskState::Fetching { since }
            | TaskState::Streaming { want: Some(Want { step: WantStep::Fetching { since }, .. }) } => Some(since),
            _ => None,
        }
    }

    /// The buffer memory the task waits for: its length and its place in the queue.
    fn buffer_wait(&mut self) -> Option<&mut BufferWait> {
        match self {
            TaskState::WaitingBuffer(w) | TaskState::Streaming { want: Some(Want { step: WantStep::WaitingBuffer(w), .. }) } => {
                Some(w)
            }
            _ => None,
        }
    }
}

/// A wait for budgeted buffer memory (see [`Ffp::grant_buffers`]).
struct BufferWait {
    /// Bytes wanted.
    len: u32,
    /// The task's place in the queue for budgeted memory (dropped with the task).
    waiter: Option<Waiter>,
}

impl BufferWait {
    fn new(len: u32) -> BufferWait {
        BufferWait { len, waiter: None }
    }
}

/// A read's data handed out so far.
#[derive(Default)]
struct ReadOut {
    /// Read data already handed to the datamover in pieces (a streamed read).
    sent: u32,
    /// A streamed read's latest piece (offset, buffer, length), held until the next one or
    /// the end comes, so that the last Data-In always goes out with the status (or with the
    /// F bit before a separate response, even when the read fails after its pieces).
    held: Option<(u32, IoBuf, u32)>,
}

/// The piece of a streamed write's data the SCSI layer asked for: the command's bytes
/// `[offset, offset+len)`, and where it is.
struct Want {
    offset: u32,
    len: u32,
    step: WantStep,
}

enum WantStep {
    /// Waiting for its buffer.
    WaitingBuffer(BufferWait),
    /// Its solicited part requested from the datamover.
    Fetching { since: Option<Instant> },
}

/// A write's data as it comes before the solicited part: unsolicited data (immediate data
/// and unsolicited Data-Out), and the buffer it goes into.
#[derive(Default)]
struct WriteIn {
    /// The write buffer (EDTL bytes): taken at once when all the data is unsolicited,
    /// else from the budget when the solicited part is about to be asked for.
    buf: Option<IoBuf>,
    /// Unsolicited data received before the buffer exists (immediate data the datamover
    /// could not put straight into a buffer, unsolicited Data-Out), in order: the PDUs' own
    /// segments, copied into `buf` (or a streamed write's pieces) when it comes (counted as
    /// staged).
    staged: Vec<Vec<u8>>,
    /// The command offset of `staged[0]`: 0, or the immediate bytes in `first_piece`.
    staged_from: u32,
    /// A streamed write's first piece, its immediate data already at its start (the
    /// datamover placed it there): the buffer for the SCSI layer's first want.
    first_piece: Option<IoBuf>,
    /// Unsolicited bytes received (immediate data and unsolicited Data-Out).
    received: u32,
    /// Unsolicited bytes the initiator may still send.
    expected: u32,
    next_data_sn: Sn,
}

struct Task {
    lun: Lun,
    cmd: ScsiCommand,
    cdb: [u8; 16],
    /// The whole CDB when an Extended CDB AHS makes it longer than 16 bytes, else empty.
    ext_cdb: Vec<u8>,
    /// The unsolicited write data (nothing for a command without write data).
    data: WriteIn,
    state: TaskState,
}

/// The full-feature phase of one connection.
pub struct Ffp {
    cfg: FfpConfig,
    /// The session's CmdSN window, shared by all its connections (on one reactor).
    window: SharedWindow,
    stat_sn: Sn,
    /// The live tasks, where they stay from their command to their end.
    tasks: TaskTable<Task>,
    /// Commands that arrived ahead of ExpCmdSN (within the window), by CmdSN, with the write
    /// buffer holding their immediate data if the datamover placed it.
    held: BTreeMap<u32, (Pdu, Option<IoBuf>)>,
    text: TextAssembler,
    text_out: Option<(Itt, Vec<u8>)>,
    next_ttt: u32,
    actions: VecDeque<Action>,
    last_rx: Instant,
    ping: Option<(Ttt, Instant)>,
    closing: bool,
    responder: Option<Box<dyn TextResponder>>,
    /// Where write buffers come from (the global pool; tests give their own).
    pool: &'static Pool,
    /// What this connection holds of the budget (shared with its SCSI reads).
    account: Account,
    /// Writes waiting for buffer memory, oldest first.
    waiting_buf: VecDeque<Itt>,
    /// Payload bytes this layer copied: unsolicited data that waited in its segment, copied
    /// into the write buffer (a second copy, see [`super::CopyStats::staged_bytes`]).
    staged_bytes: u64,
    /// Data segments whose bytes were copied, for the datamover to reuse (`take_spare`).
    spare: Vec<Vec<u8>>,
    /// ITTs of aborted tasks whose [`Action::Abort`] the driver has not taken yet: still in
    /// use (a completion or data event of the old task may still come under them).
    aborting: Vec<Itt>,
    /// Aborted tasks the SCSI layer has not given back yet (one entry each), when the driver
    /// reports aborted results ([`Self::set_aborted_results`]): they keep their place under
    /// the task cap, so aborting in a loop cannot pile up work in the SCSI layer.
    aborted_in_scsi: Vec<Itt>,
    /// The driver hands over every [`TaskEvent::Aborted`] ([`Self::set_aborted_results`]).
    aborted_results: bool,
    /// Plain WRITEs with more solicited data than this stream: their data is asked for
    /// piece by piece by the SCSI layer (0: never).
    write_stream_chunk: u32,
}

/// Most used data segments kept for the datamover.
const MAX_SPARE: usize = 64;

impl Ffp {
    /// Starts full-feature phase after a successful login: `exp_cmd_sn` is the CmdSN of the
    /// next command, `stat_sn` the next StatSN to send.
    pub fn new(cfg: FfpConfig, exp_cmd_sn: Sn, stat_sn: Sn, now: Instant) -> Ffp {
        let qd = cfg.queue_depth.max(1);
        let window = Rc::new(Cell::new(CmdWindow { exp_cmd_sn, max_cmd_sn: exp_cmd_sn.add(qd - 1) }));
        Ffp::join(cfg, window, stat_sn, now)
    }

    /// A further connection of an existing session: it shares the session's CmdSN window
    /// (RFC 7143 §3.2.2.1: one window per session, across connections).
    pub fn join(cfg: FfpConfig, window: SharedWindow, stat_sn: Sn, now: Instant) -> Ffp {
        let tasks = TaskTable::new(cfg.queue_depth);
        Ffp {
            window,
            stat_sn,
            cfg,
            tasks,
            held: BTreeMap::new(),
            text: TextAssembler::default(),
            text_out: None,
            next_ttt: 1,
            actions: VecDeque::new(),
            last_rx: now,
            ping: None,
            closing: false,
            responder: None,
            pool: Pool::global(),
            account: Account::new(),
            waiting_buf: VecDeque::new(),
            staged_bytes: 0,
            spare: Vec::new(),
            aborting: Vec::new(),
            aborted_in_scsi: Vec::new(),
            aborted_results: false,
            write_stream_chunk: 0,
        }
    }

    /// Streams plain WRITEs (6/10/12/16) larger than `bytes` whose data is not all
    /// unsolicited: the command goes to the SCSI layer once its unsolicited data is in, and
    /// the SCSI layer asks for the rest piece by piece, each piece's buffer taken from the
    /// budget when it is asked for (a [`TaskEvent::Want`]). 0: never (the default).
    pub fn set_write_stream_chunk(&mut self, bytes: u32) {
        self.write_stream_chunk = bytes;
    }

    /// A data segment this layer is done with, for the datamover to reuse
    /// ([`super::Datamover::recycle`]). The driver drains them every poll.
    pub fn take_spare(&mut self) -> Option<Vec<u8>> {
        self.spare.pop()
    }

    /// Takes write buffers from `pool` instead of the global one (tests).
    pub fn set_pool(&mut self, pool: &'static Pool) {
        self.pool = pool;
    }

    /// The account this connection's write buffers are charged to; give the same one to its
    /// SCSI channel, so reads and writes share the connection's fair share.
    pub fn account(&self) -> &Account {
        &self.account
    }

    /// Payload bytes the iSCSI layer copied so far: unsolicited write data that the
    /// datamover delivered in its segment (the budget had no room for the task's buffer yet,
    /// or an unsolicited Data-Out), copied from there into the write buffer. Each such byte
    /// was copied once before, on its way in ([`super::CopyStats::unsolicited_bytes`]).
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes
    }

    /// The pool this connection's write buffers come from (for the datamover's
    /// [`super::WriteBuffers`]).
    pub fn pool(&self) -> &'static Pool {
        self.pool
    }

    /// Where the datamover takes write buffers for immediate data: this connection's pool
    /// and account ([`super::Datamover::set_write_buffers`]).
    pub fn write_buffers(&self) -> super::WriteBuffers {
        super::WriteBuffers {
            pool: self.pool,
            account: self.account.clone(),
            largest_write: self.cfg.largest_write,
            stream_above: self.write_stream_chunk,
        }
    }

    /// Writes waiting for buffer memory now.
    pub fn waiting_for_buffers(&self) -> usize {
        self.waiting_buf.len()
    }

    /// Gives buffer memory to writes waiting for it, oldest first, as the budget allows;
    /// each one then asks the datamover for its solicited data. The driver calls it every
    /// poll; cheap when none waits. Returns how many were served.
    ///
    /// Fairness: the buffers are charged to the connection's [`Account`] (its reads' too),
    /// and a connection that already holds budgeted memory takes no more than its share of
    /// the budget ([`Pool::try_alloc_for`]), so one slow initiator cannot hold all of it; a
    /// connection holding little passes others' big waits (the reserve). What a silent
    /// initiator holds comes back at the Data-Out timeout (`timeouts`).
    pub fn grant_buffers(&mut self) -> usize {
        let mut served = 0;
        while let Some(&itt) = self.waiting_buf.front() {
            let pool = self.pool;
            let Some(t) = self.tasks.get_mut(&itt) else {
                // Aborted (or otherwise gone) meanwhile: its place went with it.
                self.waiting_buf.pop_front();
                continue;
            };
            let Some(w) = t.state.buffer_wait() else {
                self.waiting_buf.pop_front();
                continue;
            };
            let Some(mut buf) = pool.try_alloc_for(w.len as usize, &mut w.waiter, &self.account) else {
                break;
            };
            self.waiting_buf.pop_front();
            served += 1;
            if matches!(t.state, TaskState::Streaming { .. }) {
                self.serve_want(itt, buf);
                continue;
            }
            self.staged_bytes += gather(&mut t.data.staged, &mut buf, &mut self.spare);
            t.data.buf = Some(buf);
            self.fetch(itt);
        }
        served
    }

    /// Who answers SendTargets in this session.
    pub fn set_responder(&mut self, r: Box<dyn TextResponder>) {
        self.responder = Some(r);
    }

    pub fn config(&self) -> &FfpConfig {
        &self.cfg
    }

    /// The session's window, for connections that join it.
    pub fn window(&self) -> SharedWindow {
        self.window.clone()
    }

    fn exp(&self) -> Sn {
        self.window.get().exp_cmd_sn
    }

    fn max(&self) -> Sn {
        self.window.get().max_cmd_sn
    }

    /// Dispatches commands held for a gap that another connection of the session has
    /// since filled. The driver calls it every poll; cheap when nothing is held.
    pub fn release_held(&mut self) {
        // Usually nothing is held: no tree walk then (called per poll and per command).
        if self.held.is_empty() {
            return;
        }
        while let Some((p, buf)) = self.held.remove(&self.exp().get()) {
            self.advance_and_dispatch(p, buf);
        }
    }

    /// Sequence numbers without advancing StatSN (R2T, Data-In without status, NOP-In pings).
    pub fn sn(&self) -> SnState {
        SnState { stat_sn: self.stat_sn, exp_cmd_sn: self.exp(), max_cmd_sn: self.max() }
    }

    /// Takes a StatSN for a status-carrying PDU.
    fn next_stat_sn(&mut self) -> SnState {
        let s = self.sn();
        self.stat_sn = self.stat_sn.next();
        s
    }

    pub fn active_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Unsolicited write data held in segments outside the buffer budget now: immediate
    /// data and unsolicited Data-Out of tasks waiting for their buffer, and the immediate
    /// data of commands held for a CmdSN gap. Bounded per connection by the task cap
    /// (`queue_depth` tasks, see `on_scsi_command`) and the CmdSN window, each command
    /// holding at most FirstBurstLength of unsolicited data (RFC 7143 §13.14).
    pub fn staged_held_bytes(&self) -> usize {
        let staged: usize = self.tasks.values().flat_map(|t| t.data.staged.iter()).map(Vec::len).sum();
        let held: usize = self.held.values().map(|(p, _)| p.data.len()).sum();
        staged + held
    }

    /// Whether this layer has provably nothing to do without new input: no task, no
    /// command held for a CmdSN gap, no write waiting for buffers, no action queued, no
    /// segment to give back, not closing. Its timeouts run from the driver's timer.
    pub fn quiet(&self) -> bool {
        self.tasks.is_empty()
            && self.held.is_empty()
            && self.waiting_buf.is_empty()
            && self.actions.is_empty()
            && self.spare.is_empty()
            && self.aborting.is_empty()
            && !self.closing
    }

    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// The next action for the driver. Taking an [`Action::Abort`] frees its ITT for reuse
    /// (the driver carries the abort out now).
    #[inline]
    pub fn poll_action(&mut self) -> Option<Action> {
        // Looked at in place, then moved out straight into the caller's hands (an action is
        // large: one copy, not two).
        if let Some(&Action::Abort { itt, .. }) = self.actions.front() {
            if let Some(i) = self.aborting.iter().position(|x| *x == itt) {
                self.aborting.swap_remove(i);
            }
        }
        self.actions.pop_front()
    }

    fn close(&mut self, reason: impl Into<String>, logout: bool) {
        self.close_with(reason, logout, false)
    }

    fn close_with(&mut self, reason: impl Into<String>, logout: bool, whole_session: bool) {
        if !self.closing {
            self.closing = true;
            self.actions.push_back(Action::Close { reason: reason.into(), logout, whole_session });
        }
    }

    fn reject(&mut self, header: &[u8; BHS_LEN], reason: RejectReason) {
        let s = self.sn();
        let pdu = Pdu::with_data(
            Op::Reject(Reject {
                reason: reason.code(),
                stat_sn: s.stat_sn,
                exp_cmd_sn: s.exp_cmd_sn,
                max_cmd_sn: s.max_cmd_sn,
                data_sn_or_r2t_sn: Sn(0),
            }),
            header.to_vec(),
        );
        // A Reject takes a StatSN (RFC 7143 §11.17).
        self.stat_sn = self.stat_sn.next();
        self.actions.push_back(Action::Send(pdu));
    }

    /// Rejects a PDU given its decoded header.
    pub fn reject_pdu(&mut self, bhs: &Bhs, reason: RejectReason) {
        self.reject(&bhs.to_bytes(), reason);
    }

    /// Rejects a raw header (the datamover could not decode or accept it).
    pub fn reject_raw(&mut self, header: &[u8; BHS_LEN], reason: RejectReason) {
        self.reject(header, reason);
    }

    /// A control-type PDU from the datamover (Control_Notify).
    pub fn on_pdu(&mut self, pdu: Pdu, now: Instant) {
        self.on_pdu_with(pdu, None, now)
    }

    /// A SCSI Command whose immediate data the datamover copied straight into the task's
    /// write buffer `buf` (EDTL bytes; the data at its start, `pdu.data` empty).
    pub fn on_command_placed(&mut self, pdu: Pdu, buf: IoBuf, now: Instant) {
        self.on_pdu_with(pdu, Some(buf), now)
    }

    fn on_pdu_with(&mut self, pdu: Pdu, placed: Option<IoBuf>, now: Instant) {
        log::trace!("rx {:?} itt {:#x} data {} (ExpCmdSN {}, MaxCmdSN {})", pdu.opcode(), pdu.itt().0, pdu.data.len(), self.exp().get(), self.max().get());
        self.last_rx = now;
        if self.closing {
            return;
        }
        // ExpCmdSN / immediate rules apply to every initiator PDU with a CmdSN; Data-Out and
        // SNACK have none (RFC 7143 §3.2.2.1).
        match pdu.op() {
            Op::DataOut(_) => return self.on_data_out(pdu),
            Op::SnackRequest(_) => {
                // ERL 0: SNACK is not supported (RFC 7143 §11.16).
                return self.reject_pdu(&pdu.bhs, RejectReason::ProtocolError);
            }
            Op::Unknown(u) => {
                let raw = u.raw;
                return self.reject(&raw, RejectReason::CommandNotSupported);
            }
            Op::LoginRequest(_) => {
                // A login in full-feature phase is a protocol error (RFC 7143 §6.3).
                self.reject_pdu(&pdu.bhs, RejectReason::ProtocolError);
                return self.close("Login Request in full-feature phase", false);
            }
            op if !is_initiator_op(op) => {
                self.reject_pdu(&pdu.bhs, RejectReason::ProtocolError);
                return self.close("target opcode received from the initiator", false);
            }
            _ => {}
        }
        let (immediate, cmd_sn) = match cmd_sn_of(pdu.op()) {
            Some(v) => v,
            None => return,
        };
        if immediate {
            return self.dispatch(pdu, placed);
        }
        // RFC 7143 §3.2.2.1: outside [ExpCmdSN, MaxCmdSN] is silently ignored.
        if !cmd_sn.in_window(self.exp(), self.max()) {
            log::debug!(
                "dropping PDU with CmdSN {} outside the window [{}, {}]",
                cmd_sn.get(),
                self.exp().get(),
                self.max().get()
            );
            return;
        }
        if cmd_sn != self.exp() {
            // Ahead of a gap (several connections, or a lost PDU): hold it in order.
            self.held.insert(cmd_sn.get(), (pdu, placed));
            return;
        }
        self.advance_and_dispatch(pdu, placed);
        // Release commands that were waiting for this one.
        self.release_held();
    }

    fn advance_and_dispatch(&mut self, pdu: Pdu, placed: Option<IoBuf>) {
        let mut w = self.window.get();
        w.exp_cmd_sn = w.exp_cmd_sn.next();
        self.window.set(w);
        self.dispatch(pdu, placed);
    }

    /// Opens one slot of the command window (a task or a non-task command finished).
    fn slot_freed(&mut self) {
        let mut w = self.window.get();
        w.max_cmd_sn = w.max_cmd_sn.next();
        self.window.set(w);
    }

    fn dispatch(&mut self, pdu: Pdu, placed: Option<IoBuf>) {
        let immediate = cmd_sn_of(pdu.op()).is_none_or(|v| v.0);
        let is_nop_or_logout_or_text =
            matches!(pdu.op(), Op::NopOut(_) | Op::LogoutRequest(_) | Op::TextRequest(_));
        if self.cfg.discovery && !is_nop_or_logout_or_text {
            // RFC 7143 §4.3: discovery sessions carry Text, NOP and Logout only.
            self.reject_pdu(&pdu.bhs, RejectReason::ProtocolError);
            if !immediate {
                self.slot_freed();
            }
            return;
        }
        let Pdu { bhs, ahs, data } = pdu;
        // The header bytes a Reject quotes are made again only for a Reject.
        let lens = (bhs.total_ahs_length, bhs.data_segment_length);
        // Immediate data: in the task's buffer already, or in the segment.
        let unsolicited = match placed {
            Some(buf) => Immediate::Placed { buf, len: bhs.data_segment_length },
            None => Immediate::Segment(data),
        };
        match bhs.op {
            Op::ScsiCommand(cmd) => self.on_scsi_command(cmd, lens, ahs, unsolicited),
            Op::NopOut(n) => {
                if !immediate {
                    self.slot_freed();
                }
                if n.itt.is_reserved() {
                    // The answer to our ping (RFC 7143 §11.18).
                    if self.ping.is_some_and(|(t, _)| t == n.ttt) {
                        self.ping = None;
                    }
                    return;
                }
                let mut echo = unsolicited.into_segment();
                echo.truncate(self.cfg.initiator_mrdsl as usize);
                let s = self.next_stat_sn();
                let pdu = Pdu::with_data(
                    Op::NopIn(NopIn {
                        lun: n.lun,
                        itt: n.itt,
                        ttt: Ttt::RESERVED,
                        stat_sn: s.stat_sn,
                        exp_cmd_sn: s.exp_cmd_sn,
                        max_cmd_sn: s.max_cmd_sn,
                    }),
                    echo,
                );
                self.actions.push_back(Action::Send(pdu));
            }
            Op::TextRequest(t) => {
                if !immediate {
                    self.slot_freed();
                }
                self.on_text(t, unsolicited.into_segment())
            }
            Op::LogoutRequest(l) => {
                if !immediate {
                    self.slot_freed();
                }
                let resp = match l.reason_code {
                    logout::CLOSE_SESSION | logout::CLOSE_CONNECTION => logout::response::CLOSED_SUCCESSFULLY,
                    // ERL 0 has no connection recovery.
                    _ => logout::response::RECOVERY_NOT_SUPPORTED,
                };
                // Outstanding tasks of this connection end with it (RFC 7143 §11.14.1).
                self.abort_all(None);
                let s = self.next_stat_sn();
                self.actions.push_back(Action::Send(Pdu::new(Op::LogoutResponse(LogoutResponse {
                    response: resp,
                    itt: l.itt,
                    stat_sn: s.stat_sn,
                    exp_cmd_sn: s.exp_cmd_sn,
                    max_cmd_sn: s.max_cmd_sn,
                    time2wait: 0,
                    time2retain: 0,
                }))));
                if resp == logout::response::CLOSED_SUCCESSFULLY {
                    self.close_with("logout", true, l.reason_code == logout::CLOSE_SESSION);
                }
            }
            Op::TaskMgmtRequest(t) => {
                if !immediate {
                    self.slot_freed();
                }
                self.on_tmf(t)
            }
            _ => {}
        }
    }

    fn alloc_ttt(&mut self) -> Ttt {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == u32::MAX {
            self.next_ttt = 1;
        }
        Ttt(t)
    }

    /// Sends the Async Message "logout requested" (RFC 7143 §11.9.1: AsyncEvent 1; the
    /// initiator must log out within Parameter3 seconds). It takes a StatSN, as SPDK's does.
    /// Nothing once the connection is closing.
    pub fn request_logout(&mut self, time2wait: u16) {
        if self.closing {
            return;
        }
        let s = self.next_stat_sn();
        self.actions.push_back(Action::Send(Pdu::new(Op::AsyncMessage(AsyncMessage {
            lun: Lun(0),
            stat_sn: s.stat_sn,
            exp_cmd_sn: s.exp_cmd_sn,
            max_cmd_sn: s.max_cmd_sn,
            async_event: 1,
            async_vcode: 0,
            parameter1: 0,
            parameter2: 0,
            parameter3: time2wait,
        }))));
    }

    /// Timers: the Data-Out timeout (see `timeouts`), NOP-In pings on a silent connection
    /// and their timeout.
    pub fn on_timer(&mut self, now: Instant) {
        if self.closing {
            return;
        }
        self.check_data_out(now);
        if self.cfg.nop_in_interval.is_zero() {
            return;
        }
        if let Some((_, sent)) = self.ping {
            if now.duration_since(sent) >= self.cfg.nop_timeout {
                self.close("NOP-In ping timed out", false);
            }
            return;
        }
        if now.duration_since(self.last_rx) >= self.cfg.nop_in_interval {
            let ttt = self.alloc_ttt();
            self.ping = Some((ttt, now));
            let s = self.sn();
            // A ping does not advance StatSN (RFC 7143 §11.19: StatSN is not advanced when
            // ITT is 0xffffffff).
            self.actions.push_back(Action::Send(Pdu::new(Op::NopIn(NopIn {
                lun: Lun(0),
                itt: Itt::RESERVED,
                ttt,
                stat_sn: s.stat_sn,
                exp_cmd_sn: s.exp_cmd_sn,
                max_cmd_sn: s.max_cmd_sn,
            }))));
        }
    }
}

/// The immediate data of a command, as the datamover delivered it.
enum Immediate {
    /// In the PDU's data segment (possibly empty).
    Segment(Vec<u8>),
    /// Already at the start of the task's write buffer: `len` bytes.
    Placed { buf: IoBuf, len: u32 },
}

impl Immediate {
    fn len(&self) -> u32 {
        match self {
            Immediate::Segment(v) => v.len() as u32,
            Immediate::Placed { len, .. } => *len,
        }
    }

    /// The data segment of a PDU that is not a write (a NOP-Out, a Text Request): the
    /// datamover places data for SCSI Commands only.
    fn into_segment(self) -> Vec<u8> {
        match self {
            Immediate::Segment(v) => v,
            Immediate::Placed { .. } => Vec::new(),
        }
    }
}

/// Copies the staged unsolicited segments, in order from offset 0, into `buf`; the emptied
/// segments go to `spare` (up to its limit); returns the bytes copied.
fn gather(staged: &mut Vec<Vec<u8>>, buf: &mut IoBuf, spare: &mut Vec<Vec<u8>>) -> u64 {
    let mut off = 0;
    for seg in staged.drain(..) {
        if let Some(dst) = buf.get_mut(off..off + seg.len()) {
            dst.copy_from_slice(&seg);
        }
        off += seg.len();
        if spare.len() < MAX_SPARE && seg.capacity() <= riser_buf::MAX_SPARE_VEC {
            spare.push(seg);
        }
    }
    off as u64
}

fn is_initiator_op(op: &Op) -> bool {
    matches!(
        op,
        Op::NopOut(_)
            | Op::ScsiCommand(_)
            | Op::TaskMgmtRequest(_)
            | Op::LoginRequest(_)
            | Op::TextRequest(_)
            | Op::DataOut(_)
            | Op::LogoutRequest(_)
            | Op::SnackRequest(_)
    )
}

/// (immediate, CmdSN) of a PDU that carries a CmdSN.
fn cmd_sn_of(op: &Op) -> Option<(bool, Sn)> {
    Some(match op {
        Op::NopOut(n) => (n.immediate, n.cmd_sn),
        Op::ScsiCommand(c) => (c.immediate, c.cmd_sn),
        Op::TaskMgmtRequest(t) => (t.immediate, t.cmd_sn),
        Op::TextRequest(t) => (t.immediate, t.cmd_sn),
        Op::LogoutRequest(l) => (l.immediate, l.cmd_sn),
        _ => return None,
    })
}

// The sense data of commands that fail in the iSCSI layer, before or instead of the SCSI
// layer; sent in fixed format (SPC-4 4.5.3), as the SCSI layer does unless D_SENSE is set.

/// A write larger than the target takes (`largest_write`, the MAXIMUM TRANSFER LENGTH the
/// Block Limits VPD page advertises): ILLEGAL REQUEST, INVALID FIELD IN CDB.
const SENSE_WRITE_TOO_LARGE: Sense = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);

/// A broken Data-Out sequence or failed solicited data under ERL 0: ABORTED COMMAND, DATA PHASE
/// ERROR, as iSCSI targets report it.
const SENSE_DATA_PHASE_ERROR: Sense = Sense::new(SenseKey::AbortedCommand, Asc::DATA_PHASE_ERROR);

mod command;
mod read;
mod table;
mod task_mgmt;
mod text;
mod timeouts;
mod write;

#[cfg(test)]
mod tests;
