//! NVMe through the kernel's driver (SPDK's `bdev_nvme_attach_controller` with trtype
//! PCIe): no user-space PCI driver, hugepages or IOMMU setup. A controller is found by its
//! PCI address in sysfs (/sys/bus/pci/devices/ADDR/nvme/nvmeX), each of its namespaces
//! becomes a bdev `<name>n<nsid>`.
//!
//! I/O path, best first (chosen at attach, said in the log and in `bdev_get_bdevs`):
//!
//! 1. **passthrough, polled**: NVMe Read/Write/Flush/Write Zeroes/Dataset Management
//!    commands through io_uring (`IORING_OP_URING_CMD`) on the namespace's generic char
//!    device /dev/ngXnY, on an IOPOLL ring: the driver's poll queues (`nvme.poll_queues=N`),
//!    completions reaped by the reactor's loop, no interrupt. Commands without data (Flush,
//!    Write Zeroes) go through an interrupt-driven ring of the same thread: Linux 6.1's
//!    driver polls a passthrough command through its bio, so one without data would never
//!    be polled (it hangs on the poll queue; seen in the VM).
//! 2. **passthrough**: the same commands on an interrupt-driven ring, when the driver has no
//!    poll queues (or IOPOLL is refused).
//! 3. **block device**: O_DIRECT on /dev/nvmeXnY through riser's file engine
//!    ([`crate::FileBdev`]), when passthrough is not available (no /dev/ng*, a kernel before
//!    5.19, no permission: before 6.2 passthrough needs CAP_SYS_ADMIN).
//!
//! What the namespace is comes from Identify (admin passthrough ioctl on /dev/nvmeX):
//! block size (the current LBA format), capacity, the volatile write cache (VWC: WCE and
//! what Flush is for), Dataset Management and Write Zeroes (ONCS), whether deallocated
//! blocks read as zeros (DLFEAT). When the ioctl is refused, sysfs says most of it.
//! Mapping: FUA → the FUA bit; SYNCHRONIZE CACHE → Flush; UNMAP → Write Zeroes with DEAC
//! (zeros guaranteed, as SCSI's LBPRZ promises; deallocated where the device can), or Dataset
//! Management deallocate on a device without Write Zeroes whose deallocated blocks read as
//! zeros (DLFEAT); GET LBA STATUS reads the blocks (NVMe's Get LBA Status is optional and rare: a
//! zeroed block is reported deallocated, which LBPRZ makes indistinguishable).

pub(crate) mod rpc;

pub mod cmd;
mod ring;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use self::cmd::{dsm_range, IdCtrl, IdNs, NvmeCmd, DSM_MAX_RANGES, MAX_NLB, NVME_IOCTL_ADMIN_CMD};
use self::ring::{PtOp, PtRing};
pub use self::ring::PathStats;
use crate::io::{validate, BdevError, BdevInfo, BdevIo, IoBuf, IoChannel, IoCompletion, IoKind};
use crate::{Bdev, FileBdev, FileKind, SUPPORTED_BLOCK_SIZES};

/// The product name bdevs of this kind show (SPDK's).
pub const PRODUCT: &str = "NVMe disk";

#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    #[error("trtype {0:?} is not supported: riser attaches local PCIe controllers through the kernel's nvme driver (trtype PCIe)")]
    Trtype(String),
    #[error("traddr {0:?} is not a PCI address (DDDD:BB:DD.F, e.g. 0000:00:04.0)")]
    BadTraddr(String),
    #[error("no PCI device {0} (/sys/bus/pci/devices/{0} does not exist)")]
    NoDevice(String),
    #[error("PCI device {addr} is not bound to the kernel's nvme driver (driver: {driver}); riser reaches NVMe through it: bind it back to nvme (e.g. echo {addr} > /sys/bus/pci/drivers/nvme/bind)")]
    NotNvme { addr: String, driver: String },
    #[error("controller {ctrl} at {addr} has no namespaces")]
    NoNamespaces { ctrl: String, addr: String },
    #[error("namespace {dev}: {why}")]
    Namespace { dev: String, why: String },
    #[error("{0}")]
    Io(String),
}

impl NvmeError {
    /// SPDK's error code (a negative errno).
    pub fn errno(&self) -> i32 {
        match self {
            NvmeError::Trtype(_) | NvmeError::BadTraddr(_) => -libc::EINVAL,
            NvmeError::NoDevice(_) | NvmeError::NotNvme { .. } | NvmeError::NoNamespaces { .. } => -libc::ENODEV,
            NvmeError::Namespace { .. } | NvmeError::Io(_) => -libc::EIO,
        }
    }
}

