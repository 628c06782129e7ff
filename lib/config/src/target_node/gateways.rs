//! The gateways that export a node's devices (issue 23, highly available gateways): when a
//! LUN's device has a gateway group ([`riser_bdev::Bdev::gateway_group`]), the node tells
//! the group which target port groups this gateway serves it through (the portal groups
//! mapped to the node here, again whenever the maps change, and none once the node goes),
//! and follows the group's events:
//!
//! * `Changed`: the effective ALUA states are recomputed from the members
//!   ([`riser_scsi::alua::liveness`], [`riser_scsi::alua::effective`]); a group served only
//!   by fenced gateways becomes unavailable, the live gateways' groups take over.
//! * `SelfFenced`: this gateway's own groups become unavailable and the node's sessions are
//!   dropped (the `node_fenced` hook; the session layer closes the connections). New logins
//!   are let in: the initiator finds the port unavailable through REPORT TARGET PORT GROUPS
//!   and the LUN answers NOT READY, LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE
//!   STATE to media access, which multipath treats as a path to avoid; refusing logins would
//!   only make initiators retry them, and a session that stays in tells the initiator at
//!   once, with a unit attention, when the gateway has rejoined.
//! * `Rejoined`: the new member publishes what it serves again, and the states are
//!   recomputed.
//!
//! Every change of effective state raises ASYMMETRIC ACCESS STATE CHANGED on every I_T
//! nexus of the node's LUNs and is logged with the groups, the states and why.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use riser_bdev::{GatewayGroupHandle, GroupEvent, Member};
use riser_scsi::{AluaChange, Asc};
use serde_json::{json, Value};

use super::TargetNode;
use crate::{hooks_of, SharedHooks};

/// One LUN whose device has a gateway group.
struct Attached {
    lun_id: u16,
    bdev_name: String,
    group: GatewayGroupHandle,
    /// Cleared when the LUN goes: its subscription (which lives as long as the group) does
    /// nothing from then on.
    active: Arc<AtomicBool>,
}

/// The node's LUNs that have a gateway group.
#[derive(Default)]
pub(crate) struct Gateways {
    attached: Mutex<Vec<Attached>>,
}

impl Gateways {
    fn lock(&self) -> MutexGuard<'_, Vec<Attached>> {
        self.attached.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One device's group as a node sees it (`iscsi_get_target_nodes`, the metrics).
#[derive(Clone, Debug)]
pub struct GatewayView {
    pub lun_id: u16,
    pub bdev_name: String,
    /// Where the group lives.
    pub group: String,
    /// This gateway's member id.
    pub me: u64,
    /// Whether this gateway is fenced from it now.
    pub fenced: bool,
    pub members: Vec<Member>,
}

impl TargetNode {
    /// The target port groups this gateway serves the node through: the tags of the portal
    /// groups mapped to it here.
    pub fn local_tpgs(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.lock().maps.iter().map(|(pg, _)| *pg).collect();
        v.sort_unstable();
        v
    }

    /// Subscribes to the gateway group of every LUN that has one and is not attached yet,
    /// and publishes what this gateway serves. Called once the node is shared (created, or a
    /// LUN added), with no target lock held.
    pub(crate) fn attach_gateways(self: &Arc<Self>, hooks: &SharedHooks) {
        let (_, luns) = self.luns();
        let local = self.local_tpgs();
        let mut added = 0;
        for l in luns.iter() {
            let Some(group) = l.bdev.gateway_group() else { continue };
            if self.gateways.lock().iter().any(|a| a.lun_id == l.id) {
                continue;
            }
            let active = Arc::new(AtomicBool::new(true));
            self.gateways.lock().push(Attached { lun_id: l.id, bdev_name: l.bdev_name.clone(), group: group.clone(), active: active.clone() });
            group.set_served(&local);
            let (node, hooks, lun_id) = (Arc::downgrade(self), hooks.clone(), l.id);
            group.subscribe(Box::new(move |ev| {
                if !active.load(Ordering::Acquire) {
                    return;
                }
                if let Some(node) = node.upgrade() {
                    node.on_group_event(lun_id, ev, &hooks);
                }
            }));
            log::info!(
                "target node {}: LUN {} (bdev {}) is exported by the gateways of {}; this gateway serves it through target port group(s) {local:?}",
                self.name(),
                l.id,
                l.bdev_name,
                group.describe()
            );
            added += 1;
        }
        if added > 0 {
            self.refresh_liveness("a LUN with a gateway group was exported");
        }
    }

    /// Publishes the target port groups served again (the maps changed) and recomputes.
    pub(crate) fn publish_served(&self) {
        let local = self.local_tpgs();
        let groups: Vec<GatewayGroupHandle> = self.gateways.lock().iter().map(|a| a.group.clone()).collect();
        if groups.is_empty() {
            return;
        }
        for g in &groups {
            g.set_served(&local);
        }
        self.refresh_liveness("the node's portal group maps changed");
    }

