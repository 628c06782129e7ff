//! Asymmetric logical unit access (SPC-4 5.15): the target port groups of a target node,
//! each with its asymmetric access state, shared by every session of the node.
//!
//! riser does implicit ALUA only (INQUIRY TPGS = 01b): states are set by the administrator
//! (an RPC) and by the target itself when a gateway is fenced, never by SET TARGET PORT
//! GROUPS. One riser process hosts some portal groups of
//! a target node ("local" groups); a node served by several gateways is described the same
//! way on each of them, so REPORT TARGET PORT GROUPS lists the peers' groups too. A group is
//! a portal group: its identifier is the portal group tag, its target port (relative target
//! port identifier) by default the tag as well.
//!
//! * [`AccessState`] — the states and what each lets through ([`AccessState::admits`]).
//! * [`Alua`] — the description of one target node: set and changed by the control plane,
//!   read by the data path ([`Alua::check`]: one atomic load while every group is active).
//! * [`report_target_port_groups`] — the REPORT TARGET PORT GROUPS parameter data.
//! * [`liveness`], [`effective`] — ALUA that follows the liveness of the gateways (issue
//!   23): the administrator's states are the preferred ones; a group served only by fenced
//!   gateways becomes unavailable, the live gateways' groups take over as active/optimized,
//!   and failback follows a [`Failback`] policy. Pure functions, so the whole policy is
//!   tested without a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use riser_bdev::{Member, MemberState};

use crate::cdb::{op, put_be16, put_be32, Cdb};
use crate::sense::{Asc, CmdError, SenseKey};
use crate::task::Nexus;

/// Asymmetric access states (SPC-4 6.36, table 164), as REPORT TARGET PORT GROUPS codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    Transitioning,
}

/// SUPPORTED STATES byte of every group: T_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP (the states
/// an RPC can set; no logical block dependent or offline state).
pub const SUPPORTED_STATES: u8 = 0x80 | 0x08 | 0x04 | 0x02 | 0x01;

/// STATUS CODE of a group whose state was changed by the target (implicit transition).
pub const STATUS_IMPLICIT_CHANGE: u8 = 0x02;

impl AccessState {
    pub const ALL: [AccessState; 5] =
        [AccessState::ActiveOptimized, AccessState::ActiveNonOptimized, AccessState::Standby, AccessState::Unavailable, AccessState::Transitioning];

    /// The ASYMMETRIC ACCESS STATE code.
    pub fn code(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x0,
            AccessState::ActiveNonOptimized => 0x1,
            AccessState::Standby => 0x2,
            AccessState::Unavailable => 0x3,
            AccessState::Transitioning => 0xF,
        }
    }

    /// The name the RPCs use.
    pub fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active_optimized",
            AccessState::ActiveNonOptimized => "active_non_optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Transitioning => "transitioning",
        }
    }

    pub fn from_name(s: &str) -> Option<AccessState> {
        AccessState::ALL.into_iter().find(|a| a.name() == s)
    }

    pub fn is_active(self) -> bool {
        matches!(self, AccessState::ActiveOptimized | AccessState::ActiveNonOptimized)
    }

    /// Whether a command with `cdb` may run through a target port in this state, else the
    /// NOT READY additional sense it gets (SPC-4 5.15.2.4.2-5, 5.15.2.5).
    pub fn admits(self, cdb: &Cdb) -> Result<(), Asc> {
        let opc = cdb.opcode();
        // Allowed in every state: what an initiator needs to find out about the port and
        // the logical unit (SPC-4 5.15.2.4.5 list, with the later REPORT commands).
        let always = match opc {
            op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE | op::MAINTENANCE_IN => true,
            // Echo buffer modes of READ BUFFER / WRITE BUFFER.
            op::READ_BUFFER | op::WRITE_BUFFER => cdb.u8(1) & 0x1F == 0x0A || cdb.u8(1) & 0x1F == 0x0B,
            _ => false,
        };
        if always || self.is_active() {
            return Ok(());
        }
        match self {
            AccessState::Standby => match opc {
                // SPC-4 5.15.2.4.4: standby also serves logs, mode pages, diagnostics and
                // persistent reservations (TEST UNIT READY is not in the list).
                op::LOG_SELECT
                | op::LOG_SENSE
                | op::MODE_SELECT6
                | op::MODE_SELECT10
                | op::MODE_SENSE6
                | op::MODE_SENSE10
                | op::SEND_DIAGNOSTIC
                | RECEIVE_DIAGNOSTIC_RESULTS
                | op::PERSISTENT_RESERVE_IN
                | op::PERSISTENT_RESERVE_OUT => Ok(()),
                _ => Err(Asc::LUN_NOT_ACCESSIBLE_STANDBY),
            },
            AccessState::Unavailable => Err(Asc::LUN_NOT_ACCESSIBLE_UNAVAILABLE),
            _ => Err(Asc::LUN_NOT_ACCESSIBLE_TRANSITIONING),
        }
    }
}

