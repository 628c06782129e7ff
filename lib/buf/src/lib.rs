//! I/O buffers: the memory that data moves through, from the block device to the wire and
//! back, and the budget that bounds it.
//!
//! An [`IoBuf`] is an owned, page-aligned (4 KiB) buffer. It moves by value — bdev → SCSI →
//! iSCSI → datamover and back — and is never copied to change hands. When dropped it goes
//! back to its [`Pool`], which keeps it for the next I/O of the same size class, so a
//! steady stream of I/O maps no memory and allocates nothing.
//!
//! Buffers are anonymous memory mappings: page-aligned as O_DIRECT and io_uring fixed
//! buffers need, registrable with an RDMA protection domain, and given back to the kernel
//! (not just to the C heap) when the pool trims them.
//!
//! # The budget
//!
//! A pool has one limit, `max_bytes` (the `iobuf_set_options` RPC), on the memory it maps:
//! buffers in use plus buffers kept for reuse. Two ways to get a buffer:
//!
//! * [`Pool::try_alloc`] — *budgeted*, for memory an initiator can make the target pin
//!   (write data it solicits). When the budget is spent it returns `None` and queues the
//!   caller, who retries on its next poll; callers are served strictly in order (a
//!   [`Waiter`] holds the place; dropping it leaves the queue). A command waits for its
//!   buffer, it never fails for lack of one, and the memory stays bounded whatever the
//!   initiators send.
//! * [`IoBuf::alloc`] — *unbudgeted*, for buffers the target sizes itself and releases on
//!   its own schedule (read data the device is filling, control data). Always succeeds; it
//!   counts towards the budget, so budgeted requests see less room while it is held.
//!
//! # Fair shares
//!
//! Budgeted requests are charged to an [`Account`] (one per connection) with
//! [`Pool::try_alloc_for`], and two rules keep one initiator, or a few, from taking the
//! budget from everyone else (an initiator that never answers its R2Ts pins what it was
//! given until the Data-Out timeout fails its command):
//!
//! * **The share** (`max_buffer_share_percent`, 25 % by default): an account holding
//!   budgeted memory takes no more than this part of the budget; beyond it, it waits outside
//!   the queue until its own buffers come back. An account holding nothing may take one
//!   request of any size (up to the largest transfer), so that every command can run.
//! * **The reserve** (`buffer_reserve_percent`, 15 % by default, at most what leaves the
//!   largest transfer room): the last part of the budget, kept for accounts that hold little
//!   (at most a quarter of the reserve, this request included). Everyone else's requests see
//!   a budget without the part of the reserve not in use; an account holding little takes
//!   from the reserve when the rest is spent, or others wait, passing the queue: a big
//!   waiter at its head (a 32 MiB write) does not stop the small I/O of other connections,
//!   and its own place is not taken, since the reserve is never its room.
//!
//! Size classes: powers of two from 4 KiB to 1 MiB, then whole MiB up to 32 MiB (the
//! largest transfer riser takes). Larger buffers are mapped for each use.

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crossbeam_queue::ArrayQueue;
use memmap2::MmapMut;

mod iobuf;

use iobuf::Backing;
pub use iobuf::{take_vec, IoBuf, MAX_SPARE_VEC};

/// The alignment of every buffer, and the granularity of sizes.
pub const PAGE: usize = 4096;
const MIB: usize = 1 << 20;
/// The largest pooled size class.
pub const MAX_POOLED: usize = 32 * MIB;
/// The default budget: room for one largest transfer and change. A node that serves many
/// initiators with large writes raises it with `iobuf_set_options`.
pub const DEFAULT_MAX_BYTES: usize = 48 * MIB;
/// The smallest budget `set_max_bytes` accepts: one largest transfer must always fit.
pub const MIN_MAX_BYTES: usize = MAX_POOLED;
/// The default share: an account holding budgeted memory takes at most this percentage of
/// the budget (see the crate docs, "Fair shares").
pub const DEFAULT_SHARE_PERCENT: u32 = 25;
/// The default reserve: this percentage of the budget is kept for accounts holding little.
pub const DEFAULT_RESERVE_PERCENT: u32 = 15;
/// The largest reserve `set_shares` accepts, in percent of the budget.
pub const MAX_RESERVE_PERCENT: u32 = 50;

