//! File and block-device bdevs (SPDK's `bdev_uring_create` and `bdev_aio_create`; both run
//! on the io_uring engine of [`crate::uring`]).
//!
//! The backing store is opened with O_DIRECT: a write goes to the device, never to the page
//! cache, and a read comes from it. What it promises, per device:
//!
//! * block size: given, or detected: a block device's logical block size (BLKSSZGET); for
//!   a file 512 bytes (SPDK's choice), or the file system's direct-I/O alignment (statx
//!   STATX_DIOALIGN) when that is larger. A block size below what the device can address,
//!   or a size that is not a whole number of blocks, is refused.
//! * write cache: a file always has one (data or the metadata that finds it may sit in the
//!   page cache, the journal or the disk's cache until fdatasync); a block device has one
//!   when its queue says "write back" (sysfs `queue/write_cache`). Flush is fdatasync; a
//!   FUA write is issued with RWF_DSYNC.
//! * thin provisioning: Unmap punches holes (fallocate PUNCH_HOLE|KEEP_SIZE) where the file
//!   system or device supports it (probed at creation); WriteZeroes is fallocate
//!   ZERO_RANGE; a file's holes are found with SEEK_DATA / SEEK_HOLE ([`Bdev::provisioning`]).
//! * size: the file's or device's size at creation; [`Bdev::rescan_blocks`] reads it again.

pub(crate) mod rpc;

#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use rustix::fs::{FallocateFlags, SeekFrom};
use uuid::Uuid;

use crate::io::{validate, BdevError, BdevInfo, BdevIo, IoChannel, IoCompletion, IoKind};
use crate::uring::{Op, Ring};
use crate::{Bdev, Lba, LbaRun, SUPPORTED_BLOCK_SIZES};

/// Which RPC family made the device (what `save_config` writes back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// `bdev_uring_create`: product "URING bdev".
    Uring,
    /// `bdev_aio_create`: product "AIO disk" (same engine).
    Aio,
}

impl FileKind {
    pub fn product_name(self) -> &'static str {
        match self {
            FileKind::Uring => "URING bdev",
            FileKind::Aio => "AIO disk",
        }
    }
}

/// Why a file device could not be created; each names its cause.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: io::Error },
    #[error("{path} is neither a regular file nor a block device")]
    NotAFileOrDevice { path: String },
    #[error("cannot open {path} for direct I/O (O_DIRECT): {source}; the file system does not support it (tmpfs does not), use a file on ext4, xfs or btrfs, or a block device")]
    NoDirectIo { path: String, source: io::Error },
    #[error("block_size {0} is not supported (use 512 or 4096)")]
    BadBlockSize(u32),
    #[error("block_size {given} is below the logical block size of {path} ({detected} bytes)")]
    BlockSizeBelowDevice { path: String, given: u32, detected: u32 },
    #[error("{path} is empty: size it first (e.g. truncate -s 1G {path})")]
    Empty { path: String },
    #[error("the size of {path} ({size} bytes) is not a multiple of block_size {block_size}")]
    SizeNotMultiple { path: String, size: u64, block_size: u32 },
    #[error("io_uring is not available: {0}")]
    NoUring(io::Error),
    #[error("cannot read the size of {path}: {source}")]
    Size { path: String, source: io::Error },
}

impl FileError {
    /// SPDK's error code for it (a negative errno).
    pub fn errno(&self) -> i32 {
        match self {
            FileError::Open { source, .. } | FileError::NoDirectIo { source, .. } | FileError::Size { source, .. } => {
                -source.raw_os_error().unwrap_or(libc::EIO)
            }
            FileError::NoUring(e) => -e.raw_os_error().unwrap_or(libc::ENOSYS),
            FileError::NotAFileOrDevice { .. } => -libc::ENODEV,
            _ => -libc::EINVAL,
        }
    }
}

/// A file or block device served through io_uring.
pub struct FileBdev {
    info: BdevInfo,
    file: Arc<File>,
    path: PathBuf,
    kind: FileKind,
    readonly: bool,
    block_device: bool,
    /// block_size was given (not detected).
    block_size_given: bool,
    punch_hole: bool,
    zero_range: bool,
    seek_data: bool,
}

/// What the device says about itself.
struct Probe {
    logical: u32,
    physical: u32,
    size: u64,
    write_cache: bool,
    punch_hole: bool,
    zero_range: bool,
    seek_data: bool,
}

