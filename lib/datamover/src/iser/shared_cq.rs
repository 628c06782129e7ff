//! One completion queue for many queue pairs: per reactor and device, as the design asks
//! (SPDK's poll groups do the same), owned and polled by that reactor alone.
//!
//! * A [`SharedCq`] has a fixed table of slots, one per QP on it (at most [`MAX_SLOTS`]), each
//!   with a bounded inbox. A QP takes a slot when it is created ([`SharedCq::join`], on the
//!   portal thread, at CONNECT_REQUEST) and every work request posted on it carries the slot's
//!   route in the low [`ROUTE_BITS`] bits of its `wr_id`: a [`Tag`] of the slot index and the
//!   slot's generation (bumped each time the slot is taken, so a completion of a QP that left
//!   cannot reach the next QP of the same slot), encoded by [`ROUTE`]. The table is
//!   riser-reactor's tag with atomics of its own: slots are taken on the portal thread and
//!   inboxes read wherever the connection runs.
//! * The [`CqPoller`] is the only thing that polls the verbs CQ. The portal attaches it to the
//!   reactor when the CQ opens (`LoginSink::attach_poller`); the reactor runs it once per pass:
//!   it drains the CQ in batches and puts each completion in the inbox its `wr_id` names: an
//!   array index, no lock, no hash map. The QP is the reactor's from its creation: during login
//!   the login thread only takes its completions out of the inbox, in full-feature phase the
//!   connection does (on the same reactor for a new session; a connection joining a session
//!   on another reactor reads its inbox from there: inboxes are lock-free queues).
//! * Capacity: a CQ that overflows puts every QP on it in error, so the CQ has one slot per
//!   `slot_depth` entries (the send + receive depth of its QPs): a CQ with no free slot is full
//!   and [`CqSet::cq_for`] opens another one for the reactor. An inbox holds `slot_depth`
//!   completions, as many as its QP can have outstanding.
//! * Lifetime: the set keeps CQs weakly; members (QPs) and the poller hold them. When only its
//!   poller is left, the poller retires the CQ (under the set's lock, which is also the only
//!   place a CQ is handed out, so none is handed out as it retires) and the reactor drops it:
//!   a device being removed is let go as soon as its connections are.
//!
//! The routing is generic over [`CqSource`] so it is unit-tested without a device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crossbeam_queue::ArrayQueue;
use riser_reactor::{Tag, TagLayout};

use super::wr::Completion;
use super::error::IserError;

/// The route to a QP's slot in the low bits of every `wr_id` posted on a shared CQ's QPs: the
/// slot index in the low 8 bits, the slot's generation in the next 8 (the tag's route is the
/// slot itself: no bits). The datamover keeps them zero.
pub const ROUTE: TagLayout = TagLayout::low(8, 8, 0);
pub const ROUTE_BITS: u32 = ROUTE.width();
pub const ROUTE_MASK: u64 = ROUTE.mask();
/// Most QPs on one CQ (8 bits of slot index in the route).
pub const MAX_SLOTS: usize = ROUTE.slots() as usize;
/// A slot's state: this bit while a QP holds it, the generation in the low bits.
const IN_USE: u32 = 1 << 8;
const GEN_MASK: u32 = IN_USE - 1;

/// Completions drained per CQ poll call.
const BATCH: usize = 32;
/// Batches per pass: bounds one pass's time when the CQ keeps filling.
const MAX_BATCHES: usize = 8;

/// What a shared CQ is polled through: the verbs CQ, or a fake in tests. Only the
/// [`CqPoller`] holds it.
pub trait CqSource: Send {
    /// Appends up to `max` completions; returns how many, or an error.
    fn poll_into(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize, IserError>;
}

/// What a [`CqPoller`] pass says (the reactor's poller status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollerPass {
    /// Routed completions.
    Busy,
    Idle,
    /// The CQ retired: no QP is left on it. Unregister the poller (dropping it closes the CQ).
    Done,
}

struct Slot {
    /// [`IN_USE`] | generation.
    state: AtomicU32,
    inbox: ArrayQueue<Completion>,
    /// The CQ could not be polled, or the inbox overflowed: the member reports an error.
    broken: AtomicBool,
}

/// A CQ shared by the QPs of one reactor on one device: the routing table of its
/// completions, and `handle`, what QPs are created on (the verbs CQ; never polled through it).
pub struct SharedCq<H> {
    handle: H,
    slot_depth: u32,
    slots: Box<[Slot]>,
    free: ArrayQueue<u16>,
    /// Set by the poller when it stops: the CQ is handed out no more.
    retired: AtomicBool,
    /// Completions whose route named no QP on the CQ now (dropped).
    stale: AtomicU64,
}

