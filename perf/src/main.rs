//! `riser-perf`: benchmarks for riser. The command line over the `riser_perf` library:
//! - `riser-perf [flags] URL...` (the default): the iSCSI initiator mode ([`init`]).
//! - `riser-perf bdev ...`: in-process, bdevperf-like ([`bdev`]).
//! - `riser-perf chart RESULTS.json -o FILE.svg`: the table and chart of a benchmark matrix
//!   ([`plot`]).
//!
//! Clap sees the first non-flag argument: the name of a subcommand selects it, anything else
//! is a URL of the initiator mode (`args_conflicts_with_subcommands`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use riser_perf::{bdev, init, plot};

#[derive(Parser, Debug)]
#[command(
    name = "riser-perf",
    version,
    about = "Benchmarks for riser: an iSCSI initiator load generator (riser-perf [flags] URL...) and an in-process block benchmark (riser-perf bdev)",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    init: init::InitArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// In-process block benchmark (like SPDK's bdevperf): one device, QD I/Os kept
    /// outstanding by every reactor of the core mask, IOPS and latency percentiles.
    Bdev(bdev::BdevArgs),
    /// The benchmark matrix of scripts/bench-perf-matrix.sh: reads its RESULTS.json (the
    /// --json reports of every run), prints the medians and ratios as a table, writes the
    /// chart (-o FILE.svg) and the medians (--summary FILE.json).
    Chart(plot::ChartArgs),
}

fn main() -> ExitCode {
    // Log lines (e.g. "could not pin") go to stderr; RUST_LOG overrides.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::Bdev(args)) => bdev::main(args).map(|_| true),
        Some(Command::Chart(args)) => plot::chart_main(args).map(|_| true),
        None => init::main(&cli.init),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
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
        let Some(Command::Bdev(a)) = cli.command else {
            panic!("bdev subcommand expected")
        };
        assert_eq!(a.bdev, bdev::DevKind::Malloc);
        assert_eq!(a.bs, 8192);
        assert_eq!(a.cpumask, "0x2");
        assert!(a.json);
    }

    #[test]
    fn urls_select_the_initiator_mode() {
        let cli = Cli::try_parse_from([
            "riser-perf",
            "--rw",
            "randwrite",
            "--bs",
            "8192",
            "--qd",
            "8",
            "-m",
            "0x3",
            "iscsi://127.0.0.1/iqn.x:y/0",
            "iscsi://127.0.0.1:3265/iqn.x:z/1",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.init.urls.len(), 2);
        let p = cli.init.plan().unwrap();
        assert_eq!((p.bs, p.qd, p.cores.len()), (8192, 8, 2));
        // A URL first, flags after it, also works.
        let cli = Cli::try_parse_from(["riser-perf", "iscsi://h/iqn.x/0", "--qd", "4"]).unwrap();
        assert_eq!(cli.init.qd, 4);
        // Initiator flags before a subcommand make it a URL, which the plan refuses.
        let cli = Cli::try_parse_from(["riser-perf", "--qd", "4", "bdev"]).unwrap();
        assert!(cli
            .init
            .plan()
            .unwrap_err()
            .contains("riser-perf bdev [flags]"));
        // The chart subcommand.
        let cli = Cli::try_parse_from(["riser-perf", "chart", "r.json", "-o", "m.svg"]).unwrap();
        let Some(Command::Chart(a)) = cli.command else {
            panic!("chart subcommand expected")
        };
        assert_eq!(a.input.to_str(), Some("r.json"));
        assert_eq!(a.output.as_deref().and_then(|p| p.to_str()), Some("m.svg"));
        assert!(Cli::try_parse_from(["riser-perf", "chart"]).is_err());
        // --plot belongs to the initiator mode.
        let cli =
            Cli::try_parse_from(["riser-perf", "--plot", "l.svg", "iscsi://h/iqn.x/0"]).unwrap();
        assert_eq!(
            cli.init
                .plan()
                .unwrap()
                .plot
                .as_deref()
                .and_then(|p| p.to_str()),
            Some("l.svg")
        );
        // No arguments at all: parses, and the plan says what is missing.
        let cli = Cli::try_parse_from(["riser-perf"]).unwrap();
        assert!(cli.init.plan().unwrap_err().contains("no target URL"));
    }
}
