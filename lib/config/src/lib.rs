//! iSCSI target configuration: global options, portal groups, initiator groups, target nodes
//! with their LUNs and maps, the JSON-RPC methods that build them (SPDK's names and shapes),
//! and the queries login code asks (may this initiator log in here? what does SendTargets
//! list? where to listen?).
//!
//! [`IscsiTarget`] owns all of it behind one lock; the control plane (RPC threads, login
//! threads) calls it, reactors never do. Sessions hold `Arc<TargetNode>` and notice changes
//! through [`TargetNode::generation`].
//!
//! Lock order: the target's lock, then the bdev registry's lock (never the other way round),
//! then a node's own small lock. Hooks run with no lock held.

pub mod initiator_group;
pub mod node;
pub mod options;
pub mod portal_group;
pub mod rpc;

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use riser_bdev::{BdevRegistry, RegistryError};
use riser_rpc::RpcError;
use serde_json::{json, Value};
use thiserror::Error;

pub use initiator_group::{InitiatorGroup, Netmask};
pub use node::{Chap, Lun, LunOptions, LunSpec, PgIgMap, TargetNode};
pub use options::{Options, OptionsUpdate};
pub use portal_group::{Portal, PortalGroup, PortalParam};

use node::{NodeInit, MAX_ALIAS_LEN, MAX_LUNS, MAX_TARGET_MAPS};
use portal_group::{host_string, MAX_PORTAL_GROUP_TAG};

/// Why a configuration change was refused. Each kind has SPDK's error code.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum TargetError {
    /// A parameter is out of range or malformed (-32602); the message names it.
    #[error("{0}")]
    Invalid(String),
    /// A tag, name, LUN or map that must be new already exists (-17, EEXIST).
    #[error("{0}")]
    Exists(String),
    /// A tag, name, bdev, LUN or map that must exist does not (-19, ENODEV).
    #[error("{0}")]
    NotFound(String),
    /// The object is in use (-16, EBUSY).
    #[error("{0}")]
    Busy(String),
}

impl TargetError {
    pub fn code(&self) -> i64 {
        match self {
            TargetError::Invalid(_) => -32602,
            TargetError::Exists(_) => -17,
            TargetError::NotFound(_) => -19,
            TargetError::Busy(_) => -16,
        }
    }
}

impl From<TargetError> for RpcError {
    fn from(e: TargetError) -> Self {
        RpcError::new(e.code(), e.to_string())
    }
}

/// Why a login is refused (the Login Response status to send, RFC 7143 §11.13.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// The node is gone or being deleted: status 0x0203 (Not found).
    NotFound,
    /// The node is not mapped to the portal group the connection came in on, or no initiator
    /// group mapped with it admits this name and address: status 0x0202 (Authorization failure).
    NotAuthorized,
}

/// Which nodes a SendTargets request asks for (RFC 7143 §12.3, Appendix C).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendTargets<'a> {
    /// `SendTargets=All` (discovery sessions).
    All,
    /// `SendTargets=<iSCSI name>`, or the session's own target for `SendTargets=` (empty).
    One(&'a str),
}

type NodeHook = Arc<dyn Fn(&Arc<TargetNode>) + Send + Sync>;
type LunHook = Arc<dyn Fn(&Arc<TargetNode>, u16) + Send + Sync>;
type PortalsHook = Arc<dyn Fn() + Send + Sync>;

/// Callbacks into the session and listener layers. Each runs on the thread of the RPC that
/// caused it, with no lock held, so it may call back into [`IscsiTarget`].
#[derive(Default, Clone)]
struct Hooks {
    node_deleting: Option<NodeHook>,
    lun_added: Option<LunHook>,
    portals_changed: Option<PortalsHook>,
}

#[derive(Default)]
struct Inner {
    options: Options,
    /// In creation order, which is also save_config's order.
    portal_groups: Vec<PortalGroup>,
    initiator_groups: Vec<InitiatorGroup>,
    /// Includes nodes whose deletion has started (until it ends).
    nodes: Vec<Arc<TargetNode>>,
}

impl Inner {
    fn pg(&self, tag: u32) -> Option<&PortalGroup> {
        self.portal_groups.iter().find(|g| g.tag == tag)
    }

    fn ig(&self, tag: u32) -> Option<&InitiatorGroup> {
        self.initiator_groups.iter().find(|g| g.tag == tag)
    }

    /// The node of that exact name (iSCSI names compare case-insensitively), deleted or not.
    fn node_exact(&self, name: &str) -> Option<&Arc<TargetNode>> {
        self.nodes.iter().find(|n| n.name().eq_ignore_ascii_case(name))
    }

    /// A node named in an RPC: the full name, or the short name SPDK's create took (node_base
    /// is put in front). Refuses a node being deleted.
    fn node_for_change(&self, name: &str) -> Result<Arc<TargetNode>, TargetError> {
        let n = self
            .node_exact(name)
            .or_else(|| self.node_exact(&node::full_name(&self.options.node_base, name)))
            .ok_or_else(|| TargetError::NotFound(format!("target node {name} not found")))?;
        if n.is_deleted() {
            return Err(TargetError::Busy(format!("target node {} is being deleted", n.name())));
        }
        Ok(n.clone())
    }

    /// A node whose maps use portal group `tag` (named in the refusal), if any.
    fn pg_user(&self, tag: u32) -> Option<&str> {
        self.nodes.iter().find(|n| n.is_mapped_to(tag)).map(|n| n.name())
    }