/// A PCI address in its canonical form (domain 0000 added when absent, lower case).
pub fn canonical_traddr(s: &str) -> Result<String, NvmeError> {
    let bad = || NvmeError::BadTraddr(s.to_string());
    let t = s.trim().to_ascii_lowercase();
    let parts: Vec<&str> = t.split(':').collect();
    let (dom, bus, devfn) = match parts.as_slice() {
        [d, b, df] => (*d, *b, *df),
        [b, df] => ("0000", *b, *df),
        _ => return Err(bad()),
    };
    let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
    let hex = |x: &str, max_len: usize| !x.is_empty() && x.len() <= max_len && x.chars().all(|c| c.is_ascii_hexdigit());
    if !(hex(dom, 4) && hex(bus, 2) && hex(dev, 2) && hex(func, 1)) {
        return Err(bad());
    }
    let n = |x: &str| u32::from_str_radix(x, 16).map_err(|_| bad());
    let (d, b, v, f) = (n(dom)?, n(bus)?, n(dev)?, n(func)?);
    if v > 0x1f || f > 7 {
        return Err(bad());
    }
    Ok(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

/// How a namespace's I/O reaches the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoPath {
    PassthroughPolled,
    Passthrough,
    BlockDevice,
}

impl IoPath {
    pub fn as_str(self) -> &'static str {
        match self {
            IoPath::PassthroughPolled => "passthrough+iopoll",
            IoPath::Passthrough => "passthrough",
            IoPath::BlockDevice => "block_device",
        }
    }
}

/// An attached controller (what `bdev_nvme_get_controllers` shows).
#[derive(Debug)]
pub struct NvmeCtrlr {
    pub name: String,
    pub traddr: String,
    /// The kernel's name: nvmeX.
    pub kernel_name: String,
    pub id: Option<IdCtrl>,
    /// The bdevs of its namespaces, in nsid order.
    pub bdevs: Vec<String>,
}

impl NvmeCtrlr {
    pub fn info_json(&self) -> serde_json::Value {
        let mut c = serde_json::json!({
            "state": "enabled",
            "trid": {"trtype": "PCIe", "traddr": self.traddr},
            "cntlid": self.id.as_ref().map_or(0, |i| i.cntlid),
            "host": {"nqn": "", "addr": "", "svcid": ""},
            "kernel_device": format!("/dev/{}", self.kernel_name),
        });
        if let Some(i) = &self.id {
            c["cdata"] = serde_json::json!({
                "model_number": i.model, "serial_number": i.serial, "firmware_revision": i.firmware,
                "vendor_id": format!("{:#06x}", i.vid), "volatile_write_cache": i.vwc,
            });
        }
        serde_json::json!({"name": self.name, "ctrlrs": [c], "bdevs": self.bdevs})
    }
}

/// One namespace of a controller, as sysfs names it.
#[derive(Clone, Debug)]
struct NsDev {
    nsid: u32,
    /// nvmeXnY (the block device, and /sys/block/nvmeXnY).
    block: String,
    /// /dev/ngXnY.
    generic: PathBuf,
}

fn read_sys(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn sys_u64(p: impl AsRef<Path>) -> Option<u64> {
    read_sys(p)?.parse().ok()
}

/// `nvme<digits>` only.
fn is_ctrl_name(s: &str) -> bool {
    s.strip_prefix("nvme").is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
}

/// nvmeXnY (a namespace) or nvmeXcZnY (one path of a multipath namespace): the block
/// device's name nvmeXnY and the trailing Y.
fn ns_entry(s: &str) -> Option<(String, u32)> {
    let rest = s.strip_prefix("nvme")?;
    let (x, rest) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit())?);
    if x.is_empty() {
        return None;
    }
    let rest = match rest.strip_prefix('c') {
        Some(r) => {
            let (z, r) = r.split_at(r.find(|c: char| !c.is_ascii_digit())?);
            if z.is_empty() {
                return None;
            }
            r
        }
        None => rest,
    };
    let y = rest.strip_prefix('n')?;
    if y.is_empty() || !y.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((format!("nvme{x}n{y}"), y.parse().ok()?))
}

/// The controller bound to `traddr` and its namespaces.
fn find_controller(traddr: &str) -> Result<(String, Vec<NsDev>), NvmeError> {
    let dev = Path::new("/sys/bus/pci/devices").join(traddr);
    if !dev.exists() {
        return Err(NvmeError::NoDevice(traddr.to_string()));
    }
    let ctrl = std::fs::read_dir(dev.join("nvme"))
        .ok()
        .and_then(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).find(|n| is_ctrl_name(n)));
    let Some(ctrl) = ctrl else {
        let driver = std::fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().to_string()))
            .unwrap_or_else(|| "none".to_string());
        return Err(NvmeError::NotNvme { addr: traddr.to_string(), driver });
    };
    let cdir = Path::new("/sys/class/nvme").join(&ctrl);
    let mut ns: Vec<NsDev> = Vec::new();
    for e in std::fs::read_dir(&cdir).map_err(|e| NvmeError::Io(format!("{}: {e}", cdir.display())))? {
        let Some(name) = e.ok().and_then(|e| e.file_name().into_string().ok()) else { continue };
        let Some((block, y)) = ns_entry(&name) else { continue };
        let nsid = sys_u64(cdir.join(&name).join("nsid")).map_or(y, |n| n as u32);
        let generic = PathBuf::from(format!("/dev/ng{}", &block[4..]));
        if !ns.iter().any(|n| n.block == block) {
            ns.push(NsDev { nsid, block, generic });
        }
    }
    ns.sort_by_key(|n| n.nsid);
    if ns.is_empty() {
        return Err(NvmeError::NoNamespaces { ctrl, addr: traddr.to_string() });
    }
    Ok((ctrl, ns))
}

