//! Issue 26's first acceptance test: with `riser-perf --verify` running on LUN 0 of a target,
//! a LUN is added, written and removed; a null and a malloc device are resized; the initiator
//! group's netmask changes so that another initiator's session is asked to log out and then
//! cannot log in again; a redirect is set and cleared. riser-perf sees no verify error (LUN 0
//! is never touched), and a second session observes each unit attention, as does libiscsi
//! (`test/c/ua_probe.c`, built here with the system's cc and libiscsi-dev).
//!
//! riser-perf logs in through portal group 2 (the redirect is set on portal group 1, where the
//! observing session and the other initiator are), and runs its write-and-read-back pass
//! again and again until the changes are done, each run with a generation of its own; the
//! unit attentions its own nexus gets (REPORTED LUNS DATA HAS CHANGED) it retries, as
//! initiators do, and says so on stderr.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use super::access::discovery_login;
use super::*;
use riser_tests::bin;
use riser_tests::iscsi::connect_from;

/// One riser-perf run: (exit ok, stdout, stderr).
fn perf_run(url: &str, generation: u64) -> (bool, String, String) {
    let out = Command::new(bin("riser-perf"))
        .args(["--no-pin", "-m", "0x1", "--qd", "8", "--login-timeout", "10", "--verify", "--bs", "4096"])
        .args(["--generation", &generation.to_string(), url])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run riser-perf");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// TEST UNIT READY on `lun` until GOOD; the unit attentions it met, in order.
fn unit_attentions(c: &mut Client, lun: u16) -> Vec<(u8, u8, u8)> {
    let mut seen = Vec::new();
    for _ in 0..8 {
        let r = test_unit_ready(c, lun).expect("connection lost");
        match (r.status, r.sense()) {
            (0, _) => {
                // The same condition raised twice before it was reported may come once or twice.
                seen.dedup();
                return seen;
            }
            (CHECK_CONDITION, Some(s)) if s.0 == UNIT_ATTENTION => seen.push(s),
            other => panic!("TEST UNIT READY on LUN {lun}: {other:?}"),
        }
    }
    panic!("LUN {lun} never became ready; unit attentions: {seen:?}");
}

/// libiscsi's view: `ua_probe` logged in through its own I_T nexus, asked LUN by LUN.
struct Libiscsi {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Libiscsi {
    /// Builds test/c/ua_probe.c and logs it in to `url`.
    fn start(url: &str) -> Libiscsi {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("c/ua_probe.c");
        let exe = std::env::temp_dir().join(format!("riser-ua-probe-{}", std::process::id()));
        let cc = Command::new("cc").arg("-o").arg(&exe).arg(&src).arg("-liscsi").output().expect("run cc (build-essential)");
        assert!(cc.status.success(), "building {} failed (libiscsi-dev: scripts/setup.sh test): {}", src.display(), String::from_utf8_lossy(&cc.stderr));
        let mut child = Command::new(&exe).arg(url).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("run ua_probe");
        let _ = std::fs::remove_file(&exe);
        let stdin = child.stdin.take().expect("stdin");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("ua_probe output");
        assert_eq!(line.trim(), "ready", "libiscsi's login");
        Libiscsi { child, stdin, out }
    }

    /// TEST UNIT READY on `lun` until GOOD: the unit attentions libiscsi met.
    fn unit_attentions(&mut self, lun: u16) -> Vec<(u8, u8, u8)> {
        writeln!(self.stdin, "{lun}").expect("to ua_probe");
        self.stdin.flush().expect("to ua_probe");
        let mut seen = Vec::new();
        loop {
            let mut line = String::new();
            self.out.read_line(&mut line).expect("from ua_probe");
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["good"] => {
                    seen.dedup();
                    return seen;
                }
                ["ua", k, a, q] => {
                    let h = |x: &str| u8::from_str_radix(x, 16).expect("hex");
                    seen.push((h(k), h(a), h(q)));
                }
                _ => panic!("libiscsi on LUN {lun}: {line}"),
            }
        }
    }
}

impl Drop for Libiscsi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn live_changes_under_riser_perf_verify_on_lun_0() {
    let riser = Riser::start();
    let (p1, p2) = (free_port(), free_port());
    let iqn = riser.add_iscsi_target("accept", p1, &[8]);
    let call = |m: &str, p: Value| riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", riser.log()));
    call("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "127.0.0.1", "port": p2.to_string()}]}));
    call("iscsi_target_node_add_pg_ig_maps", json!({"name": iqn, "pg_ig_maps": [{"pg_tag": 2, "ig_tag": 1}]}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", p2)).is_err() {
        assert!(Instant::now() < deadline, "riser does not listen on {p2}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut obs = session(&riser, p1, &iqn);
    let mut other = Client::over(connect_from("127.0.0.2".parse().expect("ip"), p1, None).expect("connect from 127.0.0.2"));
    other.login(&iqn, &[]).unwrap_or_else(|s| panic!("login from 127.0.0.2: {s:?}\nriser log:\n{}", riser.log()));
    assert!(other.clear_unit_attentions());
    let mut lib = Libiscsi::start(&format!("iscsi://127.0.0.1:{p1}/{iqn}/0"));
    let mut luas = Vec::new();

    // riser-perf --verify on LUN 0, run after run, until the changes are done.
    let url = format!("iscsi://127.0.0.1:{p2}/{iqn}/0");
    let stop = Arc::new(AtomicBool::new(false));
    let runs: Arc<Mutex<Vec<(bool, String, String)>>> = Arc::default();
    let perf = {
        let (stop, runs, url) = (stop.clone(), runs.clone(), url.clone());
        std::thread::spawn(move || {
            let mut generation = 100;
            loop {
                let r = perf_run(&url, generation);
                let ok = r.0;
                runs.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                generation += 1;
                if !ok || stop.load(Ordering::Acquire) {
                    break;
                }
            }
        })
    };
    // Let the first run get going.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !connections(&riser).iter().any(|c| c["pg_tag"] == json!(2)) {
        assert!(Instant::now() < deadline, "riser-perf never logged in\nriser log:\n{}", riser.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut uas = Vec::new();

    // 1. A LUN added, written, removed.
    riser.rpc_json(&["bdev_malloc_create", "-b", "Added", "4", "512"]);
    assert_eq!(riser.rpc(&["iscsi_target_node_add_lun", &iqn, "Added", "-i", "1"]).json(), json!(true));
    uas.extend(unit_attentions(&mut obs, 0));
    luas.extend(lib.unit_attentions(0));
    lib.unit_attentions(1);
    clear_unit_attentions(&mut obs, 1);
    write_and_verify(&mut obs, 1, 0, 90);
    assert_eq!(riser.rpc(&["iscsi_target_node_remove_lun", &iqn, "1"]).json(), json!(true));
    uas.extend(unit_attentions(&mut obs, 0));
    luas.extend(lib.unit_attentions(0));

    // 2. A null and a malloc device, on LUNs 2 and 3, grow.
    riser.rpc_json(&["bdev_null_create", "Nul", "4", "512"]);
    riser.rpc_json(&["bdev_malloc_create", "-b", "Mal", "4", "512"]);
    assert_eq!(riser.rpc(&["iscsi_target_node_add_lun", &iqn, "Nul", "-i", "2"]).json(), json!(true));
    assert_eq!(riser.rpc(&["iscsi_target_node_add_lun", &iqn, "Mal", "-i", "3"]).json(), json!(true));
    uas.extend(unit_attentions(&mut obs, 0));
    clear_unit_attentions(&mut obs, 2);
    clear_unit_attentions(&mut obs, 3);
    luas.extend(lib.unit_attentions(0));
    lib.unit_attentions(2);
    lib.unit_attentions(3);
    assert_eq!(riser.rpc(&["bdev_null_resize", "Nul", "8"]).json(), json!(true));
    uas.extend(unit_attentions(&mut obs, 2));
    luas.extend(lib.unit_attentions(2));
    assert_eq!(read_capacity16(&mut obs, 2), (16384, 512));
    assert_eq!(riser.rpc(&["bdev_malloc_resize", "Mal", "8"]).json(), json!(true));
    uas.extend(unit_attentions(&mut obs, 3));
    luas.extend(lib.unit_attentions(3));
    assert_eq!(read_capacity16(&mut obs, 3), (16384, 512));

    // 3. The netmask: only 127.0.0.1 from now on. The other initiator is asked to log out,
    //    does, and cannot log in again.
    assert_eq!(riser.rpc(&["iscsi_initiator_group_add_initiators", "1", "-m", "127.0.0.1/32"]).json(), json!(true));
    assert_eq!(riser.rpc(&["iscsi_initiator_group_remove_initiators", "1", "-m", "ANY"]).json(), json!(true));
    let msg = async_message(&riser, &mut other);
    assert_eq!((msg.async_event, msg.parameter3), (1, 30), "{msg:?}");
    let itt = other.itt();
    let l = LogoutRequest { immediate: true, reason_code: 0, itt, cid: other.cid, cmd_sn: other.cmd_sn, exp_stat_sn: other.exp_stat_sn };
    other.send(&Pdu::new(Op::LogoutRequest(l))).expect("send Logout");
    assert!(other.closed_within(Duration::from_secs(5)), "the other initiator's session did not end");
    let mut again = Client::over(connect_from("127.0.0.2".parse().expect("ip"), p1, None).expect("connect from 127.0.0.2"));
    assert_eq!(again.login(&iqn, &[]).err(), Some((2, 2)), "the other initiator logs in again");
    let asked: Vec<String> = riser.log().lines().filter(|l| l.contains("asked to log out")).map(str::to_string).collect();
    assert_eq!(asked.len(), 1, "only the other initiator's session is asked: {asked:?}");
    assert!(asked[0].contains("initiator 127.0.0.2 not in initiator group 1's netmasks"), "{asked:?}");

    // 4. A redirect on portal group 1, set and cleared.
    assert_eq!(riser.rpc(&["iscsi_target_node_set_redirect", &iqn, "1", "-a", "127.0.0.9", "-p", "3260"]).json(), json!(true));
    let (class, detail, keys) = first_login_answer(p1, &iqn);
    assert_eq!((class, detail), (1, 1), "Target moved temporarily: {keys:?}");
    let mut d = Client::connect(p1);
    discovery_login(&mut d).expect("discovery is not redirected");
    assert_eq!(riser.rpc(&["iscsi_target_node_set_redirect", &iqn, "1"]).json(), json!(true));
    assert_eq!(first_login_answer(p1, &iqn).0, 0, "after clearing, logins go on");
    write_and_verify(&mut obs, 3, 16376, 91);

    // riser-perf finishes its run; every run verified clean.
    stop.store(true, Ordering::Release);
    perf.join().expect("riser-perf thread");
    let runs = runs.lock().unwrap_or_else(|p| p.into_inner());
    assert!(!runs.is_empty());
    for (i, (ok, out, err)) in runs.iter().enumerate() {
        assert!(*ok && out.contains("0 mismatched") && out.contains("verify: PASSED"), "riser-perf run {i}:\n{out}\n{err}\nriser log:\n{}", riser.log());
    }
    let retried: usize = runs.iter().map(|r| r.2.matches("retried").count()).sum();
    eprintln!("riser-perf: {} verify run(s), {retried} command(s) retried after a unit attention", runs.len());

    // The observing session saw each unit attention: the LUN added, removed, the two added,
    // then each capacity change.
    assert_eq!(uas, [REPORTED_LUNS_CHANGED, REPORTED_LUNS_CHANGED, REPORTED_LUNS_CHANGED, CAPACITY_CHANGED, CAPACITY_CHANGED]);
    // And so did libiscsi, through a nexus of its own.
    assert_eq!(luas, uas, "libiscsi's unit attentions");
    // LUN 0 was never touched by the changes: its data is riser-perf's last generation.
    write_and_verify(&mut obs, 0, 0, 92);
}
