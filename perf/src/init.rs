//! `riser-perf [flags] URL...`: the initiator mode. Logs in to every target URL with
//! `--sessions` sessions each, spreads the sessions over one client thread per core of `-m`,
//! and keeps `--qd` I/Os outstanding on every session.
//!
//! Each client thread owns its connections outright: it logs them in, runs its polling loop
//! over them (no locks, no shared queues; the clock is read once per connection pass with
//! completions), records latencies in its own histogram and publishes running totals for
//! the live line through relaxed atomics. The control thread only starts phases, prints the
//! live line once a second and merges the results at the end.
//!
//! `--verify` writes every block of the LBA range in the self-checking format of
//! [`crate::verify`], optionally pauses (`--verify-pause`, to tamper with the LUN from
//! elsewhere), reads everything back and reports each mismatch; `--verify-only` does just
//! the read pass, for the generation given with `--generation`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::report::{Latency, Recorder, Report, Window, WorkerResult};
use crate::scsi::{Completion, Dir};
use crate::session::{LoginOptions, Negotiated, INITIATOR_NAME, MAX_QD};
use crate::sys::{self, pin_to, rusage, thread_cpu};
use crate::transport::Session;
use crate::url::{self, TargetUrl, Transport};
use crate::verify::{self, Mismatches};
use crate::workload::{OpGen, PollModeArg, Workload};

const MIB: f64 = 1024.0 * 1024.0;
use crate::MAX_SECONDS;
const MAX_SESSIONS: usize = 1024;
/// Buffers of one thread (sessions x qd x bs) may not exceed this.
const MAX_BUFFER_BYTES: u64 = 4 << 30;
/// How long in-flight I/Os may take to finish after the end of the run.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Adaptive polling: passes without progress before sleeping in poll(2).
/// One empty pass is enough: measured on a shared 2-core machine against tgt, longer spins
/// (32 passes, or busy polling) cost the target CPU time and IOPS.
const SPIN_PASSES: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DigestArg {
    None,
    Header,
    Data,
    Both,
}

/// Flags of the initiator mode (`riser-perf [flags] URL...`).
#[derive(Args, Clone, Debug)]
pub struct InitArgs {
    /// Targets: iscsi://host[:port]/IQN/LUN (iSCSI over TCP) or iser://host[:port]/IQN/LUN
    /// (iSER over RDMA: InfiniBand, RoCE); port 3260 by default.
    #[arg(value_name = "URL")]
    pub urls: Vec<String>,

    /// Access pattern. Random offsets are uniform over the LBA range and aligned to --bs;
    /// sequential streams start spread over the range (one per session) and wrap.
    #[arg(long, value_enum, default_value_t = Workload::Randread)]
    pub rw: Workload,

    /// Percentage of reads for rw and randrw (0 to 100).
    #[arg(long, value_name = "PCT", default_value_t = 70)]
    pub rwmixread: u8,

    /// Size of every I/O in bytes: a multiple of the LUN's block size.
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    pub bs: u64,

    /// I/Os kept outstanding per session (1 to 4096); the target's CmdSN window may hold
    /// some back.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub qd: u32,

    /// Seconds measured (after the ramp).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub time: u64,

    /// Seconds of load before measuring starts (not counted).
    #[arg(long, value_name = "SECONDS", default_value_t = 1)]
    pub ramp: u64,

    /// Part of the LUN to use, in logical blocks: START:COUNT (default: the whole LUN).
    #[arg(long = "lba-range", value_name = "START:COUNT")]
    pub lba_range: Option<String>,

    /// Client threads, one per core of the mask (SPDK syntax: 0x3, 3, [0,1], [0-3]),
    /// each pinned to its core.
    #[arg(
        short = 'm',
        long = "cpumask",
        value_name = "MASK",
        default_value = "0x1"
    )]
    pub cpumask: String,

    /// Do not pin client threads to their cores.
    #[arg(long = "no-pin")]
    pub no_pin: bool,

    /// What a client thread does when a pass over its sockets found nothing: adaptive sleeps
    /// in poll(2) until a socket is ready (a spinning client takes CPU from a target on the
    /// same machine); busy spins (lowest latency when client and target have cores of
    /// their own).
    #[arg(long = "poll-mode", value_enum, default_value_t = PollModeArg::Adaptive)]
    pub poll_mode: PollModeArg,

    /// Sessions per URL (one connection each), spread round-robin over the client
    /// threads. Default: one per client thread.
    #[arg(long, value_name = "N")]
    pub sessions: Option<usize>,

    /// Write the LBA range sequentially in a self-checking format (LBA, generation, CRC32C
    /// in every block), read it all back and report every mismatch; exits non-zero on any.
    /// Runs until the range is done (--time and --ramp do not apply).
    #[arg(long, conflicts_with_all = ["rw", "rwmixread"])]
    pub verify: bool,

    /// Only the read-back pass of --verify, checking for --generation.
    #[arg(long = "verify-only", conflicts_with_all = ["verify", "rw", "rwmixread"], requires = "generation")]
    pub verify_only: bool,

    /// Generation number written (--verify) or expected (--verify-only).
    /// Default for --verify: the current Unix time.
    #[arg(long, value_name = "N")]
    pub generation: Option<u64>,

    /// Seconds to wait between the write and the read pass of --verify.
    #[arg(long = "verify-pause", value_name = "SECONDS", default_value_t = 0)]
    pub verify_pause: u64,

    /// CRC32C digests to negotiate.
    #[arg(long, value_enum, default_value_t = DigestArg::None)]
    pub digest: DigestArg,

    /// InitiatorName sent at login.
    #[arg(long = "initiator-name", value_name = "IQN", default_value = INITIATOR_NAME)]
    pub initiator_name: String,

    /// Seconds allowed for connecting, logging in, each setup command and logout.
    #[arg(long = "login-timeout", value_name = "SECONDS", default_value_t = 10)]
    pub login_timeout: u64,

    /// Print one JSON object on stdout (the live lines go to stderr).
    #[arg(long)]
    pub json: bool,

    /// Also write the latency distribution of the measured window as an SVG chart
    /// (percentile spectrum and histogram).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Bench,
    /// Write pass (unless `read_only`), pause, read pass.
    Verify {
        read_only: bool,
        generation: u64,
        pause: Duration,
    },
}

/// A validated run description (everything that can be checked before connecting).
#[derive(Clone, Debug)]
pub struct Plan {
    pub targets: Vec<TargetUrl>,
    pub workload: Workload,
    pub read_pct: u8,
    pub bs: u64,
    pub qd: usize,
    pub time: Duration,
    pub ramp: Duration,
    pub lba_range: Option<(u64, u64)>,
    pub cores: Vec<usize>,
    pub pin: bool,
    pub poll_mode: PollModeArg,
    pub sessions: usize,
    pub mode: Mode,
    pub header_digest: bool,
    pub data_digest: bool,
    pub initiator_name: String,
    pub timeout: Duration,
    pub json: bool,
    pub plot: Option<std::path::PathBuf>,
}

