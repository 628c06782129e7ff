//! End-to-end tests: CDBs as an initiator sends them, through a [`LunChannel`], against a
//! real malloc bdev.

use std::sync::Arc;

use riser_bdev::{BdevRegistry, IoBuf};

use crate::cdb::op;
use crate::target;
use crate::{Lun, LunChannel, LunConfig, Nexus, Residual, ScsiResult, ScsiTask, Status};

pub(crate) const BS: usize = 512;
pub(crate) const BLOCKS: u64 = 8192;

pub(crate) struct Env {
    pub lun: Arc<Lun>,
    pub ch: LunChannel,
    pub a: Arc<Nexus>,
    pub b: Arc<Nexus>,
    next_tag: u64,
}

pub(crate) fn env_with(cfg: LunConfig) -> Env {
    let mut reg = BdevRegistry::new();
    let name = reg.create_malloc(None, BLOCKS, BS as u32, None).unwrap();
    let bdev = reg.get(&name).unwrap();
    let lun = Lun::new(
        LunConfig {
            target_name: "iqn.2024-01.test:tgt".into(),
            ..cfg
        },
        bdev,
    );
    let ch = LunChannel::new(lun.clone());
    let a = Arc::new(Nexus::new(
        "iqn.2024-01.test:init1",
        0x23d0_0000_0001,
        "iqn.2024-01.test:tgt",
        1,
    ));
    let b = Arc::new(Nexus::new(
        "iqn.2024-01.test:init2",
        0x23d0_0000_0002,
        "iqn.2024-01.test:tgt",
        1,
    ));
    let mut e = Env {
        lun,
        ch,
        a,
        b,
        next_tag: 1,
    };
    // Consume the power-on unit attentions, as initiators do after login.
    let (a, b) = (e.a.clone(), e.b.clone());
    let r = e.run(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense_triplet(), Some((6, 0x29, 0x00)));
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.run(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e
}

pub(crate) fn env() -> Env {
    env_with(LunConfig::default())
}

impl Env {
    pub fn task(
        &mut self,
        n: &Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
    ) -> ScsiTask {
        let tag = self.next_tag;
        self.next_tag += 1;
        let mut t = ScsiTask::new(tag, 0, cdb, edtl, n.clone());
        t.write = data.is_some();
        t.read = data.is_none() && edtl > 0;
        t.data_out = data.map(|d| Box::new(d) as IoBuf);
        t
    }

    /// Submits and polls until the result comes back.
    pub fn run(
        &mut self,
        n: &Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
    ) -> ScsiResult {
        let t = self.task(n, cdb, edtl, data);
        let tag = t.tag;
        self.ch.submit(t);
        let mut out = Vec::new();
        for _ in 0..1_000_000 {
            self.ch.poll(&mut out);
            if let Some(p) = out.iter().position(|r| r.tag == tag) {
                return out.swap_remove(p);
            }
        }
        panic!("task {tag} never completed");
    }

    pub fn ok(&mut self, n: &Arc<Nexus>, cdb: &[u8], edtl: u32, data: Option<Vec<u8>>) -> Vec<u8> {
        let r = self.run(n, cdb, edtl, data);
        assert_eq!(r.status, Status::Good, "{cdb:02x?}: {r:?}");
        r.data().to_vec()
    }

    /// Expects CHECK CONDITION with (key, asc, ascq).
    pub fn check(
        &mut self,
        n: &Arc<Nexus>,
        cdb: &[u8],
        edtl: u32,
        data: Option<Vec<u8>>,
        k: (u8, u8, u8),
    ) {
        let r = self.run(n, cdb, edtl, data);
        assert_eq!(r.status, Status::CheckCondition, "{cdb:02x?}: {r:?}");
        assert_eq!(r.sense_triplet(), Some(k), "{cdb:02x?}: {r:?}");
    }

    pub fn conflict(&mut self, n: &Arc<Nexus>, cdb: &[u8], edtl: u32, data: Option<Vec<u8>>) {
        let r = self.run(n, cdb, edtl, data);
        assert_eq!(r.status, Status::ReservationConflict, "{cdb:02x?}: {r:?}");
    }

    pub fn write16(&mut self, n: &Arc<Nexus>, lba: u64, data: Vec<u8>) -> ScsiResult {
        let blocks = (data.len() / BS) as u32;
        let c = rw16(op::WRITE16, lba, blocks, 0);
        let len = data.len() as u32;
        self.run(n, &c, len, Some(data))
    }

    pub fn read16(&mut self, n: &Arc<Nexus>, lba: u64, blocks: u32) -> Vec<u8> {
        let c = rw16(op::READ16, lba, blocks, 0);
        self.ok(n, &c, blocks * BS as u32, None)
    }
}

pub(crate) fn rw10(opc: u8, lba: u32, blocks: u16, flags: u8) -> Vec<u8> {
    let mut c = vec![opc, flags, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub(crate) fn rw12(opc: u8, lba: u32, blocks: u32, flags: u8) -> Vec<u8> {
    let mut c = vec![opc, flags, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub(crate) fn rw16(opc: u8, lba: u64, blocks: u32, flags: u8) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = opc;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub(crate) fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const ILLEGAL_FIELD: (u8, u8, u8) = (5, 0x24, 0);
const LBA_OOR: (u8, u8, u8) = (5, 0x21, 0);

// ----------------------------------------------------------------------------------
// INQUIRY, VPD, READ CAPACITY

#[test]
fn inquiry_standard_and_alloc_length() {
    let mut e = env();
    let a = e.a.clone();
    let d = e.ok(&a, &[op::INQUIRY, 0, 0, 1, 4, 0], 260, None);
    assert_eq!(d.len(), 96);
    assert_eq!(d[0], 0);
    assert_eq!(d[2], 6);
    assert_eq!(d[3] & 0x0F, 2);
    assert_eq!(d[4] as usize, d.len() - 5);
    assert_eq!(&d[8..16], b"RISER   ");
    assert!(d[7] & 0x02 != 0, "CmdQue");
    assert_eq!(d[5] & 0x30, 0x10, "TPGS implicit");
    let descs: Vec<u16> = (0..8)
        .map(|i| u16::from_be_bytes([d[58 + 2 * i], d[59 + 2 * i]]))
        .collect();
    assert!(descs.contains(&0x04C0) && descs.contains(&0x0460));
    // Every allocation length works and truncates.
    for alloc in 0..=255u16 {
        let r = e.run(
            &a,
            &[op::INQUIRY, 0, 0, (alloc >> 8) as u8, alloc as u8, 0],
            alloc as u32,
            None,
        );
        assert_eq!(r.status, Status::Good);
        assert_eq!(r.data_len, (alloc as usize).min(96));
        let want = if alloc > 96 {
            Residual::Underflow(alloc as u32 - 96)
        } else {
            Residual::None
        };
        assert_eq!(r.residual, want);
    }
    // EVPD=0 with a page code; CMDDT.
    e.check(
        &a,
        &[op::INQUIRY, 0, 0x80, 0, 255, 0],
        255,
        None,
        ILLEGAL_FIELD,
    );
    e.check(
        &a,
        &[op::INQUIRY, 2, 0, 0, 255, 0],
        255,
        None,
        ILLEGAL_FIELD,
    );
}

#[test]
fn vpd_pages() {
    let mut e = env();
    let a = e.a.clone();
    let sup = e.ok(&a, &[op::INQUIRY, 1, 0, 0, 255, 0], 255, None);
    let pages = sup[4..4 + sup[3] as usize].to_vec();
    assert_eq!(pages, vec![0x00, 0x80, 0x83, 0x8F, 0xB0, 0xB1, 0xB2]);
    for p in pages {
        let d = e.ok(&a, &[op::INQUIRY, 1, p, 0, 255, 0], 255, None);
        assert_eq!(d[1], p);
        assert_eq!(
            u16::from_be_bytes([d[2], d[3]]) as usize + 4,
            d.len(),
            "page {p:02x}"
        );
    }
    e.check(
        &a,
        &[op::INQUIRY, 1, 0x99, 0, 255, 0],
        255,
        None,
        ILLEGAL_FIELD,
    );
    // Serial number is the bdev UUID.
    let sn = e.ok(&a, &[op::INQUIRY, 1, 0x80, 0, 255, 0], 255, None);
    assert_eq!(
        &sn[4..],
        e.lun.bdev().info().uuid.simple().to_string().as_bytes()
    );
    // Device identification: NAA 6 first, then T10, port designators, names.
    let di = e.ok(&a, &[op::INQUIRY, 1, 0x83, 0, 255, 0], 255, None);
    let mut off = 4;
    let mut types = vec![];
    while off < di.len() {
        let ty = di[off + 1] & 0x0F;
        let assoc = (di[off + 1] >> 4) & 3;
        let len = di[off + 3] as usize;
        if ty == 3 {
            assert_eq!(di[off + 4] >> 4, 6);
            assert_eq!(len, 16);
        }
        if ty == 4 {
            assert_eq!(u16::from_be_bytes([di[off + 6], di[off + 7]]), 1);
        }
        if ty == 8 && assoc == 2 {
            assert!(di[off + 4..off + 4 + len].starts_with(b"iqn.2024-01.test:tgt\0"));
        }
        types.push((ty, assoc));
        off += 4 + len;
    }
    assert_eq!(off, di.len());
    for t in [(3, 0), (1, 0), (4, 1), (5, 1), (8, 1), (8, 2)] {
        assert!(types.contains(&t), "{t:?} in {types:?}");
    }
    // Block limits: SBC-3 length, unmap limits when thin.
    let bl = e.ok(&a, &[op::INQUIRY, 1, 0xB0, 0, 255, 0], 255, None);
    assert_eq!(bl[3], 0x3C);
    assert!(u32::from_be_bytes(bl[20..24].try_into().unwrap()) > 0);
    let lbp = e.ok(&a, &[op::INQUIRY, 1, 0xB2, 0, 255, 0], 255, None);
    assert_eq!(lbp[5] & 0xE4, 0xE4, "LBPU LBPWS LBPWS10 LBPRZ");
    let bdc = e.ok(&a, &[op::INQUIRY, 1, 0xB1, 0, 255, 0], 255, None);
    assert_eq!(u16::from_be_bytes([bdc[4], bdc[5]]), 1);
}

#[test]
fn read_capacity() {
    let mut e = env();
    let a = e.a.clone();
    let d = e.ok(
        &a,
        &[op::READ_CAPACITY10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        8,
        None,
    );
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()) as u64,
        BLOCKS - 1
    );
    assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), BS as u32);
    let mut c = vec![0u8; 16];
    c[0] = op::SERVICE_ACTION_IN16;
    c[1] = op::SAI_READ_CAPACITY16;
    c[13] = 32;
    let d = e.ok(&a, &c, 32, None);
    assert_eq!(d.len(), 32);
    assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), BLOCKS - 1);
    assert_eq!(d[14] & 0xC0, 0xC0, "LBPME LBPRZ");
    // Allocation length 15: truncated.
    c[13] = 15;
    assert_eq!(e.ok(&a, &c, 15, None).len(), 15);
    // LBA without PMI.
    e.check(
        &a,
        &[op::READ_CAPACITY10, 0, 0, 0, 0, 1, 0, 0, 0, 0],
        8,
        None,
        ILLEGAL_FIELD,
    );
    // Unknown SERVICE ACTION IN(16) service action.
    c[1] = 0x1F;
    e.check(&a, &c, 32, None, ILLEGAL_FIELD);
}

