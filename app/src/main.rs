//! `riser`: the daemon. Parses flags, starts the reactors and the JSON-RPC server, replays a
//! config file, and shuts everything down cleanly on SIGINT / SIGTERM.

mod config;
mod framework;
mod iobuf;
mod logging;
mod metrics;
mod service;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Parser;
use riser_bdev::BdevRegistry;
use riser_reactor::{parse_core_mask, PollMode, ReactorConfig, ReactorHandle, ReactorSet};
use riser_rpc::server::{group_id, SocketAccess};
use riser_rpc::{RpcRegistry, RpcServer};
use riser_config::IscsiTarget;
use riser_datamover::{IserPortal, TcpPortal};
use riser_server::IscsiServer;

/// riser: a user-space, polled-mode iSCSI target with an iSER (RDMA) datamover.
///
/// Configure it over JSON-RPC (SPDK's method names; see `riser-rpc --help`) or start it from a
/// config file saved with `riser-rpc save_config`.
#[derive(Parser, Debug)]
#[command(name = "riser", version, about, long_about = None)]
struct Args {
    /// Core mask for the reactors, one pinned polling thread per core: hex (0x3) or list ([0,2], [0-3]).
    #[arg(short = 'm', long = "cpumask", default_value = "0x1")]
    cpumask: String,

    /// Path of the JSON-RPC Unix socket: created mode 0600 (riser's user only). An existing path is refused, except a stale socket a dead riser left (replaced).
    #[arg(short = 'r', long = "rpc-socket", default_value = riser_rpc::DEFAULT_SOCKET)]
    rpc_socket: PathBuf,

    /// Let this group (a name from /etc/group, or a number) use the JSON-RPC socket too: mode 0660, owned by that group.
    #[arg(long = "rpc-group", value_name = "GROUP")]
    rpc_group: Option<String>,

    /// Start from this config file (the format `riser-rpc save_config` prints).
    #[arg(long = "json", value_name = "FILE", conflicts_with = "default_config")]
    json: Option<PathBuf>,

    /// Start from the built-in default config (a 64 MiB malloc bdev Malloc0); see --print-default-config.
    #[arg(long)]
    default_config: bool,

    /// Print the built-in default config and exit.
    #[arg(long)]
    print_default_config: bool,

    /// busy: reactors spin (lowest latency, one core each at 100%); adaptive: they sleep when idle (small machines, CI).
    #[arg(long, default_value = "busy", value_parser = parse_poll_mode)]
    poll_mode: PollMode,

    /// Log level: error, warn, info, debug or trace.
    #[arg(long, default_value = "info", value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: String,

    /// Do not pin reactor threads to their cores.
    #[arg(long)]
    no_pin: bool,

    /// Directory for state that outlives the process: persistent reservations made with APTPL=1 (one file per device UUID and LUN).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/riser")]
    state_dir: PathBuf,

    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
}

fn parse_poll_mode(s: &str) -> Result<PollMode, String> {
    s.parse()
}

/// Everything the control plane owns. The data path holds only `Arc`s into it.
pub struct App {
    pub bdevs: Arc<Mutex<BdevRegistry>>,
    pub target: Arc<IscsiTarget>,
    pub server: Arc<IscsiServer>,
    pub reactors: ReactorHandle,
}

impl App {
    /// The registry lock; a poisoned lock (a panicked RPC thread) is still usable data.
    pub fn bdevs(&self) -> std::sync::MutexGuard<'_, BdevRegistry> {
        self.bdevs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_default_config {
        print!("{}", config::DEFAULT_CONFIG);
        return ExitCode::SUCCESS;
    }
    logging::init_logging(&args.log_level);
    exit_on_reactor_panic();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            eprintln!("riser: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A panic on a reactor thread is a bug that leaves that reactor's connections and pollers
/// dead while the process lives on, so initiators would hang on it: riser says so and exits
/// (status 70), for its service manager to restart it; initiators log in again.
fn exit_on_reactor_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        let thread = std::thread::current();
        if let Some(name) = thread.name().filter(|n| n.starts_with("reactor_")) {
            log::error!("{name} panicked (a bug in riser: {info}); exiting so that riser is restarted");
            eprintln!("riser: {name} panicked; exiting");
            std::process::exit(70);
        }
    }));
}

