//! LBA range locking for commands that must be atomic against other writes
//! (COMPARE AND WRITE, ORWRITE, WRITE ATOMIC: SBC-3 5.2, 5.9), across all reactors.
//!
//! Plain writes pay one uncontended atomic add and one load on their own reactor's counter
//! while no atomic command is active anywhere on the LUN (the fast path). An atomic
//! command first raises `exclusive_active`, which sends new writes to the slow path
//! (register their range in the shared table), then waits until the writes that entered
//! the fast path before have drained and no registered range overlaps its own. The
//! handshake is Dekker-style: a writer increments its counter and then reads
//! `exclusive_active`; the atomic command increments `exclusive_active` and then reads the
//! counters; with sequentially consistent operations at least one of them sees the other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use riser_bdev::Lba;

/// Fast-path writes in flight on one channel, on its own cache line.
#[repr(align(128))]
#[derive(Default, Debug)]
pub(crate) struct FastCounter(pub AtomicU64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    start: Lba,
    end: Lba,
    exclusive: bool,
    id: u64,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    next_id: u64,
}

#[derive(Default)]
pub(crate) struct RangeLock {
    /// Atomic commands holding or waiting for a range.
    exclusive_active: AtomicU64,
    table: Mutex<Table>,
    counters: Mutex<Vec<Arc<FastCounter>>>,
}

/// A registered range (or set of ranges) to give back with [`RangeLock::release`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RangeGrant {
    pub ids: Vec<u64>,
    pub exclusive: bool,
}

/// What a writer got.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WriteAdmission {
    /// Fast path: the channel's counter was incremented; decrement it on completion.
    Fast,
    /// Slow path: the ranges are registered; release them on completion.
    Registered(RangeGrant),
    /// An atomic command owns an overlapping range: try again later.
    Wait,
}

fn overlaps(e: &Entry, s: Lba, end: Lba) -> bool {
    e.start < end && s < e.end
}

impl RangeLock {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn register_counter(&self) -> Arc<FastCounter> {
        let c = Arc::new(FastCounter::default());
        self.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(c.clone());
        c
    }

    /// Counters registered: one per open [`LunChannel`](crate::LunChannel) of the LUN.
    pub fn counters(&self) -> usize {
        self.counters.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn unregister_counter(&self, c: &Arc<FastCounter>) {
        self.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|x| !Arc::ptr_eq(x, c));
    }

    /// Admits a write of the given ranges (`(lba, blocks)`).
    pub fn admit_write(&self, counter: &FastCounter, ranges: &[(Lba, u64)]) -> WriteAdmission {
        counter.0.fetch_add(1, Ordering::SeqCst);
        if self.exclusive_active.load(Ordering::SeqCst) == 0 {
            return WriteAdmission::Fast;
        }
        counter.0.fetch_sub(1, Ordering::SeqCst);
        let mut t = self.table();
        for &(s, n) in ranges {
            let end = s.saturating_add(n.max(1));
            if t.entries.iter().any(|e| e.exclusive && overlaps(e, s, end)) {
                return WriteAdmission::Wait;
            }
        }
        let mut ids = Vec::with_capacity(ranges.len());
        for &(s, n) in ranges {
            t.next_id += 1;
            let id = t.next_id;
            t.entries.push(Entry {
                start: s,
                end: s.saturating_add(n.max(1)),
                exclusive: false,
                id,
            });
            ids.push(id);
        }
        WriteAdmission::Registered(RangeGrant {
            ids,
            exclusive: false,
        })
    }

    /// Ends a fast-path write.
    pub fn fast_done(&self, counter: &FastCounter) {
        counter.0.fetch_sub(1, Ordering::SeqCst);
    }

    /// Announces an atomic command: from now on writes take the slow path. Must be matched
    /// by [`release`](Self::release) of the exclusive grant, or by
    /// [`cancel_exclusive`](Self::cancel_exclusive) if it never got one.
    pub fn begin_exclusive(&self) {
        self.exclusive_active.fetch_add(1, Ordering::SeqCst);
    }

    pub fn cancel_exclusive(&self) {
        self.exclusive_active.fetch_sub(1, Ordering::SeqCst);
    }

    /// Tries to take `[lba, lba+n)` exclusively, after [`begin_exclusive`](Self::begin_exclusive).
    pub fn try_exclusive(&self, lba: Lba, n: u64) -> Option<RangeGrant> {
        let end = lba.saturating_add(n.max(1));
        let mut t = self.table();
        if t.entries.iter().any(|e| overlaps(e, lba, end)) {
            return None;
        }
        // Writes admitted on the fast path before we raised the flag must be finished.
        let busy = self
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|c| c.0.load(Ordering::SeqCst) != 0);
        if busy {
            return None;
        }
        t.next_id += 1;
        let id = t.next_id;
        t.entries.push(Entry {
            start: lba,
            end,
            exclusive: true,
            id,
        });
        Some(RangeGrant {
            ids: vec![id],
            exclusive: true,
        })
    }

    pub fn release(&self, g: RangeGrant) {
        {
            let mut t = self.table();
            t.entries.retain(|e| !g.ids.contains(&e.id));
        }
        if g.exclusive {
            self.exclusive_active.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[cfg(test)]
    pub fn idle(&self) -> bool {
        self.exclusive_active.load(Ordering::SeqCst) == 0 && self.table().entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_slow_and_exclusive() {
        let l = RangeLock::default();
        let c1 = l.register_counter();
        let c2 = l.register_counter();
        assert_eq!(l.admit_write(&c1, &[(Lba::new(0), 8)]), WriteAdmission::Fast);
        l.begin_exclusive();
        // A fast write is in flight on c1: the exclusive range cannot be granted yet.
        assert_eq!(l.try_exclusive(Lba::new(4), 1), None);
        l.fast_done(&c1);
        let g = l.try_exclusive(Lba::new(4), 1).unwrap();
        // Overlapping writes wait, others register.
        assert_eq!(l.admit_write(&c2, &[(Lba::new(0), 8)]), WriteAdmission::Wait);
        let w = match l.admit_write(&c2, &[(Lba::new(100), 8)]) {
            WriteAdmission::Registered(g) => g,
            x => panic!("{x:?}"),
        };
        // A second atomic command on an overlapping registered range waits.
        l.begin_exclusive();
        assert_eq!(l.try_exclusive(Lba::new(104), 1), None);
        l.release(w);
        let g2 = l.try_exclusive(Lba::new(104), 1).unwrap();
        l.release(g);
        l.release(g2);
        assert!(l.idle());
        assert_eq!(l.admit_write(&c2, &[(Lba::new(0), 8)]), WriteAdmission::Fast);
        l.fast_done(&c2);
        l.unregister_counter(&c1);
        l.unregister_counter(&c2);
    }
}
