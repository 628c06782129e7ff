//! SCSI command emulation (SPC-4, SBC-3) for riser's iSCSI target.
//!
//! * [`Lun`] — a logical unit over a bdev, shared by every reactor (`Arc<Lun>`), created on
//!   the control plane: identity (VPD 0x80/0x83), unit attentions per I_T nexus,
//!   persistent and SPC-2 reservations, mode parameters, medium state, copy results, and
//!   the sanitize state (a SANITIZE outlives its task, its session and resets; the next
//!   [`LunChannel`] to poll takes over one whose channel went away).
//! * [`LunChannel`] — the per-reactor executor for one LUN: [`submit`](LunChannel::submit)
//!   a [`ScsiTask`], collect [`ScsiResult`]s with [`poll`](LunChannel::poll) (results only
//!   ever come from `poll`, even for emulated commands). Abort with
//!   [`abort_task`](LunChannel::abort_task), [`abort_nexus`](LunChannel::abort_nexus),
//!   [`abort_all`](LunChannel::abort_all).
//! * [`target`] — REPORT LUNS for the whole target, LUN field encoding, and the answers for
//!   a LUN number that does not exist.
//!
//! # How the iSCSI layer uses it
//!
//! 1. Per session, one [`Nexus`] (`Arc`) built from the initiator name + ISID and the
//!    target name + portal group tag.
//! 2. Per SCSI Command PDU: decode the LUN ([`target::decode_lun`]); REPORT LUNS
//!    ([`target::is_target_level`]) goes to [`target::report_luns`]; a LUN the target does
//!    not have goes to [`target::no_such_lun`]; anything else becomes a [`ScsiTask`] (with
//!    the gathered Data-Out in `data_out`) submitted to that LUN's [`LunChannel`] on this
//!    reactor.
//! 3. Each poll pass: [`LunChannel::poll`]; for each [`ScsiResult`] send `data()` as
//!    Data-In, then the SCSI Response with `status`, `sense` and `residual` (skip results
//!    with `aborted` set: they only say the task is gone).
//! 4. Task management: ABORT TASK → `abort_task`; ABORT/CLEAR TASK SET → `abort_nexus`;
//!    LOGICAL UNIT RESET → `abort_all` on every reactor's channel of that LUN and
//!    [`Lun::reset`] once; session end → `abort_nexus`, [`LunChannel::forget_nexus`] and
//!    [`Lun::nexus_lost`] once; LUN map change → [`Lun::set_target_luns`] on every LUN of
//!    the target.

pub mod cdb;
mod exec;
mod inquiry;
mod lock;
mod lun;
mod mode;
mod opcodes;
mod pr;
mod rw;
mod sanitize;
pub mod sense;
pub mod target;
mod task;
mod xcopy;

pub use cdb::Cdb;
pub use exec::{BufAlloc, LunChannel};
pub use inquiry::{MAX_CAW_BLOCKS, MAX_TRANSFER_BYTES};
pub use lun::{Lun, LunConfig, ResetKind, IEEE_COMPANY_ID};
pub use opcodes::command_name;
pub use pr::pr_type;
pub use sense::{Asc, CmdError, Sense, SenseBuf, SenseKey, Status};
pub use task::{Nexus, Residual, ScsiResult, ScsiTask, TaskAttr};

#[cfg(test)]
mod tests;
