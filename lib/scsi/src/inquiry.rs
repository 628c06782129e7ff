//! INQUIRY (SPC-4 6.6) with its VPD pages, READ CAPACITY (SBC-3 5.15, 5.16) and the
//! limits riser advertises in the Block Limits VPD page.

use crate::cdb::{put_be16, put_be32, put_be64, Cdb};
use crate::lun::Lun;
use crate::sense::{CmdError, CmdResult};
use crate::task::Nexus;

/// Version descriptors (SPC-4 table 147): SAM-5, iSCSI, SPC-4, SBC-3.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0960, 0x0460, 0x04C0];

/// Largest READ/WRITE transfer in bytes: bounds the buffers a single command allocates
/// (Block Limits MAXIMUM TRANSFER LENGTH, SBC-3 6.5.3; longer transfers are refused with
/// INVALID FIELD IN CDB). 32 MiB is 65536 blocks of 512 bytes: initiators and test suites
/// commonly issue single 32 MiB commands (a 4-byte transfer length of 65536 blocks),
/// while it still caps what one command can make the target hold in memory.
pub const MAX_TRANSFER_BYTES: u64 = 32 << 20;
/// MAXIMUM COMPARE AND WRITE LENGTH in blocks (Block Limits byte 5).
pub const MAX_CAW_BLOCKS: u64 = 255;
/// MAXIMUM UNMAP LBA COUNT and block descriptor count (Block Limits bytes 20..28).
pub const MAX_UNMAP_LBA_COUNT: u64 = 1 << 20;
pub const MAX_UNMAP_DESCRIPTORS: usize = 256;
/// MAXIMUM WRITE SAME LENGTH in blocks (Block Limits bytes 36..44).
pub const MAX_WRITE_SAME_BLOCKS: u64 = 1 << 22;
/// Bytes written per bdev I/O when WRITE SAME repeats a block.
pub const WRITE_SAME_CHUNK_BYTES: u64 = 1 << 20;

/// MAXIMUM TRANSFER LENGTH in blocks for `lun`.
pub fn max_transfer_blocks(lun: &Lun) -> u64 {
    (MAX_TRANSFER_BYTES / lun.block_size() as u64).max(1)
}

/// VPD pages in ascending order (SPC-4 7.8.1).
const VPD_PAGES: [u8; 7] = [0x00, 0x80, 0x83, 0x8F, 0xB0, 0xB1, 0xB2];

fn ascii_field(dst: &mut [u8], s: &str) {
    // SPC-4 4.4.1: printable ASCII, left aligned, padded with spaces.
    dst.fill(b' ');
    for (d, c) in dst.iter_mut().zip(s.bytes()) {
        *d = if (0x20..0x7F).contains(&c) { c } else { b'?' };
    }
}

/// INQUIRY: the standard data or a VPD page, before allocation-length truncation.
pub(crate) fn inquiry(lun: &Lun, nexus: &Nexus, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    let evpd = cdb.u8(1) & 0x01 != 0;
    if cdb.u8(1) & 0x02 != 0 {
        // CMDDT is obsolete (SPC-4 6.6.1).
        return Err(CmdError::invalid_cdb(1, Some(1)));
    }
    let page = cdb.u8(2);
    if !evpd {
        if page != 0 {
            return Err(CmdError::invalid_cdb(2, None));
        }
        return Ok(standard(lun));
    }
    match page {
        0x00 => Ok(vpd(0x00, VPD_PAGES.to_vec())),
        0x80 => Ok(vpd(0x80, lun.serial().as_bytes().to_vec())),
        0x83 => Ok(vpd(0x83, device_identification(lun, Some(nexus)))),
        0x8F => Ok(vpd(0x8F, crate::xcopy::third_party_copy_vpd())),
        0xB0 => Ok(vpd(0xB0, block_limits(lun))),
        0xB1 => Ok(vpd(0xB1, block_characteristics(lun))),
        0xB2 => Ok(vpd(0xB2, provisioning(lun))),
        _ => Err(CmdError::invalid_cdb(2, None)),
    }
}

fn vpd(page: u8, body: Vec<u8>) -> Vec<u8> {
    let mut v = vec![0u8, page, 0, 0];
    put_be16(&mut v, 2, body.len() as u16);
    v.extend_from_slice(&body);
    v
}

