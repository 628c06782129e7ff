//! Service integration, end to end: `make install DESTDIR=... PREFIX=/usr` (from the built
//! binaries of `cargo build --workspace`), `systemd-analyze verify` on the installed unit, the
//! installed riser started from the installed sample config and stopped by SIGTERM, journald's
//! stream format when `JOURNAL_STREAM` names riser's stderr, and SPDK's `log_*_level` RPCs
//! through the installed `riser-rpc`. Needs `systemd-analyze` (Debian's `systemd` package,
//! installed by `scripts/setup.sh test`).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use riser_tests::*;

const BINARIES: [&str; 4] = ["riser", "riser-rpc", "riser-perf", "riser-top"];

/// `make -C <root> TARGET VARS..`; its output.
fn make(target: &str, vars: &[String]) -> Output {
    Command::new("make")
        .arg("--no-print-directory")
        .arg("-C")
        .arg(workspace_root())
        .arg(target)
        .args(vars)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run make: {e}"))
}

fn text(o: &Output) -> String {
    format!("status {}\nstdout:\n{}\nstderr:\n{}", o.status, String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn install(destdir: &Path, from: &Path) -> Output {
    make("install", &[format!("DESTDIR={}", destdir.display()), "PREFIX=/usr".into(), format!("INSTALL_FROM={}", from.display())])
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap_or_else(|e| panic!("{} was not installed: {e}", path.display())).permissions().mode() & 0o7777
}

/// `make install` puts every file in place with its mode, keeps an existing config, refuses
/// to install a half-built tree, and `make uninstall` removes what it installed but the config.
#[test]
fn make_install_puts_the_files_in_place_and_keeps_an_existing_config() {
    let dest = TempDir::new("inst");
    let root = dest.path();
    let out = install(root, &bin_dir());
    assert!(out.status.success(), "make install failed: {}", text(&out));

    for b in BINARIES {
        let p = root.join("usr/bin").join(b);
        assert_eq!(mode(&p), 0o755, "{}", p.display());
        let built = fs::read(bin_dir().join(b)).unwrap_or_else(|e| panic!("{b}: {e}"));
        assert!(fs::read(&p).unwrap() == built, "{} differs from the built {b}", p.display());
    }
    let unit = root.join("usr/lib/systemd/system/riser.service");
    assert_eq!(mode(&unit), 0o644);
    let unit_text = fs::read_to_string(&unit).unwrap();
    for line in [
        "ExecStart=/usr/bin/riser --json /etc/riser/riser.json $RISER_ARGS",
        "Type=notify",
        "KillSignal=SIGTERM",
        "Restart=on-failure",
        "LimitMEMLOCK=infinity",
        "WantedBy=multi-user.target",
    ] {
        assert!(unit_text.lines().any(|l| l == line), "unit lacks {line:?}:\n{unit_text}");
    }
    assert!(!unit_text.contains('@'), "a template variable was left in the unit:\n{unit_text}");
    assert!(!unit_text.contains("PrivateDevices=yes"), "RDMA and NVMe need /dev:\n{unit_text}");

    let sample = fs::read_to_string(workspace_root().join("scripts/riser.sample.json")).unwrap();
    let config = root.join("etc/riser/riser.json");
    assert_eq!(mode(&config), 0o600, "the config will hold CHAP secrets after save_config");
    assert_eq!(fs::read_to_string(&config).unwrap(), sample);
    assert!(!root.join("etc/riser/riser.json.sample").exists());

    // A second install (an upgrade) keeps the admin's config and puts the sample beside it.
    fs::write(&config, "{\"subsystems\": []}\n").unwrap();
    let out = install(root, &bin_dir());
    assert!(out.status.success(), "second make install failed: {}", text(&out));
    assert_eq!(fs::read_to_string(&config).unwrap(), "{\"subsystems\": []}\n", "make install overwrote riser.json");
    assert_eq!(fs::read_to_string(root.join("etc/riser/riser.json.sample")).unwrap(), sample);
    assert!(String::from_utf8_lossy(&out.stdout).contains("kept /etc/riser/riser.json"), "{}", text(&out));

    // A tree where a binary is missing: nothing installed, and the message names it.
    let half = TempDir::new("half");
    for b in ["riser", "riser-rpc", "riser-perf"] {
        fs::copy(bin_dir().join(b), half.join(b)).unwrap();
    }
    let dest2 = TempDir::new("inst2");
    let out = install(dest2.path(), half.path());
    assert!(!out.status.success(), "make install succeeded without riser-top: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not built") && err.contains("riser-top") && err.contains("make release"), "{}", text(&out));
    assert!(!dest2.join("usr/bin/riser").exists(), "a partial install was left");

    let out = make("uninstall", &[format!("DESTDIR={}", root.display()), "PREFIX=/usr".into()]);
    assert!(out.status.success(), "make uninstall failed: {}", text(&out));
    for b in BINARIES {
        assert!(!root.join("usr/bin").join(b).exists(), "{b} is still installed");
    }
    assert!(!unit.exists(), "the unit is still installed");
    assert!(config.exists(), "make uninstall removed the config");
}

/// `systemd-analyze verify` on the installed unit, inside the DESTDIR tree (`--root`) so that
/// ExecStart's /usr/bin/riser is the installed one; systemd's own units are copied in for
/// the dependencies (sysinit.target, network-online.target, ...). Warnings fail the test too:
/// verify exits 0 on a misspelt key.
#[test]
fn systemd_analyze_verify_passes_on_the_installed_unit() {
    let dest = TempDir::new("verify");
    let root = dest.path();
    let out = install(root, &bin_dir());
    assert!(out.status.success(), "make install failed: {}", text(&out));
    let units = Path::new("/usr/lib/systemd/system");
    assert!(
        units.join("sysinit.target").exists(),
        "{} lacks systemd's units: install Debian's systemd package (scripts/setup.sh test)",
        units.display()
    );
    let cp = Command::new("cp")
        .arg("-rn")
        .arg(format!("{}/.", units.display()))
        .arg(root.join("usr/lib/systemd/system"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run cp: {e}"));
    assert!(cp.status.success(), "copying systemd's units failed: {}", text(&cp));

    let verify = |unit: &str| {
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.display()))
            .arg(unit)
            .env("SYSTEMD_LOG_COLOR", "0")
            .output()
            .unwrap_or_else(|e| panic!("systemd-analyze is missing ({e}): install Debian's systemd package (scripts/setup.sh test)"))
    };
    let out = verify("/usr/lib/systemd/system/riser.service");
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "systemd-analyze verify failed: {}", text(&out));
    assert!(!all.contains("riser.service"), "systemd-analyze verify warned about the unit:\n{all}");

    // The check has teeth: a unit whose binary is missing fails.
    fs::remove_file(root.join("usr/bin/riser")).unwrap();
    let out = verify("/usr/lib/systemd/system/riser.service");
    assert!(!out.status.success(), "verify passed with /usr/bin/riser missing: {}", text(&out));
}