/// 4 KiB, 8 KiB, ... 1 MiB.
const SMALL_CLASSES: usize = 9;
/// The small classes, then 2 MiB, 3 MiB, ... 32 MiB.
const CLASSES: usize = SMALL_CLASSES + MAX_POOLED / MIB - 1;

/// The size class of a buffer of `len` bytes, or `None` above [`MAX_POOLED`].
fn class_of(len: usize) -> Option<usize> {
    if len <= PAGE {
        Some(0)
    } else if len <= MIB {
        Some((len.next_power_of_two().trailing_zeros() - PAGE.trailing_zeros()) as usize)
    } else if len <= MAX_POOLED {
        Some(SMALL_CLASSES - 2 + len.div_ceil(MIB))
    } else {
        None
    }
}

/// The bytes a buffer of class `c` maps.
fn class_size(c: usize) -> usize {
    if c < SMALL_CLASSES {
        PAGE << c
    } else {
        (c + 2 - SMALL_CLASSES) * MIB
    }
}

/// What a buffer of `len` bytes maps: its class size, or `len` rounded up to pages.
fn mapped_size(len: usize) -> usize {
    class_of(len).map_or_else(|| len.div_ceil(PAGE) * PAGE, class_size)
}

/// `pct` (at most 100) percent of `bytes`, rounded down; without overflow, and without a
/// 128-bit division (it runs on every budgeted allocation).
fn percent_of(bytes: usize, pct: usize) -> usize {
    bytes / 100 * pct + bytes % 100 * pct / 100
}

/// How many free buffers a class keeps at most (beyond that they are unmapped).
fn class_capacity(c: usize) -> usize {
    if c < SMALL_CLASSES {
        2048
    } else {
        64
    }
}

/// A registration of a mapping with some device (an RDMA protection domain): its key
/// (lkey) and the guard whose drop undoes it.
struct Registration {
    domain: usize,
    key: u32,
    _guard: Box<dyn Any + Send + Sync>,
}

/// One mapping and what it is registered with, boxed once when mapped (an [`IoBuf`] holds
/// the box, the pool keeps it for reuse). The registrations are declared first, so they are
/// dropped (deregistered) before the memory is unmapped. While a buffer holds it, it also
/// records what that buffer must give back when dropped (its account's charge, its part
/// of the reserve); both are cleared when it goes back to the pool.
struct Mapping {
    regs: Vec<Registration>,
    map: MmapMut,
    pool: &'static Pool,
    /// The account charged with this mapping's size ([`Pool::try_alloc_for`]).
    account: Option<Account>,
    /// Bytes of the pool's reserve the buffer holds (0: none).
    reserved: usize,
    /// How many leading bytes are known to be zero ([`IoBuf::fill_zero`]): all of a new
    /// mapping (the kernel maps zeros), or what the last fill zeroed. Kept through reuse;
    /// 0 from the moment anything that could write to the bytes is handed out (a mutable
    /// slice, any pointer, a registration). Atomic only because [`IoBuf::as_ptr`] takes
    /// `&self`; one buffer is used by one thread at a time.
    zeroed: AtomicUsize,
}

