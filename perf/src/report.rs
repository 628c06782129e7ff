//! What a benchmark worker measures ([`Recorder`], over a [`Window`]), the results of a run
//! and how they are printed: one line per worker (reactor), then a total block; or one JSON
//! object.
//!
//! Kept free of anything bdev-specific: the initiator mode (`riser-perf URL...`) hands in
//! its client threads as workers (busy = the thread's CPU time) and formats its own summary.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in nanoseconds up to this bound; larger values are clamped to it
/// (an hour is far past anything a healthy run sees, and keeps the histogram small).
pub const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// A latency histogram in nanoseconds with 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // Constant bounds that hdrhistogram always accepts (low >= 1, high >= 2 * low, sigfig <= 5).
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("constant histogram bounds are valid")
}

/// What a worker measures while its window is open: I/Os, reads, and their latencies in a
/// histogram ([`new_histogram`]). Runs of equal latencies are recorded with one histogram
/// call: on a device that completes a whole batch in one pass, a pass produces one run, so
/// the histogram is touched once per pass instead of once per I/O.
pub struct Recorder {
    pub ios: u64,
    /// Of which reads.
    pub reads: u64,
    hist: Histogram<u64>,
    /// The run of equal latencies not recorded yet: (latency, count).
    run: (u64, u64),
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            ios: 0,
            reads: 0,
            hist: new_histogram(),
            run: (0, 0),
        }
    }
}

impl Recorder {
    /// One completed I/O of `lat_ns`.
    #[inline]
    pub fn record(&mut self, lat_ns: u64, read: bool) {
        self.ios += 1;
        self.reads += read as u64;
        if lat_ns == self.run.0 {
            self.run.1 += 1;
        } else {
            self.flush();
            self.run = (lat_ns, 1);
        }
    }

    /// Records the pending run (at the end of the window).
    pub fn flush(&mut self) {
        if self.run.1 > 0 {
            self.hist.saturating_record_n(self.run.0, self.run.1);
            self.run.1 = 0;
        }
    }

    /// The histogram of everything recorded (a fresh one is left in its place).
    pub fn take_hist(&mut self) -> Histogram<u64> {
        self.flush();
        std::mem::replace(&mut self.hist, new_histogram())
    }
}

/// The phases of a timed run, in ns from its start: load without measuring (the ramp),
/// the measured window, then stopping (no new I/Os; those in flight drain). A probe
/// (CPU time, reactor busy/idle time: two counters) is read as the window opens and closes.
pub struct Window {
    ramp_ns: u64,
    end_ns: u64,
    measuring: bool,
    stopping: bool,
    start_ns: u64,
    stop_ns: u64,
    elapsed_ns: u64,
    probe_start: (u64, u64),
    probe_end: (u64, u64),
}

impl Window {
    /// `ramp` of load, then `time` measured.
    pub fn new(ramp: std::time::Duration, time: std::time::Duration) -> Window {
        let ramp_ns = ramp.as_nanos() as u64;
        Window {
            ramp_ns,
            end_ns: ramp_ns + time.as_nanos() as u64,
            measuring: false,
            stopping: false,
            start_ns: 0,
            stop_ns: 0,
            elapsed_ns: 0,
            probe_start: (0, 0),
            probe_end: (0, 0),
        }
    }

    /// Moves on to `now_ns`: opens the window once the ramp is over, stops at the end of the
    /// time or, before that, as soon as `abort()` says so. True when it stopped now.
    #[inline]
    pub fn tick(
        &mut self,
        now_ns: u64,
        abort: impl FnOnce() -> bool,
        mut probe: impl FnMut() -> (u64, u64),
    ) -> bool {
        if self.stopping {
            return false;
        }
        if !self.measuring && now_ns >= self.ramp_ns {
            self.measuring = true;
            self.start_ns = now_ns;
            self.probe_start = probe();
        }
        if now_ns >= self.end_ns || abort() {
            return self.stop(now_ns, probe);
        }
        false
    }

    /// Stops now (the end, or an error): closes the window if it is open. False when it was
    /// stopping already.
    pub fn stop(&mut self, now_ns: u64, mut probe: impl FnMut() -> (u64, u64)) -> bool {
        if self.stopping {
            return false;
        }
        self.stopping = true;
        self.stop_ns = now_ns;
        if self.measuring {
            self.measuring = false;
            self.elapsed_ns = now_ns - self.start_ns;
            self.probe_end = probe();
        }
        true
    }

    /// Within the measured window: completions count.
    #[inline]
    pub fn measuring(&self) -> bool {
        self.measuring
    }

