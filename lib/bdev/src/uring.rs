//! The io_uring engine of the file and block-device bdevs: one ring per thread (a reactor),
//! shared by every channel opened on that thread; a channel is a light handle (an index
//! into the ring's completion queues).
//!
//! * Submission: a channel's `submit` queues SQEs; the ring enters the kernel once per
//!   `poll` (all channels' SQEs together), or at once when the SQ is full.
//! * Completion: any channel's `poll` reaps every CQE of the ring and files each under its
//!   channel; then it returns its own. A channel dropped with I/O in flight leaves the
//!   ops (and their buffers) in the ring until the kernel is done with them. The ops and
//!   the channels' inboxes are a [`Router`]: an SQE's `user_data` is the op's [`Tag`]
//!   ([`USER_DATA`]), generation-checked when its CQE comes.
//! * Memory: data moves by O_DIRECT straight into and out of the caller's [`IoBuf`]; a
//!   pool buffer is registered once as an io_uring fixed buffer (a sparse table per ring,
//!   the slot recorded with the mapping through riser-buf's registrations, so a reused
//!   buffer is registered already) and then read and written with READ_FIXED /
//!   WRITE_FIXED. A buffer that is not suitably aligned (an adopted vector) goes through an
//!   aligned bounce buffer.
//! * Waking: a reactor in adaptive mode parks its thread when idle. After a run of polls
//!   that found I/O in flight and no completion, the ring enables its eventfd; a small
//!   thread blocked on that eventfd unparks the reactor when a completion arrives. While
//!   completions keep coming the eventfd stays disabled (IORING_CQ_EVENTFD_DISABLED), so
//!   a busy reactor pays nothing for it.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use io_uring::{opcode, squeue, types, IoUring};
use riser_reactor::{Router, Tag, TagLayout};

use crate::sq::{reap_batch, Backlog, REAP_BATCH};

use crate::io::{BdevError, IoBuf, IoCompletion, IoKind};

/// SQ entries per ring (the CQ is twice that; the kernel keeps overflowing CQEs).
const RING_ENTRIES: u32 = 512;
/// Fixed-buffer slots per ring (the kernel's limit is 16384).
const FIXED_SLOTS: u32 = 4096;
/// Buffers aligned to this go to the kernel as they are (pool buffers are page-aligned);
/// others are bounced. A page satisfies every device's O_DIRECT memory alignment.
const MEM_ALIGN: usize = 4096;
/// Polls with I/O in flight and no completion before the eventfd wakes the thread.
const IDLE_POLLS_BEFORE_WAKEUPS: u32 = 256;
/// An SQE's `user_data`: its op's slot, the slot's generation and the op's channel.
const USER_DATA: TagLayout = TagLayout::low(32, 16, 16);

/// What an op does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Read or write `len` bytes at `offset` (`done` of them so far).
    Rw,
    /// fallocate with this mode over `offset`, `len`.
    Fallocate(i32),
    /// fdatasync.
    Sync,
}

/// One I/O the ring has taken: everything the kernel may touch stays here until its CQE.
pub(crate) struct Op {
    pub chan: u32,
    pub tag: u64,
    pub kind: IoKind,
    pub file: Arc<File>,
    pub buf: Option<IoBuf>,
    /// The aligned buffer the kernel actually uses when `buf` is not aligned for O_DIRECT.
    bounce: Option<IoBuf>,
    pub offset: u64,
    pub len: u64,
    done: u64,
    /// Fixed-buffer slot of the buffer the kernel uses.
    fixed: Option<u16>,
    /// Durable before completion: RWF_DSYNC for writes, a data sync after fallocate.
    pub fua: bool,
    stage: Stage,
}

impl Op {
    pub fn rw(chan: u32, tag: u64, kind: IoKind, file: Arc<File>, buf: IoBuf, offset: u64, fua: bool) -> Op {
        let len = buf.len() as u64;
        Op { chan, tag, kind, file, buf: Some(buf), bounce: None, offset, len, done: 0, fixed: None, fua, stage: Stage::Rw }
    }

