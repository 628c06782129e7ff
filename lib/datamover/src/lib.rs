//! Datamovers: the transports below the iSCSI layer, each implementing
//! [`riser_iscsi::ffp::Datamover`] (RFC 5047).
//!
//! * [`tcp`]: traditional iSCSI on a byte stream: Data-In, R2T and Data-Out PDUs, digests.
//! * [`iser`]: iSCSI Extensions for RDMA (RFC 7145).
//! * `mem` (feature `test-util`): in memory, for tests of everything above the datamover.

pub mod iser;
#[cfg(any(test, feature = "test-util"))]
pub mod mem;
pub mod tcp;

pub use iser::portal::IserPortal;
pub use tcp::portal::TcpPortal;
pub use tcp::TcpDatamover;