const RECEIVE_DIAGNOSTIC_RESULTS: u8 = 0x1C;

/// One target port group as described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortGroup {
    /// TARGET PORT GROUP: the portal group tag.
    pub id: u16,
    pub state: AccessState,
    /// PREF: a preferred group.
    pub pref: bool,
    /// RELATIVE TARGET PORT IDENTIFIERs of its ports (empty: the id).
    pub rel_port_ids: Vec<u16>,
    /// STATUS CODE: 0, or [`STATUS_IMPLICIT_CHANGE`] once its state was changed.
    pub status: u8,
}

impl PortGroup {
    pub fn new(id: u16, state: AccessState) -> PortGroup {
        PortGroup { id, state, pref: false, rel_port_ids: Vec::new(), status: 0 }
    }

    /// The relative target port identifiers (the id when none are given).
    pub fn ports(&self) -> Vec<u16> {
        if self.rel_port_ids.is_empty() {
            vec![self.id]
        } else {
            self.rel_port_ids.clone()
        }
    }
}

/// The ALUA description of one target node: empty until set, and then every session of
/// the node sees the same groups. Shared (`Arc`) by the node and its nexuses.
///
/// The administrator's states are the *preferred* ones; the *effective* states, the ones
/// REPORT TARGET PORT GROUPS reports and [`Alua::check`] enforces, follow the liveness of
/// the gateways as well (see [`Liveness`] and [`effective`]): without a gateway group, or
/// while no gateway is fenced, they are the preferred states.
#[derive(Debug, Default)]
pub struct Alua {
    /// The effective groups, by id: what the data path reads.
    groups: RwLock<Vec<PortGroup>>,
    /// Some effective group is not active: commands look up their group's state.
    restricted: AtomicBool,
    /// What the effective groups are computed from (taken before `groups`).
    ctl: Mutex<Control>,
}

/// The inputs of the effective states, and why each is what it is.
#[derive(Debug, Default)]
struct Control {
    /// The administrator's description (`iscsi_target_node_set_alua`), by id.
    preferred: Vec<PortGroup>,
    failback: Failback,
    /// Groups kept unavailable after their gateway was fenced, until the administrator
    /// fails back (manual failback only).
    held: BTreeSet<u16>,
    live: Liveness,
    /// Why each effective group is in its state.
    why: BTreeMap<u16, Why>,
    /// Groups reported transitioning while they take over (see [`Alua::finish_transition`]).
    transitioning: bool,
}

impl Alua {
    pub fn new() -> Arc<Alua> {
        Arc::new(Alua::default())
    }

