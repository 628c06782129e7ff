//! The reactor loop, its context and the handle other threads use to reach it.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use rustix::event::epoll;
use thiserror::Error;

use crate::stats::Stats;
pub use crate::stats::ReactorStatsSnapshot;
use crate::wake::{arm_wake_sources, check_readiness, signalled_waits, wait_readable, WakeSet, SIGNALLED_SLEEP, WAKE};
pub use crate::wake::{add_ready_fd, add_wake_fd, fd_drained, fd_readable, force_epoll_readiness, remove_wake_fd, uring_readiness, SignalledWait, WakeId};

/// A unit of cross-thread work: runs once, on the reactor it was sent to.
pub type Message = Box<dyn FnOnce(&mut Ctx) + Send + 'static>;

/// How a reactor spends an idle loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// Spin forever: lowest latency, one core at 100%. The production default.
    Busy,
    /// Back off to sleeping (up to 1 ms, or until a message or timer is due) after a run of
    /// idle loops. For small machines and CI.
    Adaptive,
}

impl std::str::FromStr for PollMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "busy" => Ok(PollMode::Busy),
            "adaptive" => Ok(PollMode::Adaptive),
            _ => Err(format!("unknown poll mode {s:?}: expected busy or adaptive")),
        }
    }
}

/// What a poller says about one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollStatus {
    /// It did work (counts the loop as busy).
    Busy,
    /// It found nothing to do.
    Idle,
    /// It is finished: unregister it (it is dropped on its reactor).
    Done,
}

/// Identifies a poller on its reactor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PollerId(u64);

#[derive(Debug, Error)]
pub enum ReactorError {
    #[error("core {core} is not available on this machine (cores available: {available:?})")]
    CoreUnavailable { core: usize, available: Vec<usize> },
    #[error("no cores given")]
    NoCores,
    #[error("failed to spawn reactor thread: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("cannot create a reactor's wake-up descriptors (eventfd, epoll): {0}")]
    Wake(rustix::io::Errno),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SendError {
    #[error("reactor {0} does not exist")]
    NoSuchReactor(usize),
    #[error("message ring of reactor {0} is full")]
    Full(usize),
    #[error("reactors are shutting down")]
    Stopped,
}

/// Settings for [`ReactorSet::start`].
#[derive(Clone, Debug)]
pub struct ReactorConfig {
    /// One reactor per entry, pinned to that core.
    pub cores: Vec<usize>,
    pub mode: PollMode,
    /// Capacity of each reactor's message ring.
    pub ring_size: usize,
    /// Pin each thread to its core (turn off only in tests on machines with fewer cores).
    pub pin: bool,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig { cores: vec![0], mode: PollMode::Busy, ring_size: 4096, pin: true }
    }
}

struct Shared {
    rings: Vec<ArrayQueue<Message>>,
    threads: Vec<OnceLock<Thread>>,
    /// Per reactor: the eventfd that wakes it from an adaptive sleep (it is in the
    /// reactor's epoll set with the descriptors its pollers registered).
    wakes: Vec<OwnedFd>,
    stats: Vec<Stats>,
    cores: Vec<usize>,
    mode: PollMode,
    stop: AtomicBool,
}

impl Shared {
    /// Ends reactor `id`'s adaptive sleep (if it sleeps; otherwise its next sleep is short).
    fn wake(&self, id: usize) {
        if let Some(fd) = self.wakes.get(id) {
            // EAGAIN (the counter is full) still leaves it readable: nothing is lost.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
        if let Some(t) = self.threads.get(id).and_then(OnceLock::get) {
            t.unpark();
        }
    }
}

thread_local! {
    /// On a reactor thread: the reactors and this one's index.
    static CURRENT: RefCell<Option<(Arc<Shared>, usize)>> = const { RefCell::new(None) };
}

/// Wakes one thread from another: the reactor it was made on, from an adaptive sleep, or
/// (made on another thread) that thread, with [`Thread::unpark`].
#[derive(Clone)]
pub struct Waker(WakerKind);

#[derive(Clone)]
enum WakerKind {
    Reactor(Arc<Shared>, usize),
    Thread(Thread),
}

/// A [`Waker`] for the calling thread (a reactor, or any thread that parks).
pub fn current_waker() -> Waker {
    CURRENT.with(|c| match c.borrow().as_ref() {
        Some((sh, id)) => Waker(WakerKind::Reactor(sh.clone(), *id)),
        None => Waker(WakerKind::Thread(thread::current())),
    })
}

impl Waker {
    pub fn wake(&self) {
        match &self.0 {
            WakerKind::Reactor(sh, id) => sh.wake(*id),
            WakerKind::Thread(t) => t.unpark(),
        }
    }
}

/// A cheap, cloneable, thread-safe way to reach the reactors.
#[derive(Clone)]
pub struct ReactorHandle {
    shared: Arc<Shared>,
}

impl ReactorHandle {
    /// Number of reactors.
    pub fn len(&self) -> usize {
        self.shared.rings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shared.rings.is_empty()
    }

    pub fn mode(&self) -> PollMode {
        self.shared.mode
    }

    /// Queues `f` to run on reactor `reactor`. Messages from one sender arrive in order.
    pub fn send<F>(&self, reactor: usize, f: F) -> Result<(), SendError>
    where
        F: FnOnce(&mut Ctx) + Send + 'static,
    {
        self.send_boxed(reactor, Box::new(f)).map_err(|(e, _)| e)
    }

