//! Per-device I/O statistics (SPDK's `bdev_get_iostat`, `bdev_reset_iostat`) and latency
//! histograms (`bdev_enable_histogram`, `bdev_get_histogram`).
//!
//! The registry wraps every device it holds in a [`Counted`] device, whose channels count
//! what passes through them. Each channel owns one [`ChannelStats`] block: only the channel's
//! reactor writes it (relaxed loads and stores, no read-modify-write, no lock, nothing
//! allocated per I/O); the control plane sums the blocks on request. A reset is a request,
//! not a write: it bumps an epoch in [`BdevStats`], each channel clears its own counters the
//! next time it completes an I/O, and readers count a channel that has not caught up yet as
//! zero. A channel that closes folds its counts into the device's totals, so nothing is lost.
//!
//! Latency is submit-to-completion on the monotonic clock, in nanoseconds: `tick_rate` is
//! 1e9 and "ticks" are nanoseconds since riser started.

use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use serde_json::{json, Value};

use crate::io::{BdevInfo, BdevIo, IoChannel, IoCompletion, IoKind};
use crate::{Bdev, BdevError, Lba, LbaRun};

/// Whether the registry's devices count their I/O: on, unless `RISER_IOSTAT=off` (a hidden
/// switch, to measure what counting costs).
pub(crate) fn counting_on() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| std::env::var("RISER_IOSTAT").map_or(true, |v| v != "off"));
    *ON
}

/// Ticks per second of every `*_latency_ticks` figure (nanoseconds).
pub const TICK_RATE: u64 = 1_000_000_000;

static START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Nanoseconds since riser started: the clock of every latency figure.
pub fn now_ticks() -> u64 {
    START.elapsed().as_nanos() as u64
}

/// The per-I/O clock: the CPU's time-stamp counter where it is invariant (calibrated once
/// against the monotonic clock), else the monotonic clock. A read costs a few ns where
/// `Instant::now` costs tens in a VM, and a 4 KiB I/O reads it about twice.
static IO_CLOCK: LazyLock<quanta::Clock> = LazyLock::new(quanta::Clock::new);

/// Starts both clocks: "ticks" count from here, and the per-I/O clock's calibration (some
/// milliseconds) runs now rather than in a reactor's first I/O.
pub fn start_clocks() {
    now_ticks();
    io_clock_raw();
}

fn io_clock_raw() -> u64 {
    IO_CLOCK.raw()
}

fn io_clock_ns(start: u64, end: u64) -> u64 {
    IO_CLOCK.delta_as_nanos(start, end)
}

/// The kinds of I/O counted, in the order of [`KindStats`] arrays.
pub const KINDS: [IoKind; 5] = [IoKind::Read, IoKind::Write, IoKind::Unmap, IoKind::Flush, IoKind::WriteZeroes];

fn kind_index(k: IoKind) -> usize {
    match k {
        IoKind::Read => 0,
        // Counted with the writes (riser's addition; SPDK has no such counter).
        IoKind::Write | IoKind::CompareAndWrite => 1,
        IoKind::Unmap => 2,
        IoKind::Flush => 3,
        IoKind::WriteZeroes => 4,
    }
}

/// The name of a kind in metric labels.
pub fn kind_name(k: IoKind) -> &'static str {
    match k {
        IoKind::Read => "read",
        IoKind::Write => "write",
        IoKind::Unmap => "unmap",
        IoKind::Flush => "flush",
        IoKind::WriteZeroes => "write_zeroes",
        IoKind::CompareAndWrite => "compare_and_write",
    }
}

/// Coarse latency buckets, always counted (Prometheus): bucket `k < LAT_BUCKETS - 1` holds
/// latencies below 2^k µs (1 µs to 16.8 s); the last one everything else.
pub const LAT_BUCKETS: usize = 26;

/// The upper bound of coarse bucket `k` in seconds (`+Inf` for the last).
pub fn lat_bucket_le_seconds(k: usize) -> f64 {
    if k + 1 >= LAT_BUCKETS {
        f64::INFINITY
    } else {
        (1u64 << k) as f64 * 1e-6
    }
}

