//! Status codes, sense keys, additional sense codes and sense data encoding (SPC-4 4.5).

use std::fmt;

/// SCSI status (SAM-5 5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    Good = 0x00,
    CheckCondition = 0x02,
    ConditionMet = 0x04,
    Busy = 0x08,
    ReservationConflict = 0x18,
    TaskSetFull = 0x28,
    AcaActive = 0x30,
    TaskAborted = 0x40,
}

impl Status {
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// Sense keys (SPC-4 table 45).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SenseKey {
    NoSense = 0x0,
    RecoveredError = 0x1,
    NotReady = 0x2,
    MediumError = 0x3,
    HardwareError = 0x4,
    IllegalRequest = 0x5,
    UnitAttention = 0x6,
    DataProtect = 0x7,
    BlankCheck = 0x8,
    VendorSpecific = 0x9,
    CopyAborted = 0xA,
    AbortedCommand = 0xB,
    VolumeOverflow = 0xD,
    Miscompare = 0xE,
}

/// An additional sense code and qualifier (SPC-4 table 46), `(ASC << 8) | ASCQ`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Asc(pub u16);

impl Asc {
    pub const fn new(asc: u8, ascq: u8) -> Asc {
        Asc(((asc as u16) << 8) | ascq as u16)
    }
    pub fn asc(self) -> u8 {
        (self.0 >> 8) as u8
    }
    pub fn ascq(self) -> u8 {
        self.0 as u8
    }