    #[allow(clippy::too_many_arguments)] // one per field of the operation
    pub fn fallocate(chan: u32, tag: u64, kind: IoKind, file: Arc<File>, mode: i32, offset: u64, len: u64, fua: bool) -> Op {
        Op { chan, tag, kind, file, buf: None, bounce: None, offset, len, done: 0, fixed: None, fua, stage: Stage::Fallocate(mode) }
    }

    pub fn sync(chan: u32, tag: u64, kind: IoKind, file: Arc<File>) -> Op {
        Op { chan, tag, kind, file, buf: None, bounce: None, offset: 0, len: 0, done: 0, fixed: None, fua: false, stage: Stage::Sync }
    }
}

/// Hands fixed-buffer slots back when riser-buf unmaps (or re-registers) a mapping.
struct SlotGuard {
    slot: u16,
    released: Arc<Mutex<Vec<u16>>>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.released.lock().unwrap_or_else(|p| p.into_inner()).push(self.slot);
    }
}

/// The ring's sparse fixed-buffer table.
struct Fixed {
    /// riser-buf's registration domain for this ring: odd, so never an RDMA PD's address.
    domain: usize,
    free: Vec<u16>,
    released: Arc<Mutex<Vec<u16>>>,
}

static NEXT_DOMAIN: AtomicUsize = AtomicUsize::new(0);

/// The thread that turns eventfd signals into unparks of the ring's thread.
struct Waker {
    efd: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
    enabled: bool,
}

/// Counters of a ring, for tests and diagnostics.
#[derive(Default)]
pub struct RingStats {
    /// Times the waker thread unparked the ring's thread.
    pub wakeups: AtomicU64,
    /// Reads and writes that used a registered (fixed) buffer, and those that did not.
    pub fixed_ios: AtomicU64,
    pub plain_ios: AtomicU64,
    /// Reads and writes that went through a bounce buffer (unaligned caller buffer).
    pub bounced: AtomicU64,
}

struct Inner {
    uring: IoUring,
    /// The ops in flight, and per channel (a route) its completions not yet returned.
    ops: Router<Op, IoCompletion>,
    /// SQEs that did not fit in the SQ yet.
    backlog: Backlog<squeue::Entry>,
    fixed: Option<Fixed>,
    waker: Option<Waker>,
    idle_polls: u32,
    stats: Arc<RingStats>,
}

/// One thread's ring.
pub(crate) struct Ring {
    inner: RefCell<Inner>,
}

thread_local! {
    static RING: RefCell<Option<Rc<Ring>>> = const { RefCell::new(None) };
}

fn errno_text(res: i32) -> String {
    io::Error::from_raw_os_error(-res).to_string()
}

impl Ring {
    /// This thread's ring, created on first use.
    pub fn current() -> io::Result<Rc<Ring>> {
        RING.with(|r| {
            let mut r = r.borrow_mut();
            if let Some(ring) = r.as_ref() {
                return Ok(ring.clone());
            }
            let ring = Rc::new(Ring::new()?);
            *r = Some(ring.clone());
            // On a reactor: its completions end the reactor's adaptive sleep. Before it
            // sleeps, the eventfd goes on if I/O is in flight (whatever the idle count).
            if let Some(w) = ring.inner.borrow().waker.as_ref() {
                let armed = riser_reactor::add_wake_fd(w.efd.as_fd(), || {
                    RING.with(|r| {
                        if let Some(ring) = r.borrow().as_ref() {
                            let mut i = ring.inner.borrow_mut();
                            if i.ops.in_use() > 0 {
                                i.set_eventfd(true);
                            }
                        }
                    })
                });
                if let Err(e) = armed {
                    log::warn!("io_uring: completions cannot end the reactor's sleep ({e}); it notices them when it wakes");
                }
            }
            Ok(ring)
        })
    }

