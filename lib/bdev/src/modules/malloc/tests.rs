//! Tests of the malloc device's growth in extents: I/O across extents, zeroes after a
//! shrink and regrowth, the memory check and the growth limit.

use std::sync::Arc;

use super::*;
use crate::{run_sync, BdevIo, IoBuf};

fn io(kind: IoKind, off: u64, n: u64, buf: Option<Vec<u8>>, tag: u64) -> BdevIo {
    BdevIo { kind, offset_blocks: Lba::new(off), num_blocks: n, buf: buf.map(IoBuf::from), tag, fua: false }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn grown_device_keeps_data_and_serves_io_across_extents() {
    let m = Arc::new(MallocBdev::new("M", 16, 512, None).unwrap());
    let mut ch = m.clone().open_channel();
    let a = pattern(1, 8 * 512);
    assert_eq!(run_sync(&mut *ch, io(IoKind::Write, 8, 8, Some(a.clone()), 1)).result, Ok(()));
    // Past the end: refused before the growth.
    let c = run_sync(&mut *ch, io(IoKind::Write, 16, 1, Some(vec![1; 512]), 2));
    assert!(matches!(c.result, Err(BdevError::OutOfRange { .. })), "{:?}", c.result);

    m.resize(40).unwrap();
    assert_eq!(m.info().num_blocks(), 40);
    m.resize(64).unwrap();
    assert_eq!(m.extents.iter().filter(|e| e.get().is_some()).count(), 3);
    // One write over all three extents (blocks 8..48), read back whole and in parts.
    let b = pattern(2, 40 * 512);
    assert_eq!(run_sync(&mut *ch, io(IoKind::Write, 8, 40, Some(b.clone()), 3)).result, Ok(()));
    let c = run_sync(&mut *ch, io(IoKind::Read, 0, 64, Some(vec![0xAA; 64 * 512]), 4));
    assert_eq!(c.result, Ok(()));
    let got = c.buf.unwrap();
    assert!(got.as_slice()[..8 * 512].iter().all(|&x| x == 0));
    assert_eq!(&got.as_slice()[8 * 512..48 * 512], &b[..]);
    assert!(got.as_slice()[48 * 512..].iter().all(|&x| x == 0), "grown blocks read zeroes");
    // Zeroing across extents; provisioning sees the runs across them too.
    assert_eq!(run_sync(&mut *ch, io(IoKind::WriteZeroes, 12, 30, None, 5)).result, Ok(()));
    let runs = m.provisioning(Lba::new(0), 64, 16).unwrap().unwrap();
    let shape: Vec<(u64, u64, bool)> = runs.iter().map(|r| (r.start.get(), r.blocks, r.deallocated)).collect();
    assert_eq!(shape, [(0, 8, true), (8, 4, false), (12, 30, true), (42, 6, false), (48, 16, true)]);
}

#[test]
fn shrink_hides_blocks_and_regrowth_shows_zeroes() {
    let m = Arc::new(MallocBdev::new("M", 32, 512, None).unwrap());
    let mut ch = m.clone().open_channel();
    assert_eq!(run_sync(&mut *ch, io(IoKind::Write, 20, 4, Some(pattern(3, 2048)), 1)).result, Ok(()));
    assert_eq!(run_sync(&mut *ch, io(IoKind::Write, 4, 1, Some(pattern(4, 512)), 2)).result, Ok(()));
    m.resize(16).unwrap();
    let c = run_sync(&mut *ch, io(IoKind::Read, 20, 1, Some(vec![0; 512]), 3));
    assert!(matches!(c.result, Err(BdevError::OutOfRange { .. })), "{:?}", c.result);
    // Growing again within the memory kept: no new extent, the old data is gone.
    m.resize(32).unwrap();
    assert_eq!(m.extents.iter().filter(|e| e.get().is_some()).count(), 1);
    let c = run_sync(&mut *ch, io(IoKind::Read, 16, 16, Some(vec![0xAA; 16 * 512]), 4));
    assert!(c.buf.unwrap().as_slice().iter().all(|&x| x == 0), "blocks hidden by the shrink come back zeroed");
    let c = run_sync(&mut *ch, io(IoKind::Read, 4, 1, Some(vec![0; 512]), 5));
    assert_eq!(c.buf.unwrap().as_slice(), &pattern(4, 512)[..], "blocks below the shrink keep their data");
}

#[test]
fn growth_beyond_memory_or_extents_is_refused_and_changes_nothing() {
    let m = MallocBdev::new("M", 8, 4096, None).unwrap();
    let e = m.resize(u64::MAX / 4096).unwrap_err();
    assert!(matches!(&e, RegistryError::NoMemory(s) if s.contains("growing malloc bdev M")), "{e}");
    let e = m.resize(u64::MAX).unwrap_err();
    assert!(matches!(&e, RegistryError::NoMemory(s) if s.contains("cannot be addressed")), "{e}");
    assert_eq!(m.info().num_blocks(), 8);
    for n in 1..MAX_EXTENTS as u64 {
        m.resize(8 + n).unwrap();
    }
    let e = m.resize(1000).unwrap_err();
    assert!(e.to_string().contains("has grown 31 times"), "{e}");
    assert_eq!(m.info().num_blocks(), 8 + MAX_EXTENTS as u64 - 1);
    // Within the memory it has, it still shrinks and grows.
    m.resize(4).unwrap();
    m.resize(8 + MAX_EXTENTS as u64 - 1).unwrap();
}
