//! The file bdevs' RPCs: `bdev_uring_*` and `bdev_aio_*` (create, delete, rescan).

use std::sync::Arc;

use riser_rpc::params::{BdevAioCreate, BdevUringCreate, ByName};
use riser_rpc::RpcRegistry;
use serde_json::Value;

use crate::rpc::{to_rpc, Bdevs};
use crate::FileKind;

/// Registers the file methods on `reg` (called by [`crate::rpc::register`]).
pub(crate) fn register(reg: &mut RpcRegistry, app: &Arc<Bdevs>) {
    for kind in [FileKind::Uring, FileKind::Aio] {
        let product = kind.product_name();
        let (delete, rescan) = match kind {
            FileKind::Uring => ("bdev_uring_delete", "bdev_uring_rescan"),
            FileKind::Aio => ("bdev_aio_delete", "bdev_aio_rescan"),
        };
        let a = app.clone();
        reg.add(delete, move |p: ByName| {
            a.bdevs().delete(&p.name, Some(product)).map_err(to_rpc)?;
            Ok(Value::Bool(true))
        });
        let a = app.clone();
        reg.add(rescan, move |p: ByName| {
            a.bdevs().rescan(&p.name, Some(product)).map_err(to_rpc)?;
            Ok(Value::Bool(true))
        });
    }
    let a = app.clone();
    reg.add("bdev_uring_create", move |p: BdevUringCreate| {
        let name = a
            .bdevs()
            .create_file(FileKind::Uring, &p.name, &p.filename, p.block_size, false, p.uuid)
            .map_err(to_rpc)?;
        Ok(Value::String(name))
    });
    let a = app.clone();
    reg.add("bdev_aio_create", move |p: BdevAioCreate| {
        let name = a
            .bdevs()
            .create_file(FileKind::Aio, &p.name, &p.filename, p.block_size, p.readonly, p.uuid)
            .map_err(to_rpc)?;
        Ok(Value::String(name))
    });
}
