//! The connection registry: what the control plane sees of every live connection
//! (`iscsi_get_connections`), and the switch it uses to end one (session reinstatement,
//! target deletion, shutdown).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use riser_config::recheck::SessionAuth;
use riser_iscsi::ffp::CopyStats;
use riser_reactor::ReactorHandle;
use serde_json::{json, Value};

use crate::logout::LogoutSlot;
use crate::stats::LogLimiter;

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
    /// The portal group the connection logged in through.
    pub pg_tag: u32,
    pub transport: &'static str,
    /// Negotiated keys, as JSON.
    pub params: Value,
    /// Set to ask the connection to close.
    pub kill: AtomicBool,
    pub pdus_in: AtomicU64,
    pub tasks_done: AtomicU64,
    /// SCSI tasks in flight on this connection (submitted, result not yet collected):
    /// stored by its reactor, the only writer, so a plain relaxed store, no read-modify-write.
    pub queue_depth: AtomicU32,
    /// Payload bytes copied by the CPU on this connection (published by its reactor).
    pub copies: CopyCounters,
    /// A logout the control plane asks for (`iscsi_target_node_request_logout`, or a change
    /// of access rules that no longer admit the session).
    pub logout: LogoutSlot,
    /// What the session proved at login (its CHAP user), for the re-check after a change.
    pub auth: SessionAuth,
    /// Milliseconds since the initiator's last PDU (answers to NOP-In pings aside), as of
    /// the connection's last timer tick (stored by its reactor): which discovery session
    /// gives way to a newcomer ([`crate::IscsiServer`]'s session table).
    pub idle_ms: AtomicU64,
    /// Reactor passes this connection skipped at once: provably nothing to do (its socket
    /// unreadable, nothing queued, no task, timer not due). Stored by its reactor.
    pub skipped_polls: AtomicU64,
    /// Reactor passes this connection polled fully. Stored by its reactor.
    pub full_polls: AtomicU64,
}

/// Payload copies ([`CopyStats`]) as counters other threads can read.
#[derive(Debug, Default)]
pub struct CopyCounters {
    read_bytes: AtomicU64,
    solicited_bytes: AtomicU64,
    unsolicited_bytes: AtomicU64,
    staged_bytes: AtomicU64,
}

impl CopyCounters {
    pub fn add(&self, c: CopyStats) {
        self.read_bytes.fetch_add(c.read_bytes, Ordering::Relaxed);
        self.solicited_bytes.fetch_add(c.solicited_bytes, Ordering::Relaxed);
        self.unsolicited_bytes.fetch_add(c.unsolicited_bytes, Ordering::Relaxed);
        self.staged_bytes.fetch_add(c.staged_bytes, Ordering::Relaxed);
    }

    pub fn get(&self) -> CopyStats {
        CopyStats {
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            solicited_bytes: self.solicited_bytes.load(Ordering::Relaxed),
            unsolicited_bytes: self.unsolicited_bytes.load(Ordering::Relaxed),
            staged_bytes: self.staged_bytes.load(Ordering::Relaxed),
        }
    }
}

/// `{"read_bytes": n, "solicited_bytes": n, "unsolicited_bytes": n, "staged_bytes": n}`.
pub fn copies_json(c: CopyStats) -> Value {
    json!({
        "read_bytes": c.read_bytes,
        "solicited_bytes": c.solicited_bytes,
        "unsolicited_bytes": c.unsolicited_bytes,
        "staged_bytes": c.staged_bytes,
    })
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
            "pg_tag": self.pg_tag,
            "transport": self.transport,
            "negotiated": self.params,
            "pdus_in": self.pdus_in.load(Ordering::Relaxed),
            "tasks_done": self.tasks_done.load(Ordering::Relaxed),
            "queue_depth": self.queue_depth.load(Ordering::Relaxed),
            "payload_copies": copies_json(self.copies.get()),
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
    /// The copies of connections that are gone.
    ended_copies: CopyCounters,
    /// Discovery sessions closed for being idle, and evicted for a newcomer: logged at most
    /// once a second each.
    pub(crate) idle_log: LogLimiter,
    pub(crate) evict_log: LogLimiter,
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
        let gone = {
            let mut conns = self.lock();
            // Counted as ended before it leaves the list, so no stats call misses it.
            if let Some(c) = conns.get(&id) {
                self.ended_copies.add(c.copies.get());
            }
            conns.remove(&id)
        };
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

    /// Payload bytes copied on every connection, live and gone, since start.
    pub fn copies(&self) -> CopyStats {
        let mut total = self.ended_copies.get();
        for c in self.lock().values() {
            total += c.copies.get();
        }
        total
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}
