//! Ceph RBD images as bdevs (SPDK's `bdev_rbd_*`): registered cluster connections, one
//! bdev per image, and the RPCs.
//!
//! * Clusters: `bdev_rbd_register_cluster` connects once (librados) and the bdevs that name
//!   it share that connection; a bdev without `cluster_name` connects on its own from its
//!   `user_id` and `config` (SPDK's way). Unless configured otherwise riser sets
//!   `rbd_cache = false` (riser caches no data, so gateways sharing an image stay coherent and
//!   an acknowledged write is in the cluster) and 30 s operation timeouts (a cluster that
//!   goes away fails I/O instead of hanging it; librados reconnects by itself when it is back).
//! * Data path: every I/O channel (one per reactor) opens its own image handle with its own
//!   eventfd; I/O is submitted with librbd's asynchronous calls straight from/into the
//!   caller's buffer (`rbd_aio_readv`/`writev`, one segment), and completions are collected in
//!   the channel's `poll` with `rbd_poll_io_events`: no librbd thread touches reactor state.
//!   No exclusive lock is taken for plain I/O, so another gateway may open the same image.
//! * COMPARE AND WRITE of one 512-byte block is `rbd_aio_compare_and_write`: the compare is
//!   atomic in the cluster, across gateways. librbd 16.2 does it within one 512-byte sector
//!   only, so longer ones (and 4096-byte blocks) are read, compared and written by the SCSI
//!   layer, atomic against this riser's own writes only.
//! * Errors: a timeout or a lost connection is [`BdevError::Unavailable`] (the SCSI layer
//!   answers HARDWARE ERROR / LOGICAL UNIT COMMUNICATION FAILURE, a path error to an initiator's
//!   multipath); other failures are [`BdevError::Io`]; every message names the image and the
//!   errno.

mod group;
mod pr;
mod rpc;

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use riser_rbd::{AioDone, AioOp, Cluster, ClusterConfig, Image, Pool, RbdError};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::io::{validate, DoneQueue, FailedChannel};
use group::{ChannelSlot, GroupThread, RbdGroup, DEFAULT_LEASE_S, LEASE_RANGE};
pub(crate) use rpc::register;
pub use rpc::{BdevRbdCreate, BdevRbdGetClustersInfo, BdevRbdRegisterCluster, BdevRbdResize};
use crate::GatewayGroup;
use crate::{Bdev, BdevError, BdevInfo, BdevIo, BdevRegistry, IoChannel, IoCompletion, IoKind, RegistryError, SUPPORTED_BLOCK_SIZES};

pub const PRODUCT: &str = "Ceph Rbd Disk";

/// Options riser sets on every cluster connection unless its configuration names them.
const DEFAULT_OPTIONS: [(&str, &str); 4] =
    [("rbd_cache", "false"), ("rados_osd_op_timeout", "30"), ("rados_mon_op_timeout", "30"), ("client_mount_timeout", "30")];

/// A registered cluster (`bdev_rbd_register_cluster`).
pub(crate) struct RegisteredCluster {
    name: String,
    cfg: ClusterConfig,
    /// `config_param` as given (for `bdev_rbd_get_clusters_info` and save_config).
    config_param: Option<BTreeMap<String, String>>,
    cluster: Arc<Cluster>,
}

/// The registered clusters, kept in the [`BdevRegistry`].
#[derive(Default)]
pub(crate) struct RbdClusters {
    list: Vec<RegisteredCluster>,
    /// The RBD bdevs by name (the registry holds them wrapped): for `bdev_rbd_resize`.
    bdevs: Vec<(String, std::sync::Weak<RbdBdev>)>,
}

fn with_defaults(mut cfg: ClusterConfig) -> ClusterConfig {
    for (k, v) in DEFAULT_OPTIONS {
        let norm = |s: &str| s.replace(' ', "_");
        if !cfg.config_param.iter().any(|(key, _)| norm(key) == k) {
            // Before the user's options so theirs win; after the file (set in order).
            cfg.config_param.insert(0, (k.to_string(), v.to_string()));
        }
    }
    cfg
}

