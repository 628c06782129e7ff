//! The `--verify` block format, and mismatch bookkeeping.
//!
//! Every logical block written in verify mode is self-describing, so a read can tell what
//! went wrong without keeping a copy of what was written:
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | magic `RISERVFY` |
//! | 8..16 | LBA the block was written to (little-endian) |
//! | 16..24 | generation (little-endian): which run wrote it |
//! | 24..28 | CRC32C of bytes 0..24 followed by 28..block end |
//! | 28..32 | zero |
//! | 32.. | pseudo-random fill seeded by (LBA, generation) |
//!
//! A read is checked in this order: all zeros (never written, or discarded by the target),
//! no magic (someone else's data), CRC (a changed byte anywhere), LBA (a misdirected write
//! or read), generation (a stale block: an older run's data, i.e. a lost write).

use std::fmt;

pub const MAGIC: [u8; 8] = *b"RISERVFY";
/// Smallest block the format fits in (the SCSI minimum, 512, is far above it).
pub const MIN_BLOCK: usize = 64;

const CRC_AT: usize = 24;
const FILL_AT: usize = 32;

fn checksum(block: &[u8]) -> u32 {
    let c = crc32c::crc32c(&block[..CRC_AT]);
    crc32c::crc32c_append(c, &block[CRC_AT + 4..])
}

/// splitmix64: a distinct, cheap stream per (LBA, generation).
fn fill_seed(lba: u64, generation: u64) -> u64 {
    lba.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ generation.rotate_left(32) ^ 0xD1B5_4A32_D192_ED03
}

#[inline]
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Writes the verify pattern of `lba` / `generation` into one block (`block.len()` is the
/// LUN's block size, at least [`MIN_BLOCK`]).
pub fn fill_block(block: &mut [u8], lba: u64, generation: u64) {
    debug_assert!(block.len() >= MIN_BLOCK);
    block[..8].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&lba.to_le_bytes());
    block[16..24].copy_from_slice(&generation.to_le_bytes());
    block[CRC_AT..FILL_AT].fill(0);
    let mut s = fill_seed(lba, generation);
    let mut chunks = block[FILL_AT..].chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&splitmix(&mut s).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = splitmix(&mut s).to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
    let crc = checksum(block);
    block[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Fills a whole I/O buffer of consecutive blocks starting at `lba`.
pub fn fill(buf: &mut [u8], block_size: usize, lba: u64, generation: u64) {
    for (i, b) in buf.chunks_exact_mut(block_size).enumerate() {
        fill_block(b, lba + i as u64, generation);
    }
}

/// What is wrong with one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Every byte is zero: never written, or the target discards writes (a null LUN).
    Zeros,
    /// No verify header: not written by riser-perf's verify mode.
    NoMagic,
    /// The header is there but the checksum does not match: a byte changed.
    Checksum,
    /// A valid block written for another LBA.
    WrongLba { found: u64 },
    /// A valid block for this LBA from another generation.
    Generation { found: u64 },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Zeros => write!(f, "all zeros (never written, or the target drops writes)"),
            Problem::NoMagic => write!(f, "not a riser-perf verify block (no header: overwritten)"),
            Problem::Checksum => write!(f, "checksum mismatch (data corrupted)"),
            Problem::WrongLba { found } => {
                write!(f, "block of LBA {found} found here (misdirected)")
            }
            Problem::Generation { found } => {
                write!(f, "stale generation {found} (a write was lost)")
            }
        }
    }
}

