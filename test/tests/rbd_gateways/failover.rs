//! Path failover across gateways (issue 15's acceptance: "an initiator writing with --verify
//! through gateway A moves to gateway B when A is killed, and no acknowledged write is
//! lost"). Two riser processes export one RBD image (same bdev uuid) through portal groups 1
//! and 2; riser-perf --verify writes the whole image at QD 16 with the two gateways as two
//! paths of one LUN (`URL_A,URL_B`). In the middle of the write pass:
//!
//! 1. gateway A is killed (SIGKILL: its connection resets): riser-perf logs in through B,
//!    resubmits what A had not acknowledged, finishes the write pass and the read-back with
//!    verify PASSED and reports one failover; a fresh `riser-perf --verify-only` of that
//!    generation through B alone then reads every block back.
//! 2. gateway B is stopped (SIGSTOP: a hung gateway, the connection open and silent) while a
//!    new gateway A' serves as the second path: after --path-timeout riser-perf gives B up,
//!    goes on through A', and the same checks hold.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use riser_tests::bin;
use riser_tests::ceph::CephCluster;

use super::{create_image, Gateway};

const UUID: &str = "6c0b7a1e-15a2-4a10-9a5e-0000000fa110";
const IMAGE: &str = "gw-failover";
/// 128 MiB: 32768 writes of 4 KiB, 2 s at the 17 k writes per second seen here on a quiet
/// machine, 10 s and more on a loaded one (memstore keeps the image in RAM).
const IMAGE_MIB: u64 = 128;
/// How long into the write pass a gateway fails.
const FAIL_AFTER: Duration = Duration::from_millis(300);
const BLOCKS: u64 = IMAGE_MIB * 2048;
/// --path-timeout of the runs: how long a silent gateway keeps its I/Os.
const PATH_TIMEOUT_S: u64 = 3;
/// The longest a riser-perf run may take here.
const RUN_LIMIT: Duration = Duration::from_secs(150);

/// A riser-perf run whose output lines arrive on a channel as they are printed.
struct Perf {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Perf {
    fn start(args: &[&str]) -> Perf {
        let mut child = Command::new(bin("riser-perf"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start riser-perf: {e}"));
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("stdout piped");
        let err = child.stderr.take().expect("stderr piped");
        for (stream, tag) in [(Box::new(out) as Box<dyn Read + Send>, ""), (Box::new(err), "stderr: ")] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(format!("{tag}{line}")).is_err() {
                        break;
                    }
                }
            });
        }
        Perf { child, lines, seen: Vec::new() }
    }

    fn output(&self) -> String {
        self.seen.join("\n")
    }

    /// Waits for a line that `f` accepts; panics with the output so far after `limit`.
    fn wait_for(&mut self, what: &str, limit: Duration, f: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    eprintln!("  perf| {l}");
                    let hit = f(&l);
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("riser-perf: no {what} within {limit:?}; its output:\n{}", self.output());
                }
            }
        }
    }

    /// Waits for the exit (all output read); panics after `limit`. (success, output)
    fn finish(mut self, limit: Duration) -> (bool, String) {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    eprintln!("  perf| {l}");
                    self.seen.push(l);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("riser-perf did not finish within {limit:?}; its output:\n{}", self.output());
                }
            }
        }
        let st = self.child.wait().expect("wait for riser-perf");
        (st.success(), self.output())
    }
}

/// `riser-perf --verify` of `generation` through `paths`, at QD 16 in 4 KiB writes.
fn verify_run(paths: &str, generation: u64) -> Perf {
    let g = generation.to_string();
    let pt = PATH_TIMEOUT_S.to_string();
    Perf::start(&[
        "--verify",
        "--generation",
        &g,
        "--bs",
        "4096",
        "--qd",
        "16",
        "--no-pin",
        "--path-timeout",
        &pt,
        "--login-timeout",
        "5",
        "--failover-timeout",
        "30",
        paths,
    ])
}