/// `START:COUNT`, decimal or 0x hex, COUNT > 0.
pub fn parse_lba_range(s: &str) -> Result<(u64, u64), String> {
    let bad = |why: &str| format!("--lba-range {s}: {why} (expected START:COUNT in blocks)");
    let (a, b) = s.split_once(':').ok_or_else(|| bad("no ':'"))?;
    let num = |v: &str| -> Result<u64, String> {
        let v = v.trim();
        let r = if let Some(h) = v.strip_prefix("0x") {
            u64::from_str_radix(h, 16)
        } else {
            v.parse()
        };
        r.map_err(|_| bad(&format!("\"{v}\" is not a number")))
    };
    let (start, count) = (num(a)?, num(b)?);
    if count == 0 {
        return Err(bad("COUNT must be at least 1"));
    }
    if start.checked_add(count).is_none() {
        return Err(bad("START + COUNT overflows"));
    }
    Ok((start, count))
}

impl InitArgs {
    /// Checks the flags and turns them into a [`Plan`], or says what is wrong.
    // `u64::is_multiple_of` is newer than the workspace's rust-version (1.75).
    #[allow(unknown_lints, clippy::manual_is_multiple_of)]
    pub fn plan(&self) -> Result<Plan, String> {
        if self.urls.is_empty() {
            return Err("no target URL given: riser-perf [flags] iscsi://host[:port]/IQN/LUN ... (or riser-perf bdev ...)".into());
        }
        let mut targets = Vec::new();
        for u in &self.urls {
            if u == "bdev" {
                return Err("\"bdev\" after initiator flags: the subcommand comes first, riser-perf bdev [flags]".into());
            }
            let t = url::parse(u)?;
            if t.transport == Transport::Iser && self.digest != DigestArg::None {
                return Err(format!(
                    "{u}: --digest does not apply to iSER (RDMA has its own integrity checks)"
                ));
            }
            targets.push(t);
        }
        if self.bs == 0 || self.bs % 512 != 0 {
            return Err(format!(
                "--bs {} must be a positive multiple of 512",
                self.bs
            ));
        }
        if self.bs > 16 << 20 {
            return Err(format!("--bs {} is above the 16 MiB limit", self.bs));
        }
        if self.qd == 0 || self.qd as usize > MAX_QD {
            return Err(format!(
                "--qd {} is out of range: use 1 to {MAX_QD}",
                self.qd
            ));
        }
        crate::check_run_flags(self.time, self.ramp, self.rwmixread as u64)?;
        if self.verify_pause > MAX_SECONDS {
            return Err(format!(
                "--verify-pause {} is out of range",
                self.verify_pause
            ));
        }
        if self.login_timeout == 0 || self.login_timeout > 3600 {
            return Err(format!(
                "--login-timeout {} is out of range: use 1 to 3600",
                self.login_timeout
            ));
        }
        let cores = riser_reactor::parse_core_mask(&self.cpumask)
            .map_err(|e| format!("-m {}: {e}", self.cpumask))?;
        let sessions = self.sessions.unwrap_or(cores.len());
        if sessions == 0 || sessions > MAX_SESSIONS {
            return Err(format!(
                "--sessions {sessions} is out of range: use 1 to {MAX_SESSIONS}"
            ));
        }
        let per_thread = (sessions * targets.len()).div_ceil(cores.len()) as u64;
        let bytes = per_thread
            .saturating_mul(self.qd as u64)
            .saturating_mul(self.bs);
        if bytes > MAX_BUFFER_BYTES {
            return Err(format!(
                "{per_thread} sessions x --qd {} x --bs {} need {} MiB of buffers per thread; the limit is {} MiB",
                self.qd,
                self.bs,
                bytes >> 20,
                MAX_BUFFER_BYTES >> 20
            ));
        }
        let lba_range = self.lba_range.as_deref().map(parse_lba_range).transpose()?;
        if !self.verify && !self.verify_only && (self.generation.is_some() || self.verify_pause > 0)
        {
            return Err(
                "--generation and --verify-pause only apply with --verify or --verify-only".into(),
            );
        }
        if self.verify_only && self.verify_pause > 0 {
            return Err("--verify-pause needs --verify (--verify-only has no write pass)".into());
        }
        let mode = if self.verify || self.verify_only {
            let generation = match self.generation {
                Some(g) => g,
                None => std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(1),
            };
            Mode::Verify {
                read_only: self.verify_only,
                generation,
                pause: Duration::from_secs(self.verify_pause),
            }
        } else {
            Mode::Bench
        };
        if !self.initiator_name.starts_with("iqn.")
            && !self.initiator_name.starts_with("eui.")
            && !self.initiator_name.starts_with("naa.")
        {
            return Err(format!(
                "--initiator-name {}: an iSCSI name starts with iqn., eui. or naa.",
                self.initiator_name
            ));
        }
        let (header_digest, data_digest) = match self.digest {
            DigestArg::None => (false, false),
            DigestArg::Header => (true, false),
            DigestArg::Data => (false, true),
            DigestArg::Both => (true, true),
        };
        Ok(Plan {
            targets,
            workload: self.rw,
            read_pct: self.rw.read_pct(self.rwmixread),
            bs: self.bs,
            qd: self.qd as usize,
            time: Duration::from_secs(self.time),
            ramp: Duration::from_secs(self.ramp),
            lba_range,
            pin: !self.no_pin,
            poll_mode: self.poll_mode,
            cores,
            sessions,
            mode,
            header_digest,
            data_digest,
            initiator_name: self.initiator_name.clone(),
            timeout: Duration::from_secs(self.login_timeout),
            json: self.json,
            plot: self.plot.clone(),
        })
    }
}

/// Where one URL's I/Os go, once its LUN is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Geometry {
    pub block_size: u32,
    pub num_blocks: u64,
    /// The range used, in blocks.
    pub start: u64,
    pub count: u64,
    /// Blocks per I/O.
    pub io_blocks: u32,
}

impl Geometry {
    /// Checks the plan against what READ CAPACITY said.
    #[allow(unknown_lints, clippy::manual_is_multiple_of)]
    pub fn resolve(plan: &Plan, block_size: u32, num_blocks: u64) -> Result<Geometry, String> {
        if plan.bs % block_size as u64 != 0 {
            return Err(format!(
                "--bs {} is not a multiple of the LUN's block size ({block_size} bytes)",
                plan.bs
            ));
        }
        let io_blocks = (plan.bs / block_size as u64) as u32;
        let (start, count) = plan.lba_range.unwrap_or((0, num_blocks));
        if start + count > num_blocks {
            return Err(format!(
                "--lba-range {start}:{count} ends past the LUN's {num_blocks} blocks"
            ));
        }
        // Benchmarks issue whole --bs I/Os; verify also covers a partial last one.
        if matches!(plan.mode, Mode::Bench) && count < io_blocks as u64 {
            return Err(format!(
                "the LBA range ({count} blocks) is smaller than one I/O ({io_blocks} blocks of {block_size} bytes)"
            ));
        }
        Ok(Geometry {
            block_size,
            num_blocks,
            start,
            count,
            io_blocks,
        })
    }

