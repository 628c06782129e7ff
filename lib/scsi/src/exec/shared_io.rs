//! One bdev I/O channel per block device and reactor thread, shared by every LUN channel
//! (every connection) of that thread on that device: a device opens its channel (an RBD
//! image handle, a ring slot, a queue) once per reactor, not once per connection.
//!
//! Each LUN channel gets an id; its I/Os carry the id in the top 16 bits of their tag, and
//! whoever polls the shared channel sorts the completions into each id's queue. An id is
//! reused only once every I/O of its last owner has come back, so a late completion never
//! reaches a new owner.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use riser_bdev::{Bdev, BdevIo, IoChannel, IoCompletion};

/// Bits of a tag left to its LUN channel (slot and piece); the id is above them.
const ID_SHIFT: u32 = 48;
const LOW_MASK: u64 = (1 << ID_SHIFT) - 1;

struct Shared {
    io: Box<dyn IoChannel>,
    /// Per id: completions not yet taken, I/Os in flight, whether its owner is gone.
    queues: Vec<Queue>,
    free: Vec<usize>,
    scratch: Vec<IoCompletion>,
}

#[derive(Default)]
struct Queue {
    done: Vec<IoCompletion>,
    inflight: usize,
    closed: bool,
}

thread_local! {
    /// This thread's shared channels, by device (the `Arc`'s address, and the device itself
    /// to tell a new device at a reused address); neither kept alive by the map.
    static CHANNELS: RefCell<HashMap<usize, ChannelEntry>> = RefCell::new(HashMap::new());
}

/// A [`CHANNELS`] entry: the device (to tell a new one at a reused address) and the channel.
type ChannelEntry = (std::sync::Weak<dyn Bdev>, Weak<RefCell<Shared>>);

/// A LUN channel's handle on its thread's channel to a device.
pub(crate) struct IoHandle {
    shared: Rc<RefCell<Shared>>,
    id: usize,
}

impl IoHandle {
    /// The calling thread's channel to `bdev` (opened on first use), under a new id.
    pub(crate) fn open(bdev: &Arc<dyn Bdev>) -> IoHandle {
        let key = Arc::as_ptr(bdev) as *const () as usize;
        let shared = CHANNELS.with(|m| {
            let mut m = m.borrow_mut();
            m.retain(|_, (_, w)| w.strong_count() > 0);
            match m.get(&key).and_then(|(b, w)| if std::sync::Weak::ptr_eq(b, &Arc::downgrade(bdev)) { w.upgrade() } else { None }) {
                Some(s) => s,
                None => {
                    let s = Rc::new(RefCell::new(Shared { io: bdev.clone().open_channel(), queues: Vec::new(), free: Vec::new(), scratch: Vec::new() }));
                    m.insert(key, (Arc::downgrade(bdev), Rc::downgrade(&s)));
                    s
                }
            }
        });
        let id = {
            let mut s = shared.borrow_mut();
            match s.free.pop() {
                Some(id) => {
                    s.queues[id] = Queue::default();
                    id
                }
                None => {
                    s.queues.push(Queue::default());
                    s.queues.len() - 1
                }
            }
        };
        IoHandle { shared, id }
    }

    pub(crate) fn submit(&mut self, mut io: BdevIo) {
        debug_assert!(io.tag >> ID_SHIFT == 0, "tag {:#x} uses the id bits", io.tag);
        io.tag = (io.tag & LOW_MASK) | ((self.id as u64) << ID_SHIFT);
        let mut s = self.shared.borrow_mut();
        s.queues[self.id].inflight += 1;
        s.io.submit(io);
    }

    /// Polls the shared channel, sorts what came into every id's queue, and moves this
    /// handle's completions (tags as submitted) into `out`.
    pub(crate) fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let mut s = self.shared.borrow_mut();
        let s = &mut *s;
        s.io.poll(&mut s.scratch);
        for mut c in s.scratch.drain(..) {
            let id = (c.tag >> ID_SHIFT) as usize;
            c.tag &= LOW_MASK;
            let Some(q) = s.queues.get_mut(id) else { continue };
            q.inflight = q.inflight.saturating_sub(1);
            if q.closed {
                // Its owner is gone: the buffer goes back; the id is free once all are in.
                if q.inflight == 0 {
                    q.closed = false;
                    s.free.push(id);
                }
                continue;
            }
            q.done.push(c);
        }
        let q = &mut s.queues[self.id];
        let n = q.done.len();
        out.append(&mut q.done);
        n
    }
}

impl Drop for IoHandle {
    fn drop(&mut self) {
        let mut s = self.shared.borrow_mut();
        let q = &mut s.queues[self.id];
        q.done.clear();
        if q.inflight == 0 {
            s.free.push(self.id);
        } else {
            q.closed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_bdev::{BdevRegistry, IoBuf, IoKind, Lba};

    fn read(tag: u64) -> BdevIo {
        BdevIo { kind: IoKind::Read, offset_blocks: Lba::ZERO, num_blocks: 1, buf: Some(IoBuf::alloc(512)), tag, fua: false }
    }

    #[test]
    fn handles_on_one_thread_share_a_channel_and_get_their_own_completions() {
        let mut reg = BdevRegistry::new();
        let name = reg.create_malloc(None, 64, 512, None).unwrap();
        let bdev = reg.get(&name).unwrap();
        let (mut a, mut b) = (IoHandle::open(&bdev), IoHandle::open(&bdev));
        assert!(Rc::ptr_eq(&a.shared, &b.shared), "one channel per device and thread");
        a.submit(read(7));
        b.submit(read(7));
        b.submit(read(9 | (3 << 32)));
        let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
        for _ in 0..100 {
            a.poll(&mut got_a);
            b.poll(&mut got_b);
        }
        assert_eq!(got_a.iter().map(|c| c.tag).collect::<Vec<_>>(), vec![7]);
        assert_eq!(got_b.iter().map(|c| c.tag).collect::<Vec<_>>(), vec![7, 9 | (3 << 32)]);
        // A handle dropped with I/O in flight: its id is not reused until that is back.
        a.submit(read(1));
        let id = a.id;
        drop(a);
        let c = IoHandle::open(&bdev);
        assert_ne!(c.id, id, "the id of I/O still in flight is not reused");
        for _ in 0..100 {
            b.poll(&mut got_b);
        }
        assert_eq!(got_b.len(), 2, "nothing of the dropped handle's");
        let d = IoHandle::open(&bdev);
        assert_eq!(d.id, id, "reused once its I/O came back");
        // Another thread has its own.
        let other = std::thread::spawn(move || {
            let h = IoHandle::open(&bdev);
            h.id
        });
        assert_eq!(other.join().unwrap(), 0);
        drop((b, c, d));
    }
}