    /// Stopped: no new I/Os.
    #[inline]
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// When it stopped.
    pub fn stop_ns(&self) -> u64 {
        self.stop_ns
    }

    /// The length of the measured window (0 if it never opened).
    pub fn elapsed_ns(&self) -> u64 {
        self.elapsed_ns
    }

    /// How much each of the probe's counters moved over the window.
    pub fn probe_delta(&self) -> (u64, u64) {
        (
            self.probe_end.0.saturating_sub(self.probe_start.0),
            self.probe_end.1.saturating_sub(self.probe_start.1),
        )
    }
}

/// What one worker (a reactor) measured over its measurement window.
#[derive(Clone, Debug)]
pub struct WorkerResult {
    pub reactor: usize,
    pub core: usize,
    /// I/Os completed in the window.
    pub ios: u64,
    /// Of which reads (the rest are writes).
    pub reads: u64,
    /// Failed I/Os (any phase).
    pub errors: u64,
    /// Length of the window in nanoseconds.
    pub elapsed_ns: u64,
    /// Reactor loop time over the window, from `ReactorHandle::stats()`.
    pub busy_ns: u64,
    pub idle_ns: u64,
    /// Completion latencies (ns) of the I/Os counted in `ios`.
    pub hist: Histogram<u64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Latency {
    pub avg_us: f64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn from_histogram(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency {
                avg_us: 0.0,
                min_us: 0.0,
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                p9999_us: 0.0,
                max_us: 0.0,
            };
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            avg_us: h.mean() / 1000.0,
            min_us: us(h.min()),
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            p9999_us: us(h.value_at_quantile(0.9999)),
            max_us: us(h.max()),
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WorkerLine {
    pub reactor: usize,
    pub core: usize,
    pub ios: u64,
    pub reads: u64,
    pub writes: u64,
    pub errors: u64,
    pub elapsed_s: f64,
    pub iops: f64,
    pub mib_per_s: f64,
    pub busy_pct: f64,
    pub latency: Latency,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Total {
    pub ios: u64,
    pub reads: u64,
    pub writes: u64,
    pub errors: u64,
    /// Sum of the workers' rates (each over its own window).
    pub iops: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub mib_per_s: f64,
    /// Mean of the workers' busy percentages.
    pub busy_pct: f64,
    pub latency: Latency,
}

/// A finished run: what was run (`title` for people, `config` free-form for machines),
/// per-worker lines and the total.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    #[serde(skip)]
    pub title: String,
    pub config: serde_json::Value,
    pub reactors: Vec<WorkerLine>,
    pub total: Total,
}

fn rate(n: u64, elapsed_ns: u64) -> f64 {
    if elapsed_ns == 0 {
        0.0
    } else {
        n as f64 * 1e9 / elapsed_ns as f64
    }
}

fn busy_pct(busy: u64, idle: u64) -> f64 {
    let all = busy.saturating_add(idle);
    if all == 0 {
        0.0
    } else {
        busy as f64 * 100.0 / all as f64
    }
}

impl Report {
    /// Builds the report; `io_bytes` is the size of every I/O. Histograms are merged here.
    pub fn build(
        title: String,
        config: serde_json::Value,
        io_bytes: u64,
        workers: &[WorkerResult],
    ) -> Report {
        const MIB: f64 = 1024.0 * 1024.0;
        let mut merged = new_histogram();
        let mut reactors = Vec::with_capacity(workers.len());
        let (mut ios, mut reads, mut errors) = (0u64, 0u64, 0u64);
        let (mut iops, mut read_iops, mut busy_sum) = (0.0, 0.0, 0.0);
        for w in workers {
            // Both histograms have the same bounds, and values were clamped on recording,
            // so adding cannot fail; were it to, the total would only undercount.
            let _ = merged.add(&w.hist);
            let r = rate(w.ios, w.elapsed_ns);
            let busy = busy_pct(w.busy_ns, w.idle_ns);
            reactors.push(WorkerLine {
                reactor: w.reactor,
                core: w.core,
                ios: w.ios,
                reads: w.reads,
                writes: w.ios - w.reads,
                errors: w.errors,
                elapsed_s: w.elapsed_ns as f64 / 1e9,
                iops: r,
                mib_per_s: r * io_bytes as f64 / MIB,
                busy_pct: busy,
                latency: Latency::from_histogram(&w.hist),
            });
            ios += w.ios;
            reads += w.reads;
            errors += w.errors;
            iops += r;
            read_iops += rate(w.reads, w.elapsed_ns);
            busy_sum += busy;
        }
        let n = workers.len().max(1) as f64;
        let total = Total {
            ios,
            reads,
            writes: ios - reads,
            errors,
            iops,
            read_iops,
            write_iops: (iops - read_iops).max(0.0),
            mib_per_s: iops * io_bytes as f64 / MIB,
            busy_pct: busy_sum / n,
            latency: Latency::from_histogram(&merged),
        };
        Report {
            title,
            config,
            reactors,
            total,
        }
    }

    /// The human-readable form.
    pub fn human(&self) -> String {
        // Writing into a String cannot fail.
        let mut s = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(s, "{}", self.title);
        }
        for r in &self.reactors {
            let _ = writeln!(
                s,
                "reactor {} (core {}): {:.0} IOPS, {:.2} MiB/s",
                r.reactor, r.core, r.iops, r.mib_per_s
            );
        }
        let t = &self.total;
        let l = &t.latency;
        let _ = writeln!(s, "total:");
        let _ = writeln!(
            s,
            "  IOPS:      {:.0} (read {:.0}, write {:.0})",
            t.iops, t.read_iops, t.write_iops
        );
        let _ = writeln!(s, "  MiB/s:     {:.2}", t.mib_per_s);
        let _ = writeln!(s, "  I/Os:      {} ({} errors)", t.ios, t.errors);
        let _ = writeln!(
            s,
            "  latency:   avg {:.2} us, min {:.2} us, p50 {:.2} us, p90 {:.2} us, p99 {:.2} us, p99.9 {:.2} us, p99.99 {:.2} us, max {:.2} us",
            l.avg_us, l.min_us, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.p9999_us, l.max_us
        );
        let per: Vec<String> = self
            .reactors
            .iter()
            .map(|r| format!("reactor {} {:.1} %", r.reactor, r.busy_pct))
            .collect();
        let _ = writeln!(s, "  busy:      {:.1} % ({})", t.busy_pct, per.join(", "));
        s
    }

    pub fn json(&self) -> String {
        // Only plain numbers, strings and a serde_json::Value: serialization cannot fail,
        // but an error message is still better than a panic.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(reactor: usize, ios: u64, reads: u64, lat_ns: u64) -> WorkerResult {
        let mut hist = new_histogram();
        hist.saturating_record_n(lat_ns, ios);
        WorkerResult {
            reactor,
            core: reactor,
            ios,
            reads,
            errors: 0,
            elapsed_ns: 2_000_000_000,
            busy_ns: 3,
            idle_ns: 1,
            hist,
        }
    }

    #[test]
    fn totals_sum_rates_and_merge_latency() {
        let r = Report::build(
            String::new(),
            serde_json::json!({"bs": 4096}),
            4096,
            &[
                worker(0, 2_000_000, 1_400_000, 10_000),
                worker(1, 4_000_000, 0, 30_000),
            ],
        );
        assert_eq!(r.reactors[0].iops, 1_000_000.0);
        assert_eq!(r.reactors[1].iops, 2_000_000.0);
        assert_eq!(r.total.iops, 3_000_000.0);
        assert_eq!(r.total.read_iops, 700_000.0);
        assert_eq!(r.total.write_iops, 2_300_000.0);
        assert!((r.total.mib_per_s - 3_000_000.0 * 4096.0 / 1048576.0).abs() < 1e-6);
        assert_eq!(r.total.busy_pct, 75.0);
        // 1/3 of the samples at 10 us, 2/3 at 30 us (3 significant digits).
        let l = &r.total.latency;
        assert!((l.avg_us - 70.0 / 3.0).abs() < 0.05, "avg {}", l.avg_us);
        assert!((l.p50_us - 30.0).abs() < 0.05 && (l.max_us - 30.0).abs() < 0.05);
        let human = r.human();
        assert!(
            human.starts_with("reactor 0 (core 0): 1000000 IOPS, 3906.25 MiB/s\n"),
            "{human}"
        );
        assert!(human.contains("p99.9"));
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["total"]["ios"], 6_000_000);
        assert_eq!(v["reactors"][1]["core"], 1);
        assert_eq!(v["config"]["bs"], 4096);
        assert!(v["total"]["latency"]["p999_us"].is_number());
    }

    #[test]
    fn empty_window_gives_zeros_not_nan() {
        let mut w = worker(0, 0, 0, 1);
        w.elapsed_ns = 0;
        w.busy_ns = 0;
        w.idle_ns = 0;
        let r = Report::build("t".into(), serde_json::Value::Null, 512, &[w]);
        assert_eq!(r.total.iops, 0.0);
        assert_eq!(r.total.busy_pct, 0.0);
        assert_eq!(r.total.latency.avg_us, 0.0);
    }
}