/// Identify through the admin passthrough ioctl on `dev` (CAP_SYS_ADMIN).
fn identify(dev: &File, cns: u8, nsid: u32) -> io::Result<Vec<u8>> {
    let mut data = vec![0u8; 4096];
    let cmd = NvmeCmd::identify(cns, nsid, data.as_mut_ptr() as u64);
    #[repr(C, align(8))]
    struct Raw([u8; 72]);
    let mut raw = Raw([0u8; 72]);
    raw.0.copy_from_slice(&cmd.to_bytes()[..72]);
    // SAFETY: NVME_IOCTL_ADMIN_CMD reads and writes a 72-byte struct nvme_passthru_cmd
    // (`raw`, 8-byte aligned), and the device writes at most data_len (4096) bytes at `addr`
    // (`data`); both live across the call, which is synchronous.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), NVME_IOCTL_ADMIN_CMD as _, raw.0.as_mut_ptr()) };
    match rc {
        0 => Ok(data),
        r if r < 0 => Err(io::Error::last_os_error()),
        s => Err(io::Error::other(cmd::status_text(s))),
    }
}

/// Everything riser needs of a namespace, from Identify or sysfs.
#[derive(Clone, Debug)]
struct NsProps {
    block_size: u32,
    num_blocks: u64,
    vwc: bool,
    dsm: bool,
    write_zeroes: bool,
    dealloc_zeroes: bool,
    wz_deallocates: bool,
    uuid: Option<Uuid>,
    /// Per-command limits in blocks.
    max_rw_blocks: u64,
    max_wz_blocks: u64,
    max_dsm_blocks: u64,
    /// The driver has poll queues (queue/io_poll).
    poll_queues: bool,
    source: &'static str,
}

fn ns_props(ctrl: &Option<IdCtrl>, ctrl_dev: Option<&File>, ns: &NsDev) -> Result<NsProps, NvmeError> {
    let q = Path::new("/sys/block").join(&ns.block).join("queue");
    let nserr = |why: String| NvmeError::Namespace { dev: ns.block.clone(), why };
    let sys_bs = sys_u64(q.join("logical_block_size")).unwrap_or(512) as u32;
    let max_hw = sys_u64(q.join("max_hw_sectors_kb")).unwrap_or(128) * 1024;
    // A user buffer is mapped page by page: keep a command within the driver's segments.
    let segs = sys_u64(q.join("max_segments")).unwrap_or(33).max(2);
    let max_bytes = max_hw.min((segs - 1) * 4096).max(4096);
    let wz_bytes = sys_u64(q.join("write_zeroes_max_bytes")).unwrap_or(0);
    let discard_bytes = sys_u64(q.join("discard_max_hw_bytes")).unwrap_or(0);
    let poll_queues = read_sys(q.join("io_poll")).is_some_and(|s| s == "1");
    let idns = ctrl_dev.and_then(|f| match identify(f, 0, ns.nsid) {
        Ok(b) => IdNs::parse(&b),
        Err(e) => {
            log::warn!("{}: Identify Namespace failed ({e}); using sysfs", ns.block);
            None
        }
    });
    let (block_size, num_blocks, dealloc_zeroes, wz_deallocates, uuid, source) = match &idns {
        Some(n) => {
            if n.metadata_size != 0 {
                return Err(nserr(format!("formatted with {} bytes of metadata per block; riser serves namespaces without metadata (nvme format --ms=0)", n.metadata_size)));
            }
            let uuid = if n.nguid != [0; 16] {
                Some(Uuid::from_bytes(n.nguid))
            } else if n.eui64 != [0; 8] {
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&n.eui64);
                b[8..12].copy_from_slice(&ns.nsid.to_be_bytes());
                Some(Uuid::from_bytes(b))
            } else {
                None
            };
            (n.block_size, n.nsze, n.dealloc_reads_zeroes, n.write_zeroes_deallocates, uuid, "identify")
        }
        None => {
            let sectors = sys_u64(Path::new("/sys/block").join(&ns.block).join("size")).unwrap_or(0);
            (sys_bs, sectors * 512 / sys_bs.max(512) as u64, false, false, None, "sysfs")
        }
    };
    if !SUPPORTED_BLOCK_SIZES.contains(&block_size) {
        return Err(nserr(format!("block size {block_size} is not supported (riser serves 512 and 4096)")));
    }
    if num_blocks == 0 {
        return Err(nserr("has no blocks (size 0)".to_string()));
    }
    let bs = block_size as u64;
    let (vwc, dsm, write_zeroes) = match (ctrl, &idns) {
        (Some(c), Some(_)) => (c.vwc, c.dsm(), c.write_zeroes()),
        _ => (read_sys(q.join("write_cache")).is_none_or(|s| s != "write through"), discard_bytes > 0, wz_bytes > 0),
    };
    let uuid = uuid.or_else(|| {
        // A stable identity from the namespace's own IDs in sysfs.
        let id = read_sys(Path::new("/sys/block").join(&ns.block).join("wwid"))?;
        let h = fnv128(id.as_bytes());
        Some(Uuid::from_bytes(h))
    });
    Ok(NsProps {
        block_size,
        num_blocks,
        vwc,
        dsm,
        write_zeroes,
        dealloc_zeroes,
        wz_deallocates,
        uuid,
        max_rw_blocks: (max_bytes / bs).clamp(1, MAX_NLB),
        max_wz_blocks: if wz_bytes > 0 { (wz_bytes / bs).clamp(1, MAX_NLB) } else { MAX_NLB },
        max_dsm_blocks: if discard_bytes > 0 { (discard_bytes / bs).clamp(1, u32::MAX as u64) } else { u32::MAX as u64 },
        poll_queues,
        source,
    })
}

