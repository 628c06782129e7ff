//! The NVMe passthrough ring: io_uring with 128-byte SQEs and 32-byte CQEs carrying NVMe
//! commands (`IORING_OP_URING_CMD`, `NVME_URING_CMD_IO`) to a namespace's generic char device
//! /dev/ngXnY, one ring per thread (a reactor), shared by every NVMe channel opened on it.
//!
//! With IOPOLL the ring's commands go to the driver's poll queues (`nvme.poll_queues`) and
//! complete only when polled: every [`PtRing::poll`] enters the kernel with GETEVENTS, which
//! polls the NVMe completion queue once without sleeping; the reactor's loop is the poller.
//! Without IOPOLL the commands go to interrupt-driven queues and completions appear in the CQ
//! by themselves. An IOPOLL ring cannot carry the file engine's buffered or non-pollable I/O,
//! so this ring is separate from [`crate::uring`]'s.
//!
//! An I/O may need several NVMe commands (transfer size limits, 16-bit block counts,
//! 256 DSM ranges): they are all submitted at once and the I/O completes when the last one
//! does, with the first error. A FUA deallocate is followed by a Flush.
//!
//! The ops in flight and the channels' inboxes are a [`Router`]: a command's `user_data` is
//! its op's [`Tag`] with the command's index in the op above it ([`USER_DATA`]).

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use riser_reactor::{Router, Tag, TagLayout};

use crate::sq::{reap_batch, Backlog, REAP_BATCH};

use super::cmd::{status_text, NvmeCmd, NVME_URING_CMD_IO};
use crate::io::{BdevError, IoBuf, IoCompletion, IoKind};

const RING_ENTRIES: u32 = 256;
/// A command's `user_data`: its op's slot, the slot's generation and the op's channel in
/// the low 48 bits, the command's index in the op in the 16 above.
const USER_DATA: TagLayout = TagLayout::low(20, 12, 16);

type Uring = IoUring<squeue::Entry128, cqueue::Entry32>;

/// Counters of one namespace's I/O path, for `bdev_get_bdevs` and tests.
#[derive(Default, Debug)]
pub struct PathStats {
    /// NVMe commands completed through passthrough.
    pub commands: AtomicU64,
    /// Of those, the ones reaped by polling an IOPOLL ring (poll queues)...
    pub polled: AtomicU64,
    /// ... and the ones completed by interrupt (no poll queues, or a command without data).
    pub interrupt: AtomicU64,
    /// Commands that failed (device status or errno).
    pub errors: AtomicU64,
}

/// One I/O: its buffers, which the kernel may use, stay here until its last CQE.
pub(crate) struct PtOp {
    pub chan: u32,
    pub tag: u64,
    pub kind: IoKind,
    pub file: Arc<File>,
    pub buf: Option<IoBuf>,
    /// Dataset Management range descriptors the commands point into.
    pub dsm: Option<Vec<u8>>,
    /// The commands (their addresses point into `buf` or `dsm`, heap memory that does not
    /// move with the op).
    pub cmds: Vec<NvmeCmd>,
    /// Flush this namespace after the commands (a FUA deallocate).
    pub flush_after: Option<u32>,
    pub stats: Arc<PathStats>,
    pending: usize,
    err: Option<BdevError>,
}

impl PtOp {
    pub fn new(chan: u32, tag: u64, kind: IoKind, file: Arc<File>, buf: Option<IoBuf>, stats: Arc<PathStats>) -> PtOp {
        PtOp { chan, tag, kind, file, buf, dsm: None, cmds: Vec::new(), flush_after: None, stats, pending: 0, err: None }
    }
}

struct Inner {
    uring: Uring,
    polled: bool,
    /// The ops in flight, and per channel (a route) its completions not yet returned. A
    /// closed channel's route is reused only once its last I/O is back, so no completion
    /// reaches a newer channel.
    ops: Router<PtOp, IoCompletion>,
    backlog: Backlog<squeue::Entry128>,
}

/// One thread's passthrough ring.
pub(crate) struct PtRing {
    inner: RefCell<Inner>,
}

thread_local! {
    /// [interrupt-driven, polled]
    static RINGS: RefCell<[Option<Rc<PtRing>>; 2]> = const { RefCell::new([None, None]) };
}

fn new_uring(polled: bool, entries: u32) -> io::Result<Uring> {
    let mut b = IoUring::<squeue::Entry128, cqueue::Entry32>::builder();
    b.setup_cqsize(entries * 2);
    if polled {
        b.setup_iopoll();
    }
    b.build(entries)
}

/// The `user_data` of command `sub` of the op `tag` names.
fn user_data(tag: Tag, sub: usize) -> u64 {
    USER_DATA.pack(tag, (sub as u64) << USER_DATA.width())
}

/// The op's tag and the command's index in a `user_data`.
fn split_user_data(ud: u64) -> (Tag, usize) {
    let (tag, rest) = USER_DATA.unpack(ud);
    (tag, (rest >> USER_DATA.width()) as usize)
}

