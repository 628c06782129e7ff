//! The few system calls riser-perf makes through libc (waiting on descriptors, CPU time,
//! pinning threads): the only `unsafe` code of the crate, each block allowed on its own.

use std::io;
use std::time::Duration;

/// poll(2) on `fds` for at most `timeout_ms` milliseconds: how many are ready.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs,
    // which poll(2) reads and whose `revents` it writes, nothing else; it keeps no pointer.
    #[allow(unsafe_code)]
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Waits until `fd` is readable (or writable) or `timeout` passes; false on timeout (or an
/// interrupted wait).
pub fn wait_fd(fd: i32, write: bool, timeout: Duration) -> Result<bool, String> {
    let mut p = [libc::pollfd {
        fd,
        events: if write { libc::POLLOUT } else { libc::POLLIN },
        revents: 0,
    }];
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    match poll(&mut p, ms) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(format!("poll: {e}")),
    }
}

/// CPU time of the calling thread (user, system) in ns.
pub fn thread_cpu() -> (u64, u64) {
    rusage(libc::RUSAGE_THREAD)
}

/// CPU time (user, system) in ns of `who` (`libc::RUSAGE_SELF`, `libc::RUSAGE_THREAD`);
/// zeros if it cannot be had.
pub fn rusage(who: libc::c_int) -> (u64, u64) {
    // SAFETY: `rusage` is a plain C struct of integers, for which all-zero bytes are a valid
    // value.
    #[allow(unsafe_code)]
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, exclusively borrowed rusage that getrusage(2) fills in; it
    // keeps no pointer.
    #[allow(unsafe_code)]
    let r = unsafe { libc::getrusage(who, &mut ru) };
    if r != 0 {
        return (0, 0);
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    (ns(ru.ru_utime), ns(ru.ru_stime))
}

/// Pins the calling thread to one core.
pub fn pin_to(core: usize) -> Result<(), String> {
    if core >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(format!("core {core} is beyond the CPU set size"));
    }
    // SAFETY: cpu_set_t is a plain bit array, valid all zero; CPU_SET writes one bit inside
    // it (`core` was checked against its size above); sched_setaffinity(2) only reads the
    // `size_of::<cpu_set_t>()` bytes of `set`.
    #[allow(unsafe_code)]
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(format!(
            "cannot pin to core {core}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