    pub const NO_ADDITIONAL_SENSE: Asc = Asc::new(0x00, 0x00);
    pub const LUN_NOT_READY_MANUAL_INTERVENTION: Asc = Asc::new(0x04, 0x03);
    pub const LUN_NOT_READY_SANITIZE_IN_PROGRESS: Asc = Asc::new(0x04, 0x1B);
    /// LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION (SPC-4 5.15.2.5).
    pub const LUN_NOT_ACCESSIBLE_TRANSITIONING: Asc = Asc::new(0x04, 0x0A);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE.
    pub const LUN_NOT_ACCESSIBLE_STANDBY: Asc = Asc::new(0x04, 0x0B);
    /// LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE.
    pub const LUN_NOT_ACCESSIBLE_UNAVAILABLE: Asc = Asc::new(0x04, 0x0C);
    pub const WRITE_ERROR: Asc = Asc::new(0x0C, 0x00);
    pub const INVALID_FIELD_IN_INFORMATION_UNIT: Asc = Asc::new(0x0E, 0x03);
    pub const UNRECOVERED_READ_ERROR: Asc = Asc::new(0x11, 0x00);
    pub const PARAMETER_LIST_LENGTH_ERROR: Asc = Asc::new(0x1A, 0x00);
    pub const MISCOMPARE_DURING_VERIFY: Asc = Asc::new(0x1D, 0x00);
    pub const INVALID_COMMAND_OPERATION_CODE: Asc = Asc::new(0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: Asc = Asc::new(0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: Asc = Asc::new(0x24, 0x00);
    pub const LOGICAL_UNIT_NOT_SUPPORTED: Asc = Asc::new(0x25, 0x00);
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Asc = Asc::new(0x26, 0x00);
    pub const PARAMETER_NOT_SUPPORTED: Asc = Asc::new(0x26, 0x01);
    pub const PARAMETER_VALUE_INVALID: Asc = Asc::new(0x26, 0x02);
    pub const INVALID_RELEASE_OF_PERSISTENT_RESERVATION: Asc = Asc::new(0x26, 0x04);
    pub const TOO_MANY_TARGET_DESCRIPTORS: Asc = Asc::new(0x26, 0x06);
    pub const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE: Asc = Asc::new(0x26, 0x07);
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: Asc = Asc::new(0x26, 0x08);
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE: Asc = Asc::new(0x26, 0x09);
    pub const WRITE_PROTECTED: Asc = Asc::new(0x27, 0x00);
    pub const SOFTWARE_WRITE_PROTECTED: Asc = Asc::new(0x27, 0x02);
    pub const POWER_ON_RESET_OR_BUS_DEVICE_RESET: Asc = Asc::new(0x29, 0x00);
    pub const POWER_ON_OCCURRED: Asc = Asc::new(0x29, 0x01);
    pub const SCSI_BUS_RESET_OCCURRED: Asc = Asc::new(0x29, 0x02);
    pub const BUS_DEVICE_RESET_FUNCTION_OCCURRED: Asc = Asc::new(0x29, 0x03);
    pub const I_T_NEXUS_LOSS_OCCURRED: Asc = Asc::new(0x29, 0x07);
    pub const PARAMETERS_CHANGED: Asc = Asc::new(0x2A, 0x00);
    pub const MODE_PARAMETERS_CHANGED: Asc = Asc::new(0x2A, 0x01);
    pub const RESERVATIONS_PREEMPTED: Asc = Asc::new(0x2A, 0x03);
    pub const RESERVATIONS_RELEASED: Asc = Asc::new(0x2A, 0x04);
    pub const REGISTRATIONS_PREEMPTED: Asc = Asc::new(0x2A, 0x05);
    pub const COMMANDS_CLEARED_BY_ANOTHER_INITIATOR: Asc = Asc::new(0x2F, 0x00);
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: Asc = Asc::new(0x39, 0x00);
    pub const SANITIZE_COMMAND_FAILED: Asc = Asc::new(0x31, 0x03);
    pub const MEDIUM_NOT_PRESENT: Asc = Asc::new(0x3A, 0x00);
    pub const INQUIRY_DATA_HAS_CHANGED: Asc = Asc::new(0x3F, 0x03);
    pub const REPORTED_LUNS_DATA_HAS_CHANGED: Asc = Asc::new(0x3F, 0x0E);
    pub const INTERNAL_TARGET_FAILURE: Asc = Asc::new(0x44, 0x00);
    /// A broken data transfer (e.g. an iSCSI Data-Out sequence that cannot be completed).
    pub const DATA_PHASE_ERROR: Asc = Asc::new(0x4B, 0x00);
    pub const MEDIUM_REMOVAL_PREVENTED: Asc = Asc::new(0x53, 0x02);
    /// The device server lacks the resources (e.g. buffer memory) to process the command.
    pub const INSUFFICIENT_RESOURCES: Asc = Asc::new(0x55, 0x03);
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: Asc = Asc::new(0x55, 0x04);
    pub const CAPACITY_DATA_HAS_CHANGED: Asc = Asc::new(0x2A, 0x09);
    /// ASYMMETRIC ACCESS STATE CHANGED (SPC-4 5.15.2.6).
    pub const ASYMMETRIC_ACCESS_STATE_CHANGED: Asc = Asc::new(0x2A, 0x06);
}

impl fmt::Debug for Asc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02X}/{:02X}", self.asc(), self.ascq())
    }
}

/// Sense-key specific information (SPC-4 4.5.2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SenseSpecific {
    /// Field pointer for ILLEGAL REQUEST: `cdb` says whether the bad byte is in the CDB (else
    /// in the parameter list), `bit` the bit within it (when known).
    Field {
        cdb: bool,
        byte: u16,
        bit: Option<u8>,
    },
    /// PROGRESS INDICATION (SPC-4 4.5.2.4.4): the fraction done of a long operation, in
    /// 1/65536ths, reported with NOT READY (e.g. a sanitize in progress).
    Progress(u16),
}

impl SenseSpecific {
    /// The three SENSE KEY SPECIFIC bytes, SKSV set.
    fn bytes(self) -> [u8; 3] {
        match self {
            SenseSpecific::Field { cdb, byte, bit } => {
                let b = byte.to_be_bytes();
                [
                    0x80 | if cdb { 0x40 } else { 0 } | bit.map_or(0, |x| 0x08 | (x & 7)),
                    b[0],
                    b[1],
                ]
            }
            SenseSpecific::Progress(p) => {
                let b = p.to_be_bytes();
                [0x80, b[0], b[1]]
            }
        }
    }
}