/// The SQE of a command, with `user_data`.
fn sqe(file: &File, cmd: &NvmeCmd, user_data: u64) -> squeue::Entry128 {
    opcode::UringCmd80::new(types::Fd(file.as_raw_fd()), NVME_URING_CMD_IO).cmd(cmd.to_bytes()).build().user_data(user_data)
}

fn result_of(res: i32) -> Result<(), BdevError> {
    match res {
        0 => Ok(()),
        r if r < 0 => Err(BdevError::Io(io::Error::from_raw_os_error(-r).to_string())),
        s => Err(BdevError::Io(status_text(s))),
    }
}

impl PtRing {
    /// This thread's ring of that kind, created on first use.
    pub fn current(polled: bool) -> io::Result<Rc<PtRing>> {
        RINGS.with(|r| {
            let mut r = r.borrow_mut();
            let slot = &mut r[polled as usize];
            if let Some(ring) = slot.as_ref() {
                return Ok(ring.clone());
            }
            let uring = new_uring(polled, RING_ENTRIES)?;
            let ring = Rc::new(PtRing {
                inner: RefCell::new(Inner {
                    uring,
                    polled,
                    ops: Router::new(USER_DATA, RING_ENTRIES as usize),
                    backlog: Backlog::new(),
                }),
            });
            *slot = Some(ring.clone());
            Ok(ring)
        })
    }

    pub fn open_channel(&self) -> u32 {
        self.inner.borrow_mut().ops.inboxes_mut().open()
    }

    /// The channel is gone: its queued completions are dropped, and so are those of its
    /// I/Os still in flight when they come.
    pub fn close_channel(&self, chan: u32) {
        self.inner.borrow_mut().ops.inboxes_mut().close(chan);
    }

    pub fn complete_now(&self, chan: u32, c: IoCompletion) {
        self.inner.borrow_mut().ops.inboxes_mut().push(chan, c);
    }

    pub fn submit(&self, op: PtOp) {
        self.inner.borrow_mut().start(op);
    }

    /// Submits what is queued, polls (IOPOLL) or reaps the CQ, returns `chan`'s completions.
    pub fn poll(&self, chan: u32, out: &mut Vec<IoCompletion>) -> usize {
        let mut r = self.inner.borrow_mut();
        r.flush();
        r.reap();
        r.ops.inboxes_mut().drain(chan, out)
    }

    pub fn outstanding(&self, chan: u32) -> usize {
        self.inner.borrow().ops.inboxes().outstanding(chan)
    }
}

impl Inner {
    fn start(&mut self, mut op: PtOp) {
        op.pending = op.cmds.len();
        let chan = op.chan;
        let (tag, op) = match self.ops.reserve(chan, op) {
            Ok(r) => r,
            Err(mut op) => {
                let result = Err(BdevError::Io("too many I/Os in flight on this thread's NVMe ring".into()));
                return self.ops.inboxes_mut().push(chan, IoCompletion { tag: op.tag, kind: op.kind, result, buf: op.buf.take() });
            }
        };
        if op.cmds.is_empty() {
            // Nothing for the device (a Flush of a namespace without a cache was turned into
            // a Flush command by the channel, so this is a zero-length I/O).
            return self.finish(tag);
        }
        let sqes: Vec<squeue::Entry128> = op.cmds.iter().enumerate().map(|(i, c)| sqe(&op.file, c, user_data(tag, i))).collect();
        for s in sqes {
            self.queue(s);
        }
    }

    fn queue(&mut self, sqe: squeue::Entry128) {
        // SAFETY: the addresses in the command point into the op's buffer or DSM ranges,
        // which `self.ops` keeps (heap memory, never moved) until the op's last CQE.
        #[allow(unsafe_code)]
        unsafe {
            self.backlog.queue(&mut self.uring, sqe)
        };
    }

    fn flush(&mut self) {
        // IOPOLL: an enter with GETEVENTS (the crate adds it for IOPOLL rings) is what polls
        // the device's completion queue, so enter whenever anything is in flight.
        let enter = self.polled && self.ops.in_use() > 0;
        self.backlog.submit(&mut self.uring, enter, "NVMe passthrough ring");
    }

    fn reap(&mut self) {
        let mut got = 0;
        let mut cqes = [(0u64, 0i32); REAP_BATCH];
        loop {
            let n = reap_batch(&mut self.uring, &mut cqes);
            if n == 0 {
                break;
            }
            got += n;
            for &(ud, res) in &cqes[..n] {
                let (tag, sub) = split_user_data(ud);
                self.on_cqe(tag, sub, res);
            }
        }
        if got > 0 {
            self.flush();
        }
    }