    /// A node whose maps use initiator group `tag`, if any.
    fn ig_user(&self, tag: u32) -> Option<&str> {
        self.nodes.iter().find(|n| n.pg_ig_maps().iter().any(|m| m.ig_tag == tag)).map(|n| n.name())
    }

    /// Checks maps to add: groups exist, no map twice (in the request or already on `existing`).
    fn check_new_maps(&self, maps: &[PgIgMap], existing: &[(u32, Vec<u32>)]) -> Result<(), TargetError> {
        let mut seen = HashSet::new();
        for (i, m) in maps.iter().enumerate() {
            if self.pg(m.pg_tag).is_none() {
                return Err(TargetError::NotFound(format!("pg_ig_maps[{i}].pg_tag: portal group {} not found", m.pg_tag)));
            }
            if self.ig(m.ig_tag).is_none() {
                return Err(TargetError::NotFound(format!("pg_ig_maps[{i}].ig_tag: initiator group {} not found", m.ig_tag)));
            }
            if !seen.insert((m.pg_tag, m.ig_tag)) || node::has_map(existing, *m) {
                return Err(TargetError::Exists(format!(
                    "pg_ig_maps[{i}]: portal group {} is already mapped to initiator group {}",
                    m.pg_tag, m.ig_tag
                )));
            }
        }
        if seen.len() + node::flatten(existing).len() > MAX_TARGET_MAPS {
            return Err(TargetError::Invalid(format!("pg_ig_maps: a target node holds at most {MAX_TARGET_MAPS} maps")));
        }
        Ok(())
    }

    /// SPDK's access rule (`iscsi_tgt_node_access`): over the maps of portal group `pg_tag`,
    /// in order, the first initiator group that denies the name refuses, the first that
    /// admits name and address accepts.
    fn access(&self, node: &TargetNode, initiator_name: &str, addr: IpAddr, pg_tag: u32) -> Result<(), Denied> {
        if node.is_deleted() {
            return Err(Denied::NotFound);
        }
        let st = node.lock();
        let igs = st.maps.iter().find(|(pg, _)| *pg == pg_tag).map(|(_, igs)| igs.as_slice()).unwrap_or(&[]);
        for ig in igs.iter().filter_map(|t| self.ig(*t)) {
            match ig.name_verdict(initiator_name) {
                Some(false) => return Err(Denied::NotAuthorized),
                Some(true) if ig.allows_addr(addr) => return Ok(()),
                _ => {}
            }
        }
        Err(Denied::NotAuthorized)
    }
}

/// All iSCSI target configuration. Share it as `Arc<IscsiTarget>`.
pub struct IscsiTarget {
    inner: Mutex<Inner>,
    bdevs: Arc<Mutex<BdevRegistry>>,
    hooks: Mutex<Hooks>,
    portal_generation: AtomicU64,
}

fn claim_error(field: &str, e: RegistryError) -> TargetError {
    match e {
        RegistryError::NotFound(n) => TargetError::NotFound(format!("{field}: bdev {n} not found")),
        RegistryError::Claimed { name, owner } => {
            TargetError::Busy(format!("{field}: bdev {name} is already claimed by {owner}"))
        }
        other => TargetError::Invalid(format!("{field}: {other}")),
    }
}

/// The claim owner of a LUN, as `BdevRegistry` and `bdev_get_bdevs` errors show it.
fn lun_owner(node_name: &str, lun_id: u16) -> String {
    format!("{node_name}:lun{lun_id}")
}

/// What `iscsi_create_target_node` takes (after JSON decoding).
#[derive(Clone, Debug, Default)]
pub struct NodeParams {
    pub name: String,
    pub alias_name: Option<String>,
    pub pg_ig_maps: Vec<PgIgMap>,
    pub luns: Vec<LunSpec>,
    /// None: the max_queue_depth option.
    pub queue_depth: Option<u32>,
    pub chap: Chap,
    pub header_digest: bool,
    pub data_digest: bool,
}

impl IscsiTarget {
    /// An empty configuration with default options. LUNs claim their bdevs in `bdevs`.
    pub fn new(bdevs: Arc<Mutex<BdevRegistry>>) -> Self {
        IscsiTarget {
            inner: Mutex::new(Inner::default()),
            bdevs,
            hooks: Mutex::new(Hooks::default()),
            portal_generation: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_bdevs(&self) -> MutexGuard<'_, BdevRegistry> {
        self.bdevs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hooks(&self) -> Hooks {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    // ---- hooks ---------------------------------------------------------------------------

    /// Called when `iscsi_delete_target_node` starts, before the node is removed and its
    /// bdevs released: the session layer should log out that node's sessions (it may wait
    /// for them here). The node already refuses logins and [`TargetNode::is_deleted`] is true.
    pub fn on_node_deleting(&self, f: impl Fn(&Arc<TargetNode>) + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).node_deleting = Some(Arc::new(f));
    }

    /// Called after a LUN was added to a node (sessions owe a REPORTED LUNS DATA HAS CHANGED
    /// unit attention, SPC-4 §7.7).
    pub fn on_lun_added(&self, f: impl Fn(&Arc<TargetNode>, u16) + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).lun_added = Some(Arc::new(f));
    }

    /// Called after portal groups changed (created, started, deleted): listeners should be
    /// brought in line with [`IscsiTarget::portal_groups`].
    pub fn on_portals_changed(&self, f: impl Fn() + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).portals_changed = Some(Arc::new(f));
    }

