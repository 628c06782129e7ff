//! The gateways that export one RBD image ([`GatewayGroup`], issue 23): membership,
//! liveness and fencing through the RADOS object `riser_gw.<image id>` next to the image.
//!
//! * The record: the object holds JSON `{"members": [Member...]}` (id = the RADOS client's
//!   instance id, name `host:pid`, addr = the client's address as the blocklist takes it,
//!   the port groups it serves, live or fenced), replaced whole by compare-and-swap on the
//!   object's version, like the persistent reservation state next to it.
//! * Liveness: every gateway keeps a liveness watch on the object (`rados_watch3` with a
//!   timeout of the lease, acknowledged by the librados callback itself), and its group
//!   thread notifies the object about once a second, waiting up to a third of the lease
//!   for acknowledgements. The notify's reply names the instance ids that acknowledged. A
//!   member listed live in the record that has not acknowledged one of this gateway's
//!   notifies for `lease` (from when this gateway first saw it), and at least the last 3 in a
//!   row, has stopped (killed, stopped, cut off): this gateway fences it. Only notifies this
//!   gateway's own watch acknowledged count: when the cluster is too slow to deliver any, no
//!   gateway fences another for it. A process that is stopped (SIGSTOP) or
//!   killed stops answering alike.
//! * Fencing, in this order: `rados_blocklist_add(addr)` (the monitors commit it; the OSDs
//!   refuse the client's operations from that osdmap on, including what it had in flight),
//!   then `rados_wait_for_latest_osdmap` (this gateway's later operations carry that epoch,
//!   so no OSD executes them before it knows of the blocklist: what Ceph's exclusive-lock
//!   breaking relies on; librados' blocklist_add already waits for it, the explicit call
//!   makes it independent of that), then the member is marked fenced in the record (CAS:
//!   when several survivors race, one write wins and the others find it fenced), then
//!   subscribers get [`GroupEvent::Changed`]. Only then may anyone act on its absence (a
//!   PR OUT whose notify it did not acknowledge completes, see `pr`).
//! * A fenced gateway notices: its operations fail with EBLOCKLISTED (ESHUTDOWN), or it
//!   reads the record and finds itself fenced. It emits [`GroupEvent::SelfFenced`]; its
//!   I/O channels fail new I/O at once ([`BdevError::Unavailable`]: a path that is down,
//!   to be retried elsewhere); and once the cluster answers it rejoins as a new client: a
//!   new connection (new instance id and address), a new member in the record, new image
//!   handles opened here (never on a reactor: `rbd_open` blocks) for every channel, which
//!   swaps to its new handle at its next submit or poll with nothing in flight, then
//!   [`GroupEvent::Rejoined`]. The shared-state handles (persistent reservations, LU
//!   events) use the group's current connection ([`StoreCell`]), so they move with it.
//! * Blocklisting is per client (connection): a gateway whose bdevs share a registered
//!   cluster connection is fenced for all of them; each bdev's group notices and rejoins
//!   on a connection of its own.
//! * A gateway that leaves (bdev deleted) takes itself out of the record, so nobody fences it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use riser_rbd::object::{CasError, NotifyReply, ObjectStore, Watch, WatchEvent};
use riser_rbd::{Cluster, ClusterConfig, Image, Pool, RbdError};
use serde::{Deserialize, Serialize};

use crate::{BdevError, GatewayGroup, GroupEvent, Member, MemberState, OnGroupEvent};

/// The lease when `bdev_rbd_create` names none: how long a gateway may go without
/// answering before the others fence it.
pub const DEFAULT_LEASE_S: u32 = 10;
/// The leases `bdev_rbd_create` accepts: at least 3 s (a loaded cluster answers a notify
/// in well under a second, and a gateway needs a few tries), at most 10 minutes.
pub const LEASE_RANGE: std::ops::RangeInclusive<u32> = 3..=600;
/// How often the group thread notifies (and reads the record).
const TICK: Duration = Duration::from_secs(1);
/// Fenced members kept in the record (for people); older ones are dropped.
const KEEP_FENCED: usize = 8;

/// The errno of an operation of a blocklisted client (EBLOCKLISTED).
const EBLOCKLISTED: i32 = libc::ESHUTDOWN;

/// The group object's content.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub members: Vec<Member>,
}

