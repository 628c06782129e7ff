//! Datamovers: the transports below the iSCSI layer, each implementing
//! [`riser_iscsi::ffp::Datamover`] (RFC 5047).
//!
//! * [`tcp`]: traditional iSCSI on a byte stream: Data-In, R2T and Data-Out PDUs, digests.
//! * [`iser`]: iSCSI Extensions for RDMA (RFC 7145).

pub mod iser;
pub mod tcp;

pub use iser::portal::IserPortal;
pub use tcp::portal::TcpPortal;
pub use tcp::TcpDatamover;
