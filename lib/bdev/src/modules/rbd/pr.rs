//! Shared state of an RBD image ([`SharedState`]): the RADOS object `riser_<purpose>.<image
//! id>` in the image's pool (`riser_pr.<id>` for persistent reservations), replaced whole
//! by compare-and-swap on the object's version, watched by every gateway that opened it.
//!
//! A thread per handle keeps the watch (which the cluster keeps [`watch_timeout_s`] after
//! the gateway stops pinging: at least the group's lease): on a notify it calls the owner's `on_notify`
//! (which re-reads the object) and acknowledges only once that succeeded, so a notifier
//! that got every acknowledgement knows each watching gateway has the new state. A re-read
//! that fails (the cluster does not answer, an object this gateway cannot decode) is retried
//! for [`REREAD_BUDGET`], within the notifier's timeout; if it still fails the notify is
//! left unacknowledged (the notifier sees this gateway did not follow) and the thread keeps
//! re-reading every second until one succeeds. When the watch breaks
//! (the cluster went away: ENOTCONN, or `rados_watch_check` says so) the thread makes a new
//! one (every second until the cluster answers) and calls `on_notify` with an empty payload,
//! so whatever was missed meanwhile is read, and only then removes the old one (still
//! answering what reaches it): the gateway is never out of a notify while it serves. The object is created empty
//! when the handle opens (a watch needs an object); empty reads as "nothing stored".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use riser_rbd::object::{CasError, Watch, WatchEvent};
use riser_rbd::RbdError;

use super::group::{RbdGroup, StoreCell};
use crate::{BdevError, OnNotify, SharedError, SharedState, SharedStateHandle};

/// How long a notifier waits for the other gateways' acknowledgements.
pub(crate) const NOTIFY_TIMEOUT_MS: u64 = 5000;

/// How long a watcher retries a failed re-read before it gives up acknowledging a notify:
/// well within the notifier's [`NOTIFY_TIMEOUT_MS`], so that an acknowledgement sent at the
/// end still arrives in time.
const REREAD_BUDGET: Duration = Duration::from_millis(NOTIFY_TIMEOUT_MS * 3 / 5);
/// Pause between two attempts of a failed re-read.
const REREAD_RETRY: Duration = Duration::from_millis(250);
/// Pause between two re-reads while a re-read is owed (one failed for its whole budget).
const REREAD_OWED_RETRY: Duration = Duration::from_secs(1);

/// How long the cluster keeps a gateway's shared-state watch after the gateway stops
/// pinging it, for a gateway group whose lease is `lease`: twice the lease, 30 s at least
/// (the OSDs' default). Never shorter than the lease: a notifier must find the watch of a
/// gateway that stopped answering (stopped, hung, cut off) until the group fences it, so that
/// its notify waits for that gateway and fences it before the change is reported done. A
/// watch the cluster had dropped sooner (`osd_client_watch_timeout` below the lease) would
/// let the change complete while that gateway, not yet fenced, could come back and act on the
/// state it held until it noticed.
pub(crate) fn watch_timeout_s(lease: Duration) -> u32 {
    u32::try_from(lease.as_secs().saturating_mul(2)).unwrap_or(u32::MAX).max(30)
}

fn unavailable(e: RbdError) -> SharedError {
    SharedError::Unavailable(e.to_string())
}

struct Inner {
    /// The gateway group's current connection (it changes when a fenced gateway rejoins).
    store: StoreCell,
    oid: String,
}

impl Inner {
    /// Creates the object empty if it does not exist (watching needs it).
    fn ensure(&self) -> Result<(), RbdError> {
        match self.store.write_if(&self.oid, b"", None) {
            Ok(_) | Err(CasError::Changed) => Ok(()),
            Err(CasError::Failed(e)) => Err(e),
        }
    }
}