/// Standard INQUIRY data (SPC-4 6.6.2): 96 bytes.
pub(crate) fn standard(lun: &Lun) -> Vec<u8> {
    let mut d = vec![0u8; 96];
    d[0] = 0x00; // peripheral qualifier 000b, direct access block device
    d[1] = if lun.config().removable { 0x80 } else { 0 };
    d[2] = 0x06; // SPC-4
    d[3] = 0x10 | 0x02; // HISUP, response data format 2
    d[4] = (d.len() - 5) as u8;
    d[5] = 0x10 | 0x08; // TPGS 01b (implicit ALUA), 3PC (EXTENDED COPY)
    d[7] = 0x02; // CMDQUE
    ascii_field(&mut d[8..16], &lun.config().vendor);
    ascii_field(&mut d[16..32], lun.product());
    ascii_field(&mut d[32..36], &lun.config().revision);
    for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
        put_be16(&mut d, 58 + 2 * i, *v);
    }
    d
}

/// Designation descriptor header (SPC-4 7.8.6.1).
fn designator(out: &mut Vec<u8>, proto_piv: bool, code_set: u8, assoc: u8, ty: u8, body: &[u8]) {
    let proto = if proto_piv { 0x50 } else { 0x00 }; // iSCSI protocol identifier when PIV
    out.push(proto | code_set);
    out.push(if proto_piv { 0x80 } else { 0 } | (assoc << 4) | ty);
    out.push(0);
    out.push(body.len() as u8);
    out.extend_from_slice(body);
}

/// A SCSI name string designator body: UTF-8, NUL terminated, padded to 4 bytes.
fn name_string(s: &str) -> Vec<u8> {
    let mut b = s.as_bytes().to_vec();
    b.truncate(251);
    b.push(0);
    while b.len() & 3 != 0 {
        b.push(0);
    }
    b
}

/// Device Identification VPD page body (SPC-4 7.8.6): the LU's NAA and T10 vendor
/// designators, and the target port / target device designators of the nexus.
pub(crate) fn device_identification(lun: &Lun, nexus: Option<&Nexus>) -> Vec<u8> {
    let mut v = Vec::with_capacity(256);
    // NAA IEEE Registered Extended, associated with the logical unit.
    designator(&mut v, false, 1, 0, 3, lun.naa());
    // T10 vendor identification: vendor (8) + serial.
    let mut t10 = vec![b' '; 8];
    ascii_field(&mut t10, &lun.config().vendor);
    t10.extend_from_slice(lun.serial().as_bytes());
    designator(&mut v, false, 2, 0, 1, &t10);
    if let Some(n) = nexus {
        // Relative target port identifier and target port group (target port).
        let mut rel = [0u8; 4];
        put_be16(&mut rel, 2, n.rel_target_port);
        designator(&mut v, true, 1, 1, 4, &rel);
        let mut tpg = [0u8; 4];
        put_be16(&mut tpg, 2, n.target_port_group);
        designator(&mut v, true, 1, 1, 5, &tpg);
        // SCSI name strings: target port name and target device name (RFC 7143).
        designator(&mut v, true, 3, 1, 8, &name_string(&n.target_port()));
        designator(&mut v, true, 3, 2, 8, &name_string(&n.target_name));
    } else if !lun.config().target_name.is_empty() {
        designator(
            &mut v,
            true,
            3,
            2,
            8,
            &name_string(&lun.config().target_name),
        );
    }
    v
}

