//! Write-heavy initiators for the memory-bound tests: a session that offers InitialR2T=Yes
//! and ImmediateData=No, keeps many large WRITE(16) commands outstanding within the CmdSN
//! window, and answers the target's R2Ts either slowly (throttled, to hold the target's
//! write buffers for a long time) or promptly (to check that every write still completes).
//!
//! Unlike [`crate::iscsi::Client`], whose `recv` cannot tell a timeout from a close, the
//! [`Conn`] here polls with a short wait and reports a closed connection as an error, so a
//! writer can interleave sending commands, reading R2Ts and sending throttled Data-Out.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use riser_iscsi::framer::{Framer, FramerLimits};
use riser_iscsi::pdu::{DataOut, Digests, Isid, LoginRequest, NopIn, NopOut, Op, Pdu, R2t, ScsiCommand, Stage};
use riser_iscsi::serial::{Itt, Sn, Ttt};
use riser_iscsi::testing::{data_out, nop_out, scsi_command};
use riser_iscsi::text::{encode_pairs, parse_pairs, Pairs};

use crate::iscsi::{Client, INITIATOR};

/// The MaxRecvDataSegmentLength these sessions declare.
pub const OUR_MRDSL: u32 = 262_144;

/// SCSI status GOOD.
pub const GOOD: u8 = 0;

/// What the login settled that the writers need.
#[derive(Debug, Clone)]
pub struct Negotiated {
    /// Every key the target answered or declared, in order.
    pub keys: Pairs,
    /// The target's MaxRecvDataSegmentLength: the most data one Data-Out may carry.
    pub target_mrdsl: u32,
    pub max_burst_length: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
}

