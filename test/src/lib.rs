//! Harness for integration tests that run the real `riser` daemon and `riser-rpc` CLI.
//!
//! The binaries are not built by `cargo test -p riser-tests` (cargo only builds a
//! package's own targets), so they are looked up in `<workspace>/target/debug/`, or in
//! `$RISER_BIN_DIR` when set. Every [`Riser`] gets its own temporary directory and socket,
//! so tests run in parallel without seeing each other.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

pub use riser_rpc::client::{ClientError, RpcClient};
pub use serde_json::{json, Value};

/// How long riser may take to answer its first `spdk_get_version`.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Reply timeout for calls made by the tests; generous because CI machines are small.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The workspace root: this crate lives in `<root>/test`.
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Where the binaries are: `$RISER_BIN_DIR`, else `<root>/target/debug`.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("RISER_BIN_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("target").join("debug"),
    }
}

/// The path of a built binary; panics with the fix when it is missing.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    if !path.is_file() {
        panic!("{} not found: build first: cargo build --workspace (or set RISER_BIN_DIR)", path.display());
    }
    path
}

/// SPDK's `scripts/rpc.py` and its python package, unpacked from the tarball in
/// ../shared/peers/spdk (a failure, not a skip, when it is missing).
pub fn spdk_rpc_py(dir: &TempDir) -> PathBuf {
    let tarball = workspace_root().join("../shared/peers/spdk/spdk-v24.01.tar.gz");
    assert!(tarball.exists(), "{} is missing: SPDK's sources come with ../shared", tarball.display());
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(dir.path())
        .args(["--wildcards", "*/scripts/rpc.py", "*/python/spdk/*"])
        .output()
        .unwrap_or_else(|e| panic!("tar: {e}"));
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    let rpc = dir.join("spdk/scripts/rpc.py");
    assert!(rpc.exists(), "no scripts/rpc.py in {}", tarball.display());
    rpc
}