/// Checks one block read from `lba`; `None` when it is exactly what generation `generation`
/// wrote there.
pub fn check_block(block: &[u8], lba: u64, generation: u64) -> Option<Problem> {
    if block.len() < MIN_BLOCK {
        return Some(Problem::NoMagic);
    }
    if block[..8] != MAGIC {
        return Some(if block.iter().all(|b| *b == 0) {
            Problem::Zeros
        } else {
            Problem::NoMagic
        });
    }
    let stored = u32::from_le_bytes([block[24], block[25], block[26], block[27]]);
    if stored != checksum(block) || block[28..32] != [0; 4] {
        return Some(Problem::Checksum);
    }
    let found_lba = u64::from_le_bytes(block[8..16].try_into().unwrap_or_default());
    if found_lba != lba {
        return Some(Problem::WrongLba { found: found_lba });
    }
    let found_gen = u64::from_le_bytes(block[16..24].try_into().unwrap_or_default());
    if found_gen != generation {
        return Some(Problem::Generation { found: found_gen });
    }
    None
}

/// A run of consecutive LBAs with the same problem (a WrongLba run continues while the
/// found LBA also advances by one; a Generation run while the found generation is equal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub lba: u64,
    pub count: u64,
    pub problem: Problem,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 1 {
            write!(f, "LBA {}: {}", self.lba, self.problem)
        } else {
            let p = match self.problem {
                Problem::WrongLba { found } => format!(
                    "blocks of LBAs {}..={} found here (misdirected)",
                    found,
                    found + self.count - 1
                ),
                p => p.to_string(),
            };
            write!(
                f,
                "LBAs {}..={} ({} blocks): {p}",
                self.lba,
                self.lba + self.count - 1,
                self.count
            )
        }
    }
}

/// Collects mismatches of one checker (one connection), coalescing runs; checked blocks
/// arrive in any order, runs are merged when they touch.
#[derive(Default, Debug)]
pub struct Mismatches {
    pub runs: Vec<Mismatch>,
    pub blocks: u64,
}

impl Mismatches {
    pub fn add(&mut self, lba: u64, problem: Problem) {
        self.blocks += 1;
        if let Some(last) = self.runs.last_mut() {
            if last.lba + last.count == lba && continues(last, problem) {
                last.count += 1;
                return;
            }
        }
        self.runs.push(Mismatch {
            lba,
            count: 1,
            problem,
        });
    }

    /// Checks a buffer of consecutive blocks read from `lba`; returns how many were bad.
    pub fn check(&mut self, buf: &[u8], block_size: usize, lba: u64, generation: u64) -> u64 {
        let mut bad = 0;
        for (i, b) in buf.chunks_exact(block_size).enumerate() {
            if let Some(p) = check_block(b, lba + i as u64, generation) {
                self.add(lba + i as u64, p);
                bad += 1;
            }
        }
        bad
    }

    /// All runs of several checkers, sorted by LBA and merged where they touch.
    pub fn merge(all: Vec<Mismatches>) -> Mismatches {
        let mut runs: Vec<Mismatch> = all.into_iter().flat_map(|m| m.runs).collect();
        runs.sort_by_key(|r| r.lba);
        let mut out = Mismatches::default();
        for r in runs {
            out.blocks += r.count;
            if let Some(last) = out.runs.last_mut() {
                if last.lba + last.count == r.lba && continues(last, r.problem) {
                    last.count += r.count;
                    continue;
                }
            }
            out.runs.push(r);
        }
        out
    }
}

