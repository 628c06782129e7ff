//! What the file ring (`uring.rs`) and the NVMe passthrough ring (`nvme/ring.rs`) share: a
//! submission queue that never refuses an entry (a backlog takes what the ring has no room
//! for) and reaping completions without allocating.

use std::collections::VecDeque;

use io_uring::{cqueue, squeue, IoUring};

/// How many completions one reaping step takes out of the ring at most.
pub(crate) const REAP_BATCH: usize = 64;

/// Entries waiting for room in the submission queue, in order.
pub(crate) struct Backlog<S>(VecDeque<S>);

impl<S: squeue::EntryMarker> Backlog<S> {
    pub(crate) fn new() -> Self {
        Backlog(VecDeque::new())
    }

    /// Puts `sqe` into the ring's submission queue, behind anything already waiting: when
    /// the queue is full the kernel gets what it has and `sqe` one more try, then it waits
    /// here for [`Backlog::drain`].
    ///
    /// # Safety
    ///
    /// Every address in `sqe` (buffers, commands, ranges) must stay valid until the ring
    /// reaps its completion.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn queue<C: cqueue::EntryMarker>(&mut self, uring: &mut IoUring<S, C>, sqe: S) {
        if self.0.is_empty() {
            // SAFETY: the caller keeps what `sqe` points to until its completion.
            if unsafe { uring.submission().push(&sqe) }.is_ok() {
                return;
            }
            let _ = uring.submit();
            // SAFETY: as above.
            if unsafe { uring.submission().push(&sqe) }.is_ok() {
                return;
            }
        }
        self.0.push_back(sqe);
    }

    /// Moves waiting entries into the submission queue while it has room (entering the
    /// kernel once when it is full).
    fn drain<C: cqueue::EntryMarker>(&mut self, uring: &mut IoUring<S, C>) {
        while let Some(sqe) = self.0.front() {
            // SAFETY: entries only get here through `queue`, whose caller promised their
            // addresses stay valid until their completions.
            #[allow(unsafe_code)]
            let pushed = unsafe { uring.submission().push(sqe) };
            if pushed.is_err() {
                let _ = uring.submit();
                // SAFETY: as above.
                #[allow(unsafe_code)]
                let again = unsafe { uring.submission().push(sqe) };
                if again.is_err() {
                    break;
                }
            }
            self.0.pop_front();
        }
    }

    /// [`Backlog::drain`], then enters the kernel when anything is queued, or always when
    /// `enter` (an IOPOLL ring polls its device's completions by entering). Busy and
    /// interrupted enters are retried by the next pass; any other error is logged.
    pub(crate) fn submit<C: cqueue::EntryMarker>(&mut self, uring: &mut IoUring<S, C>, enter: bool, ring: &str) {
        self.drain(uring);
        if uring.submission().is_empty() && !enter {
            return;
        }
        if let Err(e) = uring.submit() {
            if !matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN | libc::EINTR)) {
                log::error!("{ring}: submit failed: {e}");
            }
        }
    }
}

/// Takes up to [`REAP_BATCH`] completions out of `uring` into `out` as (user data, result),
/// releasing the completion queue before the caller handles them; returns how many.
pub(crate) fn reap_batch<S: squeue::EntryMarker, C: cqueue::EntryMarker>(uring: &mut IoUring<S, C>, out: &mut [(u64, i32); REAP_BATCH]) -> usize {
    let mut n = 0;
    for (slot, c) in out.iter_mut().zip(uring.completion()) {
        let c: cqueue::Entry = c.into();
        *slot = (c.user_data(), c.result());
        n += 1;
    }
    n
}
