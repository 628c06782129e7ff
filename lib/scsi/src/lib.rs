//! SCSI command emulation (SPC-4, SBC-3) for riser's iSCSI target.
//!
//! * [`Lun`] — a logical unit over a bdev, shared by every reactor (`Arc<Lun>`), created on
//!   the control plane: identity (VPD 0x80/0x83), unit attentions per I_T nexus,
//!   persistent and SPC-2 reservations, mode parameters, medium state, copy results, and
//!   the sanitize state (a SANITIZE outlives its task, its session and resets; the next
//!   [`LunChannel`] to poll takes over one whose channel went away).
//! * [`LunChannel`] — the per-reactor executor for one LUN: [`submit`](LunChannel::submit)
//!   a [`ScsiTask`], collect its [`TaskEvent`]s with [`poll`](LunChannel::poll) (results only
//!   ever come from `poll`, even for emulated commands). Abort with
//!   [`abort_task`](LunChannel::abort_task), [`abort_nexus`](LunChannel::abort_nexus),
//!   [`abort_all`](LunChannel::abort_all).
//! * [`ScsiDevice`] — the LUN map of one target (SPDK's `spdk_scsi_dev`): LUN numbers
//!   ([`LunId`], the 8-byte LUN field), REPORT LUNS, and the answers for a LUN number the
//!   target does not have.
//! * [`DeviceChannel`] — the per-connection executor for one [`ScsiDevice`]: routes each
//!   task to its LUN's [`LunChannel`] (opened on first use) or answers it at target level.
//!
//! # How the iSCSI layer uses it
//!
//! 1. Per target, one [`ScsiDevice`] (`Arc`), built on the control plane from the target's
//!    LUNs and replaced as a whole when the LUN map changes
//!    ([`ScsiDevice::announce_luns`] queues REPORTED LUNS DATA HAS CHANGED where the set
//!    changed).
//! 2. Per session, one [`Nexus`] (`Arc`) built from the initiator name + ISID and the
//!    target name + portal group tag; per connection, one [`DeviceChannel`] on its
//!    reactor ([`DeviceChannel::set_device`] when the LUN map changes).
//! 3. Per SCSI Command PDU: a [`ScsiTask`] (LUN number from [`LunId::from_field`], the
//!    Data-Out as a [`DataOut`]: whole, or streamed) to [`DeviceChannel::submit`]. The
//!    types of this protocol are in [`task`].
//! 4. Each poll pass: [`DeviceChannel::poll`]; for each [`TaskEvent`]: a read's piece goes
//!    out as Data-In, a streamed write's want is fetched and handed back with
//!    [`DeviceChannel::write_data`], a [`ScsiResult`] ends the task (its `data()` as
//!    Data-In, then the SCSI Response with `status`, `sense` and `residual`), and an abort
//!    only says the task is gone.
//! 5. Task management: ABORT TASK → [`DeviceChannel::abort_task`]; LOGICAL UNIT RESET →
//!    [`DeviceChannel::reset_lun`]; target reset → [`DeviceChannel::reset_target`];
//!    connection end → [`DeviceChannel::teardown`]. Each resets the shared LUN state
//!    ([`Lun::reset`], [`Lun::nexus_lost`]) and aborts this connection's tasks.

pub mod alua;
pub mod cdb;
mod device;
mod exec;
mod inquiry;
mod lock;
mod lu_events;
mod lu_shared;
mod lun;
mod mode;
mod nexus;
mod opcodes;
mod pr;
mod rw;
mod sanitize;
pub mod sense;
pub mod task;
mod xcopy;

pub use alua::{AccessState, Alua, Change as AluaChange, Failback, GroupView, Liveness, PortGroup, Why as AluaWhy};
pub use cdb::Cdb;
pub use device::{BufAllocFactory, DeviceChannel, LunId, ResetPending, ScsiDevice};
pub use lu_events::{Announcement, ANNOUNCE_WAIT};
pub use exec::{BufAlloc, LunChannel};
pub use inquiry::{MAX_CAW_BLOCKS, MAX_TRANSFER_BYTES};
pub use lun::{Lun, LunConfig, ResetKind, IEEE_COMPANY_ID};
pub use opcodes::command_name;
pub use pr::pr_type;
pub use sense::{Asc, CmdError, Sense, SenseBuf, SenseKey, Status};
pub use task::{DataOut, DataPiece, DataWant, Nexus, Residual, ScsiResult, ScsiTask, TaskAttr, TaskEvent};

#[cfg(test)]
mod tests;