    fn portals_changed(&self) {
        self.portal_generation.fetch_add(1, Ordering::AcqRel);
        if let Some(h) = self.hooks().portals_changed {
            h();
        }
    }

    // ---- queries for login and listener code ----------------------------------------------

    /// A copy of the global options (the values login negotiation offers).
    pub fn options(&self) -> Options {
        self.lock().options.clone()
    }

    /// The node a Login Request's TargetName names (case-insensitive), unless it is being
    /// deleted.
    pub fn find_node(&self, name: &str) -> Option<Arc<TargetNode>> {
        self.lock().node_exact(name).filter(|n| !n.is_deleted()).cloned()
    }

    /// Every node, in creation order (those being deleted left out).
    pub fn target_nodes(&self) -> Vec<Arc<TargetNode>> {
        self.lock().nodes.iter().filter(|n| !n.is_deleted()).cloned().collect()
    }

    /// May `initiator_name` at `initiator_addr`, connected to a portal of portal group
    /// `pg_tag`, log in to `node`? The node must be mapped to that portal group and one of the
    /// initiator groups mapped with it must admit the name and the address (SPDK's rule).
    pub fn login_allowed(
        &self,
        node: &TargetNode,
        initiator_name: &str,
        initiator_addr: IpAddr,
        pg_tag: u32,
    ) -> Result<(), Denied> {
        self.lock().access(node, initiator_name, initiator_addr, pg_tag)
    }

    /// The SendTargets answer (RFC 7143 Appendix C): for each node this initiator may log in
    /// to through at least one of its portal groups, `(TargetName, [TargetAddress])`, the
    /// addresses being `host:port,tag` for every portal of every non-private portal group
    /// the node is mapped to. A wildcard portal (`0.0.0.0`, `[::]`) is shown as `target_addr`,
    /// the local address the discovery connection arrived on (as SPDK does). IPv6 hosts are
    /// in brackets.
    pub fn send_targets(
        &self,
        initiator_name: &str,
        initiator_addr: IpAddr,
        target_addr: IpAddr,
        which: SendTargets<'_>,
    ) -> Vec<(String, Vec<String>)> {
        let inner = self.lock();
        let mut out = Vec::new();
        for n in inner.nodes.iter().filter(|n| !n.is_deleted()) {
            if let SendTargets::One(want) = which {
                if !n.name().eq_ignore_ascii_case(want) {
                    continue;
                }
            }
            let pgs: Vec<u32> = n.lock().maps.iter().map(|(pg, _)| *pg).collect();
            if !pgs.iter().any(|pg| inner.access(n, initiator_name, initiator_addr, *pg).is_ok()) {
                continue;
            }
            let mut addrs = Vec::new();
            for g in pgs.iter().filter_map(|t| inner.pg(*t)).filter(|g| !g.private) {
                for p in &g.portals {
                    let host = if p.is_wildcard() { host_string(target_addr.to_canonical()) } else { p.host() };
                    addrs.push(format!("{host}:{},{}", p.addr.port(), g.tag));
                }
            }
            out.push((n.name().to_string(), addrs));
        }
        out
    }

    /// The portal groups (listeners should serve the portals of the started ones; a
    /// connection accepted on a portal belongs to that portal's group).
    pub fn portal_groups(&self) -> Vec<PortalGroup> {
        self.lock().portal_groups.clone()
    }

    /// Bumped whenever [`IscsiTarget::portal_groups`] changes: a listener thread may poll it
    /// instead of (or besides) registering [`IscsiTarget::on_portals_changed`].
    pub fn portal_generation(&self) -> u64 {
        self.portal_generation.load(Ordering::Acquire)
    }

    /// The initiator groups.
    pub fn initiator_groups(&self) -> Vec<InitiatorGroup> {
        self.lock().initiator_groups.clone()
    }

    // ---- changes (the RPC methods) --------------------------------------------------------

    /// `iscsi_set_options`: given values replace current ones. `max_queue_depth` may not go
    /// below an existing node's queue_depth.
    pub fn set_options(&self, update: OptionsUpdate) -> Result<(), TargetError> {
        let mut inner = self.lock();
        let o = inner.options.updated(update)?;
        if let Some(n) = inner.nodes.iter().find(|n| n.queue_depth() > o.max_queue_depth) {
            return Err(TargetError::Invalid(format!(
                "max_queue_depth: {} is below queue_depth {} of target node {}",
                o.max_queue_depth,
                n.queue_depth(),
                n.name()
            )));
        }
        inner.options = o;
        Ok(())
    }

    /// `iscsi_create_portal_group`. A portal (address, port, transport) may belong to one
    /// group only. With `wait`, listeners stay off until [`Self::start_portal_group`].
    pub fn create_portal_group(&self, tag: u32, portals: &[PortalParam], private: bool, wait: bool) -> Result<(), TargetError> {
        {
            let mut inner = self.lock();
            if tag == 0 || tag > MAX_PORTAL_GROUP_TAG {
                return Err(TargetError::Invalid(format!("tag: {tag} is out of range (1..={MAX_PORTAL_GROUP_TAG})")));
            }
            if inner.pg(tag).is_some() {
                return Err(TargetError::Exists(format!("portal group {tag} already exists")));
            }
            if portals.is_empty() {
                return Err(TargetError::Invalid("portals: at least one portal is required".into()));
            }
            let mut parsed: Vec<Portal> = Vec::new();
            for (i, p) in portals.iter().enumerate() {
                let field = format!("portals[{i}]");
                let p = p.parse(&field).map_err(TargetError::Invalid)?;
                let clash = |q: &Portal| q.addr == p.addr && q.iser == p.iser;
                if parsed.iter().any(clash) {
                    return Err(TargetError::Exists(format!("{field}: {} is given twice", p.addr)));
                }
                if let Some(g) = inner.portal_groups.iter().find(|g| g.portals.iter().any(clash)) {
                    return Err(TargetError::Exists(format!("{field}: {} is already in portal group {}", p.addr, g.tag)));
                }
                parsed.push(p);
            }
            inner.portal_groups.push(PortalGroup { tag, portals: parsed, private, started: !wait });
        }
        self.portals_changed();
        Ok(())
    }

