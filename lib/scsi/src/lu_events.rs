//! Resets across gateways: a logical unit exported by several riser processes (an RBD image
//! behind two gateways, issue 15) is one logical unit, so a LOGICAL UNIT RESET or a target
//! reset received by one gateway is a reset for the I_T nexuses of the others too (SAM-5
//! 6.3: every nexus gets the reset unit attention). The device's shared state
//! ([`riser_bdev::Bdev::shared_state`], purpose `"lu"`) carries it: the gateway that took the
//! reset notifies, each other gateway applies the shared-state part of the reset
//! ([`Lun::reset_local`]) before acknowledging. Devices without shared state (local ones)
//! have none of this.
//!
//! The notify blocks on the network, so it runs on a worker thread, never on the reactor:
//! on a small pool of its own ([`ANNOUNCE_WORKERS`] threads, at most [`ANNOUNCE_PER_LUN`]
//! announcements of one LUN waiting), not on the pool of `pr::work` that PERSISTENT RESERVE
//! OUT work runs on. A flood of PR OUTs (full queues, every PR worker held by a stalled
//! cluster) therefore never delays or refuses a reset's announcement; past its own bound
//! (a LUN reset over and over) the reset stays on this gateway, logged.
//!
//! **The reactor never waits for the announcement**: [`LuEvents::announce`] queues it and
//! returns an [`Announcement`] the connection polls; the connection holds back its task
//! management response (and what it received after the reset) until the announcement is
//! done or [`ANNOUNCE_WAIT`] has passed, while the reactor serves its other connections.
//! So in the common case an initiator that got the response through one gateway finds the
//! reset's unit attention through every other (libiscsi's MultipathIO.Reset checks exactly
//! that), and a peer that is gone (its watch not yet expired, ~30 s) costs that connection
//! [`ANNOUNCE_WAIT`] per reset and no other connection anything. (Before, the reactor itself
//! waited up to half a second, stalling every connection it served.) Tasks the other
//! gateways are running are not aborted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::pr::work::{self, Pool, Serial};

use riser_bdev::SharedStateHandle;

use crate::lun::{Lun, ResetKind};

/// Longest a connection holds back the task management response of a reset while the
/// other gateways are told (its reactor serves its other connections meanwhile). Shorter
/// than the notify's own timeout (5 s): a peer that is gone must not cost a reset that much;
/// long enough for live peers on a loaded cluster (milliseconds usually).
pub const ANNOUNCE_WAIT: Duration = Duration::from_secs(2);

/// A reset's announcement to the other gateways, in flight on the announcement pool.
pub struct Announcement {
    done: AtomicBool,
    since: Instant,
}

impl Announcement {
    /// Every gateway acknowledged (or the notify failed: logged), or [`ANNOUNCE_WAIT`] passed.
    pub fn settled(&self) -> bool {
        self.done.load(Ordering::Acquire) || self.since.elapsed() >= ANNOUNCE_WAIT
    }
}

/// Worker threads that only announce resets. Two, so that one LUN whose cluster does not
/// answer (a notify that waits for its timeout) holds one and another LUN's reset still
/// goes out at once; one LUN never holds more than one (its announcements run in order).
pub(crate) const ANNOUNCE_WORKERS: usize = 2;

/// Announcements of one LUN waiting at most; past it a reset stays on this gateway. Resets
/// come from task management requests, not PR OUT floods, and four queued behind a stalled
/// one already tell the other gateways all there is to tell.
pub(crate) const ANNOUNCE_PER_LUN: usize = 4;

/// The process's pool for announcements: theirs alone, so that PR work never delays them.
fn announce_pool() -> Arc<Pool> {
    static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
    POOL.get_or_init(|| Pool::new("lu-events", ANNOUNCE_WORKERS, ANNOUNCE_PER_LUN)).clone()
}

/// This process's mark on its own notifications (it receives them too).
fn process_nonce() -> u64 {
    static NONCE: AtomicU64 = AtomicU64::new(0);
    let n = NONCE.load(Ordering::Relaxed);
    if n != 0 {
        return n;
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let fresh = (t ^ ((std::process::id() as u64) << 32)) | 1;
    match NONCE.compare_exchange(0, fresh, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => fresh,
        Err(other) => other,
    }
}

fn kind_name(k: ResetKind) -> &'static str {
    match k {
        ResetKind::LunReset => "lun",
        ResetKind::TargetWarmReset => "warm",
        ResetKind::TargetColdReset => "cold",
    }
}

fn kind_of(s: &str) -> Option<ResetKind> {
    match s {
        "lun" => Some(ResetKind::LunReset),
        "warm" => Some(ResetKind::TargetWarmReset),
        "cold" => Some(ResetKind::TargetColdReset),
        _ => None,
    }
}