fn size_of(file: &File, block_device: bool) -> io::Result<u64> {
    if block_device {
        // A block device's size is where its end is.
        Ok(rustix::fs::seek(file, SeekFrom::End(0))?)
    } else {
        Ok(file.metadata()?.len())
    }
}

/// `/sys/dev/block/MAJ:MIN/queue/NAME` of the device (its disk's, for a partition).
fn sysfs_queue(file: &File, name: &str) -> Option<String> {
    let st = rustix::fs::fstat(file).ok()?;
    let dev = format!("/sys/dev/block/{}:{}", rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev));
    let dir = Path::new(&dev);
    let q = if dir.join("partition").exists() { dir.join("../queue") } else { dir.join("queue") };
    std::fs::read_to_string(q.join(name)).ok().map(|s| s.trim().to_string())
}

fn probe(file: &File, path: &Path, block_device: bool, readonly: bool) -> Result<Probe, FileError> {
    let p = path.display().to_string();
    let size = size_of(file, block_device).map_err(|source| FileError::Size { path: p.clone(), source })?;
    if block_device {
        let logical = rustix::fs::ioctl_blksszget(file).unwrap_or(512);
        let physical = rustix::fs::ioctl_blkpbszget(file).unwrap_or(logical);
        let zeroes = sysfs_queue(file, "write_zeroes_max_bytes").and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        return Ok(Probe {
            logical,
            physical,
            size,
            write_cache: sysfs_queue(file, "write_cache").is_none_or(|s| s != "write through"),
            // blkdev fallocate: PUNCH_HOLE is a write-zeroes that may unmap (needs the
            // device's support); ZERO_RANGE falls back to writing zeros.
            punch_hole: !readonly && zeroes > 0,
            zero_range: !readonly,
            seek_data: false,
        });
    }
    let sx = rustix::fs::statx(file, "", rustix::fs::AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::DIOALIGN).ok();
    let logical = sx.map(|s| s.stx_dio_offset_align).filter(|&a| a > 0).unwrap_or(512);
    // The file system's block (what it allocates and punches as one) is not claimed as the
    // physical block: initiators then unmap whole file system blocks only, but libiscsi's
    // GetLBAStatus.UnmapSingle mixes up LBAs when a physical block holds several (it asks
    // at i + 1 and expects i + LBPPB). A LUN that wants both says block_size 4096.
    let physical = logical;
    // A hole punched past the end of the file (KEEP_SIZE) changes nothing, and tells
    // whether the file system can punch holes at all.
    let past_end = size.div_ceil(65536) * 65536 + 65536;
    let punch_hole = !readonly
        && rustix::fs::fallocate(file, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, past_end, 65536).is_ok();
    let zero_range = !readonly && probe_zero_range(path);
    let seek_data = matches!(rustix::fs::seek(file, SeekFrom::Data(0)), Ok(_) | Err(rustix::io::Errno::NXIO));
    Ok(Probe { logical, physical, size, write_cache: true, punch_hole, zero_range, seek_data })
}

/// Whether the file system of `path` zeroes ranges in place (fallocate ZERO_RANGE), tried on
/// an unnamed temporary file next to it (never on the file itself).
fn probe_zero_range(path: &Path) -> bool {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Ok(tmp) = rustix::fs::open(dir, rustix::fs::OFlags::TMPFILE | rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::from_raw_mode(0o600)) else {
        return false;
    };
    rustix::fs::fallocate(&tmp, FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE, 0, 65536).is_ok()
}

