//! Decoding of block-command CDBs (SBC-3 5.x) and the checks they share.

use riser_bdev::Lba;

use crate::cdb::{op, Cdb};
use crate::inquiry::max_transfer_blocks;
use crate::lun::Lun;
use crate::sense::{CmdError, CmdResult};

/// The LBA/length part of a READ, WRITE, VERIFY, WRITE AND VERIFY, PRE-FETCH,
/// SYNCHRONIZE CACHE, WRITE SAME, ORWRITE or COMPARE AND WRITE CDB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockCmd {
    pub lba: Lba,
    pub blocks: u64,
    /// Byte 1 of the CDB (RDPROTECT/WRPROTECT, DPO, FUA, BYTCHK, IMMED, UNMAP ...).
    pub flags: u8,
}

impl BlockCmd {
    /// The 3-bit protection field (RDPROTECT, WRPROTECT, VRPROTECT, ORPROTECT).
    pub fn protect(&self) -> u8 {
        self.flags >> 5
    }
}

pub(crate) fn decode(cdb: &Cdb) -> BlockCmd {
    let flags = cdb.u8(1);
    let (lba, blocks) = match cdb.opcode() {
        op::READ6 | op::WRITE6 => {
            // SBC-3 5.8/5.33: transfer length 0 means 256 blocks.
            let n = cdb.u8(4) as u64;
            (
                (cdb.be24(1) & 0x1F_FFFF) as u64,
                if n == 0 { 256 } else { n },
            )
        }
        op::READ10
        | op::WRITE10
        | op::WRITE_VERIFY10
        | op::VERIFY10
        | op::PRE_FETCH10
        | op::SYNCHRONIZE_CACHE10
        | op::WRITE_SAME10 => (cdb.be32(2) as u64, cdb.be16(7) as u64),
        op::READ12 | op::WRITE12 | op::WRITE_VERIFY12 | op::VERIFY12 => {
            (cdb.be32(2) as u64, cdb.be32(6) as u64)
        }
        op::COMPARE_AND_WRITE => (cdb.be64(2), cdb.u8(13) as u64),
        op::WRITE_ATOMIC16 => (cdb.be64(2), cdb.be16(12) as u64),
        _ => (cdb.be64(2), cdb.be32(10) as u64),
    };
    // READ(6)/WRITE(6) have no flags byte.
    let flags = if matches!(cdb.opcode(), op::READ6 | op::WRITE6) {
        0
    } else {
        flags
    };
    BlockCmd { lba: Lba::new(lba), blocks, flags }
}

/// LOGICAL BLOCK ADDRESS OUT OF RANGE unless `[lba, lba+blocks)` lies on the medium
/// (SBC-3 4.5). A zero-length range must still start on the medium or just past it.
pub(crate) fn check_range(lun: &Lun, lba: Lba, blocks: u64) -> CmdResult<()> {
    match lba.checked_add(blocks) {
        Some(end) if end <= lun.end_lba() => Ok(()),
        _ => Err(CmdError::lba_out_of_range()),
    }
}

/// INVALID FIELD IN CDB when a protection field is set: riser LUNs have no protection
/// information (SBC-3 4.18, READ CAPACITY(16) PROT_EN 0).
pub(crate) fn check_protect(b: &BlockCmd) -> CmdResult<()> {
    if b.protect() != 0 {
        return Err(CmdError::invalid_cdb(1, Some(5)));
    }
    Ok(())
}

/// INVALID FIELD IN CDB when the transfer exceeds MAXIMUM TRANSFER LENGTH (SBC-3 6.5.3).
pub(crate) fn check_transfer(lun: &Lun, cdb: &Cdb, blocks: u64) -> CmdResult<()> {
    if blocks > max_transfer_blocks(lun) {
        let byte = match cdb.opcode() {
            op::READ6 | op::WRITE6 => 4,
            op::READ10 | op::WRITE10 | op::WRITE_VERIFY10 | op::VERIFY10 => 7,
            op::READ12 | op::WRITE12 | op::WRITE_VERIFY12 | op::VERIFY12 => 6,
            op::WRITE_ATOMIC16 => 12,
            _ => 10,
        };
        return Err(CmdError::invalid_cdb(byte, None));
    }
    Ok(())
}
