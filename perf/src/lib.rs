//! `riser-perf`: benchmarks for riser, as a library (the `riser-perf` binary is a thin CLI
//! over it, `src/main.rs`).
//!
//! Two ways of generating load, sharing [`report`]:
//! - `riser-perf [flags] URL...` (the default): an iSCSI initiator of its own ([`init`],
//!   [`conn`], [`iser`]) that drives any target (riser, tgt, LIO, ...) over TCP or iSER from
//!   polled client threads, or checks data integrity with `--verify`.
//! - `riser-perf bdev ...`: in-process, bdevperf-like ([`bdev`]).
//! - `riser-perf chart RESULTS.json -o FILE.svg`: the table and chart of a benchmark matrix
//!   ([`plot`], which also draws `--plot FILE.svg`, the latency chart of one run).
//!
//! The initiator's protocol logic, free of I/O, is riser-initiator's (sequence numbers, the
//! login exchange, task bookkeeping, the handling of received PDUs, SCSI CDBs and sense,
//! target URLs): [`conn`] and [`iser`] keep only their I/O and plug it in through
//! [`riser_initiator::session::Transport`].

pub mod bdev;
pub mod conn;
pub mod cost;
#[cfg(test)]
mod fake_target;
pub mod init;
pub mod iser;
pub mod plot;
pub mod report;
pub mod sys;
pub mod transport;
pub mod verify;
pub mod workload;

/// Longest --time / --ramp of both modes: a week (deadlines never overflow an `Instant`).
pub const MAX_SECONDS: u64 = 7 * 24 * 3600;

/// The I/O buffers one worker preallocates (a bdev reactor: qd x bs; an initiator client
/// thread: sessions x qd x bs) may not exceed this.
pub const MAX_BUFFER_BYTES: u64 = 4 << 30;

/// Checks a numeric flag: `--flag V is out of range: use LO to HI[ unit]`.
pub fn in_range(flag: &str, v: u64, lo: u64, hi: u64, unit: &str) -> Result<(), String> {
    if v < lo || v > hi {
        return Err(format!(
            "{flag} {v} is out of range: use {lo} to {hi}{unit}"
        ));
    }
    Ok(())
}

/// The checks both modes make of --time, --ramp and --rwmixread.
pub fn check_run_flags(time: u64, ramp: u64, rwmixread: u64) -> Result<(), String> {
    in_range("--time", time, 1, MAX_SECONDS, " seconds")?;
    in_range("--ramp", ramp, 0, MAX_SECONDS, " seconds")?;
    in_range("--rwmixread", rwmixread, 0, 100, "")
}
