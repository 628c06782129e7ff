//! `riser-perf bdev`: an in-process block benchmark in the manner of SPDK's bdevperf.
//!
//! One device is created; every reactor of the core mask opens its own channel on it and
//! keeps `--qd` I/Os outstanding from a single poller: poll completions, record their
//! latency, resubmit the same slot at once. Everything a reactor touches on the hot path
//! (channel, buffers, RNG, histogram, counters) is its own, so nothing is shared or locked
//! while measuring; histograms are merged once at the end.
//!
//! Time comes from `Ctx::now()`, which the reactor reads once per loop: every I/O submitted
//! or completed in one poll pass is stamped with that one value, so the hot loop makes no
//! clock calls at all.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

use riser_bdev::{Bdev, BdevIo, BdevRegistry, FileKind, IoBuf, IoChannel, IoCompletion, IoKind, Lba};
use riser_reactor::{parse_core_mask, Ctx, PollMode, PollStatus, ReactorConfig, ReactorSet};

use crate::report::{Recorder, Report, Window, WorkerResult};
use riser_initiator::scsi::Dir;
use crate::workload::{self, PollModeArg, Workload};
use crate::MAX_BUFFER_BYTES;

const MIB: u64 = 1024 * 1024;
/// Tags are slot indices; this also bounds the per-reactor buffer count.
const MAX_QD: u32 = 65_536;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DevKind {
    /// Reads return zeros, writes are discarded: measures everything above the device.
    Null,
    /// RAM-backed: data is really copied.
    Malloc,
    /// A file or block device through io_uring, O_DIRECT (--filename), as `bdev_uring_create`.
    Uring,
}

impl DevKind {
    pub fn name(self) -> &'static str {
        match self {
            DevKind::Null => "null",
            DevKind::Malloc => "malloc",
            DevKind::Uring => "uring",
        }
    }

    /// The name the device gets (SPDK's first automatic names).
    fn bdev_name(self) -> &'static str {
        match self {
            DevKind::Null => "Null0",
            DevKind::Malloc => "Malloc0",
            DevKind::Uring => "Uring0",
        }
    }
}

/// Flags of `riser-perf bdev`.
#[derive(Args, Clone, Debug)]
pub struct BdevArgs {
    /// Kind of device to create and measure.
    #[arg(long, value_enum, default_value_t = DevKind::Null)]
    pub bdev: DevKind,

    /// Device size in MiB.
    #[arg(long = "size-mib", value_name = "MIB", default_value_t = 1024)]
    pub size_mib: u64,

    /// Device block size in bytes: 512 or 4096.
    #[arg(long = "block-size", value_name = "BYTES", default_value_t = 512)]
    pub block_size: u32,

    /// Size of every I/O in bytes; a multiple of --block-size.
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    pub bs: u64,

    /// I/Os kept outstanding per reactor (1 to 65536).
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub qd: u32,

    /// Access pattern. Random offsets are uniform over the device and aligned to --bs;
    /// sequential ones start at a different place on each reactor and wrap at the end.
    #[arg(long, value_enum, default_value_t = Workload::Randread)]
    pub rw: Workload,

    /// Percentage of reads for the mixed patterns rw and randrw (0 to 100).
    #[arg(long, value_name = "PCT", default_value_t = 70)]
    pub rwmixread: u8,

    /// Seconds measured (after the ramp).
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub time: u64,

    /// Seconds of load before measuring starts (not counted).
    #[arg(long, value_name = "SECONDS", default_value_t = 1)]
    pub ramp: u64,

    /// Core mask, SPDK syntax: 0x3, 3, [0,1] or [0-3]. One reactor per core.
    #[arg(
        short = 'm',
        long = "cpumask",
        value_name = "MASK",
        default_value = "0x1"
    )]
    pub cpumask: String,

    /// What a reactor does when idle.
    #[arg(long = "poll-mode", value_enum, default_value_t = PollModeArg::Busy)]
    pub poll_mode: PollModeArg,

    /// Do not pin reactor threads to their cores (for machines with fewer cores than the
    /// mask, or shared machines).
    #[arg(long = "no-pin")]
    pub no_pin: bool,

    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    /// --bdev uring: the file or block device (its first --size-mib MiB are used, at most
    /// its size; its block size is --block-size).
    #[arg(long, value_name = "PATH")]
    pub filename: Option<std::path::PathBuf>,
}

