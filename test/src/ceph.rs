//! A single-node Ceph cluster for the RBD tests (`scripts/ceph-test-cluster.sh`), stopped
//! when the guard drops (also while a test unwinds from a panic) and, should the test
//! process die without unwinding, by the script's watchdog on this process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::workspace_root;

pub struct CephCluster {
    dir: PathBuf,
    conf: PathBuf,
    keyring: PathBuf,
}

impl CephCluster {
    /// Starts a cluster in a fresh directory named after `tag` (its packages are installed
    /// by the script through scripts/setup.sh ceph). Panics with the script's output when it
    /// does not reach active+clean.
    pub fn start(tag: &str) -> CephCluster {
        CephCluster::start_on(tag, "127.0.0.1")
    }

    /// As [`start`](Self::start), every daemon bound to `addr` (an address of this machine,
    /// such as the host side of a veth pair, so that clients in another network namespace
    /// reach the cluster): the script's CEPH_ADDR.
    pub fn start_on(tag: &str, addr: &str) -> CephCluster {
        let dir = std::env::temp_dir().join(format!("riser-ceph-{tag}-{}", std::process::id()));
        let script = workspace_root().join("scripts/ceph-test-cluster.sh");
        let out = Command::new(&script)
            .arg("start")
            .arg(&dir)
            .env("CEPH_OWNER_PID", std::process::id().to_string())
            .env("CEPH_ADDR", addr)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        // The guard exists from here: a failed start still stops what did start.
        let c = CephCluster { conf: dir.join("ceph.conf"), keyring: dir.join("keyring"), dir };
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "ceph-test-cluster.sh start failed ({}):\n{text}", out.status);
        assert!(text.contains(&format!("CEPH_CONF={}", c.conf.display())), "unexpected output:\n{text}");
        c
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster's ceph.conf (monitor address, and the client.admin keyring in `keyring`).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The client.admin keyring.
    pub fn keyring(&self) -> &Path {
        &self.keyring
    }

    /// `rbd -c CONF ARGS..`.
    pub fn rbd(&self, args: &[&str]) -> Output {
        Command::new("rbd").arg("-c").arg(&self.conf).args(args).output().unwrap_or_else(|e| panic!("rbd {args:?}: {e}"))
    }

    /// `rbd ARGS..`, which must succeed; returns its stdout.
    pub fn rbd_ok(&self, args: &[&str]) -> String {
        let o = self.rbd(args);
        assert!(
            o.status.success(),
            "rbd {args:?} failed ({}): {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The PIDs of the cluster's daemons (mon, osd, mgr), from their pid files.
    pub fn daemon_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for name in ["mon.a", "osd.0", "mgr.x"] {
            if let Some(p) = std::fs::read_to_string(self.dir.join(format!("run/{name}.pid"))).ok().and_then(|s| s.trim().parse().ok()) {
                pids.push(p);
            }
        }
        pids
    }

    /// Sends `signal` (e.g. SIGSTOP, SIGCONT) to every daemon: the cluster stops answering
    /// and comes back with its data (memstore keeps it in the stopped process).
    pub fn signal_all(&self, signal: &str) {
        for p in self.daemon_pids() {
            let st = Command::new("kill").arg(format!("-{signal}")).arg(p.to_string()).status();
            assert!(st.is_ok_and(|s| s.success()), "kill -{signal} {p} failed");
        }
    }

    /// Whether any daemon of the cluster is still alive.
    pub fn running(&self) -> bool {
        let script = workspace_root().join("scripts/ceph-test-cluster.sh");
        Command::new(&script).arg("status").arg(&self.dir).output().is_ok_and(|o| o.status.success())
    }
}

impl Drop for CephCluster {
    fn drop(&mut self) {
        // Stopped daemons must be continued to die of SIGTERM promptly.
        for p in self.daemon_pids() {
            let _ = Command::new("kill").arg("-CONT").arg(p.to_string()).status();
        }
        let script = workspace_root().join("scripts/ceph-test-cluster.sh");
        match Command::new(&script).arg("stop").arg(&self.dir).output() {
            Ok(o) if o.status.success() => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
            Ok(o) => eprintln!("ceph-test-cluster.sh stop failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("cannot run {}: {e}", script.display()),
        }
    }
}
