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
use std::time::Instant;

use riser_bdev::IoBuf;
use riser_buf::{Account, Pool, Waiter};
pub use riser_scsi::Residual;
use riser_scsi::{Asc, Sense, SenseKey, Status};

use super::config::FfpConfig;
use super::datamover::{GetData, PutData, SnState};
use crate::pdu::{
    logout, response, tmf, Bhs, LogoutResponse, Lun, NopIn, Op, Pdu, Reject, RejectReason,
    ScsiCommand, ScsiResponse, TaskMgmtResponse, TextResponse, BHS_LEN,
};
use crate::serial::{Itt, Sn, TagMap, Ttt};
use crate::text::{encode_pairs, Pairs, TextAssembler};

/// SCSI status GOOD / CHECK CONDITION (SAM-5), as the `u8` of [`ScsiDone::status`].
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
    /// Write data (EDTL bytes, `data_out_len` of them received).
    pub data_out: Option<IoBuf>,
    pub data_out_len: u32,
    /// A streamed write: no data yet; the SCSI layer asks for it piece by piece
    /// ([`Ffp::on_scsi_want`]) and gets each piece through [`Action::WriteData`].
    pub data_out_later: bool,
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
}

/// A finished SCSI command.
pub struct ScsiDone {
    pub itt: Itt,
    pub status: u8,
    /// Sense data (fixed format), empty when none.
    pub sense: Vec<u8>,
    /// Read data: the first `data_in_len` bytes go to the initiator.
    pub data_in: Option<IoBuf>,
    pub data_in_len: u32,
    /// The command's buffer offset of `data_in[0]`: 0, or where the last piece of a streamed
    /// read starts (the pieces before it came through [`Ffp::on_scsi_data`]).
    pub data_in_offset: u32,
    pub residual: Residual,
    /// The write buffer given with the request, returned for reuse.
    pub data_out: Option<IoBuf>,
}