    fn ctl(&self) -> MutexGuard<'_, Control> {
        self.ctl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The effective groups, by id (empty: none described and none changed by liveness).
    pub fn groups(&self) -> Vec<PortGroup> {
        self.groups.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The administrator's description, by id (empty: none).
    pub fn preferred(&self) -> Vec<PortGroup> {
        self.ctl().preferred.clone()
    }

    /// Whether a description is set.
    pub fn is_described(&self) -> bool {
        !self.ctl().preferred.is_empty()
    }

    /// Every group described or changed by liveness, with its preferred and effective
    /// state and why (for `iscsi_get_target_nodes` and the metrics).
    pub fn view(&self) -> Vec<GroupView> {
        let ctl = self.ctl();
        let eff = self.groups();
        let mut ids: Vec<u16> = ctl.preferred.iter().map(|g| g.id).chain(eff.iter().map(|g| g.id)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| {
                let p = ctl.preferred.iter().find(|g| g.id == id);
                let e = eff.iter().find(|g| g.id == id);
                GroupView {
                    group: p.or(e).cloned().unwrap_or_else(|| PortGroup::new(id, AccessState::ActiveOptimized)),
                    described: p.is_some(),
                    preferred: p.map_or(AccessState::ActiveOptimized, |g| g.state),
                    effective: e.map_or(AccessState::ActiveOptimized, |g| g.state),
                    why: ctl.why.get(&id).cloned().unwrap_or(Why::Preferred),
                }
            })
            .collect()
    }

    pub fn failback_policy(&self) -> Failback {
        self.ctl().failback
    }

    /// Replaces the description (`groups` with distinct ids; empty: back to none) and
    /// releases every held group. A group whose state differs from what it reported before
    /// (active/optimized when it was not described) gets STATUS CODE 02h. Returns whether
    /// any effective state changed, for the caller to raise ASYMMETRIC ACCESS STATE CHANGED.
    pub fn set_groups(&self, groups: Vec<PortGroup>) -> bool {
        !self.replace(groups).is_empty()
    }

    /// [`Alua::set_groups`], returning the changes of effective state.
    pub fn replace(&self, mut groups: Vec<PortGroup>) -> Vec<Change> {
        groups.sort_by_key(|g| g.id);
        let mut ctl = self.ctl();
        ctl.preferred = groups;
        ctl.held.clear();
        self.recompute(&mut ctl)
    }

    /// Changes the preferred state of described group `id` (and releases it if it was held);
    /// `None` if there is no such group, else whether the effective state changed.
    pub fn set_state(&self, id: u16, state: AccessState) -> Option<bool> {
        self.set_preferred_state(id, state).map(|c| !c.is_empty())
    }

    /// [`Alua::set_state`], returning the changes of effective state.
    pub fn set_preferred_state(&self, id: u16, state: AccessState) -> Option<Vec<Change>> {
        let mut ctl = self.ctl();
        let g = ctl.preferred.iter_mut().find(|g| g.id == id)?;
        g.state = state;
        ctl.held.remove(&id);
        Some(self.recompute(&mut ctl))
    }

    /// Sets the failback policy (switching to auto fails back at once).
    pub fn set_failback(&self, failback: Failback) -> Vec<Change> {
        let mut ctl = self.ctl();
        ctl.failback = failback;
        self.recompute(&mut ctl)
    }

    /// Manual failback: every held group returns to its computed state (a group still
    /// served only by fenced gateways stays unavailable). Returns the changes and the
    /// groups released.
    pub fn failback_now(&self) -> (Vec<Change>, Vec<u16>) {
        let mut ctl = self.ctl();
        let released: Vec<u16> = std::mem::take(&mut ctl.held).into_iter().filter(|id| !ctl.live.down.contains_key(id)).collect();
        (self.recompute(&mut ctl), released)
    }

    /// New liveness from the gateway groups. A group that was down because its gateway was
    /// fenced stays down until a live gateway serves it again: the fenced member dropping
    /// out of the group's record (which keeps only the latest ones) is no recovery.
    pub fn set_liveness(&self, mut live: Liveness) -> Vec<Change> {
        let mut ctl = self.ctl();
        for (id, why) in ctl.live.down.iter() {
            if matches!(why, Why::Fenced(_)) && !live.down.contains_key(id) && !live.live.contains(id) {
                live.down.insert(*id, why.clone());
            }
        }
        ctl.live = live;
        self.recompute(&mut ctl)
    }

    /// Whether groups report transitioning while they take over: the caller raises the
    /// unit attention, then calls [`Alua::finish_transition`].
    pub fn is_transitioning(&self) -> bool {
        self.ctl().transitioning
    }

    /// Ends a takeover: the groups that reported transitioning take their computed state.
    pub fn finish_transition(&self) -> Vec<Change> {
        let mut ctl = self.ctl();
        ctl.transitioning = false;
        self.install(&mut ctl, false)
    }

    fn recompute(&self, ctl: &mut Control) -> Vec<Change> {
        self.install(ctl, true)
    }

    /// Computes the effective groups from `ctl` and installs them. With `transition`, a
    /// group that takes over from an inactive state reports transitioning first (SPC-4
    /// 5.15.2.6: commands get NOT READY, ASYMMETRIC ACCESS STATE TRANSITION and are retried),
    /// so no initiator sees a half-applied change; a group that was already active goes
    /// straight to active/optimized, its I/O never paused.
    fn install(&self, ctl: &mut Control, transition: bool) -> Vec<Change> {
        let eff = effective(&ctl.preferred, &ctl.live, &ctl.held, ctl.failback);
        ctl.held = eff.held;
        let mut cur = self.groups.write().unwrap_or_else(|e| e.into_inner());
        let old_state = |id: u16| cur.iter().find(|g| g.id == id).map_or(AccessState::ActiveOptimized, |g| g.state);
        let mut groups = Vec::with_capacity(eff.groups.len());
        let mut why = BTreeMap::new();
        let mut transitioning = false;
        for (mut g, w) in eff.groups {
            if transition && w == Why::TakingOver && !old_state(g.id).is_active() && g.state.is_active() {
                g.state = AccessState::Transitioning;
                transitioning = true;
            }
            why.insert(g.id, w);
            groups.push(g);
        }
        ctl.transitioning = transitioning;
        let mut changes = Vec::new();
        for g in groups.iter_mut() {
            let old = cur.iter().find(|o| o.id == g.id);
            // Without a description every group reports active/optimized.
            let old_state = old.map_or(AccessState::ActiveOptimized, |o| o.state);
            if old_state != g.state {
                g.status = STATUS_IMPLICIT_CHANGE;
                changes.push(Change { id: g.id, old: old_state, new: g.state, why: why.get(&g.id).cloned().unwrap_or(Why::Preferred) });
            } else {
                g.status = old.map_or(0, |o| o.status);
            }
        }
        // Groups that go away return to the default (active/optimized).
        for o in cur.iter().filter(|o| !groups.iter().any(|g| g.id == o.id)) {
            if o.state != AccessState::ActiveOptimized {
                changes.push(Change { id: o.id, old: o.state, new: AccessState::ActiveOptimized, why: Why::Preferred });
            }
        }
        self.restricted.store(groups.iter().any(|g| !g.state.is_active()), Ordering::Release);
        ctl.why = why;
        *cur = groups;
        changes
    }

    /// The state of group `id` (active/optimized when not described).
    pub fn state_of(&self, id: u16) -> AccessState {
        let cur = self.groups.read().unwrap_or_else(|e| e.into_inner());
        cur.iter().find(|g| g.id == id).map_or(AccessState::ActiveOptimized, |g| g.state)
    }

    /// The access check of a command that came in through group `tpg` (SPC-4 5.15.2.4):
    /// NOT READY with the state's LOGICAL UNIT NOT ACCESSIBLE code if the state bars it.
    /// One atomic load while every group is active.
    pub fn check(&self, tpg: u16, cdb: &Cdb) -> Result<(), CmdError> {
        if !self.restricted.load(Ordering::Acquire) {
            return Ok(());
        }
        self.state_of(tpg).admits(cdb).map_err(|asc| CmdError::check(SenseKey::NotReady, asc))
    }
}

// ---- ALUA that follows liveness ------------------------------------------------------------

/// What happens when the groups of a fenced gateway are served again by a live gateway
/// (it rejoined): `auto` returns every group to its computed (preferred) state at once;
/// `manual` keeps the failed-over states until the administrator calls
/// `iscsi_target_node_alua_failback` or sets the group's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Failback {
    #[default]
    Auto,
    Manual,
}

