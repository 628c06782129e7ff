//! The per-pass readiness check of the descriptors registered with `add_ready_fd`: an
//! io_uring of multishot polls (`uring.rs`; no system call on a pass that finds nothing),
//! or where io_uring is unavailable, one `epoll_wait` per pass.

use std::os::fd::{OwnedFd, RawFd};

use rustix::event::epoll;

use crate::uring::UringReady;
use crate::wake::WakeId;

/// Which check a reactor makes, chosen when its first socket registers.
enum Mode {
    Untried,
    Uring(Box<UringReady>),
    Epoll,
}

/// A reactor's readiness of its `add_ready_fd` descriptors.
pub(crate) struct Ready {
    mode: Mode,
    epoll: Readiness,
}

impl Ready {
    pub(crate) fn new() -> Ready {
        Ready { mode: Mode::Untried, epoll: Readiness::new() }
    }

    /// Use the `epoll_wait` check on this reactor (before its first socket registers;
    /// afterwards it keeps what it has). Also chosen by `RISER_READINESS=epoll` in the
    /// environment (to compare the two; `uring-ipi`: the ring without cooperative task running).
    pub(crate) fn force_epoll(&mut self) -> bool {
        match self.mode {
            Mode::Untried | Mode::Epoll => {
                self.mode = Mode::Epoll;
                true
            }
            Mode::Uring(_) => false,
        }
    }

    /// Registers a socket; returns its id (`seq`, the wake set's sequence number, with the
    /// ring's slot in the top bits when the ring polls it).
    pub(crate) fn add(&mut self, fd: RawFd, seq: u64) -> u64 {
        if let Mode::Untried = self.mode {
            self.mode = if std::env::var("RISER_READINESS").is_ok_and(|v| v == "epoll") {
                log::info!("socket readiness: one epoll_wait per reactor pass (RISER_READINESS=epoll)");
                Mode::Epoll
            } else {
                match UringReady::new() {
                    Ok(u) => Mode::Uring(Box::new(u)),
                    Err(e) => {
                        log::warn!("socket readiness: io_uring multishot poll unavailable ({e}); one epoll_wait per reactor pass instead");
                        Mode::Epoll
                    }
                }
            };
        }
        match &mut self.mode {
            Mode::Uring(u) => u.add(fd, seq),
            _ => seq,
        }
    }

    /// Unregisters a socket of [`add`](Self::add) (its poll is cancelled at once).
    pub(crate) fn remove(&mut self, id: u64) {
        if let Mode::Uring(u) = &mut self.mode {
            u.remove(id);
        }
    }

    /// The check at the start of a pass. `checked`: how many sockets are registered;
    /// `last_id`: the last id the wake set gave.
    pub(crate) fn check(&mut self, epoll: &OwnedFd, checked: usize, last_id: u64) {
        match &mut self.mode {
            Mode::Uring(u) => {
                if u.any() {
                    u.check()
                }
            }
            Mode::Epoll => self.epoll.check(epoll, checked, last_id),
            Mode::Untried => {}
        }
    }

    pub(crate) fn readable(&self, id: WakeId) -> Option<bool> {
        match &self.mode {
            Mode::Uring(u) => u.readable(id.0),
            Mode::Epoll => self.epoll.readable(id),
            Mode::Untried => None,
        }
    }

    pub(crate) fn drained(&mut self, id: WakeId) {
        if let Mode::Uring(u) = &mut self.mode {
            u.drained(id.0);
        }
    }

    /// Whether the io_uring check is the one in use.
    pub(crate) fn uring(&self) -> bool {
        matches!(self.mode, Mode::Uring(_))
    }
}

/// What the readiness check at the start of this pass found: the ids of the readable
/// descriptors (sorted), the last id registered before it, and whether it ran at all.
pub(crate) struct Readiness {
    events: epoll::EventVec,
    ids: Vec<u64>,
    /// Ids above this were registered after the check: nothing is known of them.
    upto: u64,
    /// The check ran this pass (and did not fail).
    valid: bool,
    /// More descriptors were readable than one check reports: each counts as readable.
    overflow: bool,
}

/// Most readable descriptors one readiness check reports; when more are, every descriptor
/// counts as readable for that pass (level-triggered, nothing is lost either way).
const READY_EVENTS: usize = 256;

impl Readiness {
    pub(crate) fn new() -> Readiness {
        Readiness { events: epoll::EventVec::with_capacity(READY_EVENTS), ids: Vec::with_capacity(READY_EVENTS), upto: 0, valid: false, overflow: false }
    }
}

impl Readiness {
    /// The readiness check of a pass: one `epoll_wait` with a zero timeout on the whole set
    /// (level-triggered: a descriptor not drained in this pass is reported again in the
    /// next). Skipped (nothing known: every source reads) while fewer than two sources
    /// asked for it (`checked`): for one socket the check would cost what reading it costs.
    /// `last_id`: the last id registered so far.
    pub(crate) fn check(&mut self, epoll: &OwnedFd, checked: usize, last_id: u64) {
        self.valid = false;
        if checked < 2 {
            return;
        }
        self.ids.clear();
        self.upto = last_id;
        // EINTR and the like: nothing known this pass, every source reads.
        if let Ok(()) = epoll::wait(epoll, &mut self.events, 0) {
            self.ids.extend(self.events.iter().map(|e| e.data.u64()));
            self.ids.sort_unstable();
            self.overflow = self.ids.len() >= READY_EVENTS;
            self.valid = true;
        }
    }

    pub(crate) fn readable(&self, id: WakeId) -> Option<bool> {
        if !self.valid || id.0 > self.upto {
            return None;
        }
        Some(self.overflow || self.ids.binary_search(&id.0).is_ok())
    }
}
