//! Small RADOS objects next to an image, for state every gateway shares (persistent
//! reservations): whole-object reads with the object's version, whole-object writes that
//! succeed only if the object is still at the version read (compare-and-swap), and
//! watch/notify to tell the other gateways that the object changed.
//!
//! [`ObjectStore`] uses its own I/O context: `rados_get_last_version` is the version
//! of the last operation on an ioctx, so reads and writes here are serialized by a mutex
//! and nothing else uses that ioctx.

use std::ffi::{c_char, c_void, CString};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use crate::{check, cstr, sys, Cluster, Pool, RbdError, Result};

/// The largest object [`ObjectStore::read`] takes (persistent reservation state is a few
/// KiB: 1 MiB is thousands of registrations).
pub const MAX_OBJECT: usize = 1 << 20;

/// One pool's objects, through a private ioctx.
pub struct ObjectStore {
    pool: Arc<Pool>,
    cluster: Arc<Cluster>,
    /// Serializes operation + `rados_get_last_version`.
    io: Mutex<()>,
}

/// Why a compare-and-swap write did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasError {
    /// The object changed (or appeared, or went) since the version given: read it again.
    Changed,
    Failed(RbdError),
}

/// What a watch reports, in the order librados delivered it.
#[derive(Debug)]
pub enum WatchEvent {
    /// A notify: acknowledge it with [`Watch::ack`] once handled (the notifier waits).
    Notify { notify_id: u64, payload: Vec<u8> },
    /// The watch broke (errno, positive: ENOTCONN when the cluster lost it): make a new one.
    Error(i32),
}

impl ObjectStore {
    pub fn open(cluster: &Arc<Cluster>, pool: &str) -> Result<ObjectStore> {
        Ok(ObjectStore { pool: Pool::open(cluster, pool)?, cluster: cluster.clone(), io: Mutex::new(()) })
    }

    pub fn pool_name(&self) -> &str {
        self.pool.name()
    }