impl FileBdev {
    /// Opens `filename` (O_DIRECT; a block device also O_EXCL, so one in use by a file
    /// system or another program is refused) and sizes the device.
    pub fn open(
        kind: FileKind,
        name: &str,
        filename: &str,
        block_size: Option<u32>,
        readonly: bool,
        uuid: Option<Uuid>,
    ) -> Result<FileBdev, FileError> {
        Ring::probe().map_err(FileError::NoUring)?;
        let path = PathBuf::from(filename);
        let p = filename.to_string();
        let meta = std::fs::metadata(&path).map_err(|source| FileError::Open { path: p.clone(), source })?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.is_file() {
            return Err(FileError::NotAFileOrDevice { path: p });
        }
        let flags = libc::O_DIRECT | libc::O_CLOEXEC | if block_device { libc::O_EXCL } else { 0 };
        let file = OpenOptions::new().read(true).write(!readonly).custom_flags(flags).open(&path).map_err(|source| {
            if source.raw_os_error() == Some(libc::EINVAL) {
                FileError::NoDirectIo { path: p.clone(), source }
            } else {
                FileError::Open { path: p.clone(), source }
            }
        })?;
        let pr = probe(&file, &path, block_device, readonly)?;
        let bs = match block_size {
            Some(bs) => bs,
            None => pr.logical.max(512),
        };
        if !SUPPORTED_BLOCK_SIZES.contains(&bs) {
            return Err(FileError::BadBlockSize(bs));
        }
        if bs < pr.logical {
            return Err(FileError::BlockSizeBelowDevice { path: p, given: bs, detected: pr.logical });
        }
        if pr.size == 0 {
            return Err(FileError::Empty { path: p });
        }
        if pr.size % bs as u64 != 0 {
            return Err(FileError::SizeNotMultiple { path: p, size: pr.size, block_size: bs });
        }
        let mut info = BdevInfo::new(name, kind.product_name(), bs, pr.size / bs as u64, uuid.unwrap_or_else(Uuid::new_v4));
        info.volatile_write_cache = pr.write_cache;
        if pr.physical > bs && pr.physical % bs == 0 && pr.physical.is_power_of_two() && pr.physical <= 65536 {
            info.physical_block_size = pr.physical;
        }
        log::info!(
            "{filename}: {} blocks of {bs} bytes, {}, write cache {}, unmap {}, write zeroes {}, holes {}",
            info.num_blocks(),
            if block_device { "block device" } else { "file" },
            if pr.write_cache { "on" } else { "off" },
            pr.punch_hole,
            pr.zero_range,
            pr.seek_data
        );
        Ok(FileBdev {
            info,
            file: Arc::new(file),
            path,
            kind,
            readonly,
            block_device,
            block_size_given: block_size.is_some(),
            punch_hole: pr.punch_hole,
            zero_range: pr.zero_range,
            seek_data: pr.seek_data,
        })
    }

    pub fn kind(&self) -> FileKind {
        self.kind
    }

    pub fn filename(&self) -> &Path {
        &self.path
    }

    fn byte_range(&self, lba: Lba, blocks: u64) -> Option<(u64, u64)> {
        let bs = self.info.block_size;
        Some((lba.byte_offset(bs)?, blocks.checked_mul(bs as u64)?))
    }
}

