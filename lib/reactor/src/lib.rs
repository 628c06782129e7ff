//! Polled-mode reactors: one pinned thread per core of a core mask.
//!
//! Each reactor owns everything registered on it (pollers, timed pollers, per-reactor
//! locals) and is reached from other threads only through its bounded lock-free message
//! ring. Objects move between reactors by being sent inside a message. Nothing on the data
//! path takes a lock.
//!
//! * [`ReactorSet::start`] starts the threads; [`ReactorHandle`] sends messages to them.
//! * [`Ctx`] is what a message, a poller or a timed poller sees of its reactor.
//! * [`PollMode::Busy`] spins (production); [`PollMode::Adaptive`] backs off to sleeping
//!   when a reactor has been idle, so a small machine is not starved.
//! * [`Router`] routes completions back to who submitted them: a typed [`Tag`] (slot,
//!   generation, route) encoded by a [`TagLayout`], a slot table and per-route [`Inboxes`].

mod mask;
mod reactor;
mod ready;
mod route;
mod stats;
mod uring;
mod wake;

pub use route::{Inboxes, Router, Tag, TagLayout};
pub use mask::{parse_core_mask, CoreMaskError};
pub use reactor::{
    add_ready_fd, add_wake_fd, current_waker, fd_drained, fd_readable, force_epoll_readiness, remove_wake_fd, uring_readiness, Ctx, SignalledWait, Message, PollMode, PollStatus, PollerId, ReactorConfig, ReactorError, ReactorHandle, ReactorSet,
    ReactorStatsSnapshot, SendError, WakeId, Waker,
};
