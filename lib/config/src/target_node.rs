//! Target nodes: an iSCSI name, its LUNs (each a claimed bdev), the portal group ↔ initiator
//! group maps that say who may log in where, its CHAP policy, and per-node session parameters;
//! their methods (`iscsi_create_target_node`, `iscsi_target_node_add_lun`,
//! `iscsi_target_node_remove_lun`, `iscsi_target_node_add_pg_ig_maps`, `iscsi_target_node_remove_pg_ig_maps`,
//! `iscsi_target_node_set_auth`, `iscsi_delete_target_node`, `iscsi_get_target_nodes`) and
//! save_config calls.
//!
//! A node is shared (`Arc`) with login and data-path code. What can change after creation
//! (LUNs, maps, CHAP policy) sits behind a small lock; every change bumps [`TargetNode::generation`], so a
//! session notices with one atomic load and fetches a new [`TargetNode::luns`] snapshot only
//! then.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use riser_bdev::{Bdev, RegistryError};
use riser_rpc::params::{is_false, is_zero_u32, not_null, NoParams};
use riser_rpc::{RpcError, RpcRegistry};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::initiator_group::MAX_ISCSI_NAME_LEN;
use crate::rpc::ok;
use crate::{options, Inner, IscsiTarget, TargetError};

/// LUN ids are 0..=1023 (SPDK's SPDK_SCSI_DEV_MAX_LUN; flat-space addressing reaches 16383).
pub const MAX_LUNS: u32 = 1024;
/// How long `iscsi_target_node_remove_lun` waits for the commands in flight on the LUN
/// before it releases the bdev anyway (as long as `iscsi_delete_target_node` waits for
/// sessions).
pub const LUN_DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Most pg_ig_maps per node (SPDK's MAX_TARGET_MAP).
pub const MAX_TARGET_MAPS: usize = 256;
/// Longest alias (TargetAlias is a text value, RFC 7143 §13.6; SPDK caps the name at 255).
pub const MAX_ALIAS_LEN: usize = 255;

/// riser's per-LUN options (SPDK has none; tgt has the same two as LU parameters). Both off
/// by default; `iscsi_get_target_nodes` and `save_config` show only those set, so a default
/// configuration stays SPDK-shaped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LunOptions {
    /// Report a removable medium (INQUIRY RMB=1): PREVENT ALLOW MEDIUM REMOVAL is honoured and
    /// START STOP UNIT with LOEJ ejects and loads the medium (reads and writes then fail with
    /// MEDIUM NOT PRESENT until it is loaded again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removable: bool,
    /// Write-protected: MODE SENSE shows WP, every write fails with DATA PROTECT / WRITE
    /// PROTECTED. The bdev itself is untouched.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// One LUN of a target node as configured: what `iscsi_create_target_node` takes per LUN.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LunSpec {
    pub lun_id: u32,
    pub bdev_name: String,
    pub options: LunOptions,
}

impl LunSpec {
    pub fn new(lun_id: u32, bdev_name: &str) -> LunSpec {
        LunSpec { lun_id, bdev_name: bdev_name.to_string(), options: LunOptions::default() }
    }
}

/// One LUN: its number, the bdev name it was created with, its options, the device, and the
/// SCSI logical unit over it (shared by every session, so reservations and unit attentions
/// cross sessions).
#[derive(Clone)]
pub struct Lun {
    pub id: u16,
    pub bdev_name: String,
    pub options: LunOptions,
    pub bdev: Arc<dyn Bdev>,
    pub scsi: Arc<riser_scsi::Lun>,
}

impl Lun {
    /// `state_dir`: where its persistent reservations (APTPL) live, see
    /// [`IscsiTarget::set_state_dir`](crate::IscsiTarget::set_state_dir).
    pub fn new(
        id: u16,
        bdev_name: &str,
        options: LunOptions,
        bdev: Arc<dyn Bdev>,
        target_name: &str,
        state_dir: Option<PathBuf>,
    ) -> Lun {
        let i = bdev.info();
        let cfg = riser_scsi::LunConfig {
            id: id as u64,
            target_name: target_name.to_string(),
            physical_block_size: (i.physical_block_size != i.block_size).then_some(i.physical_block_size),
            removable: options.removable,
            read_only: options.read_only,
            state_dir,
            ..Default::default()
        };
        let scsi = riser_scsi::Lun::new(cfg, bdev.clone());
        Lun { id, bdev_name: bdev_name.to_string(), options, scsi, bdev }
    }

