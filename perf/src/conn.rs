//! One iSCSI/TCP connection (= one session, MaxConnections=1) of the initiator.
//!
//! The socket is non-blocking from the start. Setup (login, TEST UNIT READY, READ CAPACITY,
//! logout) waits with `poll(2)` and a deadline; the hot path never waits: the owning client
//! thread calls [`Conn::poll`] (one `read(2)`, parse every complete PDU in place) and
//! [`Conn::flush`] (one `write(2)` of everything queued) in its loop, and submits I/Os with
//! [`Conn::submit`]. Nothing is shared with other threads.
//!
//! PDUs are parsed straight out of the receive buffer with riser-iscsi's `Bhs::parse`; the
//! data of a Data-In is copied once, into the task's buffer. PDUs to send are encoded into
//! one transmit buffer, so a pass that completes 20 reads sends 20 commands in one write.
//!
//! Protocol coverage (RFC 7143): login with AuthMethod=None answering every key the target
//! offers; digests (CRC32C) if asked for; ImmediateData / InitialR2T / FirstBurstLength as
//! negotiated, unsolicited Data-Out, R2T-solicited Data-Out split at the target's
//! MaxRecvDataSegmentLength; Data-In with or without status (phase collapse) and a separate
//! SCSI Response; the CmdSN window (a command never goes out beyond MaxCmdSN: it waits);
//! NOP-In pings answered; Async Messages asking for logout end the run; logout at the end.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use riser_iscsi::digest;
use riser_iscsi::pdu::{
    padded_len, raw_data_segment_len, raw_total_ahs_len, Bhs, DataOut, Digests, Lun, Op, BHS_LEN,
    DIGEST_LEN,
};
use riser_iscsi::serial::{Itt, Sn, Ttt};
use riser_iscsi::text::parse_number;

use crate::session::{self, Outcome, Received, SessionState, TaskState, Tasks, Transport};
use crate::sys::wait_fd;
use crate::url::TargetUrl;

pub const INITIATOR_NAME: &str = "iqn.2024-01.io.riser:perf";
/// What we declare as MaxRecvDataSegmentLength: the largest Data-In the target may send.
pub const OUR_MAX_RECV_DSL: u32 = 262_144;
/// Data segment limit while logging in (RFC 7143 §13.12).
pub(crate) const LOGIN_MAX_RECV_DSL: u32 = 8192;
/// Receive buffer: several maximal PDUs, so that one read(2) picks up many completions.
const RX_BUF: usize = 1 << 20;
/// Management tasks (TUR, READ CAPACITY, logout) use ITTs with the top bit set; I/O tasks
/// use `(sequence << 16) | slot`, top bit clear.
pub(crate) const MGMT_ITT: u32 = 0x8000_0000;
/// Largest queue depth of one connection (the slot lives in the low 16 bits of the ITT).
pub const MAX_QD: usize = 4096;

/// SCSI status codes (SAM-5).
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const BUSY: u8 = 0x08;
    pub const TASK_SET_FULL: u8 = 0x28;
}

/// Sense key, additional sense code and qualifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
}

impl Sense {
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const NOT_READY: u8 = 0x2;

    /// From the data segment of a SCSI Response: 2-byte SenseLength, then the sense data
    /// (fixed format 0x70/0x71 or descriptor format 0x72/0x73).
    pub fn parse(segment: &[u8]) -> Option<Sense> {
        let len = u16::from_be_bytes([*segment.first()?, *segment.get(1)?]) as usize;
        let s = segment.get(2..2 + len)?;
        match s.first()? & 0x7f {
            0x70 | 0x71 => Some(Sense {
                key: s.get(2)? & 0x0f,
                asc: *s.get(12).unwrap_or(&0),
                ascq: *s.get(13).unwrap_or(&0),
            }),
            0x72 | 0x73 => Some(Sense {
                key: s.get(1)? & 0x0f,
                asc: *s.get(2).unwrap_or(&0),
                ascq: *s.get(3).unwrap_or(&0),
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const KEYS: [&str; 16] = [
            "NO SENSE",
            "RECOVERED ERROR",
            "NOT READY",
            "MEDIUM ERROR",
            "HARDWARE ERROR",
            "ILLEGAL REQUEST",
            "UNIT ATTENTION",
            "DATA PROTECT",
            "BLANK CHECK",
            "VENDOR SPECIFIC",
            "COPY ABORTED",
            "ABORTED COMMAND",
            "RESERVED",
            "VOLUME OVERFLOW",
            "MISCOMPARE",
            "COMPLETED",
        ];
        let what = match (self.asc, self.ascq) {
            (0x04, _) => ": logical unit not ready",
            (0x20, 0x00) => ": invalid command operation code",
            (0x21, 0x00) => ": LBA out of range",
            (0x24, 0x00) => ": invalid field in CDB",
            (0x25, 0x00) => ": logical unit not supported (no such LUN)",
            (0x27, _) => ": write protected",
            (0x29, _) => ": power on, reset or bus device reset occurred",
            (0x2a, _) => ": parameters changed",
            (0x3a, _) => ": medium not present",
            _ => "",
        };
        write!(
            f,
            "{} (ASC/ASCQ {:#04x}/{:#04x}{what})",
            KEYS[(self.key & 0xf) as usize],
            self.asc,
            self.ascq
        )
    }
}

/// What came back for a command that did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoError {
    pub status: u8,
    pub sense: Option<Sense>,
    pub what: String,
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)?;
        if let Some(s) = self.sense {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

pub(crate) fn status_name(s: u8) -> String {
    match s {
        0x00 => "GOOD".into(),
        0x02 => "CHECK CONDITION".into(),
        0x04 => "CONDITION MET".into(),
        0x08 => "BUSY".into(),
        0x18 => "RESERVATION CONFLICT".into(),
        0x28 => "TASK SET FULL".into(),
        0x30 => "ACA ACTIVE".into(),
        0x40 => "TASK ABORTED".into(),
        s => format!("status {s:#04x}"),
    }
}

/// Login options of one connection.
#[derive(Clone, Debug)]
pub struct LoginOptions {
    pub initiator_name: String,
    pub header_digest: bool,
    pub data_digest: bool,
    /// For connect, login, setup commands and logout, each.
    pub timeout: Duration,
    pub isid: [u8; 6],
}

/// The operational parameters that matter to the data path, as negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub header_digest: bool,
    pub data_digest: bool,
    /// The target's MaxRecvDataSegmentLength: the largest data segment we may send.
    pub max_send_dsl: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub first_burst: u32,
    pub max_burst: u32,
}

impl Default for Negotiated {
    /// RFC 7143 §13 defaults: what holds for a key nobody mentioned.
    fn default() -> Self {
        Negotiated {
            header_digest: false,
            data_digest: false,
            max_send_dsl: 8192,
            immediate_data: true,
            initial_r2t: true,
            first_burst: 65_536,
            max_burst: 262_144,
        }
    }
}

/// The initiator side of login negotiation, kept free of I/O so it can be tested.
#[derive(Clone, Debug)]
pub struct KeyNegotiation {
    want_header_digest: bool,
    want_data_digest: bool,
    /// Keys sent so far (a target's copy of one of these is an answer, not an offer).
    pub(crate) proposed: Vec<String>,
    pub result: Negotiated,
    /// iSER (RFC 7145 §6): RDMAExtensions=Yes and the iSER keys instead of
    /// MaxRecvDataSegmentLength.
    iser: bool,
    pub iser_result: IserKeys,
}

/// What we declare as InitiatorRecvDataSegmentLength on iSER: the largest control-type data
/// segment the target may send us (our receive buffers are sized for it). Linux's value.
pub const OUR_INITIATOR_RECV_DSL: u32 = 8192;
/// What we propose as TargetRecvDataSegmentLength (Minimum): the largest immediate data.
/// The RFC 7145 default: LIO/isert answers a larger proposal with Yes-sir (262144) but its
/// receive buffers hold 8 KiB, and a larger SEND fails with a remote operation error.
pub const OUR_TARGET_RECV_DSL: u32 = 8192;

/// The iSER keys as negotiated (RFC 7145 §6.3-6.5; defaults when a key was not mentioned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IserKeys {
    pub rdma_extensions: bool,
    /// Largest data segment we may send (immediate data, Text, NOP-Out).
    pub target_recv_dsl: u32,
    /// Largest data segment the target may send us.
    pub initiator_recv_dsl: u32,
    /// 0: no limit.
    pub max_outstanding_unexpected_pdus: u32,
}

impl Default for IserKeys {
    fn default() -> Self {
        IserKeys {
            rdma_extensions: false,
            target_recv_dsl: 8192,
            initiator_recv_dsl: 8192,
            max_outstanding_unexpected_pdus: 0,
        }
    }
}

impl KeyNegotiation {
    pub fn new(header_digest: bool, data_digest: bool) -> Self {
        KeyNegotiation {
            want_header_digest: header_digest,
            want_data_digest: data_digest,
            proposed: Vec::new(),
            result: Negotiated::default(),
            iser: false,
            iser_result: IserKeys::default(),
        }
    }