fn lat_bucket(ns: u64) -> usize {
    let us = ns / 1000;
    ((64 - us.leading_zeros()) as usize).min(LAT_BUCKETS - 1)
}

// Fine buckets for percentiles (log-linear like HdrHistogram): values below 64 ns exactly,
// then 32 buckets per power of two (3 % wide) up to 2^43 ns (about 2.4 hours).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const MAX_EXP: u32 = 42;
const HIST_LEN: usize = (2 * SUB + (MAX_EXP as u64 - SUB_BITS as u64) * SUB) as usize;

fn hist_index(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let v = v.min((1u64 << (MAX_EXP + 1)) - 1);
    let e = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let m = (v >> (e - SUB_BITS)) - SUB; // 0..SUB
    (2 * SUB + (e - SUB_BITS - 1) as u64 * SUB + m) as usize
}

/// The middle of fine bucket `i`, in nanoseconds.
fn hist_value(i: usize) -> u64 {
    let i = i as u64;
    if i < 2 * SUB {
        return i;
    }
    let e = (i - 2 * SUB) / SUB + SUB_BITS as u64 + 1;
    let m = (i - 2 * SUB) % SUB;
    let shift = e - SUB_BITS as u64;
    let lo = (SUB + m) << shift;
    lo + (1u64 << shift) / 2
}

/// One kind's counters in one channel.
#[derive(Default)]
struct KindStats {
    ops: AtomicU64,
    bytes: AtomicU64,
    latency: AtomicU64,
    /// u64::MAX until an I/O completed.
    min_latency: AtomicU64,
    max_latency: AtomicU64,
    buckets: [AtomicU64; LAT_BUCKETS],
}

/// A single writer's add: no read-modify-write instruction, the owner is the only writer.
#[inline]
fn bump(a: &AtomicU64, v: u64) {
    a.store(a.load(Relaxed).wrapping_add(v), Relaxed);
}

impl KindStats {
    fn new() -> Self {
        let k = KindStats::default();
        k.min_latency.store(u64::MAX, Relaxed);
        k
    }

    #[inline]
    fn record(&self, bytes: u64, ns: u64) {
        bump(&self.ops, 1);
        bump(&self.bytes, bytes);
        bump(&self.latency, ns);
        if ns < self.min_latency.load(Relaxed) {
            self.min_latency.store(ns, Relaxed);
        }
        if ns > self.max_latency.load(Relaxed) {
            self.max_latency.store(ns, Relaxed);
        }
        bump(&self.buckets[lat_bucket(ns)], 1);
    }

    fn clear_counts(&self) {
        for a in [&self.ops, &self.bytes, &self.latency].into_iter().chain(self.buckets.iter()) {
            a.store(0, Relaxed);
        }
    }

    fn clear_maxmin(&self) {
        self.min_latency.store(u64::MAX, Relaxed);
        self.max_latency.store(0, Relaxed);
    }
}

/// The statistics of one channel: written by its reactor only.
pub struct ChannelStats {
    /// The core of the reactor that opened the channel (SPDK's `thread_id`).
    thread_id: u64,
    kinds: [KindStats; 5],
    errors: AtomicU64,
    outstanding: AtomicU64,
    /// Fine latency buckets, made the first time histograms are on.
    hist: OnceLock<Box<[AtomicU64]>>,
    seen_all: AtomicU64,
    seen_maxmin: AtomicU64,
    seen_hist: AtomicU64,
}

impl ChannelStats {
    fn new(dev: &BdevStats) -> ChannelStats {
        // Reactor threads are named reactor_<core>; any other thread counts as 0.
        let thread_id = std::thread::current().name().and_then(|n| n.strip_prefix("reactor_")).and_then(|c| c.parse().ok()).unwrap_or(0);
        ChannelStats {
            thread_id,
            kinds: std::array::from_fn(|_| KindStats::new()),
            errors: AtomicU64::new(0),
            outstanding: AtomicU64::new(0),
            hist: OnceLock::new(),
            seen_all: AtomicU64::new(dev.reset_all.load(Acquire)),
            seen_maxmin: AtomicU64::new(dev.reset_maxmin.load(Acquire)),
            seen_hist: AtomicU64::new(dev.reset_hist.load(Acquire)),
        }
    }

