//! The client threads of the initiator mode: each logs in its sessions, then runs the
//! benchmark or the verify passes over them from one polling loop, and the little they share
//! with the control thread (the phase gate, the live totals, the messages).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::{Geometry, Mode, Plan};
use crate::report::{Recorder, Window};
use riser_initiator::scsi::{status, Completion, Dir, Sense};
use riser_initiator::session::{AbortStats, LoginOptions, Negotiated};
use crate::sys::{self, pin_to, thread_cpu};
use crate::transport::Session;
use crate::verify::{self, Mismatches};
use crate::workload::{OpGen, PollModeArg};

/// How long in-flight I/Os may take to finish after the end of the run.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Adaptive polling: passes without progress before sleeping in poll(2).
/// One empty pass is enough: measured on a shared 2-core machine against tgt, longer spins
/// (32 passes, or busy polling) cost the target CPU time and IOPS.
const SPIN_PASSES: u32 = 1;

/// One session to open: which URL, which of that URL's sessions.
#[derive(Clone, Debug)]
pub(super) struct SessionSpec {
    pub(super) url: usize,
    pub(super) index: usize,
    pub(super) isid: [u8; 6],
}

/// Running totals of one thread for the live line (written by the thread only).
#[repr(align(128))]
#[derive(Default)]
pub(super) struct Live {
    pub(super) ios: AtomicU64,
    pub(super) lat_ns: AtomicU64,
}

/// What the control thread tells the client threads; waited on only between phases.
#[derive(Default)]
pub(super) struct Gate {
    /// 0: wait; 1: run the benchmark or the verify write pass; 2: the verify read pass.
    pub(super) phase: u32,
    pub(super) t0: Option<Instant>,
    pub(super) geoms: Arc<Vec<Geometry>>,
    pub(super) abort: bool,
}

pub(super) struct Control {
    pub(super) gate: Mutex<Gate>,
    pub(super) cv: Condvar,
    /// Stop early (SIGINT or another thread failed); polled by the hot loop.
    pub(super) stop: Arc<AtomicBool>,
}

impl Control {
    pub(super) fn set(&self, f: impl FnOnce(&mut Gate)) {
        if let Ok(mut g) = self.gate.lock() {
            f(&mut g);
        }
        self.cv.notify_all();
    }

