//! The malloc device: data kept in RAM.
//!
//! The bytes live in `AtomicU64` words accessed with relaxed loads and stores: channels on
//! several reactors may touch the same blocks at once (SCSI gives overlapping commands no
//! order), and atomics make that well defined without locks or `unsafe`.

pub(crate) mod rpc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use uuid::Uuid;

use crate::io::{validate, BdevError, BdevInfo, BdevIo, DoneQueue, IoChannel, IoCompletion, IoKind};
use crate::{Bdev, Lba, LbaRun};

pub struct MallocBdev {
    info: BdevInfo,
    words: Box<[AtomicU64]>,
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
        let bytes = num_blocks
            .checked_mul(block_size as u64)
            .ok_or_else(|| BdevError::Io("size overflows".into()))?;
        let n = usize::try_from(bytes / 8).map_err(|_| BdevError::Io("size too large".into()))?;
        let mut v: Vec<AtomicU64> = Vec::new();
        v.try_reserve_exact(n)
            .map_err(|_| BdevError::Io(format!("cannot allocate {bytes} bytes of memory")))?;
        v.resize_with(n, || AtomicU64::new(0));
        Ok(MallocBdev {
            info: BdevInfo::new(name, "Malloc disk", block_size, num_blocks, uuid.unwrap_or_else(Uuid::new_v4)),
            words: v.into_boxed_slice(),
        })
    }

    /// Sets the physical block size (validated by the registry).
    pub fn with_physical_block_size(mut self, pbs: u32) -> Self {
        self.info.physical_block_size = pbs;
        self
    }

    /// The words holding blocks `[lba, lba + num_blocks)`. [`validate`] has checked the
    /// range; an address whose bytes do not fit (which it cannot pass) is out of range here
    /// too, not a panic.
    fn words(&self, lba: Lba, num_blocks: u64) -> Result<&[AtomicU64], BdevError> {
        let bs = self.info.block_size;
        let range = lba.byte_offset(bs).zip(num_blocks.checked_mul(bs as u64)).and_then(|(start, len)| {
            let start = usize::try_from(start / 8).ok()?;
            Some(start..start.checked_add(usize::try_from(len / 8).ok()?)?)
        });
        range.and_then(|r| self.words.get(r)).ok_or(BdevError::OutOfRange {
            offset: lba,
            num: num_blocks,
            capacity: self.info.num_blocks(),
        })
    }

    fn read_into(&self, lba: Lba, buf: &mut [u8]) -> Result<(), BdevError> {
        let words = self.words(lba, buf.len() as u64 / self.info.block_size as u64)?;
        for (w, out) in words.iter().zip(buf.chunks_exact_mut(8)) {
            out.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        Ok(())
    }

    fn write_from(&self, lba: Lba, buf: &[u8]) -> Result<(), BdevError> {
        let words = self.words(lba, buf.len() as u64 / self.info.block_size as u64)?;
        for (w, chunk) in words.iter().zip(buf.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
        Ok(())
    }

    fn zero(&self, lba: Lba, num_blocks: u64) -> Result<(), BdevError> {
        for w in self.words(lba, num_blocks)? {
            w.store(0, Ordering::Relaxed);
        }
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
        let words = match self.words(lba, n) {
            Ok(w) => w,
            Err(e) => return Some(Err(e)),
        };
        let per_block = (self.info.block_size / 8) as usize;
        let mut runs: Vec<LbaRun> = Vec::new();
        for (i, blk) in words.chunks(per_block).enumerate() {
            let deallocated = blk.iter().all(|w| w.load(Ordering::Relaxed) == 0);
            match runs.last_mut() {
                Some(r) if r.deallocated == deallocated => r.blocks += 1,
                _ => {
                    if runs.len() > max_runs {
                        break;
                    }
                    runs.push(LbaRun { start: lba + i as u64, blocks: 1, deallocated });
                }
            }
        }
        Some(Ok(runs))
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
