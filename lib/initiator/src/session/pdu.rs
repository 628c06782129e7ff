//! [`PduSession`]: riser-perf's initiator session over whole PDUs, with no transport of its
//! own. It makes the PDUs to send (Login Requests, SCSI commands with their immediate and
//! unsolicited data, Data-Out, NOP-Out, Task Management and Logout requests) with the right
//! CmdSN and ExpStatSN, and takes the PDUs received into [`Event`]s; the caller carries them
//! (an in-memory target, a socket with a framer, ...). The protocol logic is the one of
//! riser-perf's TCP and iSER transports ([`SessionState`], [`Tasks`], [`LoginExchange`]).
//!
//! ```no_run
//! use riser_iscsi::pdu::{logout, Lun, Pdu};
//! use riser_initiator::scsi::{rw_cdb, Dir};
//! use riser_initiator::session::{
//!     Event, KeyNegotiation, LoginParams, PduSession, Proposal, INITIATOR_NAME,
//! };
//!
//! /// Hands `pdu` to the target, returns what it answered (in the caller's harness).
//! fn target(pdu: Pdu) -> Vec<Pdu> {
//!     unimplemented!()
//! }
//!
//! # fn main() -> Result<(), String> {
//! let mut s = PduSession::new("mem", Lun(0));
//! // Login: the keys are the caller's to choose.
//! let proposal = Proposal {
//!     immediate_data: false,
//!     initial_r2t: true,
//!     first_burst: 65536,
//!     max_burst: 262144,
//!     max_recv_dsl: 8192,
//!     ..Proposal::tcp(false, false)
//! };
//! let params = LoginParams::normal(INITIATOR_NAME, "iqn.2016-06.io.riser:t", [0x80, 0, 0, 0, 0, 1]);
//! let neg = s.login_via(&params, KeyNegotiation::with_proposal(proposal), |req| {
//!     target(req).into_iter().next().ok_or_else(|| "no Login Response".to_string())
//! })?;
//! assert!(neg.initial_r2t);
//!
//! // A WRITE: its data goes out unsolicited as negotiated, the rest answers R2Ts.
//! let (itt, pdus) = s.write(&rw_cdb(Dir::Write, 0, 8), &[0xa5; 4096])?;
//! let mut to_send = pdus;
//! while let Some(p) = to_send.pop() {
//!     for answer in target(p) {
//!         match s.receive(&answer)? {
//!             Event::R2t { reply, .. } => to_send.extend(reply),
//!             Event::Complete(c) => assert_eq!((c.itt, c.status), (itt, 0)),
//!             _ => {}
//!         }
//!     }
//! }
//! // A READ, a ping, an ABORT TASK, a LUN RESET, the logout.
//! let (_, read) = s.read(&rw_cdb(Dir::Read, 0, 8), 4096)?;
//! let (_, ping) = s.nop_out(b"ping");
//! let (_, abort) = s.abort_task(itt);
//! let (_, reset) = s.lun_reset();
//! let (_, bye) = s.logout(logout::CLOSE_SESSION);
//! # let _ = (read, ping, abort, reset, bye);
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;

use riser_iscsi::pdu::{extended_cdb_ahs, tmf, AsyncMessage, Bhs, Lun, Op, Pdu, TaskMgmtResponse};
use riser_iscsi::serial::{Itt, Sn, Ttt};

use super::{
    data_outs, KeyNegotiation, LoginExchange, LoginParams, LoginStep, Negotiated, Outcome,
    Received, SessionState, TaskState, Tasks,
};
use crate::scsi::{Dir, Sense};

/// How much of a write's data goes out with its command, unsolicited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsolicited {
    /// As negotiated: immediate data (ImmediateData, up to FirstBurstLength and the target's
    /// MaxRecvDataSegmentLength), then unsolicited Data-Out up to FirstBurstLength
    /// (InitialR2T=No). What riser-perf's TCP initiator does.
    Negotiated,
    /// Exactly `immediate` bytes in the command PDU, then `data_out` more bytes in
    /// unsolicited Data-Out PDUs (each at most the target's MaxRecvDataSegmentLength),
    /// whatever was negotiated: to see how a target copes.
    Exactly { immediate: u32, data_out: u32 },
}

/// How a login goes on after a Login Response.
#[derive(Debug)]
pub enum LoginProgress {
    /// Send this Login Request and hand its response to [`PduSession::login_response`].
    Send(Pdu),
    /// The session is in the full-feature phase, with these operational parameters.
    Done(Negotiated),
}

