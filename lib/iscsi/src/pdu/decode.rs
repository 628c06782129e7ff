//! The BHS decoder: any 48 bytes become a typed header.

use super::bhs::{be16, be32, be64, bit, sn, C, F, I, T};
use super::*;
use crate::serial::{Itt, Ttt};

impl Bhs {
    /// Parse a header. Unknown opcodes are not an error: they become [`Op::Unknown`].
    /// Errors are reserved for headers that contradict themselves (RFC 7143 §11.10.2 and
    /// §11.12.2: F/T and C together).
    pub fn parse(b: &[u8; BHS_LEN]) -> Result<Bhs, PduError> {
        let b0 = b[0];
        let b1 = b[1];
        let immediate = bit(b0, I);
        let itt = Itt(be32(b, 16));
        let lun = Lun(be64(b, 8));
        let op = match Opcode::from_u8(b0) {
            None => Op::Unknown(Unknown {
                opcode: b0 & 0x3f,
                raw: *b,
            }),
            Some(code) => match code {
                Opcode::NopOut => Op::NopOut(NopOut {
                    immediate,
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    cmd_sn: sn(b, 24),
                    exp_stat_sn: sn(b, 28),
                }),
                Opcode::ScsiCommand => {
                    let mut cdb = [0u8; 16];
                    cdb.copy_from_slice(&b[32..48]);
                    Op::ScsiCommand(ScsiCommand {
                        immediate,
                        final_bit: bit(b1, F),
                        read: bit(b1, 0x40),
                        write: bit(b1, 0x20),
                        attr: b1 & 0x07,
                        lun,
                        itt,
                        expected_data_transfer_length: be32(b, 20),
                        cmd_sn: sn(b, 24),
                        exp_stat_sn: sn(b, 28),
                        cdb,
                    })
                }
                Opcode::TaskMgmtRequest => Op::TaskMgmtRequest(TaskMgmtRequest {
                    immediate,
                    function: b1 & 0x7f,
                    lun,
                    itt,
                    referenced_task_tag: Itt(be32(b, 20)),
                    cmd_sn: sn(b, 24),
                    exp_stat_sn: sn(b, 28),
                    ref_cmd_sn: sn(b, 32),
                    exp_data_sn: sn(b, 36),
                }),
                Opcode::LoginRequest => {
                    // RFC 7143 §11.12.2: T and C must not both be 1.
                    if bit(b1, T) && bit(b1, C) {
                        return Err(invalid(code, itt, "T and C bits both set"));
                    }
                    Op::LoginRequest(LoginRequest {
                        transit_bit: bit(b1, T),
                        continue_bit: bit(b1, C),
                        csg: Stage::from_bits(b1 >> 2),
                        nsg: Stage::from_bits(b1),
                        version_max: b[2],
                        version_min: b[3],
                        isid: isid(b),
                        tsih: be16(b, 14),
                        itt,
                        cid: be16(b, 20),
                        cmd_sn: sn(b, 24),
                        exp_stat_sn: sn(b, 28),
                    })
                }
                Opcode::TextRequest => {
                    // RFC 7143 §11.10.2: a Text Request with C=1 must have F=0.
                    if bit(b1, F) && bit(b1, C) {
                        return Err(invalid(code, itt, "F and C bits both set"));
                    }
                    Op::TextRequest(TextRequest {
                        immediate,
                        final_bit: bit(b1, F),
                        continue_bit: bit(b1, C),
                        lun,
                        itt,
                        ttt: Ttt(be32(b, 20)),
                        cmd_sn: sn(b, 24),
                        exp_stat_sn: sn(b, 28),
                    })
                }
                Opcode::DataOut => Op::DataOut(DataOut {
                    final_bit: bit(b1, F),
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    exp_stat_sn: sn(b, 28),
                    data_sn: sn(b, 36),
                    buffer_offset: be32(b, 40),
                }),
                Opcode::LogoutRequest => Op::LogoutRequest(LogoutRequest {
                    immediate,
                    reason_code: b1 & 0x7f,
                    itt,
                    cid: be16(b, 20),
                    cmd_sn: sn(b, 24),
                    exp_stat_sn: sn(b, 28),
                }),
                Opcode::SnackRequest => Op::SnackRequest(SnackRequest {
                    snack_type: b1 & 0x0f,
                    lun,
                    itt,
                    ttt_or_snack_tag: be32(b, 20),
                    exp_stat_sn: sn(b, 28),
                    beg_run: be32(b, 36),
                    run_length: be32(b, 40),
                }),
                Opcode::NopIn => Op::NopIn(NopIn {
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                }),
                Opcode::ScsiResponse => Op::ScsiResponse(ScsiResponse {
                    bidi_read_residual_overflow: bit(b1, 0x10),
                    bidi_read_residual_underflow: bit(b1, 0x08),
                    residual_overflow: bit(b1, 0x04),
                    residual_underflow: bit(b1, 0x02),
                    response: b[2],
                    status: b[3],
                    itt,
                    snack_tag: be32(b, 20),
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    exp_data_sn: sn(b, 36),
                    bidi_read_residual_count: be32(b, 40),
                    residual_count: be32(b, 44),
                }),
                Opcode::TaskMgmtResponse => Op::TaskMgmtResponse(TaskMgmtResponse {
                    response: b[2],
                    itt,
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                }),
                Opcode::LoginResponse => {
                    if bit(b1, T) && bit(b1, C) {
                        return Err(invalid(code, itt, "T and C bits both set"));
                    }
                    Op::LoginResponse(LoginResponse {
                        transit_bit: bit(b1, T),
                        continue_bit: bit(b1, C),
                        csg: Stage::from_bits(b1 >> 2),
                        nsg: Stage::from_bits(b1),
                        version_max: b[2],
                        version_active: b[3],
                        isid: isid(b),
                        tsih: be16(b, 14),
                        itt,
                        stat_sn: sn(b, 24),
                        exp_cmd_sn: sn(b, 28),
                        max_cmd_sn: sn(b, 32),
                        status: LoginStatus::new(b[36], b[37]),
                    })
                }
                Opcode::TextResponse => {
                    if bit(b1, F) && bit(b1, C) {
                        return Err(invalid(code, itt, "F and C bits both set"));
                    }
                    Op::TextResponse(TextResponse {
                        final_bit: bit(b1, F),
                        continue_bit: bit(b1, C),
                        lun,
                        itt,
                        ttt: Ttt(be32(b, 20)),
                        stat_sn: sn(b, 24),
                        exp_cmd_sn: sn(b, 28),
                        max_cmd_sn: sn(b, 32),
                    })
                }
                Opcode::DataIn => Op::DataIn(DataIn {
                    final_bit: bit(b1, F),
                    acknowledge: bit(b1, 0x40),
                    residual_overflow: bit(b1, 0x04),
                    residual_underflow: bit(b1, 0x02),
                    status_present: bit(b1, 0x01),
                    status: b[3],
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    data_sn: sn(b, 36),
                    buffer_offset: be32(b, 40),
                    residual_count: be32(b, 44),
                }),
                Opcode::LogoutResponse => Op::LogoutResponse(LogoutResponse {
                    response: b[2],
                    itt,
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    time2wait: be16(b, 40),
                    time2retain: be16(b, 42),
                }),
                Opcode::R2t => Op::R2t(R2t {
                    lun,
                    itt,
                    ttt: Ttt(be32(b, 20)),
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    r2t_sn: sn(b, 36),
                    buffer_offset: be32(b, 40),
                    desired_data_transfer_length: be32(b, 44),
                }),
                Opcode::AsyncMessage => Op::AsyncMessage(AsyncMessage {
                    lun,
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    async_event: b[36],
                    async_vcode: b[37],
                    parameter1: be16(b, 38),
                    parameter2: be16(b, 40),
                    parameter3: be16(b, 42),
                }),
                Opcode::Reject => Op::Reject(Reject {
                    reason: b[2],
                    stat_sn: sn(b, 24),
                    exp_cmd_sn: sn(b, 28),
                    max_cmd_sn: sn(b, 32),
                    data_sn_or_r2t_sn: sn(b, 36),
                }),
            },
        };
        Ok(Bhs {
            total_ahs_length: b[4],
            data_segment_length: raw_data_segment_len(b) as u32,
            op,
        })
    }

    /// Parse the first 48 bytes of `buf`.
    pub fn parse_slice(buf: &[u8]) -> Result<Bhs, PduError> {
        Bhs::parse(header_of(buf)?)
    }
}

/// The first 48 bytes of `buf`, or `Truncated`.
pub(super) fn header_of(buf: &[u8]) -> Result<&[u8; BHS_LEN], PduError> {
    buf.get(..BHS_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or(PduError::Truncated {
            needed: BHS_LEN,
            got: buf.len(),
        })
}

fn isid(b: &[u8; BHS_LEN]) -> Isid {
    let mut v = [0u8; 6];
    v.copy_from_slice(&b[8..14]);
    Isid(v)
}

fn invalid(code: Opcode, itt: Itt, field: &'static str) -> PduError {
    PduError::InvalidField {
        opcode: code as u8,
        itt,
        field,
    }
}
