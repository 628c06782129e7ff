//! Durability, thin provisioning and capacity as the device tells them: the caching mode
//! page's WCE, FUA, SYNCHRONIZE CACHE, MODE SELECT WCE=0, a read-only device, GET LBA
//! STATUS from a file's holes, and CAPACITY DATA HAS CHANGED after a rescan.

use std::sync::Mutex;

use riser_bdev::{
    Bdev, BdevInfo, BdevIo, FileKind, IoChannel, IoCompletion, IoKind, MallocBdev,
};

use super::*;

/// A malloc device that records what reaches it, with or without a volatile write cache.
struct Recording {
    info: BdevInfo,
    inner: Arc<MallocBdev>,
    seen: Arc<Mutex<Vec<(IoKind, bool)>>>,
}

struct RecordingChannel {
    inner: Box<dyn IoChannel>,
    seen: Arc<Mutex<Vec<(IoKind, bool)>>>,
}

impl Bdev for Recording {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn supports(&self, kind: IoKind) -> bool {
        self.inner.supports(kind)
    }
    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        Box::new(RecordingChannel { inner: self.inner.clone().open_channel(), seen: self.seen.clone() })
    }
    fn config_json(&self) -> (&'static str, serde_json::Value) {
        self.inner.config_json()
    }
}

impl IoChannel for RecordingChannel {
    fn submit(&mut self, io: BdevIo) {
        self.seen.lock().unwrap().push((io.kind, io.fua));
        self.inner.submit(io);
    }
    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        self.inner.poll(out)
    }
    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }
}

fn env_on(bdev: Arc<dyn Bdev>) -> Env {
    let lun = Lun::new(LunConfig { target_name: "iqn.2024-01.test:tgt".into(), ..LunConfig::default() }, bdev);
    let mut e = env();
    e.lun = lun.clone();
    e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
    let (a, b) = (e.a.clone(), e.b.clone());
    for n in [&a, &b] {
        e.run(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None); // POWER ON
    }
    e
}

/// The I/O a recording device saw: each request's kind and its FUA bit.
type Recorded = Arc<Mutex<Vec<(IoKind, bool)>>>;

fn recording(write_cache: bool) -> (Env, Recorded) {
    let inner = Arc::new(MallocBdev::new("R", BLOCKS, BS as u32, None).unwrap());
    let mut info = BdevInfo::new("R", "Malloc disk", BS as u32, BLOCKS, uuid::Uuid::new_v4());
    info.volatile_write_cache = write_cache;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let e = env_on(Arc::new(Recording { info, inner, seen: seen.clone() }));
    (e, seen)
}

/// The caching mode page (current or changeable) without block descriptors.
fn caching_page(e: &mut Env, a: &Arc<Nexus>, pc: u8) -> Vec<u8> {
    let d = e.ok(a, &[op::MODE_SENSE6, 0x08, (pc << 6) | 0x08, 0, 255, 0], 255, None);
    d[4..24].to_vec()
}

fn mode_select_wce(e: &mut Env, a: &Arc<Nexus>, wce: bool) -> ScsiResult {
    let mut page = caching_page(e, a, 0);
    page[0] &= 0x3F;
    page[2] = (page[2] & !0x04) | if wce { 0x04 } else { 0 };
    let mut p = vec![0u8; 4];
    p.extend(page);
    let len = p.len() as u8;
    e.run(a, &[op::MODE_SELECT6, 0x10, 0, 0, len, 0], len as u32, Some(p))
}

fn take(seen: &Arc<Mutex<Vec<(IoKind, bool)>>>) -> Vec<(IoKind, bool)> {
    std::mem::take(&mut *seen.lock().unwrap())
}

#[test]
fn fua_and_synchronize_cache_reach_the_device() {
    let (mut e, seen) = recording(true);
    let a = e.a.clone();
    assert_eq!(caching_page(&mut e, &a, 0)[2] & 0x04, 0x04, "WCE: the device has a write cache");
    take(&seen);
    e.ok(&a, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![1; BS]));
    e.ok(&a, &rw10(op::WRITE10, 1, 1, 0x08), BS as u32, Some(vec![2; BS])); // FUA
    e.ok(&a, &rw16(op::WRITE16, 2, 1, 0x08), BS as u32, Some(vec![3; BS]));
    e.ok(&a, &rw10(op::WRITE_VERIFY10, 3, 1, 0), BS as u32, Some(vec![4; BS]));
    e.ok(&a, &[op::SYNCHRONIZE_CACHE10, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0, None);
    assert_eq!(
        take(&seen),
        vec![
            (IoKind::Write, false),
            (IoKind::Write, true),
            (IoKind::Write, true),
            (IoKind::Write, true),
            (IoKind::Flush, false),
        ]
    );
    // The data went where it should, FUA or not.
    assert!(e.read16(&a, 1, 1).iter().all(|&x| x == 2));
}

