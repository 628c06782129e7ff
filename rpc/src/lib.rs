//! JSON-RPC 2.0 for riser: the server (Unix socket, SPDK's unframed wire format), the
//! method registry with SPDK-style errors, and the client used by `riser-rpc` and tests.

pub mod client;
pub mod server;

pub use server::{RpcError, RpcRegistry, RpcServer, DEFAULT_SOCKET};
