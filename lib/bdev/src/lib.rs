//! Block devices with per-reactor I/O channels.
//!
//! A [`Bdev`] is shared (`Arc<dyn Bdev>`) and immutable in shape; I/O goes through an
//! [`IoChannel`] that one reactor opens and owns. [`IoChannel::submit`] never blocks and
//! never fails synchronously: every I/O, valid or not, comes back exactly once from
//! [`IoChannel::poll`] on the reactor that submitted it.
//!
//! Two devices now: [`NullBdev`] (reads return zeros, writes are discarded) and
//! [`MallocBdev`] (RAM). [`BdevRegistry`] holds them by unique name, with claims.

mod io;
mod lba;
mod malloc;
mod null;
mod registry;
pub mod rpc;

pub use io::{
    run_sync, validate, BdevError, BdevInfo, BdevIo, IoBuf, IoChannel, IoCompletion,
    IoKind,
};
pub use lba::Lba;
pub use malloc::MallocBdev;
pub use null::NullBdev;
pub use registry::{BdevRegistry, RegistryError};

use std::sync::Arc;

/// A block device. Implementations are `Send + Sync`; per-reactor state lives in channels.
pub trait Bdev: Send + Sync {
    fn info(&self) -> &BdevInfo;

    /// Whether this device executes `kind` (unsupported kinds complete with an error).
    fn supports(&self, kind: IoKind) -> bool;

    /// Opens an I/O channel for the calling reactor.
    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel>;

    /// The RPC call (method, params) that would recreate this device (`save_config`).
    fn config_json(&self) -> (&'static str, serde_json::Value);
}

/// Block sizes the devices accept.
pub const SUPPORTED_BLOCK_SIZES: [u32; 2] = [512, 4096];

/// The JSON that `bdev_get_bdevs` shows for one device (SPDK's shape).
pub fn info_json(bdev: &dyn Bdev, claimed: bool) -> serde_json::Value {
    let i = bdev.info();
    let s = |k| bdev.supports(k);
    serde_json::json!({
        "name": i.name,
        "aliases": [],
        "product_name": i.product_name,
        "block_size": i.block_size,
        "num_blocks": i.num_blocks,
        "uuid": i.uuid.to_string(),
        "assigned_rate_limits": {
            "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0,
            "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0
        },
        "claimed": claimed,
        "zoned": false,
        "supported_io_types": {
            "read": s(IoKind::Read),
            "write": s(IoKind::Write),
            "unmap": s(IoKind::Unmap),
            "write_zeroes": s(IoKind::WriteZeroes),
            "flush": s(IoKind::Flush),
            "reset": false,
            "compare": false,
            "compare_and_write": false,
            "abort": false,
            "nvme_admin": false,
            "nvme_io": false
        },
        "driver_specific": {}
    })
}
