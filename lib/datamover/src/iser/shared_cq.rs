//! One completion queue for many queue pairs: per reactor and device, as the design asks
//! (SPDK's poll groups do the same), instead of one CQ per connection.
//!
//! A [`SharedCq`] is polled in batches by whichever of its users polls first: the reactor
//! that owns its connections, or a portal thread whose connection is still logging in on a
//! QP of this CQ. Completions are sorted by QP number into per-QP [`Inbox`]es (lock-free
//! queues), from which each connection takes its own. The sorting runs under a `try_lock`:
//! a user that finds another one draining just reads its inbox, so nobody ever waits.
//!
//! Capacity: a CQ that overflows puts every QP on it in error, so each QP reserves its
//! send + receive depth at registration; [`CqSet::cq_for`] opens another CQ for the
//! reactor when the current one is full.
//!
//! The sorting logic is generic over [`CqSource`] so it is unit-tested without a device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crossbeam_queue::SegQueue;

use super::conn::Completion;
use super::error::IserError;

/// What a shared CQ is polled through: the verbs CQ, or a fake in tests.
pub trait CqSource: Send + Sync {
    /// Appends up to `max` (qp_num, completion) pairs; returns how many, or an error.
    fn poll_into(&self, out: &mut Vec<(u32, Completion)>, max: usize) -> Result<usize, IserError>;
}

/// Where one QP's completions wait for it.
#[derive(Default)]
pub struct Inbox {
    q: SegQueue<Completion>,
}

