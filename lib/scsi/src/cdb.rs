//! Operation codes and CDB field access.
//!
//! Every accessor is bounds-checked: a short or malformed CDB reads as zeros, never panics.

pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const FORMAT_UNIT: u8 = 0x04;
    pub const READ6: u8 = 0x08;
    pub const WRITE6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT6: u8 = 0x15;
    pub const RESERVE6: u8 = 0x16;
    pub const RELEASE6: u8 = 0x17;
    pub const MODE_SENSE6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const SEND_DIAGNOSTIC: u8 = 0x1D;
    pub const PREVENT_ALLOW: u8 = 0x1E;
    pub const READ_CAPACITY10: u8 = 0x25;
    pub const READ10: u8 = 0x28;
    pub const WRITE10: u8 = 0x2A;
    pub const WRITE_VERIFY10: u8 = 0x2E;
    pub const VERIFY10: u8 = 0x2F;
    pub const PRE_FETCH10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE10: u8 = 0x35;
    pub const READ_DEFECT_DATA10: u8 = 0x37;
    pub const WRITE_BUFFER: u8 = 0x3B;
    pub const READ_BUFFER: u8 = 0x3C;
    pub const WRITE_SAME10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const SANITIZE: u8 = 0x48;
    pub const LOG_SELECT: u8 = 0x4C;
    pub const LOG_SENSE: u8 = 0x4D;
    pub const MODE_SELECT10: u8 = 0x55;
    pub const RESERVE10: u8 = 0x56;
    pub const RELEASE10: u8 = 0x57;
    pub const MODE_SENSE10: u8 = 0x5A;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE16: u8 = 0x8A;
    pub const ORWRITE16: u8 = 0x8B;
    pub const WRITE_VERIFY16: u8 = 0x8E;
    pub const VERIFY16: u8 = 0x8F;
    pub const PRE_FETCH16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE16: u8 = 0x91;
    pub const WRITE_SAME16: u8 = 0x93;
    pub const WRITE_ATOMIC16: u8 = 0x9C;
    pub const SERVICE_ACTION_IN16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const READ12: u8 = 0xA8;
    pub const WRITE12: u8 = 0xAA;
    pub const WRITE_VERIFY12: u8 = 0xAE;
    pub const VERIFY12: u8 = 0xAF;
    pub const READ_DEFECT_DATA12: u8 = 0xB7;

    /// SERVICE ACTION IN(16) service actions (SBC-3).
    pub const SAI_READ_CAPACITY16: u8 = 0x10;
    pub const SAI_GET_LBA_STATUS: u8 = 0x12;
    /// MAINTENANCE IN service actions (SPC-4).
    pub const MI_REPORT_TARGET_PORT_GROUPS: u8 = 0x0A;
    pub const MI_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
    pub const MI_REPORT_SUPPORTED_TMFS: u8 = 0x0D;
    /// RECEIVE COPY RESULTS service actions (SPC-4 6.18).
    pub const RCR_COPY_STATUS: u8 = 0x00;
    pub const RCR_OPERATING_PARAMETERS: u8 = 0x03;
}

/// CDB length implied by the operation code's group (SPC-4 4.2.5.1); `None` for groups
/// without a fixed length (variable-length and vendor-specific).
pub fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// A CDB as the initiator sent it (up to 16 bytes), with bounds-checked accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cdb {
    pub bytes: [u8; 16],
}

impl std::fmt::Debug for Cdb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = cdb_len(self.opcode()).unwrap_or(16);
        write!(f, "Cdb({:02x?})", &self.bytes[..n])
    }
}

impl Cdb {
    /// Builds a CDB from up to 16 bytes (extra bytes are ignored, missing ones are zero).
    pub fn new(b: &[u8]) -> Cdb {
        let mut bytes = [0u8; 16];
        let n = b.len().min(16);
        bytes[..n].copy_from_slice(&b[..n]);
        Cdb { bytes }
    }

    pub fn opcode(&self) -> u8 {
        self.bytes[0]
    }

    pub fn len(&self) -> usize {
        cdb_len(self.opcode()).unwrap_or(16)
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn u8(&self, i: usize) -> u8 {
        self.bytes.get(i).copied().unwrap_or(0)
    }

    pub fn be16(&self, i: usize) -> u16 {
        u16::from_be_bytes([self.u8(i), self.u8(i + 1)])
    }

    pub fn be24(&self, i: usize) -> u32 {
        u32::from_be_bytes([0, self.u8(i), self.u8(i + 1), self.u8(i + 2)])
    }

    pub fn be32(&self, i: usize) -> u32 {
        u32::from_be_bytes([self.u8(i), self.u8(i + 1), self.u8(i + 2), self.u8(i + 3)])
    }

    pub fn be64(&self, i: usize) -> u64 {
        ((self.be32(i) as u64) << 32) | self.be32(i + 4) as u64
    }

    /// The service action field of byte 1 (bits 4..0).
    pub fn service_action(&self) -> u8 {
        self.u8(1) & 0x1F
    }

    /// The CONTROL byte (last byte of the CDB). NACA (bit 2) and LINK (bit 0) are not
    /// supported (SAM-5 5.2).
    pub fn control(&self) -> u8 {
        self.u8(self.len() - 1)
    }
}

/// Big-endian helpers for building and parsing data buffers.
pub fn get_be16(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([
        b.get(i).copied().unwrap_or(0),
        b.get(i + 1).copied().unwrap_or(0),
    ])
}

pub fn get_be32(b: &[u8], i: usize) -> u32 {
    ((get_be16(b, i) as u32) << 16) | get_be16(b, i + 2) as u32
}

pub fn get_be64(b: &[u8], i: usize) -> u64 {
    ((get_be32(b, i) as u64) << 32) | get_be32(b, i + 4) as u64
}

pub fn put_be16(b: &mut [u8], i: usize, v: u16) {
    b[i..i + 2].copy_from_slice(&v.to_be_bytes());
}

pub fn put_be32(b: &mut [u8], i: usize, v: u32) {
    b[i..i + 4].copy_from_slice(&v.to_be_bytes());
}

pub fn put_be64(b: &mut [u8], i: usize, v: u64) {
    b[i..i + 8].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_fields() {
        assert_eq!(cdb_len(op::READ6), Some(6));
        assert_eq!(cdb_len(op::READ10), Some(10));
        assert_eq!(cdb_len(op::MODE_SENSE10), Some(10));
        assert_eq!(cdb_len(op::READ16), Some(16));
        assert_eq!(cdb_len(op::READ12), Some(12));
        assert_eq!(cdb_len(0x7F), None);
        let c = Cdb::new(&[0x28, 0, 1, 2, 3, 4, 0, 0, 8, 0]);
        assert_eq!(c.be32(2), 0x01020304);
        assert_eq!(c.be16(7), 8);
        assert_eq!(c.be64(12), 0); // beyond the CDB reads as zero
        assert_eq!(get_be32(&[1, 2], 0), 0x01020000);
    }
}
