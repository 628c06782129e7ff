//! Decoding of block-command CDBs (SBC-3 5.x) and the checks they share.
//!
//! [`open`] is the opening every READ, WRITE, WRITE AND VERIFY, ORWRITE, VERIFY, COMPARE
//! AND WRITE and WRITE SAME handler starts with, in this order: decode the CDB, record the
//! bytes the command transfers (for the residual, whatever check fails next), refuse a
//! protection field, the command's own CDB checks, its length limit, its range.

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
    /// The CDB byte where the length field starts (the field pointer of INVALID FIELD IN
    /// CDB for a length over a limit).
    pub len_byte: u16,
}

impl BlockCmd {
    /// The 3-bit protection field (RDPROTECT, WRPROTECT, VRPROTECT, ORPROTECT).
    pub fn protect(&self) -> u8 {
        self.flags >> 5
    }

    /// VERIFY's BYTCHK field (byte 1 bits 2-1).
    pub fn bytchk(&self) -> u8 {
        (self.flags >> 1) & 0x03
    }
}

pub(crate) fn decode(cdb: &Cdb) -> BlockCmd {
    let flags = cdb.u8(1);
    let (lba, blocks, len_byte) = match cdb.opcode() {
        op::READ6 | op::WRITE6 => {
            // SBC-3 5.8/5.33: transfer length 0 means 256 blocks.
            let n = cdb.u8(4) as u64;
            ((cdb.be24(1) & 0x1F_FFFF) as u64, if n == 0 { 256 } else { n }, 4)
        }
        op::READ10 | op::WRITE10 | op::WRITE_VERIFY10 | op::VERIFY10 | op::PRE_FETCH10 | op::SYNCHRONIZE_CACHE10 | op::WRITE_SAME10 => {
            (cdb.be32(2) as u64, cdb.be16(7) as u64, 7)
        }
        op::READ12 | op::WRITE12 | op::WRITE_VERIFY12 | op::VERIFY12 => (cdb.be32(2) as u64, cdb.be32(6) as u64, 6),
        op::COMPARE_AND_WRITE => (cdb.be64(2), cdb.u8(13) as u64, 13),
        op::WRITE_ATOMIC16 => (cdb.be64(2), cdb.be16(12) as u64, 12),
        _ => (cdb.be64(2), cdb.be32(10) as u64, 10),
    };
    // READ(6)/WRITE(6) have no flags byte.
    let flags = if matches!(cdb.opcode(), op::READ6 | op::WRITE6) { 0 } else { flags };
    BlockCmd { lba: Lba::new(lba), blocks, flags, len_byte }
}

/// What bounds a block command's NUMBER OF LOGICAL BLOCKS in [`open`] (INVALID FIELD IN
/// CDB at the length field when over it).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Limit {
    /// MAXIMUM TRANSFER LENGTH of the Block Limits VPD page (SBC-3 6.5.3).
    Transfer,
    /// At most this many blocks (COMPARE AND WRITE: MAXIMUM COMPARE AND WRITE LENGTH).
    Blocks(u64),
    /// Checked by the handler itself (WRITE SAME: "0" means to the end of the medium, so
    /// the limit applies after the range check).
    Handler,
}

/// The opening shared by the block commands (see the module doc): decodes `cdb`, sets
/// `*xfer` to `bytes(&cmd, block size)`, then checks the protection field, `own` (the
/// command's own CDB fields), the length against `limit`, and the range.
pub(crate) fn open(
    lun: &Lun,
    cdb: &Cdb,
    xfer: &mut u64,
    bytes: impl FnOnce(&BlockCmd, u64) -> u64,
    own: impl FnOnce(&BlockCmd) -> CmdResult<()>,
    limit: Limit,
) -> CmdResult<BlockCmd> {
    let b = decode(cdb);
    *xfer = bytes(&b, lun.block_size() as u64);
    check_protect(&b)?;
    own(&b)?;
    match limit {
        Limit::Transfer => check_transfer(lun, &b)?,
        Limit::Blocks(max) if b.blocks > max => return Err(CmdError::invalid_cdb(b.len_byte, None)),
        Limit::Blocks(_) | Limit::Handler => {}
    }
    check_range(lun, b.lba, b.blocks)?;
    Ok(b)
}

/// [`open`] for the commands that transfer their blocks and check nothing else of their
/// own: READ, WRITE, WRITE AND VERIFY, WRITE ATOMIC, ORWRITE.
pub(crate) fn open_transfer(lun: &Lun, cdb: &Cdb, xfer: &mut u64) -> CmdResult<BlockCmd> {
    open(lun, cdb, xfer, |b, bs| b.blocks * bs, |_| Ok(()), Limit::Transfer)
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
pub(crate) fn check_transfer(lun: &Lun, b: &BlockCmd) -> CmdResult<()> {
    if b.blocks > max_transfer_blocks(lun) {
        return Err(CmdError::invalid_cdb(b.len_byte, None));
    }
    Ok(())
}

/// WRITE PROTECTED (DATA PROTECT) when the LUN refuses writes (read-only, SWP, or a device
/// that cannot write): for the handlers of commands that write the medium (`F_WRITE`).
pub(crate) fn check_writable(lun: &Lun) -> CmdResult<()> {
    if lun.write_protected() {
        return Err(CmdError::write_protected());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::cdb_len;

    /// `len_byte` (the field pointer of a length over a limit) is where the length field
    /// starts, for every block command the table has.
    #[test]
    fn len_byte_points_at_the_length_field() {
        let block_ops = crate::opcodes::COMMANDS.iter().map(|c| c.opcode).filter(|&o| {
            !matches!(
                o,
                op::TEST_UNIT_READY
                    | op::REQUEST_SENSE
                    | op::INQUIRY
                    | op::MODE_SELECT6
                    | op::RESERVE6
                    | op::RELEASE6
                    | op::MODE_SENSE6
                    | op::START_STOP_UNIT
                    | op::PREVENT_ALLOW
                    | op::READ_CAPACITY10
                    | op::READ_DEFECT_DATA10
                    | op::UNMAP
                    | op::SANITIZE
                    | op::MODE_SELECT10
                    | op::RESERVE10
                    | op::RELEASE10
                    | op::MODE_SENSE10
                    | op::PERSISTENT_RESERVE_IN
                    | op::PERSISTENT_RESERVE_OUT
                    | op::EXTENDED_COPY
                    | op::RECEIVE_COPY_RESULTS
                    | op::SERVICE_ACTION_IN16
                    | op::REPORT_LUNS
                    | op::MAINTENANCE_IN
                    | op::READ_DEFECT_DATA12
            )
        });
        let mut n = 0;
        for opc in block_ops {
            let len = cdb_len(opc).unwrap();
            let mut c = vec![0u8; len];
            c[0] = opc;
            let zero = decode(&Cdb::new(&c));
            c[zero.len_byte as usize] = 0x01;
            let one = decode(&Cdb::new(&c));
            assert_ne!(zero.blocks, one.blocks, "{opc:#04x}");
            assert_eq!(zero.lba, one.lba, "{opc:#04x}");
            if zero.len_byte > 1 {
                c[zero.len_byte as usize - 1] = 0xFF;
                assert_eq!(decode(&Cdb::new(&c)).blocks, one.blocks, "{opc:#04x}: the field starts there");
            }
            n += 1;
        }
        assert_eq!(n, 23);
    }
}
