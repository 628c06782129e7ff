//! A target node's ALUA description (riser's extension; see `riser_scsi::alua`): the target
//! port groups of the whole multi-gateway target, one per portal group (the group id is
//! the portal group tag, which the administrator keeps unique across gateways), each with
//! its asymmetric access state. Every gateway gets the same description; the groups of
//! portal groups this riser hosts are its local ones, the others describe the peers.
//!
//! Methods: `iscsi_target_node_set_alua` (name, groups: [{tpg_id, state, pref?,
//! rel_port_ids?}], failback?: "auto" | "manual"; an empty list removes the description),
//! `iscsi_target_node_set_alua_state` (name, tpg_id, state) and
//! `iscsi_target_node_alua_failback` (name). A state change raises ASYMMETRIC ACCESS STATE
//! CHANGED on every I_T nexus of the node's LUNs.
//!
//! With gateway groups (issue 23, see `gateways.rs`) the administrator's states are the
//! *preferred* ones: the states reported and enforced (the *effective* ones) follow the
//! liveness of the gateways. A group served only by fenced gateways is unavailable; when it
//! was an active one, the live gateways' groups take over as active/optimized. When a live
//! gateway serves it again, `failback` decides: `auto` (the default) returns to the
//! preferred states at once; `manual` keeps the failed-over states until the administrator
//! calls `iscsi_target_node_alua_failback` or sets the group's state.

use riser_rpc::{RpcError, RpcRegistry};
use riser_scsi::{AccessState, Failback, PortGroup};
use riser_rpc::params::is_false;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::TargetNode;
use crate::rpc::ok;
use crate::{IscsiTarget, TargetError};
use std::sync::Arc;

/// Most groups in a description (a group descriptor count is not bounded by SPC-4 but the
/// REPORT TARGET PORT GROUPS data must fit its 32-bit length; 256 is plenty).
pub const MAX_ALUA_GROUPS: usize = 256;
/// Most relative target ports per group (TARGET PORT COUNT is one byte).
pub const MAX_GROUP_PORTS: usize = 255;

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// One group of `iscsi_target_node_set_alua`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AluaGroupParam {
    pub tpg_id: u32,
    pub state: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub pref: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rel_port_ids: Vec<u32>,
}

/// `iscsi_target_node_set_alua`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeSetAlua {
    pub name: String,
    pub groups: Vec<AluaGroupParam>,
    /// `auto` or `manual`; omitted: the node's policy stays as it is (`auto` at first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failback: Option<String>,
}

/// `iscsi_target_node_alua_failback`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeAluaFailback {
    pub name: String,
}

/// `iscsi_target_node_set_alua_state`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeSetAluaState {
    /// Target node name
    pub name: String,
    /// Target port group (portal group tag)
    pub tpg_id: u32,
    /// active_optimized, active_non_optimized, standby, unavailable or transitioning
    pub state: String,
}

fn state(field: &str, s: &str) -> Result<AccessState, TargetError> {
    AccessState::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = AccessState::ALL.iter().map(|a| a.name()).collect();
        TargetError::Invalid(format!("{field}: unknown state {s:?} (one of {})", names.join(", ")))
    })
}

/// Checks a failback policy name.
pub fn failback(s: &str) -> Result<Failback, TargetError> {
    Failback::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Failback::ALL.iter().map(|f| f.name()).collect();
        TargetError::Invalid(format!("failback: unknown policy {s:?} (one of {})", names.join(", ")))
    })
}

fn id16(field: &str, v: u32) -> Result<u16, TargetError> {
    match u16::try_from(v) {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(TargetError::Invalid(format!("{field}: {v} is out of range (1..=65535)"))),
    }
}