    /// Applies resets asked for since the last call (on the owner's thread).
    fn catch_up(&self, dev: &BdevStats) {
        let all = dev.reset_all.load(Acquire);
        if all != self.seen_all.load(Relaxed) {
            for k in &self.kinds {
                k.clear_counts();
                k.clear_maxmin();
            }
            self.errors.store(0, Relaxed);
            self.seen_all.store(all, Release);
        }
        let mm = dev.reset_maxmin.load(Acquire);
        if mm != self.seen_maxmin.load(Relaxed) {
            for k in &self.kinds {
                k.clear_maxmin();
            }
            self.seen_maxmin.store(mm, Release);
        }
        let h = dev.reset_hist.load(Acquire);
        if h != self.seen_hist.load(Relaxed) {
            if let Some(b) = self.hist.get() {
                b.iter().for_each(|a| a.store(0, Relaxed));
            }
            self.seen_hist.store(h, Release);
        }
    }
}

/// Counts of one device, or one channel, or one reactor's channels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoStat {
    pub ops: [u64; 5],
    pub bytes: [u64; 5],
    pub latency_ticks: [u64; 5],
    pub min_latency_ticks: [u64; 5],
    pub max_latency_ticks: [u64; 5],
    pub buckets: [[u64; LAT_BUCKETS]; 5],
    pub errors: u64,
}

impl Default for IoStat {
    fn default() -> Self {
        IoStat {
            ops: [0; 5],
            bytes: [0; 5],
            latency_ticks: [0; 5],
            min_latency_ticks: [u64::MAX; 5],
            max_latency_ticks: [0; 5],
            buckets: [[0; LAT_BUCKETS]; 5],
            errors: 0,
        }
    }
}

impl IoStat {
    /// Adds one channel's counts, leaving out what a reset it has not applied yet cleared.
    fn add_channel(&mut self, ch: &ChannelStats, dev: &BdevStats) {
        if ch.seen_all.load(Acquire) != dev.reset_all.load(Acquire) {
            return;
        }
        let maxmin = ch.seen_maxmin.load(Acquire) == dev.reset_maxmin.load(Acquire);
        for (i, k) in ch.kinds.iter().enumerate() {
            self.ops[i] += k.ops.load(Relaxed);
            self.bytes[i] += k.bytes.load(Relaxed);
            self.latency_ticks[i] += k.latency.load(Relaxed);
            if maxmin {
                self.min_latency_ticks[i] = self.min_latency_ticks[i].min(k.min_latency.load(Relaxed));
                self.max_latency_ticks[i] = self.max_latency_ticks[i].max(k.max_latency.load(Relaxed));
            }
            for (b, a) in self.buckets[i].iter_mut().zip(k.buckets.iter()) {
                *b += a.load(Relaxed);
            }
        }
        self.errors += ch.errors.load(Relaxed);
    }

    fn add(&mut self, o: &IoStat) {
        for i in 0..5 {
            self.ops[i] += o.ops[i];
            self.bytes[i] += o.bytes[i];
            self.latency_ticks[i] += o.latency_ticks[i];
            self.min_latency_ticks[i] = self.min_latency_ticks[i].min(o.min_latency_ticks[i]);
            self.max_latency_ticks[i] = self.max_latency_ticks[i].max(o.max_latency_ticks[i]);
            for (b, x) in self.buckets[i].iter_mut().zip(o.buckets[i].iter()) {
                *b += x;
            }
        }
        self.errors += o.errors;
    }

    fn clear_maxmin(&mut self) {
        self.min_latency_ticks = [u64::MAX; 5];
        self.max_latency_ticks = [0; 5];
    }

    pub fn of(&self, k: IoKind) -> KindStat {
        let i = kind_index(k);
        KindStat {
            ops: self.ops[i],
            bytes: self.bytes[i],
            latency_ticks: self.latency_ticks[i],
            min_latency_ticks: if self.min_latency_ticks[i] == u64::MAX { 0 } else { self.min_latency_ticks[i] },
            max_latency_ticks: self.max_latency_ticks[i],
            buckets: self.buckets[i],
        }
    }

