//! `riser-rpc`: command-line client for riser's JSON-RPC socket, used like SPDK's
//! `scripts/rpc.py` (`riser-rpc bdev_malloc_create -b Malloc0 64 512`).
//!
//! Adding a method: a variant in [`Cmd`] (its doc comment is the `--help` line), an args
//! struct deriving `Args` that becomes the method's params (for iSCSI and bdev methods the
//! struct of [`riser_rpc::params`], the very type the server decodes), and one line in
//! [`Cmd::into_action`]. Methods without a subcommand still work through the raw mode.
//! rpc.py's list arguments (`'Malloc0:0 Malloc1:1'`, one quoted argument) are parsed by a
//! clap value parser into a [`List`], so bad syntax is a usage error before anything is sent.
//!
//! Exit status: 0 success, 1 RPC error or connection failure, 2 usage error.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use riser_rpc::client::{ClientError, RpcClient, DEFAULT_SOCKET_PATH};
use riser_rpc::params::{self, ByName, ByTag, LunParam, PgIgMap, PortParam, PortalParam};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

#[derive(Parser, Debug)]
#[command(
    name = "riser-rpc",
    version,
    about = "Send JSON-RPC calls to a running riser (SPDK rpc.py style)",
    after_help = "Any other METHOD is sent as is: riser-rpc METHOD ['{\"json\": \"params\"}']"
)]
struct Cli {
    /// Path of riser's RPC socket
    #[arg(short = 's', long = "server", value_name = "SOCK", default_value = DEFAULT_SOCKET_PATH)]
    server: PathBuf,

    /// Seconds to wait for each reply
    #[arg(short = 't', long = "timeout", value_name = "SECS", default_value = "60", value_parser = parse_timeout)]
    timeout: Duration,

