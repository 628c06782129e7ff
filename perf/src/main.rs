//! `riser-perf`: benchmarks for riser.
//!
//! Each way of generating load is a subcommand with its own module; `report` formats the
//! results of any of them. Today: `bdev` (in-process, bdevperf-like). The iSCSI/iSER
//! initiator mode (`riser-perf [flags] URL...`) will be added as positional URLs on [`Cli`]
//! (with `args_conflicts_with_subcommands`) next to the subcommands, reusing `report`.

mod bdev;
mod report;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "riser-perf",
    version,
    about = "Benchmarks for riser: block devices in process, and (later) iSCSI/iSER targets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// In-process block benchmark (like SPDK's bdevperf): one device, QD I/Os kept
    /// outstanding by every reactor of the core mask, IOPS and latency percentiles.
    Bdev(bdev::BdevArgs),
}

fn main() -> ExitCode {
    // Reactor and bdev log lines (e.g. "could not pin") go to stderr; RUST_LOG overrides.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Bdev(args) => bdev::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("riser-perf: error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent_and_bdev_parses() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "riser-perf",
            "bdev",
            "--bdev",
            "malloc",
            "--bs",
            "8192",
            "-m",
            "0x2",
            "--json",
        ])
        .unwrap();
        let Command::Bdev(a) = cli.command;
        assert_eq!(a.bdev, bdev::DevKind::Malloc);
        assert_eq!(a.bs, 8192);
        assert_eq!(a.cpumask, "0x2");
        assert!(a.json);
        assert!(Cli::try_parse_from(["riser-perf"]).is_err());
    }
}