fn rbd_err(e: RbdError) -> RegistryError {
    RegistryError::File { errno: -e.errno(), message: e.to_string() }
}

impl BdevRegistry {
    /// `bdev_rbd_register_cluster`: connects now, so a wrong address or key fails here.
    pub fn rbd_register_cluster(
        &mut self,
        name: &str,
        user_id: Option<String>,
        config_param: Option<BTreeMap<String, String>>,
        config_file: Option<String>,
        key_file: Option<String>,
    ) -> Result<String, RegistryError> {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(RegistryError::BadName(name.to_string()));
        }
        if self.rbd.list.iter().any(|c| c.name == name) {
            return Err(RegistryError::Exists(format!("rbd cluster {name}")));
        }
        let cfg = ClusterConfig {
            user_id,
            config_file,
            config_param: config_param.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect(),
            key_file,
        };
        let cluster = Cluster::connect(&with_defaults(cfg.clone())).map_err(rbd_err)?;
        log::info!("rbd cluster {name} connected (fsid {})", cluster.fsid().unwrap_or_default());
        self.rbd.list.push(RegisteredCluster { name: name.to_string(), cfg, config_param, cluster });
        Ok(name.to_string())
    }

    /// `bdev_rbd_unregister_cluster`: refused while a bdev uses the connection.
    pub fn rbd_unregister_cluster(&mut self, name: &str) -> Result<(), RegistryError> {
        let i = self.rbd.list.iter().position(|c| c.name == name).ok_or_else(|| RegistryError::NotFound(format!("rbd cluster {name}")))?;
        // Each bdev (and each of its channels) holds the connection through its pool.
        if Arc::strong_count(&self.rbd.list[i].cluster) > 1 {
            let users: Vec<String> = self
                .iter()
                .filter(|(b, _)| b.info().product_name == PRODUCT && b.config_json().1["cluster_name"] == name)
                .map(|(b, _)| b.info().name.clone())
                .collect();
            return Err(RegistryError::Claimed { name: format!("rbd cluster {name}"), owner: format!("bdevs [{}]", users.join(", ")) });
        }
        self.rbd.list.remove(i);
        log::info!("rbd cluster {name} unregistered");
        Ok(())
    }

    /// `bdev_rbd_get_clusters_info`'s entries (all, or the one named).
    pub fn rbd_clusters_info(&self, name: Option<&str>) -> Result<Vec<Value>, RegistryError> {
        let list: Vec<Value> = self.rbd.list.iter().filter(|c| name.is_none_or(|n| n == c.name)).map(cluster_json).collect();
        match name {
            Some(n) if list.is_empty() => Err(RegistryError::NotFound(format!("rbd cluster {n}"))),
            _ => Ok(list),
        }
    }

    /// The `bdev_rbd_register_cluster` calls that recreate the clusters (save_config puts
    /// them before the bdevs).
    pub fn rbd_cluster_calls(&self) -> Vec<Value> {
        self.rbd.list.iter().map(|c| json!({"method": "bdev_rbd_register_cluster", "params": cluster_params(c)})).collect()
    }

    /// `bdev_rbd_create`.
    pub fn create_rbd(&mut self, p: BdevRbdCreate) -> Result<String, RegistryError> {
        let name = match &p.name {
            Some(n) => n.clone(),
            None => self.next_name("Ceph"),
        };
        if name.is_empty() || name.len() > 255 || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(RegistryError::BadName(name));
        }
        if self.contains(&name) {
            return Err(RegistryError::Exists(name));
        }
        if !SUPPORTED_BLOCK_SIZES.contains(&p.block_size) {
            return Err(RegistryError::BadBlockSize(p.block_size));
        }
        if let Some(l) = p.lease_s.filter(|l| !LEASE_RANGE.contains(l)) {
            return Err(RegistryError::File {
                errno: -libc::EINVAL,
                message: format!("lease_s {l} is out of range ({}..={} s)", LEASE_RANGE.start(), LEASE_RANGE.end()),
            });
        }
        // The connection, and how to make a new one (a fenced gateway rejoins as a new client).
        let (cluster, cfg) = match &p.cluster_name {
            Some(c) => {
                if p.user_id.is_some() || p.config.is_some() {
                    return Err(RegistryError::File {
                        errno: -libc::EINVAL,
                        message: "cluster_name excludes user_id and config (the cluster has its own)".into(),
                    });
                }
                self.rbd
                    .list
                    .iter()
                    .find(|x| &x.name == c)
                    .map(|x| (x.cluster.clone(), with_defaults(x.cfg.clone())))
                    .ok_or_else(|| RegistryError::NotFound(format!("rbd cluster {c} (register it with bdev_rbd_register_cluster)")))?
            }
            None => {
                let cfg = ClusterConfig {
                    user_id: p.user_id.clone(),
                    config_file: None,
                    config_param: p.config.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    key_file: None,
                };
                let cfg = with_defaults(cfg);
                (Cluster::connect(&cfg).map_err(rbd_err)?, cfg)
            }
        };
        let b = Arc::new(RbdBdev::open(&name, cluster, cfg, p)?);
        self.register(b.clone())?;
        self.rbd.bdevs.retain(|(n, w)| n != &name && w.strong_count() > 0);
        self.rbd.bdevs.push((name.clone(), Arc::downgrade(&b)));
        Ok(name)
    }

    /// `bdev_rbd_resize`: grows the image to `new_size_mib` MiB and the bdev with it.
    pub fn rbd_resize(&mut self, name: &str, new_size_mib: u64) -> Result<u64, RegistryError> {
        let b = self.get(name).filter(|b| b.info().product_name == PRODUCT).ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let bytes = new_size_mib.checked_mul(1 << 20).ok_or(RegistryError::ZeroBlocks)?;
        let old = b.info().size_bytes();
        if bytes < old {
            return Err(RegistryError::File {
                errno: -libc::EINVAL,
                message: format!("bdev {name}: new_size {new_size_mib} MiB is smaller than the current {} MiB (RBD bdevs only grow)", old >> 20),
            });
        }
        let rbd =
            self.rbd.bdevs.iter().find(|(n, _)| n == name).and_then(|(_, w)| w.upgrade()).ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        rbd.resize(bytes)?;
        self.rescan(name, Some(PRODUCT))
    }
}

