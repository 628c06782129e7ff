//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS (SPC-4 6.4, 6.18): block-to-block copies
//! within the logical unit, the copy manager being the LU itself.
//!
//! Only identification-descriptor CSCD descriptors (0xE4) naming this LU and
//! block-device-to-block-device segment descriptors (0x02) are supported; everything is
//! validated before the first block moves, so a rejected list changes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use riser_bdev::Lba;

use crate::cdb::{get_be16, get_be32, get_be64, put_be16, put_be32, Cdb};
use crate::lun::Lun;
use crate::sense::{Asc, CmdError, CmdResult, SenseKey};

/// Copy manager limits (RECEIVE COPY RESULTS operating parameters, SPC-4 6.18.4).
pub(crate) const MAX_TARGET_DESCRIPTORS: usize = 2;
pub(crate) const MAX_SEGMENT_DESCRIPTORS: usize = 16;
pub(crate) const MAX_DESCRIPTOR_LIST_LENGTH: usize = 1024;
/// Largest segment, in bytes.
pub(crate) const MAX_SEGMENT_BYTES: u64 = 1 << 30;
/// Bytes moved per read/write step of a copy: the buffer one running copy holds.
pub(crate) const COPY_CHUNK_BYTES: u64 = 8 << 20;

const TGT_IDENT: u8 = 0xE4;
const SEG_BLOCK_TO_BLOCK: u8 = 0x02;
const TGT_DESC_LEN: usize = 32;

/// One block-to-block segment: `blocks` from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub src: Lba,
    pub dst: Lba,
    pub blocks: u64,
}

/// A validated EXTENDED COPY parameter list.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CopyPlan {
    pub list_id: u8,
    /// LIST ID USAGE 11b: no results are kept.
    pub discard: bool,
    pub segments: Vec<Segment>,
}

/// Outcome of a finished copy, kept for RECEIVE COPY RESULTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CopyStatus {
    pub ok: bool,
    pub segments_processed: u16,
    pub blocks: u64,
}

/// Results of finished copy operations, by I_T nexus and list identifier.
#[derive(Default, Debug)]
pub(crate) struct CopyResults {
    pub by_list: HashMap<(Arc<str>, u8), CopyStatus>,
}

fn copy_aborted(asc: Asc) -> CmdError {
    CmdError::check(SenseKey::CopyAborted, asc)
}

/// COPY TARGET DEVICE NOT REACHABLE (0D/02).
fn unreachable() -> CmdError {
    copy_aborted(Asc::new(0x0D, 0x02))
}

