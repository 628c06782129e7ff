//! The malloc bdev's RPCs: `bdev_malloc_create`, `bdev_malloc_delete`, and riser's
//! `bdev_malloc_resize` (SPDK has none; the parameters of its `bdev_null_resize`).

use std::sync::Arc;

use riser_rpc::params::{is_zero_u32, ByName};
use riser_rpc::RpcRegistry;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::rpc::{no_metadata, to_rpc, Bdevs};

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `bdev_malloc_create`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevMallocCreate {
    /// The server picks one when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub num_blocks: u64,
    pub block_size: u32,
    /// Random when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
    /// Accepted for SPDK configs; riser's malloc has no I/O boundary.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub optimal_io_boundary: u32,
    /// Separate metadata per block: only 0 is supported.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub md_size: u32,
    /// SPDK's name: several logical blocks per physical block (e.g. 4096 over 512).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical_block_size: Option<u32>,
}

/// `bdev_malloc_resize` (riser's extension, `bdev_null_resize`'s parameters): grow a malloc
/// bdev within the memory the machine has, or shrink one no LUN uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevMallocResize {
    /// Bdev name
    pub name: String,
    /// New size in MiB (smaller only while no LUN uses the bdev)
    pub new_size: u64,
}

/// Registers the malloc methods on `reg` (called by [`crate::rpc::register`]).
pub(crate) fn register(reg: &mut RpcRegistry, app: &Arc<Bdevs>) {
    let a = app.clone();
    reg.add("bdev_malloc_create", move |p: BdevMallocCreate| {
        no_metadata(p.md_size)?;
        let name = a
            .bdevs()
            .create_malloc_with(p.name.as_deref(), p.num_blocks, p.block_size, p.physical_block_size.filter(|&x| x != 0), p.uuid)
            .map_err(to_rpc)?;
        Ok(Value::String(name))
    });
    let a = app.clone();
    reg.add("bdev_malloc_delete", move |p: ByName| {
        a.bdevs().delete(&p.name, Some(super::PRODUCT)).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
    let a = app.clone();
    reg.add("bdev_malloc_resize", move |p: BdevMallocResize| {
        a.bdevs().malloc_resize(&p.name, p.new_size).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
}
