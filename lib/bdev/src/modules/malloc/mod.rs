//! The malloc device: data kept in RAM.
//!
//! The bytes live in `AtomicU64` words accessed with relaxed loads and stores: channels on
//! several reactors may touch the same blocks at once (SCSI gives overlapping commands no
//! order), and atomics make that well defined without locks or `unsafe`.
//!
//! The words sit in extents: the one allocated at creation and one more per growth
//! (`bdev_malloc_resize`), each published once (`OnceLock`) before the size that exposes it,
//! so I/O on other reactors never waits for a resize and never sees memory move.

pub(crate) mod rpc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use uuid::Uuid;

use crate::io::{validate, BdevError, BdevInfo, BdevIo, DoneQueue, IoChannel, IoCompletion, IoKind};
use crate::{Bdev, Lba, LbaRun, RegistryError};

/// `bdev_get_bdevs`' product_name of malloc devices.
pub const PRODUCT: &str = "Malloc disk";

/// Most extents a malloc device has: the one made at creation and up to 31 growths.
pub const MAX_EXTENTS: usize = 32;

/// Words `[start, start + words.len())` of the device.
struct Extent {
    start: usize,
    words: Box<[AtomicU64]>,
}

pub struct MallocBdev {
    info: BdevInfo,
    /// Filled in order, never emptied: word `w` lives in the extent whose range holds it.
    extents: [OnceLock<Extent>; MAX_EXTENTS],
    /// Serializes resizes (the registry's lock does too; this keeps the type sound alone).
    resizing: Mutex<()>,
}

/// The memory the machine has available now (`MemAvailable`), when Linux says.
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = s.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// `n` zeroed words, or why not: more than the machine has available (a device must not be
/// allowed to take the memory the rest of riser needs, nor get the process killed when its
/// pages are touched), or an allocation that fails.
fn alloc_words(n: usize, what: &str) -> Result<Box<[AtomicU64]>, String> {
    let bytes = (n as u64).saturating_mul(8);
    if let Some(avail) = mem_available().filter(|&a| bytes > a) {
        return Err(format!("{what}: {bytes} bytes of memory are needed, {avail} are available"));
    }
    let mut v: Vec<AtomicU64> = Vec::new();
    v.try_reserve_exact(n).map_err(|_| format!("{what}: cannot allocate {bytes} bytes of memory"))?;
    v.resize_with(n, || AtomicU64::new(0));
    Ok(v.into_boxed_slice())
}

/// Words of `num_blocks` blocks of `block_size` bytes.
fn words_of(num_blocks: u64, block_size: u32) -> Option<usize> {
    usize::try_from(num_blocks.checked_mul(block_size as u64)? / 8).ok()
}

impl MallocBdev {
    /// Allocates `num_blocks * block_size` bytes of zeroed memory; a clear error if the
    /// machine cannot provide it.
    pub fn new(
        name: &str,
        num_blocks: u64,
        block_size: u32,
        uuid: Option<Uuid>,
    ) -> Result<MallocBdev, BdevError> {
        let n = words_of(num_blocks, block_size).ok_or_else(|| BdevError::Io("size too large".into()))?;
        let words = alloc_words(n, &format!("malloc bdev {name}")).map_err(BdevError::Io)?;
        let extents: [OnceLock<Extent>; MAX_EXTENTS] = std::array::from_fn(|_| OnceLock::new());
        let _ = extents[0].set(Extent { start: 0, words });
        Ok(MallocBdev {
            info: BdevInfo::new(name, PRODUCT, block_size, num_blocks, uuid.unwrap_or_else(Uuid::new_v4)),
            extents,
            resizing: Mutex::new(()),
        })
    }

    /// Sets the physical block size (validated by the registry).
    pub fn with_physical_block_size(mut self, pbs: u32) -> Self {
        self.info.physical_block_size = pbs;
        self
    }

    /// The extents allocated so far, in order.
    fn allocated(&self) -> impl Iterator<Item = &Extent> {
        self.extents.iter().map_while(OnceLock::get)
    }

