//! The logical unit's state shared by the gateways that export one device (`lu_shared`):
//! SPC-2 RESERVE/RELEASE and the mode parameters, over the in-memory shared store of
//! `fake_shared` (two LUNs over one store are two gateways). Initiator ports log in through
//! gateway A as target port group 1 and through gateway B as group 2, as they do in front of
//! an RBD image: their I_T nexuses differ.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fake_shared::{shared_lun, Store};
use super::*;
use crate::lun::MODE_SWP;
use crate::ResetKind;

const RESERVE6: [u8; 6] = [op::RESERVE6, 0, 0, 0, 0, 0];
const RELEASE6: [u8; 6] = [op::RELEASE6, 0, 0, 0, 0, 0];
const DATA_PROTECT: (u8, u8, u8) = (7, 0x27, 0x02);
const COMM_FAILURE: (u8, u8, u8) = (4, 0x08, 0x00);

/// One gateway: a LUN over the shared device, and initiator ports X and Y logged in through
/// its target port group `tpgt` (power-on unit attentions consumed).
struct Gw {
    e: Env,
    x: Arc<Nexus>,
    y: Arc<Nexus>,
}

fn gateway(store: &Arc<Store>, uuid: uuid::Uuid, tpgt: u16) -> Gw {
    let lun = shared_lun(store, uuid);
    let mut e = env();
    e.lun = lun.clone();
    e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
    let x = Arc::new(Nexus::new("iqn.2024-01.test:x", 0x23d0_0000_0001, "iqn.2024-01.test:tgt", tpgt));
    let y = Arc::new(Nexus::new("iqn.2024-01.test:y", 0x23d0_0000_0002, "iqn.2024-01.test:tgt", tpgt));
    for n in [&x, &y] {
        e.run(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    }
    Gw { e, x, y }
}

fn two_gateways() -> (Arc<Store>, Gw, Gw) {
    let store = Arc::new(Store::default());
    let uuid = uuid::Uuid::new_v4();
    let a = gateway(&store, uuid, 1);
    let b = gateway(&store, uuid, 2);
    (store, a, b)
}

fn tur_status(e: &mut Env, n: &Arc<Nexus>) -> Status {
    e.run(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None).status
}

/// Waits (bounded) until `f` holds: work queued on the pool (a release after a nexus loss
/// or a reset) completes on its own time.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}: not after 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// MODE SELECT(6) of the control mode page with SWP `on`, through `n`.
fn set_swp(e: &mut Env, n: &Arc<Nexus>, on: bool) {
    let cur = e.ok(n, &[op::MODE_SENSE6, 0x08, 0x0A, 0, 255, 0], 255, None);
    let mut p = vec![0, 0, 0, 0];
    p.extend(cur[4..].to_vec());
    if on {
        p[4 + 4] |= 0x08;
    } else {
        p[4 + 4] &= !0x08;
    }
    e.ok(n, &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0], p.len() as u32, Some(p));
}