    #[command(subcommand)]
    cmd: Cmd,
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err("the timeout must be a positive number of seconds".into());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

/// The subcommand names are the JSON-RPC method names, as in rpc.py.
#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
enum Cmd {
    /// Show riser's version
    SpdkGetVersion,
    /// List the RPC methods riser serves
    RpcGetMethods(RpcGetMethods),
    /// Show the reactors (one per core of the core mask)
    FrameworkGetReactors,
    /// List the subsystems and what each depends on
    FrameworkGetSubsystems,
    /// Show the configuration calls of one subsystem
    FrameworkGetConfig(FrameworkGetConfig),
    /// Create a RAM-backed bdev
    BdevMallocCreate(BdevMallocCreate),
    /// Delete a malloc bdev
    BdevMallocDelete(BdevName),
    /// Create a bdev that discards writes and reads zeroes
    BdevNullCreate(BdevNullCreate),
    /// Delete a null bdev
    BdevNullDelete(BdevName),
    /// Create a bdev on a file or block device through io_uring (O_DIRECT)
    BdevUringCreate(BdevUringCreate),
    /// Delete a uring bdev
    BdevUringDelete(BdevName),
    /// Read a uring bdev's file or device size again (after it grew)
    BdevUringRescan(BdevName),
    /// Create a bdev on a file or block device (SPDK's AIO parameters; riser's io_uring engine)
    BdevAioCreate(BdevAioCreate),
    /// Delete an aio bdev
    BdevAioDelete(BdevName),
    /// Read an aio bdev's file or device size again (after it grew)
    BdevAioRescan(BdevName),
    /// List bdevs (all, or one by name)
    BdevGetBdevs(BdevGetBdevs),
    /// Attach a local NVMe controller (trtype PCIe, through the kernel's nvme driver): bdevs NAMEn<nsid>
    BdevNvmeAttachController(BdevNvmeAttachController),
    /// Detach an NVMe controller and delete its bdevs
    BdevNvmeDetachController(BdevName),
    /// List attached NVMe controllers (all, or one by name)
    BdevNvmeGetControllers(BdevNvmeGetControllers),
    /// Show I/O statistics of all bdevs or one (-c: per reactor); latency in ticks of tick_rate
    BdevGetIostat(BdevGetIostat),
    /// Reset I/O statistics of all bdevs or one (-m all|maxmin)
    BdevResetIostat(BdevResetIostat),
    /// Turn a bdev's latency histogram on (-e, the default) or off (-d)
    BdevEnableHistogram(BdevEnableHistogram),
    /// Show latency percentiles (µs) of a bdev's histogram
    BdevGetHistogram(BdevName),
    /// Connect to a Ceph cluster once, for RBD bdevs to share: NAME [--config-file F] [--config-param k=v]... [--key-file K]
    BdevRbdRegisterCluster(BdevRbdRegisterCluster),
    /// Disconnect a registered Ceph cluster (refused while an RBD bdev uses it)
    BdevRbdUnregisterCluster(BdevName),
    /// Show the registered Ceph clusters (all, or one with -b)
    BdevRbdGetClustersInfo(BdevRbdGetClustersInfo),
    /// Create a bdev on a Ceph RBD image: POOL_NAME RBD_NAME BLOCK_SIZE [-b NAME] [-c CLUSTER | --user-id ID --config k=v...]
    BdevRbdCreate(BdevRbdCreate),
    /// Delete an RBD bdev
    BdevRbdDelete(BdevName),
    /// Grow an RBD bdev and its image: NAME NEW_SIZE (MiB)
    BdevRbdResize(BdevRbdResize),
    /// Print the whole running configuration as JSON (input for load_config or riser --json;
    /// it holds CHAP secrets: -o writes it to a file only its owner can read)
    SaveConfig(SaveConfig),
    /// Replay a configuration made by save_config
    LoadConfig(LoadConfig),
    /// Set global iSCSI options (flags as in rpc.py; only those given change)
    IscsiSetOptions(IscsiSetOptions),
    /// Show the global iSCSI options
    IscsiGetOptions,
    /// Set CHAP authentication of discovery sessions (replaces the whole policy)
    IscsiSetDiscoveryAuth(IscsiSetDiscoveryAuth),
    /// Create a portal group: TAG 'HOST:PORT ...' (a portal HOST:PORT@iser is an iSER one)
    IscsiCreatePortalGroup(IscsiCreatePortalGroup),
    /// Start listening on the portals of a portal group created with --wait
    IscsiStartPortalGroup(IscsiTag),
    /// Delete a portal group
    IscsiDeletePortalGroup(IscsiTag),
    /// List the portal groups
    IscsiGetPortalGroups,
    /// Create an initiator group: TAG 'INITIATORS' 'NETMASKS'
    IscsiCreateInitiatorGroup(IscsiCreateInitiatorGroup),
    /// Add initiators and/or netmasks to an initiator group
    IscsiInitiatorGroupAddInitiators(IscsiChangeInitiatorGroup),
    /// Remove initiators and/or netmasks from an initiator group
    IscsiInitiatorGroupRemoveInitiators(IscsiChangeInitiatorGroup),
    /// Delete an initiator group
    IscsiDeleteInitiatorGroup(IscsiTag),
    /// List the initiator groups
    IscsiGetInitiatorGroups,
    /// Create a CHAP auth group: TAG [-c 'user:U secret:S muser:MU msecret:MS initiator_group:IG,user:U2 secret:S2']
    IscsiCreateAuthGroup(IscsiCreateAuthGroup),
    /// Delete an auth group
    IscsiDeleteAuthGroup(IscsiTag),
    /// List the auth groups (secrets included)
    IscsiGetAuthGroups,
    /// Add a CHAP secret to an auth group: TAG -u USER -s SECRET [-m MUSER -r MSECRET] [-i INITIATOR_GROUP]
    IscsiAuthGroupAddSecret(IscsiAuthGroupAddSecret),
    /// Remove a user's CHAP secret from an auth group: TAG -u USER
    IscsiAuthGroupRemoveSecret(IscsiAuthGroupRemoveSecret),
    /// Create a target node: NAME ALIAS 'BDEV:LUN ...' 'PG:IG ...' QUEUE_DEPTH
    IscsiCreateTargetNode(IscsiCreateTargetNode),
    /// Add a LUN to a target node (live sessions get a REPORTED LUNS DATA HAS CHANGED unit attention)
    IscsiTargetNodeAddLun(IscsiTargetNodeAddLun),
    /// Map a target node to more portal group / initiator group pairs: NAME 'PG:IG ...'
    IscsiTargetNodeAddPgIgMaps(IscsiNodeMaps),
    /// Unmap portal group / initiator group pairs from a target node: NAME 'PG:IG ...'
    IscsiTargetNodeRemovePgIgMaps(IscsiNodeMaps),
    /// Set CHAP authentication of a target node (replaces its whole policy)
    IscsiTargetNodeSetAuth(IscsiTargetNodeSetAuth),
    /// Delete a target node (its sessions are closed, its bdevs released)
    IscsiDeleteTargetNode(IscsiNodeName),
    /// Set a target node's ALUA target port groups: NAME 'TPG:STATE[:pref][:PORT,PORT]' ... (none: remove)
    IscsiTargetNodeSetAlua(IscsiTargetNodeSetAlua),
    /// Change the ALUA state of one target port group: NAME TPG STATE
    IscsiTargetNodeSetAluaState(IscsiTargetNodeSetAluaState),
    /// Fail back a target node's ALUA groups held after their gateway was fenced (manual failback)
    IscsiTargetNodeAluaFailback(IscsiNodeName),
    /// List the target nodes
    IscsiGetTargetNodes,
    /// List the live iSCSI connections
    IscsiGetConnections,
    /// Show iSCSI connection counts by state, logins by outcome, payload copies
    IscsiGetStats,
    /// Set the I/O buffer budget (bytes mapped for data buffers, in use and kept)
    IobufSetOptions(IobufSetOptions),
    /// Show the I/O buffer budget
    IobufGetOptions,
    /// Show the I/O buffer pool: mapped, in use, kept, waiting requests, reuse counts
    IobufGetStats,
    /// Set the log level: ERROR, WARNING (or WARN), NOTICE, INFO or DEBUG
    LogSetLevel(LogLevel),
    /// Show the log level
    LogGetLevel,
    /// Set the log level (riser has one log sink: the same level as log_set_level)
    LogSetPrintLevel(LogLevel),
    /// Show the log level (the same as log_get_level)
    LogGetPrintLevel,
    /// Call any method with optional JSON params
    Call(Call),
    /// Any other method name: METHOD ['{JSON params}']
    #[command(external_subcommand)]
    External(Vec<String>),
}

#[derive(Args, Serialize, Debug)]
struct RpcGetMethods {
    /// Only the methods allowed in the current state
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    current: bool,
    /// Include deprecated alias names
    #[arg(short = 'i', long)]
    #[serde(skip_serializing_if = "is_false")]
    include_aliases: bool,
}

/// log_set_level / log_set_print_level (riser checks the name).
#[derive(Args, Serialize, Debug)]
struct LogLevel {
    /// ERROR, WARNING (or WARN), NOTICE, INFO or DEBUG (any case)
    level: String,
}

#[derive(Args, Serialize, Debug)]
struct FrameworkGetConfig {
    /// Subsystem name (see framework_get_subsystems)
    name: String,
}

#[derive(Args, Debug)]
struct BdevMallocCreate {
    /// Bdev name (riser picks one when absent)
    #[arg(short = 'b', long)]
    name: Option<String>,
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    uuid: Option<Uuid>,
    /// Size in MiB
    total_size: f64,
    /// Block size in bytes (512 or 4096)
    block_size: u32,
}

impl BdevMallocCreate {
    fn params(self) -> Result<params::BdevMallocCreate, UsageError> {
        let num_blocks = num_blocks(self.total_size, self.block_size)?;
        Ok(params::BdevMallocCreate {
            name: self.name,
            num_blocks,
            block_size: self.block_size,
            uuid: self.uuid,
            ..Default::default()
        })
    }
}

#[derive(Args, Debug)]
struct BdevNullCreate {
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    uuid: Option<Uuid>,
    /// Bdev name
    name: String,
    /// Size in MiB
    total_size: f64,
    /// Block size in bytes (512 or 4096)
    block_size: u32,
}

impl BdevNullCreate {
    fn params(self) -> Result<params::BdevNullCreate, UsageError> {
        let num_blocks = num_blocks(self.total_size, self.block_size)?;
        Ok(params::BdevNullCreate {
            name: self.name,
            num_blocks,
            block_size: self.block_size,
            uuid: self.uuid,
            ..Default::default()
        })
    }
}

#[derive(Args, Debug)]
struct BdevUringCreate {
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    uuid: Option<Uuid>,
    /// Path to the file or block device (e.g. /dev/nvme0n1)
    filename: String,
    /// Bdev name
    name: String,
    /// Block size in bytes (512 or 4096; detected when absent)
    block_size: Option<u32>,
}

#[derive(Args, Debug)]
struct BdevAioCreate {
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    uuid: Option<Uuid>,
    /// Open the file or device read-only
    #[arg(short = 'r', long)]
    readonly: bool,
    /// Path to the file or block device
    filename: String,
    /// Bdev name
    name: String,
    /// Block size in bytes (512 or 4096; detected when absent)
    block_size: Option<u32>,
}

#[derive(Args, Debug)]
struct BdevNvmeAttachController {
    /// Name of the controller (its bdevs are NAMEn1, NAMEn2, ...)
    #[arg(short = 'b', long)]
    name: String,
    /// Transport type: PCIe
    #[arg(short = 't', long)]
    trtype: String,
    /// PCI address of the controller, e.g. 0000:00:04.0
    #[arg(short = 'a', long)]
    traddr: String,
}

#[derive(Args, Debug)]
struct BdevNvmeGetControllers {
    /// Name of one controller
    #[arg(short = 'n', long)]
    name: Option<String>,
}

#[derive(Args, Debug)]
struct BdevName {
    /// Bdev name
    name: String,
}

#[derive(Args, Debug)]
struct BdevGetBdevs {
    /// Only this bdev
    #[arg(short = 'b', long)]
    name: Option<String>,
}

// Statistics: bdev_get_iostat, bdev_reset_iostat, bdev_enable_histogram (rpc.py's flags).
#[derive(Args, Serialize, Debug)]
struct BdevGetIostat {
    /// Only this bdev
    #[arg(short = 'b', long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// Per reactor (needs -b)
    #[arg(short = 'c', long = "per-channel", requires = "name")]
    #[serde(skip_serializing_if = "is_false")]
    per_channel: bool,
}

#[derive(Args, Serialize, Debug)]
struct BdevResetIostat {
    /// Only this bdev
    #[arg(short = 'b', long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// What to reset: all (default) or maxmin (the min/max latencies only)
    #[arg(short = 'm', long, value_parser = ["all", "maxmin"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
}

#[derive(Args, Debug)]
struct BdevEnableHistogram {
    /// Turn it on (the default)
    #[arg(short = 'e', long = "enable", conflicts_with = "disable")]
    _enable: bool,
    /// Turn it off
    #[arg(short = 'd', long)]
    disable: bool,
    /// Bdev name
    name: String,
}

#[derive(Args, Debug)]
struct SaveConfig {
    /// Spaces per indentation level
    #[arg(short = 'i', long, default_value_t = 2)]
    indent: usize,
    /// Write to FILE, created with mode 0600 (the configuration holds CHAP secrets), instead
    /// of standard output; an existing FILE is replaced
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct LoadConfig {
    /// JSON file made by save_config (standard input when absent)
    #[arg(short = 'j', long = "json-conf", value_name = "FILE")]
    json_conf: Option<PathBuf>,
}

#[derive(Args, Debug, Serialize)]
struct IobufSetOptions {
    /// The budget in bytes (at least 33554432, the largest transfer)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_bytes: Option<u64>,
    /// SPDK's fields, for rpc.py habits: the budget becomes what these pools would hold
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    small_pool_count: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    large_pool_count: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    small_bufsize: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    large_bufsize: Option<u64>,
    /// The most of the budget one connection holds while it holds any (percent)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_buffer_share_percent: Option<u32>,
    /// The part of the budget kept for connections holding little (percent)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    buffer_reserve_percent: Option<u32>,
}

#[derive(Args, Debug)]
struct Call {
    /// Method name
    method: String,
    /// Params as one JSON object or array (none when absent)
    params: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

// ---- Ceph RBD (rpc.py's bdev_rbd_* arguments) ---------------------------------------------

/// `key=value` list arguments (rpc.py's --config-param / --config), as a JSON object.
fn key_values(items: &[String], what: &str) -> Result<Option<serde_json::Map<String, Value>>, UsageError> {
    if items.is_empty() {
        return Ok(None);
    }
    let mut m = serde_json::Map::new();
    for kv in items {
        let Some((k, v)) = kv.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(UsageError(format!("{what} {kv:?}: use key=value")));
        };
        m.insert(k.to_string(), Value::String(v.to_string()));
    }
    Ok(Some(m))
}

#[derive(Args, Debug)]
struct BdevRbdRegisterCluster {
    /// Name of the cluster registration
    name: String,
    /// Ceph id (admin, not client.admin)
    #[arg(long = "user-id")]
    user_id: Option<String>,
    /// A Ceph option key=value (repeatable), e.g. mon_host=127.0.0.1:3300 key=...
    #[arg(long = "config-param")]
    config_param: Vec<String>,
    /// Path of a ceph.conf
    #[arg(long = "config-file")]
    config_file: Option<String>,
    /// Path of a keyring
    #[arg(long = "key-file")]
    key_file: Option<String>,
}

impl BdevRbdRegisterCluster {
    fn params(self) -> Result<Value, UsageError> {
        let mut o = serde_json::Map::new();
        o.insert("name".into(), Value::String(self.name));
        let opt = |o: &mut serde_json::Map<String, Value>, k: &str, v: Option<String>| {
            if let Some(v) = v {
                o.insert(k.into(), Value::String(v));
            }
        };
        opt(&mut o, "user_id", self.user_id);
        if let Some(m) = key_values(&self.config_param, "--config-param")? {
            o.insert("config_param".into(), Value::Object(m));
        }
        opt(&mut o, "config_file", self.config_file);
        opt(&mut o, "key_file", self.key_file);
        Ok(Value::Object(o))
    }
}

#[derive(Args, Serialize, Debug)]
struct BdevRbdGetClustersInfo {
    /// Only this cluster
    #[arg(short = 'b', long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

#[derive(Args, Debug)]
struct BdevRbdCreate {
    /// Pool of the image
    pool_name: String,
    /// Image name
    rbd_name: String,
    /// Block size in bytes (512 or 4096)
    block_size: u32,
    /// Bdev name (default Ceph<n>)
    #[arg(short = 'b', long)]
    name: Option<String>,
    /// Ceph id, for a connection of the bdev's own (without -c)
    #[arg(long = "user-id")]
    user_id: Option<String>,
    /// A Ceph option key=value (repeatable), for a connection of the bdev's own
    #[arg(long = "config")]
    config: Vec<String>,
    /// A cluster registered with bdev_rbd_register_cluster
    #[arg(short = 'c', long = "cluster-name")]
    cluster_name: Option<String>,
    /// UUID of the bdev
    #[arg(short = 'u', long)]
    uuid: Option<Uuid>,
    /// riser: seconds a gateway exporting the image may go without answering before the
    /// others fence it (default 10)
    #[arg(long = "lease-s")]
    lease_s: Option<u32>,
}

impl BdevRbdCreate {
    fn params(self) -> Result<Value, UsageError> {
        let mut o = serde_json::Map::new();
        let opt = |o: &mut serde_json::Map<String, Value>, k: &str, v: Option<String>| {
            if let Some(v) = v {
                o.insert(k.into(), Value::String(v));
            }
        };
        opt(&mut o, "name", self.name);
        opt(&mut o, "user_id", self.user_id);
        o.insert("pool_name".into(), Value::String(self.pool_name));
        o.insert("rbd_name".into(), Value::String(self.rbd_name));
        o.insert("block_size".into(), Value::from(self.block_size));
        if let Some(m) = key_values(&self.config, "--config")? {
            o.insert("config".into(), Value::Object(m));
        }
        opt(&mut o, "cluster_name", self.cluster_name);
        opt(&mut o, "uuid", self.uuid.map(|u| u.to_string()));
        if let Some(l) = self.lease_s {
            o.insert("lease_s".into(), Value::from(l));
        }
        Ok(Value::Object(o))
    }
}

#[derive(Args, Serialize, Debug)]
struct BdevRbdResize {
    /// Bdev name
    name: String,
    /// New size in MiB (RBD bdevs only grow)
    new_size: u64,
}

// ---- ALUA (riser's extension) ------------------------------------------------------------

/// ALUA states as the RPCs name them.
const ALUA_STATES: [&str; 5] = ["active_optimized", "active_non_optimized", "standby", "unavailable", "transitioning"];

#[derive(Args, Debug)]
struct IscsiTargetNodeSetAlua {
    /// Target node name (full, or as given to iscsi_create_target_node)
    name: String,
    /// Target port groups, each TPG:STATE[:pref][:PORT,PORT...] (TPG: the portal group tag;
    /// STATE: active_optimized, active_non_optimized, standby, unavailable, transitioning;
    /// PORTs: relative target port ids, default the TPG)
    groups: Vec<String>,
    /// When a fenced gateway's groups are served again: auto (return to these states) or
    /// manual (stay failed over until iscsi_target_node_alua_failback); omitted: unchanged
    #[arg(long, value_parser = ["auto", "manual"])]
    failback: Option<String>,
}

impl IscsiTargetNodeSetAlua {
    fn params(self) -> Result<Value, UsageError> {
        let mut groups = Vec::new();
        for g in &self.groups {
            let bad = |why: &str| UsageError(format!("group {g:?}: {why} (TPG:STATE[:pref][:PORT,PORT])"));
            let mut parts = g.split(':');
            let tpg: u32 = parts.next().unwrap_or_default().parse().map_err(|_| bad("TPG is not a number"))?;
            let state = parts.next().ok_or_else(|| bad("no STATE"))?;
            if !ALUA_STATES.contains(&state) {
                return Err(bad(&format!("unknown STATE (one of {})", ALUA_STATES.join(", "))));
            }
            let mut o = serde_json::Map::new();
            o.insert("tpg_id".into(), tpg.into());
            o.insert("state".into(), state.into());
            for part in parts {
                if part == "pref" {
                    o.insert("pref".into(), true.into());
                } else {
                    let ports: Result<Vec<u32>, _> = part.split(',').map(str::parse::<u32>).collect();
                    let ports = ports.map_err(|_| bad(&format!("{part:?} is neither pref nor a list of port ids")))?;
                    o.insert("rel_port_ids".into(), ports.into());
                }
            }
            groups.push(Value::Object(o));
        }
        let mut v = serde_json::json!({"name": self.name, "groups": groups});
        if let (Some(f), Some(m)) = (self.failback, v.as_object_mut()) {
            m.insert("failback".into(), f.into());
        }
        Ok(v)
    }
}

#[derive(Args, Serialize, Debug)]
struct IscsiTargetNodeSetAluaState {
    /// Target node name
    name: String,
    /// Target port group (portal group tag)
    tpg_id: u32,
    /// active_optimized, active_non_optimized, standby, unavailable or transitioning
    state: String,
}

#[cfg(test)]
mod alua_cli_tests {
    use clap::{CommandFactory, FromArgMatches};
    use serde_json::json;

    use super::*;