    /// As `iscsi_get_target_nodes` and `save_config` show it.
    pub fn json(&self) -> Value {
        let mut v = json!({"bdev_name": self.bdev_name, "lun_id": self.id});
        if let (Some(m), Ok(Value::Object(o))) = (v.as_object_mut(), serde_json::to_value(self.options)) {
            m.extend(o);
        }
        v
    }
}

impl std::fmt::Debug for Lun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lun").field("id", &self.id).field("bdev_name", &self.bdev_name).finish()
    }
}

/// CHAP policy of a node (or of discovery sessions), SPDK's four parameters: `disable_chap`
/// (AuthMethod=None only), `require_chap` (CHAP only), neither (either), `mutual_chap` (the
/// target authenticates too; needs `require_chap`), and `chap_group`, the auth group holding
/// the secrets (0: none). Login code asks [`crate::IscsiTarget::node_auth`] /
/// [`crate::IscsiTarget::discovery_auth`], which join it with the group's secrets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chap {
    pub disable_chap: bool,
    pub require_chap: bool,
    pub mutual_chap: bool,
    pub chap_group: u32,
}

impl Chap {
    /// For log lines: "CHAP required, mutual, auth group 2", "no CHAP", ...
    pub fn describe(&self) -> String {
        let mode = match (self.disable_chap, self.require_chap) {
            (true, _) => return "no CHAP".to_string(),
            (false, true) => "CHAP required",
            (false, false) => "CHAP optional",
        };
        let mutual = if self.mutual_chap { ", mutual" } else { "" };
        match self.chap_group {
            0 => format!("{mode}{mutual}, no auth group"),
            g => format!("{mode}{mutual}, auth group {g}"),
        }
    }
}

/// The part of a node that changes after creation.
pub(crate) struct NodeState {
    /// Sorted by id. Replaced, never edited, so readers can keep an old snapshot.
    pub(crate) luns: Arc<[Lun]>,
    /// Grouped by portal group in the order the groups were first mapped, as SPDK keeps and
    /// shows them.
    pub(crate) maps: Vec<(u32, Vec<u32>)>,
    /// Checked on the way in ([`crate::options::check_chap`]).
    pub(crate) chap: Chap,
    /// Login redirects by portal group (`iscsi_target_node_set_redirect`).
    pub(crate) redirects: Vec<redirect::Redirect>,
}

/// A target node.
pub struct TargetNode {
    name: String,
    alias_name: Option<String>,
    queue_depth: u32,
    header_digest: bool,
    data_digest: bool,
    generation: AtomicU64,
    /// Set when deletion starts: the node is no longer found, refuses logins and changes.
    deleted: AtomicBool,
    state: Mutex<NodeState>,
    /// The ALUA description (`iscsi_target_node_set_alua`), shared with every nexus.
    pub(crate) alua: Arc<riser_scsi::Alua>,
    /// The LUNs whose device has a gateway group (issue 23).
    gateways: gateways::Gateways,
}

impl std::fmt::Debug for TargetNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetNode")
            .field("name", &self.name)
            .field("generation", &self.generation())
            .field("deleted", &self.is_deleted())
            .finish()
    }
}

/// What a node is created with (validated by the caller).
pub(crate) struct NodeInit {
    pub name: String,
    pub alias_name: Option<String>,
    pub queue_depth: u32,
    pub chap: Chap,
    pub header_digest: bool,
    pub data_digest: bool,
    pub luns: Vec<Lun>,
    pub maps: Vec<PgIgMap>,
}

impl TargetNode {
    pub(crate) fn new(init: NodeInit) -> TargetNode {
        let mut luns = init.luns;
        luns.sort_by_key(|l| l.id);
        let mut maps = Vec::new();
        for m in &init.maps {
            add_map(&mut maps, *m);
        }
        TargetNode {
            name: init.name,
            alias_name: init.alias_name,
            queue_depth: init.queue_depth,
            header_digest: init.header_digest,
            data_digest: init.data_digest,
            generation: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            state: Mutex::new(NodeState {
                luns: {
                    let ids: Vec<u64> = luns.iter().map(|l| l.id as u64).collect();
                    for l in &luns {
                        l.scsi.set_target_luns(&ids);
                    }
                    luns.into()
                },
                maps,
                chap: init.chap,
                redirects: Vec::new(),
            }),
            alua: riser_scsi::Alua::new(),
            gateways: Default::default(),
        }
    }