/// A directory under the system temp dir, removed (with its contents) on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        // Short names: a Unix socket path must fit in 108 bytes.
        let path = std::env::temp_dir().join(format!("riser-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// What one `riser-rpc` run gave.
#[derive(Debug)]
pub struct RpcOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl RpcOutput {
    /// The exit code (None when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Stdout parsed as JSON; panics (with both streams) unless the run succeeded.
    pub fn json(&self) -> Value {
        assert!(self.status.success(), "riser-rpc failed: {self:?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

/// Runs `riser-rpc -s SOCK -t 10 ARGS..` and collects its output.
pub fn riser_rpc(sock: &Path, args: &[&str]) -> RpcOutput {
    riser_rpc_stdin(sock, args, None)
}

/// Like [`riser_rpc`], feeding `stdin` to the process (for `load_config` without `-j`).
pub fn riser_rpc_stdin(sock: &Path, args: &[&str], stdin: Option<&[u8]>) -> RpcOutput {
    let mut cmd = Command::new(bin("riser-rpc"));
    cmd.arg("-s").arg(sock).arg("-t").arg(CALL_TIMEOUT.as_secs().to_string()).args(args);
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run riser-rpc: {e}"));
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes).unwrap_or_else(|e| panic!("cannot write riser-rpc's stdin: {e}"));
        // Dropping the pipe closes it: riser-rpc sees end of input.
    }
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("riser-rpc did not finish: {e}"));
    RpcOutput {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Waits up to `timeout` for a child to exit.
fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

/// A running `riser` daemon, killed on drop.
pub struct Riser {
    child: Option<Child>,
    sock: PathBuf,
    log: PathBuf,
    dir: TempDir,
}

impl Riser {
    /// `riser --poll-mode adaptive -m 0x1 -r SOCK`, ready to answer.
    pub fn start() -> Riser {
        Riser::start_with(&[])
    }

    /// Same as [`start`](Self::start) with more arguments (`--json FILE`, ...).
    pub fn start_with(extra: &[&str]) -> Riser {
        Riser::start_bin(&bin("riser"), extra)
    }

    /// The release build of riser (`target/release/riser`, which `make test` builds), with
    /// more arguments: for tests that judge what users run (memory, hostile peers).
    pub fn start_release(extra: &[&str]) -> Riser {
        let path = workspace_root().join("target").join("release").join("riser");
        assert!(
            path.exists(),
            "{} is not built: `make test` builds it (or run `cargo build --release -p riser --bin riser`)",
            path.display()
        );
        Riser::start_bin(&path, extra)
    }

    /// `path` (a riser binary) as [`start_with`](Self::start_with) runs it.
    pub fn start_bin(path: &Path, extra: &[&str]) -> Riser {
        Riser::start_prefixed(&[], path, extra)
    }

    /// As [`start_with`](Self::start_with), run through `prefix`, a command that execs the
    /// rest of its command line (`ip netns exec NS`: riser in another network namespace; its
    /// RPC socket is a file, reached from here all the same). The process is riser itself
    /// once the prefix has exec'ed, so [`pid`](Self::pid) and signals reach riser.
    pub fn start_in(prefix: &[&str], extra: &[&str]) -> Riser {
        Riser::start_prefixed(prefix, &bin("riser"), extra)
    }

    fn start_prefixed(prefix: &[&str], path: &Path, extra: &[&str]) -> Riser {
        let dir = TempDir::new("t");
        let sock = dir.join("rpc.sock");
        let log = dir.join("riser.log");
        let out = File::create(&log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let err = out.try_clone().unwrap_or_else(|e| panic!("cannot dup the log file: {e}"));
        // Adaptive polling and one core: tests share a 2-core machine with each other.
        let mask: &[&str] = if extra.contains(&"-m") { &[] } else { &["-m", "0x1"] };
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(path);
                c
            }
            None => Command::new(path),
        };
        let child = cmd
            .args(["--poll-mode", "adaptive"])
            .args(mask)
            .arg("-r")
            .arg(&sock)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start riser: {e}"));
        let mut riser = Riser { child: Some(child), sock, log, dir };
        riser.wait_ready(extra);
        riser
    }

    /// Polls until `spdk_get_version` answers; panics with riser's log otherwise.
    fn wait_ready(&mut self, extra: &[&str]) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last_error = String::from("socket not created yet");
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("riser {extra:?} exited ({status}) before answering; its output:\n{}", self.log());
                }
            }
            if self.sock.exists() {
                match RpcClient::connect(&self.sock, Duration::from_secs(2))
                    .and_then(|mut c| c.call("spdk_get_version", None))
                {
                    Ok(_) => return,
                    Err(e) => last_error = e.to_string(),
                }
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "riser {extra:?} did not answer spdk_get_version within {START_TIMEOUT:?} ({last_error}); its output:\n{}",
                    self.log()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The RPC socket path.
    pub fn socket(&self) -> &Path {
        &self.sock
    }

    /// This instance's temp dir (holds the socket and the log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything riser printed so far (stdout and stderr together).
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A fresh JSON-RPC connection.
    pub fn client(&self) -> RpcClient {
        RpcClient::connect(&self.sock, CALL_TIMEOUT).unwrap_or_else(|e| panic!("{e}; riser output:\n{}", self.log()))
    }

    /// One call on a fresh connection.
    pub fn call(&self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        self.client().call(method, params)
    }

    /// A raw connection, for sending bytes that are not a well-formed request.
    pub fn raw_stream(&self) -> UnixStream {
        let s = UnixStream::connect(&self.sock).unwrap_or_else(|e| panic!("cannot connect: {e}"));
        let _ = s.set_read_timeout(Some(CALL_TIMEOUT));
        s
    }

    /// `riser-rpc -s SOCK ARGS..`.
    pub fn rpc(&self, args: &[&str]) -> RpcOutput {
        riser_rpc(&self.sock, args)
    }

    /// `riser-rpc -s SOCK ARGS..` that must succeed; its stdout as JSON.
    pub fn rpc_json(&self, args: &[&str]) -> Value {
        let out = self.rpc(args);
        assert!(out.status.success(), "riser-rpc {args:?} failed: {out:?}\nriser output:\n{}", self.log());
        out.json()
    }

    /// Whether the process is still alive.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Sends SIGTERM and waits up to `timeout`; None if it is still running then.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let status = wait_timeout(child, timeout);
        if status.is_some() {
            self.child = None;
        }
        status
    }

    /// SIGKILL and reap (idempotent).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Riser {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The JSON-RPC error code of a failed call; panics when the call did not fail that way.
pub fn rpc_code(r: &Result<Value, ClientError>) -> i64 {
    match r {
        Err(ClientError::Rpc { code, .. }) => *code,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

/// The JSON-RPC error message of a failed call; panics when the call did not fail that way.
pub fn rpc_message(r: &Result<Value, ClientError>) -> String {
    match r {
        Err(ClientError::Rpc { message, .. }) => message.clone(),
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

pub mod ceph;
pub mod compliance;
pub mod files;
pub mod iscsi;
pub mod perf_out;
pub mod slow_writer;
pub mod vm;

/// A TCP port free on 127.0.0.1 right now (tests run in parallel: each target gets its own).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

impl Riser {
    /// Configures, over JSON-RPC, an iSCSI target `iqn.2016-06.io.riser:NAME` on
    /// 127.0.0.1:`port` with one malloc LUN per entry of `lun_mib` (LUN ids 0, 1, ...),
    /// open to any initiator. Returns the target's IQN.
    pub fn add_iscsi_target(&self, name: &str, port: u16, lun_mib: &[u64]) -> String {
        let luns: Vec<(u64, Value)> = lun_mib.iter().map(|&m| (m, json!({}))).collect();
        self.add_iscsi_target_luns(name, port, &luns)
    }

    /// As [`Riser::add_iscsi_target`], each LUN given as (MiB, extra LUN parameters such as
    /// `{"removable": true}`).
    pub fn add_iscsi_target_luns(&self, name: &str, port: u16, lun_defs: &[(u64, Value)]) -> String {
        let call = |m: &str, p: Value| {
            self.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", self.log()))
        };
        let mut luns = Vec::new();
        for (i, (mib, extra)) in lun_defs.iter().enumerate() {
            let bdev = format!("{name}_m{i}");
            call("bdev_malloc_create", json!({"name": bdev, "num_blocks": mib * 2048, "block_size": 512}));
            let mut lun = json!({"bdev_name": bdev, "lun_id": i});
            if let (Some(l), Some(x)) = (lun.as_object_mut(), extra.as_object()) {
                l.extend(x.clone());
            }
            luns.push(lun);
        }
        self.add_iscsi_target_on(name, port, luns)
    }

    /// Resident memory of the daemon in KiB (from /proc), for leak checks.
    pub fn rss_kib(&self) -> u64 {
        let Some(pid) = self.pid() else { return 0 };
        fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
            })
            .unwrap_or(0)
    }
}
