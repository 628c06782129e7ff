//! Sequence numbers and task tags.
//!
//! CmdSN, StatSN, ExpCmdSN, MaxCmdSN, DataSN and R2TSN are 32-bit serial numbers compared
//! with RFC 1982 arithmetic (RFC 7143 §4.2.2.1): they wrap, so `a < b` only means
//! "b is less than 2^31 ahead of a". [`Sn`] deliberately does not implement `PartialOrd`:
//! the relation is not transitive across the whole space, and a derived `<` would be wrong
//! exactly at the wrap.
//!
//! The Initiator Task Tag and the Target Transfer Tag are opaque 32-bit values that live in
//! neighbouring BHS fields; [`Itt`] and [`Ttt`] keep them from being swapped.

use std::fmt;

/// The tag hasher and map of riser-scsi's task protocol (one multiply per lookup).
pub use riser_scsi::task::{TagHasher, TagMap};

/// Half of the 32-bit serial number space (RFC 1982 §3.2: 2^(SERIAL_BITS - 1)).
const HALF: u32 = 1 << 31;

/// A 32-bit serial number (CmdSN, StatSN, ExpCmdSN, MaxCmdSN, ExpStatSN, DataSN, R2TSN).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sn(pub u32);

impl Sn {
    pub const fn new(v: u32) -> Self {
        Sn(v)
    }

    pub const fn get(self) -> u32 {
        self.0
    }

    /// RFC 1982 §3.1 addition; `n` must be below 2^31 to be meaningful, larger values wrap.
    #[must_use]
    pub const fn add(self, n: u32) -> Sn {
        Sn(self.0.wrapping_add(n))
    }

    /// The next serial number (`self + 1`).
    #[must_use]
    pub const fn next(self) -> Sn {
        self.add(1)
    }

    /// How far `later` is ahead of `self`, modulo 2^32 (`later - self`).
    pub const fn distance_to(self, later: Sn) -> u32 {
        later.0.wrapping_sub(self.0)
    }

    /// RFC 1982 §3.2 "less than". Values exactly 2^31 apart are neither lt nor gt.
    pub const fn lt(self, other: Sn) -> bool {
        let d = other.0.wrapping_sub(self.0);
        d != 0 && d < HALF
    }

    /// RFC 1982 §3.2 "greater than".
    pub const fn gt(self, other: Sn) -> bool {
        other.lt(self)
    }

    pub const fn le(self, other: Sn) -> bool {
        self.0 == other.0 || self.lt(other)
    }

    pub const fn ge(self, other: Sn) -> bool {
        self.0 == other.0 || self.gt(other)
    }

    /// `lo <= self <= hi` in serial arithmetic: the CmdSN window check of RFC 7143 §4.2.2.1
    /// (a CmdSN outside [ExpCmdSN, MaxCmdSN] is silently dropped). An empty window
    /// (MaxCmdSN = ExpCmdSN - 1) contains nothing.
    pub const fn in_window(self, lo: Sn, hi: Sn) -> bool {
        lo.le(self) && self.le(hi)
    }
}

impl fmt::Debug for Sn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sn({})", self.0)
    }
}

impl fmt::Display for Sn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<u32> for Sn {
    fn from(v: u32) -> Self {
        Sn(v)
    }
}

/// The value 0xffffffff, reserved for tags that name no task (RFC 7143 §11.18.2, §11.19.2).
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Initiator Task Tag (RFC 7143 §11.2.1.8): chosen by the initiator, echoed by the target.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Itt(pub u32);

/// Target Transfer Tag (RFC 7143 §11.7.4, §11.8.3): chosen by the target, echoed by the
/// initiator on Data-Out and NOP-Out.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ttt(pub u32);

impl Itt {
    /// 0xffffffff: no task (unsolicited NOP-In, Async Message, Reject).
    pub const RESERVED: Itt = Itt(RESERVED_TAG);

    pub const fn is_reserved(self) -> bool {
        self.0 == RESERVED_TAG
    }
}

impl Ttt {
    /// 0xffffffff: no transfer (unsolicited Data-Out, NOP-Out that wants no NOP-In ping).
    pub const RESERVED: Ttt = Ttt(RESERVED_TAG);

    pub const fn is_reserved(self) -> bool {
        self.0 == RESERVED_TAG
    }
}

impl fmt::Debug for Itt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Itt({:#x})", self.0)
    }
}

impl fmt::Debug for Ttt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ttt({:#x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_without_wrap() {
        assert!(Sn(1).lt(Sn(2)));
        assert!(Sn(2).gt(Sn(1)));
        assert!(!Sn(2).lt(Sn(2)));
        assert!(Sn(2).le(Sn(2)) && Sn(2).ge(Sn(2)));
    }

    #[test]
    fn ordering_across_wrap() {
        let top = Sn(u32::MAX);
        assert!(top.lt(Sn(0)));
        assert!(top.lt(Sn(5)));
        assert!(Sn(5).gt(top));
        assert_eq!(top.next(), Sn(0));
        assert_eq!(top.distance_to(Sn(4)), 5);
    }

    #[test]
    fn half_space_is_undefined() {
        // RFC 1982 §3.2: exactly 2^31 apart is neither less nor greater.
        let a = Sn(10);
        let b = a.add(HALF);
        assert!(!a.lt(b) && !a.gt(b) && !b.lt(a) && !b.gt(a));
        assert!(a.lt(a.add(HALF - 1)));
    }

    #[test]
    fn window() {
        assert!(Sn(5).in_window(Sn(5), Sn(10)));
        assert!(Sn(10).in_window(Sn(5), Sn(10)));
        assert!(!Sn(11).in_window(Sn(5), Sn(10)));
        assert!(!Sn(4).in_window(Sn(5), Sn(10)));
        // window straddling the wrap
        assert!(Sn(1).in_window(Sn(u32::MAX - 1), Sn(3)));
        assert!(!Sn(4).in_window(Sn(u32::MAX - 1), Sn(3)));
        // empty window: MaxCmdSN = ExpCmdSN - 1
        assert!(!Sn(5).in_window(Sn(5), Sn(4)));
    }

    #[test]
    fn tags() {
        assert!(Itt::RESERVED.is_reserved());
        assert!(!Ttt(1).is_reserved());
    }
}

