//! Quality of service: rate limits on I/O (SPDK's `bdev_set_qos_limit`), enforced across
//! reactors without a lock on the I/O path.
//!
//! A [`Qos`] holds one shared budget per limit (I/Os, read+write bytes, read bytes, write
//! bytes): atomics, refilled each time slice ([`TIMESLICE_NS`], 1 ms) with a slice's worth of
//! the rate by whichever reactor first sees the new slice. Each reactor's channel keeps a
//! [`Throttle`]: its own small buckets, topped up from the shared budget when one runs short
//! (a slice of the budget at a time, one atomic per top-up), and a queue of the I/Os that
//! found no tokens. An I/O over the limit waits in that queue, in submission order, and is
//! submitted by a later poll once tokens come back: it never fails and the reactor never
//! waits for it. A budget may go into debt by one I/O (an I/O larger than a slice's worth,
//! as SPDK allows): the next slices repay it first. Slices in which no reactor asked (one
//! descheduled on a busy machine) are made up for, up to 10 ms' worth; unused budget does
//! not build up past that, so an idle device gets no real burst.
//!
//! With no limit set a channel checks one relaxed flag per I/O.

use std::collections::VecDeque;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::{BdevIo, IoKind};

/// The length of a time slice: each one refills the shared budgets (SPDK's 1 ms).
pub const TIMESLICE_NS: u64 = 1_000_000;
/// An I/O limit must be a multiple of this (SPDK's `SPDK_BDEV_QOS_MIN_IOS_PER_SEC`).
pub const MIN_IOS_PER_SEC: u64 = 1000;

/// The limits, as SPDK's `assigned_rate_limits` names them; 0: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosLimits {
    pub rw_ios_per_sec: u64,
    pub rw_mbytes_per_sec: u64,
    pub r_mbytes_per_sec: u64,
    pub w_mbytes_per_sec: u64,
}

impl QosLimits {
    /// No limit at all.
    pub fn is_none(&self) -> bool {
        *self == QosLimits::default()
    }

    /// Per second: I/Os, read+write bytes, read bytes, write bytes (the [`Qos`] order).
    fn rates(&self) -> [u64; 4] {
        let b = |m: u64| m.saturating_mul(1024 * 1024);
        [self.rw_ios_per_sec, b(self.rw_mbytes_per_sec), b(self.r_mbytes_per_sec), b(self.w_mbytes_per_sec)]
    }

    /// SPDK's rule: an I/O limit is a multiple of [`MIN_IOS_PER_SEC`] (byte limits are
    /// whole MiB/s, SPDK's minimum unit, by construction).
    pub fn validate(&self) -> Result<(), String> {
        if !self.rw_ios_per_sec.is_multiple_of(MIN_IOS_PER_SEC) {
            return Err(format!("rw_ios_per_sec {} is not a multiple of {MIN_IOS_PER_SEC}", self.rw_ios_per_sec));
        }
        Ok(())
    }

    /// `assigned_rate_limits`' JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// The tokens a slice of `rate` per second gives for slice `s` (exact over many slices:
/// the sum of slices 1..=n is `rate * n / 1000`, with no rounding drift).
fn per_slice(rate: u64, s: u64) -> i64 {
    budget_between(rate, s.saturating_sub(1), s)
}

/// The tokens of slices `from + 1 ..= to`.
fn budget_between(rate: u64, from: u64, to: u64) -> i64 {
    let at = |s: u64| (rate as u128 * s as u128 * TIMESLICE_NS as u128 / 1_000_000_000) as i64;
    at(to) - at(from)
}

/// The most slices one refill makes up for (10 ms).
const CATCH_UP: u64 = 10;

/// One limit's shared budget.
#[derive(Default)]
struct Budget {
    /// Per second; 0: no limit.
    rate: AtomicU64,
    /// Tokens left in this slice (negative: a debt the next slices repay).
    tokens: AtomicI64,
    /// The slice the tokens were last refilled for.
    slice: AtomicU64,
}

impl Budget {
    /// Refills the budget when `slice` is a new one: the first reactor to see it wins.
    fn refill(&self, rate: u64, slice: u64) {
        let last = self.slice.load(Acquire);
        if slice <= last || self.slice.compare_exchange(last, slice, AcqRel, Relaxed).is_err() {
            return;
        }
        // The slices nobody asked in (a reactor descheduled on a busy machine) count too, up
        // to CATCH_UP of them: an idle device gets no more than that as a burst.
        let add = budget_between(rate, slice - (slice - last).min(CATCH_UP), slice);
        // A debt carries over; a surplus does not build up.
        let _ = self.tokens.fetch_update(AcqRel, Relaxed, |t| Some(if t < 0 { t + add } else { add }));
    }