impl Record {
    /// An empty object (as created) is an empty group.
    pub fn decode(b: &[u8]) -> Result<Record, String> {
        if b.iter().all(u8::is_ascii_whitespace) {
            return Ok(Record::default());
        }
        serde_json::from_slice(b).map_err(|e| format!("the group record is not valid: {e}"))
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn get(&self, id: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Marks `id` fenced; false when it is not there or already fenced.
    pub fn fence(&mut self, id: u64) -> bool {
        match self.members.iter_mut().find(|m| m.id == id) {
            Some(m) if m.state == MemberState::Live => {
                m.state = MemberState::Fenced;
                true
            }
            _ => false,
        }
    }

    /// Adds or replaces `m` (by id); keeps the newest [`KEEP_FENCED`] fenced members.
    pub fn upsert(&mut self, m: Member) {
        match self.members.iter_mut().find(|x| x.id == m.id) {
            Some(x) => *x = m,
            None => self.members.push(m),
        }
        let fenced = self.members.iter().filter(|m| m.state == MemberState::Fenced).count();
        let mut drop = fenced.saturating_sub(KEEP_FENCED);
        self.members.retain(|m| {
            if drop > 0 && m.state == MemberState::Fenced {
                drop -= 1;
                return false;
            }
            true
        });
    }
}

/// A member is fenced only after missing at least this many of this gateway's notifies in a
/// row (besides a lease of silence): one notify that a stall of this gateway's own thread
/// left as the first after a long gap says nothing on its own.
const MIN_MISSED: u32 = 3;

/// Who has answered this gateway's notifies, and when (pure: the decision is unit tested).
#[derive(Default)]
pub(crate) struct Liveness {
    /// Instance id -> when it last acknowledged (or when it was first seen live in the
    /// record), and how many judged notifies it has missed since.
    last: HashMap<u64, (Instant, u32)>,
}

impl Liveness {
    /// Takes one notify's acknowledgements at `now`; returns the live members of `record`
    /// (other than `me`) that have not acknowledged for `lease`, over at least
    /// [`MIN_MISSED`] notifies: the ones to fence. A notify that this gateway's own watch
    /// did not acknowledge judges nobody: the cluster was too slow to deliver it (an
    /// overloaded OSD delays every watcher alike, and fencing the others for it would take
    /// every path down), or this gateway's watch is not there.
    pub fn observe(&mut self, record: &Record, me: u64, acked: &[u64], now: Instant, lease: Duration) -> Vec<u64> {
        for id in acked {
            self.last.insert(*id, (now, 0));
        }
        let judged = acked.contains(&me);
        let mut out = Vec::new();
        for m in &record.members {
            if m.id == me || m.state != MemberState::Live {
                continue;
            }
            let (since, missed) = self.last.entry(m.id).or_insert((now, 0));
            if !judged || *since == now {
                // Not judged, answered now, or first seen now.
                continue;
            }
            *missed += 1;
            if now.saturating_duration_since(*since) >= lease && *missed >= MIN_MISSED {
                out.push(m.id);
            }
        }
        // Forget who left the record (and who is fenced: a fenced id never comes back).
        self.last.retain(|id, _| record.get(*id).is_some_and(|m| m.state == MemberState::Live));
        out
    }
}

/// The group's current shared-object store, which the shared-state handles (`pr`) use
/// too: when a fenced gateway rejoins on a new connection, they move with it. Each handle
/// has its own cell on the group's store, which records the generation (connection) of
/// the handle's last successful watch: a rejoin waits until every handle watches on the
/// new connection before the gateway serves again (else it could act on shared state it
/// missed a change of).
#[derive(Clone)]
pub(crate) struct StoreCell {
    cur: Arc<RwLock<(u64, Arc<ObjectStore>)>>,
    watched: Arc<AtomicU64>,
}

impl StoreCell {
    fn new(s: Arc<ObjectStore>) -> StoreCell {
        StoreCell { cur: Arc::new(RwLock::new((0, s))), watched: Arc::new(AtomicU64::new(u64::MAX)) }
    }

    /// A cell for one shared-state handle, on the same store.
    fn handle(&self) -> StoreCell {
        StoreCell { cur: self.cur.clone(), watched: Arc::new(AtomicU64::new(u64::MAX)) }
    }

    pub fn get(&self) -> Arc<ObjectStore> {
        self.cur.read().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    fn set(&self, gen: u64, s: Arc<ObjectStore>) {
        *self.cur.write().unwrap_or_else(|p| p.into_inner()) = (gen, s);
    }

    pub fn pool_name(&self) -> String {
        self.get().pool_name().to_string()
    }

    pub fn read(&self, oid: &str) -> riser_rbd::Result<Option<(Vec<u8>, u64)>> {
        self.get().read(oid)
    }

    pub fn write_if(&self, oid: &str, data: &[u8], version: Option<u64>) -> Result<u64, CasError> {
        self.get().write_if(oid, data, version)
    }

    pub fn notify_reply(&self, oid: &str, payload: &[u8], timeout_ms: u64) -> riser_rbd::Result<NotifyReply> {
        self.get().notify_reply(oid, payload, timeout_ms)
    }

    /// Watches `oid`, kept by the cluster for `timeout_s` after this client stops pinging.
    pub fn watch(&self, oid: &str, timeout_s: u32) -> riser_rbd::Result<(Watch, Receiver<WatchEvent>)> {
        let (gen, store) = self.cur.read().unwrap_or_else(|p| p.into_inner()).clone();
        let w = store.watch(oid, timeout_s)?;
        self.watched.store(gen, Ordering::Release);
        Ok(w)
    }
}

/// One I/O channel's mailbox: the new image handle the group opened for it on rejoining.
#[derive(Default)]
pub(crate) struct ChannelSlot {
    pending: Mutex<Option<(u64, Image)>>,
}

impl ChannelSlot {
    /// The handle for generation `gen` or later, if the group has opened it.
    pub fn take(&self) -> Option<(u64, Image)> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The connection the group (and the bdev's handles) use now.
struct Conn {
    cluster: Arc<Cluster>,
    pool: Arc<Pool>,
}

/// The group of one RBD bdev (shared by the bdev, its channels, its shared-state handles
/// and the target layer's subscribers).
pub(crate) struct RbdGroup {
    oid: String,
    image_name: String,
    /// How to connect again after being fenced (the defaults applied).
    cfg: ClusterConfig,
    lease: Duration,
    /// `host:pid`.
    name: String,
    conn: Mutex<Conn>,
    store: StoreCell,
    /// The bdev's control handle (size, resize): reopened on rejoining.
    ctl: Arc<Mutex<Image>>,
    me: Mutex<Member>,
    view: Mutex<Vec<Member>>,
    fenced: AtomicBool,
    /// Bumped at every rejoin: a channel whose handle is older fails I/O until it swapped.
    generation: AtomicU64,
    subs: Mutex<Vec<Arc<OnGroupEvent>>>,
    /// `set_served` was called since the record last had it.
    served_dirty: AtomicBool,
    channels: Mutex<Vec<Weak<ChannelSlot>>>,
    /// The shared-state handles' watched generations ([`StoreCell`]).
    handles: Mutex<Vec<Weak<AtomicU64>>>,
    /// Old image handles the channels gave up, closed on the group thread (closing a
    /// blocklisted client's image may wait on the cluster).
    retired: Mutex<Vec<Image>>,
    stop: AtomicBool,
}

/// Stops the group thread when the bdev goes (the bdev owns it; the group itself may live
/// on in subscribers' hands).
pub(crate) struct GroupThread {
    group: Arc<RbdGroup>,
    thread: Option<JoinHandle<()>>,
}

fn host_pid() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "localhost".into());
    format!("{host}:{}", std::process::id())
}

fn member_of(cluster: &Cluster, name: &str, served: Vec<u32>) -> Result<Member, RbdError> {
    Ok(Member { id: cluster.instance_id(), name: name.to_string(), addr: cluster.addrs()?, served, state: MemberState::Live })
}

impl RbdGroup {
    /// Starts the group of image `image_id` (`image_name` in `pool`) on `cluster`: the
    /// thread joins the record at its first tick.
    pub fn start(
        cluster: Arc<Cluster>,
        pool: Arc<Pool>,
        cfg: ClusterConfig,
        image_id: &str,
        image_name: &str,
        lease_s: u32,
        ctl: Arc<Mutex<Image>>,
    ) -> Result<GroupThread, BdevError> {
        let unavailable = |e: RbdError| BdevError::Unavailable(e.to_string());
        let store = Arc::new(ObjectStore::open(&cluster, pool.name()).map_err(unavailable)?);
        let name = host_pid();
        let me = member_of(&cluster, &name, Vec::new()).map_err(unavailable)?;
        let g = Arc::new(RbdGroup {
            oid: format!("riser_gw.{image_id}"),
            image_name: image_name.to_string(),
            cfg,
            lease: Duration::from_secs(lease_s as u64),
            name,
            conn: Mutex::new(Conn { cluster, pool }),
            store: StoreCell::new(store),
            ctl,
            me: Mutex::new(me),
            view: Mutex::new(Vec::new()),
            fenced: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            subs: Mutex::new(Vec::new()),
            served_dirty: AtomicBool::new(false),
            channels: Mutex::new(Vec::new()),
            handles: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let t = g.clone();
        let thread = std::thread::Builder::new()
            .name("rbd-gw-group".into())
            .spawn(move || GroupLoop::new(t).run())
            .map_err(|e| BdevError::Io(format!("cannot start the gateway group thread: {e}")))?;
        Ok(GroupThread { group: g, thread: Some(thread) })
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// A shared-state handle's cell on the group's store (see [`StoreCell`]).
    pub fn store(&self) -> StoreCell {
        let c = self.store.handle();
        let mut l = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        l.retain(|w| w.strong_count() > 0);
        l.push(Arc::downgrade(&c.watched));
        c
    }

    /// For a channel opening now: the pool of the current connection, its generation, and
    /// the channel's mailbox for the handles of later connections. Under the channels' lock,
    /// which a rejoin holds while it switches connections: a channel either opens on the
    /// new connection or is in the list the rejoin opens new handles for.
    pub fn add_channel(&self) -> (Arc<Pool>, u64, Arc<ChannelSlot>) {
        let s = Arc::new(ChannelSlot::default());
        let mut l = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        l.retain(|w| w.strong_count() > 0);
        l.push(Arc::downgrade(&s));
        let pool = self.conn.lock().unwrap_or_else(|p| p.into_inner()).pool.clone();
        (pool, self.generation.load(Ordering::Acquire), s)
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A channel's old handle, to be closed on the group thread.
    pub fn retire(&self, img: Image) {
        self.retired.lock().unwrap_or_else(|p| p.into_inner()).push(img);
    }

    /// An I/O failed with EBLOCKLISTED: this gateway was fenced. Fails new I/O from now on
    /// (the group thread confirms, tells subscribers and rejoins).
    pub fn note_blocklisted(&self) {
        self.fenced.store(true, Ordering::Release);
    }

    fn emit(&self, e: GroupEvent) {
        let subs: Vec<Arc<OnGroupEvent>> = self.subs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for s in subs {
            s(&e);
        }
    }

    fn what(&self) -> String {
        format!("rbd {}/{} (image {})", self.store.pool_name(), self.oid, self.image_name)
    }

    /// Fences member `id`: blocklists its address, waits for the osdmap, marks it fenced
    /// in the record. Ok when it is fenced (by this call or before); Err when it cannot be
    /// (unknown id, the cluster refuses).
    pub fn fence(&self, id: u64, why: &str) -> Result<(), String> {
        let what = self.what();
        let (rec, _) = self.read_record()?;
        let Some(m) = rec.get(id).cloned() else {
            return Err(format!("{what}: client {id} is not a member of the group: cannot fence it"));
        };
        if m.state == MemberState::Fenced {
            return Ok(());
        }
        if id == self.me().id {
            return Err(format!("{what}: refusing to fence this gateway itself"));
        }
        let cluster = self.conn.lock().unwrap_or_else(|p| p.into_inner()).cluster.clone();
        log::warn!("{what}: fencing gateway {} (client {id}) at {}: {why}; blocklisting {}", m.name, m.addr, m.addr);
        cluster.blocklist_add(&m.addr, 0).map_err(|e| format!("{what}: blocklisting {} failed: {e}", m.addr))?;
        cluster.wait_for_latest_osdmap().map_err(|e| format!("{what}: waiting for the osdmap after blocklisting {}: {e}", m.addr))?;
        log::warn!("{what}: blocklisted {} (gateway {}, client {id}); marking it fenced", m.addr, m.name);
        for _ in 0..20 {
            let (mut rec, v) = self.read_record()?;
            if !rec.fence(id) {
                break;
            }
            match self.store.write_if(&self.oid, &rec.encode(), v) {
                Ok(_) => break,
                Err(CasError::Changed) => continue,
                Err(CasError::Failed(e)) => return Err(format!("{what}: marking client {id} fenced: {e}")),
            }
        }
        self.refresh_view()?;
        Ok(())
    }

    /// (record, version; `None`: no object yet).
    fn read_record(&self) -> Result<(Record, Option<u64>), String> {
        match self.store.read(&self.oid) {
            Ok(Some((b, v))) => Ok((Record::decode(&b).map_err(|e| format!("{}: {e}", self.what()))?, Some(v))),
            Ok(None) => Ok((Record::default(), None)),
            Err(e) => Err(format!("{}: reading the group record: {e}", self.what())),
        }
    }

    /// Reads the record into the view; emits Changed when it differs.
    fn refresh_view(&self) -> Result<Record, String> {
        let (rec, _) = self.read_record()?;
        self.set_view(&rec);
        Ok(rec)
    }

    fn set_view(&self, rec: &Record) {
        let changed = {
            let mut v = self.view.lock().unwrap_or_else(|p| p.into_inner());
            let changed = *v != rec.members;
            if changed {
                *v = rec.members.clone();
            }
            changed
        };
        if changed {
            self.emit(GroupEvent::Changed);
        }
    }

    /// The `driver_specific` view (`bdev_get_bdevs`).
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "group": self.describe(),
            "lease_s": self.lease.as_secs(),
            "me": self.me().id,
            "fenced": self.is_fenced(),
            "members": self.members(),
        })
    }
}

impl GatewayGroup for RbdGroup {
    fn describe(&self) -> String {
        format!("rbd {}/{}", self.store.pool_name(), self.oid)
    }

    fn me(&self) -> Member {
        self.me.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn members(&self) -> Vec<Member> {
        let v = self.view.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if v.is_empty() {
            return vec![self.me()];
        }
        v
    }

    fn set_served(&self, tpg_ids: &[u32]) {
        let mut ids = tpg_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        self.me.lock().unwrap_or_else(|p| p.into_inner()).served = ids;
        self.served_dirty.store(true, Ordering::Release);
    }

    fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    fn subscribe(&self, on_event: OnGroupEvent) {
        self.subs.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::new(on_event));
    }
}

impl GroupThread {
    pub fn group(&self) -> &Arc<RbdGroup> {
        &self.group
    }
}

impl Drop for GroupThread {
    /// Stops the thread (it leaves the record) and waits for it, 5 s at most.
    fn drop(&mut self) {
        self.group.stop.store(true, Ordering::Release);
        let Some(t) = self.thread.take() else { return };
        if t.thread().id() == std::thread::current().id() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            log::warn!("{}: the group thread is still busy; not waiting for it", self.group.what());
        }
    }
}

/// The group thread's state.
struct GroupLoop {
    g: Arc<RbdGroup>,
    watch: Option<(Watch, Receiver<WatchEvent>)>,
    live: Liveness,
    /// This gateway is in the record (joined).
    joined: bool,
    /// SelfFenced was emitted and the rejoin has not finished.
    fenced_since: Option<Instant>,
    last_error: Option<String>,
}

/// Whether an error text is a blocklisted client's.
fn is_blocklisted(e: &RbdError) -> bool {
    e.errno() == EBLOCKLISTED
}

impl GroupLoop {
    fn new(g: Arc<RbdGroup>) -> GroupLoop {
        GroupLoop { g, watch: None, live: Liveness::default(), joined: false, fenced_since: None, last_error: None }
    }

    fn sleep_until(&self, t: Instant) {
        while !self.g.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= t {
                return;
            }
            std::thread::sleep((t - now).min(Duration::from_millis(100)));
        }
    }

    fn run(mut self) {
        while !self.g.stop.load(Ordering::Acquire) {
            let start = Instant::now();
            self.g.retired.lock().unwrap_or_else(|p| p.into_inner()).clear();
            let r = if self.fenced_since.is_some() || self.g.is_fenced() { self.rejoin() } else { self.tick() };
            match r {
                Ok(()) => {
                    if self.last_error.take().is_some() {
                        log::info!("{}: the group answers again", self.g.what());
                    }
                }
                Err(e) => {
                    // Said once per kind of failure, not every second.
                    if self.last_error.as_deref() != Some(e.as_str()) {
                        log::warn!("{e}");
                        self.last_error = Some(e);
                    }
                }
            }
            self.sleep_until(start + TICK);
        }
        self.leave();
    }

    /// This gateway was fenced: fail I/O, tell the subscribers (once).
    fn self_fenced(&mut self, why: &str) {
        if self.fenced_since.is_none() {
            self.fenced_since = Some(Instant::now());
            self.g.fenced.store(true, Ordering::Release);
            self.watch = None;
            let me = self.g.me();
            log::error!(
                "{}: this gateway (client {} at {}) was fenced by the others: {why}; failing its I/O and rejoining as a new client",
                self.g.what(),
                me.id,
                me.addr
            );
            self.g.emit(GroupEvent::SelfFenced);
        }
    }

    fn check_blocklisted<T>(&mut self, r: Result<T, RbdError>, doing: &str) -> Result<T, String> {
        r.map_err(|e| {
            if is_blocklisted(&e) {
                self.self_fenced(&format!("{doing}: {e}"));
            }
            format!("{}: {doing}: {e}", self.g.what())
        })
    }

    /// One round while live: the record (join, served, am I fenced?), the watch, a notify,
    /// and fencing whoever has been silent for the lease.
    fn tick(&mut self) -> Result<(), String> {
        let g = self.g.clone();
        let me = g.me();
        let r = g.store.read(&g.oid);
        let read = self.check_blocklisted(r, "reading the group record")?;
        let (rec, version) = match read {
            Some((b, v)) => (Record::decode(&b).map_err(|e| format!("{}: {e}", g.what()))?, Some(v)),
            None => (Record::default(), None),
        };
        match rec.get(me.id) {
            Some(m) if m.state == MemberState::Fenced => {
                self.self_fenced("the group record lists it fenced");
                return Ok(());
            }
            Some(m) if m.served == me.served && m.addr == me.addr && !g.served_dirty.load(Ordering::Acquire) => {}
            _ => {
                // Join (or publish what it serves).
                g.served_dirty.store(false, Ordering::Release);
                let mut rec = rec;
                rec.upsert(me.clone());
                let w = g.store.write_if(&g.oid, &rec.encode(), version);
                match w {
                    Ok(_) => {
                        if !self.joined {
                            log::info!("{}: joined as client {} at {} ({}), lease {} s", g.what(), me.id, me.addr, me.name, g.lease.as_secs());
                            self.joined = true;
                        }
                        g.set_view(&rec);
                    }
                    Err(CasError::Changed) => g.served_dirty.store(true, Ordering::Release),
                    Err(CasError::Failed(e)) => {
                        g.served_dirty.store(true, Ordering::Release);
                        return self.check_blocklisted(Err(e), "writing the group record");
                    }
                }
                // The next tick reads what was written and notifies.
                return Ok(());
            }
        }
        g.set_view(&rec);
        // The liveness watch (answers the others' notifies).
        if let Some((w, rx)) = &self.watch {
            let broken = match rx.try_recv() {
                Ok(WatchEvent::Error(errno)) => Some(errno),
                Err(TryRecvError::Disconnected) => Some(libc::ENOTCONN),
                _ => w.check().err().map(|e| e.errno()),
            };
            // Drain the notifies (already acknowledged by the callback).
            while let Ok(WatchEvent::Notify { .. }) = rx.try_recv() {}
            if let Some(errno) = broken {
                self.watch = None;
                if errno == EBLOCKLISTED {
                    self.self_fenced("its liveness watch was refused (blocklisted)");
                    return Ok(());
                }
                log::warn!("{}: liveness watch lost ({}); watching again", g.what(), riser_rbd::errno_str(errno));
            }
        }
        if self.watch.is_none() {
            let lease_s = g.lease.as_secs() as u32;
            let w = g.store.get().watch_acking(&g.oid, lease_s);
            self.watch = Some(self.check_blocklisted(w, "watching the group record")?);
        }
        // Who answers.
        let timeout_ms = (g.lease.as_millis() as u64 / 3).clamp(1000, 5000);
        let r = g.store.notify_reply(&g.oid, b"", timeout_ms);
        let reply = self.check_blocklisted(r, "notifying the group")?;
        let silent = self.live.observe(&rec, me.id, &reply.acked, Instant::now(), g.lease);
        for id in silent {
            if self.g.stop.load(Ordering::Acquire) {
                break;
            }
            let why = format!("no answer to this gateway's notifies for {} s (the lease)", g.lease.as_secs());
            g.fence(id, &why)?;
        }
        Ok(())
    }

    /// Connects again as a new client and rejoins; every channel gets a new image handle.
    fn rejoin(&mut self) -> Result<(), String> {
        let g = self.g.clone();
        if self.fenced_since.is_none() {
            // A channel saw EBLOCKLISTED first.
            self.self_fenced("its I/O was refused (blocklisted)");
        }
        let what = g.what();
        let cluster = Cluster::connect(&g.cfg).map_err(|e| format!("{what}: rejoining: cannot connect: {e}"))?;
        let pool = Pool::open(&cluster, g.store.get().pool_name()).map_err(|e| format!("{what}: rejoining: {e}"))?;
        let store = Arc::new(ObjectStore::open(&cluster, pool.name()).map_err(|e| format!("{what}: rejoining: {e}"))?);
        let mut me = g.me();
        me = member_of(&cluster, &g.name, std::mem::take(&mut me.served)).map_err(|e| format!("{what}: rejoining: {e}"))?;
        let ctl = Image::open(&pool, &g.image_name).map_err(|e| format!("{what}: rejoining: {e}"))?;
        // Join the record as the new client.
        for _ in 0..20 {
            let (mut rec, v) = match store.read(&g.oid) {
                Ok(Some((b, v))) => (Record::decode(&b).map_err(|e| format!("{what}: {e}"))?, Some(v)),
                Ok(None) => (Record::default(), None),
                Err(e) => return Err(format!("{what}: rejoining: {e}")),
            };
            rec.upsert(me.clone());
            match store.write_if(&g.oid, &rec.encode(), v) {
                Ok(_) => break,
                Err(CasError::Changed) => continue,
                Err(CasError::Failed(e)) => return Err(format!("{what}: rejoining: {e}")),
            }
        }
        let old = std::mem::replace(&mut *g.ctl.lock().unwrap_or_else(|p| p.into_inner()), ctl);
        g.retire(old);
        // Switch connections; channels opening from here on use the new one.
        let (gen, slots) = {
            let l = g.channels.lock().unwrap_or_else(|p| p.into_inner());
            *g.conn.lock().unwrap_or_else(|p| p.into_inner()) = Conn { cluster, pool: pool.clone() };
            let gen = g.generation.fetch_add(1, Ordering::AcqRel) + 1;
            (gen, l.iter().filter_map(Weak::upgrade).collect::<Vec<Arc<ChannelSlot>>>())
        };
        g.store.set(gen, store);
        // Answer the others' liveness notifies from now on (the new member is in the record).
        self.watch = g.store.get().watch_acking(&g.oid, g.lease.as_secs() as u32).ok();
        *g.me.lock().unwrap_or_else(|p| p.into_inner()) = me.clone();
        // New handles for the channels of the old connection (each swaps at its next poll).
        for s in &slots {
            match Image::open(&pool, &g.image_name) {
                Ok(img) => *s.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some((gen, img)),
                Err(e) => log::error!("{what}: rejoining: a channel's image handle: {e}; that reactor fails the image's I/O"),
            }
        }
        // Serve again only once every shared-state handle watches on the new connection (its
        // watch thread notices the old watch broke and re-watches within a few seconds), and
        // has re-read what changed meanwhile (it does right after re-watching).
        let deadline = Instant::now() + g.lease;
        let behind = || {
            let l = g.handles.lock().unwrap_or_else(|p| p.into_inner());
            l.iter().filter_map(Weak::upgrade).filter(|w| w.load(Ordering::Acquire) != gen).count()
        };
        while behind() > 0 && Instant::now() < deadline && !g.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(50));
        }
        match behind() {
            0 => std::thread::sleep(Duration::from_millis(200)),
            n => log::warn!("{what}: rejoining: {n} shared-state handle(s) not watching on the new connection after {} s; serving anyway", g.lease.as_secs()),
        }
        self.live = Liveness::default();
        self.joined = true;
        let took = self.fenced_since.take().map(|t| t.elapsed()).unwrap_or_default();
        g.fenced.store(false, Ordering::Release);
        log::warn!("{what}: rejoined as a new client {} at {} after {:.1} s fenced", me.id, me.addr, took.as_secs_f64());
        g.emit(GroupEvent::Rejoined);
        let _ = g.refresh_view();
        Ok(())
    }