/// Checks and converts the groups of `iscsi_target_node_set_alua`.
pub fn groups_from_params(groups: &[AluaGroupParam]) -> Result<Vec<PortGroup>, TargetError> {
    if groups.len() > MAX_ALUA_GROUPS {
        return Err(TargetError::Invalid(format!("groups: at most {MAX_ALUA_GROUPS} target port groups")));
    }
    let mut out: Vec<PortGroup> = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        let id = id16(&format!("groups[{i}].tpg_id"), g.tpg_id)?;
        if out.iter().any(|o| o.id == id) {
            return Err(TargetError::Exists(format!("groups[{i}].tpg_id: target port group {id} is listed twice")));
        }
        if g.rel_port_ids.len() > MAX_GROUP_PORTS {
            return Err(TargetError::Invalid(format!("groups[{i}].rel_port_ids: at most {MAX_GROUP_PORTS} ports")));
        }
        let mut pg = PortGroup::new(id, state(&format!("groups[{i}].state"), &g.state)?);
        pg.pref = g.pref;
        for (j, p) in g.rel_port_ids.iter().enumerate() {
            let p = id16(&format!("groups[{i}].rel_port_ids[{j}]"), *p)?;
            if pg.rel_port_ids.contains(&p) {
                return Err(TargetError::Exists(format!("groups[{i}].rel_port_ids[{j}]: port {p} is listed twice")));
            }
            pg.rel_port_ids.push(p);
        }
        out.push(pg);
    }
    // A relative target port belongs to one group only.
    let mut ports: Vec<(u16, u16)> = out.iter().flat_map(|g| g.ports().into_iter().map(move |p| (p, g.id))).collect();
    ports.sort_unstable();
    if let Some(w) = ports.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(TargetError::Invalid(format!("groups: relative target port {} is in target port groups {} and {}", w[0].0, w[0].1, w[1].1)));
    }
    Ok(out)
}

impl TargetNode {
    /// The ALUA view shown by `iscsi_get_target_nodes` (`None` when there is nothing to
    /// show: no description, and no group changed by liveness): each group with its
    /// effective `state`, its `preferred_state`, `local` true when the node is mapped to
    /// that portal group here, and `reason` when the target changed it.
    pub fn alua_json(&self) -> Option<Value> {
        let view = self.alua.view();
        if view.is_empty() {
            return None;
        }
        let maps = self.lock().maps.iter().map(|(pg, _)| *pg).collect::<Vec<_>>();
        Some(Value::Array(
            view.iter()
                .map(|v| {
                    let g = &v.group;
                    let mut val = json!({"tpg_id": g.id, "state": v.effective.name(), "preferred_state": v.preferred.name(), "pref": g.pref});
                    if let Some(m) = val.as_object_mut() {
                        if !g.rel_port_ids.is_empty() {
                            m.insert("rel_port_ids".into(), json!(g.rel_port_ids));
                        }
                        m.insert("local".into(), json!(maps.contains(&(g.id as u32))));
                        if !v.described {
                            m.insert("described".into(), json!(false));
                        }
                        if v.why != riser_scsi::AluaWhy::Preferred {
                            m.insert("reason".into(), json!(v.why.name()));
                            m.insert("reason_text".into(), json!(v.why.describe()));
                        }
                    }
                    val
                })
                .collect(),
        ))
    }

    /// The failback policy.
    pub fn alua_failback(&self) -> Failback {
        self.alua.failback_policy()
    }

    /// The `iscsi_target_node_set_alua` call that recreates the description and the
    /// failback policy, if either is set.
    pub fn alua_config_json(&self) -> Option<Value> {
        let groups: Vec<Value> = self
            .alua
            .preferred()
            .iter()
            .map(|g| {
                let mut v = json!({"tpg_id": g.id, "state": g.state.name(), "pref": g.pref});
                if !g.rel_port_ids.is_empty() {
                    if let Some(m) = v.as_object_mut() {
                        m.insert("rel_port_ids".into(), json!(g.rel_port_ids));
                    }
                }
                v
            })
            .collect();
        let failback = self.alua.failback_policy();
        (!groups.is_empty() || failback != Failback::default()).then(|| {
            json!({"method": "iscsi_target_node_set_alua", "params": {"name": self.name, "groups": groups, "failback": failback.name()}})
        })
    }

