//! The transport-independent part of one initiator session, shared by the TCP connection
//! ([`crate::conn::Conn`]) and the iSER one ([`crate::iser::IserConn`]): the sequence numbers
//! and the CmdSN window, the management task (setup commands, logout), the task slots of the
//! data path, the login exchange, and what a received PDU that moves no data asks for (SCSI
//! Response, NOP-In, Async Message, Reject, Logout / Text / Task Management responses).
//!
//! Each transport keeps its own I/O (socket reads and writes, RDMA posts) and plugs it in
//! through [`Transport`].

use std::collections::VecDeque;
use std::time::Instant;

use riser_iscsi::pdu::{
    logout, Bhs, Isid, LoginRequest, LogoutRequest, Lun, NopOut, Op, ScsiCommand, Stage,
};
use riser_iscsi::serial::{Itt, Sn};
use riser_iscsi::text::{encode_pairs, parse_pairs};

use crate::conn::{
    login_status_text, status, status_name, Dir, IoError, KeyNegotiation, LoginOptions, ScsiExec,
    Sense, LOGIN_MAX_RECV_DSL, MGMT_ITT,
};
use crate::url::TargetUrl;

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

/// Sequence numbers, CmdSN window and management task of one session.
pub(crate) struct SessionState {
    pub cmd_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    pub exp_stat_sn: Sn,
    pub lun: Lun,
    next_mgmt: u32,
    pub mgmt: Mgmt,
}

/// What the transport does after [`SessionState::receive`].
pub(crate) enum Received {
    /// Nothing more.
    Done,
    /// A ping from the target: send this NOP-Out (its TTT), echoing the ping's data.
    Ping(NopOut),
    /// The SCSI Response of an I/O task.
    Complete(Outcome),
}

/// How an I/O task ended (its status), for the transport to complete it.
pub(crate) struct Outcome {
    pub slot: usize,
    pub status: u8,
    pub sense: Option<Sense>,
    /// A residual on a GOOD status.
    pub residual: bool,
}

impl SessionState {
    pub fn new(lun: Lun) -> Self {
        SessionState {
            cmd_sn: Sn(1),
            exp_cmd_sn: Sn(1),
            max_cmd_sn: Sn(1),
            exp_stat_sn: Sn(0),
            lun,
            next_mgmt: 0,
            mgmt: Mgmt::default(),
        }
    }

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

    pub fn saw_stat_sn(&mut self, stat_sn: Sn) {
        let next = stat_sn.next();
        if next.gt(self.exp_stat_sn) {
            self.exp_stat_sn = next;
        }
    }

    pub fn window_open(&self) -> bool {
        self.cmd_sn.le(self.max_cmd_sn)
    }

    /// Makes a new management task (reading `want` bytes) the one in flight; its ITT.
    fn new_mgmt(&mut self, want: usize) -> u32 {
        self.next_mgmt = self.next_mgmt.wrapping_add(1) & 0x7fff_ffff;
        let itt = MGMT_ITT | self.next_mgmt;
        self.mgmt = Mgmt {
            itt,
            want,
            ..Mgmt::default()
        };
        itt
    }

    /// A SCSI command (simple task attribute) with the next CmdSN.
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

    /// The Logout Request closing the session, as a new management task.
    fn logout_request(&mut self) -> LogoutRequest {
        let itt = self.new_mgmt(0);
        LogoutRequest {
            immediate: true,
            reason_code: logout::CLOSE_SESSION,
            itt: Itt(itt),
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        }
    }