// ----------------------------------------------------------------------------------
// READ / WRITE

#[test]
fn write_then_read_back_all_sizes() {
    let mut e = env();
    let a = e.a.clone();
    let data = pattern(8 * BS, 7);
    let r = e.write16(&a, 100, data.clone());
    assert_eq!(r.status, Status::Good);
    assert_eq!(e.read16(&a, 100, 8), data);
    let d10 = e.ok(&a, &rw10(op::READ10, 100, 8, 0), 8 * BS as u32, None);
    assert_eq!(d10, data);
    let d12 = e.ok(&a, &rw12(op::READ12, 102, 2, 0), 2 * BS as u32, None);
    assert_eq!(d12, &data[2 * BS..4 * BS]);
    // WRITE(10) with DPO and FUA, READ(6).
    let d2 = pattern(2 * BS, 99);
    e.ok(
        &a,
        &rw10(op::WRITE10, 5, 2, 0x18),
        2 * BS as u32,
        Some(d2.clone()),
    );
    let d6 = e.ok(&a, &[op::READ6, 0, 0, 5, 2, 0], 2 * BS as u32, None);
    assert_eq!(d6, d2);
    // WRITE(12), WRITE(6).
    e.ok(
        &a,
        &rw12(op::WRITE12, 7, 1, 0),
        BS as u32,
        Some(vec![0x11; BS]),
    );
    e.ok(
        &a,
        &[op::WRITE6, 0, 0, 8, 1, 0],
        BS as u32,
        Some(vec![0x22; BS]),
    );
    let d = e.read16(&a, 7, 2);
    assert!(d[..BS].iter().all(|&x| x == 0x11) && d[BS..].iter().all(|&x| x == 0x22));
    // READ(6) with transfer length 0 reads 256 blocks.
    let r = e.run(&a, &[op::READ6, 0, 0, 0, 0, 0], 256 * BS as u32, None);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data_len, 256 * BS);
}

#[test]
fn out_of_range_and_protect_fields() {
    let mut e = env();
    let a = e.a.clone();
    let last = (BLOCKS - 1) as u32;
    e.ok(&a, &rw10(op::READ10, last, 1, 0), BS as u32, None);
    e.check(
        &a,
        &rw10(op::READ10, last, 2, 0),
        2 * BS as u32,
        None,
        LBA_OOR,
    );
    e.check(&a, &rw10(op::READ10, last + 2, 0, 0), 0, None, LBA_OOR);
    e.check(
        &a,
        &rw10(op::READ10, u32::MAX, 1, 0),
        BS as u32,
        None,
        LBA_OOR,
    );
    e.check(
        &a,
        &rw16(op::READ16, u64::MAX, 1, 0),
        BS as u32,
        None,
        LBA_OOR,
    );
    e.check(
        &a,
        &rw16(op::WRITE16, BLOCKS, 1, 0),
        BS as u32,
        Some(vec![0; BS]),
        LBA_OOR,
    );
    e.ok(&a, &rw10(op::READ10, 0, 0, 0), 0, None);
    // RDPROTECT / WRPROTECT without protection information.
    for p in 1..8u8 {
        e.check(
            &a,
            &rw10(op::READ10, 0, 1, p << 5),
            BS as u32,
            None,
            ILLEGAL_FIELD,
        );
        e.check(
            &a,
            &rw16(op::WRITE16, 0, 1, p << 5),
            BS as u32,
            Some(vec![0; BS]),
            ILLEGAL_FIELD,
        );
    }
    // Beyond MAXIMUM TRANSFER LENGTH.
    let max = (crate::MAX_TRANSFER_BYTES / BS as u64) as u32;
    e.check(&a, &rw16(op::READ16, 0, max + 1, 0), 0, None, ILLEGAL_FIELD);
    // Unknown opcode.
    e.check(
        &a,
        &[0xC0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        0,
        None,
        (5, 0x20, 0),
    );
}

#[test]
fn read_residuals() {
    let mut e = env();
    let a = e.a.clone();
    let bs = BS as u32;
    let c = rw10(op::READ10, 0, 1, 0);
    let r = e.run(&a, &c, 0, None);
    assert_eq!(
        (r.status, r.residual, r.data_len),
        (Status::Good, Residual::Overflow(bs), 0)
    );
    let r = e.run(&a, &c, 10000, None);
    assert_eq!(
        (r.status, r.residual, r.data_len),
        (Status::Good, Residual::Underflow(10000 - bs), BS)
    );
    let r = e.run(&a, &c, 200, None);
    assert_eq!(
        (r.status, r.residual, r.data_len),
        (Status::Good, Residual::Overflow(bs - 200), 200)
    );
    let r = e.run(&a, &rw10(op::READ10, 0, 2, 0), bs, None);
    assert_eq!(
        (r.status, r.residual, r.data_len),
        (Status::Good, Residual::Overflow(bs), BS)
    );
    // A READ flagged as a write with data: the data is ignored.
    let mut t = e.task(&a, &c, bs, Some(vec![1; BS]));
    t.read = false;
    e.ch.submit(t);
    let mut out = vec![];
    while out.is_empty() {
        e.ch.poll(&mut out);
    }
    assert_eq!(out[0].status, Status::Good);
}

#[test]
fn write_residuals_write_only_what_arrived() {
    let mut e = env();
    let a = e.a.clone();
    let bs = BS as u32;
    let c1 = rw10(op::WRITE10, 0, 1, 0);
    let r = e.run(&a, &c1, 0, None);
    assert_eq!(
        (r.status, r.residual),
        (Status::Good, Residual::Overflow(bs))
    );
    let r = e.run(&a, &c1, 10000, Some(vec![1; 10000]));
    assert_eq!(
        (r.status, r.residual),
        (Status::Good, Residual::Underflow(10000 - bs))
    );
    let r = e.run(&a, &c1, 200, Some(vec![1; 200]));
    assert_eq!(r.residual, Residual::Overflow(bs - 200));
    // EDTL 2 blocks for a 1-block write: only one block written.
    e.write16(&a, 0, vec![b'a'; 2 * BS]);
    let r = e.run(&a, &c1, 2 * bs, Some(vec![b'b'; 2 * BS]));
    assert_eq!(
        (r.status, r.residual),
        (Status::Good, Residual::Underflow(bs))
    );
    let d = e.read16(&a, 0, 2);
    assert!(d[..BS].iter().all(|&x| x == b'b') && d[BS..].iter().all(|&x| x == b'a'));
    // EDTL 1 block for a 2-block write: only EDTL written.
    e.write16(&a, 0, vec![b'a'; 2 * BS]);
    let r = e.run(&a, &rw10(op::WRITE10, 0, 2, 0), bs, Some(vec![b'b'; BS]));
    assert_eq!(
        (r.status, r.residual),
        (Status::Good, Residual::Overflow(bs))
    );
    let d = e.read16(&a, 0, 2);
    assert!(d[..BS].iter().all(|&x| x == b'b') && d[BS..].iter().all(|&x| x == b'a'));
}

// ----------------------------------------------------------------------------------
// Target level, TUR, REQUEST SENSE, unit attentions

#[test]
fn report_luns_and_missing_lun() {
    let e = env();
    let a = e.a.clone();
    let mut c = vec![0u8; 12];
    c[0] = op::REPORT_LUNS;
    c[9] = 255;
    let t = ScsiTask::new(1, 0, &c, 255, a.clone());
    let r = target::report_luns(&t, &[0, 3, 300], Some(&e.lun));
    assert_eq!(r.status, Status::Good);
    let d = r.data();
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 24);
    assert_eq!(&d[8..16], &[0; 8]);
    assert_eq!(&d[16..24], &[0, 3, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&d[24..32], &[0x41, 0x2C, 0, 0, 0, 0, 0, 0]);
    assert_eq!(r.residual, Residual::Underflow(255 - 32));
    // Allocation length below 16.
    c[9] = 8;
    let t = ScsiTask::new(1, 0, &c, 8, a.clone());
    assert_eq!(
        target::report_luns(&t, &[0], None).status,
        Status::CheckCondition
    );
    // A LUN that does not exist.
    let t = ScsiTask::new(2, 9, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, a.clone());
    let r = target::no_such_lun(&t);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data()[0], 0x7F);
    let t = ScsiTask::new(3, 9, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, a.clone());
    let r = target::no_such_lun(&t);
    assert_eq!(r.sense_triplet(), Some((5, 0x25, 0)));
    let t = ScsiTask::new(4, 9, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, a);
    let r = target::no_such_lun(&t);
    assert_eq!(r.status, Status::Good);
    assert_eq!((r.data()[2], r.data()[12]), (5, 0x25));
}

#[test]
fn unit_attentions_and_request_sense() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    // A new nexus sees POWER ON first, but INQUIRY is not held up by it.
    let c = Arc::new(Nexus::new(
        "iqn.2024-01.test:init3",
        3,
        "iqn.2024-01.test:tgt",
        1,
    ));
    e.ok(&c, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    let s = e.ok(&c, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None);
    assert_eq!((s[2], s[12], s[13]), (6, 0x29, 0));
    let s = e.ok(&c, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None);
    assert_eq!((s[2], s[12]), (0, 0));
    // Descriptor format.
    let s = e.ok(&c, &[op::REQUEST_SENSE, 1, 0, 0, 18, 0], 18, None);
    assert_eq!(s[0], 0x72);
    // A nexus whose first command is INQUIRY still gets POWER ON on the next command.
    let d = Arc::new(Nexus::new(
        "iqn.2024-01.test:init4",
        4,
        "iqn.2024-01.test:tgt",
        1,
    ));
    e.ok(&d, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    e.check(
        &d,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x29, 0),
    );
    e.ok(&d, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // The LUN inventory changes.
    e.lun.set_target_luns(&[0, 1]);
    e.ok(&d, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.lun.set_target_luns(&[0, 1, 2]);
    e.check(
        &d,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x3F, 0x0E),
    );
    let mut rl = vec![0u8; 12];
    rl[0] = op::REPORT_LUNS;
    rl[9] = 64;
    let l = e.ok(&d, &rl, 64, None);
    assert_eq!(u32::from_be_bytes(l[0..4].try_into().unwrap()), 24);
    // LUN reset: everybody gets 29/03 once.
    e.lun.reset(crate::ResetKind::LunReset);
    e.check(
        &a,
        &rw10(op::READ10, 0, 1, 0),
        BS as u32,
        None,
        (6, 0x29, 3),
    );
    e.ok(&a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    e.check(
        &b,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x29, 3),
    );
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // REPORTED LUNS DATA HAS CHANGED is cleared by REPORT LUNS.
    e.lun
        .establish_ua_all(crate::Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x3F, 0x0E),
    );
    let mut rl = vec![0u8; 12];
    rl[0] = op::REPORT_LUNS;
    rl[9] = 64;
    e.ok(&b, &rl, 64, None);
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
}