fn cluster_params(c: &RegisteredCluster) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("name".into(), json!(c.name));
    if let Some(u) = &c.cfg.user_id {
        o.insert("user_id".into(), json!(u));
    }
    if let Some(p) = &c.config_param {
        o.insert("config_param".into(), json!(p));
    }
    if let Some(f) = &c.cfg.config_file {
        o.insert("config_file".into(), json!(f));
    }
    if let Some(k) = &c.cfg.key_file {
        o.insert("key_file".into(), json!(k));
    }
    Value::Object(o)
}

/// SPDK's `bdev_rbd_get_clusters_info` entry.
fn cluster_json(c: &RegisteredCluster) -> Value {
    let mut v = cluster_params(c);
    if let Value::Object(o) = &mut v {
        if let Some(n) = o.remove("name") {
            o.insert("cluster_name".into(), n);
        }
        o.insert("fsid".into(), json!(c.cluster.fsid().unwrap_or_default()));
    }
    v
}

/// The namespace of the UUIDs [`image_uuid`] derives (a constant of riser's).
const IMAGE_UUID_NAMESPACE: Uuid = Uuid::from_u128(0x5597_5f8c_002e_4b95_adc9_60e0_2d87_4e2d);

/// The default identity of a bdev on an image: a name-based UUID (RFC 4122 version 5,
/// SHA-1) of the cluster's fsid, the pool's id and the image's id, so that every gateway
/// that opens the image without being given a `uuid` presents the same logical unit (unit
/// serial, VPD 0x83 NAA designator), and keeps it across restarts, pool and image renames.
/// An image of the old format has no id: its name stands in.
fn image_uuid(cluster: &Cluster, pool: &Pool, img: &Image, rbd_name: &str) -> Result<Uuid, RegistryError> {
    let fsid = cluster.fsid().map_err(rbd_err)?;
    let image = img.id().unwrap_or_else(|_| format!("name:{rbd_name}"));
    Ok(name_uuid(&format!("ceph-rbd:{fsid}/{}/{image}", pool.id())))
}

