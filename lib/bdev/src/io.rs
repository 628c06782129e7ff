//! I/O requests, completions, buffers, channels and the checks every device shares.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;
use uuid::Uuid;

use crate::Lba;

/// The data buffer handed to a device and handed back in the completion: riser-buf's
/// owned, page-aligned, pooled buffer.
pub use riser_buf::IoBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    Read,
    Write,
    Flush,
    Unmap,
    WriteZeroes,
    /// Compare the blocks with the first half of the buffer and, when equal, write the second
    /// half, atomically in the device (SBC-3 COMPARE AND WRITE); a device that supports it.
    /// The SCSI layer sends it for one block only (librbd 16.2's limit: one 512-byte sector).
    CompareAndWrite,
}

impl IoKind {
    pub fn needs_buffer(self) -> bool {
        matches!(self, IoKind::Read | IoKind::Write | IoKind::CompareAndWrite)
    }
}

/// One I/O. `tag` is the submitter's, returned untouched in the completion.
pub struct BdevIo {
    pub kind: IoKind,
    /// The first block (an address in blocks, not bytes).
    pub offset_blocks: Lba,
    pub num_blocks: u64,
    /// Read: filled by the device. Write: read by the device. Others: none.
    pub buf: Option<IoBuf>,
    pub tag: u64,
    /// Force unit access: a Write (Unmap, WriteZeroes) completes only once it is durable
    /// (SBC-3 FUA; also every write while the LUN's write cache is off). Ignored by reads.
    pub fua: bool,
}

impl fmt::Debug for BdevIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BdevIo")
            .field("kind", &self.kind)
            .field("offset_blocks", &self.offset_blocks)
            .field("num_blocks", &self.num_blocks)
            .field("buf_len", &self.buf.as_ref().map(|b| b.len()))
            .field("tag", &self.tag)
            .field("fua", &self.fua)
            .finish()
    }
}

pub struct IoCompletion {
    pub tag: u64,
    pub kind: IoKind,
    pub result: Result<(), BdevError>,
    /// The buffer given with the request, if any.
    pub buf: Option<IoBuf>,
}

impl fmt::Debug for IoCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoCompletion")
            .field("tag", &self.tag)
            .field("kind", &self.kind)
            .field("result", &self.result)
            .finish()
    }
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum BdevError {
    #[error("I/O out of range: blocks {offset}+{num} on a device of {capacity} blocks")]
    OutOfRange { offset: Lba, num: u64, capacity: u64 },
    #[error("buffer of {got} bytes for an I/O of {expected} bytes")]
    BufferSize { expected: u64, got: u64 },
    #[error("{0:?} needs a data buffer")]
    MissingBuffer(IoKind),
    #[error("{0:?} is not supported by this device")]
    Unsupported(IoKind),
    #[error("I/O error: {0}")]
    Io(String),
    /// The backing store cannot be reached (a cluster that does not answer): a path error.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// This gateway was fenced by the others exporting the device (its cluster client is
    /// blocklisted, see `gateways`): the I/O must be retried through another gateway, and
    /// the SCSI layer answers as a target port in the unavailable state does.
    #[error("gateway fenced: {0}")]
    Fenced(String),
    /// CompareAndWrite: the data differ at this byte offset from the I/O's start.
    #[error("miscompare at byte {offset}")]
    Miscompare { offset: u64 },
}

/// What a device is. Fixed at creation, except its size: a file or block device that grew
/// is rescanned (`bdev_*_rescan`), and `num_blocks` is read atomically by every reactor.
#[derive(Debug)]
pub struct BdevInfo {
    pub name: String,
    pub product_name: &'static str,
    pub block_size: u32,
    /// The unit the medium writes atomically (READ CAPACITY(16)'s LOGICAL BLOCKS PER
    /// PHYSICAL BLOCK); equal to `block_size` unless configured.
    pub physical_block_size: u32,
    num_blocks: AtomicU64,
    pub uuid: Uuid,
    /// Whether a write may complete before it is durable (a volatile write cache: the
    /// page cache and a disk's cache for a file, a drive's cache, RAM): the caching mode
    /// page's WCE, and what Flush and FUA are for.
    pub volatile_write_cache: bool,
}

impl Clone for BdevInfo {
    /// A copy with the size as it is now.
    fn clone(&self) -> Self {
        BdevInfo {
            name: self.name.clone(),
            product_name: self.product_name,
            block_size: self.block_size,
            physical_block_size: self.physical_block_size,
            num_blocks: AtomicU64::new(self.num_blocks()),
            uuid: self.uuid,
            volatile_write_cache: self.volatile_write_cache,
        }
    }
}