    /// LUN `lun_id` left the node: its device's group (if it has one) is no longer served
    /// from here, and its subscription falls silent.
    pub(crate) fn detach_gateway(&self, lun_id: u16) {
        let gone: Vec<Attached> = {
            let mut v = self.gateways.lock();
            let (gone, stay) = std::mem::take(&mut *v).into_iter().partition(|a| a.lun_id == lun_id);
            *v = stay;
            gone
        };
        if gone.is_empty() {
            return;
        }
        for a in gone {
            a.active.store(false, Ordering::Release);
            a.group.set_served(&[]);
        }
        self.refresh_liveness("a LUN with a gateway group was removed");
    }

    /// The node goes: it serves nothing any more, and its subscriptions fall silent.
    pub(crate) fn detach_gateways(&self) {
        let attached = std::mem::take(&mut *self.gateways.lock());
        for a in attached {
            a.active.store(false, Ordering::Release);
            a.group.set_served(&[]);
        }
    }

    /// The gateway groups of the node's LUNs, as this gateway sees them now.
    pub fn gateway_views(&self) -> Vec<GatewayView> {
        let attached: Vec<(u16, String, GatewayGroupHandle)> =
            self.gateways.lock().iter().map(|a| (a.lun_id, a.bdev_name.clone(), a.group.clone())).collect();
        attached
            .into_iter()
            .map(|(lun_id, bdev_name, g)| GatewayView {
                lun_id,
                bdev_name,
                group: g.describe(),
                me: g.me().id,
                fenced: g.is_fenced(),
                members: g.members(),
            })
            .collect()
    }

    /// `gateways` of `iscsi_get_target_nodes` (`None` without any group).
    pub(crate) fn gateways_json(&self) -> Option<Value> {
        let views = self.gateway_views();
        (!views.is_empty()).then(|| {
            Value::Array(
                views
                    .iter()
                    .map(|v| {
                        json!({
                            "lun_id": v.lun_id,
                            "bdev_name": v.bdev_name,
                            "group": v.group,
                            "fenced": v.fenced,
                            "members": v.members.iter().map(|m| json!({
                                "id": m.id,
                                "name": m.name,
                                "addr": m.addr,
                                "served": m.served,
                                "state": m.state,
                                "self": m.id == v.me,
                            })).collect::<Vec<_>>(),
                        })
                    })
                    .collect(),
            )
        })
    }

    fn on_group_event(self: &Arc<Self>, lun_id: u16, ev: &GroupEvent, hooks: &SharedHooks) {
        if self.is_deleted() {
            return;
        }
        let Some((bdev_name, group)) = self.gateways.lock().iter().find(|a| a.lun_id == lun_id).map(|a| (a.bdev_name.clone(), a.group.clone()))
        else {
            return;
        };
        match ev {
            GroupEvent::Changed => self.refresh_liveness(&format!("the membership of {} changed", group.describe())),
            GroupEvent::SelfFenced => {
                let why = format!("this gateway was fenced from {} (LUN {lun_id}, bdev {bdev_name}): its I/O to the device fails", group.describe());
                log::warn!("target node {}: {why}; its target port groups become unavailable and its sessions are dropped", self.name());
                self.refresh_liveness(&why);
                if let Some(h) = hooks_of(hooks).node_fenced {
                    h(self, &why);
                }
            }
            GroupEvent::Rejoined => {
                let local = self.local_tpgs();
                group.set_served(&local);
                let why = format!("this gateway rejoined {} as member {}", group.describe(), group.me().id);
                log::info!("target node {}: {why}; serving target port group(s) {local:?} again", self.name());
                self.refresh_liveness(&why);
            }
        }
    }

    /// Recomputes the effective ALUA states from every group's members.
    pub(crate) fn refresh_liveness(&self, cause: &str) {
        let groups: Vec<GatewayGroupHandle> = self.gateways.lock().iter().map(|a| a.group.clone()).collect();
        if groups.is_empty() {
            return;
        }
        let members: Vec<Vec<Member>> = groups.iter().map(|g| g.members()).collect();
        let fenced = groups.iter().any(|g| g.is_fenced());
        let local: Vec<u16> = self.local_tpgs().into_iter().filter_map(|t| u16::try_from(t).ok()).collect();
        let changes = self.alua.set_liveness(riser_scsi::alua::liveness(&members, &local, fenced));
        self.apply_alua_changes(changes, cause);
    }

    /// Logs the changes of effective state and raises ASYMMETRIC ACCESS STATE CHANGED; a
    /// takeover that reported transitioning is then completed (the unit attention raised
    /// and the states in place on every LUN: the change is applied) and reported again.
    pub(crate) fn apply_alua_changes(&self, changes: Vec<AluaChange>, cause: &str) {
        self.report_alua_changes(&changes, cause);
        if self.alua.is_transitioning() {
            let done = self.alua.finish_transition();
            self.report_alua_changes(&done, "takeover applied");
        }
    }

    fn report_alua_changes(&self, changes: &[AluaChange], cause: &str) {
        if changes.is_empty() {
            return;
        }
        for c in changes {
            log::info!(
                "target node {}: target port group {}: {} -> {} ({}; {cause})",
                self.name(),
                c.id,
                c.old.name(),
                c.new.name(),
                c.why.describe()
            );
        }
        let (_, luns) = self.luns();
        for l in luns.iter() {
            l.scsi.establish_ua_all(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
        }
    }
}
