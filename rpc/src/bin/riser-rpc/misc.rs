//! Subcommands of the small subsystems: rpc_get_methods, framework, log, iobuf, and the
//! raw `call`.

use clap::Args;
use serde::Serialize;

use crate::is_false;

#[derive(Args, Serialize, Debug)]
pub(crate) struct RpcGetMethods {
    /// Only the methods allowed in the current state
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) current: bool,
    /// Include deprecated alias names
    #[arg(short = 'i', long)]
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) include_aliases: bool,
}

/// log_set_level / log_set_print_level (riser checks the name).
#[derive(Args, Serialize, Debug)]
pub(crate) struct LogLevel {
    /// ERROR, WARNING (or WARN), NOTICE, INFO or DEBUG (any case)
    pub(crate) level: String,
}

#[derive(Args, Serialize, Debug)]
pub(crate) struct FrameworkGetConfig {
    /// Subsystem name (see framework_get_subsystems)
    pub(crate) name: String,
}

#[derive(Args, Debug, Serialize)]
pub(crate) struct IobufSetOptions {
    /// The budget in bytes (at least 33554432, the largest transfer)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_bytes: Option<u64>,
    /// SPDK's fields, for rpc.py habits: the budget becomes what these pools would hold
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) small_pool_count: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) large_pool_count: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) small_bufsize: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) large_bufsize: Option<u64>,
    /// The most of the budget one connection holds while it holds any (percent)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_buffer_share_percent: Option<u32>,
    /// The part of the budget kept for connections holding little (percent)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) buffer_reserve_percent: Option<u32>,
}

#[derive(Args, Debug)]
pub(crate) struct Call {
    /// Method name
    pub(crate) method: String,
    /// Params as one JSON object or array (none when absent)
    pub(crate) params: Option<String>,
}