    /// For an iSER connection: no digests, RDMAExtensions=Yes, the iSER keys, InitialR2T=Yes
    /// (unsolicited data only as immediate data in the command's SEND).
    pub fn new_iser() -> Self {
        KeyNegotiation {
            iser: true,
            ..Self::new(false, false)
        }
    }

    /// Keys of the first Login Operational Negotiation request.
    pub fn operational_proposal(&mut self) -> Vec<(String, String)> {
        let digest = |on: bool| if on { "CRC32C" } else { "None" };
        if self.iser {
            let v: Vec<(&str, String)> = vec![
                ("HeaderDigest", "None".into()),
                ("DataDigest", "None".into()),
                ("RDMAExtensions", "Yes".into()),
                (
                    "InitiatorRecvDataSegmentLength",
                    OUR_INITIATOR_RECV_DSL.to_string(),
                ),
                (
                    "TargetRecvDataSegmentLength",
                    OUR_TARGET_RECV_DSL.to_string(),
                ),
                ("MaxOutstandingUnexpectedPDUs", "0".into()),
                ("ImmediateData", "Yes".into()),
                // OR-negotiated: Yes wins, so no unsolicited Data-Out PDUs on iSER.
                ("InitialR2T", "Yes".into()),
                ("FirstBurstLength", "262144".into()),
                ("MaxBurstLength", "16776192".into()),
                ("MaxOutstandingR2T", "1".into()),
                ("MaxConnections", "1".into()),
                ("DataPDUInOrder", "Yes".into()),
                ("DataSequenceInOrder", "Yes".into()),
                ("ErrorRecoveryLevel", "0".into()),
                ("DefaultTime2Wait", "0".into()),
                ("DefaultTime2Retain", "0".into()),
            ];
            let v: Vec<(String, String)> = v.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            self.proposed.extend(v.iter().map(|(k, _)| k.clone()));
            return v;
        }
        let v: Vec<(&str, String)> = vec![
            ("HeaderDigest", digest(self.want_header_digest).into()),
            ("DataDigest", digest(self.want_data_digest).into()),
            ("MaxRecvDataSegmentLength", OUR_MAX_RECV_DSL.to_string()),
            ("ImmediateData", "Yes".into()),
            // OR-negotiated: the target's Yes wins; No saves a round trip per write.
            ("InitialR2T", "No".into()),
            ("FirstBurstLength", "262144".into()),
            ("MaxBurstLength", "16776192".into()),
            ("MaxOutstandingR2T", "1".into()),
            ("MaxConnections", "1".into()),
            ("DataPDUInOrder", "Yes".into()),
            ("DataSequenceInOrder", "Yes".into()),
            ("ErrorRecoveryLevel", "0".into()),
            ("DefaultTime2Wait", "0".into()),
            ("DefaultTime2Retain", "0".into()),
        ];
        let v: Vec<(String, String)> = v.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        self.proposed.extend(v.iter().map(|(k, _)| k.clone()));
        v
    }