    /// Takes at least `want` tokens if the budget has any left (it may go into debt).
    fn take(&self, want: i64) -> bool {
        self.tokens.fetch_update(AcqRel, Relaxed, |t| (t > 0).then_some(t - want)).is_ok()
    }
}

/// A device's (or an initiator's) limits and shared budgets.
pub struct Qos {
    limits: Mutex<QosLimits>,
    /// Any limit set: the one flag the I/O path reads when there is none.
    active: AtomicBool,
    /// Bumped on every change, so each throttle drops the tokens it held.
    generation: AtomicU64,
    budgets: [Budget; 4],
    /// Nanoseconds I/Os spent queued by the limits, summed over I/Os.
    throttled_ns: AtomicU64,
    /// I/Os that had to wait.
    throttled_ios: AtomicU64,
}

impl Default for Qos {
    fn default() -> Self {
        Qos {
            limits: Mutex::new(QosLimits::default()),
            active: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            budgets: Default::default(),
            throttled_ns: AtomicU64::new(0),
            throttled_ios: AtomicU64::new(0),
        }
    }
}

static QOS_START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// The clock of the time slices (monotonic nanoseconds), read only while a limit is set.
pub fn now_ns() -> u64 {
    QOS_START.elapsed().as_nanos() as u64
}

impl Qos {
    pub fn limits(&self) -> QosLimits {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the limits (all four: 0 removes one), at `now` on [`now_ns`]'s clock.
    pub fn set_at(&self, limits: QosLimits, now: u64) {
        let mut l = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        *l = limits;
        let slice = now / TIMESLICE_NS;
        for (b, rate) in self.budgets.iter().zip(limits.rates()) {
            b.rate.store(rate, Relaxed);
            b.slice.store(slice, Relaxed);
            b.tokens.store(per_slice(rate, slice.max(1)), Relaxed);
        }
        self.generation.fetch_add(1, Release);
        self.active.store(!limits.is_none(), Release);
    }

    pub fn set(&self, limits: QosLimits) {
        self.set_at(limits, now_ns())
    }

    /// Whether any limit is set.
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Relaxed)
    }

    /// Total time I/Os spent queued by the limits, in nanoseconds, and how many waited.
    pub fn throttled(&self) -> (u64, u64) {
        (self.throttled_ns.load(Relaxed), self.throttled_ios.load(Relaxed))
    }
}

/// Limits per initiator on one logical unit (riser's extension, `iscsi_target_node_set_qos_limit`):
/// each initiator name (compared without regard to case, as iSCSI names are) has its own
/// [`Qos`], shared by all its sessions. Channels look an initiator up only when the table's
/// generation changed, never per I/O.
#[derive(Default)]
pub struct QosTable {
    generation: AtomicU64,
    entries: Mutex<Vec<(String, std::sync::Arc<Qos>)>>,
}

impl QosTable {
    /// Changes with every change of the table (0: never set).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, std::sync::Arc<Qos>)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The limits of `initiator`, if it has any.
    pub fn find(&self, initiator: &str) -> Option<std::sync::Arc<Qos>> {
        self.lock().iter().find(|(n, _)| n.eq_ignore_ascii_case(initiator)).map(|(_, q)| q.clone())
    }

