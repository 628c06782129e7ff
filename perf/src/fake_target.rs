//! A small, strict in-process iSCSI target for the initiator's tests: it negotiates the
//! keys riser and tgt never pick (InitialR2T=No, ImmediateData=No, a 1 KiB
//! MaxRecvDataSegmentLength, a 2-command CmdSN window), raises a UNIT ATTENTION on the first
//! TEST UNIT READY, splits reads over several Data-In PDUs (status in the last one or in a
//! separate SCSI Response, alternately), and solicits write data with R2Ts after the
//! unsolicited burst. It answers pings (NOP-Out), ABORT TASK of a write still waiting for
//! data and LOGICAL UNIT RESET. It records every rule the initiator breaks in `violations`.
//! With [`start_with`] and a [`FakeChap`] it insists on CHAP in the security stage (riser's
//! [`ChapTarget`] checks the keys; the fake target checks the stages and T bits).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use riser_iscsi::chap::{ChapSecret, ChapTarget};
use riser_iscsi::framer::{Framer, FramerLimits};
use riser_iscsi::login::{AuthStep, Authenticator};
use riser_iscsi::pdu::{
    tmf, DataIn, Digests, LoginResponse, LoginStatus, LogoutResponse, NopIn, Op, Pdu, R2t,
    ScsiResponse, Stage, TaskMgmtResponse,
};
use riser_iscsi::serial::{Itt, Sn, Ttt};
use riser_iscsi::text::{encode_pairs, parse_pairs};

pub const BLOCKS: u64 = 1000;
pub const BLOCK: usize = 512;
/// What the target declares as its MaxRecvDataSegmentLength.
pub const TARGET_MRDSL: usize = 1024;
pub const FIRST_BURST: usize = 2048;
pub const MAX_BURST: usize = 4096;
/// CmdSN window: MaxCmdSN = ExpCmdSN + WINDOW - 1.
pub const WINDOW: u32 = 2;

#[derive(Default)]
pub struct Observed {
    pub violations: Vec<String>,
    pub logins: usize,
    pub commands: usize,
    pub r2ts: usize,
    pub unsolicited_data_outs: usize,
    pub answered_offer: bool,
    pub logged_out: bool,
    /// NOP-Outs and task management requests received.
    pub nops: usize,
    pub tmfs: usize,
    /// Reads aborted (ABORT TASK before their answer; [`FakeOpts::defer_reads`]).
    pub aborted_reads: usize,
    /// CHAP mode: the user that authenticated, or why CHAP failed.
    pub chap_user: Option<String>,
    pub chap_failure: Option<String>,
}

/// How a failing target fails ([`FakeOpts::fail_after`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailKind {
    /// Closes the connection (a killed target).
    Close,
    /// Answers nothing more but keeps the connection open (a hung target).
    Hang,
}

/// Behaviours for ABORT TASK and path failover tests.
#[derive(Clone, Debug, Default)]
pub struct FakeOpts {
    /// The disk, shared with other fake targets (several paths to one LUN); its own when None.
    pub disk: Option<Arc<Mutex<Vec<u8>>>>,
    /// Fail when the Nth SCSI command arrives (it and later ones stay unanswered; writes
    /// not answered yet are written or not, like a target that died).
    pub fail_after: Option<(usize, FailKind)>,
    /// Answer READs only after the whole batch of PDUs they came in (an ABORT TASK in the
    /// same batch finds them pending: Function complete, no answer).
    pub defer_reads: bool,
    /// A broken target: answer an aborted READ anyway, after the TMF response.
    pub answer_aborted: bool,
    /// Answer the READs that arrive as these SCSI commands (counting from 1, per
    /// connection) with CHECK CONDITION, UNIT ATTENTION, REPORTED LUNS DATA HAS CHANGED,
    /// without reading (a LUN added elsewhere on the target).
    pub unit_attention_at: Vec<usize>,
}