    /// Handles a received PDU other than Data-In and R2T (those are the transport's): the
    /// sequence numbers, the window, the management task. `data`: its data segment;
    /// `slot_of`: the I/O task slot of an ITT, or the error.
    pub fn receive(
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
                if r.response != 0 {
                    return Err(format!(
                        "{label}: the target failed a command (iSCSI response {:#04x})",
                        r.response
                    ));
                }
                let residual =
                    (r.residual_underflow || r.residual_overflow) && r.status == status::GOOD;
                return Ok(Received::Complete(Outcome {
                    slot,
                    status: r.status,
                    sense,
                    residual,
                }));
            }
            Op::NopIn(n) => {
                self.update_window(n.exp_cmd_sn, n.max_cmd_sn);
                if !n.itt.is_reserved() {
                    self.saw_stat_sn(n.stat_sn);
                }
                if !n.ttt.is_reserved() {
                    // A ping from the target: answer with its TTT and the same data.
                    return Ok(Received::Ping(NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: Itt::RESERVED,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    }));
                }
            }
            Op::AsyncMessage(a) => {
                self.update_window(a.exp_cmd_sn, a.max_cmd_sn);
                self.saw_stat_sn(a.stat_sn);
                match a.async_event {
                    // A SCSI asynchronous event (sense data), or parameter renegotiation:
                    // nothing to do for a load generator.
                    0 | 4 => {}
                    1 => {
                        return Err(format!(
                            "{label}: the target asked for logout (Async Message)"
                        ))
                    }
                    e => {
                        return Err(format!(
                        "{label}: the target is dropping the connection (Async Message event {e})"
                    ))
                    }
                }
            }
            Op::Reject(r) => {
                self.saw_stat_sn(r.stat_sn);
                return Err(format!(
                    "{label}: the target rejected a PDU (reason {:#04x})",
                    r.reason
                ));
            }
            Op::LogoutResponse(l) => {
                self.saw_stat_sn(l.stat_sn);
                if l.itt.0 == self.mgmt.itt {
                    self.mgmt.logout = Some(l.response);
                }
            }
            Op::TextResponse(t) => self.saw_stat_sn(t.stat_sn),
            Op::TaskMgmtResponse(t) => self.saw_stat_sn(t.stat_sn),
            other => {
                return Err(format!(
                    "{label}: unexpected PDU from the target: {:?}",
                    other.opcode()
                ))
            }
        }
        Ok(Received::Done)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskState {
    Idle,
    /// Waiting for the CmdSN window to open.
    Blocked,
    InFlight,
}

/// One I/O task slot.
pub(crate) struct Task {
    pub state: TaskState,
    pub itt: u32,
    pub seq: u16,
    pub dir: Dir,
    pub lba: u64,
    pub blocks: u32,
    pub len: u32,
    /// TCP: Data-In bytes received.
    pub received: u32,
    /// The caller's view of the data (TCP: where Data-In lands and Data-Out comes from).
    pub buf: Vec<u8>,
    /// iSER: `buf` changed since it was last copied into the registered region.
    pub dirty: bool,
}

impl Task {
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
pub(crate) struct Tasks {
    pub slots: Vec<Task>,
    blocked: VecDeque<usize>,
    pub inflight: usize,
}

impl Tasks {
    pub fn new() -> Self {
        Tasks {
            slots: Vec::new(),
            blocked: VecDeque::new(),
            inflight: 0,
        }
    }

