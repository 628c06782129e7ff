//! JSON-RPC 2.0 for riser: the server (Unix socket, SPDK's unframed wire format), the
//! method registry with SPDK-style errors, the client used by `riser-rpc` and tests, and the
//! parameters of each method, shared by the server's handlers and the `riser-rpc` CLI.

pub mod client;
pub mod params;
pub mod server;

pub use server::{RpcError, RpcRegistry, RpcServer, DEFAULT_SOCKET};