    /// Takes the keys of one Login Response; returns the answers owed to the target's offers
    /// (empty when it offered nothing), or why the login cannot go on.
    pub fn take_response(
        &mut self,
        pairs: &[(String, String)],
    ) -> Result<Vec<(String, String)>, String> {
        let mut answers = Vec::new();
        for (k, v) in pairs {
            let answer_to_ours = self.proposed.iter().any(|p| p == k);
            // An iSER key the target does not know (LIO: MaxOutstandingUnexpectedPDUs) keeps
            // its default; RDMAExtensions then stays No, which the iSER login refuses.
            if self.iser
                && answer_to_ours
                && matches!(v.as_str(), "NotUnderstood" | "Irrelevant" | "Reject")
            {
                continue;
            }
            match k.as_str() {
                "HeaderDigest" | "DataDigest" => {
                    let want = if k == "HeaderDigest" {
                        self.want_header_digest
                    } else {
                        self.want_data_digest
                    };
                    let chosen = if answer_to_ours {
                        v.clone()
                    } else {
                        // An offer: pick from its list what we want, else None.
                        let offered: Vec<&str> = v.split(',').collect();
                        let pick = if want && offered.contains(&"CRC32C") {
                            "CRC32C"
                        } else if offered.contains(&"None") {
                            "None"
                        } else if offered.contains(&"CRC32C") {
                            "CRC32C"
                        } else {
                            "Reject"
                        };
                        answers.push((k.clone(), pick.to_string()));
                        pick.to_string()
                    };
                    let on = match chosen.as_str() {
                        "CRC32C" => true,
                        "None" => false,
                        other => {
                            if want {
                                return Err(format!(
                                    "the target refused {k}=CRC32C (answered {other})"
                                ));
                            }
                            false
                        }
                    };
                    if want && !on {
                        return Err(format!("the target refused {k}=CRC32C (answered {chosen})"));
                    }
                    if k == "HeaderDigest" {
                        self.result.header_digest = on;
                    } else {
                        self.result.data_digest = on;
                    }
                }
                // Declarative: the target's own receive limit.
                "MaxRecvDataSegmentLength" => {
                    let n = number(k, v)?;
                    if !(512..=16_777_215).contains(&n) {
                        return Err(format!("the target declared MaxRecvDataSegmentLength={n}, outside 512..16777215"));
                    }
                    self.result.max_send_dsl = n as u32;
                }
                "TargetAlias" | "TargetPortalGroupTag" | "TargetAddress" => {}
                "ImmediateData" | "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" => {
                    let b = match v.as_str() {
                        "Yes" => Some(true),
                        "No" => Some(false),
                        _ => None,
                    };
                    if !answer_to_ours {
                        answers.push((k.clone(), v.clone()));
                    }
                    if let Some(b) = b {
                        match k.as_str() {
                            "ImmediateData" => self.result.immediate_data = b,
                            "InitialR2T" => self.result.initial_r2t = b,
                            _ => {}
                        }
                    }
                }
                "FirstBurstLength" | "MaxBurstLength" => {
                    if !answer_to_ours {
                        answers.push((k.clone(), v.clone()));
                    }
                    // "Irrelevant" (no unsolicited data at all) keeps the default.
                    if let Ok(n) = parse_number(v) {
                        let n = n.clamp(512, 16_777_215) as u32;
                        if k == "FirstBurstLength" {
                            self.result.first_burst = n;
                        } else {
                            self.result.max_burst = n;
                        }
                    }
                }
                "MaxOutstandingR2T" | "MaxConnections" | "ErrorRecoveryLevel"
                | "DefaultTime2Wait" | "DefaultTime2Retain" | "OFMarker" | "IFMarker" => {
                    if !answer_to_ours {
                        // Accepting the offered value is a valid answer for each of these
                        // (min, max or boolean functions).
                        answers.push((k.clone(), v.clone()));
                    }
                }
                "AuthMethod" => {
                    if !answer_to_ours {
                        let none = v.split(',').any(|m| m == "None");
                        answers.push((k.clone(), if none { "None" } else { "Reject" }.into()));
                    }
                    if v != "None" && !v.split(',').any(|m| m == "None") {
                        return Err(format!(
                            "the target requires authentication (AuthMethod={v}); CHAP is not supported by riser-perf yet"
                        ));
                    }
                }
                "RDMAExtensions" if self.iser => {
                    if !answer_to_ours {
                        answers.push((k.clone(), v.clone()));
                    }
                    self.iser_result.rdma_extensions = v == "Yes";
                }
                "TargetRecvDataSegmentLength" | "InitiatorRecvDataSegmentLength" if self.iser => {
                    let n = number(k, v)?;
                    if !(512..=16_777_215).contains(&n) {
                        return Err(format!("the target sent {k}={n}, outside 512..16777215"));
                    }
                    let ours = if k == "TargetRecvDataSegmentLength" {
                        OUR_TARGET_RECV_DSL
                    } else {
                        OUR_INITIATOR_RECV_DSL
                    };
                    // Minimum: an answer above our proposal is the target's error; use ours.
                    let n = (n as u32).min(ours);
                    if !answer_to_ours {
                        answers.push((k.clone(), n.to_string()));
                    }
                    if k == "TargetRecvDataSegmentLength" {
                        self.iser_result.target_recv_dsl = n;
                    } else {
                        self.iser_result.initiator_recv_dsl = n;
                    }
                }
                "MaxOutstandingUnexpectedPDUs" if self.iser => {
                    let n = number(k, v)?;
                    if n == 1 || n > u32::MAX as u64 {
                        return Err(format!("the target sent {k}={n}, not 0 or 2..2^32-1"));
                    }
                    if !answer_to_ours {
                        // MinOrZero with our 0 (no limit): the target's value.
                        answers.push((k.clone(), v.clone()));
                    }
                    self.iser_result.max_outstanding_unexpected_pdus = n as u32;
                }
                "MaxAHSLength" if self.iser => {
                    if !answer_to_ours {
                        answers.push((k.clone(), v.clone()));
                    }
                }
                "iSERHelloRequired" | "TaggedBufferForSolicitedDataOnly" if self.iser => {
                    if !answer_to_ours {
                        answers.push((k.clone(), "No".into()));
                    }
                }
                "RDMAExtensions" | "iSERHelloRequired" => {
                    if !answer_to_ours {
                        answers.push((k.clone(), "No".into()));
                    }
                }
                _ => {
                    if !answer_to_ours
                        && !matches!(v.as_str(), "NotUnderstood" | "Irrelevant" | "Reject")
                    {
                        answers.push((k.clone(), "NotUnderstood".into()));
                    }
                }
            }
        }
        self.proposed.extend(answers.iter().map(|(k, _)| k.clone()));
        Ok(answers)
    }
}

pub(crate) fn number(k: &str, v: &str) -> Result<u64, String> {
    parse_number(v).map_err(|_| format!("the target sent {k}={v}, not a number"))
}

pub(crate) fn login_status_text(class: u8, detail: u8) -> String {
    let what = match (class, detail) {
        (1, 1) | (1, 2) => "the target moved (redirection is not supported by riser-perf)",
        (2, 1) => "authentication failed",
        (2, 2) => "authorization failure: this initiator may not access the target (ACL?)",
        (2, 3) => "target not found: check the IQN in the URL",
        (2, 4) => "the target was removed",
        (2, 5) => "unsupported iSCSI version",
        (2, 6) => "too many connections",
        (2, 7) => "missing parameter",
        (2, 8) => "cannot include in session",
        (2, 9) => "session type not supported",
        (2, 10) => "session does not exist",
        (2, 11) => "invalid request during login",
        (2, _) => "initiator error",
        (3, 1) => "service unavailable",
        (3, 2) => "the target is out of resources",
        (3, _) => "target error",
        _ => "unknown status",
    };
    format!("login refused: {what} (status class {class:#04x}, detail {detail:#04x})")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Read,
    Write,
}

/// One finished I/O.
#[derive(Debug)]
pub struct Completion {
    pub slot: usize,
    pub result: Result<(), IoError>,
}

/// Result of a management SCSI command.
pub struct CmdResult {
    pub status: u8,
    pub sense: Option<Sense>,
    pub data: Vec<u8>,
}

pub struct Conn {
    sock: TcpStream,
    /// "iscsi://host:port/iqn/lun" for messages.
    pub label: String,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    tx: Vec<u8>,
    tx_off: usize,
    max_recv_dsl: u32,
    pub neg: Negotiated,
    digests: Digests,
    s: SessionState,
    pub block_size: u32,
    pub num_blocks: u64,
    t: Tasks,
    timeout: Duration,
    logged_out: bool,
}

fn io_err(label: &str, what: &str, e: io::Error) -> String {
    format!("{label}: {what}: {e}")
}

/// Appends one PDU in TCP form: header (+ digest), data, padding (+ digest).
fn push_pdu(tx: &mut Vec<u8>, d: Digests, mut bhs: Bhs, data: &[u8]) {
    bhs.data_segment_length = data.len() as u32;
    bhs.total_ahs_length = 0;
    let mut h = [0u8; BHS_LEN];
    bhs.write(&mut h);
    tx.extend_from_slice(&h);
    if d.header {
        tx.extend_from_slice(&digest::to_wire(digest::crc32c(&h)));
    }
    if !data.is_empty() {
        let at = tx.len();
        tx.extend_from_slice(data);
        tx.resize(at + padded_len(data.len()), 0);
        if d.data {
            let crc = digest::crc32c(&tx[at..]);
            tx.extend_from_slice(&digest::to_wire(crc));
        }
    }
}

fn bhs(op: Op) -> Bhs {
    Bhs {
        total_ahs_length: 0,
        data_segment_length: 0,
        op,
    }
}

/// READ/WRITE (10) when the LBA and length fit, (16) otherwise.
pub fn rw_cdb(dir: Dir, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    if lba + blocks as u64 <= u32::MAX as u64 + 1 && blocks <= 0xffff {
        c[0] = if dir == Dir::Read { 0x28 } else { 0x2a };
        c[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
        c[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
    } else {
        c[0] = if dir == Dir::Read { 0x88 } else { 0x8a };
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&blocks.to_be_bytes());
    }
    c
}

impl Conn {
    /// Connects and logs in (normal session, AuthMethod=None).
    pub fn login(url: &TargetUrl, opts: &LoginOptions) -> Result<Conn, String> {
        let label = url.to_string();
        let addr = url.socket_addr();
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| format!("{label}: cannot resolve {}: {e}", url.host))?
            .collect();
        let mut last = None;
        let mut sock = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, opts.timeout) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let sock = match sock {
            Some(s) => s,
            None => {
                return Err(match last {
                    Some(e) => io_err(&label, &format!("cannot connect to {addr}"), e),
                    None => format!("{label}: {} resolves to no address", url.host),
                })
            }
        };
        sock.set_nodelay(true)
            .and_then(|_| sock.set_nonblocking(true))
            .map_err(|e| io_err(&label, "socket setup", e))?;
        let mut c = Conn {
            sock,
            label,
            rx: vec![0u8; RX_BUF],
            rx_start: 0,
            rx_end: 0,
            tx: Vec::with_capacity(64 * 1024),
            tx_off: 0,
            max_recv_dsl: LOGIN_MAX_RECV_DSL,
            neg: Negotiated::default(),
            digests: Digests::default(),
            s: SessionState::new(Lun(url.lun_field())),
            block_size: 0,
            num_blocks: 0,
            t: Tasks::new(),
            timeout: opts.timeout,
            logged_out: false,
        };
        c.do_login(url, opts)?;
        Ok(c)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    fn do_login(&mut self, url: &TargetUrl, opts: &LoginOptions) -> Result<(), String> {
        let deadline = self.deadline();
        let neg = KeyNegotiation::new(opts.header_digest, opts.data_digest);
        let neg = session::login(self, url, opts, neg, deadline)?;
        self.neg = neg.result;
        self.digests = Digests {
            header: self.neg.header_digest,
            data: self.neg.data_digest,
        };
        self.max_recv_dsl = OUR_MAX_RECV_DSL;
        Ok(())
    }

    /// Reads what the socket has; Err on EOF or error. Returns bytes read (0: nothing now).
    fn fill(&mut self) -> Result<usize, String> {
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else if self.rx.len() - self.rx_end < 128 * 1024 {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        match (&self.sock).read(&mut self.rx[self.rx_end..]) {
            Ok(0) => Err(format!("{}: the target closed the connection", self.label)),
            Ok(n) => {
                self.rx_end += n;
                Ok(n)
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Ok(0)
            }
            Err(e) => Err(io_err(&self.label, "receive", e)),
        }
    }

    /// The next complete PDU in the receive buffer: its header and the place of its data
    /// segment (valid until the next `fill`).
    fn next_frame(&mut self) -> Result<Option<(Bhs, usize, usize)>, String> {
        let start = self.rx_start;
        let avail = self.rx_end - start;
        if avail < BHS_LEN {
            return Ok(None);
        }
        let mut h = [0u8; BHS_LEN];
        h.copy_from_slice(&self.rx[start..start + BHS_LEN]);
        let ahs = raw_total_ahs_len(&h);
        let hd = if self.digests.header { DIGEST_LEN } else { 0 };
        let header_len = BHS_LEN + ahs + hd;
        if avail < header_len {
            return Ok(None);
        }
        if self.digests.header {
            let computed = digest::crc32c(&self.rx[start..start + BHS_LEN + ahs]);
            let at = start + BHS_LEN + ahs;
            let received = digest::from_wire([
                self.rx[at],
                self.rx[at + 1],
                self.rx[at + 2],
                self.rx[at + 3],
            ]);
            if computed != received {
                return Err(format!(
                    "{}: header digest error from the target",
                    self.label
                ));
            }
        }
        let dsl = raw_data_segment_len(&h);
        if dsl > self.max_recv_dsl as usize {
            return Err(format!(
                "{}: the target sent a {dsl}-byte data segment, above our MaxRecvDataSegmentLength {}",
                self.label, self.max_recv_dsl
            ));
        }
        let data_len = if dsl == 0 {
            0
        } else {
            padded_len(dsl) + if self.digests.data { DIGEST_LEN } else { 0 }
        };
        if avail < header_len + data_len {
            return Ok(None);
        }
        let ds = start + header_len;
        if dsl > 0 && self.digests.data {
            let p = padded_len(dsl);
            let computed = digest::crc32c(&self.rx[ds..ds + p]);
            let at = ds + p;
            let received = digest::from_wire([
                self.rx[at],
                self.rx[at + 1],
                self.rx[at + 2],
                self.rx[at + 3],
            ]);
            if computed != received {
                return Err(format!("{}: data digest error from the target", self.label));
            }
        }
        let bhs = Bhs::parse(&h)
            .map_err(|e| format!("{}: malformed PDU from the target: {e}", self.label))?;
        self.rx_start += header_len + data_len;
        Ok(Some((bhs, ds, dsl)))
    }

    /// Blocks (poll) for the next PDU until `deadline`.
    fn wait_frame(&mut self, deadline: Instant, what: &str) -> Result<(Bhs, usize, usize), String> {
        loop {
            if let Some(f) = self.next_frame()? {
                return Ok(f);
            }
            if self
                .fill()
                .map_err(|e| format!("{e} while waiting for {what}"))?
                > 0
            {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "{}: timed out after {:?} waiting for {what}",
                    self.label, self.timeout
                ));
            }
            wait_fd(self.sock.as_raw_fd(), false, left)?;
        }
    }

