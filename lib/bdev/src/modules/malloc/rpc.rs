//! The malloc bdev's RPCs: `bdev_malloc_create`, `bdev_malloc_delete`.

use std::sync::Arc;

use riser_rpc::params::{BdevMallocCreate, ByName};
use riser_rpc::RpcRegistry;
use serde_json::Value;

use crate::rpc::{no_metadata, to_rpc, Bdevs};

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
        a.bdevs().delete(&p.name, Some("Malloc disk")).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
}
