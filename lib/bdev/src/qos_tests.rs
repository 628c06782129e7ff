//! Unit tests of the QoS buckets: refill, sharing, removal, queue order, which limits count.

use super::*;
use crate::Lba;

const MS: u64 = TIMESLICE_NS;

fn io(kind: IoKind, tag: u64) -> BdevIo {
    BdevIo { kind, offset_blocks: Lba::ZERO, num_blocks: 8, buf: None, tag, fua: false }
}

fn limits(ios: u64, rw: u64, r: u64, w: u64) -> QosLimits {
    QosLimits { rw_ios_per_sec: ios, rw_mbytes_per_sec: rw, r_mbytes_per_sec: r, w_mbytes_per_sec: w }
}

/// Keeps `depth` I/Os of `kind` and `bytes` offered through `t` every 100 µs from `from` to
/// `to` (ns); returns the tags submitted (an I/O "completes" at once, so the offered load
/// is always above the limit).
fn drive(q: &Qos, t: &mut Throttle, kind: IoKind, bytes: u64, from: u64, to: u64, tag0: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut tag = tag0;
    let mut now = from;
    while now < to {
        t.release(q, now, &mut |io| out.push(io.tag));
        while t.queued() < 4 {
            t.submit(q, io(kind, tag), bytes, now, &mut |io| out.push(io.tag));
            tag += 1;
        }
        now += MS / 10;
    }
    out
}

#[test]
fn the_budget_refills_each_slice_and_holds_the_rate() {
    let q = Qos::default();
    q.set_at(limits(2000, 0, 0, 0), 0);
    let mut t = Throttle::default();
    let done = drive(&q, &mut t, IoKind::Read, 4096, 0, 1000 * MS, 0);
    // One second at 2000 I/Os a second: a slice's worth (2) of slack either way.
    assert!((1998..=2002).contains(&done.len()), "{} I/Os in one second", done.len());
    let (ns, n) = q.throttled();
    assert!(n > 0 && ns > 0, "waiting was counted: {n} I/Os, {ns} ns");
}

#[test]
fn byte_limits_hold_and_an_io_larger_than_a_slice_goes_into_debt() {
    let q = Qos::default();
    q.set_at(limits(0, 1, 0, 0), 0);
    let mut t = Throttle::default();
    // 1 MiB/s is 1048 bytes a slice; 64 KiB I/Os each take 62 slices' worth.
    let done = drive(&q, &mut t, IoKind::Write, 65536, 0, 2000 * MS, 0);
    let bytes = done.len() as u64 * 65536;
    assert!((2 * 1024 * 1024 - 2 * 65536..=2 * 1024 * 1024 + 2 * 65536).contains(&bytes), "{bytes} bytes in 2 s at 1 MiB/s");
}

#[test]
fn slices_nobody_asked_in_are_made_up_for_up_to_ten() {
    let q = Qos::default();
    q.set_at(limits(10000, 0, 0, 0), 0);
    let mut t = Throttle::default();
    let mut n = 0;
    let offer = |t: &mut Throttle, now: u64, n: &mut usize| {
        for tag in 0..100 {
            t.submit(&q, io(IoKind::Read, tag), 512, now, &mut |_| *n += 1);
        }
        t.release(&q, now, &mut |_| *n += 1);
    };
    offer(&mut t, 0, &mut n);
    assert_eq!(n, 10, "slice 0: 10 I/Os");
    // Asked again 4 slices later: slices 1 to 4 (40).
    offer(&mut t, 4 * MS, &mut n);
    assert_eq!(n, 50);
    // After a second idle: 10 slices' worth at most.
    offer(&mut t, 1004 * MS, &mut n);
    assert_eq!(n, 150);
}

#[test]
fn two_reactors_share_one_budget() {
    let q = Qos::default();
    q.set_at(limits(4000, 0, 0, 0), 0);
    let (mut a, mut b) = (Throttle::default(), Throttle::default());
    let (mut got_a, mut got_b) = (0usize, 0usize);
    let mut tag = 0;
    let mut now = 0;
    while now < 1000 * MS {
        // Which reactor comes first after a refill changes from slice to slice.
        let mut pair = [(&mut a, &mut got_a), (&mut b, &mut got_b)];
        if (now / MS) % 2 == 1 {
            pair.reverse();
        }
        for (t, got) in pair {
            t.release(&q, now, &mut |_| *got += 1);
            while t.queued() < 4 {
                t.submit(&q, io(IoKind::Read, tag), 512, now, &mut |_| *got += 1);
                tag += 1;
            }
        }
        now += MS / 10;
    }
    let total = got_a + got_b;
    assert!((3996..=4004).contains(&total), "{total} I/Os over both in one second");
    assert!(got_a > 1000 && got_b > 1000, "both get a share: {got_a} and {got_b}");
}