/// The write pass is under way: its first line, then [`FAIL_AFTER`].
fn wait_write_pass(p: &mut Perf) {
    p.wait_for("verify write pass", Duration::from_secs(30), |l| l.starts_with("verify: writing generation"));
    std::thread::sleep(FAIL_AFTER);
}

/// The run passed with exactly one failover, from `from` to `to`, every block checked.
fn assert_one_failover(ok: bool, out: &str, from: &str, to: &str, reason: &str) {
    assert!(ok, "riser-perf failed:\n{out}");
    assert!(out.contains("verify: PASSED"), "{out}");
    assert!(out.contains(&format!("verify: {BLOCKS} blocks checked, 0 mismatched")), "{out}");
    let at = |prefix: &str| out.lines().position(|l| l.starts_with(prefix));
    let (failed, read) = (at("stderr: riser-perf: path "), at("verify: reading back"));
    assert!(failed.is_some() && failed < read, "the path failed before the read pass: the image is too small\n{out}");
    assert!(out.contains("failovers: 1 (time without a path: "), "{out}");
    let line = out.lines().find(|l| l.starts_with("failover at ")).unwrap_or_else(|| panic!("no failover line:\n{out}"));
    assert!(line.contains(&format!("{from} -> {to}")), "{line}");
    assert!(line.contains(reason), "reason {reason:?} expected: {line}");
}

/// `riser-perf --verify-only` of `generation` through `url` alone: every block reads back.
fn read_back(url: &str, generation: u64) {
    let p = Perf::start(&["--verify-only", "--generation", &generation.to_string(), "--qd", "16", "--no-pin", url]);
    let (ok, out) = p.finish(RUN_LIMIT);
    assert!(ok && out.contains("verify: PASSED"), "read-back of generation {generation} through {url}:\n{out}");
    assert!(out.contains(&format!("verify: {BLOCKS} blocks checked, 0 mismatched")), "{out}");
}

/// `kill -SIG PID`.
fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
    assert!(st.is_ok_and(|s| s.success()), "kill -{sig} {pid} failed");
}

pub fn check(ceph: &CephCluster) {
    create_image(ceph, IMAGE, IMAGE_MIB);
    let mut a = Gateway::start(ceph, IMAGE, UUID, 1, &[]);
    let b = Gateway::start(ceph, IMAGE, UUID, 2, &[]);
    let (ua, ub) = (a.url(), b.url());

    // 1. A killed in the middle of the write pass.
    let g1 = 1_500_001;
    let mut p = verify_run(&format!("{ua},{ub}"), g1);
    wait_write_pass(&mut p);
    let t = Instant::now();
    a.riser.kill();
    eprintln!("failover: gateway A (pg 1) killed");
    let (ok, out) = p.finish(RUN_LIMIT);
    eprintln!("failover: riser-perf finished {:?} after the kill", t.elapsed());
    assert_one_failover(ok, &out, &ua, &ub, "");
    read_back(&ub, g1);
    drop(a);

    // 2. B hung (SIGSTOP) in the middle of the write pass; a new gateway A' is the other path.
    let a2 = Gateway::start(ceph, IMAGE, UUID, 1, &[]);
    let ua2 = a2.url();
    let g2 = 1_500_002;
    let mut p = verify_run(&format!("{ub},{ua2}"), g2);
    wait_write_pass(&mut p);
    let pid = b.riser.pid().expect("gateway B runs");
    signal(pid, "STOP");
    eprintln!("failover: gateway B (pg 2) stopped");
    let t = Instant::now();
    let (ok, out) = p.finish(RUN_LIMIT);
    let took = t.elapsed();
    // SIGKILL ends a stopped process too (and the guard reaps it).
    let mut b = b;
    b.riser.kill();
    eprintln!("failover: riser-perf finished {took:?} after the stop");
    assert_one_failover(ok, &out, &ub, &ua2, &format!("no answer for {PATH_TIMEOUT_S} s"));
    assert!(took >= Duration::from_secs(PATH_TIMEOUT_S), "a silent path was given up before --path-timeout: {took:?}");
    read_back(&ua2, g2);
}
