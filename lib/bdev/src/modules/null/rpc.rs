//! The null bdev's RPCs: `bdev_null_create`, `bdev_null_delete`.

use std::sync::Arc;

use riser_rpc::params::{BdevNullCreate, ByName};
use riser_rpc::RpcRegistry;
use serde_json::Value;

use crate::rpc::{no_metadata, to_rpc, Bdevs};

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
        a.bdevs().delete(&p.name, Some("Null disk")).map_err(to_rpc)?;
        Ok(Value::Bool(true))
    });
}