impl<H> SharedCq<H> {
    /// A shared CQ of `capacity` entries for QPs of up to `slot_depth` work requests.
    fn new(handle: H, capacity: u32, slot_depth: u32) -> Result<SharedCq<H>, IserError> {
        let slot_depth = slot_depth.max(1);
        let count = ((capacity / slot_depth) as usize).min(MAX_SLOTS);
        if count == 0 {
            return Err(IserError::QpDeeperThanCq { depth: slot_depth, capacity });
        }
        let free = ArrayQueue::new(count);
        for i in 0..count as u16 {
            let _ = free.push(i);
        }
        let slots = (0..count)
            .map(|_| Slot {
                state: AtomicU32::new(0),
                inbox: ArrayQueue::new(slot_depth as usize),
                broken: AtomicBool::new(false),
            })
            .collect();
        Ok(SharedCq { handle, slot_depth, slots, free, retired: AtomicBool::new(false), stale: AtomicU64::new(0) })
    }

    pub fn handle(&self) -> &H {
        &self.handle
    }

    /// Room for one more QP of up to `depth` work requests?
    pub fn has_room(&self, depth: u32) -> bool {
        depth <= self.slot_depth && !self.free.is_empty()
    }

    /// How many QPs are on it.
    pub fn members(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Completions dropped because their QP had left (or their route named no slot).
    pub fn stale(&self) -> u64 {
        self.stale.load(Ordering::Relaxed)
    }

    /// Takes a slot for a QP of `depth` work requests (send + receive), before anything is
    /// posted on it. Every work request of the QP must carry [`CqMember::route`].
    pub fn join(self: &Arc<Self>, depth: u32) -> Result<CqMember<H>, IserError> {
        if depth > self.slot_depth {
            return Err(IserError::QpDeeperThanCq { depth, capacity: self.slot_depth });
        }
        let Some(i) = self.free.pop() else {
            let capacity = self.slot_depth * self.slots.len() as u32;
            return Err(IserError::CqFull { reserved: capacity, capacity });
        };
        let slot = &self.slots[i as usize];
        let gen = ROUTE.next_gen(slot.state.load(Ordering::Acquire) & GEN_MASK);
        // Left over from a completion routed as the last QP left: not ours.
        while slot.inbox.pop().is_some() {}
        slot.broken.store(false, Ordering::Relaxed);
        slot.state.store(IN_USE | gen, Ordering::Release);
        Ok(CqMember { cq: self.clone(), slot: i, route: ROUTE.encode(Tag { slot: u32::from(i), gen, route: 0 }) })
    }
}

/// A QP's slot on a shared CQ: its inbox; given back on drop (after the QP is destroyed).
pub struct CqMember<H> {
    cq: Arc<SharedCq<H>>,
    slot: u16,
    route: u64,
}

impl<H> CqMember<H> {
    /// The bits to OR into every `wr_id` posted on the QP (its low [`ROUTE_BITS`]).
    pub fn route(&self) -> u64 {
        self.route
    }

    pub fn cq(&self) -> &Arc<SharedCq<H>> {
        &self.cq
    }

    /// Appends up to `max` of this QP's completions, their `wr_id` without the route. A CQ that
    /// could not be polled (or an inbox that overflowed) is reported as one error completion
    /// (the connection tears down). Never polls the CQ: its reactor does.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let slot = &self.cq.slots[self.slot as usize];
        let mut n = 0;
        if slot.broken.swap(false, Ordering::Relaxed) {
            out.push(Completion { wr_id: 0, error: Some(false), byte_len: 0 });
            n += 1;
        }
        while n < max {
            let Some(mut c) = slot.inbox.pop() else { break };
            let (tag, wr_id) = ROUTE.unpack(c.wr_id);
            if ROUTE.encode(tag) != self.route {
                // Routed as the slot changed hands: the QP that left's.
                self.cq.stale.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            c.wr_id = wr_id;
            out.push(c);
            n += 1;
        }
        n
    }