    /// Like [`send`](Self::send) but gives the message back when the ring is full.
    pub fn send_boxed(&self, reactor: usize, msg: Message) -> Result<(), (SendError, Message)> {
        let sh = &self.shared;
        let Some(ring) = sh.rings.get(reactor) else {
            return Err((SendError::NoSuchReactor(reactor), msg));
        };
        if sh.stop.load(Ordering::Acquire) {
            return Err((SendError::Stopped, msg));
        }
        ring.push(msg).map_err(|m| (SendError::Full(reactor), m))?;
        // Pairs with the fence in the reactor's sleep path: either it sees our message or
        // we see its `sleeping` flag and wake it.
        fence(Ordering::SeqCst);
        if sh.stats[reactor].sleeping.load(Ordering::Relaxed) {
            sh.wake(reactor);
        }
        Ok(())
    }

    /// Sends, waiting (yielding) while the ring is full. For control-plane threads only.
    pub fn send_blocking<F>(&self, reactor: usize, f: F) -> Result<(), SendError>
    where
        F: FnOnce(&mut Ctx) + Send + 'static,
    {
        let mut msg: Message = Box::new(f);
        loop {
            match self.send_boxed(reactor, msg) {
                Ok(()) => return Ok(()),
                Err((SendError::Full(_), m)) => {
                    msg = m;
                    thread::yield_now();
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Runs `f` on reactor `reactor` and waits for its result. Control plane only: never
    /// call it from a reactor (it would wait on itself).
    pub fn call<R, F>(&self, reactor: usize, f: F) -> Result<R, SendError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Ctx) -> R + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send_blocking(reactor, move |ctx| {
            let _ = tx.send(f(ctx));
        })?;
        rx.recv().map_err(|_| SendError::Stopped)
    }

    /// The reactor with the smallest application load (ties: lowest index).
    pub fn least_loaded(&self) -> usize {
        (0..self.len()).min_by_key(|&i| self.shared.stats[i].load.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// Adds `delta` to a reactor's application load counter (see [`least_loaded`](Self::least_loaded)).
    pub fn add_load(&self, reactor: usize, delta: isize) {
        if let Some(s) = self.shared.stats.get(reactor) {
            if delta >= 0 {
                s.load.fetch_add(delta as usize, Ordering::Relaxed);
            } else {
                let d = delta.unsigned_abs();
                let _ = s.load.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(d)));
            }
        }
    }

    pub fn stats(&self) -> Vec<ReactorStatsSnapshot> {
        let sh = &self.shared;
        (0..self.len())
            .map(|i| {
                let s = &sh.stats[i];
                ReactorStatsSnapshot {
                    reactor: i,
                    core: sh.cores[i],
                    busy_ns: s.busy_ns.load(Ordering::Relaxed),
                    idle_ns: s.idle_ns.load(Ordering::Relaxed),
                    messages: s.messages.load(Ordering::Relaxed),
                    pollers: s.pollers.load(Ordering::Relaxed),
                    load: s.load.load(Ordering::Relaxed),
                    sleeping: s.sleeping.load(Ordering::Relaxed),
                    woken: s.woken.load(Ordering::Relaxed),
                    yields: s.yields.load(Ordering::Relaxed),
                    spin_ns: s.spin_ns.load(Ordering::Relaxed),
                    passes: s.passes.load(Ordering::Relaxed),
                    busy_passes: s.busy_passes.load(Ordering::Relaxed),
                    poller_calls: s.poller_calls.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    pub fn is_stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }
}

/// The running reactors. Dropping it shuts them down.
pub struct ReactorSet {
    handle: ReactorHandle,
    joins: Vec<JoinHandle<()>>,
}

impl ReactorSet {
    /// Starts one thread per core in `cfg.cores`, pinned when `cfg.pin`.
    pub fn start(cfg: ReactorConfig) -> Result<ReactorSet, ReactorError> {
        if cfg.cores.is_empty() {
            return Err(ReactorError::NoCores);
        }
        if cfg.pin {
            let available: Vec<usize> = core_affinity::get_core_ids().unwrap_or_default().into_iter().map(|c| c.id).collect();
            if let Some(&core) = cfg.cores.iter().find(|c| !available.contains(c)) {
                return Err(ReactorError::CoreUnavailable { core, available });
            }
        }
        let n = cfg.cores.len();
        let ring_size = cfg.ring_size.max(2);
        let mut wakes = Vec::with_capacity(n);
        let mut epolls = Vec::with_capacity(n);
        for _ in 0..n {
            let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
                .map_err(ReactorError::Wake)?;
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(ReactorError::Wake)?;
            epoll::add(&ep, &efd, epoll::EventData::new_u64(0), epoll::EventFlags::IN).map_err(ReactorError::Wake)?;
            wakes.push(efd);
            epolls.push(Some(ep));
        }
        let shared = Arc::new(Shared {
            rings: (0..n).map(|_| ArrayQueue::new(ring_size)).collect(),
            threads: (0..n).map(|_| OnceLock::new()).collect(),
            wakes,
            stats: (0..n).map(|_| Stats::default()).collect(),
            cores: cfg.cores.clone(),
            mode: cfg.mode,
            stop: AtomicBool::new(false),
        });
        let handle = ReactorHandle { shared };
        let mut set = ReactorSet { handle: handle.clone(), joins: Vec::with_capacity(n) };
        for (id, &core) in cfg.cores.iter().enumerate() {
            let h = handle.clone();
            let pin = cfg.pin;
            let ep = epolls[id].take().ok_or(ReactorError::NoCores)?;
            let join = thread::Builder::new().name(format!("reactor_{core}")).spawn(move || {
                if pin && !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                    log::warn!("reactor {id}: could not pin to core {core}");
                }
                let _ = h.shared.threads[id].set(thread::current());
                CURRENT.with(|c| *c.borrow_mut() = Some((h.shared.clone(), id)));
                let epfd = ep.as_raw_fd();
                WAKE.with(|w| *w.borrow_mut() = Some(WakeSet::new(ep)));
                Reactor::new(id, core, h, epfd).run();
                WAKE.with(|w| w.borrow_mut().take());
            })?;
            set.joins.push(join);
        }
        // Wait until every thread has registered itself so wake-ups are never lost.
        for t in &handle.shared.threads {
            while t.get().is_none() {
                thread::yield_now();
            }
        }
        log::info!("started {n} reactor(s) on cores {:?} ({:?} poll mode)", cfg.cores, cfg.mode);
        Ok(set)
    }

    pub fn handle(&self) -> ReactorHandle {
        self.handle.clone()
    }

    /// Stops every reactor: each runs what is already in its ring, lets its pollers finish
    /// in-flight work (bounded), drops its pollers and exits. Returns when all have exited.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        let sh = &self.handle.shared;
        sh.stop.store(true, Ordering::Release);
        for id in 0..sh.rings.len() {
            sh.wake(id);
        }
        for j in self.joins.drain(..) {
            if j.join().is_err() {
                log::error!("a reactor thread panicked");
            }
        }
    }
}

impl Drop for ReactorSet {
    fn drop(&mut self) {
        if !self.joins.is_empty() {
            self.stop_and_join();
        }
    }
}

type PollFn = Box<dyn FnMut(&mut Ctx) -> PollStatus>;

struct Poller {
    id: PollerId,
    f: PollFn,
}

struct Timed {
    id: PollerId,
    period: Duration,
    due: Instant,
    f: PollFn,
}

/// What code running on a reactor sees: its identity, the time of this loop, and the means
/// to register pollers and keep per-reactor objects.
pub struct Ctx {
    id: usize,
    core: usize,
    now: Instant,
    next_id: u64,
    new_pollers: Vec<Poller>,
    new_timed: Vec<Timed>,
    removed: Vec<PollerId>,
    locals: HashMap<TypeId, Box<dyn Any>>,
    handle: ReactorHandle,
}

impl Ctx {
    /// Index of this reactor in the set.
    pub fn reactor_id(&self) -> usize {
        self.id
    }

    /// The core this reactor runs on.
    pub fn core(&self) -> usize {
        self.core
    }

    /// The time at the start of this loop iteration (cheap; refreshed once per loop).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// A handle to every reactor (to send messages or move objects).
    pub fn handle(&self) -> &ReactorHandle {
        &self.handle
    }

    fn next_id(&mut self) -> PollerId {
        self.next_id += 1;
        PollerId(self.next_id)
    }

    /// Registers a poller called on every loop iteration until it returns `Done` or is removed.
    pub fn add_poller<F>(&mut self, f: F) -> PollerId
    where
        F: FnMut(&mut Ctx) -> PollStatus + 'static,
    {
        let id = self.next_id();
        self.new_pollers.push(Poller { id, f: Box::new(f) });
        id
    }

    /// Registers a poller called every `period` (first call one period from now).
    pub fn add_timed_poller<F>(&mut self, period: Duration, f: F) -> PollerId
    where
        F: FnMut(&mut Ctx) -> PollStatus + 'static,
    {
        let id = self.next_id();
        let period = period.max(Duration::from_micros(1));
        self.new_timed.push(Timed { id, period, due: self.now + period, f: Box::new(f) });
        id
    }

    /// Unregisters a poller (it is dropped at the end of this loop iteration).
    pub fn remove_poller(&mut self, id: PollerId) {
        self.removed.push(id);
    }

    /// [`add_wake_fd`] on this reactor.
    pub fn add_wake_fd(&mut self, fd: BorrowedFd<'_>, arm: impl FnMut() + 'static) -> std::io::Result<WakeId> {
        add_wake_fd(fd, arm)?.ok_or_else(|| std::io::Error::other("not on a reactor thread"))
    }

    /// [`remove_wake_fd`] on this reactor.
    pub fn remove_wake_fd(&mut self, id: WakeId) {
        remove_wake_fd(id)
    }

    /// A per-reactor object of type `T`, created by `init` on first use.
    pub fn local<T: 'static>(&mut self, init: impl FnOnce() -> T) -> &mut T {
        self.locals.entry(TypeId::of::<T>()).or_insert_with(|| Box::new(init())).downcast_mut::<T>().expect("locals are keyed by their own TypeId")
    }
}

struct Reactor {
    /// The epoll set of [`WakeSet`] (owned by the thread-local).
    epoll: RawFd,
    shared: Arc<Shared>,
    ctx: Ctx,
    pollers: Vec<Poller>,
    timed: Vec<Timed>,
    next_due: Option<Instant>,
    /// Poller calls so far (published in the stats).
    poller_calls: u64,
}

const MAX_MESSAGES_PER_LOOP: usize = 256;
const IDLE_LOOPS_BEFORE_SLEEP: u32 = 1000;
/// An adaptive reactor also sleeps once idle this long, whatever the number of loops: a slow
/// machine (a VM under emulation) would otherwise spin for milliseconds, starving the kernel
/// work (a software RDMA device, softirqs) that shares its core.
const IDLE_TIME_BEFORE_SLEEP: Duration = Duration::from_micros(50);
/// A spinning reactor idle this long gives its core to whatever else is runnable there, and
/// again after each such spell (see `Reactor::run`).
const YIELD_EVERY: Duration = Duration::from_micros(50);
/// The longest an adaptive reactor spins idle before it sleeps: its spin window starts at
/// `IDLE_TIME_BEFORE_SLEEP`, doubles while its sleeps end early (work came soon after it
/// slept: spinning on would have caught it without the wake-up) and halves while they do not,
/// as KVM's halt polling does. It matters where a pass is slow (a VM under emulation): on
/// a real core `IDLE_LOOPS_BEFORE_SLEEP` passes end the spin first.
const MAX_SPIN: Duration = Duration::from_millis(1);
const MIN_SLEEP: Duration = Duration::from_micros(50);
const MAX_SLEEP: Duration = Duration::from_millis(1);
const DRAIN_PASSES: usize = 100_000;

impl Reactor {
    fn new(id: usize, core: usize, handle: ReactorHandle, epoll: RawFd) -> Reactor {
        Reactor {
            shared: handle.shared.clone(),
            ctx: Ctx {
                id,
                core,
                now: Instant::now(),
                next_id: 0,
                new_pollers: Vec::new(),
                new_timed: Vec::new(),
                removed: Vec::new(),
                locals: HashMap::new(),
                handle,
            },
            epoll,
            pollers: Vec::new(),
            timed: Vec::new(),
            next_due: None,
            poller_calls: 0,
        }
    }

    fn stats(&self) -> &Stats {
        &self.ctx.handle.shared.stats[self.ctx.id]
    }

    /// One pass: messages, pollers, due timed pollers. Returns how much work was done.
    fn run_once(&mut self) -> usize {
        let mut work = 0;
        let ring = &self.shared.rings[self.ctx.id];
        while work < MAX_MESSAGES_PER_LOOP {
            match ring.pop() {
                Some(m) => {
                    m(&mut self.ctx);
                    work += 1;
                }
                None => break,
            }
        }
        if work > 0 {
            self.shared.stats[self.ctx.id].messages.fetch_add(work as u64, Ordering::Relaxed);
        }
        check_readiness();
        self.poller_calls += self.pollers.len() as u64;
        self.shared.stats[self.ctx.id].poller_calls.store(self.poller_calls, Ordering::Relaxed);
        let mut done = false;
        for p in self.pollers.iter_mut() {
            match (p.f)(&mut self.ctx) {
                PollStatus::Busy => work += 1,
                PollStatus::Idle => {}
                PollStatus::Done => {
                    self.ctx.removed.push(p.id);
                    done = true;
                }
            }
        }
        if let Some(due) = self.next_due {
            if self.ctx.now >= due {
                let now = self.ctx.now;
                for t in self.timed.iter_mut() {
                    if now >= t.due {
                        match (t.f)(&mut self.ctx) {
                            PollStatus::Busy => work += 1,
                            PollStatus::Idle => {}
                            PollStatus::Done => {
                                self.ctx.removed.push(t.id);
                                done = true;
                            }
                        }
                        t.due = now + t.period;
                    }
                }
                self.next_due = self.timed.iter().map(|t| t.due).min();
            }
        }
        if done || !self.ctx.removed.is_empty() || !self.ctx.new_pollers.is_empty() || !self.ctx.new_timed.is_empty() {
            self.apply_changes();
        }
        work
    }

    fn apply_changes(&mut self) {
        self.pollers.append(&mut self.ctx.new_pollers);
        self.timed.append(&mut self.ctx.new_timed);
        if !self.ctx.removed.is_empty() {
            let removed = std::mem::take(&mut self.ctx.removed);
            self.pollers.retain(|p| !removed.contains(&p.id));
            self.timed.retain(|t| !removed.contains(&t.id));
        }
        self.next_due = self.timed.iter().map(|t| t.due).min();
        self.stats().pollers.store(self.pollers.len() + self.timed.len(), Ordering::Relaxed);
    }

    fn run(mut self) {
        let sh = self.ctx.handle.shared.clone();
        let stats = &sh.stats[self.ctx.id];
        let mode = sh.mode;
        let mut last = Instant::now();
        let mut idle_loops: u32 = 0;
        let mut idle_since = last;
        let mut sleep = MIN_SLEEP;
        let mut last_yield = last;
        let mut spin = IDLE_TIME_BEFORE_SLEEP;
        stats.spin_ns.store(spin.as_nanos() as u64, Ordering::Relaxed);
        let mut yields = 0u64;
        // Counted here, published with plain stores (this thread is the only writer).
        let (mut passes, mut busy_passes) = (0u64, 0u64);
        loop {
            self.ctx.now = last;
            let work = self.run_once();
            passes += 1;
            stats.passes.store(passes, Ordering::Relaxed);
            let now = Instant::now();
            let spent = now.duration_since(last).as_nanos() as u64;
            last = now;
            if work > 0 {
                busy_passes += 1;
                stats.busy_passes.store(busy_passes, Ordering::Relaxed);
                stats.busy_ns.fetch_add(spent, Ordering::Relaxed);
                idle_loops = 0;
                idle_since = now;
                sleep = MIN_SLEEP;
            } else {
                stats.idle_ns.fetch_add(spent, Ordering::Relaxed);
                idle_loops = idle_loops.saturating_add(1);
            }
            if sh.stop.load(Ordering::Acquire) {
                break;
            }
            // (Only idle passes look at the time since the last work.)
            let idle_for = if idle_loops > 1 { now.duration_since(idle_since) } else { Duration::ZERO };
            // Work in flight that wakes the reactor by itself (SignalledWait): no spin first,
            // and the sleep ends with that work, not at the usual cap.
            let signalled = mode == PollMode::Adaptive && idle_loops > 0 && signalled_waits();
            let sleep_now = mode == PollMode::Adaptive
                && (signalled || idle_loops >= IDLE_LOOPS_BEFORE_SLEEP || (idle_loops > 1 && idle_for >= spin));
            // A reactor that spins while idle (busy mode always; adaptive mode until it sleeps)
            // yields its core now and then: kernel work deferred to this core (softirqs run by
            // ksoftirqd: a software RDMA device's tasklets, packets raised here) would otherwise
            // wait for the scheduler to preempt a thread that never blocks, milliseconds per
            // I/O. One sched_yield per 50 us of idleness, none while there is work; with
            // nothing else runnable it returns at once.
            if !sleep_now && idle_loops > 1 && idle_for >= YIELD_EVERY && now.duration_since(last_yield) >= YIELD_EVERY {
                thread::yield_now();
                last_yield = now;
                yields += 1;
                stats.yields.store(yields, Ordering::Relaxed);
            }
            if sleep_now {
                let mut timeout = if signalled { SIGNALLED_SLEEP } else { sleep };
                if let Some(due) = self.next_due {
                    timeout = timeout.min(due.saturating_duration_since(now));
                }
                stats.sleeping.store(true, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                // Arm the sources, then look once more: what came in before arming raised
                // no event.
                let late = if arm_wake_sources() {
                    passes += 1;
                    stats.passes.store(passes, Ordering::Relaxed);
                    self.run_once()
                } else {
                    0
                };
                if late > 0 {
                    busy_passes += 1;
                    stats.busy_passes.store(busy_passes, Ordering::Relaxed);
                }
                let mut woke = false;
                if late == 0 && sh.rings[self.ctx.id].is_empty() && !sh.stop.load(Ordering::Acquire) {
                    // SAFETY: the thread-local WakeSet owns this descriptor until run() returns.
                    #[allow(unsafe_code)]
                    let ep = unsafe { BorrowedFd::borrow_raw(self.epoll) };
                    woke = wait_readable(ep, timeout);
                    if woke {
                        stats.woken.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&sh.wakes[self.ctx.id], &mut b);
                }
                stats.sleeping.store(false, Ordering::Relaxed);
                let after = Instant::now();
                if !signalled {
                    // Work within MAX_SPIN of going to sleep: spin longer next time; else shorter.
                    spin = if late > 0 || (woke && after.duration_since(now) < MAX_SPIN) {
                        (spin * 2).min(MAX_SPIN)
                    } else {
                        (spin / 2).max(IDLE_TIME_BEFORE_SLEEP)
                    };
                    stats.spin_ns.store(spin.as_nanos() as u64, Ordering::Relaxed);
                }
                if late > 0 {
                    stats.busy_ns.fetch_add(after.duration_since(last).as_nanos() as u64, Ordering::Relaxed);
                    idle_loops = 0;
                    idle_since = after;
                    sleep = MIN_SLEEP;
                } else {
                    stats.idle_ns.fetch_add(after.duration_since(last).as_nanos() as u64, Ordering::Relaxed);
                    sleep = (sleep * 2).min(MAX_SLEEP);
                }
                last = after;
            }
        }
        self.drain();
    }

    /// Shutdown: run every queued message, let pollers finish in-flight work, drop them.
    fn drain(&mut self) {
        let mut passes = 0;
        loop {
            self.ctx.now = Instant::now();
            let work = self.run_once();
            passes += 1;
            if work == 0 && self.ctx.handle.shared.rings[self.ctx.id].is_empty() {
                break;
            }
            if passes >= DRAIN_PASSES {
                log::warn!("reactor {}: pollers still busy after {passes} drain passes; dropping them", self.ctx.id);
                break;
            }
        }
        self.pollers.clear();
        self.timed.clear();
        self.ctx.locals.clear();
        self.stats().pollers.store(0, Ordering::Relaxed);
        log::debug!("reactor {} stopped", self.ctx.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    /// A test poller's step: reads the eventfd; Busy (and counted in `seen`) if it had a value.
    fn eventfd_read(efd: &OwnedFd, seen: &std::sync::atomic::AtomicUsize) -> PollStatus {
        let mut b = [0u8; 8];
        match rustix::io::read(efd, &mut b) {
            Ok(_) => {
                seen.fetch_add(1, Ordering::Relaxed);
                PollStatus::Busy
            }
            Err(_) => PollStatus::Idle,
        }
    }

    fn cfg(n: usize, mode: PollMode) -> ReactorConfig {
        ReactorConfig { cores: (0..n).collect(), mode, ring_size: 64, pin: false }
    }

    /// One adaptive reactor, its handle, and a non-blocking eventfd for a test to register.
    fn adaptive_with_eventfd() -> (ReactorSet, ReactorHandle, Arc<OwnedFd>) {
        let set = ReactorSet::start(cfg(1, PollMode::Adaptive)).unwrap();
        let h = set.handle();
        let efd = Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap());
        (set, h, efd)
    }

    #[test]
    fn messages_arrive_once_in_order_per_sender() {
        let set = ReactorSet::start(cfg(2, PollMode::Adaptive)).unwrap();
        let h = set.handle();
        // Per reactor: the (sender, sequence number) messages in the order they arrived.
        type Seen = Arc<Vec<Mutex<Vec<(usize, u32)>>>>;
        let seen: Seen = Arc::new((0..2).map(|_| Mutex::new(Vec::new())).collect());
        let senders: Vec<_> = (0..4)
            .map(|sender| {
                let h = h.clone();
                let seen = seen.clone();
                thread::spawn(move || {
                    for i in 0..5000u32 {
                        let r = (i as usize) % 2;
                        let seen = seen.clone();
                        // ring_size 64 forces the full-ring path often.
                        h.send_blocking(r, move |ctx| {
                            assert_eq!(ctx.reactor_id(), r);
                            seen[r].lock().unwrap().push((sender, i));
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().unwrap();
        }
        // A final round trip through each ring proves everything before it ran.
        for r in 0..2 {
            h.call(r, |_| ()).unwrap();
        }
        for r in 0..2 {
            let got = seen[r].lock().unwrap();
            assert_eq!(got.len(), 4 * 2500);
            for sender in 0..4 {
                let seq: Vec<u32> = got.iter().filter(|(s, _)| *s == sender).map(|(_, i)| *i).collect();
                let want: Vec<u32> = (0..5000).filter(|i| (*i as usize) % 2 == r).collect();
                assert_eq!(seq, want, "reactor {r} sender {sender}: lost, duplicated or reordered");
            }
        }
        set.shutdown();
    }

    #[test]
    fn timed_pollers_fire_and_pollers_unregister() {
        let set = ReactorSet::start(cfg(1, PollMode::Adaptive)).unwrap();
        let h = set.handle();
        let ticks = Arc::new(AtomicU64::new(0));
        let calls = Arc::new(AtomicU64::new(0));
        let (t2, c2) = (ticks.clone(), calls.clone());
        h.call(0, move |ctx| {
            ctx.add_timed_poller(Duration::from_millis(5), move |_| {
                t2.fetch_add(1, Ordering::Relaxed);
                PollStatus::Busy
            });
            ctx.add_poller(move |_| if c2.fetch_add(1, Ordering::Relaxed) + 1 >= 10 { PollStatus::Done } else { PollStatus::Busy });
        })
        .unwrap();
        thread::sleep(Duration::from_millis(200));
        let n = ticks.load(Ordering::Relaxed);
        assert!(n >= 5, "timed poller fired only {n} times in 200 ms at a 5 ms period");
        assert!(n <= 45, "timed poller fired {n} times in 200 ms at a 5 ms period");
        assert_eq!(calls.load(Ordering::Relaxed), 10, "a Done poller must not be called again");
        assert_eq!(h.stats()[0].pollers, 1);
        set.shutdown();
    }

    #[test]
    fn shutdown_drains_rings_and_pollers() {
        let set = ReactorSet::start(cfg(2, PollMode::Busy)).unwrap();
        let h = set.handle();
        let ran = Arc::new(AtomicU64::new(0));
        let inflight = Arc::new(AtomicU64::new(0));
        for r in 0..2 {
            let inflight = inflight.clone();
            // A poller with "in-flight I/O" that completes one unit per call.
            h.call(r, move |ctx| {
                inflight.fetch_add(100, Ordering::Relaxed);
                ctx.add_poller(move |_| {
                    if inflight.load(Ordering::Relaxed) == 0 {
                        return PollStatus::Idle;
                    }
                    inflight.fetch_sub(1, Ordering::Relaxed);
                    PollStatus::Busy
                });
            })
            .unwrap();
        }
        for i in 0..50 {
            let ran = ran.clone();
            h.send_blocking(i % 2, move |_| {
                ran.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        }
        set.shutdown();
        assert_eq!(ran.load(Ordering::Relaxed), 50);
        assert_eq!(inflight.load(Ordering::Relaxed), 0);
        assert_eq!(h.send(0, |_| ()), Err(SendError::Stopped));
    }

    #[test]
    fn locals_are_per_reactor_and_busy_time_counts() {
        let set = ReactorSet::start(cfg(2, PollMode::Adaptive)).unwrap();
        let h = set.handle();
        for r in 0..2 {
            let v = h.call(r, move |ctx| {
                *ctx.local(|| 0usize) += ctx.reactor_id() + 1;
                *ctx.local(|| 0usize)
            });
            assert_eq!(v.unwrap(), r + 1);
        }
        assert_eq!(h.send(7, |_| ()), Err(SendError::NoSuchReactor(7)));
        h.add_load(1, 3);
        assert_eq!(h.least_loaded(), 0);
        h.add_load(0, 5);
        assert_eq!(h.least_loaded(), 1);
        h.add_load(0, -5);
        assert_eq!(h.least_loaded(), 0);
        // A reactor publishes its counters after the message that answered `call` returned:
        // wait for them (bounded) rather than race the reply.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut s = h.stats();
        while !(s[0].busy_ns > 0 && s[0].messages >= 1) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            s = h.stats();
        }
        assert!(s[0].busy_ns > 0 && s[0].messages >= 1, "{:?}", (s[0].busy_ns, s[0].messages));
        set.shutdown();
    }

    #[test]
    fn unknown_core_is_a_clear_error() {
        let r = ReactorSet::start(ReactorConfig { cores: vec![100_000 - 1], pin: true, ..Default::default() });
        match r {
            Err(ReactorError::CoreUnavailable { core, .. }) => assert_eq!(core, 99_999),
            _ => panic!("expected CoreUnavailable"),
        }
    }

    #[test]
    fn without_io_uring_each_pass_checks_readiness_once_for_descriptors_that_ask_for_it() {
        let set = ReactorSet::start(cfg(1, PollMode::Busy)).unwrap();
        let h = set.handle();
        let mk = || Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap());
        let (a, b, plain, other) = (mk(), mk(), mk(), mk());
        // What the poller saw in its last pass: a, b, plain, and an id registered during it.
        type Seen = (Option<bool>, Option<bool>, Option<bool>, Option<bool>);
        let seen: Arc<Mutex<Seen>> = Arc::new(Mutex::new((None, None, None, None)));
        let (a2, b2, p2, s2) = (a.clone(), b.clone(), plain.clone(), seen.clone());
        h.call(0, move |ctx| {
            // The fallback (no io_uring): one epoll_wait of the whole set per pass.
            assert!(force_epoll_readiness());
            let ia = ctx.add_wake_fd(a2.as_fd(), || {}).unwrap();
            let ip = add_wake_fd(p2.as_fd(), || {}).unwrap().unwrap();
            remove_wake_fd(ia);
            let ia = add_ready_fd(a2.as_fd(), || {}).unwrap().unwrap();
            let ib = add_ready_fd(b2.as_fd(), || {}).unwrap().unwrap();
            ctx.add_poller(move |_| {
                let id = add_ready_fd(other.as_fd(), || {}).unwrap().unwrap();
                let now = fd_readable(id);
                remove_wake_fd(id);
                *s2.lock().unwrap() = (fd_readable(ia), fd_readable(ib), fd_readable(ip), now);
                PollStatus::Idle
            });
        })
        .unwrap();
        let wait = |what: &str, want: Seen| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while *seen.lock().unwrap() != want {
                assert!(Instant::now() < deadline, "{what}: {:?}", *seen.lock().unwrap());
                thread::sleep(Duration::from_micros(200));
            }
        };
        // The check answers for every id registered before it (the plain one too), not for
        // one registered after it in the same pass.
        wait("nothing readable", (Some(false), Some(false), Some(false), None));
        rustix::io::write(&*b, &1u64.to_ne_bytes()).unwrap();
        wait("b readable", (Some(false), Some(true), Some(false), None));
        let mut buf = [0u8; 8];
        rustix::io::read(&*b, &mut buf).unwrap();
        rustix::io::write(&*a, &1u64.to_ne_bytes()).unwrap();
        wait("a readable, b drained", (Some(true), Some(false), Some(false), None));
        set.shutdown();
    }

    #[test]
    fn the_stats_count_poller_calls() {
        let set = ReactorSet::start(cfg(1, PollMode::Busy)).unwrap();
        let h = set.handle();
        h.call(0, |ctx| {
            for _ in 0..3 {
                ctx.add_poller(|_| PollStatus::Idle);
            }
        })
        .unwrap();
        // Three calls a pass from the pass after the one that added them (one pass of slack
        // at each end: the two counters are read one after the other).
        let s0 = h.stats()[0].clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        while h.stats()[0].poller_calls < s0.poller_calls + 3000 {
            assert!(Instant::now() < deadline, "{:?}", h.stats()[0]);
            thread::yield_now();
        }
        let s1 = h.stats()[0].clone();
        set.shutdown();
        let (calls, passes) = (s1.poller_calls - s0.poller_calls, s1.passes - s0.passes);
        assert!(calls.abs_diff(3 * passes) <= 6, "{calls} poller calls in {passes} passes of 3 pollers");
    }

    #[test]
    fn without_descriptors_that_ask_for_it_no_readiness_is_known() {
        let set = ReactorSet::start(cfg(1, PollMode::Busy)).unwrap();
        let h = set.handle();
        let e = Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap());
        rustix::io::write(&*e, &1u64.to_ne_bytes()).unwrap();
        let e2 = e.clone();
        let got = h
            .call(0, move |ctx| {
                let id = ctx.add_wake_fd(e2.as_fd(), || {}).unwrap();
                fd_readable(id)
            })
            .unwrap();
        assert_eq!(got, None, "a plain wake descriptor costs no per-pass check");
        set.shutdown();
    }

    #[test]
    fn a_registered_descriptor_ends_an_adaptive_sleep_and_is_armed_first() {
        use std::sync::atomic::AtomicUsize;
        let (set, h, efd) = adaptive_with_eventfd();
        let (armed, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (e, a, n) = (efd.clone(), armed.clone(), seen.clone());
        let id = h
            .call(0, move |ctx| {
                let e2 = e.clone();
                ctx.add_poller(move |_| {
                    eventfd_read(&e2, &n)
                });
                ctx.add_wake_fd(e.as_fd(), move || {
                    a.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap()
            })
            .unwrap();
        let wait = |what: &str, f: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !f() {
                assert!(Instant::now() < deadline, "{what}");
                thread::sleep(Duration::from_micros(200));
            }
        };
        // Twenty times: once the reactor sleeps, the descriptor becomes readable.
        let woken0 = h.stats()[0].woken;
        for i in 1..=20 {
            wait("the reactor never slept", &|| h.stats()[0].sleeping);
            rustix::io::write(&*efd, &1u64.to_ne_bytes()).unwrap();
            wait("the poller never read the descriptor", &|| seen.load(Ordering::Relaxed) >= i);
        }
        assert!(armed.load(Ordering::Relaxed) >= 20, "arm is called before each sleep");
        // Some of the twenty sleeps ended by the descriptor, not by their timeout (each ends
        // by timeout only if the write lands just as it runs out).
        assert!(h.stats()[0].woken > woken0, "no sleep was ended by the descriptor");
        // Unregistered: no longer armed.
        h.call(0, move |ctx| ctx.remove_wake_fd(id)).unwrap();
        let before = armed.load(Ordering::Relaxed);
        thread::sleep(Duration::from_millis(20));
        assert_eq!(armed.load(Ordering::Relaxed), before);
        set.shutdown();
    }

    /// The pass counters: every pass counted, and exactly the passes where a poller did
    /// work counted busy (here, a poller busy on its first 50 calls only).
    #[test]
    fn passes_and_busy_passes_are_counted() {
        let set = ReactorSet::start(cfg(1, PollMode::Adaptive)).unwrap();
        let h = set.handle();
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        h.call(0, move |ctx| {
            ctx.add_poller(move |_| if c.fetch_add(1, Ordering::Relaxed) < 50 { PollStatus::Busy } else { PollStatus::Idle });
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::Relaxed) < 200 {
            assert!(Instant::now() < deadline, "the poller is not called");
            thread::sleep(Duration::from_millis(1));
        }
        let s = &h.stats()[0];
        // The call that added the poller was a message: one more busy pass.
        assert!((50..=52).contains(&s.busy_passes), "busy passes: {s:?}");
        assert!(s.passes >= 200 && s.passes > s.busy_passes, "passes: {s:?}");
        set.shutdown();
    }
    /// A SignalledWait turned on makes an idle adaptive reactor sleep long (its work in
    /// flight wakes it: here an eventfd in the wake set), instead of waking every
    /// millisecond at most; work signalled on the descriptor is still collected, and off,
    /// the usual cap is back.
    #[test]
    fn a_signalled_wait_lets_the_reactor_sleep_until_its_descriptor() {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        let (set, h, efd) = adaptive_with_eventfd();
        let (calls, seen, on) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(true)));
        let (e, c, n, o) = (efd.clone(), calls.clone(), seen.clone(), on.clone());
        h.call(0, move |ctx| {
            let e2 = e.clone();
            let mut wait = SignalledWait::default();
            ctx.add_poller(move |_| {
                c.fetch_add(1, Ordering::Relaxed);
                wait.set(o.load(Ordering::Relaxed));
                eventfd_read(&e2, &n)
            });
            ctx.add_wake_fd(e.as_fd(), || {}).unwrap();
        })
        .unwrap();
        let calls_in = |d: Duration| {
            let c0 = calls.load(Ordering::Relaxed);
            thread::sleep(d);
            calls.load(Ordering::Relaxed) - c0
        };
        thread::sleep(Duration::from_millis(50));
        let long = calls_in(Duration::from_millis(300));
        rustix::io::write(&*efd, &1u64.to_ne_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "the signalled work was never collected");
            thread::sleep(Duration::from_millis(1));
        }
        on.store(false, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(50));
        let capped = calls_in(Duration::from_millis(300));
        // On: a sleep of up to 10 ms per two passes (about 60 in 300 ms); off: up to 1 ms.
        assert!(long * 3 < capped, "passes in 300 ms: {long} with the wait on, {capped} off");
        set.shutdown();
    }

    /// A busy reactor yields its core while idle (so that kernel work deferred to that core
    /// runs), about once per 50 us of idleness, and never while its pollers find work.
    /// (An adaptive one does too while it spins; it sleeps after 50 us here.)
    #[test]
    fn a_busy_reactor_yields_its_core_only_while_idle() {
        use std::sync::atomic::AtomicBool;
        let set = ReactorSet::start(cfg(1, PollMode::Busy)).unwrap();
        let h = set.handle();
        let busy = Arc::new(AtomicBool::new(true));
        let b = busy.clone();
        h.call(0, move |ctx| {
            ctx.add_poller(move |_| if b.load(Ordering::Relaxed) { PollStatus::Busy } else { PollStatus::Idle });
        })
        .unwrap();
        let yields = || h.stats()[0].yields;
        // (It may have yielded before its poller came.)
        thread::sleep(Duration::from_millis(20));
        let y0 = yields();
        thread::sleep(Duration::from_millis(100));
        assert_eq!(yields(), y0, "yielded while its poller had work");
        busy.store(false, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(200));
        let idle = yields() - y0;
        // At most one per 50 us (4000 in 200 ms); at least some, however slow the machine.
        assert!(idle > 0 && idle <= 4000, "yields in 200 ms idle: {idle}");
        busy.store(true, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(20));
        let y0 = yields();
        thread::sleep(Duration::from_millis(100));
        assert_eq!(yields(), y0, "yielded again once its poller had work");
        set.shutdown();
    }

    /// An adaptive reactor whose sleeps keep ending early (work every ~100 us) spins longer
    /// before it sleeps, and back to the shortest spin once sleeps run to their end.
    #[test]
    fn an_adaptive_reactor_spins_longer_while_work_comes_soon_after_it_sleeps() {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        let (set, h, efd) = adaptive_with_eventfd();
        let seen = Arc::new(AtomicUsize::new(0));
        let (e, n) = (efd.clone(), seen.clone());
        h.call(0, move |ctx| {
            let e2 = e.clone();
            ctx.add_poller(move |_| eventfd_read(&e2, &n));
            ctx.add_wake_fd(e.as_fd(), || {}).unwrap();
        })
        .unwrap();
        let shortest = IDLE_TIME_BEFORE_SLEEP.as_nanos() as u64;
        thread::sleep(Duration::from_millis(50));
        assert_eq!(h.stats()[0].spin_ns, shortest, "idle: the shortest spin");
        let stop = Arc::new(AtomicBool::new(false));
        let (e, st) = (efd.clone(), stop.clone());
        let writer = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                rustix::io::write(&*e, &1u64.to_ne_bytes()).unwrap();
                thread::sleep(Duration::from_micros(100));
            }
        });
        let mut longest = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while longest <= shortest && Instant::now() < deadline {
            longest = longest.max(h.stats()[0].spin_ns);
            thread::sleep(Duration::from_micros(200));
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(seen.load(Ordering::Relaxed) > 0);
        assert!(longest > shortest, "the spin window never grew (stats {:?})", h.stats()[0]);
        assert!(longest <= MAX_SPIN.as_nanos() as u64);
        let deadline = Instant::now() + Duration::from_secs(5);
        while h.stats()[0].spin_ns != shortest {
            assert!(Instant::now() < deadline, "the spin window never shrank back: {:?}", h.stats()[0]);
            thread::sleep(Duration::from_millis(5));
        }
        set.shutdown();
    }
}