impl Negotiated {
    fn key(&self, name: &str) -> Option<&str> {
        self.keys.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One logged-in (or logging-in) connection of a single-connection session.
pub struct Conn {
    sock: TcpStream,
    framer: Framer,
    rxbuf: Vec<u8>,
    isid: [u8; 6],
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    next_itt: u32,
}

impl Conn {
    /// Connects to 127.0.0.1:`port` (the socket and a process-unique ISID come from
    /// [`Client::connect`], so these sessions never reinstate another test's).
    pub fn connect(port: u16) -> Conn {
        let client = Client::connect(port);
        let isid = client.isid;
        let sock = client.sock;
        Conn {
            sock,
            framer: Framer::with_limits(FramerLimits { max_recv_data_segment_length: 1 << 20, max_ahs_length: 1020 }),
            rxbuf: vec![0u8; 256 * 1024],
            isid,
            cmd_sn: Sn(1),
            exp_stat_sn: Sn(0),
            exp_cmd_sn: Sn(1),
            max_cmd_sn: Sn(1),
            next_itt: 0x1000,
        }
    }

    pub fn itt(&mut self) -> Itt {
        self.next_itt += 1;
        Itt(self.next_itt)
    }

    pub fn send(&mut self, pdu: &Pdu) -> Result<(), String> {
        let bytes = pdu.to_bytes(Digests::default()).map_err(|e| format!("cannot encode {:?}: {e}", pdu.opcode()))?;
        self.sock.write_all(&bytes).map_err(|e| format!("send {:?}: {e}", pdu.opcode()))
    }

    /// The next PDU if one arrives within `wait` (Ok(None) if not); an error when the target
    /// closed the connection or sent something unparsable.
    pub fn poll(&mut self, wait: Duration) -> Result<Option<Pdu>, String> {
        loop {
            match self.framer.next_pdu() {
                Ok(Some(p)) => {
                    self.note(&p);
                    return Ok(Some(p));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("target sent something unparsable: {e}")),
            }
            let wait = wait.max(Duration::from_millis(1));
            self.sock.set_read_timeout(Some(wait)).map_err(|e| format!("set_read_timeout: {e}"))?;
            match self.sock.read(&mut self.rxbuf) {
                Ok(0) => return Err("the target closed the connection".into()),
                Ok(n) => self.framer.feed(&self.rxbuf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("receive failed: {e}")),
            }
        }
    }

    /// The next PDU, waiting until `deadline`; an error on timeout.
    pub fn recv_by(&mut self, deadline: Instant, what: &str) -> Result<Pdu, String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("timed out waiting for {what}"));
            }
            if let Some(p) = self.poll(left.min(Duration::from_millis(200)))? {
                return Ok(p);
            }
        }
    }

    /// Sequence numbers from a target PDU (RFC 7143 §4.2.2.1: MaxCmdSN and ExpCmdSN only
    /// move forward; only PDUs that carry a status advance ExpStatSN).
    fn note(&mut self, p: &Pdu) {
        let (stat_sn, exp, max) = match &p.bhs.op {
            Op::ScsiResponse(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn),
            Op::NopIn(n) => (if n.itt.is_reserved() { None } else { Some(n.stat_sn) }, n.exp_cmd_sn, n.max_cmd_sn),
            Op::TextResponse(t) => (Some(t.stat_sn), t.exp_cmd_sn, t.max_cmd_sn),
            Op::LogoutResponse(l) => (Some(l.stat_sn), l.exp_cmd_sn, l.max_cmd_sn),
            Op::TaskMgmtResponse(t) => (Some(t.stat_sn), t.exp_cmd_sn, t.max_cmd_sn),
            Op::LoginResponse(l) => (Some(l.stat_sn), l.exp_cmd_sn, l.max_cmd_sn),
            Op::DataIn(d) => (if d.status_present { Some(d.stat_sn) } else { None }, d.exp_cmd_sn, d.max_cmd_sn),
            Op::R2t(r) => (None, r.exp_cmd_sn, r.max_cmd_sn),
            Op::AsyncMessage(a) => (None, a.exp_cmd_sn, a.max_cmd_sn),
            Op::Reject(r) => (None, r.exp_cmd_sn, r.max_cmd_sn),
            _ => return,
        };
        if let Some(sn) = stat_sn {
            self.exp_stat_sn = sn.next();
        }
        // A MaxCmdSN below ExpCmdSN - 1 is to be ignored (RFC 7143 §4.2.2.1).
        if max.ge(Sn(exp.0.wrapping_sub(1))) {
            if exp.gt(self.exp_cmd_sn) {
                self.exp_cmd_sn = exp;
            }
            if max.gt(self.max_cmd_sn) {
                self.max_cmd_sn = max;
            }
        }
    }

    /// Whether the CmdSN window lets one more non-immediate command go.
    pub fn window_open(&self) -> bool {
        self.cmd_sn.le(self.max_cmd_sn)
    }

    fn login_request(&mut self, csg: Stage, nsg: Stage, keys: &[(&str, &str)]) -> Pdu {
        let itt = self.itt();
        Pdu::with_data(
            Op::LoginRequest(LoginRequest {
                transit_bit: true,
                continue_bit: false,
                csg,
                nsg,
                version_max: 0,
                version_min: 0,
                isid: Isid(self.isid),
                tsih: 0,
                itt,
                cid: 1,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            }),
            encode_pairs(keys),
        )
    }

    /// Logs in to `target` (no authentication), offering InitialR2T=Yes, ImmediateData=No,
    /// no digests and `extra` keys; checks that the target agreed to InitialR2T=Yes and
    /// ImmediateData=No.
    pub fn login(&mut self, target: &str, extra: &[(&str, &str)]) -> Result<Negotiated, String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let keys = [("InitiatorName", INITIATOR), ("TargetName", target), ("SessionType", "Normal"), ("AuthMethod", "None")];
        let req = self.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, &keys);
        self.send(&req)?;
        let mut answered: Pairs = Vec::new();
        let mut offered: Vec<(&str, &str)> = vec![
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "No"),
            ("MaxRecvDataSegmentLength", "262144"),
        ];
        offered.extend_from_slice(extra);
        // The answer to the security stage, then operational negotiation (as Client::login).
        let first = self.recv_by(deadline, "the first Login Response")?;
        let Op::LoginResponse(r) = &first.bhs.op else {
            return Err(format!("expected a Login Response, got {:?}", first.bhs.op));
        };
        if r.status.class != 0 {
            return Err(format!("login refused: class {:#x} detail {:#x}", r.status.class, r.status.detail));
        }
        answered.extend(parse_pairs(&first.data).map_err(|e| format!("Login Response text: {e}"))?);
        let stage = Stage::LoginOperationalNegotiation;
        let mut req = self.login_request(stage, Stage::FullFeaturePhase, &offered);
        for _round in 0..8 {
            self.send(&req)?;
            let resp = self.recv_by(deadline, "a Login Response")?;
            let Op::LoginResponse(r) = &resp.bhs.op else {
                return Err(format!("expected a Login Response, got {:?}", resp.bhs.op));
            };
            if r.status.class != 0 {
                return Err(format!("login refused: class {:#x} detail {:#x}", r.status.class, r.status.detail));
            }
            if r.continue_bit {
                return Err("the target split a Login Response (C bit); this helper does not reassemble".into());
            }
            let got = parse_pairs(&resp.data).map_err(|e| format!("Login Response text: {e}"))?;
            answered.extend(got.iter().cloned());
            if r.transit_bit && r.nsg == Stage::FullFeaturePhase {
                self.cmd_sn = r.exp_cmd_sn;
                self.exp_cmd_sn = r.exp_cmd_sn;
                self.max_cmd_sn = r.max_cmd_sn;
                return self.negotiated(answered);
            }
            // The target offered keys of its own (RFC 7143 §6.2): accept its values.
            let theirs: Vec<(String, String)> = got.into_iter().filter(|(k, _)| !offered.iter().any(|(o, _)| o == k)).collect();
            let theirs: Vec<(&str, &str)> = theirs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            req = self.login_request(stage, Stage::FullFeaturePhase, &theirs);
        }
        Err(format!("login did not reach full-feature phase in 8 rounds; keys so far: {answered:?}"))
    }

    fn negotiated(&self, keys: Pairs) -> Result<Negotiated, String> {
        let mut n = Negotiated { keys, target_mrdsl: 8192, max_burst_length: 262_144, initial_r2t: true, immediate_data: true };
        let num = |v: Option<&str>, name: &str| -> Result<Option<u32>, String> {
            v.map(|s| s.parse::<u32>().map_err(|e| format!("{name}={s}: {e}"))).transpose()
        };
        if let Some(v) = num(n.key("MaxRecvDataSegmentLength"), "MaxRecvDataSegmentLength")? {
            n.target_mrdsl = v;
        }
        if let Some(v) = num(n.key("MaxBurstLength"), "MaxBurstLength")? {
            n.max_burst_length = v;
        }
        n.initial_r2t = match n.key("InitialR2T") {
            Some("Yes") => true,
            Some("No") => false,
            other => return Err(format!("InitialR2T answered {other:?}; keys {:?}", n.keys)),
        };
        n.immediate_data = match n.key("ImmediateData") {
            Some("Yes") => true,
            Some("No") => false,
            other => return Err(format!("ImmediateData answered {other:?}; keys {:?}", n.keys)),
        };
        if !n.initial_r2t || n.immediate_data {
            return Err(format!(
                "the target did not agree to InitialR2T=Yes, ImmediateData=No: {:?} / {:?}",
                n.key("InitialR2T"),
                n.key("ImmediateData")
            ));
        }
        Ok(n)
    }

    /// A non-immediate SCSI command with the next CmdSN (F set: no unsolicited data).
    pub fn command(&mut self, cdb: &[u8], read: bool, write: bool, edtl: u32) -> (Itt, Pdu) {
        let itt = self.itt();
        let cmd = ScsiCommand { exp_stat_sn: self.exp_stat_sn, ..scsi_command(itt, self.cmd_sn, read, write, edtl, cdb) };
        self.cmd_sn = self.cmd_sn.next();
        (itt, Pdu::new(Op::ScsiCommand(cmd)))
    }

    /// Answers a NOP-In ping from the target (a TTT other than 0xffffffff asks for a NOP-Out).
    pub fn answer_nop_in(&mut self, n: &NopIn) -> Result<(), String> {
        if n.ttt.is_reserved() {
            return Ok(());
        }
        let nop = NopOut { ttt: n.ttt, exp_stat_sn: self.exp_stat_sn, ..nop_out(Itt::RESERVED, self.cmd_sn) };
        self.send(&Pdu::new(Op::NopOut(nop)))
    }

    /// One Data-Out of an R2T's sequence.
    pub fn send_data_out(&mut self, itt: Itt, ttt: Ttt, data_sn: Sn, offset: u32, last: bool, data: Vec<u8>) -> Result<(), String> {
        let d = DataOut { final_bit: last, exp_stat_sn: self.exp_stat_sn, ..data_out(itt, ttt, data_sn, offset) };
        self.send(&Pdu::with_data(Op::DataOut(d), data))
    }

    /// TEST UNIT READY until GOOD: a new I_T nexus first sees a POWER ON unit attention.
    pub fn clear_unit_attentions(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for _ in 0..8 {
            let (itt, pdu) = self.command(&[0u8; 6], false, false, 0);
            self.send(&pdu)?;
            loop {
                let p = self.recv_by(deadline, "the TEST UNIT READY status")?;
                match &p.bhs.op {
                    Op::ScsiResponse(r) if r.itt == itt => {
                        if r.status == GOOD {
                            return Ok(());
                        }
                        break;
                    }
                    Op::NopIn(n) => {
                        let n = n.clone();
                        self.answer_nop_in(&n)?;
                    }
                    Op::Reject(r) => return Err(format!("TEST UNIT READY rejected, reason {:#x}", r.reason)),
                    _ => {}
                }
            }
        }
        Err("TEST UNIT READY never returned GOOD".into())
    }

    /// READ(16) of `blocks` blocks at `lba`: (status, data reassembled by buffer offset).
    pub fn read16(&mut self, lba: u64, blocks: u32, block_size: u32, deadline: Instant) -> Result<(u8, Vec<u8>), String> {
        let len = blocks as usize * block_size as usize;
        let (itt, pdu) = self.command(&cdb16(READ16, lba, blocks), true, false, len as u32);
        self.send(&pdu)?;
        let mut data = vec![0u8; len];
        let mut got = 0usize;
        loop {
            let p = self.recv_by(deadline, "READ(16) data")?;
            match &p.bhs.op {
                Op::DataIn(d) if d.itt == itt => {
                    let off = d.buffer_offset as usize;
                    let dst = data
                        .get_mut(off..off + p.data.len())
                        .ok_or_else(|| format!("Data-In at offset {off}, {} bytes, beyond the {len} asked", p.data.len()))?;
                    dst.copy_from_slice(&p.data);
                    got += p.data.len();
                    if d.status_present {
                        return check_read_len(d.status, got, len, data);
                    }
                }
                Op::ScsiResponse(r) if r.itt == itt => return check_read_len(r.status, got, len, data),
                Op::NopIn(n) => {
                    let n = n.clone();
                    self.answer_nop_in(&n)?;
                }
                Op::Reject(r) => return Err(format!("READ(16) rejected, reason {:#x}", r.reason)),
                _ => {}
            }
        }
    }
}

