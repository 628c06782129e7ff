//! `riser-perf --verify` against real targets over TCP: tgt (Debian's user-space target,
//! started here as this test's own tgtd with a file-backed LUN) and riser itself.
//!
//! A clean write-and-read-back pass must pass (exit 0, every block checked); a block changed
//! behind riser-perf's back (through tgt's backing file, through a second session of the
//! test initiator, or by riser-perf itself writing another generation to a few LBAs) must
//! make the read-back exit non-zero and name each changed LBA, and only those.
//!
//! tgtd needs root and the Debian package `tgt` (scripts/setup.sh test installs it). Each
//! tgtd gets its own management socket (`tgtd -C N`, `tgtadm -C N`) and iSCSI port, so tests
//! running in parallel (and a `make bench` tgtd on the default socket) never meet; a guard
//! deletes its target and stops it at the end, also when the test panics.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use riser_tests::iscsi::Client;
use riser_tests::{bin, free_port, Riser, TempDir};

const TGTD: &str = "/usr/sbin/tgtd";
const TGTADM: &str = "/usr/sbin/tgtadm";
/// Every LUN here: 8 MiB of 512-byte blocks.
const LUN_MIB: u64 = 8;
const BLOCKS: u64 = LUN_MIB * 2048;

/// Runs a command with a deadline (a wedged tgtd must not hang the test); None on timeout.
fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().ok(),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// One tgtd of this test, with one target and one file-backed LUN (LUN 1).
struct Tgt {
    child: Option<Child>,
    control: u16,
    port: u16,
    iqn: String,
    lun_file: PathBuf,
    log: PathBuf,
    _dir: TempDir,
}

impl Tgt {
    fn start() -> Tgt {
        for tool in [TGTD, TGTADM] {
            assert!(
                Path::new(tool).is_file(),
                "{tool} not found: these tests need Debian's tgt (the user-space iSCSI target); \
                 install it with `scripts/setup.sh test` (as root) or `apt-get install tgt`"
            );
        }
        // tgtd refuses a management instance that another tgtd holds (its lock file) and a
        // port someone took since free_port(): try another pair then.
        let mut last = String::new();
        for attempt in 0..20u32 {
            let port = free_port();
            // `tgtd -C` takes 0 to 32767; 0 is the default instance (make bench's tgtd).
            let control = 1 + ((std::process::id() as u64 * 7919 + port as u64 + attempt as u64 * 104_729) % 32_000) as u16;
            match Tgt::try_start(port, control) {
                Ok(t) => return t,
                Err(log) if log.contains("another tgtd is using") || log.contains("unable to bind") => last = log,
                Err(log) => panic!("tgtd -C {control} exited before answering; its output:\n{log}"),
            }
        }
        panic!("tgtd did not start in 20 tries (port or management instance taken); last output:\n{last}");
    }

