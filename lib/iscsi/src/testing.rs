//! Builders of the PDU headers tests write again and again, for this crate's tests and, with
//! the `test-util` feature, for other crates' (the datamovers' unit tests, the test-support
//! crate's initiator).
//!
//! What a test rarely cares about gets a neutral value: LUN 0, the final bit set, a simple
//! task (ATTR 1), ExpStatSN 0, the reserved Target Transfer Tag. Change a field with struct
//! update syntax: `ScsiCommand { immediate: true, ..scsi_command(..) }`.

use crate::ffp::SnState;
use crate::pdu::{DataOut, Lun, NopOut, ScsiCommand, ScsiResponse, TextRequest};
use crate::serial::{Itt, Sn, Ttt};

/// The 16 CDB bytes of the BHS: the first 16 bytes of `cdb`, zero-padded.
pub fn cdb16(cdb: &[u8]) -> [u8; 16] {
    let mut c = [0u8; 16];
    let n = cdb.len().min(16);
    c[..n].copy_from_slice(&cdb[..n]);
    c
}

/// READ(10) of `blocks` blocks at `lba`.
pub fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// WRITE(10) of `blocks` blocks at `lba`.
pub fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

/// A SCSI Command, not immediate, F set (no unsolicited Data-Out follows), simple task,
/// LUN 0, ExpStatSN 0.
pub fn scsi_command(itt: Itt, cmd_sn: Sn, read: bool, write: bool, edtl: u32, cdb: &[u8]) -> ScsiCommand {
    ScsiCommand {
        immediate: false,
        final_bit: true,
        read,
        write,
        attr: 1,
        lun: Lun(0),
        itt,
        expected_data_transfer_length: edtl,
        cmd_sn,
        exp_stat_sn: Sn(0),
        cdb: cdb16(cdb),
    }
}

/// A SCSI Response "command completed at target" with `status`, no residual.
pub fn scsi_response(itt: Itt, status: u8, sn: SnState) -> ScsiResponse {
    ScsiResponse {
        bidi_read_residual_overflow: false,
        bidi_read_residual_underflow: false,
        residual_overflow: false,
        residual_underflow: false,
        response: crate::pdu::response::COMMAND_COMPLETED_AT_TARGET,
        status,
        itt,
        snack_tag: 0,
        stat_sn: sn.stat_sn,
        exp_cmd_sn: sn.exp_cmd_sn,
        max_cmd_sn: sn.max_cmd_sn,
        exp_data_sn: Sn(0),
        bidi_read_residual_count: 0,
        residual_count: 0,
    }
}

/// A Data-Out with F set (the last of its sequence), LUN 0, ExpStatSN 0; `ttt` reserved for
/// unsolicited data, the R2T's for solicited data.
pub fn data_out(itt: Itt, ttt: Ttt, data_sn: Sn, buffer_offset: u32) -> DataOut {
    DataOut { final_bit: true, lun: Lun(0), itt, ttt, exp_stat_sn: Sn(0), data_sn, buffer_offset }
}

/// An immediate NOP-Out that asks for an answer (a ping from the initiator), LUN 0.
pub fn nop_out(itt: Itt, cmd_sn: Sn) -> NopOut {
    NopOut { immediate: true, lun: Lun(0), itt, ttt: Ttt::RESERVED, cmd_sn, exp_stat_sn: Sn(0) }
}

/// An immediate Text Request, LUN 0: the final part of the text (F set), or with
/// `continue_bit` a part that more text follows (C set, F clear).
pub fn text_request(itt: Itt, cmd_sn: Sn, continue_bit: bool) -> TextRequest {
    TextRequest {
        immediate: true,
        final_bit: !continue_bit,
        continue_bit,
        lun: Lun(0),
        itt,
        ttt: Ttt::RESERVED,
        cmd_sn,
        exp_stat_sn: Sn(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{Bhs, Op};

    #[test]
    fn builders_make_headers_that_round_trip() {
        let cdb = write10(0x01020304, 8);
        assert_eq!(cdb, [0x2a, 0, 1, 2, 3, 4, 0, 0, 8, 0]);
        assert_eq!(read10(7, 1)[0], 0x28);
        let c = scsi_command(Itt(3), Sn(9), false, true, 4096, &cdb);
        assert_eq!(&c.cdb[..10], &cdb);
        assert_eq!(cdb16(&[1u8; 20]), [1u8; 16]);
        let sn = SnState { stat_sn: Sn(1), exp_cmd_sn: Sn(2), max_cmd_sn: Sn(3) };
        for op in [
            Op::ScsiCommand(c),
            Op::ScsiResponse(scsi_response(Itt(3), 2, sn)),
            Op::DataOut(data_out(Itt(3), Ttt(5), Sn(1), 512)),
            Op::NopOut(nop_out(Itt(4), Sn(10))),
            Op::TextRequest(text_request(Itt(5), Sn(10), true)),
            Op::TextRequest(text_request(Itt(5), Sn(10), false)),
        ] {
            let bhs = Bhs { total_ahs_length: 0, data_segment_length: 0, op };
            assert_eq!(Bhs::parse(&bhs.to_bytes()).unwrap(), bhs);
        }
    }
}
