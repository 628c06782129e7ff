//! The iSER datamover (RFC 7145): control-type PDUs in RC SENDs behind a 28-byte header,
//! read data by RDMA Write to the initiator's Read STag, write data by RDMA Read from its
//! Write STag. The header codec is here; the verbs-driven datamover builds on `bindings/`.

pub mod config;
pub mod conn;
pub mod error;
pub mod header;
pub mod memlock;
pub mod pool;
pub mod portal;
pub mod shared_cq;
pub mod verbs;
pub mod wr;

pub use error::IserError;
pub use header::{IserHeader, IserHeaderError, Stag, TaggedBuffer, ISER_HDR_LEN};