/// CHAP for the fake target: these secrets, mutual CHAP required or not.
pub struct FakeChap {
    pub secrets: Vec<ChapSecret>,
    pub mutual: bool,
}

struct Write_ {
    lba: u64,
    len: usize,
    /// Bytes received.
    got: usize,
    /// End of what has been asked for (unsolicited burst, then R2Ts).
    asked: usize,
    r2t_sn: u32,
    data: Vec<u8>,
}

struct Conn {
    sock: TcpStream,
    framer: Framer,
    stat_sn: Sn,
    exp_cmd_sn: Sn,
    advertised: Sn,
    ua_pending: bool,
    disk: Arc<Mutex<Vec<u8>>>,
    /// SCSI commands received.
    cmds: usize,
    /// [`FailKind::Hang`] happened: read and drop everything until the initiator leaves.
    hung: bool,
    writes: HashMap<u32, Write_>,
    reads_done: u32,
    next_ttt: u32,
    obs: Arc<Mutex<Observed>>,
    chap: Option<ChapTarget>,
    opts: FakeOpts,
    /// READs not answered yet (ITT, CDB).
    deferred: Vec<(Itt, [u8; 16])>,
}

fn violation(obs: &Arc<Mutex<Observed>>, what: String) {
    if let Ok(mut o) = obs.lock() {
        o.violations.push(what);
    }
}

impl Conn {
    fn send(&mut self, p: Pdu) {
        let b = p.to_bytes(Digests::default()).expect("encode");
        let _ = self.sock.write_all(&b);
    }