/// A validated run description: every field is in range and consistent.
#[derive(Clone, Debug)]
pub struct Plan {
    pub kind: DevKind,
    pub block_size: u32,
    pub num_blocks: u64,
    pub bs: u64,
    /// Blocks per I/O.
    pub io_blocks: u64,
    pub qd: usize,
    pub workload: Workload,
    pub read_pct: u8,
    pub time: Duration,
    pub ramp: Duration,
    pub cores: Vec<usize>,
    pub mode: PollMode,
    pub pin: bool,
    /// --bdev uring's file or device.
    pub filename: Option<std::path::PathBuf>,
}

impl BdevArgs {
    /// Checks the flags and turns them into a [`Plan`], or says what is wrong.
    // `u64::is_multiple_of` is newer than the workspace's rust-version (1.75).
    #[allow(unknown_lints, clippy::manual_is_multiple_of)]
    pub fn plan(&self) -> Result<Plan, String> {
        if self.block_size != 512 && self.block_size != 4096 {
            return Err(format!(
                "--block-size {} is not supported: use 512 or 4096",
                self.block_size
            ));
        }
        let bsz = self.block_size as u64;
        if self.bs == 0 || self.bs % bsz != 0 {
            return Err(format!(
                "--bs {} must be a positive multiple of the block size ({bsz})",
                self.bs
            ));
        }
        if self.qd == 0 || self.qd > MAX_QD {
            return Err(format!(
                "--qd {} is out of range: use 1 to {MAX_QD}",
                self.qd
            ));
        }
        if (self.qd as u64).saturating_mul(self.bs) > MAX_BUFFER_BYTES {
            return Err(format!(
                "--qd {} x --bs {} needs {} MiB of buffers per reactor; the limit is {} MiB",
                self.qd,
                self.bs,
                (self.qd as u64).saturating_mul(self.bs) / MIB,
                MAX_BUFFER_BYTES / MIB
            ));
        }
        crate::check_run_flags(self.time, self.ramp, self.rwmixread as u64)?;
        if self.size_mib == 0 {
            return Err("--size-mib must be at least 1".into());
        }
        let size = self
            .size_mib
            .checked_mul(MIB)
            .ok_or_else(|| format!("--size-mib {} is too large", self.size_mib))?;
        if size < self.bs {
            return Err(format!(
                "--size-mib {} is smaller than one I/O (--bs {})",
                self.size_mib, self.bs
            ));
        }
        let cores =
            parse_core_mask(&self.cpumask).map_err(|e| format!("-m {}: {e}", self.cpumask))?;
        match (self.bdev, &self.filename) {
            (DevKind::Uring, None) => return Err("--bdev uring needs --filename PATH".into()),
            (DevKind::Null | DevKind::Malloc, Some(_)) => {
                return Err("--filename only applies to --bdev uring".into())
            }
            _ => {}
        }
        Ok(Plan {
            filename: self.filename.clone(),
            kind: self.bdev,
            block_size: self.block_size,
            num_blocks: size / bsz,
            bs: self.bs,
            io_blocks: self.bs / bsz,
            qd: self.qd as usize,
            workload: self.rw,
            read_pct: self.rw.read_pct(self.rwmixread),
            time: Duration::from_secs(self.time),
            ramp: Duration::from_secs(self.ramp),
            cores,
            mode: match self.poll_mode {
                PollModeArg::Busy => PollMode::Busy,
                PollModeArg::Adaptive => PollMode::Adaptive,
            },
            pin: !self.no_pin,
        })
    }
}

