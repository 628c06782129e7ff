//! The iSCSI PDU: 48-byte Basic Header Segment (BHS), Additional Header Segments (AHS) and
//! the data segment (RFC 7143 §11).
//!
//! [`Bhs::parse`] turns any 48 bytes into a typed header; an opcode this crate does not
//! know becomes [`Op::Unknown`] with the raw bytes kept, so the target can answer it with a
//! Reject carrying the header (RFC 7143 §11.17). [`Pdu`] adds the AHS and the data segment
//! and knows the two wire encodings: the TCP byte stream (padding to 4 bytes, optional
//! CRC32C digests, RFC 7143 §11.1) and the iSER message (no padding, no digests,
//! RFC 7145 §7.1).

use crate::digest;
use crate::serial::{Itt, Sn, Ttt, RESERVED_TAG};
use thiserror::Error;

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// Largest value of the 24-bit DataSegmentLength field (RFC 7143 §11.2.1.5).
pub const MAX_DATA_SEGMENT_LENGTH: usize = (1 << 24) - 1;
/// TotalAHSLength is one byte of 4-byte words (RFC 7143 §11.2.1.4).
pub const MAX_AHS_LENGTH: usize = 255 * 4;
/// Length of a header or data digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// Errors from the PDU codec. The header, when there was one, stays with the caller (the
/// framer returns it next to this error), so a Reject can still quote it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PduError {
    #[error("PDU truncated: need {needed} bytes, got {got}")]
    Truncated { needed: usize, got: usize },
    #[error("invalid field in opcode {opcode:#04x} PDU (ITT {itt:?}): {field}")]
    InvalidField {
        opcode: u8,
        itt: Itt,
        field: &'static str,
    },
    #[error("data segment of {len} bytes does not fit the 24-bit DataSegmentLength")]
    DataSegmentTooLong { len: usize },
    #[error("AHS of {len} bytes: must be a multiple of 4 and at most {MAX_AHS_LENGTH}")]
    BadAhsLength { len: usize },
    #[error("malformed AHS at byte {offset}")]
    MalformedAhs { offset: usize },
    #[error("data segment length field says {field} but the message holds {actual}")]
    LengthMismatch { field: usize, actual: usize },
}

/// The opcodes of RFC 7143 §11.2.1.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    NopOut = 0x00,
    ScsiCommand = 0x01,
    TaskMgmtRequest = 0x02,
    LoginRequest = 0x03,
    TextRequest = 0x04,
    DataOut = 0x05,
    LogoutRequest = 0x06,
    SnackRequest = 0x10,
    NopIn = 0x20,
    ScsiResponse = 0x21,
    TaskMgmtResponse = 0x22,
    LoginResponse = 0x23,
    TextResponse = 0x24,
    DataIn = 0x25,
    LogoutResponse = 0x26,
    R2t = 0x31,
    AsyncMessage = 0x32,
    Reject = 0x3f,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match v & 0x3f {
            0x00 => NopOut,
            0x01 => ScsiCommand,
            0x02 => TaskMgmtRequest,
            0x03 => LoginRequest,
            0x04 => TextRequest,
            0x05 => DataOut,
            0x06 => LogoutRequest,
            0x10 => SnackRequest,
            0x20 => NopIn,
            0x21 => ScsiResponse,
            0x22 => TaskMgmtResponse,
            0x23 => LoginResponse,
            0x24 => TextResponse,
            0x25 => DataIn,
            0x26 => LogoutResponse,
            0x31 => R2t,
            0x32 => AsyncMessage,
            0x3f => Reject,
            _ => return None,
        })
    }

    /// Initiator opcodes are 0x00-0x1f, target opcodes 0x20-0x3f (RFC 7143 §11.2.1.2).
    pub fn is_initiator(self) -> bool {
        (self as u8) < 0x20
    }
}

/// Logical Unit Number, the 8-byte SAM encoding carried as is (RFC 7143 §11.2.1.6);
/// the SCSI layer decodes the addressing method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lun(pub u64);

/// Initiator Session ID (RFC 7143 §11.12.5): 6 bytes, the initiator's half of the SSID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Isid(pub [u8; 6]);

/// Login stage codes of the CSG and NSG fields (RFC 7143 §11.12.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    SecurityNegotiation,
    LoginOperationalNegotiation,
    /// Code 2 is reserved; kept so the login state machine can refuse it with a Login
    /// Response instead of the codec losing the request.
    Reserved,
    FullFeaturePhase,
}

impl Stage {
    pub fn from_bits(v: u8) -> Stage {
        match v & 3 {
            0 => Stage::SecurityNegotiation,
            1 => Stage::LoginOperationalNegotiation,
            2 => Stage::Reserved,
            _ => Stage::FullFeaturePhase,
        }
    }

    pub fn bits(self) -> u8 {
        match self {
            Stage::SecurityNegotiation => 0,
            Stage::LoginOperationalNegotiation => 1,
            Stage::Reserved => 2,
            Stage::FullFeaturePhase => 3,
        }
    }
}

/// Login Response Status-Class and Status-Detail (RFC 7143 §11.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LoginStatus {
    pub class: u8,
    pub detail: u8,
}

impl LoginStatus {
    pub const SUCCESS: Self = Self::new(0x00, 0x00);
    pub const TARGET_MOVED_TEMPORARILY: Self = Self::new(0x01, 0x01);
    pub const TARGET_MOVED_PERMANENTLY: Self = Self::new(0x01, 0x02);
    pub const INITIATOR_ERROR: Self = Self::new(0x02, 0x00);
    pub const AUTHENTICATION_FAILURE: Self = Self::new(0x02, 0x01);
    pub const AUTHORIZATION_FAILURE: Self = Self::new(0x02, 0x02);
    pub const NOT_FOUND: Self = Self::new(0x02, 0x03);
    pub const TARGET_REMOVED: Self = Self::new(0x02, 0x04);
    pub const UNSUPPORTED_VERSION: Self = Self::new(0x02, 0x05);
    pub const TOO_MANY_CONNECTIONS: Self = Self::new(0x02, 0x06);
    pub const MISSING_PARAMETER: Self = Self::new(0x02, 0x07);
    pub const CANT_INCLUDE_IN_SESSION: Self = Self::new(0x02, 0x08);
    pub const SESSION_TYPE_NOT_SUPPORTED: Self = Self::new(0x02, 0x09);
    pub const SESSION_DOES_NOT_EXIST: Self = Self::new(0x02, 0x0a);
    pub const INVALID_DURING_LOGIN: Self = Self::new(0x02, 0x0b);
    pub const TARGET_ERROR: Self = Self::new(0x03, 0x00);
    pub const SERVICE_UNAVAILABLE: Self = Self::new(0x03, 0x01);
    pub const OUT_OF_RESOURCES: Self = Self::new(0x03, 0x02);

    pub const fn new(class: u8, detail: u8) -> Self {
        LoginStatus { class, detail }
    }

    pub const fn is_success(self) -> bool {
        self.class == 0
    }
}

/// Reject reason codes (RFC 7143 §11.17.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectReason {
    DataDigestError = 0x02,
    SnackReject = 0x03,
    ProtocolError = 0x04,
    CommandNotSupported = 0x05,
    ImmediateCommandReject = 0x06,
    TaskInProgress = 0x07,
    InvalidDataAck = 0x08,
    InvalidPduField = 0x09,
    LongOperationReject = 0x0a,
    WaitingForLogout = 0x0c,
}