    /// Whether io_uring works here (a ring can be set up), for a clear error at creation.
    /// Whether this kernel lets riser set up a ring. Tried on a short-lived thread of its
    /// own: a ring's teardown may notify the thread that made it, which then sees a
    /// blocking call with a timeout (the RPC thread's next read) fail with EINTR.
    pub fn probe() -> io::Result<()> {
        std::thread::Builder::new()
            .name("uring-probe".into())
            .spawn(|| IoUring::new(8).map(drop))?
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the io_uring probe thread panicked")))
    }

    fn new() -> io::Result<Ring> {
        let mut uring = IoUring::builder().setup_cqsize(RING_ENTRIES * 2).build(RING_ENTRIES)?;
        let fixed = match uring.submitter().register_buffers_sparse(FIXED_SLOTS) {
            Ok(()) => Some(Fixed {
                domain: (NEXT_DOMAIN.fetch_add(1, Ordering::Relaxed) << 1) | 1,
                free: (0..FIXED_SLOTS as u16).rev().collect(),
                released: Arc::new(Mutex::new(Vec::new())),
            }),
            Err(e) => {
                log::warn!("io_uring: no fixed buffers ({e}); I/O buffers are mapped per I/O");
                None
            }
        };
        let stats = Arc::new(RingStats::default());
        let waker = match start_waker(&uring, &stats) {
            Ok(w) => {
                // Off until the ring has waited a while (see the module doc).
                uring.completion().disable_eventfd();
                Some(w)
            }
            Err(e) => {
                log::warn!("io_uring: no completion wake-ups ({e}); an idle reactor notices completions when it wakes");
                None
            }
        };
        Ok(Ring {
            inner: RefCell::new(Inner {
                uring,
                ops: Router::new(USER_DATA, RING_ENTRIES as usize),
                backlog: Backlog::new(),
                fixed,
                waker,
                idle_polls: 0,
                stats,
            }),
        })
    }

    pub fn stats(&self) -> Arc<RingStats> {
        self.inner.borrow().stats.clone()
    }

    pub fn open_channel(&self) -> u32 {
        self.inner.borrow_mut().ops.inboxes_mut().open()
    }

    /// The channel is gone: its queued completions are dropped, and so are those of its
    /// ops still in flight when they come (its number is reused once they have).
    pub fn close_channel(&self, chan: u32) {
        self.inner.borrow_mut().ops.inboxes_mut().close(chan);
    }

    /// A completion that needs no kernel (a request that failed validation).
    pub fn complete_now(&self, chan: u32, c: IoCompletion) {
        self.inner.borrow_mut().ops.inboxes_mut().push(chan, c);
    }

    pub fn submit(&self, op: Op) {
        self.inner.borrow_mut().start(op);
    }

    /// Submits what is queued, reaps every completion, returns `chan`'s into `out`.
    pub fn poll(&self, chan: u32, out: &mut Vec<IoCompletion>) -> usize {
        let mut r = self.inner.borrow_mut();
        r.flush();
        r.reap();
        r.ops.inboxes_mut().drain(chan, out)
    }

    /// Ops in flight plus completions waiting, of `chan`.
    pub fn outstanding(&self, chan: u32) -> usize {
        self.inner.borrow().ops.inboxes().outstanding(chan)
    }
}

/// The counters of this thread's ring, if it has one.
pub fn thread_ring_stats() -> Option<Arc<RingStats>> {
    RING.with(|r| r.borrow().as_ref().map(|r| r.stats()))
}