#[test]
fn a_reserve_through_one_gateway_conflicts_through_the_other() {
    let (store, mut a, mut b) = two_gateways();
    a.e.ok(&a.x, &RESERVE6, 0, None);
    // B learnt it from the notify before RESERVE completed: its checks are local.
    b.e.conflict(&b.y, &RESERVE6, 0, None);
    b.e.conflict(&b.y, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
    assert_eq!(tur_status(&mut b.e, &b.y), Status::ReservationConflict);
    // X through B is another I_T nexus than X through A.
    b.e.conflict(&b.x, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    a.e.ok(&a.x, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![1; BS]));
    assert!(String::from_utf8(store.object("lu_state")).unwrap().contains(a.x.key().as_ref()));
    // RELEASE by someone else: no effect. By the holder, through A: B may reserve.
    b.e.ok(&b.y, &RELEASE6, 0, None);
    b.e.conflict(&b.y, &RESERVE6, 0, None);
    a.e.ok(&a.x, &RELEASE6, 0, None);
    b.e.ok(&b.y, &RESERVE6, 0, None);
    a.e.conflict(&a.x, &RESERVE6, 0, None);
    a.e.conflict(&a.y, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
    // A gateway that opens the device later reads the reservation.
    let mut c = gateway(&store, uuid::Uuid::new_v4(), 3);
    c.e.conflict(&c.x, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
    b.e.ok(&b.y, &RELEASE6, 0, None);
    assert_eq!(tur_status(&mut c.e, &c.x), Status::Good);
}

#[test]
fn the_holders_nexus_lost_through_one_gateway_releases_it_for_all() {
    let (store, mut a, mut b) = two_gateways();
    a.e.ok(&a.x, &RESERVE6, 0, None);
    b.e.conflict(&b.y, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
    // X logs out of gateway A (or its connection drops).
    a.e.lun.nexus_lost(&a.x);
    eventually("the release reaches gateway B", || b.e.lun.lock().spc2_holder.is_none());
    assert!(!String::from_utf8(store.object("lu_state")).unwrap().contains(a.x.key().as_ref()));
    b.e.ok(&b.y, &RESERVE6, 0, None);
    // Y's nexus through B lost: released through A as well.
    b.e.lun.nexus_lost(&b.y);
    eventually("the release reaches gateway A", || a.e.lun.lock().spc2_holder.is_none());
    a.e.ok(&a.y, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
}

#[test]
fn a_lun_reset_through_one_gateway_ends_the_reservation_everywhere() {
    let (store, a, mut b) = two_gateways();
    b.e.ok(&b.y, &RESERVE6, 0, None);
    a.e.lun.reset(ResetKind::LunReset);
    eventually("the reservation is gone from the object", || !String::from_utf8(store.object("lu_state")).unwrap().contains("0x"));
    eventually("gateway B's copy", || b.e.lun.lock().spc2_holder.is_none());
    // A gateway opening the device now finds it free.
    let mut c = gateway(&store, uuid::Uuid::new_v4(), 3);
    c.e.ok(&c.x, &RESERVE6, 0, None);
}

#[test]
fn software_write_protect_set_through_one_gateway_holds_through_the_other() {
    let (store, mut a, mut b) = two_gateways();
    set_swp(&mut b.e, &b.y, true);
    assert_ne!(a.e.lun.mode_bits() & MODE_SWP, 0);
    // Every nexus of gateway A is told (MODE PARAMETERS CHANGED), then writes are refused.
    let r = a.e.run(&a.x, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    assert_eq!(r.sense_triplet(), Some((6, 0x2A, 0x01)), "{r:?}");
    a.e.check(&a.x, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]), DATA_PROTECT);
    let ms = a.e.ok(&a.x, &[op::MODE_SENSE6, 0, 0x0A, 0, 255, 0], 255, None);
    assert_eq!(ms[2] & 0x80, 0x80, "WP through A");
    // The nexus that set it gets no unit attention for its own change.
    b.e.check(&b.y, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]), DATA_PROTECT);
    // A gateway that opens the device later is write protected too.
    let mut c = gateway(&store, uuid::Uuid::new_v4(), 3);
    c.e.check(&c.x, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]), DATA_PROTECT);
    // Cleared through A: B writes.
    set_swp(&mut a.e, &a.x, false);
    let r = b.e.run(&b.x, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
    assert_eq!(r.sense_triplet(), Some((6, 0x2A, 0x01)), "{r:?}");
    b.e.ok(&b.x, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
}

#[test]
fn an_unreachable_cluster_fails_reserve_and_mode_select_and_changes_nothing() {
    let (store, mut a, mut b) = two_gateways();
    store.down.store(true, Ordering::Release);
    a.e.check(&a.x, &RESERVE6, 0, None, COMM_FAILURE);
    assert!(a.e.lun.lock().spc2_holder.is_none());
    let cur = a.e.ok(&a.x, &[op::MODE_SENSE6, 0x08, 0x0A, 0, 255, 0], 255, None);
    let mut p = vec![0, 0, 0, 0];
    p.extend(cur[4..].to_vec());
    p[4 + 4] |= 0x08;
    a.e.check(&a.x, &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0], p.len() as u32, Some(p), COMM_FAILURE);
    assert_eq!(a.e.lun.mode_bits() & MODE_SWP, 0);
    // Reads and writes go on from the local copy.
    a.e.ok(&a.x, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
    store.down.store(false, Ordering::Release);
    a.e.ok(&a.x, &RESERVE6, 0, None);
    b.e.conflict(&b.x, &RESERVE6, 0, None);
}

#[test]
fn an_object_riser_cannot_read_is_never_overwritten() {
    let (store, mut a, _b) = two_gateways();
    // A newer riser's object (another format): RESERVE fails, the object stays.
    let newer = br#"{"format": "riser-shared-lu-state-v2", "holders": []}"#;
    {
        let h = a.e.lun.bdev().shared_state("lu_state", Box::new(|_: &[u8]| Ok(()))).unwrap().unwrap();
        let v = h.read().unwrap().map(|(_, v)| v);
        h.write(newer, v).unwrap();
    }
    a.e.check(&a.x, &RESERVE6, 0, None, COMM_FAILURE);
    assert_eq!(store.object("lu_state"), newer.to_vec());
}

/// A device that keeps no allocation map of its own (as an RBD image): GET LBA STATUS
/// reads it, and blocks of zeros are deallocated, whatever gateway wrote or unmapped them.
struct NoMap(Arc<riser_bdev::NullBdev>);

impl riser_bdev::Bdev for NoMap {
    fn info(&self) -> &riser_bdev::BdevInfo {
        self.0.info()
    }
    fn supports(&self, kind: riser_bdev::IoKind) -> bool {
        self.0.supports(kind)
    }
    fn open_channel(self: Arc<Self>) -> Box<dyn riser_bdev::IoChannel> {
        self.0.clone().open_channel()
    }
    fn config_json(&self) -> (&'static str, serde_json::Value) {
        self.0.config_json()
    }
}

/// libiscsi's Sanitize.BlockErase asks GET LBA STATUS, after a BLOCK ERASE, to describe
/// the whole LU as deallocated in one answer; on a 256 MiB RBD image the scan stopped at
/// 128 MiB. 512 MiB of zeros: one descriptor for all of it.
#[test]
fn get_lba_status_reads_a_deallocated_device_without_a_map_whole() {
    let blocks = (512u64 << 20) / BS as u64;
    let bdev = Arc::new(NoMap(Arc::new(riser_bdev::NullBdev::new("N", blocks, BS as u32, None))));
    let lun = Lun::new(LunConfig { target_name: "iqn.2024-01.test:tgt".into(), ..LunConfig::default() }, bdev);
    let mut e = env();
    e.lun = lun.clone();
    e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
    let a = e.a.clone();
    e.run(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    let d = e.ok(&a, &get_lba_status(0, 256), 256, None);
    assert_eq!(lba_status_descs(&d), vec![(0, blocks as u32, 1)]);
}

/// A gateway group as every gateway sees it (one view shared by the test's gateways).
#[derive(Default)]
struct FakeGroup {
    members: std::sync::Mutex<Vec<riser_bdev::Member>>,
    subscribers: std::sync::Mutex<Vec<riser_bdev::OnGroupEvent>>,
}

impl FakeGroup {
    fn member(id: u64, tpg: u32) -> riser_bdev::Member {
        riser_bdev::Member { id, name: format!("gw{id}"), addr: String::new(), served: vec![tpg], state: riser_bdev::MemberState::Live }
    }

    /// Member `id` is fenced: every subscriber hears of it.
    fn fence(&self, id: u64) {
        for m in self.members.lock().unwrap().iter_mut().filter(|m| m.id == id) {
            m.state = riser_bdev::MemberState::Fenced;
        }
        for s in self.subscribers.lock().unwrap().iter() {
            s(&riser_bdev::GroupEvent::Changed);
        }
    }
}

impl riser_bdev::GatewayGroup for FakeGroup {
    fn describe(&self) -> String {
        "test group".into()
    }
    fn me(&self) -> riser_bdev::Member {
        self.members.lock().unwrap()[0].clone()
    }
    fn members(&self) -> Vec<riser_bdev::Member> {
        self.members.lock().unwrap().clone()
    }
    fn set_served(&self, _tpg_ids: &[u32]) {}
    fn is_fenced(&self) -> bool {
        false
    }
    fn subscribe(&self, on_event: riser_bdev::OnGroupEvent) {
        self.subscribers.lock().unwrap().push(on_event);
    }
}

/// A shared device that also belongs to a gateway group.
struct Grouped {
    inner: Arc<dyn riser_bdev::Bdev>,
    group: Arc<FakeGroup>,
}

impl riser_bdev::Bdev for Grouped {
    fn info(&self) -> &riser_bdev::BdevInfo {
        self.inner.info()
    }
    fn supports(&self, kind: riser_bdev::IoKind) -> bool {
        self.inner.supports(kind)
    }
    fn open_channel(self: Arc<Self>) -> Box<dyn riser_bdev::IoChannel> {
        self.inner.clone().open_channel()
    }
    fn config_json(&self) -> (&'static str, serde_json::Value) {
        self.inner.config_json()
    }
    fn shared_state(&self, purpose: &str, on_notify: riser_bdev::OnNotify) -> Option<Result<riser_bdev::SharedStateHandle, riser_bdev::BdevError>> {
        self.inner.shared_state(purpose, on_notify)
    }
    fn gateway_group(&self) -> Option<riser_bdev::GatewayGroupHandle> {
        Some(self.group.clone())
    }
}

fn grouped_gateway(store: &Arc<Store>, group: &Arc<FakeGroup>, tpgt: u16) -> Gw {
    let inner = shared_lun(store, uuid::Uuid::new_v4()).bdev().clone();
    let bdev = Arc::new(Grouped { inner, group: group.clone() });
    let lun = Lun::new(LunConfig { target_name: "iqn.2024-01.test:tgt".into(), ..LunConfig::default() }, bdev);
    let mut g = gateway(store, uuid::Uuid::new_v4(), tpgt);
    g.e.lun = lun.clone();
    g.e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
    for n in [g.x.clone(), g.y.clone()] {
        g.e.run(&n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    }
    g
}

/// The holder's gateway is killed: the group fences it, and the survivors release the
/// reservation made through it (its I_T nexuses are gone), once.
#[test]
fn a_reservation_made_through_a_gateway_that_is_fenced_is_released() {
    let store = Arc::new(Store::default());
    let group = Arc::new(FakeGroup::default());
    *group.members.lock().unwrap() = vec![FakeGroup::member(1, 1), FakeGroup::member(2, 2)];
    let mut a = grouped_gateway(&store, &group, 1);
    let mut b = grouped_gateway(&store, &group, 2);
    b.e.ok(&b.x, &RESERVE6, 0, None);
    a.e.conflict(&a.y, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
    // Gateway A going away is not B's holder's concern.
    group.fence(1);
    std::thread::sleep(Duration::from_millis(50));
    assert!(b.e.lun.lock().spc2_holder.is_some(), "released for the fencing of another gateway");
    // B is fenced: A releases what X held through B.
    group.fence(2);
    eventually("the reservation through the fenced gateway is released", || a.e.lun.lock().spc2_holder.is_none());
    assert!(!String::from_utf8(store.object("lu_state")).unwrap().contains("0x"));
    a.e.ok(&a.y, &RESERVE6, 0, None);
    // A later change of the group does not release the new holder.
    group.fence(2);
    std::thread::sleep(Duration::from_millis(50));
    a.e.conflict(&a.x, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
}

#[test]
fn a_reserve_that_a_silent_unfenceable_gateway_missed_is_not_good() {
    let (store, mut a, mut b) = two_gateways();
    store.muted.lock().unwrap().push(1);
    store.unfenceable.store(true, Ordering::Release);
    let r = a.e.run(&a.x, &RESERVE6, 0, None);
    assert_eq!(r.sense_triplet(), Some((4, 0x08, 0x00)), "{r:?}");
    // The reservation is in the shared state: a retry by the holder is GOOD, others conflict.
    a.e.ok(&a.x, &RESERVE6, 0, None);
    a.e.conflict(&a.y, &RESERVE6, 0, None);
    store.unfenceable.store(false, Ordering::Release);
    store.muted.lock().unwrap().clear();
    a.e.ok(&a.x, &RELEASE6, 0, None);
    b.e.ok(&b.y, &RESERVE6, 0, None);
}