    /// I/O-sized units in the range (a partial last unit counts in verify mode).
    fn units(&self, partial: bool) -> u64 {
        if partial {
            self.count.div_ceil(self.io_blocks as u64)
        } else {
            self.count / self.io_blocks as u64
        }
    }

    /// First LBA and length in blocks of unit `u`.
    fn unit(&self, u: u64) -> (u64, u32) {
        let lba = self.start + u * self.io_blocks as u64;
        let end = (lba + self.io_blocks as u64).min(self.start + self.count);
        (lba, (end - lba) as u32)
    }
}

// ---- threads and their coordination ------------------------------------------------------

/// One session to open: which URL, which of that URL's sessions.
#[derive(Clone, Debug)]
struct SessionSpec {
    url: usize,
    index: usize,
    isid: [u8; 6],
}

/// Running totals of one thread for the live line (written by the thread only).
#[repr(align(128))]
#[derive(Default)]
struct Live {
    ios: AtomicU64,
    lat_ns: AtomicU64,
}

/// What the control thread tells the client threads; waited on only between phases.
#[derive(Default)]
struct Gate {
    /// 0: wait; 1: run the benchmark or the verify write pass; 2: the verify read pass.
    phase: u32,
    t0: Option<Instant>,
    geoms: Arc<Vec<Geometry>>,
    abort: bool,
}

struct Control {
    gate: Mutex<Gate>,
    cv: Condvar,
    /// Stop early (SIGINT or another thread failed); polled by the hot loop.
    stop: Arc<AtomicBool>,
}

impl Control {
    fn set(&self, f: impl FnOnce(&mut Gate)) {
        if let Ok(mut g) = self.gate.lock() {
            f(&mut g);
        }
        self.cv.notify_all();
    }