    /// The node's ALUA description (empty until `iscsi_target_node_set_alua`): sessions'
    /// nexuses hold it (`riser_scsi::Nexus::with_alua`).
    pub fn alua(&self) -> &Arc<riser_scsi::Alua> {
        &self.alua
    }

    /// The full iSCSI name (TargetName).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// TargetAlias, if any.
    pub fn alias_name(&self) -> Option<&str> {
        self.alias_name.as_deref()
    }

    /// Most commands outstanding per session (bounds MaxCmdSN - ExpCmdSN + 1).
    pub fn queue_depth(&self) -> u32 {
        self.queue_depth
    }

    /// The CHAP policy now (`iscsi_target_node_set_auth` changes it). Login code wants
    /// [`crate::IscsiTarget::node_auth`], which adds the secrets.
    pub fn chap(&self) -> Chap {
        self.lock().chap
    }

    /// HeaderDigest must be CRC32C (RFC 7143 §13.1): offer only CRC32C.
    pub fn header_digest(&self) -> bool {
        self.header_digest
    }

    /// DataDigest must be CRC32C.
    pub fn data_digest(&self) -> bool {
        self.data_digest
    }

    /// Bumped on every change (LUN added or removed, maps or CHAP policy changed, deletion started). Sessions compare
    /// it with the value they saw last and re-read [`TargetNode::luns`] when it moved.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The LUNs (sorted by id) and the generation they belong to, read together.
    pub fn luns(&self) -> (u64, Arc<[Lun]>) {
        let st = self.lock();
        (self.generation(), st.luns.clone())
    }

    /// The maps, flattened in SPDK's order.
    pub fn pg_ig_maps(&self) -> Vec<PgIgMap> {
        flatten(&self.lock().maps)
    }

    /// Whether the node is mapped to portal group `pg_tag`.
    pub fn is_mapped_to(&self, pg_tag: u32) -> bool {
        self.lock().maps.iter().any(|(pg, _)| *pg == pg_tag)
    }

    /// True once deletion has started; sessions still holding the node should log out.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the state and bumps the generation under the node lock, so [`Self::luns`]
    /// never pairs a new generation with an old snapshot.
    pub(crate) fn change<R>(&self, f: impl FnOnce(&mut NodeState) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st);
        self.generation.fetch_add(1, Ordering::AcqRel);
        r
    }

    /// Marks the node deleted (callers check it was not, under the target's lock).
    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
        self.change(|_| ());
    }

    /// What `iscsi_get_target_nodes` shows (SPDK's `iscsi_tgt_node_info_json`).
    pub fn info_json(&self) -> Value {
        let st = self.lock();
        let mut v = json!({
            "name": self.name,
            "pg_ig_maps": flatten(&st.maps),
            "luns": st.luns.iter().map(Lun::json).collect::<Vec<_>>(),
            "queue_depth": self.queue_depth,
            "disable_chap": st.chap.disable_chap,
            "require_chap": st.chap.require_chap,
            "mutual_chap": st.chap.mutual_chap,
            "chap_group": st.chap.chap_group,
            "header_digest": self.header_digest,
            "data_digest": self.data_digest,
        });
        if let (Some(a), Some(m)) = (&self.alias_name, v.as_object_mut()) {
            m.insert("alias_name".into(), json!(a));
        }
        drop(st);
        let gateways = self.gateways_json();
        if let (Some(g), Some(m)) = (self.alua_json(), v.as_object_mut()) {
            m.insert("alua_groups".into(), g);
        }
        if let Some(m) = v.as_object_mut() {
            let failback = self.alua_failback();
            if m.contains_key("alua_groups") || gateways.is_some() || failback != riser_scsi::Failback::default() {
                m.insert("alua_failback".into(), json!(failback.name()));
            }
            if let Some(g) = gateways {
                m.insert("gateways".into(), g);
            }
            // riser's extension: SPDK keeps redirects but does not show them.
            if let Some(r) = self.redirects_json() {
                m.insert("redirects".into(), r);
            }
            // riser's extension: rate limits per initiator.
            if let Some(q) = self.qos_json() {
                m.insert("qos_limits".into(), q);
            }
        }
        v
    }

    /// The `iscsi_create_target_node` call that recreates this node, LUNs, maps and CHAP policy
    /// included.
    pub fn config_json(&self) -> Value {
        let mut params = self.info_json();
        // The ALUA description has a call of its own (see [`TargetNode::config_calls`]);
        // the gateways are what the cluster says, not configuration.
        if let Some(m) = params.as_object_mut() {
            for k in ["alua_groups", "alua_failback", "gateways", "redirects", "qos_limits"] {
                m.remove(k);
            }
        }
        json!({"method": "iscsi_create_target_node", "params": params})
    }
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

