//! Reservations across gateways that cannot diverge (issue 23): a gateway acknowledges a
//! notify only once it re-read the shared state, an object it cannot decode is never
//! overwritten, a gateway that missed notifies raises the unit attentions it owes, and a
//! reset never makes the reactor wait for the other gateways. Two LUNs (two gateways' views
//! of one device) over the in-memory shared object of `fake_shared`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::fake_shared::{rewatch, shared_lun, Store};
use super::*;
use crate::pr_type::WRITE_EXCLUSIVE;
use crate::ResetKind;

/// Gateway B's device number in the store (A's is 0).
const GW_B: usize = 1;

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

const TUR: [u8; 6] = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];

impl Env {
    fn pr(&mut self, n: &Arc<Nexus>, sa: u8, ty: u8, key: u64, sark: u64) -> ScsiResult {
        let (c, p) = prout(sa, ty, key, sark);
        self.run(n, &c, 24, Some(p))
    }
    /// READ KEYS: (generation, keys).
    fn read_keys(&mut self, n: &Arc<Nexus>) -> (u32, Vec<u64>) {
        let d = self.ok(n, &[op::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0x10, 0, 0], 4096, None);
        let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
        (u32::from_be_bytes(d[0..4].try_into().unwrap()), d[8..8 + len].chunks(8).map(|k| u64::from_be_bytes(k.try_into().unwrap())).collect())
    }
    fn writes(&mut self, n: &Arc<Nexus>) -> bool {
        let r = self.run(n, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
        assert!(matches!(r.status, Status::Good | Status::ReservationConflict), "{r:?}");
        r.status == Status::Good
    }
    /// The sense of TEST UNIT READY (a unit attention), or None when GOOD.
    fn tur_sense(&mut self, n: &Arc<Nexus>) -> Option<(u8, u8, u8)> {
        let r = self.run(n, &TUR, 0, None);
        (r.status != Status::Good).then(|| r.sense_triplet()).flatten()
    }
}

/// One gateway's view: a LUN over the shared device, nexuses a and b powered on.
fn gateway(store: &Arc<Store>, uuid: uuid::Uuid) -> Env {
    let lun = shared_lun(store, uuid);
    let mut e = env();
    e.lun = lun.clone();
    e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
    let (a, b) = (e.a.clone(), e.b.clone());
    for n in [&a, &b] {
        e.run(n, &TUR, 0, None);
        assert_eq!(e.tur_sense(n), None);
    }
    e
}

fn two_gateways() -> (Arc<Store>, Env, Env) {
    let store = Arc::new(Store::default());
    let uuid = uuid::Uuid::new_v4();
    let ga = gateway(&store, uuid);
    let gb = gateway(&store, uuid);
    (store, ga, gb)
}

/// The shared object as a newer riser would write it (a format version this one does not
/// read): the state of `bytes` with its version bumped.
fn newer_format(bytes: &[u8]) -> Vec<u8> {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.contains("\"version\": 1"), "{text}");
    text.replace("\"version\": 1", "\"version\": 2").into_bytes()
}

#[test]
fn an_undecodable_object_fails_pr_out_and_is_never_overwritten() {
    let (store, mut ga, mut gb) = two_gateways();
    let (a, b) = (ga.a.clone(), ga.b.clone());
    assert_eq!(ga.pr(&a, 0, 0, 0, 0xA1).status, Status::Good);
    assert_eq!(ga.pr(&a, 1, WRITE_EXCLUSIVE, 0xA1, 0).status, Status::Good);
    let (good, _) = store.get();
    for junk in [newer_format(&good), b"\x00\xffnot json at all".to_vec()] {
        store.put(&junk);
        let before = store.get();
        // Any PR OUT through either gateway: HARDWARE ERROR, LOGICAL UNIT FAILED
        // SELF-CONFIGURATION; the object stays as it is.
        for g in [&mut ga, &mut gb] {
            let r = g.pr(&b, 0, 0, 0, 0xB2);
            assert_eq!(r.sense_triplet(), Some((4, 0x4C, 0x00)), "{r:?}");
            let r = g.pr(&a, 3, 0, 0xA1, 0);
            assert_eq!(r.sense_triplet(), Some((4, 0x4C, 0x00)), "CLEAR: {r:?}");
        }
        assert_eq!(store.get(), before, "the undecodable object was overwritten");
        // A re-read that finds it fails (the watch does not acknowledge)...
        assert!(!rewatch(&store, GW_B, "pr"));
        // ...and PR IN and the I/O checks go on with the last good state.
        for g in [&mut ga, &mut gb] {
            assert_eq!(g.read_keys(&b), (1, vec![0xA1]));
            assert!(!g.writes(&b), "the reservation is still enforced");
            assert!(g.writes(&a));
        }
    }
    // Once the object is readable again (the newer riser wrote it back in a format both
    // read, or an administrator restored it), everything goes on.
    store.put(&good);
    assert!(rewatch(&store, GW_B, "pr"));
    assert_eq!(gb.pr(&b, 0, 0, 0, 0xB2).status, Status::Good);
    assert_eq!(ga.read_keys(&a), (2, vec![0xA1, 0xB2]));
}

