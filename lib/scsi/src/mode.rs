//! MODE SENSE (6)/(10) and MODE SELECT (6)/(10) (SPC-4 6.11-6.14) with the caching (0x08),
//! control (0x0A) and informational exceptions (0x1C) pages (SPC-4 7.5, SBC-3 6.4).
//!
//! The current values live in the LUN's mode bits (atomics the data path reads); changeable
//! fields are WCE (on a device with a volatile write cache: WCE=0 makes every write FUA),
//! D_SENSE and SWP. Saved parameters are not supported.

use crate::cdb::{get_be16, get_be32, get_be64, op, put_be16, put_be32, put_be64, Cdb};
use crate::lun::{Lun, MODE_DSENSE, MODE_SWP, MODE_WCE};
use crate::sense::{Asc, CmdError, CmdResult};
use crate::pr::work::Deferred;
use crate::task::Nexus;
use std::sync::Arc;

const PAGE_CACHING: u8 = 0x08;
const PAGE_CONTROL: u8 = 0x0A;
const PAGE_IEC: u8 = 0x1C;
const PAGE_ALL: u8 = 0x3F;
const PAGES: [u8; 3] = [PAGE_CACHING, PAGE_CONTROL, PAGE_IEC];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pc {
    Current,
    Changeable,
    Default,
}

