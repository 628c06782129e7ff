//! SANITIZE (SBC-3 4.11 "Sanitize operations" and the SANITIZE command): decoding and
//! validation of the CDB and the OVERWRITE parameter list, the logical unit's sanitize
//! state, and the data a sanitize writes. The executor (`exec.rs`) runs the operation as a
//! job over the whole medium.
//!
//! What each service action does on riser's devices:
//! * BLOCK ERASE (02h): every block is deallocated (UNMAP). The device reads deallocated
//!   blocks as zeros (LBPRZ), so nothing of the old data can be read back; offered only
//!   on thin-provisioned LUNs (a device without unmap cannot deallocate).
//! * CRYPTOGRAPHIC ERASE (03h): riser devices have no media encryption key to change, so
//!   the effect the command exists for (SBC-3 4.11: the old user data can no longer be
//!   read) is produced directly: every block is overwritten with unpredictable data, which
//!   is what reads return afterwards, as they would after a key change.
//! * OVERWRITE (01h): the initialization pattern is written to every block, OVERWRITE
//!   COUNT times (inverted on alternate passes with INVERT). Offered only when
//!   [`LunConfig::sanitize_overwrite`](crate::LunConfig::sanitize_overwrite) is set.
//! * EXIT FAILURE MODE (1Fh): leaves the failure mode a failed sanitize left behind, if
//!   that SANITIZE had AUSE set; without a failed sanitize it has no effect.
//!
//! While the operation runs only INQUIRY, REPORT LUNS and REQUEST SENSE are processed;
//! everything else gets NOT READY, SANITIZE IN PROGRESS with the progress made. Aborts,
//! resets and the loss of the I_T nexus that started it do not stop it (SBC-3 4.11): the
//! command (if not IMMED) reports the outcome, otherwise the operation just goes on. If
//! it fails, medium access commands get MEDIUM ERROR, SANITIZE COMMAND FAILED until a
//! sanitize completes (or EXIT FAILURE MODE, when AUSE allowed it).

use riser_bdev::Lba;

use crate::cdb::{get_be16, op, Cdb};
use crate::lun::Lun;
use crate::opcodes::F_MEDIUM;
use crate::sense::{CmdError, CmdResult};

/// SANITIZE service actions.
pub(crate) const SA_OVERWRITE: u8 = 0x01;
pub(crate) const SA_BLOCK_ERASE: u8 = 0x02;
pub(crate) const SA_CRYPTO_ERASE: u8 = 0x03;
pub(crate) const SA_EXIT_FAILURE_MODE: u8 = 0x1F;

/// Bytes written per bdev I/O by an overwrite or a cryptographic erase.
pub(crate) const SANITIZE_WRITE_CHUNK_BYTES: u64 = 1 << 20;
/// Bytes deallocated per bdev I/O by a block erase (a RAM device zeroes them in place:
/// bounded so that one I/O does not hold a reactor for long).
pub(crate) const SANITIZE_UNMAP_CHUNK_BYTES: u64 = 16 << 20;

/// The work of one sanitize operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SanitizeOp {
    BlockErase,
    CryptoErase,
    /// `pattern` is one logical block: the initialization pattern repeated from the start
    /// of the block.
    Overwrite {
        pattern: Vec<u8>,
        invert: bool,
        passes: u8,
    },
}

impl SanitizeOp {
    pub fn passes(&self) -> u8 {
        match self {
            SanitizeOp::Overwrite { passes, .. } => *passes,
            _ => 1,
        }
    }
}

/// The logical unit's sanitize state (behind the LUN lock).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum SanitizeState {
    #[default]
    Idle,
    /// An operation is in progress; `pass` and `next` say how far it got (blocks before
    /// `next` of pass `pass` are done). `owned` is false while no executor drives it (the
    /// one that did went away): the next executor that polls takes it over.
    Running {
        op: SanitizeOp,
        ause: bool,
        pass: u8,
        next: Lba,
        owned: bool,
    },
    /// The last operation failed; `ause` is the AUSE bit of its SANITIZE command.
    Failed { ause: bool },
}