fn run(args: Args) -> Result<(), String> {
    // Checked before anything starts: a wrong group is a wrong command line.
    let rpc_access = SocketAccess {
        group: args.rpc_group.as_deref().map(group_id).transpose().map_err(|e| format!("--rpc-group: {e}"))?,
    };
    let cores = parse_core_mask(&args.cpumask).map_err(|e| format!("-m {}: {e}", args.cpumask))?;
    let reactors = ReactorSet::start(ReactorConfig {
        cores,
        mode: args.poll_mode,
        ring_size: 4096,
        pin: !args.no_pin,
    })
    .map_err(|e| format!("cannot start reactors: {e}"))?;

    let bdevs = Arc::new(Mutex::new(BdevRegistry::new()));
    let target = Arc::new(IscsiTarget::new(bdevs.clone()));
    // Before the config loads: its LUNs restore their persistent reservations from here.
    if let Err(e) = std::fs::create_dir_all(&args.state_dir) {
        log::warn!("state directory {}: {e}; PERSISTENT RESERVE OUT with APTPL=1 will fail until it can be written", args.state_dir.display());
    }
    target.set_state_dir(Some(args.state_dir.clone()));
    let server = IscsiServer::new(target.clone(), reactors.handle(), vec![Arc::new(TcpPortal), Arc::new(IserPortal)]);
    let app = Arc::new(App { bdevs, target: target.clone(), server: server.clone(), reactors: reactors.handle() });
    let mut registry = RpcRegistry::new();
    framework::register(&mut registry, &app);
    iobuf::register(&mut registry);
    logging::register(&mut registry);
    riser_bdev::rpc::register(&mut registry, &app.bdevs);
    riser_config::rpc::register(&mut registry, target.clone());
    riser_server::rpc::register(&mut registry, &server);
    let registry = framework::finish(registry);

    if let Some(path) = &args.json {
        // It may hold CHAP secrets: overwritten once loaded.
        let text = zeroize::Zeroizing::new(
            std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?,
        );
        config::load(&registry, &text).map_err(|e| format!("config {}: {e}", path.display()))?;
        log::info!("loaded config {}", path.display());
    } else if args.default_config {
        config::load(&registry, config::DEFAULT_CONFIG).map_err(|e| format!("default config: {e}"))?;
        log::info!("loaded the built-in default config");
    }

    server.sync_listeners();
    if let Some(addr) = &args.metrics {
        metrics::start(addr, app.clone())?;
    }

    let signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM]);
    let mut signals = signals.map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let server = RpcServer::start_with(&args.rpc_socket, registry, rpc_access)
        .map_err(|e| format!("cannot listen on {}: {e}", args.rpc_socket.display()))?;
    log::info!("riser {} ready", env!("CARGO_PKG_VERSION"));
    service::notify("READY=1");

    let sig = signals.forever().next();
    log::info!("signal {}: shutting down", sig.unwrap_or(0));
    service::notify("STOPPING=1");
    server.shutdown();
    app.server.shutdown();
    reactors.shutdown();
    log::info!("riser stopped");
    bound_teardown(TEARDOWN_GRACE);
    Ok(())
}

/// How long the devices may take to close once the reactors have stopped: well within the
/// service unit's `TimeoutStopSec=30`.
const TEARDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// Once the reactors have stopped, nothing is in flight and every acknowledged write is on
/// its device; what remains is closing the devices (the bdevs drop as `run` returns). Each
/// wait for a backend that does not answer is bounded (an RBD image of a cluster that went
/// away: 2 s per shared-state watch, 5 s per gateway group), but they add up over the
/// devices one after another, past the service manager's stop timeout, which would kill
/// riser without a word. A watchdog thread ends the process after `grace` instead, with a
/// log line that says so; a teardown that finishes first exits normally and the watchdog
/// goes with the process.
fn bound_teardown(grace: std::time::Duration) {
    let spawned = std::thread::Builder::new().name("teardown-watchdog".into()).spawn(move || {
        std::thread::sleep(grace);
        log::warn!(
            "closing the devices did not finish within {} s after the reactors stopped (a backend that does not answer, e.g. an unreachable Ceph cluster); exiting without waiting for it",
            grace.as_secs()
        );
        std::process::exit(0);
    });
    if let Err(e) = spawned {
        log::warn!("cannot start the teardown watchdog ({e}); closing the devices without a bound");
    }
}
