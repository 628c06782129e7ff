//! What ends a reactor's adaptive sleep (its epoll set of wake-up descriptors) and the
//! per-pass readiness of the sockets among them (`add_ready_fd`, `fd_readable`).

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use rustix::event::epoll;

use crate::ready::Ready;

thread_local! {
    /// On a reactor thread: what ends its adaptive sleep.
    pub(crate) static WAKE: RefCell<Option<WakeSet>> = const { RefCell::new(None) };
}

/// The descriptors that end a reactor's adaptive sleep: its eventfd (data 0) and those
/// registered with [`add_wake_fd`], in one epoll set.
pub(crate) struct WakeSet {
    epoll: OwnedFd,
    sources: Vec<WakeSource>,
    next_id: u64,
    /// Sources registered with [`add_ready_fd`]: while there are any, each pass starts with
    /// one readiness check of the whole set ([`Readiness::check`]).
    checked: usize,
    ready: Ready,
}

/// Registers `fd` (level-triggered, readable) as a reason to end the calling reactor's
/// adaptive sleep: a socket, an RDMA completion channel, an eventfd. Before the reactor
/// sleeps it calls `arm` (e.g. to drain a completion channel and request the next event,
/// or to switch an io_uring's eventfd on), then polls once more, so work that came in before
/// arming is not slept on. The owner keeps `fd` open until [`remove_wake_fd`]. Busy-polling
/// reactors never sleep and never call `arm`. Off a reactor thread: `Ok(None)`.
pub fn add_wake_fd(fd: BorrowedFd<'_>, arm: impl FnMut() + 'static) -> std::io::Result<Option<WakeId>> {
    add_source(fd, Box::new(arm), false)
}

/// [`add_wake_fd`], and the reactor checks the readiness of such descriptors (sockets) once
/// at the start of every pass: [`fd_readable`] then tells a poller whether reading it can
/// find anything, so a pass reads only the sockets with data. The check is an io_uring
/// multishot poll per descriptor whose completions a pass finds in memory shared with the
/// kernel: no system call on a pass with nothing new. Where io_uring is unavailable (or
/// `RISER_READINESS=epoll`), one `epoll_wait` (timeout 0) of the whole set per pass, while
/// two or more such descriptors are registered. The reader calls [`fd_drained`] when a read
/// found the descriptor empty (`EAGAIN`, or fewer bytes than asked): until then it stays
/// readable, as a socket read only partly must be read again.
pub fn add_ready_fd(fd: BorrowedFd<'_>, arm: impl FnMut() + 'static) -> std::io::Result<Option<WakeId>> {
    add_source(fd, Box::new(arm), true)
}

fn add_source(fd: BorrowedFd<'_>, arm: Box<dyn FnMut()>, checked: bool) -> std::io::Result<Option<WakeId>> {
    WAKE.with(|w| {
        let mut w = w.borrow_mut();
        let Some(w) = w.as_mut() else { return Ok(None) };
        w.next_id += 1;
        let id = WakeId(if checked { w.ready.add(fd.as_raw_fd(), w.next_id) } else { w.next_id });
        let data = epoll::EventData::new_u64(id.0);
        match epoll::add(&w.epoll, fd, data, epoll::EventFlags::IN) {
            // A closed descriptor whose number came back (a dup kept it in the set).
            Err(rustix::io::Errno::EXIST) => epoll::modify(&w.epoll, fd, data, epoll::EventFlags::IN)?,
            r => {
                if let Err(e) = r {
                    if checked {
                        w.ready.remove(id.0);
                    }
                    return Err(e.into());
                }
            }
        }
        w.sources.push(WakeSource { id, fd: fd.as_raw_fd(), arm, checked });
        w.checked += usize::from(checked);
        Ok(Some(id))
    })
}

impl WakeSet {
    pub(crate) fn new(epoll: OwnedFd) -> WakeSet {
        WakeSet { epoll, sources: Vec::new(), next_id: 0, checked: 0, ready: Ready::new() }
    }
}

/// Whether descriptor `id` (of [`add_ready_fd`], on the calling reactor) was readable (or
/// hung up, or in error) at the readiness check that started this pass. `None` when nothing
/// is known: off a reactor thread, the check failed, or `id` came after it (read it).
pub fn fd_readable(id: WakeId) -> Option<bool> {
    WAKE.with(|w| w.borrow().as_ref().and_then(|w| w.ready.readable(id)))
}

/// The reader of descriptor `id` (of [`add_ready_fd`]) found it empty: a read returned
/// `EAGAIN` or fewer bytes than asked. [`fd_readable`] says `Some(false)` from the next pass
/// until data comes in again.
pub fn fd_drained(id: WakeId) {
    WAKE.with(|w| {
        if let Some(w) = w.borrow_mut().as_mut() {
            w.ready.drained(id)
        }
    })
}