    fn sent(args: &[&str]) -> Result<Option<Value>, String> {
        let argv = std::iter::once("riser-rpc").chain(args.iter().copied());
        let m = Cli::command().try_get_matches_from(argv).map_err(|e| e.to_string())?;
        let cli = Cli::from_arg_matches(&m).map_err(|e| e.to_string())?;
        match cli.cmd.into_action(args[0].to_string()) {
            Ok(Action::Call(_, p)) => Ok(p),
            Ok(_) => Err("not a call".into()),
            Err(UsageError(m)) => Err(m),
        }
    }

    #[test]
    fn alua_subcommands() {
        assert_eq!(
            sent(&["iscsi_target_node_set_alua", "gw", "1:active_optimized:pref", "2:standby:20,21"]),
            Ok(Some(json!({"name": "gw", "groups": [
                {"tpg_id": 1, "state": "active_optimized", "pref": true},
                {"tpg_id": 2, "state": "standby", "rel_port_ids": [20, 21]}]})))
        );
        assert_eq!(sent(&["iscsi_target_node_set_alua", "gw"]), Ok(Some(json!({"name": "gw", "groups": []}))));
        assert_eq!(
            sent(&["iscsi_target_node_set_alua", "gw", "--failback", "manual", "1:standby"]),
            Ok(Some(json!({"name": "gw", "groups": [{"tpg_id": 1, "state": "standby"}], "failback": "manual"})))
        );
        assert!(sent(&["iscsi_target_node_set_alua", "gw", "--failback", "never"]).is_err());
        assert_eq!(sent(&["iscsi_target_node_alua_failback", "gw"]), Ok(Some(json!({"name": "gw"}))));
        let e = sent(&["iscsi_target_node_set_alua", "gw", "1:offline"]).expect_err("unknown state");
        assert!(e.contains("unknown STATE"), "{e}");
        let e = sent(&["iscsi_target_node_set_alua", "gw", "x:standby"]).expect_err("bad tpg");
        assert!(e.contains("TPG is not a number"), "{e}");
        let e = sent(&["iscsi_target_node_set_alua", "gw", "1:standby:p"]).expect_err("bad part");
        assert!(e.contains("neither pref"), "{e}");
        assert_eq!(
            sent(&["iscsi_target_node_set_alua_state", "gw", "2", "standby"]),
            Ok(Some(json!({"name": "gw", "tpg_id": 2, "state": "standby"})))
        );
    }
}

#[cfg(test)]
mod rbd_cli_tests {
    use clap::{CommandFactory, FromArgMatches};
    use serde_json::json;

    use super::*;

    fn sent(args: &[&str]) -> Result<Option<Value>, String> {
        let argv = std::iter::once("riser-rpc").chain(args.iter().copied());
        let m = Cli::command().try_get_matches_from(argv).map_err(|e| e.to_string())?;
        let cli = Cli::from_arg_matches(&m).map_err(|e| e.to_string())?;
        match cli.cmd.into_action(m.subcommand_name().unwrap_or_default().to_string()) {
            Ok(Action::Call(_, p)) => Ok(p),
            Ok(_) => Err("not a call".into()),
            Err(UsageError(msg)) => Err(msg),
        }
    }

    #[test]
    fn rbd_subcommands_send_spdks_params() {
        assert_eq!(
            sent(&["bdev_rbd_register_cluster", "c0", "--config-file", "/x/ceph.conf", "--user-id", "admin"]).unwrap(),
            Some(json!({"name": "c0", "user_id": "admin", "config_file": "/x/ceph.conf"}))
        );
        assert_eq!(
            sent(&["bdev_rbd_register_cluster", "c1", "--config-param", "mon_host=127.0.0.1:13300", "--config-param", "key=AQ=="]).unwrap(),
            Some(json!({"name": "c1", "config_param": {"mon_host": "127.0.0.1:13300", "key": "AQ=="}}))
        );
        assert!(sent(&["bdev_rbd_register_cluster", "c1", "--config-param", "novalue"]).unwrap_err().contains("key=value"));
        assert_eq!(
            sent(&["bdev_rbd_create", "rbd", "img", "4096", "-b", "Ceph0", "-c", "c0"]).unwrap(),
            Some(json!({"name": "Ceph0", "pool_name": "rbd", "rbd_name": "img", "block_size": 4096, "cluster_name": "c0"}))
        );
        assert_eq!(
            sent(&["bdev_rbd_create", "rbd", "img", "512", "--config", "mon_host=h"]).unwrap(),
            Some(json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 512, "config": {"mon_host": "h"}}))
        );
        assert_eq!(
            sent(&["bdev_rbd_create", "rbd", "img", "512", "-c", "c0", "--lease-s", "20"]).unwrap(),
            Some(json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 512, "cluster_name": "c0", "lease_s": 20}))
        );
        assert!(sent(&["bdev_rbd_create", "rbd", "img", "big"]).is_err());
        assert_eq!(sent(&["bdev_rbd_delete", "Ceph0"]).unwrap(), Some(json!({"name": "Ceph0"})));
        assert_eq!(sent(&["bdev_rbd_unregister_cluster", "c0"]).unwrap(), Some(json!({"name": "c0"})));
        assert_eq!(sent(&["bdev_rbd_resize", "Ceph0", "128"]).unwrap(), Some(json!({"name": "Ceph0", "new_size": 128})));
        assert_eq!(sent(&["bdev_rbd_get_clusters_info"]).unwrap(), None);
        assert_eq!(sent(&["bdev_rbd_get_clusters_info", "-b", "c0"]).unwrap(), Some(json!({"name": "c0"})));
    }
}

// ---- iSCSI ------------------------------------------------------------------------------

/// Splits an rpc.py-style list argument: items separated by whitespace (rpc.py's form,
/// `'a b'`) and/or commas (`a,b`). Empty items are dropped, so `''` is an empty list.
fn split_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| c.is_whitespace() || c == ',').filter(|t| !t.is_empty())
}

/// A list argument parsed into items: one command-line argument, sent as a JSON array.
#[derive(Clone, Debug, PartialEq, Eq)]
struct List<T>(Vec<T>);

/// A portal group / initiator group tag: a whole number (the server checks its range).
fn parse_tag(s: &str) -> Result<u32, String> {
    s.trim().parse::<u32>().map_err(|_| format!("{s:?} is not a tag (a whole number, 1 or more)"))
}

/// One portal of `iscsi_create_portal_group` as typed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PortalArg {
    host: String,
    /// A string, as rpc.py sends it.
    port: String,
    iser: bool,
    /// rpc.py's old `@CPUMASK` suffix, accepted and ignored (with a warning) as rpc.py does.
    ignored_cpumask: Option<String>,
}

impl PortalArg {
    /// What is sent (the CPU mask is not).
    fn param(&self) -> PortalParam {
        PortalParam { host: self.host.clone(), port: PortParam(self.port.clone()), iser: self.iser }
    }
}

