//! PERSISTENT RESERVE OUT work off the reactor (issue 22, items 6 and 7): the APTPL file's
//! write and the shared state's update run on the bounded pool of `pr::work`; the
//! executor (a reactor) keeps serving the other commands meanwhile, the PR OUT completes
//! once its state is durable, a flood costs no more threads than the pool has, and a full
//! backlog answers BUSY.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use riser_bdev::Bdev;

use super::fake_shared::{shared_lun, Store};
use super::*;
use crate::pr::work::{tests::UsePool, Pool, WORKERS};
use crate::pr::store::tests::{on_write, Dir};
use crate::pr::store::PrStore;

fn prout(sa: u8, key: u64, sark: u64, aptpl: bool) -> (Vec<u8>, Vec<u8>) {
    let mut c = vec![0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_OUT;
    c[1] = sa;
    c[8] = 24;
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p[20] = u8::from(aptpl);
    (c, p)
}

/// READ KEYS: (generation, keys).
fn keys(e: &mut Env, n: &Arc<Nexus>) -> (u32, Vec<u64>) {
    let mut c = vec![0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_IN;
    c[7] = 0x10;
    let d = e.ok(n, &c, 4096, None);
    let gen = u32::from_be_bytes(d[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    (gen, d[8..8 + len].chunks(8).map(|k| u64::from_be_bytes(k.try_into().unwrap())).collect())
}

/// Submits a PR OUT without waiting for it; its tag.
fn submit_prout(e: &mut Env, n: &Arc<Nexus>, sa: u8, key: u64, sark: u64, aptpl: bool) -> u64 {
    let (c, p) = prout(sa, key, sark, aptpl);
    let t = e.task(n, &c, 24, Some(p));
    let tag = t.tag;
    e.dc.submit(t);
    tag
}

/// Polls the env's device for `for_` and returns every result that came back.
fn poll_for(e: &mut Env, for_: Duration) -> Vec<ScsiResult> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < for_ {
        e.dc.poll_results(&mut out);
    }
    out
}

/// Polls until the result of `tag` is in `out` (10 s at most), and takes it.
fn wait_for(e: &mut Env, out: &mut Vec<ScsiResult>, tag: u64) -> ScsiResult {
    let t0 = Instant::now();
    loop {
        if let Some(i) = out.iter().position(|r| r.tag == tag) {
            return out.swap_remove(i);
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "task {tag} never completed");
        e.dc.poll_results(out);
    }
}

fn device() -> Arc<dyn Bdev> {
    let mut reg = BdevRegistry::new();
    let name = reg.create_malloc(None, BLOCKS, BS as u32, None).unwrap();
    reg.get(&name).unwrap()
}

/// The env's nexuses on a new LUN over `bdev` with state directory `dir`, their POWER ON
/// unit attentions consumed.
fn env_in(dir: &Path, bdev: Arc<dyn Bdev>) -> Env {
    let lun = Lun::new(
        LunConfig { target_name: "iqn.2024-01.test:tgt".into(), state_dir: Some(dir.to_path_buf()), ..LunConfig::default() },
        bdev,
    );
    with_lun(lun)
}

fn with_lun(lun: Arc<Lun>) -> Env {
    let mut e = env();
    e.lun = lun.clone();
    e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
    let (a, b) = (e.a.clone(), e.b.clone());
    for n in [&a, &b] {
        e.run(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None); // POWER ON
        e.ok(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    }
    e
}

/// A REGISTER with APTPL whose file write is held by a test hook: the executor serves
/// other commands of the same LUN channel meanwhile (reads, writes, PR IN, another
/// channel's commands), the PR OUT completes only after the write is let go, the state
/// the other commands saw is the one before it until then, and a second PR OUT queued
/// behind it makes durable a state that includes the first.
///
/// Before the change the write ran inside the executor, on the polling (test) thread: the
/// hook finds itself on that thread, and the PR OUT completes before anything else runs.
#[test]
fn an_aptpl_write_does_not_hold_up_the_reactor_and_completes_once_durable() {
    let d = Dir::new("offload");
    let bdev = device();
    let mut e = env_in(&d.0, bdev.clone());
    let (a, b) = (e.a.clone(), e.b.clone());
    let me = std::thread::current().id();
    let (entered_tx, entered_rx) = mpsc::channel::<ThreadId>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let _hook = on_write(&d.0, move || {
        let _ = entered_tx.send(std::thread::current().id());
        // Bounded, so that a write on the polling thread (the old code) ends the test
        // with a failure instead of hanging it.
        let _ = release_rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
    });

    let t1 = submit_prout(&mut e, &a, 0, 0, 0xA1, true);
    let mut out = Vec::new();
    let t0 = Instant::now();
    let writer = loop {
        e.dc.poll_results(&mut out);
        if let Ok(t) = entered_rx.try_recv() {
            break t;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the APTPL file is never written");
    };
    assert_ne!(writer, me, "the APTPL file is written on the thread that polls the LUN channel (the reactor)");
    // The write is held: the same LUN channel serves everything else meanwhile.
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    let data = pattern(BS * 4, 7);
    assert_eq!(e.write16(&b, 8, data.clone()).status, Status::Good);
    assert_eq!(e.read16(&b, 8, 4), data);
    // Not durable yet, so not in force yet: PR IN reports the state before it.
    assert_eq!(keys(&mut e, &b), (0, vec![]));
    // A second REGISTER with APTPL queues behind the first (in order).
    let t2 = submit_prout(&mut e, &b, 0, 0, 0xB2, true);
    // Another reactor's channel on the same LUN does not wait on the first's lock.
    let mut dc2 = DeviceChannel::new(e.dc.device().clone());
    let mut t = e.task(&b, &rw16(op::READ16, 8, 4, 0), (BS * 4) as u32, None);
    t.tag = 9000;
    dc2.submit(t);
    let mut out2 = Vec::new();
    let t0 = Instant::now();
    while !out2.iter().any(|r: &ScsiResult| r.tag == 9000) {
        dc2.poll_results(&mut out2);
        assert!(t0.elapsed() < Duration::from_secs(10), "another channel's read never completed");
    }
    assert_eq!(out2[0].status, Status::Good);
    out.extend(poll_for(&mut e, Duration::from_millis(100)));
    assert!(out.iter().all(|r| r.tag != t1 && r.tag != t2), "a PR OUT completed before its state was durable: {out:?}");
    assert!(!PrStore::new(&d.0, bdev.info().uuid, 0).path().exists(), "the hook runs before the write");

    // Let the first write go: it completes, then the second one is written.
    release_tx.send(()).unwrap();
    let r1 = wait_for(&mut e, &mut out, t1);
    assert_eq!(r1.status, Status::Good, "{r1:?}");
    let second = entered_rx.recv_timeout(Duration::from_secs(10)).expect("the second PR OUT writes the file");
    assert_ne!(second, me);
    assert_eq!(keys(&mut e, &a), (1, vec![0xA1]), "the first is in force once durable");
    out.extend(poll_for(&mut e, Duration::from_millis(50)));
    assert!(out.iter().all(|r| r.tag != t2), "the second PR OUT completed before its write");
    release_tx.send(()).unwrap();
    let r2 = wait_for(&mut e, &mut out, t2);
    assert_eq!(r2.status, Status::Good, "{r2:?}");
    assert_eq!(keys(&mut e, &a), (2, vec![0xA1, 0xB2]));
    // On disk: the second's state includes the first's.
    let on_disk = PrStore::new(&d.0, bdev.info().uuid, 0).load().expect("the state file");
    assert_eq!(on_disk, e.lun.lock().pr);
    assert_eq!(on_disk.regs.iter().map(|r| r.key).collect::<Vec<_>>(), vec![0xA1, 0xB2]);
}

// ------------------------------------------------------------------------------------
// Shared state (an RBD image behind several gateways): the in-memory store of `fake_shared`.

/// A gateway's LUN over a device whose reservations live in `store`.
fn gateway(store: &Arc<Store>) -> Env {
    let lun = shared_lun(store, uuid::Uuid::new_v4());
    assert!(lun.pr_shared().is_some());
    with_lun(lun)
}

/// Threads of this process whose name starts with `pr-` (the old per-command `pr-out`
/// threads, the pool's `pr-work-N`).
fn pr_threads() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok()).filter(|c| c.starts_with("pr-")).count()
}

/// 64 PERSISTENT RESERVE OUTs in flight on 8 shared LUNs whose cluster is slow: no more
/// threads than the pool's workers (before: a thread each), and every one completes, in
/// order per LUN, once the cluster answers.
#[test]
fn many_shared_pr_outs_use_no_more_threads_than_the_pool_has() {
    let mut gws: Vec<(Arc<Store>, Env)> = (0..8)
        .map(|_| {
            let s = Arc::new(Store::default());
            let e = gateway(&s);
            (s, e)
        })
        .collect();
    let reads: Vec<usize> = gws.iter().map(|(s, _)| s.reads.load(Ordering::Acquire)).collect();
    let mut tags = Vec::new();
    for (s, e) in &mut gws {
        s.stalled.store(true, Ordering::Release);
        let a = e.a.clone();
        // REGISTER AND IGNORE EXISTING KEY, keys 1..=8: the last one is the key in force.
        tags.push((1..=8u64).map(|k| submit_prout(e, &a, 6, 0, k, false)).collect::<Vec<_>>());
    }
    let mut outs: Vec<Vec<ScsiResult>> = gws.iter_mut().map(|(_, e)| poll_for(e, Duration::from_millis(20))).collect();
    // Give the workers time to start what they can.
    let t0 = Instant::now();
    while gws.iter().zip(&reads).filter(|((s, _), &r)| s.reads.load(Ordering::Acquire) > r).count() < WORKERS.min(8) && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let n = pr_threads();
    assert!(n <= WORKERS, "{n} PR threads for 64 PR OUTs (the pool has {WORKERS})");
    assert!(outs.iter().flatten().all(|r| r.status != Status::Good), "done while the cluster stalls");
    for (s, _) in &gws {
        s.stalled.store(false, Ordering::Release);
    }
    for (i, (_, e)) in gws.iter_mut().enumerate() {
        for &tag in &tags[i] {
            let r = wait_for(e, &mut outs[i], tag);
            assert_eq!(r.status, Status::Good, "{r:?}");
        }
        let a = e.a.clone();
        assert_eq!(keys(e, &a), (8, vec![8]), "applied in order");
    }
    assert!(pr_threads() <= WORKERS);
}

/// With the backlog full, a PR OUT is answered BUSY at once and changes nothing; those
/// accepted complete, in order.
#[test]
fn a_full_backlog_answers_busy() {
    let pool = Pool::new("test-pool", 1, 3);
    let _use = UsePool::new(&pool);
    let store = Arc::new(Store::default());
    let mut e = gateway(&store);
    let (a, b) = (e.a.clone(), e.b.clone());
    store.stalled.store(true, Ordering::Release);
    let reads = store.reads.load(Ordering::Acquire);
    let first = submit_prout(&mut e, &a, 6, 0, 1, false);
    let mut out = Vec::new();
    let t0 = Instant::now();
    while store.reads.load(Ordering::Acquire) == reads {
        e.dc.poll_results(&mut out);
        assert!(t0.elapsed() < Duration::from_secs(10), "the first PR OUT never started");
    }
    // One running, three waiting: the fifth is refused.
    let queued: Vec<u64> = (2..=4).map(|k| submit_prout(&mut e, &a, 6, 0, k, false)).collect();
    let refused = submit_prout(&mut e, &a, 6, 0, 5, false);
    let r = wait_for(&mut e, &mut out, refused);
    assert_eq!(r.status, Status::Busy, "{r:?}");
    assert!(out.iter().all(|r| r.tag != first && !queued.contains(&r.tag)), "{out:?} first {first} queued {queued:?}");
    // SPC-2 RESERVE waits for the queued PR OUTs too (BUSY), and nothing is queued for it.
    let r = e.run(&b, &[op::RESERVE6, 0, 0, 0, 0, 0], 0, None);
    assert_eq!(r.status, Status::Busy, "{r:?}");
    assert_eq!(pool.threads(), 1);
    store.stalled.store(false, Ordering::Release);
    for tag in std::iter::once(first).chain(queued) {
        let r = wait_for(&mut e, &mut out, tag);
        assert_eq!(r.status, Status::Good, "{r:?}");
    }
    assert_eq!(keys(&mut e, &a), (4, vec![4]), "the refused one changed nothing");
    assert_eq!(pool.threads(), 1);
}

/// The backlog is bounded per LUN: one LUN flooded with PR OUTs (its cluster stalled, so
/// none completes) gets BUSY past its own bound, while a PR OUT on another LUN is still
/// accepted and completes meanwhile, on the pool's other worker (the flooded LUN holds one
/// worker, never more). Those accepted on the flooded LUN complete, in order, once its
/// cluster answers.
///
/// Before the change the bound was one backlog for the whole process: the flooded LUN
/// filled it and the other LUN's PR OUT was BUSY too.
#[test]
fn a_flooded_lun_gets_busy_and_another_lun_is_still_served() {
    // Two workers; three tasks of one LUN wait at most (before: three over all LUNs).
    let pool = Pool::new("test-pool", 2, 3);
    let _use = UsePool::new(&pool);
    let (slow, fast) = (Arc::new(Store::default()), Arc::new(Store::default()));
    let mut es = gateway(&slow);
    let mut ef = gateway(&fast);
    let a = es.a.clone();
    slow.stalled.store(true, Ordering::Release);
    let reads = slow.reads.load(Ordering::Acquire);
    let first = submit_prout(&mut es, &a, 6, 0, 1, false);
    let mut out = Vec::new();
    let t0 = Instant::now();
    while slow.reads.load(Ordering::Acquire) == reads {
        es.dc.poll_results(&mut out);
        assert!(t0.elapsed() < Duration::from_secs(10), "the first PR OUT never started");
    }
    // One running, three waiting: the next ones on this LUN are refused.
    let queued: Vec<u64> = (2..=4).map(|k| submit_prout(&mut es, &a, 6, 0, k, false)).collect();
    for k in 5..=8 {
        let refused = submit_prout(&mut es, &a, 6, 0, k, false);
        let r = wait_for(&mut es, &mut out, refused);
        assert_eq!(r.status, Status::Busy, "{r:?}");
    }
    // Another LUN: accepted and done while the flooded one still waits for its cluster.
    let fa = ef.a.clone();
    let r = ef.run(&fa, &prout(6, 0, 0xF1, false).0, 24, Some(prout(6, 0, 0xF1, false).1));
    assert_eq!(r.status, Status::Good, "a PR OUT on another LUN: {r:?}");
    assert_eq!(keys(&mut ef, &fa), (1, vec![0xF1]));
    out.extend(poll_for(&mut es, Duration::from_millis(20)));
    assert!(out.iter().all(|r| r.tag != first && !queued.contains(&r.tag)), "done while the cluster stalls: {out:?}");
    assert!(pool.threads() <= 2);
    slow.stalled.store(false, Ordering::Release);
    for tag in std::iter::once(first).chain(queued) {
        let r = wait_for(&mut es, &mut out, tag);
        assert_eq!(r.status, Status::Good, "{r:?}");
    }
    assert_eq!(keys(&mut es, &a), (4, vec![4]), "the refused ones changed nothing");
}

/// A LOGICAL UNIT RESET reaches the other gateway of its device while the PR work of this
/// process is at its bounds (a LUN's queue full, its worker held by a stalled cluster):
/// announcements have their own workers and queues.
///
/// Before the change the announcement was queued on the PR pool: refused (full), so the
/// reset stayed on this gateway and the other one's nexus never got its unit attention.
#[test]
fn a_reset_reaches_the_other_gateway_while_pr_work_is_full() {
    // One worker and three waiting tasks (before: over all LUNs; now: per LUN).
    let pool = Pool::new("test-pool", 1, 3);
    let _use = UsePool::new(&pool);
    // The flood, on a device whose cluster is stalled.
    let slow = Arc::new(Store::default());
    let mut es = gateway(&slow);
    let a = es.a.clone();
    slow.stalled.store(true, Ordering::Release);
    let reads = slow.reads.load(Ordering::Acquire);
    let mut tags = vec![submit_prout(&mut es, &a, 6, 0, 1, false)];
    let mut out = Vec::new();
    let t0 = Instant::now();
    while slow.reads.load(Ordering::Acquire) == reads {
        es.dc.poll_results(&mut out);
        assert!(t0.elapsed() < Duration::from_secs(10), "the first PR OUT never started");
    }
    tags.extend((2..=4).map(|k| submit_prout(&mut es, &a, 6, 0, k, false)));
    let refused = submit_prout(&mut es, &a, 6, 0, 5, false);
    assert_eq!(wait_for(&mut es, &mut out, refused).status, Status::Busy);

    // Another device, exported by two gateways (two LUNs of this process over one store).
    let store = Arc::new(Store::default());
    let uuid = uuid::Uuid::new_v4();
    let mut g1 = with_lun(shared_lun(&store, uuid));
    let mut g2 = with_lun(shared_lun(&store, uuid));
    let tur = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];
    let b2 = g2.b.clone();
    g2.ok(&b2, &tur, 0, None);
    g1.lun.reset(crate::ResetKind::LunReset);
    let b1 = g1.b.clone();
    g1.check(&b1, &tur, 0, None, (6, 0x29, 3));
    // The other gateway's nexus gets the reset's unit attention (the announcement may
    // still be on its way after the reactor stopped waiting: polled, generously bounded).
    let t0 = Instant::now();
    loop {
        let r = g2.run(&b2, &tur, 0, None);
        if r.status == Status::CheckCondition {
            assert_eq!(r.sense_triplet(), Some((6, 0x29, 3)), "{r:?}");
            break;
        }
        assert_eq!(r.status, Status::Good, "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(10), "the reset never reached the other gateway");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The PR work was full all along, and completes once its cluster answers.
    out.extend(poll_for(&mut es, Duration::from_millis(5)));
    assert!(out.iter().all(|r| !tags.contains(&r.tag)), "done while the cluster stalls: {out:?}");
    slow.stalled.store(false, Ordering::Release);
    for tag in tags {
        assert_eq!(wait_for(&mut es, &mut out, tag).status, Status::Good);
    }
}