fn start_waker(uring: &IoUring, stats: &Arc<RingStats>) -> io::Result<Waker> {
    let efd = Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?);
    uring.submitter().register_eventfd(efd.as_raw_fd())?;
    let stop = Arc::new(AtomicBool::new(false));
    // The reactor this ring belongs to (this thread), woken from its adaptive sleep.
    let reactor = riser_reactor::current_waker();
    let (e, s, st) = (efd.clone(), stop.clone(), stats.clone());
    let join = std::thread::Builder::new().name(format!("{}-uring-wake", std::thread::current().name().unwrap_or("bdev"))).spawn(move || {
        let mut b = [0u8; 8];
        loop {
            match rustix::io::read(e.as_fd(), &mut b) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
            if s.load(Ordering::Acquire) {
                break;
            }
            st.wakeups.fetch_add(1, Ordering::Relaxed);
            reactor.wake();
        }
    })?;
    Ok(Waker { efd, stop, join: Some(join), enabled: false })
}

impl Inner {
    fn set_eventfd(&mut self, on: bool) {
        let Some(w) = self.waker.as_mut() else { return };
        if w.enabled == on {
            return;
        }
        w.enabled = on;
        let cq = self.uring.completion();
        if on {
            cq.enable_eventfd();
        } else {
            cq.disable_eventfd();
        }
    }

    /// Stores `op`, prepares its SQE and queues it.
    fn start(&mut self, mut op: Op) {
        if op.stage == Stage::Rw {
            self.prepare_buffers(&mut op);
        }
        let chan = op.chan;
        match self.ops.reserve(chan, op) {
            Ok((tag, op)) => {
                let sqe = sqe_for(op, USER_DATA.encode(tag));
                self.queue(sqe);
            }
            Err(mut op) => {
                let result = Err(BdevError::Io("too many I/Os in flight on this thread's ring".into()));
                self.ops.inboxes_mut().push(chan, IoCompletion { tag: op.tag, kind: op.kind, result, buf: op.buf.take() });
            }
        }
    }

    fn queue(&mut self, sqe: squeue::Entry) {
        // SAFETY: every pointer in the SQE (buffer, length) belongs to an op stored in
        // `self.ops` until its CQE is reaped, so it stays valid while the kernel uses it.
        #[allow(unsafe_code)]
        unsafe {
            self.backlog.queue(&mut self.uring, sqe)
        };
    }

