//! Target-level helpers: REPORT LUNS (SPC-4 6.33), LUN encoding (SAM-5 4.6), and the
//! answers for a LUN that does not exist (SPC-4 6.6.2 peripheral qualifier 011b).

use std::sync::Arc;

use riser_bdev::IoBuf;

use crate::cdb::{op, put_be32, Cdb};
use crate::sense::{Asc, CmdError, CmdResult, Sense, SenseKey, Status};
use crate::task::{Residual, ScsiResult, ScsiTask};
use crate::Lun;

/// Encodes a LUN number as the 8-byte LUN field: peripheral device addressing for
/// LUNs below 256 and flat space addressing up to 16383 (SAM-5 4.6.6, 4.6.7), as Linux
/// and libiscsi expect.
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        let l = (lun & 0x3FFF) as u16;
        b[0] = 0x40 | (l >> 8) as u8;
        b[1] = l as u8;
    }
    b
}

/// Decodes the 8-byte LUN field of a PDU (peripheral or flat addressing; first level).
pub fn decode_lun(b: &[u8; 8]) -> u64 {
    match b[0] >> 6 {
        0b00 => b[1] as u64 | (((b[0] & 0x3F) as u64) << 8),
        0b01 => (((b[0] & 0x3F) as u64) << 8) | b[1] as u64,
        _ => u64::MAX,
    }
}

/// REPORT LUNS parameter data (SPC-4 6.33) for `luns`, before allocation-length
/// truncation. SELECT REPORT 0, 1 and 2 all list the same (riser has no well-known LUNs).
pub fn report_luns_data(cdb: &Cdb, luns: &[u64]) -> CmdResult<Vec<u8>> {
    let select = cdb.u8(2);
    if select > 0x02 {
        return Err(CmdError::invalid_cdb(2, None));
    }
    // SPC-4 6.33: an allocation length below 16 is an error.
    if cdb.be32(6) < 16 {
        return Err(CmdError::invalid_cdb(6, None));
    }
    let mut ids: Vec<u64> = if select == 0x01 {
        Vec::new()
    } else {
        luns.to_vec()
    };
    ids.sort_unstable();
    ids.dedup();
    let mut v = vec![0u8; 8 + 8 * ids.len()];
    put_be32(&mut v, 0, (8 * ids.len()) as u32);
    for (i, id) in ids.iter().enumerate() {
        v[8 + 8 * i..16 + 8 * i].copy_from_slice(&encode_lun(*id));
    }
    Ok(v)
}

fn data_result(task: &ScsiTask, mut v: Vec<u8>, alloc: usize) -> ScsiResult {
    v.truncate(alloc);
    let residual = Residual::compute(v.len() as u64, task.edtl);
    v.truncate(task.edtl as usize);
    let n = v.len();
    ScsiResult {
        tag: task.tag,
        status: Status::Good,
        sense: None,
        data_in: if n > 0 {
            Some(Box::new(v) as IoBuf)
        } else {
            None
        },
        data_len: n,
        residual,
        aborted: false,
    }
}

fn error_result(task: &ScsiTask, e: CmdError) -> ScsiResult {
    ScsiResult {
        tag: task.tag,
        status: e.status,
        sense: e.sense.map(|s| s.fixed()),
        data_in: None,
        data_len: 0,
        residual: Residual::compute(0, task.edtl),
        aborted: false,
    }
}

/// Answers REPORT LUNS addressed to any LUN number (existing or not) of a target whose
/// LUNs are `luns`. When the addressed LUN exists the iSCSI layer may also just submit
/// the task to its [`LunChannel`](crate::LunChannel), which reports the same list only
/// if it is given; this helper is the one that knows the whole target.
pub fn report_luns(task: &ScsiTask, luns: &[u64], addressed: Option<&Arc<Lun>>) -> ScsiResult {
    if let Some(lun) = addressed {
        lun.clear_ua(&task.nexus, Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
    }
    match report_luns_data(&task.cdb, luns) {
        Ok(v) => data_result(task, v, task.cdb.be32(6) as usize),
        Err(e) => error_result(task, e),
    }
}

/// Whether the iSCSI layer should answer this CDB at target level with
/// [`report_luns`] rather than at the LUN.
pub fn is_target_level(cdb: &Cdb) -> bool {
    cdb.opcode() == op::REPORT_LUNS
}

/// The answer for a task addressed to a LUN that does not exist (SPC-4 6.6.2, SAM-5):
/// INQUIRY returns data with peripheral qualifier 011b and device type 1Fh;
/// REQUEST SENSE returns LOGICAL UNIT NOT SUPPORTED as sense data; REPORT LUNS must go
/// to [`report_luns`]; everything else is CHECK CONDITION, ILLEGAL REQUEST, LOGICAL UNIT
/// NOT SUPPORTED.
pub fn no_such_lun(task: &ScsiTask) -> ScsiResult {
    let cdb = &task.cdb;
    match cdb.opcode() {
        op::INQUIRY => {
            let evpd = cdb.u8(1) & 0x01 != 0;
            if cdb.u8(1) & 0x02 != 0 || (!evpd && cdb.u8(2) != 0) {
                return error_result(task, CmdError::invalid_cdb(if evpd { 1 } else { 2 }, None));
            }
            let v = if evpd {
                match cdb.u8(2) {
                    0x00 => vec![0x7F, 0x00, 0x00, 0x01, 0x00],
                    _ => return error_result(task, CmdError::invalid_cdb(2, None)),
                }
            } else {
                let mut d = vec![0u8; 36];
                d[0] = 0x7F; // qualifier 011b, type 1Fh: no logical unit here
                d[2] = 0x06;
                d[3] = 0x12;
                d[4] = 31;
                d
            };
            data_result(task, v, cdb.be16(3) as usize)
        }
        op::REQUEST_SENSE => {
            let s = Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED);
            let b = s.encode(cdb.u8(1) & 0x01 != 0);
            data_result(task, b.as_slice().to_vec(), cdb.u8(4) as usize)
        }
        op::REPORT_LUNS => error_result(task, CmdError::illegal(Asc::LOGICAL_UNIT_NOT_SUPPORTED)),
        _ => error_result(task, CmdError::illegal(Asc::LOGICAL_UNIT_NOT_SUPPORTED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_encoding() {
        assert_eq!(encode_lun(0), [0; 8]);
        assert_eq!(encode_lun(5), [0, 5, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode_lun(300), [0x41, 0x2C, 0, 0, 0, 0, 0, 0]);
        for l in [0u64, 1, 255, 256, 1000, 16383] {
            assert_eq!(decode_lun(&encode_lun(l)), l);
        }
    }
}
