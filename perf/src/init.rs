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

mod args;
mod client;
mod summary;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

pub use args::{parse_lba_range, DigestArg, Geometry, InitArgs, Mode, Plan};
pub use client::{Failover, SessionInfo};
use client::{client_thread, Control, Gate, Live, Msg, SessionSpec, ThreadResult};
use summary::{bench_report, describe, live_line, VerifyOut};

use crate::sys::rusage;
use crate::verify::Mismatches;

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
    // Every path of a multipath URL may be tried (and time out) before one logs in.
    let max_paths = plan.paths.iter().map(Vec::len).max().unwrap_or(1) as u32;
    let setup_deadline = Instant::now() + plan.timeout * (3 * per_thread * max_paths + 2);
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
    // Lets the client threads into `phase` (1: the benchmark or the verify write pass, 2: the
    // verify read pass).
    let start_phase = |phase: u32| {
        ctl.set(|g| {
            g.phase = phase;
            g.t0 = Some(t0);
            g.geoms = geoms.clone();
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
            start_phase(1);
            let ramp = plan.ramp.as_secs();
            let label = move |s: u64| {
                if s <= ramp {
                    " ramp".to_string()
                } else {
                    String::new()
                }
            };
            pump(
                &label,
                &mut counting(is_done, 0, active),
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
            let failovers: Vec<Failover> =
                rs.iter().flat_map(|(_, r)| r.failovers.iter().cloned()).collect();
            let (report, cpu) =
                bench_report(plan, &rs, &geoms, proc0, proc1, &all_infos, &failovers);
            if plan.json {
                println!("{report}");
            } else {
                print!("{cpu}");
                print!("{}", failover_lines(plan, &failovers));
            }
            if let Some(path) = &plan.plot {
                let hists: Vec<&Histogram<u64>> = rs.iter().map(|(_, r)| &r.hist).collect();
                let window = rs.iter().map(|(_, r)| r.elapsed_ns).max().unwrap_or(0);
                crate::plot::plot_run(path, plan, &hists, window)?;
            }
            if plan.abort_every.is_some() {
                let mut all = riser_initiator::session::AbortStats::default();
                for (_, r) in &rs {
                    all.add(&r.aborts);
                }
                if plan.json {
                    eprintln!("{}", all.line());
                } else {
                    println!("{}", all.line());
                }
                if let Some(e) = rs.iter().find_map(|(_, r)| r.abort_error.clone()) {
                    return Err(format!(
                        "ABORT TASK: {e} ({} violation(s) in all)",
                        all.errors
                    ));
                }
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
                start_phase(1);
                pump(
                    &|_| " write".to_string(),
                    &mut counting(|m| matches!(m, Msg::Written), 0, active),
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
            start_phase(2);
            let already = finished;
            pump(
                &|_| " read".to_string(),
                &mut counting(is_done, already, active),
                &mut results,
                &mut finished,
            )?;
            let read_s = read_start.elapsed().as_secs_f64();
            let rs: Vec<Box<ThreadResult>> = results.into_iter().flatten().collect();
            let failovers: Vec<Failover> =
                rs.iter().flat_map(|r| r.failovers.iter().cloned()).collect();
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
                let v = serde_json::json!({ "verify": out, "lun": geoms.as_slice(), "sessions": all_infos, "failovers": failovers });
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                print!("{}", failover_lines(plan, &failovers));
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

/// The summary's failover lines: none for a run without several paths; otherwise a count,
/// the time without a path, and one line per failover.
fn failover_lines(plan: &Plan, fs: &[Failover]) -> String {
    if plan.paths.iter().all(|p| p.len() < 2) {
        return String::new();
    }
    let max = fs.iter().map(|f| f.no_path_s).fold(0.0, f64::max);
    let sum = fs.iter().map(|f| f.no_path_s).fold(0.0, |a, b| a + b);
    let mut s = format!(
        "failovers: {} (time without a path: {sum:.2} s in all, {max:.2} s at most)\n",
        fs.len()
    );
    for f in fs {
        s += &format!(
            "failover at {:.2} s: {} -> {} ({}): {:.2} s without a path, {} login(s); {} I/Os resubmitted, {} of them writes in doubt until acknowledged on the new path\n",
            f.at_s, f.from, f.to, f.reason, f.no_path_s, f.attempts, f.resubmitted, f.writes_in_doubt
        );
    }
    s
}

fn is_done(m: &Msg) -> bool {
    matches!(m, Msg::Done(..))
}

/// An `until` for the control thread's pump: true once `n` messages that `is` picks have
/// come (`already` of them before).
fn counting(is: fn(&Msg) -> bool, already: usize, n: usize) -> impl FnMut(&Msg) -> bool {
    let mut count = already;
    move |m| {
        if is(m) {
            count += 1;
        }
        count == n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_initiator::url::Transport;
    use crate::workload::{PollModeArg, Workload};
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
        assert!(err(&["--bs", "33554944", U]).contains("32 MiB"));
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

    /// The whole verify mode (write pass, read pass, checks) against the fake target, with
    /// a partial last I/O.
    #[test]
    fn verify_against_the_fake_target() {
        let (port, obs, h) = crate::fake_target::start();
        let url = format!("iscsi://127.0.0.1:{port}/iqn.2024-01.test:fake/0");
        let a = args(&[
            "--verify",
            "--generation",
            "5",
            "--bs",
            "8192",
            "--qd",
            "4",
            "--no-pin",
            "--json",
            &url,
        ])
        .unwrap();
        assert_eq!(main(&a), Ok(true));
        h.join().unwrap();
        let o = obs.lock().unwrap();
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        // TUR twice (unit attention), READ CAPACITY, 63 writes and 63 reads of 16 blocks
        // or less (1000 blocks).
        assert_eq!(o.commands, 3 + 2 * 63);
    }

    /// A unit attention in the middle of a verify pass (the target's LUNs changed): the READs
    /// that met it are retried and the run passes, every block checked.
    #[test]
    fn verify_retries_reads_that_meet_a_unit_attention() {
        use crate::fake_target::{start_opts, FakeOpts};
        // Commands 1-3: TUR (unit attention), TUR, READ CAPACITY; 4-66: the writes; then reads.
        let opts = FakeOpts {
            unit_attention_at: vec![70, 90],
            ..FakeOpts::default()
        };
        let (port, obs, h) = start_opts(None, opts);
        let url = format!("iscsi://127.0.0.1:{port}/iqn.2024-01.test:fake/0");
        let a = args(&[
            "--verify", "--generation", "6", "--bs", "8192", "--qd", "4", "--no-pin", "--json", &url,
        ])
        .unwrap();
        assert_eq!(main(&a), Ok(true));
        h.join().unwrap();
        let o = obs.lock().unwrap();
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        // Two READs more than a clean run: the two that met the unit attention, again.
        assert_eq!(o.commands, 3 + 2 * 63 + 2);
    }

    fn abort_run(answer_aborted: bool) -> (Result<bool, String>, crate::fake_target::Observed) {
        use crate::fake_target::{start_opts, FakeOpts};
        let opts = FakeOpts {
            defer_reads: true,
            answer_aborted,
            ..FakeOpts::default()
        };
        let (port, obs, h) = start_opts(None, opts);
        let url = format!("iscsi://127.0.0.1:{port}/iqn.2024-01.test:fake/0");
        let a = args(&[
            "--abort-every", "3", "--qd", "4", "--time", "1", "--ramp", "0", "--no-pin", &url,
        ])
        .unwrap();
        let r = main(&a);
        h.join().unwrap();
        let o = std::mem::take(&mut *obs.lock().unwrap());
        (r, o)
    }

    /// --abort-every against the fake target (it answers READs after each batch, so an ABORT
    /// TASK in the same batch aborts its READ): the run succeeds, aborts happened, and the
    /// aborted slots went on with new READs.
    #[test]
    fn abort_every_against_the_fake_target() {
        let (r, o) = abort_run(false);
        assert_eq!(r, Ok(true));
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        assert!(o.tmfs > 0 && o.aborted_reads > 0, "{} TMFs, {} reads aborted", o.tmfs, o.aborted_reads);
        assert!(o.logged_out);
        // --abort-every is refused with --verify, and 0 is refused.
        assert!(args(&["--abort-every", "3", "--verify", U]).is_err());
        assert!(plan(&["--abort-every", "0", U]).unwrap_err().contains("--abort-every 0"));
    }

    /// A target that answers a READ after saying its ABORT TASK completed: riser-perf fails
    /// and says so.
    #[test]
    fn abort_every_catches_a_response_after_function_complete() {
        let (r, o) = abort_run(true);
        assert!(o.aborted_reads > 0);
        let e = r.unwrap_err();
        assert!(e.contains("after answering its ABORT TASK with Function complete"), "{e}");
    }

    /// Two fake targets on one disk (two paths to one LUN); the first fails (`kind`) at its
    /// `n`th SCSI command. Returns riser-perf's result and what the targets saw together.
    fn failover_run(
        kind: crate::fake_target::FailKind,
        n: usize,
        second_alive: bool,
        extra: &[&str],
    ) -> (Result<bool, String>, crate::fake_target::Observed) {
        use crate::fake_target::{start_opts, FakeOpts, BLOCK, BLOCKS};
        let disk = Arc::new(Mutex::new(vec![0u8; BLOCKS as usize * BLOCK]));
        let a_opts = FakeOpts {
            disk: Some(disk.clone()),
            fail_after: Some((n, kind)),
            ..FakeOpts::default()
        };
        let (pa, obs_a, ha) = start_opts(None, a_opts);
        let (pb, b) = if second_alive {
            let (pb, obs_b, hb) = start_opts(None, FakeOpts { disk: Some(disk), ..FakeOpts::default() });
            (pb, Some((obs_b, hb)))
        } else {
            // A port nobody listens on: the second path refuses every login.
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            (l.local_addr().unwrap().port(), None)
        };
        let url = format!(
            "iscsi://127.0.0.1:{pa}/iqn.2024-01.test:fake/0,iscsi://127.0.0.1:{pb}/iqn.2024-01.test:fake/0"
        );
        let mut v = vec!["--verify", "--generation", "9", "--bs", "4096", "--qd", "4", "--no-pin", "--login-timeout", "2"];
        v.extend_from_slice(extra);
        v.push(&url);
        let r = main(&args(&v).unwrap());
        ha.join().unwrap();
        let mut o = std::mem::take(&mut *obs_a.lock().unwrap());
        if let Some((obs_b, hb)) = b {
            hb.join().unwrap();
            let ob = std::mem::take(&mut *obs_b.lock().unwrap());
            o.violations.extend(ob.violations);
            o.commands += ob.commands;
            o.logged_out = ob.logged_out;
        }
        (r, o)
    }

    /// A path that closes its connection in the middle of --verify's write pass: riser-perf
    /// logs in on the second path, resubmits what was not acknowledged, and the read-back
    /// through the second path passes (both targets share the disk).
    #[test]
    fn failover_when_the_path_is_closed() {
        use crate::fake_target::FailKind;
        let (r, o) = failover_run(FailKind::Close, 40, true, &[]);
        assert_eq!(r, Ok(true));
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        assert!(o.logged_out, "the second path's session logged out");
        // 1000 blocks of 512 B in 4 KiB I/Os: 125 writes and 125 reads, plus setup
        // (TUR x2 + READ CAPACITY per session); the I/Os A had not answered (at most --qd)
        // were sent twice.
        assert!(o.commands > 2 * 3 + 250 && o.commands <= 2 * 3 + 250 + 4, "{}", o.commands);
    }

    /// A path that stops answering (a hung target, the connection open): after
    /// --path-timeout riser-perf gives it up and goes on through the second.
    #[test]
    fn failover_when_the_path_hangs() {
        use crate::fake_target::FailKind;
        let t = Instant::now();
        let (r, o) = failover_run(FailKind::Hang, 60, true, &["--path-timeout", "1"]);
        assert_eq!(r, Ok(true));
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        assert!(t.elapsed() >= Duration::from_secs(1), "gave up before --path-timeout");
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    }

    /// No path left: the run fails after --failover-timeout and names the writes in doubt.
    #[test]
    fn failover_without_a_path_left_fails_naming_the_writes_in_doubt() {
        use crate::fake_target::FailKind;
        let t = Instant::now();
        let (r, _) = failover_run(FailKind::Close, 40, false, &["--failover-timeout", "1"]);
        let e = r.unwrap_err();
        assert!(e.contains("no path logged in within 1 s"), "{e}");
        assert!(e.contains("writes left in doubt: LBA "), "{e}");
        assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    }

    #[test]
    fn multipath_urls() {
        let a = "iscsi://127.0.0.1:3261/iqn.x:y/0";
        let b = "iscsi://127.0.0.2:3262/iqn.x:y/0";
        let p = plan(&[&format!("{a},{b}"), U]).unwrap();
        assert_eq!(p.targets.len(), 2);
        assert_eq!(p.paths[0].len(), 2);
        assert_eq!(p.paths[0][1].to_string(), b);
        assert_eq!(p.paths[1].len(), 1);
        assert_eq!((p.path_timeout.as_secs(), p.failover_timeout.as_secs()), (5, 60));
        assert!(plan(&[&format!("{a},")]).unwrap_err().contains("empty path"));
        assert!(plan(&[&format!("{a},{a}")]).unwrap_err().contains("given twice"));
        assert!(plan(&["--path-timeout", "0", a]).unwrap_err().contains("--path-timeout 0"));
        assert!(plan(&["--failover-timeout", "9999", a]).unwrap_err().contains("--failover-timeout"));
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
