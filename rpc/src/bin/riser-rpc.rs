//! `riser-rpc`: command-line client for riser's JSON-RPC socket, used like SPDK's
//! `scripts/rpc.py` (`riser-rpc bdev_malloc_create -b Malloc0 64 512`).
//!
//! Adding a method: a variant in [`Cmd`] (its doc comment is the `--help` line), an args
//! struct deriving `Args` + `Serialize` whose fields are the JSON params, and one line in
//! [`Cmd::into_action`]. Methods without a subcommand still work through the raw mode.
//!
//! Exit status: 0 success, 1 RPC error or connection failure, 2 usage error.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use riser_rpc::client::{ClientError, RpcClient, DEFAULT_SOCKET_PATH};
use serde::Serialize;
use serde_json::{json, Value};

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
    /// List bdevs (all, or one by name)
    BdevGetBdevs(BdevGetBdevs),
    /// Print the whole running configuration as JSON (input for load_config or riser --json)
    SaveConfig(SaveConfig),
    /// Replay a configuration made by save_config
    LoadConfig(LoadConfig),
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
    uuid: Option<String>,
    /// Size in MiB
    total_size: f64,
    /// Block size in bytes (512 or 4096)
    block_size: u32,
}

#[derive(Args, Debug)]
struct BdevNullCreate {
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    uuid: Option<String>,
    /// Bdev name
    name: String,
    /// Size in MiB
    total_size: f64,
    /// Block size in bytes (512 or 4096)
    block_size: u32,
}

#[derive(Args, Serialize, Debug)]
struct BdevName {
    /// Bdev name
    name: String,
}

#[derive(Args, Serialize, Debug)]
struct BdevGetBdevs {
    /// Only this bdev
    #[arg(short = 'b', long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

#[derive(Args, Debug)]
struct SaveConfig {
    /// Spaces per indentation level
    #[arg(short = 'i', long, default_value_t = 2)]
    indent: usize,
}

#[derive(Args, Debug)]
struct LoadConfig {
    /// JSON file made by save_config (standard input when absent)
    #[arg(short = 'j', long = "json-conf", value_name = "FILE")]
    json_conf: Option<PathBuf>,
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

/// What to do once the command line is understood.
enum Action {
    /// One call: its result is printed.
    Call(String, Option<Value>),
    SaveConfig { indent: usize },
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
            Cmd::BdevMallocCreate(a) => Some(sized_bdev_params(a.name, a.uuid, a.total_size, a.block_size)?),
            Cmd::BdevMallocDelete(a) => to_params(&a)?,
            Cmd::BdevNullCreate(a) => Some(sized_bdev_params(Some(a.name), a.uuid, a.total_size, a.block_size)?),
            Cmd::BdevNullDelete(a) => to_params(&a)?,
            Cmd::BdevGetBdevs(a) => to_params(&a)?,
            Cmd::SaveConfig(a) => return Ok(Action::SaveConfig { indent: a.indent }),
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

/// `{name?, num_blocks, block_size, uuid?}` from a size in MiB, refusing a size that is
/// not a whole number of blocks (as rpc.py does) rather than silently rounding it down.
fn sized_bdev_params(
    name: Option<String>,
    uuid: Option<String>,
    total_size_mib: f64,
    block_size: u32,
) -> Result<Value, UsageError> {
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
    let mut p = json!({ "num_blocks": num_blocks, "block_size": block_size });
    if let Some(obj) = p.as_object_mut() {
        if let Some(name) = name {
            obj.insert("name".into(), Value::String(name));
        }
        if let Some(uuid) = uuid {
            obj.insert("uuid".into(), Value::String(uuid));
        }
    }
    Ok(p)
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
        Action::SaveConfig { indent } => ("save_config".to_string(), client.save_config().map(|v| Some(pretty(&v, indent)))),
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