    /// Words allocated (the device may show fewer after a shrink).
    fn capacity_words(&self) -> usize {
        self.allocated().last().map_or(0, |e| e.start + e.words.len())
    }

    /// Calls `f(offset, words)` for the pieces of words `[start, end)` in order (`offset`:
    /// of the piece from `start`, in words). Nothing is called unless all of them are
    /// allocated.
    fn for_words(&self, start: usize, end: usize, mut f: impl FnMut(usize, &[AtomicU64])) -> bool {
        if end > self.capacity_words() {
            return false;
        }
        let mut at = start;
        for e in self.allocated() {
            let e_end = e.start + e.words.len();
            if at >= end {
                break;
            }
            if at >= e_end {
                continue;
            }
            let to = end.min(e_end);
            f(at - start, &e.words[at - e.start..to - e.start]);
            at = to;
        }
        true
    }

    /// [`for_words`](Self::for_words) over blocks `[lba, lba + num_blocks)`. [`validate`]
    /// has checked the range; an address whose bytes do not fit (which it cannot pass) is
    /// out of range here too, not a panic.
    fn for_blocks(&self, lba: Lba, num_blocks: u64, f: impl FnMut(usize, &[AtomicU64])) -> Result<(), BdevError> {
        let bs = self.info.block_size;
        let range = lba.byte_offset(bs).zip(num_blocks.checked_mul(bs as u64)).and_then(|(start, len)| {
            let start = usize::try_from(start / 8).ok()?;
            Some((start, start.checked_add(usize::try_from(len / 8).ok()?)?))
        });
        match range {
            Some((start, end)) if self.for_words(start, end, f) => Ok(()),
            _ => Err(BdevError::OutOfRange { offset: lba, num: num_blocks, capacity: self.info.num_blocks() }),
        }
    }