fn check_read_len(status: u8, got: usize, len: usize, data: Vec<u8>) -> Result<(u8, Vec<u8>), String> {
    if status == GOOD && got != len {
        return Err(format!("READ(16) GOOD with {got} of {len} bytes"));
    }
    Ok((status, data))
}

/// A 16-byte READ(16)/WRITE(16) CDB (SBC-4 §5.16, §5.46).
pub fn cdb16(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// WRITE(16) opcode.
pub const WRITE16: u8 = 0x8a;
/// READ(16) opcode.
pub const READ16: u8 = 0x88;

/// Fills `out` with the bytes at `start..start + out.len()` of the pattern `tag`: 8-byte
/// little-endian words whose top 16 bits are the tag and whose low 48 bits depend on the
/// word's offset, so a misplaced block and another command's data both show.
pub fn fill_pattern(tag: u16, start: u64, out: &mut [u8]) {
    let word = |i: u64| ((tag as u64) << 48) | (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) & 0xffff_ffff_ffff);
    if start.is_multiple_of(8) && out.len().is_multiple_of(8) {
        for (k, w) in out.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&word(start / 8 + k as u64).to_le_bytes());
        }
    } else {
        for (k, b) in out.iter_mut().enumerate() {
            let o = start + k as u64;
            *b = word(o / 8).to_le_bytes()[(o % 8) as usize];
        }
    }
}