    /// `iscsi_start_portal_group`: lets a group created with `wait` listen. Starting a
    /// started group succeeds (SPDK).
    pub fn start_portal_group(&self, tag: u32) -> Result<(), TargetError> {
        let changed = {
            let mut inner = self.lock();
            let g = inner
                .portal_groups
                .iter_mut()
                .find(|g| g.tag == tag)
                .ok_or_else(|| TargetError::NotFound(format!("portal group {tag} not found")))?;
            !std::mem::replace(&mut g.started, true)
        };
        if changed {
            self.portals_changed();
        }
        Ok(())
    }

    /// `iscsi_delete_portal_group`: refused while a target node maps it.
    pub fn delete_portal_group(&self, tag: u32) -> Result<(), TargetError> {
        {
            let mut inner = self.lock();
            if inner.pg(tag).is_none() {
                return Err(TargetError::NotFound(format!("portal group {tag} not found")));
            }
            if let Some(n) = inner.pg_user(tag) {
                return Err(TargetError::Busy(format!("portal group {tag} is mapped by target node {n}")));
            }
            inner.portal_groups.retain(|g| g.tag != tag);
        }
        self.portals_changed();
        Ok(())
    }

    /// `iscsi_create_initiator_group`.
    pub fn create_initiator_group(&self, tag: u32, initiators: &[String], netmasks: &[String]) -> Result<(), TargetError> {
        let mut inner = self.lock();
        if tag == 0 {
            return Err(TargetError::Invalid("tag: 0 is out of range (1..)".into()));
        }
        if inner.ig(tag).is_some() {
            return Err(TargetError::Exists(format!("initiator group {tag} already exists")));
        }
        let mut g = InitiatorGroup::new(tag);
        g.add(initiators, netmasks)?;
        inner.initiator_groups.push(g);
        Ok(())
    }

    fn with_ig(&self, tag: u32, f: impl FnOnce(&mut InitiatorGroup) -> Result<(), TargetError>) -> Result<(), TargetError> {
        let mut inner = self.lock();
        let g = inner
            .initiator_groups
            .iter_mut()
            .find(|g| g.tag == tag)
            .ok_or_else(|| TargetError::NotFound(format!("initiator group {tag} not found")))?;
        f(g)
    }

    /// `iscsi_initiator_group_add_initiators`. Affects later logins only.
    pub fn initiator_group_add(&self, tag: u32, initiators: &[String], netmasks: &[String]) -> Result<(), TargetError> {
        self.with_ig(tag, |g| g.add(initiators, netmasks))
    }

    /// `iscsi_initiator_group_remove_initiators`. Sessions already logged in stay.
    pub fn initiator_group_remove(&self, tag: u32, initiators: &[String], netmasks: &[String]) -> Result<(), TargetError> {
        self.with_ig(tag, |g| g.remove(initiators, netmasks))
    }

    /// `iscsi_delete_initiator_group`: refused while a target node maps it.
    pub fn delete_initiator_group(&self, tag: u32) -> Result<(), TargetError> {
        let mut inner = self.lock();
        if inner.ig(tag).is_none() {
            return Err(TargetError::NotFound(format!("initiator group {tag} not found")));
        }
        if let Some(n) = inner.ig_user(tag) {
            return Err(TargetError::Busy(format!("initiator group {tag} is mapped by target node {n}")));
        }
        inner.initiator_groups.retain(|g| g.tag != tag);
        Ok(())
    }