fn fnv128(b: &[u8]) -> [u8; 16] {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for &x in b {
        h ^= x as u128;
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    h.to_be_bytes()
}

/// How an UNMAP reaches the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UnmapHow {
    None,
    /// Dataset Management deallocate (deallocated blocks read as zeros).
    Dsm,
    /// Write Zeroes with DEAC: zeros for sure, deallocated where the device can.
    WriteZeroesDeac,
}

enum Path_ {
    Passthrough { ng: Arc<File>, polled: bool },
    Block(Arc<FileBdev>),
}

/// A namespace served as a bdev.
pub struct NvmeBdev {
    info: BdevInfo,
    ctrlr_name: String,
    traddr: String,
    nsid: u32,
    ns: NsDev,
    props: NsProps,
    unmap: UnmapHow,
    path: Path_,
    stats: Arc<PathStats>,
}

impl NvmeBdev {
    pub fn io_path(&self) -> IoPath {
        match &self.path {
            Path_::Passthrough { polled: true, .. } => IoPath::PassthroughPolled,
            Path_::Passthrough { polled: false, .. } => IoPath::Passthrough,
            Path_::Block(_) => IoPath::BlockDevice,
        }
    }

    pub fn stats(&self) -> &Arc<PathStats> {
        &self.stats
    }
}

/// Whether passthrough works on `ng` (a one-block read of LBA 0), on a polled ring or not.
///
/// The probe's ring lives on a short-lived thread of its own: a ring's teardown notifies
/// the thread that made it, and the caller (the RPC thread) would see its next timed read
/// fail with EINTR (see `uring::probe`).
fn probe_passthrough(ng: &File, nsid: u32, bs: u32, polled: bool) -> Result<(), String> {
    let ng = ng.try_clone().map_err(|e| e.to_string())?;
    let probe = move || {
        let mut buf = IoBuf::alloc(bs as usize);
        let cmd = NvmeCmd::rw(false, nsid, 0, 1, buf.as_mut_slice().as_mut_ptr() as u64, bs, false);
        match ring::run_one(&ng, &cmd, polled, buf, Duration::from_secs(10)) {
            Ok((0, _)) => Ok(()),
            Ok((r, _)) if r < 0 => Err(io::Error::from_raw_os_error(-r).to_string()),
            Ok((s, _)) => Err(cmd::status_text(s)),
            Err(e) => Err(e.to_string()),
        }
    };
    let thread = std::thread::Builder::new().name("nvme-probe".into()).spawn(probe).map_err(|e| e.to_string())?;
    thread.join().unwrap_or_else(|_| Err("the probe thread panicked".into()))
}

