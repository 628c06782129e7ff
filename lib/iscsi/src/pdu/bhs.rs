//! The Basic Header Segment: [`Op`] (the typed header of each opcode), [`Bhs`], and the
//! byte-level helpers its decoder and encoder share.

use super::*;
use crate::serial::{Itt, Sn};

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

pub(super) fn be16(b: &[u8; BHS_LEN], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
pub(super) fn be32(b: &[u8; BHS_LEN], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(super) fn be64(b: &[u8; BHS_LEN], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}
pub(super) fn sn(b: &[u8; BHS_LEN], at: usize) -> Sn {
    Sn(be32(b, at))
}
pub(super) fn put16(b: &mut [u8; BHS_LEN], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
pub(super) fn put32(b: &mut [u8; BHS_LEN], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
pub(super) fn put64(b: &mut [u8; BHS_LEN], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
pub(super) fn bit(byte: u8, mask: u8) -> bool {
    byte & mask != 0
}
pub(super) fn flag(on: bool, mask: u8) -> u8 {
    if on {
        mask
    } else {
        0
    }
}

// Byte 1 flag bits.
pub(super) const F: u8 = 0x80;
pub(super) const C: u8 = 0x40; // Text/Login "continue"
pub(super) const T: u8 = 0x80; // Login "transit"
pub(super) const I: u8 = 0x40; // byte 0 "immediate"

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
    pub fn opcode(&self) -> Option<Opcode> {
        self.op.opcode()
    }

    /// The Initiator Task Tag; 0xffffffff for Async Message and Reject.
    pub fn itt(&self) -> Itt {
        self.op.itt()
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
    pub(super) fn opcode_byte(&self) -> u8 {
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