// ----------------------------------------------------------------------------------
// Multi-step commands

fn caw(lba: u64, blocks: u8) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op::COMPARE_AND_WRITE;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

#[test]
fn compare_and_write_success_and_miscompare() {
    let mut e = env();
    let a = e.a.clone();
    e.write16(&a, 10, vec![b'A'; 2 * BS]);
    // Success: compare 'A', write 'B'.
    let mut d = vec![b'A'; 2 * BS];
    d.extend(vec![b'B'; 2 * BS]);
    e.ok(&a, &caw(10, 2), 4 * BS as u32, Some(d));
    assert!(e.read16(&a, 10, 2).iter().all(|&x| x == b'B'));
    // Miscompare: byte 27 from the end of the verify data differs; nothing written.
    let mut d = vec![b'B'; 2 * BS];
    d[2 * BS - 27] = b'C';
    d.extend(vec![b'Z'; 2 * BS]);
    let r = e.run(&a, &caw(10, 2), 4 * BS as u32, Some(d));
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense_triplet(), Some((0x0E, 0x1D, 0)));
    let s = r.sense_bytes();
    assert_eq!(s[0], 0xF0, "VALID: the information field holds the offset");
    assert_eq!(
        u32::from_be_bytes(s[3..7].try_into().unwrap()) as usize,
        2 * BS - 27
    );
    assert!(e.read16(&a, 10, 2).iter().all(|&x| x == b'B'));
    // Data-out size must be exactly 2 x blocks.
    e.check(
        &a,
        &caw(10, 1),
        4 * BS as u32,
        Some(vec![0; 4 * BS]),
        ILLEGAL_FIELD,
    );
    e.check(
        &a,
        &caw(10, 3),
        4 * BS as u32,
        Some(vec![0; 4 * BS]),
        ILLEGAL_FIELD,
    );
    // Beyond the limit and beyond the end.
    e.check(
        &a,
        &caw(BLOCKS - 1, 2),
        4 * BS as u32,
        Some(vec![0; 4 * BS]),
        LBA_OOR,
    );
    assert!(e.lun.ranges.idle());
}