impl Mapping {
    fn new(map: MmapMut, pool: &'static Pool) -> Box<Mapping> {
        let zeroed = AtomicUsize::new(map.len());
        Box::new(Mapping { regs: Vec::new(), map, pool, account: None, reserved: 0, zeroed })
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// What a request to [`Pool::take`] may fill.
#[derive(Clone, Copy)]
enum Limit {
    /// Nothing: an unbudgeted buffer.
    Unbudgeted,
    /// The budget less the part of the reserve not in use ([`Pool::general_limit`]).
    General,
    /// The whole budget (a request the reserve has room for).
    Budget,
}

/// A pool of buffers under one budget. riser uses the process-wide [`Pool::global`];
/// separate pools exist for tests.
pub struct Pool {
    max: AtomicUsize,
    /// Bytes mapped: buffers in use and buffers kept free.
    mapped: AtomicUsize,
    in_use: AtomicUsize,
    /// The most `in_use` has been since start.
    peak_in_use: AtomicUsize,
    cached: AtomicUsize,
    free: Vec<ArrayQueue<Box<Mapping>>>,
    waiters: Mutex<VecDeque<u64>>,
    /// `waiters.len()`, readable without the lock (the fast path checks it).
    waiting: AtomicUsize,
    next_waiter: AtomicU64,
    maps: AtomicU64,
    unmaps: AtomicU64,
    reuses: AtomicU64,
    waits: AtomicU64,
    /// The fair share of one account, in percent of the budget.
    share_pct: AtomicUsize,
    /// [`share_bytes`](Self::share_bytes), worked out when the budget or the share is set
    /// (every budgeted allocation reads it).
    share: AtomicUsize,
    /// The reserve for accounts holding little, in percent of the budget.
    reserve_pct: AtomicUsize,
    /// Bytes of buffers in use that were taken from the reserve.
    reserved_in_use: AtomicUsize,
    reserve_grants: AtomicU64,
    /// Whether threads keep a few small buffers of this pool for themselves ([`LocalCache`]):
    /// the global pool does, so that a reactor's 4 KiB I/O takes and gives back its buffer
    /// without touching shared counters or queues.
    thread_cache: bool,
    /// Bumped by [`trim`](Self::trim): threads drop what their caches hold when they see it.
    trim_gen: AtomicU64,
}

static GLOBAL: LazyLock<Pool> = LazyLock::new(|| Pool { thread_cache: true, ..Pool::new(DEFAULT_MAX_BYTES) });

/// Size classes a thread keeps buffers of (4 KiB to 128 KiB) and the bytes it keeps per class.
const LOCAL_CLASSES: usize = 6;
const LOCAL_BYTES_PER_CLASS: usize = 256 * 1024;

/// A thread's own free buffers of the global pool's small classes, none registered with a
/// device. They stay counted as in use (and mapped, so under the budget): taking and giving
/// back one touches nothing shared. Bounded (1.5 MiB a thread); emptied when the pool is
/// trimmed, and at thread exit.
#[derive(Default)]
struct LocalCache {
    trim_gen: u64,
    /// Boxed: an [`IoBuf`] holds the box, which goes back and forth without re-boxing.
    #[allow(clippy::vec_box)]
    free: [Vec<Box<Mapping>>; LOCAL_CLASSES],
    /// Reuses from this cache not yet added to the pool's shared counter (it is added to in
    /// batches of [`LOCAL_REUSE_BATCH`]: no shared read-modify-write per buffer).
    reuses: u64,
}

/// How many reuses a thread's cache counts before it adds them to the pool's figure.
const LOCAL_REUSE_BATCH: u64 = 64;

impl LocalCache {
    /// Empties the cache if the pool was trimmed since it last looked.
    #[inline]
    fn check_trim(&mut self, pool: &Pool) {
        let g = pool.trim_gen.load(Ordering::Relaxed);
        if g != self.trim_gen {
            self.trimmed(pool, g);
        }
    }

    #[cold]
    fn trimmed(&mut self, pool: &Pool, g: u64) {
        self.trim_gen = g;
        for m in self.free.iter_mut().flat_map(|f| f.drain(..)) {
            pool.unmap_in_use(m);
        }
    }

    /// A buffer of class `c` from this cache, counted as a reuse of `pool`'s.
    #[inline]
    fn take(&mut self, pool: &Pool, c: usize) -> Option<Box<Mapping>> {
        self.check_trim(pool);
        let m = self.free[c].pop()?;
        self.reuses += 1;
        if self.reuses >= LOCAL_REUSE_BATCH {
            pool.reuses.fetch_add(self.reuses, Ordering::Relaxed);
            self.reuses = 0;
        }
        Some(m)
    }
}

impl Drop for LocalCache {
    fn drop(&mut self) {
        let pool = Pool::global();
        pool.reuses.fetch_add(self.reuses, Ordering::Relaxed);
        for m in self.free.iter_mut().flat_map(|f| f.drain(..)) {
            pool.in_use.fetch_sub(m.len(), Ordering::Relaxed);
            pool.give_back_shared(m);
        }
    }
}

thread_local! {
    static LOCAL: std::cell::RefCell<LocalCache> = std::cell::RefCell::new(LocalCache::default());
}

/// Figures for `iobuf_get_stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub max_bytes: usize,
    /// Bytes mapped now: in use plus kept for reuse.
    pub mapped_bytes: usize,
    /// Bytes in buffers in use, or kept by a reactor thread for its next small I/O (at most
    /// 1.5 MiB a thread).
    pub in_use_bytes: usize,
    /// The most bytes ever in use at once, since start: what the I/O actually needed.
    pub peak_in_use_bytes: usize,
    /// Bytes kept for reuse by any thread.
    pub cached_bytes: usize,
    /// Requests waiting for budget now.
    pub waiting: usize,
    /// Requests that had to wait for budget, since start.
    pub waits: u64,
    /// The reserve for connections holding little (see the crate docs), and what of it is in
    /// use now.
    pub reserve_bytes: usize,
    pub reserve_in_use_bytes: usize,
    /// Requests served from the reserve, since start.
    pub reserve_grants: u64,
    /// Buffers mapped, reused from the pool, and unmapped, since start (a reactor thread adds
    /// the reuses from its own small cache in batches of 64).
    pub maps: u64,
    pub reuses: u64,
    pub unmaps: u64,
}

/// The budgeted bytes one owner (a connection) holds across the buffers it took with
/// [`Pool::try_alloc_for`]; each buffer gives its share back when dropped. Cloning shares it.
#[derive(Clone, Default, Debug)]
pub struct Account(std::sync::Arc<AtomicUsize>);

impl Account {
    pub fn new() -> Account {
        Account::default()
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A place in the queue for budgeted memory ([`Pool::try_alloc`]). Dropping it gives the
/// place up (the task was aborted, the connection closed).
pub struct Waiter {
    pool: &'static Pool,
    id: u64,
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter").field("id", &self.id).finish()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut q = self.pool.queue();
        if let Some(i) = q.iter().position(|&w| w == self.id) {
            q.remove(i);
        }
        self.pool.waiting.store(q.len(), Ordering::Release);
    }
}

impl Pool {
    /// A pool with a budget of `max_bytes`.
    pub fn new(max_bytes: usize) -> Pool {
        Pool {
            max: AtomicUsize::new(max_bytes),
            mapped: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            peak_in_use: AtomicUsize::new(0),
            cached: AtomicUsize::new(0),
            free: (0..CLASSES).map(|c| ArrayQueue::new(class_capacity(c))).collect(),
            waiters: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
            next_waiter: AtomicU64::new(1),
            maps: AtomicU64::new(0),
            unmaps: AtomicU64::new(0),
            reuses: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            share_pct: AtomicUsize::new(DEFAULT_SHARE_PERCENT as usize),
            share: AtomicUsize::new(percent_of(max_bytes, DEFAULT_SHARE_PERCENT as usize)),
            reserve_pct: AtomicUsize::new(DEFAULT_RESERVE_PERCENT as usize),
            reserved_in_use: AtomicUsize::new(0),
            reserve_grants: AtomicU64::new(0),
            thread_cache: false,
            trim_gen: AtomicU64::new(0),
        }
    }

