//! iSCSI target configuration: global options, portal groups, initiator groups, auth groups
//! (CHAP secrets), target nodes with their LUNs and maps, the JSON-RPC methods that build them
//! (SPDK's names and shapes), and the queries login code asks (may this initiator log in
//! here? how must it authenticate? what does SendTargets list? where to listen?).
//!
//! [`IscsiTarget`] owns all of it behind one lock; the control plane (RPC threads, login
//! threads) calls it, reactors never do. Sessions hold `Arc<TargetNode>` and notice changes
//! through [`TargetNode::generation`].
//!
//! One file per concept, as SPDK keeps `portal_grp.c`, `init_grp.c` and `tgt_node.c` (auth
//! groups, in SPDK's `iscsi_subsystem.c`, get their own here): its
//! types, its `impl IscsiTarget` block (create, change, delete, list), its RPC methods and its
//! part of save_config. This file holds what they share: the target and its lock, errors,
//! hooks and the login queries. Each method's parameter type is defined once, beside its
//! handler in its concept's file: this server decodes it, the `riser-rpc` CLI (rpc/cli)
//! encodes it, and with the `cli` feature most of them carry their subcommand's arguments.
//!
//! Lock order: the target's lock, then the bdev registry's lock (never the other way round),
//! then a node's own small lock. Hooks run with no lock held.

pub mod auth_group;
pub mod initiator_group;
pub mod options;
pub mod portal_group;
pub mod recheck;
pub mod rpc;
pub mod target_node;
#[cfg(test)]
mod testing;

/// The old name of [`target_node`].
pub use target_node as node;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use riser_bdev::BdevRegistry;
use riser_rpc::RpcError;
use serde_json::Value;
use thiserror::Error;

pub use auth_group::{AuthDecision, AuthGroup, AuthMode, AuthSecret};
pub use initiator_group::{InitiatorGroup, Netmask};
pub use options::{Options, OptionsUpdate};
pub use portal_group::{Portal, PortalGroup, PortalParam};
pub use target_node::{Chap, Lun, LunOptions, LunSpec, NodeParams, PgIgMap, TargetNode};

use portal_group::host_string;

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

/// Which nodes a SendTargets request asks for (RFC 7143 §13.3, Appendix C).
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
type NodeCountHook = Arc<dyn Fn(&Arc<TargetNode>) -> usize + Send + Sync>;
type NodeReasonHook = Arc<dyn Fn(&Arc<TargetNode>, &str) + Send + Sync>;

/// Callbacks into the session and listener layers. Each runs on the thread of the RPC that
/// caused it (`node_fenced`: the gateway group's thread), with no lock held, so it may call
/// back into [`IscsiTarget`].
#[derive(Default, Clone)]
struct Hooks {
    node_deleting: Option<NodeHook>,
    lun_added: Option<LunHook>,
    portals_changed: Option<PortalsHook>,
    node_fenced: Option<NodeReasonHook>,
    node_sessions: Option<NodeCountHook>,
    recheck: recheck::RecheckHooks,
}

/// The hooks, shared with the gateway groups' subscriptions (which outlive any one call).
type SharedHooks = Arc<Mutex<Hooks>>;