impl Failback {
    pub const ALL: [Failback; 2] = [Failback::Auto, Failback::Manual];

    pub fn name(self) -> &'static str {
        match self {
            Failback::Auto => "auto",
            Failback::Manual => "manual",
        }
    }

    pub fn from_name(s: &str) -> Option<Failback> {
        Failback::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// Why an effective state is what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// The administrator's (preferred) state.
    Preferred,
    /// Served only by fenced gateways (their names), by no live one: unavailable.
    Fenced(Vec<String>),
    /// A local group of this gateway, which is fenced: unavailable.
    SelfFenced,
    /// Its gateway was fenced and it is served again, but failback is manual: unavailable
    /// until the administrator fails back.
    Held,
    /// Served by a live gateway while an active group is out of service: active/optimized
    /// (transitioning while it takes over).
    TakingOver,
}

impl Why {
    /// For `iscsi_get_target_nodes` and log lines.
    pub fn describe(&self) -> String {
        match self {
            Why::Preferred => "preferred".into(),
            Why::Fenced(by) => format!("served only by fenced gateway(s) {}", by.join(", ")),
            Why::SelfFenced => "this gateway is fenced".into(),
            Why::Held => "held after its gateway was fenced (failback is manual)".into(),
            Why::TakingOver => "taking over from a fenced gateway".into(),
        }
    }