#[test]
fn compare_and_write_is_atomic_across_reactors() {
    // Several "reactors" increment a counter in block 0 with read + COMPARE AND WRITE,
    // retrying on miscompare, while plain writes hit a neighbouring block: no increment
    // may be lost.
    let e = env();
    let lun = e.lun.clone();
    let threads = 4;
    let per = 200u64;
    let mut hs = vec![];
    for t in 0..threads {
        let lun = lun.clone();
        hs.push(std::thread::spawn(move || {
            let n = Arc::new(Nexus::new(
                "iqn.2024-01.test:mt",
                100 + t,
                "iqn.2024-01.test:tgt",
                1,
            ));
            let mut ch = LunChannel::new(lun);
            let mut tag = 0u64;
            let mut run = |ch: &mut LunChannel, cdb: &[u8], edtl: u32, data: Option<Vec<u8>>| {
                tag += 1;
                let mut task = ScsiTask::new(tag, 0, cdb, edtl, n.clone());
                task.data_out = data.map(|d| Box::new(d) as IoBuf);
                ch.submit(task);
                let mut out = vec![];
                loop {
                    ch.poll(&mut out);
                    if let Some(r) = out.pop() {
                        return r;
                    }
                    std::thread::yield_now();
                }
            };
            run(&mut ch, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None); // power-on UA
            let mut done = 0;
            while done < per {
                let r = run(&mut ch, &rw16(op::READ16, 0, 1, 0), BS as u32, None);
                let cur = r.data().to_vec();
                let v = u64::from_le_bytes(cur[..8].try_into().unwrap());
                let mut next = cur.clone();
                next[..8].copy_from_slice(&(v + 1).to_le_bytes());
                let mut d = cur;
                d.extend(next);
                let r = run(&mut ch, &caw(0, 1), 2 * BS as u32, Some(d));
                match r.status {
                    Status::Good => done += 1,
                    Status::CheckCondition => assert_eq!(r.sense_triplet(), Some((0x0E, 0x1D, 0))),
                    s => panic!("{s:?}"),
                }
                // A plain write to block 1 from the same reactor.
                let r = run(
                    &mut ch,
                    &rw16(op::WRITE16, 1, 1, 0),
                    BS as u32,
                    Some(vec![t as u8; BS]),
                );
                assert_eq!(r.status, Status::Good);
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    let mut e = e;
    let a = e.a.clone();
    let d = e.read16(&a, 0, 1);
    assert_eq!(
        u64::from_le_bytes(d[..8].try_into().unwrap()),
        threads * per
    );
    assert!(e.lun.ranges.idle());
}

#[test]
fn write_same_unmap_and_zero_blocks() {
    let mut e = env();
    let a = e.a.clone();
    let ws10 = |lba: u32, n: u16, flags: u8| rw10(op::WRITE_SAME10, lba, n, flags);
    // Repeat one block.
    let blk = pattern(BS, 3);
    e.ok(&a, &ws10(20, 5, 0), BS as u32, Some(blk.clone()));
    let d = e.read16(&a, 20, 5);
    for c in d.chunks(BS) {
        assert_eq!(c, &blk[..]);
    }
    // A large WRITE SAME (several chunks).
    let n = 4000u16;
    e.ok(&a, &ws10(1000, n, 0), BS as u32, Some(blk.clone()));
    let d = e.read16(&a, 1000, n as u32);
    assert!(d.chunks(BS).all(|c| c == &blk[..]));
    // UNMAP bit: deallocated, reads zeros even though the block was not zero.
    e.ok(&a, &ws10(20, 5, 0x08), BS as u32, Some(vec![0xFF; BS]));
    assert!(e.read16(&a, 20, 5).iter().all(|&x| x == 0));
    // Number of blocks 0: up to the end of the medium.
    e.write16(&a, BLOCKS - 3, vec![7; 3 * BS]);
    e.ok(
        &a,
        &ws10((BLOCKS - 2) as u32, 0, 0x08),
        BS as u32,
        Some(vec![0; BS]),
    );
    let d = e.read16(&a, BLOCKS - 3, 3);
    assert!(d[..BS].iter().all(|&x| x == 7) && d[BS..].iter().all(|&x| x == 0));
    e.check(
        &a,
        &ws10((BLOCKS + 1) as u32, 0, 0),
        BS as u32,
        Some(vec![0; BS]),
        LBA_OOR,
    );
    e.check(
        &a,
        &ws10(u32::MAX, 0, 0),
        BS as u32,
        Some(vec![0; BS]),
        LBA_OOR,
    );
    // Wrong data-out size.
    e.check(
        &a,
        &ws10(0, 1, 0x08),
        (BS / 2) as u32,
        Some(vec![0; BS / 2]),
        (5, 0x1A, 0),
    );
    e.check(
        &a,
        &ws10(0, 1, 0x08),
        2 * BS as u32,
        Some(vec![0; 2 * BS]),
        (5, 0x1A, 0),
    );
    // WRPROTECT, ANCHOR.
    e.check(
        &a,
        &ws10(0, 1, 0x20),
        BS as u32,
        Some(vec![0; BS]),
        ILLEGAL_FIELD,
    );
    e.check(
        &a,
        &ws10(0, 1, 0x10),
        BS as u32,
        Some(vec![0; BS]),
        ILLEGAL_FIELD,
    );
    // WRITE SAME(16) with NDOB: zeros without a data block.
    e.write16(&a, 50, vec![9; BS]);
    e.ok(&a, &rw16(op::WRITE_SAME16, 50, 1, 0x01), 0, None);
    assert!(e.read16(&a, 50, 1).iter().all(|&x| x == 0));
}

fn unmap_cdb(len: u16) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = op::UNMAP;
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}

fn unmap_list(descs: &[(u64, u32)]) -> Vec<u8> {
    let mut p = vec![0u8; 8 + 16 * descs.len()];
    p[0..2].copy_from_slice(&((6 + 16 * descs.len()) as u16).to_be_bytes());
    p[2..4].copy_from_slice(&((16 * descs.len()) as u16).to_be_bytes());
    for (i, (lba, n)) in descs.iter().enumerate() {
        p[8 + 16 * i..16 + 16 * i].copy_from_slice(&lba.to_be_bytes());
        p[16 + 16 * i..20 + 16 * i].copy_from_slice(&n.to_be_bytes());
    }
    p
}

#[test]
fn unmap_descriptors_and_lba_status() {
    let mut e = env();
    let a = e.a.clone();
    e.write16(&a, 0, vec![b'a'; 64 * BS]);
    let p = unmap_list(&[(2, 3), (10, 1), (0, 0), (BLOCKS, 0)]);
    e.ok(&a, &unmap_cdb(p.len() as u16), p.len() as u32, Some(p));
    let d = e.read16(&a, 0, 12);
    for (i, c) in d.chunks(BS).enumerate() {
        let zero = (2..5).contains(&i) || i == 10;
        assert_eq!(c.iter().all(|&x| x == 0), zero, "block {i}");
        assert_eq!(c.iter().all(|&x| x == b'a'), !zero, "block {i}");
    }
    // No descriptors, zero length.
    let p = unmap_list(&[]);
    e.ok(&a, &unmap_cdb(8), 8, Some(p));
    e.ok(&a, &unmap_cdb(0), 0, None);
    // Out of range, short list.
    let p = unmap_list(&[(BLOCKS - 1, 2)]);
    e.check(
        &a,
        &unmap_cdb(p.len() as u16),
        p.len() as u32,
        Some(p),
        LBA_OOR,
    );
    e.check(&a, &unmap_cdb(4), 4, Some(vec![0; 4]), (5, 0x1A, 0));
    // GET LBA STATUS: blocks 2..5 deallocated, 5 mapped.
    let mut c = vec![0u8; 16];
    c[0] = op::SERVICE_ACTION_IN16;
    c[1] = op::SAI_GET_LBA_STATUS;
    c[2..10].copy_from_slice(&2u64.to_be_bytes());
    c[13] = 24;
    let d = e.ok(&a, &c, 24, None);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 2);
    assert_eq!(u32::from_be_bytes(d[16..20].try_into().unwrap()), 3);
    assert_eq!(d[20], 1);
    c[2..10].copy_from_slice(&5u64.to_be_bytes());
    let d = e.ok(&a, &c, 24, None);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 5);
    assert_eq!(d[20], 0);
    c[2..10].copy_from_slice(&(BLOCKS + 1).to_be_bytes());
    e.check(&a, &c, 24, None, LBA_OOR);
}

#[test]
fn verify_writeverify_orwrite_prefetch_sync() {
    let mut e = env();
    let a = e.a.clone();
    let data = pattern(4 * BS, 11);
    e.write16(&a, 30, data.clone());
    // VERIFY BYTCHK=1 match and mismatch.
    e.ok(
        &a,
        &rw10(op::VERIFY10, 30, 4, 0x02),
        4 * BS as u32,
        Some(data.clone()),
    );
    let mut bad = data.clone();
    bad[700] ^= 0x58;
    let r = e.run(
        &a,
        &rw16(op::VERIFY16, 30, 4, 0x02),
        4 * BS as u32,
        Some(bad.clone()),
    );
    assert_eq!(r.sense_triplet(), Some((0x0E, 0x1D, 0)));
    // BYTCHK=0: no data, no compare.
    e.ok(&a, &rw12(op::VERIFY12, 30, 4, 0x10), 0, None);
    e.check(
        &a,
        &rw10(op::VERIFY10, (BLOCKS - 1) as u32, 2, 0),
        0,
        None,
        LBA_OOR,
    );
    e.check(&a, &rw10(op::VERIFY10, 0, 1, 0x20), 0, None, ILLEGAL_FIELD);
    // WRITE AND VERIFY.
    let d2 = pattern(2 * BS, 77);
    e.ok(
        &a,
        &rw10(op::WRITE_VERIFY10, 40, 2, 0x02),
        2 * BS as u32,
        Some(d2.clone()),
    );
    assert_eq!(e.read16(&a, 40, 2), d2);
    e.ok(
        &a,
        &rw16(op::WRITE_VERIFY16, 42, 1, 0x10),
        BS as u32,
        Some(vec![5; BS]),
    );
    // ORWRITE.
    e.write16(&a, 50, vec![0xA0; BS]);
    e.ok(
        &a,
        &rw16(op::ORWRITE16, 50, 1, 0),
        BS as u32,
        Some(vec![0x05; BS]),
    );
    assert!(e.read16(&a, 50, 1).iter().all(|&x| x == 0xA5));
    // PRE-FETCH (GOOD: nothing to stage), SYNCHRONIZE CACHE.
    e.ok(&a, &rw10(op::PRE_FETCH10, 0, 1, 0x02), 0, None);
    e.check(&a, &rw16(op::PRE_FETCH16, BLOCKS, 1, 0), 0, None, LBA_OOR);
    e.ok(&a, &rw10(op::SYNCHRONIZE_CACHE10, 0, 0, 0), 0, None);
    e.ok(&a, &rw16(op::SYNCHRONIZE_CACHE16, 10, 10, 0x02), 0, None);
    e.check(
        &a,
        &rw16(op::SYNCHRONIZE_CACHE16, BLOCKS, 10, 0),
        0,
        None,
        LBA_OOR,
    );
    // WRITE ATOMIC(16).
    let mut c = vec![0u8; 16];
    c[0] = op::WRITE_ATOMIC16;
    c[2..10].copy_from_slice(&60u64.to_be_bytes());
    c[12..14].copy_from_slice(&2u16.to_be_bytes());
    e.ok(&a, &c, 2 * BS as u32, Some(vec![0x3C; 2 * BS]));
    assert!(e.read16(&a, 60, 2).iter().all(|&x| x == 0x3C));
}

// ----------------------------------------------------------------------------------
// MODE SENSE / MODE SELECT

#[test]
fn mode_sense_and_select_round_trip() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    let all = e.ok(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    assert_eq!(all[0] as usize, all.len() - 1);
    assert_eq!(all[2] & 0x10, 0x10, "DPOFUA");
    assert_eq!(all[3], 8, "block descriptor");
    let pages: Vec<u8> = {
        let mut v = vec![];
        let mut off = 4 + 8;
        while off < all.len() {
            v.push(all[off] & 0x3F);
            off += all[off + 1] as usize + 2;
        }
        v
    };
    assert_eq!(pages, vec![0x08, 0x0A, 0x1C]);
    // Residuals: 4 bytes requested, no overflow.
    let r = e.run(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 4, 0], 4, None);
    assert_eq!((r.data_len, r.residual), (4, Residual::None));
    // Saved values are not supported; unknown page.
    e.check(
        &a,
        &[op::MODE_SENSE6, 0, 0xC8, 0, 255, 0],
        255,
        None,
        (5, 0x39, 0),
    );
    e.check(
        &a,
        &[op::MODE_SENSE6, 0, 0x19, 0, 255, 0],
        255,
        None,
        ILLEGAL_FIELD,
    );
    // MODE SENSE(10) with LLBAA and DBD.
    let d = e.ok(
        &a,
        &[op::MODE_SENSE10, 0x10, 0x08, 0, 0, 0, 0, 0, 255, 0],
        255,
        None,
    );
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 16);
    let d = e.ok(
        &a,
        &[op::MODE_SENSE10, 0x08, 0x08, 0, 0, 0, 0, 0, 255, 0],
        255,
        None,
    );
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 0);
    assert_eq!(d[8], 0x08);
    assert_eq!(d[10] & 0x04, 0x04, "WCE on by default");
    // Changeable values show WCE, D_SENSE and SWP.
    let ch = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x4A, 0, 255, 0], 255, None);
    assert_eq!((ch[4 + 2], ch[4 + 4]), (0x04, 0x08));
    // Turn WCE off with MODE SELECT(6) of the current caching page.
    let cur = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x08, 0, 255, 0], 255, None);
    let mut page = cur[4..].to_vec();
    page[2] &= !0x04;
    let mut p = vec![0, 0, 0, 0];
    p.extend(page.clone());
    e.ok(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p.clone()),
    );
    let cur = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x08, 0, 255, 0], 255, None);
    assert_eq!(cur[6] & 0x04, 0);
    // The other nexus hears about it.
    e.check(
        &b,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x2A, 0x01),
    );
    // Changing a field that is not changeable, SP, a short list.
    let mut bad = p.clone();
    bad[4 + 2] |= 0x01; // RCD
    e.check(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, bad.len() as u8, 0],
        bad.len() as u32,
        Some(bad),
        (5, 0x26, 0),
    );
    e.check(
        &a,
        &[op::MODE_SELECT6, 0x11, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p.clone()),
        ILLEGAL_FIELD,
    );
    e.check(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, 3, 0],
        3,
        Some(vec![0; 3]),
        (5, 0x1A, 0),
    );
    // D_SENSE: descriptor sense data from now on.
    let cur = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x0A, 0, 255, 0], 255, None);
    let mut p = vec![0, 0, 0, 0];
    p.extend(cur[4..].to_vec());
    p[4 + 2] |= 0x04;
    e.ok(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p.clone()),
    );
    let r = e.run(&a, &rw16(op::READ16, u64::MAX, 1, 0), BS as u32, None);
    assert_eq!(r.sense_bytes()[0], 0x72);
    assert_eq!(r.sense_triplet(), Some(LBA_OOR));
    // SWP: writes fail with DATA PROTECT, reads work, WP shows in MODE SENSE.
    p[4 + 2] &= !0x04;
    p[4 + 4] |= 0x08;
    e.ok(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p.clone()),
    );
    e.ok(&a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    e.check(
        &a,
        &rw10(op::WRITE10, 0, 1, 0),
        BS as u32,
        Some(vec![0; BS]),
        (7, 0x27, 0x02),
    );
    let ms = e.ok(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    assert_eq!(ms[2] & 0x80, 0x80);
    p[4 + 4] &= !0x08;
    e.ok(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p),
    );
    e.ok(
        &a,
        &rw10(op::WRITE10, 0, 1, 0),
        BS as u32,
        Some(vec![0; BS]),
    );
}

// ----------------------------------------------------------------------------------
// REPORT SUPPORTED OPERATION CODES

#[test]
fn supported_opcodes_match_what_is_accepted() {
    let mut e = env();
    let a = e.a.clone();
    let mut c = vec![0u8; 12];
    c[0] = op::MAINTENANCE_IN;
    c[1] = op::MI_REPORT_SUPPORTED_OPCODES;
    c[6..10].copy_from_slice(&65535u32.to_be_bytes());
    let d = e.ok(&a, &c, 65535, None);
    let n = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    assert_eq!(n + 4, d.len());
    let mut listed = vec![];
    for desc in d[4..].chunks(8) {
        let sa = if desc[5] & 1 != 0 {
            Some(u16::from_be_bytes([desc[2], desc[3]]) as u8)
        } else {
            None
        };
        listed.push((desc[0], sa, u16::from_be_bytes([desc[6], desc[7]])));
    }
    // Every listed command is accepted (never INVALID COMMAND OPERATION CODE or an
    // invalid service action), and its one-command report agrees.
    for &(opc, sa, len) in &listed {
        let mut cdb = vec![0u8; len as usize];
        cdb[0] = opc;
        if let Some(s) = sa {
            cdb[1] = s;
        }
        let r = e.run(&a, &cdb, 0, None);
        if r.status == Status::CheckCondition {
            let (k, asc, _) = r.sense_triplet().unwrap();
            assert!(
                !(k == 5 && asc == 0x20),
                "{opc:02x}/{sa:?} rejected as invalid opcode"
            );
            // Unknown service actions point at byte 1.
            assert!(
                !(k == 5
                    && asc == 0x24
                    && sa.is_some()
                    && r.sense_bytes()[17] == 1
                    && r.sense_bytes()[15] & 0x80 != 0),
                "{opc:02x}/{sa:?} rejected as invalid service action"
            );
        }
        let mut one = c.clone();
        one[2] = if sa.is_some() { 2 } else { 1 };
        one[3] = opc;
        one[4..6].copy_from_slice(&(sa.unwrap_or(0) as u16).to_be_bytes());
        let d = e.ok(&a, &one, 65535, None);
        assert_eq!(d[1] & 7, 3, "{opc:02x} supported");
        assert_eq!(u16::from_be_bytes([d[2], d[3]]), len);
        assert_eq!(d[4], opc);
        // The other reporting option is refused.
        one[2] = if sa.is_some() { 1 } else { 2 };
        e.check(&a, &one, 65535, None, ILLEGAL_FIELD);
    }
    // Every other opcode is rejected as such.
    for opc in 0..=255u8 {
        if listed.iter().any(|l| l.0 == opc) {
            continue;
        }
        let len = crate::cdb::cdb_len(opc).unwrap_or(16);
        let mut cdb = vec![0u8; len];
        cdb[0] = opc;
        e.check(&a, &cdb, 0, None, (5, 0x20, 0));
    }
    // With timeouts descriptors.
    c[2] = 0x80;
    let d = e.ok(&a, &c, 65535, None);
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize,
        listed.len() * 20
    );
    assert!(d[4..]
        .chunks(20)
        .all(|x| x[5] & 2 != 0 && u16::from_be_bytes([x[8], x[9]]) == 0x0A));
}

