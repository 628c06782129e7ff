//! Subcommands of the small subsystems: rpc_get_methods, framework, log and iobuf take the
//! parameter types of [`riser_rpc::params`] as their arguments (the `riser` binary serves
//! them); and the raw `call`.

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct Call {
    /// Method name
    pub(crate) method: String,
    /// Params as one JSON object or array (none when absent)
    pub(crate) params: Option<String>,
}