    /// The process-wide pool every riser buffer comes from.
    pub fn global() -> &'static Pool {
        &GLOBAL
    }

    pub fn max_bytes(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// Sets the budget (at least [`MIN_MAX_BYTES`]); buffers kept for reuse beyond it are
    /// unmapped now, buffers in use when they come back.
    pub fn set_max_bytes(&self, max_bytes: usize) -> Result<(), String> {
        if max_bytes < MIN_MAX_BYTES {
            return Err(format!(
                "max_bytes {max_bytes} is below {MIN_MAX_BYTES} (32 MiB, the largest transfer must fit)"
            ));
        }
        self.max.store(max_bytes, Ordering::Relaxed);
        self.update_share();
        while self.mapped.load(Ordering::Relaxed) > max_bytes && self.trim_one() {}
        log::info!("I/O buffer budget set to {} MiB", max_bytes / MIB);
        Ok(())
    }

    /// Sets the fair-share rules (see the crate docs): an account holding budgeted memory
    /// takes at most `share_percent` (1..=100) of the budget; `reserve_percent`
    /// (0..=[`MAX_RESERVE_PERCENT`]) of it is kept for accounts holding little.
    pub fn set_shares(&self, share_percent: u32, reserve_percent: u32) -> Result<(), String> {
        if !(1..=100).contains(&share_percent) {
            return Err(format!("max_buffer_share_percent {share_percent} is out of range (1..=100)"));
        }
        if reserve_percent > MAX_RESERVE_PERCENT {
            return Err(format!("buffer_reserve_percent {reserve_percent} is out of range (0..={MAX_RESERVE_PERCENT})"));
        }
        self.share_pct.store(share_percent as usize, Ordering::Relaxed);
        self.update_share();
        self.reserve_pct.store(reserve_percent as usize, Ordering::Relaxed);
        log::info!(
            "I/O buffer shares: a connection holds at most {share_percent}% of the budget ({} KiB), {} KiB are kept for connections holding little",
            self.share_bytes() / 1024,
            self.reserve_bytes() / 1024
        );
        Ok(())
    }

    /// `(share, reserve)` in percent of the budget.
    pub fn shares(&self) -> (u32, u32) {
        (self.share_pct.load(Ordering::Relaxed) as u32, self.reserve_pct.load(Ordering::Relaxed) as u32)
    }

    /// The most an account holding budgeted memory may hold.
    pub fn share_bytes(&self) -> usize {
        self.share.load(Ordering::Relaxed)
    }

    fn update_share(&self) {
        self.share.store(percent_of(self.max_bytes(), self.share_pct.load(Ordering::Relaxed)), Ordering::Relaxed);
    }

    /// The reserve: its percentage of the budget, but never so much that the largest
    /// transfer would not fit in the rest (a budget of 32 MiB has none).
    pub fn reserve_bytes(&self) -> usize {
        let max = self.max_bytes();
        percent_of(max, self.reserve_pct.load(Ordering::Relaxed)).min(max.saturating_sub(MAX_POOLED))
    }

    /// An account "holds little", and may use the reserve, while it holds at most this
    /// (the request included): a quarter of the reserve, so that several such connections
    /// are served from it at once.
    fn little_bytes(&self) -> usize {
        self.reserve_bytes() / 4
    }

    /// What requests not taken from the reserve may fill: the budget less the part of the
    /// reserve not in use.
    fn general_limit(&self) -> usize {
        let r = self.reserve_bytes();
        self.max_bytes() - r.saturating_sub(self.reserved_in_use.load(Ordering::Relaxed))
    }

    /// `size` more bytes in use (and the peak).
    fn note_in_use(&self, size: usize) {
        let now = self.in_use.fetch_add(size, Ordering::Relaxed) + size;
        self.peak_in_use.fetch_max(now, Ordering::Relaxed);
    }

    pub fn stats(&self) -> Stats {
        Stats {
            max_bytes: self.max_bytes(),
            mapped_bytes: self.mapped.load(Ordering::Relaxed),
            in_use_bytes: self.in_use.load(Ordering::Relaxed),
            peak_in_use_bytes: self.peak_in_use.load(Ordering::Relaxed),
            cached_bytes: self.cached.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            reserve_bytes: self.reserve_bytes(),
            reserve_in_use_bytes: self.reserved_in_use.load(Ordering::Relaxed),
            reserve_grants: self.reserve_grants.load(Ordering::Relaxed),
            maps: self.maps.load(Ordering::Relaxed),
            reuses: self.reuses.load(Ordering::Relaxed),
            unmaps: self.unmaps.load(Ordering::Relaxed),
        }
    }

    /// Unmaps every buffer kept for reuse (threads' own small caches when each next uses
    /// the pool).
    pub fn trim(&self) {
        self.trim_gen.fetch_add(1, Ordering::Relaxed);
        while self.trim_one() {}
    }

    fn queue(&self) -> MutexGuard<'_, VecDeque<u64>> {
        // The queue holds plain ids: a panic elsewhere cannot leave it inconsistent.
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A budgeted buffer of `len` bytes, or `None` (the budget is spent): then `waiter`
    /// holds the caller's place in the queue and the caller retries later with the same
    /// `waiter`. Served in order: while others wait, a newcomer waits behind them. It does
    /// not take the reserve (see the crate docs): that is [`try_alloc_for`](Self::try_alloc_for)'s,
    /// for accounts holding little.
    pub fn try_alloc(&'static self, len: usize, waiter: &mut Option<Waiter>) -> Option<IoBuf> {
        if waiter.is_none() && self.waiting.load(Ordering::Acquire) == 0 {
            if let Some(map) = self.take(len, Limit::General) {
                return Some(Self::buf(map, len));
            }
        }
        let mut q = self.queue();
        let id = match waiter {
            Some(w) => w.id,
            None => {
                let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
                q.push_back(id);
                self.waiting.store(q.len(), Ordering::Release);
                self.waits.fetch_add(1, Ordering::Relaxed);
                *waiter = Some(Waiter { pool: self, id });
                id
            }
        };
        if q.front() != Some(&id) {
            return None;
        }
        let map = self.take(len, Limit::General)?;
        q.pop_front();
        self.waiting.store(q.len(), Ordering::Release);
        drop(q);
        // Served: the place is already out of the queue.
        if let Some(w) = waiter.take() {
            std::mem::forget(w);
        }
        Some(Self::buf(map, len))
    }

    fn buf(map: Option<Box<Mapping>>, len: usize) -> IoBuf {
        match map {
            Some(m) => IoBuf { backing: Backing::Map(m), len },
            None => IoBuf::empty(),
        }
    }

    /// A buffer from the reserve, or `None` when the reserve (or the budget) has no room
    /// for it. The caller checked that its account holds little.
    fn take_reserved(&'static self, len: usize) -> Option<IoBuf> {
        let size = mapped_size(len);
        let r = self.reserve_bytes();
        let mut cur = self.reserved_in_use.load(Ordering::Relaxed);
        loop {
            if cur + size > r {
                return None;
            }
            match self.reserved_in_use.compare_exchange_weak(cur, cur + size, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        match self.take(len, Limit::Budget) {
            Some(Some(mut map)) => {
                self.reserve_grants.fetch_add(1, Ordering::Relaxed);
                map.reserved = size;
                Some(Self::buf(Some(map), len))
            }
            // An empty buffer maps nothing: it holds no reserve.
            Some(None) => {
                self.reserved_in_use.fetch_sub(size, Ordering::Relaxed);
                self.reserve_grants.fetch_add(1, Ordering::Relaxed);
                Some(IoBuf::empty())
            }
            None => {
                self.reserved_in_use.fetch_sub(size, Ordering::Relaxed);
                None
            }
        }
    }

    /// Charges `b` to `account` until it is dropped.
    fn charge(b: IoBuf, account: &Account) -> IoBuf {
        let mut b = b;
        // An empty buffer maps nothing and is charged nothing.
        if let Backing::Map(m) = &mut b.backing {
            account.0.fetch_add(m.len(), Ordering::Relaxed);
            m.account = Some(account.clone());
        }
        b
    }

    /// Like [`try_alloc`](Self::try_alloc), charging the buffer to `account` until it is
    /// dropped; and fair (see the crate docs, "Fair shares"): an account that already holds
    /// budgeted memory takes no more than its share of the budget (it waits, outside the
    /// queue, until its own buffers come back), so one slow initiator cannot hold all of it;
    /// a request larger than that goes when its account holds nothing. An account holding
    /// little takes from the reserve when the rest of the budget is spent or others wait
    /// before it: past the queue, so a big request waiting at its head does not hold up the
    /// small I/O of other connections.
    pub fn try_alloc_for(&'static self, len: usize, waiter: &mut Option<Waiter>, account: &Account) -> Option<IoBuf> {
        let held = account.held();
        let size = mapped_size(len);
        if held > 0 && held + size > self.share_bytes() {
            *waiter = None;
            return None;
        }
        // The common case first, in line: nobody waits, and this thread keeps a buffer of
        // the class (what `try_alloc` would take, through `take`, without the calls).
        if len > 0 && waiter.is_none() && self.thread_cache && self.waiting.load(Ordering::Acquire) == 0 {
            if let Some(c) = class_of(len).filter(|&c| c < LOCAL_CLASSES) {
                if let Ok(Some(m)) = LOCAL.try_with(|l| l.borrow_mut().take(self, c)) {
                    return Some(Self::charge(Self::buf(Some(m), len), account));
                }
            }
        }
        let queued = waiter.is_some() || self.waiting.load(Ordering::Acquire) != 0;
        if queued && held + size <= self.little_bytes() {
            if let Some(b) = self.take_reserved(len) {
                *waiter = None;
                return Some(Self::charge(b, account));
            }
        }
        if let Some(b) = self.try_alloc(len, waiter) {
            return Some(Self::charge(b, account));
        }
        if !queued && held + size <= self.little_bytes() {
            if let Some(b) = self.take_reserved(len) {
                // Leaves the queue it just joined.
                *waiter = None;
                return Some(Self::charge(b, account));
            }
        }
        None
    }

    /// Like [`try_alloc_for`](Self::try_alloc_for), but now or never: `None`, without
    /// taking a place in the queue, when the account's fair share is spent, or the budget
    /// has no room or others already wait (and the account does not hold little enough for
    /// the reserve). For data that has arrived already and can wait elsewhere (immediate
    /// data: copied straight into its task's buffer when there is room for it, else kept in
    /// its segment while the task queues with `try_alloc_for`).
    pub fn try_alloc_now_for(&'static self, len: usize, account: &Account) -> Option<IoBuf> {
        let held = account.held();
        let size = mapped_size(len);
        if held > 0 && held + size > self.share_bytes() {
            return None;
        }
        if self.waiting.load(Ordering::Acquire) == 0 {
            if let Some(map) = self.take(len, Limit::General) {
                return Some(Self::charge(Self::buf(map, len), account));
            }
        }
        if held + size <= self.little_bytes() {
            return self.take_reserved(len).map(|b| Self::charge(b, account));
        }
        None
    }

    /// An unbudgeted buffer (see the crate docs).
    pub fn alloc(&'static self, len: usize) -> IoBuf {
        match self.take(len, Limit::Unbudgeted) {
            Some(map) => Self::buf(map, len),
            // Out of address space or memory: what a failed heap allocation does too.
            None => panic!("cannot map an I/O buffer of {len} bytes"),
        }
    }

    /// A mapping for `len` bytes: a kept one of its class, or a new one (trimming kept
    /// buffers of other classes to make room), or `None`. `limit`: a budgeted request gets
    /// nothing when the bytes in use would go over its limit (a buffer this thread keeps for
    /// itself is in use already, and taken whatever the limit).
    fn take(&'static self, len: usize, limit: Limit) -> Option<Option<Box<Mapping>>> {
        if len == 0 {
            return Some(None);
        }
        let size = mapped_size(len);
        let class = class_of(len);
        if let Some(c) = class {
            if self.thread_cache && c < LOCAL_CLASSES {
                if let Ok(Some(m)) = LOCAL.try_with(|l| l.borrow_mut().take(self, c)) {
                    return Some(Some(m));
                }
            }
        }
        let max = self.max_bytes();
        // Worked out only now: a buffer from this thread's cache needs none of it.
        let limit = match limit {
            Limit::Unbudgeted => None,
            Limit::General => Some(self.general_limit()),
            Limit::Budget => Some(max),
        };
        if let Some(limit) = limit {
            let in_use = self.in_use.load(Ordering::Relaxed);
            // A buffer larger than the whole budget is let through when nothing is in use,
            // so that it cannot wait forever.
            if in_use + size > limit && !(size > max && in_use == 0) {
                return None;
            }
        }
        if let Some(c) = class {
            if let Some(m) = self.free[c].pop() {
                self.cached.fetch_sub(size, Ordering::Relaxed);
                self.note_in_use(size);
                self.reuses.fetch_add(1, Ordering::Relaxed);
                return Some(Some(m));
            }
        }
        loop {
            let m = self.mapped.load(Ordering::Relaxed);
            let fits = m + size <= max || (size > max && self.in_use.load(Ordering::Relaxed) == 0);
            if limit.is_none() || fits {
                if self.mapped.compare_exchange(m, m + size, Ordering::Relaxed, Ordering::Relaxed).is_err() {
                    continue;
                }
                return match MmapMut::map_anon(size) {
                    Ok(map) => {
                        self.note_in_use(size);
                        self.maps.fetch_add(1, Ordering::Relaxed);
                        Some(Some(Mapping::new(map, self)))
                    }
                    Err(e) => {
                        self.mapped.fetch_sub(size, Ordering::Relaxed);
                        log::error!("cannot map an I/O buffer of {size} bytes: {e}");
                        None
                    }
                };
            }
            if !self.trim_one() {
                return None;
            }
        }
    }

    /// Unmaps one kept buffer, the largest first; false if none is kept.
    fn trim_one(&self) -> bool {
        for c in (0..CLASSES).rev() {
            if let Some(m) = self.free[c].pop() {
                let size = class_size(c);
                self.cached.fetch_sub(size, Ordering::Relaxed);
                self.mapped.fetch_sub(size, Ordering::Relaxed);
                self.unmaps.fetch_add(1, Ordering::Relaxed);
                drop(m);
                return true;
            }
        }
        false
    }

    /// A buffer came back: keep it for reuse if its class has room and the budget allows
    /// (first in this thread's own cache).
    fn give_back(&self, map: Box<Mapping>) {
        let size = map.len();
        let map = match class_of(size) {
            // Registered buffers (iSER, io_uring fixed buffers) go back to the shared queues,
            // which a trim (a device going away) empties at once: a thread's cache could hold
            // a registration, and with it the device, until that thread next does I/O.
            Some(c) if self.thread_cache && c < LOCAL_CLASSES && class_size(c) == size && map.regs.is_empty() => {
                let within = self.mapped.load(Ordering::Relaxed) <= self.max_bytes();
                let mut slot = Some(map);
                let _ = LOCAL.try_with(|l| {
                    let mut l = l.borrow_mut();
                    l.check_trim(self);
                    let f = &mut l.free[c];
                    if within && (f.len() + 1) * size <= LOCAL_BYTES_PER_CLASS {
                        if let Some(m) = slot.take() {
                            f.push(m);
                        }
                    }
                });
                match slot {
                    None => return,
                    Some(m) => m,
                }
            }
            _ => map,
        };
        self.in_use.fetch_sub(size, Ordering::Relaxed);
        self.give_back_shared(map);
    }

    /// A buffer in use is unmapped (a thread's cache emptied after a trim).
    fn unmap_in_use(&self, map: Box<Mapping>) {
        let size = map.len();
        self.in_use.fetch_sub(size, Ordering::Relaxed);
        self.mapped.fetch_sub(size, Ordering::Relaxed);
        self.unmaps.fetch_add(1, Ordering::Relaxed);
        drop(map);
    }

    /// A buffer no longer counted in use: into the shared free queue of its class, or
    /// unmapped.
    fn give_back_shared(&self, map: Box<Mapping>) {
        let size = map.len();
        let keep = class_of(size).filter(|&c| class_size(c) == size && self.mapped.load(Ordering::Relaxed) <= self.max_bytes());
        let map = match keep {
            Some(c) => {
                // Counted before it can be taken again, so the figures never wrap.
                self.cached.fetch_add(size, Ordering::Relaxed);
                match self.free[c].push(map) {
                    Ok(()) => return,
                    Err(map) => {
                        self.cached.fetch_sub(size, Ordering::Relaxed);
                        map
                    }
                }
            }
            None => map,
        };
        self.mapped.fetch_sub(size, Ordering::Relaxed);
        self.unmaps.fetch_add(1, Ordering::Relaxed);
        drop(map);
    }
}

#[cfg(test)]
mod tests;
