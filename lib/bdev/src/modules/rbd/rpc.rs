//! The RBD bdevs' RPCs and their parameter types: `bdev_rbd_register_cluster`,
//! `bdev_rbd_unregister_cluster`, `bdev_rbd_get_clusters_info`, `bdev_rbd_create`,
//! `bdev_rbd_delete`, `bdev_rbd_resize` (SPDK's names and parameters, plus riser's `lease_s`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use riser_rpc::params::ByName;
use riser_rpc::{RpcError, RpcRegistry};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::PRODUCT;
use crate::{BdevRegistry, RegistryError};

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `bdev_rbd_register_cluster`: one connection to a Ceph cluster, for RBD bdevs to share.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevRbdRegisterCluster {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_param: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// SPDK's librados thread mask: accepted and ignored (riser leaves librados' threads to
    /// the OS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_mask: Option<String>,
}

/// `bdev_rbd_get_clusters_info`: all registered clusters, or the one named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevRbdGetClustersInfo {
    /// Only this cluster
    #[cfg_attr(feature = "cli", arg(short = 'b', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `bdev_rbd_create`'s params (SPDK's names; `config` is rpc.py's `--config-param`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevRbdCreate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    pub pool_name: String,
    pub rbd_name: String,
    pub block_size: u32,
    #[serde(default, alias = "config_param", skip_serializing_if = "Option::is_none")]
    pub config: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
    /// riser: how long (s) a gateway exporting the image may go without answering before
    /// the others fence it (see `group`); `DEFAULT_LEASE_S` (10) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_s: Option<u32>,
}

/// `bdev_rbd_resize`: grow an RBD bdev and its image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevRbdResize {
    /// Bdev name
    pub name: String,
    /// New size in MiB (RBD bdevs only grow)
    pub new_size: u64,
}

/// Registers the `bdev_rbd_*` methods.
pub(crate) fn register(reg: &mut RpcRegistry, bdevs: &Arc<Mutex<BdevRegistry>>, to_rpc: fn(RegistryError) -> RpcError) {
    let lock = |b: &Arc<Mutex<BdevRegistry>>| -> Arc<Mutex<BdevRegistry>> { b.clone() };
    let b = lock(bdevs);
    reg.add("bdev_rbd_register_cluster", move |p: BdevRbdRegisterCluster| {
        if p.config_file.is_none() && p.config_param.is_none() && p.key_file.is_some() {
            return Err(RpcError::invalid_params("key_file needs config_file or config_param (where are the monitors?)"));
        }
        let mut r = b.lock().unwrap_or_else(|e| e.into_inner());
        let name = r.rbd_register_cluster(&p.name, p.user_id, p.config_param, p.config_file, p.key_file).map_err(to_rpc)?;
        Ok(Value::String(name))
    });
    let b = lock(bdevs);
    reg.add("bdev_rbd_unregister_cluster", move |p: ByName| {
        b.lock().unwrap_or_else(|e| e.into_inner()).rbd_unregister_cluster(&p.name).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
    let b = lock(bdevs);
    reg.add("bdev_rbd_get_clusters_info", move |p: BdevRbdGetClustersInfo| {
        let list = b.lock().unwrap_or_else(|e| e.into_inner()).rbd_clusters_info(p.name.as_deref()).map_err(to_rpc)?;
        Ok(match p.name {
            // SPDK answers one object for a named cluster.
            Some(_) => list.into_iter().next().unwrap_or(Value::Null),
            None => Value::Array(list),
        })
    });
    let b = lock(bdevs);
    reg.add("bdev_rbd_create", move |p: BdevRbdCreate| {
        let name = b.lock().unwrap_or_else(|e| e.into_inner()).create_rbd(p).map_err(to_rpc)?;
        Ok(Value::String(name))
    });
    let b = lock(bdevs);
    reg.add("bdev_rbd_delete", move |p: ByName| {
        b.lock().unwrap_or_else(|e| e.into_inner()).delete(&p.name, Some(PRODUCT)).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
    let b = lock(bdevs);
    reg.add("bdev_rbd_resize", move |p: BdevRbdResize| {
        b.lock().unwrap_or_else(|e| e.into_inner()).rbd_resize(&p.name, p.new_size).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn create_params_take_spdks_names() {
        let p: BdevRbdCreate = serde_json::from_value(json!({
            "pool_name": "rbd", "rbd_name": "img", "block_size": 512, "config": {"mon_host": "127.0.0.1:13300"}
        }))
        .unwrap();
        assert_eq!(p.config.unwrap()["mon_host"], "127.0.0.1:13300");
        let p: BdevRbdCreate =
            serde_json::from_value(json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 4096, "config_param": {"a": "b"}})).unwrap();
        assert_eq!(p.config.unwrap()["a"], "b");
        assert!(serde_json::from_value::<BdevRbdCreate>(json!({"pool_name": "rbd", "block_size": 512})).is_err());
        assert!(serde_json::from_value::<BdevRbdCreate>(json!({"pool_name": "rbd", "rbd_name": "x", "block_size": 512, "bogus": 1})).is_err());
    }

    /// What riser-rpc sends: SPDK's shapes, absent fields left out.
    #[test]
    fn params_encode_spdks_shapes() {
        let c = BdevRbdCreate {
            name: Some("Ceph0".into()),
            pool_name: "rbd".into(),
            rbd_name: "img".into(),
            block_size: 4096,
            cluster_name: Some("c0".into()),
            ..Default::default()
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v, json!({"name": "Ceph0", "pool_name": "rbd", "rbd_name": "img", "block_size": 4096, "cluster_name": "c0"}));
        assert_eq!(serde_json::from_value::<BdevRbdCreate>(v).ok(), Some(c));
        let r = BdevRbdRegisterCluster { name: "c1".into(), config_file: Some("/x".into()), ..Default::default() };
        assert_eq!(serde_json::to_value(&r).ok(), Some(json!({"name": "c1", "config_file": "/x"})));
    }
}