impl From<IscsiCreateTargetNode> for NodeParams {
    fn from(p: IscsiCreateTargetNode) -> Self {
        NodeParams {
            name: p.name,
            alias_name: p.alias_name,
            pg_ig_maps: p.pg_ig_maps,
            luns: p
                .luns
                .into_iter()
                .map(|l| LunSpec {
                    lun_id: l.lun_id,
                    bdev_name: l.bdev_name,
                    options: LunOptions { removable: l.removable, read_only: l.read_only },
                })
                .collect(),
            queue_depth: p.queue_depth,
            chap: Chap {
                disable_chap: p.disable_chap,
                require_chap: p.require_chap,
                mutual_chap: p.mutual_chap,
                chap_group: p.chap_group.unwrap_or(0),
            },
            header_digest: p.header_digest,
            data_digest: p.data_digest,
        }
    }
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

impl Inner {
    /// The node of that exact name (iSCSI names compare case-insensitively), deleted or not.
    fn node_exact(&self, name: &str) -> Option<&Arc<TargetNode>> {
        self.nodes.iter().find(|n| n.name().eq_ignore_ascii_case(name))
    }

    /// A node named in an RPC: the full name, or the short name SPDK's create took (node_base
    /// is put in front). Refuses a node being deleted.
    fn node_for_change(&self, name: &str) -> Result<Arc<TargetNode>, TargetError> {
        let n = self
            .node_exact(name)
            .or_else(|| self.node_exact(&full_name(&self.options.node_base, name)))
            .ok_or_else(|| TargetError::NotFound(format!("target node {name} not found")))?;
        if n.is_deleted() {
            return Err(TargetError::Busy(format!("target node {} is being deleted", n.name())));
        }
        Ok(n.clone())
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
            if !seen.insert((m.pg_tag, m.ig_tag)) || has_map(existing, *m) {
                return Err(TargetError::Exists(format!(
                    "pg_ig_maps[{i}]: portal group {} is already mapped to initiator group {}",
                    m.pg_tag, m.ig_tag
                )));
            }
        }
        if seen.len() + flatten(existing).len() > MAX_TARGET_MAPS {
            return Err(TargetError::Invalid(format!("pg_ig_maps: a target node holds at most {MAX_TARGET_MAPS} maps")));
        }
        Ok(())
    }
}

impl IscsiTarget {
    /// The node a Login Request's TargetName names (case-insensitive), unless it is being
    /// deleted.
    pub fn find_node(&self, name: &str) -> Option<Arc<TargetNode>> {
        self.lock().node_exact(name).filter(|n| !n.is_deleted()).cloned()
    }

    /// A node named in an RPC (the full name, or the short one given to create), not being
    /// deleted.
    pub fn node_named(&self, name: &str) -> Result<Arc<TargetNode>, TargetError> {
        self.lock().node_for_change(name)
    }

    /// Every node, in creation order (those being deleted left out).
    pub fn target_nodes(&self) -> Vec<Arc<TargetNode>> {
        self.lock().nodes.iter().filter(|n| !n.is_deleted()).cloned().collect()
    }