    /// The connection this store's I/O context is on.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    fn last_version(&self) -> u64 {
        // SAFETY: the ioctx is live (self.pool); the caller holds `io`.
        unsafe { sys::rados_get_last_version(self.pool.raw) }
    }

    /// The object's bytes and version; `None` if it does not exist.
    pub fn read(&self, oid: &str) -> Result<Option<(Vec<u8>, u64)>> {
        let o = cstr("object", oid)?;
        let mut buf = vec![0u8; MAX_OBJECT + 1];
        let _io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the ioctx is live; o is NUL-terminated; buf is writable for its length.
        let r = unsafe { sys::rados_read(self.pool.raw, o.as_ptr(), buf.as_mut_ptr().cast::<c_char>(), buf.len(), 0) };
        if r == -libc::ENOENT {
            return Ok(None);
        }
        let n = check("rados_read", oid, r)? as usize;
        if n > MAX_OBJECT {
            return Err(RbdError::InvalidArgument(format!("object {oid} is larger than {MAX_OBJECT} bytes")));
        }
        let version = self.last_version();
        buf.truncate(n);
        Ok(Some((buf, version)))
    }

    /// Replaces the object with `data` if it is still at `version` (`None`: if it does not
    /// exist yet). Returns the new version.
    pub fn write_if(&self, oid: &str, data: &[u8], version: Option<u64>) -> std::result::Result<u64, CasError> {
        let o = cstr("object", oid).map_err(CasError::Failed)?;
        let _io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: plain constructor; released below on every path.
        let op = unsafe { sys::rados_create_write_op() };
        if op.is_null() {
            return Err(CasError::Failed(RbdError::Call { call: "rados_create_write_op", what: oid.into(), errno: libc::ENOMEM }));
        }
        // SAFETY: op is live; data outlives rados_write_op_operate below (the op copies
        // nothing before it runs, and runs synchronously there).
        let r = unsafe {
            match version {
                Some(v) => sys::rados_write_op_assert_version(op, v),
                None => sys::rados_write_op_create(op, sys::LIBRADOS_CREATE_EXCLUSIVE as i32, std::ptr::null()),
            }
            sys::rados_write_op_write_full(op, data.as_ptr().cast::<c_char>(), data.len());
            let r = sys::rados_write_op_operate(op, self.pool.raw, o.as_ptr(), std::ptr::null_mut(), 0);
            sys::rados_release_write_op(op);
            r
        };
        match r {
            // assert_version: ERANGE (object newer), EOVERFLOW (older); create: EEXIST;
            // assert on an object that went: ENOENT.
            _ if r == -libc::ERANGE || r == -libc::EOVERFLOW || r == -libc::EEXIST || r == -libc::ENOENT => Err(CasError::Changed),
            _ if r < 0 => Err(CasError::Failed(RbdError::Call { call: "rados_write_op_operate", what: oid.into(), errno: -r })),
            _ => Ok(self.last_version()),
        }
    }

    /// Removes the object (tests); a missing one is fine.
    pub fn remove(&self, oid: &str) -> Result<()> {
        let o = cstr("object", oid)?;
        // SAFETY: the ioctx is live; o is NUL-terminated.
        let r = unsafe { sys::rados_remove(self.pool.raw, o.as_ptr()) };
        if r == -libc::ENOENT {
            return Ok(());
        }
        check("rados_remove", oid, r).map(|_| ())
    }

    /// Notifies the object's watchers with `payload`, waits until every one acknowledged or
    /// `timeout_ms` passed, and says who answered: the instance ids
    /// ([`Cluster::instance_id`]) of the watchers that acknowledged within `timeout_ms` and
    /// of those that did not. A timeout is not an error here (the answer lists the silent
    /// watchers); a watcher whose watch the cluster already dropped is in neither list.
    pub fn notify_reply(&self, oid: &str, payload: &[u8], timeout_ms: u64) -> Result<NotifyReply> {
        let o = cstr("object", oid)?;
        let len = i32::try_from(payload.len()).map_err(|_| RbdError::InvalidArgument("notify payload too large".into()))?;
        let mut reply: *mut c_char = std::ptr::null_mut();
        let mut reply_len: usize = 0;
        // SAFETY: the ioctx is live; o is NUL-terminated; payload is readable for len bytes;
        // reply/reply_len are valid out-pointers.
        let r =
            unsafe { sys::rados_notify2(self.pool.raw, o.as_ptr(), payload.as_ptr().cast::<c_char>(), len, timeout_ms, &mut reply, &mut reply_len) };
        let mut out = NotifyReply::default();
        if !reply.is_null() {
            let mut acks: *mut sys::notify_ack_t = std::ptr::null_mut();
            let mut timeouts: *mut sys::notify_timeout_t = std::ptr::null_mut();
            let (mut nr_acks, mut nr_timeouts) = (0usize, 0usize);
            // SAFETY: reply is librados' buffer of reply_len bytes; the out-pointers are valid.
            let d = unsafe { sys::rados_decode_notify_response(reply, reply_len, &mut acks, &mut nr_acks, &mut timeouts, &mut nr_timeouts) };
            if d == 0 {
                for i in 0..nr_acks {
                    // SAFETY: librados allocated nr_acks entries at acks.
                    out.acked.push(unsafe { (*acks.add(i)).notifier_id });
                }
                for i in 0..nr_timeouts {
                    // SAFETY: nr_timeouts entries at timeouts.
                    out.timed_out.push(unsafe { (*timeouts.add(i)).notifier_id });
                }
                // SAFETY: what rados_decode_notify_response allocated, freed once.
                unsafe { sys::rados_free_notify_response(acks, nr_acks, timeouts) };
            }
            // SAFETY: librados allocated the reply; freed once, with its own function.
            unsafe { sys::rados_buffer_free(reply) };
            if d < 0 && r == 0 {
                return Err(RbdError::Call { call: "rados_decode_notify_response", what: oid.into(), errno: -d });
            }
        }
        if r == -libc::ETIMEDOUT {
            return Ok(out);
        }
        check("rados_notify2", oid, r)?;
        Ok(out)
    }

    /// Watches `oid` (which must exist): events arrive on the returned receiver, from a
    /// librados thread, which does nothing else (no riser code runs there). The cluster
    /// keeps the watch for `timeout_s` seconds after this client stops pinging it (instead
    /// of the OSDs' `osd_client_watch_timeout`, 30 s by default): so long, a notifier waits
    /// for this client's acknowledgement and learns that it did not give one.
    pub fn watch(self: &Arc<Self>, oid: &str, timeout_s: u32) -> Result<(Watch, Receiver<WatchEvent>)> {
        self.watch_inner(oid, timeout_s, false)
    }

    /// A liveness watch: like [`watch`](Self::watch), but every notify is acknowledged at
    /// once, on the librados thread that delivers it (a gateway answers as long as its
    /// client runs: a killed or stopped process stops answering), and the cluster drops the
    /// watch when this client has not pinged it for `timeout_s` seconds (instead of the
    /// OSDs' default 30 s), so notifiers stop waiting for a dead client sooner. The
    /// notifies still arrive on the receiver (already acknowledged).
    pub fn watch_acking(self: &Arc<Self>, oid: &str, timeout_s: u32) -> Result<(Watch, Receiver<WatchEvent>)> {
        self.watch_inner(oid, timeout_s, true)
    }

    fn watch_inner(self: &Arc<Self>, oid: &str, timeout_s: u32, acking: bool) -> Result<(Watch, Receiver<WatchEvent>)> {
        let o = cstr("object", oid)?;
        let (tx, rx) = channel();
        let ack = acking.then(|| AutoAck { io: self.pool.raw, oid: o.clone() });
        let ctx = Box::into_raw(Box::new(WatchCtx { tx: Mutex::new(tx), ack }));
        let mut cookie: u64 = 0;
        let call = "rados_watch3";
        // SAFETY: the ioctx is live; o is NUL-terminated; ctx stays allocated until the
        // watch is removed and flushed (Watch::drop), so the callbacks never see it freed.
        let r = unsafe { sys::rados_watch3(self.pool.raw, o.as_ptr(), &mut cookie, Some(watch_cb), Some(watch_err_cb), timeout_s, ctx.cast::<c_void>()) };
        if r < 0 {
            // SAFETY: the watch was not registered: no callback holds ctx.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(RbdError::Call { call, what: oid.into(), errno: -r });
        }
        Ok((Watch { store: self.clone(), oid: o, cookie, ctx }, rx))
    }
}

