//! SANITIZE.

use super::*;

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
    e.ch().submit(t);
    tag
}

/// Polls until `tag` is reported; returns it.
fn wait(e: &mut Env, tag: u64) -> ScsiResult {
    done(wait_event(e, tag))
}

/// Polls until `tag` is reported; returns its event.
fn wait_event(e: &mut Env, tag: u64) -> TaskEvent {
    let mut out = Vec::new();
    for _ in 0..1_000_000 {
        e.ch().poll(&mut out);
        if let Some(p) = out.iter().position(|r| r.tag() == tag) {
            return out.swap_remove(p);
        }
    }
    panic!("task {tag} never completed");
}

/// Polls until no sanitize runs.
fn wait_sanitized(e: &mut Env) {
    let mut out = Vec::new();
    for _ in 0..1_000_000 {
        e.ch().poll(&mut out);
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
    e.ch().submit(t);
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
    e.ch().submit(t);
    assert_eq!(
        wait(&mut e, tag).sense_triplet(),
        Some(SANITIZE_IN_PROGRESS)
    );
    let t = e.task(&a, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, None);
    let tag = t.tag;
    e.ch().submit(t);
    assert_eq!(wait(&mut e, tag).status, Status::Good);
    let t = e.task(&b, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None);
    let tag = t.tag;
    e.ch().submit(t);
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
    e.ch().poll(&mut out);
    assert!(e.ch().abort_task(&a, tag));
    let r = wait_event(&mut e, tag);
    assert!(r.is_aborted());
    assert!(e.lun.lock().sanitize.active());
    wait_sanitized(&mut e);
    assert_ne!(e.read16(&a, 0, 1), vec![b'x'; BS]);
    // The channel that runs it goes away (its connection ended): another channel of the
    // LUN takes it over and finishes it.
    e.write16(&a, 0, vec![b'y'; BS]);
    let tag = submit(&mut e, &a, &sanitize_cdb(0x03, 0x80, 0));
    assert_eq!(wait(&mut e, tag).status, Status::Good);
    let fresh = LunChannel::new(e.lun.clone());
    let old = std::mem::replace(e.ch(), fresh);
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