    /// `iscsi_create_target_node`. Everything is checked before any bdev is claimed, and a
    /// failed claim releases the ones made, so a refused call leaves nothing behind.
    pub fn create_target_node(&self, p: NodeParams) -> Result<Arc<TargetNode>, TargetError> {
        let mut inner = self.lock();
        let name = full_name(&inner.options.node_base, p.name.trim());
        check_iscsi_name(&name).map_err(|e| TargetError::Invalid(format!("name: {e}")))?;
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
        let state_dir = self.state_dir();
        {
            let mut bdevs = self.lock_bdevs();
            for (i, spec) in p.luns.iter().enumerate() {
                // Checked above: id < MAX_LUNS fits u16.
                let id = spec.lun_id as u16;
                match bdevs.claim(&spec.bdev_name, &lun_owner(&name, id)) {
                    Ok(bdev) => luns.push(Lun::new(id, &spec.bdev_name, spec.options, bdev, &name, state_dir.clone())),
                    Err(e) => {
                        for l in &luns {
                            bdevs.release(&l.bdev_name);
                        }
                        return Err(claim_error(&format!("luns[{i}].bdev_name"), e));
                    }
                }
            }
        }
        inner.warn_unusable_chap(&format!("target node {name}"), &p.chap);
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
        log::info!("iSCSI target node {} created ({})", node.name(), p.chap.describe());
        inner.nodes.push(node.clone());
        drop(inner);
        node.attach_gateways(&self.hooks);
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
            let state_dir = self.state_dir();
            node.change(|st| {
                let mut v = st.luns.to_vec();
                v.push(Lun::new(id, bdev_name, options, bdev, node.name(), state_dir));
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
        node.attach_gateways(&self.hooks);
        if let Some(h) = self.hooks().lun_added {
            h(&node, id);
        }
        Ok(id)
    }

    /// `iscsi_target_node_remove_lun` (riser's extension; SPDK has no way to remove a LUN,
    /// spdk #2871): LUN `lun_id` leaves the node's map at once, so every later command to
    /// it gets LOGICAL UNIT NOT SUPPORTED, as for a LUN that never existed, and every I_T
    /// nexus that used one of the node's other LUNs gets REPORTED LUNS DATA HAS CHANGED.
    /// Commands already running on it complete (or are aborted by the initiator) on their
    /// connection's channel of it; once no channel of it is left (bounded by
    /// [`LUN_DRAIN_WAIT`]) its bdev is released, so it can be deleted.
    ///
    /// Any LUN may go, LUN 0 included (as in LIO: REPORT LUNS is answered at target level
    /// through whichever LUN number it is sent to), but not the last one: a node has at
    /// least one LUN, as `iscsi_create_target_node` requires (delete the node instead).
    pub fn target_node_remove_lun(&self, name: &str, lun_id: u32) -> Result<(), TargetError> {
        let (node, lun) = {
            let inner = self.lock();
            let node = inner.node_for_change(name)?;
            let (_, luns) = node.luns();
            let lun = luns
                .iter()
                .find(|l| u32::from(l.id) == lun_id)
                .cloned()
                .ok_or_else(|| TargetError::NotFound(format!("lun_id: target node {} has no LUN {lun_id}", node.name())))?;
            if luns.len() == 1 {
                return Err(TargetError::Invalid(format!(
                    "lun_id: LUN {lun_id} is the last LUN of target node {}; a target node has at least one (delete the node instead)",
                    node.name()
                )));
            }
            node.change(|st| {
                let v: Vec<Lun> = st.luns.iter().filter(|l| l.id != lun.id).cloned().collect();
                // The LUNs that stay learn the new inventory and raise REPORTED LUNS DATA
                // HAS CHANGED for every initiator that used them (SPC-4 §6.33).
                let ids: Vec<u64> = v.iter().map(|l| l.id as u64).collect();
                for l in &v {
                    l.scsi.set_target_luns(&ids);
                }
                st.luns = v.into();
            });
            (node, lun)
        };
        log::info!("iSCSI target node {}: LUN {} (bdev {}) removed", node.name(), lun.id, lun.bdev_name);
        node.detach_gateway(lun.id);
        // Connections pick the new map up on their next command or timer tick; a channel
        // of the LUN lives on until its commands in flight are done. Two looks apart, so
        // that a connection that read the old map just before the change is seen too.
        let deadline = std::time::Instant::now() + LUN_DRAIN_WAIT;
        let mut quiet = 0;
        while quiet < 2 {
            if lun.scsi.open_channels() == 0 {
                quiet += 1;
            } else {
                quiet = 0;
            }
            if std::time::Instant::now() >= deadline {
                log::warn!(
                    "iSCSI target node {}: LUN {} still has {} connection(s) with commands in flight after {LUN_DRAIN_WAIT:?}; releasing bdev {} anyway",
                    node.name(),
                    lun.id,
                    lun.scsi.open_channels(),
                    lun.bdev_name
                );
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.lock_bdevs().release(&lun.bdev_name);
        Ok(())
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
        node.change(|st| maps.iter().for_each(|m| add_map(&mut st.maps, *m)));
        drop(inner);
        node.publish_served();
        // An initiator group with a `!name` entry mapped ahead of another can shut one out.
        self.access_changed(&format!("iscsi_target_node_add_pg_ig_maps on target node {}", node.name()));
        Ok(())
    }

    /// `iscsi_target_node_remove_pg_ig_maps`: all or none. Live sessions the maps left no
    /// longer admit are asked to log out (the access-changed hook).
    pub fn target_node_remove_pg_ig_maps(&self, name: &str, maps: &[PgIgMap]) -> Result<(), TargetError> {
        let inner = self.lock();
        let node = inner.node_for_change(name)?;
        if maps.is_empty() {
            return Err(TargetError::Invalid("pg_ig_maps: at least one map is required".into()));
        }
        let mut left = node.lock().maps.clone();
        for (i, m) in maps.iter().enumerate() {
            if !has_map(&left, *m) {
                return Err(TargetError::NotFound(format!(
                    "pg_ig_maps[{i}]: portal group {} is not mapped to initiator group {} on target node {}",
                    m.pg_tag,
                    m.ig_tag,
                    node.name()
                )));
            }
            remove_map(&mut left, *m);
        }
        node.change(|st| {
            st.redirects.retain(|r| left.iter().any(|(pg, _)| *pg == r.pg_tag));
            st.maps = left
        });
        drop(inner);
        node.publish_served();
        self.access_changed(&format!("iscsi_target_node_remove_pg_ig_maps on target node {}", node.name()));
        Ok(())
    }

    /// `iscsi_target_node_set_auth`: the node's whole CHAP policy is replaced (SPDK). Applies
    /// to the next logins; live sessions it no longer admits are asked to log out.
    pub fn set_target_node_auth(&self, name: &str, chap: Chap) -> Result<(), TargetError> {
        let inner = self.lock();
        let node = inner.node_for_change(name)?;
        options::check_chap(chap.disable_chap, chap.require_chap, chap.mutual_chap)?;
        inner.warn_unusable_chap(&format!("target node {}", node.name()), &chap);
        node.change(|st| st.chap = chap);
        drop(inner);
        log::info!("iSCSI target node {}: {}", node.name(), chap.describe());
        self.access_changed(&format!("iscsi_target_node_set_auth on target node {}", node.name()));
        Ok(())
    }

    /// `iscsi_delete_target_node`: marks the node deleted (no new logins), runs the
    /// node-deleting hook (which logs its sessions out), then removes it and releases its bdevs.
    /// A node with sessions is refused (Busy) unless `force` (riser's extension).
    pub fn delete_target_node(&self, name: &str, force: bool) -> Result<(), TargetError> {
        let sessions = self.hooks().node_sessions;
        let node = {
            let inner = self.lock();
            let node = inner.node_for_change(name)?;
            let n = sessions.as_ref().map_or(0, |h| h(&node));
            if n > 0 && !force {
                return Err(TargetError::Busy(format!(
                    "target node {} has {n} session(s): log them out first, or delete with force",
                    node.name()
                )));
            }
            node.mark_deleted();
            node
        };
        if let Some(h) = self.hooks().node_deleting {
            h(&node);
        }
        node.detach_gateways();
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

    pub(crate) fn target_nodes_json(&self) -> Value {
        Value::Array(self.target_nodes().iter().map(|n| n.info_json()).collect())
    }
}

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// A portal group ↔ initiator group pair: initiators of `ig_tag` may log in through the
/// portals of `pg_tag`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgIgMap {
    pub pg_tag: u32,
    pub ig_tag: u32,
}

/// One LUN of `iscsi_create_target_node`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LunParam {
    pub bdev_name: String,
    /// 0..=1023 (checked by the server).
    pub lun_id: u32,
    /// riser's extension: a removable medium.
    #[serde(default, skip_serializing_if = "is_false")]
    pub removable: bool,
    /// riser's extension: write-protected.
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
}

/// `iscsi_create_target_node`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiCreateTargetNode {
    /// A full `iqn.`/`eui.`/`naa.` name, or a short one the server puts after node_base.
    pub name: String,
    /// Required by SPDK; optional here (no alias).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias_name: Option<String>,
    pub pg_ig_maps: Vec<PgIgMap>,
    pub luns: Vec<LunParam>,
    /// Required by SPDK; defaults here to the max_queue_depth option.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub require_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub mutual_chap: bool,
    /// Absent: 0.
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub chap_group: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub header_digest: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub data_digest: bool,
}

/// `iscsi_target_node_add_lun`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeAddLun {
    /// Target node name (full, or as given to iscsi_create_target_node)
    pub name: String,
    /// Bdev to export
    pub bdev_name: String,
    /// LUN id (the lowest free one when absent or -1)
    #[cfg_attr(feature = "cli", arg(short = 'i', long, allow_negative_numbers = true))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lun_id: Option<i64>,
    /// riser's extension: report a removable medium (PREVENT ALLOW MEDIUM REMOVAL, START STOP
    /// UNIT eject and load)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub removable: bool,
    /// riser's extension: the LUN is write-protected (writes fail with DATA PROTECT)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
}

/// `iscsi_target_node_remove_lun` (riser's extension).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeRemoveLun {
    /// Target node name (full, or as given to iscsi_create_target_node)
    pub name: String,
    /// LUN id to remove
    pub lun_id: u32,
}