/// SCSI Response "Response" field (RFC 7143 §11.4.3).
pub mod response {
    pub const COMMAND_COMPLETED_AT_TARGET: u8 = 0x00;
    pub const TARGET_FAILURE: u8 = 0x01;
}

/// Task management function codes (RFC 7143 §11.5.1).
pub mod tmf {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;
    /// Task Management Function Response codes (RFC 7143 §11.6.1).
    pub mod response {
        pub const FUNCTION_COMPLETE: u8 = 0;
        pub const TASK_DOES_NOT_EXIST: u8 = 1;
        pub const LUN_DOES_NOT_EXIST: u8 = 2;
        pub const TASK_STILL_ALLEGIANT: u8 = 3;
        pub const TASK_ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
        pub const FUNCTION_NOT_SUPPORTED: u8 = 5;
        pub const FUNCTION_AUTHORIZATION_FAILED: u8 = 6;
        pub const FUNCTION_REJECTED: u8 = 255;
    }
}

/// Logout reason and response codes (RFC 7143 §11.14.1, §11.15.1).
pub mod logout {
    pub const CLOSE_SESSION: u8 = 0;
    pub const CLOSE_CONNECTION: u8 = 1;
    pub const REMOVE_CONNECTION_FOR_RECOVERY: u8 = 2;
    pub mod response {
        pub const CLOSED_SUCCESSFULLY: u8 = 0;
        pub const CID_NOT_FOUND: u8 = 1;
        pub const RECOVERY_NOT_SUPPORTED: u8 = 2;
        pub const CLEANUP_FAILED: u8 = 3;
    }
}

// ---- the typed headers, one per opcode -------------------------------------------------

/// NOP-Out (RFC 7143 §11.18).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: Ttt,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
}

/// SCSI Command (RFC 7143 §11.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiCommand {
    pub immediate: bool,
    /// F: no unsolicited Data-Out follows (RFC 7143 §11.3.1).
    pub final_bit: bool,
    pub read: bool,
    pub write: bool,
    /// ATTR, 3 bits: untagged, simple, ordered, head of queue, ACA (RFC 7143 §11.3.1).
    pub attr: u8,
    pub lun: Lun,
    pub itt: Itt,
    pub expected_data_transfer_length: u32,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
    /// The first 16 CDB bytes; longer CDBs continue in an Extended CDB AHS.
    pub cdb: [u8; 16],
}

/// SCSI Task Management Function Request (RFC 7143 §11.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    /// Function code, see [`tmf`].
    pub function: u8,
    pub lun: Lun,
    pub itt: Itt,
    pub referenced_task_tag: Itt,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
    pub ref_cmd_sn: Sn,
    pub exp_data_sn: Sn,
}

/// Login Request (RFC 7143 §11.12). The I bit is always 1 for login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequest {
    pub transit_bit: bool,
    pub continue_bit: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: Isid,
    pub tsih: u16,
    pub itt: Itt,
    pub cid: u16,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
}

/// Text Request (RFC 7143 §11.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_bit: bool,
    pub continue_bit: bool,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: Ttt,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
}

/// SCSI Data-Out (RFC 7143 §11.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataOut {
    pub final_bit: bool,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: Ttt,
    pub exp_stat_sn: Sn,
    pub data_sn: Sn,
    pub buffer_offset: u32,
}

/// Logout Request (RFC 7143 §11.14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutRequest {
    pub immediate: bool,
    /// Reason code, see [`logout`].
    pub reason_code: u8,
    pub itt: Itt,
    pub cid: u16,
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
}

/// SNACK Request (RFC 7143 §11.16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnackRequest {
    /// Type, 4 bits: 0 Data/R2T, 1 Status, 2 DataACK, 3 R-Data.
    pub snack_type: u8,
    pub lun: Lun,
    pub itt: Itt,
    /// TTT for DataACK, SNACK Tag for R-Data, else reserved.
    pub ttt_or_snack_tag: u32,
    pub exp_stat_sn: Sn,
    pub beg_run: u32,
    pub run_length: u32,
}

/// NOP-In (RFC 7143 §11.19).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NopIn {
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: Ttt,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
}

/// SCSI Response (RFC 7143 §11.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiResponse {
    /// o: Bidirectional Read Residual Overflow.
    pub bidi_read_residual_overflow: bool,
    /// u: Bidirectional Read Residual Underflow.
    pub bidi_read_residual_underflow: bool,
    /// O: Residual Overflow.
    pub residual_overflow: bool,
    /// U: Residual Underflow.
    pub residual_underflow: bool,
    /// See [`response`].
    pub response: u8,
    /// SCSI status (valid when response is "command completed at target").
    pub status: u8,
    pub itt: Itt,
    pub snack_tag: u32,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    pub exp_data_sn: Sn,
    pub bidi_read_residual_count: u32,
    pub residual_count: u32,
}

/// SCSI Task Management Function Response (RFC 7143 §11.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    /// See [`tmf::response`].
    pub response: u8,
    pub itt: Itt,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
}

/// Login Response (RFC 7143 §11.13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginResponse {
    pub transit_bit: bool,
    pub continue_bit: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: Isid,
    pub tsih: u16,
    pub itt: Itt,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    pub status: LoginStatus,
}

/// Text Response (RFC 7143 §11.11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextResponse {
    pub final_bit: bool,
    pub continue_bit: bool,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: Ttt,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
}

/// SCSI Data-In (RFC 7143 §11.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataIn {
    pub final_bit: bool,
    /// A: the target asks for a DataACK SNACK (ERL > 0 only).
    pub acknowledge: bool,
    pub residual_overflow: bool,
    pub residual_underflow: bool,
    /// S: this PDU carries the command's status (phase collapse, RFC 7143 §11.7.3).
    pub status_present: bool,
    pub status: u8,
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: Ttt,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    pub data_sn: Sn,
    pub buffer_offset: u32,
    pub residual_count: u32,
}

/// Logout Response (RFC 7143 §11.15).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutResponse {
    /// See [`logout::response`].
    pub response: u8,
    pub itt: Itt,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    pub time2wait: u16,
    pub time2retain: u16,
}

/// Ready To Transfer (RFC 7143 §11.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct R2t {
    pub lun: Lun,
    pub itt: Itt,
    pub ttt: Ttt,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    pub r2t_sn: Sn,
    pub buffer_offset: u32,
    pub desired_data_transfer_length: u32,
}

/// Asynchronous Message (RFC 7143 §11.9); its ITT is always 0xffffffff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncMessage {
    pub lun: Lun,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    pub async_event: u8,
    pub async_vcode: u8,
    pub parameter1: u16,
    pub parameter2: u16,
    pub parameter3: u16,
}

/// Reject (RFC 7143 §11.17); its ITT is always 0xffffffff and its data segment is the
/// complete header of the rejected PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Raw reason code, see [`RejectReason`].
    pub reason: u8,
    pub stat_sn: Sn,
    pub exp_cmd_sn: Sn,
    pub max_cmd_sn: Sn,
    /// DataSN/R2TSN of a rejected SNACK, else 0.
    pub data_sn_or_r2t_sn: Sn,
}

/// A header whose opcode this crate does not know: kept whole so the target can quote it
/// in a Reject (Command not supported, RFC 7143 §11.17.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    pub opcode: u8,
    pub raw: [u8; BHS_LEN],
}