/// The tag of the pattern word at byte offset `at` (a multiple of 8) of `buf`, if any.
pub fn tag_at(buf: &[u8], at: usize) -> Option<u16> {
    let w = buf.get(at..at + 8)?;
    Some(u16::from_le_bytes([w[6], w[7]]))
}

/// The pattern tag of write `cmd` of session `session`.
pub fn tag_of(session: u8, cmd: u8) -> u16 {
    0x5000 | (u16::from(session) << 8) | u16::from(cmd)
}

/// What a throttled writer did.
#[derive(Debug, Default, Clone)]
pub struct SlowReport {
    pub commands_sent: u32,
    pub r2ts: u32,
    pub r2t_bytes_asked: u64,
    pub data_bytes_sent: u64,
    /// (ITT, SCSI status) of the commands that completed before the connection was dropped.
    pub responses: Vec<(u32, u8)>,
    pub rejects: u32,
    /// MaxCmdSN - CmdSN + 1 at login: how many commands the window first allowed.
    pub first_window: u32,
    /// When the first R2T came, counted from the start of the writer.
    pub first_r2t_after: Option<Duration>,
}

/// An R2T being answered.
struct Burst {
    itt: Itt,
    ttt: Ttt,
    offset: u32,
    len: u32,
    done: u32,
    data_sn: Sn,
}