/// `iscsi_target_node_add_pg_ig_maps` and `iscsi_target_node_remove_pg_ig_maps`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiNodeMaps {
    pub name: String,
    pub pg_ig_maps: Vec<PgIgMap>,
}

/// `iscsi_target_node_set_auth`: the node's whole CHAP policy is replaced (an absent flag is
/// `false`, an absent `chap_group` 0), as SPDK does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeSetAuth {
    /// The full name, or the short name given to `iscsi_create_target_node`.
    pub name: String,
    /// The auth group whose secrets CHAP logins to this node use; 0: none.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub chap_group: u32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub require_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub mutual_chap: bool,
}

/// `iscsi_delete_target_node`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IscsiDeleteTargetNode {
    /// Target node name (full, or as given to iscsi_create_target_node)
    pub name: String,
    /// Delete it even if it has sessions (they are dropped); without it a node with sessions
    /// is refused (riser's extension)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub force: bool,
}

/// SPDK's default wait for a requested logout (ISCSI_LOGOUT_REQUEST_TIMEOUT), seconds.
pub const LOGOUT_REQUEST_TIMEOUT: u16 = 30;

/// `iscsi_target_node_request_logout` (SPDK; served by the session layer): every connection
/// of the node (through portal group `pg_tag` if given) gets an Async Message asking its
/// initiator to log out, and is dropped if it has not within `logout_timeout` seconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeRequestLogout {
    /// Target node name (full, or as given to iscsi_create_target_node)
    pub name: String,
    /// Only the connections through this portal group (default: all)
    #[cfg_attr(feature = "cli", arg(short = 't', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_tag: Option<u32>,
    /// Seconds the initiators get to log out (Parameter3) before they are dropped; 1..=3600,
    /// default 30 as SPDK (riser's extension)
    #[cfg_attr(feature = "cli", arg(short = 'w', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logout_timeout: Option<u16>,
}

