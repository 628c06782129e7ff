//! Readiness without a system call on idle passes: one io_uring per reactor with a
//! multishot poll (`IORING_OP_POLL_ADD`, `IORING_POLL_ADD_MULTI`) armed on each socket of
//! `add_ready_fd`. A pass only looks at the completion queue, in memory shared with the
//! kernel; it enters the kernel only when something is pending (a poll to arm or cancel,
//! task work the kernel flagged, an overflowed completion queue).
//!
//! A poll completion says that data (or EOF, or an error) came since the last one: it
//! sets the descriptor's "maybe more" flag, which stays set until its reader found the
//! socket empty ([`fd_drained`](crate::fd_drained): a read that returned `EAGAIN` or fewer
//! bytes than asked). A socket read partly is read again next pass, as with a
//! level-triggered epoll. A descriptor's slot carries the id it was registered under
//! (slot in the top 32 bits, a sequence number in the low 32): a completion of a poll
//! whose descriptor has been removed (its cancellation races the next event) names an id
//! that no longer matches, and is ignored.

use std::os::fd::{AsRawFd, RawFd};

use io_uring::{cqueue, opcode, types, IoUring};

/// Submission entries: arms and cancellations of one pass (more are submitted in turns).
const SQ_ENTRIES: u32 = 64;
/// Completion entries: at most one pending completion per armed poll and wake-up (an event
/// coalesces with one not yet posted); past that the kernel keeps them (overflow) and the
/// next pass flushes them.
const CQ_ENTRIES: u32 = 1024;
/// The user data of cancellations (their own completions are ignored).
const CANCEL: u64 = u64::MAX;

/// One descriptor's state in the ring.
struct Slot {
    /// The id it was registered under (0: the slot is free).
    id: u64,
    fd: RawFd,
    /// Data may be waiting: a poll completed since the reader last found the socket empty.
    maybe: bool,
    /// Its poll failed for good (not a cancellation): nothing is known, the reader reads
    /// every pass.
    unknown: bool,
}

/// A reactor's readiness ring and its descriptors.
pub(crate) struct UringReady {
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    /// Entries queued and not yet submitted.
    queued: bool,
    /// Slots whose multishot poll ended this pass, to arm again.
    rearm: Vec<u32>,
    /// Poll completions processed (each one wake-up of a socket), kernel entries made.
    pub(crate) events: u64,
    pub(crate) enters: u64,
    /// Multishot polls armed again after they ended.
    pub(crate) rearms: u64,
}