    /// Waits for `phase` (Some(gate state)) or abort (None).
    pub(super) fn wait(&self, phase: u32) -> Option<(Instant, Arc<Vec<Geometry>>)> {
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

pub(super) enum Msg {
    Ready(Vec<(usize, SessionInfo)>),
    Failed(String),
    /// Verify write pass finished on this thread.
    Written,
    Done(usize, Box<ThreadResult>),
}

/// One path failover of a session (printed in the summary, and in the JSON report).
#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    /// The path that failed and the one the session went on with.
    pub from: String,
    pub to: String,
    /// Why the path was given up.
    pub reason: String,
    /// Seconds since the start of the run when the failure was seen.
    pub at_s: f64,
    /// Seconds the session had no working path: from the last thing received on the old
    /// path (or the failure, when I/O was still flowing) until the I/Os went out on the new.
    pub no_path_s: f64,
    /// I/Os not acknowledged on the old path, all resubmitted on the new one.
    pub resubmitted: usize,
    /// Of those, writes: in doubt (the blocks may hold the old or the new data) until
    /// acknowledged on the new path.
    pub writes_in_doubt: usize,
    /// Logins tried before one succeeded.
    pub attempts: u32,
}

pub(super) struct ThreadResult {
    pub(super) core: usize,
    pub(super) ios: u64,
    pub(super) reads: u64,
    pub(super) elapsed_ns: u64,
    pub(super) cpu_user_ns: u64,
    pub(super) cpu_sys_ns: u64,
    pub(super) hist: Histogram<u64>,
    pub(super) mismatches: Mismatches,
    pub(super) blocks_checked: u64,
    /// --abort-every: what the targets answered, and the first violation.
    pub(super) aborts: AbortStats,
    pub(super) abort_error: Option<String>,
    /// Path failovers of this thread's sessions.
    pub(super) failovers: Vec<Failover>,
}

/// What the completions feed besides the live totals.
#[derive(Default)]
struct Tally {
    /// The measured window (all of it in verify mode).
    rec: Recorder,
    mismatches: Mismatches,
    blocks_checked: u64,
}

/// How many unit attentions in a row one I/O may meet before riser-perf gives up on it.
const MAX_UNIT_ATTENTIONS: u8 = 8;

struct Job {
    conn: Session,
    url: usize,
    index: usize,
    submit_ns: Vec<u64>,
    dirs: Vec<Dir>,
    /// Each slot's I/O (blocks), and how many times in a row it met a unit attention.
    blocks: Vec<u32>,
    unit_attentions: Vec<u8>,
    /// Multipath only (several paths to the LUN): the I/O of every slot not acknowledged yet,
    /// (LBA, blocks), for resubmission on the next path; and the slots whose I/O is a write
    /// in doubt (resubmitted after a failover, not acknowledged yet).
    pending: Vec<Option<(u64, u32)>>,
    doubt: Vec<bool>,
    /// Which of `plan.paths[url]` the session is logged in through.
    path: usize,
    /// Multipath: since when I/Os have been outstanding with nothing received (None while
    /// the connection makes progress).
    stall_since: Option<Instant>,
    login: LoginOptions,
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
    tally: Tally,
    /// Every I/O, for the live line.
    lat_total: u64,
    ios_total: u64,
    idle_passes: u32,
    pollfds: Vec<libc::pollfd>,
    failovers: Vec<Failover>,
}

pub(super) fn client_thread(
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
        tally: Tally::default(),
        lat_total: 0,
        ios_total: 0,
        idle_passes: 0,
        pollfds: Vec::new(),
        failovers: Vec::new(),
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
            chap: plan.chap.clone(),
        };
        let mut infos = Vec::new();
        for s in &specs {
            if self.ctl.stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            let mut o = opts.clone();
            o.isid = s.isid;
            // The first path that logs in; with one path, its error as it is.
            let paths = &plan.paths[s.url];
            let mut errors = Vec::new();
            let mut found = None;
            for (p, t) in paths.iter().enumerate() {
                match open_path(&plan, t, &o) {
                    Ok(c) => {
                        found = Some((p, c));
                        break;
                    }
                    Err(e) if paths.len() == 1 => return Err(e),
                    Err(e) => {
                        log::warn!("path {t}: {e}");
                        errors.push(e);
                    }
                }
            }
            let Some((path, mut conn)) = found else {
                return Err(format!(
                    "none of the {} paths logged in: {}",
                    paths.len(),
                    errors.join("; ")
                ));
            };
            if let Some(n) = plan.abort_every {
                conn.abort_every(n);
            }
            infos.push((s.url, session_info(&conn)));
            let multipath = paths.len() > 1;
            self.jobs.push(Job {
                conn,
                url: s.url,
                index: s.index,
                submit_ns: vec![0; plan.qd],
                dirs: vec![Dir::Read; plan.qd],
                blocks: vec![0; plan.qd],
                unit_attentions: vec![0; plan.qd],
                pending: if multipath { vec![None; plan.qd] } else { Vec::new() },
                doubt: vec![false; plan.qd],
                path,
                stall_since: None,
                login: o,
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
                let mut r = self.result(elapsed, cpu);
                if plan.abort_every.is_some() {
                    // Log out first: an answer for an aborted task may still come meanwhile,
                    // and a logout that fails counts here.
                    for j in &mut self.jobs {
                        j.conn.logout()?;
                        if let Some((stats, res)) = j.conn.abort_stats() {
                            r.aborts.add(&stats);
                            if let Err(e) = res {
                                r.abort_error
                                    .get_or_insert_with(|| format!("{}: {e}", j.conn.label()));
                            }
                        }
                    }
                }
                Ok(r)
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
            ios: self.tally.rec.ios,
            reads: self.tally.rec.reads,
            elapsed_ns,
            cpu_user_ns: cpu.0,
            cpu_sys_ns: cpu.1,
            hist: self.tally.rec.take_hist(),
            mismatches: std::mem::take(&mut self.tally.mismatches),
            blocks_checked: self.tally.blocks_checked,
            aborts: AbortStats::default(),
            abort_error: None,
            failovers: std::mem::take(&mut self.failovers),
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

    /// Fills every session's queue: `issue` submits one slot's I/O, or says there is none.
    fn load(&mut self, mut issue: impl FnMut(&mut Job, usize) -> bool) -> Result<(), String> {
        for j in &mut self.jobs {
            for slot in 0..self.plan.qd {
                if !issue(j, slot) {
                    break;
                }
            }
            j.conn.flush()?;
        }
        Ok(())
    }

    /// One pass over every session: takes its completions (a failed I/O ends the run) into
    /// the live totals, hands each to `on_done` (tally, session, slot, time, latency; it may
    /// submit the slot's next I/O) and sends what was queued; then publishes the live
    /// totals, and idles if nothing came. The I/Os still in flight, and the time of the last
    /// completions (`now_ns` if none came). An aborted I/O (--abort-every) counts for
    /// nothing: `on_done` gets no latency for it, only the slot to reuse.
    fn pass(
        &mut self,
        t0: Instant,
        mut now_ns: u64,
        done: &mut Vec<Completion>,
        mut on_done: impl FnMut(&mut Tally, &mut Job, usize, u64, Option<u64>),
    ) -> Result<(usize, u64), String> {
        let mut any = false;
        let mut got = false;
        let mut inflight = 0;
        let plan = &self.plan;
        for j in &mut self.jobs {
            // Completions that came before a connection error still count: they were
            // acknowledged.
            let polled = j.conn.poll(done);
            if !done.is_empty() {
                any = true;
                now_ns = t0.elapsed().as_nanos() as u64;
                for c in done.drain(..) {
                    if let Err(e) = c.result {
                        // A unit attention (a LUN added or removed, a capacity changed) says
                        // nothing about the command: it is retried, as initiators do (at most
                        // MAX_UNIT_ATTENTIONS times in a row), and said on stderr.
                        let ua = e.status == status::CHECK_CONDITION
                            && e.sense.is_some_and(|s| s.key == Sense::UNIT_ATTENTION);
                        if ua && j.unit_attentions[c.slot] < MAX_UNIT_ATTENTIONS {
                            eprintln!("riser-perf: {}: {e}: retried", j.conn.label());
                            j.unit_attentions[c.slot] += 1;
                            let (dir, lba, blocks) = (j.dirs[c.slot], j.conn.lba(c.slot), j.blocks[c.slot]);
                            j.conn.submit(c.slot, dir, lba, blocks);
                            continue;
                        }
                        return Err(format!("{}: {e}", j.conn.label()));
                    }
                    j.unit_attentions[c.slot] = 0;
                    if !j.pending.is_empty() {
                        j.pending[c.slot] = None;
                        j.doubt[c.slot] = false;
                    }
                    if c.aborted {
                        on_done(&mut self.tally, j, c.slot, now_ns, None);
                        continue;
                    }
                    let lat = now_ns.saturating_sub(j.submit_ns[c.slot]);
                    self.ios_total += 1;
                    self.lat_total += lat;
                    on_done(&mut self.tally, j, c.slot, now_ns, Some(lat));
                }
            }
            let failed = match polled.and_then(|g| j.conn.flush().map(|_| g)) {
                Ok(g) => {
                    got |= g;
                    if j.pending.is_empty() {
                        None
                    } else if g || j.conn.inflight() == 0 {
                        j.stall_since = None;
                        None
                    } else {
                        // Multipath: nothing received with I/O outstanding.
                        let since = *j.stall_since.get_or_insert_with(Instant::now);
                        (since.elapsed() >= plan.path_timeout).then(|| {
                            format!(
                                "no answer for {} s with {} I/Os outstanding",
                                plan.path_timeout.as_secs(),
                                j.conn.inflight()
                            )
                        })
                    }
                }
                Err(e) if j.pending.is_empty() => return Err(e),
                Err(e) => Some(e),
            };
            if let Some(reason) = failed {
                let f = fail_over(j, plan, &self.ctl.stop, t0, reason)?;
                self.failovers.push(f);
                got = true;
            }
            inflight += j.conn.inflight();
        }
        if any {
            self.publish();
        }
        self.idle(got);
        Ok((inflight, now_ns))
    }

    /// The timed benchmark: returns the measured window (ns) and the thread's CPU time in it.
    fn bench(&mut self, t0: Instant, geoms: &[Geometry]) -> Result<(u64, (u64, u64)), String> {
        let mut window = Window::new(self.plan.ramp, self.plan.time);
        let mut done = std::mem::take(&mut self.done);
        // The next I/O of a session's slot.
        let next = |j: &mut Job, slot: usize, now_ns: u64| -> bool {
            let Some(gen) = j.gen.as_mut() else {
                return false;
            };
            let (dir, unit) = gen.next();
            let (lba, blocks) = geoms[j.url].unit(unit);
            j.submit(slot, dir, lba, blocks, now_ns);
            true
        };
        let now_ns = t0.elapsed().as_nanos() as u64;
        self.load(|j, slot| next(j, slot, now_ns))?;
        loop {
            let now_ns = t0.elapsed().as_nanos() as u64;
            let stop = &self.ctl.stop;
            if window.tick(now_ns, || stop.load(Ordering::Relaxed), thread_cpu) {
                self.tally.rec.flush();
            }
            let (measuring, stopping) = (window.measuring(), window.stopping());
            let (inflight, now_ns) =
                self.pass(t0, now_ns, &mut done, |tally, j, slot, now, lat| {
                    if let (true, Some(lat)) = (measuring, lat) {
                        tally.rec.record(lat, j.dirs[slot] == Dir::Read);
                    }
                    if !stopping {
                        next(j, slot, now);
                    }
                })?;
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
            j.submit(slot, dir, lba, blocks, now_ns);
            true
        };
        let now_ns = t0.elapsed().as_nanos() as u64;
        self.load(|j, slot| issue(j, slot, now_ns))?;
        let stop = self.ctl.stop.clone();
        // --sync-every: writes stop being issued when a sync is due, and resume after it.
        let sync_every = self.plan.sync_every.filter(|_| dir == Dir::Write);
        let mut last_sync = Instant::now();
        let mut pausing = false;
        loop {
            let (inflight, _) = self.pass(t0, 0, &mut done, |tally, j, slot, now, lat| {
                tally.rec.record(lat.unwrap_or(0), dir == Dir::Read);
                if dir == Dir::Read {
                    let g = geoms[j.url];
                    let lba = j.conn.lba(slot);
                    let n = ((g.start + g.count - lba).min(g.io_blocks as u64)) as usize;
                    let data = &j.conn.buf(slot)[..n * bsz(&g)];
                    tally.mismatches.check(data, bsz(&g), lba, generation);
                    tally.blocks_checked += n as u64;
                }
                if !stop.load(Ordering::Relaxed) && !pausing {
                    issue(j, slot, now);
                }
            })?;
            if let Some(every) = sync_every {
                if !pausing && last_sync.elapsed() >= every {
                    pausing = true;
                }
                if inflight == 0 {
                    self.sync_all(geoms)?;
                    last_sync = Instant::now();
                    pausing = false;
                    if !stop.load(Ordering::Relaxed) {
                        let now_ns = t0.elapsed().as_nanos() as u64;
                        self.load(|j, slot| issue(j, slot, now_ns))?;
                    }
                    if self.jobs.iter().all(|j| j.conn.inflight() == 0) {
                        break;
                    }
                    continue;
                }
            }
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

    /// SYNCHRONIZE CACHE (10) on every session (no writes in flight), then one line per
    /// session naming the range written so far, all of it acknowledged before the sync.
    fn sync_all(&mut self, geoms: &[Geometry]) -> Result<(), String> {
        let sessions = self.plan.sessions as u64;
        for j in &mut self.jobs {
            let r = j.conn.exec(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0)?;
            if r.status != 0 {
                return Err(format!("{}: SYNCHRONIZE CACHE: {}", j.conn.label(), riser_initiator::scsi::status_name(r.status)));
            }
            let g = geoms[j.url];
            let first = g.units(true) * j.index as u64 / sessions;
            let start = g.unit(first).0;
            let end = if j.next_unit > first {
                let (lba, blocks) = g.unit(j.next_unit - 1);
                lba + blocks as u64
            } else {
                start
            };
            println!("sync: {} LBA {start}..{end} durable", j.conn.label());
        }
        Ok(())
    }
}

impl Job {
    /// Submits one I/O on a slot, noting its direction and when it went.
    fn submit(&mut self, slot: usize, dir: Dir, lba: u64, blocks: u32, now_ns: u64) {
        self.dirs[slot] = dir;
        self.blocks[slot] = blocks;
        self.submit_ns[slot] = now_ns;
        if let Some(p) = self.pending.get_mut(slot) {
            *p = Some((lba, blocks));
        }
        self.conn.submit(slot, dir, lba, blocks);
    }
}

/// Logs in through one path and readies the session for I/O (TEST UNIT READY until ready,
/// READ CAPACITY, the task slots).
fn open_path(plan: &Plan, t: &riser_initiator::url::TargetUrl, o: &LoginOptions) -> Result<Session, String> {
    let mut conn = Session::login(t, o, plan.qd)?;
    let copy_reads = plan.mode != Mode::Bench;
    let setup = conn
        .wait_ready()
        .and_then(|_| conn.read_capacity())
        .and_then(|_| conn.start_io(plan.qd, plan.bs as usize, copy_reads));
    if let Err(e) = setup {
        let _ = conn.logout();
        return Err(e);
    }
    Ok(conn)
}

/// The session's path failed (`reason`): logs it, logs in through the next path (trying them
/// all in turn, the failed one last, for up to --failover-timeout), and resubmits there every
/// I/O the old path did not acknowledge, writes with the data they had. Until the new path
/// acknowledges them, those writes are in doubt: the old target may or may not have written
/// them. Err: no path came back in time (the message names the writes left in doubt).
fn fail_over(
    j: &mut Job,
    plan: &Plan,
    stop: &AtomicBool,
    t0: Instant,
    reason: String,
) -> Result<Failover, String> {
    let seen = Instant::now();
    let since = j.stall_since.take().unwrap_or(seen);
    let paths = &plan.paths[j.url];
    let from = j.conn.label().to_string();
    // What the old path never acknowledged: (slot, direction, LBA, blocks, write data).
    let mut redo = Vec::new();
    for slot in 0..j.pending.len() {
        if let Some((lba, blocks)) = j.pending[slot] {
            let dir = j.dirs[slot];
            let data = if dir == Dir::Write {
                let n = (blocks as usize * j.conn.block_size() as usize).min(j.conn.buf(slot).len());
                j.conn.buf(slot)[..n].to_vec()
            } else {
                Vec::new()
            };
            redo.push((slot, dir, lba, blocks, data));
        }
    }
    let writes = redo.iter().filter(|r| r.1 == Dir::Write).count();
    let (bsize, nblocks) = (j.conn.block_size(), j.conn.num_blocks());
    eprintln!(
        "riser-perf: path {from} failed: {reason}; {} I/Os not acknowledged ({writes} writes in doubt); failing over",
        redo.len()
    );
    let in_doubt = || {
        let mut v: Vec<String> = redo
            .iter()
            .filter(|r| r.1 == Dir::Write)
            .map(|r| format!("LBA {}+{}", r.2, r.3))
            .collect();
        v.sort();
        v.join(", ")
    };
    let deadline = seen + plan.failover_timeout;
    let mut attempts = 0u32;
    let mut k = 1;
    let mut last_err = String::new();
    let conn = loop {
        if stop.load(Ordering::Relaxed) {
            return Err(format!("interrupted during a failover from {from}; writes in doubt: {}", in_doubt()));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{from}: path failed ({reason}) and no path logged in within {} s (last: {last_err}); {writes} writes left in doubt: {}",
                plan.failover_timeout.as_secs(),
                in_doubt()
            ));
        }
        let p = (j.path + k) % paths.len();
        k += 1;
        if p == j.path {
            // A whole round failed: a pause before the next.
            std::thread::sleep(Duration::from_millis(200));
        }
        attempts += 1;
        let t = &paths[p];
        match open_path(plan, t, &j.login) {
            Ok(c) if c.block_size() != bsize || c.num_blocks() != nblocks => {
                last_err = format!(
                    "{t}: a LUN of {} blocks of {} B, not {nblocks} of {bsize} B as through {from}",
                    c.num_blocks(),
                    c.block_size()
                );
                eprintln!("riser-perf: {last_err}");
            }
            Ok(c) => {
                j.path = p;
                break c;
            }
            Err(e) => {
                eprintln!("riser-perf: failover: {e}");
                last_err = e;
            }
        }
    };
    // The old connection goes (closed on drop).
    let mut conn = conn;
    if let Some(n) = plan.abort_every {
        conn.abort_every(n);
    }
    j.conn = conn;
    for (slot, dir, lba, blocks, data) in &redo {
        j.conn.buf_mut(*slot)[..data.len()].copy_from_slice(data);
        j.pending[*slot] = Some((*lba, *blocks));
        j.doubt[*slot] = *dir == Dir::Write;
        // The latency of a resubmitted I/O counts from its first submission.
        j.conn.submit(*slot, *dir, *lba, *blocks);
    }
    j.conn.flush()?;
    let f = Failover {
        from,
        to: j.conn.label().to_string(),
        reason,
        at_s: seen.duration_since(t0).as_secs_f64(),
        no_path_s: since.elapsed().as_secs_f64(),
        resubmitted: redo.len(),
        writes_in_doubt: writes,
        attempts,
    };
    eprintln!(
        "riser-perf: failover: {} -> {} after {:.2} s without a path ({attempts} login(s)); {} I/Os resubmitted",
        f.from, f.to, f.no_path_s, f.resubmitted
    );
    Ok(f)
}