/// Attaches the controller at `traddr`: its namespaces as bdevs `<name>n<nsid>`.
pub fn attach(name: &str, traddr: &str) -> Result<(NvmeCtrlr, Vec<NvmeBdev>), NvmeError> {
    let traddr = canonical_traddr(traddr)?;
    let (kernel_name, namespaces) = find_controller(&traddr)?;
    let ctrl_path = format!("/dev/{kernel_name}");
    let ctrl_dev = match File::open(&ctrl_path) {
        Ok(f) => Some(f),
        Err(e) => {
            log::warn!("{ctrl_path}: {e}; namespace properties from sysfs");
            None
        }
    };
    let id = ctrl_dev.as_ref().and_then(|f| match identify(f, 1, 0) {
        Ok(b) => IdCtrl::parse(&b),
        Err(e) => {
            log::warn!("{ctrl_path}: Identify Controller failed ({e}); namespace properties from sysfs");
            None
        }
    });
    let mut bdevs = Vec::new();
    for ns in namespaces {
        let props = ns_props(&id, ctrl_dev.as_ref(), &ns)?;
        let bname = format!("{name}n{}", ns.nsid);
        let stats = Arc::new(PathStats::default());
        let opened = OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(&ns.generic);
        let mut path = None;
        match opened {
            Err(e) => log::warn!(
                "NVMe {bname}: no io_uring passthrough ({}: {e}); falling back to O_DIRECT on /dev/{} (needs the generic char device: kernel 5.19 or later, and CAP_SYS_ADMIN before 6.2)",
                ns.generic.display(),
                ns.block
            ),
            Ok(ng) => {
                if !props.poll_queues {
                    log::warn!("NVMe {bname}: the nvme driver has no poll queues (/sys/block/{}/queue/io_poll is not 1): passthrough without polling, completions by interrupt; set nvme.poll_queues=N (kernel command line or modprobe option) for polled I/O", ns.block);
                }
                let polled_ok = props.poll_queues && match probe_passthrough(&ng, ns.nsid, props.block_size, true) {
                    Ok(()) => true,
                    Err(e) => {
                        log::warn!("NVMe {bname}: polled passthrough (IOPOLL) failed on {} ({e}); trying without polling", ns.generic.display());
                        false
                    }
                };
                if polled_ok {
                    path = Some(Path_::Passthrough { ng: Arc::new(ng), polled: true });
                } else {
                    match probe_passthrough(&ng, ns.nsid, props.block_size, false) {
                        Ok(()) => path = Some(Path_::Passthrough { ng: Arc::new(ng), polled: false }),
                        Err(e) => log::warn!("NVMe {bname}: io_uring passthrough failed on {} ({e}); falling back to O_DIRECT on /dev/{} (passthrough needs kernel 5.19+, IOPOLL 6.1+, and CAP_SYS_ADMIN before 6.2)", ns.generic.display(), ns.block),
                    }
                }
            }
        }
        let path = match path {
            Some(p) => p,
            None => {
                let f = FileBdev::open(FileKind::Uring, &bname, &format!("/dev/{}", ns.block), Some(props.block_size), false, props.uuid)
                    .map_err(|e| NvmeError::Namespace { dev: ns.block.clone(), why: e.to_string() })?;
                Path_::Block(Arc::new(f))
            }
        };
        let unmap = match &path {
            Path_::Block(f) => {
                if f.supports(IoKind::Unmap) { UnmapHow::WriteZeroesDeac } else { UnmapHow::None }
            }
            // SCSI promises LBPRZ: an unmapped block reads as zeros. Write Zeroes with DEAC
            // guarantees it (and deallocates where the device can); a deallocate by DSM only
            // where DLFEAT says deallocated blocks read as zeros (a device may also ignore
            // the parts of a range it cannot deallocate, e.g. qemu's below its alignment).
            Path_::Passthrough { .. } if props.write_zeroes => UnmapHow::WriteZeroesDeac,
            Path_::Passthrough { .. } if props.dsm && props.dealloc_zeroes => UnmapHow::Dsm,
            Path_::Passthrough { .. } => UnmapHow::None,
        };
        let mut info = BdevInfo::new(&bname, PRODUCT, props.block_size, props.num_blocks, props.uuid.unwrap_or_else(Uuid::new_v4));
        info.volatile_write_cache = props.vwc;
        let b = NvmeBdev {
            info,
            ctrlr_name: name.to_string(),
            traddr: traddr.clone(),
            nsid: ns.nsid,
            ns: ns.clone(),
            props,
            unmap,
            path,
            stats,
        };
        log::info!(
            "NVMe {bname}: {} ({}) at {traddr}, nsid {}: {} blocks of {} bytes, I/O path {}, write cache {}, unmap {:?}, write zeroes {}, properties from {}",
            ns.block,
            kernel_name,
            ns.nsid,
            b.info.num_blocks(),
            b.info.block_size,
            b.io_path().as_str(),
            if b.props.vwc { "on" } else { "off" },
            b.unmap,
            b.props.write_zeroes,
            b.props.source
        );
        bdevs.push(b);
    }
    let ctrlr = NvmeCtrlr {
        name: name.to_string(),
        traddr,
        kernel_name,
        id,
        bdevs: bdevs.iter().map(|b| b.info.name.clone()).collect(),
    };
    Ok((ctrlr, bdevs))
}