/// Registers the target node methods.
pub(crate) fn register(reg: &mut RpcRegistry, target: &Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_create_target_node", move |p: IscsiCreateTargetNode| {
        ok(t.create_target_node(p.into()).map(|_| ()))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_add_lun", move |p: IscsiTargetNodeAddLun| {
        let lun_id = match p.lun_id {
            None | Some(-1) => None,
            Some(id) => match u32::try_from(id) {
                Ok(id) => Some(id),
                Err(_) => return Err(RpcError::invalid_params(format!("lun_id: {id} is out of range (0..=1023, or -1 for any)"))),
            },
        };
        let options = LunOptions { removable: p.removable, read_only: p.read_only };
        ok(t.target_node_add_lun(&p.name, &p.bdev_name, lun_id, options).map(|_| ()))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_remove_lun", move |p: IscsiTargetNodeRemoveLun| {
        ok(t.target_node_remove_lun(&p.name, p.lun_id))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_add_pg_ig_maps", move |p: IscsiNodeMaps| {
        ok(t.target_node_add_pg_ig_maps(&p.name, &p.pg_ig_maps))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_remove_pg_ig_maps", move |p: IscsiNodeMaps| {
        ok(t.target_node_remove_pg_ig_maps(&p.name, &p.pg_ig_maps))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_set_auth", move |p: IscsiTargetNodeSetAuth| {
        let chap = Chap {
            disable_chap: p.disable_chap,
            require_chap: p.require_chap,
            mutual_chap: p.mutual_chap,
            chap_group: p.chap_group,
        };
        ok(t.set_target_node_auth(&p.name, chap))
    });
    let t = target.clone();
    reg.add("iscsi_delete_target_node", move |p: IscsiDeleteTargetNode| ok(t.delete_target_node(&p.name, p.force)));
    let t = target.clone();
    reg.add("iscsi_get_target_nodes", move |_: NoParams| Ok(t.target_nodes_json()));
    alua::register(reg, target);
    redirect::register(reg, target);
    qos::register(reg, target);
}