    /// A short name (`reason` in `iscsi_get_target_nodes`).
    pub fn name(&self) -> &'static str {
        match self {
            Why::Preferred => "preferred",
            Why::Fenced(_) => "fenced",
            Why::SelfFenced => "self_fenced",
            Why::Held => "held",
            Why::TakingOver => "taking_over",
        }
    }
}

/// One change of effective state (for the log and the unit attention).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub id: u16,
    pub old: AccessState,
    pub new: AccessState,
    pub why: Why,
}

/// One group as [`Alua::view`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupView {
    /// The described group (or, for a local group only liveness changed, a default one).
    pub group: PortGroup,
    /// Whether the administrator described it.
    pub described: bool,
    pub preferred: AccessState,
    pub effective: AccessState,
    pub why: Why,
}

/// Which target port groups are out of service because of fencing, as the gateway groups
/// of a node's devices tell it ([`liveness`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    /// Groups no live gateway serves and a fenced one did (or this gateway's own while it
    /// is fenced), with why ([`Why::Fenced`] or [`Why::SelfFenced`]).
    pub down: BTreeMap<u16, Why>,
    /// Groups served by a live gateway (this gateway's local ones included unless it is
    /// fenced): those that take over.
    pub live: BTreeSet<u16>,
    /// This gateway's local groups (the portal groups it maps the node to).
    pub local: BTreeSet<u16>,
}

/// The liveness of the groups from the members of each gateway group of a node's devices
/// (`members[i]`: one device's group). A group is down when, in some device's group, a
/// fenced member served it and no live member does; this gateway's `local` groups are
/// served by a live member (this one) unless `self_fenced`, and down if it is. Only
/// fencing takes a group down: a gateway that merely stopped answering keeps its groups
/// until it is fenced (nothing acts on an absence).
pub fn liveness(members: &[Vec<Member>], local: &[u16], self_fenced: bool) -> Liveness {
    let mut l = Liveness { local: local.iter().copied().collect(), ..Default::default() };
    let ids = |m: &Member| -> Vec<u16> { m.served.iter().filter_map(|t| u16::try_from(*t).ok()).collect() };
    for group in members {
        let live: BTreeSet<u16> = group.iter().filter(|m| m.state == MemberState::Live).flat_map(ids).collect();
        for m in group.iter().filter(|m| m.state == MemberState::Fenced) {
            for id in ids(m) {
                if live.contains(&id) || (!self_fenced && l.local.contains(&id)) {
                    continue;
                }
                match l.down.entry(id).or_insert_with(|| Why::Fenced(Vec::new())) {
                    Why::Fenced(by) if !by.contains(&m.name) => by.push(m.name.clone()),
                    _ => {}
                }
            }
        }
        l.live.extend(live);
    }
    if self_fenced {
        for id in local {
            l.down.insert(*id, Why::SelfFenced);
        }
    } else {
        l.live.extend(local.iter().copied());
    }
    let down: Vec<u16> = l.down.keys().copied().collect();
    l.live.retain(|id| !down.contains(id));
    l
}

/// The effective groups (with why each is in its state) and the groups held from now on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effective {
    pub groups: Vec<(PortGroup, Why)>,
    pub held: BTreeSet<u16>,
}