    fn on_cqe(&mut self, tag: Tag, sub: usize, res: i32) {
        let polled = self.polled;
        let Some(op) = self.ops.get_mut(tag) else {
            log::error!("NVMe passthrough: completion for unknown op {tag:?}");
            return;
        };
        if res == -libc::EAGAIN || res == -libc::EINTR {
            // No request could be allocated (queue full): send it again.
            if let Some(c) = op.cmds.get(sub).copied() {
                let s = sqe(&op.file, &c, user_data(tag, sub));
                self.queue(s);
                return;
            }
        }
        op.stats.commands.fetch_add(1, Ordering::Relaxed);
        if !polled {
            op.stats.interrupt.fetch_add(1, Ordering::Relaxed);
        } else {
            op.stats.polled.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = result_of(res) {
            op.stats.errors.fetch_add(1, Ordering::Relaxed);
            log::warn!("NVMe {:?} (tag {}): {e}", op.kind, op.tag);
            op.err.get_or_insert(e);
        }
        op.pending = op.pending.saturating_sub(1);
        if op.pending > 0 {
            return;
        }
        if op.err.is_none() {
            if let Some(nsid) = op.flush_after.take() {
                op.cmds = vec![NvmeCmd::flush(nsid)];
                op.pending = 1;
                let s = sqe(&op.file, &op.cmds[0], user_data(tag, 0));
                self.queue(s);
                return;
            }
        }
        self.finish(tag);
    }

    fn finish(&mut self, tag: Tag) {
        self.ops.complete(tag, |mut op| {
            let result = match op.err.take() {
                Some(e) => Err(e),
                None => Ok(()),
            };
            IoCompletion { tag: op.tag, kind: op.kind, result, buf: op.buf.take() }
        });
    }
}

impl Drop for Inner {
    /// The device may still write into buffers of commands in flight: wait for every CQE.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.ops.in_use() > 0 {
            self.flush();
            let _ = if self.polled { self.uring.submit() } else { self.uring.submit_and_wait(1) };
            self.reap();
            if Instant::now() > deadline {
                log::error!("NVMe passthrough: {} I/Os still in flight at ring teardown; leaking them", self.ops.in_use());
                self.ops.leak();
                break;
            }
        }
    }
}

/// Runs one command through a ring of its own on the calling thread and waits (at most
/// `timeout`) for its result: 0, a negative errno or a positive NVMe status. For probes at
/// attach time. The buffer `cmd` points into must be `keep`, which is leaked if the
/// command does not complete in time (the device may still write into it).
pub(crate) fn run_one(file: &File, cmd: &NvmeCmd, polled: bool, keep: IoBuf, timeout: Duration) -> io::Result<(i32, IoBuf)> {
    let mut uring = new_uring(polled, 4)?;
    let s = sqe(file, cmd, 0);
    // SAFETY: the command's buffer is `keep`, which lives until the CQE arrives (or is
    // leaked below when it never does).
    #[allow(unsafe_code)]
    let pushed = unsafe { uring.submission().push(&s) };
    pushed.map_err(|_| io::Error::other("submission queue full"))?;
    uring.submit()?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(c) = uring.completion().next() {
            return Ok((c.result(), keep));
        }
        if Instant::now() > deadline {
            std::mem::forget(keep);
            std::mem::forget(uring);
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no completion"));
        }
        if polled {
            let _ = uring.submit(); // polls once
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring's plumbing on a host without NVMe: a passthrough command to a file that is
    /// not an NVMe generic device completes with the kernel's refusal, through the channel,
    /// exactly once, on an interrupt-driven ring and on an IOPOLL ring.
    #[test]
    fn a_command_the_file_refuses_completes_with_its_error() {
        if IoUring::new(2).is_err() {
            panic!("io_uring is not available here");
        }
        for polled in [false, true] {
            // /dev/zero: no uring_cmd (recent kernels give /dev/null one that succeeds).
            let f = Arc::new(File::open("/dev/zero").unwrap());
            let stats = Arc::new(PathStats::default());
            let ring = PtRing::current(polled).unwrap();
            let chan = ring.open_channel();
            let mut buf = IoBuf::alloc(4096);
            let addr = buf.as_mut_slice().as_mut_ptr() as u64;
            let mut op = PtOp::new(chan, 42, IoKind::Read, f.clone(), Some(buf), stats.clone());
            op.cmds = vec![NvmeCmd::rw(false, 1, 0, 8, addr, 4096, false), NvmeCmd::rw(false, 1, 8, 8, addr, 4096, false)];
            ring.submit(op);
            assert_eq!(ring.outstanding(chan), 1);
            let mut out = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while out.is_empty() && Instant::now() < deadline {
                ring.poll(chan, &mut out);
            }
            assert_eq!(out.len(), 1, "polled {polled}");
            assert_eq!(out[0].tag, 42);
            assert!(matches!(&out[0].result, Err(BdevError::Io(_))), "{:?}", out[0].result);
            assert!(out[0].buf.is_some(), "the buffer comes back");
            assert_eq!(ring.outstanding(chan), 0);
            assert_eq!(stats.commands.load(Ordering::Relaxed), 2);
            assert_eq!(stats.errors.load(Ordering::Relaxed), 2);
            ring.close_channel(chan);
            // A probe sees the refusal as a negative errno.
            let mut b = IoBuf::alloc(512);
            let cmd = NvmeCmd::rw(false, 1, 0, 1, b.as_mut_slice().as_mut_ptr() as u64, 512, false);
            let (res, _) = run_one(&f, &cmd, polled, b, Duration::from_secs(10)).unwrap();
            assert!(res < 0, "{res}");
        }
    }
}