    fn try_start(port: u16, control: u16) -> Result<Tgt, String> {
        let dir = TempDir::new("tgt");
        let log = dir.join("tgtd.log");
        let out = File::create(&log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let err = out.try_clone().unwrap_or_else(|e| panic!("cannot dup the log file: {e}"));
        let child = Command::new(TGTD)
            .args(["-f", "-C", &control.to_string(), "--iscsi", &format!("portal=127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own process group: a Ctrl-C of the test run is not tgtd's to see.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {TGTD}: {e} (tgtd needs root)"));
        let lun_file = dir.join("lun.img");
        let mut tgt = Tgt {
            child: Some(child),
            control,
            port,
            iqn: format!("iqn.2024-01.test.peer:perf-{port}"),
            lun_file,
            log,
            _dir: dir,
        };
        tgt.wait_ready()?;
        File::create(&tgt.lun_file)
            .and_then(|f| f.set_len(LUN_MIB << 20))
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", tgt.lun_file.display()));
        let iqn = tgt.iqn.clone();
        let file = tgt.lun_file.display().to_string();
        tgt.adm(&["--lld", "iscsi", "--mode", "target", "--op", "new", "--tid", "1", "--targetname", &iqn]);
        tgt.adm(&[
            "--lld", "iscsi", "--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", "--bstype", "rdwr",
            "--backing-store", &file,
        ]);
        tgt.adm(&["--lld", "iscsi", "--mode", "target", "--op", "bind", "--tid", "1", "--initiator-address", "ALL"]);
        Ok(tgt)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn tgtadm(&self, args: &[&str]) -> Option<Output> {
        run_with_timeout(Command::new(TGTADM).args(["-C", &self.control.to_string()]).args(args), Duration::from_secs(10))
    }

    /// A tgtadm command that must succeed.
    fn adm(&self, args: &[&str]) {
        match self.tgtadm(args) {
            Some(o) if o.status.success() => {}
            Some(o) => panic!(
                "tgtadm {args:?} failed ({}): {}{}\ntgtd log:\n{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr),
                self.log()
            ),
            None => panic!("tgtadm {args:?} did not answer within 10 s\ntgtd log:\n{}", self.log()),
        }
    }

    /// Until tgtd answers on its management socket and listens on its port; Err(its output)
    /// when it exited first.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err(self.log());
            }
            let managed = self
                .tgtadm(&["--lld", "iscsi", "--mode", "target", "--op", "show"])
                .is_some_and(|o| o.status.success());
            if managed && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            assert!(Instant::now() < deadline, "tgtd did not become ready within 20 s; its output:\n{}", self.log());
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{}/1", self.port, self.iqn)
    }

    /// Flips one byte of `lba` in the backing file, behind tgtd's back.
    fn corrupt(&self, lba: u64, byte: u64) {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.lun_file)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.lun_file.display()));
        let at = lba * 512 + byte;
        let mut b = [0u8; 1];
        f.seek(SeekFrom::Start(at)).and_then(|_| f.read_exact(&mut b)).expect("read the backing file");
        b[0] ^= 0x5a;
        f.seek(SeekFrom::Start(at)).and_then(|_| f.write_all(&b)).expect("write the backing file");
        f.sync_data().expect("sync the backing file");
    }
}

