//! The set of devices, by unique name, with claims (a LUN claims its device).

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use thiserror::Error;
use uuid::Uuid;

use crate::nvme::{NvmeCtrlr, NvmeError};
use crate::stats::{BdevStats, Counted};

use crate::{Bdev, BdevError, FileBdev, FileError, FileKind, MallocBdev, NullBdev, SUPPORTED_BLOCK_SIZES};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("bdev {0} already exists")]
    Exists(String),
    #[error("bdev {0} not found")]
    NotFound(String),
    #[error("bdev {name} is claimed by {owner}")]
    Claimed { name: String, owner: String },
    #[error("invalid name {0:?}: use 1-255 characters, no whitespace or control characters")]
    BadName(String),
    #[error("block_size {0} is not supported (use 512 or 4096)")]
    BadBlockSize(u32),
    #[error("num_blocks must be greater than 0")]
    ZeroBlocks,
    #[error("physical_block_size {pbs} must be a power of two multiple of block_size {bs}, at most 65536")]
    BadPhysicalBlockSize { pbs: u32, bs: u32 },
    #[error("{0}")]
    Device(#[from] BdevError),
    /// A file or block device could not be opened or used: SPDK's code (a negative errno)
    /// and the cause.
    #[error("{message}")]
    File { errno: i32, message: String },
    #[error("bdev {0} has a fixed size: there is nothing to rescan")]
    NotResizable(String),
    #[error("bdev {name} would shrink from {old} to {new} blocks while {owner} uses it")]
    ShrinkClaimed { name: String, owner: String, old: u64, new: u64 },
    /// A device that only grows (SPDK's null bdev) was asked to shrink.
    #[error("bdev {name}: new_size {new_mib} MiB is smaller than the current {old_mib} MiB ({kind} bdevs only grow)")]
    NoShrink { name: String, kind: &'static str, old_mib: u64, new_mib: u64 },
    /// Memory for a device could not be had (growing a malloc bdev).
    #[error("{0}")]
    NoMemory(String),
}

impl From<NvmeError> for RegistryError {
    fn from(e: NvmeError) -> Self {
        RegistryError::File { errno: e.errno(), message: e.to_string() }
    }
}

impl From<FileError> for RegistryError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::BadBlockSize(bs) => RegistryError::BadBlockSize(bs),
            e => RegistryError::File { errno: e.errno(), message: e.to_string() },
        }
    }
}

struct Entry {
    /// The device wrapped in a [`Counted`]: its channels count their I/O into `stats`.
    bdev: Arc<dyn Bdev>,
    stats: Arc<BdevStats>,
    claimed_by: Option<String>,
    /// The device itself when it is a malloc one (`bdev_malloc_resize` grows its memory).
    malloc: Option<Arc<MallocBdev>>,
    /// The regular file behind a file bdev (device and inode numbers): two bdevs on one
    /// file would each think they own its blocks, so a second one is refused.
    backing_file: Option<(u64, u64)>,
}

/// Devices in creation order. Lives on the control plane; the data path holds `Arc`s.
#[derive(Default)]
pub struct BdevRegistry {
    entries: Vec<Entry>,
    /// Attached NVMe controllers (`bdev_nvme_attach_controller`), in attach order.
    nvme: Vec<NvmeCtrlr>,
    /// Registered Ceph clusters and the RBD bdevs (`bdev_rbd_*`, rbd.rs).
    pub(crate) rbd: crate::rbd::RbdClusters,
}

fn check_name(name: &str) -> Result<(), RegistryError> {
    if name.is_empty() || name.len() > 255 || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(RegistryError::BadName(name.to_string()));
    }
    Ok(())
}

fn check_geometry(num_blocks: u64, block_size: u32) -> Result<(), RegistryError> {
    if !SUPPORTED_BLOCK_SIZES.contains(&block_size) {
        return Err(RegistryError::BadBlockSize(block_size));
    }
    if num_blocks == 0 {
        return Err(RegistryError::ZeroBlocks);
    }
    Ok(())
}