/// The sense data of one failed command, kept structured until it is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    pub key: SenseKey,
    pub asc: Asc,
    /// The INFORMATION field (e.g. the offset of the first miscompare, SBC-3 5.3).
    pub info: Option<u64>,
    pub specific: Option<SenseSpecific>,
}

/// Encoded sense data, kept inline so that error paths do not allocate.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SenseBuf {
    len: u8,
    bytes: [u8; 32],
}

impl SenseBuf {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Sense data given as bytes (at most 32 kept).
    pub fn from_slice(b: &[u8]) -> SenseBuf {
        let mut s = SenseBuf { len: b.len().min(32) as u8, bytes: [0; 32] };
        s.bytes[..s.len as usize].copy_from_slice(&b[..s.len as usize]);
        s
    }
}

impl fmt::Debug for SenseBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SenseBuf({:02x?})", self.as_slice())
    }
}

impl Sense {
    pub const fn new(key: SenseKey, asc: Asc) -> Sense {
        Sense {
            key,
            asc,
            info: None,
            specific: None,
        }
    }

    pub fn with_info(mut self, info: u64) -> Sense {
        self.info = Some(info);
        self
    }

    /// Fixed format (response code 0x70, SPC-4 4.5.3): 18 bytes.
    pub fn fixed(&self) -> SenseBuf {
        let mut b = [0u8; 32];
        b[0] = 0x70;
        b[2] = self.key as u8;
        if let Some(info) = self.info {
            // The fixed-format INFORMATION field has 4 bytes; VALID only if it fits.
            if let Ok(v) = u32::try_from(info) {
                b[0] |= 0x80;
                b[3..7].copy_from_slice(&v.to_be_bytes());
            }
        }
        b[7] = 10; // additional sense length: bytes 8..18
        b[12] = self.asc.asc();
        b[13] = self.asc.ascq();
        if let Some(sks) = self.specific {
            b[15..18].copy_from_slice(&sks.bytes());
        }
        SenseBuf { len: 18, bytes: b }
    }

    /// Descriptor format (response code 0x72, SPC-4 4.5.2), used when the control mode page
    /// has D_SENSE set.
    pub fn descriptor(&self) -> SenseBuf {
        let mut b = [0u8; 32];
        b[0] = 0x72;
        b[1] = self.key as u8;
        b[2] = self.asc.asc();
        b[3] = self.asc.ascq();
        let mut n = 8;
        if let Some(info) = self.info {
            // Information descriptor (type 0), 12 bytes.
            b[n] = 0x00;
            b[n + 1] = 0x0A;
            b[n + 2] = 0x80;
            b[n + 4..n + 12].copy_from_slice(&info.to_be_bytes());
            n += 12;
        }
        if let Some(sks) = self.specific {
            // Sense key specific descriptor (type 2), 8 bytes.
            b[n] = 0x02;
            b[n + 1] = 0x06;
            b[n + 4..n + 7].copy_from_slice(&sks.bytes());
            n += 8;
        }
        b[7] = (n - 8) as u8;
        SenseBuf {
            len: n as u8,
            bytes: b,
        }
    }

    pub fn encode(&self, descriptor: bool) -> SenseBuf {
        if descriptor {
            self.descriptor()
        } else {
            self.fixed()
        }
    }
}

/// Why a command did not complete with GOOD: a status and, for CHECK CONDITION, sense data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdError {
    pub status: Status,
    pub sense: Option<Sense>,
}

impl CmdError {
    pub const fn check(key: SenseKey, asc: Asc) -> CmdError {
        CmdError {
            status: Status::CheckCondition,
            sense: Some(Sense::new(key, asc)),
        }
    }