impl Inbox {
    pub fn pop(&self) -> Option<Completion> {
        self.q.pop()
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

/// Completions drained per CQ poll call.
const BATCH: usize = 64;
/// Batches per drain: bounds one drain's time when the CQ keeps filling.
const MAX_BATCHES: usize = 8;

struct Demux {
    inboxes: HashMap<u32, Weak<Inbox>>,
    buf: Vec<(u32, Completion)>,
    /// Work requests reserved by the registered QPs.
    reserved: u32,
}

/// A CQ shared by the QPs of one reactor on one device.
pub struct SharedCq<S: CqSource> {
    source: S,
    capacity: u32,
    demux: Mutex<Demux>,
}

/// A QP's membership of a shared CQ: its inbox, and its reservation, given back on drop.
pub struct CqMember<S: CqSource> {
    cq: Arc<SharedCq<S>>,
    qp_num: u32,
    depth: u32,
    inbox: Arc<Inbox>,
}

impl<S: CqSource> SharedCq<S> {
    /// A shared CQ over `source`, which holds `capacity` completions.
    pub fn new(source: S, capacity: u32) -> Arc<SharedCq<S>> {
        Arc::new(SharedCq {
            source,
            capacity,
            demux: Mutex::new(Demux { inboxes: HashMap::new(), buf: Vec::with_capacity(BATCH), reserved: 0 }),
        })
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Demux> {
        self.demux.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Room for a QP of `depth` work requests (send + receive)?
    pub fn has_room(&self, depth: u32) -> bool {
        self.lock().reserved + depth <= self.capacity
    }

    /// How many QPs are registered.
    pub fn members(&self) -> usize {
        self.lock().inboxes.len()
    }

    /// Registers QP `qp_num` (before anything is posted on it), reserving `depth` entries.
    pub fn join(self: &Arc<Self>, qp_num: u32, depth: u32) -> Result<CqMember<S>, IserError> {
        let mut d = self.lock();
        if d.reserved + depth > self.capacity {
            return Err(IserError::CqFull { reserved: d.reserved, capacity: self.capacity });
        }
        d.reserved += depth;
        let inbox = Arc::new(Inbox::default());
        d.inboxes.insert(qp_num, Arc::downgrade(&inbox));
        Ok(CqMember { cq: self.clone(), qp_num, depth, inbox })
    }

    /// Drains the CQ into the inboxes unless another thread is doing it; returns how many
    /// completions were sorted. A completion for a QP no longer registered is dropped
    /// (its connection is gone, and so is what the work request held).
    pub fn drain(&self) -> Result<usize, IserError> {
        let Ok(mut d) = self.demux.try_lock() else { return Ok(0) };
        let d = &mut *d;
        let mut total = 0;
        for _ in 0..MAX_BATCHES {
            d.buf.clear();
            let n = self.source.poll_into(&mut d.buf, BATCH)?;
            for (qp, c) in d.buf.drain(..) {
                match d.inboxes.get(&qp).and_then(Weak::upgrade) {
                    Some(inbox) => inbox.q.push(c),
                    None => log::debug!("iSER: completion {:#x} for QP {qp}, which is gone", c.wr_id),
                }
            }
            total += n;
            if n < BATCH {
                break;
            }
        }
        Ok(total)
    }
}

impl<S: CqSource> CqMember<S> {
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    pub fn cq(&self) -> &Arc<SharedCq<S>> {
        &self.cq
    }

    /// Appends up to `max` of this QP's completions, draining the CQ first when the inbox
    /// is empty. A failed CQ poll is reported as one error completion (the connection
    /// tears down).
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.inbox.is_empty() {
            if let Err(e) = self.cq.drain() {
                log::error!("iSER: polling the shared CQ failed: {e}");
                out.push(Completion { wr_id: 0, error: Some(false), byte_len: 0 });
                return 1;
            }
        }
        let mut n = 0;
        while n < max {
            let Some(c) = self.inbox.pop() else { break };
            out.push(c);
            n += 1;
        }
        n
    }
}

impl<S: CqSource> Drop for CqMember<S> {
    fn drop(&mut self) {
        let mut d = self.cq.lock();
        // Only our own entry: a new QP may already have been given this QP number.
        if d.inboxes.get(&self.qp_num).is_some_and(|w| w.as_ptr() == Arc::as_ptr(&self.inbox)) {
            d.inboxes.remove(&self.qp_num);
        }
        d.reserved = d.reserved.saturating_sub(self.depth);
    }
}

/// The shared CQs of a process, by (device key, reactor): a reactor gets another CQ on the
/// same device when its first is full. The set holds them weakly: a CQ lives as long as a QP
/// on it does, so a device being removed is let go as soon as its connections are.
pub struct CqSet<S: CqSource> {
    cqs: Mutex<HashMap<(usize, usize), Vec<Weak<SharedCq<S>>>>>,
}

impl<S: CqSource> Default for CqSet<S> {
    fn default() -> Self {
        CqSet { cqs: Mutex::new(HashMap::new()) }
    }
}

impl<S: CqSource> CqSet<S> {
    /// A shared CQ of `reactor` on `device` with room for `depth`, made by `open` (which
    /// returns the source and its capacity) when none has room. The caller keeps it alive
    /// (by joining it) or it closes.
    pub fn cq_for(
        &self,
        device: usize,
        reactor: usize,
        depth: u32,
        open: impl FnOnce() -> Result<(S, u32), IserError>,
    ) -> Result<Arc<SharedCq<S>>, IserError> {
        let mut all = self.cqs.lock().unwrap_or_else(|p| p.into_inner());
        for v in all.values_mut() {
            v.retain(|w| w.strong_count() > 0);
        }
        all.retain(|_, v| !v.is_empty());
        let v = all.entry((device, reactor)).or_default();
        if let Some(cq) = v.iter().filter_map(Weak::upgrade).find(|cq| cq.has_room(depth)) {
            return Ok(cq);
        }
        let (source, capacity) = open()?;
        if depth > capacity {
            return Err(IserError::QpDeeperThanCq { depth, capacity });
        }
        let cq = SharedCq::new(source, capacity);
        v.push(Arc::downgrade(&cq));
        Ok(cq)
    }

    /// How many CQs are open (for tests and stats).
    pub fn len(&self) -> usize {
        self.cqs.lock().unwrap_or_else(|p| p.into_inner()).values().flatten().filter(|w| w.strong_count() > 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CQ that hands out what the test queued.
    #[derive(Default)]
    struct FakeCq {
        q: Mutex<Vec<(u32, Completion)>>,
    }

    impl FakeCq {
        fn complete(&self, qp: u32, wr_id: u64) {
            self.q.lock().unwrap().push((qp, Completion { wr_id, error: None, byte_len: 0 }));
        }
    }

    impl CqSource for FakeCq {
        fn poll_into(&self, out: &mut Vec<(u32, Completion)>, max: usize) -> Result<usize, IserError> {
            let mut q = self.q.lock().unwrap();
            let n = q.len().min(max);
            out.extend(q.drain(..n));
            Ok(n)
        }
    }

    fn ids(v: &[Completion]) -> Vec<u64> {
        v.iter().map(|c| c.wr_id).collect()
    }

    #[test]
    fn completions_reach_their_own_qp_in_order() {
        let cq = SharedCq::new(FakeCq::default(), 1000);
        let a = cq.join(1, 10).unwrap();
        let b = cq.join(2, 10).unwrap();
        for i in 0..5 {
            cq.source().complete(1, i);
            cq.source().complete(2, 100 + i);
        }
        let mut out = Vec::new();
        // A's poll drains everything; B's completions wait in B's inbox.
        assert_eq!(a.poll(&mut out, 3), 3);
        assert_eq!(ids(&out), [0, 1, 2]);
        out.clear();
        assert_eq!(b.poll(&mut out, 32), 5);
        assert_eq!(ids(&out), [100, 101, 102, 103, 104]);
        out.clear();
        assert_eq!(a.poll(&mut out, 32), 2);
        assert_eq!(ids(&out), [3, 4]);
    }

    #[test]
    fn big_bursts_drain_in_batches() {
        let cq = SharedCq::new(FakeCq::default(), 10_000);
        let a = cq.join(7, 5000).unwrap();
        for i in 0..(BATCH * 3 + 5) as u64 {
            cq.source().complete(7, i);
        }
        let mut out = Vec::new();
        let mut got = 0;
        while got < BATCH * 3 + 5 {
            let n = a.poll(&mut out, 50);
            assert!(n > 0);
            got += n;
        }
        assert_eq!(ids(&out), (0..(BATCH * 3 + 5) as u64).collect::<Vec<_>>());
    }

    #[test]
    fn capacity_is_reserved_and_given_back() {
        let cq = SharedCq::new(FakeCq::default(), 100);
        let a = cq.join(1, 60).unwrap();
        assert!(!cq.has_room(41));
        assert!(cq.join(2, 41).is_err());
        assert_eq!(cq.join(2, 41).err(), Some(IserError::CqFull { reserved: 60, capacity: 100 }));
        let b = cq.join(2, 40).unwrap();
        // QP number 1 reused by a new QP before the old one's membership ends: the old one
        // leaving does not take the new one's inbox.
        let a2 = cq.join(1, 0).unwrap();
        drop(a);
        cq.source().complete(1, 8);
        let mut out = Vec::new();
        a2.poll(&mut out, 8);
        assert_eq!(ids(&out), [8]);
        drop(a2);
        assert!(cq.has_room(60));
        // A completion for a QP that left is dropped, not delivered to anyone else.
        cq.source().complete(1, 9);
        cq.source().complete(2, 10);
        out.clear();
        b.poll(&mut out, 8);
        assert_eq!(ids(&out), [10]);
    }

    #[test]
    fn a_reactor_gets_another_cq_when_full_and_unused_ones_close() {
        let set: CqSet<FakeCq> = CqSet::default();
        let open = || Ok((FakeCq::default(), 100));
        let c1 = set.cq_for(1, 0, 60, open).unwrap();
        let m1 = c1.join(1, 60).unwrap();
        let c2 = set.cq_for(1, 0, 60, open).unwrap();
        assert!(!Arc::ptr_eq(&c1, &c2), "the first CQ is full");
        let m2 = c2.join(2, 60).unwrap();
        // Another reactor, another CQ; the same reactor with room reuses one.
        let c3 = set.cq_for(1, 1, 10, open).unwrap();
        assert!(Arc::ptr_eq(&set.cq_for(1, 1, 10, open).unwrap(), &c3));
        assert_eq!(set.len(), 3);
        // A CQ closes when its last QP (and user) goes.
        drop((c1, c2, c3));
        assert_eq!(set.len(), 2, "the CQs with members stay");
        drop(m1);
        assert_eq!(set.len(), 1);
        drop(m2);
        assert!(set.is_empty());
        assert!(set.cq_for(1, 0, 200, open).is_err(), "a QP larger than a whole CQ");
        assert_eq!(set.cq_for(1, 0, 200, open).err(), Some(IserError::QpDeeperThanCq { depth: 200, capacity: 100 }));
    }
}