    /// Writes what is queued without waiting; true if everything went out.
    pub fn flush(&mut self) -> Result<bool, String> {
        while self.tx_off < self.tx.len() {
            match (&self.sock).write(&self.tx[self.tx_off..]) {
                Ok(0) => return Err(format!("{}: the connection is closed", self.label)),
                Ok(n) => self.tx_off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&self.label, "send", e)),
            }
        }
        self.tx.clear();
        self.tx_off = 0;
        Ok(true)
    }

    fn flush_until(&mut self, deadline: Instant) -> Result<(), String> {
        while !self.flush()? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("{}: timed out sending", self.label));
            }
            wait_fd(self.sock.as_raw_fd(), true, left)?;
        }
        Ok(())
    }

    // ---- management commands (setup / teardown) ------------------------------------

    /// Runs one SCSI command (no data out) and waits for its status.
    pub fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<CmdResult, String> {
        let deadline = self.deadline();
        let (status, sense, _) = session::run_mgmt(self, cdb, read_len, deadline)?;
        Ok(CmdResult {
            status,
            sense,
            data: std::mem::take(&mut self.s.mgmt.data),
        })
    }

    fn wait_and_dispatch(&mut self, deadline: Instant, what: &str) -> Result<(), String> {
        let (h, ds, dl) = self.wait_frame(deadline, what)?;
        let mut none = Vec::new();
        self.handle(h, ds, dl, &mut none)?;
        self.flush_until(deadline)
    }

    /// TEST UNIT READY until GOOD (see [`wait_ready`]).
    pub fn wait_ready(&mut self) -> Result<(), String> {
        wait_ready(self)
    }

    /// READ CAPACITY (see [`read_capacity`]): sets `block_size` and `num_blocks`.
    pub fn read_capacity(&mut self) -> Result<(), String> {
        let (bs, n) = read_capacity(self)?;
        self.block_size = bs;
        self.num_blocks = n;
        Ok(())
    }

    /// Logout (close the session) and close the socket; errors are the caller's to report
    /// or ignore.
    pub fn logout(&mut self) -> Result<(), String> {
        if self.logged_out {
            return Ok(());
        }
        self.logged_out = true;
        let deadline = self.deadline();
        session::logout_exchange(self, deadline)?;
        let _ = self.sock.shutdown(Shutdown::Both);
        session::logout_result(&self.s, &self.label)
    }

    // ---- the data path ---------------------------------------------------------------

    /// Prepares `qd` task slots with `bs`-byte buffers.
    pub fn start_io(&mut self, qd: usize, bs: usize) {
        self.t.start(qd, bs);
    }

    pub fn fd(&self) -> i32 {
        self.sock.as_raw_fd()
    }

    /// Whether bytes are queued that the socket has not taken yet.
    pub fn wants_write(&self) -> bool {
        self.tx_off < self.tx.len()
    }

    pub fn inflight(&self) -> usize {
        self.t.inflight
    }

    /// A slot's buffer: fill it before submitting a write; holds a read's data after it
    /// completed.
    pub fn buf(&self, slot: usize) -> &[u8] {
        &self.t.slots[slot].buf
    }

    pub fn buf_mut(&mut self, slot: usize) -> &mut [u8] {
        &mut self.t.slots[slot].buf
    }

    /// The LBA of a slot's current (or last) I/O.
    pub fn lba(&self, slot: usize) -> u64 {
        self.t.slots[slot].lba
    }

    /// Queues one I/O of `blocks` blocks at `lba` on an idle slot. It goes out with the next
    /// [`Conn::flush`], or waits for the CmdSN window.
    pub fn submit(&mut self, slot: usize, dir: Dir, lba: u64, blocks: u32) {
        let open = self.s.window_open();
        if self.t.submit(slot, dir, lba, blocks, self.block_size, open) {
            self.send_command(slot);
        }
    }

    fn send_command(&mut self, slot: usize) {
        let neg = self.neg;
        let t = &mut self.t.slots[slot];
        t.state = TaskState::InFlight;
        let write = t.dir == Dir::Write;
        // Unsolicited data: immediate (in the command) and/or Data-Out before any R2T.
        let (unsolicited, immediate) = if write && (neg.immediate_data || !neg.initial_r2t) {
            let u = t.len.min(neg.first_burst);
            let i = if neg.immediate_data {
                u.min(neg.max_send_dsl)
            } else {
                0
            };
            (u, i)
        } else {
            (0, 0)
        };
        let cmd = self.s.command(
            Itt(t.itt),
            !write,
            write,
            t.len,
            rw_cdb(t.dir, t.lba, t.blocks),
            unsolicited == immediate,
        );
        push_pdu(
            &mut self.tx,
            self.digests,
            bhs(Op::ScsiCommand(cmd)),
            &t.buf[..immediate as usize],
        );
        if unsolicited > immediate {
            self.send_data_out(slot, Ttt::RESERVED, immediate, unsolicited - immediate);
        }
    }

    /// Data-Out PDUs for `[offset, offset + len)` of a task, one sequence (DataSN from 0).
    fn send_data_out(&mut self, slot: usize, ttt: Ttt, offset: u32, len: u32) {
        let t = &self.t.slots[slot];
        let max = self.neg.max_send_dsl;
        let mut sent = 0u32;
        let mut sn = 0u32;
        while sent < len {
            let n = (len - sent).min(max);
            let off = offset + sent;
            let d = DataOut {
                final_bit: sent + n == len,
                lun: self.s.lun,
                itt: Itt(t.itt),
                ttt,
                exp_stat_sn: self.s.exp_stat_sn,
                data_sn: Sn(sn),
                buffer_offset: off,
            };
            push_pdu(
                &mut self.tx,
                self.digests,
                bhs(Op::DataOut(d)),
                &t.buf[off as usize..(off + n) as usize],
            );
            sent += n;
            sn += 1;
        }
    }

    fn complete(&mut self, o: Outcome, out: &mut Vec<Completion>) {
        let Outcome {
            slot,
            status,
            sense,
            residual,
        } = o;
        let t = self.t.finish(slot);
        let result = if status != status::GOOD {
            Err(t.status_error(status, sense))
        } else if t.dir == Dir::Read && (t.received != t.len || residual) {
            Err(IoError {
                status,
                sense: None,
                what: format!(
                    "READ of {} blocks at LBA {}: {} of {} bytes transferred",
                    t.blocks, t.lba, t.received, t.len
                ),
            })
        } else {
            Ok(())
        };
        out.push(Completion { slot, result });
    }

    /// Receives and handles whatever PDUs have arrived; completions are appended to `out`.
    /// Returns whether anything was received. Commands waiting for the CmdSN window are
    /// queued for sending as it opens.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<bool, String> {
        let n = self.fill()?;
        if n == 0 && self.rx_end - self.rx_start < BHS_LEN {
            return Ok(false);
        }
        while let Some((h, ds, dl)) = self.next_frame()? {
            self.handle(h, ds, dl, out)?;
        }
        while let Some(slot) = self.t.unblock(self.s.window_open()) {
            self.send_command(slot);
        }
        Ok(true)
    }

    fn handle(
        &mut self,
        h: Bhs,
        ds: usize,
        dl: usize,
        out: &mut Vec<Completion>,
    ) -> Result<(), String> {
        match h.op {
            Op::DataIn(d) => {
                self.s.update_window(d.exp_cmd_sn, d.max_cmd_sn);
                if d.status_present {
                    self.s.saw_stat_sn(d.stat_sn);
                }
                let residual = d.residual_overflow || d.residual_underflow;
                if d.itt.0 & MGMT_ITT != 0 {
                    let mgmt = &mut self.s.mgmt;
                    if d.itt.0 != mgmt.itt {
                        return Err(format!("{}: Data-In for an unknown task", self.label));
                    }
                    let off = d.buffer_offset as usize;
                    let end = (off + dl).min(mgmt.want);
                    if mgmt.data.len() < end {
                        mgmt.data.resize(end, 0);
                    }
                    if off < end {
                        mgmt.data[off..end].copy_from_slice(&self.rx[ds..ds + (end - off)]);
                    }
                    if d.status_present {
                        mgmt.done = Some((d.status, None, mgmt.data.len()));
                    }
                    return Ok(());
                }
                let slot = self.t.slot_of(&self.label, d.itt)?;
                let t = &mut self.t.slots[slot];
                let off = d.buffer_offset as usize;
                if t.dir != Dir::Read || off + dl > t.len as usize {
                    return Err(format!(
                        "{}: Data-In of {dl} bytes at offset {off} for a {}-byte {:?}",
                        self.label, t.len, t.dir
                    ));
                }
                t.buf[off..off + dl].copy_from_slice(&self.rx[ds..ds + dl]);
                t.received += dl as u32;
                if d.status_present {
                    let o = Outcome {
                        slot,
                        status: d.status,
                        sense: None,
                        residual: residual && d.status == status::GOOD,
                    };
                    self.complete(o, out);
                }
            }
            Op::R2t(r) => {
                self.s.update_window(r.exp_cmd_sn, r.max_cmd_sn);
                let slot = self.t.slot_of(&self.label, r.itt)?;
                let t = &self.t.slots[slot];
                let end = r.buffer_offset as u64 + r.desired_data_transfer_length as u64;
                if t.dir != Dir::Write || end > t.len as u64 || r.desired_data_transfer_length == 0
                {
                    return Err(format!(
                        "{}: R2T for {} bytes at offset {} of a {}-byte {:?}",
                        self.label, r.desired_data_transfer_length, r.buffer_offset, t.len, t.dir
                    ));
                }
                self.send_data_out(slot, r.ttt, r.buffer_offset, r.desired_data_transfer_length);
            }
            op => {
                let data = &self.rx[ds..ds + dl];
                let (tasks, label) = (&self.t, self.label.as_str());
                match self
                    .s
                    .receive(label, &op, data, |itt| tasks.slot_of(label, itt))?
                {
                    Received::Done => {}
                    Received::Ping(reply) => {
                        push_pdu(&mut self.tx, self.digests, bhs(Op::NopOut(reply)), data)
                    }
                    Received::Complete(o) => self.complete(o, out),
                }
            }
        }
        Ok(())
    }
}

