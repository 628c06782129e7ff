//! The null device: reads return zeros, writes are discarded. For measuring everything
//! above the device.

pub(crate) mod rpc;

use std::sync::Arc;

use uuid::Uuid;

use crate::io::{validate, BdevInfo, BdevIo, DoneQueue, IoChannel, IoCompletion, IoKind};
use crate::{Bdev, BdevError, Lba, LbaRun};

/// `bdev_get_bdevs`' product_name of null devices.
pub const PRODUCT: &str = "Null disk";

pub struct NullBdev {
    info: BdevInfo,
}

impl NullBdev {
    pub fn new(name: &str, num_blocks: u64, block_size: u32, uuid: Option<Uuid>) -> NullBdev {
        NullBdev {
            info: BdevInfo::new(name, PRODUCT, block_size, num_blocks, uuid.unwrap_or_else(Uuid::new_v4)),
        }
    }
}

impl Bdev for NullBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, kind: IoKind) -> bool {
        // COMPARE AND WRITE is read, compared and written by the SCSI layer.
        kind != IoKind::CompareAndWrite
    }

    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        Box::new(NullChannel { bdev: self, done: DoneQueue::default() })
    }

    /// Nothing is stored: every block is deallocated (and reads as zeros).
    fn provisioning(&self, lba: Lba, max_blocks: u64, _max_runs: usize) -> Option<Result<Vec<LbaRun>, BdevError>> {
        let blocks = max_blocks.min(self.info.num_blocks().saturating_sub(lba.get()));
        Some(Ok(vec![LbaRun { start: lba, blocks, deallocated: true }]))
    }

    /// `bdev_null_resize` (the registry checks the size first).
    fn set_num_blocks(&self, num_blocks: u64) {
        self.info.set_num_blocks(num_blocks);
    }

    fn config_json(&self) -> (&'static str, serde_json::Value) {
        (
            "bdev_null_create",
            serde_json::json!({
                "name": self.info.name,
                "num_blocks": self.info.num_blocks(),
                "block_size": self.info.block_size,
                "uuid": self.info.uuid.to_string(),
            }),
        )
    }
}

struct NullChannel {
    bdev: Arc<NullBdev>,
    done: DoneQueue,
}

impl IoChannel for NullChannel {
    fn submit(&mut self, mut io: BdevIo) {
        let r = validate(&self.bdev.info, true, &io);
        if r.is_ok() && io.kind == IoKind::Read {
            if let Some(buf) = io.buf.as_mut() {
                // Zeros, never another I/O's data; a buffer known to be zero is not
                // written again (SPDK's null device sends one shared zero buffer).
                buf.fill_zero();
            }
        }
        self.done.push(io, r);
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        self.done.drain_into(out)
    }

    fn outstanding(&self) -> usize {
        self.done.len()
    }
}