/// This LUN's mark on its own notifications: the process's, made distinct per LUN (an odd
/// multiplier is a bijection), so that two LUNs of one process over the same device hear
/// each other's resets as any two gateways do (they are one logical unit).
fn lun_nonce() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    process_nonce() ^ SEQ.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The notification: `reset <kind> <lun id> <nonce>`.
fn encode(kind: ResetKind, lun: u64, nonce: u64) -> Vec<u8> {
    format!("reset {} {lun} {nonce:x}", kind_name(kind)).into_bytes()
}

/// A peer's reset, or `None` (our own, or not a reset). The object is the device's, so any
/// reset announced on it concerns this LUN, whatever number the peer exports it under.
fn decode(payload: &[u8], nonce: u64) -> Option<ResetKind> {
    let s = std::str::from_utf8(payload).ok()?;
    let mut w = s.split_ascii_whitespace();
    if w.next()? != "reset" {
        return None;
    }
    let kind = kind_of(w.next()?)?;
    let _lun: u64 = w.next()?.parse().ok()?;
    let from = u64::from_str_radix(w.next()?, 16).ok()?;
    (from != nonce).then_some(kind)
}

/// A LUN's link to the other gateways exporting its device.
pub(crate) struct LuEvents {
    shared: SharedStateHandle,
    lun: u64,
    /// This LUN's mark on its notifications ([`lun_nonce`]).
    nonce: u64,
    /// This LUN's announcements on their pool, in order.
    serial: Arc<Serial>,
}

impl LuEvents {
    /// Opens the device's `"lu"` shared state for `lun`; `None` for a local device, or
    /// (logged) when the store cannot be reached: resets then stay on this gateway.
    pub(crate) fn open(lun: &Arc<Lun>) -> Option<LuEvents> {
        let weak: Weak<Lun> = Arc::downgrade(lun);
        let id = lun.id();
        let nonce = lun_nonce();
        let on_notify = Box::new(move |p: &[u8]| {
            if let (Some(kind), Some(l)) = (decode(p, nonce), weak.upgrade()) {
                log::info!("LUN {id}: {} reset by another gateway", kind_name(kind));
                l.reset_local(kind);
            }
            // Nothing to read: applying a reset cannot fail.
            Ok(())
        });
        match lun.bdev().shared_state("lu", on_notify)? {
            Ok(shared) => Some(LuEvents { shared, lun: id, nonce, serial: Arc::default() }),
            Err(e) => {
                log::warn!("LUN {id}: resets will not reach other gateways: {e}");
                None
            }
        }
    }

    /// Tells the other gateways of a reset, in the background: returns at once (on the
    /// reactor) with the announcement to poll; `None` when it could not be queued (logged:
    /// the reset stays on this gateway).
    pub(crate) fn announce(&self, kind: ResetKind) -> Option<Arc<Announcement>> {
        let shared = self.shared.clone();
        let payload = encode(kind, self.lun, self.nonce);
        let lun = self.lun;
        let a = Arc::new(Announcement { done: AtomicBool::new(false), since: Instant::now() });
        let done = a.clone();
        let task: work::Task = Box::new(move || {
            let t0 = Instant::now();
            match shared.notify(&payload) {
                Ok(()) => log::debug!("LUN {lun}: {} reset announced in {:?}", kind_name(kind), t0.elapsed()),
                Err(e) => log::warn!("LUN {lun}: a gateway did not acknowledge the {} reset ({}): {e}", kind_name(kind), shared.describe()),
            }
            done.done.store(true, Ordering::Release);
        });
        let mut q = self.serial.lock();
        match announce_pool().submit(&self.serial, &mut q, task) {
            Ok(()) => return Some(a),
            // Logged for the first and every 1000th.
            Err(work::Refused::Full) if !q.log_refusal() => {}
            Err(work::Refused::Full) => log::warn!(
                "LUN {lun}: {ANNOUNCE_PER_LUN} announcements of resets already wait (the cluster is slow to answer?); this reset stays on this gateway"
            ),
            Err(work::Refused::NoThread) => {
                log::warn!("LUN {lun}: cannot tell other gateways of the reset (no worker thread); it stays on this gateway")
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_name_kind_lun_and_sender() {
        for k in [ResetKind::LunReset, ResetKind::TargetWarmReset, ResetKind::TargetColdReset] {
            assert_eq!(decode(&encode(k, 3, 0xabc), 0x123), Some(k));
            assert_eq!(decode(&encode(k, 3, 0xabc), 0xabc), None, "our own");
        }
        assert_eq!(decode(b"", 1), None);
        assert_eq!(decode(b"reset lun x 1", 2), None);
        assert_eq!(decode(b"reset off 0 1", 2), None);
        assert_eq!(decode(b"pr 1 2", 2), None);
        assert_ne!(process_nonce(), 0);
        assert_eq!(process_nonce(), process_nonce());
        assert_ne!(lun_nonce(), lun_nonce());
    }
}
