//! JSON-RPC client (see riser-rpc).
