//! The target-level helpers the iSCSI glue called before [`DeviceChannel`] existed, kept
//! as thin wrappers over the device module until `lib/server/src/conn.rs` routes its
//! tasks through a [`DeviceChannel`] (which does all of this itself); then this module
//! goes.
//!
//! [`DeviceChannel`]: crate::DeviceChannel

use std::sync::Arc;

use crate::cdb::Cdb;
use crate::device::{self, LunId};
use crate::task::{ScsiResult, ScsiTask};
use crate::Lun;

/// Decodes the 8-byte LUN field of a PDU: [`LunId::from_field`].
pub fn decode_lun(b: &[u8; 8]) -> u64 {
    LunId::from_field(*b).get()
}

/// Answers REPORT LUNS addressed to any LUN number (existing or not) of a target whose
/// LUNs are `luns`; `addressed` is the addressed LUN if it exists. See
/// [`ScsiDevice::report_luns`](crate::ScsiDevice::report_luns).
pub fn report_luns(task: &ScsiTask, luns: &[u64], addressed: Option<&Arc<Lun>>) -> ScsiResult {
    device::report_luns(task, luns, addressed)
}

/// Whether this CDB is answered at target level with [`report_luns`] rather than by the
/// LUN (REPORT LUNS).
pub fn is_target_level(cdb: &Cdb) -> bool {
    device::is_target_level(cdb)
}

/// The answer for a task addressed to a LUN that does not exist (SPC-4 6.6.2, SAM-5).
pub fn no_such_lun(task: &ScsiTask) -> ScsiResult {
    device::no_such_lun(task)
}
