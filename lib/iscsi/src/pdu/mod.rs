//! The iSCSI PDU: 48-byte Basic Header Segment (BHS), Additional Header Segments (AHS) and
//! the data segment (RFC 7143 §11).
//!
//! [`Bhs::parse`] turns any 48 bytes into a typed header; an opcode this crate does not
//! know becomes [`Op::Unknown`] with the raw bytes kept, so the target can answer it with a
//! Reject carrying the header (RFC 7143 §11.17). [`Pdu`] adds the AHS and the data segment
//! and knows the two wire encodings: the TCP byte stream (padding to 4 bytes, optional
//! CRC32C digests, RFC 7143 §11.1) and the iSER message (no padding, no digests,
//! RFC 7145 §7.1).
//!
//! One file per topic, all re-exported here (`riser_iscsi::pdu::X` is the one path):
//! `codes` (opcodes, field types, code tables), `initiator` and `target` (the typed header
//! of each opcode), `bhs` with `decode` and `encode` (the 48-byte header), `ahs`, and
//! `codec` (the whole PDU on the TCP stream and in an iSER message).

mod ahs;
mod bhs;
mod codec;
mod codes;
mod decode;
mod encode;
mod initiator;
mod target;
#[cfg(test)]
mod tests;

pub use ahs::*;
pub use bhs::*;
pub use codec::*;
pub use codes::*;
pub use initiator::*;
pub use target::*;

use crate::serial::Itt;
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