/// The opcode-specific part of a BHS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
    Unknown(Unknown),
}

/// A parsed Basic Header Segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bhs {
    /// TotalAHSLength in 4-byte words (RFC 7143 §11.2.1.4).
    pub total_ahs_length: u8,
    /// DataSegmentLength in bytes, without padding (RFC 7143 §11.2.1.5); 24 bits.
    pub data_segment_length: u32,
    pub op: Op,
}

// ---- byte helpers: fixed offsets into a fixed 48-byte array cannot go out of bounds ----

fn be16(b: &[u8; BHS_LEN], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8; BHS_LEN], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8; BHS_LEN], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}
fn sn(b: &[u8; BHS_LEN], at: usize) -> Sn {
    Sn(be32(b, at))
}
fn put16(b: &mut [u8; BHS_LEN], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut [u8; BHS_LEN], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8; BHS_LEN], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn bit(byte: u8, mask: u8) -> bool {
    byte & mask != 0
}
fn flag(on: bool, mask: u8) -> u8 {
    if on {
        mask
    } else {
        0
    }
}

// Byte 1 flag bits.
const F: u8 = 0x80;
const C: u8 = 0x40; // Text/Login "continue"
const T: u8 = 0x80; // Login "transit"
const I: u8 = 0x40; // byte 0 "immediate"

/// TotalAHSLength in bytes, read from a raw header.
pub fn raw_total_ahs_len(b: &[u8; BHS_LEN]) -> usize {
    usize::from(b[4]) * 4
}

/// DataSegmentLength (24 bits), read from a raw header.
pub fn raw_data_segment_len(b: &[u8; BHS_LEN]) -> usize {
    (usize::from(b[5]) << 16) | (usize::from(b[6]) << 8) | usize::from(b[7])
}

/// The ITT of a raw header: bytes 16..20 for every opcode.
pub fn raw_itt(b: &[u8; BHS_LEN]) -> Itt {
    Itt(be32(b, 16))
}

/// Round up to the 4-byte boundary of RFC 7143 §11.1 (padding).
pub fn padded_len(len: usize) -> usize {
    len.div_ceil(4) * 4
}

impl Bhs {
    /// Parse a header. Unknown opcodes are not an error: they become [`Op::Unknown`].
    /// Errors are reserved for headers that contradict themselves (RFC 7143 §11.10.2 and
    /// §11.12.2: F/T and C together).
    pub fn parse(b: &[u8; BHS_LEN]) -> Result<Bhs, PduError> {
        let b0 = b[0];
        let b1 = b[1];
        let immediate = bit(b0, I);
        let itt = Itt(be32(b, 16));
        let lun = Lun(be64(b, 8));
        let op = match Opcode::from_u8(b0) {
            None => Op::Unknown(Unknown {
                opcode: b0 & 0x3f,
                raw: *b,
            }),
            Some(code) => match code {
                Opcode::NopOut => Op::NopOut(NopOut {
                    immediate,
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    cmd_sn: sn(b, 24),
                    exp_stat_sn: sn(b, 28),
                }),
                Opcode::ScsiCommand => {
                    let mut cdb = [0u8; 16];
                    cdb.copy_from_slice(&b[32..48]);
                    Op::ScsiCommand(ScsiCommand {
                        immediate,
                        final_bit: bit(b1, F),
                        read: bit(b1, 0x40),
                        write: bit(b1, 0x20),
                        attr: b1 & 0x07,
                        lun,
                        itt,
                        expected_data_transfer_length: be32(b, 20),
                        cmd_sn: sn(b, 24),
                        exp_stat_sn: sn(b, 28),
                        cdb,
                    })
                }
                Opcode::TaskMgmtRequest => Op::TaskMgmtRequest(TaskMgmtRequest {
                    immediate,
                    function: b1 & 0x7f,
                    lun,
                    itt,
                    referenced_task_tag: Itt(be32(b, 20)),
                    cmd_sn: sn(b, 24),
                    exp_stat_sn: sn(b, 28),
                    ref_cmd_sn: sn(b, 32),
                    exp_data_sn: sn(b, 36),
                }),
                Opcode::LoginRequest => {
                    // RFC 7143 §11.12.2: T and C must not both be 1.
                    if bit(b1, T) && bit(b1, C) {
                        return Err(invalid(code, itt, "T and C bits both set"));
                    }
                    Op::LoginRequest(LoginRequest {
                        transit_bit: bit(b1, T),
                        continue_bit: bit(b1, C),
                        csg: Stage::from_bits(b1 >> 2),
                        nsg: Stage::from_bits(b1),
                        version_max: b[2],
                        version_min: b[3],
                        isid: isid(b),
                        tsih: be16(b, 14),
                        itt,
                        cid: be16(b, 20),
                        cmd_sn: sn(b, 24),
                        exp_stat_sn: sn(b, 28),
                    })
                }
                Opcode::TextRequest => {
                    // RFC 7143 §11.10.2: a Text Request with C=1 must have F=0.
                    if bit(b1, F) && bit(b1, C) {
                        return Err(invalid(code, itt, "F and C bits both set"));
                    }
                    Op::TextRequest(TextRequest {
                        immediate,
                        final_bit: bit(b1, F),
                        continue_bit: bit(b1, C),
                        lun,
                        itt,
                        ttt: Ttt(be32(b, 20)),
                        cmd_sn: sn(b, 24),
                        exp_stat_sn: sn(b, 28),
                    })
                }
                Opcode::DataOut => Op::DataOut(DataOut {
                    final_bit: bit(b1, F),
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    exp_stat_sn: sn(b, 28),
                    data_sn: sn(b, 36),
                    buffer_offset: be32(b, 40),
                }),
                Opcode::LogoutRequest => Op::LogoutRequest(LogoutRequest {
                    immediate,
                    reason_code: b1 & 0x7f,
                    itt,
                    cid: be16(b, 20),
                    cmd_sn: sn(b, 24),
                    exp_stat_sn: sn(b, 28),
                }),
                Opcode::SnackRequest => Op::SnackRequest(SnackRequest {
                    snack_type: b1 & 0x0f,
                    lun,
                    itt,
                    ttt_or_snack_tag: be32(b, 20),
                    exp_stat_sn: sn(b, 28),
                    beg_run: be32(b, 36),
                    run_length: be32(b, 40),
                }),
                Opcode::NopIn => Op::NopIn(NopIn {
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                }),
                Opcode::ScsiResponse => Op::ScsiResponse(ScsiResponse {
                    bidi_read_residual_overflow: bit(b1, 0x10),
                    bidi_read_residual_underflow: bit(b1, 0x08),
                    residual_overflow: bit(b1, 0x04),
                    residual_underflow: bit(b1, 0x02),
                    response: b[2],
                    status: b[3],
                    itt,
                    snack_tag: be32(b, 20),
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    exp_data_sn: sn(b, 36),
                    bidi_read_residual_count: be32(b, 40),
                    residual_count: be32(b, 44),
                }),
                Opcode::TaskMgmtResponse => Op::TaskMgmtResponse(TaskMgmtResponse {
                    response: b[2],
                    itt,
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                }),
                Opcode::LoginResponse => {
                    if bit(b1, T) && bit(b1, C) {
                        return Err(invalid(code, itt, "T and C bits both set"));
                    }
                    Op::LoginResponse(LoginResponse {
                        transit_bit: bit(b1, T),
                        continue_bit: bit(b1, C),
                        csg: Stage::from_bits(b1 >> 2),
                        nsg: Stage::from_bits(b1),
                        version_max: b[2],
                        version_active: b[3],
                        isid: isid(b),
                        tsih: be16(b, 14),
                        itt,
                        stat_sn: sn(b, 24),
                        exp_cmd_sn: sn(b, 28),
                        max_cmd_sn: sn(b, 32),
                        status: LoginStatus::new(b[36], b[37]),
                    })
                }
                Opcode::TextResponse => {
                    if bit(b1, F) && bit(b1, C) {
                        return Err(invalid(code, itt, "F and C bits both set"));
                    }
                    Op::TextResponse(TextResponse {
                        final_bit: bit(b1, F),
                        continue_bit: bit(b1, C),
                        lun,
                        itt,
                        ttt: Ttt(be32(b, 20)),
                        stat_sn: sn(b, 24),
                        exp_cmd_sn: sn(b, 28),
                        max_cmd_sn: sn(b, 32),
                    })
                }
                Opcode::DataIn => Op::DataIn(DataIn {
                    final_bit: bit(b1, F),
                    acknowledge: bit(b1, 0x40),
                    residual_overflow: bit(b1, 0x04),
                    residual_underflow: bit(b1, 0x02),
                    status_present: bit(b1, 0x01),
                    status: b[3],
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    data_sn: sn(b, 36),
                    buffer_offset: be32(b, 40),
                    residual_count: be32(b, 44),
                }),
                Opcode::LogoutResponse => Op::LogoutResponse(LogoutResponse {
                    response: b[2],
                    itt,
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    time2wait: be16(b, 40),
                    time2retain: be16(b, 42),
                }),
                Opcode::R2t => Op::R2t(R2t {
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    r2t_sn: sn(b, 36),
                    buffer_offset: be32(b, 40),
                    desired_data_transfer_length: be32(b, 44),
                }),
                Opcode::AsyncMessage => Op::AsyncMessage(AsyncMessage {
                    lun,
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    async_event: b[36],
                    async_vcode: b[37],
                    parameter1: be16(b, 38),
                    parameter2: be16(b, 40),
                    parameter3: be16(b, 42),
                }),
                Opcode::Reject => Op::Reject(Reject {
                    reason: b[2],
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    data_sn_or_r2t_sn: sn(b, 36),
                }),
            },
        };
        Ok(Bhs {
            total_ahs_length: b[4],
            data_segment_length: raw_data_segment_len(b) as u32,
            op,
        })
    }