impl Plan {
    fn config_json(&self, bdev_name: &str) -> serde_json::Value {
        serde_json::json!({
            "bdev": self.kind,
            "bdev_name": bdev_name,
            "size_mib": self.num_blocks * self.block_size as u64 / MIB,
            "block_size": self.block_size,
            "bs": self.bs,
            "qd": self.qd,
            "rw": self.workload,
            "rwmixread": self.read_pct,
            "time_s": self.time.as_secs(),
            "ramp_s": self.ramp.as_secs(),
            "cores": self.cores,
            "poll_mode": match self.mode { PollMode::Busy => "busy", PollMode::Adaptive => "adaptive" },
            "pin": self.pin,
        })
    }

    fn describe(&self, bdev_name: &str) -> String {
        let mix = if self.workload.mixed() {
            format!(" ({} % reads)", self.read_pct)
        } else {
            String::new()
        };
        format!(
            "{bdev_name}: {} MiB, {} B blocks; {}{mix}, {} B I/Os, qd {} per reactor, {} reactor(s) on cores {:?}, {} s measured after {} s ramp",
            self.num_blocks * self.block_size as u64 / MIB,
            self.block_size,
            self.workload.name(),
            self.bs,
            self.qd,
            self.cores.len(),
            self.cores,
            self.time.as_secs(),
            self.ramp.as_secs(),
        )
    }
}

/// Picks the kind and offset of every I/O of one reactor.
#[derive(Clone, Debug)]
pub struct OpGen {
    units: workload::OpGen,
    io_blocks: u64,
}

impl OpGen {
    /// For reactor `index` of `count`; `plan` must be validated (at least one slot).
    pub fn new(plan: &Plan, index: usize, count: usize) -> OpGen {
        let slots = plan.num_blocks / plan.io_blocks;
        OpGen {
            // Seeded with the reactor id.
            units: workload::OpGen::new(
                plan.workload,
                plan.read_pct,
                slots,
                index as u64,
                count as u64,
                index as u64,
            ),
            io_blocks: plan.io_blocks,
        }
    }

    /// The next I/O: (kind, first block).
    #[inline]
    // Endless: an Iterator would only wrap every I/O in Some.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> (IoKind, Lba) {
        let (dir, slot) = self.units.next();
        let kind = match dir {
            Dir::Read => IoKind::Read,
            Dir::Write => IoKind::Write,
        };
        // slot < num_blocks / io_blocks: the product stays below num_blocks.
        (kind, Lba::new(slot * self.io_blocks))
    }
}

/// Set once by the control thread when every reactor is ready: the common time zero.
type StartGate = Arc<OnceLock<Instant>>;
type ResultTx = mpsc::Sender<(usize, Result<WorkerResult, String>)>;

/// One reactor's benchmark state; lives inside its poller.
struct Job {
    reactor: usize,
    core: usize,
    ch: Box<dyn IoChannel>,
    io_blocks: u64,
    gen: OpGen,
    /// Buffers of slots with no I/O in flight (all of them before the start, and again
    /// once stopped); while running, a buffer travels with its I/O.
    idle_bufs: Vec<Option<IoBuf>>,
    /// When each slot's current I/O was submitted, ns since `base`.
    submit_ns: Vec<u64>,
    /// Completions of one pass; reused so polling never allocates.
    done: Vec<IoCompletion>,
    inflight: usize,

    gate: StartGate,
    abort: Arc<AtomicBool>,
    window: Window,
    base: Option<Instant>,
    started: bool,

    rec: Recorder,
    errors: u64,
    first_error: Option<String>,
    tx: Option<ResultTx>,
}

fn busy_idle(ctx: &Ctx) -> (u64, u64) {
    // Allocates a Vec of all reactors' stats: fine, this runs twice per benchmark.
    ctx.handle()
        .stats()
        .into_iter()
        .find(|s| s.reactor == ctx.reactor_id())
        .map_or((0, 0), |s| (s.busy_ns, s.idle_ns))
}

