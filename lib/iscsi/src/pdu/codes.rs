//! Opcodes, the field types of the BHS (LUN, ISID, login stages) and the code tables of
//! its fields (login status, reject reasons, SCSI response, task management, logout).

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

/// Reject reason codes (RFC 7143 §11.17.1), the one reason type of the crate: the
/// full-feature phase, the framer and the datamovers all say why with it. The Reject header
/// keeps the raw byte ([`Reject::reason`](super::Reject::reason)), since a received Reject may
/// carry a code this enum does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectReason {
    /// Data (payload) digest error; the initiator may resend the data (ERL > 0).
    DataDigestError = 0x02,
    SnackReject = 0x03,
    /// The PDU breaks the protocol (e.g. a PDU that is not allowed now, or a malformed one).
    ProtocolError = 0x04,
    CommandNotSupported = 0x05,
    /// Too many immediate commands.
    ImmediateCommandReject = 0x06,
    TaskInProgress = 0x07,
    InvalidDataAck = 0x08,
    InvalidPduField = 0x09,
    /// Long operation reject: the target cannot generate a Target Transfer Tag (out of
    /// resources).
    LongOperationReject = 0x0a,
    WaitingForLogout = 0x0c,
}

impl RejectReason {
    /// The reason code on the wire (byte 2 of the Reject BHS).
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The reason a wire code stands for; `None` for reserved and deprecated codes (0x01,
    /// 0x0b, 0x0d and above).
    pub const fn from_code(code: u8) -> Option<RejectReason> {
        use RejectReason::*;
        Some(match code {
            0x02 => DataDigestError,
            0x03 => SnackReject,
            0x04 => ProtocolError,
            0x05 => CommandNotSupported,
            0x06 => ImmediateCommandReject,
            0x07 => TaskInProgress,
            0x08 => InvalidDataAck,
            0x09 => InvalidPduField,
            0x0a => LongOperationReject,
            0x0c => WaitingForLogout,
            _ => return None,
        })
    }
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
    /// RFC 7144 §5.1.
    pub const QUERY_TASK: u8 = 9;
    pub const QUERY_TASK_SET: u8 = 10;
    pub const I_T_NEXUS_RESET: u8 = 11;
    pub const QUERY_ASYNCHRONOUS_EVENT: u8 = 12;
    /// Task Management Function Response codes (RFC 7143 §11.6.1).
    pub mod response {
        pub const FUNCTION_COMPLETE: u8 = 0;
        pub const TASK_DOES_NOT_EXIST: u8 = 1;
        pub const LUN_DOES_NOT_EXIST: u8 = 2;
        pub const TASK_STILL_ALLEGIANT: u8 = 3;
        pub const TASK_ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
        pub const FUNCTION_NOT_SUPPORTED: u8 = 5;
        pub const FUNCTION_AUTHORIZATION_FAILED: u8 = 6;
        /// SAM-5's FUNCTION SUCCEEDED (RFC 7144 §5.2): the queried task (set) has tasks.
        pub const FUNCTION_SUCCEEDED: u8 = 7;
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