/// `HOST:PORT`, `[IPv6]:PORT`, with an optional `@iser` suffix (riser's extension: an iSER
/// portal). The port is after the last colon, as rpc.py splits it; an IPv6 host must be in
/// brackets so that split is not ambiguous.
fn parse_portal(item: &str) -> Result<PortalArg, String> {
    let (addr, suffix) = match item.split_once('@') {
        Some((a, s)) => (a, Some(s)),
        None => (item, None),
    };
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("portal {item:?} is not HOST:PORT (e.g. 127.0.0.1:3260 or [::1]:3260)"))?;
    if host.is_empty() {
        return Err(format!("portal {item:?} has no host (e.g. 127.0.0.1:3260 or [::1]:3260)"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!("portal {item:?}: an IPv6 host must be in brackets, e.g. [::1]:3260"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("portal {item:?}: {port:?} is not a port number (1..=65535)")),
    }
    let (iser, ignored_cpumask) = match suffix {
        None => (false, None),
        Some(s) if s.eq_ignore_ascii_case("iser") => (true, None),
        Some("") => return Err(format!("portal {item:?}: nothing after '@' (only @iser is known)")),
        // rpc.py's HOST:PORT@CPUMASK: a mask is a number (0x3, 3) or a list ([0,1]).
        Some(s) if s.starts_with("0x") || s.starts_with('[') || s.bytes().all(|b| b.is_ascii_digit()) => {
            (false, Some(s.to_string()))
        }
        Some(s) => return Err(format!("portal {item:?}: unknown suffix @{s} (only @iser is known)")),
    };
    Ok(PortalArg { host: host.to_string(), port: port.to_string(), iser, ignored_cpumask })
}

/// A list of portals: `'HOST:PORT HOST:PORT'` or `HOST:PORT,HOST:PORT`.
fn parse_portals(s: &str) -> Result<List<PortalArg>, String> {
    split_list(s).map(parse_portal).collect::<Result<_, _>>().map(List)
}

/// `'BDEV:LUN BDEV:LUN'` (rpc.py's form), each optionally followed by riser's LUN options
/// `:removable` and `:read_only`; the LUN id is after the last colon that is not an option.
fn parse_luns(s: &str) -> Result<List<LunParam>, String> {
    split_list(s)
        .map(|item| {
            let (mut rest, mut removable, mut read_only) = (item, false, false);
            loop {
                match rest.rsplit_once(':') {
                    Some((r, "removable")) => (rest, removable) = (r, true),
                    Some((r, "read_only")) => (rest, read_only) = (r, true),
                    _ => break,
                }
            }
            let (bdev, id) =
                rest.rsplit_once(':').ok_or_else(|| format!("LUN {item:?} is not BDEV:LUN_ID (e.g. Malloc0:0)"))?;
            if bdev.is_empty() {
                return Err(format!("LUN {item:?} has no bdev name (BDEV:LUN_ID, e.g. Malloc0:0)"));
            }
            let lun_id = id
                .parse::<u32>()
                .map_err(|_| format!("LUN {item:?}: {id:?} is not a LUN id (a whole number, 0 or more)"))?;
            Ok(LunParam { bdev_name: bdev.to_string(), lun_id, removable, read_only })
        })
        .collect::<Result<_, _>>()
        .map(List)
}

/// `'PG:IG PG:IG'` (rpc.py's form), e.g. `'1:1 2:1'`.
fn parse_pg_ig_maps(s: &str) -> Result<List<PgIgMap>, String> {
    split_list(s)
        .map(|item| {
            let bad = || format!("map {item:?} is not PG_TAG:IG_TAG (two whole numbers, e.g. 1:1)");
            let (pg, ig) = item.split_once(':').ok_or_else(bad)?;
            Ok(PgIgMap { pg_tag: pg.parse().map_err(|_| bad())?, ig_tag: ig.parse().map_err(|_| bad())? })
        })
        .collect::<Result<_, _>>()
        .map(List)
}

/// `'A B'` as a list of words (initiator names, netmasks).
fn parse_words(s: &str) -> Result<List<String>, String> {
    Ok(List(split_list(s).map(str::to_string).collect()))
}

#[derive(Args, Debug)]
struct IscsiSetOptions {
    /// Path of the CHAP secret file
    #[arg(short = 'f', long)]
    auth_file: Option<String>,
    /// Prefix of target node names given without iqn./eui./naa.
    #[arg(short = 'b', long)]
    node_base: Option<String>,
    /// Seconds an initiator has to answer a NOP-In
    #[arg(short = 'o', long)]
    nop_timeout: Option<u32>,
    /// Seconds between NOP-Ins sent by the target
    #[arg(short = 'n', long)]
    nop_in_interval: Option<u32>,
    /// No CHAP for discovery sessions (exclusive with --require-chap)
    #[arg(short = 'd', long, conflicts_with = "require_chap")]
    disable_chap: bool,
    /// CHAP required for discovery sessions (exclusive with --disable-chap)
    #[arg(short = 'r', long)]
    require_chap: bool,
    /// Mutual CHAP for discovery sessions
    #[arg(short = 'm', long)]
    mutual_chap: bool,
    /// Authentication group of discovery sessions
    #[arg(short = 'g', long)]
    chap_group: Option<u32>,
    /// Most sessions in the target
    #[arg(short = 'a', long)]
    max_sessions: Option<u32>,
    /// Most outstanding commands per queue
    #[arg(short = 'q', long)]
    max_queue_depth: Option<u32>,
    /// MaxConnections offered
    #[arg(short = 'c', long)]
    max_connections_per_session: Option<u32>,
    /// DefaultTime2Wait offered
    #[arg(short = 'w', long)]
    default_time2wait: Option<u32>,
    /// DefaultTime2Retain offered
    #[arg(short = 'v', long)]
    default_time2retain: Option<u32>,
    /// FirstBurstLength offered
    #[arg(short = 's', long)]
    first_burst_length: Option<u32>,
    /// ImmediateData=Yes offered
    #[arg(short = 'i', long, conflicts_with = "no_immediate_data")]
    immediate_data: bool,
    /// ImmediateData=No offered (riser's addition; rpc.py can only turn it on)
    #[arg(long)]
    no_immediate_data: bool,
    /// ErrorRecoveryLevel offered
    #[arg(short = 'l', long)]
    error_recovery_level: Option<u32>,
    /// Allow an initiator several sessions with the same ISID
    #[arg(short = 'p', long)]
    allow_duplicated_isid: bool,
    /// Most outstanding split reads per connection
    #[arg(short = 'x', long)]
    max_large_datain_per_connection: Option<u32>,
    /// MaxOutstandingR2T offered
    #[arg(short = 'k', long)]
    max_r2t_per_connection: Option<u32>,
    /// PDU pool size (accepted for SPDK compatibility)
    #[arg(short = 'u', long)]
    pdu_pool_size: Option<u32>,
    /// Immediate data buffer pool size (accepted for SPDK compatibility)
    #[arg(short = 'j', long)]
    immediate_data_pool_size: Option<u32>,
    /// Data-Out buffer pool size (accepted for SPDK compatibility)
    #[arg(short = 'z', long)]
    data_out_pool_size: Option<u32>,
    /// Bytes a connection may queue for sending outside the I/O buffers before it stops
    /// reading (riser's extension)
    #[arg(long)]
    max_tx_queue_bytes: Option<u32>,
    /// Seconds a write's data may be overdue before its command fails (riser's extension)
    #[arg(long)]
    data_out_timeout: Option<u32>,
    /// Seconds a login may take (riser)
    #[arg(long)]
    login_timeout: Option<u32>,
    /// Most logins in progress (riser)
    #[arg(long)]
    max_logins: Option<u32>,
    /// Most logins in progress from one source address (riser)
    #[arg(long)]
    max_logins_per_source: Option<u32>,
    /// Most discovery sessions (riser)
    #[arg(long)]
    max_discovery_sessions: Option<u32>,
    /// Most discovery sessions from one source address, an IPv6 /64 counting as one (riser)
    #[arg(long)]
    max_discovery_sessions_per_source: Option<u32>,
}

impl IscsiSetOptions {
    /// Only what was given is sent: each key present replaces the current value. Unlike
    /// rpc.py, a given 0 is sent too (rpc.py drops it, so it cannot set e.g. an
    /// error_recovery_level of 0).
    fn params(self) -> params::IscsiSetOptions {
        let flag = |b: bool| b.then_some(true);
        params::IscsiSetOptions {
            auth_file: self.auth_file,
            node_base: self.node_base,
            nop_timeout: self.nop_timeout,
            nop_in_interval: self.nop_in_interval,
            disable_chap: flag(self.disable_chap),
            require_chap: flag(self.require_chap),
            mutual_chap: flag(self.mutual_chap),
            chap_group: self.chap_group,
            max_sessions: self.max_sessions,
            max_connections_per_session: self.max_connections_per_session,
            max_queue_depth: self.max_queue_depth,
            default_time2wait: self.default_time2wait,
            default_time2retain: self.default_time2retain,
            first_burst_length: self.first_burst_length,
            immediate_data: if self.no_immediate_data { Some(false) } else { flag(self.immediate_data) },
            error_recovery_level: self.error_recovery_level,
            allow_duplicated_isid: flag(self.allow_duplicated_isid),
            max_large_datain_per_connection: self.max_large_datain_per_connection,
            max_r2t_per_connection: self.max_r2t_per_connection,
            pdu_pool_size: self.pdu_pool_size,
            immediate_data_pool_size: self.immediate_data_pool_size,
            data_out_pool_size: self.data_out_pool_size,
            max_tx_queue_bytes: self.max_tx_queue_bytes,
            data_out_timeout: self.data_out_timeout,
            login_timeout: self.login_timeout,
            max_logins: self.max_logins,
            max_logins_per_source: self.max_logins_per_source,
            max_discovery_sessions: self.max_discovery_sessions,
            max_discovery_sessions_per_source: self.max_discovery_sessions_per_source,
        }
    }
}

#[derive(Args, Debug)]
struct IscsiTag {
    /// Group tag (a whole number, 1 or more)
    #[arg(value_parser = parse_tag)]
    tag: u32,
}

#[derive(Args, Debug)]
struct IscsiCreatePortalGroup {
    /// Portal group tag (a whole number, 1 or more)
    #[arg(value_parser = parse_tag)]
    tag: u32,
    // `help` rather than a doc comment: rustdoc would take [::1] for a link.
    #[arg(
        value_name = "HOST:PORT[@iser]",
        required = true,
        num_args = 1..,
        value_parser = parse_portals,
        help = "Portals, HOST:PORT separated by spaces or commas, IPv6 in brackets; a suffix @iser makes \
                an iSER portal. E.g. '127.0.0.1:3260 [::1]:3260' or 192.0.2.1:3260@iser"
    )]
    portals: Vec<List<PortalArg>>,
    /// Private group: its portals are not returned by discovery (SendTargets)
    #[arg(short = 'p', long)]
    private: bool,
    /// Do not listen until iscsi_start_portal_group
    #[arg(short = 'w', long)]
    wait: bool,
}

impl IscsiCreatePortalGroup {
    /// Several list arguments (`a b` given as two arguments, or `'a b'` as one) are sent as
    /// one list.
    fn params(&self) -> params::IscsiCreatePortalGroup {
        params::IscsiCreatePortalGroup {
            tag: self.tag,
            portals: self.portals.iter().flat_map(|l| &l.0).map(PortalArg::param).collect(),
            private: self.private,
            wait: self.wait,
        }
    }
}

#[derive(Args, Debug)]
struct IscsiCreateInitiatorGroup {
    /// Initiator group tag (a whole number, 1 or more)
    #[arg(value_parser = parse_tag)]
    tag: u32,
    /// Initiator names separated by spaces, e.g. 'ANY' or 'iqn.2016-06.io.spdk:host1 !iqn.2016-06.io.spdk:host2'
    #[arg(value_name = "INITIATORS", value_parser = parse_words)]
    initiators: List<String>,
    #[arg(
        value_name = "NETMASKS",
        value_parser = parse_words,
        help = "Netmasks separated by spaces, e.g. 'ANY' or '192.168.1.0/24 [::1]/128'"
    )]
    netmasks: List<String>,
}

impl IscsiCreateInitiatorGroup {
    fn params(self) -> params::IscsiCreateInitiatorGroup {
        params::IscsiCreateInitiatorGroup { tag: self.tag, initiators: self.initiators.0, netmasks: self.netmasks.0 }
    }
}

#[derive(Args, Debug)]
struct IscsiChangeInitiatorGroup {
    /// Initiator group tag
    #[arg(value_parser = parse_tag)]
    tag: u32,
    /// Initiator names separated by spaces
    #[arg(short = 'n', long, value_name = "INITIATORS", value_parser = parse_words)]
    initiators: Option<List<String>>,
    /// Netmasks separated by spaces
    #[arg(short = 'm', long, value_name = "NETMASKS", value_parser = parse_words)]
    netmasks: Option<List<String>>,
}

impl IscsiChangeInitiatorGroup {
    fn params(self) -> params::IscsiChangeInitiatorGroup {
        params::IscsiChangeInitiatorGroup {
            tag: self.tag,
            initiators: self.initiators.map(|l| l.0),
            netmasks: self.netmasks.map(|l| l.0),
        }
    }
}

#[derive(Args, Debug)]
struct IscsiCreateTargetNode {
    /// Target node name: a full iqn./eui./naa. name, or a short one put after node_base
    name: String,
    /// Target alias
    alias_name: String,
    /// LUNs, BDEV:LUN_ID separated by spaces, e.g. 'Malloc0:0 Malloc1:1'; riser's LUN options
    /// follow as ':removable' (a removable medium) and ':read_only' (write-protected), e.g.
    /// 'Malloc0:0 Malloc1:1:removable'
    #[arg(value_name = "BDEV:LUN ...", value_parser = parse_luns)]
    luns: List<LunParam>,
    /// Portal group to initiator group maps, PG_TAG:IG_TAG separated by spaces, e.g. '1:1 2:1'
    #[arg(value_name = "PG:IG ...", value_parser = parse_pg_ig_maps)]
    pg_ig_maps: List<PgIgMap>,
    /// Most outstanding commands per session
    queue_depth: u32,
    /// CHAP disabled for this node (exclusive with --require-chap)
    #[arg(short = 'd', long, conflicts_with = "require_chap")]
    disable_chap: bool,
    /// CHAP required for this node
    #[arg(short = 'r', long)]
    require_chap: bool,
    /// Mutual (bidirectional) CHAP
    #[arg(short = 'm', long)]
    mutual_chap: bool,
    /// Authentication group of this node
    #[arg(short = 'g', long)]
    chap_group: Option<u32>,
    /// Require HeaderDigest=CRC32C
    #[arg(short = 'H', long)]
    header_digest: bool,
    /// Require DataDigest=CRC32C
    #[arg(short = 'D', long)]
    data_digest: bool,
}

impl IscsiCreateTargetNode {
    fn params(self) -> params::IscsiCreateTargetNode {
        params::IscsiCreateTargetNode {
            name: self.name,
            alias_name: Some(self.alias_name),
            pg_ig_maps: self.pg_ig_maps.0,
            luns: self.luns.0,
            queue_depth: Some(self.queue_depth),
            disable_chap: self.disable_chap,
            require_chap: self.require_chap,
            mutual_chap: self.mutual_chap,
            chap_group: self.chap_group,
            header_digest: self.header_digest,
            data_digest: self.data_digest,
        }
    }
}

#[derive(Args, Debug)]
struct IscsiTargetNodeAddLun {
    /// Target node name (full, or as given to iscsi_create_target_node)
    name: String,
    /// Bdev to export
    bdev_name: String,
    /// LUN id (the lowest free one when absent or -1)
    #[arg(short = 'i', long, allow_negative_numbers = true)]
    lun_id: Option<i64>,
    /// riser's extension: report a removable medium (PREVENT ALLOW MEDIUM REMOVAL, START STOP
    /// UNIT eject and load)
    #[arg(long)]
    removable: bool,
    /// riser's extension: the LUN is write-protected (writes fail with DATA PROTECT)
    #[arg(long)]
    read_only: bool,
}

impl IscsiTargetNodeAddLun {
    fn params(self) -> params::IscsiTargetNodeAddLun {
        params::IscsiTargetNodeAddLun {
            name: self.name,
            bdev_name: self.bdev_name,
            lun_id: self.lun_id,
            removable: self.removable,
            read_only: self.read_only,
        }
    }
}

#[derive(Args, Debug)]
struct IscsiNodeMaps {
    /// Target node name
    name: String,
    /// PG_TAG:IG_TAG pairs separated by spaces, e.g. '1:1 2:1'
    #[arg(value_name = "PG:IG ...", value_parser = parse_pg_ig_maps)]
    pg_ig_maps: List<PgIgMap>,
}

#[derive(Args, Debug)]
struct IscsiNodeName {
    /// Target node name, e.g. iqn.2016-06.io.riser:disk1
    name: String,
}

// ---- CHAP ---------------------------------------------------------------------------------