/// What the connection driver must do.
pub enum Action {
    /// Send_Control.
    Send(Pdu),
    PutData(PutData),
    GetData(GetData),
    Execute(ScsiRequest),
    /// A piece of a streamed write's data for the SCSI layer: the command's bytes from
    /// `offset` (as asked for with [`Ffp::on_scsi_want`]).
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

/// Where a task is.
enum TaskState {
    /// Collecting unsolicited data (immediate data done; Data-Out with TTT 0xffffffff).
    Unsolicited,
    /// Waiting for budgeted buffer memory before its solicited data is asked for.
    WaitingBuffer,
    /// Solicited data requested from the datamover.
    Fetching,
    /// In the SCSI layer.
    Executing,
}

struct Task {
    lun: Lun,
    cmd: ScsiCommand,
    cdb: [u8; 16],
    /// The whole CDB when an Extended CDB AHS makes it longer than 16 bytes, else empty.
    ext_cdb: Vec<u8>,
    state: TaskState,
    /// The write buffer (EDTL bytes): taken at once when all the data is unsolicited,
    /// else from the budget when the solicited part is about to be asked for.
    buf: Option<IoBuf>,
    /// Unsolicited data received before the buffer exists (immediate data the datamover
    /// could not put straight into a buffer, unsolicited Data-Out), in order from offset 0:
    /// the PDUs' own segments, copied into `buf` when it comes (counted as staged).
    staged: Vec<Vec<u8>>,
    /// The task's place in the queue for budgeted memory (dropped with the task).
    waiter: Option<Waiter>,
    /// Unsolicited bytes received (immediate data and unsolicited Data-Out).
    received: u32,
    /// Unsolicited bytes the initiator may still send.
    unsolicited_expected: u32,
    next_data_sn: Sn,
    /// Read data already handed to the datamover in pieces (a streamed read).
    data_in_sent: u32,
    /// A streamed read's latest piece (offset, buffer, length), held until the next one or
    /// the end comes, so that the last Data-In always goes out with the status (or with the
    /// F bit before a separate response, even when the read fails after its pieces).
    held_piece: Option<(u32, IoBuf, u32)>,
    /// A streamed write: the SCSI layer asks for its data piece by piece.
    stream: bool,
    /// The piece of a streamed write asked for and not yet handed over: (offset, len).
    want: Option<(u32, u32)>,
    /// A streamed write's first piece, its immediate data already at its start (the
    /// datamover placed it there): the buffer for the SCSI layer's first want.
    first_piece: Option<IoBuf>,
    /// The command offset of `staged[0]`: 0, or the immediate bytes in `first_piece`.
    staged_from: u32,
    /// Handed to the SCSI layer ([`Action::Execute`]): an abort of it comes back as a result.
    in_scsi: bool,
    /// When the Data-Out timeout's clock started for the data now due (see `timeouts`).
    data_out_since: Option<Instant>,
}

/// The full-feature phase of one connection.
pub struct Ffp {
    cfg: FfpConfig,
    /// The session's CmdSN window, shared by all its connections (on one reactor).
    window: SharedWindow,
    stat_sn: Sn,
    tasks: TagMap<Itt, Task>,
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
    /// The driver reports every aborted SCSI result ([`Self::on_scsi_aborted`]).
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
        Ffp {
            window,
            stat_sn,
            cfg,
            tasks: TagMap::default(),
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
    /// budget when it is asked for (see [`Self::on_scsi_want`]). 0: never (the default).
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
            let Some(edtl) = self
                .tasks
                .get(&itt)
                .filter(|t| matches!(t.state, TaskState::WaitingBuffer))
                .map(|t| t.want.map_or(t.cmd.expected_data_transfer_length, |(_, len)| len))
            else {
                // Aborted (or otherwise gone) meanwhile: its place went with it.
                self.waiting_buf.pop_front();
                continue;
            };
            let Some(t) = self.tasks.get_mut(&itt) else { break };
            let Some(mut buf) = pool.try_alloc_for(edtl as usize, &mut t.waiter, &self.account) else {
                break;
            };
            self.waiting_buf.pop_front();
            served += 1;
            if t.stream {
                self.serve_want(itt, buf);
                continue;
            }
            self.staged_bytes += gather(&mut t.staged, &mut buf, &mut self.spare);
            t.buf = Some(buf);
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
        let staged: usize = self.tasks.values().flat_map(|t| t.staged.iter()).map(Vec::len).sum();
        let held: usize = self.held.values().map(|(p, _)| p.data.len()).sum();
        staged + held
    }

    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// The next action for the driver. Taking an [`Action::Abort`] frees its ITT for reuse
    /// (the driver carries the abort out now).
    pub fn poll_action(&mut self) -> Option<Action> {
        let a = self.actions.pop_front();
        if let Some(Action::Abort { itt, .. }) = &a {
            if let Some(i) = self.aborting.iter().position(|x| x == itt) {
                self.aborting.swap_remove(i);
            }
        }
        a
    }

    /// Asks the driver to abort task `itt` (out of the task table already); its ITT stays
    /// in use until the driver takes the action (see [`Action::Abort`]). `in_scsi`: the
    /// task is in the SCSI layer, which gives it back with a result.
    fn abort_action(&mut self, itt: Itt, lun: Lun, in_scsi: bool) {
        self.aborting.push(itt);
        if in_scsi && self.aborted_results {
            self.aborted_in_scsi.push(itt);
        }
        self.actions.push_back(Action::Abort { itt, lun });
    }

    /// The driver promises to report every SCSI result of an aborted task with
    /// [`Self::on_scsi_aborted`] (the ones it drops): an aborted task then counts against
    /// the task cap until the SCSI layer gives it back, not only until the abort is sent.
    pub fn set_aborted_results(&mut self, on: bool) {
        self.aborted_results = on;
        if !on {
            self.aborted_in_scsi.clear();
        }
    }

    /// The SCSI layer gave back aborted task `itt` (its result, dropped).
    pub fn on_scsi_aborted(&mut self, itt: Itt) {
        self.scsi_gave_back(itt);
    }