// ----------------------------------------------------------------------------------
// Persistent reservations and RESERVE/RELEASE

fn prout(sa: u8, ty: u8, key: u64, sark: u64) -> (Vec<u8>, Vec<u8>) {
    let mut c = vec![0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_OUT;
    c[1] = sa;
    c[2] = ty;
    c[8] = 24;
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    (c, p)
}

fn prin(sa: u8) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_IN;
    c[1] = sa;
    c[7] = 0x10;
    c
}

impl Env {
    fn pr_ok(&mut self, n: &Arc<Nexus>, sa: u8, ty: u8, key: u64, sark: u64) {
        let (c, p) = prout(sa, ty, key, sark);
        self.ok(n, &c, 24, Some(p));
    }
    fn pr_conflict(&mut self, n: &Arc<Nexus>, sa: u8, ty: u8, key: u64, sark: u64) {
        let (c, p) = prout(sa, ty, key, sark);
        self.conflict(n, &c, 24, Some(p));
    }
    fn keys(&mut self, n: &Arc<Nexus>) -> (u32, Vec<u64>) {
        let d = self.ok(n, &prin(0), 4096, None);
        let gen = u32::from_be_bytes(d[0..4].try_into().unwrap());
        let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
        (
            gen,
            d[8..8 + len]
                .chunks(8)
                .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
                .collect(),
        )
    }
    fn reservation(&mut self, n: &Arc<Nexus>) -> Option<(u64, u8)> {
        let d = self.ok(n, &prin(1), 4096, None);
        if u32::from_be_bytes(d[4..8].try_into().unwrap()) == 0 {
            return None;
        }
        Some((
            u64::from_be_bytes(d[8..16].try_into().unwrap()),
            d[21] & 0x0F,
        ))
    }
    fn can_read(&mut self, n: &Arc<Nexus>) -> bool {
        let r = self.run(n, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
        assert!(
            matches!(r.status, Status::Good | Status::ReservationConflict),
            "{r:?}"
        );
        r.status == Status::Good
    }
    fn can_write(&mut self, n: &Arc<Nexus>) -> bool {
        let r = self.run(n, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
        assert!(
            matches!(r.status, Status::Good | Status::ReservationConflict),
            "{r:?}"
        );
        r.status == Status::Good
    }
}

#[test]
fn pr_register_reserve_release_each_type() {
    use crate::pr_type::*;
    // (type, registered b reads, registered b writes, unregistered b reads, writes)
    let table = [
        (EXCLUSIVE_ACCESS, false, false, false, false),
        (WRITE_EXCLUSIVE, true, false, true, false),
        (EXCLUSIVE_ACCESS_RO, true, true, false, false),
        (WRITE_EXCLUSIVE_RO, true, true, true, false),
        (EXCLUSIVE_ACCESS_AR, true, true, false, false),
        (WRITE_EXCLUSIVE_AR, true, true, true, false),
    ];
    for (ty, rr, rw, ur, uw) in table {
        let mut e = env();
        let (a, b) = (e.a.clone(), e.b.clone());
        e.pr_ok(&a, 6, 0, 0, 0xAA);
        e.pr_ok(&b, 6, 0, 0, 0xBB);
        assert_eq!(e.keys(&a), (2, vec![0xAA, 0xBB]));
        e.pr_ok(&a, 1, ty, 0xAA, 0);
        let all_reg = ty == EXCLUSIVE_ACCESS_AR || ty == WRITE_EXCLUSIVE_AR;
        assert_eq!(
            e.reservation(&b),
            Some((if all_reg { 0 } else { 0xAA }, ty))
        );
        assert!(e.can_read(&a) && e.can_write(&a));
        assert_eq!(
            (e.can_read(&b), e.can_write(&b)),
            (rr, rw),
            "type {ty} registered"
        );
        // Reserving again with the same type is fine, another type or nexus conflicts.
        e.pr_ok(&a, 1, ty, 0xAA, 0);
        if !all_reg {
            e.pr_conflict(&b, 1, ty, 0xBB, 0);
        }
        e.pr_conflict(&a, 1, if ty == 1 { 3 } else { 1 }, 0xAA, 0);
        // Unregister b.
        e.pr_ok(&b, 0, 0, 0xBB, 0);
        assert_eq!(
            (e.can_read(&b), e.can_write(&b)),
            (ur, uw),
            "type {ty} unregistered"
        );
        // Release with the wrong type, then properly.
        let (c, p) = prout(2, if ty == 1 { 3 } else { 1 }, 0xAA, 0);
        e.check(&a, &c, 24, Some(p), (5, 0x26, 0x04));
        e.pr_ok(&a, 2, ty, 0xAA, 0);
        assert_eq!(e.reservation(&a), None);
        assert!(e.can_write(&b));
        e.pr_ok(&a, 0, 0, 0xAA, 0);
        assert_eq!(e.keys(&a).1, Vec::<u64>::new());
    }
}

#[test]
fn pr_ownership_register_rules_and_preempt() {
    use crate::pr_type::*;
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    // REGISTER with a wrong key conflicts; unregistered RESERVE conflicts.
    e.pr_conflict(&a, 0, 0, 0x1, 0x2);
    e.pr_conflict(&a, 1, WRITE_EXCLUSIVE, 0x1, 0);
    e.pr_ok(&a, 0, 0, 0, 0x11);
    e.pr_conflict(&a, 0, 0, 0x99, 0x12);
    e.pr_ok(&a, 0, 0, 0x11, 0x12); // change key
    e.pr_ok(&b, 0, 0, 0, 0x22);
    // Holder unregisters: a registrants-only reservation goes, b is told.
    e.pr_ok(&a, 1, WRITE_EXCLUSIVE_RO, 0x12, 0);
    e.pr_ok(&a, 0, 0, 0x12, 0);
    assert_eq!(e.reservation(&a), None);
    e.check(
        &b,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x2A, 0x04),
    );
    // All registrants: survives until the last registrant leaves; any registrant releases.
    e.pr_ok(&a, 0, 0, 0, 0x12);
    e.pr_ok(&a, 1, EXCLUSIVE_ACCESS_AR, 0x12, 0);
    e.pr_ok(&a, 0, 0, 0x12, 0);
    assert_eq!(e.reservation(&a), Some((0, EXCLUSIVE_ACCESS_AR)));
    e.pr_ok(&b, 2, EXCLUSIVE_ACCESS_AR, 0x22, 0);
    assert_eq!(e.reservation(&a), None);
    // PREEMPT: b removes a's registration and takes the reservation.
    e.pr_ok(&a, 0, 0, 0, 0x12);
    e.pr_ok(&a, 1, EXCLUSIVE_ACCESS, 0x12, 0);
    assert!(!e.can_read(&b));
    let (gen, _) = e.keys(&a);
    e.pr_ok(&b, 4, WRITE_EXCLUSIVE, 0x22, 0x12);
    assert_eq!(e.keys(&b), (gen + 1, vec![0x22]));
    assert_eq!(e.reservation(&b), Some((0x22, WRITE_EXCLUSIVE)));
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x2A, 0x05),
    );
    assert!(e.can_read(&a) && !e.can_write(&a));
    // PREEMPT of a key nobody has, and with SARK 0 without all-registrants.
    e.pr_conflict(&b, 4, WRITE_EXCLUSIVE, 0x22, 0x77);
    let (c, p) = prout(4, WRITE_EXCLUSIVE, 0x22, 0);
    e.check(&b, &c, 24, Some(p), (5, 0x26, 0));
    // CLEAR.
    e.pr_ok(&a, 6, 0, 0, 0x33);
    e.pr_ok(&b, 3, 0, 0x22, 0);
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x2A, 0x03),
    );
    assert_eq!(e.keys(&a).1, Vec::<u64>::new());
    assert_eq!(e.reservation(&a), None);
    // Parameter list length, SPEC_I_PT, APTPL, unknown service actions.
    let (mut c, p) = prout(6, 0, 0, 0x44);
    c[8] = 20;
    e.check(&a, &c, 20, Some(p[..20].to_vec()), (5, 0x1A, 0));
    let (c, mut p) = prout(6, 0, 0, 0x44);
    p[20] = 0x01;
    e.check(&a, &c, 24, Some(p), (5, 0x26, 0));
    for sa in 4..0x20u8 {
        e.check(&a, &prin(sa), 4096, None, ILLEGAL_FIELD);
    }
    let (c, p) = prout(7, 0, 0, 0x44);
    e.check(&a, &c, 24, Some(p), ILLEGAL_FIELD);
    // REPORT CAPABILITIES and READ FULL STATUS.
    let d = e.ok(&a, &prin(2), 4096, None);
    assert_eq!(u16::from_be_bytes([d[0], d[1]]), 8);
    assert_eq!((d[4], d[5]), (0xEA, 0x01));
    e.pr_ok(&a, 6, 0, 0, 0x55);
    e.pr_ok(&a, 1, WRITE_EXCLUSIVE, 0x55, 0);
    let d = e.ok(&a, &prin(3), 4096, None);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0x55);
    assert_eq!(d[8 + 12] & 1, 1);
    assert_eq!(d[8 + 13], WRITE_EXCLUSIVE);
    let tid_len = u32::from_be_bytes(d[28..32].try_into().unwrap()) as usize;
    let tid = &d[32..32 + tid_len];
    assert_eq!(tid[0], 0x45);
    assert!(tid[4..].starts_with(b"iqn.2024-01.test:init1,i,0x23d000000001"));
    // Truncated READ KEYS keeps the header.
    let mut c = prin(0);
    c[7] = 0;
    c[8] = 4;
    assert_eq!(e.ok(&a, &c, 4, None).len(), 4);
}

