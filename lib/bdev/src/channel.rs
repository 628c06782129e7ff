//! Per-reactor device channels: one bdev I/O channel per block device and reactor thread,
//! shared by every user of that device on that thread (each LUN channel of each
//! connection): a device opens its channel (an RBD image handle, a ring slot, a queue) once
//! per reactor, not once per connection (SPDK's `spdk_get_io_channel`).
//!
//! Each user gets a route ([`SharedChannel`]); its I/Os carry the route in the top bits of
//! their tag ([`ROUTE`]), and whoever polls the shared channel files the completions in each
//! route's inbox ([`riser_reactor::Inboxes`]). A route is reused only once every I/O of its
//! last owner has come back, so a late completion never reaches a new owner.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use riser_reactor::{Inboxes, Tag, TagLayout};

use crate::{Bdev, BdevIo, IoChannel, IoCompletion};

/// Where a shared channel's route goes in an I/O's tag: its top 16 bits. The bits below are
/// the user's, returned as submitted.
pub const ROUTE: TagLayout = TagLayout::high(0, 0, 16);

struct Shared {
    io: Box<dyn IoChannel>,
    inboxes: Inboxes<IoCompletion>,
    scratch: Vec<IoCompletion>,
    /// Completions filed in each route's inbox by another route's poll, not yet taken (by
    /// route; grown when a route opens, so nothing is allocated per I/O), and their sum: such a
    /// user must be polled again although its device has nothing to signal.
    mail: Vec<usize>,
    mail_total: usize,
}

thread_local! {
    /// This thread's shared channels, by device (the `Arc`'s address, and the device itself
    /// to tell a new device at a reused address); neither kept alive by the map.
    static CHANNELS: RefCell<HashMap<usize, ChannelEntry>> = RefCell::new(HashMap::new());
}

/// A [`CHANNELS`] entry: the device (to tell a new one at a reused address) and the channel.
type ChannelEntry = (std::sync::Weak<dyn Bdev>, Weak<RefCell<Shared>>);

/// A user's handle on its thread's channel to a device.
pub struct SharedChannel {
    shared: Rc<RefCell<Shared>>,
    route: u32,
}

impl SharedChannel {
    /// The calling thread's channel to `bdev` (opened on first use), under a new route.
    pub fn open(bdev: &Arc<dyn Bdev>) -> SharedChannel {
        let key = Arc::as_ptr(bdev) as *const () as usize;
        let shared = CHANNELS.with(|m| {
            let mut m = m.borrow_mut();
            m.retain(|_, (_, w)| w.strong_count() > 0);
            match m.get(&key).and_then(|(b, w)| if std::sync::Weak::ptr_eq(b, &Arc::downgrade(bdev)) { w.upgrade() } else { None }) {
                Some(s) => s,
                None => {
                    let s = Rc::new(RefCell::new(Shared {
                        io: bdev.clone().open_channel(),
                        inboxes: Inboxes::default(),
                        scratch: Vec::new(),
                        mail: Vec::new(),
                        mail_total: 0,
                    }));
                    m.insert(key, (Arc::downgrade(bdev), Rc::downgrade(&s)));
                    s
                }
            }
        });
        let route = {
            let mut s = shared.borrow_mut();
            let route = s.inboxes.open();
            if s.mail.len() <= route as usize {
                s.mail.resize(route as usize + 1, 0);
            }
            route
        };
        SharedChannel { shared, route }
    }

    /// Submits `io`, whose tag must leave the [`ROUTE`] bits zero.
    pub fn submit(&mut self, mut io: BdevIo) {
        io.tag = ROUTE.pack(Tag { route: self.route, ..Tag::default() }, io.tag);
        let mut s = self.shared.borrow_mut();
        s.inboxes.expect(self.route);
        s.io.submit(io);
    }

    /// Polls the shared channel, files what came in every route's inbox, and moves this
    /// handle's completions (tags as submitted) into `out`.
    pub fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let mut s = self.shared.borrow_mut();
        let s = &mut *s;
        let before = out.len();
        // What other users' polls filed for this one first, then the device's completions:
        // this user's go straight into `out` (in order: its inbox is empty now), the
        // others' into their inboxes.
        s.take_mail(self.route);
        s.inboxes.drain(self.route, out);
        s.io.poll(&mut s.scratch);
        for mut c in s.scratch.drain(..) {
            let (tag, user) = ROUTE.unpack(c.tag);
            c.tag = user;
            if s.inboxes.deliver_to(tag.route, c, self.route, out) && tag.route != self.route {
                if let Some(m) = s.mail.get_mut(tag.route as usize) {
                    *m += 1;
                    s.mail_total += 1;
                }
            }
        }
        out.len() - before
    }

    /// Whether this handle's user must keep polling: its device needs polling (see
    /// [`IoChannel::needs_poll`]), or completions of another user of the channel were filed
    /// and wait for it (that user may have been polled before they came in).
    pub fn needs_poll(&self) -> bool {
        let s = self.shared.borrow();
        s.mail_total > 0 || s.io.needs_poll()
    }

    /// Completions dropped because their route was unknown (for tests and diagnostics).
    pub fn stale(&self) -> u64 {
        self.shared.borrow().inboxes.stale()
    }
}