    /// `iscsi_create_target_node`. Everything is checked before any bdev is claimed, and a
    /// failed claim releases the ones made, so a refused call leaves nothing behind.
    pub fn create_target_node(&self, p: NodeParams) -> Result<Arc<TargetNode>, TargetError> {
        let mut inner = self.lock();
        let name = node::full_name(&inner.options.node_base, p.name.trim());
        node::check_iscsi_name(&name).map_err(|e| TargetError::Invalid(format!("name: {e}")))?;
        if let Some(n) = inner.node_exact(&name) {
            if n.is_deleted() {
                return Err(TargetError::Busy(format!("target node {} is being deleted", n.name())));
            }
            return Err(TargetError::Exists(format!("target node {} already exists", n.name())));
        }
        let alias_name = p.alias_name.filter(|a| !a.is_empty());
        if let Some(a) = &alias_name {
            if a.len() > MAX_ALIAS_LEN || a.chars().any(char::is_control) {
                return Err(TargetError::Invalid(format!(
                    "alias_name: must be at most {MAX_ALIAS_LEN} bytes without control characters"
                )));
            }
        }
        inner.check_new_maps(&p.pg_ig_maps, &[])?;
        if p.luns.is_empty() {
            return Err(TargetError::Invalid("luns: at least one LUN is required".into()));
        }
        let mut ids = HashSet::new();
        for (i, LunSpec { lun_id: id, bdev_name: bdev, .. }) in p.luns.iter().enumerate() {
            if *id >= MAX_LUNS {
                return Err(TargetError::Invalid(format!("luns[{i}].lun_id: {id} is out of range (0..={})", MAX_LUNS - 1)));
            }
            if !ids.insert(*id) {
                return Err(TargetError::Invalid(format!("luns[{i}].lun_id: LUN {id} is given twice")));
            }
            if bdev.is_empty() {
                return Err(TargetError::Invalid(format!("luns[{i}].bdev_name: must not be empty")));
            }
        }
        let max_qd = inner.options.max_queue_depth;
        let queue_depth = p.queue_depth.unwrap_or(max_qd);
        if queue_depth == 0 || queue_depth > max_qd {
            return Err(TargetError::Invalid(format!(
                "queue_depth: {queue_depth} is out of range (1..={max_qd}, the max_queue_depth option)"
            )));
        }
        options::check_chap(p.chap.disable_chap, p.chap.require_chap, p.chap.mutual_chap)?;

        let mut luns: Vec<Lun> = Vec::new();
        {
            let mut bdevs = self.lock_bdevs();
            for (i, spec) in p.luns.iter().enumerate() {
                // Checked above: id < MAX_LUNS fits u16.
                let id = spec.lun_id as u16;
                match bdevs.claim(&spec.bdev_name, &lun_owner(&name, id)) {
                    Ok(bdev) => luns.push(Lun::new(id, &spec.bdev_name, spec.options, bdev, &name)),
                    Err(e) => {
                        for l in &luns {
                            bdevs.release(&l.bdev_name);
                        }
                        return Err(claim_error(&format!("luns[{i}].bdev_name"), e));
                    }
                }
            }
        }
        let node = Arc::new(TargetNode::new(NodeInit {
            name,
            alias_name,
            queue_depth,
            chap: p.chap,
            header_digest: p.header_digest,
            data_digest: p.data_digest,
            luns,
            maps: p.pg_ig_maps,
        }));
        log::info!("iSCSI target node {} created", node.name());
        inner.nodes.push(node.clone());
        Ok(node)
    }

    /// `iscsi_target_node_add_lun`: `lun_id` None takes the lowest free id. Returns the id.
    pub fn target_node_add_lun(
        &self,
        name: &str,
        bdev_name: &str,
        lun_id: Option<u32>,
        options: LunOptions,
    ) -> Result<u16, TargetError> {
        let (node, id) = {
            let inner = self.lock();
            let node = inner.node_for_change(name)?;
            let (_, luns) = node.luns();
            let id = match lun_id {
                Some(id) if id >= MAX_LUNS => {
                    return Err(TargetError::Invalid(format!("lun_id: {id} is out of range (0..={})", MAX_LUNS - 1)))
                }
                Some(id) => id as u16,
                None => (0..MAX_LUNS as u16).find(|i| luns.iter().all(|l| l.id != *i)).ok_or_else(|| {
                    TargetError::Invalid(format!("lun_id: target node {} has no free LUN id", node.name()))
                })?,
            };
            if luns.iter().any(|l| l.id == id) {
                return Err(TargetError::Exists(format!("LUN {id} already exists on target node {}", node.name())));
            }
            let bdev = self
                .lock_bdevs()
                .claim(bdev_name, &lun_owner(node.name(), id))
                .map_err(|e| claim_error("bdev_name", e))?;
            node.change(|st| {
                let mut v = st.luns.to_vec();
                v.push(Lun::new(id, bdev_name, options, bdev, node.name()));
                v.sort_by_key(|l| l.id);
                // Every LUN learns the new inventory; those that existed raise REPORTED
                // LUNS DATA HAS CHANGED for every initiator (SPC-4 §6.33).
                let ids: Vec<u64> = v.iter().map(|l| l.id as u64).collect();
                for l in &v {
                    l.scsi.set_target_luns(&ids);
                }
                st.luns = v.into();
            });
            log::info!(
                "iSCSI target node {}: LUN {id} is bdev {bdev_name}{}{}",
                node.name(),
                if options.removable { ", removable" } else { "" },
                if options.read_only { ", read-only" } else { "" }
            );
            (node, id)
        };
        if let Some(h) = self.hooks().lun_added {
            h(&node, id);
        }
        Ok(id)
    }

    /// `iscsi_target_node_add_pg_ig_maps`: all or none.
    pub fn target_node_add_pg_ig_maps(&self, name: &str, maps: &[PgIgMap]) -> Result<(), TargetError> {
        let inner = self.lock();
        let node = inner.node_for_change(name)?;
        if maps.is_empty() {
            return Err(TargetError::Invalid("pg_ig_maps: at least one map is required".into()));
        }
        let existing = node.lock().maps.clone();
        inner.check_new_maps(maps, &existing)?;
        node.change(|st| maps.iter().for_each(|m| node::add_map(&mut st.maps, *m)));
        Ok(())
    }