impl BdevRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    fn pos(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.bdev.info().name == name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.pos(name).is_some()
    }

    /// Adds a device; its name must be new.
    pub fn register(&mut self, bdev: Arc<dyn Bdev>) -> Result<(), RegistryError> {
        let name = &bdev.info().name;
        check_name(name)?;
        if self.contains(name) {
            return Err(RegistryError::Exists(name.clone()));
        }
        log::info!("bdev {name} created ({} x {} bytes, {})", bdev.info().num_blocks(), bdev.info().block_size, bdev.info().product_name);
        let counted = Counted::new(bdev, crate::stats::counting_on());
        let stats = counted.stats().clone();
        self.entries.push(Entry { bdev: Arc::new(counted), stats, claimed_by: None, malloc: None, backing_file: None });
        Ok(())
    }

    /// The first free name `{prefix}{n}` (SPDK's Malloc0, Malloc1, ...).
    pub fn next_name(&self, prefix: &str) -> String {
        (0..).map(|n| format!("{prefix}{n}")).find(|n| !self.contains(n)).unwrap_or_default()
    }

    pub fn create_malloc(&mut self, name: Option<&str>, num_blocks: u64, block_size: u32, uuid: Option<Uuid>) -> Result<String, RegistryError> {
        self.create_malloc_with(name, num_blocks, block_size, None, uuid)
    }

    /// [`create_malloc`](Self::create_malloc) with a physical block size (SPDK's
    /// `physical_block_size`): several logical blocks per physical block.
    pub fn create_malloc_with(
        &mut self,
        name: Option<&str>,
        num_blocks: u64,
        block_size: u32,
        physical_block_size: Option<u32>,
        uuid: Option<Uuid>,
    ) -> Result<String, RegistryError> {
        check_geometry(num_blocks, block_size)?;
        let pbs = physical_block_size.unwrap_or(block_size);
        if pbs < block_size || !pbs.is_multiple_of(block_size) || !pbs.is_power_of_two() || pbs > 65536 {
            return Err(RegistryError::BadPhysicalBlockSize { pbs, bs: block_size });
        }
        let name = name.map(str::to_string).unwrap_or_else(|| self.next_name("Malloc"));
        check_name(&name)?;
        if self.contains(&name) {
            return Err(RegistryError::Exists(name));
        }
        let b = Arc::new(MallocBdev::new(&name, num_blocks, block_size, uuid)?.with_physical_block_size(pbs));
        self.register(b.clone())?;
        if let Some(e) = self.entries.last_mut() {
            e.malloc = Some(b);
        }
        Ok(name)
    }

    pub fn create_null(&mut self, name: &str, num_blocks: u64, block_size: u32, uuid: Option<Uuid>) -> Result<String, RegistryError> {
        check_geometry(num_blocks, block_size)?;
        self.register(Arc::new(NullBdev::new(name, num_blocks, block_size, uuid)))?;
        Ok(name.to_string())
    }

    /// A file or block device on io_uring (`bdev_uring_create`, `bdev_aio_create`).
    pub fn create_file(
        &mut self,
        kind: FileKind,
        name: &str,
        filename: &str,
        block_size: Option<u32>,
        readonly: bool,
        uuid: Option<Uuid>,
    ) -> Result<String, RegistryError> {
        check_name(name)?;
        if self.contains(name) {
            return Err(RegistryError::Exists(name.to_string()));
        }
        // A block device is opened O_EXCL, which refuses a second opener; a regular file is
        // compared by device and inode, so another path to it (a link) is refused too.
        let file_id = std::fs::metadata(filename).ok().filter(|m| m.is_file()).map(|m| (m.dev(), m.ino()));
        if let Some(other) = file_id.and_then(|id| self.entries.iter().find(|e| e.backing_file == Some(id))) {
            return Err(RegistryError::File {
                errno: -libc::EBUSY,
                message: format!("{filename} is already the backing file of bdev {}", other.bdev.info().name),
            });
        }
        let b = FileBdev::open(kind, name, filename, block_size.filter(|&b| b != 0), readonly, uuid)?;
        self.register(Arc::new(b))?;
        if let Some(e) = self.entries.last_mut() {
            e.backing_file = file_id;
        }
        Ok(name.to_string())
    }

    /// Attaches the NVMe controller at PCI address `traddr` as `name`
    /// (`bdev_nvme_attach_controller`): one bdev `<name>n<nsid>` per namespace, all or none.
    pub fn attach_nvme(&mut self, name: &str, trtype: &str, traddr: &str) -> Result<Vec<String>, RegistryError> {
        check_name(name)?;
        if !trtype.eq_ignore_ascii_case("pcie") {
            return Err(NvmeError::Trtype(trtype.to_string()).into());
        }
        if self.nvme.iter().any(|c| c.name == name) {
            return Err(RegistryError::Exists(format!("NVMe controller {name}")));
        }
        let addr = crate::nvme::canonical_traddr(traddr)?;
        if let Some(c) = self.nvme.iter().find(|c| c.traddr == addr) {
            return Err(RegistryError::Exists(format!("NVMe controller at {addr} (attached as {})", c.name)));
        }
        let (ctrlr, bdevs) = crate::nvme::attach(name, &addr)?;
        for b in &bdevs {
            check_name(&b.info().name)?;
            if self.contains(&b.info().name) {
                return Err(RegistryError::Exists(b.info().name.clone()));
            }
        }
        let names = ctrlr.bdevs.clone();
        for b in bdevs {
            self.register(Arc::new(b))?;
        }
        log::info!("NVMe controller {name} ({}) at {addr} attached: {}", ctrlr.kernel_name, names.join(", "));
        self.nvme.push(ctrlr);
        Ok(names)
    }

    /// Detaches an NVMe controller and deletes its bdevs; refused while any is claimed.
    pub fn detach_nvme(&mut self, name: &str) -> Result<(), RegistryError> {
        let i = self.nvme.iter().position(|c| c.name == name).ok_or_else(|| RegistryError::NotFound(format!("NVMe controller {name}")))?;
        for b in &self.nvme[i].bdevs {
            if let Some(owner) = self.claimed_by(b) {
                return Err(RegistryError::Claimed { name: b.clone(), owner: owner.to_string() });
            }
        }
        let c = self.nvme.remove(i);
        for b in &c.bdevs {
            let _ = self.delete(b, Some(crate::nvme::PRODUCT));
        }
        log::info!("NVMe controller {name} at {} detached", c.traddr);
        Ok(())
    }

    /// Attached NVMe controllers (all, or the one named).
    pub fn nvme_controllers(&self) -> impl Iterator<Item = &NvmeCtrlr> {
        self.nvme.iter()
    }

    /// Reads the size of a device's backing store again (`bdev_*_rescan`) and takes it:
    /// growing is always allowed, shrinking only while no one claims the device (blocks in
    /// use must not vanish). Returns the size in blocks.
    pub fn rescan(&mut self, name: &str, product: Option<&str>) -> Result<u64, RegistryError> {
        let i = self.pos(name).ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let e = &self.entries[i];
        if product.is_some_and(|p| e.bdev.info().product_name != p) {
            return Err(RegistryError::NotFound(name.to_string()));
        }
        let new = e.bdev.rescan_blocks().ok_or_else(|| RegistryError::NotResizable(name.to_string()))??;
        let old = e.bdev.info().num_blocks();
        if new < old {
            if let Some(owner) = &e.claimed_by {
                return Err(RegistryError::ShrinkClaimed { name: name.to_string(), owner: owner.clone(), old, new });
            }
        }
        if new == 0 {
            return Err(RegistryError::ZeroBlocks);
        }
        if new != old {
            e.bdev.set_num_blocks(new);
            log::info!("bdev {name} resized from {old} to {new} blocks");
        }
        Ok(new)
    }

    /// The entry `name` of product `product` and the size `new_size_mib` MiB asks for, in
    /// blocks (never 0; always whole blocks: the block sizes divide a MiB).
    fn resize_target(&self, name: &str, product: &str, new_size_mib: u64) -> Result<(usize, u64), RegistryError> {
        let i = self.pos(name).filter(|&i| self.entries[i].bdev.info().product_name == product);
        let i = i.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let bs = self.entries[i].bdev.info().block_size as u64;
        let blocks = new_size_mib.checked_mul(1 << 20).map(|b| b / bs).ok_or_else(|| {
            RegistryError::NoMemory(format!("bdev {name}: new_size {new_size_mib} MiB cannot be addressed"))
        })?;
        if blocks == 0 {
            return Err(RegistryError::ZeroBlocks);
        }
        Ok((i, blocks))
    }

    /// `bdev_null_resize` (SPDK's): the null device `name` grows to `new_size_mib` MiB;
    /// a smaller size is refused, as SPDK does. Returns the size in blocks. A LUN over it
    /// raises CAPACITY DATA HAS CHANGED on its next command, as after a file's rescan.
    pub fn null_resize(&mut self, name: &str, new_size_mib: u64) -> Result<u64, RegistryError> {
        let (i, new) = self.resize_target(name, crate::null::PRODUCT, new_size_mib)?;
        let e = &self.entries[i];
        let old = e.bdev.info().num_blocks();
        if new < old {
            let old_mib = e.bdev.info().size_bytes() >> 20;
            return Err(RegistryError::NoShrink { name: name.to_string(), kind: "null", old_mib, new_mib: new_size_mib });
        }
        if new != old {
            e.bdev.set_num_blocks(new);
            log::info!("bdev {name} resized from {old} to {new} blocks");
        }
        Ok(new)
    }

    /// `bdev_malloc_resize` (riser's): the malloc device `name` becomes `new_size_mib` MiB.
    /// Growing takes new memory (refused, nothing changed, when the machine does not have
    /// it: [`MallocBdev::resize`]); shrinking is allowed only while no one claims the device,
    /// the rule of a rescanned file (blocks a LUN uses must not vanish). Returns the size in
    /// blocks. A LUN over it raises CAPACITY DATA HAS CHANGED on its next command.
    pub fn malloc_resize(&mut self, name: &str, new_size_mib: u64) -> Result<u64, RegistryError> {
        let (i, new) = self.resize_target(name, crate::malloc::PRODUCT, new_size_mib)?;
        let e = &self.entries[i];
        let old = e.bdev.info().num_blocks();
        if new < old {
            if let Some(owner) = &e.claimed_by {
                return Err(RegistryError::ShrinkClaimed { name: name.to_string(), owner: owner.clone(), old, new });
            }
        }
        let m = e.malloc.as_ref().ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        if new != old {
            m.resize(new)?;
            log::info!("bdev {name} resized from {old} to {new} blocks");
        }
        Ok(new)
    }

    /// Removes an unclaimed device. Channels already open keep it alive until they close.
    pub fn delete(&mut self, name: &str, product: Option<&str>) -> Result<(), RegistryError> {
        let i = self.pos(name).ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        if let Some(p) = product {
            if self.entries[i].bdev.info().product_name != p {
                return Err(RegistryError::NotFound(name.to_string()));
            }
        }
        if let Some(owner) = &self.entries[i].claimed_by {
            return Err(RegistryError::Claimed { name: name.to_string(), owner: owner.clone() });
        }
        self.entries.remove(i);
        log::info!("bdev {name} deleted");
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Bdev>> {
        self.pos(name).map(|i| self.entries[i].bdev.clone())
    }

    /// A device's I/O statistics (`bdev_get_iostat`), by name.
    pub fn stats(&self, name: &str) -> Option<Arc<BdevStats>> {
        self.pos(name).map(|i| self.entries[i].stats.clone())
    }

    /// (device, its statistics) in creation order.
    pub fn iter_stats(&self) -> impl Iterator<Item = (&Arc<dyn Bdev>, &Arc<BdevStats>)> {
        self.entries.iter().map(|e| (&e.bdev, &e.stats))
    }

    pub fn claimed_by(&self, name: &str) -> Option<&str> {
        self.pos(name).and_then(|i| self.entries[i].claimed_by.as_deref())
    }

    /// Claims a device for `owner` (e.g. a LUN); a claimed device cannot be deleted or
    /// claimed again.
    pub fn claim(&mut self, name: &str, owner: &str) -> Result<Arc<dyn Bdev>, RegistryError> {
        let i = self.pos(name).ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let e = &mut self.entries[i];
        if let Some(o) = &e.claimed_by {
            return Err(RegistryError::Claimed { name: name.to_string(), owner: o.clone() });
        }
        e.claimed_by = Some(owner.to_string());
        Ok(e.bdev.clone())
    }

    pub fn release(&mut self, name: &str) {
        if let Some(i) = self.pos(name) {
            self.entries[i].claimed_by = None;
        }
    }

    /// (device, claimed) in creation order.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<dyn Bdev>, bool)> {
        self.entries.iter().map(|e| (&e.bdev, e.claimed_by.is_some()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{run_sync, BdevIo, IoBuf, IoKind, Lba};

    fn io(kind: IoKind, off: u64, n: u64, buf: Option<Vec<u8>>, tag: u64) -> BdevIo {
        let offset_blocks = Lba::new(off);
        BdevIo { kind, offset_blocks, num_blocks: n, buf: buf.map(IoBuf::from), tag, fua: false }
    }

    #[test]
    fn malloc_keeps_data_and_checks_range() {
        let mut r = BdevRegistry::new();
        let name = r.create_malloc(None, 1024, 512, None).unwrap();
        assert_eq!(name, "Malloc0");
        let mut ch = r.get(&name).unwrap().open_channel();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let c = run_sync(&mut *ch, io(IoKind::Write, 100, 8, Some(data.clone()), 1));
        assert_eq!(c.result, Ok(()));
        let c = run_sync(&mut *ch, io(IoKind::Read, 100, 8, Some(vec![0xAA; 4096]), 2));
        assert_eq!(c.result, Ok(()));
        assert_eq!(c.buf.unwrap().as_slice(), &data[..]);
        // A neighbouring block is untouched.
        let c = run_sync(&mut *ch, io(IoKind::Read, 99, 1, Some(vec![0xAA; 512]), 3));
        assert!(c.buf.unwrap().as_slice().iter().all(|&b| b == 0));
        // Write zeroes then read.
        let c = run_sync(&mut *ch, io(IoKind::WriteZeroes, 101, 2, None, 4));
        assert_eq!(c.result, Ok(()));
        let c = run_sync(&mut *ch, io(IoKind::Read, 100, 3, Some(vec![0xAA; 1536]), 5));
        let b = c.buf.unwrap();
        assert_eq!(&b.as_slice()[..512], &data[..512]);
        assert!(b.as_slice()[512..].iter().all(|&x| x == 0));
        // Out of range, overflowing, wrong buffer, no buffer: errors, not panics.
        let c = run_sync(&mut *ch, io(IoKind::Read, 1020, 8, Some(vec![0; 4096]), 6));
        assert_eq!(c.result, Err(BdevError::OutOfRange { offset: Lba::new(1020), num: 8, capacity: 1024 }));
        let c = run_sync(&mut *ch, io(IoKind::Write, u64::MAX, 2, Some(vec![0; 1024]), 7));
        assert!(matches!(c.result, Err(BdevError::OutOfRange { .. })));
        let c = run_sync(&mut *ch, io(IoKind::Write, 0, 2, Some(vec![0; 1000]), 8));
        assert_eq!(c.result, Err(BdevError::BufferSize { expected: 1024, got: 1000 }));
        let c = run_sync(&mut *ch, io(IoKind::Read, 0, 1, None, 9));
        assert_eq!(c.result, Err(BdevError::MissingBuffer(IoKind::Read)));
        assert_eq!(ch.outstanding(), 0);
    }

    #[test]
    fn null_reads_zeros_and_discards_writes() {
        let mut r = BdevRegistry::new();
        r.create_null("Null0", 1 << 20, 4096, None).unwrap();
        let mut ch = r.get("Null0").unwrap().open_channel();
        let c = run_sync(&mut *ch, io(IoKind::Write, 5, 1, Some(vec![0x5A; 4096]), 1));
        assert_eq!(c.result, Ok(()));
        let c = run_sync(&mut *ch, io(IoKind::Read, 5, 1, Some(vec![0xFF; 4096]), 2));
        assert!(c.buf.unwrap().as_slice().iter().all(|&b| b == 0));
        let c = run_sync(&mut *ch, io(IoKind::Read, 1 << 20, 1, Some(vec![0; 4096]), 3));
        assert!(matches!(c.result, Err(BdevError::OutOfRange { .. })));
        // Completions come from poll, never from submit.
        ch.submit(io(IoKind::Flush, 0, 0, None, 4));
        assert_eq!(ch.outstanding(), 1);
        let mut out = Vec::new();
        assert_eq!(ch.poll(&mut out), 1);
        assert_eq!(out[0].tag, 4);
        assert_eq!(out[0].result, Ok(()));
    }

    #[test]
    fn names_claims_and_geometry() {
        let mut r = BdevRegistry::new();
        r.create_malloc(Some("M"), 16, 512, None).unwrap();
        assert_eq!(r.create_null("M", 16, 512, None), Err(RegistryError::Exists("M".into())));
        assert_eq!(r.create_null("N", 16, 1000, None), Err(RegistryError::BadBlockSize(1000)));
        assert_eq!(r.create_null("N", 0, 512, None), Err(RegistryError::ZeroBlocks));
        assert!(matches!(r.create_null("a b", 1, 512, None), Err(RegistryError::BadName(_))));
        r.claim("M", "iqn.x:lun0").unwrap();
        assert!(matches!(r.claim("M", "other"), Err(RegistryError::Claimed { .. })));
        assert_eq!(r.delete("M", None), Err(RegistryError::Claimed { name: "M".into(), owner: "iqn.x:lun0".into() }));
        r.release("M");
        assert_eq!(r.delete("M", Some("Null disk")), Err(RegistryError::NotFound("M".into())));
        assert_eq!(r.delete("M", Some("Malloc disk")), Ok(()));
        assert_eq!(r.delete("M", None), Err(RegistryError::NotFound("M".into())));
        assert!(matches!(r.create_malloc_with(Some("P"), 16, 512, Some(1000), None), Err(RegistryError::BadPhysicalBlockSize { .. })));
        r.create_malloc_with(Some("P"), 16, 512, Some(4096), None).unwrap();
        assert_eq!(r.get("P").unwrap().info().physical_block_size, 4096);
        assert!(matches!(r.create_malloc(Some("Huge"), u64::MAX / 512, 512, None), Err(RegistryError::Device(_))));
    }

    #[test]
    fn null_resize_grows_only_as_spdk_does() {
        let mut r = BdevRegistry::new();
        r.create_null("N", 2048, 512, None).unwrap();
        r.create_malloc(Some("M"), 2048, 512, None).unwrap();
        r.claim("N", "iqn.x:lun1").unwrap();
        assert_eq!(r.null_resize("N", 4), Ok(8192), "a claimed null bdev grows");
        assert_eq!(r.get("N").unwrap().info().num_blocks(), 8192);
        assert_eq!(r.get("N").unwrap().config_json().1["num_blocks"], 8192, "save_config shows the new size");
        assert_eq!(r.null_resize("N", 4), Ok(8192), "the same size is no change");
        let e = r.null_resize("N", 2).unwrap_err();
        assert_eq!(e, RegistryError::NoShrink { name: "N".into(), kind: "null", old_mib: 4, new_mib: 2 });
        assert!(e.to_string().contains("smaller than the current 4 MiB"), "{e}");
        assert_eq!(r.null_resize("N", 0), Err(RegistryError::ZeroBlocks));
        assert_eq!(r.null_resize("M", 8), Err(RegistryError::NotFound("M".into())), "not a null bdev");
        assert_eq!(r.null_resize("nope", 8), Err(RegistryError::NotFound("nope".into())));
        assert!(matches!(r.null_resize("N", u64::MAX), Err(RegistryError::NoMemory(_))));
        assert_eq!(r.get("N").unwrap().info().num_blocks(), 8192, "refused calls changed nothing");
    }

    #[test]
    fn malloc_resize_grows_claimed_and_shrinks_unclaimed() {
        let mut r = BdevRegistry::new();
        r.create_malloc(Some("M"), 2048, 4096, None).unwrap();
        let b = r.get("M").unwrap();
        let mut ch = b.clone().open_channel();
        let data = vec![0x5Au8; 4096];
        assert_eq!(run_sync(&mut *ch, io(IoKind::Write, 2047, 1, Some(data.clone()), 1)).result, Ok(()));
        r.claim("M", "iqn.x:lun2").unwrap();
        assert_eq!(r.malloc_resize("M", 16), Ok(4096));
        assert_eq!(b.info().num_blocks(), 4096, "the LUN's handle sees the new size");
        assert_eq!(b.config_json().1["num_blocks"], 4096);
        assert_eq!(run_sync(&mut *ch, io(IoKind::Write, 4095, 1, Some(data.clone()), 2)).result, Ok(()));
        let c = run_sync(&mut *ch, io(IoKind::Read, 2047, 1, Some(vec![0; 4096]), 3));
        assert_eq!(c.buf.unwrap().as_slice(), &data[..], "data written before the growth is kept");
        assert!(matches!(r.malloc_resize("M", 4), Err(RegistryError::ShrinkClaimed { old: 4096, new: 1024, .. })));
        assert!(matches!(r.malloc_resize("M", 1 << 40), Err(RegistryError::NoMemory(_))));
        assert_eq!(r.malloc_resize("M", 0), Err(RegistryError::ZeroBlocks));
        assert_eq!(b.info().num_blocks(), 4096, "refused calls changed nothing");
        r.release("M");
        assert_eq!(r.malloc_resize("M", 4), Ok(1024), "an unclaimed malloc bdev shrinks");
        let c = run_sync(&mut *ch, io(IoKind::Read, 2047, 1, Some(vec![0; 4096]), 4));
        assert!(matches!(c.result, Err(BdevError::OutOfRange { .. })));
        r.create_null("N", 16, 512, None).unwrap();
        assert_eq!(r.malloc_resize("N", 8), Err(RegistryError::NotFound("N".into())), "not a malloc bdev");
    }
}
