//! The typed headers of the PDUs a target sends (opcodes 0x20-0x3f).

use super::{Isid, LoginStatus, Lun, Stage};
use crate::serial::{Itt, Sn, Ttt};

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