impl Bdev for NvmeBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, kind: IoKind) -> bool {
        match kind {
            IoKind::Read | IoKind::Write | IoKind::Flush => true,
            IoKind::Unmap => self.unmap != UnmapHow::None,
            IoKind::WriteZeroes => match &self.path {
                Path_::Block(f) => f.supports(kind),
                Path_::Passthrough { .. } => self.props.write_zeroes,
            },
            IoKind::CompareAndWrite => false,
        }
    }

    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        match &self.path {
            Path_::Block(f) => f.clone().open_channel(),
            Path_::Passthrough { polled, .. } => match PtRing::current(*polled) {
                Ok(ring) => {
                    let chan = ring.open_channel();
                    // Commands without data (Flush, Write Zeroes) cannot be polled on Linux
                    // 6.1 (the driver polls a passthrough command through its bio), so on
                    // the polled path they go through an interrupt-driven ring.
                    let plain = if *polled {
                        match PtRing::current(false) {
                            Ok(r) => {
                                let c = r.open_channel();
                                Some((r, c))
                            }
                            Err(e) => {
                                return Box::new(crate::io::FailedChannel::new(format!("NVMe passthrough ring cannot be set up on this thread: {e}")))
                            }
                        }
                    } else {
                        None
                    };
                    Box::new(NvmeChannel { bdev: self, ring, chan, plain })
                }
                Err(e) => Box::new(crate::io::FailedChannel::new(format!("NVMe passthrough ring cannot be set up on this thread: {e}"))),
            },
        }
    }

    fn config_json(&self) -> (&'static str, serde_json::Value) {
        ("bdev_nvme_attach_controller", serde_json::json!({"name": self.ctrlr_name, "trtype": "PCIe", "traddr": self.traddr}))
    }

    fn driver_specific(&self) -> serde_json::Value {
        let generic = self.ns.generic.display().to_string();
        serde_json::json!({"nvme": [{
            "pci_address": self.traddr,
            "trid": {"trtype": "PCIe", "traddr": self.traddr},
            "ns_data": {"id": self.nsid},
            "block_device": format!("/dev/{}", self.ns.block),
            "char_device": generic,
            "io_path": self.io_path().as_str(),
            "iopoll": self.io_path() == IoPath::PassthroughPolled,
            "passthrough_commands": self.stats.commands.load(Ordering::Relaxed),
            "polled_commands": self.stats.polled.load(Ordering::Relaxed),
            "interrupt_commands": self.stats.interrupt.load(Ordering::Relaxed),
            "failed_commands": self.stats.errors.load(Ordering::Relaxed),
            "unmap": match self.unmap { UnmapHow::None => "none", UnmapHow::Dsm => "dsm_deallocate", UnmapHow::WriteZeroesDeac => "write_zeroes_deac" },
            "write_zeroes_deallocates": self.props.wz_deallocates,
            "properties_from": self.props.source,
        }]})
    }
}

/// A reactor's handle on a passthrough namespace: its channel in the thread's ring.
struct NvmeChannel {
    bdev: Arc<NvmeBdev>,
    ring: Rc<PtRing>,
    chan: u32,
    /// On the polled path: the thread's interrupt-driven ring and this channel's place in it,
    /// for commands that carry no data.
    plain: Option<(Rc<PtRing>, u32)>,
}

/// Per-command limits and how UNMAP is done: what turns one I/O into NVMe commands.
#[derive(Clone, Copy, Debug)]
struct Plan {
    nsid: u32,
    block_size: u64,
    max_rw_blocks: u64,
    max_wz_blocks: u64,
    max_dsm_blocks: u64,
    unmap: UnmapHow,
    vwc: bool,
}

