//! Multi-step commands: COMPARE AND WRITE, WRITE SAME, UNMAP, GET LBA STATUS, VERIFY,
//! WRITE AND VERIFY, ORWRITE, PRE-FETCH, SYNCHRONIZE CACHE.

use super::*;

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
                let mut task = ScsiTask::new(tag, 0, cdb, edtl, &n);
                task.data_out = data.map_or(DataOut::None, |d| DataOut::Whole(IoBuf::from(d)));
                ch.submit(task);
                let mut out = vec![];
                loop {
                    ch.poll_results(&mut out);
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
    // Room for one descriptor: the scan stops once a second run starts (PARAMETER DATA
    // LENGTH tells that there is more, the allocation length cuts it).
    let d = e.ok(&a, &get_lba_status(0, 24), 24, None);
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 4 + 2 * 16);
    assert_eq!(lba_status_descs(&d), vec![(0, 5000, 1)]);
    // From the middle.
    let d = e.ok(&a, &get_lba_status(5000, 256), 256, None);
    assert_eq!(
        lba_status_descs(&d),
        vec![(5000, 1, 0), (5001, (BLOCKS - 5001) as u32, 1)]
    );
}