#[derive(Args, Debug)]
struct IscsiSetDiscoveryAuth {
    /// No CHAP for discovery sessions (exclusive with --require-chap)
    #[arg(short = 'd', long, conflicts_with = "require_chap")]
    disable_chap: bool,
    /// CHAP required for discovery sessions (exclusive with --disable-chap)
    #[arg(short = 'r', long)]
    require_chap: bool,
    /// Mutual CHAP for discovery sessions (needs --require-chap)
    #[arg(short = 'm', long)]
    mutual_chap: bool,
    /// Auth group of discovery sessions
    #[arg(short = 'g', long, value_name = "TAG", value_parser = parse_tag)]
    chap_group: Option<u32>,
}

impl IscsiSetDiscoveryAuth {
    fn params(self) -> params::IscsiSetDiscoveryAuth {
        params::IscsiSetDiscoveryAuth {
            disable_chap: self.disable_chap,
            require_chap: self.require_chap,
            mutual_chap: self.mutual_chap,
            chap_group: self.chap_group.unwrap_or(0),
        }
    }
}

#[derive(Args, Debug)]
struct IscsiTargetNodeSetAuth {
    /// Target node name (full, or as given to iscsi_create_target_node)
    name: String,
    /// Auth group of this node
    #[arg(short = 'g', long, value_name = "TAG", value_parser = parse_tag)]
    chap_group: Option<u32>,
    /// CHAP disabled for this node (exclusive with --require-chap)
    #[arg(short = 'd', long, conflicts_with = "require_chap")]
    disable_chap: bool,
    /// CHAP required for this node
    #[arg(short = 'r', long)]
    require_chap: bool,
    /// Mutual (bidirectional) CHAP (needs --require-chap)
    #[arg(short = 'm', long)]
    mutual_chap: bool,
}

impl IscsiTargetNodeSetAuth {
    fn params(self) -> params::IscsiTargetNodeSetAuth {
        params::IscsiTargetNodeSetAuth {
            name: self.name,
            chap_group: self.chap_group.unwrap_or(0),
            disable_chap: self.disable_chap,
            require_chap: self.require_chap,
            mutual_chap: self.mutual_chap,
        }
    }
}

/// Secrets are parsed after clap, by [`parse_secrets`], so that no error message (clap's
/// quote the value) shows them.
#[derive(Args)]
struct IscsiCreateAuthGroup {
    /// Auth group tag (a whole number, 1 or more)
    #[arg(value_parser = parse_tag)]
    tag: u32,
    /// CHAP secrets, rpc.py's form: 'user:U1 secret:S1 muser:MU1 msecret:MS1,user:U2 secret:S2'
    /// (comma-separated; muser/msecret for mutual CHAP; riser's initiator_group:IG binds the user
    /// to that initiator group's names). A secret may hold ':', not a space or ','
    #[arg(short = 'c', long, value_name = "SECRETS")]
    secrets: Option<String>,
}

impl std::fmt::Debug for IscsiCreateAuthGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiCreateAuthGroup").field("tag", &self.tag).finish_non_exhaustive()
    }
}

impl IscsiCreateAuthGroup {
    fn params(self) -> Result<params::IscsiCreateAuthGroup, UsageError> {
        let secrets = parse_secrets(self.secrets.as_deref().unwrap_or_default())?;
        Ok(params::IscsiCreateAuthGroup { tag: self.tag, secrets })
    }
}

/// rpc.py's `-c` secrets: items separated by commas, each `KEY:VALUE` words separated by
/// whitespace, keys `user`, `secret` (both required), `muser`, `msecret`, and riser's
/// `initiator_group` (a tag); a value runs from
/// the first ':' (rpc.py refuses a ':' in it). An empty text is no secrets. Errors name the
/// item and word, never a value.
fn parse_secrets(text: &str) -> Result<Vec<params::AuthSecretParam>, UsageError> {
    let items = text.split(',').map(str::trim).filter(|i| !i.is_empty());
    let mut out = Vec::new();
    for (n, item) in items.enumerate() {
        let n = n + 1;
        let (mut user, mut secret, mut muser, mut msecret, mut ig) = (None, None, None, None, None);
        for (w, word) in item.split_whitespace().enumerate() {
            let w = w + 1;
            let bad = |what: &str| UsageError(format!("--secrets item {n}, word {w}: {what}"));
            let (key, value) =
                word.split_once(':').ok_or_else(|| bad("not KEY:VALUE (user:, secret:, muser:, msecret:, initiator_group:)"))?;
            let slot = match key {
                "user" => &mut user,
                "secret" => &mut secret,
                "muser" => &mut muser,
                "msecret" => &mut msecret,
                "initiator_group" => &mut ig,
                _ => return Err(bad("unknown key (user, secret, muser, msecret or initiator_group)")),
            };
            if slot.replace(value.to_string()).is_some() {
                return Err(bad(&format!("{key} given twice")));
            }
        }
        let missing = |key: &str| UsageError(format!("--secrets item {n}: no {key}:"));
        let user = user.ok_or_else(|| missing("user"))?;
        let secret = secret.ok_or_else(|| missing("secret"))?;
        let initiator_group = match ig {
            None => None,
            Some(t) => Some(parse_tag(&t).map_err(|_| UsageError(format!("--secrets item {n}: initiator_group: not a tag")))?),
        };
        out.push(params::AuthSecretParam {
            user,
            secret: secret.into(),
            muser,
            msecret: msecret.map(Into::into),
            initiator_group,
        });
    }
    Ok(out)
}

#[derive(Args)]
struct IscsiAuthGroupAddSecret {
    /// Auth group tag
    #[arg(value_parser = parse_tag)]
    tag: u32,
    /// CHAP user name of the initiator (CHAP_N)
    #[arg(short = 'u', long)]
    user: String,
    /// CHAP secret of that user
    #[arg(short = 's', long)]
    secret: String,
    /// User name the target answers mutual CHAP with (needs --msecret)
    #[arg(short = 'm', long)]
    muser: Option<String>,
    /// Secret the target answers mutual CHAP with (needs --muser)
    #[arg(short = 'r', long)]
    msecret: Option<String>,
    /// riser's extension: the user may log in only as an initiator name this initiator group admits
    #[arg(short = 'i', long, value_parser = parse_tag)]
    initiator_group: Option<u32>,
}

impl std::fmt::Debug for IscsiAuthGroupAddSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiAuthGroupAddSecret")
            .field("tag", &self.tag)
            .field("user", &self.user)
            .field("muser", &self.muser)
            .finish_non_exhaustive()
    }
}

impl IscsiAuthGroupAddSecret {
    fn params(self) -> params::IscsiAuthGroupAddSecret {
        params::IscsiAuthGroupAddSecret {
            tag: self.tag,
            user: self.user,
            secret: self.secret.into(),
            muser: self.muser,
            msecret: self.msecret.map(Into::into),
            initiator_group: self.initiator_group,
        }
    }
}

#[derive(Args, Debug)]
struct IscsiAuthGroupRemoveSecret {
    /// Auth group tag
    #[arg(value_parser = parse_tag)]
    tag: u32,
    /// CHAP user name whose secret goes
    #[arg(short = 'u', long)]
    user: String,
}

/// What to do once the command line is understood.
enum Action {
    /// One call: its result is printed.
    Call(String, Option<Value>),
    /// `output`: a file written with mode 0600 instead of standard output.
    SaveConfig { indent: usize, output: Option<PathBuf> },
    LoadConfig { file: Option<PathBuf> },
}

/// A mistake in the command line that clap cannot see (exit 2).
struct UsageError(String);

impl Cmd {
    /// `method` is the subcommand name as typed, i.e. the JSON-RPC method name.
    fn into_action(self, method: String) -> Result<Action, UsageError> {
        let params = match self {
            Cmd::SpdkGetVersion | Cmd::FrameworkGetReactors | Cmd::FrameworkGetSubsystems => None,
            Cmd::RpcGetMethods(a) => to_params(&a)?,
            Cmd::FrameworkGetConfig(a) => to_params(&a)?,
            Cmd::BdevMallocCreate(a) => to_params(&a.params()?)?,
            Cmd::BdevMallocDelete(a)
            | Cmd::BdevNullDelete(a)
            | Cmd::BdevUringDelete(a)
            | Cmd::BdevUringRescan(a)
            | Cmd::BdevAioDelete(a)
            | Cmd::BdevAioRescan(a) => to_params(&ByName { name: a.name })?,
            Cmd::BdevUringCreate(a) => to_params(&params::BdevUringCreate {
                name: a.name,
                filename: a.filename,
                block_size: a.block_size,
                uuid: a.uuid,
            })?,
            Cmd::BdevAioCreate(a) => to_params(&params::BdevAioCreate {
                name: a.name,
                filename: a.filename,
                block_size: a.block_size,
                readonly: a.readonly,
                uuid: a.uuid,
                ..Default::default()
            })?,
            Cmd::BdevNullCreate(a) => to_params(&a.params()?)?,
            Cmd::BdevGetBdevs(a) => to_params(&params::BdevGetBdevs { name: a.name, ..Default::default() })?,
            Cmd::BdevNvmeAttachController(a) => to_params(&params::BdevNvmeAttachController {
                name: a.name,
                trtype: a.trtype,
                traddr: a.traddr,
                ..Default::default()
            })?,
            Cmd::BdevNvmeDetachController(a) => {
                to_params(&params::BdevNvmeDetachController { name: a.name, ..Default::default() })?
            }
            Cmd::BdevNvmeGetControllers(a) => to_params(&params::BdevNvmeGetControllers { name: a.name })?,
            Cmd::BdevGetIostat(a) => to_params(&a)?,
            Cmd::BdevResetIostat(a) => to_params(&a)?,
            Cmd::BdevEnableHistogram(a) => to_params(&serde_json::json!({"name": a.name, "enable": !a.disable}))?,
            Cmd::BdevGetHistogram(a) => to_params(&ByName { name: a.name })?,
            Cmd::BdevRbdRegisterCluster(a) => to_params(&a.params()?)?,
            Cmd::BdevRbdUnregisterCluster(a) | Cmd::BdevRbdDelete(a) => to_params(&ByName { name: a.name })?,
            Cmd::BdevRbdGetClustersInfo(a) => to_params(&a)?,
            Cmd::BdevRbdCreate(a) => to_params(&a.params()?)?,
            Cmd::BdevRbdResize(a) => to_params(&a)?,
            Cmd::IscsiGetOptions
            | Cmd::IscsiGetPortalGroups
            | Cmd::IscsiGetInitiatorGroups
            | Cmd::IscsiGetAuthGroups
            | Cmd::IscsiGetTargetNodes
            | Cmd::IscsiGetConnections
            | Cmd::IscsiGetStats
            | Cmd::IobufGetOptions
            | Cmd::IobufGetStats => None,
            Cmd::IobufSetOptions(a) => to_params(&a)?,
            Cmd::LogGetLevel | Cmd::LogGetPrintLevel => None,
            Cmd::LogSetLevel(a) | Cmd::LogSetPrintLevel(a) => to_params(&a)?,
            Cmd::IscsiSetOptions(a) => to_params(&a.params())?,
            Cmd::IscsiCreatePortalGroup(a) => {
                for p in a.portals.iter().flat_map(|l| &l.0) {
                    if let Some(mask) = &p.ignored_cpumask {
                        eprintln!("warning: {}:{}: a portal CPU mask (@{mask}) is no longer supported; ignoring it", p.host, p.port);
                    }
                }
                to_params(&a.params())?
            }
            Cmd::IscsiStartPortalGroup(a)
            | Cmd::IscsiDeletePortalGroup(a)
            | Cmd::IscsiDeleteInitiatorGroup(a)
            | Cmd::IscsiDeleteAuthGroup(a) => to_params(&ByTag { tag: a.tag })?,
            Cmd::IscsiSetDiscoveryAuth(a) => to_params(&a.params())?,
            Cmd::IscsiCreateAuthGroup(a) => to_params(&a.params()?)?,
            Cmd::IscsiAuthGroupAddSecret(a) => to_params(&a.params())?,
            Cmd::IscsiAuthGroupRemoveSecret(a) => {
                to_params(&params::IscsiAuthGroupRemoveSecret { tag: a.tag, user: a.user })?
            }
            Cmd::IscsiTargetNodeSetAuth(a) => to_params(&a.params())?,
            Cmd::IscsiCreateInitiatorGroup(a) => to_params(&a.params())?,
            Cmd::IscsiInitiatorGroupAddInitiators(a) | Cmd::IscsiInitiatorGroupRemoveInitiators(a) => to_params(&a.params())?,
            Cmd::IscsiCreateTargetNode(a) => to_params(&a.params())?,
            Cmd::IscsiTargetNodeAddLun(a) => to_params(&a.params())?,
            Cmd::IscsiTargetNodeAddPgIgMaps(a) | Cmd::IscsiTargetNodeRemovePgIgMaps(a) => {
                to_params(&params::IscsiNodeMaps { name: a.name, pg_ig_maps: a.pg_ig_maps.0 })?
            }
            Cmd::IscsiDeleteTargetNode(a) => to_params(&ByName { name: a.name })?,
            Cmd::IscsiTargetNodeSetAlua(a) => to_params(&a.params()?)?,
            Cmd::IscsiTargetNodeSetAluaState(a) => to_params(&a)?,
            Cmd::IscsiTargetNodeAluaFailback(a) => to_params(&ByName { name: a.name })?,
            Cmd::SaveConfig(a) => return Ok(Action::SaveConfig { indent: a.indent, output: a.output }),
            Cmd::LoadConfig(a) => return Ok(Action::LoadConfig { file: a.json_conf }),
            Cmd::Call(a) => return Ok(Action::Call(a.method, parse_raw_params(a.params.as_deref())?)),
            Cmd::External(args) => return external_action(args),
        };
        Ok(Action::Call(method, params))
    }
}