    pub const fn illegal(asc: Asc) -> CmdError {
        CmdError::check(SenseKey::IllegalRequest, asc)
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte` (and `bit`) of the CDB.
    pub fn invalid_cdb(byte: u16, bit: Option<u8>) -> CmdError {
        let mut s = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
        s.specific = Some(SenseSpecific::Field {
            cdb: true,
            byte,
            bit,
        });
        CmdError {
            status: Status::CheckCondition,
            sense: Some(s),
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte` of the list.
    pub fn invalid_param(byte: u16, bit: Option<u8>) -> CmdError {
        let mut s = Sense::new(
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        );
        s.specific = Some(SenseSpecific::Field {
            cdb: false,
            byte,
            bit,
        });
        CmdError {
            status: Status::CheckCondition,
            sense: Some(s),
        }
    }

    pub const fn invalid_opcode() -> CmdError {
        CmdError::illegal(Asc::INVALID_COMMAND_OPERATION_CODE)
    }

    pub const fn lba_out_of_range() -> CmdError {
        CmdError::illegal(Asc::LBA_OUT_OF_RANGE)
    }

    pub const fn param_list_length() -> CmdError {
        CmdError::illegal(Asc::PARAMETER_LIST_LENGTH_ERROR)
    }

    pub const fn reservation_conflict() -> CmdError {
        CmdError {
            status: Status::ReservationConflict,
            sense: None,
        }
    }

    pub const fn write_protected() -> CmdError {
        CmdError::check(SenseKey::DataProtect, Asc::SOFTWARE_WRITE_PROTECTED)
    }

    /// MISCOMPARE, MISCOMPARE DURING VERIFY OPERATION, with the byte offset of the first
    /// difference in the INFORMATION field (SBC-3 5.2, 5.23).
    pub fn miscompare(offset: u64) -> CmdError {
        CmdError {
            status: Status::CheckCondition,
            sense: Some(
                Sense::new(SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY).with_info(offset),
            ),
        }
    }

    /// NOT READY, LOGICAL UNIT NOT READY, SANITIZE IN PROGRESS with the progress made
    /// (SBC-3 4.11: commands other than INQUIRY, REPORT LUNS and REQUEST SENSE are refused
    /// while a sanitize operation runs).
    pub fn sanitize_in_progress(progress: u16) -> CmdError {
        let mut s = Sense::new(SenseKey::NotReady, Asc::LUN_NOT_READY_SANITIZE_IN_PROGRESS);
        s.specific = Some(SenseSpecific::Progress(progress));
        CmdError {
            status: Status::CheckCondition,
            sense: Some(s),
        }
    }

    /// MEDIUM ERROR, SANITIZE COMMAND FAILED: the last sanitize operation did not complete,
    /// so the medium may hold partly sanitized data (SBC-3 4.11).
    pub const fn sanitize_failed() -> CmdError {
        CmdError::check(SenseKey::MediumError, Asc::SANITIZE_COMMAND_FAILED)
    }

    pub const fn internal() -> CmdError {
        CmdError::check(SenseKey::HardwareError, Asc::INTERNAL_TARGET_FAILURE)
    }
}

pub type CmdResult<T> = Result<T, CmdError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_layout() {
        let s = CmdError::miscompare(1234).sense.unwrap().fixed();
        let b = s.as_slice();
        assert_eq!(b.len(), 18);
        assert_eq!(b[0], 0xF0);
        assert_eq!(b[2], 0x0E);
        assert_eq!(u32::from_be_bytes([b[3], b[4], b[5], b[6]]), 1234);
        assert_eq!(b[7], 10);
        assert_eq!((b[12], b[13]), (0x1D, 0x00));
        let s = CmdError::invalid_cdb(2, Some(5)).sense.unwrap().fixed();
        assert_eq!(&s.as_slice()[15..18], &[0xC0 | 0x08 | 5, 0, 2]);
    }

    #[test]
    fn descriptor_format_layout() {
        let s = CmdError::miscompare(7).sense.unwrap().descriptor();
        let b = s.as_slice();
        assert_eq!(b[0], 0x72);
        assert_eq!((b[1], b[2], b[3]), (0x0E, 0x1D, 0x00));
        assert_eq!(b[7] as usize, b.len() - 8);
        assert_eq!(b[8], 0);
        assert_eq!(u64::from_be_bytes(b[12..20].try_into().unwrap()), 7);
    }
}