    fn recv(&mut self) -> Option<Pdu> {
        let mut buf = [0u8; 65536];
        loop {
            match self.framer.next_pdu() {
                Ok(Some(p)) => return Some(p),
                Ok(None) => {}
                Err(e) => {
                    violation(&self.obs, format!("unparsable PDU: {e}"));
                    return None;
                }
            }
            match self.sock.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.framer.feed(&buf[..n]),
            }
        }
    }

    /// The MaxCmdSN to send now; remembered as the highest one advertised.
    fn max_cmd_sn(&mut self) -> Sn {
        let m = self.exp_cmd_sn.add(WINDOW - 1);
        if m.gt(self.advertised) {
            self.advertised = m;
        }
        m
    }

    fn next_stat(&mut self) -> Sn {
        let s = self.stat_sn;
        self.stat_sn = s.next();
        s
    }

    fn login(&mut self) -> bool {
        // Security stage.
        let Some(p) = self.recv() else { return false };
        let Op::LoginRequest(r) = p.bhs.op else {
            return false;
        };
        let keys = parse_pairs(&p.data).unwrap_or_default();
        let has = |k: &str, v: &str| keys.iter().any(|(a, b)| a == k && b == v);
        if !has("InitiatorName", riser_initiator::session::INITIATOR_NAME) || !has("SessionType", "Normal") {
            violation(&self.obs, format!("bad security-stage keys {keys:?}"));
        }
        self.exp_cmd_sn = r.cmd_sn;
        let resp = |transit, csg, nsg, stat_sn: Sn, exp: Sn, tsih| LoginResponse {
            transit_bit: transit,
            continue_bit: false,
            csg,
            nsg,
            version_max: 0,
            version_active: 0,
            isid: r.isid,
            tsih,
            itt: r.itt,
            stat_sn,
            exp_cmd_sn: exp,
            max_cmd_sn: exp.add(WINDOW - 1),
            status: LoginStatus::SUCCESS,
        };
        if let Some(mut chap) = self.chap.take() {
            // AuthMethod=CHAP (T=0), then CHAP until it succeeds: T=1 with its last keys.
            if !has("AuthMethod", "CHAP") {
                violation(&self.obs, format!("CHAP target, AuthMethod not CHAP: {keys:?}"));
            }
            let s = self.next_stat();
            let sec = Stage::SecurityNegotiation;
            let op = resp(false, sec, sec, s, self.exp_cmd_sn, 0);
            self.send(Pdu::with_data(
                Op::LoginResponse(op),
                encode_pairs(&[("AuthMethod", "CHAP"), ("TargetPortalGroupTag", "1")]),
            ));
            loop {
                let Some(p) = self.recv() else { return false };
                let Op::LoginRequest(req) = p.bhs.op else {
                    return false;
                };
                if req.csg != sec {
                    violation(&self.obs, format!("CHAP step in stage {:?}", req.csg));
                }
                let keys = parse_pairs(&p.data).unwrap_or_default();
                let mut out = Vec::new();
                let s = self.next_stat();
                match chap.step(&keys, &mut out) {
                    AuthStep::Continue => {
                        if req.transit_bit {
                            violation(&self.obs, "T=1 before the CHAP response".into());
                        }
                        let op = resp(false, sec, sec, s, self.exp_cmd_sn, 0);
                        self.send(Pdu::with_data(Op::LoginResponse(op), encode_pairs(&out)));
                    }
                    AuthStep::Success => {
                        if !req.transit_bit {
                            violation(&self.obs, "no T=1 with the CHAP response".into());
                        }
                        if let Ok(mut o) = self.obs.lock() {
                            o.chap_user = chap.authenticated_user().map(str::to_string);
                        }
                        let op = resp(true, sec, Stage::LoginOperationalNegotiation, s, self.exp_cmd_sn, 0);
                        self.send(Pdu::with_data(Op::LoginResponse(op), encode_pairs(&out)));
                        break;
                    }
                    AuthStep::Failure => {
                        if let Ok(mut o) = self.obs.lock() {
                            o.chap_failure = chap.failure_reason();
                        }
                        let mut op = resp(false, sec, sec, s, self.exp_cmd_sn, 0);
                        op.status = LoginStatus::AUTHENTICATION_FAILURE;
                        self.send(Pdu::new(Op::LoginResponse(op)));
                        return false;
                    }
                }
            }
        } else {
            let s = self.next_stat();
            let op = resp(
                true,
                Stage::SecurityNegotiation,
                Stage::LoginOperationalNegotiation,
                s,
                self.exp_cmd_sn,
                0,
            );
            self.send(Pdu::with_data(
                Op::LoginResponse(op),
                encode_pairs(&[("AuthMethod", "None"), ("TargetPortalGroupTag", "1")]),
            ));
        }
        // Operational stage: answer, and offer a key of our own with T=0.
        let Some(p) = self.recv() else { return false };
        let keys = parse_pairs(&p.data).unwrap_or_default();
        if !keys.iter().any(|(k, _)| k == "MaxRecvDataSegmentLength") {
            violation(&self.obs, "no MaxRecvDataSegmentLength proposed".into());
        }
        let s = self.next_stat();
        let op = resp(
            false,
            Stage::LoginOperationalNegotiation,
            Stage::LoginOperationalNegotiation,
            s,
            self.exp_cmd_sn,
            0,
        );
        self.send(Pdu::with_data(
            Op::LoginResponse(op),
            encode_pairs(&[
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("MaxRecvDataSegmentLength", &TARGET_MRDSL.to_string()),
                ("ImmediateData", "No"),
                ("InitialR2T", "No"),
                ("FirstBurstLength", &FIRST_BURST.to_string()),
                ("MaxBurstLength", &MAX_BURST.to_string()),
                ("MaxOutstandingR2T", "1"),
                ("MaxConnections", "1"),
                ("DataPDUInOrder", "Yes"),
                ("DataSequenceInOrder", "Yes"),
                ("ErrorRecoveryLevel", "0"),
                ("DefaultTime2Wait", "0"),
                ("DefaultTime2Retain", "0"),
                ("X-io.riser.fake.Offer", "1"),
            ]),
        ));
        let Some(p) = self.recv() else { return false };
        let Op::LoginRequest(r2) = p.bhs.op else {
            return false;
        };
        let keys = parse_pairs(&p.data).unwrap_or_default();
        if keys
            .iter()
            .any(|(k, v)| k == "X-io.riser.fake.Offer" && v == "NotUnderstood")
        {
            if let Ok(mut o) = self.obs.lock() {
                o.answered_offer = true;
            }
        }
        if !r2.transit_bit {
            violation(
                &self.obs,
                "initiator did not ask to transit after answering".into(),
            );
        }
        let s = self.next_stat();
        let op = resp(
            true,
            Stage::LoginOperationalNegotiation,
            Stage::FullFeaturePhase,
            s,
            self.exp_cmd_sn,
            7,
        );
        self.advertised = self.exp_cmd_sn.add(WINDOW - 1);
        self.send(Pdu::new(Op::LoginResponse(op)));
        self.framer.set_limits(FramerLimits {
            max_recv_data_segment_length: TARGET_MRDSL,
            max_ahs_length: 1020,
        });
        if let Ok(mut o) = self.obs.lock() {
            o.logins += 1;
        }
        true
    }

    fn response(&mut self, itt: Itt, status: u8, sense: &[u8]) {
        let s = self.next_stat();
        let mut data = Vec::new();
        if !sense.is_empty() {
            data.extend_from_slice(&(sense.len() as u16).to_be_bytes());
            data.extend_from_slice(sense);
        }
        let r = ScsiResponse {
            bidi_read_residual_overflow: false,
            bidi_read_residual_underflow: false,
            residual_overflow: false,
            residual_underflow: false,
            response: 0,
            status,
            itt,
            snack_tag: 0,
            stat_sn: s,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
            exp_data_sn: Sn(0),
            bidi_read_residual_count: 0,
            residual_count: 0,
        };
        self.send(Pdu::with_data(Op::ScsiResponse(r), data));
    }

    /// Sends `data` as Data-In PDUs of at most 700 bytes (not a multiple of anything);
    /// `with_status`: the last one carries GOOD status.
    fn data_in(&mut self, itt: Itt, data: &[u8], with_status: bool) {
        let chunks: Vec<&[u8]> = data.chunks(700).collect();
        let n = chunks.len();
        for (i, c) in chunks.into_iter().enumerate() {
            let last = i + 1 == n;
            let status = last && with_status;
            let stat_sn = if status {
                self.next_stat()
            } else {
                self.stat_sn
            };
            let d = DataIn {
                final_bit: last,
                acknowledge: false,
                residual_overflow: false,
                residual_underflow: false,
                status_present: status,
                status: 0,
                lun: riser_iscsi::pdu::Lun(0),
                itt,
                ttt: Ttt::RESERVED,
                stat_sn,
                exp_cmd_sn: self.exp_cmd_sn,
                max_cmd_sn: self.max_cmd_sn(),
                data_sn: Sn(i as u32),
                buffer_offset: (i * 700) as u32,
                residual_count: 0,
            };
            self.send(Pdu::with_data(Op::DataIn(d), c.to_vec()));
        }
    }

    fn r2t(&mut self, itt: Itt) {
        let Some(w) = self.writes.get_mut(&itt.0) else {
            return;
        };
        let off = w.asked;
        let len = (w.len - off).min(MAX_BURST);
        w.asked += len;
        let sn = w.r2t_sn;
        w.r2t_sn += 1;
        self.next_ttt += 1;
        let r = R2t {
            lun: riser_iscsi::pdu::Lun(0),
            itt,
            ttt: Ttt(self.next_ttt),
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn(),
            r2t_sn: Sn(sn),
            buffer_offset: off as u32,
            desired_data_transfer_length: len as u32,
        };
        if let Ok(mut o) = self.obs.lock() {
            o.r2ts += 1;
        }
        self.send(Pdu::new(Op::R2t(r)));
    }

    /// A write has all the data asked for so far: ask for more or finish it.
    fn progress_write(&mut self, itt: Itt) {
        let Some(w) = self.writes.get(&itt.0) else {
            return;
        };
        if w.got < w.asked {
            return;
        }
        if w.got < w.len {
            self.r2t(itt);
            return;
        }
        let Some(w) = self.writes.remove(&itt.0) else {
            return;
        };
        let at = w.lba as usize * BLOCK;
        if let Ok(mut d) = self.disk.lock() {
            d[at..at + w.len].copy_from_slice(&w.data);
        }
        self.response(itt, 0, &[]);
    }

    fn serve(&mut self) {
        // PDUs are taken in batches (all that one read brought): the initiator sent all of a
        // batch before seeing any answer to it, so its commands must fit the window
        // advertised before the batch.
        while let Some(first) = self.recv() {
            let mut batch = vec![first];
            while let Ok(Some(p)) = self.framer.next_pdu() {
                batch.push(p);
            }
            let advertised = self.advertised;
            for p in batch {
                if !self.handle(p, advertised) {
                    if self.hung {
                        let mut buf = [0u8; 65536];
                        while matches!(self.sock.read(&mut buf), Ok(n) if n > 0) {}
                    }
                    return;
                }
            }
            for (itt, cdb) in std::mem::take(&mut self.deferred) {
                self.read(itt, &cdb);
            }
        }
    }

    /// False after logout.
    fn handle(&mut self, p: Pdu, advertised: Sn) -> bool {
        {
            match p.bhs.op.clone() {
                Op::ScsiCommand(c) => {
                    if let Ok(mut o) = self.obs.lock() {
                        o.commands += 1;
                    }
                    self.cmds += 1;
                    if let Some((n, kind)) = self.opts.fail_after {
                        if self.cmds >= n {
                            match kind {
                                FailKind::Close => {
                                    let _ = self.sock.shutdown(std::net::Shutdown::Both);
                                }
                                FailKind::Hang => self.hung = true,
                            }
                            return false;
                        }
                    }
                    if c.cmd_sn != self.exp_cmd_sn {
                        violation(
                            &self.obs,
                            format!("CmdSN {:?}, expected {:?}", c.cmd_sn, self.exp_cmd_sn),
                        );
                    }
                    if !c.cmd_sn.le(advertised) {
                        violation(
                            &self.obs,
                            format!("CmdSN {:?} beyond MaxCmdSN {advertised:?}", c.cmd_sn),
                        );
                    }
                    if !p.data.is_empty() {
                        violation(&self.obs, "immediate data although ImmediateData=No".into());
                    }
                    self.exp_cmd_sn = self.exp_cmd_sn.next();
                    self.handle_cdb(&c.cdb, c.itt, c.expected_data_transfer_length);
                }
                Op::DataOut(d) => {
                    if p.data.len() > TARGET_MRDSL {
                        violation(&self.obs, format!("Data-Out of {} bytes", p.data.len()));
                    }
                    if d.ttt.is_reserved() {
                        if let Ok(mut o) = self.obs.lock() {
                            o.unsolicited_data_outs += 1;
                        }
                    }
                    let Some(w) = self.writes.get_mut(&d.itt.0) else {
                        violation(&self.obs, "Data-Out for no write".into());
                        return true;
                    };
                    let off = d.buffer_offset as usize;
                    if off != w.got || off + p.data.len() > w.asked {
                        violation(
                            &self.obs,
                            format!(
                                "Data-Out at {off}+{} (got {}, asked {})",
                                p.data.len(),
                                w.got,
                                w.asked
                            ),
                        );
                        return true;
                    }
                    w.data[off..off + p.data.len()].copy_from_slice(&p.data);
                    w.got += p.data.len();
                    if d.final_bit != (w.got == w.asked) {
                        violation(
                            &self.obs,
                            format!("F bit {} at {} of {}", d.final_bit, w.got, w.asked),
                        );
                    }
                    self.progress_write(d.itt);
                }
                Op::NopOut(n) => {
                    self.immediate(n.cmd_sn);
                    if let Ok(mut o) = self.obs.lock() {
                        o.nops += 1;
                    }
                    if !n.itt.is_reserved() {
                        let s = self.next_stat();
                        let r = NopIn {
                            lun: n.lun,
                            itt: n.itt,
                            ttt: Ttt::RESERVED,
                            stat_sn: s,
                            exp_cmd_sn: self.exp_cmd_sn,
                            max_cmd_sn: self.max_cmd_sn(),
                        };
                        self.send(Pdu::with_data(Op::NopIn(r), p.data.clone()));
                    }
                }
                Op::TaskMgmtRequest(t) => {
                    self.immediate(t.cmd_sn);
                    if let Ok(mut o) = self.obs.lock() {
                        o.tmfs += 1;
                    }
                    let mut zombie = None;
                    let response = match t.function {
                        tmf::ABORT_TASK => {
                            let rtt = t.referenced_task_tag;
                            if let Some(i) = self.deferred.iter().position(|(itt, _)| *itt == rtt) {
                                let (itt, cdb) = self.deferred.remove(i);
                                if let Ok(mut o) = self.obs.lock() {
                                    o.aborted_reads += 1;
                                }
                                zombie = self.opts.answer_aborted.then_some((itt, cdb));
                                tmf::response::FUNCTION_COMPLETE
                            } else if self.writes.remove(&rtt.0).is_some() {
                                tmf::response::FUNCTION_COMPLETE
                            } else {
                                tmf::response::TASK_DOES_NOT_EXIST
                            }
                        }
                        tmf::LOGICAL_UNIT_RESET => {
                            self.writes.clear();
                            tmf::response::FUNCTION_COMPLETE
                        }
                        _ => tmf::response::FUNCTION_NOT_SUPPORTED,
                    };
                    let s = self.next_stat();
                    let r = TaskMgmtResponse {
                        response,
                        itt: t.itt,
                        stat_sn: s,
                        exp_cmd_sn: self.exp_cmd_sn,
                        max_cmd_sn: self.max_cmd_sn(),
                    };
                    self.send(Pdu::new(Op::TaskMgmtResponse(r)));
                    if let Some((itt, cdb)) = zombie {
                        self.read(itt, &cdb);
                    }
                }
                Op::LogoutRequest(l) => {
                    let s = self.next_stat();
                    let r = LogoutResponse {
                        response: 0,
                        itt: l.itt,
                        stat_sn: s,
                        exp_cmd_sn: self.exp_cmd_sn,
                        max_cmd_sn: self.max_cmd_sn(),
                        time2wait: 0,
                        time2retain: 0,
                    };
                    self.send(Pdu::new(Op::LogoutResponse(r)));
                    if let Ok(mut o) = self.obs.lock() {
                        o.logged_out = true;
                    }
                    return false;
                }
                other => violation(&self.obs, format!("unexpected {:?}", other.opcode())),
            }
        }
        true
    }

    /// An immediate request carries the next CmdSN without using it up.
    fn immediate(&mut self, cmd_sn: Sn) {
        if cmd_sn != self.exp_cmd_sn {
            violation(
                &self.obs,
                format!("immediate CmdSN {cmd_sn:?}, expected {:?}", self.exp_cmd_sn),
            );
        }
    }

    fn handle_cdb(&mut self, cdb: &[u8; 16], itt: Itt, edtl: u32) {
        match cdb[0] {
            0x00 => {
                if self.ua_pending {
                    self.ua_pending = false;
                    let mut sense = [0u8; 18];
                    sense[0] = 0x70;
                    sense[2] = 0x06;
                    sense[7] = 10;
                    sense[12] = 0x29;
                    self.response(itt, 2, &sense);
                } else {
                    self.response(itt, 0, &[]);
                }
            }
            0x9e => {
                let mut d = vec![0u8; 32];
                d[0..8].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
                d[8..12].copy_from_slice(&(BLOCK as u32).to_be_bytes());
                d.truncate(edtl as usize);
                self.data_in(itt, &d, true);
            }
            0x28 if self.opts.unit_attention_at.contains(&self.cmds) => {
                let mut sense = [0u8; 18];
                sense[0] = 0x70;
                sense[2] = 0x06;
                sense[7] = 10;
                (sense[12], sense[13]) = (0x3f, 0x0e);
                self.response(itt, 2, &sense);
            }
            0x28 if self.opts.defer_reads => self.deferred.push((itt, *cdb)),
            0x28 => self.read(itt, cdb),
            0x2a => {
                let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]) as u64;
                let n = u16::from_be_bytes([cdb[7], cdb[8]]) as usize;
                let len = n * BLOCK;
                if len != edtl as usize {
                    violation(&self.obs, format!("WRITE of {len} bytes with EDTL {edtl}"));
                }
                // InitialR2T=No: the first burst comes unsolicited.
                self.writes.insert(
                    itt.0,
                    Write_ {
                        lba,
                        len,
                        got: 0,
                        asked: len.min(FIRST_BURST),
                        r2t_sn: 0,
                        data: vec![0u8; len],
                    },
                );
            }
            op => {
                violation(&self.obs, format!("unexpected opcode {op:#x}"));
                self.response(itt, 2, &[]);
            }
        }
    }
}