/// Parameters of a throttled writer.
#[derive(Debug, Clone)]
pub struct SlowPlan {
    /// WRITE(16) commands to send (as the CmdSN window allows).
    pub commands: u32,
    /// Bytes per command (EDTL).
    pub command_bytes: u32,
    pub block_size: u32,
    /// First LBA of this session's area; command k writes at `lba + k * blocks`, wrapping
    /// within `area_blocks`.
    pub lba: u64,
    pub area_blocks: u64,
    /// Data-Out bytes per second, all R2Ts of the connection together.
    pub bytes_per_sec: u64,
    /// Largest Data-Out data segment wanted (capped by the target's MaxRecvDataSegmentLength).
    pub max_pdu: u32,
}

/// Runs a logged-in, unit-attention-free `conn` as a slow writer until `stop` is set, then
/// drops the connection without a logout (the socket closes with everything outstanding).
pub fn run_slow_writer(mut conn: Conn, neg: &Negotiated, plan: &SlowPlan, stop: &AtomicBool) -> Result<SlowReport, String> {
    let mut report = SlowReport { first_window: conn.cmd_sn.distance_to(conn.max_cmd_sn).wrapping_add(1), ..SlowReport::default() };
    let chunk = plan.max_pdu.min(neg.target_mrdsl).max(512);
    let blocks = plan.command_bytes / plan.block_size;
    let payload = vec![0xa5u8; chunk as usize];
    let mut bursts: VecDeque<Burst> = VecDeque::new();
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        while report.commands_sent < plan.commands && conn.window_open() {
            let k = u64::from(report.commands_sent);
            let lba = plan.lba + (k * u64::from(blocks)) % plan.area_blocks.max(1);
            let (_, pdu) = conn.command(&cdb16(WRITE16, lba, blocks), false, true, plan.command_bytes);
            conn.send(&pdu)?;
            report.commands_sent += 1;
        }
        // Data-Out, no faster than the rate allows.
        let allowed = (start.elapsed().as_secs_f64() * plan.bytes_per_sec as f64) as u64;
        let mut wait = Duration::from_millis(20);
        if let Some(b) = bursts.front_mut() {
            let n = chunk.min(b.len - b.done);
            if report.data_bytes_sent + u64::from(n) <= allowed {
                let last = b.done + n == b.len;
                conn.send_data_out(b.itt, b.ttt, b.data_sn, b.offset + b.done, last, payload[..n as usize].to_vec())?;
                report.data_bytes_sent += u64::from(n);
                b.done += n;
                b.data_sn = b.data_sn.next();
                if last {
                    bursts.pop_front();
                }
                wait = Duration::from_millis(1);
            } else {
                let short = report.data_bytes_sent + u64::from(n) - allowed;
                let secs = short as f64 / plan.bytes_per_sec.max(1) as f64;
                wait = Duration::from_secs_f64(secs).clamp(Duration::from_millis(1), Duration::from_millis(20));
            }
        }
        if let Some(p) = conn.poll(wait)? {
            match &p.bhs.op {
                Op::R2t(R2t { itt, ttt, buffer_offset, desired_data_transfer_length, .. }) => {
                    report.r2ts += 1;
                    report.first_r2t_after.get_or_insert(start.elapsed());
                    report.r2t_bytes_asked += u64::from(*desired_data_transfer_length);
                    bursts.push_back(Burst {
                        itt: *itt,
                        ttt: *ttt,
                        offset: *buffer_offset,
                        len: *desired_data_transfer_length,
                        done: 0,
                        data_sn: Sn(0),
                    });
                }
                Op::ScsiResponse(r) => report.responses.push((r.itt.0, r.status)),
                Op::NopIn(n) => {
                    let n = n.clone();
                    conn.answer_nop_in(&n)?;
                }
                Op::Reject(_) => report.rejects += 1,
                _ => {}
            }
        }
    }
    drop(conn);
    Ok(report)
}