fn hooks_of(h: &SharedHooks) -> Hooks {
    h.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Everything behind the target's lock. Each concept file adds its lookups (`impl Inner`).
#[derive(Default)]
struct Inner {
    options: Options,
    /// In creation order, which is also save_config's order.
    portal_groups: Vec<PortalGroup>,
    initiator_groups: Vec<InitiatorGroup>,
    auth_groups: Vec<AuthGroup>,
    /// Includes nodes whose deletion has started (until it ends).
    nodes: Vec<Arc<TargetNode>>,
}

impl Inner {
    /// SPDK's access rule (`iscsi_tgt_node_access`): over the maps of portal group `pg_tag`,
    /// in order, the first initiator group that denies the name refuses, the first that
    /// admits name and address accepts.
    fn access(&self, node: &TargetNode, initiator_name: &str, addr: IpAddr, pg_tag: u32) -> Result<(), Denied> {
        if node.is_deleted() {
            return Err(Denied::NotFound);
        }
        self.access_why(node, initiator_name, addr, pg_tag).map_err(|_| Denied::NotAuthorized)
    }
}

/// All iSCSI target configuration. Share it as `Arc<IscsiTarget>`.
pub struct IscsiTarget {
    inner: Mutex<Inner>,
    bdevs: Arc<Mutex<BdevRegistry>>,
    hooks: SharedHooks,
    portal_generation: AtomicU64,
    /// Where LUNs keep persistent reservations made with APTPL=1 (`riser --state-dir`).
    state_dir: Mutex<Option<PathBuf>>,
}

impl IscsiTarget {
    /// An empty configuration with default options. LUNs claim their bdevs in `bdevs`.
    pub fn new(bdevs: Arc<Mutex<BdevRegistry>>) -> Self {
        IscsiTarget {
            inner: Mutex::new(Inner::default()),
            bdevs,
            hooks: SharedHooks::default(),
            portal_generation: AtomicU64::new(0),
            state_dir: Mutex::new(None),
        }
    }

    /// The state directory of LUNs created from now on: their persistent reservations with
    /// APTPL=1 are saved there and restored from there (by device UUID and LUN). `None`
    /// (the default): APTPL is refused.
    pub fn set_state_dir(&self, dir: Option<PathBuf>) {
        *self.state_dir.lock().unwrap_or_else(|p| p.into_inner()) = dir;
    }

    /// See [`set_state_dir`](Self::set_state_dir).
    pub fn state_dir(&self) -> Option<PathBuf> {
        self.state_dir.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_bdevs(&self) -> MutexGuard<'_, BdevRegistry> {
        self.bdevs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hooks(&self) -> Hooks {
        hooks_of(&self.hooks)
    }

    // ---- hooks ---------------------------------------------------------------------------

    /// Called when `iscsi_delete_target_node` starts, before the node is removed and its
    /// bdevs released: the session layer should log out that node's sessions (it may wait
    /// for them here). The node already refuses logins and [`TargetNode::is_deleted`] is true.
    pub fn on_node_deleting(&self, f: impl Fn(&Arc<TargetNode>) + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).node_deleting = Some(Arc::new(f));
    }

    /// Asked how many sessions a node has (`iscsi_delete_target_node` refuses a node with
    /// sessions unless forced). Runs under the target's lock: it must not call back into it.
    pub fn on_node_sessions(&self, f: impl Fn(&Arc<TargetNode>) -> usize + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).node_sessions = Some(Arc::new(f));
    }

    /// Called when this gateway was fenced from the gateway group of a device one of the
    /// node's LUNs exports (issue 23), with why: the session layer should drop the node's
    /// sessions. Runs on the group's thread.
    pub fn on_node_fenced(&self, f: impl Fn(&Arc<TargetNode>, &str) + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).node_fenced = Some(Arc::new(f));
    }

    /// Called after a LUN was added to a node (sessions owe a REPORTED LUNS DATA HAS CHANGED
    /// unit attention, SPC-4 §6.33).
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

    // ---- queries for login code -----------------------------------------------------------

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

    // ---- save_config ----------------------------------------------------------------------

    /// The `"iscsi"` subsystem of save_config / `framework_get_config`: the calls that
    /// recreate this configuration, in an order that replays (options, portal groups,
    /// initiator groups, auth groups, then nodes with their LUNs, maps and CHAP policy), each
    /// concept's own `config_json`. Options are written in full, discovery authentication
    /// included, as SPDK does. SPDK writes auth groups last; here they come before the nodes
    /// that name them.
    pub fn config_json(&self) -> Vec<Value> {
        let inner = self.lock();
        let mut out = vec![inner.options.config_json()];
        out.extend(inner.portal_groups.iter().map(PortalGroup::config_json));
        out.extend(inner.initiator_groups.iter().map(InitiatorGroup::config_json));
        out.extend(inner.auth_groups.iter().map(AuthGroup::config_json));
        out.extend(inner.portal_groups.iter().filter_map(PortalGroup::auth_config_json));
        out.extend(inner.nodes.iter().filter(|n| !n.is_deleted()).flat_map(|n| n.config_calls()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    const A: &str = "iqn.1994-05.com.redhat:a";
    const B: &str = "iqn.1994-05.com.redhat:b";

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
        t.delete_target_node("d1", false).unwrap();
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
        t.delete_target_node(n.name(), false).unwrap();
        // Once deleted, the node is gone for every RPC.
        assert_eq!(
            t.delete_target_node(n.name(), false),
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
    fn errors_carry_spdk_codes() {
        assert_eq!(RpcError::from(TargetError::Invalid("x".into())), RpcError::invalid_params("x"));
        assert_eq!(RpcError::from(TargetError::Exists("x".into())).code, -17);
        assert_eq!(RpcError::from(TargetError::NotFound("x".into())).code, -19);
        assert_eq!(RpcError::from(TargetError::Busy("x".into())).code, -16);
    }
}