/// The NVMe commands of one validated I/O of `n` (> 0, or a Flush) blocks at `lba`; `data`:
/// the address of the I/O's buffer (reads and writes). Returns the commands, the DSM range
/// descriptors they point into (whose address the commands take from the returned vector's
/// heap buffer), and whether a Flush must follow.
fn plan_commands(p: &Plan, kind: IoKind, lba: u64, n: u64, data: u64, fua: bool) -> (Vec<NvmeCmd>, Option<Vec<u8>>, bool) {
    let mut cmds = Vec::new();
    let chunks = |max: u64| {
        let mut v = Vec::new();
        let mut done = 0;
        while done < n {
            let k = (n - done).min(max);
            v.push((lba + done, k));
            done += k;
        }
        v
    };
    match kind {
        IoKind::Read | IoKind::Write => {
            for (at, k) in chunks(p.max_rw_blocks) {
                let off = (at - lba) * p.block_size;
                cmds.push(NvmeCmd::rw(kind == IoKind::Write, p.nsid, at, k, data + off, (k * p.block_size) as u32, fua));
            }
        }
        IoKind::Flush => cmds.push(NvmeCmd::flush(p.nsid)),
        // Not supported (supports() says so): the SCSI layer reads, compares and writes.
        IoKind::CompareAndWrite => {}
        IoKind::WriteZeroes => {
            for (at, k) in chunks(p.max_wz_blocks) {
                cmds.push(NvmeCmd::write_zeroes(p.nsid, at, k, false, fua));
            }
        }
        IoKind::Unmap if p.unmap == UnmapHow::WriteZeroesDeac => {
            for (at, k) in chunks(p.max_wz_blocks) {
                cmds.push(NvmeCmd::write_zeroes(p.nsid, at, k, true, fua));
            }
        }
        IoKind::Unmap => {
            let ranges = chunks(p.max_dsm_blocks.min(u32::MAX as u64));
            let mut bytes = vec![0u8; ranges.len() * 16];
            for (i, (at, k)) in ranges.iter().enumerate() {
                bytes[i * 16..i * 16 + 16].copy_from_slice(&dsm_range(*at, *k as u32));
            }
            let base = bytes.as_ptr() as u64;
            for (i, chunk) in ranges.chunks(DSM_MAX_RANGES).enumerate() {
                cmds.push(NvmeCmd::dsm_deallocate(p.nsid, base + (i * DSM_MAX_RANGES * 16) as u64, chunk.len()));
            }
            return (cmds, Some(bytes), fua && p.vwc);
        }
    }
    (cmds, None, false)
}

impl NvmeBdev {
    fn plan(&self) -> Plan {
        Plan {
            nsid: self.nsid,
            block_size: self.info.block_size as u64,
            max_rw_blocks: self.props.max_rw_blocks,
            max_wz_blocks: self.props.max_wz_blocks,
            max_dsm_blocks: self.props.max_dsm_blocks,
            unmap: self.unmap,
            vwc: self.props.vwc,
        }
    }
}

impl IoChannel for NvmeChannel {
    fn submit(&mut self, io: BdevIo) {
        let d = &self.bdev;
        if let Err(e) = validate(&d.info, d.supports(io.kind), &io) {
            return self.ring.complete_now(self.chan, IoCompletion { tag: io.tag, kind: io.kind, result: Err(e), buf: io.buf });
        }
        if io.num_blocks == 0 && io.kind != IoKind::Flush {
            return self.ring.complete_now(self.chan, IoCompletion { tag: io.tag, kind: io.kind, result: Ok(()), buf: io.buf });
        }
        let Path_::Passthrough { ng, .. } = &d.path else {
            return self.ring.complete_now(self.chan, IoCompletion { tag: io.tag, kind: io.kind, result: Err(BdevError::Io("not a passthrough namespace".into())), buf: io.buf });
        };
        let mut io = io;
        let mut buf = io.buf.take();
        let data = buf.as_mut().map_or(0, |b| b.as_mut_slice().as_mut_ptr() as u64);
        let (cmds, dsm, flush) = plan_commands(&d.plan(), io.kind, io.offset_blocks.get(), io.num_blocks, data, io.fua);
        let dataless = cmds.iter().all(|c| c.data_len == 0) || flush;
        let (ring, chan) = match (&self.plain, dataless) {
            (Some((r, c)), true) => (r, *c),
            _ => (&self.ring, self.chan),
        };
        let mut op = PtOp::new(chan, io.tag, io.kind, ng.clone(), buf, d.stats.clone());
        op.cmds = cmds;
        op.dsm = dsm;
        op.flush_after = flush.then_some(d.nsid);
        ring.submit(op);
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let n = self.ring.poll(self.chan, out);
        match &self.plain {
            Some((r, c)) => n + r.poll(*c, out),
            None => n,
        }
    }

    fn outstanding(&self) -> usize {
        self.ring.outstanding(self.chan) + self.plain.as_ref().map_or(0, |(r, c)| r.outstanding(*c))
    }
}