#[test]
fn zero_removes_a_limit_and_the_waiting_ios_go() {
    let q = Qos::default();
    q.set_at(limits(1000, 0, 0, 0), 0);
    let mut t = Throttle::default();
    let mut out = Vec::new();
    for tag in 0..10 {
        t.submit(&q, io(IoKind::Read, tag), 512, 0, &mut |io| out.push(io.tag));
    }
    assert_eq!(out, vec![0], "one I/O a slice at 1000 I/Os a second");
    assert_eq!(t.queued(), 9);
    q.set_at(QosLimits::default(), 0);
    assert!(!q.active());
    t.release(&q, 0, &mut |io| out.push(io.tag));
    assert_eq!(out, (0..10).collect::<Vec<_>>(), "all go, in order");
    assert_eq!(t.queued(), 0);
    t.submit(&q, io(IoKind::Read, 10), 512, 0, &mut |io| out.push(io.tag));
    assert_eq!(out.len(), 11, "no limit: straight through");
}

#[test]
fn the_queue_keeps_submission_order_and_nothing_overtakes_it() {
    let q = Qos::default();
    q.set_at(limits(0, 0, 1, 0), 0);
    let mut t = Throttle::default();
    let mut out = Vec::new();
    // 1048 bytes a slice: the first 4 KiB read goes into debt, the next wait.
    for tag in 0..4 {
        t.submit(&q, io(IoKind::Read, tag), 4096, 0, &mut |io| out.push(io.tag));
    }
    // A write is not limited by r_mbytes_per_sec, but does not overtake the waiting reads.
    t.submit(&q, io(IoKind::Write, 100), 4096, 0, &mut |io| out.push(io.tag));
    assert_eq!(out, vec![0]);
    let mut now = 0;
    while t.queued() > 0 {
        now += MS;
        t.release(&q, now, &mut |io| out.push(io.tag));
        assert!(now < 100 * MS, "stuck: {out:?}");
    }
    assert_eq!(out, vec![0, 1, 2, 3, 100]);
    // 4 reads of 4 KiB at 1048 bytes a slice: about 12 slices, not sooner.
    assert!(now >= 10 * MS, "released after {} ms", now / MS);
}

#[test]
fn reads_count_against_r_and_writes_against_w() {
    let q = Qos::default();
    q.set_at(limits(0, 0, 0, 1), 0);
    let mut t = Throttle::default();
    let mut out = Vec::new();
    for tag in 0..100 {
        t.submit(&q, io(IoKind::Read, tag), 65536, 0, &mut |io| out.push(io.tag));
    }
    assert_eq!(out.len(), 100, "reads are not limited by w_mbytes_per_sec");
    for tag in 0..3 {
        t.submit(&q, io(IoKind::Write, tag), 65536, 0, &mut |io| out.push(io.tag));
    }
    assert_eq!(out.len(), 101, "writes are");
    // Flushes cost nothing (but wait their turn).
    let q2 = Qos::default();
    q2.set_at(limits(1000, 1, 1, 1), 0);
    let mut t2 = Throttle::default();
    let mut n = 0;
    for _ in 0..10 {
        t2.submit(&q2, io(IoKind::Flush, 0), 0, 0, &mut |_| n += 1);
    }
    assert_eq!(n, 10);
}

#[test]
fn a_change_drops_what_each_reactor_held() {
    let q = Qos::default();
    q.set_at(limits(0, 0, 0, 0), 0);
    let mut t = Throttle::default();
    let mut n = 0;
    t.submit(&q, io(IoKind::Read, 0), 512, 0, &mut |_| n += 1);
    q.set_at(limits(1000, 0, 0, 0), 5 * MS);
    for tag in 0..5 {
        t.submit(&q, io(IoKind::Read, tag), 512, 5 * MS, &mut |_| n += 1);
    }
    assert_eq!(n, 2, "the new limit applies at once: one I/O in this slice");
}

#[test]
fn limits_follow_spdks_rules() {
    assert!(limits(2000, 0, 0, 0).validate().is_ok());
    assert!(limits(0, 0, 0, 0).validate().is_ok());
    let e = limits(1500, 0, 0, 0).validate().unwrap_err();
    assert!(e.contains("multiple of 1000"), "{e}");
    assert_eq!(
        limits(1000, 2, 3, 4).json(),
        serde_json::json!({"rw_ios_per_sec": 1000, "rw_mbytes_per_sec": 2, "r_mbytes_per_sec": 3, "w_mbytes_per_sec": 4})
    );
}

#[test]
fn an_initiator_table_finds_names_without_regard_to_case_and_zero_removes() {
    let t = QosTable::default();
    assert_eq!(t.generation(), 0);
    assert!(t.find("iqn.2016-06.io.x:a").is_none());
    t.set("iqn.2016-06.io.x:A", limits(1000, 0, 0, 0));
    let g = t.generation();
    assert!(g > 0, "a change moves the generation");
    let q = t.find("iqn.2016-06.io.x:a").expect("found, any case");
    assert!(q.active());
    t.set("IQN.2016-06.io.x:a", limits(0, 5, 0, 0));
    assert!(std::sync::Arc::ptr_eq(&q, &t.find("iqn.2016-06.io.x:a").expect("same entry")), "changed in place");
    assert_eq!(q.limits(), limits(0, 5, 0, 0));
    t.set("iqn.2016-06.io.x:a", QosLimits::default());
    assert!(t.find("iqn.2016-06.io.x:a").is_none() && t.list().is_empty(), "0 removes it");
    assert!(!q.active(), "sessions still holding it let their I/Os go");
    assert!(t.generation() > g);
}