/// Parses and validates an EXTENDED COPY (LID1) parameter list against `lun`
/// (SPC-4 6.4.3). `Ok(None)` for an empty list.
pub(crate) fn parse(lun: &Lun, cdb: &Cdb, p: &[u8]) -> CmdResult<Option<CopyPlan>> {
    let len = cdb.be32(10) as usize;
    if len == 0 {
        return Ok(None);
    }
    if len < 16 || p.len() < len {
        return Err(CmdError::param_list_length());
    }
    let p = &p[..len];
    let list_id = p[0];
    let usage = (p[1] >> 3) & 0x03;
    let tgt_len = get_be16(p, 2) as usize;
    let seg_len = get_be32(p, 8) as usize;
    let inline_len = get_be32(p, 12) as usize;
    if 16 + tgt_len + seg_len + inline_len > len {
        return Err(CmdError::param_list_length());
    }
    if tgt_len + seg_len > MAX_DESCRIPTOR_LIST_LENGTH {
        return Err(CmdError::param_list_length());
    }
    if inline_len != 0 {
        // Inline data is only used by stream segment types, which are not supported.
        return Err(CmdError::invalid_param(12, None));
    }
    // CSCD (target) descriptors.
    let mut n_tgt = 0usize;
    let mut off = 16;
    let tgt_end = 16 + tgt_len;
    let mut targets_ok: Vec<Result<(), CmdError>> = Vec::new();
    while off < tgt_end {
        let code = p[off];
        if code != TGT_IDENT {
            return Err(CmdError::illegal(
                Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE,
            ));
        }
        if off + TGT_DESC_LEN > tgt_end {
            return Err(CmdError::param_list_length());
        }
        n_tgt += 1;
        if n_tgt > MAX_TARGET_DESCRIPTORS {
            return Err(CmdError::illegal(Asc::TOO_MANY_TARGET_DESCRIPTORS));
        }
        targets_ok.push(check_target(lun, &p[off..off + TGT_DESC_LEN]));
        off += TGT_DESC_LEN;
    }
    // Segment descriptors.
    let seg_end = tgt_end + seg_len;
    let mut segments = Vec::new();
    let bs = lun.block_size() as u64;
    while off < seg_end {
        if off + 4 > seg_end {
            return Err(CmdError::param_list_length());
        }
        let code = p[off];
        if code != SEG_BLOCK_TO_BLOCK {
            return Err(CmdError::illegal(
                Asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE,
            ));
        }
        let dlen = get_be16(p, off + 2) as usize + 4;
        if dlen != 0x1C {
            return Err(CmdError::invalid_param(off as u16 + 2, None));
        }
        if off + dlen > seg_end {
            return Err(CmdError::param_list_length());
        }
        if segments.len() + 1 > MAX_SEGMENT_DESCRIPTORS {
            return Err(CmdError::illegal(Asc::TOO_MANY_SEGMENT_DESCRIPTORS));
        }
        let d = &p[off..off + dlen];
        let dc = d[1] & 0x02 != 0;
        let src_i = get_be16(d, 4) as usize;
        let dst_i = get_be16(d, 6) as usize;
        let n = get_be16(d, 10) as u64;
        let src = Lba::new(get_be64(d, 12));
        let dst = Lba::new(get_be64(d, 20));
        // DC=1: NUMBER OF BLOCKS counts destination blocks; same LU, same size.
        let _ = dc;
        for i in [src_i, dst_i] {
            match targets_ok.get(i) {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(*e),
                None => return Err(unreachable()),
            }
        }
        if n * bs > MAX_SEGMENT_BYTES {
            return Err(CmdError::invalid_param(off as u16 + 10, None));
        }
        let in_range = |lba: Lba| lba.checked_add(n).is_some_and(|e| e <= lun.end_lba());
        if !in_range(src) || !in_range(dst) {
            // The segment would run off the medium: the copy fails before any block
            // moves (SPC-4 6.4.1: COPY ABORTED).
            return Err(copy_aborted(Asc::NO_ADDITIONAL_SENSE));
        }
        if n > 0 {
            segments.push(Segment {
                src,
                dst,
                blocks: n,
            });
        }
        off += dlen;
    }
    Ok(Some(CopyPlan {
        list_id,
        discard: usage == 0x03,
        segments,
    }))
}

/// Checks one identification CSCD descriptor (SPC-4 6.4.5.2): it must name this LU (one
/// of its VPD 0x83 designators) as a block device of this block size. The verdict is kept
/// per descriptor so that only descriptors a segment uses fail the command, as SPC-4
/// requires for unreachable copy targets.
fn check_target(lun: &Lun, d: &[u8]) -> Result<(), CmdError> {
    // Byte 1 bits 7:6 (LU ID TYPE) are not examined: in SPC-4 the identification
    // descriptor CSCD names its logical unit by the designator below, and the LU ID TYPE /
    // LU IDENTIFIER pair of SPC-3 no longer applies to it (SPC-4 6.4.5.2). The field is
    // ignored rather than refused so that SPC-4 copy managers' lists are accepted.
    let nul = d[1] & 0x20 != 0;
    let pdt = d[1] & 0x1F;
    if nul {
        // A null device is not a copy target riser can reach.
        return Err(unreachable());
    }
    if pdt != 0 {
        return Err(unreachable());
    }
    // Designation descriptor at bytes 4..24: code set, association/type, length, value.
    let ty = d[5] & 0x0F;
    let dlen = (d[7] as usize).min(16);
    let value = &d[8..8 + dlen];
    let ours = crate::inquiry::device_identification(lun, None);
    let mut i = 0;
    let mut found = false;
    while i + 4 <= ours.len() {
        let oty = ours[i + 1] & 0x0F;
        let olen = ours[i + 3] as usize;
        let assoc = (ours[i + 1] >> 4) & 0x03;
        if i + 4 + olen <= ours.len()
            && assoc == 0
            && oty == ty
            && &ours[i + 4..i + 4 + olen] == value
        {
            found = true;
        }
        i += 4 + olen;
    }
    if !found {
        return Err(unreachable());
    }
    let disk_bs = ((d[29] as u32) << 16) | ((d[30] as u32) << 8) | d[31] as u32;
    if disk_bs != lun.block_size() {
        return Err(unreachable());
    }
    Ok(())
}