/// UUID version 5 of `name` in [`IMAGE_UUID_NAMESPACE`].
fn name_uuid(name: &str) -> Uuid {
    use sha1::{Digest, Sha1};
    let mut h = Sha1::new();
    h.update(IMAGE_UUID_NAMESPACE.as_bytes());
    h.update(name.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    uuid::Builder::from_sha1_bytes(b).into_uuid()
}

/// An RBD image as a bdev.
pub struct RbdBdev {
    info: BdevInfo,
    /// The control handle: size and resize (I/O goes through each channel's own handle).
    /// Shared with the group, which reopens it on a new connection after a fence.
    ctl: Arc<Mutex<Image>>,
    params: BdevRbdCreate,
    /// The image's id (names its shared objects).
    image_id: String,
    /// The gateways exporting the image (membership, liveness, fencing); its thread stops
    /// with the bdev.
    group: GroupThread,
}

impl RbdBdev {
    fn open(name: &str, cluster: Arc<Cluster>, cfg: ClusterConfig, mut p: BdevRbdCreate) -> Result<RbdBdev, RegistryError> {
        let pool = Pool::open(&cluster, &p.pool_name).map_err(|e| match e.errno() {
            libc::ENOENT => RegistryError::NotFound(format!("rbd pool {}", p.pool_name)),
            _ => rbd_err(e),
        })?;
        let img = Image::open(&pool, &p.rbd_name).map_err(|e| match e.errno() {
            libc::ENOENT => RegistryError::NotFound(format!("rbd image {}/{}", p.pool_name, p.rbd_name)),
            _ => rbd_err(e),
        })?;
        let size = img.size().map_err(rbd_err)?;
        let num_blocks = size / p.block_size as u64;
        if num_blocks == 0 {
            return Err(RegistryError::ZeroBlocks);
        }
        // The one given, else the image's own: every gateway derives the same.
        let uuid = match p.uuid {
            Some(u) => u,
            None => image_uuid(&cluster, &pool, &img, &p.rbd_name)?,
        };
        let mut info = BdevInfo::new(name, PRODUCT, p.block_size, num_blocks, uuid);
        // Writes are in the cluster when acknowledged (rbd_cache off): no volatile cache.
        info.volatile_write_cache = false;
        p.name = Some(name.to_string());
        let image_id = img.id().map_err(rbd_err)?;
        let ctl = Arc::new(Mutex::new(img));
        let lease_s = p.lease_s.unwrap_or(DEFAULT_LEASE_S);
        let group = RbdGroup::start(cluster, pool, cfg, &image_id, &p.rbd_name, lease_s, ctl.clone())
            .map_err(|e| RegistryError::File { errno: -libc::EIO, message: format!("bdev {name}: {e}") })?;
        Ok(RbdBdev { info, ctl, params: p, image_id, group })
    }

    fn group(&self) -> &Arc<RbdGroup> {
        self.group.group()
    }

    /// Grows the image (the registry's rescan then takes the new size).
    fn resize(&self, bytes: u64) -> Result<(), RegistryError> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner()).resize(bytes).map_err(rbd_err)
    }
}