    /// Parse the first 48 bytes of `buf`.
    pub fn parse_slice(buf: &[u8]) -> Result<Bhs, PduError> {
        let raw: &[u8; BHS_LEN] =
            buf.get(..BHS_LEN)
                .and_then(|s| s.try_into().ok())
                .ok_or(PduError::Truncated {
                    needed: BHS_LEN,
                    got: buf.len(),
                })?;
        Bhs::parse(raw)
    }

    /// Write the header. Every reserved field is written as zero (RFC 7143 §11.2.1.1);
    /// DataSegmentLength is truncated to its 24 bits ([`Pdu::encode`] checks it first).
    pub fn write(&self, b: &mut [u8; BHS_LEN]) {
        if let Op::Unknown(u) = &self.op {
            *b = u.raw;
        } else {
            *b = [0u8; BHS_LEN];
        }
        b[0] = self.op.opcode_byte();
        b[4] = self.total_ahs_length;
        let dsl = self.data_segment_length & 0x00ff_ffff;
        b[5] = (dsl >> 16) as u8;
        b[6] = (dsl >> 8) as u8;
        b[7] = dsl as u8;
        match &self.op {
            Op::NopOut(p) => {
                b[0] |= flag(p.immediate, I);
                b[1] = F;
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.ttt.0);
                put32(b, 24, p.cmd_sn.0);
                put32(b, 28, p.exp_stat_sn.0);
            }
            Op::ScsiCommand(p) => {
                b[0] |= flag(p.immediate, I);
                b[1] =
                    flag(p.final_bit, F) | flag(p.read, 0x40) | flag(p.write, 0x20) | (p.attr & 7);
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.expected_data_transfer_length);
                put32(b, 24, p.cmd_sn.0);
                put32(b, 28, p.exp_stat_sn.0);
                b[32..48].copy_from_slice(&p.cdb);
            }
            Op::TaskMgmtRequest(p) => {
                b[0] |= flag(p.immediate, I);
                b[1] = F | (p.function & 0x7f);
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.referenced_task_tag.0);
                put32(b, 24, p.cmd_sn.0);
                put32(b, 28, p.exp_stat_sn.0);
                put32(b, 32, p.ref_cmd_sn.0);
                put32(b, 36, p.exp_data_sn.0);
            }
            Op::LoginRequest(p) => {
                b[0] |= I; // RFC 7143 §11.12: always immediate
                b[1] = flag(p.transit_bit, T)
                    | flag(p.continue_bit, C)
                    | (p.csg.bits() << 2)
                    | p.nsg.bits();
                b[2] = p.version_max;
                b[3] = p.version_min;
                b[8..14].copy_from_slice(&p.isid.0);
                put16(b, 14, p.tsih);
                put32(b, 16, p.itt.0);
                put16(b, 20, p.cid);
                put32(b, 24, p.cmd_sn.0);
                put32(b, 28, p.exp_stat_sn.0);
            }
            Op::TextRequest(p) => {
                b[0] |= flag(p.immediate, I);
                b[1] = flag(p.final_bit, F) | flag(p.continue_bit, C);
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.ttt.0);
                put32(b, 24, p.cmd_sn.0);
                put32(b, 28, p.exp_stat_sn.0);
            }
            Op::DataOut(p) => {
                b[1] = flag(p.final_bit, F);
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.ttt.0);
                put32(b, 28, p.exp_stat_sn.0);
                put32(b, 36, p.data_sn.0);
                put32(b, 40, p.buffer_offset);
            }
            Op::LogoutRequest(p) => {
                b[0] |= flag(p.immediate, I);
                b[1] = F | (p.reason_code & 0x7f);
                put32(b, 16, p.itt.0);
                put16(b, 20, p.cid);
                put32(b, 24, p.cmd_sn.0);
                put32(b, 28, p.exp_stat_sn.0);
            }
            Op::SnackRequest(p) => {
                b[1] = F | (p.snack_type & 0x0f);
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.ttt_or_snack_tag);
                put32(b, 28, p.exp_stat_sn.0);
                put32(b, 36, p.beg_run);
                put32(b, 40, p.run_length);
            }
            Op::NopIn(p) => {
                b[1] = F;
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.ttt.0);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
            }
            Op::ScsiResponse(p) => {
                b[1] = F
                    | flag(p.bidi_read_residual_overflow, 0x10)
                    | flag(p.bidi_read_residual_underflow, 0x08)
                    | flag(p.residual_overflow, 0x04)
                    | flag(p.residual_underflow, 0x02);
                b[2] = p.response;
                b[3] = p.status;
                put32(b, 16, p.itt.0);
                put32(b, 20, p.snack_tag);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
                put32(b, 36, p.exp_data_sn.0);
                put32(b, 40, p.bidi_read_residual_count);
                put32(b, 44, p.residual_count);
            }
            Op::TaskMgmtResponse(p) => {
                b[1] = F;
                b[2] = p.response;
                put32(b, 16, p.itt.0);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
            }
            Op::LoginResponse(p) => {
                b[1] = flag(p.transit_bit, T)
                    | flag(p.continue_bit, C)
                    | (p.csg.bits() << 2)
                    | p.nsg.bits();
                b[2] = p.version_max;
                b[3] = p.version_active;
                b[8..14].copy_from_slice(&p.isid.0);
                put16(b, 14, p.tsih);
                put32(b, 16, p.itt.0);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
                b[36] = p.status.class;
                b[37] = p.status.detail;
            }
            Op::TextResponse(p) => {
                b[1] = flag(p.final_bit, F) | flag(p.continue_bit, C);
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.ttt.0);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
            }
            Op::DataIn(p) => {
                b[1] = flag(p.final_bit, F)
                    | flag(p.acknowledge, 0x40)
                    | flag(p.residual_overflow, 0x04)
                    | flag(p.residual_underflow, 0x02)
                    | flag(p.status_present, 0x01);
                b[3] = p.status;
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.ttt.0);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
                put32(b, 36, p.data_sn.0);
                put32(b, 40, p.buffer_offset);
                put32(b, 44, p.residual_count);
            }
            Op::LogoutResponse(p) => {
                b[1] = F;
                b[2] = p.response;
                put32(b, 16, p.itt.0);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
                put16(b, 40, p.time2wait);
                put16(b, 42, p.time2retain);
            }
            Op::R2t(p) => {
                b[1] = F;
                put64(b, 8, p.lun.0);
                put32(b, 16, p.itt.0);
                put32(b, 20, p.ttt.0);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
                put32(b, 36, p.r2t_sn.0);
                put32(b, 40, p.buffer_offset);
                put32(b, 44, p.desired_data_transfer_length);
            }
            Op::AsyncMessage(p) => {
                b[1] = F;
                put64(b, 8, p.lun.0);
                put32(b, 16, RESERVED_TAG);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
                b[36] = p.async_event;
                b[37] = p.async_vcode;
                put16(b, 38, p.parameter1);
                put16(b, 40, p.parameter2);
                put16(b, 42, p.parameter3);
            }
            Op::Reject(p) => {
                b[1] = F;
                b[2] = p.reason;
                put32(b, 16, RESERVED_TAG);
                put32(b, 24, p.stat_sn.0);
                put32(b, 28, p.exp_cmd_sn.0);
                put32(b, 32, p.max_cmd_sn.0);
                put32(b, 36, p.data_sn_or_r2t_sn.0);
            }
            Op::Unknown(_) => {}
        }
    }

    /// The header as 48 bytes.
    pub fn to_bytes(&self) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        self.write(&mut b);
        b
    }

    pub fn opcode(&self) -> Option<Opcode> {
        self.op.opcode()
    }

    /// The Initiator Task Tag; 0xffffffff for Async Message and Reject.
    pub fn itt(&self) -> Itt {
        self.op.itt()
    }
}

