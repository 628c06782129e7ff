//! The null bdev's RPCs: `bdev_null_create`, `bdev_null_delete`, `bdev_null_resize`.

use std::sync::Arc;

use riser_rpc::params::{is_zero_u32, ByName};
use riser_rpc::RpcRegistry;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::rpc::{no_metadata, to_rpc, Bdevs};

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `bdev_null_create`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevNullCreate {
    pub name: String,
    pub num_blocks: u64,
    pub block_size: u32,
    /// Random when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
    /// Separate metadata per block: only 0 is supported.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub md_size: u32,
}

/// `bdev_null_resize` (SPDK's): grow a null bdev; a smaller size is refused, as in SPDK.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevNullResize {
    /// Bdev name
    pub name: String,
    /// New size in MiB (null bdevs only grow)
    pub new_size: u64,
}

/// Registers the null methods on `reg` (called by [`crate::rpc::register`]).
pub(crate) fn register(reg: &mut RpcRegistry, app: &Arc<Bdevs>) {
    let a = app.clone();
    reg.add("bdev_null_create", move |p: BdevNullCreate| {
        no_metadata(p.md_size)?;
        let name = a.bdevs().create_null(&p.name, p.num_blocks, p.block_size, p.uuid).map_err(to_rpc)?;
        Ok(Value::String(name))
    });
    let a = app.clone();
    reg.add("bdev_null_delete", move |p: ByName| {
        a.bdevs().delete(&p.name, Some(super::PRODUCT)).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
    let a = app.clone();
    reg.add("bdev_null_resize", move |p: BdevNullResize| {
        a.bdevs().null_resize(&p.name, p.new_size).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
}