    /// `iscsi_target_node_remove_pg_ig_maps`: all or none. Sessions already logged in stay;
    /// they see the generation move.
    pub fn target_node_remove_pg_ig_maps(&self, name: &str, maps: &[PgIgMap]) -> Result<(), TargetError> {
        let inner = self.lock();
        let node = inner.node_for_change(name)?;
        if maps.is_empty() {
            return Err(TargetError::Invalid("pg_ig_maps: at least one map is required".into()));
        }
        let mut left = node.lock().maps.clone();
        for (i, m) in maps.iter().enumerate() {
            if !node::has_map(&left, *m) {
                return Err(TargetError::NotFound(format!(
                    "pg_ig_maps[{i}]: portal group {} is not mapped to initiator group {} on target node {}",
                    m.pg_tag,
                    m.ig_tag,
                    node.name()
                )));
            }
            node::remove_map(&mut left, *m);
        }
        node.change(|st| st.maps = left);
        Ok(())
    }

    /// `iscsi_delete_target_node`: marks the node deleted (no new logins), runs the
    /// node-deleting hook (which logs its sessions out), then removes it and releases its bdevs.
    pub fn delete_target_node(&self, name: &str) -> Result<(), TargetError> {
        let node = {
            let inner = self.lock();
            let node = inner.node_for_change(name)?;
            node.mark_deleted();
            node
        };
        if let Some(h) = self.hooks().node_deleting {
            h(&node);
        }
        let mut inner = self.lock();
        inner.nodes.retain(|n| !Arc::ptr_eq(n, &node));
        let mut bdevs = self.lock_bdevs();
        let (_, luns) = node.luns();
        for l in luns.iter() {
            bdevs.release(&l.bdev_name);
        }
        log::info!("iSCSI target node {} deleted", node.name());
        Ok(())
    }

    // ---- JSON -----------------------------------------------------------------------------

    pub(crate) fn options_json(&self) -> Value {
        self.lock().options.info_json()
    }

    pub(crate) fn portal_groups_json(&self) -> Value {
        Value::Array(self.lock().portal_groups.iter().map(PortalGroup::info_json).collect())
    }

    pub(crate) fn initiator_groups_json(&self) -> Value {
        Value::Array(self.lock().initiator_groups.iter().map(InitiatorGroup::info_json).collect())
    }

    pub(crate) fn target_nodes_json(&self) -> Value {
        Value::Array(self.target_nodes().iter().map(|n| n.info_json()).collect())
    }