impl Drop for Tgt {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // tgtd ignores SIGTERM: delete the target, then the system, then wait for it.
        let _ = self.tgtadm(&["--lld", "iscsi", "--mode", "target", "--op", "delete", "--tid", "1", "--force"]);
        let _ = self.tgtadm(&["--op", "delete", "--mode", "system"]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut exited = false;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                exited = true;
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
        // tgtd leaves its management socket and lock file behind.
        for f in [format!("/var/run/tgtd/socket.{}", self.control), format!("/var/run/tgtd/socket.{}.lock", self.control)] {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// What one riser-perf run gave.
struct Perf {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Perf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "riser-perf exit ok={}\n--- stdout\n{}--- stderr\n{}", self.ok, self.stdout, self.stderr)
    }
}

impl Perf {
    fn mismatch_lines(&self) -> Vec<&str> {
        self.stdout.lines().filter(|l| l.starts_with("MISMATCH ")).collect()
    }
}

/// `riser-perf ARGS.. URL`, one client thread, unpinned, small queue depth (the machine is
/// shared with the other tests).
fn perf(url: &str, args: &[&str]) -> Perf {
    perf_at(url, "8", args)
}

/// riser-perf at queue depth `qd`.
fn perf_at(url: &str, qd: &str, args: &[&str]) -> Perf {
    let out = run_with_timeout(
        Command::new(bin("riser-perf"))
            .args(["--no-pin", "-m", "0x1", "--qd", qd, "--login-timeout", "10"])
            .args(args)
            .arg(url)
            .env("RUST_LOG", "warn"),
        Duration::from_secs(120),
    )
    .unwrap_or_else(|| panic!("riser-perf {args:?} {url} did not finish within 120 s"));
    Perf {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The write-and-read-back pass over the whole LUN, which must pass.
fn verify_clean(url: &str, generation: u64, ctx: &dyn Fn() -> String) {
    let g = generation.to_string();
    let p = perf(url, &["--verify", "--generation", &g, "--bs", "4096"]);
    assert!(p.ok, "a clean verify pass failed: {p:?}\n{}", ctx());
    assert!(p.stdout.contains(&format!("verify: {BLOCKS} blocks checked, 0 mismatched")), "{p:?}");
    assert!(p.stdout.contains("verify: PASSED"), "{p:?}");
    assert!(p.mismatch_lines().is_empty(), "{p:?}");
}

/// Writes generation `other` over `count` blocks at `lba` with riser-perf itself.
fn overwrite_with_generation(url: &str, lba: u64, count: u64, other: u64) {
    let range = format!("{lba}:{count}");
    let g = other.to_string();
    let p = perf(url, &["--verify", "--generation", &g, "--lba-range", &range, "--bs", "512"]);
    assert!(p.ok, "writing generation {other} at {range} failed: {p:?}");
    assert!(p.stdout.contains(&format!("verify: {count} blocks checked, 0 mismatched")), "{p:?}");
}

/// The read-back of `generation` after tampering: must fail and name exactly `expected`.
fn verify_finds(url: &str, generation: u64, expected: &[&str], ctx: &dyn Fn() -> String) {
    let g = generation.to_string();
    let p = perf(url, &["--verify-only", "--generation", &g, "--bs", "4096"]);
    assert!(!p.ok, "riser-perf exited 0 although blocks were changed: {p:?}\n{}", ctx());
    assert!(p.stdout.contains("verify: FAILED"), "{p:?}");
    let lines = p.mismatch_lines();
    assert_eq!(lines.len(), expected.len(), "expected mismatches {expected:?}, got: {p:?}");
    for (line, want) in lines.iter().zip(expected) {
        assert!(line.starts_with(&format!("MISMATCH {want}")), "expected {want:?}, got {line:?}: {p:?}");
    }
    assert!(p.stdout.contains(&format!("verify: {BLOCKS} blocks checked")), "{p:?}");
}

#[test]
fn verify_against_tgt_passes_and_names_changed_blocks() {
    let tgt = Tgt::start();
    let url = tgt.url();
    let ctx = || format!("tgtd log:\n{}", tgt.log());
    verify_clean(&url, 11, &ctx);
    // One byte changed in the backing file (a checksum mismatch), and one block written by
    // riser-perf with another generation (what a lost write looks like).
    tgt.corrupt(1234, 100);
    overwrite_with_generation(&url, 4321, 1, 12);
    verify_finds(
        &url,
        11,
        &["LBA 1234: checksum mismatch", "LBA 4321: stale generation 12"],
        &ctx,
    );
    // Written back in full, it passes again.
    verify_clean(&url, 13, &ctx);
}

#[test]
fn verify_against_riser_passes_and_names_changed_blocks() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("perfv", port, &[LUN_MIB]);
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let ctx = || format!("riser log:\n{}", riser.log());
    verify_clean(&url, 21, &ctx);
    // Payload copies over TCP, in iscsi_get_stats once the session is gone: read data goes
    // out from the I/O buffers (none); write data is copied once on its way in: from the
    // framer's buffer into the task's when solicited, into the segment that becomes the
    // task's buffer when it is all immediate (riser-perf's 4 KiB writes are).
    let t0 = Instant::now();
    while riser.rpc_json(&["iscsi_get_connections"]).as_array().is_some_and(|a| !a.is_empty()) {
        assert!(t0.elapsed() < Duration::from_secs(10), "riser-perf's connection outlived it\n{}", ctx());
        thread::sleep(Duration::from_millis(50));
    }
    let copies = riser.rpc_json(&["iscsi_get_stats"])["payload_copies"].clone();
    assert_eq!(copies["read_bytes"], serde_json::json!(0), "{copies}");
    let written = LUN_MIB << 20;
    let inbound = copies["solicited_bytes"].as_u64().unwrap_or(0) + copies["unsolicited_bytes"].as_u64().unwrap_or(0);
    assert_eq!(inbound, written, "{written} bytes written, each copied once: {copies}");
    // A second session (the test initiator) overwrites LBA 777 with foreign data.
    let mut c = Client::connect(port);
    c.login(&iqn, &[]).unwrap_or_else(|e| panic!("test initiator login failed: {e:?}\n{}", ctx()));
    assert!(c.clear_unit_attentions(), "the LUN did not become ready\n{}", ctx());
    assert_eq!(c.write10(777, &[0xa5; 512]), Some(0), "WRITE(10) failed\n{}", ctx());
    drop(c);
    // Three blocks of another generation written by riser-perf (a lost write, as a run).
    overwrite_with_generation(&url, 5000, 3, 22);
    verify_finds(
        &url,
        21,
        &[
            "LBA 777: not a riser-perf verify block",
            "LBAs 5000..=5002 (3 blocks): stale generation 22",
        ],
        &ctx,
    );
}

#[test]
fn large_writes_over_tcp_are_received_straight_into_the_task_buffers() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("perfbig", port, &[LUN_MIB]);
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let ctx = || format!("riser log:\n{}", riser.log());
    // 1 MiB writes: the first burst immediate, the rest solicited by R2Ts in Data-Outs of up
    // to riser's MaxRecvDataSegmentLength (256 KiB), verified on the way back.
    let p = perf(&url, &["--verify", "--generation", "31", "--bs", "1048576"]);
    assert!(p.ok, "a clean verify pass with 1 MiB I/Os failed: {p:?}\n{}", ctx());
    assert!(p.stdout.contains(&format!("verify: {BLOCKS} blocks checked, 0 mismatched")), "{p:?}");
    let t0 = Instant::now();
    while riser.rpc_json(&["iscsi_get_connections"]).as_array().is_some_and(|a| !a.is_empty()) {
        assert!(t0.elapsed() < Duration::from_secs(10), "riser-perf's connection outlived it\n{}", ctx());
        thread::sleep(Duration::from_millis(50));
    }
    // A solicited segment whose header has arrived goes from the socket straight into the
    // task's buffer; only what came in the same read as its header is copied (after a
    // segment received in place, riser reads no further than the next header). Of the
    // 8 MiB, at least 7 MiB are solicited (the first burst of each 1 MiB write is at most
    // 64 KiB): fewer than 1 in 8 of those bytes may have been copied.
    let copies = riser.rpc_json(&["iscsi_get_stats"])["payload_copies"].clone();
    let solicited = copies["solicited_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(solicited < (7 << 20) / 8, "solicited data should go straight into the task buffers: {copies}\n{}", ctx());
    assert_eq!(copies["read_bytes"], serde_json::json!(0), "{copies}");
}

/// 32 MiB and 16 MiB READs and WRITEs over TCP stream through the budget in 1 MiB pieces:
/// verified, and the most buffer memory ever in use stays below one 32 MiB command's worth
/// (whole-command buffers take 32 MiB for one 32 MiB I/O, and two 16 MiB ones as much).
#[test]
fn large_reads_and_writes_stream_through_the_budget_in_pieces() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("perfstream", port, &[64]);
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let ctx = || format!("riser log:\n{}", riser.log());
    for (bs, qd) in [("33554432", "2"), ("16777216", "4")] {
        let p = perf_at(&url, qd, &["--verify", "--generation", "41", "--bs", bs]);
        assert!(p.ok, "a verify pass with {bs}-byte I/Os at QD {qd} failed: {p:?}\n{}", ctx());
        assert!(p.stdout.contains(&format!("verify: {} blocks checked, 0 mismatched", 64 * 2048)), "{p:?}");
        let stats = riser.rpc_json(&["iobuf_get_stats"]);
        let peak = stats["peak_in_use_bytes"].as_u64().unwrap_or(u64::MAX);
        assert!(peak < 32 << 20, "{bs}-byte I/Os should stream in pieces, not take whole-command buffers: {stats}\n{}", ctx());
    }
    let copies = riser.rpc_json(&["iscsi_get_stats"])["payload_copies"].clone();
    assert_eq!(copies["read_bytes"], serde_json::json!(0), "read pieces go out from their buffers: {copies}");
}

#[test]
fn verify_against_riser_and_tgt_at_once() {
    // Two URLs in one run: each gets its own session and range; both pass.
    let tgt = Tgt::start();
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("perfv2", port, &[LUN_MIB]);
    let riser_url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let out = run_with_timeout(
        Command::new(bin("riser-perf"))
            .args(["--no-pin", "--qd", "8", "--verify", "--generation", "31", "--json"])
            .arg(&riser_url)
            .arg(tgt.url()),
        Duration::from_secs(120),
    )
    .expect("riser-perf did not finish within 120 s");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{}\ntgtd log:\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr),
        tgt.log()
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert_eq!(v["verify"]["passed"], true, "{stdout}");
    assert_eq!(v["verify"]["blocks_checked"], 2 * BLOCKS, "{stdout}");
    assert_eq!(v["verify"]["mismatched_blocks"], 0, "{stdout}");
}

