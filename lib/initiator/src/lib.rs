//! `riser-initiator`: an iSCSI initiator core, free of I/O (sans-IO), shared by riser-perf's
//! transports and riser-server's scenario tests.
//!
//! - [`session`]: one session's sequence numbers and CmdSN window (CmdSN, ITT, ExpStatSN),
//!   the task slots of the data path, the login exchange and key negotiation, the Data-Out
//!   PDUs of a write, task aborts, and what a received PDU asks for. Transports plug their
//!   own I/O in through [`session::Transport`] (riser-perf's TCP and iSER connections);
//!   [`session::PduSession`] is the same initiator over whole [`riser_iscsi::pdu::Pdu`]s
//!   that the caller carries (tests driving a target over an in-memory transport).
//! - [`scsi`]: the SCSI side (status, sense, READ/WRITE CDBs, the setup commands run
//!   through any session that executes one command at a time).
//! - [`url`]: target URLs (`iscsi://` and `iser://`) and the LUN field.

#![forbid(unsafe_code)]

pub mod scsi;
pub mod session;
pub mod url;