#[test]
fn spc2_reserve_release() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    let r6 = [op::RESERVE6, 0, 0, 0, 0, 0];
    let rl6 = [op::RELEASE6, 0, 0, 0, 0, 0];
    e.ok(&a, &r6, 0, None);
    e.ok(&a, &r6, 0, None);
    e.conflict(&b, &r6, 0, None);
    e.ok(&b, &rl6, 0, None); // not the holder: no effect
    e.conflict(&b, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    e.conflict(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&b, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    e.ok(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    e.ok(&a, &rl6, 0, None);
    e.ok(&b, &r6, 0, None);
    // The holder's nexus goes away: the reservation goes with it.
    e.lun.nexus_lost(&b);
    e.ch.forget_nexus(&b);
    e.ok(&a, &r6, 0, None);
    // A LUN reset releases it too.
    e.lun.reset(crate::ResetKind::LunReset);
    e.run(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.run(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&b, &r6, 0, None);
    e.ok(&b, &rl6, 0, None);
    // Persistent reservations and RESERVE do not mix.
    e.run(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.pr_ok(&a, 6, 0, 0, 0x1);
    e.conflict(&a, &r6, 0, None);
}

// ----------------------------------------------------------------------------------
// Removable medium, PREVENT ALLOW, START STOP UNIT

#[test]
fn removable_medium_eject_load_prevent() {
    let mut e = env_with(LunConfig {
        removable: true,
        ..Default::default()
    });
    let (a, b) = (e.a.clone(), e.b.clone());
    let ssu = |start: bool, loej: bool| {
        [
            op::START_STOP_UNIT,
            0,
            0,
            0,
            (loej as u8) << 1 | start as u8,
            0,
        ]
    };
    let inq = e.ok(&a, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    assert_eq!(inq[1], 0x80);
    e.ok(&a, &ssu(false, true), 0, None);
    let no_medium = (2, 0x3A, 0);
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        no_medium,
    );
    e.check(&a, &rw10(op::READ10, 0, 1, 0), BS as u32, None, no_medium);
    e.check(
        &a,
        &rw16(op::WRITE16, 0, 1, 0),
        BS as u32,
        Some(vec![0; BS]),
        no_medium,
    );
    e.check(
        &a,
        &[op::READ_CAPACITY10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        8,
        None,
        no_medium,
    );
    e.ok(&a, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    e.ok(&a, &ssu(true, true), 0, None);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // Power conditions and LOEJ=0 never eject.
    for pc in 1..16u8 {
        e.ok(
            &a,
            &[op::START_STOP_UNIT, 0, 0, 0, pc << 4 | 0x02, 0],
            0,
            None,
        );
    }
    e.ok(&a, &ssu(false, false), 0, None);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // PREVENT from a: neither a nor b can eject (or load).
    e.ok(&a, &[op::PREVENT_ALLOW, 0, 0, 0, 1, 0], 0, None);
    let prevented = (5, 0x53, 0x02);
    e.check(&a, &ssu(false, true), 0, None, prevented);
    e.check(&b, &ssu(false, true), 0, None, prevented);
    e.check(&a, &ssu(true, true), 0, None, prevented);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // a's nexus goes away: prevention ends.
    e.lun.nexus_lost(&a);
    e.ch.forget_nexus(&a);
    e.ok(&b, &ssu(false, true), 0, None);
    e.ok(&b, &ssu(true, true), 0, None);
    // A LUN reset ends it too.
    e.ok(&b, &[op::PREVENT_ALLOW, 0, 0, 0, 1, 0], 0, None);
    e.lun.reset(crate::ResetKind::LunReset);
    e.run(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&b, &ssu(false, true), 0, None);
    e.ok(&b, &ssu(true, true), 0, None);
}

#[test]
fn fixed_medium_cannot_be_ejected() {
    let mut e = env();
    let a = e.a.clone();
    e.check(
        &a,
        &[op::START_STOP_UNIT, 1, 0, 0, 0x02, 0],
        0,
        None,
        ILLEGAL_FIELD,
    );
    e.ok(&a, &[op::START_STOP_UNIT, 1, 0, 0, 0x01, 0], 0, None);
    e.ok(&a, &[op::START_STOP_UNIT, 1, 0, 0, 0x00, 0], 0, None);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&a, &[op::PREVENT_ALLOW, 0, 0, 0, 1, 0], 0, None);
    e.ok(&a, &[op::PREVENT_ALLOW, 0, 0, 0, 0, 0], 0, None);
}

// ----------------------------------------------------------------------------------
// EXTENDED COPY

fn xcopy_list(
    e: &mut Env,
    list_id: u8,
    usage: u8,
    tgts: usize,
    segs: &[(u64, u64, u16)],
) -> Vec<u8> {
    let a = e.a.clone();
    let di = e.ok(&a, &[op::INQUIRY, 1, 0x83, 0, 255, 0], 255, None);
    // The NAA designator (first one).
    let naa = &di[4..4 + 20];
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = usage << 3;
    p[2..4].copy_from_slice(&((32 * tgts) as u16).to_be_bytes());
    p[8..12].copy_from_slice(&((28 * segs.len()) as u32).to_be_bytes());
    for _ in 0..tgts {
        let mut t = vec![0u8; 32];
        t[0] = 0xE4;
        t[4..24].copy_from_slice(naa);
        t[29..32].copy_from_slice(&(BS as u32).to_be_bytes()[1..]);
        p.extend(t);
    }
    for &(src, dst, n) in segs {
        let mut s = vec![0u8; 28];
        s[0] = 0x02;
        s[2..4].copy_from_slice(&0x18u16.to_be_bytes());
        s[10..12].copy_from_slice(&n.to_be_bytes());
        s[12..20].copy_from_slice(&src.to_be_bytes());
        s[20..28].copy_from_slice(&dst.to_be_bytes());
        p.extend(s);
    }
    p
}

fn xcopy_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op::EXTENDED_COPY;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

#[test]
fn extended_copy_and_results() {
    let mut e = env();
    let a = e.a.clone();
    let data = pattern(40 * BS, 5);
    e.write16(&a, 0, data.clone());
    // No copy yet with list id 1.
    let mut rcr = vec![0u8; 16];
    rcr[0] = op::RECEIVE_COPY_RESULTS;
    rcr[2] = 1;
    rcr[13] = 255;
    e.check(&a, &rcr, 255, None, ILLEGAL_FIELD);
    let p = xcopy_list(&mut e, 1, 0, 1, &[(0, 4000, 40), (0, 5000, 2)]);
    e.ok(&a, &xcopy_cdb(p.len()), p.len() as u32, Some(p));
    assert_eq!(e.read16(&a, 4000, 40), data);
    assert_eq!(e.read16(&a, 5000, 2), &data[..2 * BS]);
    let d = e.ok(&a, &rcr, 255, None);
    assert_eq!(d[4] & 0x7F, 1);
    assert_eq!(u16::from_be_bytes([d[5], d[6]]), 2);
    // Operating parameters.
    rcr[1] = op::RCR_OPERATING_PARAMETERS;
    let d = e.ok(&a, &rcr, 255, None);
    let max_tgt = u16::from_be_bytes([d[8], d[9]]) as usize;
    let max_seg = u16::from_be_bytes([d[10], d[11]]) as usize;
    // Truncated lists, zero length.
    let p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    for cut in [16 + 31, 16 + 32 + 27] {
        e.check(
            &a,
            &xcopy_cdb(cut),
            cut as u32,
            Some(p[..cut].to_vec()),
            (5, 0x1A, 0),
        );
    }
    e.ok(&a, &xcopy_cdb(0), 0, None);
    // Too many descriptors.
    let p = xcopy_list(&mut e, 2, 0, max_tgt + 1, &[(0, 4000, 4)]);
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (5, 0x26, 0x06),
    );
    let segs = vec![(0u64, 4000u64, 1u16); max_seg + 1];
    let p = xcopy_list(&mut e, 2, 0, 1, &segs);
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (5, 0x26, 0x08),
    );
    // Unsupported descriptor types.
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[16] = 0xE0;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (5, 0x26, 0x07),
    );
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[48] = 0x03;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (5, 0x26, 0x09),
    );
    // LU ID TYPE (SPC-3) is ignored in SPC-4: a reserved value still copies, as libiscsi's
    // ExtendedCopy.ValidTgtDescr expects of an SPC-4 target.
    let src = pattern(4 * BS, 77);
    e.write16(&a, 100, src.clone());
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(100, 4100, 4)]);
    p[17] |= 0xC0;
    e.ok(&a, &xcopy_cdb(p.len()), p.len() as u32, Some(p));
    assert_eq!(e.read16(&a, 4100, 4), src);
    // NUL; bad index; beyond the end.
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[17] = 0x20;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (0x0A, 0x0D, 0x02),
    );
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[48 + 7] = 1;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (0x0A, 0x0D, 0x02),
    );
    let p = xcopy_list(&mut e, 2, 0, 1, &[(0, BLOCKS - 1, 4)]);
    let r = e.run(&a, &xcopy_cdb(p.len()), p.len() as u32, Some(p));
    assert_eq!(r.sense_triplet().map(|t| t.0), Some(0x0A));
    // A designator that is not this LU.
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[16 + 10] ^= 0xFF;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (0x0A, 0x0D, 0x02),
    );
}

// ----------------------------------------------------------------------------------
// Task management

#[test]
fn abort_tasks() {
    let mut e = env();
    let a = e.a.clone();
    // Aborting a task whose I/O is in flight reports it aborted, once.
    let t = e.task(&a, &rw10(op::READ10, 0, 8, 0), 8 * BS as u32, None);
    let tag = t.tag;
    e.ch.submit(t);
    assert!(e.ch.abort_task(&a, tag));
    assert!(!e.ch.abort_task(&a, tag));
    let mut out = vec![];
    while e.ch.outstanding() > 0 {
        e.ch.poll(&mut out);
    }
    assert_eq!(out.len(), 1);
    assert!(out[0].aborted);
    assert!(out[0].data_in.is_none());
    // A COMPARE AND WRITE waiting for its range is dropped by abort_nexus.
    let g = {
        e.lun.ranges.begin_exclusive();
        e.lun.ranges.try_exclusive(0, 1).unwrap()
    };
    let mut d = vec![0u8; BS];
    d.extend(vec![1u8; BS]);
    let t = e.task(&a, &caw(0, 1), 2 * BS as u32, Some(d));
    e.ch.submit(t);
    out.clear();
    e.ch.poll(&mut out);
    assert!(out.is_empty());
    assert_eq!(e.ch.abort_nexus(&a), 1);
    e.ch.poll(&mut out);
    assert_eq!(out.len(), 1);
    assert!(out[0].aborted);
    e.lun.ranges.release(g);
    assert!(e.lun.ranges.idle());
    assert_eq!(e.ch.outstanding(), 0);
    // A channel dropped with a COMPARE AND WRITE in flight releases its range.
    let mut ch2 = LunChannel::new(e.lun.clone());
    let mut d = vec![0u8; BS];
    d.extend(vec![1u8; BS]);
    let t = e.task(&a, &caw(0, 1), 2 * BS as u32, Some(d));
    ch2.submit(t);
    drop(ch2);
    assert!(e.lun.ranges.idle());
}