    /// `qd` idle slots with `bs`-byte buffers.
    pub fn start(&mut self, qd: usize, bs: usize) {
        self.slots = (0..qd)
            .map(|slot| Task {
                state: TaskState::Idle,
                itt: slot as u32,
                seq: 0,
                dir: Dir::Read,
                lba: 0,
                blocks: 0,
                len: 0,
                received: 0,
                // A recognisable non-zero pattern, so benchmark writes carry real data.
                buf: vec![(slot as u8) | 1; bs],
                dirty: false,
            })
            .collect();
        self.blocked = VecDeque::with_capacity(qd);
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
        let t = &mut self.slots[slot];
        debug_assert_eq!(t.state, TaskState::Idle);
        t.seq = (t.seq + 1) & 0x7fff;
        t.itt = ((t.seq as u32) << 16) | slot as u32;
        t.dir = dir;
        t.lba = lba;
        t.blocks = blocks;
        t.len = blocks * block_size;
        t.received = 0;
        self.inflight += 1;
        if self.blocked.is_empty() && window_open {
            true
        } else {
            t.state = TaskState::Blocked;
            self.blocked.push_back(slot);
            false
        }
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
        t
    }
}

/// A transport's part of login, management commands and logout.
pub(crate) trait Transport: ScsiExec {
    fn state(&mut self) -> &mut SessionState;
    /// Sends a control PDU (Login Request, management command, Logout Request) and waits
    /// until it is out.
    fn send_control(&mut self, op: Op, data: &[u8], deadline: Instant) -> Result<(), String>;
    /// During login: waits for the next PDU; appends its data segment to `text`.
    fn recv_login(&mut self, deadline: Instant, text: &mut Vec<u8>) -> Result<Bhs, String>;
    /// Waits for and handles what the target sends next (`what`: for the timeout message).
    fn progress(&mut self, deadline: Instant, what: &str) -> Result<(), String>;
}

/// Logs in (normal session, AuthMethod=None) negotiating with `neg`, up to the full-feature
/// phase, whose first CmdSN and window it takes. Returns the negotiation, for the transport
/// to check and apply.
pub(crate) fn login<T: Transport>(
    io: &mut T,
    url: &TargetUrl,
    opts: &LoginOptions,
    mut neg: KeyNegotiation,
    deadline: Instant,
) -> Result<KeyNegotiation, String> {
    let itt = Itt(MGMT_ITT);
    let mut csg = Stage::SecurityNegotiation;
    let mut keys: Vec<(String, String)> = vec![
        ("InitiatorName".into(), opts.initiator_name.clone()),
        ("TargetName".into(), url.iqn.clone()),
        ("SessionType".into(), "Normal".into()),
        ("AuthMethod".into(), "None".into()),
    ];
    neg.proposed.push("AuthMethod".into());
    let mut tsih = 0u16;
    for _round in 0..16 {
        let nsg = if csg == Stage::SecurityNegotiation {
            Stage::LoginOperationalNegotiation
        } else {
            Stage::FullFeaturePhase
        };
        let s = io.state();
        let mut req = LoginRequest {
            transit_bit: true,
            continue_bit: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: Isid(opts.isid),
            tsih,
            itt,
            cid: 0,
            cmd_sn: s.cmd_sn,
            exp_stat_sn: s.exp_stat_sn,
        };
        let text = encode_pairs(&keys);
        if text.len() > LOGIN_MAX_RECV_DSL as usize {
            return Err(format!("{}: login text too long", io.label()));
        }
        io.send_control(Op::LoginRequest(req.clone()), &text, deadline)?;
        // Collect the response text (C=1 continues it in further responses).
        let mut text = Vec::new();
        let resp = loop {
            let h = io.recv_login(deadline, &mut text)?;
            let Op::LoginResponse(r) = h.op else {
                return Err(format!(
                    "{}: expected a Login Response, got {:?}",
                    io.label(),
                    h.op.opcode()
                ));
            };
            if r.status.class != 0 {
                return Err(format!(
                    "{}: {}",
                    io.label(),
                    login_status_text(r.status.class, r.status.detail)
                ));
            }
            io.state().exp_stat_sn = r.stat_sn.next();
            if !r.continue_bit {
                break r;
            }
            text.truncate(64 * 1024);
            req.transit_bit = false;
            req.exp_stat_sn = io.state().exp_stat_sn;
            io.send_control(Op::LoginRequest(req.clone()), &[], deadline)?;
        };
        let pairs = parse_pairs(&text)
            .map_err(|e| format!("{}: bad login text from the target: {e}", io.label()))?;
        let answers = neg
            .take_response(&pairs)
            .map_err(|e| format!("{}: {e}", io.label()))?;
        tsih = resp.tsih;
        if resp.transit_bit {
            match resp.nsg {
                Stage::FullFeaturePhase => {
                    if !answers.is_empty() {
                        return Err(format!(
                            "{}: the target ended login while offering keys {:?}",
                            io.label(),
                            answers.iter().map(|(k, _)| k).collect::<Vec<_>>()
                        ));
                    }
                    let s = io.state();
                    s.cmd_sn = resp.exp_cmd_sn;
                    s.exp_cmd_sn = resp.exp_cmd_sn;
                    s.max_cmd_sn = resp.max_cmd_sn;
                    return Ok(neg);
                }
                Stage::LoginOperationalNegotiation => {
                    csg = Stage::LoginOperationalNegotiation;
                    keys = answers;
                    keys.extend(neg.operational_proposal());
                }
                other => {
                    return Err(format!(
                        "{}: the target moved login to stage {other:?}",
                        io.label()
                    ))
                }
            }
        } else {
            // The target stays in this stage: answer what it offered.
            keys = answers;
        }
    }
    Err(format!("{}: login did not finish in 16 rounds", io.label()))
}

/// Runs one management SCSI command (no data out, `read_len` bytes in) once the window
/// allows it, and waits for its status: (status, sense, bytes transferred). The data is the
/// transport's to fetch.
pub(crate) fn run_mgmt<T: Transport>(
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

/// Sends the Logout Request and waits for its response: afterwards the transport closes the
/// connection and reports with [`logout_result`].
pub(crate) fn logout_exchange<T: Transport>(io: &mut T, deadline: Instant) -> Result<(), String> {
    let req = io.state().logout_request();
    io.send_control(Op::LogoutRequest(req), &[], deadline)?;
    while io.state().mgmt.logout.is_none() {
        io.progress(deadline, "the Logout Response")?;
    }
    Ok(())
}

/// The outcome of a logout, once its response came.
pub(crate) fn logout_result(state: &SessionState, label: &str) -> Result<(), String> {
    match state.mgmt.logout {
        Some(0) | None => Ok(()),
        Some(r) => Err(format!("{label}: logout answered with response {r}")),
    }
}
