//! `riser-perf --abort-every` (hidden) against the real riser over TCP: an ABORT TASK right
//! after every 7th command of a random-read load at QD 32, then the data written and read
//! back with no aborts. riser must answer every ABORT TASK with Function complete (the task
//! aborted: no SCSI Response for it ever) or Task does not exist (answered already), never
//! send a response for a task it said it aborted, and keep serving.
//! (The same over iSER runs in the soft-RoCE VM: scripts/vm/iser-tmf.sh.)

use std::process::Command;

use riser_tests::perf_out::abort_counts;
use riser_tests::{bin, free_port, Riser};

fn perf(args: &[&str]) -> (bool, String) {
    let out = Command::new(bin("riser-perf"))
        .args(["--no-pin", "-m", "0x1", "--login-timeout", "10"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("riser-perf runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn abort_task_under_load_over_tcp_then_data_intact() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("perfabort", port, &[16]);
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let ctx = || format!("riser log:\n{}", riser.log());
    let (ok, out) = perf(&[
        "--rw", "randread", "--qd", "32", "--bs", "4096", "--time", "2", "--ramp", "0",
        "--abort-every", "7", &url,
    ]);
    assert!(ok, "riser-perf --abort-every failed:\n{out}\n{}", ctx());
    let c = abort_counts(&out, "aborts: ");
    eprintln!("{c:?}");
    assert!(c.get("sent") > 0, "{out}");
    assert_eq!(
        c.get("sent"),
        c.get("function complete") + c.get("task does not exist"),
        "every ABORT TASK answered: {out}"
    );
    assert_eq!(c.get("responses for aborted tasks"), 0, "{out}\n{}", ctx());
    assert_eq!(c.get("errors"), 0, "{out}");
    // Every aborted task's ITT went back to a later command (or its slot was the last).
    assert!(c.get("ITTs reused") + 32 >= c.get("aborted"), "{out}");
    // riser still serves, the data is intact: 16 MiB written and read back, no aborts.
    let (ok, out) = perf(&["--verify", "--generation", "31", "--qd", "32", "--bs", "65536", &url]);
    assert!(ok && out.contains("verify: PASSED"), "verify after the aborts:\n{out}\n{}", ctx());
    let (ok, out) = perf(&["--verify-only", "--generation", "31", "--qd", "8", "--bs", "4096", &url]);
    assert!(ok && out.contains("verify: PASSED"), "read back again:\n{out}\n{}", ctx());
}
