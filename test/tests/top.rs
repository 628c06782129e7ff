//! `riser-top` on a real terminal: the real riser (two reactors, a malloc LUN) loaded by
//! riser-perf (4 KiB random reads and writes), riser-top running in a detached tmux session
//! of 160x50, its screen read with `tmux capture-pane` on each tab: the reactor rows with a
//! busy %, the connection row (initiator name, tcp, queue depth), the device row with an
//! IOPS figure of the order riser-perf measured, the latency percentiles after `h`. Then
//! riser goes away (the screen says so) and `q` quits with the terminal restored.
//!
//! tmux comes from scripts/setup.sh's test packages (`make test` installs them); without it
//! this test fails, it does not skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use riser_tests::{bin, free_port, json, Riser, TempDir};

const INITIATOR: &str = "iqn.2024-01.io.riser.test:top";

/// A tmux server of our own (its own socket, no user config), killed on drop.
struct Tmux {
    sock: PathBuf,
}

impl Tmux {
    /// Starts `argv` in a detached 160x50 session named "top"; the pane stays after the
    /// program exits, so its exit status and the restored screen can be read.
    fn start(dir: &Path, argv: &[&Path]) -> Tmux {
        let t = Tmux { sock: dir.join("tmux.sock") };
        // The exit status goes to a file: tmux may mark the pane dead when its terminal
        // closes and leave #{pane_dead_status} empty.
        let script = format!("\"$0\" \"$@\"; echo $? > '{}'", dir.join("exit-status").display());
        let mut args: Vec<&std::ffi::OsStr> =
            ["new-session", "-d", "-s", "top", "-x", "160", "-y", "50", "--", "sh", "-c"].iter().map(|s| s.as_ref()).collect();
        args.push(script.as_ref());
        args.extend(argv.iter().map(|p| p.as_os_str()));
        t.ok(&args);
        t.ok(&["set-option", "-t", "top", "remain-on-exit", "on"].map(std::ffi::OsStr::new));
        t
    }

    fn run(&self, args: &[&std::ffi::OsStr]) -> Output {
        match Command::new("tmux").arg("-f").arg("/dev/null").arg("-S").arg(&self.sock).args(args).output() {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("tmux not found: `scripts/setup.sh test` installs it (make test runs it first)")
            }
            Err(e) => panic!("cannot run tmux: {e}"),
        }
    }

    fn ok(&self, args: &[&std::ffi::OsStr]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.ok(&["capture-pane", "-p", "-t", "top"].map(std::ffi::OsStr::new))
    }

    fn keys(&self, keys: &str) {
        self.ok(&["send-keys", "-t", "top", keys].map(std::ffi::OsStr::new));
    }

    /// Waits up to `secs` for a screen that `pred` accepts; panics with the last screen.
    fn wait_for(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if Instant::now() >= deadline {
                panic!("riser-top's screen never showed {what} within {secs} s; last screen:\n{s}");
            }
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").arg("-S").arg(&self.sock).arg("kill-server").output();
    }
}

/// The cells of the table row whose first cell is `first`, borders dropped (only lines
/// inside the table's box: the tab line " 1 Reactors │ 2 ..." starts with a number too).
fn row<'a>(screen: &'a str, first: &str) -> Option<Vec<&'a str>> {
    screen.lines().filter(|l| l.starts_with('│')).find_map(|l| {
        let cells: Vec<&str> = l.trim_matches(|c: char| c == '│' || c.is_whitespace()).split_whitespace().collect();
        (cells.first() == Some(&first)).then_some(cells)
    })
}

/// The reactor rows: [reactor, core, busy %, connections, pollers, state].
fn reactor_rows(screen: &str) -> Vec<Vec<&str>> {
    (0..2).filter_map(|i| row(screen, &i.to_string())).filter(|r| r.len() == 6).collect()
}

fn num(cell: &str) -> Option<f64> {
    cell.parse().ok()
}

/// riser-perf's "  IOPS:       176868 (read ..., write ...)" summary line.
fn perf_iops(out: &str) -> Option<f64> {
    out.lines().find_map(|l| l.trim().strip_prefix("IOPS:")?.split_whitespace().next()?.parse().ok())
}

