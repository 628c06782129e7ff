//! riser-rdma: a thin safe wrapper over libibverbs and librdmacm (through `rdma-sys`).
//!
//! All of riser's RDMA `unsafe` lives in this crate, each block with a `// SAFETY:` line.
//! Above it, the iSER datamover works with owned Rust values:
//!
//! | type | C object | held by (keeps alive) |
//! |---|---|---|
//! | [`EventChannel`] | `rdma_event_channel` | every [`CmId`] created on it |
//! | [`CmId`] | `rdma_cm_id` | owns its [`QueuePair`] |
//! | [`Context`] | `ibv_context` | PDs, CQs, completion channels |
//! | [`ProtectionDomain`] | `ibv_pd` | memory regions, QPs, SRQs |
//! | [`MemoryRegion`] | `ibv_mr` + the buffer | - |
//! | [`register_iobuf`] | `ibv_mr` over a `riser_buf::IoBuf`'s mapping | the mapping (dropped before it is unmapped) |
//! | [`CompletionChannel`] | `ibv_comp_channel` | CQs attached to it |
//! | [`CompletionQueue`] | `ibv_cq` | QPs using it |
//! | [`SharedReceiveQueue`] | `ibv_srq` | QPs using it |
//! | [`QueuePair`] | `ibv_qp` (via `rdma_create_qp`) | owned by its [`CmId`] |
//!
//! Free order follows from the `Arc`s: a QP is destroyed (by its id, before the id) before
//! its CQs, SRQ and PD; an MR before its PD; a PD/CQ before its context; ids before their
//! channel.
//!
//! The one rule the types cannot enforce (Linux isert's): never release a QP's buffers
//! before the QP is drained: disconnect or [`QueuePair::set_error`], poll until every
//! outstanding request has completed or flushed ([`WcStatus::is_flush`]), then drop the id,
//! then the buffers. Breaking it is still memory safe ([`MemoryRegion`] deregisters before it
//! frees, so the device cannot reach freed memory) but fails the outstanding requests.
//!
//! On a machine without RDMA (no devices, no `/dev/infiniband`) everything fails with an
//! [`RdmaError`] and nothing panics: [`devices`] returns an empty list.

mod cm;
mod cq;
mod device;
mod error;
mod mr;
mod qp;

pub use cm::{CmEvent, CmEventType, CmId, CmIdKey, ConnParam, EventChannel};
pub use cq::{CompletionChannel, CompletionQueue, WcOpcode, WcStatus, WorkCompletion, POLL_BATCH};
pub use device::{devices, mtu_bytes, refresh_cm_devices, Context, DeviceAttr, LinkLayer, PortAttr, PortState, ProtectionDomain};
pub use error::{RdmaError, Result};
pub use mr::{
    iobuf_domain, memlock_limit, register_iobuf, register_iobuf_range, release_idle_iobuf_registrations, Access, MemoryRegion, Sge,
    TransferRegistration,
};
pub use qp::{QpCaps, QpInitAttr, QpState, QueuePair, RecvWr, SendOp, SendWr, SharedReceiveQueue, WrData, MAX_CHAIN};

/// The raw bindings, for calls this crate does not wrap (each use is `unsafe`).
pub use rdma_sys as sys;