    /// Whether completions are waiting.
    pub fn pending(&self) -> bool {
        !self.cq.slots[self.slot as usize].inbox.is_empty()
    }
}

impl<H> Drop for CqMember<H> {
    fn drop(&mut self) {
        let slot = &self.cq.slots[self.slot as usize];
        let gen = slot.state.load(Ordering::Acquire) & GEN_MASK;
        slot.state.store(gen, Ordering::Release);
        while slot.inbox.pop().is_some() {}
        let _ = self.cq.free.push(self.slot);
    }
}

type CqMap<H> = HashMap<(usize, usize), Vec<Weak<SharedCq<H>>>>;

/// Polls one shared CQ and routes its completions; run by the CQ's reactor alone.
pub struct CqPoller<S: CqSource, H> {
    source: S,
    cq: Arc<SharedCq<H>>,
    set: Arc<Mutex<CqMap<H>>>,
    buf: Vec<Completion>,
}

impl<S: CqSource, H> CqPoller<S, H> {
    /// One pass: drains the CQ (up to [`MAX_BATCHES`] batches) into the inboxes.
    pub fn pass(&mut self) -> PollerPass {
        if Arc::strong_count(&self.cq) == 1 && self.retire() {
            return PollerPass::Done;
        }
        let mut routed = 0;
        for _ in 0..MAX_BATCHES {
            self.buf.clear();
            let n = match self.source.poll_into(&mut self.buf, BATCH) {
                Ok(n) => n,
                Err(e) => {
                    log::error!("iSER: polling the shared CQ failed: {e}");
                    for s in self.cq.slots.iter().filter(|s| s.state.load(Ordering::Acquire) & IN_USE != 0) {
                        s.broken.store(true, Ordering::Relaxed);
                    }
                    return PollerPass::Busy;
                }
            };
            for c in self.buf.drain(..) {
                route(&self.cq, c);
            }
            routed += n;
            if n < BATCH {
                break;
            }
        }
        if routed > 0 {
            PollerPass::Busy
        } else {
            PollerPass::Idle
        }
    }

    /// Retires the CQ if nothing but this poller holds it.
    fn retire(&self) -> bool {
        let _set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        // CQs are handed out only under this lock: nobody can take this one now.
        if Arc::strong_count(&self.cq) == 1 {
            self.cq.retired.store(true, Ordering::Release);
            return true;
        }
        false
    }
}

impl<S: CqSource, H> Drop for CqPoller<S, H> {
    fn drop(&mut self) {
        // Dropped without running (its reactor is stopping) or done: hand it out no more.
        self.cq.retired.store(true, Ordering::Release);
    }
}

/// Puts completion `c` in the inbox its route names; one whose QP is gone is dropped (and so
/// is what its work request held).
fn route<H>(cq: &SharedCq<H>, c: Completion) {
    let tag = ROUTE.decode(c.wr_id);
    match cq.slots.get(tag.slot as usize) {
        Some(s) if s.state.load(Ordering::Acquire) == IN_USE | tag.gen => {
            if s.inbox.push(c).is_err() {
                // More completions than its QP can have work requests: not a QP of ours.
                log::error!("iSER: completion {:#x}: its QP's inbox is full", c.wr_id);
                s.broken.store(true, Ordering::Relaxed);
            }
        }
        _ => {
            cq.stale.fetch_add(1, Ordering::Relaxed);
            log::debug!("iSER: completion {:#x} for a QP that is gone", c.wr_id);
        }
    }
}

/// The shared CQs of a process, by (device key, reactor): a reactor gets another CQ on the
/// same device when its first is full. The set holds them weakly (see the module's text).
pub struct CqSet<H> {
    cqs: Arc<Mutex<CqMap<H>>>,
}

impl<H> Default for CqSet<H> {
    fn default() -> Self {
        CqSet { cqs: Arc::new(Mutex::new(HashMap::new())) }
    }
}

impl<H> CqSet<H> {
    /// A shared CQ of `reactor` on `device` with a free slot for a QP of `depth` work
    /// requests, made by `open` (the source, the handle and the capacity) when none has room.
    /// A new CQ comes with its poller, which the caller hands to the reactor (dropped instead,
    /// the CQ is never handed out again). The caller keeps the CQ alive by joining it.
    #[allow(clippy::type_complexity)]
    pub fn cq_for<S: CqSource>(
        &self,
        device: usize,
        reactor: usize,
        depth: u32,
        open: impl FnOnce() -> Result<(S, H, u32), IserError>,
    ) -> Result<(Arc<SharedCq<H>>, Option<CqPoller<S, H>>), IserError> {
        let mut all = self.cqs.lock().unwrap_or_else(|p| p.into_inner());
        for v in all.values_mut() {
            v.retain(|w| w.upgrade().is_some_and(|cq| !cq.retired.load(Ordering::Acquire)));
        }
        all.retain(|_, v| !v.is_empty());
        let v = all.entry((device, reactor)).or_default();
        if let Some(cq) =
            v.iter().filter_map(Weak::upgrade).find(|cq| !cq.retired.load(Ordering::Acquire) && cq.has_room(depth))
        {
            return Ok((cq, None));
        }
        let (source, handle, capacity) = open()?;
        if depth > capacity {
            return Err(IserError::QpDeeperThanCq { depth, capacity });
        }
        let cq = Arc::new(SharedCq::new(handle, capacity, depth)?);
        v.push(Arc::downgrade(&cq));
        let poller = CqPoller { source, cq: cq.clone(), set: self.cqs.clone(), buf: Vec::with_capacity(BATCH) };
        Ok((cq, Some(poller)))
    }