    /// SPDK's fields (`spdk_bdev_dump_io_stat_json`), plus riser's flush and write-zeroes
    /// counts.
    pub fn write_json(&self, o: &mut serde_json::Map<String, Value>) {
        let (r, w, u) = (self.of(IoKind::Read), self.of(IoKind::Write), self.of(IoKind::Unmap));
        let fields = [
            ("bytes_read", r.bytes),
            ("num_read_ops", r.ops),
            ("bytes_written", w.bytes),
            ("num_write_ops", w.ops),
            ("bytes_unmapped", u.bytes),
            ("num_unmap_ops", u.ops),
            ("bytes_copied", 0),
            ("num_copy_ops", 0),
            ("read_latency_ticks", r.latency_ticks),
            ("max_read_latency_ticks", r.max_latency_ticks),
            ("min_read_latency_ticks", r.min_latency_ticks),
            ("write_latency_ticks", w.latency_ticks),
            ("max_write_latency_ticks", w.max_latency_ticks),
            ("min_write_latency_ticks", w.min_latency_ticks),
            ("unmap_latency_ticks", u.latency_ticks),
            ("max_unmap_latency_ticks", u.max_latency_ticks),
            ("min_unmap_latency_ticks", u.min_latency_ticks),
            ("copy_latency_ticks", 0),
            ("max_copy_latency_ticks", 0),
            ("min_copy_latency_ticks", 0),
            ("num_flush_ops", self.of(IoKind::Flush).ops),
            ("num_write_zeroes_ops", self.of(IoKind::WriteZeroes).ops),
            ("bytes_zeroed", self.of(IoKind::WriteZeroes).bytes),
        ];
        for (k, v) in fields {
            o.insert(k.to_string(), json!(v));
        }
        let mut err = serde_json::Map::new();
        if self.errors > 0 {
            err.insert("failed".into(), json!(self.errors));
        }
        o.insert("io_error".into(), Value::Object(err));
    }
}

/// One kind's figures from an [`IoStat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindStat {
    pub ops: u64,
    pub bytes: u64,
    pub latency_ticks: u64,
    pub min_latency_ticks: u64,
    pub max_latency_ticks: u64,
    /// Coarse buckets, not cumulative (see [`LAT_BUCKETS`]).
    pub buckets: [u64; LAT_BUCKETS],
}

/// A device's statistics: its open channels' blocks, what closed channels counted, and the
/// reset epochs the channels follow.
#[derive(Default)]
pub struct BdevStats {
    reset_all: AtomicU64,
    reset_maxmin: AtomicU64,
    reset_hist: AtomicU64,
    /// Bumped with any of the three, so a channel checks one word per completion batch.
    generation: AtomicU64,
    histogram: AtomicBool,
    inner: Mutex<Inner>,
    /// The device's rate limits (`bdev_set_qos_limit`), applied by its channels.
    pub qos: crate::qos::Qos,
}

#[derive(Default)]
struct Inner {
    channels: Vec<Arc<ChannelStats>>,
    /// What closed channels counted, by reactor (`thread_id`).
    closed: Vec<(u64, IoStat)>,
    closed_hist: Vec<u64>,
}

impl Inner {
    fn closed_of(&mut self, thread_id: u64) -> &mut IoStat {
        let i = match self.closed.iter().position(|(t, _)| *t == thread_id) {
            Some(i) => i,
            None => {
                self.closed.push((thread_id, IoStat::default()));
                self.closed.len() - 1
            }
        };
        &mut self.closed[i].1
    }
}

/// How much of the statistics `bdev_reset_iostat` clears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetMode {
    All,
    MaxMin,
}

/// Percentiles of a device's latency histogram (`bdev_get_histogram`), in microseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub p99_99: f64,
    pub max: f64,
}

impl BdevStats {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sum over every channel, open or closed.
    pub fn snapshot(&self) -> IoStat {
        let inner = self.lock();
        let mut s = IoStat::default();
        for (_, c) in &inner.closed {
            s.add(c);
        }
        for ch in &inner.channels {
            s.add_channel(ch, self);
        }
        s
    }

