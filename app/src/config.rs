//! Config files in SPDK's format: `{"subsystems":[{"subsystem":NAME,"config":[{method,params}]}]}`,
//! replayed through the same RPC methods a live client would call.

use riser_rpc::RpcRegistry;
use serde::Deserialize;
use serde_json::Value;

/// The built-in default (`riser --default-config`).
pub const DEFAULT_CONFIG: &str = include_str!("../default-config.json");

#[derive(Deserialize)]
struct ConfigFile {
    subsystems: Vec<Subsystem>,
}

#[derive(Deserialize)]
struct Subsystem {
    subsystem: String,
    #[serde(default)]
    config: Option<Vec<Call>>,
}

#[derive(Deserialize)]
struct Call {
    method: String,
    #[serde(default)]
    params: Value,
}

/// Replays every call in order; the first failure stops loading with a message that names it.
pub fn load(registry: &RpcRegistry, text: &str) -> Result<(), String> {
    let cfg: ConfigFile = serde_json::from_str(text).map_err(|e| format!("not a valid config file: {e}"))?;
    for sub in cfg.subsystems {
        for (i, call) in sub.config.unwrap_or_default().into_iter().enumerate() {
            if riser_rpc::params::IGNORED_SPDK_METHODS.contains(&call.method.as_str()) {
                log::info!("config: skipping SPDK method {} (nothing to do in riser)", call.method);
                continue;
            }
            registry.call(&call.method, call.params).map_err(|e| {
                format!("subsystem {} entry {i} ({}): {}", sub.subsystem, call.method, e)
            })?;
        }
    }
    Ok(())
}