fn isid(b: &[u8; BHS_LEN]) -> Isid {
    let mut v = [0u8; 6];
    v.copy_from_slice(&b[8..14]);
    Isid(v)
}

fn invalid(code: Opcode, itt: Itt, field: &'static str) -> PduError {
    PduError::InvalidField {
        opcode: code as u8,
        itt,
        field,
    }
}

impl Op {
    pub fn opcode(&self) -> Option<Opcode> {
        Some(match self {
            Op::NopOut(_) => Opcode::NopOut,
            Op::ScsiCommand(_) => Opcode::ScsiCommand,
            Op::TaskMgmtRequest(_) => Opcode::TaskMgmtRequest,
            Op::LoginRequest(_) => Opcode::LoginRequest,
            Op::TextRequest(_) => Opcode::TextRequest,
            Op::DataOut(_) => Opcode::DataOut,
            Op::LogoutRequest(_) => Opcode::LogoutRequest,
            Op::SnackRequest(_) => Opcode::SnackRequest,
            Op::NopIn(_) => Opcode::NopIn,
            Op::ScsiResponse(_) => Opcode::ScsiResponse,
            Op::TaskMgmtResponse(_) => Opcode::TaskMgmtResponse,
            Op::LoginResponse(_) => Opcode::LoginResponse,
            Op::TextResponse(_) => Opcode::TextResponse,
            Op::DataIn(_) => Opcode::DataIn,
            Op::LogoutResponse(_) => Opcode::LogoutResponse,
            Op::R2t(_) => Opcode::R2t,
            Op::AsyncMessage(_) => Opcode::AsyncMessage,
            Op::Reject(_) => Opcode::Reject,
            Op::Unknown(_) => return None,
        })
    }

    /// Byte 0 without the I bit.
    fn opcode_byte(&self) -> u8 {
        match self {
            Op::Unknown(u) => u.raw[0],
            other => other.opcode().map_or(0, |c| c as u8),
        }
    }

    pub fn itt(&self) -> Itt {
        match self {
            Op::NopOut(p) => p.itt,
            Op::ScsiCommand(p) => p.itt,
            Op::TaskMgmtRequest(p) => p.itt,
            Op::LoginRequest(p) => p.itt,
            Op::TextRequest(p) => p.itt,
            Op::DataOut(p) => p.itt,
            Op::LogoutRequest(p) => p.itt,
            Op::SnackRequest(p) => p.itt,
            Op::NopIn(p) => p.itt,
            Op::ScsiResponse(p) => p.itt,
            Op::TaskMgmtResponse(p) => p.itt,
            Op::LoginResponse(p) => p.itt,
            Op::TextResponse(p) => p.itt,
            Op::DataIn(p) => p.itt,
            Op::LogoutResponse(p) => p.itt,
            Op::R2t(p) => p.itt,
            Op::AsyncMessage(_) | Op::Reject(_) => Itt::RESERVED,
            Op::Unknown(u) => raw_itt(&u.raw),
        }
    }
}

// ---- AHS -------------------------------------------------------------------------------

/// AHSType codes (RFC 7143 §11.2.2.1).
pub mod ahs_type {
    pub const EXTENDED_CDB: u8 = 1;
    pub const BIDI_READ_EXPECTED_DATA_TRANSFER_LENGTH: u8 = 2;
}

/// One Additional Header Segment: its type and its AHS-specific bytes (the AHSLength
/// bytes after the type byte, RFC 7143 §11.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhsSegment<'a> {
    pub ahs_type: u8,
    pub specific: &'a [u8],
}

/// Walk the AHS area: each segment is AHSLength (2), AHSType (1), AHSLength specific
/// bytes, padded to 4 (RFC 7143 §11.2.2).
pub fn ahs_segments(ahs: &[u8]) -> Result<Vec<AhsSegment<'_>>, PduError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < ahs.len() {
        let head = ahs
            .get(at..at + 3)
            .ok_or(PduError::MalformedAhs { offset: at })?;
        let len = usize::from(u16::from_be_bytes([head[0], head[1]]));
        let end = at + 3 + len;
        let specific = ahs
            .get(at + 3..end)
            .ok_or(PduError::MalformedAhs { offset: at })?;
        out.push(AhsSegment {
            ahs_type: head[2],
            specific,
        });
        at = padded_len(end);
    }
    Ok(out)
}