    /// The sums per reactor (`thread_id`), closed channels included (SPDK's `per_channel`:
    /// there a channel lives as long as its thread; here one lives as long as its connection).
    pub fn per_thread(&self) -> Vec<(u64, IoStat)> {
        let inner = self.lock();
        let mut out: Vec<(u64, IoStat)> = inner.closed.clone();
        for ch in &inner.channels {
            let i = match out.iter().position(|(t, _)| *t == ch.thread_id) {
                Some(i) => i,
                None => {
                    out.push((ch.thread_id, IoStat::default()));
                    out.len() - 1
                }
            };
            out[i].1.add_channel(ch, self);
        }
        out.sort_by_key(|(t, _)| *t);
        out
    }

    /// I/Os submitted and not completed now, over all channels.
    pub fn queue_depth(&self) -> u64 {
        self.lock().channels.iter().map(|c| c.outstanding.load(Relaxed)).sum()
    }

    pub fn reset(&self, mode: ResetMode) {
        let mut inner = self.lock();
        match mode {
            ResetMode::All => {
                inner.closed.clear();
                self.reset_all.fetch_add(1, Release);
            }
            ResetMode::MaxMin => {
                inner.closed.iter_mut().for_each(|(_, c)| c.clear_maxmin());
                self.reset_maxmin.fetch_add(1, Release);
            }
        }
        self.generation.fetch_add(1, Release);
    }

    pub fn histogram_enabled(&self) -> bool {
        self.histogram.load(Acquire)
    }

    /// Turns histograms on (from empty, as SPDK does) or off.
    pub fn enable_histogram(&self, on: bool) {
        let mut inner = self.lock();
        if on && !self.histogram.load(Acquire) {
            inner.closed_hist.clear();
            self.reset_hist.fetch_add(1, Release);
            self.generation.fetch_add(1, Release);
        }
        self.histogram.store(on, Release);
    }

    /// The fine buckets summed over every channel (empty when nothing was recorded).
    fn hist_sum(&self) -> Vec<u64> {
        let inner = self.lock();
        let mut sum = inner.closed_hist.clone();
        let epoch = self.reset_hist.load(Acquire);
        for ch in &inner.channels {
            if ch.seen_hist.load(Acquire) != epoch {
                continue;
            }
            if let Some(b) = ch.hist.get() {
                sum.resize(HIST_LEN, 0);
                for (s, a) in sum.iter_mut().zip(b.iter()) {
                    *s += a.load(Relaxed);
                }
            }
        }
        sum
    }

    /// Percentiles of the latencies recorded since histograms were turned on (HdrHistogram
    /// over the fine buckets: about 3 % precision).
    pub fn percentiles(&self) -> Percentiles {
        let sum = self.hist_sum();
        let count: u64 = sum.iter().sum();
        if count == 0 {
            return Percentiles::default();
        }
        let Ok(mut h) = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 1u64 << (MAX_EXP + 2), 3) else {
            return Percentiles::default();
        };
        for (i, &n) in sum.iter().enumerate().filter(|(_, n)| **n > 0) {
            let _ = h.record_n(hist_value(i).max(1), n);
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Percentiles {
            count,
            min: us(h.min()),
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            p99_9: us(h.value_at_quantile(0.999)),
            p99_99: us(h.value_at_quantile(0.9999)),
            max: us(h.max()),
        }
    }

    fn open(&self) -> Arc<ChannelStats> {
        let ch = Arc::new(ChannelStats::new(self));
        self.lock().channels.push(ch.clone());
        ch
    }

    /// A channel closes: its counts join the totals (on its own thread, after catching up).
    fn close(&self, ch: &Arc<ChannelStats>) {
        ch.catch_up(self);
        let mut inner = self.lock();
        inner.channels.retain(|c| !Arc::ptr_eq(c, ch));
        let mut one = IoStat::default();
        one.add_channel(ch, self);
        inner.closed_of(ch.thread_id).add(&one);
        if let Some(b) = ch.hist.get() {
            if ch.seen_hist.load(Acquire) == self.reset_hist.load(Acquire) {
                inner.closed_hist.resize(HIST_LEN, 0);
                for (s, a) in inner.closed_hist.iter_mut().zip(b.iter()) {
                    *s += a.load(Relaxed);
                }
            }
        }
    }
}

