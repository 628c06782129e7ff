//! READ and WRITE: data, ranges, residuals, transfer limits, write protection.

use super::*;

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
    e.ch().submit(t);
    let mut out = vec![];
    while out.is_empty() {
        e.ch().poll_results(&mut out);
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
    assert_eq!(
        data_protect(&e.run(&a, &ws10, BS as u32, Some(vec![0; BS]))),
        Some(7)
    );
    let w10 = [op::WRITE10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(
        data_protect(&e.run(&a, &w10, BS as u32, Some(vec![0; BS]))),
        Some(7)
    );
    // MODE SENSE shows WP; reads work.
    let d = e.ok(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    assert_eq!(d[2] & 0x80, 0x80);
    e.read16(&a, 0, 1);
}

/// A READ waits for its buffer while the budget is spent, and completes once memory comes
/// back; it never fails for lack of it.
#[test]
fn a_read_waits_for_budgeted_memory() {
    let e = env();
    let pool: &'static riser_buf::Pool = Box::leak(Box::new(riser_buf::Pool::new(riser_buf::MIN_MAX_BYTES)));
    let mut held = None;
    let hog = pool.try_alloc(riser_buf::MIN_MAX_BYTES, &mut held).expect("the whole budget");
    let mut ch = LunChannel::new(e.lun.clone());
    ch.set_pool(pool);
    let n = Arc::new(Nexus::new("iqn.2024-01.test:budget", 1, "iqn.2024-01.test:tgt", 1));
    let mut out = vec![];
    let run = |ch: &mut LunChannel, tag: u64, cdb: &[u8], edtl: u32, out: &mut Vec<ScsiResult>| {
        ch.submit(ScsiTask::new(tag, 0, cdb, edtl, &n));
        for _ in 0..1000 {
            ch.poll_results(out);
        }
    };
    run(&mut ch, 1, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, &mut out); // power-on UA
    out.clear();
    run(&mut ch, 2, &rw16(op::READ16, 0, 8, 0), 8 * BS as u32, &mut out);
    assert!(out.is_empty(), "the read waits while the budget is spent");
    assert_eq!(pool.stats().waiting, 1);
    drop(hog);
    for _ in 0..1000 {
        ch.poll_results(&mut out);
        if !out.is_empty() {
            break;
        }
    }
    assert_eq!(out.len(), 1, "the read went once memory came back");
    assert_eq!((out[0].tag, out[0].status, out[0].data_len), (2, Status::Good, 8 * BS));
    assert_eq!(pool.stats().waiting, 0);
}