/// A SCSI command that ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    pub itt: Itt,
    /// The iSCSI response (0: command completed at target; `status` is valid).
    pub response: u8,
    /// The SCSI status.
    pub status: u8,
    /// The sense data of a CHECK CONDITION.
    pub sense: Option<Sense>,
    /// Residual underflow / overflow and the residual count, as the target reported them.
    pub underflow: bool,
    pub overflow: bool,
    pub residual_count: u32,
    /// A read's data: the bytes its Data-In PDUs brought (in order; empty for a write).
    pub data: Vec<u8>,
}

/// What a PDU received by a [`PduSession`] meant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Nothing for the caller (a Text Response, a NOP-In that is neither a ping nor an
    /// answer, a response to no task of ours).
    None,
    /// A Data-In without status: `len` bytes at `offset` of task `itt`'s data, kept for its
    /// [`Completed::data`].
    DataIn { itt: Itt, offset: u32, len: u32 },
    /// An R2T of write `itt` for `len` bytes at `offset`: `reply` holds the Data-Out PDUs
    /// answering it, from the write's data (send them, or not).
    R2t {
        itt: Itt,
        ttt: Ttt,
        offset: u32,
        len: u32,
        reply: Vec<Pdu>,
    },
    /// A SCSI command ended (SCSI Response, or Data-In with status).
    Complete(Completed),
    /// A ping from the target (NOP-In with a TTT): `reply` is the NOP-Out answering it, with
    /// the ping's TTT and data.
    Ping { reply: Pdu },
    /// A NOP-In answering our NOP-Out `itt`, with the data it echoed.
    NopIn { itt: Itt, data: Vec<u8> },
    /// The response to Task Management request `itt` (see [`tmf::response`]); `ended`: the
    /// tasks it ended here (the ABORT TASK's task, or every task for the task set and reset
    /// functions, when the function completed).
    TaskMgmt {
        itt: Itt,
        response: u8,
        ended: Vec<Itt>,
    },
    /// A Logout Response.
    Logout {
        itt: Itt,
        response: u8,
        time2wait: u16,
        time2retain: u16,
    },
    /// A Reject: the reason code and the header of the rejected PDU (its data segment), if
    /// it parses.
    Reject {
        reason: u8,
        rejected: Option<Box<Bhs>>,
    },
    /// An Async Message.
    Async(AsyncMessage),
}

/// An initiator session over PDUs: see the [module documentation](self).
///
/// Commands go out with the next CmdSN whatever the window says (ask [`Self::window_open`]
/// first to respect it); NOP-Out, Task Management and Logout requests are immediate.
/// Errors (`Err(String)`, prefixed with the label) are what the session cannot make sense
/// of: an answer to an unknown task, a Data-In or R2T outside its task, an unexpected PDU,
/// a failed login.
pub struct PduSession {
    label: String,
    s: SessionState,
    t: Tasks,
    neg: Negotiated,
    login: Option<LoginExchange>,
    logged_in: bool,
    /// The CmdSN of every SCSI command in flight (ABORT TASK's RefCmdSN).
    cmd_sns: HashMap<u32, Sn>,
    /// Task management requests in flight: (function, referenced task).
    tmfs: HashMap<u32, (u8, Itt)>,
}