impl Bdev for RbdBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, kind: IoKind) -> bool {
        match kind {
            IoKind::Read | IoKind::Write | IoKind::Flush | IoKind::Unmap | IoKind::WriteZeroes => true,
            // librbd 16.2 compares and writes within one 512-byte sector only.
            IoKind::CompareAndWrite => self.info.block_size == 512,
        }
    }

    /// A RADOS object next to the image, shared by every gateway (see `pr`).
    /// On the group's connection, so it moves with it when a fenced gateway rejoins.
    fn shared_state(&self, purpose: &str, on_notify: crate::OnNotify) -> Option<Result<crate::SharedStateHandle, BdevError>> {
        Some(pr::open(self.group(), &self.image_id, purpose, on_notify))
    }

    fn gateway_group(&self) -> Option<crate::GatewayGroupHandle> {
        Some(self.group().clone())
    }

    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        let group = self.group().clone();
        let (pool, gen, slot) = group.add_channel();
        match Image::open(&pool, &self.params.rbd_name) {
            Ok(img) => {
                let wake = match WakeReg::join(&img) {
                    Ok(w) => w,
                    Err(e) => {
                        log::warn!("bdev {}: no completion wake-ups ({e}); an idle adaptive reactor notices completions when it wakes", self.info.name);
                        None
                    }
                };
                Box::new(RbdChannel {
                    bdev: self,
                    img: Some(img),
                    done: DoneQueue::default(),
                    kinds: Vec::new(),
                    free: Vec::new(),
                    scratch: Vec::new(),
                    _wake: wake,
                    group,
                    slot,
                    gen,
                })
            }
            Err(e) => Box::new(FailedChannel::new(format!("bdev {}: cannot open the image on this reactor: {e}", self.info.name))),
        }
    }

    fn config_json(&self) -> (&'static str, Value) {
        let p = &self.params;
        let mut o = serde_json::Map::new();
        o.insert("name".into(), json!(self.info.name));
        o.insert("pool_name".into(), json!(p.pool_name));
        o.insert("rbd_name".into(), json!(p.rbd_name));
        o.insert("block_size".into(), json!(p.block_size));
        if let Some(u) = &p.user_id {
            o.insert("user_id".into(), json!(u));
        }
        if let Some(c) = &p.config {
            o.insert("config".into(), json!(c));
        }
        if let Some(c) = &p.cluster_name {
            o.insert("cluster_name".into(), json!(c));
        }
        // Only a uuid that was given: one derived from the image is derived again when the
        // configuration is loaded (the same, as long as it is the same image).
        if let Some(u) = &p.uuid {
            o.insert("uuid".into(), json!(u.to_string()));
        }
        if let Some(l) = p.lease_s {
            o.insert("lease_s".into(), json!(l));
        }
        ("bdev_rbd_create", Value::Object(o))
    }

    fn driver_specific(&self) -> Value {
        let p = &self.params;
        let mut o = serde_json::Map::new();
        o.insert("pool_name".into(), json!(p.pool_name));
        o.insert("rbd_name".into(), json!(p.rbd_name));
        if let Some(c) = &p.cluster_name {
            o.insert("cluster_name".into(), json!(c));
        } else {
            if let Some(u) = &p.user_id {
                o.insert("user_id".into(), json!(u));
            }
            if let Some(c) = &p.config {
                o.insert("config".into(), json!(c));
            }
        }
        o.insert("gateways".into(), self.group().json());
        json!({ "rbd": o })
    }

    fn rescan_blocks(&self) -> Option<Result<u64, BdevError>> {
        let img = self.ctl.lock().unwrap_or_else(|p| p.into_inner());
        Some(img.size().map(|s| s / self.info.block_size as u64).map_err(|e| BdevError::Io(format!("bdev {}: {e}", self.info.name))))
    }

    fn set_num_blocks(&self, num_blocks: u64) {
        self.info.set_num_blocks(num_blocks);
    }
}

/// One reactor's handle on the image.
struct RbdChannel {
    bdev: Arc<RbdBdev>,
    /// `None` only for the moment of a swap.
    img: Option<Image>,
    /// I/Os that failed before reaching librbd (range, buffer, submission errors).
    done: DoneQueue,
    /// (caller's tag, kind) of the I/O in librbd, by the index given to librbd as its tag.
    kinds: Vec<Option<(u64, IoKind)>>,
    free: Vec<usize>,
    /// librbd's completions of one poll (kept: no allocation per poll).
    scratch: Vec<AioDone>,
    _wake: Option<WakeReg>,
    group: Arc<RbdGroup>,
    /// Where the group leaves this channel's handle on the connection it rejoined on.
    slot: Arc<ChannelSlot>,
    /// The group generation (connection) `img` belongs to.
    gen: u64,
}