fn start_perf(url: &str, secs: &str) -> Child {
    Command::new(bin("riser-perf"))
        .args(["--no-pin", "-m", "0x1", "--rw", "randrw", "--bs", "4096", "--qd", "16", "--ramp", "0"])
        .args(["--time", secs, "--initiator-name", INITIATOR, url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("riser-perf starts")
}

#[test]
fn riser_top_shows_reactors_connections_and_device_rates_under_load() {
    let mut riser = Riser::start_with(&["-m", "0x3"]);
    let port = free_port();
    let iqn = riser.add_iscsi_target("top", port, &[64]);
    let bdev = "top_m0";
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let dir = TempDir::new("top");
    let mut perf = start_perf(&url, "14");
    let top = bin("riser-top");
    let tmux = Tmux::start(dir.path(), &[&top, Path::new("-r"), riser.socket(), Path::new("--interval"), Path::new("1")]);
    let log = || riser.log();

    // 1 Reactors: both reactors, a busy % measured over an interval, the one connection.
    let s = tmux.wait_for("two reactors with a busy % and the connection", 10, |s| {
        let rows = reactor_rows(s);
        rows.len() == 2 && rows.iter().all(|r| num(r[2]).is_some()) && rows.iter().filter_map(|r| num(r[3])).sum::<f64>() == 1.0
    });
    assert!(s.contains("Reactors (2)") && s.contains("Busy %"), "{s}");
    let rows = reactor_rows(&s);
    assert!(rows.iter().any(|r| num(r[2]).is_some_and(|b| b > 0.0)), "a reactor is busy under load:\n{s}");
    assert!(rows.iter().all(|r| num(r[2]).is_some_and(|b| (0.0..=100.0).contains(&b))), "{s}");

    // 2 Connections: riser-perf's session over TCP, its reactor and queue depth.
    tmux.keys("2");
    let s = tmux.wait_for("the connection row", 5, |s| s.contains("Connections (1)") && row(s, "1").is_some());
    let c = row(&s, "1").unwrap_or_default();
    // ID, initiator, address, target, transport, reactor, core, QD, tasks/s
    assert_eq!(c.len(), 9, "{s}");
    assert_eq!(c[1], INITIATOR, "{s}");
    assert!(c[2].starts_with("127.0.0.1:"), "{s}");
    assert_eq!(c[3], iqn, "{s}");
    assert_eq!(c[4], "tcp", "{s}");
    assert!(num(c[5]).is_some_and(|r| r <= 1.0), "reactor 0 or 1:\n{s}");
    assert!(num(c[7]).is_some_and(|qd| qd <= 16.0), "queue depth between 0 and riser-perf's 16:\n{s}");

    // 3 Devices, then h: the latency histogram is switched on and its percentiles show.
    tmux.keys("3");
    tmux.wait_for("the device tab", 5, |s| s.contains("Devices (1)") && row(s, bdev).is_some());
    tmux.keys("h");
    let s = tmux.wait_for("p50 and p99 latency after h", 6, |s| {
        row(s, bdev).is_some_and(|d| d.len() == 11 && num(d[8]).is_some() && num(d[9]).is_some() && d[10] == "on")
    });
    assert!(s.contains("histograms on"), "{s}");
    let h = riser.call("bdev_get_histogram", Some(json!({"name": bdev}))).expect("bdev_get_histogram");
    assert_eq!(h["enabled"], json!(true), "h called bdev_enable_histogram: {h}\n{}", log());

    // The IOPS column while riser-perf runs: three readings a second apart.
    let mut seen = Vec::new();
    for _ in 0..3 {
        thread::sleep(Duration::from_millis(1100));
        let s = tmux.screen();
        assert!(matches!(perf.try_wait(), Ok(None)), "riser-perf ended before the readings; screen:\n{s}");
        let d = row(&s, bdev).unwrap_or_else(|| panic!("no device row:\n{s}"));
        // Device, IOPS, read IOPS, write IOPS, read MiB/s, write MiB/s, avg us, QD, p50, p99, histogram
        let (iops, r, w) = (num(d[1]), num(d[2]), num(d[3]));
        assert!(iops.is_some() && r.is_some() && w.is_some(), "{s}");
        seen.push(iops.unwrap_or_default());
    }
    // s: sorted by the next column, IOPS, biggest first.
    tmux.keys("s");
    tmux.wait_for("the IOPS column marked as the sort", 3, |s| s.contains("IOPS▼") && s.contains("sorted by IOPS"));

    let out = perf.wait_with_output().expect("riser-perf ends");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "riser-perf failed:\n{text}\n{}", log());
    let measured = perf_iops(&text).unwrap_or_else(|| panic!("no IOPS line in riser-perf's output:\n{text}"));
    seen.sort_by(f64::total_cmp);
    let median = seen[1];
    eprintln!("riser-top IOPS readings {seen:?}, riser-perf measured {measured}");
    assert!(median > 0.0, "{seen:?}");
    // Same order of magnitude: a shared 2-core machine makes single seconds swing.
    assert!(median > measured / 4.0 && median < measured * 4.0, "riser-top's IOPS {seen:?} vs riser-perf's {measured}");

    // riser goes away: the screen says so (and riser-top keeps running, retrying).
    riser.kill();
    let s = tmux.wait_for("that riser is not answering", 5, |s| s.contains("riser is not answering on"));
    assert!(s.contains("retrying every 1 s"), "{s}");

    // q: riser-top exits 0 and gives the terminal back (its alternate screen is gone).
    tmux.keys("q");
    let status_file = dir.path().join("exit-status");
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        let st = std::fs::read_to_string(&status_file).unwrap_or_default();
        if st.ends_with('\n') || Instant::now() >= deadline {
            break st;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.trim(), "0", "riser-top exited with status 0 after q");
    let s = tmux.screen();
    assert!(!s.contains("Devices (") && !s.contains("riser-top"), "the terminal is restored:\n{s}");
}