impl Job {
    #[allow(clippy::too_many_arguments)]
    fn new(
        ctx: &Ctx,
        bdev: Arc<dyn Bdev>,
        plan: &Plan,
        count: usize,
        gate: StartGate,
        abort: Arc<AtomicBool>,
        tx: ResultTx,
    ) -> Job {
        let reactor = ctx.reactor_id();
        // Opened and allocated here, on the reactor, so the memory is first touched by
        // the core that will use it.
        let ch = bdev.open_channel();
        let idle_bufs = (0..plan.qd)
            .map(|i| {
                // A recognisable non-zero pattern, so writes carry real data.
                let mut b = IoBuf::alloc(plan.bs as usize);
                b.fill((i as u8) | 1);
                Some(b)
            })
            .collect();
        Job {
            reactor,
            core: ctx.core(),
            ch,
            io_blocks: plan.io_blocks,
            gen: OpGen::new(plan, reactor, count),
            idle_bufs,
            submit_ns: vec![0; plan.qd],
            done: Vec::with_capacity(plan.qd),
            inflight: 0,
            gate,
            abort,
            window: Window::new(plan.ramp, plan.time),
            base: None,
            started: false,
            rec: Recorder::default(),
            errors: 0,
            first_error: None,
            tx: Some(tx),
        }
    }

    #[inline]
    fn submit(&mut self, slot: usize, buf: Option<IoBuf>, now_ns: u64) {
        let (kind, offset_blocks) = self.gen.next();
        self.submit_ns[slot] = now_ns;
        self.inflight += 1;
        self.ch.submit(BdevIo {
            kind,
            offset_blocks,
            num_blocks: self.io_blocks,
            buf,
            tag: slot as u64,
            fua: false,
        });
    }

    /// Ends the measurement window (on time, on error, or on request) and stops issuing.
    fn stop(&mut self, ctx: &Ctx, now_ns: u64) {
        if self.window.stop(now_ns, || busy_idle(ctx)) {
            self.rec.flush();
        }
    }

    /// One poll pass.
    fn pass(&mut self, ctx: &mut Ctx) -> PollStatus {
        let now = ctx.now();
        let base = match self.base {
            Some(b) => b,
            None => match self.gate.get() {
                Some(&t0) => {
                    self.base = Some(t0);
                    t0
                }
                None => return PollStatus::Idle,
            },
        };
        // This loop's clock may be a hair older than the start the control thread set.
        let now_ns = now.saturating_duration_since(base).as_nanos() as u64;

        // Phase changes: a few compares per pass.
        let abort = &self.abort;
        if self
            .window
            .tick(now_ns, || abort.load(Ordering::Relaxed), || busy_idle(ctx))
        {
            self.rec.flush();
        }

        // Taken out and put back so the loop can call `&mut self` methods; no allocation.
        let mut done = std::mem::take(&mut self.done);
        self.ch.poll(&mut done);
        let mut worked = !done.is_empty();
        for c in done.drain(..) {
            let slot = c.tag as usize;
            self.inflight -= 1;
            if let Err(e) = c.result {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(format!("{:?} I/O failed: {e}", c.kind));
                }
                self.idle_bufs[slot] = c.buf;
                self.stop(ctx, now_ns);
                continue;
            }
            if self.window.measuring() {
                let lat = now_ns.saturating_sub(self.submit_ns[slot]);
                self.rec.record(lat, c.kind == IoKind::Read);
            }
            if self.window.stopping() {
                self.idle_bufs[slot] = c.buf;
            } else {
                self.submit(slot, c.buf, now_ns);
            }
        }
        self.done = done;

        // The first load goes in after this pass's poll, so that every I/O is completed by a
        // later poll than the one it was submitted in, i.e. with a later timestamp: a
        // device that completes inside `submit` would otherwise show 0 ns latencies.
        if !self.started {
            self.started = true;
            if !self.window.stopping() {
                for slot in 0..self.idle_bufs.len() {
                    let buf = self.idle_bufs[slot].take();
                    self.submit(slot, buf, now_ns);
                }
                worked = true;
            }
        }

