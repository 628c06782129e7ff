//! File bdevs on real files in the temp directory, through the real io_uring.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::{run_sync, BdevError, BdevIo, BdevRegistry, FileKind, IoBuf, IoKind, Lba, LbaRun, RegistryError};

/// A file in the temp directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, size: u64) -> TempFile {
        let p = std::env::temp_dir().join(format!("riser-bdev-{tag}-{}-{:?}", std::process::id(), std::thread::current().id()));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(size).unwrap();
        TempFile(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }

    /// 512-byte units allocated to the file.
    fn allocated(&self) -> u64 {
        std::fs::metadata(&self.0).unwrap().blocks()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn io(kind: IoKind, lba: u64, n: u64, buf: Option<IoBuf>, tag: u64) -> BdevIo {
    BdevIo { kind, offset_blocks: Lba::new(lba), num_blocks: n, buf, tag, fua: false }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn reads_and_writes_reach_the_file_with_fixed_and_bounced_buffers() {
    let f = TempFile::new("rw", 4 << 20);
    let mut r = BdevRegistry::new();
    r.create_file(FileKind::Uring, "U0", f.path(), None, false, None).unwrap();
    let b = r.get("U0").unwrap();
    assert_eq!(b.info().block_size, 512, "a file defaults to 512-byte blocks");
    assert_eq!(b.info().num_blocks(), 8192);
    assert!(b.info().volatile_write_cache);
    let mut ch = b.clone().open_channel();
    // A pool buffer (page-aligned: registered as a fixed buffer) ...
    let data = pattern(8192, 7);
    let c = run_sync(&mut *ch, io(IoKind::Write, 16, 16, Some(IoBuf::copy_from(&data)), 1));
    assert_eq!(c.result, Ok(()));
    // ... and an adopted vector (not aligned: bounced), with FUA.
    let data2 = pattern(1024, 99);
    let mut w = io(IoKind::Write, 40, 2, Some(IoBuf::from_vec(data2.clone())), 2);
    w.fua = true;
    assert_eq!(run_sync(&mut *ch, w).result, Ok(()));
    // The file holds the bytes (read without O_DIRECT, through the page cache).
    let on_disk = std::fs::read(&f.0).unwrap();
    assert_eq!(&on_disk[16 * 512..32 * 512], &data[..]);
    assert_eq!(&on_disk[40 * 512..42 * 512], &data2[..]);
    // Read back into a pool buffer and into an unaligned one.
    let c = run_sync(&mut *ch, io(IoKind::Read, 16, 16, Some(IoBuf::alloc(8192)), 3));
    assert_eq!(c.result, Ok(()));
    assert_eq!(c.buf.unwrap().as_slice(), &data[..]);
    let c = run_sync(&mut *ch, io(IoKind::Read, 40, 2, Some(IoBuf::from_vec(vec![0xEE; 1024])), 4));
    assert_eq!(c.buf.unwrap().as_slice(), &data2[..]);
    assert_eq!(run_sync(&mut *ch, io(IoKind::Flush, 0, 0, None, 5)).result, Ok(()));
    let st = crate::thread_ring_stats().expect("this thread has a ring");
    assert!(st.fixed_ios.load(Ordering::Relaxed) >= 2, "pool buffers go as fixed buffers");
    assert!(st.bounced.load(Ordering::Relaxed) >= 2, "unaligned buffers are bounced");
    // Out of range and a wrong buffer: errors from poll, not panics.
    let c = run_sync(&mut *ch, io(IoKind::Read, 8190, 4, Some(IoBuf::alloc(2048)), 6));
    assert!(matches!(c.result, Err(BdevError::OutOfRange { .. })), "{:?}", c.result);
    let c = run_sync(&mut *ch, io(IoKind::Write, 0, 2, Some(IoBuf::alloc(512)), 7));
    assert!(matches!(c.result, Err(BdevError::BufferSize { .. })), "{:?}", c.result);
    assert_eq!(ch.outstanding(), 0);
}

#[test]
fn many_ios_in_flight_on_two_channels_of_one_ring() {
    let f = TempFile::new("qd", 8 << 20);
    let mut r = BdevRegistry::new();
    r.create_file(FileKind::Aio, "A0", f.path(), Some(4096), false, None).unwrap();
    let b = r.get("A0").unwrap();
    let mut a = b.clone().open_channel();
    let mut c = b.clone().open_channel();
    // 1024 writes (more than the SQ holds) spread over two channels, then read them all.
    for i in 0..1024u64 {
        let ch = if i % 2 == 0 { &mut a } else { &mut c };
        ch.submit(io(IoKind::Write, i, 1, Some(IoBuf::copy_from(&pattern(4096, i as u8))), i));
    }
    let mut done = Vec::new();
    while done.len() < 1024 {
        a.poll(&mut done);
        c.poll(&mut done);
    }
    assert!(done.iter().all(|d| d.result.is_ok()));
    let mut tags: Vec<u64> = done.iter().map(|d| d.tag).collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..1024).collect::<Vec<_>>(), "each I/O completes once");
    for i in (0..1024u64).step_by(97) {
        let d = run_sync(&mut *a, io(IoKind::Read, i, 1, Some(IoBuf::alloc(4096)), 5000 + i));
        assert_eq!(d.buf.unwrap().as_slice(), &pattern(4096, i as u8)[..], "block {i}");
    }
    // A channel dropped with I/O in flight: the ring keeps the buffers until the kernel is
    // done, and the other channel goes on.
    for i in 0..64 {
        c.submit(io(IoKind::Read, i, 1, Some(IoBuf::alloc(4096)), i));
    }
    drop(c);
    let d = run_sync(&mut *a, io(IoKind::Read, 3, 1, Some(IoBuf::alloc(4096)), 9999));
    assert_eq!(d.buf.unwrap().as_slice(), &pattern(4096, 3)[..]);
}