/// Build an Extended CDB AHS for the CDB bytes beyond the first 16 (RFC 7143 §11.2.2.3):
/// AHSLength = CDB length - 15 (the reserved byte plus the extension).
pub fn extended_cdb_ahs(cdb_tail: &[u8]) -> Vec<u8> {
    let len = cdb_tail.len() + 1;
    let mut v = Vec::with_capacity(padded_len(3 + len));
    v.extend_from_slice(&(len as u16).to_be_bytes());
    v.push(ahs_type::EXTENDED_CDB);
    v.push(0);
    v.extend_from_slice(cdb_tail);
    v.resize(padded_len(v.len()), 0);
    v
}

/// Build a Bidirectional Read Expected Data Transfer Length AHS (RFC 7143 §11.2.2.4).
pub fn bidi_read_edtl_ahs(len: u32) -> Vec<u8> {
    let mut v = vec![
        0x00,
        0x05,
        ahs_type::BIDI_READ_EXPECTED_DATA_TRANSFER_LENGTH,
        0,
    ];
    v.extend_from_slice(&len.to_be_bytes());
    v
}

// ---- the whole PDU -------------------------------------------------------------------

/// Which digests are on for a connection (RFC 7143 §13.1); always off on iSER.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// A complete PDU. `bhs.total_ahs_length` and `bhs.data_segment_length` are recomputed from
/// `ahs` and `data` when encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: Bhs,
    /// Raw AHS area, a multiple of 4 bytes; usually empty.
    pub ahs: Vec<u8>,
    /// Data segment without padding.
    pub data: Vec<u8>,
}

impl Pdu {
    /// A PDU with no AHS and no data.
    pub fn new(op: Op) -> Pdu {
        Pdu {
            bhs: Bhs {
                total_ahs_length: 0,
                data_segment_length: 0,
                op,
            },
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    pub fn with_data(op: Op, data: Vec<u8>) -> Pdu {
        let mut p = Pdu::new(op);
        p.data = data;
        p
    }

    pub fn op(&self) -> &Op {
        &self.bhs.op
    }

    pub fn opcode(&self) -> Option<Opcode> {
        self.bhs.opcode()
    }

    pub fn itt(&self) -> Itt {
        self.bhs.itt()
    }

    fn check_lengths(&self) -> Result<(), PduError> {
        if self.data.len() > MAX_DATA_SEGMENT_LENGTH {
            return Err(PduError::DataSegmentTooLong {
                len: self.data.len(),
            });
        }
        if self.ahs.len() & 3 != 0 || self.ahs.len() > MAX_AHS_LENGTH {
            return Err(PduError::BadAhsLength {
                len: self.ahs.len(),
            });
        }
        Ok(())
    }

    /// The header with its length fields taken from `ahs` and `data`.
    pub fn header_bytes(&self) -> Result<[u8; BHS_LEN], PduError> {
        self.check_lengths()?;
        let mut bhs = self.bhs.clone();
        bhs.total_ahs_length = (self.ahs.len() / 4) as u8;
        bhs.data_segment_length = self.data.len() as u32;
        Ok(bhs.to_bytes())
    }

    /// Bytes this PDU takes on a TCP connection (RFC 7143 §11.1).
    pub fn encoded_len(&self, digests: Digests) -> usize {
        let mut n = BHS_LEN + self.ahs.len();
        if digests.header {
            n += DIGEST_LEN;
        }
        if !self.data.is_empty() {
            n += padded_len(self.data.len());
            if digests.data {
                n += DIGEST_LEN;
            }
        }
        n
    }

    /// Append the TCP encoding: BHS, AHS, header digest, data, padding, data digest.
    /// The data digest covers the padding too (RFC 7143 §11.1); no data, no data digest.
    pub fn encode(&self, digests: Digests, out: &mut Vec<u8>) -> Result<(), PduError> {
        let header = self.header_bytes()?;
        out.reserve(self.encoded_len(digests));
        let start = out.len();
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.ahs);
        if digests.header {
            let crc = digest::crc32c(out.get(start..).unwrap_or_default());
            out.extend_from_slice(&digest::to_wire(crc));
        }
        if !self.data.is_empty() {
            let data_start = out.len();
            out.extend_from_slice(&self.data);
            out.resize(data_start + padded_len(self.data.len()), 0);
            if digests.data {
                let crc = digest::crc32c(out.get(data_start..).unwrap_or_default());
                out.extend_from_slice(&digest::to_wire(crc));
            }
        }
        Ok(())
    }

    pub fn to_bytes(&self, digests: Digests) -> Result<Vec<u8>, PduError> {
        let mut v = Vec::new();
        self.encode(digests, &mut v)?;
        Ok(v)
    }

    /// Append the message encoding used after the iSER header: BHS, AHS, data, with no
    /// padding and no digests (RFC 7145 §7.1).
    pub fn encode_message(&self, out: &mut Vec<u8>) -> Result<(), PduError> {
        let header = self.header_bytes()?;
        out.reserve(BHS_LEN + self.ahs.len() + self.data.len());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.ahs);
        out.extend_from_slice(&self.data);
        Ok(())
    }

    /// Decode one message-framed PDU (iSER: the bytes after the 28-byte iSER header).
    /// The data segment is whatever follows the AHS; it must agree with DataSegmentLength
    /// (up to 3 padding bytes are tolerated) and not exceed `max_data_segment_length`.
    pub fn decode_message(buf: &[u8], max_data_segment_length: usize) -> Result<Pdu, PduError> {
        let raw: [u8; BHS_LEN] =
            buf.get(..BHS_LEN)
                .and_then(|s| s.try_into().ok())
                .ok_or(PduError::Truncated {
                    needed: BHS_LEN,
                    got: buf.len(),
                })?;
        let ahs_len = raw_total_ahs_len(&raw);
        let dsl = raw_data_segment_len(&raw);
        let bhs = Bhs::parse(&raw)?;
        let ahs = buf
            .get(BHS_LEN..BHS_LEN + ahs_len)
            .ok_or(PduError::Truncated {
                needed: BHS_LEN + ahs_len,
                got: buf.len(),
            })?;
        let rest = buf.get(BHS_LEN + ahs_len..).unwrap_or_default();
        if dsl > max_data_segment_length {
            return Err(PduError::DataSegmentTooLong { len: dsl });
        }
        if rest.len() < dsl || rest.len() - dsl >= 4 {
            return Err(PduError::LengthMismatch {
                field: dsl,
                actual: rest.len(),
            });
        }
        let data = rest.get(..dsl).unwrap_or_default().to_vec();
        Ok(Pdu {
            bhs,
            ahs: ahs.to_vec(),
            data,
        })
    }

    /// The whole CDB: the 16 BHS bytes plus an Extended CDB AHS if present.
    /// `None` when this is not a SCSI Command.
    pub fn cdb(&self) -> Result<Option<Vec<u8>>, PduError> {
        let Op::ScsiCommand(cmd) = &self.bhs.op else {
            return Ok(None);
        };
        let mut cdb = cmd.cdb.to_vec();
        for seg in ahs_segments(&self.ahs)? {
            if seg.ahs_type == ahs_type::EXTENDED_CDB {
                // first specific byte is reserved
                cdb.extend_from_slice(seg.specific.get(1..).unwrap_or_default());
            }
        }
        Ok(Some(cdb))
    }

