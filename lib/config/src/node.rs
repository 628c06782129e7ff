//! Target nodes: an iSCSI name, its LUNs (each a claimed bdev), the portal group ↔ initiator
//! group maps that say who may log in where, and per-node session parameters.
//!
//! A node is shared (`Arc`) with login and data-path code. What can change after creation
//! (LUNs, maps) sits behind a small lock; every change bumps [`TargetNode::generation`], so a
//! session notices with one atomic load and fetches a new [`TargetNode::luns`] snapshot only
//! then.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use riser_bdev::Bdev;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::initiator_group::MAX_ISCSI_NAME_LEN;

/// LUN ids are 0..=1023 (SPDK's SPDK_SCSI_DEV_MAX_LUN; flat-space addressing reaches 16383).
pub const MAX_LUNS: u32 = 1024;
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
    pub fn new(id: u16, bdev_name: &str, options: LunOptions, bdev: Arc<dyn Bdev>, target_name: &str) -> Lun {
        let i = bdev.info();
        let cfg = riser_scsi::LunConfig {
            id: id as u64,
            target_name: target_name.to_string(),
            physical_block_size: (i.physical_block_size != i.block_size).then_some(i.physical_block_size),
            removable: options.removable,
            read_only: options.read_only,
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

/// A portal group ↔ initiator group pair: initiators of `ig_tag` may log in through the
/// portals of `pg_tag`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgIgMap {
    pub pg_tag: u32,
    pub ig_tag: u32,
}

/// CHAP policy of a node (or of discovery sessions). No CHAP secrets exist yet (no
/// `iscsi_create_auth_group`), so the login code can only honour `disable_chap` and must
/// refuse `require_chap`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chap {
    pub disable_chap: bool,
    pub require_chap: bool,
    pub mutual_chap: bool,
    pub chap_group: u32,
}

/// The part of a node that changes after creation.
pub(crate) struct NodeState {
    /// Sorted by id. Replaced, never edited, so readers can keep an old snapshot.
    pub(crate) luns: Arc<[Lun]>,
    /// Grouped by portal group in the order the groups were first mapped, as SPDK keeps and
    /// shows them.
    pub(crate) maps: Vec<(u32, Vec<u32>)>,
}

/// A target node.
pub struct TargetNode {
    name: String,
    alias_name: Option<String>,
    queue_depth: u32,
    chap: Chap,
    header_digest: bool,
    data_digest: bool,
    generation: AtomicU64,
    /// Set when deletion starts: the node is no longer found, refuses logins and changes.
    deleted: AtomicBool,
    state: Mutex<NodeState>,
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
            chap: init.chap,
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
            }),
        }
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

    pub fn chap(&self) -> Chap {
        self.chap
    }

    /// HeaderDigest must be CRC32C (RFC 7143 §13.1): offer only CRC32C.
    pub fn header_digest(&self) -> bool {
        self.header_digest
    }

    /// DataDigest must be CRC32C.
    pub fn data_digest(&self) -> bool {
        self.data_digest
    }

    /// Bumped on every change (LUN added, maps changed, deletion started). Sessions compare
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
            "disable_chap": self.chap.disable_chap,
            "require_chap": self.chap.require_chap,
            "mutual_chap": self.chap.mutual_chap,
            "chap_group": self.chap.chap_group,
            "header_digest": self.header_digest,
            "data_digest": self.data_digest,
        });
        if let (Some(a), Some(m)) = (&self.alias_name, v.as_object_mut()) {
            m.insert("alias_name".into(), json!(a));
        }
        v
    }

    /// The `iscsi_create_target_node` call that recreates this node, LUNs and maps included.
    pub fn config_json(&self) -> Value {
        json!({"method": "iscsi_create_target_node", "params": self.info_json()})
    }
}

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

/// The full name of a node given as `name`: names with a type prefix (RFC 7143 §4.2.7.2)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_base_is_prefixed_only_to_names_without_a_type() {
        let base = "iqn.2016-06.io.riser";
        assert_eq!(full_name(base, "disk1"), "iqn.2016-06.io.riser:disk1");
        assert_eq!(full_name(base, "iqn.2001-04.com.example:d"), "iqn.2001-04.com.example:d");
        assert_eq!(full_name(base, "IQN.2001-04.com.example:d"), "IQN.2001-04.com.example:d");
        assert_eq!(full_name(base, "eui.02004567A425678D"), "eui.02004567A425678D");
        assert_eq!(full_name(base, "naa.52004567BA64678D"), "naa.52004567BA64678D");
        assert_eq!(full_name(base, "iq"), "iqn.2016-06.io.riser:iq");
        assert_eq!(full_name(base, "éé"), "iqn.2016-06.io.riser:éé");
    }

    #[test]
    fn iscsi_names_are_checked() {
        for ok in [
            "iqn.2016-06.io.riser:disk1",
            "iqn.1991-05.com.microsoft:host.domain",
            "iqn.2001-04.com.example",
            "eui.02004567A425678D",
            "naa.52004567BA64678D",
            "naa.52004567BA64678D52004567BA64678D",
            "iqn.2016-06.io.riser:ünïcode",
        ] {
            assert_eq!(check_iscsi_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "iqn.2016-06.io.riser:has space",
            "iqn.2016-06.io.riser:a/b",
            "iqn.2016-06.io.riser:a_b",
            "iqn.16-06.io.riser:x",
            "iqn.2016-6.io.riser:x",
            "iqn.2016-06.",
            "eui.1234",
            "naa.xyz4567BA64678D",
        ] {
            assert!(check_iscsi_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_iscsi_name(&format!("iqn.2016-06.io.riser:{}", "a".repeat(210))).is_err());
    }

    #[test]
    fn maps_group_by_portal_group_as_spdk_shows_them() {
        let mut maps = Vec::new();
        for (pg, ig) in [(1, 1), (2, 2), (1, 3)] {
            add_map(&mut maps, PgIgMap { pg_tag: pg, ig_tag: ig });
        }
        let flat: Vec<(u32, u32)> = flatten(&maps).iter().map(|m| (m.pg_tag, m.ig_tag)).collect();
        assert_eq!(flat, [(1, 1), (1, 3), (2, 2)]);
        assert!(has_map(&maps, PgIgMap { pg_tag: 1, ig_tag: 3 }));
        remove_map(&mut maps, PgIgMap { pg_tag: 2, ig_tag: 2 });
        assert_eq!(maps, vec![(1, vec![1, 3])]);
    }
}