impl Drop for NvmeChannel {
    fn drop(&mut self) {
        self.ring.close_channel(self.chan);
        if let Some((r, c)) = &self.plain {
            r.close_channel(*c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses() {
        assert_eq!(canonical_traddr("0000:00:04.0").unwrap(), "0000:00:04.0");
        assert_eq!(canonical_traddr("00:04.0").unwrap(), "0000:00:04.0");
        assert_eq!(canonical_traddr("0000:5E:00.1").unwrap(), "0000:5e:00.1");
        for bad in ["", "0000:00:04", "0000:00:20.0", "0000:00:04.8", "zz:00.0", "1:2:3:4.0", "0000:00:04.0/../x", "10.0.0.1"] {
            assert!(canonical_traddr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn namespace_names() {
        assert_eq!(ns_entry("nvme0n1"), Some(("nvme0n1".into(), 1)));
        assert_eq!(ns_entry("nvme2c3n14"), Some(("nvme2n14".into(), 14)));
        assert_eq!(ns_entry("nvme0"), None);
        assert_eq!(ns_entry("nvme0n"), None);
        assert_eq!(ns_entry("nvme0n1p1"), None);
        assert_eq!(ns_entry("ng0n1"), None);
        assert!(is_ctrl_name("nvme12") && !is_ctrl_name("nvme") && !is_ctrl_name("nvme-subsys0"));
    }

    fn plan(unmap: UnmapHow) -> Plan {
        Plan { nsid: 1, block_size: 512, max_rw_blocks: 256, max_wz_blocks: 1000, max_dsm_blocks: 5000, unmap, vwc: true }
    }

    fn f(c: &NvmeCmd) -> (u8, u64, u32, u64) {
        (c.opcode, c.cdw10 as u64 | (c.cdw11 as u64) << 32, c.cdw12, c.addr)
    }

    #[test]
    fn large_reads_and_writes_split_at_the_transfer_limit() {
        let (c, dsm, flush) = plan_commands(&plan(UnmapHow::Dsm), IoKind::Write, 1 << 33, 600, 0x10000, true);
        assert!(dsm.is_none() && !flush);
        let got: Vec<_> = c.iter().map(f).collect();
        let fua = 1 << 30;
        assert_eq!(
            got,
            vec![
                (1, (1 << 33), 255 | fua, 0x10000),
                (1, (1 << 33) + 256, 255 | fua, 0x10000 + 256 * 512),
                (1, (1 << 33) + 512, 87 | fua, 0x10000 + 512 * 512)
            ]
        );
        assert_eq!(c.iter().map(|c| c.data_len).sum::<u32>(), 600 * 512);
        let (r, _, _) = plan_commands(&plan(UnmapHow::Dsm), IoKind::Read, 7, 1, 0x2000, false);
        assert_eq!(r.iter().map(f).collect::<Vec<_>>(), vec![(2, 7, 0, 0x2000)]);
    }

    #[test]
    fn unmap_as_dsm_ranges_or_write_zeroes_with_deac() {
        // 300 ranges of at most 5000 blocks: two DSM commands (256 + 44 ranges).
        let n = 5000 * 299 + 1;
        let (c, dsm, flush) = plan_commands(&plan(UnmapHow::Dsm), IoKind::Unmap, 10, n, 0, true);
        assert!(flush, "a FUA deallocate is followed by a flush (volatile cache)");
        let dsm = dsm.unwrap();
        assert_eq!(dsm.len(), 300 * 16);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].opcode, c[0].cdw10, c[0].cdw11, c[0].data_len), (0x09, 255, 4, 4096));
        assert_eq!((c[1].cdw10, c[1].data_len), (43, 44 * 16));
        assert_eq!(c[0].addr, dsm.as_ptr() as u64);
        assert_eq!(c[1].addr, dsm.as_ptr() as u64 + 4096);
        let last = &dsm[299 * 16..];
        assert_eq!(u32::from_le_bytes(last[4..8].try_into().unwrap()), 1);
        assert_eq!(u64::from_le_bytes(last[8..16].try_into().unwrap()), 10 + 5000 * 299);
        let (z, dsm, flush) = plan_commands(&plan(UnmapHow::WriteZeroesDeac), IoKind::Unmap, 0, 2500, 0, false);
        assert!(dsm.is_none() && !flush);
        assert_eq!(z.iter().map(f).collect::<Vec<_>>(), vec![(8, 0, 999 | 1 << 25, 0), (8, 1000, 999 | 1 << 25, 0), (8, 2000, 499 | 1 << 25, 0)]);
        let (w, _, _) = plan_commands(&plan(UnmapHow::Dsm), IoKind::WriteZeroes, 0, 1, 0, true);
        assert_eq!(w.iter().map(f).collect::<Vec<_>>(), vec![(8, 0, 1 << 30, 0)]);
        let (fl, _, _) = plan_commands(&plan(UnmapHow::Dsm), IoKind::Flush, 0, 0, 0, false);
        assert_eq!(fl.iter().map(f).collect::<Vec<_>>(), vec![(0, 0, 0, 0)]);
    }

    #[test]
    fn attach_errors_name_the_cause() {
        assert!(matches!(attach("N", "not-pci"), Err(NvmeError::BadTraddr(_))));
        // No such device on this host (PCI domain ffff is never used).
        let e = attach("N", "ffff:ff:1f.7").err().unwrap();
        assert!(matches!(e, NvmeError::NoDevice(_)), "{e}");
        assert_eq!(e.errno(), -libc::ENODEV);
    }
}