impl Transport for Conn {
    fn state(&mut self) -> &mut SessionState {
        &mut self.s
    }

    fn send_control(&mut self, op: Op, data: &[u8], deadline: Instant) -> Result<(), String> {
        // Login PDUs go out without digests: they are off until login ends.
        push_pdu(&mut self.tx, self.digests, bhs(op), data);
        self.flush_until(deadline)
    }

    fn recv_login(&mut self, deadline: Instant, text: &mut Vec<u8>) -> Result<Bhs, String> {
        let (h, ds, dl) = self.wait_frame(deadline, "a Login Response")?;
        text.extend_from_slice(&self.rx[ds..ds + dl]);
        Ok(h)
    }

    fn progress(&mut self, deadline: Instant, what: &str) -> Result<(), String> {
        self.wait_and_dispatch(deadline, what)
    }
}

/// A session that can run one management SCSI command at a time (setup and teardown).
pub trait ScsiExec {
    /// Runs one SCSI command (no data out) and waits for its status.
    fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<CmdResult, String>;
    fn label(&self) -> &str;
}

impl ScsiExec for Conn {
    fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<CmdResult, String> {
        Conn::exec(self, cdb, read_len)
    }
    fn label(&self) -> &str {
        &self.label
    }
}

/// TEST UNIT READY until GOOD: a new I_T nexus first gets a POWER ON / RESET unit
/// attention, and a target may report NOT READY (becoming ready) or BUSY for a while.
pub fn wait_ready<E: ScsiExec>(c: &mut E) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..30 {
        let r = c.exec(&[0u8; 6], 0)?;
        match (r.status, r.sense) {
            (status::GOOD, _) => return Ok(()),
            (status::CHECK_CONDITION, Some(s)) if s.key == Sense::UNIT_ATTENTION => {
                last = format!("CHECK CONDITION, {s}");
            }
            (status::CHECK_CONDITION, Some(s)) if s.key == Sense::NOT_READY => {
                last = format!("CHECK CONDITION, {s}");
                std::thread::sleep(Duration::from_millis(100));
            }
            (status::BUSY | status::TASK_SET_FULL, _) => {
                last = status_name(r.status);
                std::thread::sleep(Duration::from_millis(100));
            }
            (s, sense) => {
                return Err(format!(
                    "{}: TEST UNIT READY failed: {}{}",
                    c.label(),
                    status_name(s),
                    sense.map(|x| format!(", {x}")).unwrap_or_default()
                ))
            }
        }
    }
    Err(format!(
        "{}: the LUN did not become ready (last: {last})",
        c.label()
    ))
}

