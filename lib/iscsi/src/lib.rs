//! riser-iscsi: sans-IO building blocks of the iSCSI layer (RFC 7143, iSER keys of RFC 7145).
#![forbid(unsafe_code)]

pub mod digest;
pub mod ffp;
pub mod framer;
pub mod login;
pub mod negotiate;
pub mod params;
pub mod pdu;
pub mod serial;
pub mod text;