    /// Makes the op's buffer usable for O_DIRECT (bouncing it if not) and registers it as
    /// a fixed buffer if the table has room.
    fn prepare_buffers(&mut self, op: &mut Op) {
        let Some(buf) = op.buf.as_mut() else { return };
        let aligned = buf.capacity() > 0 && !buf.mapping_ptr().is_null() && (buf.as_ptr() as usize).is_multiple_of(MEM_ALIGN);
        if !aligned {
            let mut b = IoBuf::alloc(buf.len());
            if op.kind == IoKind::Write {
                b.as_mut_slice().copy_from_slice(buf.as_slice());
            }
            op.bounce = Some(b);
            self.stats.bounced.fetch_add(1, Ordering::Relaxed);
        }
        let Some(target) = op.bounce.as_mut().or(op.buf.as_mut()) else { return };
        op.fixed = self.fixed_slot(target);
        if op.fixed.is_some() {
            self.stats.fixed_ios.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.plain_ios.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The fixed-buffer slot of `buf`'s mapping, registering it on first use.
    fn fixed_slot(&mut self, buf: &mut IoBuf) -> Option<u16> {
        let fixed = self.fixed.as_mut()?;
        if let Some(k) = buf.reg_key(fixed.domain) {
            return u16::try_from(k).ok();
        }
        // Slots of mappings that went away: clear them, then reuse them.
        let released: Vec<u16> = std::mem::take(&mut *fixed.released.lock().unwrap_or_else(|p| p.into_inner()));
        for slot in released {
            let none = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
            // SAFETY: a null iovec clears the slot (a sparse table); no op uses it (its
            // mapping is gone, and an op holds its buffer until the CQE).
            #[allow(unsafe_code)]
            let _ = unsafe { self.uring.submitter().register_buffers_update(slot as u32, &[none], None) };
            fixed.free.push(slot);
        }
        let slot = fixed.free.pop()?;
        let base = buf.mapping_ptr();
        if base.is_null() {
            fixed.free.push(slot);
            return None;
        }
        let iov = libc::iovec { iov_base: base.cast(), iov_len: buf.capacity() };
        // SAFETY: the iovec is the buffer's whole mapping, alive now; riser-buf drops the
        // guard recorded below before it unmaps the mapping, and the guard frees the slot
        // (cleared before reuse), so the slot never names memory the ring may not use.
        #[allow(unsafe_code)]
        let r = unsafe { self.uring.submitter().register_buffers_update(slot as u32, &[iov], None) };
        match r {
            Ok(()) => {
                let guard = SlotGuard { slot, released: fixed.released.clone() };
                buf.add_registration(fixed.domain, slot as u32, Box::new(guard));
                Some(slot)
            }
            Err(e) => {
                log::warn!("io_uring: cannot register a fixed buffer ({e}); I/O buffers are mapped per I/O from now on");
                self.fixed = None;
                None
            }
        }
    }

    /// Pushes the backlog into the SQ and enters the kernel if anything is queued.
    fn flush(&mut self) {
        self.backlog.submit(&mut self.uring, false, "io_uring");
    }

    /// Reaps every CQE and files its completion (or resubmits the op's next step).
    fn reap(&mut self) {
        let mut got = 0;
        // Up to 64 at a time into an array (nothing allocated per poll), handled once the
        // completion queue is released.
        let mut cqes = [(0u64, 0i32); REAP_BATCH];
        loop {
            let n = reap_batch(&mut self.uring, &mut cqes);
            if n == 0 {
                break;
            }
            got += n;
            for &(ud, res) in &cqes[..n] {
                self.on_cqe(ud, res);
            }
        }
        if got > 0 {
            self.idle_polls = 0;
            self.set_eventfd(false);
            self.flush();
        } else if self.ops.in_use() > 0 {
            self.idle_polls = self.idle_polls.saturating_add(1);
            if self.idle_polls == IDLE_POLLS_BEFORE_WAKEUPS {
                self.set_eventfd(true);
            }
        }
    }

    fn on_cqe(&mut self, ud: u64, res: i32) {
        let tag = USER_DATA.decode(ud);
        let Some(op) = self.ops.get_mut(tag) else {
            log::error!("io_uring: completion for unknown op {tag:?}");
            return;
        };
        let result = match (op.stage, res) {
            (_, r) if r == -libc::EAGAIN || r == -libc::EINTR => return self.resubmit(tag),
            (Stage::Fallocate(_), r) if r == -libc::EOPNOTSUPP => Err(BdevError::Unsupported(op.kind)),
            (_, r) if r < 0 => Err(BdevError::Io(errno_text(r))),
            (Stage::Rw, 0) => Err(BdevError::Io(format!("short {:?} at byte {} of the device (end of file?)", op.kind, op.offset + op.done))),
            (Stage::Rw, n) => {
                op.done += n as u64;
                if op.done < op.len {
                    return self.resubmit(tag);
                }
                if let (IoKind::Read, Some(b), Some(buf)) = (op.kind, op.bounce.as_ref(), op.buf.as_mut()) {
                    buf.as_mut_slice().copy_from_slice(b.as_slice());
                }
                Ok(())
            }
            (Stage::Fallocate(_), _) if op.fua => {
                op.stage = Stage::Sync;
                return self.resubmit(tag);
            }
            (Stage::Fallocate(_) | Stage::Sync, _) => Ok(()),
        };
        self.ops.complete(tag, |mut op| IoCompletion { tag: op.tag, kind: op.kind, result, buf: op.buf.take() });
    }

    /// Queues the next step of the op `tag` names.
    fn resubmit(&mut self, tag: Tag) {
        let Some(op) = self.ops.get_mut(tag) else { return };
        let sqe = sqe_for(op, USER_DATA.encode(tag));
        self.queue(sqe);
    }
}

/// The SQE for the op's current step.
fn sqe_for(op: &mut Op, user_data: u64) -> squeue::Entry {
    let fd = types::Fd(op.file.as_raw_fd());
    let entry = match op.stage {
        Stage::Rw => {
            let done = op.done as usize;
            let left = (op.len - op.done) as u32;
            let offset = op.offset + op.done;
            let fixed = op.fixed;
            let b = match op.bounce.as_mut() {
                Some(b) => b,
                None => op.buf.as_mut().expect("a read or write op holds its buffer"),
            };
            // In bounds: `done < len == buf.len()`.
            let ptr = b.as_mut_slice()[done..].as_mut_ptr();
            match (op.kind, fixed) {
                (IoKind::Read, Some(i)) => opcode::ReadFixed::new(fd, ptr, left, i).offset(offset).build(),
                (IoKind::Read, None) => opcode::Read::new(fd, ptr, left).offset(offset).build(),
                (_, fixed) => {
                    let flags = if op.fua { libc::RWF_DSYNC } else { 0 };
                    match fixed {
                        Some(i) => opcode::WriteFixed::new(fd, ptr, left, i).offset(offset).rw_flags(flags).build(),
                        None => opcode::Write::new(fd, ptr, left).offset(offset).rw_flags(flags).build(),
                    }
                }
            }
        }
        Stage::Fallocate(mode) => opcode::Fallocate::new(fd, op.len).offset(op.offset).mode(mode).build(),
        Stage::Sync => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
    };
    entry.user_data(user_data)
}

impl Drop for Inner {
    /// The kernel may still write into buffers of ops in flight: wait for every CQE before
    /// the buffers (and the ring) go.
    fn drop(&mut self) {
        let mut spins = 0u32;
        while self.ops.in_use() > 0 {
            self.flush();
            if let Err(e) = self.uring.submit_and_wait(1) {
                if e.raw_os_error() != Some(libc::EINTR) {
                    spins += 1;
                }
            }
            self.reap();
            if spins > 1000 {
                // Leak the ops rather than free memory the kernel may still use.
                log::error!("io_uring: {} ops still in flight at ring teardown; leaking them", self.ops.in_use());
                self.ops.leak();
                break;
            }
        }
        if let Some(mut w) = self.waker.take() {
            w.stop.store(true, Ordering::Release);
            let _ = rustix::io::write(w.efd.as_fd(), &1u64.to_ne_bytes());
            if let Some(j) = w.join.take() {
                let _ = j.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CQE whose `user_data` names no op in flight (a stale generation, a slot never
    /// used) is counted and dropped; a closed channel's number waits for its ops.
    #[test]
    fn stale_completions_are_dropped_and_a_channel_waits_for_its_ops() {
        let ring = Ring::new().expect("io_uring is available here");
        let dir = std::env::temp_dir().join(format!("riser-uring-route-{}", std::process::id()));
        let file = Arc::new(File::create(&dir).unwrap());
        let a = ring.open_channel();
        ring.submit(Op::sync(a, 7, IoKind::Flush, file.clone()));
        // Forged completions: slot 0 under the wrong generation, and a slot never used.
        ring.inner.borrow_mut().on_cqe(USER_DATA.encode(Tag { slot: 0, gen: 9, route: a }), 0);
        ring.inner.borrow_mut().on_cqe(USER_DATA.encode(Tag { slot: 4000, gen: 1, route: a }), 0);
        assert_eq!(ring.inner.borrow().ops.stale(), 2);
        assert_eq!(ring.outstanding(a), 1, "the real op is still in flight");
        ring.close_channel(a);
        let b = ring.open_channel();
        assert_ne!(a, b, "not reused while its op is in flight");
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ring.inner.borrow().ops.in_use() > 0 && std::time::Instant::now() < deadline {
            ring.poll(b, &mut out);
        }
        assert!(out.is_empty(), "the closed channel's completion went nowhere");
        assert_eq!(ring.open_channel(), a, "reused once its op is back");
        let _ = std::fs::remove_file(&dir);
    }
}
