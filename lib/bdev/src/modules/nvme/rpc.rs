//! The NVMe RPCs: `bdev_nvme_attach_controller`, `bdev_nvme_detach_controller`, `bdev_nvme_get_controllers`.

use std::sync::Arc;

use riser_rpc::params::{BdevNvmeAttachController, BdevNvmeDetachController, BdevNvmeGetControllers};
use riser_rpc::{RpcError, RpcRegistry};
use serde_json::{json, Value};

use crate::rpc::{to_rpc, Bdevs};

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