impl PduSession {
    /// A session on `lun` (the LUN field of every command; see [`crate::url::lun_field`]),
    /// not logged in; `label` starts its error messages.
    pub fn new(label: impl Into<String>, lun: Lun) -> PduSession {
        PduSession {
            label: label.into(),
            s: SessionState::new(lun),
            t: Tasks::new(),
            neg: Negotiated::default(),
            login: None,
            logged_in: false,
            cmd_sns: HashMap::new(),
            tmfs: HashMap::new(),
        }
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// The sequence numbers and window.
    pub fn state(&self) -> &SessionState {
        &self.s
    }

    /// The sequence numbers, to change (to send a wrong CmdSN on purpose, ...).
    pub fn state_mut(&mut self) -> &mut SessionState {
        &mut self.s
    }

    /// The operational parameters in force (RFC 7143 defaults before login).
    pub fn negotiated(&self) -> Negotiated {
        self.neg
    }

    /// Whether the login reached the full-feature phase.
    pub fn logged_in(&self) -> bool {
        self.logged_in
    }

    /// Whether the next command is inside the CmdSN window.
    pub fn window_open(&self) -> bool {
        self.s.window_open()
    }

    /// SCSI commands in flight.
    pub fn outstanding(&self) -> usize {
        self.t.inflight
    }

    fn err(&self, e: impl std::fmt::Display) -> String {
        format!("{}: {e}", self.label)
    }

    // ---- login -----------------------------------------------------------------------

    /// Starts a login as `params`, negotiating with `neg`: the first Login Request. Hand
    /// each response to [`Self::login_response`]. AuthMethod=None, or CHAP when
    /// [`LoginParams::chap`] is set (see [`LoginParams::with_chap`]): mutual CHAP if its
    /// config has `mutual`, the target's answer then checked (a wrong one fails the login).
    pub fn login(&mut self, params: &LoginParams, neg: KeyNegotiation) -> Result<Pdu, String> {
        let (ex, req, text) =
            LoginExchange::start(params, neg, &self.s).map_err(|e| self.err(e))?;
        self.login = Some(ex);
        self.logged_in = false;
        Ok(Pdu::with_data(Op::LoginRequest(req), text))
    }

    /// Takes a PDU received during login: the next Login Request, or the end of the login.
    /// Err: the login failed (a refusal, a protocol error) and is over.
    pub fn login_response(&mut self, pdu: &Pdu) -> Result<LoginProgress, String> {
        let Some(ex) = self.login.as_mut() else {
            return Err(self.err("no login in progress"));
        };
        match ex.on_response(&mut self.s, pdu.op(), &pdu.data) {
            Ok(LoginStep::Send(req, text)) => Ok(LoginProgress::Send(Pdu::with_data(
                Op::LoginRequest(req),
                text,
            ))),
            Ok(LoginStep::Done(neg)) => {
                self.login = None;
                self.logged_in = true;
                self.neg = neg.result;
                Ok(LoginProgress::Done(self.neg))
            }
            Err(e) => {
                self.login = None;
                Err(self.err(e))
            }
        }
    }

    /// The whole login: `exchange` sends a Login Request and returns the target's response.
    pub fn login_via(
        &mut self,
        params: &LoginParams,
        neg: KeyNegotiation,
        mut exchange: impl FnMut(Pdu) -> Result<Pdu, String>,
    ) -> Result<Negotiated, String> {
        let mut req = self.login(params, neg)?;
        loop {
            let resp = exchange(req)?;
            match self.login_response(&resp)? {
                LoginProgress::Send(next) => req = next,
                LoginProgress::Done(n) => return Ok(n),
            }
        }
    }

    // ---- SCSI commands ---------------------------------------------------------------

    /// A SCSI command with any CDB (longer than 16 bytes: the rest in an Extended CDB AHS):
    /// reading `read_len` bytes, or writing `write` (not both), its write data sent
    /// unsolicited as `unsolicited` says. Its ITT and the PDUs to send: the command (with
    /// its immediate data), then the unsolicited Data-Out PDUs.
    pub fn scsi_command(
        &mut self,
        cdb: &[u8],
        read_len: u32,
        write: &[u8],
        unsolicited: Unsolicited,
    ) -> Result<(Itt, Vec<Pdu>), String> {
        if cdb.is_empty() {
            return Err(self.err("an empty CDB"));
        }
        if read_len > 0 && !write.is_empty() {
            return Err(self.err("bidirectional commands are not supported"));
        }
        let (dir, buf) = if write.is_empty() {
            (Dir::Read, vec![0u8; read_len as usize])
        } else {
            (Dir::Write, write.to_vec())
        };
        let len = buf.len() as u32;
        let (all, immediate) = match (dir, unsolicited) {
            (Dir::Read, _) => (0, 0),
            (Dir::Write, Unsolicited::Negotiated) => self.neg.unsolicited(len),
            (
                Dir::Write,
                Unsolicited::Exactly {
                    immediate,
                    data_out,
                },
            ) => {
                let all = immediate.saturating_add(data_out);
                if all > len {
                    return Err(self.err(format!(
                        "{all} bytes of unsolicited data for a {len}-byte write"
                    )));
                }
                (all, immediate)
            }
        };
        let slot = self.t.open(dir, buf).map_err(|e| self.err(e))?;
        let itt = Itt(self.t.slots[slot].itt);
        let mut c = [0u8; 16];
        let n = cdb.len().min(16);
        c[..n].copy_from_slice(&cdb[..n]);
        let cmd = self.s.command(
            itt,
            read_len > 0,
            dir == Dir::Write,
            len,
            c,
            all == immediate,
        );
        self.cmd_sns.insert(itt.0, cmd.cmd_sn);
        let data = self.t.slots[slot].buf[..immediate as usize].to_vec();
        let mut p = Pdu::with_data(Op::ScsiCommand(cmd), data);
        if cdb.len() > 16 {
            p.ahs = extended_cdb_ahs(&cdb[16..]);
        }
        let mut out = vec![p];
        out.extend(self.data_out_pdus(slot, Ttt::RESERVED, immediate, all - immediate));
        Ok((itt, out))
    }

    /// A command reading `len` bytes (0: no data at all, e.g. TEST UNIT READY).
    pub fn read(&mut self, cdb: &[u8], len: u32) -> Result<(Itt, Pdu), String> {
        let (itt, mut pdus) = self.scsi_command(cdb, len, &[], Unsolicited::Negotiated)?;
        match pdus.pop() {
            Some(p) => Ok((itt, p)),
            None => Err(self.err("internal: no command PDU")),
        }
    }

    /// A command writing `data`, unsolicited data as negotiated.
    pub fn write(&mut self, cdb: &[u8], data: &[u8]) -> Result<(Itt, Vec<Pdu>), String> {
        self.scsi_command(cdb, 0, data, Unsolicited::Negotiated)
    }

    /// Data-Out PDUs with `[offset, offset + len)` of write `itt`'s data, for target
    /// transfer tag `ttt` (an R2T's; `Ttt::RESERVED`: unsolicited), split at the target's
    /// MaxRecvDataSegmentLength. ([`Event::R2t`] brings them ready made.)
    pub fn data_out(&self, itt: Itt, ttt: Ttt, offset: u32, len: u32) -> Result<Vec<Pdu>, String> {
        let slot = self.t.slot_of(&self.label, itt)?;
        let t = &self.t.slots[slot];
        if t.dir != Dir::Write || offset as u64 + len as u64 > t.len as u64 {
            return Err(self.err(format!(
                "no {len} bytes at offset {offset} in a {}-byte {:?}",
                t.len, t.dir
            )));
        }
        Ok(self.data_out_pdus(slot, ttt, offset, len))
    }

    fn data_out_pdus(&self, slot: usize, ttt: Ttt, offset: u32, len: u32) -> Vec<Pdu> {
        let t = &self.t.slots[slot];
        let mut out = Vec::new();
        data_outs(
            &self.s,
            Itt(t.itt),
            ttt,
            offset,
            len,
            self.neg.max_send_dsl,
            |d, r| out.push(Pdu::with_data(Op::DataOut(d), t.buf[r].to_vec())),
        );
        out
    }

    /// Forgets task `itt` (one the target will not answer, e.g. a rejected command): true
    /// if it was in flight.
    pub fn forget(&mut self, itt: Itt) -> bool {
        match self.t.slot_of(&self.label, itt) {
            Ok(slot) => {
                self.end(slot);
                true
            }
            Err(_) => false,
        }
    }

    fn end(&mut self, slot: usize) -> &mut super::Task {
        let t = self.t.finish(slot);
        self.cmd_sns.remove(&t.itt);
        t
    }

    fn complete(&mut self, o: Outcome) -> Completed {
        let t = self.end(o.slot);
        let mut data = std::mem::take(&mut t.buf);
        if t.dir == Dir::Read {
            data.truncate(t.received as usize);
        } else {
            data.clear();
        }
        Completed {
            itt: Itt(t.itt),
            response: o.response,
            status: o.status,
            sense: o.sense,
            underflow: o.underflow,
            overflow: o.overflow,
            residual_count: o.residual_count,
            data,
        }
    }

    // ---- NOP-Out, task management, logout -------------------------------------------

    /// A ping: an immediate NOP-Out asking for a NOP-In that echoes `data`.
    pub fn nop_out(&mut self, data: &[u8]) -> (Itt, Pdu) {
        let itt = self.s.next_mgmt_itt();
        let nop = self.s.nop_out(itt, Ttt::RESERVED, self.s.lun);
        (itt, Pdu::with_data(Op::NopOut(nop), data.to_vec()))
    }

    /// A Task Management Function Request (see [`tmf`]) about task `referenced`
    /// (`Itt::RESERVED` when none) whose CmdSN was `ref_cmd_sn`.
    pub fn task_mgmt(&mut self, function: u8, referenced: Itt, ref_cmd_sn: Sn) -> (Itt, Pdu) {
        let itt = self.s.next_mgmt_itt();
        self.tmfs.insert(itt.0, (function, referenced));
        let req = self.s.task_mgmt(itt, function, referenced, ref_cmd_sn);
        (itt, Pdu::new(Op::TaskMgmtRequest(req)))
    }

    /// ABORT TASK of `task` (its RefCmdSN is the task's CmdSN; for a task not in flight,
    /// the next CmdSN).
    pub fn abort_task(&mut self, task: Itt) -> (Itt, Pdu) {
        let ref_cmd_sn = self.cmd_sns.get(&task.0).copied().unwrap_or(self.s.cmd_sn);
        self.task_mgmt(tmf::ABORT_TASK, task, ref_cmd_sn)
    }

    /// LOGICAL UNIT RESET of the session's LUN.
    pub fn lun_reset(&mut self) -> (Itt, Pdu) {
        self.task_mgmt(tmf::LOGICAL_UNIT_RESET, Itt::RESERVED, Sn(0))
    }

    /// A Logout Request for `reason_code` (see [`riser_iscsi::pdu::logout`]).
    pub fn logout(&mut self, reason_code: u8) -> (Itt, Pdu) {
        let req = self.s.logout_request(reason_code);
        (req.itt, Pdu::new(Op::LogoutRequest(req)))
    }

    // ---- receiving -------------------------------------------------------------------

    /// Takes a PDU from the target (in the full-feature phase; login responses go to
    /// [`Self::login_response`]): its sequence numbers, its data, and what it means.
    pub fn receive(&mut self, pdu: &Pdu) -> Result<Event, String> {
        let label = self.label.as_str();
        match pdu.op() {
            Op::DataIn(d) => match self.t.data_in(&mut self.s, label, d, &pdu.data)? {
                Some(o) => Ok(Event::Complete(self.complete(o))),
                None => Ok(Event::DataIn {
                    itt: d.itt,
                    offset: d.buffer_offset,
                    len: pdu.data.len() as u32,
                }),
            },
            Op::R2t(r) => {
                let slot = self.t.r2t(&mut self.s, label, r)?;
                let (offset, len) = (r.buffer_offset, r.desired_data_transfer_length);
                Ok(Event::R2t {
                    itt: r.itt,
                    ttt: r.ttt,
                    offset,
                    len,
                    reply: self.data_out_pdus(slot, r.ttt, offset, len),
                })
            }
            op => {
                let tasks = &self.t;
                let r = self
                    .s
                    .take(label, op, &pdu.data, |itt| tasks.slot_of(label, itt))?;
                Ok(match (r, op) {
                    (Received::Ping(nop), _) => Event::Ping {
                        reply: Pdu::with_data(Op::NopOut(nop), pdu.data.clone()),
                    },
                    (Received::Complete(o), _) => Event::Complete(self.complete(o)),
                    (Received::Reject(reason), _) => Event::Reject {
                        reason,
                        rejected: Bhs::parse_slice(&pdu.data).ok().map(Box::new),
                    },
                    (_, Op::AsyncMessage(a)) => Event::Async(a.clone()),
                    (_, Op::NopIn(n)) if !n.itt.is_reserved() => Event::NopIn {
                        itt: n.itt,
                        data: pdu.data.clone(),
                    },
                    (_, Op::TaskMgmtResponse(t)) => self.task_mgmt_done(t),
                    (_, Op::LogoutResponse(l)) => Event::Logout {
                        itt: l.itt,
                        response: l.response,
                        time2wait: l.time2wait,
                        time2retain: l.time2retain,
                    },
                    _ => Event::None,
                })
            }
        }
    }

    fn task_mgmt_done(&mut self, r: &TaskMgmtResponse) -> Event {
        let mut ended = Vec::new();
        let done = r.response == tmf::response::FUNCTION_COMPLETE;
        match self.tmfs.remove(&r.itt.0) {
            Some((tmf::ABORT_TASK, task)) if done => {
                ended.extend(self.forget(task).then_some(task))
            }
            Some((
                tmf::ABORT_TASK_SET
                | tmf::CLEAR_TASK_SET
                | tmf::LOGICAL_UNIT_RESET
                | tmf::TARGET_WARM_RESET
                | tmf::TARGET_COLD_RESET,
                _,
            )) if done => {
                for slot in 0..self.t.slots.len() {
                    if self.t.slots[slot].state == TaskState::InFlight {
                        ended.push(Itt(self.end(slot).itt));
                    }
                }
            }
            _ => {}
        }
        Event::TaskMgmt {
            itt: r.itt,
            response: r.response,
            ended,
        }
    }
}

#[cfg(test)]
mod tests;
