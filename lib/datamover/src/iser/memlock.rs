//! Why iSER connections are refused when the memory lock limit is too low (issue #22,
//! item 13).
//!
//! Memory registered with an RDMA device is pinned and counted against the process's
//! `RLIMIT_MEMLOCK`: on soft-iWARP (siw) always, even for root (siw checks the limit without
//! looking at `CAP_IPC_LOCK`), on other devices unless the process has `CAP_IPC_LOCK`. riser
//! registers its pooled I/O buffers (up to the I/O buffer budget) and every connection's
//! login buffer and control pools. Under the default 8 MiB the registrations fail as soon as
//! I/O fills the pool, and connections are refused or reset (the initiator sees its connect
//! rejected, or status -104, ECONNRESET) with nothing on its side to say why. So riser says
//! it, once per process and not per connection: when an iSER portal starts (the limit
//! against the budget) and at the first registration refused for lack of memory.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

/// `CAP_IPC_LOCK`'s bit in the capability sets (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// What the check needs to know of the process and the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemlockFacts {
    /// The soft RLIMIT_MEMLOCK in bytes; None: unlimited.
    pub limit: Option<u64>,
    /// The I/O buffer budget (`iobuf_set_options` max_bytes): what the pool may register.
    pub budget: u64,
    /// Registered per connection beside the pool: login buffer and control pools.
    pub per_connection: u64,
    /// The process has CAP_IPC_LOCK in its effective set.
    pub cap_ipc_lock: bool,
    /// The device counts registrations against the limit whatever the capabilities (siw).
    pub counts_despite_cap: bool,
}

fn mib(bytes: u64) -> String {
    if bytes & ((1 << 20) - 1) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{} KiB", bytes.div_ceil(1024))
    }
}

/// The fix, in the words an operator needs.
const FIX: &str = "raise it above the budget: `ulimit -l unlimited` (or limits.conf memlock) before starting riser, \
LimitMEMLOCK=infinity in its systemd unit (the shipped unit sets it), or, except on soft-iWARP (siw), run riser as root \
with CAP_IPC_LOCK";

/// The warning for `facts`, or None when the limit does not bind: unlimited, a process with
/// CAP_IPC_LOCK on a device that honours it, or room for the budget and one connection.
pub fn advice(facts: &MemlockFacts) -> Option<String> {
    let limit = facts.limit?;
    if facts.cap_ipc_lock && !facts.counts_despite_cap {
        return None;
    }
    let need = facts.budget + facts.per_connection;
    if limit >= need {
        return None;
    }
    let why = if facts.cap_ipc_lock { " (siw counts it even with CAP_IPC_LOCK)" } else { "" };
    Some(format!(
        "RLIMIT_MEMLOCK is {}{why}, below what iSER registers with the RDMA device: the I/O buffer budget ({}) plus about {} \
         per connection; registrations will fail and iSER connections be refused (the initiator sees its connect rejected \
         or reset, e.g. status -104) once they reach the limit. Fix: {FIX}",
        mib(limit),
        mib(facts.budget),
        mib(facts.per_connection),
    ))
}

/// The warning when a registration of `bytes` was refused with `errno`, or None when the
/// limit cannot be the cause (another errno, or no limit that binds).
pub fn refused_advice(facts: &MemlockFacts, bytes: usize, errno: Option<i32>) -> Option<String> {
    if errno != Some(libc_enomem()) {
        return None;
    }
    let limit = facts.limit?;
    if facts.cap_ipc_lock && !facts.counts_despite_cap {
        return None;
    }
    Some(format!(
        "registering {} with the RDMA device was refused (ENOMEM) under RLIMIT_MEMLOCK {}{}; iSER needs the I/O buffer \
         budget ({}) plus about {} per connection, and refuses connections and I/O until the limit is raised. Fix: {FIX}",
        mib(bytes as u64),
        mib(limit),
        if facts.cap_ipc_lock { " (siw counts it even with CAP_IPC_LOCK)" } else { "" },
        mib(facts.budget),
        mib(facts.per_connection),
    ))
}

/// ENOMEM, without a libc dependency for one constant (the same on every Linux).
const fn libc_enomem() -> i32 {
    12
}

/// Whether the process has CAP_IPC_LOCK in its effective set (/proc/self/status CapEff).
pub fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| cap_eff_has(&s, CAP_IPC_LOCK))
}

fn cap_eff_has(status: &str, cap: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|bits| bits & (1 << cap) != 0)
}

