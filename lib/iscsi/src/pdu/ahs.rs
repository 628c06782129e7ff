//! Additional Header Segments (RFC 7143 §11.2.2).

use super::{padded_len, PduError};

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