fn continues(run: &Mismatch, next: Problem) -> bool {
    match (run.problem, next) {
        (Problem::WrongLba { found: a }, Problem::WrongLba { found: b }) => a + run.count == b,
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(bs: usize, lba: u64, gen: u64) -> Vec<u8> {
        let mut b = vec![0u8; bs];
        fill_block(&mut b, lba, gen);
        b
    }

    #[test]
    fn a_fresh_block_checks_clean_in_both_sizes() {
        for bs in [512usize, 520, 4096] {
            for lba in [0u64, 1, 12345, u64::MAX] {
                let b = block(bs, lba, 7);
                assert_eq!(check_block(&b, lba, 7), None, "bs {bs} lba {lba}");
            }
        }
        // The fill really differs from block to block and generation to generation.
        assert_ne!(block(512, 1, 7)[32..], block(512, 2, 7)[32..]);
        assert_ne!(block(512, 1, 7)[32..], block(512, 1, 8)[32..]);
    }

    #[test]
    fn every_changed_byte_is_detected() {
        let good = block(512, 42, 3);
        for i in 0..512 {
            let mut b = good.clone();
            b[i] ^= 0x01;
            let p = check_block(&b, 42, 3);
            assert!(p.is_some(), "flip at byte {i} went unnoticed");
            if i >= 8 {
                assert_eq!(p, Some(Problem::Checksum), "byte {i}");
            } else {
                assert_eq!(p, Some(Problem::NoMagic), "byte {i}");
            }
        }
    }

    #[test]
    fn wrong_lba_and_stale_generation() {
        let b = block(4096, 100, 5);
        assert_eq!(
            check_block(&b, 101, 5),
            Some(Problem::WrongLba { found: 100 })
        );
        assert_eq!(
            check_block(&b, 100, 6),
            Some(Problem::Generation { found: 5 })
        );
        // A valid header with a forged LBA but the old checksum is a checksum error.
        let mut f = b.clone();
        f[8..16].copy_from_slice(&101u64.to_le_bytes());
        assert_eq!(check_block(&f, 101, 5), Some(Problem::Checksum));
        assert_eq!(check_block(&vec![0u8; 512], 0, 1), Some(Problem::Zeros));
        assert_eq!(
            check_block(&vec![0xa5u8; 512], 0, 1),
            Some(Problem::NoMagic)
        );
    }

    #[test]
    fn buffers_of_blocks_and_coalesced_reports() {
        let bs = 512;
        let mut buf = vec![0u8; 8 * bs];
        fill(&mut buf, bs, 1000, 9);
        let mut m = Mismatches::default();
        assert_eq!(m.check(&buf, bs, 1000, 9), 0);
        // Corrupt blocks 2 and 3 (one run), leave 4, zero 5..8, and read as if from 1001.
        buf[2 * bs + 100] ^= 0xff;
        buf[3 * bs + 511] ^= 0xff;
        buf[5 * bs..].fill(0);
        assert_eq!(m.check(&buf, bs, 1000, 9), 5);
        assert_eq!(
            m.runs,
            vec![
                Mismatch {
                    lba: 1002,
                    count: 2,
                    problem: Problem::Checksum
                },
                Mismatch {
                    lba: 1005,
                    count: 3,
                    problem: Problem::Zeros
                },
            ]
        );
        assert_eq!(
            m.runs[0].to_string(),
            "LBAs 1002..=1003 (2 blocks): checksum mismatch (data corrupted)"
        );
        // Misdirected: the good blocks 0,1 read at LBAs 2000.. are a run of WrongLba.
        let mut m2 = Mismatches::default();
        m2.check(&buf[..2 * bs], bs, 2000, 9);
        assert_eq!(
            m2.runs,
            vec![Mismatch {
                lba: 2000,
                count: 2,
                problem: Problem::WrongLba { found: 1000 }
            }]
        );
        assert!(m2.runs[0]
            .to_string()
            .contains("LBAs 1000..=1001 found here"));
        let one = Mismatch {
            lba: 7,
            count: 1,
            problem: Problem::Generation { found: 2 },
        };
        assert_eq!(
            one.to_string(),
            "LBA 7: stale generation 2 (a write was lost)"
        );
        // Merging across checkers sorts and joins touching runs.
        let mut a = Mismatches::default();
        a.add(10, Problem::Checksum);
        let mut b = Mismatches::default();
        b.add(11, Problem::Checksum);
        b.add(3, Problem::Zeros);
        let all = Mismatches::merge(vec![a, b]);
        assert_eq!(all.blocks, 3);
        assert_eq!(
            all.runs,
            vec![
                Mismatch {
                    lba: 3,
                    count: 1,
                    problem: Problem::Zeros
                },
                Mismatch {
                    lba: 10,
                    count: 2,
                    problem: Problem::Checksum
                },
            ]
        );
    }
}
