//! Running a script in the soft-RoCE VM (`scripts/rxe-vm.sh run SCRIPT`) from a test.
//!
//! One VM at a time, machine-wide: two TCG guests on a small host only slow each other down,
//! so every run holds an exclusive `flock(2)` on `/tmp/riser-vm.lock` (the same lock a person
//! can take by hand: `flock /tmp/riser-vm.lock scripts/rxe-vm.sh run ...`). Test binaries run
//! one after another under cargo, but tests inside one binary, and people, run in parallel.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{bin, bin_dir, workspace_root};

/// The lock file every VM run holds while it runs.
pub const VM_LOCK: &str = "/tmp/riser-vm.lock";

/// What one VM run left: the exit status of `scripts/rxe-vm.sh run`, its output (the guest's
/// console, rxe-vm.sh's own lines), and how long it took.
pub struct VmRun {
    pub script: String,
    pub success: bool,
    pub status: String,
    pub text: String,
    pub took: Duration,
}

impl VmRun {
    /// Whether the output has `line` as a line of its own.
    pub fn has_line(&self, line: &str) -> bool {
        self.text.lines().any(|l| l == line)
    }

    /// Asserts `line` is in the output; shows the whole output otherwise.
    pub fn expect_line(&self, line: &str) {
        assert!(
            self.has_line(line),
            "no `{line}` in the output of {} ({}, after {:.0?}):\n{}",
            self.script,
            self.status,
            self.took,
            self.text
        );
    }

    /// Asserts the run succeeded and printed `ok_line`; returns the output.
    pub fn expect_ok(self, ok_line: &str) -> String {
        assert!(self.success, "scripts/rxe-vm.sh run {} failed ({}) after {:.0?}:\n{}", self.script, self.status, self.took, self.text);
        // Belt and braces: a zero status must come with the script's own last word.
        self.expect_line(ok_line);
        self.text
    }
}

/// Holds the machine-wide VM lock until dropped.
pub struct VmLock(std::fs::File);

impl VmLock {
    /// Waits for the lock. [`vm_run`] takes it itself; a test that drives a VM with
    /// [`vm_spawn`] takes it first (and may set up around the VM what must not be shared).
    pub fn take() -> VmLock {
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(VM_LOCK)
            .unwrap_or_else(|e| panic!("cannot open the VM lock {VM_LOCK}: {e}"));
        // SAFETY: flock on a descriptor this File owns; no memory is involved.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "flock {VM_LOCK}: {}", std::io::Error::last_os_error());
        VmLock(f)
    }
}

impl Drop for VmLock {
    fn drop(&mut self) {
        // SAFETY: as above; closing the file would release the lock as well.
        #[allow(unsafe_code)]
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Runs `script` in the VM with `smp` vCPUs (unless RISER_VM_SMP says otherwise) and returns
/// what happened, without judging it. `bins` are the host-built binaries the script needs
/// (checked before booting, so a missing one fails here with the fix).
pub fn vm_run(script: &str, smp: u32, bins: &[&str]) -> VmRun {
    for b in bins {
        bin(b);
    }
    let dir = bin_dir().canonicalize().expect("the binaries' directory");
    let _one = VmLock::take();

    let start = Instant::now();
    // One stream (2>&1) so rxe-vm.sh's own messages stay in order with the guest's console.
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &format!("exec scripts/rxe-vm.sh run {script} 2>&1")])
        .current_dir(workspace_root())
        .env("RISER_BIN_DIR", &dir);
    if std::env::var_os("RISER_VM_SMP").is_none() {
        cmd.env("RISER_VM_SMP", smp.to_string());
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run bash scripts/rxe-vm.sh: {e}"));
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // Shown with --nocapture.
    println!("{text}\n{script}: {took:.1?}");
    VmRun { script: script.to_string(), success: out.status.success(), status: out.status.to_string(), text, took }
}

/// A VM run in progress ([`vm_spawn`]): its output goes to a file, readable at any time; the
/// whole process group (rxe-vm.sh, timeout, qemu) is killed when this is dropped unwaited.
pub struct VmChild {
    script: String,
    child: Option<std::process::Child>,
    log: std::path::PathBuf,
    start: Instant,
}

impl VmChild {
    /// Everything rxe-vm.sh and the guest's console printed so far.
    pub fn output(&self) -> String {
        std::fs::read(&self.log).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// Whether the VM is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Waits for the run's end (rxe-vm.sh has its own timeout, RISER_VM_TIMEOUT).
    pub fn wait(mut self) -> VmRun {
        let status = self.child.take().map(|mut c| c.wait());
        let took = self.start.elapsed();
        let text = self.output();
        println!("{text}\n{}: {took:.1?}", self.script);
        let (success, status) = match status {
            Some(Ok(s)) => (s.success(), s.to_string()),
            Some(Err(e)) => (false, format!("wait failed: {e}")),
            None => (false, "already reaped".into()),
        };
        VmRun { script: self.script.clone(), success, status, text, took }
    }
}

impl Drop for VmChild {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pgid) = libc::pid_t::try_from(c.id()) {
                // SAFETY: kill(2) of the process group this child leads (spawned with
                // process_group(0)) and that is not reaped yet; no memory is involved.
                #[allow(unsafe_code)]
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
            }
            let _ = c.wait();
        }
    }
}

/// Starts `script` in the VM as [`vm_run`] does, without waiting, with `env` added to its
/// environment (RISER_* variables reach the guest; RISER_VM_OUT names the shared directory).
/// The caller holds the [`VmLock`]. The output goes to `log`.
pub fn vm_spawn(script: &str, smp: u32, bins: &[&str], env: &[(&str, String)], log: &std::path::Path) -> VmChild {
    use std::os::unix::process::CommandExt;
    for b in bins {
        bin(b);
    }
    let dir = bin_dir().canonicalize().expect("the binaries' directory");
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
    let err = out.try_clone().unwrap_or_else(|e| panic!("cannot dup {}: {e}", log.display()));
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &format!("exec scripts/rxe-vm.sh run {script}")])
        .current_dir(workspace_root())
        .env("RISER_BIN_DIR", &dir)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    if std::env::var_os("RISER_VM_SMP").is_none() {
        cmd.env("RISER_VM_SMP", smp.to_string());
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run bash scripts/rxe-vm.sh: {e}"));
    VmChild { script: script.to_string(), child: Some(child), log: log.to_path_buf(), start: Instant::now() }
}