impl SanitizeState {
    pub fn active(&self) -> bool {
        !matches!(self, SanitizeState::Idle)
    }

    /// PROGRESS INDICATION of a running operation: the fraction done in 1/65536ths.
    pub fn progress(&self, num_blocks: u64) -> u16 {
        match self {
            SanitizeState::Running { op, pass, next, .. } => {
                let total = op.passes() as u128 * num_blocks.max(1) as u128;
                let done = *pass as u128 * num_blocks as u128 + next.get() as u128;
                ((done * 65536) / total).min(65535) as u16
            }
            _ => 0,
        }
    }
}

/// Whether a command may run in the current sanitize state (SBC-3 4.11).
pub(crate) fn gate(st: &SanitizeState, num_blocks: u64, opcode: u8, flags: u8) -> CmdResult<()> {
    match st {
        SanitizeState::Idle => Ok(()),
        SanitizeState::Running { .. } => match opcode {
            // The commands a device server processes during a sanitize operation; REQUEST
            // SENSE reports the progress itself.
            op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE => Ok(()),
            _ => Err(CmdError::sanitize_in_progress(st.progress(num_blocks))),
        },
        SanitizeState::Failed { .. } => {
            // A new SANITIZE (or EXIT FAILURE MODE) is how the failure mode is left;
            // commands that do not touch the medium are not affected.
            if opcode != op::SANITIZE && flags & F_MEDIUM != 0 {
                Err(CmdError::sanitize_failed())
            } else {
                Ok(())
            }
        }
    }
}

/// A decoded SANITIZE command.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    ExitFailureMode,
    Start {
        op: SanitizeOp,
        immed: bool,
        ause: bool,
    },
}

/// Decodes and validates a SANITIZE CDB and its parameter list (`p`, already cut to the
/// PARAMETER LIST LENGTH and to what arrived).
pub(crate) fn parse(lun: &Lun, cdb: &Cdb, p: &[u8]) -> CmdResult<Request> {
    let b1 = cdb.u8(1);
    let immed = b1 & 0x80 != 0;
    let ause = b1 & 0x20 != 0;
    let sa = b1 & 0x1F;
    if b1 & 0x40 != 0 {
        // Bit 6 is reserved in SBC-3 (ZNR in SBC-4 applies to zoned devices only).
        return Err(CmdError::invalid_cdb(1, Some(6)));
    }
    for i in 2..=6 {
        // Bytes 2..6 are reserved.
        if cdb.u8(i) != 0 {
            return Err(CmdError::invalid_cdb(i as u16, None));
        }
    }
    let len = cdb.be16(7) as usize;
    let op = match sa {
        SA_EXIT_FAILURE_MODE | SA_BLOCK_ERASE | SA_CRYPTO_ERASE => {
            // These service actions take no parameter list: the length must be zero.
            if len != 0 {
                return Err(CmdError::invalid_cdb(7, None));
            }
            match sa {
                SA_EXIT_FAILURE_MODE => return Ok(Request::ExitFailureMode),
                SA_BLOCK_ERASE if !lun.thin_provisioned() => {
                    // Without deallocation there is no block erase: not offered on this
                    // LU (REPORT SUPPORTED OPERATION CODES does not list it either).
                    return Err(CmdError::invalid_cdb(1, Some(4)));
                }
                SA_BLOCK_ERASE => SanitizeOp::BlockErase,
                _ => SanitizeOp::CryptoErase,
            }
        }
        SA_OVERWRITE if lun.config().sanitize_overwrite => overwrite_params(lun, len, p)?,
        _ => return Err(CmdError::invalid_cdb(1, Some(4))),
    };
    Ok(Request::Start { op, immed, ause })
}

