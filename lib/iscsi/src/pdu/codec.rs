//! The whole PDU and its two wire encodings: the TCP byte stream and the iSER message.

use super::decode::header_of;
use super::*;
use crate::digest;
use crate::serial::Itt;

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
        Pdu::with_data(op, Vec::new())
    }

    pub fn with_data(op: Op, data: Vec<u8>) -> Pdu {
        Pdu {
            bhs: Bhs {
                total_ahs_length: 0,
                data_segment_length: 0,
                op,
            },
            ahs: Vec::new(),
            data,
        }
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
        let raw = header_of(buf)?;
        let ahs_len = raw_total_ahs_len(raw);
        let dsl = raw_data_segment_len(raw);
        let bhs = Bhs::parse(raw)?;
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
