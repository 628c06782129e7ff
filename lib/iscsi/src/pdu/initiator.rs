//! The typed headers of the PDUs an initiator sends (opcodes 0x00-0x1f).

use super::{Isid, Lun, Stage};
use crate::serial::{Itt, Sn, Ttt};

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