    /// Every call that recreates the node: `iscsi_create_target_node`, then its ALUA
    /// description if it has one.
    pub fn config_calls(&self) -> Vec<Value> {
        let mut v = vec![self.config_json()];
        v.extend(self.alua_config_json());
        v.extend(self.redirect_config_json());
        v.extend(self.qos_config_json());
        v
    }
}

impl IscsiTarget {
    /// `iscsi_target_node_set_alua`: replaces the node's description (releasing every
    /// held group) and, if given, its failback policy.
    pub fn set_target_node_alua(&self, name: &str, groups: &[AluaGroupParam], fb: Option<&str>) -> Result<(), TargetError> {
        let node = self.lock().node_for_change(name)?;
        let fb = fb.map(failback).transpose()?;
        let groups = groups_from_params(groups)?;
        let desc = groups.iter().map(|g| format!("{}:{}", g.id, g.state.name())).collect::<Vec<_>>().join(" ");
        let mut changes = node.alua.replace(groups);
        if let Some(f) = fb {
            changes = merge(changes, node.alua.set_failback(f));
        }
        log::info!("target node {}: ALUA groups [{desc}], failback {}", node.name(), node.alua.failback_policy().name());
        node.apply_alua_changes(changes, "iscsi_target_node_set_alua");
        Ok(())
    }

    /// `iscsi_target_node_set_alua_state`: changes the preferred state of one described
    /// group (and releases it if it was held after its gateway was fenced).
    pub fn set_target_node_alua_state(&self, name: &str, tpg_id: u32, st: &str) -> Result<(), TargetError> {
        let node = self.lock().node_for_change(name)?;
        let id = id16("tpg_id", tpg_id)?;
        let st = state("state", st)?;
        match node.alua.set_preferred_state(id, st) {
            None => Err(TargetError::NotFound(format!(
                "tpg_id: target node {} has no target port group {id} (set them with iscsi_target_node_set_alua)",
                node.name()
            ))),
            Some(changes) => {
                log::info!("target node {}: target port group {id} is now preferred {}", node.name(), st.name());
                node.apply_alua_changes(changes, "iscsi_target_node_set_alua_state");
                Ok(())
            }
        }
    }

    /// `iscsi_target_node_alua_failback`: the groups held after their gateway was fenced
    /// (manual failback) return to their computed states; those still served only by
    /// fenced gateways stay unavailable.
    pub fn target_node_alua_failback(&self, name: &str) -> Result<(), TargetError> {
        let node = self.lock().node_for_change(name)?;
        let (changes, released) = node.alua.failback_now();
        log::info!("target node {}: ALUA failback: released target port group(s) {released:?}", node.name());
        node.apply_alua_changes(changes, "iscsi_target_node_alua_failback");
        Ok(())
    }
}

/// Two rounds of changes as one: a group changed twice keeps its first old state.
fn merge(mut a: Vec<riser_scsi::AluaChange>, b: Vec<riser_scsi::AluaChange>) -> Vec<riser_scsi::AluaChange> {
    for c in b {
        match a.iter().position(|x| x.id == c.id) {
            Some(i) if a[i].old == c.new => {
                a.remove(i);
            }
            Some(i) => {
                a[i].new = c.new;
                a[i].why = c.why;
            }
            None => a.push(c),
        }
    }
    a
}