#[test]
fn unmap_punches_holes_and_provisioning_reports_them() {
    let f = TempFile::new("unmap", 4 << 20);
    let mut r = BdevRegistry::new();
    r.create_file(FileKind::Uring, "U1", f.path(), Some(4096), false, None).unwrap();
    let b = r.get("U1").unwrap();
    assert!(b.supports(IoKind::Unmap), "ext4 punches holes");
    let mut ch = b.clone().open_channel();
    // A new sparse file: all one hole.
    assert_eq!(b.provisioning(Lba::ZERO, 1024, 16).unwrap().unwrap(), vec![LbaRun { start: Lba::ZERO, blocks: 1024, deallocated: true }]);
    // Fill 1 MiB (blocks 0..256).
    let c = run_sync(&mut *ch, io(IoKind::Write, 0, 256, Some(IoBuf::copy_from(&pattern(1 << 20, 1))), 1));
    assert_eq!(c.result, Ok(()));
    assert_eq!(run_sync(&mut *ch, io(IoKind::Flush, 0, 0, None, 2)).result, Ok(()));
    let before = f.allocated();
    assert!(before >= 2048, "1 MiB written: {before} sectors allocated");
    // Punch blocks 64..192 (512 KiB), durably.
    let mut u = io(IoKind::Unmap, 64, 128, None, 3);
    u.fua = true;
    assert_eq!(run_sync(&mut *ch, u).result, Ok(()));
    let after = f.allocated();
    assert!(after + 1024 <= before, "allocated sectors {before} -> {after}: the hole freed 512 KiB");
    let runs = b.provisioning(Lba::ZERO, 1024, 16).unwrap().unwrap();
    assert_eq!(
        runs,
        vec![
            LbaRun { start: Lba::ZERO, blocks: 64, deallocated: false },
            LbaRun { start: Lba::new(64), blocks: 128, deallocated: true },
            LbaRun { start: Lba::new(192), blocks: 64, deallocated: false },
            LbaRun { start: Lba::new(256), blocks: 768, deallocated: true },
        ]
    );
    // From the middle of a run, and capped by max_runs.
    let runs = b.provisioning(Lba::new(100), 1024, 1).unwrap().unwrap();
    assert_eq!(runs[0], LbaRun { start: Lba::new(100), blocks: 92, deallocated: true });
    assert!(runs.len() <= 2);
    // The hole reads as zeros; WriteZeroes zeroes in place.
    let c = run_sync(&mut *ch, io(IoKind::Read, 60, 8, Some(IoBuf::alloc(8 * 4096)), 4));
    let got = c.buf.unwrap();
    assert_eq!(&got[..4 * 4096], &pattern(1 << 20, 1)[60 * 4096..64 * 4096]);
    assert!(got[4 * 4096..].iter().all(|&x| x == 0));
    if b.supports(IoKind::WriteZeroes) {
        assert_eq!(run_sync(&mut *ch, io(IoKind::WriteZeroes, 0, 2, None, 5)).result, Ok(()));
        let c = run_sync(&mut *ch, io(IoKind::Read, 0, 3, Some(IoBuf::alloc(3 * 4096)), 6));
        let got = c.buf.unwrap();
        assert!(got[..2 * 4096].iter().all(|&x| x == 0));
        assert_eq!(&got[2 * 4096..], &pattern(1 << 20, 1)[2 * 4096..3 * 4096]);
    }
}

