//! What goes wrong in the iSER datamover, its verbs glue and its portals: one error type, so
//! callers can tell a missing device from a full CQ. Where a `String` crosses into another
//! crate's API (the login transport, the portal listener), it is this error's text.

use std::net::SocketAddr;

use riser_iscsi::pdu::{Opcode, PduError};
use riser_rdma::RdmaError;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IserError {
    /// A verbs or rdma_cm call failed: the error names the C call and its errno
    /// ([`RdmaError::call`], [`RdmaError::errno`]).
    #[error(transparent)]
    Verbs(#[from] RdmaError),
    /// The CM id has no queue pair (not created yet, or already destroyed).
    #[error("no queue pair")]
    NoQueuePair,
    /// The CM id is bound to no RDMA device.
    #[error("no device for the connection")]
    NoDevice,
    /// The CM id has no peer address (the connect request carried none we can read).
    #[error("no peer address")]
    NoPeerAddress,
    /// The portal's address could not be bound: usually no RDMA device has it (yet).
    #[error("bind {addr} (is there an RDMA device with this address?): {source}")]
    Bind { addr: SocketAddr, source: RdmaError },
    #[error("listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: RdmaError },
    /// Registering a buffer with the device failed (memory lock limit, device limits).
    #[error("cannot register {bytes} bytes: {source}")]
    Registration { bytes: usize, source: RdmaError },
    #[error("cannot create a CQ of {entries} entries: {source}")]
    CreateCq { entries: u32, source: RdmaError },
    /// A shared CQ has no room left for another QP's send + receive depth (it would overflow
    /// and put every QP on it in error).
    #[error("completion queue full ({reserved} of {capacity} entries reserved)")]
    CqFull { reserved: u32, capacity: u32 },
    /// A QP deeper than a whole CQ of the device.
    #[error("a QP of {depth} work requests does not fit a CQ of {capacity}")]
    QpDeeperThanCq { depth: u32, capacity: u32 },
    /// The reactor that would own the connection's CQ is stopping.
    #[error("reactor {0} is stopping")]
    NoReactor(usize),
    /// A PDU to send could not be encoded.
    #[error("cannot encode {opcode:?}: {source}")]
    Encode { opcode: Option<Opcode>, source: PduError },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_say_what_and_where() {
        let e = RdmaError::Call { call: "rdma_bind_addr", errno: 19 };
        assert_eq!(IserError::from(e.clone()).to_string(), e.to_string(), "a verbs error is its own text");
        let addr = SocketAddr::from(([192, 0, 2, 1], 3260));
        let bind = IserError::Bind { addr, source: e.clone() }.to_string();
        assert!(bind.starts_with("bind 192.0.2.1:3260 (is there an RDMA device"), "{bind}");
        assert!(bind.ends_with(&e.to_string()), "{bind}");
        assert_eq!(
            IserError::CqFull { reserved: 60, capacity: 100 }.to_string(),
            "completion queue full (60 of 100 entries reserved)"
        );
        assert_eq!(
            IserError::Registration { bytes: 4096, source: e.clone() }.to_string(),
            format!("cannot register 4096 bytes: {e}")
        );
    }
}
