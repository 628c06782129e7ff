//! The connection registry: what the control plane sees of every live connection
//! (`iscsi_get_connections`), and the switch it uses to end one (session reinstatement,
//! target deletion, shutdown).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use riser_reactor::ReactorHandle;
use serde_json::{json, Value};

/// What the control plane sees of a live connection (`iscsi_get_connections`), and the
/// switch it uses to end it (session reinstatement, target deletion, shutdown).
pub struct ConnInfo {
    pub id: u64,
    pub cid: u16,
    pub tsih: u16,
    pub isid: u64,
    pub reactor: usize,
    pub lcore: usize,
    pub initiator_name: String,
    pub initiator_addr: String,
    pub target_addr: String,
    pub target_node_name: String,
    pub transport: &'static str,
    /// Negotiated keys, as JSON.
    pub params: Value,
    /// Set to ask the connection to close.
    pub kill: AtomicBool,
    pub pdus_in: AtomicU64,
    pub tasks_done: AtomicU64,
}

impl ConnInfo {
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "cid": self.cid,
            "tsih": self.tsih,
            "isid": format!("0x{:012x}", self.isid),
            "lcore_id": self.lcore,
            "reactor": self.reactor,
            "initiator_name": self.initiator_name,
            "initiator_addr": self.initiator_addr,
            "target_addr": self.target_addr,
            "target_node_name": self.target_node_name,
            "transport": self.transport,
            "negotiated": self.params,
            "pdus_in": self.pdus_in.load(Ordering::Relaxed),
            "tasks_done": self.tasks_done.load(Ordering::Relaxed),
        })
    }
}

type GoneHook = Box<dyn Fn(&ConnInfo) + Send + Sync>;

/// Every live connection, for listing and for closing by session or node.
#[derive(Default)]
pub struct ConnRegistry {
    conns: Mutex<HashMap<u64, Arc<ConnInfo>>>,
    next_id: AtomicU64,
    reactors: Option<ReactorHandle>,
    on_gone: Mutex<Option<GoneHook>>,
}

impl ConnRegistry {
    /// A registry that keeps the reactors' load counters (connections per reactor) right.
    pub fn with_reactors(reactors: ReactorHandle) -> Self {
        ConnRegistry { reactors: Some(reactors), ..Default::default() }
    }

    /// Called (on the connection's reactor) after a connection is gone.
    pub fn on_gone(&self, f: impl Fn(&ConnInfo) + Send + Sync + 'static) {
        *self.on_gone.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnInfo>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn add(&self, c: Arc<ConnInfo>) {
        self.lock().insert(c.id, c);
    }

    pub fn remove(&self, id: u64) {
        let gone = self.lock().remove(&id);
        if let Some(c) = gone {
            if let Some(r) = &self.reactors {
                r.add_load(c.reactor, -1);
            }
            if let Some(f) = self.on_gone.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                f(&c);
            }
        }
    }

    pub fn list(&self) -> Vec<Arc<ConnInfo>> {
        let mut v: Vec<_> = self.lock().values().cloned().collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Asks every connection matching `pred` to close; returns how many.
    pub fn kill_where(&self, pred: impl Fn(&ConnInfo) -> bool) -> usize {
        let conns = self.lock();
        let mut n = 0;
        for c in conns.values().filter(|c| pred(c)) {
            c.kill.store(true, Ordering::Release);
            n += 1;
        }
        n
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}