#[test]
fn a_gateway_whose_re_read_fails_does_not_acknowledge_and_catches_up() {
    let (store, mut ga, mut gb) = two_gateways();
    let (a, b) = (ga.a.clone(), ga.b.clone());
    // B's reads fail (it is cut off from the OSDs, A is not).
    store.unreadable.lock().unwrap().push(GW_B);
    assert_eq!(ga.pr(&a, 0, 0, 0, 0xA1).status, Status::Good);
    assert_eq!(ga.pr(&a, 1, WRITE_EXCLUSIVE, 0xA1, 0).status, Status::Good);
    // Neither notify was acknowledged by B: the notifier knows B did not follow.
    assert_eq!(store.unacked.load(Ordering::Acquire), 2);
    assert_eq!(gb.read_keys(&b), (0, vec![]), "B still has the state it read last");
    // B reads again (the watch thread retries): it follows.
    store.unreadable.lock().unwrap().clear();
    assert!(rewatch(&store, GW_B, "pr"));
    assert_eq!(gb.read_keys(&b), (1, vec![0xA1]));
    assert!(!gb.writes(&b));
    // Every gateway reading: acknowledged.
    assert_eq!(ga.pr(&a, 2, WRITE_EXCLUSIVE, 0xA1, 0).status, Status::Good);
    assert_eq!(store.unacked.load(Ordering::Acquire), 2);
    assert!(gb.writes(&b));
}

#[test]
fn a_gateway_that_missed_notifies_raises_the_unit_attentions_it_owes() {
    let (store, mut ga, mut gb) = two_gateways();
    let (a, b) = (ga.a.clone(), ga.b.clone());
    assert_eq!(gb.pr(&b, 0, 0, 0, 0xB2).status, Status::Good);
    assert_eq!(ga.pr(&a, 0, 0, 0, 0xA1).status, Status::Good);
    // B is cut off from notifies; A preempts b's registration.
    store.muted.lock().unwrap().push(GW_B);
    assert_eq!(ga.pr(&a, 4, WRITE_EXCLUSIVE, 0xA1, 0xB2).status, Status::Good);
    assert_eq!(ga.tur_sense(&b), Some((6, 0x2A, 0x05)), "b through A");
    assert_eq!(gb.tur_sense(&b), None, "B has not heard yet");
    // B's watch is back: it reads the object and owes b REGISTRATIONS PREEMPTED.
    store.muted.lock().unwrap().clear();
    assert!(rewatch(&store, GW_B, "pr"));
    assert_eq!(gb.tur_sense(&b), Some((6, 0x2A, 0x05)), "b through B");
    assert_eq!(gb.tur_sense(&b), None, "once");
    assert_eq!(gb.tur_sense(&a), None, "a lost nothing");
    assert_eq!(gb.read_keys(&b).1, vec![0xA1]);
    // A PR OUT through B reads the object first: it raises what B owed for a change it
    // missed. b registers again; A CLEARs while B is cut off; b registers through B.
    assert_eq!(gb.pr(&b, 0, 0, 0, 0xB3).status, Status::Good);
    assert_eq!(ga.tur_sense(&b), None);
    store.muted.lock().unwrap().push(GW_B);
    assert_eq!(ga.pr(&a, 3, 0, 0xA1, 0).status, Status::Good);
    assert_eq!(ga.tur_sense(&b), Some((6, 0x2A, 0x03)), "CLEAR: RESERVATIONS PREEMPTED through A");
    assert_eq!(gb.pr(&b, 6, 0, 0, 0xB4).status, Status::Good);
    assert_eq!(gb.tur_sense(&b), Some((6, 0x2A, 0x03)), "CLEAR: RESERVATIONS PREEMPTED through B");
    assert_eq!(gb.read_keys(&a).1, vec![0xB4]);
}

#[test]
fn past_the_log_a_gateway_raises_conservative_unit_attentions() {
    let (store, mut ga, mut gb) = two_gateways();
    let (a, b) = (ga.a.clone(), ga.b.clone());
    assert_eq!(gb.pr(&b, 0, 0, 0, 0xB2).status, Status::Good);
    assert_eq!(ga.pr(&a, 0, 0, 0, 0xA1).status, Status::Good);
    store.muted.lock().unwrap().push(GW_B);
    // b is preempted, then many more changes push that one out of the log.
    assert_eq!(ga.pr(&a, 4, WRITE_EXCLUSIVE, 0xA1, 0xB2).status, Status::Good);
    for k in 0..crate::pr::shared::UA_LOG_ENTRIES as u64 + 2 {
        assert_eq!(ga.pr(&a, 0, 0, 0xA1 + k, 0xA2 + k).status, Status::Good);
    }
    store.muted.lock().unwrap().clear();
    assert!(rewatch(&store, GW_B, "pr"));
    assert_eq!(gb.tur_sense(&b), Some((6, 0x2A, 0x05)), "b lost its registration: REGISTRATIONS PREEMPTED");
    assert_eq!(gb.tur_sense(&a), None, "a lost nothing");
    assert_eq!(gb.read_keys(&b).1.len(), 1);
}

