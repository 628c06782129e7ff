//! SCSI command emulation (SPC-4, SBC-3) for riser's iSCSI target.
//!
//! * [`Lun`] — a logical unit over a bdev, shared by every reactor (`Arc<Lun>`): identity,
//!   unit attentions, reservations, mode parameters.
//! * [`LunChannel`] — the per-reactor executor: [`submit`](LunChannel::submit) a
//!   [`ScsiTask`], collect [`ScsiResult`]s with [`poll`](LunChannel::poll).
//! * [`target`] — REPORT LUNS, LUN encoding and answers for LUNs that do not exist.

pub mod cdb;
mod exec;
mod inquiry;
mod lock;
mod lun;
mod mode;
mod opcodes;
mod pr;
mod rw;
pub mod sense;
pub mod target;
mod task;
mod xcopy;

pub use cdb::Cdb;
pub use exec::{BufAlloc, LunChannel};
pub use inquiry::{MAX_CAW_BLOCKS, MAX_TRANSFER_BYTES};
pub use opcodes::command_name;
pub use lun::{Lun, LunConfig, ResetKind, IEEE_COMPANY_ID};
pub use pr::pr_type;
pub use sense::{Asc, CmdError, Sense, SenseBuf, SenseKey, Status};
pub use task::{Nexus, Residual, ScsiResult, ScsiTask, TaskAttr};

#[cfg(test)]
mod tests;