impl UringReady {
    /// A ring for readiness polls, or why there is none (an old kernel, a seccomp filter).
    pub(crate) fn new() -> std::io::Result<UringReady> {
        // Cooperative task running: a socket's wake-up does not interrupt the reactor (no
        // IPI); the kernel flags the work instead (IORING_SQ_TASKRUN), and the reactor's next
        // system call, whatever it is, runs it. Kernels before 5.19: the plain ring.
        // `RISER_READINESS=uring-ipi`: the plain ring (a wake-up interrupts the reactor to
        // post its completion), to compare the two.
        let coop = !std::env::var("RISER_READINESS").is_ok_and(|v| v == "uring-ipi");
        let coop_ring = if coop { IoUring::builder().setup_cqsize(CQ_ENTRIES).setup_coop_taskrun().setup_taskrun_flag().build(SQ_ENTRIES).ok() } else { None };
        let ring = match coop_ring {
            Some(r) => r,
            None => IoUring::builder().setup_cqsize(CQ_ENTRIES).build(SQ_ENTRIES)?,
        };
        let mut me = UringReady { ring, slots: Vec::new(), free: Vec::new(), live: 0, queued: false, rearm: Vec::new(), events: 0, enters: 0, rearms: 0 };
        // A ring whose multishot polls do not work (before 5.13) is no use: try one on an
        // eventfd that is readable at once.
        let efd = rustix::event::eventfd(1, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        me.push(opcode::PollAdd::new(types::Fd(efd.as_raw_fd()), libc::POLLIN as u32).multi(true).build().user_data(1));
        me.ring.submit_and_wait(1)?;
        let ok = me.ring.completion().next().map(|c| c.result() > 0 && cqueue::more(c.flags()));
        me.push(opcode::PollRemove::new(1).build().user_data(CANCEL));
        me.ring.submit_and_wait(1)?;
        // The cancellation's and the cancelled poll's completions.
        me.ring.completion().for_each(drop);
        if ok != Some(true) {
            return Err(std::io::Error::other(format!("multishot poll unsupported (first completion: {ok:?})")));
        }
        drop(efd);
        Ok(me)
    }

    /// Whether any descriptor is registered.
    pub(crate) fn any(&self) -> bool {
        self.live > 0
    }

    /// Queues an entry, submitting first when the submission queue is full.
    fn push(&mut self, e: io_uring::squeue::Entry) {
        loop {
            // SAFETY: the entries queued here (poll add, poll remove) hold no pointer: the
            // kernel reads only the descriptor number and the user data.
            #[allow(unsafe_code)]
            let r = unsafe { self.ring.submission().push(&e) };
            if r.is_ok() {
                self.queued = true;
                return;
            }
            if self.enter().is_err() {
                // The ring cannot take it now (ENOMEM, EBUSY): try again shortly.
                std::thread::yield_now();
            }
        }
    }

    fn enter(&mut self) -> std::io::Result<usize> {
        self.enters += 1;
        let r = self.ring.submit();
        if r.is_ok() {
            self.queued = false;
        }
        r
    }

    fn arm(&mut self, slot: usize) {
        let s = &self.slots[slot];
        let e = opcode::PollAdd::new(types::Fd(s.fd), libc::POLLIN as u32).multi(true).build().user_data(s.id);
        self.push(e);
    }

    /// Registers `fd` under a fresh id made of its slot and `seq`; arms its poll at once.
    /// Readable until the first pass shows otherwise (nothing is known yet).
    pub(crate) fn add(&mut self, fd: RawFd, seq: u64) -> u64 {
        let slot = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.slots.push(Slot { id: 0, fd: -1, maybe: false, unknown: false });
                self.slots.len() - 1
            }
        };
        let id = ((slot as u64 + 1) << 32) | (seq & 0xffff_ffff);
        self.slots[slot] = Slot { id, fd, maybe: true, unknown: false };
        self.live += 1;
        self.arm(slot);
        let _ = self.enter();
        id
    }

    fn slot_of(&self, id: u64) -> Option<usize> {
        let i = ((id >> 32) as usize).checked_sub(1)?;
        (self.slots.get(i)?.id == id).then_some(i)
    }

    /// Unregisters `id`: cancels its poll now (the poll holds the socket's file open:
    /// the descriptor's close would not end it). A completion that raced the
    /// cancellation finds the slot gone or reused under another id.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        let Some(i) = self.slot_of(id) else { return false };
        self.slots[i] = Slot { id: 0, fd: -1, maybe: false, unknown: false };
        self.free.push(i as u32);
        self.live -= 1;
        self.push(opcode::PollRemove::new(id).build().user_data(CANCEL));
        let _ = self.enter();
        true
    }

    /// The check of a pass: no system call unless something is pending.
    pub(crate) fn check(&mut self) {
        let (taskrun, overflow) = {
            let sq = self.ring.submission();
            (sq.taskrun(), sq.cq_overflow())
        };
        if self.queued || taskrun || overflow {
            // Runs the flagged task work (the polls' completions) and flushes an overflow.
            let _ = self.enter();
        }
        if overflow {
            // Completions were held back; a poll that could not post ended: each descriptor
            // counts as readable once.
            for s in self.slots.iter_mut().filter(|s| s.id != 0) {
                s.maybe = true;
            }
        }
        let mut cq = self.ring.completion();
        if cq.is_empty() {
            return;
        }
        for c in &mut cq {
            let ud = c.user_data();
            // A cancellation's own completion, or a removed descriptor's late one.
            let Some(i) = ((ud >> 32) as usize).checked_sub(1).filter(|&i| ud != CANCEL && self.slots.get(i).is_some_and(|s| s.id == ud)) else {
                continue;
            };
            self.events += 1;
            let s = &mut self.slots[i];
            s.maybe = true;
            if !cqueue::more(c.flags()) {
                let r = c.result();
                if r >= 0 || r == -libc::ECANCELED || r == -libc::ENOMEM || r == -libc::EAGAIN {
                    // The multishot poll ended (the completion queue overflowed, the kernel
                    // cancelled it): poll again, once out of the queue's borrow.
                    self.rearm.push(i as u32);
                } else {
                    // It failed for good (EBADF, EINVAL): its reader reads every pass.
                    s.unknown = true;
                }
            }
        }
        drop(cq);
        if !self.rearm.is_empty() {
            let mut todo = std::mem::take(&mut self.rearm);
            for &i in &todo {
                if self.slots[i as usize].id != 0 {
                    self.rearms += 1;
                    self.arm(i as usize);
                }
            }
            todo.clear();
            self.rearm = todo;
            let _ = self.enter();
        }
    }

    /// Whether descriptor `id` may have data: `None` when nothing is known.
    pub(crate) fn readable(&self, id: u64) -> Option<bool> {
        let s = &self.slots[self.slot_of(id)?];
        if s.unknown {
            return None;
        }
        Some(s.maybe)
    }

    /// Its reader found descriptor `id` empty: not readable until its next poll completion.
    pub(crate) fn drained(&mut self, id: u64) {
        if let Some(i) = self.slot_of(id) {
            self.slots[i].maybe = false;
        }
    }
}

#[cfg(test)]
#[path = "uring_tests.rs"]
mod tests;
