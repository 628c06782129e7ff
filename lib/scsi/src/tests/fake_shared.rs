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
    watchers: Mutex<Vec<(String, Arc<OnNotify>)>>,
    /// The cluster is gone: every call fails.
    pub down: AtomicBool,
    /// The cluster is slow: reads wait while set (at most 20 s, so a failed test ends).
    pub stalled: AtomicBool,
    /// Reads begun.
    pub reads: AtomicUsize,
    /// Writes done.
    pub writes: AtomicU64,
}

impl Store {
    /// The bytes of `purpose`'s object (empty: none).
    pub fn object(&self, purpose: &str) -> Vec<u8> {
        self.objects.lock().unwrap().get(purpose).map(|o| o.0.clone()).unwrap_or_default()
    }
}

struct Handle(Arc<Store>, String);

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
        if self.0.down.load(Ordering::Acquire) {
            return Err(SharedError::Unavailable("cluster down".into()));
        }
        let objects = self.0.objects.lock().unwrap();
        Ok(objects.get(&self.1).filter(|o| o.1 > 0).cloned())
    }
    fn write(&self, data: &[u8], version: Option<u64>) -> Result<u64, SharedError> {
        if self.0.down.load(Ordering::Acquire) {
            return Err(SharedError::Unavailable("cluster down".into()));
        }
        let mut objects = self.0.objects.lock().unwrap();
        let o = objects.entry(self.1.clone()).or_default();
        if version.unwrap_or(0) != o.1 {
            return Err(SharedError::Changed);
        }
        *o = (data.to_vec(), o.1 + 1);
        self.0.writes.fetch_add(1, Ordering::Relaxed);
        Ok(o.1)
    }
    fn notify(&self, payload: &[u8]) -> Result<(), SharedError> {
        let watchers: Vec<Arc<OnNotify>> =
            self.0.watchers.lock().unwrap().iter().filter(|(p, _)| *p == self.1).map(|(_, w)| w.clone()).collect();
        for w in watchers {
            w(payload);
        }
        Ok(())
    }
}

/// A malloc device whose shared state is `store`.
struct SharedDev {
    inner: Arc<MallocBdev>,
    info: BdevInfo,
    store: Arc<Store>,
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
        self.store.watchers.lock().unwrap().push((purpose.to_string(), Arc::new(on_notify)));
        // Created empty when first watched, as `rbd_pr` does (a RADOS watch needs an object).
        self.store.objects.lock().unwrap().entry(purpose.to_string()).or_insert_with(|| (Vec::new(), 1));
        Some(Ok(Arc::new(Handle(self.store.clone(), purpose.to_string()))))
    }
}

/// One gateway's LUN over a malloc device (identity `uuid`) whose reservations live in
/// `store`.
pub(crate) fn shared_lun(store: &Arc<Store>, uuid: uuid::Uuid) -> Arc<Lun> {
    let inner = Arc::new(MallocBdev::new("S", BLOCKS, BS as u32, None).unwrap());
    let info = BdevInfo::new("S", "Malloc disk", BS as u32, BLOCKS, uuid);
    let bdev = Arc::new(SharedDev { inner, info, store: store.clone() });
    Lun::new(LunConfig { target_name: "iqn.2024-01.test:tgt".into(), ..LunConfig::default() }, bdev)
}