impl RbdChannel {
    /// Tells the reactor whether this channel's only work is librbd's signalled I/O in flight.
    fn note_signalled(&mut self) {
        let waiting = self.done.len() == 0 && self.img.as_ref().is_some_and(|i| i.in_flight() > 0 && i.unsignalled() == 0);
        if let Some(w) = self._wake.as_mut() {
            w.1.set(waiting);
        }
    }

    /// Whether the channel may send I/O to the cluster: not while this gateway is fenced,
    /// and not on a handle of a connection the group left. Takes the new handle when the
    /// group rejoined and nothing is in flight on the old one (on the reactor: the wake-up
    /// registration belongs to it; the old handle is closed on the group thread).
    fn usable(&mut self) -> bool {
        if self.group.is_fenced() {
            return false;
        }
        if self.gen == self.group.generation() {
            return true;
        }
        if self.img.as_ref().is_some_and(|i| i.in_flight() > 0) {
            return false;
        }
        let Some((gen, img)) = self.slot.take() else {
            return false;
        };
        self._wake = None;
        self._wake = WakeReg::join(&img).unwrap_or_else(|e| {
            log::warn!("bdev {}: no completion wake-ups ({e})", self.bdev.info.name);
            None
        });
        if let Some(old) = self.img.replace(img) {
            self.group.retire(old);
        }
        self.gen = gen;
        log::info!("bdev {}: I/O channel moved to the gateway's new cluster connection", self.bdev.info.name);
        true
    }
}

/// The channel's place in its reactor's wake set: librbd's completion eventfd ends an
/// adaptive reactor's sleep. Before the reactor sleeps it drains the eventfd (the arm hook) and
/// polls once more, so a completion queued before that is collected then, and one queued after
/// it makes the eventfd readable again. No thread of riser's runs for it, and a busy reactor
/// never looks at it; off a reactor (tests) there is none and completions wait for a poll.
/// While only librbd's I/O is in flight it also tells the reactor so (a
/// [`riser_reactor::SignalledWait`]): the reactor then sleeps through a write's milliseconds
/// instead of waking every millisecond at most.
struct WakeReg(riser_reactor::WakeId, riser_reactor::SignalledWait);

impl WakeReg {
    fn join(img: &Image) -> std::io::Result<Option<WakeReg>> {
        let efd = Rc::new(img.event_fd()?);
        let e = efd.clone();
        let id = riser_reactor::add_wake_fd(efd.as_fd(), move || {
            let mut b = [0u8; 8];
            // Non-blocking (the image's eventfd is EFD_NONBLOCK; a dup shares that).
            let _ = rustix::io::read(&*e, &mut b);
        })?;
        Ok(id.map(|id| WakeReg(id, riser_reactor::SignalledWait::default())))
    }
}

impl Drop for WakeReg {
    fn drop(&mut self) {
        // Channels are not Send: this runs on the reactor that registered it.
        riser_reactor::remove_wake_fd(self.0);
    }
}

/// The errnos of a cluster that cannot be reached (vs. a failed operation).
fn unreachable(errno: i32) -> bool {
    matches!(errno, libc::ETIMEDOUT | libc::ENOTCONN | libc::ESHUTDOWN | libc::ECONNREFUSED | libc::ECONNRESET | libc::EHOSTUNREACH)
}

/// The bdev error for librbd's failure `errno` of a `kind` I/O.
pub(crate) fn rbd_io_error(bdev: &str, kind: IoKind, errno: i32) -> BdevError {
    let what = format!("bdev {bdev}: rbd {kind:?}: {} (errno {errno})", riser_rbd::errno_str(errno));
    if errno == libc::ESHUTDOWN {
        // EBLOCKLISTED: the other gateways fenced this one (see group.rs).
        BdevError::Fenced(format!("{what}: this gateway's cluster client is blocklisted"))
    } else if unreachable(errno) {
        BdevError::Unavailable(format!("{what}: the Ceph cluster does not answer"))
    } else {
        BdevError::Io(what)
    }
}

