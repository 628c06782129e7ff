//! What both load generators share about the I/Os they issue: the access pattern
//! (`--rw`, `--rwmixread`), the polling mode, and the generator that picks the direction
//! and place of every I/O.

use clap::ValueEnum;
use serde::Serialize;

use riser_initiator::scsi::Dir;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
/// The access pattern of a run (`--rw`), in both modes.
pub enum Workload {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Uniformly random reads.
    Randread,
    /// Uniformly random writes.
    Randwrite,
    /// Sequential, reads and writes mixed per --rwmixread.
    Rw,
    /// Random, reads and writes mixed per --rwmixread.
    Randrw,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::Randread => "randread",
            Workload::Randwrite => "randwrite",
            Workload::Rw => "rw",
            Workload::Randrw => "randrw",
        }
    }

    pub fn random(self) -> bool {
        matches!(
            self,
            Workload::Randread | Workload::Randwrite | Workload::Randrw
        )
    }

    /// Percentage of reads this workload issues, given `--rwmixread`.
    pub fn read_pct(self, rwmixread: u8) -> u8 {
        match self {
            Workload::Read | Workload::Randread => 100,
            Workload::Write | Workload::Randwrite => 0,
            Workload::Rw | Workload::Randrw => rwmixread,
        }
    }

    /// Whether reads and writes are mixed (per --rwmixread).
    pub fn mixed(self) -> bool {
        matches!(self, Workload::Rw | Workload::Randrw)
    }
}

/// `--poll-mode`, in both modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PollModeArg {
    /// Spin: lowest latency, each core at 100 %.
    Busy,
    /// Sleep after a run of idle loops (small or shared machines, CI).
    Adaptive,
}

/// xorshift64*: a few instructions per number and plenty good for picking offsets.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Spread small seeds (reactor ids) over all bits (splitmix64 finalizer); the state
        // must never be zero or xorshift stays at zero forever.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(if z == 0 { 0x2545_F491_4F6C_DD1D } else { z })
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0) by multiply-and-shift: no division, bias below 2^-32 for
    /// any device size that fits in memory.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Picks the direction and place of every I/O of one worker (a bdev reactor, an initiator
/// session): places are I/O-sized units of a range, uniformly random or sequential.
#[derive(Clone, Debug)]
pub struct OpGen {
    rng: Rng,
    units: u64,
    random: bool,
    next_seq: u64,
    read_pct: u8,
}

impl OpGen {
    /// For worker `index` of `count` over `units` places (at least one is used): sequential
    /// streams start spread over the range, so that workers do not all touch the same
    /// blocks at the same time.
    pub fn new(
        workload: Workload,
        read_pct: u8,
        units: u64,
        index: u64,
        count: u64,
        seed: u64,
    ) -> OpGen {
        let units = units.max(1);
        OpGen {
            rng: Rng::new(seed),
            units,
            random: workload.random(),
            next_seq: (units as u128 * index as u128 / count.max(1) as u128) as u64,
            read_pct,
        }
    }

    /// The next I/O: (direction, unit).
    #[inline]
    // Endless: an Iterator would only wrap every I/O in Some.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> (Dir, u64) {
        let dir = match self.read_pct {
            100 => Dir::Read,
            0 => Dir::Write,
            p => {
                if self.rng.below(100) < p as u64 {
                    Dir::Read
                } else {
                    Dir::Write
                }
            }
        };
        let u = if self.random {
            self.rng.below(self.units)
        } else {
            let s = self.next_seq;
            self.next_seq = if s + 1 == self.units { 0 } else { s + 1 };
            s
        };
        (dir, u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_below_is_roughly_uniform() {
        let mut r = Rng::new(7);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            buckets[r.below(10) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&b| (9_000..11_000).contains(&b)),
            "{buckets:?}"
        );
        assert_ne!(Rng::new(0).next_u64(), Rng::new(1).next_u64());
    }

    #[test]
    fn opgen_sequential_and_mixed() {
        let mut g = OpGen::new(Workload::Read, 100, 10, 1, 2, 0);
        let u: Vec<u64> = (0..7).map(|_| g.next().1).collect();
        assert_eq!(u, vec![5, 6, 7, 8, 9, 0, 1]);
        let mut g = OpGen::new(Workload::Randrw, 70, 1 << 20, 0, 1, 3);
        let reads = (0..100_000).filter(|_| g.next().0 == Dir::Read).count();
        assert!((69_000..71_000).contains(&reads), "{reads}");
        let mut g = OpGen::new(Workload::Randwrite, 0, 5, 0, 1, 3);
        assert!((0..1000).all(|_| {
            let (d, u) = g.next();
            d == Dir::Write && u < 5
        }));
    }
}