impl Drop for SharedChannel {
    fn drop(&mut self) {
        let mut s = self.shared.borrow_mut();
        s.take_mail(self.route);
        s.inboxes.close(self.route);
    }
}

impl Shared {
    /// `route`'s filed completions are taken (or dropped with it).
    fn take_mail(&mut self, route: u32) {
        if let Some(m) = self.mail.get_mut(route as usize) {
            self.mail_total -= *m;
            *m = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BdevRegistry, IoBuf, IoKind, Lba};

    fn read(tag: u64) -> BdevIo {
        BdevIo { kind: IoKind::Read, offset_blocks: Lba::ZERO, num_blocks: 1, buf: Some(IoBuf::alloc(512)), tag, fua: false }
    }

    #[test]
    fn handles_on_one_thread_share_a_channel_and_get_their_own_completions() {
        let mut reg = BdevRegistry::new();
        let name = reg.create_malloc(None, 64, 512, None).unwrap();
        let bdev = reg.get(&name).unwrap();
        let (mut a, mut b) = (SharedChannel::open(&bdev), SharedChannel::open(&bdev));
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
        // A handle dropped with I/O in flight: its route is not reused until that is back.
        a.submit(read(1));
        let route = a.route;
        drop(a);
        let c = SharedChannel::open(&bdev);
        assert_ne!(c.route, route, "the route of I/O still in flight is not reused");
        for _ in 0..100 {
            b.poll(&mut got_b);
        }
        assert_eq!(got_b.len(), 2, "nothing of the dropped handle's");
        let d = SharedChannel::open(&bdev);
        assert_eq!(d.route, route, "reused once its I/O came back");
        assert_eq!(b.stale(), 0);
        // Another thread has its own.
        let other = std::thread::spawn(move || {
            let h = SharedChannel::open(&bdev);
            h.route
        });
        assert_eq!(other.join().unwrap(), 0);
        drop((b, c, d));
    }

    /// A device whose completions signal themselves (like RBD's eventfd): its channel never
    /// asks to be polled for I/O in flight.
    struct Signalling(Arc<dyn Bdev>);
    struct SignallingChannel(Box<dyn IoChannel>);

    impl Bdev for Signalling {
        fn info(&self) -> &crate::BdevInfo {
            self.0.info()
        }
        fn supports(&self, kind: IoKind) -> bool {
            self.0.supports(kind)
        }
        fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
            Box::new(SignallingChannel(self.0.clone().open_channel()))
        }
        fn config_json(&self) -> (&'static str, serde_json::Value) {
            self.0.config_json()
        }
    }

    impl IoChannel for SignallingChannel {
        fn submit(&mut self, io: BdevIo) {
            self.0.submit(io)
        }
        fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
            self.0.poll(out)
        }
        fn outstanding(&self) -> usize {
            self.0.outstanding()
        }
        fn needs_poll(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_user_whose_completions_another_user_filed_must_be_polled() {
        let mut reg = BdevRegistry::new();
        let name = reg.create_malloc(None, 64, 512, None).unwrap();
        let bdev: Arc<dyn Bdev> = Arc::new(Signalling(reg.get(&name).unwrap()));
        let (mut a, mut b) = (SharedChannel::open(&bdev), SharedChannel::open(&bdev));
        a.submit(read(1));
        b.submit(read(2));
        assert!(!a.needs_poll() && !b.needs_poll(), "the device signals its completions itself");
        let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
        b.poll(&mut got_b);
        assert_eq!(got_b.len(), 1);
        // b's poll filed a's completion: nothing will signal it again, so whoever is asked
        // says keep polling (a may have been polled earlier in the reactor's pass).
        assert!(a.needs_poll() && b.needs_poll(), "a's completion waits in its inbox");
        a.poll(&mut got_a);
        assert_eq!(got_a.iter().map(|c| c.tag).collect::<Vec<_>>(), vec![1]);
        assert!(!a.needs_poll() && !b.needs_poll());
        // A user that leaves with mail waiting takes it with it.
        a.submit(read(3));
        b.poll(&mut got_b);
        assert!(b.needs_poll());
        drop(a);
        assert!(!b.needs_poll(), "the dropped user's mail went with it");
        // A device without a signal keeps the old answer: anything outstanding needs polling.
        let plain = reg.get(&name).unwrap();
        let mut p = SharedChannel::open(&plain);
        p.submit(read(4));
        assert!(p.needs_poll());
        let mut got = Vec::new();
        p.poll(&mut got);
        assert!(!p.needs_poll());
    }
}