    /// The Bidirectional Read Expected Data Transfer Length AHS, if present.
    pub fn bidi_read_expected_data_transfer_length(&self) -> Result<Option<u32>, PduError> {
        for seg in ahs_segments(&self.ahs)? {
            if seg.ahs_type == ahs_type::BIDI_READ_EXPECTED_DATA_TRANSFER_LENGTH {
                let v: [u8; 4] = seg
                    .specific
                    .get(1..5)
                    .and_then(|s| s.try_into().ok())
                    .ok_or(PduError::MalformedAhs { offset: 0 })?;
                return Ok(Some(u32::from_be_bytes(v)));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ops() -> Vec<Op> {
        let lun = Lun(0x0001_0000_0000_0000);
        vec![
            Op::NopOut(NopOut {
                immediate: true,
                lun,
                itt: Itt(1),
                ttt: Ttt::RESERVED,
                cmd_sn: Sn(5),
                exp_stat_sn: Sn(6),
            }),
            Op::ScsiCommand(ScsiCommand {
                immediate: false,
                final_bit: true,
                read: true,
                write: false,
                attr: 1,
                lun,
                itt: Itt(2),
                expected_data_transfer_length: 4096,
                cmd_sn: Sn(7),
                exp_stat_sn: Sn(8),
                cdb: [0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
            }),
            Op::TaskMgmtRequest(TaskMgmtRequest {
                immediate: true,
                function: tmf::ABORT_TASK,
                lun,
                itt: Itt(3),
                referenced_task_tag: Itt(2),
                cmd_sn: Sn(9),
                exp_stat_sn: Sn(10),
                ref_cmd_sn: Sn(7),
                exp_data_sn: Sn(0),
            }),
            Op::LoginRequest(LoginRequest {
                transit_bit: true,
                continue_bit: false,
                csg: Stage::LoginOperationalNegotiation,
                nsg: Stage::FullFeaturePhase,
                version_max: 0,
                version_min: 0,
                isid: Isid([0x80, 1, 2, 3, 4, 5]),
                tsih: 0,
                itt: Itt(4),
                cid: 1,
                cmd_sn: Sn(11),
                exp_stat_sn: Sn(12),
            }),
            Op::TextRequest(TextRequest {
                immediate: true,
                final_bit: false,
                continue_bit: true,
                lun,
                itt: Itt(5),
                ttt: Ttt::RESERVED,
                cmd_sn: Sn(13),
                exp_stat_sn: Sn(14),
            }),
            Op::DataOut(DataOut {
                final_bit: true,
                lun,
                itt: Itt(6),
                ttt: Ttt(0x77),
                exp_stat_sn: Sn(15),
                data_sn: Sn(3),
                buffer_offset: 8192,
            }),
            Op::LogoutRequest(LogoutRequest {
                immediate: true,
                reason_code: logout::CLOSE_CONNECTION,
                itt: Itt(7),
                cid: 3,
                cmd_sn: Sn(16),
                exp_stat_sn: Sn(17),
            }),
            Op::SnackRequest(SnackRequest {
                snack_type: 1,
                lun,
                itt: Itt(8),
                ttt_or_snack_tag: 0x99,
                exp_stat_sn: Sn(18),
                beg_run: 4,
                run_length: 2,
            }),
            Op::NopIn(NopIn {
                lun,
                itt: Itt::RESERVED,
                ttt: Ttt(0x55),
                stat_sn: Sn(1),
                exp_cmd_sn: Sn(2),
                max_cmd_sn: Sn(33),
            }),
            Op::ScsiResponse(ScsiResponse {
                bidi_read_residual_overflow: true,
                bidi_read_residual_underflow: false,
                residual_overflow: false,
                residual_underflow: true,
                response: response::COMMAND_COMPLETED_AT_TARGET,
                status: 0x02,
                itt: Itt(9),
                snack_tag: 0,
                stat_sn: Sn(19),
                exp_cmd_sn: Sn(20),
                max_cmd_sn: Sn(51),
                exp_data_sn: Sn(2),
                bidi_read_residual_count: 12,
                residual_count: 512,
            }),
            Op::TaskMgmtResponse(TaskMgmtResponse {
                response: tmf::response::TASK_DOES_NOT_EXIST,
                itt: Itt(10),
                stat_sn: Sn(21),
                exp_cmd_sn: Sn(22),
                max_cmd_sn: Sn(53),
            }),
            Op::LoginResponse(LoginResponse {
                transit_bit: false,
                continue_bit: true,
                csg: Stage::SecurityNegotiation,
                nsg: Stage::SecurityNegotiation,
                version_max: 0,
                version_active: 0,
                isid: Isid([0x40, 0, 0, 0, 0, 9]),
                tsih: 0x1234,
                itt: Itt(11),
                stat_sn: Sn(23),
                exp_cmd_sn: Sn(24),
                max_cmd_sn: Sn(24),
                status: LoginStatus::NOT_FOUND,
            }),
            Op::TextResponse(TextResponse {
                final_bit: true,
                continue_bit: false,
                lun,
                itt: Itt(12),
                ttt: Ttt::RESERVED,
                stat_sn: Sn(25),
                exp_cmd_sn: Sn(26),
                max_cmd_sn: Sn(57),
            }),
            Op::DataIn(DataIn {
                final_bit: true,
                acknowledge: false,
                residual_overflow: true,
                residual_underflow: false,
                status_present: true,
                status: 0,
                lun,
                itt: Itt(13),
                ttt: Ttt::RESERVED,
                stat_sn: Sn(27),
                exp_cmd_sn: Sn(28),
                max_cmd_sn: Sn(59),
                data_sn: Sn(4),
                buffer_offset: 65536,
                residual_count: 100,
            }),
            Op::LogoutResponse(LogoutResponse {
                response: logout::response::CLOSED_SUCCESSFULLY,
                itt: Itt(14),
                stat_sn: Sn(29),
                exp_cmd_sn: Sn(30),
                max_cmd_sn: Sn(61),
                time2wait: 2,
                time2retain: 20,
            }),
            Op::R2t(R2t {
                lun,
                itt: Itt(15),
                ttt: Ttt(0x42),
                stat_sn: Sn(31),
                exp_cmd_sn: Sn(32),
                max_cmd_sn: Sn(63),
                r2t_sn: Sn(1),
                buffer_offset: 65536,
                desired_data_transfer_length: 262144,
            }),
            Op::AsyncMessage(AsyncMessage {
                lun,
                stat_sn: Sn(33),
                exp_cmd_sn: Sn(34),
                max_cmd_sn: Sn(65),
                async_event: 1,
                async_vcode: 0,
                parameter1: 3,
                parameter2: 2,
                parameter3: 20,
            }),
            Op::Reject(Reject {
                reason: RejectReason::ProtocolError as u8,
                stat_sn: Sn(35),
                exp_cmd_sn: Sn(36),
                max_cmd_sn: Sn(67),
                data_sn_or_r2t_sn: Sn(0),
            }),
        ]
    }

    #[test]
    fn every_opcode_round_trips() {
        let ops = all_ops();
        assert_eq!(ops.len(), 18);
        for op in ops {
            let bhs = Bhs {
                total_ahs_length: 0,
                data_segment_length: 0x012345,
                op,
            };
            let raw = bhs.to_bytes();
            assert_eq!(raw_data_segment_len(&raw), 0x012345);
            let back = Bhs::parse(&raw).unwrap();
            assert_eq!(back, bhs, "opcode {:?}", bhs.opcode());
            assert_eq!(back.to_bytes(), raw);
        }
    }

    #[test]
    fn opcode_bytes_and_bits_on_the_wire() {
        for op in all_ops() {
            let code = op.opcode().unwrap();
            let raw = Bhs {
                total_ahs_length: 0,
                data_segment_length: 0,
                op,
            }
            .to_bytes();
            assert_eq!(raw[0] & 0x3f, code as u8);
            assert_eq!(Opcode::from_u8(raw[0]), Some(code));
        }
        // Login Request: I bit always set, CSG/NSG packed in byte 1
        let ops = all_ops();
        let login = ops
            .iter()
            .find(|o| matches!(o, Op::LoginRequest(_)))
            .unwrap()
            .clone();
        let raw = Bhs {
            total_ahs_length: 0,
            data_segment_length: 0,
            op: login,
        }
        .to_bytes();
        assert_eq!(raw[0], 0x43);
        assert_eq!(raw[1], 0x80 | (1 << 2) | 3);
        // Reject and Async carry ITT 0xffffffff
        let rej = ops
            .iter()
            .find(|o| matches!(o, Op::Reject(_)))
            .unwrap()
            .clone();
        let raw = Bhs {
            total_ahs_length: 0,
            data_segment_length: 48,
            op: rej,
        }
        .to_bytes();
        assert_eq!(raw_itt(&raw), Itt::RESERVED);
    }

    #[test]
    fn unknown_opcode_keeps_the_header() {
        let mut raw = [0u8; BHS_LEN];
        raw[0] = 0x1c; // vendor-specific initiator opcode
        raw[7] = 8;
        raw[16..20].copy_from_slice(&[0, 0, 0, 42]);
        raw[40] = 0xee;
        let bhs = Bhs::parse(&raw).unwrap();
        match &bhs.op {
            Op::Unknown(u) => {
                assert_eq!(u.opcode, 0x1c);
                assert_eq!(u.raw, raw);
            }
            other => panic!("expected Unknown, got {other:?}"),
        }
        assert_eq!(bhs.itt(), Itt(42));
        assert_eq!(bhs.data_segment_length, 8);
        assert_eq!(bhs.to_bytes(), raw);
    }

    #[test]
    fn contradictory_bits_are_errors() {
        let mut raw = [0u8; BHS_LEN];
        raw[0] = 0x04;
        raw[1] = 0xc0; // F and C
        assert!(matches!(
            Bhs::parse(&raw),
            Err(PduError::InvalidField { opcode: 0x04, .. })
        ));
        raw[0] = 0x43;
        raw[1] = 0xc0 | 0x07; // T and C
        assert!(matches!(
            Bhs::parse(&raw),
            Err(PduError::InvalidField { opcode: 0x03, .. })
        ));
        assert!(matches!(
            Bhs::parse_slice(&raw[..47]),
            Err(PduError::Truncated { .. })
        ));
    }

    #[test]
    fn any_header_parses_without_panic() {
        // every opcode byte with every byte-1 pattern
        for b0 in 0..=255u8 {
            for b1 in [0u8, 0x7f, 0x80, 0xc0, 0xff] {
                let mut raw = [0xa5u8; BHS_LEN];
                raw[0] = b0;
                raw[1] = b1;
                let _ = Bhs::parse(&raw);
            }
        }
    }

    #[test]
    fn encode_pads_and_digests() {
        let op = all_ops()
            .into_iter()
            .find(|o| matches!(o, Op::TextRequest(_)))
            .unwrap();
        let pdu = Pdu::with_data(op, b"SendTargets=All\0".to_vec()[..15].to_vec());
        let plain = pdu.to_bytes(Digests::default()).unwrap();
        assert_eq!(plain.len(), 48 + 16);
        assert_eq!(raw_data_segment_len(plain[..48].try_into().unwrap()), 15);
        assert_eq!(plain[63], 0);
        let dig = pdu
            .to_bytes(Digests {
                header: true,
                data: true,
            })
            .unwrap();
        assert_eq!(dig.len(), 48 + 4 + 16 + 4);
        assert_eq!(
            dig.len(),
            pdu.encoded_len(Digests {
                header: true,
                data: true
            })
        );
        let hd = u32::from_le_bytes(dig[48..52].try_into().unwrap());
        assert_eq!(hd, crate::digest::crc32c(&dig[..48]));
        let dd = u32::from_le_bytes(dig[68..72].try_into().unwrap());
        assert_eq!(dd, crate::digest::crc32c(&dig[52..68]));
        // no data: no data digest
        let nop = Pdu::new(all_ops().remove(0));
        assert_eq!(
            nop.to_bytes(Digests {
                header: true,
                data: true
            })
            .unwrap()
            .len(),
            52
        );
    }

    #[test]
    fn message_round_trip_and_length_checks() {
        let op = all_ops()
            .into_iter()
            .find(|o| matches!(o, Op::DataOut(_)))
            .unwrap();
        let pdu = Pdu::with_data(op, vec![7u8; 13]);
        let mut m = Vec::new();
        pdu.encode_message(&mut m).unwrap();
        assert_eq!(m.len(), 48 + 13);
        let mut back = Pdu::decode_message(&m, 8192).unwrap();
        back.bhs.data_segment_length = 0;
        let mut want = pdu.clone();
        want.bhs.data_segment_length = 0;
        assert_eq!(back, want);
        assert!(matches!(
            Pdu::decode_message(&m, 12),
            Err(PduError::DataSegmentTooLong { len: 13 })
        ));
        assert!(matches!(
            Pdu::decode_message(&m[..50], 8192),
            Err(PduError::LengthMismatch { .. })
        ));
        assert!(matches!(
            Pdu::decode_message(&m[..20], 8192),
            Err(PduError::Truncated { .. })
        ));
    }

    #[test]
    fn extended_cdb() {
        let mut cdb32 = [0u8; 32];
        for (i, b) in cdb32.iter_mut().enumerate() {
            *b = i as u8;
        }
        let ops = all_ops();
        let Op::ScsiCommand(mut cmd) = ops[1].clone() else {
            unreachable!()
        };
        cmd.cdb.copy_from_slice(&cdb32[..16]);
        let mut pdu = Pdu::new(Op::ScsiCommand(cmd));
        pdu.ahs = extended_cdb_ahs(&cdb32[16..]);
        pdu.ahs.extend_from_slice(&bidi_read_edtl_ahs(777));
        assert_eq!(pdu.ahs.len() % 4, 0);
        assert_eq!(pdu.cdb().unwrap().unwrap(), cdb32.to_vec());
        assert_eq!(
            pdu.bidi_read_expected_data_transfer_length().unwrap(),
            Some(777)
        );
        let bytes = pdu.to_bytes(Digests::default()).unwrap();
        assert_eq!(usize::from(bytes[4]) * 4, pdu.ahs.len());
        // a truncated AHS is an error, not a panic
        assert!(ahs_segments(&[0, 40, 1, 0]).is_err());
        assert!(ahs_segments(&[0]).is_err());
    }

    #[test]
    fn oversized_data_is_refused() {
        let mut pdu = Pdu::new(all_ops().remove(0));
        pdu.ahs = vec![0; 6];
        assert!(matches!(
            pdu.to_bytes(Digests::default()),
            Err(PduError::BadAhsLength { len: 6 })
        ));
    }
}
