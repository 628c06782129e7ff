//! The file bdevs' RPCs: `bdev_uring_*` and `bdev_aio_*` (create, delete, rescan).

use std::sync::Arc;

use riser_rpc::params::{is_false, ByName};
use riser_rpc::RpcRegistry;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::rpc::{to_rpc, Bdevs};
use crate::FileKind;

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `bdev_uring_create`: a file or block device through io_uring.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevUringCreate {
    pub name: String,
    pub filename: String,
    /// Detected when absent (or 0): the device's logical block size, 512 for a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Random when absent (SPDK v24.05's field; riser's save_config keeps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
}

/// `bdev_aio_create`: the same engine as `bdev_uring_create`, SPDK's AIO parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevAioCreate {
    pub name: String,
    pub filename: String,
    /// Detected when absent (or 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub readonly: bool,
    /// SPDK's: write zeroes by fallocate. riser probes the file system for it instead.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fallocate: bool,
    /// Random when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
}

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