/// The facts of this process now, for a device that is (`siw`) or is not soft-iWARP.
pub fn facts(per_connection: u64, siw: bool) -> MemlockFacts {
    MemlockFacts {
        limit: riser_rdma::memlock_limit(),
        budget: riser_buf::Pool::global().max_bytes() as u64,
        per_connection,
        cap_ipc_lock: has_cap_ipc_lock(),
        counts_despite_cap: siw,
    }
}

static WARNED_AT_START: AtomicBool = AtomicBool::new(false);
static WARNED_REFUSED: AtomicBool = AtomicBool::new(false);

/// When an iSER portal starts: warns (once per process) if the limit is below the budget.
pub fn check_at_start(portal: SocketAddr, facts: &MemlockFacts) {
    if let Some(msg) = advice(facts) {
        if !WARNED_AT_START.swap(true, Ordering::Relaxed) {
            log::warn!("iSER portal {portal}: {msg}");
        }
    }
}

/// A registration of `bytes` failed with `errno`: says why and how to fix it, at the first
/// such refusal of the process only.
pub fn note_refused(facts: &MemlockFacts, bytes: usize, errno: Option<i32>) {
    if let Some(msg) = refused_advice(facts, bytes, errno) {
        if !WARNED_REFUSED.swap(true, Ordering::Relaxed) {
            log::error!("iSER: {msg}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn f(limit: Option<u64>, cap: bool, siw: bool) -> MemlockFacts {
        MemlockFacts { limit, budget: 48 * MIB, per_connection: 1536 * 1024, cap_ipc_lock: cap, counts_despite_cap: siw }
    }

    #[test]
    fn the_default_8_mib_is_reported_with_the_budget_and_the_fix() {
        let msg = advice(&f(Some(8 * MIB), false, true)).expect("8 MiB does not hold a 48 MiB budget");
        assert!(msg.starts_with("RLIMIT_MEMLOCK is 8 MiB, below"), "{msg}");
        assert!(msg.contains("the I/O buffer budget (48 MiB) plus about 1.5 MiB per connection"), "{msg}");
        assert!(msg.contains("status -104"), "{msg}");
        for fix in ["ulimit -l unlimited", "LimitMEMLOCK=infinity", "CAP_IPC_LOCK"] {
            assert!(msg.contains(fix), "{fix}: {msg}");
        }
        let siw_root = advice(&f(Some(8 * MIB), true, true)).expect("siw counts it even for root");
        assert!(siw_root.contains("(siw counts it even with CAP_IPC_LOCK)"), "{siw_root}");
    }

    #[test]
    fn no_warning_where_the_limit_does_not_bind() {
        assert_eq!(advice(&f(None, false, true)), None, "unlimited");
        assert_eq!(advice(&f(Some(8 * MIB), true, false)), None, "CAP_IPC_LOCK on rxe / hardware");
        assert_eq!(advice(&f(Some(50 * MIB), false, true)), None, "room for the budget and a connection");
        assert!(advice(&f(Some(49 * MIB), false, true)).is_some(), "the budget, but not a connection beside it");
    }

    #[test]
    fn a_refused_registration_names_the_limit_only_when_it_can_be_the_cause() {
        let msg = refused_advice(&f(Some(8 * MIB), false, false), MIB as usize, Some(12)).expect("ENOMEM under a limit");
        assert!(msg.starts_with("registering 1 MiB with the RDMA device was refused (ENOMEM) under RLIMIT_MEMLOCK 8 MiB;"), "{msg}");
        assert!(msg.contains("ulimit -l unlimited"), "{msg}");
        assert_eq!(refused_advice(&f(Some(8 * MIB), false, false), 4096, Some(22)), None, "EINVAL is not the limit");
        assert_eq!(refused_advice(&f(None, false, false), 4096, Some(12)), None, "no limit");
        assert_eq!(refused_advice(&f(Some(8 * MIB), true, false), 4096, Some(12)), None, "CAP_IPC_LOCK lifts it");
        // Refused even though the budget fits: a limit that binds is still the likely cause.
        assert!(refused_advice(&f(Some(64 * MIB), false, true), 4096, Some(12)).is_some());
    }

    #[test]
    fn cap_ipc_lock_is_read_from_cap_eff() {
        let status = "Name:\triser\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n";
        assert!(cap_eff_has(status, CAP_IPC_LOCK));
        assert!(!cap_eff_has("CapEff:\t000001ffffffbfff\n", CAP_IPC_LOCK), "bit 14 cleared");
        assert!(!cap_eff_has("CapPrm:\tffffffff\n", CAP_IPC_LOCK), "no CapEff line");
        assert_eq!(mib(1536 * 1024), "1.5 MiB");
        assert_eq!(mib(20 * 1024), "20 KiB");
    }
}