#[test]
fn rescan_takes_a_grown_file_and_refuses_to_shrink_a_claimed_one() {
    let f = TempFile::new("grow", 1 << 20);
    let mut r = BdevRegistry::new();
    r.create_file(FileKind::Uring, "G", f.path(), None, false, None).unwrap();
    let b = r.get("G").unwrap();
    let mut ch = b.clone().open_channel();
    assert_eq!(b.info().num_blocks(), 2048);
    let c = run_sync(&mut *ch, io(IoKind::Write, 2048, 1, Some(IoBuf::zeroed(512)), 1));
    assert!(matches!(c.result, Err(BdevError::OutOfRange { .. })));
    std::fs::OpenOptions::new().write(true).open(&f.0).unwrap().set_len(2 << 20).unwrap();
    assert_eq!(r.rescan("G", Some("URING bdev")), Ok(4096));
    assert_eq!(b.info().num_blocks(), 4096, "the channel's device sees the new size");
    let c = run_sync(&mut *ch, io(IoKind::Write, 4095, 1, Some(IoBuf::copy_from(&pattern(512, 3))), 2));
    assert_eq!(c.result, Ok(()));
    assert_eq!(r.rescan("G", Some("AIO disk")), Err(RegistryError::NotFound("G".into())));
    r.claim("G", "lun0").unwrap();
    std::fs::OpenOptions::new().write(true).open(&f.0).unwrap().set_len(1 << 20).unwrap();
    assert!(matches!(r.rescan("G", None), Err(RegistryError::ShrinkClaimed { old: 4096, new: 2048, .. })));
    assert_eq!(b.info().num_blocks(), 4096);
    r.release("G");
    assert_eq!(r.rescan("G", None), Ok(2048));
    r.create_malloc(Some("M"), 16, 512, None).unwrap();
    assert_eq!(r.rescan("M", None), Err(RegistryError::NotResizable("M".into())));
}

#[test]
fn bad_input_gets_clear_errors_and_creates_nothing() {
    let mut r = BdevRegistry::new();
    let missing = std::env::temp_dir().join("riser-bdev-no-such-file");
    let e = r.create_file(FileKind::Uring, "X", missing.to_str().unwrap(), None, false, None).unwrap_err();
    assert!(matches!(&e, RegistryError::File { errno, message } if *errno == -libc::ENOENT && message.contains("No such file")), "{e:?}");
    let f = TempFile::new("bad", 1 << 20);
    assert_eq!(r.create_file(FileKind::Uring, "X", f.path(), Some(1000), false, None), Err(RegistryError::BadBlockSize(1000)));
    let odd = TempFile::new("odd", (1 << 20) + 100);
    let e = r.create_file(FileKind::Aio, "X", odd.path(), None, false, None).unwrap_err();
    assert!(e.to_string().contains("not a multiple of block_size 512"), "{e}");
    let empty = TempFile::new("empty", 0);
    assert!(r.create_file(FileKind::Aio, "X", empty.path(), None, false, None).unwrap_err().to_string().contains("is empty"));
    let dir = std::env::temp_dir();
    let e = r.create_file(FileKind::Aio, "X", dir.to_str().unwrap(), None, false, None).unwrap_err();
    assert!(e.to_string().contains("neither a regular file nor a block device"), "{e}");
    assert!(matches!(r.create_file(FileKind::Uring, "bad name", f.path(), None, false, None), Err(RegistryError::BadName(_))));
    assert_eq!(r.iter().count(), 0, "nothing half-created");
    r.create_file(FileKind::Uring, "X", f.path(), None, false, None).unwrap();
    assert_eq!(r.create_file(FileKind::Aio, "X", f.path(), None, false, None), Err(RegistryError::Exists("X".into())));
    r.claim("X", "lun0").unwrap();
    assert!(matches!(r.delete("X", Some("URING bdev")), Err(RegistryError::Claimed { .. })));
    r.release("X");
    assert_eq!(r.delete("X", Some("AIO disk")), Err(RegistryError::NotFound("X".into())));
    assert_eq!(r.delete("X", Some("URING bdev")), Ok(()));
    // Read-only: writes are refused by the device, reads work.
    r.create_file(FileKind::Aio, "RO", f.path(), None, true, None).unwrap();
    let b = r.get("RO").unwrap();
    assert!(!b.supports(IoKind::Write) && !b.supports(IoKind::Unmap));
    let mut ch = b.clone().open_channel();
    let c = run_sync(&mut *ch, io(IoKind::Write, 0, 1, Some(IoBuf::zeroed(512)), 1));
    assert_eq!(c.result, Err(BdevError::Unsupported(IoKind::Write)));
    assert_eq!(run_sync(&mut *ch, io(IoKind::Read, 0, 1, Some(IoBuf::alloc(512)), 2)).result, Ok(()));
    let (method, params) = b.config_json();
    assert_eq!(method, "bdev_aio_create");
    assert_eq!(params["readonly"], true);
    assert_eq!(params["filename"], f.path());
}