// ---- maps and names -------------------------------------------------------------------------

pub(crate) fn flatten(maps: &[(u32, Vec<u32>)]) -> Vec<PgIgMap> {
    maps.iter().flat_map(|(pg, igs)| igs.iter().map(move |ig| PgIgMap { pg_tag: *pg, ig_tag: *ig })).collect()
}

pub(crate) fn has_map(maps: &[(u32, Vec<u32>)], m: PgIgMap) -> bool {
    maps.iter().any(|(pg, igs)| *pg == m.pg_tag && igs.contains(&m.ig_tag))
}

pub(crate) fn add_map(maps: &mut Vec<(u32, Vec<u32>)>, m: PgIgMap) {
    match maps.iter_mut().find(|(pg, _)| *pg == m.pg_tag) {
        Some((_, igs)) => igs.push(m.ig_tag),
        None => maps.push((m.pg_tag, vec![m.ig_tag])),
    }
}

/// Removes one map; a portal group left without initiator groups goes too.
pub(crate) fn remove_map(maps: &mut Vec<(u32, Vec<u32>)>, m: PgIgMap) {
    if let Some(i) = maps.iter().position(|(pg, _)| *pg == m.pg_tag) {
        maps[i].1.retain(|ig| *ig != m.ig_tag);
        if maps[i].1.is_empty() {
            maps.remove(i);
        }
    }
}

/// The full name of a node given as `name`: names with a type prefix (RFC 7143 §4.2.7)
/// are kept, others get `node_base:` in front (SPDK's rule).
pub fn full_name(node_base: &str, name: &str) -> String {
    let has_prefix = ["iqn.", "eui.", "naa."]
        .iter()
        .any(|p| name.len() >= 4 && name.is_char_boundary(4) && name[..4].eq_ignore_ascii_case(p));
    if has_prefix {
        name.to_string()
    } else {
        format!("{node_base}:{name}")
    }
}

/// Checks an iSCSI name as SPDK does (`check_iscsi_name`), with RFC 7143 §4.2.7 formats:
/// characters are letters, digits, `-`, `.`, `:` or non-ASCII; `iqn.yyyy-mm.` names carry a
/// date, `eui.` 16 hex digits, `naa.` 16 or 32 hex digits.
pub fn check_iscsi_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_ISCSI_NAME_LEN {
        return Err(format!("{name:?} must be 1..={MAX_ISCSI_NAME_LEN} bytes"));
    }
    if let Some(c) = name.chars().find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':') || !c.is_ascii())) {
        return Err(format!("{name:?} has the character {c:?} (iSCSI names use letters, digits, '-', '.', ':')"));
    }
    let lower = name.to_ascii_lowercase();
    let b = lower.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    if lower.starts_with("iqn.") {
        let dated = digits(4..8) && b.get(8) == Some(&b'-') && digits(9..11) && b.get(11) == Some(&b'.');
        if !dated || b.len() <= 12 {
            return Err(format!("{name:?} is not of the form iqn.yyyy-mm.reversed.domain[:identifier]"));
        }
    } else if let Some(hex) = lower.strip_prefix("eui.") {
        if hex.len() != 16 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("{name:?}: an eui. name has 16 hex digits"));
        }
    } else if let Some(hex) = lower.strip_prefix("naa.") {
        if !(hex.len() == 16 || hex.len() == 32) || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("{name:?}: a naa. name has 16 or 32 hex digits"));
        }
    }
    Ok(())
}

pub mod alua;
mod gateways;
mod qos;
mod redirect;
pub use qos::IscsiTargetNodeSetQosLimit;
pub use redirect::IscsiTargetNodeSetRedirect;
pub use alua::{AluaGroupParam, IscsiTargetNodeAluaFailback, IscsiTargetNodeSetAlua, IscsiTargetNodeSetAluaState};
pub use gateways::GatewayView;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod gateways_tests;