/// The effective states: from the `preferred` description, the `live`ness of the groups,
/// the groups `held` so far and the `failback` policy.
///
/// * A down group (fenced, see [`liveness`]) is unavailable.
/// * With manual failback a group stays held, unavailable, from the moment it was down
///   until the administrator fails back (it is dropped from `held` then); with auto
///   failback nothing is held: a group served again takes its preferred state at once.
/// * When a group out of service (down or held) was preferred active, every group served
///   by a live gateway becomes active/optimized (it takes over the fenced gateway's
///   initiators); when the fenced group was standby or unavailable anyway, the others
///   keep their preferred states.
/// * A local group the description leaves out counts as preferred active/optimized; it is
///   listed only while its state differs from that (this gateway fenced), so a node with no
///   description reports its own group alone, active/optimized, as before.
pub fn effective(preferred: &[PortGroup], live: &Liveness, held: &BTreeSet<u16>, failback: Failback) -> Effective {
    let mut all: Vec<(PortGroup, bool)> = preferred.iter().map(|g| (g.clone(), true)).collect();
    for id in &live.local {
        if !preferred.iter().any(|g| g.id == *id) {
            all.push((PortGroup::new(*id, AccessState::ActiveOptimized), false));
        }
    }
    all.sort_by_key(|(g, _)| g.id);
    let held: BTreeSet<u16> = match failback {
        Failback::Auto => BTreeSet::new(),
        Failback::Manual => held
            .iter()
            .chain(live.down.keys())
            .copied()
            .filter(|id| all.iter().any(|(g, _)| g.id == *id))
            .collect(),
    };
    let out_of_service = |id: u16| live.down.contains_key(&id) || held.contains(&id);
    let takeover = all.iter().any(|(g, _)| out_of_service(g.id) && g.state.is_active());
    let mut groups = Vec::with_capacity(all.len());
    for (mut g, described) in all {
        let why = if let Some(w) = live.down.get(&g.id) {
            g.state = AccessState::Unavailable;
            w.clone()
        } else if held.contains(&g.id) {
            g.state = AccessState::Unavailable;
            Why::Held
        } else if takeover && live.live.contains(&g.id) && g.state != AccessState::ActiveOptimized {
            g.state = AccessState::ActiveOptimized;
            Why::TakingOver
        } else {
            Why::Preferred
        };
        if described || g.state != AccessState::ActiveOptimized {
            groups.push((g, why));
        }
    }
    Effective { groups, held }
}

/// The groups REPORT TARGET PORT GROUPS lists for `nexus`: the node's description (plus
/// the nexus's own group, active/optimized, should the description leave it out), or,
/// without one, the nexus's group alone, active/optimized and preferred.
pub fn reported_groups(nexus: &Nexus) -> Vec<PortGroup> {
    let mut groups = nexus.alua.as_ref().map(|a| a.groups()).unwrap_or_default();
    if groups.is_empty() {
        let mut g = PortGroup::new(nexus.target_port_group, AccessState::ActiveOptimized);
        g.pref = true;
        g.rel_port_ids = vec![nexus.rel_target_port];
        return vec![g];
    }
    if !groups.iter().any(|g| g.id == nexus.target_port_group) {
        let mut g = PortGroup::new(nexus.target_port_group, AccessState::ActiveOptimized);
        g.rel_port_ids = vec![nexus.rel_target_port];
        groups.push(g);
        groups.sort_by_key(|g| g.id);
    }
    groups
}