impl BdevInfo {
    /// A device of `num_blocks` blocks of `block_size` bytes (physically too), with a
    /// volatile write cache.
    pub fn new(name: &str, product_name: &'static str, block_size: u32, num_blocks: u64, uuid: Uuid) -> BdevInfo {
        BdevInfo {
            name: name.to_string(),
            product_name,
            block_size,
            physical_block_size: block_size,
            num_blocks: AtomicU64::new(num_blocks),
            uuid,
            volatile_write_cache: true,
        }
    }

    /// The size in blocks now (it only grows while the device is claimed).
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire)
    }

    /// A rescan found a new size.
    pub(crate) fn set_num_blocks(&self, n: u64) {
        self.num_blocks.store(n, Ordering::Release);
    }

    pub fn size_bytes(&self) -> u64 {
        self.num_blocks() * self.block_size as u64
    }
}

/// The checks every device makes before touching data: range, buffer, support.
pub fn validate(info: &BdevInfo, supported: bool, io: &BdevIo) -> Result<(), BdevError> {
    if !supported {
        return Err(BdevError::Unsupported(io.kind));
    }
    if io.kind == IoKind::Flush && io.num_blocks == 0 && io.offset_blocks == Lba::ZERO {
        return Ok(()); // flush of the whole device
    }
    let capacity = info.num_blocks();
    let end = io.offset_blocks.checked_add(io.num_blocks);
    if end.is_none_or(|e| e.get() > capacity) {
        return Err(BdevError::OutOfRange { offset: io.offset_blocks, num: io.num_blocks, capacity });
    }
    if io.kind.needs_buffer() {
        let Some(buf) = io.buf.as_ref() else {
            return Err(BdevError::MissingBuffer(io.kind));
        };
        let halves = if io.kind == IoKind::CompareAndWrite { 2 } else { 1 };
        let expected = io.num_blocks.saturating_mul(info.block_size as u64).saturating_mul(halves);
        let got = buf.as_slice().len() as u64;
        if got != expected {
            return Err(BdevError::BufferSize { expected, got });
        }
    }
    Ok(())
}

/// A reactor's handle for I/O to one device. Not shared between threads.
pub trait IoChannel {
    /// Queues an I/O. Its completion comes from a later [`poll`](Self::poll), never from
    /// inside `submit`, so callers never recurse.
    fn submit(&mut self, io: BdevIo);

    /// Moves finished I/Os into `out`; returns how many.
    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize;

    /// I/Os submitted and not yet returned by `poll`.
    fn outstanding(&self) -> usize;

    /// Whether the caller must keep polling for this channel's I/O to come back: completions
    /// are waiting, or I/O is in flight whose completion nothing signals. A device whose
    /// completions end an adaptive reactor's sleep by themselves (a descriptor in the
    /// reactor's wake set: RBD's completion eventfd) answers false while its I/O is merely in
    /// flight, so the reactor sleeps instead of spinning while the backend works (on a small
    /// machine the spinning takes the CPU the backend needs). The default is the safe answer:
    /// anything outstanding needs polling.
    fn needs_poll(&self) -> bool {
        self.outstanding() > 0
    }
}

/// A completion queue for devices that finish I/O inside `submit` (null, malloc).
#[derive(Default)]
pub(crate) struct DoneQueue {
    /// In completion order; drained whole (a vector: one copy into the poller's).
    q: Vec<IoCompletion>,
}

impl DoneQueue {
    pub(crate) fn push(&mut self, io: BdevIo, result: Result<(), BdevError>) {
        self.q.push(IoCompletion { tag: io.tag, kind: io.kind, result, buf: io.buf });
    }

    pub(crate) fn drain_into(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let n = self.q.len();
        out.append(&mut self.q);
        n
    }

    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }
}

/// The channel of a device that cannot do I/O on this thread: every I/O fails with the
/// reason, through `poll` like any other completion.
pub(crate) struct FailedChannel {
    why: String,
    done: DoneQueue,
}

impl FailedChannel {
    pub(crate) fn new(why: String) -> FailedChannel {
        log::error!("{why}");
        FailedChannel { why, done: DoneQueue::default() }
    }
}

impl IoChannel for FailedChannel {
    fn submit(&mut self, io: BdevIo) {
        let e = Err(BdevError::Io(self.why.clone()));
        self.done.push(io, e);
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        self.done.drain_into(out)
    }

    fn outstanding(&self) -> usize {
        self.done.len()
    }
}

/// Submits one I/O and polls until it completes. For tests and control-plane tools.
pub fn run_sync(ch: &mut dyn IoChannel, io: BdevIo) -> IoCompletion {
    let tag = io.tag;
    ch.submit(io);
    let mut out = Vec::new();
    loop {
        ch.poll(&mut out);
        if let Some(pos) = out.iter().position(|c| c.tag == tag) {
            return out.swap_remove(pos);
        }
        std::thread::yield_now();
    }
}