#[test]
fn malformed_cdbs_never_panic() {
    // Every opcode with random bytes and random data: a status, never a panic.
    let mut e = env();
    let a = e.a.clone();
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20000u32 {
        let mut cdb = [0u8; 16];
        for b in cdb.iter_mut() {
            *b = rnd() as u8;
        }
        cdb[0] = (i % 256) as u8;
        if cdb[0] == op::START_STOP_UNIT
            || cdb[0] == op::MODE_SELECT6
            || cdb[0] == op::MODE_SELECT10
        {
            continue; // would change LUN state for the rest of the loop
        }
        let edtl = (rnd() % 70000) as u32;
        let data = if rnd() % 2 == 0 {
            Some((0..(rnd() % 5000)).map(|_| rnd() as u8).collect())
        } else {
            None
        };
        let r = e.run(&a, &cdb, edtl, data);
        assert!(r.data_len <= edtl as usize);
        if r.status == Status::CheckCondition {
            assert!(r.sense_triplet().is_some());
        }
    }
}

#[test]
fn shared_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Lun>();
    send_sync::<Nexus>();
    send::<ScsiTask>();
    send::<ScsiResult>();
}

// ----------------------------------------------------------------------------------
// Fixes found by libiscsi's compliance suite

#[test]
fn compare_and_write_length_must_match_the_data() {
    let mut e = env();
    let a = e.a.clone();
    e.write16(&a, 0, vec![b'A'; BS]);
    // 256 blocks wrap to 0 in the one-byte field: with 2 x 256 blocks of Data-Out this is
    // not "no blocks, nothing to do" (libiscsi CompareAndWrite.Simple above the limit).
    e.check(
        &a,
        &caw(0, 0),
        (2 * 256 * BS) as u32,
        Some(vec![b'A'; 2 * 256 * BS]),
        ILLEGAL_FIELD,
    );
    assert!(e.read16(&a, 0, 1).iter().all(|&x| x == b'A'));
    // A real zero-length COMPARE AND WRITE is still fine.
    e.ok(&a, &caw(0, 0), 0, None);
    assert!(e.lun.ranges.idle());
}

#[test]
fn transfers_up_to_32_mib_are_accepted() {
    let mut e = env();
    let a = e.a.clone();
    let max = (crate::MAX_TRANSFER_BYTES / BS as u64) as u32;
    assert_eq!(max, 65536);
    // Within MAXIMUM TRANSFER LENGTH: only the range is wrong for this small LUN.
    e.check(&a, &rw16(op::READ16, 0, max, 0), 0, None, LBA_OOR);
    e.check(&a, &rw16(op::READ16, 0, max + 1, 0), 0, None, ILLEGAL_FIELD);
    let bl = e.ok(&a, &[op::INQUIRY, 1, 0xB0, 0, 64, 0], 64, None);
    assert_eq!(u32::from_be_bytes(bl[8..12].try_into().unwrap()), max);
}

fn get_lba_status(lba: u64, alloc: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op::SERVICE_ACTION_IN16;
    c[1] = op::SAI_GET_LBA_STATUS;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// (lba, blocks, status) of each descriptor.
fn lba_status_descs(d: &[u8]) -> Vec<(u64, u32, u8)> {
    d[8..]
        .chunks_exact(16)
        .map(|x| {
            (
                u64::from_be_bytes(x[0..8].try_into().unwrap()),
                u32::from_be_bytes(x[8..12].try_into().unwrap()),
                x[12],
            )
        })
        .collect()
}

#[test]
fn lba_status_scans_past_the_first_window() {
    let mut e = env();
    let a = e.a.clone();
    // The LUN (4 MiB) is larger than one scan window (1 MiB): a fully deallocated medium
    // is one descriptor covering everything (what libiscsi checks after a SANITIZE).
    let mut ws = vec![0u8; 16];
    ws[0] = op::WRITE_SAME16;
    ws[1] = 0x08; // UNMAP, NUMBER OF LOGICAL BLOCKS 0: to the end
    e.ok(&a, &ws, BS as u32, Some(vec![0; BS]));
    let d = e.ok(&a, &get_lba_status(0, 256), 256, None);
    assert_eq!(lba_status_descs(&d), vec![(0, BLOCKS as u32, 1)]);
    // One mapped block in the third window splits it in three.
    e.write16(&a, 5000, vec![1; BS]);
    let d = e.ok(&a, &get_lba_status(0, 256), 256, None);
    assert_eq!(
        lba_status_descs(&d),
        vec![
            (0, 5000, 1),
            (5000, 1, 0),
            (5001, (BLOCKS - 5001) as u32, 1)
        ]
    );
    // Room for one descriptor: the scan stops after the window where a second run starts
    // (PARAMETER DATA LENGTH tells what was found, the allocation length cuts it).
    let d = e.ok(&a, &get_lba_status(0, 24), 24, None);
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 4 + 3 * 16);
    assert_eq!(lba_status_descs(&d), vec![(0, 5000, 1)]);
    // From the middle.
    let d = e.ok(&a, &get_lba_status(5000, 256), 256, None);
    assert_eq!(
        lba_status_descs(&d),
        vec![(5000, 1, 0), (5001, (BLOCKS - 5001) as u32, 1)]
    );
}

#[test]
fn physical_block_size_is_reported() {
    let rc16 = |e: &mut Env| {
        let a = e.a.clone();
        let mut c = vec![0u8; 16];
        c[0] = op::SERVICE_ACTION_IN16;
        c[1] = op::SAI_READ_CAPACITY16;
        c[13] = 32;
        let d = e.ok(&a, &c, 32, None);
        let bl = e.ok(&a, &[op::INQUIRY, 1, 0xB0, 0, 64, 0], 64, None);
        (d[13] & 0x0F, u16::from_be_bytes([bl[6], bl[7]]))
    };
    let mut e = env();
    assert_eq!(rc16(&mut e), (0, 1));
    let mut e = env_with(LunConfig {
        physical_block_size: Some(4096),
        ..Default::default()
    });
    assert_eq!(rc16(&mut e), (3, 8));
    for bad in [1000, 1536, 256] {
        let mut e = env_with(LunConfig {
            physical_block_size: Some(bad),
            ..Default::default()
        });
        assert_eq!(rc16(&mut e), (0, 1), "{bad}");
    }
}

// ----------------------------------------------------------------------------------
// SANITIZE

fn sanitize_cdb(sa: u8, flags: u8, len: u16) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = op::SANITIZE;
    c[1] = flags | sa;
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}

const SANITIZE_IN_PROGRESS: (u8, u8, u8) = (2, 0x04, 0x1B);
const SANITIZE_FAILED: (u8, u8, u8) = (3, 0x31, 0x03);

/// Service actions of SANITIZE listed by REPORT SUPPORTED OPERATION CODES.
fn sanitize_listed(e: &mut Env) -> Vec<u8> {
    let a = e.a.clone();
    (0..=0x1Fu8)
        .filter(|&sa| {
            let mut c = vec![0u8; 12];
            c[0] = op::MAINTENANCE_IN;
            c[1] = op::MI_REPORT_SUPPORTED_OPCODES;
            c[2] = 0x02; // one command, with service action
            c[3] = op::SANITIZE;
            c[5] = sa;
            c[9] = 64;
            let d = e.ok(&a, &c, 64, None);
            d[1] & 0x07 == 0x03
        })
        .collect()
}

#[test]
fn sanitize_block_and_crypto_erase() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    assert_eq!(sanitize_listed(&mut e), vec![0x02, 0x03, 0x1F]);
    // Block Device Characteristics: WABEREQ 01b, WACEREQ 01b.
    let d = e.ok(&a, &[op::INQUIRY, 1, 0xB1, 0, 64, 0], 64, None);
    assert_eq!(d[7] & 0xF0, 0x50);
    // BLOCK ERASE: everything deallocated, reads zeros.
    e.write16(&a, 0, vec![b'a'; 16 * BS]);
    e.write16(&a, BLOCKS - 16, vec![b'a'; 16 * BS]);
    e.ok(&a, &sanitize_cdb(0x02, 0, 0), 0, None);
    assert!(e.read16(&a, 0, 16).iter().all(|&x| x == 0));
    assert!(e.read16(&a, BLOCKS - 16, 16).iter().all(|&x| x == 0));
    let d = e.ok(&b, &get_lba_status(0, 256), 256, None);
    assert_eq!(lba_status_descs(&d), vec![(0, BLOCKS as u32, 1)]);
    // CRYPTOGRAPHIC ERASE: the old data is gone, replaced by unpredictable data.
    let old = pattern(16 * BS, 9);
    e.write16(&a, 100, old.clone());
    e.ok(&a, &sanitize_cdb(0x03, 0, 0), 0, None);
    let now = e.read16(&a, 100, 16);
    assert_ne!(now, old);
    assert!(now.iter().any(|&x| x != 0));
    // The LU is usable again, by every nexus.
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.write16(&b, 7, vec![3; BS]);
    assert_eq!(e.read16(&a, 7, 1), vec![3; BS]);
    assert!(e.lun.ranges.idle());
}

#[test]
fn sanitize_cdb_checks() {
    let mut e = env();
    let a = e.a.clone();
    // No parameter list for BLOCK ERASE, CRYPTO ERASE and EXIT FAILURE MODE.
    for sa in [0x02, 0x03, 0x1F] {
        e.check(
            &a,
            &sanitize_cdb(sa, 0, 8),
            8,
            Some(vec![0; 8]),
            ILLEGAL_FIELD,
        );
    }
    // Reserved bit 6 of byte 1 and reserved bytes 2..6.
    e.check(&a, &sanitize_cdb(0x02, 0x40, 0), 0, None, ILLEGAL_FIELD);
    for i in 2..7 {
        let mut c = sanitize_cdb(0x02, 0, 0);
        c[i] = i as u8;
        e.check(&a, &c, 0, None, ILLEGAL_FIELD);
    }
    // Service actions that do not exist, and OVERWRITE (not offered by default).
    for sa in (0..=0x1E).filter(|sa| ![2, 3].contains(sa)) {
        e.check(&a, &sanitize_cdb(sa, 0, 0), 0, None, ILLEGAL_FIELD);
    }
    // EXIT FAILURE MODE without a failed sanitize: no effect.
    e.ok(&a, &sanitize_cdb(0x1F, 0, 0), 0, None);
    // Write protected, reservation conflict.
    let mut e = env_with(LunConfig {
        read_only: true,
        ..Default::default()
    });
    let (a, b) = (e.a.clone(), e.b.clone());
    let r = e.run(&a, &sanitize_cdb(0x03, 0, 0), 0, None);
    assert_eq!(r.sense_triplet().map(|t| t.0), Some(7));
    let mut e = env();
    let (a, b2) = (e.a.clone(), e.b.clone());
    let _ = b;
    e.ok(&b2, &[op::RESERVE6, 0, 0, 0, 0, 0], 0, None);
    e.conflict(&a, &sanitize_cdb(0x02, 0, 0), 0, None);
    e.ok(&b2, &[op::RELEASE6, 0, 0, 0, 0, 0], 0, None);
    // No thin provisioning: no BLOCK ERASE (and WABEREQ 00b).
    let mut e = env_with(LunConfig {
        thin_provisioning: Some(false),
        ..Default::default()
    });
    let a = e.a.clone();
    assert_eq!(sanitize_listed(&mut e), vec![0x03, 0x1F]);
    e.check(&a, &sanitize_cdb(0x02, 0, 0), 0, None, ILLEGAL_FIELD);
    let d = e.ok(&a, &[op::INQUIRY, 1, 0xB1, 0, 64, 0], 64, None);
    assert_eq!(d[7] & 0xF0, 0x10);
}