/// What a prompt writer did.
#[derive(Debug, Default, Clone)]
pub struct PromptReport {
    pub commands: u32,
    pub r2ts: u32,
    /// Command indices in the order their responses came.
    pub completion_order: Vec<u8>,
    /// Bytes compared on read-back.
    pub verified_bytes: u64,
}

/// Parameters of a prompt writer.
#[derive(Debug, Clone)]
pub struct PromptPlan {
    /// Its index: part of every pattern tag, so sessions' data never look alike.
    pub session: u8,
    pub region_lba: u64,
    /// Bytes of the region, and the EDTL of every write.
    pub region_bytes: u32,
    pub commands: u8,
    pub block_size: u32,
    /// Largest READ(16) on read-back.
    pub read_chunk: u32,
    pub deadline: Instant,
}

/// Writes `commands` WRITE(16)s of `region_bytes` each over the same region (all sent at
/// once as far as the CmdSN window allows), answering every R2T at once and in full; each
/// must end GOOD. Then reads the region back in READ(16)s of at most `read_chunk` bytes and
/// compares it with the pattern of the write that completed last (the target answers one
/// connection's writes to one malloc LUN in the order it executes them).
pub fn run_prompt_writer(conn: &mut Conn, neg: &Negotiated, plan: &PromptPlan) -> Result<PromptReport, String> {
    let PromptPlan { session, region_lba, region_bytes, commands, block_size, read_chunk, deadline } = *plan;
    let mut report = PromptReport::default();
    let blocks = region_bytes / block_size;
    let chunk = neg.target_mrdsl.clamp(512, OUR_MRDSL);
    let mut itts: Vec<Itt> = Vec::new();
    let mut sent = 0u8;
    let mut buf = Vec::new();
    while report.completion_order.len() < usize::from(commands) {
        while sent < commands && conn.window_open() {
            let (itt, pdu) = conn.command(&cdb16(WRITE16, region_lba, blocks), false, true, region_bytes);
            conn.send(&pdu)?;
            itts.push(itt);
            sent += 1;
            report.commands += 1;
        }
        let p = conn.recv_by(deadline, &format!("R2Ts or responses ({} of {commands} writes done)", report.completion_order.len()))?;
        match &p.bhs.op {
            Op::R2t(r) => {
                report.r2ts += 1;
                let k = itts.iter().position(|i| *i == r.itt).ok_or_else(|| format!("R2T for unknown ITT {:#x}", r.itt.0))?;
                let tag = tag_of(session, k as u8);
                let end = r.buffer_offset.checked_add(r.desired_data_transfer_length).filter(|e| *e <= region_bytes).ok_or_else(|| {
                    format!("R2T beyond the command: offset {} len {}", r.buffer_offset, r.desired_data_transfer_length)
                })?;
                let mut off = r.buffer_offset;
                let mut data_sn = Sn(0);
                while off < end {
                    let n = chunk.min(end - off);
                    buf.resize(n as usize, 0);
                    fill_pattern(tag, u64::from(off), &mut buf);
                    conn.send_data_out(r.itt, r.ttt, data_sn, off, off + n == end, buf.clone())?;
                    off += n;
                    data_sn = data_sn.next();
                }
            }
            Op::ScsiResponse(r) => {
                let k = itts.iter().position(|i| *i == r.itt).ok_or_else(|| format!("response for unknown ITT {:#x}", r.itt.0))?;
                if r.status != GOOD || r.response != 0 {
                    return Err(format!(
                        "write {k} of session {session}: response {:#x}, status {:#x}, sense segment {:02x?}",
                        r.response,
                        r.status,
                        &p.data[..p.data.len().min(32)]
                    ));
                }
                report.completion_order.push(k as u8);
            }
            Op::NopIn(n) => {
                let n = n.clone();
                conn.answer_nop_in(&n)?;
            }
            Op::Reject(r) => return Err(format!("session {session}: Reject, reason {:#x}", r.reason)),
            _ => {}
        }
    }
    let last = *report.completion_order.last().ok_or("no write completed")?;
    let want_tag = tag_of(session, last);
    let mut expect = Vec::new();
    let mut off = 0u32;
    while off < region_bytes {
        let n = read_chunk.min(region_bytes - off);
        let (status, data) = conn.read16(region_lba + u64::from(off / block_size), n / block_size, block_size, deadline)?;
        if status != GOOD {
            return Err(format!("session {session}: READ(16) at byte {off} of the region: status {status:#x}"));
        }
        expect.resize(n as usize, 0);
        fill_pattern(want_tag, u64::from(off), &mut expect);
        if data != expect {
            let at = data.iter().zip(&expect).position(|(a, b)| a != b).unwrap_or(0);
            let word = at & !7;
            return Err(format!(
                "session {session}: region byte {} differs from write {last} (the last to complete, order {:?}): \
                 found pattern tag {:#06x?} there, expected {want_tag:#06x}",
                u64::from(off) + at as u64,
                report.completion_order,
                tag_at(&data, word)
            ));
        }
        report.verified_bytes += u64::from(n);
        off += n;
    }
    Ok(report)
}

/// Connects, logs in with InitialR2T=Yes / ImmediateData=No and clears the unit attention.
pub fn open_session(port: u16, target: &str, extra: &[(&str, &str)]) -> Result<(Conn, Negotiated), String> {
    let mut conn = Conn::connect(port);
    let neg = conn.login(target, extra)?;
    conn.clear_unit_attentions()?;
    Ok((conn, neg))
}