/// Params from an args struct; an empty object is sent as no params at all, as rpc.py does.
fn to_params<T: Serialize>(args: &T) -> Result<Option<Value>, UsageError> {
    let v = serde_json::to_value(args).map_err(|e| UsageError(e.to_string()))?;
    Ok(match v {
        Value::Object(ref m) if m.is_empty() => None,
        v => Some(v),
    })
}

/// The number of blocks of a size in MiB, refusing a size that is not a whole number of
/// blocks (as rpc.py does) rather than silently rounding it down.
fn num_blocks(total_size_mib: f64, block_size: u32) -> Result<u64, UsageError> {
    if block_size == 0 {
        return Err(UsageError("block size must be greater than 0".into()));
    }
    let bytes = total_size_mib * 1024.0 * 1024.0;
    // Below 2^53 an f64 holds every integer exactly, so the fract() test is exact.
    if !bytes.is_finite() || bytes <= 0.0 || bytes >= 9_007_199_254_740_992.0 || bytes.fract() != 0.0 {
        return Err(UsageError(format!("invalid total size {total_size_mib} MiB")));
    }
    let bytes = bytes as u64;
    let num_blocks = bytes / u64::from(block_size);
    if num_blocks * u64::from(block_size) != bytes {
        return Err(UsageError(format!(
            "total size {total_size_mib} MiB ({bytes} bytes) is not a multiple of the block size {block_size}"
        )));
    }
    Ok(num_blocks)
}

/// Raw mode: `riser-rpc METHOD [JSON]` for a method without a subcommand.
fn external_action(args: Vec<String>) -> Result<Action, UsageError> {
    let mut it = args.into_iter();
    let method = it.next().ok_or_else(|| UsageError("no method given".into()))?;
    let params = it.next();
    if let Some(extra) = it.next() {
        return Err(UsageError(format!(
            "{method}: unexpected argument {extra:?} (raw mode takes one JSON argument; quote it)"
        )));
    }
    let params = parse_raw_params(params.as_deref())?;
    Ok(Action::Call(method, params))
}

/// The JSON params of the raw mode: one object or array, as JSON-RPC 2.0 requires.
fn parse_raw_params(text: Option<&str>) -> Result<Option<Value>, UsageError> {
    let Some(text) = text else { return Ok(None) };
    let v: Value =
        serde_json::from_str(text).map_err(|e| UsageError(format!("params are not valid JSON: {e}: {text}")))?;
    match v {
        Value::Object(_) | Value::Array(_) => Ok(Some(v)),
        _ => Err(UsageError(format!("params must be a JSON object or array, not {text}"))),
    }
}

/// JSON with `indent` spaces per level, like Python's `json.dumps(indent=N)`.
fn pretty(v: &Value, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes()));
    match v.serialize(&mut ser) {
        Ok(()) => String::from_utf8_lossy(&out).into_owned(),
        // Unreachable for a Value, but never panic on server data.
        Err(_) => v.to_string(),
    }
}

/// Reads the load_config input: a file, or standard input.
fn read_config(file: Option<&PathBuf>) -> Result<Value, String> {
    let (text, from) = match file {
        Some(path) => (
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            path.display().to_string(),
        ),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| format!("cannot read standard input: {e}"))?;
            (s, "standard input".to_string())
        }
    };
    serde_json::from_str(&text).map_err(|e| format!("{from} is not valid JSON: {e}"))
}