impl Bdev for FileBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, kind: IoKind) -> bool {
        match kind {
            IoKind::Read | IoKind::Flush => true,
            IoKind::Write => !self.readonly,
            IoKind::Unmap => self.punch_hole,
            IoKind::WriteZeroes => self.zero_range,
            IoKind::CompareAndWrite => false,
        }
    }

    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        match Ring::current() {
            Ok(ring) => {
                let chan = ring.open_channel();
                Box::new(FileChannel { bdev: self, ring, chan })
            }
            Err(e) => Box::new(crate::io::FailedChannel::new(format!("io_uring is not available on this thread: {e}"))),
        }
    }

    fn config_json(&self) -> (&'static str, serde_json::Value) {
        let mut p = serde_json::json!({
            "name": self.info.name,
            "filename": self.path.display().to_string(),
            "block_size": self.info.block_size,
            "uuid": self.info.uuid.to_string(),
        });
        match self.kind {
            FileKind::Uring => ("bdev_uring_create", p),
            FileKind::Aio => {
                if self.readonly {
                    p["readonly"] = true.into();
                }
                ("bdev_aio_create", p)
            }
        }
    }

    fn driver_specific(&self) -> serde_json::Value {
        let filename = self.path.display().to_string();
        match self.kind {
            FileKind::Uring => serde_json::json!({"uring": {"filename": filename}}),
            FileKind::Aio => serde_json::json!({"aio": {
                "filename": filename,
                "block_size_override": self.block_size_given,
                "readonly": self.readonly,
                "fallocate": self.zero_range,
            }}),
        }
    }

    fn rescan_blocks(&self) -> Option<Result<u64, BdevError>> {
        let size = size_of(&self.file, self.block_device).map_err(|e| BdevError::Io(format!("cannot read the size of {}: {e}", self.path.display())));
        Some(size.map(|s| s / self.info.block_size as u64))
    }

    fn set_num_blocks(&self, n: u64) {
        self.info.set_num_blocks(n);
    }

    /// Runs of data and holes from SEEK_DATA / SEEK_HOLE: a hole is deallocated (reads as
    /// zeros), everything else mapped. A block only partly in a hole counts as mapped.
    fn provisioning(&self, lba: Lba, max_blocks: u64, max_runs: usize) -> Option<Result<Vec<LbaRun>, BdevError>> {
        if !self.seek_data {
            return None;
        }
        let bs = self.info.block_size as u64;
        let end_lba = lba.get().saturating_add(max_blocks).min(self.info.num_blocks());
        let mut runs: Vec<LbaRun> = Vec::new();
        fn push(runs: &mut Vec<LbaRun>, start: u64, end: u64, deallocated: bool) {
            if end <= start {
                return;
            }
            match runs.last_mut() {
                Some(r) if r.deallocated == deallocated && r.start.get() + r.blocks == start => r.blocks += end - start,
                _ => runs.push(LbaRun { start: Lba::new(start), blocks: end - start, deallocated }),
            }
        }
        let mut pos = lba.get();
        let fd = self.file.as_fd();
        while pos < end_lba {
            let off = pos * bs;
            let data = match rustix::fs::seek(fd, SeekFrom::Data(off as i64)) {
                Ok(d) => d,
                Err(rustix::io::Errno::NXIO) => u64::MAX, // no data from here on
                Err(e) => return Some(Err(BdevError::Io(format!("SEEK_DATA on {}: {e}", self.path.display())))),
            };
            // A hole from `off` to `data`: the blocks wholly inside it.
            let hole_end = (data / bs).min(end_lba);
            push(&mut runs, pos, hole_end.max(pos), true);
            if data == u64::MAX || hole_end >= end_lba {
                break;
            }
            let data_blk = data / bs; // a partly-hole block is mapped
            let next_hole = match rustix::fs::seek(fd, SeekFrom::Hole(data as i64)) {
                Ok(h) => h,
                Err(e) => return Some(Err(BdevError::Io(format!("SEEK_HOLE on {}: {e}", self.path.display())))),
            };
            let data_end = next_hole.div_ceil(bs).min(end_lba).max(data_blk + 1);
            push(&mut runs, data_blk.max(pos), data_end, false);
            pos = data_end;
            if runs.len() > max_runs {
                break;
            }
        }
        Some(Ok(runs))
    }
}

/// A reactor's handle on a [`FileBdev`]: its channel in the thread's ring.
struct FileChannel {
    bdev: Arc<FileBdev>,
    ring: Rc<Ring>,
    chan: u32,
}

impl IoChannel for FileChannel {
    fn submit(&mut self, io: BdevIo) {
        let d = &self.bdev;
        let r = validate(&d.info, d.supports(io.kind), &io);
        let range = d.byte_range(io.offset_blocks, io.num_blocks);
        let (Ok(()), Some((offset, len))) = (r.clone(), range) else {
            let result = r.and(Err(BdevError::OutOfRange { offset: io.offset_blocks, num: io.num_blocks, capacity: d.info.num_blocks() }));
            return self.ring.complete_now(self.chan, IoCompletion { tag: io.tag, kind: io.kind, result, buf: io.buf });
        };
        let file = d.file.clone();
        let op = match (io.kind, io.buf) {
            (IoKind::Read | IoKind::Write, Some(buf)) if len > 0 => Op::rw(self.chan, io.tag, io.kind, file, buf, offset, io.fua),
            (IoKind::Unmap, _) if len > 0 => {
                let mode = (FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE).bits() as i32;
                Op::fallocate(self.chan, io.tag, io.kind, file, mode, offset, len, io.fua)
            }
            (IoKind::WriteZeroes, _) if len > 0 => {
                let mode = (FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE).bits() as i32;
                Op::fallocate(self.chan, io.tag, io.kind, file, mode, offset, len, io.fua)
            }
            (IoKind::Flush, _) => Op::sync(self.chan, io.tag, io.kind, file),
            // Nothing to transfer (zero blocks).
            (kind, buf) => return self.ring.complete_now(self.chan, IoCompletion { tag: io.tag, kind, result: Ok(()), buf }),
        };
        self.ring.submit(op);
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        self.ring.poll(self.chan, out)
    }

    fn outstanding(&self) -> usize {
        self.ring.outstanding(self.chan)
    }
}

impl Drop for FileChannel {
    fn drop(&mut self) {
        self.ring.close_channel(self.chan);
    }
}