/// A riser started like the unit starts it: the installed binary with the installed sample
/// config (its port swapped for a free one), its own RPC socket, stderr in `log`.
struct Installed {
    _dest: TempDir,
    bin: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    port: u16,
    /// Bound where `NOTIFY_SOCKET` points, as systemd's for a `Type=notify` unit.
    notify: std::os::unix::net::UnixDatagram,
    child: Option<Child>,
}

impl Installed {
    fn start(journal: JournalStream) -> Installed {
        let dest = TempDir::new("run");
        let out = install(dest.path(), &bin_dir());
        assert!(out.status.success(), "make install failed: {}", text(&out));
        let bin = dest.join("usr/bin");
        let port = free_port();
        let sample = fs::read_to_string(dest.join("etc/riser/riser.json")).unwrap();
        assert_eq!(sample.matches("\"3260\"").count(), 1, "the sample's portal is not on port 3260:\n{sample}");
        let config = dest.join("config.json");
        fs::write(&config, sample.replace("\"3260\"", &format!("\"{port}\""))).unwrap();
        let sock = dest.join("rpc.sock");
        let log = dest.join("riser.log");
        let out = fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let meta = fs::metadata(&log).unwrap();
        let mut cmd = Command::new(bin.join("riser"));
        cmd.args(["--poll-mode", "adaptive", "-m", "0x1", "-r"]).arg(&sock).arg("--json").arg(&config);
        let notify_path = dest.join("notify");
        let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap_or_else(|e| panic!("cannot bind {}: {e}", notify_path.display()));
        notify.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        cmd.env_remove("JOURNAL_STREAM").env_remove("RISER_LOG").env("NOTIFY_SOCKET", &notify_path);
        match journal {
            JournalStream::ThisFile => cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino())),
            // Inherited from a service, but stderr is not the journal's stream any more.
            JournalStream::OtherFile => cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino() + 1)),
            JournalStream::Unset => &mut cmd,
        };
        let child = cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().unwrap_or_else(|e| panic!("cannot start riser: {e}"));
        let r = Installed { _dest: dest, bin, sock, log, port, notify, child: Some(child) };
        r.wait_ready();
        r
    }

    /// The next sd_notify message riser sent.
    fn notified(&self) -> String {
        let mut buf = [0u8; 256];
        let n = self.notify.recv(&mut buf).unwrap_or_else(|e| panic!("no sd_notify message from riser ({e}); its log:\n{}", self.log()));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.sock.exists() {
                if let Ok(v) = RpcClient::connect(&self.sock, CALL_TIMEOUT).and_then(|mut c| c.call("spdk_get_version", None)) {
                    assert!(v["version"].as_str().is_some_and(|s| s.starts_with("riser")), "{v}");
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the installed riser did not answer; its log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The installed `riser-rpc -s SOCK ARGS..`.
    fn rpc(&self, args: &[&str]) -> Output {
        Command::new(self.bin.join("riser-rpc"))
            .arg("-s")
            .arg(&self.sock)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run riser-rpc: {e}"))
    }

    fn rpc_ok(&self, args: &[&str]) -> Value {
        let out = self.rpc(args);
        assert!(out.status.success(), "riser-rpc {args:?}: {}\nriser log:\n{}", text(&out), self.log());
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("riser-rpc {args:?}: not JSON ({e}): {}", text(&out)))
    }

    /// SIGTERM (as systemd stops it); the exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("riser was already stopped");
        let kill = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        assert!(kill.as_ref().is_ok_and(|s| s.success()), "kill -TERM failed: {kill:?}");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("wait: {e}")) {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("riser did not stop within 15 s of SIGTERM; its log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Clone, Copy)]
enum JournalStream {
    ThisFile,
    OtherFile,
    Unset,
}

/// Whether a line starts with riser's own timestamp (`[2025-01-31T12:00:00.000Z INFO ...`).
fn has_timestamp(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 20 && b[0] == b'[' && b[1..5].iter().all(u8::is_ascii_digit) && b[5] == b'-' && b[11] == b'T'
}

/// The installed sample config serves its target; under journald every line carries its
/// syslog priority and no timestamp; the log level changes through the installed riser-rpc
/// and really filters; SIGTERM stops riser with status 0 and says so.
#[test]
fn installed_riser_serves_the_sample_logs_for_journald_and_stops_on_sigterm() {
    let mut r = Installed::start(JournalStream::ThisFile);
    // Type=notify: READY=1 once it serves (wait_ready got an answer: it came before).
    assert_eq!(r.notified(), "READY=1");

    let nodes = r.rpc_ok(&["iscsi_get_target_nodes"]);
    assert_eq!(nodes[0]["name"], "iqn.2016-06.io.riser:disk1", "{nodes}");
    assert_eq!(nodes[0]["luns"][0]["bdev_name"], "Malloc0", "{nodes}");
    std::net::TcpStream::connect(("127.0.0.1", r.port))
        .unwrap_or_else(|e| panic!("the sample's portal does not accept connections: {e}\n{}", r.log()));

    // log_get_level / log_set_level round trips (SPDK's names, any case, WARN for WARNING).
    assert_eq!(r.rpc_ok(&["log_get_level"]), json!("INFO"));
    for (set, get) in [("DEBUG", "DEBUG"), ("warn", "WARNING"), ("NOTICE", "NOTICE"), ("error", "ERROR")] {
        assert_eq!(r.rpc_ok(&["log_set_level", set]), json!(true));
        assert_eq!(r.rpc_ok(&["log_get_level"]), json!(get), "after log_set_level {set}");
    }
    // One sink: the print level is the same level.
    assert_eq!(r.rpc_ok(&["log_get_print_level"]), json!("ERROR"));
    assert_eq!(r.rpc_ok(&["log_set_print_level", "INFO"]), json!(true));
    assert_eq!(r.rpc_ok(&["log_get_level"]), json!("INFO"));
    assert_eq!(r.rpc_ok(&["log_get_print_level"]), json!("INFO"));

    // A bad level is refused with SPDK's invalid-params code and changes nothing.
    let out = r.rpc(&["log_set_level", "LOUD"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid log level \"LOUD\"") && err.contains("-32602"), "{}", text(&out));
    let out = r.rpc(&["call", "log_set_level", "{\"level\": \"INFO\", \"flag\": 1}"]);
    assert_eq!(out.status.code(), Some(1), "an unknown field was accepted: {}", text(&out));
    let out = r.rpc(&["call", "log_set_level"]);
    assert_eq!(out.status.code(), Some(1), "no level was accepted: {}", text(&out));
    assert_eq!(r.rpc_ok(&["log_get_level"]), json!("INFO"));

    // The level filters: at ERROR a bdev's info line is dropped, at INFO it shows.
    r.rpc_ok(&["log_set_level", "ERROR"]);
    r.rpc_ok(&["bdev_malloc_create", "-b", "Quiet0", "1", "512"]);
    r.rpc_ok(&["log_set_level", "INFO"]);
    r.rpc_ok(&["bdev_malloc_create", "-b", "Loud0", "1", "512"]);
    r.rpc_ok(&["log_set_level", "DEBUG"]);
    r.rpc_ok(&["bdev_get_bdevs", "-b", "Loud0"]);

    let status = r.terminate();
    assert_eq!(status.code(), Some(0), "riser's exit on SIGTERM; its log:\n{}", r.log());
    assert_eq!(r.notified(), "STOPPING=1");
    let log = r.log();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 5, "{log}");
    for line in &lines {
        let prio = line.strip_prefix('<').and_then(|l| l.split_once('>')).map(|(p, _)| p);
        assert!(matches!(prio, Some("3" | "4" | "5" | "6" | "7")), "a line without a syslog priority: {line:?}\n{log}");
        assert!(!line.contains("Z INFO") && !line.contains("Z WARN"), "a timestamped line under journald: {line:?}");
    }
    for want in [
        "<6>riser: riser 0.1.0 ready",
        "<6>riser_bdev::registry: bdev Loud0 created",
        "<6>riser: signal 15: shutting down",
        "<6>riser: riser stopped",
    ] {
        assert!(log.contains(want), "the log lacks {want:?}:\n{log}");
    }
    assert!(log.contains("<4>riser_rpc::server: rpc log_set_level: invalid log level"), "{log}");
    assert!(lines.iter().any(|l| l.starts_with("<7>")), "no debug line after log_set_level DEBUG:\n{log}");
    assert!(!log.contains("Quiet0 created"), "an info line passed log_set_level ERROR:\n{log}");
}

/// Without JOURNAL_STREAM, or with one that names another file (a variable inherited from a
/// service while stderr goes elsewhere), lines keep riser's timestamp and no priority prefix.
#[test]
fn lines_keep_their_timestamp_when_stderr_is_not_the_journal() {
    for journal in [JournalStream::OtherFile, JournalStream::Unset] {
        let mut r = Installed::start(journal);
        assert_eq!(r.terminate().code(), Some(0), "{}", r.log());
        let log = r.log();
        let lines: Vec<&str> = log.lines().collect();
        assert!(lines.len() >= 3, "{log}");
        for line in &lines {
            assert!(has_timestamp(line) && !line.starts_with('<'), "not riser's own format: {line:?}\n{log}");
        }
        assert!(lines.iter().any(|l| l.ends_with("INFO  riser] riser stopped")), "{log}");
    }
}
