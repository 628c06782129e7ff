//! The device types, a folder each: null, malloc, file (io_uring / aio), NVMe, RBD.

pub(crate) mod file;
pub(crate) mod malloc;
pub(crate) mod null;
pub mod nvme;
pub mod rbd;