/// The OVERWRITE parameter list (SBC-3, SANITIZE command: INVERT, TEST, OVERWRITE COUNT,
/// INITIALIZATION PATTERN LENGTH, INITIALIZATION PATTERN).
fn overwrite_params(lun: &Lun, len: usize, p: &[u8]) -> CmdResult<SanitizeOp> {
    let bs = lun.block_size() as usize;
    // The list holds a 4-byte header and a pattern of 1..=block size bytes: any other
    // PARAMETER LIST LENGTH cannot be a valid list.
    if len < 5 || len > bs + 4 {
        return Err(CmdError::invalid_cdb(7, None));
    }
    if p.len() < len {
        return Err(CmdError::param_list_length());
    }
    let invert = p[0] & 0x80 != 0;
    let test = (p[0] >> 5) & 0x03;
    let passes = p[0] & 0x1F;
    let ipl = get_be16(p, 2) as usize;
    if test != 0 {
        // TEST is for vendor-specific test modes; riser has none.
        return Err(CmdError::invalid_param(0, Some(5)));
    }
    if passes == 0 {
        return Err(CmdError::invalid_param(0, Some(0)));
    }
    if ipl == 0 || ipl > bs || ipl + 4 > len {
        return Err(CmdError::invalid_param(2, None));
    }
    let pat = &p[4..4 + ipl];
    let pattern: Vec<u8> = pat.iter().copied().cycle().take(bs).collect();
    Ok(SanitizeOp::Overwrite {
        pattern,
        invert,
        passes,
    })
}

/// A small, fast generator of unpredictable bytes for the cryptographic erase
/// (splitmix64), seeded from the process's random hash keys and the clock.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new() -> Rng {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        h.write_u64(now);
        Rng(h.finish())
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_ne_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next().to_ne_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// Fills `buf` (whole blocks) with the overwrite pattern of pass `pass` (SBC-3: with
/// INVERT the pattern is inverted between consecutive passes).
pub(crate) fn fill_overwrite(buf: &mut [u8], pattern: &[u8], invert: bool, pass: u8) {
    let flip = invert && pass % 2 == 1;
    for blk in buf.chunks_mut(pattern.len().max(1)) {
        for (d, s) in blk.iter_mut().zip(pattern) {
            *d = if flip { !*s } else { *s };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_passes() {
        let op = SanitizeOp::Overwrite {
            pattern: vec![0; 512],
            invert: false,
            passes: 2,
        };
        let st = |pass, next| SanitizeState::Running {
            op: op.clone(),
            ause: false,
            pass,
            next: Lba::new(next),
            owned: true,
        };
        assert_eq!(st(0, 0).progress(100), 0);
        assert_eq!(st(0, 50).progress(100), 16384);
        assert_eq!(st(1, 0).progress(100), 32768);
        assert_eq!(st(1, 100).progress(100), 65535);
        assert_eq!(SanitizeState::Idle.progress(100), 0);
    }

    #[test]
    fn overwrite_fill_inverts_alternate_passes() {
        let mut b = vec![0u8; 8];
        fill_overwrite(&mut b, &[1, 2, 3, 4], true, 0);
        assert_eq!(b, [1, 2, 3, 4, 1, 2, 3, 4]);
        fill_overwrite(&mut b, &[1, 2, 3, 4], true, 1);
        assert_eq!(b, [!1, !2, !3, !4, !1, !2, !3, !4]);
        fill_overwrite(&mut b, &[1, 2, 3, 4], false, 1);
        assert_eq!(b, [1, 2, 3, 4, 1, 2, 3, 4]);
    }

    #[test]
    fn rng_fills_odd_lengths() {
        let mut r = Rng::new();
        let mut a = vec![0u8; 13];
        r.fill(&mut a);
        let mut b = vec![0u8; 13];
        r.fill(&mut b);
        assert_ne!(a, b);
    }
}
