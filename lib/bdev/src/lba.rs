//! Logical block addresses.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// A logical block address: a place on a device counted in blocks from its start, never in
/// bytes. A type of its own so that an LBA is not taken for a byte offset (or for a count
/// of blocks, which stays a plain integer) on its way from a command to a device;
/// [`byte_offset`](Lba::byte_offset) is the one way from an address to bytes.
///
/// Arithmetic is address + blocks = address and address - address = blocks. `+`, `+=`
/// and `-` overflow like the integers do (a panic in debug builds): use them where the
/// range is already known to lie on the device, and the `checked_` forms on data that was
/// not checked yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lba(u64);

impl Lba {
    /// The first block of a device.
    pub const ZERO: Lba = Lba(0);

    pub const fn new(lba: u64) -> Lba {
        Lba(lba)
    }

    /// The address as the wire and the CDBs carry it.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The address `blocks` further on; `None` past the last addressable block.
    pub const fn checked_add(self, blocks: u64) -> Option<Lba> {
        match self.0.checked_add(blocks) {
            Some(v) => Some(Lba(v)),
            None => None,
        }
    }

    /// The address `blocks` further on, stopping at the last addressable block.
    pub const fn saturating_add(self, blocks: u64) -> Lba {
        Lba(self.0.saturating_add(blocks))
    }

    /// The blocks from `start` up to this address; `None` when `start` lies beyond it.
    pub const fn checked_sub(self, start: Lba) -> Option<u64> {
        self.0.checked_sub(start.0)
    }

    /// The byte offset of this block on a device of `block_size`-byte blocks; `None` when
    /// it does not fit in 64 bits.
    pub const fn byte_offset(self, block_size: u32) -> Option<u64> {
        self.0.checked_mul(block_size as u64)
    }
}

impl fmt::Display for Lba {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The address `blocks` further on.
impl Add<u64> for Lba {
    type Output = Lba;

    fn add(self, blocks: u64) -> Lba {
        Lba(self.0 + blocks)
    }
}

impl AddAssign<u64> for Lba {
    fn add_assign(&mut self, blocks: u64) {
        self.0 += blocks;
    }
}

/// The blocks from `start` up to `self`.
impl Sub for Lba {
    type Output = u64;

    fn sub(self, start: Lba) -> u64 {
        self.0 - start.0
    }
}
