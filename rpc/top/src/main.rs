//! `riser-top`: a live terminal view of a running riser, like SPDK's `spdk_top`: reactors
//! (busy %, connections), connections (initiator, transport, reactor, queue depth) and
//! devices (IOPS, MiB/s, latency), read over riser's JSON-RPC socket every interval.
//!
//! `model.rs` turns RPC answers into rows (no I/O, no drawing), `fetch.rs` reads riser on a
//! thread of its own, `app.rs` holds the screen's state and keys, `view.rs` draws.

mod app;
mod fetch;
mod model;
mod view;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ratatui::crossterm::event::{self, Event};
use ratatui::DefaultTerminal;
use riser_rpc::client::DEFAULT_SOCKET_PATH;

use crate::app::{Action, App};
use crate::fetch::Cmd;

#[derive(Parser, Debug)]
#[command(
    name = "riser-top",
    version,
    about = "A live view of a running riser: reactors, connections and devices, refreshed every interval",
    after_help = "\
Tabs:
  1 Reactors     busy % over the last interval (framework_get_reactors), connections, pollers
  2 Connections  initiator, address, target, transport, reactor, queue depth (SCSI tasks in
                 flight), tasks completed per second (iscsi_get_connections)
  3 Devices      IOPS, MiB/s and mean latency over the last interval (bdev_get_iostat), queue
                 depth, p50/p99 latency since the histogram was enabled (bdev_get_histogram)

Keys:
  Tab, Shift-Tab, 1 2 3   switch tabs
  s, S                    sort by the next / previous column (the header marks it: ▼ biggest first)
  r                       reverse the sort order
  h                       latency histograms of every device on / off (bdev_enable_histogram)
  q, Esc, Ctrl-C          quit

A value riser does not give shows as \"-\". When riser goes away the screen says so and
riser-top keeps retrying."
)]
struct Cli {
    /// Path of riser's RPC socket
    #[arg(
        short = 'r',
        long = "rpc-socket",
        visible_short_alias = 's',
        visible_alias = "server",
        value_name = "SOCK",
        default_value = DEFAULT_SOCKET_PATH
    )]
    rpc_socket: PathBuf,

    /// Seconds between refreshes
    #[arg(short = 'i', long = "interval", value_name = "SECS", default_value = "1", value_parser = parse_interval)]
    interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() || !(0.1..=3600.0).contains(&secs) {
        return Err("the interval must be between 0.1 and 3600 seconds".into());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // SIGTERM / SIGHUP end the loop like `q` does, so the terminal is restored.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("riser-top: cannot handle signal {sig}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let (cmds, msgs, fetcher) = match fetch::spawn(cli.rpc_socket.clone(), cli.interval) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("riser-top: cannot start the fetch thread: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Raw mode and the alternate screen; ratatui's panic hook puts the terminal back
    // before the panic message is printed.
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("riser-top: cannot set up the terminal: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut app = App::new(cli.rpc_socket, cli.interval);
    let result = run(&mut terminal, &mut app, &cmds, &msgs, &stop);
    ratatui::restore();
    let _ = cmds.send(Cmd::Quit);
    drop(msgs);
    let _ = fetcher.join();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("riser-top: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The main loop: samples in, keys in, a redraw when anything changed.
fn run(
    terminal: &mut DefaultTerminal,
    app: &mut App,
    cmds: &std::sync::mpsc::Sender<Cmd>,
    msgs: &std::sync::mpsc::Receiver<fetch::Msg>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut dirty = true;
    let mut last_draw = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        loop {
            match msgs.try_recv() {
                Ok(m) => {
                    app.on_msg(m);
                    dirty = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Err(std::io::Error::other("the fetch thread ended")),
            }
        }
        // Once a second anyway: the "down for N s" clock moves without samples.
        if dirty || last_draw.elapsed() >= Duration::from_secs(1) {
            terminal.draw(|f| view::draw(f, app))?;
            dirty = false;
            last_draw = std::time::Instant::now();
        }
        if !event::poll(Duration::from_millis(50))? {
            continue;
        }
        match event::read()? {
            Event::Key(k) => match app.on_key(k) {
                Action::Quit => return Ok(()),
                Action::Histograms(on) => {
                    let _ = cmds.send(Cmd::Histograms(on));
                    dirty = true;
                }
                Action::Redraw => dirty = true,
                Action::None => {}
            },
            Event::Resize(..) => dirty = true,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_flags() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["riser-top", "-r", "/tmp/x.sock", "--interval", "0.5"]).expect("parses");
        assert_eq!(c.rpc_socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(c.interval, Duration::from_millis(500));
        let c = Cli::try_parse_from(["riser-top", "-s", "/tmp/y.sock"]).expect("riser-rpc's -s works too");
        assert_eq!(c.rpc_socket, PathBuf::from("/tmp/y.sock"));
        assert_eq!(Cli::try_parse_from(["riser-top"]).expect("defaults").rpc_socket, PathBuf::from(DEFAULT_SOCKET_PATH));
        assert!(Cli::try_parse_from(["riser-top", "--interval", "0"]).is_err());
        assert!(Cli::try_parse_from(["riser-top", "--interval", "abc"]).is_err());
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("sort by the next") && help.contains("histograms"), "{help}");
    }
}
