//! `riser-rpc`: command-line client for riser's JSON-RPC socket, used like SPDK's
//! `scripts/rpc.py` (`riser-rpc bdev_malloc_create -b Malloc0 64 512`).
//!
//! Each method's parameters are one type, defined beside the method's handler in the module
//! that owns the concept: riser-bdev's ([`riser_bdev::rpc`]), riser-config's (its
//! `options`, `portal_group`, `initiator_group`, `auth_group`, `target_node` modules) and, for
//! the methods the `riser` binary serves itself, [`riser_rpc::params`]. The server decodes
//! that type; this CLI encodes it, never JSON of its own. Where the command line's arguments
//! are the type's fields, the type is the subcommand's arguments (clap derives on it, behind
//! its crate's `cli` feature); where they differ (sizes in MiB, rpc.py's list arguments, CHAP
//! secret strings, ALUA groups) an args struct here builds it ([`Cmd::into_action`] is the
//! table).
//!
//! Adding a method: its parameter type beside its handler (with clap attributes when the
//! arguments are its fields), a variant in [`Cmd`] (its doc comment is the `--help` line),
//! and one line in [`Cmd::into_action`]. Methods without a subcommand still work through the
//! raw mode. rpc.py's list arguments (`'Malloc0:0 Malloc1:1'`, one quoted argument) are
//! parsed by a clap value parser into a [`List`], so bad syntax is a usage error before
//! anything is sent.
//!
//! The args structs live per subsystem, as SPDK's `rpc/bdev.py` / `rpc/iscsi.py`: [`bdev`],
//! [`iscsi`], [`misc`] (call) and [`config_file`] (save/load_config); [`apply`] is `riser-rpc apply`.
//!
//! Exit status: 0 success, 1 RPC error or connection failure, 2 usage error.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use riser_rpc::client::{ClientError, RpcClient, DEFAULT_SOCKET_PATH};
use riser_bdev::rpc::{
    BdevGetBdevs, BdevGetIostat, BdevMallocResize, BdevNullResize, BdevNvmeGetControllers, BdevRbdGetClustersInfo, BdevRbdResize,
    BdevResetIostat, BdevSetQosLimit,
};
use riser_config::auth_group::IscsiAuthGroupRemoveSecret as RemoveSecret;
use riser_config::node::alua::{IscsiTargetNodeAluaFailback, IscsiTargetNodeSetAluaState};
use riser_config::node::{
    IscsiDeleteTargetNode, IscsiNodeMaps as NodeMaps, IscsiTargetNodeAddLun, IscsiTargetNodeRemoveLun, IscsiTargetNodeRequestLogout,
    IscsiTargetNodeSetRedirect,
};
use riser_config::node::IscsiTargetNodeSetQosLimit;
use riser_rpc::params::{ByName, ByTag, FrameworkGetConfig, IobufSetOptions, LogSetLevel, RpcGetMethods};
use serde::Serialize;
use serde_json::Value;

mod apply;
mod bdev;
mod config_file;
mod iscsi;
mod misc;

use bdev::*;
use config_file::*;
use iscsi::*;
use misc::*;

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
    /// Resize a malloc bdev: NAME NEW_SIZE (MiB; grows within the memory available, shrinks only while no LUN uses it; riser's extension)
    BdevMallocResize(BdevMallocResize),
    /// Create a bdev that discards writes and reads zeroes
    BdevNullCreate(BdevNullCreate),
    /// Delete a null bdev
    BdevNullDelete(BdevName),
    /// Grow a null bdev: NAME NEW_SIZE (MiB; LUNs on it report CAPACITY DATA HAS CHANGED)
    BdevNullResize(BdevNullResize),
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
    /// Set a bdev's rate limits (I/Os or MiB per second; a limit left out stays, 0 removes it)
    BdevSetQosLimit(BdevSetQosLimit),
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
    /// Make the node's configuration FILE's (save_config's format) with live calls: prints the plan, then runs it [--dry-run] [--force]
    #[command(long_about = apply::LONG_HELP)]
    Apply(apply::Apply),
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
    /// Delete a portal group (it leaves the target nodes' maps; the connections through its portals are closed, no others)
    IscsiDeletePortalGroup(IscsiTag),
    /// List the portal groups
    IscsiGetPortalGroups,
    /// Set CHAP authentication of discovery sessions through a portal group: TAG [-d|-r [-m]] [-g CHAP_GROUP] (live discovery sessions it no longer admits are asked to log out)
    IscsiPortalGroupSetAuth(riser_config::portal_group::IscsiPortalGroupSetAuth),
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
    /// Remove a LUN from a target node: NAME LUN_ID (commands in flight finish, then its bdev is released; live sessions get a REPORTED LUNS DATA HAS CHANGED unit attention; riser's extension)
    IscsiTargetNodeRemoveLun(IscsiTargetNodeRemoveLun),
    /// Map a target node to more portal group / initiator group pairs: NAME 'PG:IG ...'
    IscsiTargetNodeAddPgIgMaps(IscsiNodeMaps),
    /// Unmap portal group / initiator group pairs from a target node: NAME 'PG:IG ...'
    IscsiTargetNodeRemovePgIgMaps(IscsiNodeMaps),
    /// Set CHAP authentication of a target node (replaces its whole policy)
    IscsiTargetNodeSetAuth(IscsiTargetNodeSetAuth),
    /// Delete a target node, its bdevs released (one with sessions only with --force, which closes them)
    IscsiDeleteTargetNode(IscsiDeleteTargetNode),
    /// Ask the initiators of a target node to log out (Async Message); those still logged in after the wait are dropped: NAME [-t PG_TAG] [-w SECONDS]
    IscsiTargetNodeRequestLogout(IscsiTargetNodeRequestLogout),
    /// Redirect new logins to a target node through a portal group (Target moved temporarily): NAME PG_TAG -a HOST [-p PORT]; without -a: clear
    IscsiTargetNodeSetRedirect(IscsiTargetNodeSetRedirect),
    /// Set one initiator's rate limits on a target node's LUN (-l) or every LUN: NAME INITIATOR_NAME; a limit left out stays, 0 removes it
    IscsiTargetNodeSetQosLimit(IscsiTargetNodeSetQosLimit),
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
    LogSetLevel(LogSetLevel),
    /// Show the log level
    LogGetLevel,
    /// Set the log level (riser has one log sink: the same level as log_set_level)
    LogSetPrintLevel(LogSetLevel),
    /// Show the log level (the same as log_get_level)
    LogGetPrintLevel,
    /// Call any method with optional JSON params
    Call(Call),
    /// Any other method name: METHOD ['{JSON params}']
    #[command(external_subcommand)]
    External(Vec<String>),
}