        if self.window.stopping() && self.inflight == 0 {
            self.finish();
            return PollStatus::Done;
        }
        if worked {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    fn finish(&mut self) {
        let Some(tx) = self.tx.take() else { return };
        let result = match self.first_error.take() {
            Some(e) => Err(e),
            None => Ok(WorkerResult {
                reactor: self.reactor,
                core: self.core,
                ios: self.rec.ios,
                reads: self.rec.reads,
                errors: self.errors,
                elapsed_ns: self.window.elapsed_ns(),
                busy_ns: self.window.probe_delta().0,
                idle_ns: self.window.probe_delta().1,
                hist: self.rec.take_hist(),
            }),
        };
        // The receiver gone means the control thread gave up already; nothing to do.
        let _ = tx.send((self.reactor, result));
    }
}

/// Creates the device, runs the benchmark on every reactor of the plan and returns the report.
pub fn run(plan: &Plan) -> Result<Report, String> {
    let mut reg = BdevRegistry::new();
    let name = match plan.kind {
        DevKind::Null => reg.create_null(
            plan.kind.bdev_name(),
            plan.num_blocks,
            plan.block_size,
            None,
        ),
        DevKind::Malloc => reg.create_malloc(
            Some(plan.kind.bdev_name()),
            plan.num_blocks,
            plan.block_size,
            None,
        ),
        DevKind::Uring => {
            let f = plan.filename.as_ref().and_then(|p| p.to_str()).ok_or("--filename is not a UTF-8 path")?;
            reg.create_file(FileKind::Uring, plan.kind.bdev_name(), f, Some(plan.block_size), false, None)
        }
    }
    .map_err(|e| format!("cannot create the {} device: {e}", plan.kind.name()))?;
    let bdev = reg
        .get(&name)
        .ok_or_else(|| format!("bdev {name} vanished after creation"))?;
    // A file may be smaller than --size-mib: use what it has.
    let mut plan = plan.clone();
    plan.num_blocks = plan.num_blocks.min(bdev.info().num_blocks());
    if plan.num_blocks < plan.io_blocks {
        return Err(format!("the device has {} blocks, fewer than one I/O", plan.num_blocks));
    }
    run_on(&plan, bdev)
}

/// Runs the benchmark of `plan` against an existing device (its geometry must match the
/// plan's: `num_blocks`, `block_size`).
pub fn run_on(plan: &Plan, bdev: Arc<dyn Bdev>) -> Result<Report, String> {
    let name = bdev.info().name.clone();
    log::info!("{}", plan.describe(&name));

    let set = ReactorSet::start(ReactorConfig {
        cores: plan.cores.clone(),
        mode: plan.mode,
        ring_size: 64,
        pin: plan.pin,
    })
    .map_err(|e| format!("cannot start reactors: {e}"))?;
    let h = set.handle();
    let gate: StartGate = Arc::new(OnceLock::new());
    let abort = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let count = h.len();

    // Set up every reactor first (channel, buffers), then start them all at one instant.
    for r in 0..count {
        let (bdev, plan, gate, abort, tx) = (
            bdev.clone(),
            plan.clone(),
            gate.clone(),
            abort.clone(),
            tx.clone(),
        );
        h.call(r, move |ctx| {
            let mut job = Job::new(ctx, bdev, &plan, count, gate, abort, tx);
            ctx.add_poller(move |ctx| job.pass(ctx));
        })
        .map_err(|e| format!("reactor {r}: {e}"))?;
    }
    drop(tx);
    let _ = gate.set(Instant::now());

    // Every job reports by itself once its window is over; allow generous slack for a
    // loaded machine before declaring a reactor stuck.
    let deadline = Instant::now() + plan.ramp + plan.time + Duration::from_secs(30);
    let mut results: Vec<Option<WorkerResult>> = (0..count).map(|_| None).collect();
    let mut first_err: Option<String> = None;
    for _ in 0..count {
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok((r, Ok(w))) => results[r] = Some(w),
            Ok((r, Err(e))) => {
                // One reactor failed: stop the others now rather than waiting out --time.
                abort.store(true, Ordering::Relaxed);
                first_err
                    .get_or_insert_with(|| format!("reactor {r} (core {}): {e}", plan.cores[r]));
            }
            Err(_) => {
                abort.store(true, Ordering::Relaxed);
                first_err.get_or_insert_with(|| "a reactor did not finish in time".to_string());
                break;
            }
        }
    }
    set.shutdown();
    if let Some(e) = first_err {
        return Err(e);
    }
    let workers: Vec<WorkerResult> = results.into_iter().flatten().collect();
    Ok(Report::build(
        plan.describe(&name),
        plan.config_json(&name),
        plan.bs,
        &workers,
    ))
}