    /// Waits for `phase` (Some(gate state)) or abort (None).
    fn wait(&self, phase: u32) -> Option<(Instant, Arc<Vec<Geometry>>)> {
        let mut g = self.gate.lock().ok()?;
        loop {
            if g.abort {
                return None;
            }
            if g.phase >= phase {
                return Some((g.t0.unwrap_or_else(Instant::now), g.geoms.clone()));
            }
            g = self.cv.wait(g).ok()?;
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SessionInfo {
    pub url: String,
    pub block_size: u32,
    pub num_blocks: u64,
    pub header_digest: bool,
    pub data_digest: bool,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub first_burst_length: u32,
    /// The largest data segment we may send: MaxRecvDataSegmentLength on TCP,
    /// TargetRecvDataSegmentLength on iSER.
    pub target_max_recv_data_segment_length: u32,
    /// "tcp" or "iser".
    pub transport: &'static str,
}

fn session_info(c: &Session) -> SessionInfo {
    let n: Negotiated = c.neg();
    SessionInfo {
        url: c.label().to_string(),
        block_size: c.block_size(),
        num_blocks: c.num_blocks(),
        header_digest: n.header_digest,
        data_digest: n.data_digest,
        immediate_data: n.immediate_data,
        initial_r2t: n.initial_r2t,
        first_burst_length: n.first_burst,
        target_max_recv_data_segment_length: c
            .iser_keys()
            .map_or(n.max_send_dsl, |k| k.target_recv_dsl),
        transport: if c.is_iser() { "iser" } else { "tcp" },
    }
}

enum Msg {
    Ready(Vec<(usize, SessionInfo)>),
    Failed(String),
    /// Verify write pass finished on this thread.
    Written,
    Done(usize, Box<ThreadResult>),
}

struct ThreadResult {
    core: usize,
    ios: u64,
    reads: u64,
    elapsed_ns: u64,
    cpu_user_ns: u64,
    cpu_sys_ns: u64,
    hist: Histogram<u64>,
    mismatches: Mismatches,
    blocks_checked: u64,
}

struct Job {
    conn: Session,
    url: usize,
    index: usize,
    submit_ns: Vec<u64>,
    dirs: Vec<Dir>,
    gen: Option<OpGen>,
    /// Verify: next unit and end unit of this session's share.
    next_unit: u64,
    end_unit: u64,
}

struct Client {
    thread: usize,
    core: usize,
    plan: Arc<Plan>,
    ctl: Arc<Control>,
    live: Arc<Live>,
    jobs: Vec<Job>,
    done: Vec<Completion>,
    /// The measured window (all of it in verify mode).
    rec: Recorder,
    /// Every I/O, for the live line.
    lat_total: u64,
    ios_total: u64,
    mismatches: Mismatches,
    blocks_checked: u64,
    idle_passes: u32,
    pollfds: Vec<libc::pollfd>,
}

fn client_thread(
    thread: usize,
    core: usize,
    specs: Vec<SessionSpec>,
    plan: Arc<Plan>,
    ctl: Arc<Control>,
    live: Arc<Live>,
    tx: mpsc::Sender<Msg>,
) {
    if plan.pin {
        if let Err(e) = pin_to(core) {
            log::warn!("client thread {thread}: {e}");
        }
    }
    let mut c = Client {
        thread,
        core,
        plan: plan.clone(),
        ctl,
        live,
        jobs: Vec::new(),
        done: Vec::with_capacity(plan.qd * 2),
        rec: Recorder::default(),
        lat_total: 0,
        ios_total: 0,
        mismatches: Mismatches::default(),
        blocks_checked: 0,
        idle_passes: 0,
        pollfds: Vec::new(),
    };
    let r = c.run(specs, &tx);
    // Best effort: log out of everything still logged in, also after a failure.
    let mut logout_err = None;
    for j in &mut c.jobs {
        if let Err(e) = j.conn.logout() {
            logout_err.get_or_insert(e);
        }
    }
    let msg = match r {
        Ok(res) => {
            // A failed logout after a good run is worth a warning, not a failed run.
            if let Some(e) = logout_err {
                log::warn!("{e}");
            }
            Msg::Done(thread, res)
        }
        Err(e) => Msg::Failed(e),
    };
    let _ = tx.send(msg);
}

impl Client {
    fn run(
        &mut self,
        specs: Vec<SessionSpec>,
        tx: &mpsc::Sender<Msg>,
    ) -> Result<Box<ThreadResult>, String> {
        let plan = self.plan.clone();
        let opts = LoginOptions {
            initiator_name: plan.initiator_name.clone(),
            header_digest: plan.header_digest,
            data_digest: plan.data_digest,
            timeout: plan.timeout,
            isid: [0; 6],
        };
        let mut infos = Vec::new();
        for s in &specs {
            if self.ctl.stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            let t = &plan.targets[s.url];
            let mut o = opts.clone();
            o.isid = s.isid;
            let mut conn = Session::login(t, &o, plan.qd)?;
            let copy_reads = plan.mode != Mode::Bench;
            let setup = conn
                .wait_ready()
                .and_then(|_| conn.read_capacity())
                .and_then(|_| conn.start_io(plan.qd, plan.bs as usize, copy_reads));
            if let Err(e) = setup {
                let _ = conn.logout();
                return Err(e);
            }
            infos.push((s.url, session_info(&conn)));
            self.jobs.push(Job {
                conn,
                url: s.url,
                index: s.index,
                submit_ns: vec![0; plan.qd],
                dirs: vec![Dir::Read; plan.qd],
                gen: None,
                next_unit: 0,
                end_unit: 0,
            });
        }
        let _ = tx.send(Msg::Ready(infos));
        match plan.mode {
            Mode::Bench => {
                let (t0, geoms) = self.ctl.wait(1).ok_or("aborted")?;
                for (k, j) in self.jobs.iter_mut().enumerate() {
                    let g = geoms[j.url];
                    let seed = ((self.thread as u64) << 32)
                        ^ (j.url as u64) << 16
                        ^ j.index as u64
                        ^ k as u64;
                    j.gen = Some(OpGen::new(
                        plan.workload,
                        plan.read_pct,
                        g.units(false),
                        j.index as u64,
                        plan.sessions as u64,
                        seed,
                    ));
                }
                let (elapsed, cpu) = self.bench(t0, &geoms)?;
                Ok(self.result(elapsed, cpu))
            }
            Mode::Verify {
                read_only,
                generation,
                ..
            } => {
                let (t0, geoms) = self
                    .ctl
                    .wait(if read_only { 2 } else { 1 })
                    .ok_or("aborted")?;
                let c0 = thread_cpu();
                if !read_only {
                    self.verify_pass(t0, &geoms, Dir::Write, generation)?;
                    let _ = tx.send(Msg::Written);
                    self.ctl.wait(2).ok_or("aborted")?;
                }
                self.verify_pass(t0, &geoms, Dir::Read, generation)?;
                let c1 = thread_cpu();
                let el = t0.elapsed().as_nanos() as u64;
                Ok(self.result(el, (c1.0 - c0.0, c1.1 - c0.1)))
            }
        }
    }

    fn result(&mut self, elapsed_ns: u64, cpu: (u64, u64)) -> Box<ThreadResult> {
        Box::new(ThreadResult {
            core: self.core,
            ios: self.rec.ios,
            reads: self.rec.reads,
            elapsed_ns,
            cpu_user_ns: cpu.0,
            cpu_sys_ns: cpu.1,
            hist: self.rec.take_hist(),
            mismatches: std::mem::take(&mut self.mismatches),
            blocks_checked: self.blocks_checked,
        })
    }

    /// Adaptive polling: after [`SPIN_PASSES`] passes without a byte received, sleep in
    /// poll(2) on this thread's sockets (at most 1 ms, so phase changes and the stop flag
    /// are seen).
    #[inline]
    fn idle(&mut self, progress: bool) {
        if self.plan.poll_mode == PollModeArg::Busy {
            return;
        }
        if progress {
            self.idle_passes = 0;
            return;
        }
        self.idle_passes += 1;
        if self.idle_passes < SPIN_PASSES {
            return;
        }
        self.pollfds.clear();
        for j in &mut self.jobs {
            // A socket, or an iSER session's armed completion channel; None: work came in.
            let Some((fd, events)) = j.conn.sleep_fd() else {
                return;
            };
            self.pollfds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
        // Woken by a ready descriptor, the 1 ms timeout or a signal: all the same here.
        let _ = sys::poll(&mut self.pollfds, 1);
        for j in &mut self.jobs {
            j.conn.woke();
        }
    }

    fn publish(&self) {
        self.live.ios.store(self.ios_total, Ordering::Relaxed);
        self.live.lat_ns.store(self.lat_total, Ordering::Relaxed);
    }

    /// The timed benchmark: returns the measured window (ns) and the thread's CPU time in it.
    fn bench(&mut self, t0: Instant, geoms: &[Geometry]) -> Result<(u64, (u64, u64)), String> {
        let mut window = Window::new(self.plan.ramp, self.plan.time);
        let mut done = std::mem::take(&mut self.done);

        // Initial load.
        let now_ns = t0.elapsed().as_nanos() as u64;
        for j in &mut self.jobs {
            let g = geoms[j.url];
            for slot in 0..self.plan.qd {
                let Some(gen) = j.gen.as_mut() else { break };
                let (dir, unit) = gen.next();
                let (lba, blocks) = g.unit(unit);
                j.dirs[slot] = dir;
                j.submit_ns[slot] = now_ns;
                j.conn.submit(slot, dir, lba, blocks);
            }
            j.conn.flush()?;
        }

        loop {
            let mut now_ns = t0.elapsed().as_nanos() as u64;
            let stop = &self.ctl.stop;
            if window.tick(now_ns, || stop.load(Ordering::Relaxed), thread_cpu) {
                self.rec.flush();
            }
            let (measuring, stopping) = (window.measuring(), window.stopping());
            let mut any = false;
            let mut got = false;
            let mut inflight = 0;
            for j in &mut self.jobs {
                got |= j.conn.poll(&mut done)?;
                if !done.is_empty() {
                    any = true;
                    now_ns = t0.elapsed().as_nanos() as u64;
                    let g = geoms[j.url];
                    for c in done.drain(..) {
                        if let Err(e) = c.result {
                            return Err(format!("{}: {e}", j.conn.label()));
                        }
                        let slot = c.slot;
                        let lat = now_ns.saturating_sub(j.submit_ns[slot]);
                        self.ios_total += 1;
                        self.lat_total += lat;
                        if measuring {
                            self.rec.record(lat, j.dirs[slot] == Dir::Read);
                        }
                        if !stopping {
                            let Some(gen) = j.gen.as_mut() else { continue };
                            let (dir, unit) = gen.next();
                            let (lba, blocks) = g.unit(unit);
                            j.dirs[slot] = dir;
                            j.submit_ns[slot] = now_ns;
                            j.conn.submit(slot, dir, lba, blocks);
                        }
                    }
                }
                j.conn.flush()?;
                inflight += j.conn.inflight();
            }
            if any {
                self.publish();
            }
            self.idle(got);
            if stopping {
                if inflight == 0 {
                    break;
                }
                if now_ns.saturating_sub(window.stop_ns()) > DRAIN_TIMEOUT.as_nanos() as u64 {
                    return Err(format!(
                        "{inflight} I/Os still outstanding {} s after the end of the run",
                        DRAIN_TIMEOUT.as_secs()
                    ));
                }
            }
        }
        self.done = done;
        Ok((window.elapsed_ns(), window.probe_delta()))
    }

    /// One verify pass over every session's share of its URL's range.
    fn verify_pass(
        &mut self,
        t0: Instant,
        geoms: &[Geometry],
        dir: Dir,
        generation: u64,
    ) -> Result<(), String> {
        let sessions = self.plan.sessions as u64;
        let qd = self.plan.qd;
        let mut done = std::mem::take(&mut self.done);
        for j in &mut self.jobs {
            let g = geoms[j.url];
            let units = g.units(true);
            j.next_unit = units * j.index as u64 / sessions;
            j.end_unit = units * (j.index as u64 + 1) / sessions;
        }
        let bsz = |g: &Geometry| g.block_size as usize;
        let issue = |j: &mut Job, slot: usize, now_ns: u64| -> bool {
            if j.next_unit >= j.end_unit {
                return false;
            }
            let g = geoms[j.url];
            let (lba, blocks) = g.unit(j.next_unit);
            j.next_unit += 1;
            if dir == Dir::Write {
                let n = blocks as usize * bsz(&g);
                verify::fill(&mut j.conn.buf_mut(slot)[..n], bsz(&g), lba, generation);
            }
            j.dirs[slot] = dir;
            j.submit_ns[slot] = now_ns;
            j.conn.submit(slot, dir, lba, blocks);
            true
        };
        let now_ns = t0.elapsed().as_nanos() as u64;
        for j in &mut self.jobs {
            for slot in 0..qd {
                if !issue(j, slot, now_ns) {
                    break;
                }
            }
            j.conn.flush()?;
        }
        loop {
            let mut inflight = 0;
            let mut any = false;
            let mut got = false;
            for j in &mut self.jobs {
                got |= j.conn.poll(&mut done)?;
                if !done.is_empty() {
                    any = true;
                    let now_ns = t0.elapsed().as_nanos() as u64;
                    let g = geoms[j.url];
                    for c in done.drain(..) {
                        if let Err(e) = c.result {
                            return Err(format!("{}: {e}", j.conn.label()));
                        }
                        let slot = c.slot;
                        let lat = now_ns.saturating_sub(j.submit_ns[slot]);
                        self.ios_total += 1;
                        self.lat_total += lat;
                        self.rec.record(lat, dir == Dir::Read);
                        if dir == Dir::Read {
                            let lba = j.conn.lba(slot);
                            let n = ((g.start + g.count - lba).min(g.io_blocks as u64)) as usize;
                            let data = &j.conn.buf(slot)[..n * bsz(&g)];
                            self.mismatches.check(data, bsz(&g), lba, generation);
                            self.blocks_checked += n as u64;
                        }
                        if !self.ctl.stop.load(Ordering::Relaxed) {
                            issue(j, slot, now_ns);
                        }
                    }
                }
                j.conn.flush()?;
                inflight += j.conn.inflight();
            }
            if any {
                self.publish();
            }
            self.idle(got);
            if inflight == 0 {
                break;
            }
        }
        self.done = done;
        if self.ctl.stop.load(Ordering::Relaxed) {
            return Err("interrupted".into());
        }
        Ok(())
    }
}

// ---- the control thread ------------------------------------------------------------------

/// Distinct ISIDs per session: type "random" (0x80), process id, session number.
fn isid(global: usize) -> [u8; 6] {
    let pid = std::process::id();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    [
        0x80,
        (pid >> 8) as u8 ^ (t >> 24) as u8,
        pid as u8,
        (t >> 8) as u8,
        (global >> 8) as u8,
        global as u8,
    ]
}

fn live_line(label: &str, secs: u64, ios: u64, lat_ns: u64, dt: f64, bs: u64, to_stderr: bool) {
    let iops = ios as f64 / dt;
    let mean_us = if ios > 0 {
        lat_ns as f64 / ios as f64 / 1000.0
    } else {
        0.0
    };
    let line = format!(
        "[{secs:>4} s]{label} {iops:>10.0} IOPS, {:>9.2} MiB/s, mean latency {mean_us:>8.1} us",
        iops * bs as f64 / MIB
    );
    if to_stderr {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

#[derive(Serialize)]
struct Cpu {
    user_s: f64,
    sys_s: f64,
    /// Of one core, over the measured window.
    pct_of_core: f64,
    us_per_io: f64,
    /// Whole process, whole run (login and teardown included).
    process_user_s: f64,
    process_sys_s: f64,
}

#[derive(Serialize)]
struct VerifyOut {
    passed: bool,
    generation: u64,
    blocks_checked: u64,
    mismatched_blocks: u64,
    mismatches: Vec<String>,
    write_s: Option<f64>,
    read_s: f64,
}

/// `riser-perf [flags] URL...`: validate, connect, run, print. Err: a message for stderr
/// (exit 1); Ok(false): the run finished but verify found mismatches (exit 1 too).
pub fn main(args: &InitArgs) -> Result<bool, String> {
    let plan = Arc::new(args.plan()?);
    let stop = Arc::new(AtomicBool::new(false));
    // First Ctrl-C: stop cleanly (drain, log out, report); a second one exits at once.
    let _ = signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        stop.clone(),
    );
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone());
    let ctl = Arc::new(Control {
        gate: Mutex::new(Gate::default()),
        cv: Condvar::new(),
        stop,
    });

    // Sessions round-robin over threads.
    let nthreads = plan.cores.len();
    let mut specs: Vec<Vec<SessionSpec>> = vec![Vec::new(); nthreads];
    let mut global = 0usize;
    for index in 0..plan.sessions {
        for url in 0..plan.targets.len() {
            specs[global % nthreads].push(SessionSpec {
                url,
                index,
                isid: isid(global),
            });
            global += 1;
        }
    }
    let (tx, rx) = mpsc::channel();
    let lives: Vec<Arc<Live>> = (0..nthreads).map(|_| Arc::new(Live::default())).collect();
    let mut handles = Vec::new();
    let mut active = 0;
    for (t, s) in specs.into_iter().enumerate() {
        if s.is_empty() {
            continue;
        }
        active += 1;
        let (plan, ctl, live, tx) = (plan.clone(), ctl.clone(), lives[t].clone(), tx.clone());
        let core = plan.cores[t];
        let h = std::thread::Builder::new()
            .name(format!("perf-client-{t}"))
            .spawn(move || client_thread(t, core, s, plan, ctl, live, tx))
            .map_err(|e| format!("cannot start a client thread: {e}"))?;
        handles.push(h);
    }
    drop(tx);
    let r = control(&plan, &ctl, &rx, active, &lives);
    if r.is_err() {
        ctl.stop.store(true, Ordering::Relaxed);
        ctl.set(|g| g.abort = true);
    }
    for h in handles {
        let _ = h.join();
    }
    r
}

fn control(
    plan: &Plan,
    ctl: &Control,
    rx: &mpsc::Receiver<Msg>,
    active: usize,
    lives: &[Arc<Live>],
) -> Result<bool, String> {
    let quiet_live = plan.json;
    // 1. Every thread logs in its sessions.
    let per_thread = (plan.sessions * plan.targets.len()).div_ceil(active.max(1)) as u32;
    let setup_deadline = Instant::now() + plan.timeout * (3 * per_thread + 2);
    let mut infos: Vec<Option<SessionInfo>> = vec![None; plan.targets.len()];
    let mut all_infos = Vec::new();
    for _ in 0..active {
        let wait = setup_deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Msg::Ready(v)) => {
                for (u, i) in v {
                    if infos[u].is_none() {
                        infos[u] = Some(i.clone());
                    }
                    all_infos.push(i);
                }
            }
            Ok(Msg::Failed(e)) => return Err(e),
            Ok(_) => return Err("internal: unexpected message during setup".into()),
            Err(_) => return Err("timed out logging in".into()),
        }
    }
    // 2. Geometry per URL, checked against the plan.
    let mut geoms = Vec::new();
    for (u, info) in infos.iter().enumerate() {
        let i = info.as_ref().ok_or("internal: a URL has no session")?;
        if all_infos.iter().any(|o| {
            o.url == i.url && (o.block_size != i.block_size || o.num_blocks != i.num_blocks)
        }) {
            return Err(format!("{}: sessions disagree on the LUN size", i.url));
        }
        let g = Geometry::resolve(plan, i.block_size, i.num_blocks)
            .map_err(|e| format!("{}: {e}", plan.targets[u]))?;
        geoms.push(g);
    }
    let geoms = Arc::new(geoms);
    if !plan.json {
        print!("{}", describe(plan, &infos, &geoms));
    }
    let proc0 = rusage(libc::RUSAGE_SELF);

    let t0 = Instant::now();
    let mut results: Vec<Option<Box<ThreadResult>>> = (0..plan.cores.len()).map(|_| None).collect();
    let mut finished = 0;
    let sample = |lives: &[Arc<Live>]| {
        lives.iter().fold((0u64, 0u64), |a, l| {
            (
                a.0 + l.ios.load(Ordering::Relaxed),
                a.1 + l.lat_ns.load(Ordering::Relaxed),
            )
        })
    };
    // Waits for thread messages until `until` returns true, printing the live line.
    let pump = |phase_label: &dyn Fn(u64) -> String,
                until: &mut dyn FnMut(&Msg) -> bool,
                results: &mut Vec<Option<Box<ThreadResult>>>,
                finished: &mut usize|
     -> Result<(), String> {
        // Each phase starts its own live-line seconds: none owed for a pause before it.
        let mut tick = t0.elapsed().as_secs() + 1;
        let mut last = sample(lives);
        let mut last_t = Instant::now();
        loop {
            let next = t0 + Duration::from_secs(tick);
            let wait = next.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(m) => {
                    let stop_here = until(&m);
                    match m {
                        Msg::Failed(e) => return Err(e),
                        Msg::Done(t, r) => {
                            results[t] = Some(r);
                            *finished += 1;
                        }
                        _ => {}
                    }
                    if stop_here {
                        return Ok(());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let now = sample(lives);
                    let dt = last_t.elapsed().as_secs_f64().max(1e-3);
                    last_t = Instant::now();
                    live_line(
                        &phase_label(tick),
                        tick,
                        now.0 - last.0,
                        now.1 - last.1,
                        dt,
                        plan.bs,
                        quiet_live,
                    );
                    last = now;
                    tick += 1;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err("a client thread ended without a result".into())
                }
            }
        }
    };

    match plan.mode {
        Mode::Bench => {
            ctl.set(|g| {
                g.phase = 1;
                g.t0 = Some(t0);
                g.geoms = geoms.clone();
            });
            let ramp = plan.ramp.as_secs();
            let label = move |s: u64| {
                if s <= ramp {
                    " ramp".to_string()
                } else {
                    String::new()
                }
            };
            let target = active;
            let mut count = 0;
            pump(
                &label,
                &mut |m| {
                    if matches!(m, Msg::Done(..)) {
                        count += 1;
                    }
                    count == target
                },
                &mut results,
                &mut finished,
            )?;
            let proc1 = rusage(libc::RUSAGE_SELF);
            if ctl.stop.load(Ordering::Relaxed) {
                eprintln!(
                    "riser-perf: interrupted: the summary covers the part measured before the stop"
                );
            }
            let rs: Vec<(usize, Box<ThreadResult>)> = results
                .into_iter()
                .enumerate()
                .filter_map(|(t, r)| r.map(|r| (t, r)))
                .collect();
            let (report, cpu) = bench_report(plan, &rs, &geoms, proc0, proc1, &all_infos);
            if plan.json {
                println!("{report}");
            } else {
                print!("{cpu}");
            }
            if let Some(path) = &plan.plot {
                let hists: Vec<&Histogram<u64>> = rs.iter().map(|(_, r)| &r.hist).collect();
                let window = rs.iter().map(|(_, r)| r.elapsed_ns).max().unwrap_or(0);
                crate::plot::plot_run(path, plan, &hists, window)?;
            }
            Ok(true)
        }
        Mode::Verify {
            read_only,
            generation,
            pause,
        } => {
            let mut write_s = None;
            if !read_only {
                if !plan.json {
                    println!("verify: writing generation {generation}");
                }
                ctl.set(|g| {
                    g.phase = 1;
                    g.t0 = Some(t0);
                    g.geoms = geoms.clone();
                });
                let mut written = 0;
                pump(
                    &|_| " write".to_string(),
                    &mut |m| {
                        if matches!(m, Msg::Written) {
                            written += 1;
                        }
                        written == active
                    },
                    &mut results,
                    &mut finished,
                )?;
                write_s = Some(t0.elapsed().as_secs_f64());
                if !pause.is_zero() {
                    eprintln!(
                        "verify: all blocks written (generation {generation}); reading back in {} s",
                        pause.as_secs()
                    );
                    let end = Instant::now() + pause;
                    while Instant::now() < end {
                        if ctl.stop.load(Ordering::Relaxed) {
                            return Err("interrupted".into());
                        }
                        std::thread::sleep(
                            Duration::from_millis(50)
                                .min(end.saturating_duration_since(Instant::now())),
                        );
                    }
                }
            }
            let read_start = Instant::now();
            if !plan.json {
                println!("verify: reading back, expecting generation {generation}");
            }
            ctl.set(|g| {
                g.phase = 2;
                g.t0 = Some(t0);
                g.geoms = geoms.clone();
            });
            let target = active;
            let mut count = finished;
            pump(
                &|_| " read".to_string(),
                &mut |m| {
                    if matches!(m, Msg::Done(..)) {
                        count += 1;
                    }
                    count == target
                },
                &mut results,
                &mut finished,
            )?;
            let read_s = read_start.elapsed().as_secs_f64();
            let rs: Vec<Box<ThreadResult>> = results.into_iter().flatten().collect();
            let checked: u64 = rs.iter().map(|r| r.blocks_checked).sum();
            let all = Mismatches::merge(rs.into_iter().map(|r| r.mismatches).collect());
            let expected: u64 = geoms.iter().map(|g| g.count).sum();
            let out = VerifyOut {
                passed: all.blocks == 0 && checked == expected,
                generation,
                blocks_checked: checked,
                mismatched_blocks: all.blocks,
                mismatches: all.runs.iter().map(|m| m.to_string()).collect(),
                write_s,
                read_s,
            };
            if plan.json {
                let v = serde_json::json!({ "verify": out, "lun": geoms.as_slice(), "sessions": all_infos });
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                for m in &out.mismatches {
                    println!("MISMATCH {m}");
                }
                println!(
                    "verify: {} blocks checked{}, {} mismatched ({} runs); generation {generation}; write {} read {read_s:.2} s",
                    checked,
                    if checked == expected { String::new() } else { format!(" of {expected}") },
                    all.blocks,
                    all.runs.len(),
                    write_s.map(|s| format!("{s:.2} s,")).unwrap_or_else(|| "skipped,".into()),
                );
                println!(
                    "verify: {}",
                    if all.blocks == 0 && checked == expected {
                        "PASSED"
                    } else {
                        "FAILED"
                    }
                );
            }
            Ok(all.blocks == 0 && checked == expected)
        }
    }
}

fn describe(plan: &Plan, infos: &[Option<SessionInfo>], geoms: &[Geometry]) -> String {
    let mut s = String::new();
    for (i, g) in infos.iter().zip(geoms) {
        let Some(i) = i else { continue };
        s += &format!(
            "{}: {} blocks of {} B ({:.1} GiB), using {}:{}; {} session(s); HeaderDigest {}, DataDigest {}, ImmediateData {}, InitialR2T {}, FirstBurstLength {}, {} {}\n",
            i.url,
            g.num_blocks,
            g.block_size,
            g.num_blocks as f64 * g.block_size as f64 / (1u64 << 30) as f64,
            g.start,
            g.count,
            plan.sessions,
            if i.header_digest { "CRC32C" } else { "None" },
            if i.data_digest { "CRC32C" } else { "None" },
            if i.immediate_data { "Yes" } else { "No" },
            if i.initial_r2t { "Yes" } else { "No" },
            i.first_burst_length,
            if i.transport == "iser" {
                "RDMAExtensions Yes, TargetRecvDataSegmentLength"
            } else {
                "target MaxRecvDataSegmentLength"
            },
            i.target_max_recv_data_segment_length,
        );
    }
    if plan.mode == Mode::Bench {
        let mix = if plan.workload.mixed() {
            format!(" ({} % reads)", plan.read_pct)
        } else {
            String::new()
        };
        s += &format!(
            "{}{mix}, {} B I/Os, qd {} per session, {} client thread(s) on cores {:?}, {} s measured after {} s ramp\n",
            plan.workload.name(),
            plan.bs,
            plan.qd,
            plan.cores.len(),
            plan.cores,
            plan.time.as_secs(),
            plan.ramp.as_secs()
        );
    } else {
        s += &format!(
            "verify: {} B I/Os, qd {} per session, {} client thread(s)\n",
            plan.bs,
            plan.qd,
            plan.cores.len()
        );
    }
    s
}

/// The summary: (JSON text, human text).
fn bench_report(
    plan: &Plan,
    rs: &[(usize, Box<ThreadResult>)],
    geoms: &[Geometry],
    proc0: (u64, u64),
    proc1: (u64, u64),
    infos: &[SessionInfo],
) -> (String, String) {
    let workers: Vec<WorkerResult> = rs
        .iter()
        .map(|(t, r)| {
            let busy = r.cpu_user_ns + r.cpu_sys_ns;
            WorkerResult {
                reactor: *t,
                core: r.core,
                ios: r.ios,
                reads: r.reads,
                errors: 0,
                elapsed_ns: r.elapsed_ns,
                busy_ns: busy,
                idle_ns: r.elapsed_ns.saturating_sub(busy),
                hist: r.hist.clone(),
            }
        })
        .collect();
    let config = serde_json::json!({
        "urls": plan.targets.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        "rw": plan.workload,
        "rwmixread": plan.read_pct,
        "bs": plan.bs,
        "qd": plan.qd,
        "sessions_per_url": plan.sessions,
        "time_s": plan.time.as_secs(),
        "ramp_s": plan.ramp.as_secs(),
        "cores": plan.cores,
        "pin": plan.pin,
        "poll_mode": if plan.poll_mode == PollModeArg::Busy { "busy" } else { "adaptive" },
        "lun": geoms,
    });
    let report = Report::build(String::new(), config, plan.bs, &workers);
    let user: u64 = rs.iter().map(|(_, r)| r.cpu_user_ns).sum();
    let sys: u64 = rs.iter().map(|(_, r)| r.cpu_sys_ns).sum();
    let window = rs.iter().map(|(_, r)| r.elapsed_ns).max().unwrap_or(0);
    let t = &report.total;
    let cpu = Cpu {
        user_s: user as f64 / 1e9,
        sys_s: sys as f64 / 1e9,
        pct_of_core: if window > 0 {
            (user + sys) as f64 * 100.0 / window as f64
        } else {
            0.0
        },
        us_per_io: if t.ios > 0 {
            (user + sys) as f64 / 1000.0 / t.ios as f64
        } else {
            0.0
        },
        process_user_s: proc1.0.saturating_sub(proc0.0) as f64 / 1e9,
        process_sys_s: proc1.1.saturating_sub(proc0.1) as f64 / 1e9,
    };
    let mut v = serde_json::to_value(&report).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        if let Some(r) = o.remove("reactors") {
            o.insert("threads".into(), r);
        }
        o.insert(
            "client_cpu".into(),
            serde_json::to_value(&cpu).unwrap_or_default(),
        );
        o.insert(
            "sessions".into(),
            serde_json::to_value(infos).unwrap_or_default(),
        );
    }
    let json = serde_json::to_string_pretty(&v).unwrap_or_default();

    let mut s = String::new();
    for w in &report.reactors {
        s += &format!(
            "thread {} (core {}): {:.0} IOPS, {:.2} MiB/s, CPU {:.1} %\n",
            w.reactor, w.core, w.iops, w.mib_per_s, w.busy_pct
        );
    }
    let l: &Latency = &t.latency;
    s += "total:\n";
    s += &format!(
        "  IOPS:       {:.0} (read {:.0}, write {:.0})\n",
        t.iops, t.read_iops, t.write_iops
    );
    s += &format!("  MiB/s:      {:.2}\n", t.mib_per_s);
    s += &format!("  I/Os:       {} ({} errors)\n", t.ios, t.errors);
    s += &format!(
        "  latency us: min {:.1}, p50 {:.1}, p90 {:.1}, p99 {:.1}, p99.9 {:.1}, p99.99 {:.1}, max {:.1} (mean {:.1})\n",
        l.min_us, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.p9999_us, l.max_us, l.avg_us
    );
    s += &format!(
        "  client CPU: {:.2} s (user {:.2} s, sys {:.2} s) = {:.1} % of one core, {:.2} us per I/O\n",
        cpu.user_s + cpu.sys_s,
        cpu.user_s,
        cpu.sys_s,
        cpu.pct_of_core,
        cpu.us_per_io
    );
    (json, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: InitArgs,
    }

    fn args(extra: &[&str]) -> Result<InitArgs, String> {
        let mut v = vec!["t"];
        v.extend_from_slice(extra);
        T::try_parse_from(v).map(|t| t.a).map_err(|e| e.to_string())
    }

    fn plan(extra: &[&str]) -> Result<Plan, String> {
        args(extra)?.plan()
    }

    const U: &str = "iscsi://127.0.0.1:3264/iqn.2016-06.io.riser:null/0";

    #[test]
    fn defaults() {
        let p = plan(&[U]).unwrap();
        assert_eq!(p.targets.len(), 1);
        assert_eq!((p.bs, p.qd, p.sessions), (4096, 32, 1));
        assert_eq!(p.workload, Workload::Randread);
        assert_eq!(p.read_pct, 100);
        assert_eq!((p.time.as_secs(), p.ramp.as_secs()), (10, 1));
        assert_eq!(p.cores, vec![0]);
        assert!(p.pin && !p.header_digest && !p.data_digest);
        assert_eq!(p.poll_mode, PollModeArg::Adaptive);
        assert_eq!(p.mode, Mode::Bench);
        assert_eq!(p.initiator_name, "iqn.2024-01.io.riser:perf");
        let p = plan(&[
            "-m",
            "0x6",
            "--rw",
            "randrw",
            "--rwmixread",
            "30",
            "--digest",
            "both",
            U,
            U,
        ])
        .unwrap();
        assert_eq!(p.cores, vec![1, 2]);
        assert_eq!(p.sessions, 2);
        assert_eq!(p.read_pct, 30);
        assert!(p.header_digest && p.data_digest);
        assert_eq!(plan(&["--rw", "write", U]).unwrap().read_pct, 0);
        assert_eq!(
            plan(&["--lba-range", "0x10:100", U]).unwrap().lba_range,
            Some((16, 100))
        );
    }

    #[test]
    fn flag_validation() {
        let err = |v: &[&str]| plan(v).expect_err(&format!("{v:?} should be refused"));
        assert!(err(&[]).contains("no target URL"));
        assert!(err(&["--digest", "header", "iser://h/iqn.x/0"]).contains("does not apply to iSER"));
        assert_eq!(
            plan(&["iser://192.0.2.1/iqn.x:y/0"]).unwrap().targets[0].transport,
            Transport::Iser
        );
        assert!(err(&["iscsi://h/iqn.x"]).contains("no LUN"));
        assert!(err(&["--bs", "1000", U]).contains("multiple of 512"));
        assert!(err(&["--bs", "0", U]).contains("--bs 0"));
        assert!(err(&["--bs", "33554432", U]).contains("16 MiB"));
        assert!(err(&["--qd", "0", U]).contains("--qd 0"));
        assert!(err(&["--qd", "5000", U]).contains("1 to 4096"));
        assert!(err(&["--time", "0", U]).contains("--time 0"));
        assert!(err(&["--ramp", "9999999999", U]).contains("--ramp"));
        assert!(err(&["--rwmixread", "101", U]).contains("0 to 100"));
        assert!(err(&["--sessions", "0", U]).contains("--sessions 0"));
        assert!(err(&["-m", "0x0", U]).contains("-m 0x0"));
        assert!(err(&["--lba-range", "5", U]).contains("START:COUNT"));
        assert!(err(&["--lba-range", "5:0", U]).contains("at least 1"));
        assert!(err(&["--lba-range", "x:5", U]).contains("not a number"));
        assert!(err(&["--lba-range", "18446744073709551615:2", U]).contains("overflows"));
        assert!(
            err(&["--qd", "4096", "--bs", "16777216", "--sessions", "2", U])
                .contains("buffers per thread")
        );
        assert!(err(&["--generation", "3", U]).contains("only apply"));
        assert!(err(&["--initiator-name", "me", U]).contains("iqn."));
        assert!(err(&["--login-timeout", "0", U]).contains("login-timeout"));
        // clap-level: conflicts and missing requirements are errors, not panics.
        assert!(args(&["--verify", "--rw", "read", U]).is_err());
        assert!(args(&["--verify-only", U]).is_err());
        assert!(args(&["--verify", "--verify-only", "--generation", "1", U]).is_err());
        assert!(args(&["--qd", "-1", U]).is_err());
        assert!(args(&["--rw", "sideways", U]).is_err());
        assert!(err(&[
            "--verify-only",
            "--generation",
            "4",
            "--verify-pause",
            "3",
            U
        ])
        .contains("--verify-pause"));
    }

    #[test]
    fn verify_modes() {
        let p = plan(&["--verify", "--generation", "7", "--verify-pause", "5", U]).unwrap();
        assert_eq!(
            p.mode,
            Mode::Verify {
                read_only: false,
                generation: 7,
                pause: Duration::from_secs(5)
            }
        );
        let p = plan(&["--verify-only", "--generation", "7", U]).unwrap();
        assert!(matches!(
            p.mode,
            Mode::Verify {
                read_only: true,
                generation: 7,
                ..
            }
        ));
        // Without --generation, --verify picks the time: some large number.
        let p = plan(&["--verify", U]).unwrap();
        assert!(matches!(p.mode, Mode::Verify { generation, .. } if generation > 1_600_000_000));
    }

    #[test]
    fn geometry_against_the_lun() {
        let p = plan(&["--bs", "8192", U]).unwrap();
        let g = Geometry::resolve(&p, 512, 1000).unwrap();
        assert_eq!((g.start, g.count, g.io_blocks), (0, 1000, 16));
        assert_eq!(g.units(false), 62);
        assert_eq!(g.units(true), 63);
        assert_eq!(g.unit(62), (992, 8));
        assert!(Geometry::resolve(&p, 4096, 1000).is_ok());
        let p = plan(&["--bs", "512", U]).unwrap();
        assert!(Geometry::resolve(&p, 4096, 1000)
            .unwrap_err()
            .contains("block size (4096"));
        let p = plan(&["--lba-range", "900:101", U]).unwrap();
        assert!(Geometry::resolve(&p, 512, 1000)
            .unwrap_err()
            .contains("ends past"));
        let p = plan(&["--lba-range", "900:4", U]).unwrap();
        assert!(Geometry::resolve(&p, 512, 1000)
            .unwrap_err()
            .contains("smaller than one I/O"));
        // Verify covers a partial last I/O.
        let p = plan(&["--verify", "--lba-range", "900:4", U]).unwrap();
        let g = Geometry::resolve(&p, 512, 1000).unwrap();
        assert_eq!((g.units(true), g.unit(0)), (1, (900, 4)));
    }

    #[test]
    fn unreachable_target_is_a_clear_error() {
        // A port that was just free on localhost (port 1 is not: a test tgtd may sit there).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let url = format!("iscsi://127.0.0.1:{port}/iqn.x:y/0");
        let e = main(
            &args(&[
                "--time",
                "1",
                "--ramp",
                "0",
                "--no-pin",
                "--login-timeout",
                "2",
                &url,
            ])
            .unwrap(),
        )
        .unwrap_err();
        assert!(
            e.contains(&format!("cannot connect to 127.0.0.1:{port}")),
            "{e}"
        );
    }
}