#[test]
fn a_reset_whose_announcement_stalls_does_not_stall_the_reactor() {
    let (store, mut ga, mut gb) = two_gateways();
    let (a, b) = (ga.a.clone(), ga.b.clone());
    // The other gateway is slow to acknowledge (gone, its watch not yet expired).
    store.notify_stalled.store(true, Ordering::Release);
    let started = store.notifies.load(Ordering::Acquire);
    let t0 = Instant::now();
    let pending = ga.dc.reset_lun(LunId::new(ga.lun.id()), ResetKind::LunReset);
    let took = t0.elapsed();
    // The reactor went on at once; what it got back is not settled: the connection holds
    // its task management response.
    assert_eq!(store.notified.load(Ordering::Acquire), 0);
    assert!(!pending.settled() || took >= crate::ANNOUNCE_WAIT, "settled before the other gateway acknowledged");
    assert!(took < Duration::from_millis(400), "the reset waited {took:?} for the other gateways");
    // I/O on that reactor goes on while the announcement waits.
    assert_eq!(ga.tur_sense(&a), Some((6, 0x29, 0x03)));
    assert_eq!(ga.tur_sense(&b), Some((6, 0x29, 0x03)));
    assert!(ga.writes(&a));
    assert!(ga.writes(&b));
    // The announcement was started; once the peer answers it is settled, and the peer has
    // the reset's unit attention by then.
    let t0 = Instant::now();
    while store.notifies.load(Ordering::Acquire) == started {
        assert!(t0.elapsed() < Duration::from_secs(10), "the reset was never announced");
        std::thread::sleep(Duration::from_millis(1));
    }
    store.notify_stalled.store(false, Ordering::Release);
    let t0 = Instant::now();
    while !pending.settled() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the announcement never settled");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(gb.tur_sense(&a), Some((6, 0x29, 0x03)));
    // A peer that never answers: settled after ANNOUNCE_WAIT all the same.
    store.notify_stalled.store(true, Ordering::Release);
    let pending = gb.dc.reset_lun(LunId::new(gb.lun.id()), ResetKind::LunReset);
    let t0 = Instant::now();
    while !pending.settled() {
        assert!(t0.elapsed() < crate::ANNOUNCE_WAIT + Duration::from_secs(10), "never settled");
        std::thread::sleep(Duration::from_millis(5));
    }
    store.notify_stalled.store(false, Ordering::Release);
}

#[test]
fn a_peer_that_neither_acknowledges_nor_can_be_fenced_fails_pr_out() {
    let (store, mut ga, mut gb) = two_gateways();
    let (a, b) = (ga.a.clone(), ga.b.clone());
    assert_eq!(ga.pr(&a, 0, 0, 0, 0xA1).status, Status::Good);
    // B misses notifies and the blocklist command fails (the monitors refuse it, say).
    store.muted.lock().unwrap().push(GW_B);
    store.unfenceable.store(true, Ordering::Release);
    let r = ga.pr(&a, 1, WRITE_EXCLUSIVE, 0xA1, 0);
    // Never GOOD: HARDWARE ERROR, LOGICAL UNIT COMMUNICATION FAILURE.
    assert_eq!(r.sense_triplet(), Some((4, 0x08, 0x00)), "{r:?}");
    // The change is in the object: A (and any gateway that reads it) honours it, and a
    // retry of the same command finds it done.
    assert!(!ga.writes(&b));
    assert_eq!(ga.pr(&a, 1, WRITE_EXCLUSIVE, 0xA1, 0).sense_triplet(), None);
    // B follows once it reads again.
    store.muted.lock().unwrap().clear();
    assert!(rewatch(&store, GW_B, "pr"));
    assert!(!gb.writes(&b));
    // With fencing working again, a non-acknowledging peer is fenced and the command is GOOD.
    store.muted.lock().unwrap().push(GW_B);
    store.unfenceable.store(false, Ordering::Release);
    let unacked = store.unacked.load(Ordering::Acquire);
    assert_eq!(ga.pr(&a, 2, WRITE_EXCLUSIVE, 0xA1, 0).status, Status::Good);
    assert_eq!(store.unacked.load(Ordering::Acquire), unacked + 1);
}