/// riser-perf logs in with CHAP: against tgt with a CHAP account bound to its target
/// (one-way; tgt's outgoing account for mutual), and against riser with one-way and mutual
/// CHAP; a wrong secret fails the run with the target's 0x0201. tgt 1.0.85 knows only MD5
/// and refuses a CHAP_A list naming others (Initiator Error), so riser-perf offers it MD5
/// alone; riser gets riser-perf's default offer (SHA-256 first).
#[test]
fn verify_with_chap_against_tgt_and_riser() {
    let tgt = Tgt::start();
    let ctx = || format!("tgtd log:\n{}", tgt.log());
    tgt.adm(&["--lld", "iscsi", "--mode", "account", "--op", "new", "--user", "perfuser", "--password", "perf-secret-12"]);
    tgt.adm(&["--lld", "iscsi", "--mode", "account", "--op", "bind", "--tid", "1", "--user", "perfuser"]);
    tgt.adm(&["--lld", "iscsi", "--mode", "account", "--op", "new", "--user", "tgtout", "--password", "tgt-secret-345"]);
    tgt.adm(&["--lld", "iscsi", "--mode", "account", "--op", "bind", "--tid", "1", "--user", "tgtout", "--outgoing"]);
    let url = tgt.url();
    let p = perf(&url, &["--verify", "--generation", "21", "--bs", "4096", "--chap", "perfuser:perf-secret-12", "--chap-digest", "md5"]);
    assert!(p.ok && p.stdout.contains("verify: PASSED"), "one-way CHAP with tgt: {p:?}\n{}", ctx());
    let p = perf(
        &url,
        &[
            "--verify-only", "--generation", "21", "--bs", "4096", "--chap", "perfuser:perf-secret-12", "--chap-mutual",
            "tgtout:tgt-secret-345", "--chap-digest", "md5",
        ],
    );
    assert!(p.ok && p.stdout.contains("verify: PASSED"), "mutual CHAP with tgt: {p:?}\n{}", ctx());
    let p = perf(&url, &["--verify-only", "--generation", "21", "--bs", "4096", "--chap", "perfuser:wrong-secret-00", "--chap-digest", "md5"]);
    assert!(!p.ok, "a wrong secret must fail against tgt: {p:?}");
    let p = perf(&url, &["--verify-only", "--generation", "21", "--bs", "4096"]);
    assert!(!p.ok, "no CHAP must fail against tgt's CHAP target: {p:?}");

    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("perfchap", port, &[LUN_MIB]);
    let call = |m: &str, params: serde_json::Value| {
        riser.call(m, Some(params)).unwrap_or_else(|e| panic!("{m}: {e}\n{}", riser.log()))
    };
    call(
        "iscsi_create_auth_group",
        serde_json::json!({"tag": 1, "secrets": [{"user": "perfuser", "secret": "perf-secret-12", "muser": "riser", "msecret": "riser-secret-9"}]}),
    );
    call("iscsi_target_node_set_auth", serde_json::json!({"name": iqn, "chap_group": 1, "require_chap": true, "mutual_chap": true}));
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let args = ["--verify", "--generation", "22", "--bs", "4096", "--chap", "perfuser:perf-secret-12", "--chap-mutual", "riser:riser-secret-9"];
    let p = perf(&url, &args);
    assert!(p.ok && p.stdout.contains("verify: PASSED"), "mutual CHAP with riser: {p:?}\n{}", riser.log());
    let p = perf(&url, &["--verify-only", "--generation", "22", "--bs", "4096", "--chap", "perfuser:perf-secret-12", "--chap-mutual", "riser:wrong-secret-00"]);
    assert!(!p.ok, "riser-perf must refuse riser's answer to another target secret: {p:?}");
    let p = perf(&url, &["--verify-only", "--generation", "22", "--bs", "4096", "--chap", "perfuser:perf-secret-12"]);
    assert!(!p.ok, "one-way CHAP must not satisfy riser's mutual_chap: {p:?}");
}