/// A reactor in adaptive mode parks its thread when its pollers are idle; a completion
/// must unpark it through the ring's eventfd rather than wait out the sleep.
#[test]
fn a_completion_wakes_a_sleeping_adaptive_reactor() {
    use riser_reactor::{PollMode, PollStatus, ReactorConfig, ReactorSet};
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};

    let f = TempFile::new("wake", 64 << 20);
    let mut r = BdevRegistry::new();
    r.create_file(FileKind::Uring, "W", f.path(), Some(4096), false, None).unwrap();
    let bdev = r.get("W").unwrap();
    let set = ReactorSet::start(ReactorConfig { cores: vec![0], mode: PollMode::Adaptive, ring_size: 64, pin: false }).unwrap();
    let h = set.handle();
    let completed = Arc::new(AtomicU64::new(0));
    let wakeups = Arc::new(AtomicU64::new(0));
    let (done, woke) = (completed.clone(), wakeups.clone());
    h.call(0, move |ctx| {
        let mut ch = bdev.open_channel();
        let mut out = Vec::new();
        let mut next = 0u64;
        let mut inflight = false;
        ctx.add_poller(move |_| {
            out.clear();
            if ch.poll(&mut out) > 0 {
                assert!(out[0].result.is_ok(), "{:?}", out[0].result);
                inflight = false;
                // The wakeups first: the test reads them once it sees the completions.
                if let Some(s) = crate::thread_ring_stats() {
                    woke.store(s.wakeups.load(Ordering::Acquire), Ordering::Release);
                }
                done.fetch_add(1, Ordering::Release);
            }
            // At least 8 writes, and more (up to 64) until one has completed on a sleeping
            // reactor: a fast device may finish a write before the reactor falls asleep.
            let more = next < 8 || (next < 64 && woke.load(Ordering::Relaxed) == 0);
            if !inflight && more {
                // 16 MiB writes with FUA: slow enough for the reactor to fall asleep.
                let mut w = io(IoKind::Write, (next % 4) * 4096, 4096, Some(IoBuf::zeroed(16 << 20)), next);
                w.fua = true;
                ch.submit(w);
                next += 1;
                inflight = true;
            }
            // Idle even with I/O in flight, so that the reactor sleeps.
            PollStatus::Idle
        });
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let finished = || {
        let n = completed.load(Ordering::Acquire);
        n >= 64 || (n >= 8 && wakeups.load(Ordering::Acquire) >= 1)
    };
    while !finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(completed.load(Ordering::Acquire) >= 8, "the writes completed on a sleeping reactor");
    assert!(wakeups.load(Ordering::Acquire) >= 1, "no completion woke the reactor through the eventfd");
    set.shutdown();
}

#[test]
fn a_second_bdev_on_the_same_file_is_refused_until_the_first_is_deleted() {
    let f = TempFile::new("twice", 1 << 20);
    let mut r = BdevRegistry::new();
    r.create_file(FileKind::Uring, "F0", f.path(), None, false, None).unwrap();
    let e = r.create_file(FileKind::Aio, "F1", f.path(), None, false, None).unwrap_err();
    assert!(matches!(e, RegistryError::File { errno, .. } if errno == -libc::EBUSY), "{e}");
    assert!(e.to_string().contains("already the backing file of bdev F0"), "{e}");
    // Another name for the same inode is the same file.
    let link = PathBuf::from(format!("{}.link", f.path()));
    std::fs::hard_link(&f.0, &link).unwrap();
    let e = r.create_file(FileKind::Uring, "F1", link.to_str().unwrap(), None, false, None).unwrap_err();
    std::fs::remove_file(&link).unwrap();
    assert!(e.to_string().contains("bdev F0"), "{e}");
    assert!(r.get("F1").is_none(), "a refused create left a bdev");
    r.delete("F0", None).unwrap();
    r.create_file(FileKind::Uring, "F1", f.path(), None, false, None).unwrap();
}