/// A device that counts the I/O of its channels. The registry wraps every device in one.
pub struct Counted {
    inner: Arc<dyn Bdev>,
    stats: Arc<BdevStats>,
    /// Off (`RISER_IOSTAT=off`, a hidden switch for measuring the cost): channels are the
    /// device's own.
    counting: bool,
}

impl Counted {
    pub fn new(inner: Arc<dyn Bdev>, counting: bool) -> Counted {
        Counted { inner, stats: Arc::new(BdevStats::default()), counting }
    }

    pub fn stats(&self) -> &Arc<BdevStats> {
        &self.stats
    }
}

/// Every method forwards to the device (a method added to [`Bdev`] must be forwarded here).
impl Bdev for Counted {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }

    fn supports(&self, kind: IoKind) -> bool {
        self.inner.supports(kind)
    }

    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        let inner = self.inner.clone().open_channel();
        if !self.counting {
            return inner;
        }
        let stats = self.stats.open();
        Box::new(CountingChannel {
            inner,
            block_size: self.inner.info().block_size as u64,
            dev: self.stats.clone(),
            stats,
            slots: Vec::new(),
            free: Vec::new(),
            generation: self.stats.generation.load(Acquire),
            throttle: crate::qos::Throttle::default(),
        })
    }

    fn config_json(&self) -> (&'static str, Value) {
        self.inner.config_json()
    }

    fn driver_specific(&self) -> Value {
        self.inner.driver_specific()
    }

    fn provisioning(&self, lba: Lba, max_blocks: u64, max_runs: usize) -> Option<Result<Vec<LbaRun>, BdevError>> {
        self.inner.provisioning(lba, max_blocks, max_runs)
    }

    fn rescan_blocks(&self) -> Option<Result<u64, BdevError>> {
        self.inner.rescan_blocks()
    }

    fn set_num_blocks(&self, num_blocks: u64) {
        self.inner.set_num_blocks(num_blocks)
    }

    fn shared_state(&self, purpose: &str, on_notify: crate::OnNotify) -> Option<Result<crate::SharedStateHandle, BdevError>> {
        self.inner.shared_state(purpose, on_notify)
    }

    fn gateway_group(&self) -> Option<crate::GatewayGroupHandle> {
        self.inner.gateway_group()
    }
}

/// An I/O in flight: the submitter's tag, when it was submitted (raw [`IO_CLOCK`]), its size.
#[derive(Clone, Copy)]
struct Slot {
    tag: u64,
    start: u64,
    bytes: u64,
}

/// A channel that counts: the device's channel sees slot numbers as tags, and each
/// completion gets its submitter's tag back. The slot table grows to the channel's highest
/// queue depth once, then allocates nothing.
struct CountingChannel {
    inner: Box<dyn IoChannel>,
    block_size: u64,
    dev: Arc<BdevStats>,
    stats: Arc<ChannelStats>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    generation: u64,
    /// This reactor's share of the device's rate limits, and the I/Os waiting on them.
    throttle: crate::qos::Throttle,
}

impl CountingChannel {
    /// Submits the I/Os waiting on the rate limits that may go now.
    #[cold]
    fn release_throttled(&mut self) {
        let (dev, mut throttle) = (self.dev.clone(), std::mem::take(&mut self.throttle));
        throttle.release(&dev.qos, crate::qos::now_ns(), &mut |io| self.submit_now(io));
        self.throttle = throttle;
    }

    /// Queues `io` behind the rate limits, or submits it if they allow it now.
    #[cold]
    fn submit_throttled(&mut self, io: BdevIo) {
        let bytes = io.num_blocks.saturating_mul(self.block_size);
        let (dev, mut throttle) = (self.dev.clone(), std::mem::take(&mut self.throttle));
        throttle.submit(&dev.qos, io, bytes, crate::qos::now_ns(), &mut |io| self.submit_now(io));
        self.throttle = throttle;
    }

    fn submit_now(&mut self, mut io: BdevIo) {
        let bytes = io.num_blocks.saturating_mul(self.block_size);
        let slot = Slot { tag: io.tag, start: io_clock_raw(), bytes };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        io.tag = i as u64;
        bump(&self.stats.outstanding, 1);
        self.inner.submit(io);
    }
}