/// What to do once the command line is understood.
enum Action {
    /// One call: its result is printed.
    Call(String, Option<Value>),
    /// `output`: a file written with mode 0600 instead of standard output.
    SaveConfig { indent: usize, output: Option<PathBuf> },
    LoadConfig { file: Option<PathBuf> },
    Apply(apply::Apply),
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
            Cmd::BdevUringCreate(a) => to_params(&a.params())?,
            Cmd::BdevAioCreate(a) => to_params(&a.params())?,
            Cmd::BdevNullCreate(a) => to_params(&a.params()?)?,
            Cmd::BdevGetBdevs(a) => to_params(&a)?,
            Cmd::BdevNvmeAttachController(a) => to_params(&a.params())?,
            Cmd::BdevNvmeDetachController(a) => to_params(&riser_bdev::rpc::BdevNvmeDetachController {
                name: a.name,
                ..Default::default()
            })?,
            Cmd::BdevNvmeGetControllers(a) => to_params(&a)?,
            Cmd::BdevGetIostat(a) => to_params(&a)?,
            Cmd::BdevResetIostat(a) => to_params(&a)?,
            Cmd::BdevSetQosLimit(a) => to_params(&a)?,
            Cmd::BdevEnableHistogram(a) => to_params(&a.params())?,
            Cmd::BdevGetHistogram(a) => to_params(&ByName { name: a.name })?,
            Cmd::BdevRbdRegisterCluster(a) => to_params(&a.params()?)?,
            Cmd::BdevRbdUnregisterCluster(a) | Cmd::BdevRbdDelete(a) => to_params(&ByName { name: a.name })?,
            Cmd::BdevRbdGetClustersInfo(a) => to_params(&a)?,
            Cmd::BdevRbdCreate(a) => to_params(&a.params()?)?,
            Cmd::BdevRbdResize(a) => to_params(&a)?,
            Cmd::BdevNullResize(a) => to_params(&a)?,
            Cmd::BdevMallocResize(a) => to_params(&a)?,
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
            Cmd::IscsiPortalGroupSetAuth(a) => to_params(&a)?,
            Cmd::IscsiCreateAuthGroup(a) => to_params(&a.params()?)?,
            Cmd::IscsiAuthGroupAddSecret(a) => to_params(&a.params())?,
            Cmd::IscsiAuthGroupRemoveSecret(a) => to_params(&RemoveSecret { tag: a.tag, user: a.user })?,
            Cmd::IscsiTargetNodeSetAuth(a) => to_params(&a.params())?,
            Cmd::IscsiCreateInitiatorGroup(a) => to_params(&a.params())?,
            Cmd::IscsiInitiatorGroupAddInitiators(a) | Cmd::IscsiInitiatorGroupRemoveInitiators(a) => to_params(&a.params())?,
            Cmd::IscsiCreateTargetNode(a) => to_params(&a.params())?,
            Cmd::IscsiTargetNodeAddLun(a) => to_params(&a)?,
            Cmd::IscsiTargetNodeRemoveLun(a) => to_params(&a)?,
            Cmd::IscsiTargetNodeAddPgIgMaps(a) | Cmd::IscsiTargetNodeRemovePgIgMaps(a) => {
                to_params(&NodeMaps { name: a.name, pg_ig_maps: a.pg_ig_maps.0 })?
            }
            Cmd::IscsiDeleteTargetNode(a) => to_params(&a)?,
            Cmd::IscsiTargetNodeRequestLogout(a) => to_params(&a)?,
            Cmd::IscsiTargetNodeSetRedirect(a) => to_params(&a)?,
            Cmd::IscsiTargetNodeSetQosLimit(a) => to_params(&a)?,
            Cmd::IscsiTargetNodeSetAlua(a) => to_params(&a.params()?)?,
            Cmd::IscsiTargetNodeSetAluaState(a) => to_params(&a)?,
            Cmd::IscsiTargetNodeAluaFailback(a) => to_params(&IscsiTargetNodeAluaFailback { name: a.name })?,
            Cmd::SaveConfig(a) => return Ok(Action::SaveConfig { indent: a.indent, output: a.output }),
            Cmd::LoadConfig(a) => return Ok(Action::LoadConfig { file: a.json_conf }),
            Cmd::Apply(a) => return Ok(Action::Apply(a)),
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
    let wanted = match &action {
        Action::Apply(a) => match apply::read(a) {
            Ok(c) => Some(c),
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
        Action::Apply(a) => return apply::run(&mut client, &a, &wanted.unwrap_or_default()),
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
mod tests;
