//! The JSON-RPC socket of the real daemon: its owner's only (0600) or a group's too
//! (`--rpc-group`, 0660); a path that is something else is refused and kept (riser exits
//! non-zero, saying why); a socket a killed riser left is replaced, and the log says so.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use riser_rpc::client::RpcClient;
use riser_tests::{bin, Riser, TempDir, START_TIMEOUT};

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `riser -r SOCK EXTRA..`, its output into `log`.
fn spawn(sock: &Path, log: &Path, extra: &[&str]) -> Child {
    let out = File::create(log).expect("log file");
    let err = out.try_clone().expect("dup");
    Command::new(bin("riser"))
        .args(["--poll-mode", "adaptive", "-m", "0x1", "--state-dir"])
        .arg(log.with_extension("state"))
        .arg("-r")
        .arg(sock)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("cannot start riser")
}

/// Waits for a riser that must refuse to start: its exit code and output.
fn refused(sock: &Path, log: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut child = spawn(sock, log, extra);
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return (status.code(), std::fs::read_to_string(log).unwrap_or_default());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("riser started on {}: {}", sock.display(), std::fs::read_to_string(log).unwrap_or_default());
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until riser answers on `sock`.
fn answers(sock: &Path, child: &mut Child, log: &Path) {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("riser exited ({status}): {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        if RpcClient::connect(sock, Duration::from_secs(2)).and_then(|mut c| c.call("spdk_get_version", None)).is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "riser never answered: {}", std::fs::read_to_string(log).unwrap_or_default());
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_socket_is_for_riser_s_user_only() {
    let riser = Riser::start();
    assert_eq!(mode_of(riser.socket()), 0o600, "whatever the umask");
    assert!(riser.log().contains("owner only, mode 0600"), "{}", riser.log());
}

#[test]
fn a_group_may_use_the_socket_too() {
    let dir = TempDir::new("rpc-group");
    let (sock, log) = (dir.join("rpc.sock"), dir.join("riser.log"));
    let gid = std::fs::metadata(dir.path()).expect("dir").gid();
    let mut child = spawn(&sock, &log, &["--rpc-group", &gid.to_string()]);
    answers(&sock, &mut child, &log);
    assert_eq!(mode_of(&sock), 0o660);
    assert_eq!(std::fs::symlink_metadata(&sock).expect("socket").gid(), gid);
    let _ = child.kill();
    let _ = child.wait();
    // A group that does not exist is a wrong command line.
    let (code, out) = refused(&dir.join("other.sock"), &dir.join("bad.log"), &["--rpc-group", "no-such-group-here"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("--rpc-group: no group \"no-such-group-here\""), "{out}");
}

#[test]
fn a_path_that_is_not_a_stale_socket_is_refused_and_kept() {
    let dir = TempDir::new("rpc-refuse");
    let file = dir.join("file.sock");
    std::fs::write(&file, "keep me").expect("file");
    let (code, out) = refused(&file, &dir.join("a.log"), &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("exists and is a regular file; refusing to replace it"), "{out}");
    assert_eq!(std::fs::read_to_string(&file).expect("file"), "keep me");

    let link = dir.join("link.sock");
    std::os::unix::fs::symlink(&file, &link).expect("symlink");
    let (code, out) = refused(&link, &dir.join("b.log"), &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("is a symbolic link"), "{out}");
    assert_eq!(std::fs::read_link(&link).expect("link"), file);

    // Another riser's live socket.
    let live = Riser::start();
    let (code, out) = refused(live.socket(), &dir.join("c.log"), &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("is in use: a process answers on it"), "{out}");
    assert!(live.call("spdk_get_version", None).is_ok(), "the first riser still answers");
}

#[test]
fn a_killed_riser_s_socket_is_replaced_and_the_log_says_so() {
    let mut first = Riser::start();
    let sock = first.socket().to_path_buf();
    first.kill();
    assert!(sock.exists(), "SIGKILL leaves the socket");
    let log = first.dir().join("second.log");
    let mut second = spawn(&sock, &log, &[]);
    answers(&sock, &mut second, &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("removed a stale socket"), "{text}");
    assert_eq!(mode_of(&sock), 0o600);
    let _ = second.kill();
    let _ = second.wait();
}