/// READ CAPACITY (16), or (10) if the target does not know (16): (block size, blocks).
pub fn read_capacity<E: ScsiExec>(c: &mut E) -> Result<(u32, u64), String> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[13] = 32;
    let r = c.exec(&cdb, 32)?;
    let (last_lba, block_size) = if r.status == status::GOOD && r.data.len() >= 12 {
        (
            u64::from_be_bytes(r.data[0..8].try_into().unwrap_or_default()),
            u32::from_be_bytes(r.data[8..12].try_into().unwrap_or_default()),
        )
    } else {
        let r10 = c.exec(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8)?;
        if r10.status != status::GOOD || r10.data.len() < 8 {
            return Err(format!(
                "{}: READ CAPACITY failed: (16) {}{}, (10) {}{}",
                c.label(),
                status_name(r.status),
                r.sense.map(|x| format!(", {x}")).unwrap_or_default(),
                status_name(r10.status),
                r10.sense.map(|x| format!(", {x}")).unwrap_or_default()
            ));
        }
        (
            u32::from_be_bytes(r10.data[0..4].try_into().unwrap_or_default()) as u64,
            u32::from_be_bytes(r10.data[4..8].try_into().unwrap_or_default()),
        )
    };
    if !(512..=65536).contains(&block_size) || !block_size.is_power_of_two() {
        return Err(format!(
            "{}: the LUN reports a block size of {block_size} bytes",
            c.label()
        ));
    }
    Ok((block_size, last_lba.saturating_add(1)))
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn answers_to_our_proposals_set_the_result() {
        let mut n = KeyNegotiation::new(false, false);
        let prop = n.operational_proposal();
        assert!(prop.iter().any(|(k, v)| k == "InitialR2T" && v == "No"));
        let ans = n
            .take_response(&pairs(&[
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("MaxRecvDataSegmentLength", "65536"),
                ("ImmediateData", "Yes"),
                ("InitialR2T", "Yes"),
                ("FirstBurstLength", "65536"),
                ("MaxBurstLength", "262144"),
                ("TargetPortalGroupTag", "1"),
            ]))
            .unwrap();
        assert!(ans.is_empty(), "{ans:?}");
        let r = n.result;
        assert_eq!(r.max_send_dsl, 65536);
        assert!(r.immediate_data && r.initial_r2t);
        assert_eq!((r.first_burst, r.max_burst), (65536, 262144));
    }

    #[test]
    fn offers_are_answered() {
        let mut n = KeyNegotiation::new(true, false);
        let ans = n
            .take_response(&pairs(&[
                ("HeaderDigest", "None,CRC32C"),
                ("DataDigest", "CRC32C,None"),
                ("ImmediateData", "No"),
                ("MaxOutstandingR2T", "4"),
                ("X-com.example.Thing", "1"),
                ("RDMAExtensions", "Yes"),
                ("AuthMethod", "CHAP,None"),
            ]))
            .unwrap();
        assert_eq!(
            ans,
            pairs(&[
                ("HeaderDigest", "CRC32C"),
                ("DataDigest", "None"),
                ("ImmediateData", "No"),
                ("MaxOutstandingR2T", "4"),
                ("X-com.example.Thing", "NotUnderstood"),
                ("RDMAExtensions", "No"),
                ("AuthMethod", "None"),
            ])
        );
        assert!(n.result.header_digest && !n.result.data_digest && !n.result.immediate_data);
    }

    #[test]
    fn refusals_are_errors() {
        let mut n = KeyNegotiation::new(true, false);
        n.operational_proposal();
        let e = n
            .take_response(&pairs(&[("HeaderDigest", "None")]))
            .unwrap_err();
        assert!(e.contains("HeaderDigest=CRC32C"), "{e}");
        let mut n = KeyNegotiation::new(false, false);
        let e = n
            .take_response(&pairs(&[("AuthMethod", "CHAP")]))
            .unwrap_err();
        assert!(e.contains("CHAP"), "{e}");
        let e = n
            .take_response(&pairs(&[("MaxRecvDataSegmentLength", "12")]))
            .unwrap_err();
        assert!(e.contains("MaxRecvDataSegmentLength"), "{e}");
        assert!(login_status_text(2, 3).contains("target not found"));
    }

    /// The whole data path against a strict fake target with the settings riser and tgt
    /// never choose: unsolicited Data-Out (InitialR2T=No, ImmediateData=No), R2Ts, 1 KiB
    /// Data-Out / odd-sized Data-In segments, status in the last Data-In or separately, a
    /// 2-command CmdSN window under a queue depth of 8, a unit attention at start.
    #[test]
    fn full_session_against_a_strict_fake_target() {
        use crate::fake_target as ft;
        use crate::verify;
        let (port, obs, h) = ft::start();
        let url = crate::url::parse(&format!("iscsi://127.0.0.1:{port}/iqn.2024-01.test:fake/0"))
            .unwrap();
        let opts = LoginOptions {
            initiator_name: INITIATOR_NAME.into(),
            header_digest: false,
            data_digest: false,
            timeout: Duration::from_secs(10),
            isid: [0x80, 0, 0, 0, 0, 1],
        };
        let mut c = Conn::login(&url, &opts).unwrap();
        assert_eq!(
            c.neg,
            Negotiated {
                header_digest: false,
                data_digest: false,
                max_send_dsl: ft::TARGET_MRDSL as u32,
                immediate_data: false,
                initial_r2t: false,
                first_burst: ft::FIRST_BURST as u32,
                max_burst: ft::MAX_BURST as u32,
            }
        );
        c.wait_ready().unwrap();
        c.read_capacity().unwrap();
        assert_eq!((c.num_blocks, c.block_size), (ft::BLOCKS, ft::BLOCK as u32));
        let (qd, io_blocks) = (8usize, 16u64);
        c.start_io(qd, io_blocks as usize * ft::BLOCK);
        let bsz = ft::BLOCK;
        let mut out = Vec::new();
        let mut m = verify::Mismatches::default();
        for dir in [Dir::Write, Dir::Read] {
            let mut next = 0u64;
            let issue = |c: &mut Conn, slot: usize, next: &mut u64| {
                if *next >= ft::BLOCKS {
                    return;
                }
                let n = (ft::BLOCKS - *next).min(io_blocks) as u32;
                if dir == Dir::Write {
                    verify::fill(&mut c.buf_mut(slot)[..n as usize * bsz], bsz, *next, 5);
                }
                c.submit(slot, dir, *next, n);
                *next += n as u64;
            };
            for slot in 0..qd {
                issue(&mut c, slot, &mut next);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.inflight() > 0 {
                assert!(Instant::now() < deadline, "I/Os did not complete");
                c.flush().unwrap();
                c.poll(&mut out).unwrap();
                for done in out.drain(..) {
                    done.result.unwrap();
                    if dir == Dir::Read {
                        let lba = c.lba(done.slot);
                        let n = (ft::BLOCKS - lba).min(io_blocks) as usize;
                        m.check(&c.buf(done.slot)[..n * bsz], bsz, lba, 5);
                    }
                    issue(&mut c, done.slot, &mut next);
                }
            }
        }
        assert_eq!(m.blocks, 0, "{:?}", m.runs);
        c.logout().unwrap();
        h.join().unwrap();
        let o = obs.lock().unwrap();
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        assert!(o.answered_offer && o.logged_out);
        // 63 writes: the first 2 KiB unsolicited in two 1 KiB PDUs, the rest by R2T.
        let writes = ft::BLOCKS.div_ceil(io_blocks) as usize;
        assert_eq!(o.unsolicited_data_outs, 2 * writes);
        assert!(o.r2ts >= writes, "{} R2Ts", o.r2ts);
        // 2 TUR (unit attention, then GOOD) + READ CAPACITY + writes + reads.
        assert_eq!(o.commands, 3 + 2 * writes);
    }

    #[test]
    fn cdbs() {
        let c = rw_cdb(Dir::Read, 0x1234, 8);
        assert_eq!(&c[..10], &[0x28, 0, 0, 0, 0x12, 0x34, 0, 0, 8, 0]);
        let c = rw_cdb(Dir::Write, u32::MAX as u64 - 7, 8);
        assert_eq!(c[0], 0x2a);
        let c = rw_cdb(Dir::Write, u32::MAX as u64, 8);
        assert_eq!(c[0], 0x8a);
        assert_eq!(&c[2..14], &[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 8]);
        assert_eq!(rw_cdb(Dir::Read, 0, 0x10000)[0], 0x88);
    }

    #[test]
    fn sense_formats() {
        let mut fixed = vec![0, 18, 0x70, 0, 0x06, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x29, 0x00];
        fixed.resize(20, 0);
        let s = Sense::parse(&fixed).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (6, 0x29, 0));
        assert!(s.to_string().starts_with("UNIT ATTENTION"));
        let desc = [0, 8, 0x72, 0x05, 0x24, 0x00, 0, 0, 0, 0];
        let s = Sense::parse(&desc).unwrap();
        assert_eq!((s.key, s.asc), (5, 0x24));
        assert_eq!(Sense::parse(&[0, 40, 0x70]), None);
        assert_eq!(Sense::parse(&[]), None);
    }
}
