//! Block devices with per-reactor I/O channels.
//!
//! A [`Bdev`] is shared (`Arc<dyn Bdev>`) and immutable in shape; I/O goes through an
//! [`IoChannel`] that one reactor opens and owns. [`IoChannel::submit`] never blocks and
//! never fails synchronously: every I/O, valid or not, comes back exactly once from
//! [`IoChannel::poll`] on the reactor that submitted it. [`SharedChannel`] is a reactor's one
//! channel per device, shared by all its users on that thread.
//!
//! Devices: [`NullBdev`] (reads return zeros, writes are discarded), [`MallocBdev`] (RAM)
//! and [`FileBdev`] (a file or block device through io_uring, O_DIRECT: SPDK's
//! `bdev_uring_*` and `bdev_aio_*`), [`NvmeBdev`] (an NVMe namespace through the kernel's
//! driver, io_uring passthrough with polled completions: `bdev_nvme_*`). [`BdevRegistry`] holds them by unique name, with
//! claims.

pub mod channel;
pub mod gateways;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
mod io;
mod lba;
mod modules;
pub mod qos;
mod shared;
mod registry;
mod sq;
pub mod rpc;
pub mod stats;
mod uring;

use modules::{file, malloc, null};
pub use modules::{nvme, rbd};

pub use channel::SharedChannel;
pub use file::{FileBdev, FileError, FileKind};
pub use io::{
    run_sync, validate, BdevError, BdevInfo, BdevIo, IoBuf, IoChannel, IoCompletion,
    IoKind,
};
pub use lba::Lba;
pub use gateways::{GatewayGroup, GatewayGroupHandle, GroupEvent, Member, MemberState, OnGroupEvent};
pub use shared::{OnNotify, SharedError, SharedState, SharedStateHandle};
pub use malloc::MallocBdev;
pub use null::NullBdev;
pub use nvme::{IoPath, NvmeBdev, NvmeCtrlr, NvmeError};
pub use registry::{BdevRegistry, RegistryError};
pub use stats::{BdevStats, IoStat, Percentiles, ResetMode};
pub use uring::{thread_ring_stats, RingStats};

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

    /// `bdev_get_bdevs`' `driver_specific` object.
    fn driver_specific(&self) -> serde_json::Value {
        serde_json::json!({})
    }

    /// Provisioning status of the blocks from `lba` (at most `max_blocks` of them) from the
    /// device's own allocation map, as runs of same-state blocks in order, stopping once
    /// there are more than `max_runs`; `None` when the device keeps no map (the caller
    /// reads the blocks: zeros count as deallocated).
    fn provisioning(&self, _lba: Lba, _max_blocks: u64, _max_runs: usize) -> Option<Result<Vec<LbaRun>, BdevError>> {
        None
    }

    /// The size in blocks the backing store has now (`bdev_*_rescan`); `None` for a
    /// device whose size cannot change.
    fn rescan_blocks(&self) -> Option<Result<u64, BdevError>> {
        None
    }

    /// Takes the size a rescan found (the registry checks it first).
    fn set_num_blocks(&self, _num_blocks: u64) {}

    /// State shared by every gateway exporting this device, named `purpose` (`"pr"`), with
    /// `on_notify` called when another gateway changes it; `None`: the device is local.
    fn shared_state(&self, _purpose: &str, _on_notify: OnNotify) -> Option<Result<SharedStateHandle, BdevError>> {
        None
    }

    /// The gateways that export this device with this one (see [`gateways`]); `None`: the
    /// device is local.
    fn gateway_group(&self) -> Option<GatewayGroupHandle> {
        None
    }
}

/// A run of blocks in one provisioning state (GET LBA STATUS, SBC-3 5.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbaRun {
    pub start: Lba,
    pub blocks: u64,
    /// Deallocated (a hole; reads as zeros) rather than mapped.
    pub deallocated: bool,
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
        "num_blocks": i.num_blocks(),
        "uuid": i.uuid.to_string(),
        "write_cache": i.volatile_write_cache,
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
            "compare_and_write": s(IoKind::CompareAndWrite),
            "abort": false,
            "nvme_admin": false,
            "nvme_io": false
        },
        "driver_specific": bdev.driver_specific()
    })
}