/// One mode page as (current | changeable | default) values of `bits` on `lun`.
fn page(lun: &Lun, code: u8, pc: Pc, bits: u32) -> Vec<u8> {
    let bit = |m: u32| -> bool {
        match pc {
            Pc::Current => bits & m != 0,
            Pc::Default => lun.default_mode_bits() & m != 0,
            // WCE means something only on a device with a volatile write cache (SBC-3
            // 6.4.5); elsewhere it stays 0.
            Pc::Changeable => m != MODE_WCE || lun.volatile_write_cache(),
        }
    };
    let fixed = pc != Pc::Changeable;
    match code {
        PAGE_CACHING => {
            // SBC-3 6.4.5, page length 0x12.
            let mut p = vec![0u8; 20];
            p[0] = PAGE_CACHING;
            p[1] = 0x12;
            if bit(MODE_WCE) {
                p[2] |= 0x04;
            }
            p
        }
        PAGE_CONTROL => {
            // SPC-4 7.5.8, page length 0x0A.
            let mut p = vec![0u8; 12];
            p[0] = PAGE_CONTROL;
            p[1] = 0x0A;
            if bit(MODE_DSENSE) {
                p[2] |= 0x04;
            }
            if fixed {
                p[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
                put_be16(&mut p, 8, 0xFFFF); // BUSY TIMEOUT PERIOD: unlimited
            }
            if bit(MODE_SWP) {
                p[4] |= 0x08;
            }
            p
        }
        _ => {
            // Informational exceptions control, SPC-4 7.5.11, page length 0x0A:
            // exceptions are disabled (DEXCPT), nothing is reported.
            let mut p = vec![0u8; 12];
            p[0] = PAGE_IEC;
            p[1] = 0x0A;
            if fixed {
                p[2] = 0x08;
            }
            p
        }
    }
}

/// MODE SENSE (6) and (10).
pub(crate) fn mode_sense(lun: &Lun, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    let ten = cdb.opcode() == op::MODE_SENSE10;
    let dbd = cdb.u8(1) & 0x08 != 0;
    let llbaa = ten && cdb.u8(1) & 0x10 != 0;
    let pc = match cdb.u8(2) >> 6 {
        0 => Pc::Current,
        1 => Pc::Changeable,
        2 => Pc::Default,
        _ => return Err(CmdError::illegal(Asc::SAVING_PARAMETERS_NOT_SUPPORTED)),
    };
    let code = cdb.u8(2) & 0x3F;
    let sub = cdb.u8(3);
    let pages: Vec<u8> = match (code, sub) {
        (PAGE_ALL, 0x00) | (PAGE_ALL, 0xFF) => PAGES.to_vec(),
        (c, 0x00) | (c, 0xFF) if PAGES.contains(&c) => vec![c],
        _ => return Err(CmdError::invalid_cdb(if sub != 0 { 3 } else { 2 }, None)),
    };
    let bits = lun.mode_bits();
    let mut body = Vec::new();
    for c in pages {
        body.extend(page(lun, c, pc, bits));
    }
    // Device specific parameter (SBC-3 6.4.1): WP, DPOFUA.
    let dsp = if lun.write_protected() { 0x80 } else { 0 } | 0x10;
    let blocks = lun.num_blocks();
    let bdesc: Vec<u8> = if dbd {
        vec![]
    } else if llbaa {
        let mut d = vec![0u8; 16];
        put_be64(&mut d, 0, blocks);
        put_be32(&mut d, 12, lun.block_size());
        d
    } else {
        let mut d = vec![0u8; 8];
        put_be32(&mut d, 0, blocks.min(0xFFFF_FFFF) as u32);
        put_be32(&mut d, 4, lun.block_size() & 0xFF_FFFF);
        d
    };
    let mut v;
    if ten {
        v = vec![0u8; 8];
        v[3] = dsp;
        if llbaa && !dbd {
            v[4] = 0x01; // LONGLBA
        }
        put_be16(&mut v, 6, bdesc.len() as u16);
        v.extend(bdesc);
        v.extend(body);
        let n = (v.len() - 2) as u16;
        put_be16(&mut v, 0, n);
    } else {
        v = vec![0u8; 4];
        v[2] = dsp;
        v[3] = bdesc.len() as u8;
        v.extend(bdesc);
        v.extend(body);
        v[0] = (v.len() - 1).min(255) as u8;
    }
    Ok(v)
}

/// MODE SELECT (6) and (10) with parameter list `p` (already cut to the CDB's length).
///
/// On a LUN whose device several gateways share, the new values are the device's
/// (`lu_shared`): set on a worker, `Some` result to poll.
pub(crate) fn mode_select(lun: &Lun, nexus: &Arc<Nexus>, cdb: &Cdb, p: &[u8]) -> CmdResult<Option<Arc<Deferred>>> {
    let ten = cdb.opcode() == op::MODE_SELECT10;
    if cdb.u8(1) & 0x01 != 0 {
        // SP: saved pages are not supported (SPC-4 6.11).
        return Err(CmdError::invalid_cdb(1, Some(0)));
    }
    let len = if ten {
        cdb.be16(7) as usize
    } else {
        cdb.u8(4) as usize
    };
    if len == 0 {
        return Ok(None); // nothing to change (SPC-4 6.11)
    }
    let hdr = if ten { 8 } else { 4 };
    if p.len() < hdr || p.len() < len {
        return Err(CmdError::param_list_length());
    }
    let p = &p[..len];
    let bdl = if ten {
        get_be16(p, 6) as usize
    } else {
        p[3] as usize
    };
    let long = ten && p[4] & 0x01 != 0;
    let mut off = hdr;
    if bdl > 0 {
        let dl = if long { 16 } else { 8 };
        if bdl != dl || p.len() < off + bdl {
            return Err(CmdError::param_list_length());
        }
        let d = &p[off..off + bdl];
        // The block descriptor may only restate the current geometry.
        let (nblk, blen) = if long {
            (get_be64(d, 0), get_be32(d, 12))
        } else {
            (get_be32(d, 0) as u64, get_be32(d, 4) & 0xFF_FFFF)
        };
        let cur = if long {
            lun.num_blocks()
        } else {
            lun.num_blocks().min(0xFFFF_FFFF)
        };
        if (nblk != 0 && nblk != cur) || blen != lun.block_size() {
            return Err(CmdError::invalid_param(off as u16, None));
        }
        off += bdl;
    }
    let cur_bits = lun.mode_bits();
    let mut new_bits = cur_bits;
    while off < p.len() {
        if p.len() < off + 2 {
            return Err(CmdError::param_list_length());
        }
        let code = p[off] & 0x3F;
        if p[off] & 0x80 != 0 {
            // PS is reserved in MODE SELECT.
            return Err(CmdError::invalid_param(off as u16, Some(7)));
        }
        if p[off] & 0x40 != 0 || !PAGES.contains(&code) {
            // Subpage format or unsupported page.
            return Err(CmdError::invalid_param(off as u16, None));
        }
        let plen = p[off + 1] as usize + 2;
        let cur = page(lun, code, Pc::Current, cur_bits);
        if plen != cur.len() {
            return Err(CmdError::invalid_param(off as u16 + 1, None));
        }
        if p.len() < off + plen {
            return Err(CmdError::param_list_length());
        }
        let got = &p[off..off + plen];
        let mask = page(lun, code, Pc::Changeable, cur_bits);
        for i in 2..plen {
            if (got[i] ^ cur[i]) & !mask[i] != 0 {
                // A field that cannot be changed differs from its current value.
                return Err(CmdError::invalid_param((off + i) as u16, None));
            }
        }
        match code {
            PAGE_CACHING => set(&mut new_bits, MODE_WCE, got[2] & 0x04 != 0),
            PAGE_CONTROL => {
                set(&mut new_bits, MODE_DSENSE, got[2] & 0x04 != 0);
                set(&mut new_bits, MODE_SWP, got[4] & 0x08 != 0);
            }
            _ => {}
        }
        off += plen;
    }
    if new_bits != cur_bits && lun.lu_shared().is_some() {
        return crate::lu_shared::set_mode(lun, nexus, new_bits).map(Some);
    }
    if new_bits != cur_bits {
        let mut st = lun.lock();
        for bit in [MODE_WCE, MODE_DSENSE, MODE_SWP] {
            lun.set_mode_bit(bit, new_bits & bit != 0);
        }
        // Other I_T nexuses learn about it (SPC-4 5.14 table: MODE PARAMETERS CHANGED).
        st.add_ua_all(Asc::MODE_PARAMETERS_CHANGED, Some(nexus.key()));
        lun.refresh_attn(&st);
    }
    Ok(None)
}

fn set(bits: &mut u32, m: u32, on: bool) {
    if on {
        *bits |= m;
    } else {
        *bits &= !m;
    }
}