/// REPORT TARGET PORT GROUPS parameter data (SPC-4 6.36), before allocation-length
/// truncation: the length-only header, or the extended header (FORMAT TYPE 001b, implicit
/// transition time 0) when the CDB's PARAMETER DATA FORMAT asks for it.
pub fn report_target_port_groups(nexus: &Nexus, cdb: &Cdb) -> Vec<u8> {
    let ext = cdb.u8(1) >> 5 == 0x01;
    let mut v = vec![0u8; if ext { 8 } else { 4 }];
    if ext {
        v[4] = 0x10; // FORMAT TYPE 001b; IMPLICIT TRANSITION TIME 0: unspecified
    }
    for g in reported_groups(nexus) {
        let ports = g.ports();
        let mut d = [0u8; 8];
        d[0] = if g.pref { 0x80 } else { 0 } | g.state.code();
        d[1] = SUPPORTED_STATES;
        put_be16(&mut d, 2, g.id);
        d[5] = g.status;
        d[7] = ports.len().min(255) as u8;
        v.extend_from_slice(&d);
        for p in ports.iter().take(255) {
            let mut pd = [0u8; 4];
            put_be16(&mut pd, 2, *p);
            v.extend_from_slice(&pd);
        }
    }
    let n = (v.len() - 4) as u32;
    put_be32(&mut v, 0, n);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdb(b: &[u8]) -> Cdb {
        Cdb::new(b)
    }

    #[test]
    fn states_admit_what_spc4_lists() {
        let read = cdb(&[op::READ10, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        let tur = cdb(&[op::TEST_UNIT_READY, 0, 0, 0, 0, 0]);
        let inq = cdb(&[op::INQUIRY, 0, 0, 0, 96, 0]);
        let prin = cdb(&[op::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0, 8, 0]);
        let rtpg = cdb(&[op::MAINTENANCE_IN, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        let msense = cdb(&[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0]);
        for s in [AccessState::ActiveOptimized, AccessState::ActiveNonOptimized] {
            for c in [&read, &tur, &inq, &prin, &rtpg, &msense] {
                assert_eq!(s.admits(c), Ok(()), "{s:?}");
            }
        }
        let sb = AccessState::Standby;
        assert_eq!(sb.admits(&read), Err(Asc::LUN_NOT_ACCESSIBLE_STANDBY));
        assert_eq!(sb.admits(&tur), Err(Asc::LUN_NOT_ACCESSIBLE_STANDBY));
        for c in [&inq, &prin, &rtpg, &msense] {
            assert_eq!(sb.admits(c), Ok(()));
        }
        let un = AccessState::Unavailable;
        for c in [&read, &tur, &prin, &msense] {
            assert_eq!(un.admits(c), Err(Asc::LUN_NOT_ACCESSIBLE_UNAVAILABLE));
        }
        assert_eq!(un.admits(&inq), Ok(()));
        assert_eq!(un.admits(&rtpg), Ok(()));
        let tr = AccessState::Transitioning;
        assert_eq!(tr.admits(&read), Err(Asc::LUN_NOT_ACCESSIBLE_TRANSITIONING));
        assert_eq!(tr.admits(&inq), Ok(()));
        for s in AccessState::ALL {
            assert_eq!(AccessState::from_name(s.name()), Some(s));
        }
        assert_eq!(AccessState::from_name("offline"), None);
    }

    #[test]
    fn changes_set_the_status_code_and_say_whether_a_state_moved() {
        let a = Alua::new();
        let tpg = |id, st| PortGroup::new(id, st);
        // group 1 stays active/optimized (the default): no change; group 2 becomes ANO.
        assert!(a.set_groups(vec![tpg(2, AccessState::ActiveNonOptimized), tpg(1, AccessState::ActiveOptimized)]));
        let g = a.groups();
        assert_eq!(g.iter().map(|g| (g.id, g.status)).collect::<Vec<_>>(), [(1, 0), (2, 2)]);
        assert!(!a.set_groups(a.groups()), "the same description again changes nothing");
        let read = cdb(&[op::READ10, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        assert_eq!(a.check(1, &read), Ok(()));
        assert_eq!(a.set_state(1, AccessState::Standby), Some(true));
        assert_eq!(a.set_state(1, AccessState::Standby), Some(false));
        assert_eq!(a.set_state(9, AccessState::Standby), None);
        assert_eq!(a.groups()[0].status, STATUS_IMPLICIT_CHANGE);
        let e = a.check(1, &read).expect_err("standby refuses READ");
        assert_eq!(e, CmdError::check(SenseKey::NotReady, Asc::LUN_NOT_ACCESSIBLE_STANDBY));
        assert_eq!(a.check(2, &read), Ok(()));
        assert_eq!(a.check(3, &read), Ok(()), "an undescribed group is active");
        // Back to no description: group 1 returns to active/optimized.
        assert!(a.set_groups(vec![]));
        assert_eq!(a.check(1, &read), Ok(()));
        assert!(!a.is_described());
    }
}