impl IoChannel for CountingChannel {
    fn submit(&mut self, io: BdevIo) {
        // No limit and nothing waiting: one flag and one length.
        if self.dev.qos.active() || self.throttle.queued() > 0 {
            return self.submit_throttled(io);
        }
        self.submit_now(io)
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        if self.throttle.queued() > 0 {
            self.release_throttled();
        }
        let start = out.len();
        let n = self.inner.poll(out);
        if out.len() == start {
            return n;
        }
        let g = self.dev.generation.load(Acquire);
        if g != self.generation {
            self.stats.catch_up(&self.dev);
            self.generation = g;
        }
        let now = io_clock_raw();
        let hist = if self.dev.histogram.load(Relaxed) {
            Some(self.stats.hist.get_or_init(|| (0..HIST_LEN).map(|_| AtomicU64::new(0)).collect()))
        } else {
            None
        };
        let mut done = 0;
        for c in &mut out[start..] {
            let Some(slot) = self.slots.get(c.tag as usize).copied() else {
                log::error!("bdev channel completed an I/O with unknown tag {}", c.tag);
                continue;
            };
            self.free.push(c.tag as u32);
            c.tag = slot.tag;
            done += 1;
            let ns = io_clock_ns(slot.start, now);
            if c.result.is_ok() {
                self.stats.kinds[kind_index(c.kind)].record(slot.bytes, ns);
            } else {
                bump(&self.stats.errors, 1);
            }
            if let Some(h) = hist {
                bump(&h[hist_index(ns)], 1);
            }
        }
        let left = self.stats.outstanding.load(Relaxed).saturating_sub(done);
        self.stats.outstanding.store(left, Relaxed);
        n
    }

    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.throttle.queued()
    }

    fn needs_poll(&self) -> bool {
        self.inner.needs_poll()
    }
}

