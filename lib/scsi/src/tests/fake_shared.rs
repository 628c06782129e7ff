//! A minimal in-memory stand-in for a device's shared state (an RBD image's RADOS object
//! behind several gateways): a versioned object with compare-and-swap writes and notifies to
//! every watcher, which a test can make slow or take down. Shared by the reservation tests
//! across gateways and the PR work-pool tests. One object per purpose (as `rbd_pr` names
//! one RADOS object per purpose), notified to that purpose's watchers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use riser_bdev::{
    Bdev, BdevError, BdevInfo, IoChannel, IoKind, MallocBdev, OnNotify, SharedError, SharedState,
    SharedStateHandle,
};

use super::{BLOCKS, BS};
use crate::{Lun, LunConfig};

#[derive(Default)]
pub(crate) struct Store {
    objects: Mutex<HashMap<String, (Vec<u8>, u64)>>,
    /// (device number, purpose, callback).
    watchers: Mutex<Vec<(usize, String, Arc<OnNotify>)>>,
    /// Devices made so far: each gets the next number (the first gateway's is 0).
    devices: AtomicUsize,
    /// Devices whose watchers miss every notify (cut off from the store's notifications).
    pub muted: Mutex<Vec<usize>>,
    /// Devices whose reads fail (the store answers the others).
    pub unreadable: Mutex<Vec<usize>>,
    /// Notifies wait while set (at most 20 s) before they reach the watchers: a peer that
    /// is slow to acknowledge.
    pub notify_stalled: AtomicBool,
    /// Notifies begun, and finished.
    pub notifies: AtomicUsize,
    pub notified: AtomicUsize,
    /// Notifies that found a watcher failing (not acknowledged). Such a watcher is fenced
    /// (as RBD blocklists it) and the notify succeeds, unless `unfenceable` is set.
    pub unacked: AtomicUsize,
    /// A watcher that does not acknowledge cannot be fenced either (the blocklist command
    /// fails): the notify fails.
    pub unfenceable: AtomicBool,
    /// The cluster is gone: every call fails.
    pub down: AtomicBool,
    /// The cluster is slow: reads wait while set (at most 20 s, so a failed test ends).
    pub stalled: AtomicBool,
    /// Reads begun.
    pub reads: AtomicUsize,
    /// Writes done.
    pub writes: AtomicU64,
}

/// (store, device number, purpose).
struct Handle(Arc<Store>, usize, String);

impl Store {
    /// The bytes of `purpose`'s object (empty: none).
    pub fn object(&self, purpose: &str) -> Vec<u8> {
        self.objects.lock().unwrap().get(purpose).map(|o| o.0.clone()).unwrap_or_default()
    }
    /// The reservation object's bytes and version.
    pub fn get(&self) -> (Vec<u8>, u64) {
        self.objects.lock().unwrap().get("pr").cloned().unwrap_or_default()
    }
    /// Replaces the reservation object behind every gateway's back (no notify), as
    /// `rados put` does.
    pub fn put(&self, data: &[u8]) {
        let mut objects = self.objects.lock().unwrap();
        let o = objects.entry("pr".into()).or_default();
        *o = (data.to_vec(), o.1 + 1);
    }
}

impl SharedState for Handle {
    fn describe(&self) -> String {
        "test store".into()
    }
    fn read(&self) -> Result<Option<(Vec<u8>, u64)>, SharedError> {
        self.0.reads.fetch_add(1, Ordering::AcqRel);
        let t0 = Instant::now();
        while self.0.stalled.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.0.down.load(Ordering::Acquire) || self.0.unreadable.lock().unwrap().contains(&self.1) {
            return Err(SharedError::Unavailable("cluster down".into()));
        }
        let objects = self.0.objects.lock().unwrap();
        Ok(objects.get(&self.2).filter(|o| o.1 > 0).cloned())
    }
    fn write(&self, data: &[u8], version: Option<u64>) -> Result<u64, SharedError> {
        if self.0.down.load(Ordering::Acquire) {
            return Err(SharedError::Unavailable("cluster down".into()));
        }
        let mut objects = self.0.objects.lock().unwrap();
        let o = objects.entry(self.2.clone()).or_default();
        if version.unwrap_or(0) != o.1 {
            return Err(SharedError::Changed);
        }
        *o = (data.to_vec(), o.1 + 1);
        self.0.writes.fetch_add(1, Ordering::Relaxed);
        Ok(o.1)
    }
    fn notify(&self, payload: &[u8]) -> Result<(), SharedError> {
        self.0.notifies.fetch_add(1, Ordering::AcqRel);
        let t0 = Instant::now();
        while self.0.notify_stalled.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let watchers = self.0.watchers.lock().unwrap().clone();
        let muted = self.0.muted.lock().unwrap().clone();
        let mut acked = true;
        for (dev, purpose, w) in watchers {
            if purpose != self.2 {
                continue;
            }
            if muted.contains(&dev) {
                acked = false;
                continue;
            }
            acked &= w(payload).is_ok();
        }
        self.0.notified.fetch_add(1, Ordering::AcqRel);
        if acked {
            return Ok(());
        }
        self.0.unacked.fetch_add(1, Ordering::AcqRel);
        if self.0.unfenceable.load(Ordering::Acquire) {
            Err(SharedError::Unavailable("a watcher did not acknowledge and could not be fenced".into()))
        } else {
            Ok(())
        }
    }
}

/// A malloc device whose shared state is `store`.
struct SharedDev {
    inner: Arc<MallocBdev>,
    info: BdevInfo,
    store: Arc<Store>,
    /// This device's number in the store.
    id: usize,
}

impl Bdev for SharedDev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn supports(&self, kind: IoKind) -> bool {
        self.inner.supports(kind)
    }
    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        self.inner.clone().open_channel()
    }
    fn config_json(&self) -> (&'static str, serde_json::Value) {
        self.inner.config_json()
    }
    fn shared_state(&self, purpose: &str, on_notify: OnNotify) -> Option<Result<SharedStateHandle, BdevError>> {
        self.store.watchers.lock().unwrap().push((self.id, purpose.to_string(), Arc::new(on_notify)));
        // Created empty when first watched, as `rbd_pr` does (a RADOS watch needs an object).
        self.store.objects.lock().unwrap().entry(purpose.to_string()).or_insert_with(|| (Vec::new(), 1));
        Some(Ok(Arc::new(Handle(self.store.clone(), self.id, purpose.to_string()))))
    }
}

/// One gateway's LUN over a malloc device (identity `uuid`) whose reservations live in
/// `store`.
pub(crate) fn shared_lun(store: &Arc<Store>, uuid: uuid::Uuid) -> Arc<Lun> {
    let inner = Arc::new(MallocBdev::new("S", BLOCKS, BS as u32, None).unwrap());
    let info = BdevInfo::new("S", "Malloc disk", BS as u32, BLOCKS, uuid);
    let id = store.devices.fetch_add(1, Ordering::AcqRel);
    let bdev = Arc::new(SharedDev { inner, info, store: store.clone(), id });
    Lun::new(LunConfig { target_name: "iqn.2024-01.test:tgt".into(), ..LunConfig::default() }, bdev)
}

/// What the watch thread of a device does after it re-established its watch: calls the
/// `purpose` watchers of device `dev` with an empty payload; whether they all succeeded.
pub(crate) fn rewatch(store: &Store, dev: usize, purpose: &str) -> bool {
    let watchers = store.watchers.lock().unwrap().clone();
    watchers.iter().filter(|(d, p, _)| *d == dev && p == purpose).all(|(_, _, w)| w(&[]).is_ok())
}