fn overwrite_list(flags: u8, pat: &[u8]) -> Vec<u8> {
    let mut p = vec![flags, 0];
    p.extend_from_slice(&(pat.len() as u16).to_be_bytes());
    p.extend_from_slice(pat);
    p
}

#[test]
fn sanitize_overwrite_when_configured() {
    let mut e = env_with(LunConfig {
        sanitize_overwrite: true,
        ..Default::default()
    });
    let a = e.a.clone();
    assert_eq!(sanitize_listed(&mut e), vec![0x01, 0x02, 0x03, 0x1F]);
    // One pass of a full-block pattern.
    let p = overwrite_list(1, &[0xAA; BS]);
    e.ok(
        &a,
        &sanitize_cdb(0x01, 0, p.len() as u16),
        p.len() as u32,
        Some(p),
    );
    assert!(e.read16(&a, 0, 4).iter().all(|&x| x == 0xAA));
    assert!(e.read16(&a, BLOCKS - 4, 4).iter().all(|&x| x == 0xAA));
    // Two passes of a 3-byte pattern, inverted on the second: the pattern restarts at
    // every block and the last pass is the inverted one.
    let p = overwrite_list(0x80 | 2, &[1, 2, 3]);
    e.ok(
        &a,
        &sanitize_cdb(0x01, 0, p.len() as u16),
        p.len() as u32,
        Some(p),
    );
    let d = e.read16(&a, 10, 2);
    for blk in d.chunks(BS) {
        let want: Vec<u8> = [!1u8, !2, !3].iter().copied().cycle().take(BS).collect();
        assert_eq!(blk, &want[..]);
    }
    // Parameter list checks: length 0..=4 and > block size + 4 are CDB errors; count 0,
    // pattern length 0 or above the block size, TEST set are list errors.
    for len in [0u16, 1, 4, BS as u16 + 5] {
        let data = vec![1u8; len as usize];
        let data = if len == 0 { None } else { Some(data) };
        e.check(
            &a,
            &sanitize_cdb(0x01, 0, len),
            len as u32,
            data,
            ILLEGAL_FIELD,
        );
    }
    let bad = [
        overwrite_list(0, &[1; 4]),
        overwrite_list(0x20 | 1, &[1; 4]),
        {
            let mut p = overwrite_list(1, &[1; 4]);
            p[2..4].copy_from_slice(&0u16.to_be_bytes());
            p
        },
        {
            let mut p = overwrite_list(1, &[1; BS]);
            p[2..4].copy_from_slice(&(BS as u16 + 4).to_be_bytes());
            p
        },
    ];
    for p in bad {
        e.check(
            &a,
            &sanitize_cdb(0x01, 0, p.len() as u16),
            p.len() as u32,
            Some(p),
            (5, 0x26, 0),
        );
    }
    assert!(e.lun.ranges.idle());
}

/// Submits without waiting for the result.
fn submit(e: &mut Env, n: &Arc<Nexus>, cdb: &[u8]) -> u64 {
    let t = e.task(n, cdb, 0, None);
    let tag = t.tag;
    e.ch.submit(t);
    tag
}

/// Polls until `tag` is reported; returns it.
fn wait(e: &mut Env, tag: u64) -> ScsiResult {
    let mut out = Vec::new();
    for _ in 0..1_000_000 {
        e.ch.poll(&mut out);
        if let Some(p) = out.iter().position(|r| r.tag == tag) {
            return out.swap_remove(p);
        }
    }
    panic!("task {tag} never completed");
}

/// Polls until no sanitize runs.
fn wait_sanitized(e: &mut Env) {
    let mut out = Vec::new();
    for _ in 0..1_000_000 {
        e.ch.poll(&mut out);
        if !e.lun.lock().sanitize.active() {
            return;
        }
    }
    panic!("sanitize never ended");
}

#[test]
fn sanitize_immed_gates_commands_and_reports_progress() {
    let mut e = env_with(LunConfig {
        sanitize_overwrite: true,
        ..Default::default()
    });
    let (a, b) = (e.a.clone(), e.b.clone());
    e.write16(&a, 0, vec![b'x'; BS]);
    // IMMED: GOOD at the first poll, while the overwrite (31 passes of 4 chunks, one chunk
    // per poll) is still running.
    let p = overwrite_list(31, &[0x5A]);
    let t = e.task(
        &a,
        &sanitize_cdb(0x01, 0x80, p.len() as u16),
        p.len() as u32,
        Some(p),
    );
    let tag = t.tag;
    e.ch.submit(t);
    let r = wait(&mut e, tag);
    assert_eq!(r.status, Status::Good);
    assert!(e.lun.lock().sanitize.active());
    // Refused with NOT READY, SANITIZE IN PROGRESS; INQUIRY, REPORT LUNS and REQUEST SENSE
    // (which tells the progress) are processed.
    let tag = submit(&mut e, &b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0]);
    let r = wait(&mut e, tag);
    assert_eq!(r.sense_triplet(), Some(SANITIZE_IN_PROGRESS));
    assert_eq!(
        r.sense_bytes()[15] & 0x80,
        0x80,
        "SKSV: progress indication"
    );
    let t = e.task(&a, &rw16(op::READ16, 0, 1, 0), BS as u32, None);
    let tag = t.tag;
    e.ch.submit(t);
    assert_eq!(
        wait(&mut e, tag).sense_triplet(),
        Some(SANITIZE_IN_PROGRESS)
    );
    let t = e.task(&a, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, None);
    let tag = t.tag;
    e.ch.submit(t);
    assert_eq!(wait(&mut e, tag).status, Status::Good);
    let t = e.task(&b, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None);
    let tag = t.tag;
    e.ch.submit(t);
    let r = wait(&mut e, tag);
    assert_eq!(r.status, Status::Good);
    let s = r.data();
    assert_eq!((s[2] & 0x0F, s[12], s[13]), SANITIZE_IN_PROGRESS);
    assert_eq!(s[15], 0x80);
    // A second SANITIZE is refused too.
    let tag = submit(&mut e, &b, &sanitize_cdb(0x02, 0, 0));
    assert_eq!(
        wait(&mut e, tag).sense_triplet(),
        Some(SANITIZE_IN_PROGRESS)
    );
    wait_sanitized(&mut e);
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    assert_eq!(e.read16(&a, 0, 1), vec![0x5A; BS]);
    assert!(e.lun.ranges.idle());
}

#[test]
fn sanitize_survives_abort_and_lost_channel() {
    let mut e = env();
    let a = e.a.clone();
    // ABORT TASK of a running SANITIZE: the task is reported aborted, the operation goes
    // on to the end.
    e.write16(&a, 0, vec![b'x'; BS]);
    let tag = submit(&mut e, &a, &sanitize_cdb(0x03, 0, 0));
    let mut out = Vec::new();
    e.ch.poll(&mut out);
    assert!(e.ch.abort_task(&a, tag));
    let r = wait(&mut e, tag);
    assert!(r.aborted);
    assert!(e.lun.lock().sanitize.active());
    wait_sanitized(&mut e);
    assert_ne!(e.read16(&a, 0, 1), vec![b'x'; BS]);
    // The channel that runs it goes away (its connection ended): another channel of the
    // LUN takes it over and finishes it.
    e.write16(&a, 0, vec![b'y'; BS]);
    let tag = submit(&mut e, &a, &sanitize_cdb(0x03, 0x80, 0));
    assert_eq!(wait(&mut e, tag).status, Status::Good);
    let old = std::mem::replace(&mut e.ch, LunChannel::new(e.lun.clone()));
    drop(old);
    assert!(e.lun.lock().sanitize.active());
    let r = e.run(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    assert_eq!(r.sense_triplet(), Some(SANITIZE_IN_PROGRESS));
    wait_sanitized(&mut e);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    assert_ne!(e.read16(&a, 0, 1), vec![b'y'; BS]);
    assert!(e.lun.ranges.idle());
}

#[test]
fn sanitize_failure_mode() {
    let mut e = env();
    let a = e.a.clone();
    let fail = |e: &mut Env, ause: bool| {
        let mut st = e.lun.lock();
        st.sanitize = crate::sanitize::SanitizeState::Failed { ause };
        e.lun.refresh_attn(&st);
    };
    // Medium access fails; other commands do not.
    fail(&mut e, true);
    e.check(
        &a,
        &rw16(op::READ16, 0, 1, 0),
        BS as u32,
        None,
        SANITIZE_FAILED,
    );
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        SANITIZE_FAILED,
    );
    e.ok(&a, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, None);
    // AUSE was set: EXIT FAILURE MODE ends it.
    e.ok(&a, &sanitize_cdb(0x1F, 0, 0), 0, None);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // Without AUSE only a sanitize that completes does.
    fail(&mut e, false);
    e.check(&a, &sanitize_cdb(0x1F, 0, 0), 0, None, ILLEGAL_FIELD);
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        SANITIZE_FAILED,
    );
    e.ok(&a, &sanitize_cdb(0x02, 0, 0), 0, None);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
}

/// A write-protected LUN: every writing command fails with DATA PROTECT, even a WRITE SAME
/// with UNMAP and no data block (libiscsi's ReadOnly.ReadOnlySBC), reads still work.
#[test]
fn read_only_lun_refuses_writes_first() {
    let mut e = env_with(LunConfig {
        read_only: true,
        ..Default::default()
    });
    let a = e.a.clone();
    let data_protect = |r: &ScsiResult| r.sense_triplet().map(|t| t.0);
    let mut ws10 = vec![op::WRITE_SAME10, 0x08, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(data_protect(&e.run(&a, &ws10, 0, None)), Some(7));
    ws10[1] = 0;
    assert_eq!(data_protect(&e.run(&a, &ws10, BS as u32, Some(vec![0; BS]))), Some(7));
    let w10 = [op::WRITE10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(data_protect(&e.run(&a, &w10, BS as u32, Some(vec![0; BS]))), Some(7));
    // MODE SENSE shows WP; reads work.
    let d = e.ok(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    assert_eq!(d[2] & 0x80, 0x80);
    e.read16(&a, 0, 1);
}