/// Who answered a notify ([`ObjectStore::notify_reply`]), by instance id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NotifyReply {
    pub acked: Vec<u64>,
    pub timed_out: Vec<u64>,
}

/// What a liveness watch's callback needs to acknowledge a notify itself.
struct AutoAck {
    io: sys::rados_ioctx_t,
    oid: CString,
}

struct WatchCtx {
    tx: Mutex<Sender<WatchEvent>>,
    ack: Option<AutoAck>,
}

impl WatchCtx {
    fn send(&self, e: WatchEvent) {
        // A closed receiver: the watch is going away, nobody wants the event.
        let _ = self.tx.lock().unwrap_or_else(|p| p.into_inner()).send(e);
    }
}

unsafe extern "C" fn watch_cb(arg: *mut c_void, notify_id: u64, handle: u64, _notifier: u64, data: *mut c_void, len: usize) {
    // SAFETY: arg is the WatchCtx given to rados_watch2/3, alive until after rados_watch_flush.
    let ctx = unsafe { &*(arg as *const WatchCtx) };
    if let Some(a) = &ctx.ack {
        // SAFETY: the ioctx outlives the watch (Watch holds the store; the watch is flushed
        // before the context goes); the handle is this watch's cookie. librados sends the
        // acknowledgement asynchronously: calling it from the callback is allowed.
        unsafe { sys::rados_notify_ack(a.io, a.oid.as_ptr(), notify_id, handle, std::ptr::null(), 0) };
    }
    let payload = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: librados passes data readable for len bytes for the callback's duration.
        unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec()
    };
    ctx.send(WatchEvent::Notify { notify_id, payload });
}

unsafe extern "C" fn watch_err_cb(arg: *mut c_void, _cookie: u64, err: i32) {
    // SAFETY: as in watch_cb.
    let ctx = unsafe { &*(arg as *const WatchCtx) };
    ctx.send(WatchEvent::Error(err.abs()));
}

/// A registered watch; dropping it unwatches and waits for callbacks in flight.
pub struct Watch {
    store: Arc<ObjectStore>,
    oid: CString,
    cookie: u64,
    ctx: *mut WatchCtx,
}

// SAFETY: ctx is only read through a Mutex'd Sender (thread safe); the ioctx calls are thread safe.
unsafe impl Send for Watch {}

impl Watch {
    /// Acknowledges a notify (the notifier's `notify` returns once every watcher did).
    pub fn ack(&self, notify_id: u64) -> Result<()> {
        // SAFETY: the ioctx is live; oid is NUL-terminated; an empty reply payload.
        let r = unsafe { sys::rados_notify_ack(self.store.pool.raw, self.oid.as_ptr(), notify_id, self.cookie, std::ptr::null(), 0) };
        check("rados_notify_ack", &self.oid.to_string_lossy(), r).map(|_| ())
    }

    /// Milliseconds since the cluster last confirmed the watch, or the error that broke it.
    pub fn check(&self) -> Result<u64> {
        // SAFETY: the ioctx is live; cookie is this watch's.
        let r = unsafe { sys::rados_watch_check(self.store.pool.raw, self.cookie) };
        check("rados_watch_check", &self.oid.to_string_lossy(), r).map(|ms| ms as u64)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: the ioctx is live; cookie came from rados_watch2. Errors (cluster gone)
        // leave nothing to undo.
        unsafe { sys::rados_unwatch2(self.store.pool.raw, self.cookie) };
        // SAFETY: the cluster handle is live (store holds it); after the flush no callback
        // of this watch runs any more, so ctx can be freed.
        unsafe {
            sys::rados_watch_flush(self.store.cluster.raw);
            drop(Box::from_raw(self.ctx));
        }
    }
}