/// The handle the LUN holds; dropping it stops the watch thread.
pub(crate) struct RbdShared {
    inner: Arc<Inner>,
    /// Fences the gateways that do not acknowledge a notify.
    group: Arc<RbdGroup>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Opens (creating it if needed) and watches the shared object `purpose` of image
/// `image_id`, in the image's pool, on the connection of the image's gateway group.
pub(crate) fn open(group: &Arc<RbdGroup>, image_id: &str, purpose: &str, on_notify: OnNotify) -> Result<SharedStateHandle, BdevError> {
    let inner = Arc::new(Inner { store: group.store(), oid: format!("riser_{purpose}.{image_id}") });
    inner.ensure().map_err(|e| BdevError::Unavailable(e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (i, s) = (inner.clone(), stop.clone());
    let timeout_s = watch_timeout_s(group.lease());
    let thread = std::thread::Builder::new()
        .name(format!("rbd-watch-{purpose}"))
        .spawn(move || watch_loop(&i, &s, timeout_s, on_notify))
        .map_err(|e| BdevError::Io(format!("cannot start the watch thread: {e}")))?;
    Ok(Arc::new(RbdShared { inner, group: group.clone(), stop, thread: Some(thread) }))
}

/// Calls `on_notify(payload)` until it succeeds, for [`REREAD_BUDGET`] at most (a stop
/// ends it early); whether it succeeded. Every failure is logged, the first at warning.
fn reread(what: &str, stop: &AtomicBool, on_notify: &OnNotify, payload: &[u8]) -> bool {
    let t0 = Instant::now();
    let mut tries = 0u32;
    loop {
        tries += 1;
        match on_notify(payload) {
            Ok(()) => {
                if tries > 1 {
                    log::info!("{what}: re-read the shared state at attempt {tries}");
                }
                return true;
            }
            Err(why) if tries == 1 => log::warn!("{what}: re-reading the shared state failed ({why}); retrying for {REREAD_BUDGET:?}"),
            Err(why) => log::debug!("{what}: re-read attempt {tries} failed: {why}"),
        }
        if stop.load(Ordering::Acquire) || t0.elapsed() + REREAD_RETRY > REREAD_BUDGET {
            return false;
        }
        std::thread::sleep(REREAD_RETRY);
    }
}

/// Follows the notifies that still reach a watch that reported an error (the cluster may
/// still hold it) while its replacement is made: re-read, then acknowledge through it, as
/// for the live watch; one left unanswered would make its notifier fence this gateway.
fn follow_broken(what: &str, stop: &AtomicBool, on_notify: &OnNotify, broken: Option<&(Watch, Receiver<WatchEvent>)>) {
    let Some((w, rx)) = broken else {
        return;
    };
    while let Ok(e) = rx.try_recv() {
        if let WatchEvent::Notify { notify_id, payload } = e {
            if reread(what, stop, on_notify, &payload) {
                if let Err(e) = w.ack(notify_id) {
                    log::debug!("{what}: acknowledging notify {notify_id} on the broken watch: {e}");
                }
            }
        }
    }
}

fn watch_loop(inner: &Inner, stop: &AtomicBool, timeout_s: u32, on_notify: OnNotify) {
    let what = format!("rbd {}/{}", inner.store.pool_name(), inner.oid);
    let mut watch: Option<(Watch, Receiver<WatchEvent>)> = None;
    // A watch that broke, kept until its replacement is in place and the state re-read:
    // removing it first would leave a moment in which this gateway, not watching, is left
    // out of another gateway's notify (which then completes without waiting for it, while
    // it still acts on the copy it holds).
    let mut broken: Option<(Watch, Receiver<WatchEvent>)> = None;
    let mut broken_since: Option<Instant> = None;
    let mut last_check = Instant::now();
    // A re-read is owed (one failed for its whole budget): retried every second until one
    // succeeds, whatever notifies come meanwhile.
    let mut owed: Option<Instant> = None;
    let mut last_owed_try = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let Some((w, rx)) = &watch else {
            follow_broken(&what, stop, &on_notify, broken.as_ref());
            match inner.ensure().and_then(|()| inner.store.watch(&inner.oid, timeout_s)) {
                Ok(wr) => {
                    watch = Some(wr);
                    if let Some(t) = broken_since.take() {
                        log::info!("{what}: watch re-established after {:.1} s; re-reading the shared state", t.elapsed().as_secs_f64());
                    }
                    // Whatever changed while nobody watched.
                    if !reread(&what, stop, &on_notify, &[]) && owed.is_none() {
                        owed = Some(Instant::now());
                    }
                    last_owed_try = Instant::now();
                    // Only now is the old watch removed.
                    follow_broken(&what, stop, &on_notify, broken.as_ref());
                    drop(broken.take());
                }
                Err(e) => {
                    if broken_since.is_none() {
                        log::warn!("{what}: cannot watch: {e}; retrying every second");
                        broken_since = Some(Instant::now());
                    }
                    // A second, in steps that let a stop through.
                    for _ in 0..10 {
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            continue;
        };
        let mut lost = None;
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(WatchEvent::Notify { notify_id, payload }) => {
                if reread(&what, stop, &on_notify, &payload) {
                    if let Some(t) = owed.take() {
                        log::info!("{what}: the shared state is read again, {:.1} s after a re-read first failed", t.elapsed().as_secs_f64());
                    }
                    if let Err(e) = w.ack(notify_id) {
                        log::warn!("{what}: acknowledging notify {notify_id}: {e}");
                    }
                } else {
                    // The notifier must not count this gateway as one that follows the new
                    // state: no acknowledgement.
                    log::error!(
                        "{what}: could not re-read the shared state after notify {notify_id} within {REREAD_BUDGET:?}; not acknowledging it (this gateway still enforces the last state it read), re-reading every second"
                    );
                    owed.get_or_insert_with(Instant::now);
                    last_owed_try = Instant::now();
                }
            }
            Ok(WatchEvent::Error(errno)) => lost = Some(riser_rbd::errno_str(errno)),
            Err(RecvTimeoutError::Disconnected) => lost = Some("watch channel closed".into()),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some(t) = owed {
            if last_owed_try.elapsed() >= REREAD_OWED_RETRY {
                last_owed_try = Instant::now();
                match on_notify(&[]) {
                    Ok(()) => {
                        log::info!("{what}: the shared state is read again, {:.1} s after a re-read first failed", t.elapsed().as_secs_f64());
                        owed = None;
                    }
                    Err(why) => log::debug!("{what}: owed re-read failed again: {why}"),
                }
            }
        }
        if lost.is_none() && last_check.elapsed() >= Duration::from_secs(2) {
            last_check = Instant::now();
            if let Err(e) = w.check() {
                lost = Some(e.to_string());
            }
        }
        if let Some(why) = lost {
            log::warn!("{what}: watch lost ({why}); re-watching");
            broken_since = Some(Instant::now());
            broken = watch.take();
        }
    }
}

impl SharedState for RbdShared {
    fn describe(&self) -> String {
        format!("rbd {}/{}", self.inner.store.pool_name(), self.inner.oid)
    }

    fn read(&self) -> Result<Option<(Vec<u8>, u64)>, SharedError> {
        match self.inner.store.read(&self.inner.oid).map_err(unavailable)? {
            Some((b, v)) if !b.is_empty() => Ok(Some((b, v))),
            // Empty (as created) or gone: nothing stored; a write must find it as it is.
            Some((_, v)) => Ok(Some((Vec::new(), v))),
            None => Ok(None),
        }
    }

    fn write(&self, data: &[u8], version: Option<u64>) -> Result<u64, SharedError> {
        self.inner.store.write_if(&self.inner.oid, data, version).map_err(|e| match e {
            CasError::Changed => SharedError::Changed,
            CasError::Failed(e) => unavailable(e),
        })
    }

    /// Waits up to the group's lease for every watching gateway's acknowledgement; one
    /// that does not answer in that time is fenced (blocklisted, see `group`) before
    /// this returns Ok, so it cannot act on the state it missed. A silent gateway that
    /// cannot be fenced fails the notify (the change may then not be reported as done).
    fn notify(&self, payload: &[u8]) -> Result<(), SharedError> {
        let lease_ms = self.group.lease().as_millis() as u64;
        let reply = self.inner.store.notify_reply(&self.inner.oid, payload, lease_ms).map_err(unavailable)?;
        let me = crate::GatewayGroup::me(&*self.group).id;
        if reply.timed_out.contains(&me) {
            log::warn!("{}: this gateway's own watch did not acknowledge a notify within {lease_ms} ms", self.describe());
        }
        for id in reply.timed_out.into_iter().filter(|id| *id != me) {
            let why = format!("it did not acknowledge a notify of {} within the lease ({} ms)", self.describe(), lease_ms);
            self.group.fence(id, &why).map_err(SharedError::Unavailable)?;
        }
        Ok(())
    }
}

impl Drop for RbdShared {
    /// Stops the watch thread and waits for it (it unwatches, so the cluster connection is
    /// free for `bdev_rbd_unregister_cluster`), 2 s at most: a thread stuck in a read of an
    /// unreachable cluster is left to finish on its own.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let Some(t) = self.thread.take() else {
            return;
        };
        // The last owner may go away inside on_notify, on the watch thread itself.
        if t.thread().id() == std::thread::current().id() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            log::warn!("{}: the watch thread is still busy; not waiting for it", self.describe());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway's shared-state watch lasts at least the lease and never less than the OSDs'
    /// default: a notifier finds the watch of a silent gateway until the group fences it.
    #[test]
    fn a_shared_state_watch_outlives_the_lease() {
        assert_eq!(watch_timeout_s(Duration::from_secs(3)), 30);
        assert_eq!(watch_timeout_s(Duration::from_secs(10)), 30);
        assert_eq!(watch_timeout_s(Duration::from_secs(30)), 60);
        assert_eq!(watch_timeout_s(Duration::from_secs(600)), 1200);
        for lease in crate::modules::rbd::group::LEASE_RANGE {
            assert!(u64::from(watch_timeout_s(Duration::from_secs(lease.into()))) > u64::from(lease), "lease {lease}");
        }
    }
}
