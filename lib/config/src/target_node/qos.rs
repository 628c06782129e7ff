//! Rate limits per initiator on a target's LUNs (riser's extension,
//! `iscsi_target_node_set_qos_limit`): the same four limits as SPDK's `bdev_set_qos_limit`,
//! for one initiator's I/O to one LUN (or to each LUN of the node), shared by all that
//! initiator's sessions, so one noisy host cannot take a shared LUN from the others. Its I/O
//! over the limit waits in its own sessions' LUN channels; other initiators' I/O does not
//! wait behind it. The limits live with each LUN (`riser_scsi::Lun::initiator_qos`): a LUN
//! added later starts with none.

use std::sync::Arc;

use riser_bdev::qos::QosLimits;
use riser_rpc::RpcRegistry;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{check_iscsi_name, TargetNode};
use crate::rpc::ok;
use crate::{IscsiTarget, TargetError};

/// `iscsi_target_node_set_qos_limit`: one initiator's limits on a node's LUN (every LUN of
/// the node when `lun_id` is left out). A limit left out stays as it is; 0 removes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeSetQosLimit {
    /// Target node name (full, or as given to iscsi_create_target_node)
    pub name: String,
    /// The initiator's iSCSI name (iqn.… or eui.…)
    pub initiator_name: String,
    /// Only this LUN (default: every LUN of the node)
    #[cfg_attr(feature = "cli", arg(short = 'l', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lun_id: Option<u32>,
    /// I/Os per second, reads and writes together (a multiple of 1000; 0: no limit)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rw_ios_per_sec: Option<u64>,
    /// MiB per second, reads and writes together (0: no limit)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rw_mbytes_per_sec: Option<u64>,
    /// MiB per second read (0: no limit)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r_mbytes_per_sec: Option<u64>,
    /// MiB per second written (0: no limit)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_mbytes_per_sec: Option<u64>,
}

impl IscsiTargetNodeSetQosLimit {
    /// `current` with the limits given here applied.
    fn apply_to(&self, current: QosLimits) -> Result<QosLimits, TargetError> {
        let given = [self.rw_ios_per_sec, self.rw_mbytes_per_sec, self.r_mbytes_per_sec, self.w_mbytes_per_sec];
        if given.iter().all(Option::is_none) {
            return Err(TargetError::Invalid(
                "no rate limit given: rw_ios_per_sec, rw_mbytes_per_sec, r_mbytes_per_sec or w_mbytes_per_sec".into(),
            ));
        }
        let l = QosLimits {
            rw_ios_per_sec: self.rw_ios_per_sec.unwrap_or(current.rw_ios_per_sec),
            rw_mbytes_per_sec: self.rw_mbytes_per_sec.unwrap_or(current.rw_mbytes_per_sec),
            r_mbytes_per_sec: self.r_mbytes_per_sec.unwrap_or(current.r_mbytes_per_sec),
            w_mbytes_per_sec: self.w_mbytes_per_sec.unwrap_or(current.w_mbytes_per_sec),
        };
        l.validate().map_err(TargetError::Invalid)?;
        Ok(l)
    }
}

impl TargetNode {
    /// Every (LUN id, initiator, limits, throttled ns and I/Os) of the node's LUNs.
    fn initiator_limits(&self) -> Vec<(u16, String, QosLimits, (u64, u64))> {
        let (_, luns) = self.luns();
        luns.iter()
            .flat_map(|l| l.scsi.initiator_qos.list().into_iter().map(move |(i, q, t)| (l.id, i, q, t)))
            .collect()
    }

    /// The per-initiator limits, for `iscsi_get_target_nodes` (None when there are none).
    pub(crate) fn qos_json(&self) -> Option<Value> {
        let v: Vec<Value> = self
            .initiator_limits()
            .into_iter()
            .map(|(lun, i, q, (ns, ios))| {
                let mut o = q.json();
                o["initiator_name"] = json!(i);
                o["lun_id"] = json!(lun);
                o["throttled_ticks"] = json!(ns);
                o["throttled_ios"] = json!(ios);
                o
            })
            .collect();
        (!v.is_empty()).then_some(Value::Array(v))
    }

    /// The `iscsi_target_node_set_qos_limit` calls that restore them (`save_config`).
    pub(crate) fn qos_config_json(&self) -> Vec<Value> {
        self.initiator_limits()
            .into_iter()
            .map(|(lun, i, q, _)| {
                let mut p = q.json();
                p["name"] = json!(self.name());
                p["initiator_name"] = json!(i);
                p["lun_id"] = json!(lun);
                json!({"method": "iscsi_target_node_set_qos_limit", "params": p})
            })
            .collect()
    }
}

impl IscsiTarget {
    /// `iscsi_target_node_set_qos_limit`: checks everything, then sets the limits on each LUN.
    pub fn set_target_node_qos(&self, p: &IscsiTargetNodeSetQosLimit) -> Result<(), TargetError> {
        check_iscsi_name(&p.initiator_name).map_err(|e| TargetError::Invalid(format!("initiator_name: {e}")))?;
        let node = self.lock().node_for_change(&p.name)?;
        let (_, luns) = node.luns();
        let chosen: Vec<_> = luns.iter().filter(|l| p.lun_id.is_none_or(|id| id == l.id as u32)).collect();
        if chosen.is_empty() {
            return Err(TargetError::NotFound(match p.lun_id {
                Some(id) => format!("target node {} has no LUN {id}", node.name()),
                None => format!("target node {} has no LUN", node.name()),
            }));
        }
        let current = |l: &super::Lun| l.scsi.initiator_qos.find(&p.initiator_name).map(|q| q.limits()).unwrap_or_default();
        let new: Vec<QosLimits> = chosen.iter().map(|l| p.apply_to(current(l))).collect::<Result<_, _>>()?;
        for (l, limits) in chosen.iter().zip(new) {
            l.scsi.initiator_qos.set(&p.initiator_name, limits);
            log::info!("target node {} LUN {}: initiator {}: QoS limits {limits:?}", node.name(), l.id, p.initiator_name);
        }
        Ok(())
    }
}

/// Registers `iscsi_target_node_set_qos_limit`.
pub(crate) fn register(reg: &mut RpcRegistry, target: &Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_target_node_set_qos_limit", move |p: IscsiTargetNodeSetQosLimit| ok(t.set_target_node_qos(&p)));
}