    /// Sets `initiator`'s limits; all zero removes its entry (its sessions' waiting I/Os go).
    pub fn set(&self, initiator: &str, limits: QosLimits) {
        let mut e = self.lock();
        match e.iter().position(|(n, _)| n.eq_ignore_ascii_case(initiator)) {
            Some(i) => {
                e[i].1.set(limits);
                if limits.is_none() {
                    e.remove(i);
                }
            }
            None if limits.is_none() => {}
            None => {
                let q = std::sync::Arc::new(Qos::default());
                q.set(limits);
                e.push((initiator.to_string(), q));
            }
        }
        self.generation.fetch_add(1, Release);
    }

    /// (initiator, its limits, its throttled nanoseconds and I/Os) in the order they were set.
    pub fn list(&self) -> Vec<(String, QosLimits, (u64, u64))> {
        self.lock().iter().map(|(n, q)| (n.clone(), q.limits(), q.throttled())).collect()
    }
}

/// What an I/O costs against each budget: I/Os, read+write bytes, read bytes, write bytes.
/// Reads and writes count; other kinds (flush, unmap, write zeroes) pass free.
fn cost(kind: IoKind, bytes: u64) -> [i64; 4] {
    let b = bytes as i64;
    match kind {
        IoKind::Read => [1, b, b, 0],
        IoKind::Write | IoKind::CompareAndWrite => [1, b, 0, b],
        _ => [0; 4],
    }
}

/// A reactor's share of a [`Qos`]: its own buckets and its queue of waiting I/Os.
pub struct Throttle {
    generation: u64,
    local: [i64; 4],
    /// Waiting I/Os with their size in bytes and when they were queued ([`now_ns`]). Grows to
    /// the channel's highest backlog once, then allocates nothing.
    queue: VecDeque<(BdevIo, u64, u64)>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle { generation: u64::MAX, local: [0; 4], queue: VecDeque::new() }
    }
}

impl Throttle {
    /// I/Os waiting for tokens.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether an I/O of `kind` and `bytes` may go now; charges it if so.
    fn admit(&mut self, qos: &Qos, kind: IoKind, bytes: u64, now: u64) -> bool {
        if !qos.active() {
            return true;
        }
        let g = qos.generation.load(Acquire);
        if g != self.generation {
            self.generation = g;
            self.local = [0; 4];
        }
        let need = cost(kind, bytes);
        let slice = now / TIMESLICE_NS;
        let mut ok = true;
        for (i, b) in qos.budgets.iter().enumerate() {
            let rate = b.rate.load(Relaxed);
            if rate == 0 || need[i] == 0 || self.local[i] >= need[i] {
                continue;
            }
            b.refill(rate, slice);
            // A quarter of a slice at a time: few atomics, little held by any one reactor.
            let want = (need[i] - self.local[i]).max(per_slice(rate, slice.max(1)) / 4).max(1);
            if b.take(want) {
                self.local[i] += want;
            } else {
                ok = false;
            }
        }
        if !ok {
            return false;
        }
        for (i, b) in qos.budgets.iter().enumerate() {
            if b.rate.load(Relaxed) != 0 {
                self.local[i] -= need[i];
            }
        }
        true
    }

    /// Submits `io` through `next` if the limits allow it now and nothing waits before it;
    /// else queues it for [`release`](Self::release).
    pub fn submit(&mut self, qos: &Qos, io: BdevIo, bytes: u64, now: u64, next: &mut dyn FnMut(BdevIo)) {
        if self.queue.is_empty() && self.admit(qos, io.kind, bytes, now) {
            next(io);
        } else {
            self.queue.push_back((io, bytes, now));
        }
    }

    /// Submits the waiting I/Os the limits allow now, in the order they came.
    pub fn release(&mut self, qos: &Qos, now: u64, next: &mut dyn FnMut(BdevIo)) {
        while let Some((io, bytes, _)) = self.queue.front() {
            if !self.admit(qos, io.kind, *bytes, now) {
                break;
            }
            if let Some((io, _, queued)) = self.queue.pop_front() {
                qos.throttled_ns.fetch_add(now.saturating_sub(queued), Relaxed);
                qos.throttled_ios.fetch_add(1, Relaxed);
                next(io);
            }
        }
    }
}

#[cfg(test)]
#[path = "qos_tests.rs"]
mod tests;