impl Conn {
    fn read(&mut self, itt: Itt, cdb: &[u8; 16]) {
        let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]) as usize;
        let n = u16::from_be_bytes([cdb[7], cdb[8]]) as usize;
        let data = match self.disk.lock() {
            Ok(d) => d[lba * BLOCK..(lba + n) * BLOCK].to_vec(),
            Err(_) => return,
        };
        self.reads_done += 1;
        // Phase collapse on every other read; a separate SCSI Response otherwise.
        let collapse = self.reads_done & 1 == 0;
        self.data_in(itt, &data, collapse);
        if !collapse {
            self.response(itt, 0, &[]);
        }
    }
}

/// Starts the target on a free port for one connection; returns the port, what it saw
/// and its thread.
pub fn start() -> (u16, Arc<Mutex<Observed>>, JoinHandle<()>) {
    start_with(None)
}

/// [`start`], with CHAP required if `chap` says so.
pub fn start_with(chap: Option<FakeChap>) -> (u16, Arc<Mutex<Observed>>, JoinHandle<()>) {
    start_opts(chap, FakeOpts::default())
}

/// [`start_with`], with [`FakeOpts`].
pub fn start_opts(
    chap: Option<FakeChap>,
    opts: FakeOpts,
) -> (u16, Arc<Mutex<Observed>>, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let obs = Arc::new(Mutex::new(Observed::default()));
    let o = obs.clone();
    let h = std::thread::spawn(move || {
        let Ok((sock, _)) = l.accept() else { return };
        let _ = sock.set_nodelay(true);
        let mut c = Conn {
            sock,
            framer: Framer::with_limits(FramerLimits::LOGIN),
            stat_sn: Sn(100),
            exp_cmd_sn: Sn(0),
            advertised: Sn(0),
            ua_pending: true,
            disk: opts
                .disk
                .clone()
                .unwrap_or_else(|| Arc::new(Mutex::new(vec![0u8; BLOCKS as usize * BLOCK]))),
            cmds: 0,
            hung: false,
            writes: HashMap::new(),
            reads_done: 0,
            next_ttt: 0,
            obs: o,
            chap: chap.map(|c| ChapTarget::new(c.secrets, c.mutual)),
            opts,
            deferred: Vec::new(),
        };
        if c.login() {
            c.serve();
        }
    });
    (port, obs, h)
}

#[cfg(test)]
mod tests;