/// Writes `text` to `path` readable by its owner only (mode 0600: a saved configuration holds
/// CHAP secrets): into a new file beside it, then renamed over it, so an existing file with
/// wider permissions is replaced rather than written into, and no half-written file is left.
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let name = path.file_name().ok_or_else(|| format!("{}: not a file name", path.display()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(".{}.riser-rpc-{}.tmp", name.to_string_lossy(), std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        // The umask may have taken bits off 0600; never added any. Make it exactly 0600.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

fn main() -> ExitCode {
    // Parse through ArgMatches so the subcommand name typed (= the method name) is at hand.
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let method = matches.subcommand_name().unwrap_or_default().to_string();
    let action = match cli.cmd.into_action(method) {
        Ok(a) => a,
        Err(UsageError(msg)) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
    };

    // Read the config before connecting, so a bad file is reported as such.
    let config = match &action {
        Action::LoadConfig { file } => match read_config(file.as_ref()) {
            Ok(v) => Some(v),
            Err(msg) => {
                eprintln!("error: {msg}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };

    let mut client = match RpcClient::connect(&cli.server, cli.timeout) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };

    let (label, result) = match action {
        Action::Call(method, params) => {
            let r = client.call(&method, params).map(|v| Some(pretty(&v, 2)));
            (method, r)
        }
        Action::SaveConfig { indent, output: None } => {
            ("save_config".to_string(), client.save_config().map(|v| Some(pretty(&v, indent))))
        }
        Action::SaveConfig { indent, output: Some(path) } => match client.save_config() {
            Ok(v) => {
                let mut text = pretty(&v, indent);
                text.push('\n');
                return match write_private(&path, &text) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(msg) => {
                        eprintln!("error: {msg}");
                        ExitCode::from(1)
                    }
                };
            }
            Err(e) => ("save_config".to_string(), Err(e)),
        },
        Action::LoadConfig { .. } => {
            let cfg = config.unwrap_or(Value::Null);
            ("load_config".to_string(), client.load_config(&cfg).map(|()| None))
        }
    };

    match result {
        Ok(Some(text)) => {
            let mut out = std::io::stdout().lock();
            // A closed stdout (riser-rpc ... | head) is not worth a panic.
            if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            match e {
                // The server's own answer: say which method it refused.
                ClientError::Rpc { .. } | ClientError::Load { .. } | ClientError::BadConfig(_) => {
                    eprintln!("error: {label}: {e}")
                }
                _ => eprintln!("error: {e}"),
            }
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What `riser-rpc ARGS..` would send: (method, params), or the usage error and its exit
    /// status.
    fn sent(args: &[&str]) -> Result<(String, Option<Value>), (String, i32)> {
        let argv = std::iter::once("riser-rpc").chain(args.iter().copied());
        let m = Cli::command().try_get_matches_from(argv).map_err(|e| (e.to_string(), e.exit_code()))?;
        let cli = Cli::from_arg_matches(&m).map_err(|e| (e.to_string(), e.exit_code()))?;
        match cli.cmd.into_action(m.subcommand_name().unwrap_or_default().to_string()) {
            Ok(Action::Call(method, params)) => Ok((method, params)),
            Ok(_) => panic!("{args:?}: not a plain call"),
            Err(UsageError(msg)) => Err((msg, 2)),
        }
    }

    fn params(args: &[&str]) -> Value {
        let (method, p) = sent(args).unwrap_or_else(|e| panic!("{args:?}: {e:?}"));
        assert_eq!(method, args[0]);
        p.unwrap_or(Value::Null)
    }

    /// A usage error (exit 2) whose message contains `needle`.
    fn refused(args: &[&str], needle: &str) {
        match sent(args) {
            Err((msg, code)) => {
                assert_eq!(code, 2, "{args:?}: {msg}");
                assert!(msg.contains(needle), "{args:?}: {msg:?} lacks {needle:?}");
            }
            Ok(p) => panic!("{args:?} was accepted: {p:?}"),
        }
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn list_splitting() {
        let v = |s: &'static str| split_list(s).collect::<Vec<_>>();
        assert_eq!(v("a b"), ["a", "b"]);
        assert_eq!(v("  a \t b\n"), ["a", "b"]);
        assert_eq!(v("a,b c, d"), ["a", "b", "c", "d"]);
        assert!(v("").is_empty());
        assert!(v(" , ").is_empty());
    }

    #[test]
    fn portals_parse() {
        let p = |host: &str, port: &str, iser: bool| PortalArg { host: host.into(), port: port.into(), iser, ignored_cpumask: None };
        assert_eq!(parse_portals("127.0.0.1:3260"), Ok(List(vec![p("127.0.0.1", "3260", false)])));
        assert_eq!(
            parse_portals("127.0.0.1:3260 10.0.0.1:3261,[::1]:3260 192.0.2.1:3260@iser [fe80::1]:860@ISER"),
            Ok(List(vec![
                p("127.0.0.1", "3260", false),
                p("10.0.0.1", "3261", false),
                p("[::1]", "3260", false),
                p("192.0.2.1", "3260", true),
                p("[fe80::1]", "860", true),
            ]))
        );
        // rpc.py's old CPU mask suffix is accepted and ignored.
        let got = parse_portals("0.0.0.0:3260@0x3").unwrap();
        assert_eq!((got.0[0].iser, got.0[0].ignored_cpumask.as_deref()), (false, Some("0x3")));
        assert_eq!(parse_portals(""), Ok(List(vec![])));
        for (bad, needle) in [
            ("127.0.0.1", "is not HOST:PORT"),
            (":3260", "has no host"),
            ("127.0.0.1:", "is not a port number"),
            ("127.0.0.1:x", "is not a port number"),
            ("127.0.0.1:0", "is not a port number"),
            ("127.0.0.1:65536", "is not a port number"),
            ("::1:3260", "IPv6 host must be in brackets"),
            ("127.0.0.1:3260@rdma", "unknown suffix @rdma"),
            ("127.0.0.1:3260@", "nothing after '@'"),
            ("1.2.3.4:3260 5.6.7.8", "\"5.6.7.8\""),
        ] {
            let e = parse_portals(bad).expect_err(bad);
            assert!(e.contains(needle), "{bad}: {e:?} lacks {needle:?}");
        }
    }

    #[test]
    fn luns_and_maps_parse() {
        let l = |b: &str, id: u32| LunParam { bdev_name: b.into(), lun_id: id, removable: false, read_only: false };
        assert_eq!(parse_luns("Malloc0:0 Malloc1:1"), Ok(List(vec![l("Malloc0", 0), l("Malloc1", 1)])));
        assert_eq!(parse_luns(" Malloc5:2 "), Ok(List(vec![l("Malloc5", 2)])));
        // The id is after the last colon.
        assert_eq!(parse_luns("ns:a:7"), Ok(List(vec![l("ns:a", 7)])));
        // riser's LUN options, in any order, after the id.
        let opts = |b: &str, id: u32, removable, read_only| LunParam { bdev_name: b.into(), lun_id: id, removable, read_only };
        assert_eq!(
            parse_luns("M0:0:removable M1:1:read_only M2:2:read_only:removable"),
            Ok(List(vec![opts("M0", 0, true, false), opts("M1", 1, false, true), opts("M2", 2, true, true)]))
        );
        assert!(parse_luns("M0:removable").is_err());
        for (bad, needle) in [
            ("Malloc0", "is not BDEV:LUN_ID"),
            (":0", "has no bdev name"),
            ("Malloc0:", "is not a LUN id"),
            ("Malloc0:x", "is not a LUN id"),
            ("Malloc0:-1", "is not a LUN id"),
            ("Malloc0:0 Malloc1", "\"Malloc1\""),
        ] {
            let e = parse_luns(bad).expect_err(bad);
            assert!(e.contains(needle), "{bad}: {e:?} lacks {needle:?}");
        }

        let m = |pg: u32, ig: u32| PgIgMap { pg_tag: pg, ig_tag: ig };
        assert_eq!(parse_pg_ig_maps("1:1 2:2 2:1"), Ok(List(vec![m(1, 1), m(2, 2), m(2, 1)])));
        assert_eq!(parse_pg_ig_maps("1:1,3:4"), Ok(List(vec![m(1, 1), m(3, 4)])));
        for bad in ["1", "1:", ":1", "a:1", "1:b", "1:1:1", "1-1", "1:-1"] {
            let e = parse_pg_ig_maps(bad).expect_err(bad);
            assert!(e.contains("is not PG_TAG:IG_TAG"), "{bad}: {e:?}");
        }

        assert_eq!(parse_words("ANY"), Ok(List(vec!["ANY".to_string()])));
        assert_eq!(
            parse_words("iqn.2016-06.io.spdk:h1  !iqn.2016-06.io.spdk:h2"),
            Ok(List(vec!["iqn.2016-06.io.spdk:h1".to_string(), "!iqn.2016-06.io.spdk:h2".to_string()]))
        );
        assert_eq!(parse_tag("7"), Ok(7));
        assert!(parse_tag("x").unwrap_err().contains("is not a tag"));
        assert!(parse_tag("-1").is_err());
    }

    #[test]
    fn bdev_commands() {
        assert_eq!(
            params(&["bdev_malloc_create", "-b", "Malloc0", "64", "512"]),
            json!({"name": "Malloc0", "num_blocks": 131072, "block_size": 512})
        );
        let u = "4f2c6e1a-9b7d-4c3e-8a5f-0d1e2f3a4b5c";
        assert_eq!(params(&["bdev_malloc_create", "-u", u, "0.5", "4096"]), json!({"num_blocks": 128, "block_size": 4096, "uuid": u}));
        let upper = u.to_uppercase();
        assert_eq!(
            params(&["bdev_null_create", "-u", &upper, "Null0", "16", "4096"]),
            json!({"name": "Null0", "num_blocks": 4096, "block_size": 4096, "uuid": u})
        );
        assert_eq!(
            params(&["bdev_uring_create", "/tmp/disk.img", "Uring0"]),
            json!({"name": "Uring0", "filename": "/tmp/disk.img"})
        );
        assert_eq!(
            params(&["bdev_aio_create", "-r", "/dev/sdb", "Aio0", "4096"]),
            json!({"name": "Aio0", "filename": "/dev/sdb", "block_size": 4096, "readonly": true})
        );
        for m in ["bdev_malloc_delete", "bdev_null_delete", "bdev_uring_delete", "bdev_uring_rescan", "bdev_aio_delete", "bdev_aio_rescan"] {
            assert_eq!(params(&[m, "Malloc0"]), json!({"name": "Malloc0"}));
        }
        assert_eq!(params(&["bdev_get_bdevs"]), Value::Null);
        assert_eq!(params(&["bdev_get_bdevs", "-b", "Null0"]), json!({"name": "Null0"}));
        assert_eq!(
            params(&["bdev_nvme_attach_controller", "-b", "Nvme0", "-t", "PCIe", "-a", "0000:00:04.0"]),
            json!({"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:00:04.0"})
        );
        assert_eq!(params(&["bdev_nvme_detach_controller", "Nvme0"]), json!({"name": "Nvme0"}));
        assert_eq!(params(&["bdev_nvme_get_controllers"]), Value::Null);
        assert_eq!(params(&["bdev_nvme_get_controllers", "-n", "Nvme0"]), json!({"name": "Nvme0"}));
        refused(&["bdev_malloc_create", "1", "3000"], "not a multiple of the block size");
        refused(&["bdev_malloc_create", "1", "0"], "block size must be greater than 0");
        refused(&["bdev_null_create", "N", "0", "512"], "invalid total size");
        refused(&["bdev_malloc_create", "-u", "not-a-uuid", "1", "512"], "invalid value");
    }

    #[test]
    fn statistics_commands() {
        assert_eq!(params(&["bdev_get_iostat"]), Value::Null);
        assert_eq!(params(&["bdev_get_iostat", "-b", "Malloc0", "-c"]), json!({"name": "Malloc0", "per_channel": true}));
        refused(&["bdev_get_iostat", "-c"], "--name");
        assert_eq!(params(&["bdev_reset_iostat", "-m", "maxmin"]), json!({"mode": "maxmin"}));
        assert_eq!(params(&["bdev_reset_iostat", "-b", "N", "-m", "all"]), json!({"name": "N", "mode": "all"}));
        refused(&["bdev_reset_iostat", "-m", "some"], "invalid value");
        assert_eq!(params(&["bdev_enable_histogram", "N"]), json!({"name": "N", "enable": true}));
        assert_eq!(params(&["bdev_enable_histogram", "--enable", "N"]), json!({"name": "N", "enable": true}));
        assert_eq!(params(&["bdev_enable_histogram", "-d", "N"]), json!({"name": "N", "enable": false}));
        refused(&["bdev_enable_histogram", "-e", "-d", "N"], "cannot be used with");
        assert_eq!(params(&["bdev_get_histogram", "N"]), json!({"name": "N"}));
        refused(&["bdev_get_histogram"], "required");
    }

    #[test]
    fn portal_group_commands() {
        assert_eq!(
            params(&["iscsi_create_portal_group", "1", "127.0.0.1:3260 [::1]:3261"]),
            json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3260"}, {"host": "[::1]", "port": "3261"}]})
        );
        // Several arguments, commas, flags, @iser.
        assert_eq!(
            params(&["iscsi_create_portal_group", "-p", "2", "10.0.0.1:3260,10.0.0.2:3260", "192.0.2.1:3260@iser", "-w"]),
            json!({"tag": 2, "portals": [
                {"host": "10.0.0.1", "port": "3260"},
                {"host": "10.0.0.2", "port": "3260"},
                {"host": "192.0.2.1", "port": "3260", "iser": true}
            ], "private": true, "wait": true})
        );
        assert_eq!(params(&["iscsi_start_portal_group", "3"]), json!({"tag": 3}));
        assert_eq!(params(&["iscsi_delete_portal_group", "3"]), json!({"tag": 3}));
        assert_eq!(params(&["iscsi_get_portal_groups"]), Value::Null);
        refused(&["iscsi_create_portal_group", "x", "127.0.0.1:3260"], "is not a tag");
        refused(&["iscsi_create_portal_group", "1", "127.0.0.1"], "is not HOST:PORT");
        refused(&["iscsi_create_portal_group", "1"], "required");
        refused(&["iscsi_delete_portal_group", "one"], "is not a tag");
        refused(&["iscsi_get_portal_groups", "1"], "unexpected argument");
    }

    #[test]
    fn initiator_group_commands() {
        assert_eq!(
            params(&["iscsi_create_initiator_group", "1", "ANY", "127.0.0.0/8 [::1]/128"]),
            json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["127.0.0.0/8", "[::1]/128"]})
        );
        assert_eq!(
            params(&["iscsi_initiator_group_add_initiators", "1", "-n", "iqn.a:x iqn.a:y", "-m", "10.0.0.0/8"]),
            json!({"tag": 1, "initiators": ["iqn.a:x", "iqn.a:y"], "netmasks": ["10.0.0.0/8"]})
        );
        assert_eq!(
            params(&["iscsi_initiator_group_remove_initiators", "1", "-m", "10.0.0.0/8"]),
            json!({"tag": 1, "netmasks": ["10.0.0.0/8"]})
        );
        assert_eq!(
            params(&["iscsi_initiator_group_remove_initiators", "4", "--initiators", "ANY"]),
            json!({"tag": 4, "initiators": ["ANY"]})
        );
        assert_eq!(params(&["iscsi_delete_initiator_group", "2"]), json!({"tag": 2}));
        assert_eq!(params(&["iscsi_get_initiator_groups"]), Value::Null);
        refused(&["iscsi_create_initiator_group", "1", "ANY"], "required");
        refused(&["iscsi_create_initiator_group", "1.5", "ANY", "ANY"], "is not a tag");
    }

    #[test]
    fn target_node_commands() {
        assert_eq!(
            params(&["iscsi_create_target_node", "disk1", "Disk 1", "Malloc0:0 Malloc1:1", "1:1 2:1", "64"]),
            json!({
                "name": "disk1", "alias_name": "Disk 1",
                "luns": [{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1}],
                "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 2, "ig_tag": 1}],
                "queue_depth": 64
            })
        );
        assert_eq!(
            params(&["iscsi_create_target_node", "-r", "-m", "-g", "2", "-H", "-D", "n", "a", "M:0", "1:1", "8"]),
            json!({
                "name": "n", "alias_name": "a", "luns": [{"bdev_name": "M", "lun_id": 0}],
                "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}], "queue_depth": 8,
                "require_chap": true, "mutual_chap": true, "chap_group": 2, "header_digest": true, "data_digest": true
            })
        );
        assert_eq!(params(&["iscsi_create_target_node", "n", "a", "M:0", "1:1", "8", "-d"])["disable_chap"], json!(true));
        refused(&["iscsi_create_target_node", "n", "a", "Malloc0", "1:1", "8"], "is not BDEV:LUN_ID");
        refused(&["iscsi_create_target_node", "n", "a", "M:0", "1-1", "8"], "is not PG_TAG:IG_TAG");
        refused(&["iscsi_create_target_node", "n", "a", "M:0", "1:1", "deep"], "invalid value");
        refused(&["iscsi_create_target_node", "n", "a", "M:0", "1:1"], "required");
        refused(&["iscsi_create_target_node", "-d", "-r", "n", "a", "M:0", "1:1", "8"], "cannot be used with");

        assert_eq!(params(&["iscsi_target_node_add_lun", "disk1", "Malloc2"]), json!({"name": "disk1", "bdev_name": "Malloc2"}));
        assert_eq!(
            params(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "--removable", "--read-only"]),
            json!({"name": "disk1", "bdev_name": "Malloc2", "removable": true, "read_only": true})
        );
        // LUN 0 is sent (rpc.py drops a 0), and -1 ("any") too.
        assert_eq!(params(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "-i", "0"])["lun_id"], json!(0));
        assert_eq!(params(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "-i", "-1"])["lun_id"], json!(-1));
        assert_eq!(params(&["iscsi_target_node_add_lun", "-i", "5", "disk1", "Malloc2"])["lun_id"], json!(5));
        refused(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "-i", "two"], "invalid value");

        for m in ["iscsi_target_node_add_pg_ig_maps", "iscsi_target_node_remove_pg_ig_maps"] {
            assert_eq!(
                params(&[m, "iqn.2016-06.io.riser:disk1", "1:1 2:3"]),
                json!({"name": "iqn.2016-06.io.riser:disk1", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 2, "ig_tag": 3}]})
            );
            refused(&[m, "d", "1:x"], "is not PG_TAG:IG_TAG");
        }
        assert_eq!(params(&["iscsi_delete_target_node", "d"]), json!({"name": "d"}));
        assert_eq!(params(&["iscsi_get_target_nodes"]), Value::Null);
    }

    #[test]
    fn options_and_getters() {
        assert_eq!(params(&["iscsi_set_options"]), Value::Null);
        assert_eq!(
            params(&[
                "iscsi_set_options", "-f", "/etc/auth", "-b", "iqn.2024-01.com.example", "-o", "10", "-n", "5", "-r", "-m",
                "-g", "1", "-a", "16", "-q", "32", "-c", "4", "-w", "0", "-v", "30", "-s", "65536", "-i", "-l", "0", "-p",
                "-x", "8", "-k", "2", "-u", "1024", "-j", "512", "-z", "256",
            ]),
            json!({
                "auth_file": "/etc/auth", "node_base": "iqn.2024-01.com.example", "nop_timeout": 10, "nop_in_interval": 5,
                "require_chap": true, "mutual_chap": true, "chap_group": 1, "max_sessions": 16, "max_queue_depth": 32,
                "max_connections_per_session": 4, "default_time2wait": 0, "default_time2retain": 30,
                "first_burst_length": 65536, "immediate_data": true, "error_recovery_level": 0,
                "allow_duplicated_isid": true, "max_large_datain_per_connection": 8, "max_r2t_per_connection": 2,
                "pdu_pool_size": 1024, "immediate_data_pool_size": 512, "data_out_pool_size": 256
            })
        );
        assert_eq!(params(&["iscsi_set_options", "--no-immediate-data", "-d"]), json!({"disable_chap": true, "immediate_data": false}));
        assert_eq!(params(&["iscsi_set_options", "--first-burst-length", "4096"]), json!({"first_burst_length": 4096}));
        assert_eq!(params(&["iscsi_set_options", "--data-out-timeout", "5"]), json!({"data_out_timeout": 5}));
        assert_eq!(
            params(&["iobuf_set_options", "--max-buffer-share-percent", "20", "--buffer-reserve-percent", "10"]),
            json!({"max_buffer_share_percent": 20, "buffer_reserve_percent": 10})
        );
        assert_eq!(
            params(&["iscsi_set_options", "--login-timeout", "5", "--max-logins", "64", "--max-logins-per-source", "4", "--max-discovery-sessions", "8"]),
            json!({"login_timeout": 5, "max_logins": 64, "max_logins_per_source": 4, "max_discovery_sessions": 8})
        );
        assert_eq!(
            params(&["iscsi_set_options", "--max-discovery-sessions-per-source", "2"]),
            json!({"max_discovery_sessions_per_source": 2})
        );
        refused(&["iscsi_set_options", "-i", "--no-immediate-data"], "cannot be used with");
        refused(&["iscsi_set_options", "-d", "-r"], "cannot be used with");
        refused(&["iscsi_set_options", "-q", "many"], "invalid value");
        refused(&["iscsi_set_options", "-q", "-1"], "-1");
        for m in ["iscsi_get_options", "iscsi_get_connections", "iscsi_get_stats"] {
            assert_eq!(sent(&[m]), Ok((m.to_string(), None)));
        }
    }

    #[test]
    fn every_iscsi_subcommand_has_help() {
        let cmd = Cli::command();
        let iscsi: Vec<_> = cmd.get_subcommands().filter(|c| c.get_name().starts_with("iscsi_")).collect();
        assert_eq!(iscsi.len(), 28);
        for c in iscsi {
            assert!(c.get_about().is_some(), "{} has no help line", c.get_name());
            let e = sent(&[c.get_name(), "--help"]).expect_err("--help");
            assert_eq!(e.1, 0, "{}: {}", c.get_name(), e.0);
            for a in c.get_arguments().filter(|a| a.get_id() != "help") {
                assert!(a.get_help().is_some(), "{} {}: no help", c.get_name(), a.get_id());
            }
        }
    }

    #[test]
    fn auth_group_commands() {
        assert_eq!(params(&["iscsi_create_auth_group", "1"]), json!({"tag": 1}));
        // rpc.py's -c form.
        assert_eq!(
            params(&["iscsi_create_auth_group", "1", "-c", "user:u secret:s muser:mu msecret:ms,user:u2 secret:s2"]),
            json!({"tag": 1, "secrets": [
                {"user": "u", "secret": "s", "muser": "mu", "msecret": "ms"},
                {"user": "u2", "secret": "s2"}
            ]})
        );
        // Looser than rpc.py: any order and whitespace, empty items, a ':' inside a value.
        assert_eq!(
            params(&["iscsi_create_auth_group", "--secrets", " secret:a:b \t user:x ,", "2"]),
            json!({"tag": 2, "secrets": [{"user": "x", "secret": "a:b"}]})
        );
        assert_eq!(params(&["iscsi_create_auth_group", "3", "-c", ""]), json!({"tag": 3}));
        assert_eq!(
            params(&["iscsi_create_auth_group", "4", "-c", "user:u secret:s initiator_group:2"]),
            json!({"tag": 4, "secrets": [{"user": "u", "secret": "s", "initiator_group": 2}]})
        );
        for (bad, needle) in [
            ("user:u secret:SECRETX extra", "--secrets item 1, word 3: not KEY:VALUE"),
            ("user:u secret:SECRETX,user:v", "--secrets item 2: no secret:"),
            ("secret:SECRETX", "--secrets item 1: no user:"),
            ("user:u secret:SECRETX secret:SECRETY", "--secrets item 1, word 3: secret given twice"),
            ("user:u secret:SECRETX pass:SECRETY", "--secrets item 1, word 3: unknown key"),
            // A secret with a space: its second half looks like a word of its own.
            ("user:u secret:SECRET X:SECRETY", "--secrets item 1, word 3: unknown key"),
            ("user:u secret:SECRETX initiator_group:x", "--secrets item 1: initiator_group: not a tag"),
        ] {
            let (msg, code) = sent(&["iscsi_create_auth_group", "1", "-c", bad]).expect_err(bad);
            assert_eq!(code, 2, "{bad}: {msg}");
            assert!(msg.contains(needle), "{bad}: {msg:?} lacks {needle:?}");
            assert!(!msg.contains("SECRET"), "{bad}: the message shows a secret: {msg}");
        }
        refused(&["iscsi_create_auth_group", "0x1"], "is not a tag");

        assert_eq!(params(&["iscsi_delete_auth_group", "4"]), json!({"tag": 4}));
        assert_eq!(params(&["iscsi_get_auth_groups"]), Value::Null);
        assert_eq!(
            params(&["iscsi_auth_group_add_secret", "1", "-u", "u", "-s", "s"]),
            json!({"tag": 1, "user": "u", "secret": "s"})
        );
        assert_eq!(
            params(&["iscsi_auth_group_add_secret", "--user", "u", "--secret", "s", "-m", "mu", "-r", "ms", "1"]),
            json!({"tag": 1, "user": "u", "secret": "s", "muser": "mu", "msecret": "ms"})
        );
        assert_eq!(
            params(&["iscsi_auth_group_add_secret", "1", "-u", "u", "-s", "s", "-i", "3"]),
            json!({"tag": 1, "user": "u", "secret": "s", "initiator_group": 3})
        );
        refused(&["iscsi_auth_group_add_secret", "1", "-u", "u"], "--secret");
        refused(&["iscsi_auth_group_add_secret", "1", "-s", "s"], "--user");
        assert_eq!(params(&["iscsi_auth_group_remove_secret", "1", "-u", "u"]), json!({"tag": 1, "user": "u"}));
        refused(&["iscsi_auth_group_remove_secret", "1"], "--user");
        // The global -s (socket) still works before the method.
        let argv = ["riser-rpc", "-s", "/tmp/x.sock", "iscsi_auth_group_add_secret", "1", "-u", "u", "-s", "s"];
        let cli = Cli::try_parse_from(argv).unwrap();
        assert_eq!(cli.server, PathBuf::from("/tmp/x.sock"));
    }

    #[test]
    fn auth_policy_commands() {
        assert_eq!(params(&["iscsi_set_discovery_auth"]), Value::Null);
        assert_eq!(
            params(&["iscsi_set_discovery_auth", "-r", "-m", "-g", "2"]),
            json!({"require_chap": true, "mutual_chap": true, "chap_group": 2})
        );
        assert_eq!(params(&["iscsi_set_discovery_auth", "--disable-chap"]), json!({"disable_chap": true}));
        refused(&["iscsi_set_discovery_auth", "-d", "-r"], "cannot be used with");
        refused(&["iscsi_set_discovery_auth", "-g", "x"], "is not a tag");
        assert_eq!(params(&["iscsi_target_node_set_auth", "disk1"]), json!({"name": "disk1"}));
        assert_eq!(
            params(&["iscsi_target_node_set_auth", "disk1", "-g", "1", "-r", "-m"]),
            json!({"name": "disk1", "chap_group": 1, "require_chap": true, "mutual_chap": true})
        );
        assert_eq!(params(&["iscsi_target_node_set_auth", "-d", "disk1"]), json!({"name": "disk1", "disable_chap": true}));
        refused(&["iscsi_target_node_set_auth", "disk1", "-d", "-r"], "cannot be used with");
        refused(&["iscsi_target_node_set_auth"], "required");
    }

    #[test]
    fn log_level_subcommands() {
        assert_eq!(params(&["log_set_level", "DEBUG"]), json!({"level": "DEBUG"}));
        assert_eq!(params(&["log_set_print_level", "warn"]), json!({"level": "warn"}));
        assert_eq!(params(&["log_get_level"]), Value::Null);
        assert_eq!(params(&["log_get_print_level"]), Value::Null);
        refused(&["log_set_level"], "required");
        refused(&["log_set_level", "INFO", "DEBUG"], "unexpected argument");
        refused(&["log_get_level", "INFO"], "unexpected argument");
    }

    #[test]
    fn debug_of_a_command_line_never_shows_secrets() {
        for argv in [
            &["riser-rpc", "iscsi_create_auth_group", "1", "-c", "user:u secret:SECRETX muser:m msecret:SECRETY"][..],
            &["riser-rpc", "iscsi_auth_group_add_secret", "1", "-u", "u", "-s", "SECRETX", "-m", "m", "-r", "SECRETY"][..],
        ] {
            let cli = Cli::try_parse_from(argv).unwrap();
            let text = format!("{cli:?} {cli:#?}");
            assert!(!text.contains("SECRET"), "{text}");
        }
    }

    #[test]
    fn save_config_output_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let cli = Cli::try_parse_from(["riser-rpc", "save_config", "-o", "cfg.json", "-i", "4"]).unwrap();
        match cli.cmd.into_action("save_config".into()) {
            Ok(Action::SaveConfig { indent: 4, output: Some(p) }) => assert_eq!(p, PathBuf::from("cfg.json")),
            _ => panic!("not save_config to cfg.json"),
        }
        let dir = std::env::temp_dir().join(format!("riser-rpc-save-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cfg.json");
        // An existing file readable by all is replaced by a private one.
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, "{\"subsystems\": []}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"subsystems\": []}\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        write_private(&dir.join("new.json"), "x").unwrap();
        assert_eq!(std::fs::metadata(dir.join("new.json")).unwrap().permissions().mode() & 0o777, 0o600);
        // Nothing else left behind; a missing directory is an error, not a panic.
        let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["cfg.json", "new.json"]);
        let e = write_private(&dir.join("no/such/dir.json"), "x").unwrap_err();
        assert!(e.starts_with("cannot write"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