impl Drop for CountingChannel {
    fn drop(&mut self) {
        self.dev.close(&self.stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BdevRegistry, IoBuf};

    fn io(kind: IoKind, off: u64, n: u64, bs: u64, tag: u64) -> BdevIo {
        let buf = kind.needs_buffer().then(|| IoBuf::from(vec![0u8; (n * bs) as usize]));
        BdevIo { kind, offset_blocks: Lba::new(off), num_blocks: n, buf, tag, fua: false }
    }

    /// Submits `ios` at once, polls them all back; returns the tags seen.
    fn run(ch: &mut dyn IoChannel, ios: Vec<BdevIo>) -> Vec<u64> {
        let n = ios.len();
        for i in ios {
            ch.submit(i);
        }
        let mut out = Vec::new();
        while out.len() < n {
            ch.poll(&mut out);
        }
        out.iter().map(|c| c.tag).collect()
    }

    #[test]
    fn fine_buckets_hold_their_values() {
        for v in (0..5000u64).chain([1 << 20, 123_456_789, 1 << 42, (1 << 43) - 1]) {
            let i = hist_index(v);
            assert!(i < HIST_LEN, "{v} -> {i}");
            let mid = hist_value(i);
            let err = (mid as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 1.0 / SUB as f64, "{v}: bucket {i} middle {mid}");
            if v > 0 {
                assert!(hist_index(v - 1) <= i, "monotonic at {v}");
            }
        }
        assert_eq!(hist_index(u64::MAX), HIST_LEN - 1);
        assert_eq!(lat_bucket(999), 0);
        assert_eq!(lat_bucket(1000), 1);
        assert_eq!(lat_bucket(3999), 2);
        assert_eq!(lat_bucket(u64::MAX), LAT_BUCKETS - 1);
        assert_eq!(lat_bucket_le_seconds(2), 4e-6);
    }

    #[test]
    fn channels_count_restore_tags_and_fold_when_closed() {
        let mut r = BdevRegistry::new();
        r.create_null("N", 1 << 20, 4096, None).unwrap();
        let stats = r.stats("N").unwrap();
        let b = r.get("N").unwrap();
        let mut a = b.clone().open_channel();
        let mut c = b.clone().open_channel();
        let tags = run(&mut *a, (0..40).map(|i| io(IoKind::Read, i, 1, 4096, 1000 + i)).collect());
        assert_eq!(tags, (1000..1040).collect::<Vec<_>>(), "the submitter's tags come back");
        run(&mut *c, (0..10).map(|i| io(IoKind::Write, i, 2, 4096, i)).collect());
        run(&mut *c, vec![io(IoKind::Unmap, 0, 8, 4096, 7), io(IoKind::Flush, 0, 0, 4096, 8)]);
        // Out of range: an error, not counted as a read.
        run(&mut *c, vec![io(IoKind::Read, 1 << 20, 1, 4096, 9)]);
        let s = stats.snapshot();
        assert_eq!(s.of(IoKind::Read).ops, 40);
        assert_eq!(s.of(IoKind::Read).bytes, 40 * 4096);
        assert_eq!(s.of(IoKind::Write).ops, 10);
        assert_eq!(s.of(IoKind::Write).bytes, 10 * 8192);
        assert_eq!(s.of(IoKind::Unmap).bytes, 8 * 4096);
        assert_eq!(s.of(IoKind::Flush).ops, 1);
        assert_eq!(s.errors, 1);
        let r0 = s.of(IoKind::Read);
        assert!(r0.min_latency_ticks <= r0.max_latency_ticks && r0.latency_ticks >= r0.max_latency_ticks);
        assert_eq!(r0.buckets.iter().sum::<u64>(), 40);
        assert_eq!(stats.queue_depth(), 0);
        assert_eq!(stats.per_thread().len(), 1, "both channels are on this (non-reactor) thread");
        drop(a);
        drop(c);
        assert_eq!(stats.snapshot(), s, "closed channels' counts are kept");
        let t = stats.per_thread();
        assert_eq!((t.len(), &t[0].1), (1, &s), "and still show per thread");
    }

    #[test]
    fn resets_clear_what_they_say_even_for_idle_channels() {
        let mut r = BdevRegistry::new();
        r.create_malloc(Some("M"), 1024, 512, None).unwrap();
        let stats = r.stats("M").unwrap();
        let mut ch = r.get("M").unwrap().open_channel();
        run(&mut *ch, (0..5).map(|i| io(IoKind::Write, i, 1, 512, i)).collect());
        stats.reset(ResetMode::MaxMin);
        let s = stats.snapshot();
        assert_eq!(s.of(IoKind::Write).ops, 5, "maxmin keeps the counts");
        assert_eq!((s.of(IoKind::Write).min_latency_ticks, s.of(IoKind::Write).max_latency_ticks), (0, 0));
        run(&mut *ch, vec![io(IoKind::Write, 0, 1, 512, 1)]);
        let s = stats.snapshot();
        assert_eq!(s.of(IoKind::Write).ops, 6);
        assert!(s.of(IoKind::Write).max_latency_ticks > 0);
        stats.reset(ResetMode::All);
        assert_eq!(stats.snapshot(), IoStat::default(), "an idle channel reads as reset");
        run(&mut *ch, vec![io(IoKind::Read, 0, 2, 512, 1)]);
        let s = stats.snapshot();
        assert_eq!((s.of(IoKind::Write).ops, s.of(IoKind::Read).ops, s.of(IoKind::Read).bytes), (0, 1, 1024));
    }

    #[test]
    fn histogram_percentiles_from_recorded_latencies() {
        let mut r = BdevRegistry::new();
        r.create_null("N", 1024, 512, None).unwrap();
        let stats = r.stats("N").unwrap();
        let mut ch = r.get("N").unwrap().open_channel();
        run(&mut *ch, vec![io(IoKind::Read, 0, 1, 512, 1)]);
        assert_eq!(stats.percentiles().count, 0, "off by default");
        stats.enable_histogram(true);
        run(&mut *ch, (0..100).map(|i| io(IoKind::Read, i, 1, 512, i)).collect());
        let p = stats.percentiles();
        assert_eq!(p.count, 100);
        assert!(p.min <= p.p50 && p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p99_9 && p.p99_9 <= p.max);
        assert!(p.max > 0.0);
        drop(ch);
        assert_eq!(stats.percentiles().count, 100, "a closed channel's histogram is kept");
        stats.enable_histogram(false);
        stats.enable_histogram(true);
        assert_eq!(stats.percentiles().count, 0, "turning it on again starts empty");
    }
}
