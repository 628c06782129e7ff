//! The per-pass readiness check of the descriptors registered with `add_ready_fd`.

use std::os::fd::OwnedFd;

use rustix::event::epoll;

use crate::wake::WakeId;

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