    /// The `"iscsi"` subsystem of save_config / `framework_get_config`: the calls that
    /// recreate this configuration, in an order that replays (options, portal groups,
    /// initiator groups, then nodes with their LUNs and maps). Options are written in full,
    /// as SPDK does.
    pub fn config_json(&self) -> Vec<Value> {
        let inner = self.lock();
        let mut out = vec![json!({"method": "iscsi_set_options", "params": inner.options.info_json()})];
        out.extend(inner.portal_groups.iter().map(PortalGroup::config_json));
        out.extend(inner.initiator_groups.iter().map(InitiatorGroup::config_json));
        out.extend(inner.nodes.iter().filter(|n| !n.is_deleted()).map(|n| n.config_json()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "iqn.1994-05.com.redhat:a";
    const B: &str = "iqn.1994-05.com.redhat:b";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn portal(host: &str, port: u16) -> PortalParam {
        PortalParam { host: host.into(), port: portal_group::PortParam(port.to_string()), iser: false }
    }

    fn target() -> (Arc<Mutex<BdevRegistry>>, Arc<IscsiTarget>) {
        let mut b = BdevRegistry::new();
        for i in 0..4 {
            b.create_null(&format!("Null{i}"), 1024, 512, None).unwrap();
        }
        let bdevs = Arc::new(Mutex::new(b));
        (bdevs.clone(), Arc::new(IscsiTarget::new(bdevs)))
    }

    fn node(t: &IscsiTarget, name: &str, maps: &[(u32, u32)], bdev: &str) -> Arc<TargetNode> {
        t.create_target_node(NodeParams {
            name: name.into(),
            pg_ig_maps: maps.iter().map(|&(pg_tag, ig_tag)| PgIgMap { pg_tag, ig_tag }).collect(),
            luns: vec![LunSpec::new(0, bdev)],
            ..Default::default()
        })
        .unwrap()
    }

    /// pg 1: 10.0.0.1:3260 and [fd00::1]:3260; pg 2: 0.0.0.0:3261; pg 3 (private): 10.0.0.1:3262.
    /// ig 1: A from 10.0.0.0/8; ig 2: anyone but B from anywhere.
    fn acl_setup() -> Arc<IscsiTarget> {
        let (_, t) = target();
        t.create_portal_group(1, &[portal("10.0.0.1", 3260), portal("[fd00::1]", 3260)], false, false).unwrap();
        t.create_portal_group(2, &[portal("0.0.0.0", 3261)], false, false).unwrap();
        t.create_portal_group(3, &[portal("10.0.0.1", 3262)], true, false).unwrap();
        t.create_initiator_group(1, &strings(&[A]), &strings(&["10.0.0.0/8"])).unwrap();
        t.create_initiator_group(2, &strings(&["ANY", &format!("!{B}")]), &strings(&["ANY"])).unwrap();
        t
    }

    #[test]
    fn login_needs_the_portal_group_and_an_admitting_initiator_group() {
        let t = acl_setup();
        let n = node(&t, "d1", &[(1, 1), (3, 2)], "Null0");
        assert_eq!(t.login_allowed(&n, A, ip("10.9.9.9"), 1), Ok(()));
        assert_eq!(t.login_allowed(&n, A, ip("::ffff:10.9.9.9"), 1), Ok(()));
        assert_eq!(t.login_allowed(&n, A, ip("192.168.0.1"), 1), Err(Denied::NotAuthorized), "address outside ig 1");
        assert_eq!(t.login_allowed(&n, B, ip("10.9.9.9"), 1), Err(Denied::NotAuthorized), "name not in ig 1");
        assert_eq!(t.login_allowed(&n, A, ip("10.9.9.9"), 2), Err(Denied::NotAuthorized), "not mapped to pg 2");
        assert_eq!(t.login_allowed(&n, "iqn.2000-01.x:other", ip("1.1.1.1"), 3), Ok(()));
        assert_eq!(t.login_allowed(&n, B, ip("1.1.1.1"), 3), Err(Denied::NotAuthorized), "denied by name in ig 2");
        // A deny in an initiator group refuses even when a later one would admit (SPDK).
        t.target_node_add_pg_ig_maps(n.name(), &[PgIgMap { pg_tag: 3, ig_tag: 1 }]).unwrap();
        assert_eq!(t.login_allowed(&n, B, ip("10.0.0.5"), 3), Err(Denied::NotAuthorized));
        // ACL changes apply to the next login.
        t.initiator_group_add(1, &strings(&[B]), &[]).unwrap();
        assert_eq!(t.login_allowed(&n, B, ip("10.0.0.5"), 1), Ok(()));
        t.initiator_group_remove(1, &[], &strings(&["10.0.0.0/8"])).unwrap();
        assert_eq!(t.login_allowed(&n, B, ip("10.0.0.5"), 1), Err(Denied::NotAuthorized));
        // Names of nodes compare case-insensitively; deleted nodes are gone.
        assert!(t.find_node("IQN.2016-06.io.riser:D1").is_some());
        t.delete_target_node("d1").unwrap();
        assert!(t.find_node(n.name()).is_none());
        assert_eq!(t.login_allowed(&n, "iqn.2000-01.x:other", ip("1.1.1.1"), 3), Err(Denied::NotFound));
    }

    #[test]
    fn send_targets_lists_reachable_nodes_with_public_portals() {
        let t = acl_setup();
        node(&t, "d1", &[(1, 1), (2, 1), (3, 1)], "Null0");
        node(&t, "d2", &[(2, 2)], "Null1");
        node(&t, "d3", &[(3, 2)], "Null2");
        node(&t, "unmapped", &[], "Null3");
        let local = ip("10.0.0.1");
        let all = t.send_targets(A, ip("10.0.0.7"), local, SendTargets::All);
        assert_eq!(
            all,
            vec![
                (
                    "iqn.2016-06.io.riser:d1".to_string(),
                    strings(&["10.0.0.1:3260,1", "[fd00::1]:3260,1", "10.0.0.1:3261,2"])
                ),
                ("iqn.2016-06.io.riser:d2".to_string(), strings(&["10.0.0.1:3261,2"])),
                // Reachable only through a private group: listed, with no address.
                ("iqn.2016-06.io.riser:d3".to_string(), vec![]),
            ]
        );
        // B is denied by ig 2 and not in ig 1: nothing.
        assert!(t.send_targets(B, ip("10.0.0.7"), local, SendTargets::All).is_empty());
        // A from outside 10/8 only reaches the ig-2 nodes; a wildcard portal shows the
        // address the connection came in on, IPv6 in brackets.
        let far = t.send_targets(A, ip("fd00::9"), ip("fd00::1"), SendTargets::All);
        assert_eq!(
            far,
            vec![
                ("iqn.2016-06.io.riser:d2".to_string(), strings(&["[fd00::1]:3261,2"])),
                ("iqn.2016-06.io.riser:d3".to_string(), vec![]),
            ]
        );
        let one = t.send_targets(A, ip("10.0.0.7"), local, SendTargets::One("IQN.2016-06.io.riser:d2"));
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].0, "iqn.2016-06.io.riser:d2");
        assert!(t.send_targets(A, ip("10.0.0.7"), local, SendTargets::One("iqn.2016-06.io.riser:nope")).is_empty());
    }

    #[test]
    fn generation_moves_on_every_change_and_snapshots_follow() {
        let t = acl_setup();
        let n = node(&t, "d", &[(1, 1)], "Null0");
        let g0 = n.generation();
        let (g, luns) = n.luns();
        assert_eq!((g, luns.len()), (g0, 1));
        t.target_node_add_lun("d", "Null1", None, LunOptions::default()).unwrap();
        let g1 = n.generation();
        assert!(g1 > g0);
        // An old snapshot stays valid; a new one shows the LUN.
        assert_eq!(luns.len(), 1);
        let (g, luns) = n.luns();
        assert_eq!(g, g1);
        assert_eq!(luns.iter().map(|l| l.id).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(luns[1].bdev.info().name, "Null1");
        t.target_node_add_pg_ig_maps("d", &[PgIgMap { pg_tag: 2, ig_tag: 2 }]).unwrap();
        let g2 = n.generation();
        assert!(g2 > g1);
        t.target_node_remove_pg_ig_maps("d", &[PgIgMap { pg_tag: 2, ig_tag: 2 }]).unwrap();
        assert!(n.generation() > g2);
        // A refused change does not move it.
        let g3 = n.generation();
        assert!(t.target_node_add_lun("d", "Null1", None, LunOptions::default()).is_err());
        assert_eq!(n.generation(), g3);
    }

    #[test]
    fn hooks_run_outside_the_lock_at_the_right_moment() {
        let (bdevs, t) = target();
        t.create_portal_group(1, &[portal("127.0.0.1", 3260)], false, true).unwrap();
        t.create_initiator_group(1, &strings(&["ANY"]), &strings(&["ANY"])).unwrap();
        let n = node(&t, "d", &[(1, 1)], "Null0");

        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let (s, t2, b2) = (seen.clone(), Arc::downgrade(&t), bdevs.clone());
        t.on_node_deleting(move |node| {
            // Called before removal: no longer found, but its bdevs are still claimed, and
            // the target can be called back (no lock held).
            let t = t2.upgrade().unwrap();
            assert!(node.is_deleted());
            assert!(t.find_node(node.name()).is_none());
            assert!(b2.lock().unwrap().claimed_by("Null0").is_some());
            s.lock().unwrap().push(format!("deleting {}", node.name()));
        });
        let (s, t2) = (seen.clone(), Arc::downgrade(&t));
        t.on_lun_added(move |node, id| {
            let t = t2.upgrade().unwrap();
            assert!(t.find_node(node.name()).is_some());
            s.lock().unwrap().push(format!("lun {id} on {}", node.name()));
        });
        let (s, t2) = (seen.clone(), Arc::downgrade(&t));
        t.on_portals_changed(move || {
            let n = t2.upgrade().unwrap().portal_groups().len();
            s.lock().unwrap().push(format!("portals {n}"));
        });

        let pg0 = t.portal_generation();
        assert!(!t.portal_groups()[0].started);
        t.start_portal_group(1).unwrap();
        t.start_portal_group(1).unwrap(); // already started: no change, no call
        assert!(t.portal_groups()[0].started);
        t.create_portal_group(2, &[portal("127.0.0.1", 3261)], false, false).unwrap();
        t.delete_portal_group(2).unwrap();
        assert_eq!(t.portal_generation(), pg0 + 3);
        t.target_node_add_lun("d", "Null1", Some(5), LunOptions::default()).unwrap();
        t.delete_target_node(n.name()).unwrap();
        // Once deleted, the node is gone for every RPC.
        assert_eq!(
            t.delete_target_node(n.name()),
            Err(TargetError::NotFound("target node iqn.2016-06.io.riser:d not found".into()))
        );
        assert_eq!(
            *seen.lock().unwrap(),
            strings(&[
                "portals 1",
                "portals 2",
                "portals 1",
                "lun 5 on iqn.2016-06.io.riser:d",
                "deleting iqn.2016-06.io.riser:d",
            ])
        );
        assert_eq!(bdevs.lock().unwrap().claimed_by("Null0"), None);
        assert_eq!(bdevs.lock().unwrap().claimed_by("Null1"), None);
    }

    #[test]
    fn a_node_being_deleted_refuses_changes_and_its_name() {
        let (_, t) = target();
        let n = node(&t, "d", &[], "Null0");
        let t2 = Arc::downgrade(&t);
        t.on_node_deleting(move |node| {
            let t = t2.upgrade().unwrap();
            assert!(matches!(t.target_node_add_lun(node.name(), "Null1", None, LunOptions::default()), Err(TargetError::Busy(_))));
            assert!(matches!(t.delete_target_node(node.name()), Err(TargetError::Busy(_))));
            let again = NodeParams { name: "d".into(), luns: vec![LunSpec::new(0, "Null2")], ..Default::default() };
            assert!(matches!(t.create_target_node(again), Err(TargetError::Busy(_))));
            assert!(t.config_json().iter().all(|c| c["method"] != "iscsi_create_target_node"));
        });
        t.delete_target_node("d").unwrap();
        assert!(n.is_deleted());
        // The name is free again.
        node(&t, "d", &[], "Null0");
    }

    #[test]
    fn errors_carry_spdk_codes() {
        assert_eq!(RpcError::from(TargetError::Invalid("x".into())), RpcError::invalid_params("x"));
        assert_eq!(RpcError::from(TargetError::Exists("x".into())).code, -17);
        assert_eq!(RpcError::from(TargetError::NotFound("x".into())).code, -19);
        assert_eq!(RpcError::from(TargetError::Busy("x".into())).code, -16);
    }

    /// riser's LUN options reach the SCSI layer and show (only when set) in the node's JSON,
    /// which is what save_config replays.
    #[test]
    fn lun_options_reach_the_lun_and_the_saved_config() {
        let (_, t) = target();
        let removable = LunOptions { removable: true, read_only: false };
        let node = t
            .create_target_node(NodeParams {
                name: "d".into(),
                luns: vec![LunSpec::new(0, "Null0"), LunSpec { lun_id: 1, bdev_name: "Null1".into(), options: removable }],
                ..Default::default()
            })
            .unwrap();
        t.target_node_add_lun("d", "Null2", Some(2), LunOptions { removable: false, read_only: true }).unwrap();
        let (_, luns) = node.luns();
        assert!(!luns[0].scsi.config().removable && !luns[0].scsi.config().read_only);
        assert!(luns[1].scsi.config().removable && !luns[1].scsi.config().read_only);
        assert!(luns[2].scsi.config().read_only && !luns[2].scsi.config().removable);
        let cfg = node.config_json();
        assert_eq!(
            cfg["params"]["luns"],
            serde_json::json!([
                {"bdev_name": "Null0", "lun_id": 0},
                {"bdev_name": "Null1", "lun_id": 1, "removable": true},
                {"bdev_name": "Null2", "lun_id": 2, "read_only": true}
            ])
        );
    }
}