    /// How many CQs are open and handed out (for tests and stats).
    pub fn len(&self) -> usize {
        let all = self.cqs.lock().unwrap_or_else(|p| p.into_inner());
        all.values().flatten().filter_map(Weak::upgrade).filter(|cq| !cq.retired.load(Ordering::Acquire)).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CQ that hands out what the test queued.
    #[derive(Clone, Default)]
    struct FakeCq {
        q: Arc<Mutex<Vec<Completion>>>,
        fail: Arc<AtomicBool>,
    }

    impl FakeCq {
        /// A completion of the work request `wr_id` posted on `m`'s QP.
        fn complete(&self, m: &CqMember<()>, wr_id: u64) {
            self.complete_raw(wr_id << ROUTE_BITS | m.route());
        }
        fn complete_raw(&self, wr_id: u64) {
            self.q.lock().unwrap().push(Completion { wr_id, error: None, byte_len: 0 });
        }
    }

    impl CqSource for FakeCq {
        fn poll_into(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize, IserError> {
            if self.fail.load(Ordering::Relaxed) {
                return Err(IserError::NoDevice);
            }
            let mut q = self.q.lock().unwrap();
            let n = q.len().min(max);
            out.extend(q.drain(..n));
            Ok(n)
        }
    }

    fn ids(v: &[Completion]) -> Vec<u64> {
        v.iter().map(|c| c.wr_id >> ROUTE_BITS).collect()
    }

    /// A set with one CQ of `capacity` for QPs of `depth`, its poller and its fake source.
    fn one_cq(capacity: u32, depth: u32) -> (CqSet<()>, Arc<SharedCq<()>>, CqPoller<FakeCq, ()>, FakeCq) {
        let set = CqSet::default();
        let fake = FakeCq::default();
        let f = fake.clone();
        let (cq, poller) = set.cq_for(1, 0, depth, move || Ok((f, (), capacity))).unwrap();
        (set, cq, poller.expect("a new CQ comes with its poller"), fake)
    }

    #[test]
    fn the_poller_routes_each_completion_to_the_qp_its_wr_id_names() {
        let (_set, cq, mut poller, fake) = one_cq(1000, 10);
        let a = cq.join(10).unwrap();
        let b = cq.join(10).unwrap();
        assert_ne!(a.route(), b.route());
        for i in 0..5 {
            fake.complete(&a, i);
            fake.complete(&b, 100 + i);
        }
        let mut out = Vec::new();
        // Members never poll the CQ: nothing before the reactor's pass.
        assert_eq!(a.poll(&mut out, 32), 0);
        assert_eq!(poller.pass(), PollerPass::Busy);
        assert_eq!(a.poll(&mut out, 3), 3);
        assert_eq!(ids(&out), [0, 1, 2]);
        assert!(out.iter().all(|c| c.wr_id & ROUTE_MASK == 0), "the route is taken off");
        out.clear();
        assert_eq!(b.poll(&mut out, 32), 5);
        assert_eq!(ids(&out), [100, 101, 102, 103, 104]);
        out.clear();
        assert_eq!(a.poll(&mut out, 32), 2);
        assert_eq!(ids(&out), [3, 4]);
        assert_eq!(poller.pass(), PollerPass::Idle);
    }

    #[test]
    fn big_bursts_drain_in_batches() {
        let (_set, cq, mut poller, fake) = one_cq(10_000, 5000);
        let a = cq.join(5000).unwrap();
        let total = (BATCH * MAX_BATCHES + 5) as u64;
        for i in 0..total {
            fake.complete(&a, i);
        }
        let mut out = Vec::new();
        poller.pass();
        assert_eq!(a.poll(&mut out, 10_000), BATCH * MAX_BATCHES, "one pass is bounded");
        poller.pass();
        a.poll(&mut out, 10_000);
        assert_eq!(ids(&out), (0..total).collect::<Vec<_>>());
    }

    #[test]
    fn a_slot_reused_never_gets_the_completions_of_the_qp_that_left() {
        let (_set, cq, mut poller, fake) = one_cq(20, 10);
        let a = cq.join(10).unwrap();
        let b = cq.join(10).unwrap();
        assert!(!cq.has_room(10));
        assert!(matches!(cq.join(10), Err(IserError::CqFull { .. })));
        assert_eq!(cq.join(11).err(), Some(IserError::QpDeeperThanCq { depth: 11, capacity: 10 }));
        let old_route = a.route();
        // A's QP leaves with a completion still in the CQ; a new QP takes its slot.
        fake.complete(&a, 7);
        drop(a);
        let a2 = cq.join(10).unwrap();
        assert_eq!(a2.route() & 0xff, old_route & 0xff, "the same slot");
        assert_ne!(a2.route(), old_route, "another generation");
        fake.complete(&a2, 8);
        // Even one the poller had already routed before the slot changed hands.
        cq.slots[(old_route & 0xff) as usize].inbox.push(Completion { wr_id: 6 << ROUTE_BITS | old_route, error: None, byte_len: 0 }).unwrap();
        poller.pass();
        let mut out = Vec::new();
        a2.poll(&mut out, 8);
        assert_eq!(ids(&out), [8]);
        // A completion naming no slot at all is dropped, not delivered to anyone.
        fake.complete_raw(0xff);
        fake.complete(&b, 10);
        poller.pass();
        out.clear();
        b.poll(&mut out, 8);
        a2.poll(&mut out, 8);
        assert_eq!(ids(&out), [10]);
        assert_eq!(cq.stale(), 3, "A's late completions and the one naming no slot, counted");
    }

    #[test]
    fn a_failed_cq_poll_reaches_every_qp_as_an_error() {
        let (_set, cq, mut poller, fake) = one_cq(100, 10);
        let a = cq.join(10).unwrap();
        let b = cq.join(10).unwrap();
        fake.fail.store(true, Ordering::Relaxed);
        poller.pass();
        for m in [&a, &b] {
            let mut out = Vec::new();
            assert_eq!(m.poll(&mut out, 8), 1);
            assert_eq!(out[0].error, Some(false));
        }
    }

    #[test]
    fn completions_cross_to_a_member_read_on_another_thread() {
        let (_set, cq, mut poller, fake) = one_cq(100, 50);
        let a = cq.join(50).unwrap();
        for i in 0..40 {
            fake.complete(&a, i);
        }
        poller.pass();
        let got = std::thread::spawn(move || {
            let mut out = Vec::new();
            a.poll(&mut out, 64);
            ids(&out)
        })
        .join()
        .unwrap();
        assert_eq!(got, (0..40).collect::<Vec<_>>());
    }

    #[test]
    fn a_reactor_gets_another_cq_when_full_and_unused_ones_retire() {
        let set: CqSet<()> = CqSet::default();
        let open = || Ok((FakeCq::default(), (), 100));
        let (c1, p1) = set.cq_for(1, 0, 60, open).unwrap();
        let mut p1 = p1.unwrap();
        let m1 = c1.join(60).unwrap();
        let (c2, p2) = set.cq_for(1, 0, 60, open).unwrap();
        let mut p2 = p2.unwrap();
        assert!(!Arc::ptr_eq(&c1, &c2), "the first CQ is full");
        let m2 = c2.join(60).unwrap();
        // Another reactor, another CQ; the same reactor with room reuses one.
        let (c3, p3) = set.cq_for(1, 1, 10, open).unwrap();
        let mut p3 = p3.unwrap();
        let (again, none) = set.cq_for(1, 1, 10, open).unwrap();
        assert!(Arc::ptr_eq(&again, &c3) && none.is_none(), "no second poller for the same CQ");
        assert_eq!(set.len(), 3);
        drop((c1, c2, c3, again));
        // A CQ retires when only its poller holds it.
        assert_eq!(p3.pass(), PollerPass::Done);
        assert_eq!(p1.pass(), PollerPass::Idle, "a CQ with a member stays");
        assert_eq!(set.len(), 2);
        drop(m1);
        assert_eq!(p1.pass(), PollerPass::Done);
        assert_eq!(set.len(), 1);
        drop(m2);
        assert_eq!(p2.pass(), PollerPass::Done);
        assert!(set.is_empty());
        // A retired CQ is never handed out again, even while its poller lives on.
        let (c4, p4) = set.cq_for(1, 0, 60, open).unwrap();
        assert!(p4.is_some(), "a fresh CQ");
        drop(p4);
        let (c5, p5) = set.cq_for(1, 0, 60, open).unwrap();
        assert!(!Arc::ptr_eq(&c4, &c5) && p5.is_some(), "a CQ whose poller never ran is not handed out");
        assert_eq!(set.cq_for(1, 0, 200, open).err(), Some(IserError::QpDeeperThanCq { depth: 200, capacity: 100 }));
    }
}
