//! Asymmetric logical unit access (SPC-4 5.15): the target port groups of a target node,
//! each with its asymmetric access state, shared by every session of the node.
//!
//! riser does implicit ALUA only (INQUIRY TPGS = 01b): states are set by the administrator
//! (an RPC), never by SET TARGET PORT GROUPS. One riser process hosts some portal groups of
//! a target node ("local" groups); a node served by several gateways is described the same
//! way on each of them, so REPORT TARGET PORT GROUPS lists the peers' groups too. A group is
//! a portal group: its identifier is the portal group tag, its target port (relative target
//! port identifier) by default the tag as well.
//!
//! * [`AccessState`] — the states and what each lets through ([`AccessState::admits`]).
//! * [`Alua`] — the description of one target node: set and changed by the control plane,
//!   read by the data path ([`Alua::check`]: one atomic load while every group is active).
//! * [`report_target_port_groups`] — the REPORT TARGET PORT GROUPS parameter data.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

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
#[derive(Debug, Default)]
pub struct Alua {
    groups: RwLock<Vec<PortGroup>>,
    /// Some described group is not active: commands look up their group's state.
    restricted: AtomicBool,
}

impl Alua {
    pub fn new() -> Arc<Alua> {
        Arc::new(Alua::default())
    }

    /// The described groups, by id (empty: none described).
    pub fn groups(&self) -> Vec<PortGroup> {
        self.groups.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a description is set.
    pub fn is_described(&self) -> bool {
        !self.groups.read().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Replaces the description (`groups` with distinct ids; empty: back to none). A group
    /// whose state differs from what it reported before (active/optimized when it was not
    /// described) gets STATUS CODE 02h. Returns whether any state changed, for the caller
    /// to raise ASYMMETRIC ACCESS STATE CHANGED.
    pub fn set_groups(&self, mut groups: Vec<PortGroup>) -> bool {
        groups.sort_by_key(|g| g.id);
        let mut cur = self.groups.write().unwrap_or_else(|e| e.into_inner());
        let before = |id: u16| -> Option<&PortGroup> { cur.iter().find(|g| g.id == id) };
        let mut changed = false;
        for g in groups.iter_mut() {
            let old = before(g.id);
            // Without a description every group reports active/optimized.
            let old_state = old.map_or(AccessState::ActiveOptimized, |o| o.state);
            if old_state != g.state {
                changed = true;
                g.status = STATUS_IMPLICIT_CHANGE;
            } else {
                g.status = old.map_or(0, |o| o.status);
            }
        }
        // Groups that go away return to the default (active/optimized).
        changed |= cur.iter().any(|o| o.state != AccessState::ActiveOptimized && !groups.iter().any(|g| g.id == o.id));
        self.restricted.store(groups.iter().any(|g| !g.state.is_active()), Ordering::Release);
        *cur = groups;
        changed
    }

    /// Changes the state of described group `id`; `None` if there is no such group, else
    /// whether the state changed.
    pub fn set_state(&self, id: u16, state: AccessState) -> Option<bool> {
        let mut cur = self.groups.write().unwrap_or_else(|e| e.into_inner());
        let g = cur.iter_mut().find(|g| g.id == id)?;
        let changed = g.state != state;
        if changed {
            g.state = state;
            g.status = STATUS_IMPLICIT_CHANGE;
        }
        self.restricted.store(cur.iter().any(|g| !g.state.is_active()), Ordering::Release);
        Some(changed)
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