impl IoChannel for RbdChannel {
    fn submit(&mut self, mut io: BdevIo) {
        if !self.usable() {
            let e = BdevError::Fenced(format!(
                "bdev {}: this gateway was fenced (blocklisted) by the other gateways of the image and is rejoining; use another path",
                self.bdev.info.name
            ));
            return self.done.push(io, Err(e));
        }
        let info = &self.bdev.info;
        if let Err(e) = validate(info, self.bdev.supports(io.kind), &io) {
            return self.done.push(io, Err(e));
        }
        let bs = info.block_size as u64;
        let offset = io.offset_blocks.get() * bs;
        let len = io.num_blocks * bs;
        let op = match io.kind {
            IoKind::Read => AioOp::Read,
            IoKind::Write => AioOp::Write,
            IoKind::CompareAndWrite => AioOp::CompareAndWrite,
            IoKind::Flush => AioOp::Flush,
            // rbd_aio_discard skips what is not aligned to rbd_discard_granularity_bytes (64 KiB,
            // at least 4 KiB), so unmapped blocks would not all read as zeros (LBPRZ);
            // write-zeroes deallocates the whole objects and zeroes the edges.
            IoKind::Unmap => AioOp::WriteZeroes { len },
            IoKind::WriteZeroes => AioOp::WriteZeroes { len },
        };
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.kinds.push(None);
                self.kinds.len() - 1
            }
        };
        let Some(img) = self.img.as_mut() else {
            self.free.push(slot);
            return self.done.push(io, Err(BdevError::Unavailable(format!("bdev {}: no image handle", info.name))));
        };
        match img.submit(op, offset, io.buf.take(), slot as u64) {
            Ok(()) => {
                self.kinds[slot] = Some((io.tag, io.kind));
                self.note_signalled();
            }
            Err((e, buf)) => {
                self.free.push(slot);
                io.buf = buf;
                let err = rbd_io_error(&info.name, io.kind, e.errno());
                self.done.push(io, Err(err));
            }
        }
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let mut n = self.done.drain_into(out);
        let Some(img) = self.img.as_mut() else { return n };
        if img.in_flight() == 0 {
            if self.gen != self.group.generation() {
                self.usable();
            }
            self.note_signalled();
            return n;
        }
        let mut done = std::mem::take(&mut self.scratch);
        img.poll(&mut done);
        for d in done.drain(..) {
            let slot = d.tag as usize;
            let Some((tag, kind)) = self.kinds.get_mut(slot).and_then(Option::take) else {
                log::error!("bdev {}: rbd completion for unknown slot {slot}", self.bdev.info.name);
                continue;
            };
            self.free.push(slot);
            let result = match (d.ret, d.mismatch) {
                (r, _) if r >= 0 => Ok(()),
                (_, Some(off)) => Err(BdevError::Miscompare { offset: off }),
                (r, None) => {
                    if -r == libc::ESHUTDOWN as i64 {
                        // EBLOCKLISTED: the other gateways fenced this one.
                        self.group.note_blocklisted();
                    }
                    Err(rbd_io_error(&self.bdev.info.name, kind, (-r) as i32))
                }
            };
            if let Err(e) = &result {
                if !matches!(e, BdevError::Miscompare { .. }) {
                    log::warn!("{e}");
                }
            }
            out.push(IoCompletion { tag, kind, result, buf: d.buf });
            n += 1;
        }
        self.scratch = done;
        self.note_signalled();
        n
    }

    fn outstanding(&self) -> usize {
        self.done.len() + self.img.as_ref().map_or(0, Image::in_flight)
    }

    /// librbd signals every completion on the image's eventfd, which is in the reactor's wake
    /// set: I/O in flight needs no polling, except what librbd does not signal (COMPARE AND
    /// WRITE) and all of it when the eventfd could not join a wake set (off a reactor).
    fn needs_poll(&self) -> bool {
        self.done.len() > 0
            || self.img.as_ref().is_some_and(|i| i.in_flight() > 0 && (self._wake.is_none() || i.unsignalled() > 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_do_not_override_the_users_options() {
        let cfg = ClusterConfig { config_param: vec![("rados osd op timeout".into(), "5".into())], ..Default::default() };
        let c = with_defaults(cfg);
        let get = |k: &str| c.config_param.iter().filter(|(key, _)| key.replace(' ', "_") == k).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert_eq!(get("rados_osd_op_timeout"), ["5"]);
        assert_eq!(get("rbd_cache"), ["false"]);
        // The user's options come last, so they win if librados saw both.
        assert_eq!(c.config_param.last().map(|(k, _)| k.as_str()), Some("rados osd op timeout"));
    }

    #[test]
    fn timeouts_are_unavailable_other_errors_are_io() {
        assert!(matches!(rbd_io_error("R", IoKind::Read, libc::ETIMEDOUT), BdevError::Unavailable(m) if m.contains("does not answer")));
        assert!(matches!(rbd_io_error("R", IoKind::Write, libc::ESHUTDOWN), BdevError::Fenced(_)));
        assert!(matches!(rbd_io_error("R", IoKind::Write, libc::EIO), BdevError::Io(m) if m.contains("bdev R")));
    }

    #[test]
    fn image_uuids_are_name_based_and_stable() {
        let a = name_uuid("ceph-rbd:0b1c2d3e-0000-4000-8000-000000000001/2/10a2b3c4d5e6");
        assert_eq!(a.get_version_num(), 5);
        assert_eq!(a, name_uuid("ceph-rbd:0b1c2d3e-0000-4000-8000-000000000001/2/10a2b3c4d5e6"), "every gateway derives the same");
        assert_ne!(a, name_uuid("ceph-rbd:0b1c2d3e-0000-4000-8000-000000000001/3/10a2b3c4d5e6"), "another pool");
        assert_ne!(a, name_uuid("ceph-rbd:0b1c2d3e-0000-4000-8000-000000000002/2/10a2b3c4d5e6"), "another cluster");
        // Pinned (Python's uuid.uuid5 of "x" in the namespace gives the same): a change
        // would give every deployed LU a new identity.
        assert_eq!(name_uuid("x").to_string(), "f8b8f327-e2a1-5b20-8b0d-0451b04db024");
    }

    #[test]
    fn registry_errors_without_a_cluster() {
        let mut r = BdevRegistry::new();
        let p = |bs, cluster: Option<&str>| BdevRbdCreate {
            name: Some("Ceph0".into()),
            user_id: None,
            pool_name: "rbd".into(),
            rbd_name: "img".into(),
            block_size: bs,
            config: None,
            cluster_name: cluster.map(str::to_string),
            uuid: None,
            lease_s: None,
        };
        assert_eq!(r.create_rbd(p(1000, Some("c"))), Err(RegistryError::BadBlockSize(1000)));
        assert!(matches!(r.create_rbd(p(512, Some("nope"))), Err(RegistryError::NotFound(m)) if m.contains("rbd cluster nope")));
        // A lease out of range is refused before any connection.
        for bad in [0, 2, 601] {
            let e = r.create_rbd(BdevRbdCreate { lease_s: Some(bad), ..p(512, Some("c")) }).unwrap_err();
            assert!(e.to_string().contains(&format!("lease_s {bad} is out of range")), "{e}");
        }
        assert!(matches!(r.rbd_unregister_cluster("nope"), Err(RegistryError::NotFound(_))));
        assert!(matches!(r.rbd_clusters_info(Some("nope")), Err(RegistryError::NotFound(_))));
        assert_eq!(r.rbd_clusters_info(None), Ok(vec![]));
        assert!(r.rbd_cluster_calls().is_empty());
        assert!(matches!(r.rbd_resize("nope", 1), Err(RegistryError::NotFound(_))));
        // A cluster that cannot be read fails registration with the cause.
        let e = r.rbd_register_cluster("c", None, None, Some("/nonexistent/ceph.conf".into()), None).unwrap_err();
        assert!(e.to_string().contains("rados_conf_read_file"), "{e}");
    }
}
