//! The malloc device: data kept in RAM.
//!
//! The bytes live in `AtomicU64` words accessed with relaxed loads and stores: channels on
//! several reactors may touch the same blocks at once (SCSI gives overlapping commands no
//! order), and atomics make that well defined without locks or `unsafe`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use uuid::Uuid;

use crate::io::{validate, BdevError, BdevInfo, BdevIo, DoneQueue, IoChannel, IoCompletion, IoKind};
use crate::Bdev;

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
            info: BdevInfo {
                name: name.to_string(),
                product_name: "Malloc disk",
                block_size,
                physical_block_size: block_size,
                num_blocks,
                uuid: uuid.unwrap_or_else(Uuid::new_v4),
            },
            words: v.into_boxed_slice(),
        })
    }

    /// Sets the physical block size (validated by the registry).
    pub fn with_physical_block_size(mut self, pbs: u32) -> Self {
        self.info.physical_block_size = pbs;
        self
    }

    fn words(&self, offset_blocks: u64, num_blocks: u64) -> &[AtomicU64] {
        let wpb = self.info.block_size as usize / 8;
        let start = offset_blocks as usize * wpb;
        &self.words[start..start + num_blocks as usize * wpb]
    }

    fn read_into(&self, offset_blocks: u64, buf: &mut [u8]) {
        let words = self.words(offset_blocks, buf.len() as u64 / self.info.block_size as u64);
        for (w, out) in words.iter().zip(buf.chunks_exact_mut(8)) {
            out.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
    }

    fn write_from(&self, offset_blocks: u64, buf: &[u8]) {
        let words = self.words(offset_blocks, buf.len() as u64 / self.info.block_size as u64);
        for (w, chunk) in words.iter().zip(buf.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
    }

    fn zero(&self, offset_blocks: u64, num_blocks: u64) {
        for w in self.words(offset_blocks, num_blocks) {
            w.store(0, Ordering::Relaxed);
        }
    }
}

impl Bdev for MallocBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, _kind: IoKind) -> bool {
        true
    }

    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        Box::new(MallocChannel { bdev: self, done: DoneQueue::default() })
    }

    fn config_json(&self) -> (&'static str, serde_json::Value) {
        let mut p = serde_json::json!({
            "name": self.info.name,
            "num_blocks": self.info.num_blocks,
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
        let r = validate(&d.info, true, &io);
        if r.is_ok() {
            match (io.kind, io.buf.as_mut()) {
                (IoKind::Read, Some(b)) => d.read_into(io.offset_blocks, b.as_mut_slice()),
                (IoKind::Write, Some(b)) => d.write_from(io.offset_blocks, b.as_slice()),
                (IoKind::Unmap | IoKind::WriteZeroes, _) => d.zero(io.offset_blocks, io.num_blocks),
                _ => {} // flush: RAM is always durable as far as it goes
            }
        }
        self.done.push(io, r);
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        self.done.drain_into(out)
    }

    fn outstanding(&self) -> usize {
        self.done.len()
    }
}
