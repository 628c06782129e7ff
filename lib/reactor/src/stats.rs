//! Per-reactor counters: written by the reactor thread, read by anyone (`ReactorHandle::stats`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

/// Per-reactor counters, written by the reactor, read by anyone.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) busy_ns: AtomicU64,
    pub(crate) idle_ns: AtomicU64,
    pub(crate) messages: AtomicU64,
    pub(crate) pollers: AtomicUsize,
    /// Application-defined load (e.g. connections), for placement decisions.
    pub(crate) load: AtomicUsize,
    pub(crate) sleeping: AtomicBool,
    /// Adaptive sleeps ended by a descriptor (a message, a socket, a completion channel)
    /// rather than by their timeout.
    pub(crate) woken: AtomicU64,
    /// Busy mode: idle spells in which the reactor gave its core to other runnable threads
    /// (`sched_yield`), such as the kernel's softirq thread on that core.
    pub(crate) yields: AtomicU64,
    /// Adaptive mode: how long the reactor now spins idle before it sleeps (nanoseconds).
    pub(crate) spin_ns: AtomicU64,
    /// Loop passes (each a look at messages, pollers and due timers), and those that found
    /// work: `riser-perf`'s cost benchmark and `framework_get_reactors` show them per I/O.
    pub(crate) passes: AtomicU64,
    pub(crate) busy_passes: AtomicU64,
    /// Poller calls (each pass calls every poller): what a pass costs per registered poller.
    pub(crate) poller_calls: AtomicU64,
}

/// A copy of one reactor's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReactorStatsSnapshot {
    pub reactor: usize,
    pub core: usize,
    pub busy_ns: u64,
    pub idle_ns: u64,
    pub messages: u64,
    pub pollers: usize,
    pub load: usize,
    pub sleeping: bool,
    /// Adaptive sleeps ended by an event rather than by their timeout.
    pub woken: u64,
    /// Busy mode: yields of the core to other runnable threads while idle.
    pub yields: u64,
    /// Adaptive mode: the spin window before a sleep, in nanoseconds (it grows while work
    /// comes soon after the reactor sleeps).
    pub spin_ns: u64,
    /// Loop passes since the start, and those that found work.
    pub passes: u64,
    pub busy_passes: u64,
    /// Poller calls since the start (not counting timed pollers).
    pub poller_calls: u64,
}