/// `riser-perf bdev`: validate, run, print.
pub fn main(args: &BdevArgs) -> Result<(), String> {
    let plan = args.plan()?;
    let report = run(&plan)?;
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.human());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: BdevArgs,
    }

    fn args(extra: &[&str]) -> BdevArgs {
        let mut v = vec!["t"];
        v.extend_from_slice(extra);
        T::try_parse_from(v).expect("flags parse").a
    }

    fn plan_err(extra: &[&str]) -> String {
        args(extra).plan().expect_err("plan should be rejected")
    }

    #[test]
    fn defaults_are_bdevperf_like() {
        let p = args(&[]).plan().unwrap();
        assert_eq!(p.kind, DevKind::Null);
        assert_eq!((p.block_size, p.bs, p.io_blocks, p.qd), (512, 4096, 8, 128));
        assert_eq!(p.num_blocks, 1024 * MIB / 512);
        assert_eq!(p.workload, Workload::Randread);
        assert_eq!(p.read_pct, 100);
        assert_eq!(
            (p.time, p.ramp),
            (Duration::from_secs(5), Duration::from_secs(1))
        );
        assert_eq!(p.cores, vec![0]);
        assert_eq!(p.mode, PollMode::Busy);
        assert!(p.pin);
        let p = args(&[
            "--rw",
            "randrw",
            "--rwmixread",
            "30",
            "-m",
            "[0-1]",
            "--no-pin",
            "--poll-mode",
            "adaptive",
        ])
        .plan()
        .unwrap();
        assert_eq!(p.read_pct, 30);
        assert_eq!(p.cores, vec![0, 1]);
        assert!(!p.pin);
        assert_eq!(p.mode, PollMode::Adaptive);
        assert_eq!(
            args(&["--rw", "write", "--rwmixread", "30"])
                .plan()
                .unwrap()
                .read_pct,
            0
        );
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        assert!(plan_err(&["--bs", "1000"]).contains("multiple of the block size (512)"));
        assert!(plan_err(&["--block-size", "4096", "--bs", "512"])
            .contains("multiple of the block size (4096)"));
        assert!(plan_err(&["--bs", "0"]).contains("--bs 0"));
        assert!(plan_err(&["--block-size", "1024"]).contains("512 or 4096"));
        assert!(plan_err(&["--qd", "0"]).contains("--qd 0"));
        assert!(plan_err(&["--qd", "1000000"]).contains("--qd"));
        assert!(plan_err(&["--qd", "65536", "--bs", "1048576"]).contains("buffers per reactor"));
        assert!(plan_err(&["--time", "0"]).contains("--time 0"));
        assert!(plan_err(&["--ramp", "99999999"]).contains("--ramp"));
        assert!(plan_err(&["--rwmixread", "101"]).contains("0 to 100"));
        assert!(plan_err(&["--size-mib", "0"]).contains("--size-mib"));
        assert!(plan_err(&["--size-mib", "18446744073709551615"]).contains("too large"));
        assert!(plan_err(&["--size-mib", "1", "--bs", "2097152"]).contains("smaller than one I/O"));
        assert!(plan_err(&["-m", "0x0"]).contains("-m 0x0"));
        assert!(plan_err(&["-m", "zz"]).contains("-m zz"));
        // Not numbers at all: clap's own error, not a panic.
        assert!(T::try_parse_from(["t", "--qd", "-1"]).is_err());
        assert!(T::try_parse_from(["t", "--rw", "sideways"]).is_err());
        assert!(T::try_parse_from(["t", "--bdev", "nvme"]).is_err());
    }

    fn plan_for(workload: Workload, num_blocks: u64, io_blocks: u64) -> Plan {
        Plan {
            kind: DevKind::Null,
            block_size: 512,
            num_blocks,
            bs: io_blocks * 512,
            io_blocks,
            qd: 1,
            workload,
            read_pct: workload.read_pct(70),
            time: Duration::from_secs(1),
            ramp: Duration::ZERO,
            cores: vec![0],
            mode: PollMode::Busy,
            pin: false,
            filename: None,
        }
    }

    #[test]
    fn offsets_stay_in_range_and_aligned() {
        for &(num_blocks, io_blocks) in &[
            (1003u64, 8u64),
            (8, 8),
            (15, 8),
            (1 << 21, 8),
            (4096, 1),
            (100, 7),
        ] {
            for w in [
                Workload::Randread,
                Workload::Read,
                Workload::Randrw,
                Workload::Write,
            ] {
                let plan = plan_for(w, num_blocks, io_blocks);
                for reactor in 0..3 {
                    let mut g = OpGen::new(&plan, reactor, 3);
                    let mut seen_last = false;
                    for _ in 0..20_000 {
                        let off = g.next().1.get();
                        assert_eq!(
                            off % io_blocks,
                            0,
                            "{w:?}: offset {off} not aligned to {io_blocks}"
                        );
                        assert!(
                            off + io_blocks <= num_blocks,
                            "{w:?}: {off}+{io_blocks} past {num_blocks}"
                        );
                        seen_last |= off + 2 * io_blocks > num_blocks;
                    }
                    // Both kinds reach the end of the device (random: 20000 draws is plenty
                    // for these sizes except the 1 GiB one).
                    if num_blocks < 1 << 20 {
                        assert!(
                            seen_last,
                            "{w:?} never reached the last slot of {num_blocks}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn sequential_wraps_and_starts_spread() {
        let plan = plan_for(Workload::Read, 80, 8);
        let mut g = OpGen::new(&plan, 1, 2);
        let offs: Vec<u64> = (0..12).map(|_| g.next().1.get()).collect();
        assert_eq!(offs, vec![40, 48, 56, 64, 72, 0, 8, 16, 24, 32, 40, 48]);
        assert_eq!(OpGen::new(&plan, 0, 2).next().1, Lba::ZERO);
    }

    #[test]
    fn mixed_workload_respects_rwmixread() {
        for pct in [0u8, 10, 50, 70, 100] {
            let mut plan = plan_for(Workload::Randrw, 1 << 20, 8);
            plan.read_pct = pct;
            let mut g = OpGen::new(&plan, 0, 1);
            let n = 200_000;
            let reads = (0..n).filter(|_| g.next().0 == IoKind::Read).count();
            let got = reads as f64 * 100.0 / n as f64;
            assert!(
                (got - pct as f64).abs() < 1.0,
                "rwmixread {pct}: got {got:.2} % reads"
            );
        }
        let mut g = OpGen::new(&plan_for(Workload::Randread, 1 << 20, 8), 0, 1);
        assert!((0..1000).all(|_| g.next().0 == IoKind::Read));
        let mut g = OpGen::new(&plan_for(Workload::Randwrite, 1 << 20, 8), 0, 1);
        assert!((0..1000).all(|_| g.next().0 == IoKind::Write));
    }

    fn short_run(extra: &[&str]) -> Report {
        let mut v = vec![
            "--time",
            "1",
            "--ramp",
            "0",
            "--no-pin",
            "--size-mib",
            "16",
            "--qd",
            "16",
        ];
        v.extend_from_slice(extra);
        let plan = args(&v).plan().unwrap();
        run(&plan).expect("benchmark run")
    }

    #[test]
    fn real_run_malloc_randrw_completes_without_errors() {
        let r = short_run(&[
            "--bdev",
            "malloc",
            "--rw",
            "randrw",
            "--rwmixread",
            "70",
            "--block-size",
            "4096",
            "--bs",
            "8192",
        ]);
        let t = &r.total;
        assert!(t.ios > 1000, "only {} I/Os in a second", t.ios);
        assert_eq!(t.errors, 0);
        let pct = t.reads as f64 * 100.0 / t.ios as f64;
        assert!((pct - 70.0).abs() < 5.0, "{pct:.1} % reads");
        assert!(t.iops > 0.0 && t.mib_per_s > 0.0);
        assert!(t.latency.min_us > 0.0 && t.latency.max_us >= t.latency.p999_us);
        assert_eq!(r.reactors.len(), 1);
        assert!(
            r.reactors[0].elapsed_s >= 0.99 && r.reactors[0].elapsed_s < 3.0,
            "{}",
            r.reactors[0].elapsed_s
        );
        assert!(r.total.busy_pct > 0.0);
        assert_eq!(r.config["bdev"], "malloc");
        assert_eq!(r.config["rw"], "randrw");
    }

    #[test]
    fn real_run_null_seq_write_two_reactors() {
        let r = short_run(&["--rw", "write", "-m", "0x3", "--poll-mode", "adaptive"]);
        assert_eq!(r.reactors.len(), 2);
        assert!(r
            .reactors
            .iter()
            .all(|w| w.ios > 1000 && w.errors == 0 && w.reads == 0));
        assert_eq!(r.total.ios, r.reactors[0].ios + r.reactors[1].ios);
    }

    /// A device whose every I/O fails, to check that device errors abort the run.
    struct FailingBdev(riser_bdev::BdevInfo);
    struct FailingChannel(Vec<IoCompletion>);

    impl Bdev for FailingBdev {
        fn info(&self) -> &riser_bdev::BdevInfo {
            &self.0
        }
        fn supports(&self, _: IoKind) -> bool {
            true
        }
        fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
            Box::new(FailingChannel(Vec::new()))
        }
        fn config_json(&self) -> (&'static str, serde_json::Value) {
            ("none", serde_json::Value::Null)
        }
    }

    impl IoChannel for FailingChannel {
        fn submit(&mut self, io: BdevIo) {
            let result = Err(riser_bdev::BdevError::Io("injected media error".into()));
            self.0.push(IoCompletion {
                tag: io.tag,
                kind: io.kind,
                result,
                buf: io.buf,
            });
        }
        fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
            let n = self.0.len();
            out.append(&mut self.0);
            n
        }
        fn outstanding(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn device_errors_abort_the_run_quickly_with_the_message() {
        let plan = args(&[
            "--time",
            "30",
            "--ramp",
            "0",
            "--no-pin",
            "-m",
            "0x3",
            "--size-mib",
            "1",
        ])
        .plan()
        .unwrap();
        let bdev = Arc::new(FailingBdev(riser_bdev::BdevInfo::new(
            "Fail0",
            "test",
            plan.block_size,
            plan.num_blocks,
            Default::default(),
        )));
        let t = Instant::now();
        let e = run_on(&plan, bdev).expect_err("every I/O fails");
        assert!(
            e.contains("injected media error") && e.contains("reactor"),
            "{e}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "took {:?} to abort",
            t.elapsed()
        );
    }

    #[test]
    fn device_creation_failure_is_an_error_not_a_panic() {
        // 2^60 bytes of RAM: the allocation fails and is reported.
        let plan = args(&[
            "--bdev",
            "malloc",
            "--size-mib",
            "1099511627776",
            "--time",
            "1",
            "--no-pin",
        ])
        .plan()
        .unwrap();
        let e = run(&plan).expect_err("an exabyte malloc device cannot be created");
        assert!(e.contains("cannot create the malloc device"), "{e}");
    }
}
