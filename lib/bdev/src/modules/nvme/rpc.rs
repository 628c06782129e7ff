//! The NVMe RPCs: `bdev_nvme_attach_controller`, `bdev_nvme_detach_controller`, `bdev_nvme_get_controllers`.

use std::sync::Arc;

use riser_rpc::params::is_false;
use riser_rpc::{RpcError, RpcRegistry};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::rpc::{to_rpc, Bdevs};

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `bdev_nvme_attach_controller`: a local NVMe controller (trtype PCIe) through the
/// kernel's nvme driver. SPDK's fabrics and protection parameters are accepted only with
/// their defaults (they mean nothing for a local PCIe controller, or riser does not do them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevNvmeAttachController {
    pub name: String,
    /// "PCIe" (any case).
    pub trtype: String,
    /// The PCI address, e.g. 0000:00:04.0.
    pub traddr: String,
    /// Fabrics only: refused when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adrfam: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trsvcid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnqn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostnqn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostaddr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostsvcid: Option<String>,
    /// End-to-end protection checks: refused when true (riser serves no PI namespaces).
    #[serde(default, skip_serializing_if = "is_false")]
    pub prchk_reftag: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub prchk_guard: bool,
    /// NVMe/TCP digests: refused when true.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hdgst: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub ddgst: bool,
    /// Reconnect and multipath tuning of SPDK's own driver: accepted and ignored (the kernel's
    /// driver does its own resets and multipathing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctrlr_loss_timeout_sec: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect_delay_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_io_fail_timeout_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipath: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_io_queues: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabrics_connect_timeout_us: Option<u64>,
}

/// `bdev_nvme_detach_controller` (SPDK's trid filters are accepted only empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevNvmeDetachController {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traddr: Option<String>,
}

/// `bdev_nvme_get_controllers`: all, or the one named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevNvmeGetControllers {
    /// Name of one controller
    #[cfg_attr(feature = "cli", arg(short = 'n', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Registers the NVMe methods on `reg` (called by [`crate::rpc::register`]).
pub(crate) fn register(reg: &mut RpcRegistry, app: &Arc<Bdevs>) {
    let a = app.clone();
    reg.add("bdev_nvme_attach_controller", move |p: BdevNvmeAttachController| {
        let fabrics = [("adrfam", &p.adrfam), ("trsvcid", &p.trsvcid), ("subnqn", &p.subnqn), ("hostaddr", &p.hostaddr), ("hostsvcid", &p.hostsvcid)];
        if let Some((k, _)) = fabrics.iter().find(|(_, v)| v.is_some()) {
            return Err(RpcError::invalid_params(format!("{k}: a fabrics parameter; riser attaches local PCIe controllers only (trtype PCIe, traddr)")));
        }
        if p.prchk_reftag || p.prchk_guard {
            return Err(RpcError::invalid_params("prchk_reftag/prchk_guard: riser serves namespaces without protection information"));
        }
        if p.hdgst || p.ddgst {
            return Err(RpcError::invalid_params("hdgst/ddgst: NVMe/TCP digests do not apply to PCIe"));
        }
        let names = a.bdevs().attach_nvme(&p.name, &p.trtype, &p.traddr).map_err(to_rpc)?;
        Ok(json!(names))
    });
    let a = app.clone();
    reg.add("bdev_nvme_detach_controller", move |p: BdevNvmeDetachController| {
        let mut bdevs = a.bdevs();
        if let Some(addr) = &p.traddr {
            let want = crate::nvme::canonical_traddr(addr).map_err(|e| RpcError::invalid_params(e.to_string()))?;
            if !bdevs.nvme_controllers().any(|c| c.name == p.name && c.traddr == want) {
                return Err(RpcError::not_found(format!("NVMe controller {} at {addr} not found", p.name)));
            }
        }
        bdevs.detach_nvme(&p.name).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
    let a = app.clone();
    reg.add("bdev_nvme_get_controllers", move |p: BdevNvmeGetControllers| {
        let bdevs = a.bdevs();
        let list: Vec<Value> = bdevs
            .nvme_controllers()
            .filter(|c| p.name.as_ref().is_none_or(|n| &c.name == n))
            .map(|c| c.info_json())
            .collect();
        if let (Some(n), true) = (&p.name, list.is_empty()) {
            return Err(RpcError::not_found(format!("NVMe controller {n} not found")));
        }
        Ok(json!(list))
    });
}