    /// Takes this gateway out of the record (a clean exit is not a failure to fence).
    fn leave(&mut self) {
        self.watch = None;
        if self.g.is_fenced() {
            return;
        }
        let id = self.g.me().id;
        for _ in 0..5 {
            let Ok((mut rec, v)) = self.g.read_record() else { return };
            if rec.get(id).is_none() {
                return;
            }
            rec.members.retain(|m| m.id != id);
            match self.g.store.write_if(&self.g.oid, &rec.encode(), v) {
                Ok(_) => {
                    log::info!("{}: left the group (client {id})", self.g.what());
                    return;
                }
                Err(CasError::Changed) => continue,
                Err(CasError::Failed(_)) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: u64, state: MemberState) -> Member {
        Member { id, name: format!("h:{id}"), addr: format!("v2:127.0.0.1:0/{id}"), served: vec![1], state }
    }

    #[test]
    fn record_round_trips_and_empty_is_an_empty_group() {
        let r = Record { members: vec![m(1, MemberState::Live), m(2, MemberState::Fenced)] };
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let j: serde_json::Value = serde_json::from_slice(&r.encode()).unwrap();
        assert_eq!(j["members"][1]["state"], "fenced");
        assert_eq!(j["members"][0]["addr"], "v2:127.0.0.1:0/1");
        assert_eq!(Record::decode(b"").unwrap(), Record::default());
        assert!(Record::decode(b"{not json").unwrap_err().contains("not valid"));
    }

    #[test]
    fn fence_and_upsert() {
        let mut r = Record { members: vec![m(1, MemberState::Live)] };
        assert!(r.fence(1));
        assert!(!r.fence(1), "already fenced");
        assert!(!r.fence(9), "not a member");
        r.upsert(m(2, MemberState::Live));
        r.upsert(Member { served: vec![1, 2], ..m(2, MemberState::Live) });
        assert_eq!(r.members.len(), 2);
        assert_eq!(r.get(2).unwrap().served, vec![1, 2]);
        // Old fenced members are dropped beyond KEEP_FENCED.
        for i in 10..30 {
            r.upsert(m(i, MemberState::Fenced));
        }
        assert_eq!(r.members.iter().filter(|m| m.state == MemberState::Fenced).count(), KEEP_FENCED);
        assert!(r.get(2).is_some(), "live members stay");
        assert!(r.get(29).is_some(), "the newest fenced stay");
    }

    #[test]
    fn a_member_silent_for_the_lease_is_fenced_others_are_not() {
        let lease = Duration::from_secs(10);
        let rec = Record { members: vec![m(1, MemberState::Live), m(2, MemberState::Live), m(3, MemberState::Fenced)] };
        let mut l = Liveness::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // 1 is me; 2 answers at first, then goes silent; 3 is already fenced.
        assert!(l.observe(&rec, 1, &[1, 2], t0, lease).is_empty());
        assert!(l.observe(&rec, 1, &[1], at(5), lease).is_empty());
        assert!(l.observe(&rec, 1, &[1], at(9), lease).is_empty());
        assert_eq!(l.observe(&rec, 1, &[1], at(10), lease), vec![2]);
        // Answering again in time resets the clock.
        assert!(l.observe(&rec, 1, &[1, 2], at(11), lease).is_empty());
        for s in [14, 17, 20] {
            assert!(l.observe(&rec, 1, &[1], at(s), lease).is_empty(), "{s}");
        }
        assert_eq!(l.observe(&rec, 1, &[1], at(21), lease), vec![2]);
        // I never fence myself, even when my own acknowledgement is missing.
        assert!(!l.observe(&rec, 1, &[], at(100), lease).contains(&1));
    }

    /// A notify this gateway's own watch did not acknowledge (the cluster too slow to deliver
    /// any, or this gateway's watch gone) judges nobody, however long it lasts; and after a
    /// long gap in this gateway's own notifies (its thread stalled), one missed notify is not
    /// enough.
    #[test]
    fn only_notifies_this_gateway_saw_itself_judge_the_others() {
        let lease = Duration::from_secs(10);
        let rec = Record { members: vec![m(1, MemberState::Live), m(2, MemberState::Live)] };
        let mut l = Liveness::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(l.observe(&rec, 1, &[1, 2], t0, lease).is_empty());
        for s in 1..60 {
            assert!(l.observe(&rec, 1, &[], at(s), lease).is_empty(), "an overloaded cluster at {s} s");
        }
        // This gateway's thread sends nothing for 30 s, then one notify 2 misses.
        assert!(l.observe(&rec, 1, &[1, 2], at(100), lease).is_empty());
        assert!(l.observe(&rec, 1, &[1], at(130), lease).is_empty(), "one notify after a stall");
        assert!(l.observe(&rec, 1, &[1], at(131), lease).is_empty());
        assert_eq!(l.observe(&rec, 1, &[1], at(132), lease), vec![2], "three in a row, a lease after its last answer");
    }

    #[test]
    fn a_member_first_seen_gets_a_whole_lease() {
        let lease = Duration::from_secs(10);
        let mut l = Liveness::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let rec = Record { members: vec![m(1, MemberState::Live)] };
        assert!(l.observe(&rec, 1, &[1], t0, lease).is_empty());
        // 5 joins (or this gateway starts after 5 died): its clock starts when first seen.
        let rec = Record { members: vec![m(1, MemberState::Live), m(5, MemberState::Live)] };
        for s in [30, 33, 36, 39] {
            assert!(l.observe(&rec, 1, &[1], at(s), lease).is_empty(), "{s}");
        }
        assert_eq!(l.observe(&rec, 1, &[1], at(40), lease), vec![5]);
        // Once fenced in the record it is forgotten, and never fenced twice.
        let rec = Record { members: vec![m(1, MemberState::Live), m(5, MemberState::Fenced)] };
        assert!(l.observe(&rec, 1, &[1], at(50), lease).is_empty());
        assert!(!l.last.contains_key(&5));
    }
}
