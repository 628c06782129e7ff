//! Small helpers of the executor: parameter lists, reservation classes, and the data of
//! a few emulated commands.

use riser_bdev::{IoBuf, Lba};

use super::Action;
use crate::cdb::{op, put_be32, put_be64, Cdb};
use crate::opcodes::CmdDesc;
use crate::pr::PrClass;
use crate::sense::CmdResult;
use crate::task::Nexus;

/// Bytes GET LBA STATUS reads per step.
pub(super) const LBA_STATUS_WINDOW_BYTES: u64 = 1 << 20;
/// Bytes one GET LBA STATUS examines at most. SBC-3 5.5 lets the device server describe
/// fewer blocks than remain (the initiator asks again from the next LBA); scanning on while
/// the descriptors still fit lets a medium that is all one state (e.g. right after a
/// SANITIZE or a full UNMAP) be reported in a single descriptor, without reading an
/// arbitrarily large device for one command. 1 GiB: a device this scan serves (one without
/// an allocation map of its own, such as an RBD image, whose deallocated blocks cost the
/// cluster no disk read) is reported whole after a SANITIZE up to that size, which
/// libiscsi's Sanitize.BlockErase expects of a 256 MiB image (128 MiB was too little).
pub(super) const LBA_STATUS_MAX_SCAN_BYTES: u64 = 1 << 30;

/// The parameter list of a command: the data-out bytes, cut to the CDB's parameter list
/// length and to EDTL.
pub(super) fn param(data_out: &Option<IoBuf>, len: u64, edtl: u32) -> &[u8] {
    let d = data_out.as_ref().map_or(&[][..], |d| d.as_slice());
    let n = (d.len() as u64).min(len).min(edtl as u64) as usize;
    &d[..n]
}

/// How `d` interacts with reservations, refined by CDB fields where SPC/SBC say so.
pub(super) fn class_of(d: &CmdDesc, cdb: &Cdb) -> PrClass {
    match cdb.opcode() {
        // PREVENT ALLOW MEDIUM REMOVAL with PREVENT=0 is allowed (SBC-3 table 13).
        op::PREVENT_ALLOW if cdb.u8(4) & 0x03 == 0 => PrClass::AllowedPr,
        // START STOP UNIT with START=1 and no power condition is allowed.
        op::START_STOP_UNIT if cdb.u8(4) & 0xF1 == 0x01 => PrClass::AllowedPr,
        _ => d.pr,
    }
}

/// Runs of provisioning status for GET LBA STATUS: `(start, blocks, status)`, status 0
/// mapped, 1 deallocated (SBC-3 5.5.2, table 30).
pub(super) type LbaRuns = Vec<(Lba, u64, u8)>;

/// Adds the blocks in `data` (starting at `lba`) to `runs`. With LBPRZ a deallocated block
/// reads as zeros, and a block of zeros is as good as deallocated, so zeros are reported
/// deallocated.
pub(super) fn lba_status_scan(runs: &mut LbaRuns, lba: Lba, data: &[u8], bs: usize) {
    for (i, blk) in data.chunks(bs).enumerate() {
        let st = if blk.iter().all(|&b| b == 0) { 1 } else { 0 };
        match runs.last_mut() {
            Some(r) if r.2 == st && r.0 + r.1 == lba + i as u64 => r.1 += 1,
            _ => runs.push((lba + i as u64, 1, st)),
        }
    }
}

/// GET LBA STATUS parameter data (SBC-3 5.5.2) for `runs`, before allocation-length
/// truncation. A descriptor's count is 32 bits: longer runs are split.
pub(super) fn lba_status_data(runs: &[(Lba, u64, u8)]) -> Vec<u8> {
    let mut v = vec![0u8; 8];
    for &(start, n, st) in runs {
        let mut start = start;
        let mut left = n;
        while left > 0 {
            let k = left.min(u32::MAX as u64);
            let mut d = [0u8; 16];
            put_be64(&mut d, 0, start.get());
            put_be32(&mut d, 8, k as u32);
            d[12] = st;
            v.extend_from_slice(&d);
            start += k;
            left -= k;
        }
    }
    let n = (v.len() - 4) as u32;
    put_be32(&mut v, 0, n);
    v
}

/// READ DEFECT DATA (10/12) (SBC-3 5.11, 5.12): an empty list in the requested format.
pub(super) fn read_defect_data(cdb: &Cdb) -> Action {
    let ten = cdb.opcode() == op::READ_DEFECT_DATA10;
    let (flags, alloc) = if ten {
        (cdb.u8(2), cdb.be16(7) as usize)
    } else {
        (cdb.u8(1), cdb.be32(6) as usize)
    };
    let v = if ten {
        vec![0, flags & 0x1F, 0, 0]
    } else {
        vec![0, flags & 0x1F, 0, 0, 0, 0, 0, 0]
    };
    Action::Data(v, alloc)
}

/// REPORT TARGET PORT GROUPS (SPC-4 6.36): the target node's groups with their states
/// (see [`crate::alua`]), or the nexus's group alone, active/optimized.
pub(super) fn report_target_port_groups(nexus: &Nexus, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    Ok(crate::alua::report_target_port_groups(nexus, cdb))
}