/// Makes the calling reactor check its sockets' readiness with `epoll_wait` rather than
/// io_uring (before its first [`add_ready_fd`]; tests of the fallback). Whether it does.
#[doc(hidden)]
pub fn force_epoll_readiness() -> bool {
    WAKE.with(|w| w.borrow_mut().as_mut().is_some_and(|w| w.ready.force_epoll()))
}

/// Whether the calling reactor checks its sockets' readiness through io_uring.
pub fn uring_readiness() -> bool {
    WAKE.with(|w| w.borrow().as_ref().is_some_and(|w| w.ready.uring()))
}

/// The readiness check at the start of a pass (see [`add_ready_fd`]).
pub(crate) fn check_readiness() {
    WAKE.with(|w| {
        if let Some(w) = w.borrow_mut().as_mut() {
            w.ready.check(&w.epoll, w.checked, w.next_id);
        }
    })
}

/// Unregisters a descriptor of [`add_wake_fd`] (on the reactor that registered it);
/// call it before closing the descriptor.
pub fn remove_wake_fd(id: WakeId) {
    WAKE.with(|w| {
        let mut w = w.borrow_mut();
        let Some(w) = w.as_mut() else { return };
        if let Some(i) = w.sources.iter().position(|s| s.id == id) {
            let s = w.sources.swap_remove(i);
            w.checked -= usize::from(s.checked);
            if s.checked {
                w.ready.remove(id.0);
            }
            // SAFETY: the owner promised to keep `s.fd` open until this call.
            #[allow(unsafe_code)]
            let fd = unsafe { BorrowedFd::borrow_raw(s.fd) };
            // ENOENT/EBADF: the descriptor was closed first, which removed it already.
            let _ = epoll::delete(&w.epoll, fd);
        }
    })
}

thread_local! {
    /// On a reactor thread: how many [`SignalledWait`]s are on.
    static SIGNALLED: Cell<usize> = const { Cell::new(0) };
}

/// A poller's statement that it has work in flight whose end a descriptor of the reactor's
/// wake set signals by itself (librbd's completion eventfd), and nothing else to poll for.
/// While any is on, an adaptive reactor with nothing to do sleeps at once and up to
/// [`SIGNALLED_SLEEP`], instead of spinning first and waking every millisecond at most: a
/// Ceph write's milliseconds cost the reactor one sleep instead of a dozen wake-ups (on a
/// small machine, CPU the cluster needs). Owned by the poller (not `Send`: it counts on the
/// thread that sets it); dropping it turns it off.
#[derive(Debug, Default)]
pub struct SignalledWait {
    on: bool,
    _thread_bound: PhantomData<*const ()>,
}

impl SignalledWait {
    /// On while the poller's only work is signalled work in flight; off otherwise.
    pub fn set(&mut self, on: bool) {
        if on != self.on {
            self.on = on;
            let _ = SIGNALLED.try_with(|c| c.set(if on { c.get() + 1 } else { c.get().saturating_sub(1) }));
        }
    }
}

impl Drop for SignalledWait {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// The longest adaptive sleep while a [`SignalledWait`] is on: a safety net for anything
/// on the reactor whose work no descriptor signals.
pub(crate) const SIGNALLED_SLEEP: Duration = Duration::from_millis(10);

/// Whether any [`SignalledWait`] of the calling thread is on.
pub(crate) fn signalled_waits() -> bool {
    SIGNALLED.try_with(|c| c.get() > 0).unwrap_or(false)
}

/// Calls every source's `arm`; whether there is any. An `arm` may register or remove
/// sources.
pub(crate) fn arm_wake_sources() -> bool {
    let mut sources = WAKE.with(|w| w.borrow_mut().as_mut().map(|w| std::mem::take(&mut w.sources)).unwrap_or_default());
    for s in sources.iter_mut() {
        (s.arm)();
    }
    let any = !sources.is_empty();
    WAKE.with(|w| {
        if let Some(w) = w.borrow_mut().as_mut() {
            sources.append(&mut w.sources);
            w.sources = sources;
        }
    });
    any
}

/// Identifies a descriptor registered with [`Ctx::add_wake_fd`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WakeId(pub(crate) u64);

struct WakeSource {
    id: WakeId,
    fd: RawFd,
    arm: Box<dyn FnMut()>,
    /// Registered with [`add_ready_fd`].
    checked: bool,
}


/// Sleeps until `fd` is readable or `timeout` has passed (ppoll: a timeout finer than
/// epoll_wait's milliseconds). An epoll descriptor is readable while any of its set is.
/// Whether it became readable.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: one valid pollfd and a valid timespec, both alive for the call; no signal mask.
    #[allow(unsafe_code)]
    let n = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
    n > 0
}