/// Block Limits VPD page body (SBC-3 6.5.3; SBC-4 atomic fields): page length 0x3C.
fn block_limits(lun: &Lun) -> Vec<u8> {
    let mut b = vec![0u8; 0x3C];
    // Offsets below are page offsets minus 4.
    // WSNZ 0: WRITE SAME with NUMBER OF LOGICAL BLOCKS 0 writes to the end of the medium.
    b[1] = MAX_CAW_BLOCKS as u8;
    // OPTIMAL TRANSFER LENGTH GRANULARITY: one physical block.
    put_be16(&mut b, 2, 1 << lun.lbppb_exponent());
    let max_xfer = max_transfer_blocks(lun).min(u32::MAX as u64) as u32;
    put_be32(&mut b, 4, max_xfer); // MAXIMUM TRANSFER LENGTH
    put_be32(
        &mut b,
        8,
        max_xfer
            .min(128 << 10 >> lun.block_size().trailing_zeros())
            .max(1),
    ); // OPTIMAL
    put_be32(&mut b, 12, max_xfer); // MAXIMUM PREFETCH LENGTH
    if lun.thin_provisioned() {
        put_be32(&mut b, 16, MAX_UNMAP_LBA_COUNT as u32);
        put_be32(&mut b, 20, MAX_UNMAP_DESCRIPTORS as u32);
        put_be32(&mut b, 24, 1 << lun.lbppb_exponent()); // OPTIMAL UNMAP GRANULARITY: a physical block
        put_be32(&mut b, 28, 0x8000_0000); // UGAVALID, alignment 0
    }
    put_be64(&mut b, 32, MAX_WRITE_SAME_BLOCKS); // MAXIMUM WRITE SAME LENGTH
    put_be32(&mut b, 40, max_xfer); // MAXIMUM ATOMIC TRANSFER LENGTH
    put_be32(&mut b, 44, 0); // ATOMIC ALIGNMENT
    put_be32(&mut b, 48, 0); // ATOMIC TRANSFER LENGTH GRANULARITY
    b
}

/// Block Device Characteristics VPD page body (SBC-3 6.5.2): a non-rotating medium.
fn block_characteristics(lun: &Lun) -> Vec<u8> {
    let mut b = vec![0u8; 0x3C];
    put_be16(&mut b, 0, 0x0001); // MEDIUM ROTATION RATE: non-rotating
                                 // Page byte 7: WABEREQ (bits 7:6) and WACEREQ (bits 5:4) say what a read of a block
                                 // that a block erase / cryptographic erase sanitized (and nothing wrote since) returns.
                                 // 01b: GOOD status (a block erase leaves deallocated blocks, read as zeros; a
                                 // cryptographic erase leaves unpredictable data). WABEREQ is 00b where BLOCK ERASE is
                                 // not offered (no thin provisioning).
    let wabereq = if lun.thin_provisioned() { 0x40 } else { 0 };
    b[3] = wabereq | 0x10;
    b
}

/// Logical Block Provisioning VPD page body (SBC-3 6.5.4).
fn provisioning(lun: &Lun) -> Vec<u8> {
    let mut b = vec![0u8; 4];
    if lun.thin_provisioned() {
        // LBPU, LBPWS, LBPWS10, LBPRZ (unmapped blocks read as zeros: the bdev zeroes).
        b[1] = 0x80 | 0x40 | 0x20 | 0x04;
        b[2] = 0x02; // PROVISIONING TYPE: thin
    }
    b
}

/// READ CAPACITY (10) (SBC-3 5.15).
pub(crate) fn read_capacity10(lun: &Lun, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    let pmi = cdb.u8(8) & 0x01 != 0;
    if !pmi && cdb.be32(2) != 0 {
        return Err(CmdError::invalid_cdb(2, None));
    }
    let mut d = vec![0u8; 8];
    let last = lun.num_blocks() - 1;
    put_be32(
        &mut d,
        0,
        if last > 0xFFFF_FFFE {
            0xFFFF_FFFF
        } else {
            last as u32
        },
    );
    put_be32(&mut d, 4, lun.block_size());
    Ok(d)
}

/// READ CAPACITY (16) (SBC-3 5.16): 32 bytes.
pub(crate) fn read_capacity16(lun: &Lun, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    let pmi = cdb.u8(14) & 0x01 != 0;
    if !pmi && cdb.be64(2) != 0 {
        return Err(CmdError::invalid_cdb(2, None));
    }
    let mut d = vec![0u8; 32];
    put_be64(&mut d, 0, lun.num_blocks() - 1);
    put_be32(&mut d, 8, lun.block_size());
    d[13] = lun.lbppb_exponent() & 0x0F; // LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT
    if lun.thin_provisioned() {
        d[14] = 0x80 | 0x40; // LBPME, LBPRZ
    }
    Ok(d)
}
