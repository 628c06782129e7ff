//! The BHS encoder.

use super::bhs::{flag, put16, put32, put64, C, F, I, T};
use super::*;
use crate::serial::RESERVED_TAG;

impl Bhs {
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
}