#[test]
fn mode_select_turns_the_write_cache_off_and_every_write_becomes_fua() {
    let (mut e, seen) = recording(true);
    let (a, b) = (e.a.clone(), e.b.clone());
    assert_eq!(caching_page(&mut e, &a, 1)[2] & 0x04, 0x04, "WCE is changeable");
    let r = mode_select_wce(&mut e, &a, false);
    assert_eq!(r.status, Status::Good, "{r:?}");
    assert_eq!(caching_page(&mut e, &a, 0)[2] & 0x04, 0, "WCE now 0");
    // The other nexus hears of it.
    e.check(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None, (6, 0x2A, 0x01));
    take(&seen);
    e.ok(&a, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![1; BS]));
    let mut ws = rw16(op::WRITE_SAME16, 10, 4, 0);
    ws[1] = 0;
    e.ok(&a, &ws, BS as u32, Some(vec![7; BS]));
    let mut unmap = vec![0u8; 24];
    unmap[1] = 22;
    unmap[3] = 16;
    unmap[8..16].copy_from_slice(&20u64.to_be_bytes());
    unmap[16..20].copy_from_slice(&2u32.to_be_bytes());
    e.ok(&a, &[op::UNMAP, 0, 0, 0, 0, 0, 0, 0, 24, 0], 24, Some(unmap));
    let got = take(&seen);
    assert!(!got.is_empty() && got.iter().all(|&(_, fua)| fua), "every change durable: {got:?}");
    // Back on: plain writes are plain again.
    assert_eq!(mode_select_wce(&mut e, &a, true).status, Status::Good);
    e.ok(&a, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![1; BS]));
    assert_eq!(take(&seen), vec![(IoKind::Write, false)]);
}

#[test]
fn a_device_without_a_write_cache_reports_wce_0_and_keeps_it() {
    let (mut e, _) = recording(false);
    let a = e.a.clone();
    assert_eq!(caching_page(&mut e, &a, 0)[2] & 0x04, 0, "no volatile cache: WCE=0");
    assert_eq!(caching_page(&mut e, &a, 1)[2] & 0x04, 0, "and it cannot be turned on");
    assert_eq!(caching_page(&mut e, &a, 2)[2] & 0x04, 0, "default WCE=0");
    let r = mode_select_wce(&mut e, &a, true);
    assert_eq!(r.sense_triplet(), Some((5, 0x26, 0x00)), "{r:?}");
}

/// A file in the temp directory for a file LUN, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(tag: &str, size: u64) -> TempFile {
        let p = std::env::temp_dir().join(format!("riser-scsi-{tag}-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::File::create(&p).unwrap().set_len(size).unwrap();
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_file_lun_reports_holes_and_a_grown_capacity() {
    let f = TempFile::new("grow", BLOCKS * BS as u64);
    let mut reg = BdevRegistry::new();
    reg.create_file(FileKind::Uring, "F", f.0.to_str().unwrap(), None, false, None).unwrap();
    let mut e = env_on(reg.get("F").unwrap());
    let (a, b) = (e.a.clone(), e.b.clone());
    assert!(e.lun.thin_provisioned(), "ext4 punches holes: thin");
    // One logical block per physical block (see FileBdev: the file system's block is not
    // claimed as the physical one).
    let cap = e.ok(&a, &rw16(op::SERVICE_ACTION_IN16, 0, 32, op::SAI_READ_CAPACITY16), 32, None);
    assert_eq!(cap[13] & 0x0F, 0, "LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT");
    assert_eq!(cap[14] & 0xC0, 0xC0, "LBPME, LBPRZ");
    // Written blocks are mapped, the rest of the sparse file deallocated.
    e.write16(&a, 0, pattern(64 * BS, 5));
    let d = e.ok(&a, &get_lba_status(0, 256), 256, None);
    assert_eq!(lba_status_descs(&d), vec![(0, 64, 0), (64, (BLOCKS - 64) as u32, 1)]);
    // UNMAP 16 blocks (two 4 KiB file system blocks) in the middle: a hole.
    let mut unmap = vec![0u8; 24];
    unmap[1] = 22;
    unmap[3] = 16;
    unmap[8..16].copy_from_slice(&16u64.to_be_bytes());
    unmap[16..20].copy_from_slice(&16u32.to_be_bytes());
    e.ok(&a, &[op::UNMAP, 0, 0, 0, 0, 0, 0, 0, 24, 0], 24, Some(unmap));
    let d = e.ok(&a, &get_lba_status(0, 256), 256, None);
    assert_eq!(lba_status_descs(&d), vec![(0, 16, 0), (16, 16, 1), (32, 32, 0), (64, (BLOCKS - 64) as u32, 1)]);
    assert!(e.read16(&a, 16, 16).iter().all(|&x| x == 0), "a hole reads as zeros");
    // The file grows and is rescanned: both nexuses see CAPACITY DATA HAS CHANGED once,
    // then the new size.
    std::fs::OpenOptions::new().write(true).open(&f.0).unwrap().set_len(2 * BLOCKS * BS as u64).unwrap();
    assert_eq!(reg.rescan("F", None), Ok(2 * BLOCKS));
    for n in [&a, &b] {
        e.check(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None, (6, 0x2A, 0x09));
        e.ok(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    }
    let cap = e.ok(&a, &rw16(op::SERVICE_ACTION_IN16, 0, 32, op::SAI_READ_CAPACITY16), 32, None);
    assert_eq!(u64::from_be_bytes(cap[0..8].try_into().unwrap()), 2 * BLOCKS - 1);
    let r = e.write16(&a, 2 * BLOCKS - 1, vec![9; BS]);
    assert_eq!(r.status, Status::Good, "the new last block is writable: {r:?}");
}

#[test]
fn a_read_only_device_is_write_protected() {
    let f = TempFile::new("ro", BLOCKS * BS as u64);
    let mut reg = BdevRegistry::new();
    reg.create_file(FileKind::Aio, "RO", f.0.to_str().unwrap(), None, true, None).unwrap();
    let mut e = env_on(reg.get("RO").unwrap());
    let a = e.a.clone();
    let r = e.write16(&a, 0, vec![1; BS]);
    assert_eq!(r.sense_triplet(), Some((7, 0x27, 0x02)), "{r:?}");
    let ms = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x08, 0, 255, 0], 255, None);
    assert_eq!(ms[2] & 0x80, 0x80, "WP in the device-specific parameter");
    assert!(!e.lun.thin_provisioned());
    e.read16(&a, 0, 8);
}