    fn read_into(&self, lba: Lba, buf: &mut [u8]) -> Result<(), BdevError> {
        self.for_blocks(lba, buf.len() as u64 / self.info.block_size as u64, |off, words| {
            for (w, out) in words.iter().zip(buf[off * 8..].chunks_exact_mut(8)) {
                out.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
        })
    }

    fn write_from(&self, lba: Lba, buf: &[u8]) -> Result<(), BdevError> {
        self.for_blocks(lba, buf.len() as u64 / self.info.block_size as u64, |off, words| {
            for (w, chunk) in words.iter().zip(buf[off * 8..].chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(chunk);
                w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
            }
        })
    }

    fn zero(&self, lba: Lba, num_blocks: u64) -> Result<(), BdevError> {
        self.for_blocks(lba, num_blocks, |_, words| words.iter().for_each(|w| w.store(0, Ordering::Relaxed)))
    }

    /// Grows or shrinks the device to `num_blocks` (`bdev_malloc_resize`; the registry
    /// refuses shrinking a claimed device and a size of 0). Growing allocates the new blocks,
    /// zeroed, as one more extent, or fails with a clear error (nothing changed) when the
    /// machine does not have the memory or the device has grown [`MAX_EXTENTS`] - 1 times;
    /// shrinking keeps the memory (given back when the device is deleted), and blocks a later
    /// growth shows again read zeroes.
    pub fn resize(&self, num_blocks: u64) -> Result<(), RegistryError> {
        let _one = self.resizing.lock().unwrap_or_else(|p| p.into_inner());
        let name = &self.info.name;
        let bs = self.info.block_size;
        let old = self.info.num_blocks();
        let too_large = || RegistryError::NoMemory(format!("malloc bdev {name}: {num_blocks} blocks of {bs} bytes cannot be addressed"));
        let want = words_of(num_blocks, bs).ok_or_else(too_large)?;
        if num_blocks > old {
            let have = self.capacity_words();
            if want > have {
                let slot = self.extents.iter().position(|e| e.get().is_none()).ok_or_else(|| {
                    RegistryError::NoMemory(format!(
                        "malloc bdev {name} has grown {} times, the most it can; create a larger one",
                        MAX_EXTENTS - 1
                    ))
                })?;
                let words = alloc_words(want - have, &format!("growing malloc bdev {name} to {num_blocks} blocks"))
                    .map_err(RegistryError::NoMemory)?;
                let _ = self.extents[slot].set(Extent { start: have, words });
            }
            // Blocks an earlier shrink hid come back as zeroes, as new ones do.
            let hidden = words_of(old, bs).unwrap_or(0);
            self.for_words(hidden, want.min(have), |_, words| words.iter().for_each(|w| w.store(0, Ordering::Relaxed)));
        }
        // Published after the memory that backs it: I/O validated against the new size finds it.
        self.info.set_num_blocks(num_blocks);
        Ok(())
    }
}

impl Bdev for MallocBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, kind: IoKind) -> bool {
        // COMPARE AND WRITE is read, compared and written by the SCSI layer.
        kind != IoKind::CompareAndWrite
    }

    /// A block of zeros is reported deallocated (it reads as an unmapped block would, and
    /// UNMAP zeroes): a scan of the RAM itself, so a run is one descriptor however long
    /// (libiscsi's Sanitize.BlockErase reads the whole LUN's state in 256 bytes).
    fn provisioning(&self, lba: Lba, max_blocks: u64, max_runs: usize) -> Option<Result<Vec<LbaRun>, BdevError>> {
        let cap = self.info.num_blocks();
        let n = max_blocks.min(cap.saturating_sub(lba.get()));
        let per_block = (self.info.block_size / 8) as usize;
        let mut runs: Vec<LbaRun> = Vec::new();
        let mut full = false;
        // Extents hold whole blocks, so a block never spans two pieces.
        let r = self.for_blocks(lba, n, |off, words| {
            for (i, blk) in words.chunks(per_block).enumerate() {
                if full {
                    return;
                }
                let deallocated = blk.iter().all(|w| w.load(Ordering::Relaxed) == 0);
                match runs.last_mut() {
                    Some(r) if r.deallocated == deallocated => r.blocks += 1,
                    _ => {
                        if runs.len() > max_runs {
                            full = true;
                            return;
                        }
                        runs.push(LbaRun { start: lba + (off / per_block + i) as u64, blocks: 1, deallocated });
                    }
                }
            }
        });
        Some(r.map(|()| runs))
    }

    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        Box::new(MallocChannel { bdev: self, done: DoneQueue::default() })
    }

    fn config_json(&self) -> (&'static str, serde_json::Value) {
        let mut p = serde_json::json!({
            "name": self.info.name,
            "num_blocks": self.info.num_blocks(),
            "block_size": self.info.block_size,
            "uuid": self.info.uuid.to_string(),
        });
        if self.info.physical_block_size != self.info.block_size {
            p["physical_block_size"] = self.info.physical_block_size.into();
        }
        ("bdev_malloc_create", p)
    }
}

struct MallocChannel {
    bdev: Arc<MallocBdev>,
    done: DoneQueue,
}

impl IoChannel for MallocChannel {
    fn submit(&mut self, mut io: BdevIo) {
        let d = &self.bdev;
        let r = validate(&d.info, true, &io).and_then(|()| match (io.kind, io.buf.as_mut()) {
            (IoKind::Read, Some(b)) => d.read_into(io.offset_blocks, b.as_mut_slice()),
            (IoKind::Write, Some(b)) => d.write_from(io.offset_blocks, b.as_slice()),
            (IoKind::Unmap | IoKind::WriteZeroes, _) => d.zero(io.offset_blocks, io.num_blocks),
            _ => Ok(()), // flush: RAM is always durable as far as it goes
        });
        self.done.push(io, r);
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        self.done.drain_into(out)
    }

    fn outstanding(&self) -> usize {
        self.done.len()
    }
}

#[cfg(test)]
mod tests;