/// RECEIVE COPY RESULTS (SPC-4 6.18) for `nexus`.
pub(crate) fn receive_copy_results(lun: &Lun, nexus: &Arc<str>, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    match cdb.service_action() {
        crate::cdb::op::RCR_COPY_STATUS => {
            let list_id = cdb.u8(2);
            let st = lun.lock();
            let Some(s) = st.copies.by_list.get(&(nexus.clone(), list_id)) else {
                // No copy with this list identifier (SPC-4 6.18.2).
                return Err(CmdError::invalid_cdb(2, None));
            };
            let mut v = vec![0u8; 12];
            put_be32(&mut v, 0, 8);
            v[4] = if s.ok { 0x01 } else { 0x02 }; // completed, without / with errors
            put_be16(&mut v, 5, s.segments_processed);
            v[7] = 0xF1; // TRANSFER COUNT UNITS: logical blocks of the destination
            put_be32(&mut v, 8, s.blocks.min(u32::MAX as u64) as u32);
            Ok(v)
        }
        _ => {
            // OPERATING PARAMETERS (SPC-4 6.18.4).
            let mut v = vec![0u8; 46];
            v[4] = 0x01; // SNLID: the list identifier may be "not used"
            put_be16(&mut v, 8, MAX_TARGET_DESCRIPTORS as u16);
            put_be16(&mut v, 10, MAX_SEGMENT_DESCRIPTORS as u16);
            put_be32(&mut v, 12, MAX_DESCRIPTOR_LIST_LENGTH as u32);
            put_be32(&mut v, 16, MAX_SEGMENT_BYTES as u32);
            // MAXIMUM INLINE DATA LENGTH, HELD DATA LIMIT, stream size: 0.
            put_be16(&mut v, 34, 1); // TOTAL CONCURRENT COPIES
            v[36] = 1; // MAXIMUM CONCURRENT COPIES
            v[37] = lun.block_size().trailing_zeros() as u8; // DATA SEGMENT GRANULARITY
            v[43] = 2; // IMPLEMENTED DESCRIPTOR LIST LENGTH
            v[44] = SEG_BLOCK_TO_BLOCK;
            v[45] = TGT_IDENT;
            let n = (v.len() - 4) as u32;
            put_be32(&mut v, 0, n);
            Ok(v)
        }
    }
}

/// Third-party Copy VPD page body (SPC-4 7.8.17): supported commands and the LID1
/// parameter data descriptor.
pub(crate) fn third_party_copy_vpd() -> Vec<u8> {
    let mut v = Vec::new();
    // Supported Commands descriptor (type 0001h).
    let cmds: [(u8, &[u8]); 2] = [(0x83, &[0x00]), (0x84, &[0x00, 0x03])];
    let mut list = Vec::new();
    for (opc, sas) in cmds {
        list.push(opc);
        list.push(sas.len() as u8);
        list.extend_from_slice(sas);
    }
    let mut body = vec![list.len() as u8];
    body.extend(list);
    while body.len() & 3 != 0 {
        body.push(0);
    }
    v.extend_from_slice(&[0x00, 0x01]);
    v.extend_from_slice(&(body.len() as u16).to_be_bytes());
    v.extend(body);
    // Parameter Data descriptor (type 0008h).
    let mut pd = vec![0u8; 0x1C];
    put_be16(&mut pd, 4, MAX_TARGET_DESCRIPTORS as u16);
    put_be16(&mut pd, 6, MAX_SEGMENT_DESCRIPTORS as u16);
    put_be32(&mut pd, 8, MAX_DESCRIPTOR_LIST_LENGTH as u32);
    v.extend_from_slice(&[0x00, 0x08]);
    v.extend_from_slice(&(pd.len() as u16).to_be_bytes());
    v.extend(pd);
    v
}