/// Registers the ALUA methods.
pub(crate) fn register(reg: &mut RpcRegistry, target: &Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_target_node_set_alua", move |p: IscsiTargetNodeSetAlua| -> Result<Value, RpcError> {
        ok(t.set_target_node_alua(&p.name, &p.groups, p.failback.as_deref()))
    });

    let t = target.clone();
    reg.add("iscsi_target_node_set_alua_state", move |p: IscsiTargetNodeSetAluaState| -> Result<Value, RpcError> {
        ok(t.set_target_node_alua_state(&p.name, p.tpg_id, &p.state))
    });
    let t = target.clone();
    reg.add("iscsi_target_node_alua_failback", move |p: IscsiTargetNodeAluaFailback| -> Result<Value, RpcError> {
        ok(t.target_node_alua_failback(&p.name))
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::*;

    #[test]
    fn set_show_change_save_and_refuse() {
        let e = env();
        populate(&e);
        let name = "iqn.2024-01.com.example:disk1";
        let groups = json!([{"tpg_id": 2, "state": "active_non_optimized", "rel_port_ids": [20]},
                            {"tpg_id": 1, "state": "active_optimized", "pref": true},
                            {"tpg_id": 7, "state": "standby"}]);
        assert_eq!(e.ok("iscsi_target_node_set_alua", json!({"name": name, "groups": groups})), json!(true));
        let nodes = e.ok("iscsi_get_target_nodes", json!(null));
        assert_eq!(
            nodes[0]["alua_groups"],
            json!([
                {"tpg_id": 1, "state": "active_optimized", "preferred_state": "active_optimized", "pref": true, "local": true},
                {"tpg_id": 2, "state": "active_non_optimized", "preferred_state": "active_non_optimized", "pref": false, "rel_port_ids": [20], "local": true},
                {"tpg_id": 7, "state": "standby", "preferred_state": "standby", "pref": false, "local": false},
            ])
        );
        assert!(nodes[1].get("alua_groups").is_none(), "no description, nothing shown");
        assert_eq!(e.ok("iscsi_target_node_set_alua_state", json!({"name": name, "tpg_id": 7, "state": "unavailable"})), json!(true));
        let nodes = e.ok("iscsi_get_target_nodes", json!(null));
        assert_eq!(nodes[0]["alua_groups"][2]["state"], "unavailable");
        // save_config: the description right after its node, and it replays.
        let dump = e.target.config_json();
        let i = dump.iter().position(|c| c["method"] == "iscsi_target_node_set_alua").expect("in save_config");
        assert_eq!(dump[i - 1]["method"], "iscsi_create_target_node");
        assert_eq!(dump[i - 1]["params"]["name"], name);
        let b = env();
        for c in &dump {
            b.ok(c["method"].as_str().unwrap(), c["params"].clone());
        }
        assert_eq!(b.target.config_json(), dump);
        // Refusals, SPDK-style.
        let m = "iscsi_target_node_set_alua_state";
        assert_eq!(e.err(m, json!({"name": name, "tpg_id": 9, "state": "standby"}), "no target port group 9"), -19);
        assert_eq!(e.err(m, json!({"name": "nope", "tpg_id": 1, "state": "standby"}), "not found"), -19);
        assert_eq!(e.err(m, json!({"name": name, "tpg_id": 1, "state": "offline"}), "unknown state \"offline\""), -32602);
        assert_eq!(e.err(m, json!({"name": name, "tpg_id": 70000, "state": "standby"}), "tpg_id: 70000 is out of range"), -32602);
        let m = "iscsi_target_node_set_alua";
        let twice = json!({"name": name, "groups": [{"tpg_id": 1, "state": "standby"}, {"tpg_id": 1, "state": "standby"}]});
        assert_eq!(e.err(m, twice, "groups[1].tpg_id: target port group 1 is listed twice"), -17);
        let shared = json!({"name": name, "groups": [{"tpg_id": 1, "state": "standby"}, {"tpg_id": 2, "state": "standby", "rel_port_ids": [1]}]});
        assert_eq!(e.err(m, shared, "relative target port 1 is in target port groups 1 and 2"), -32602);
        assert_eq!(e.err(m, json!({"name": name, "groups": [{"tpg_id": 0, "state": "standby"}]}), "groups[0].tpg_id"), -32602);
        assert_eq!(e.err(m, json!({"name": name, "groups": [{"tpg_id": 1, "state": "standby", "x": 1}]}), "x"), -32602);
        // The refused calls changed nothing.
        assert_eq!(e.ok("iscsi_get_target_nodes", json!(null))[0]["alua_groups"][2]["state"], "unavailable");
        // An empty list removes the description.
        assert_eq!(e.ok("iscsi_target_node_set_alua", json!({"name": name, "groups": []})), json!(true));
        assert!(e.ok("iscsi_get_target_nodes", json!(null))[0].get("alua_groups").is_none());
    }
}