    /// An aborted task `itt` is out of the SCSI layer.
    fn scsi_gave_back(&mut self, itt: Itt) {
        if let Some(i) = self.aborted_in_scsi.iter().position(|x| *x == itt) {
            self.aborted_in_scsi.swap_remove(i);
        }
    }

    /// Tasks counted against the cap: live ones, and aborted ones still in the SCSI layer.
    fn tasks_held(&self) -> usize {
        self.tasks.len() + self.aborted_in_scsi.len()
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
        let immediate = cmd_sn_of(pdu.op()).map_or(true, |v| v.0);
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
        let header = pdu.bhs.to_bytes();
        let Pdu { bhs, ahs, data } = pdu;
        // Immediate data: in the task's buffer already, or in the segment.
        let unsolicited = match placed {
            Some(buf) => Immediate::Placed { buf, len: bhs.data_segment_length },
            None => Immediate::Segment(data),
        };
        match bhs.op {
            Op::ScsiCommand(cmd) => self.on_scsi_command(cmd, &header, ahs, unsolicited),
            Op::NopOut(n) => {
                if !immediate {
                    self.slot_freed();
                }
                if n.itt.is_reserved() {
                    // The answer to our ping (RFC 7143 §11.18).
                    if self.ping.map_or(false, |(t, _)| t == n.ttt) {
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

    fn on_scsi_command(&mut self, cmd: ScsiCommand, header: &[u8; BHS_LEN], ahs: Vec<u8>, data: Immediate) {
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
            self.reject(header, RejectReason::InvalidPduField);
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
                self.reject(header, RejectReason::ImmediateCommandReject);
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
                    self.reject(header, RejectReason::InvalidPduField);
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
            self.reject(header, RejectReason::InvalidPduField);
            return;
        }
        let imm = data.len();
        if imm > 0 && (!cmd.write || !self.cfg.immediate_data || imm > self.cfg.first_burst_length || imm > edtl) {
            // Immediate data the session did not allow, or more than promised.
            release_slot(self);
            self.reject(header, RejectReason::ProtocolError);
            return;
        }
        if cmd.write && edtl > self.cfg.largest_write {
            release_slot(self);
            self.respond_check(cmd.itt, immediate, SENSE_WRITE_TOO_LARGE, edtl, true);
            return;
        }
        let mut task = Task {
            lun: cmd.lun,
            cdb: cmd.cdb,
            ext_cdb,
            state: TaskState::Executing,
            buf: None,
            staged: Vec::new(),
            waiter: None,
            received: imm,
            unsolicited_expected: 0,
            next_data_sn: Sn(0),
            data_in_sent: 0,
            held_piece: None,
            stream: false,
            want: None,
            first_piece: None,
            staged_from: 0,
            in_scsi: false,
            data_out_since: None,
            cmd,
        };
        if task.cmd.write && edtl > 0 {
            // Unsolicited Data-Out may follow unless F is set or InitialR2T=Yes
            // (RFC 7143 §13.10, §13.14).
            if !self.cfg.initial_r2t && !task.cmd.final_bit {
                let first_burst = self.cfg.first_burst_length.min(edtl);
                task.unsolicited_expected = first_burst.saturating_sub(imm);
            }
            match data {
                // The datamover had the budget's room for the task's buffer and copied the
                // immediate data straight into it: the one copy; the rest is asked for at once.
                Immediate::Placed { buf, .. } if buf.len() == edtl as usize => task.buf = Some(buf),
                // The first piece of a write that streams: the immediate data is at its start.
                Immediate::Placed { buf, len } if len as usize <= buf.len() && buf.len() < edtl as usize => {
                    task.first_piece = Some(buf);
                    task.staged_from = len;
                }
                Immediate::Placed { buf, .. } => {
                    log::error!("task {:#x}: placed write buffer of {} bytes for EDTL {edtl}", task.cmd.itt.0, buf.len());
                    release_slot(self);
                    self.respond_check(task.cmd.itt, immediate, SENSE_DATA_PHASE_ERROR, edtl, true);
                    return;
                }
                // All of it came as immediate data: the segment itself becomes the write
                // buffer, no copy (at most FirstBurstLength per command, within the window).
                Immediate::Segment(data) if imm == edtl => task.buf = Some(IoBuf::from_vec(data)),
                // More follows (unsolicited Data-Out, or solicited) and the datamover did not
                // place it (no room in the budget then): no buffer yet, the immediate data
                // waits in its segment, copied into the buffer when the budget grants it.
                Immediate::Segment(data) if imm > 0 => task.staged.push(data),
                Immediate::Segment(_) => {}
            }
            task.state = TaskState::Unsolicited;
            let itt = task.cmd.itt;
            self.tasks.insert(itt, task);
            self.after_unsolicited(itt);
        } else {
            let itt = task.cmd.itt;
            self.tasks.insert(itt, task);
            self.execute(itt);
        }
    }

    /// Moves a write on once its unsolicited data is in: wait for buffer memory and fetch
    /// the rest, or execute.
    fn after_unsolicited(&mut self, itt: Itt) {
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        if t.unsolicited_expected > 0 {
            return;
        }
        let edtl = t.cmd.expected_data_transfer_length;
        if t.received < edtl && t.buf.is_some() {
            // The buffer came with the immediate data (the datamover placed it there): the
            // budget granted it already.
            return self.fetch(itt);
        }
        let plain_write = t.ext_cdb.is_empty() && matches!(t.cdb[0], 0x0a | 0x2a | 0xaa | 0x8a);
        if t.received < edtl && plain_write && self.write_stream_chunk > 0 && edtl - t.received > self.write_stream_chunk {
            // A large WRITE: to the SCSI layer now, which asks for the data piece by piece
            // once the command has passed its checks (on_scsi_want).
            t.stream = true;
            return self.execute(itt);
        }
        if let Some(first) = t.first_piece.take() {
            // Placed as a first piece, but the write does not stream after all (not a plain
            // WRITE): its immediate data waits with the rest, copied once more.
            let imm = t.staged_from as usize;
            t.staged.insert(0, first.as_slice()[..imm.min(first.len())].to_vec());
            t.staged_from = 0;
        }
        if t.received < edtl {
            // Solicited data follows: first the memory for it, in turn with every other
            // write of every connection (grant_buffers), then Get_Data.
            t.state = TaskState::WaitingBuffer;
            self.waiting_buf.push_back(itt);
            if self.waiting_buf.len() == 1 {
                self.grant_buffers();
            }
            return;
        }
        if t.buf.is_none() {
            // All of it came unsolicited, in segments: one segment is the buffer as it is;
            // several are copied into one (the memory they hold is freed as it is used).
            t.buf = Some(if t.staged.len() == 1 && t.staged[0].len() == edtl as usize {
                IoBuf::from_vec(t.staged.remove(0))
            } else {
                let mut buf = IoBuf::alloc(edtl as usize);
                self.staged_bytes += gather(&mut t.staged, &mut buf, &mut self.spare);
                buf
            });
        }
        self.execute(itt);
    }

    /// Get_Data for a write whose buffer is there.
    fn fetch(&mut self, itt: Itt) {
        let sn = self.sn();
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        let edtl = t.cmd.expected_data_transfer_length;
        let Some(buf) = t.buf.take() else { return };
        t.state = TaskState::Fetching;
        t.data_out_since = None;
        self.actions.push_back(Action::GetData(GetData {
            itt,
            lun: t.lun,
            buf,
            offset: t.received,
            len: edtl - t.received,
            base: 0,
            more: false,
            sn,
        }));
    }

    fn execute(&mut self, itt: Itt) {
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        t.state = TaskState::Executing;
        t.in_scsi = true;
        let data_out_len = if t.buf.is_some() { t.cmd.expected_data_transfer_length } else { 0 };
        self.actions.push_back(Action::Execute(ScsiRequest {
            itt,
            lun: t.lun,
            cdb: t.cdb,
            ext_cdb: std::mem::take(&mut t.ext_cdb),
            edtl: t.cmd.expected_data_transfer_length,
            read: t.cmd.read,
            write: t.cmd.write,
            attr: t.cmd.attr,
            data_out: t.buf.take(),
            data_out_len,
            data_out_later: t.stream,
        }));
    }

    /// The SCSI layer asks for a piece of a streamed write's data (the command's bytes
    /// `[offset, offset+len)`): its buffer from the budget (in turn with every other write),
    /// then the unsolicited bytes it covers, then Get_Data for the rest.
    pub fn on_scsi_want(&mut self, itt: Itt, offset: u32, len: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return; // aborted or failed meanwhile
        };
        let edtl = t.cmd.expected_data_transfer_length;
        if !t.stream || t.want.is_some() || len == 0 || offset.checked_add(len).is_none_or(|end| end > edtl) {
            // Not a want this layer can serve: the command fails rather than waits forever.
            log::error!("task {:#x}: the SCSI layer asked for data [{offset}, +{len}) it cannot have: the command fails", itt.0);
            let (lun, immediate) = (t.lun, t.cmd.immediate);
            self.tasks.remove(&itt);
            self.abort_action(itt, lun, true);
            self.respond_check(itt, immediate, SENSE_DATA_PHASE_ERROR, edtl, false);
            return;
        }
        t.want = Some((offset, len));
        if let Some(first) = t.first_piece.take() {
            if offset == 0 && first.len() == len as usize {
                // Its buffer came with the command (taken from the budget then).
                return self.serve_want(itt, first);
            }
            // Not the piece it was taken for: its immediate data waits with the rest.
            let imm = t.staged_from as usize;
            t.staged.insert(0, first.as_slice()[..imm.min(first.len())].to_vec());
            t.staged_from = 0;
        }
        t.state = TaskState::WaitingBuffer;
        self.waiting_buf.push_back(itt);
        if self.waiting_buf.len() == 1 {
            self.grant_buffers();
        }
    }

    /// A streamed write's piece has its buffer: the unsolicited bytes it covers, then
    /// Get_Data for the rest (or straight to the SCSI layer when there is none).
    fn serve_want(&mut self, itt: Itt, mut buf: IoBuf) {
        let sn = self.sn();
        let Some(t) = self.tasks.get_mut(&itt) else { return };
        let Some((offset, len)) = t.want else { return };
        let end = offset + len;
        // Unsolicited bytes [staged_from, received) wait in their segments, in order (those
        // before staged_from are in the first piece already).
        let mut at = t.staged_from;
        for seg in &t.staged {
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
        if end <= t.received {
            t.want = None;
            t.state = TaskState::Executing;
            let lun = t.lun;
            self.actions.push_back(Action::WriteData { itt, lun, offset, buf });
            return;
        }
        let from = offset.max(t.received);
        t.state = TaskState::Fetching;
        t.data_out_since = None;
        self.actions.push_back(Action::GetData(GetData { itt, lun: t.lun, buf, offset: from, len: end - from, base: offset, more: end < edtl, sn }));
    }

    fn on_data_out(&mut self, pdu: Pdu) {
        let Op::DataOut(d) = pdu.op().clone() else { return };
        let header = pdu.bhs.to_bytes();
        let Some(t) = self.tasks.get_mut(&d.itt) else {
            // Data for a task we do not know (aborted, or bogus): drop it quietly
            // unless the tag is reserved, which is a protocol error.
            if d.itt.is_reserved() {
                self.reject(&header, RejectReason::InvalidPduField);
            }
            return;
        };
        if !d.ttt.is_reserved() || !matches!(t.state, TaskState::Unsolicited) || t.unsolicited_expected == 0 {
            // Solicited data is the datamover's; unsolicited data beyond FirstBurstLength or
            // for a task not expecting it is a protocol error (RFC 7143 §13.14).
            return self.reject(&header, RejectReason::ProtocolError);
        }
        let len = pdu.data.len() as u32;
        let edtl = t.cmd.expected_data_transfer_length;
        let in_order = d.data_sn == t.next_data_sn && d.buffer_offset == t.received;
        if !in_order || len > t.unsolicited_expected || d.buffer_offset.saturating_add(len) > edtl {
            // ERL 0: the command fails, the connection lives.
            let itt = d.itt;
            let t = self.tasks.remove(&itt);
            if let Some(t) = t {
                self.respond_check(itt, t.cmd.immediate, SENSE_DATA_PHASE_ERROR, edtl, false);
            }
            return;
        }
        match t.buf.as_mut() {
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
            None => t.staged.push(pdu.data),
        }
        t.received += len;
        t.unsolicited_expected -= len;
        t.next_data_sn = t.next_data_sn.next();
        if d.final_bit || t.unsolicited_expected == 0 {
            t.unsolicited_expected = 0;
            self.after_unsolicited(d.itt);
        }
    }

    /// Data_Completion_Notify for a Get_Data.
    pub fn on_data_ready(&mut self, itt: Itt, buf: IoBuf) {
        if let Some(t) = self.tasks.get_mut(&itt).filter(|t| t.stream) {
            // A streamed write's piece: on to the SCSI layer, which asks for the next.
            if let Some((offset, _)) = t.want.take() {
                t.state = TaskState::Executing;
                let lun = t.lun;
                self.actions.push_back(Action::WriteData { itt, lun, offset, buf });
            }
            return;
        }
        if let Some(t) = self.tasks.get_mut(&itt) {
            t.received = t.cmd.expected_data_transfer_length;
            t.buf = Some(buf);
            self.execute(itt);
        }
    }

    /// Get_Data failed: the command ends with CHECK CONDITION.
    pub fn on_data_failed(&mut self, itt: Itt, reason: &str) {
        if let Some(t) = self.tasks.remove(&itt) {
            log::warn!("task {:#x}: write data failed: {reason}", itt.0);
            if t.stream {
                // The command is in the SCSI layer already, waiting for this piece.
                self.abort_action(itt, t.lun, t.in_scsi);
            }
            self.respond_check(itt, t.cmd.immediate, SENSE_DATA_PHASE_ERROR, t.cmd.expected_data_transfer_length, false);
        }
    }

    /// A piece of a streamed read's data (`len` bytes of `buf`, from the command's buffer
    /// offset `offset`): the piece before it goes out (Put_Data without status) and this one
    /// waits for the next or the end; the task goes on. Pieces come in order; the last one
    /// comes with the task's [`ScsiDone`].
    pub fn on_scsi_data(&mut self, itt: Itt, offset: u32, buf: IoBuf, len: u32) {
        let sn = self.sn();
        let Some(t) = self.tasks.get_mut(&itt) else {
            return; // aborted meanwhile
        };
        let edtl = t.cmd.expected_data_transfer_length;
        if !t.cmd.read || offset != t.data_in_sent || offset >= edtl {
            // Data-In for a command without the R bit is never sent (see on_scsi_done).
            return;
        }
        let len = len.min(edtl - offset);
        t.data_in_sent = offset + len;
        if let Some((offset, buf, len)) = t.held_piece.replace((offset, buf, len)) {
            self.actions.push_back(Action::PutData(PutData { itt, lun: t.lun, buf, len, offset, response: None, sn }));
        }
    }

    /// A SCSI completion.
    pub fn on_scsi_done(&mut self, done: ScsiDone) {
        let Some(t) = self.tasks.remove(&done.itt) else {
            // Aborted meanwhile, and finished before the abort reached the SCSI layer.
            self.scsi_gave_back(done.itt);
            return;
        };
        let immediate = t.cmd.immediate;
        if !immediate {
            self.slot_freed();
        }
        if t.stream && t.want.is_some() {
            // The write ended (an error) while a piece was asked for: the datamover forgets
            // its Get_Data (the SCSI layer has nothing left of the task).
            self.abort_action(done.itt, t.lun, false);
        }
        let s = self.next_stat_sn();
        let mut residual = done.residual;
        if done.data_in_len > 0 && !t.cmd.read {
            // Data-In for a command without the R bit (a READ sent as a write, or with no
            // data expected): its Data-In EDTL is 0, so nothing is sent and the whole
            // SCSI-presented length is a residual overflow (RFC 7143 §11.4.5.2), GOOD or not.
            // libiscsi's iSCSIResiduals.Read10Invalid expects the status to stay as it is.
            let shown = done.data_in_offset.saturating_add(done.data_in_len);
            let presented = match done.residual {
                Residual::Overflow(n) => shown.saturating_add(n),
                _ => shown,
            };
            log::debug!("task {:#x}: {presented} bytes of Data-In without the R bit, not sent", done.itt.0);
            residual = Residual::Overflow(presented);
        }
        let response = scsi_response(done.itt, done.status, &done.sense, residual, s);
        let edtl = t.cmd.expected_data_transfer_length;
        let mut t = t;
        let last_ok = done.data_in.is_some() && done.data_in_len > 0 && t.cmd.read && done.data_in_offset == t.data_in_sent && done.data_in_offset < edtl;
        if let Some((offset, buf, len)) = t.held_piece.take() {
            if !last_ok {
                // The read ended without a last piece (it failed on the way): the held one
                // is the last Data-In, the response follows it.
                self.actions.push_back(Action::PutData(PutData { itt: done.itt, lun: t.lun, buf, len, offset, response: Some(response), sn: s }));
                return;
            }
            self.actions.push_back(Action::PutData(PutData { itt: done.itt, lun: t.lun, buf, len, offset, response: None, sn: s }));
        }
        match done.data_in {
            // The data (whole, or a streamed read's last piece, right after the others).
            Some(buf) if done.data_in_len > 0 && t.cmd.read && done.data_in_offset == t.data_in_sent && done.data_in_offset < edtl => {
                self.actions.push_back(Action::PutData(PutData {
                    itt: done.itt,
                    lun: t.lun,
                    buf,
                    len: done.data_in_len.min(edtl - done.data_in_offset),
                    offset: done.data_in_offset,
                    response: Some(response),
                    sn: s,
                }))
            }
            // Pieces went out but the last brings no data (the read failed on the way): the
            // response still closes the stream in the datamover (TCP's ExpDataSN).
            _ if t.data_in_sent > 0 => self.actions.push_back(Action::PutData(PutData {
                itt: done.itt,
                lun: t.lun,
                buf: IoBuf::empty(),
                len: 0,
                offset: t.data_in_sent,
                response: Some(response),
                sn: s,
            })),
            _ => self.actions.push_back(Action::Send(response)),
        }
    }

    /// A response without sense data (TASK SET FULL) for a command that never became a task.
    fn respond_status(&mut self, itt: Itt, immediate: bool, status: u8, edtl: u32) {
        if !immediate {
            self.slot_freed();
        }
        let s = self.next_stat_sn();
        let residual = if edtl > 0 { Residual::Underflow(edtl) } else { Residual::None };
        self.actions.push_back(Action::Send(scsi_response(itt, status, &[], residual, s)));
    }

    /// A CHECK CONDITION response for a task that never reached the SCSI layer.
    fn respond_check(&mut self, itt: Itt, immediate: bool, sense: Sense, edtl: u32, slot_already_freed: bool) {
        if !immediate && !slot_already_freed {
            self.slot_freed();
        }
        let s = self.next_stat_sn();
        let residual = if edtl > 0 { Residual::Underflow(edtl) } else { Residual::None };
        let sense = sense.fixed();
        self.actions.push_back(Action::Send(scsi_response(itt, STATUS_CHECK_CONDITION, sense.as_slice(), residual, s)));
    }

    fn on_text(&mut self, t: crate::pdu::TextRequest, data: Vec<u8>) {
        // A continuation of our own long answer (RFC 7143 §11.10.4): empty request, our TTT.
        if let Some((itt, rest)) = self.text_out.take() {
            if itt == t.itt && data.is_empty() {
                return self.send_text_segment(t.itt, t.lun, rest);
            }
        }
        match self.text.push(&data, t.continue_bit) {
            Ok(None) => {
                // More request text follows: answer with an empty response (F=0), and a TTT
                // that the initiator returns with the next part.
                let s = self.next_stat_sn();
                let ttt = self.alloc_ttt();
                self.actions.push_back(Action::Send(Pdu::new(Op::TextResponse(TextResponse {
                    final_bit: false,
                    continue_bit: false,
                    lun: t.lun,
                    itt: t.itt,
                    ttt,
                    stat_sn: s.stat_sn,
                    exp_cmd_sn: s.exp_cmd_sn,
                    max_cmd_sn: s.max_cmd_sn,
                }))));
            }
            Ok(Some(pairs)) => {
                self.text.reset();
                let answer = self.answer_text(&pairs);
                self.send_text_segment(t.itt, t.lun, encode_pairs(&answer));
            }
            Err(e) => {
                self.text.reset();
                log::warn!("bad Text request: {e}");
                self.reject_pdu(&Bhs { total_ahs_length: 0, data_segment_length: 0, op: Op::TextRequest(t) }, RejectReason::ProtocolError);
            }
        }
    }

    fn answer_text(&mut self, pairs: &Pairs) -> Pairs {
        let (send_targets, others): (Pairs, Pairs) =
            pairs.iter().cloned().partition(|(k, _)| k == "SendTargets");
        let mut out = Pairs::new();
        if !send_targets.is_empty() {
            if let Some(r) = self.responder.as_mut() {
                out.extend(r.respond(&send_targets));
            }
        }
        // riser renegotiates nothing in full-feature phase (RFC 7143 §6.2: answer what we
        // do not take part in with NotUnderstood).
        out.extend(others.into_iter().map(|(k, _)| (k, "NotUnderstood".to_string())));
        out
    }

    /// Sends the next piece of a Text answer: at most what the initiator receives per PDU
    /// (128 bytes on iSER, see [`super::config::ISER_INITIATOR_RECV_DATA_SEGMENT`]); the rest
    /// waits for the initiator's empty continuation request (C=1, RFC 7143 §11.11).
    fn send_text_segment(&mut self, itt: Itt, lun: Lun, mut text: Vec<u8>) {
        let max = self.cfg.initiator_mrdsl.max(1) as usize;
        let more = text.len() > max;
        let rest = if more { text.split_off(max) } else { Vec::new() };
        let ttt = if more { self.alloc_ttt() } else { Ttt::RESERVED };
        if more {
            self.text_out = Some((itt, rest));
        }
        let s = self.next_stat_sn();
        self.actions.push_back(Action::Send(Pdu::with_data(
            Op::TextResponse(TextResponse {
                final_bit: !more,
                continue_bit: more,
                lun,
                itt,
                ttt,
                stat_sn: s.stat_sn,
                exp_cmd_sn: s.exp_cmd_sn,
                max_cmd_sn: s.max_cmd_sn,
            }),
            text,
        )));
    }

    fn alloc_ttt(&mut self) -> Ttt {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == u32::MAX {
            self.next_ttt = 1;
        }
        Ttt(t)
    }

    fn abort_all(&mut self, lun: Option<Lun>) {
        let itts: Vec<Itt> = self
            .tasks
            .iter()
            .filter(|(_, t)| lun.map_or(true, |l| t.lun == l))
            .map(|(i, _)| *i)
            .collect();
        for itt in itts {
            if let Some(t) = self.tasks.remove(&itt) {
                if !t.cmd.immediate {
                    self.slot_freed();
                }
                self.abort_action(itt, t.lun, t.in_scsi);
            }
        }
    }

    fn on_tmf(&mut self, t: crate::pdu::TaskMgmtRequest) {
        let function = t.function & 0x7f;
        let resp = match function {
            tmf::ABORT_TASK => {
                let itt = t.referenced_task_tag;
                match self.tasks.remove(&itt) {
                    Some(task) => {
                        if !task.cmd.immediate {
                            self.slot_freed();
                        }
                        self.abort_action(itt, task.lun, task.in_scsi);
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

/// A SCSI Response PDU (RFC 7143 §11.4); sense data travels with a 2-byte length
/// (§11.4.7.2).
fn scsi_response(itt: Itt, status: u8, sense: &[u8], residual: Residual, s: SnState) -> Pdu {
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

mod timeouts;

#[cfg(test)]
mod tests;
