//! `riser-rpc apply FILE [--dry-run] [--force]`: makes the running node's configuration the
//! one in FILE (save_config's format) with live calls, sessions kept. [`plan`] computes the
//! ordered steps from the node's own save_config (a pure function, one [`plan::Section`] per
//! part of the configuration: [`sections`], [`nodes`], [`qos`]); this file fetches what it needs,
//! prints the plan and runs it step by step through the client.
//!
//! Exit status: 0 done or nothing to change, 1 refused or a step failed, 2 usage.

pub mod nodes;
pub mod plan;
pub mod qos;
pub mod sections;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use riser_rpc::client::RpcClient;
use serde_json::Value;

use plan::{make_plan, Config, Plan, Session};

/// `riser-rpc apply --help` (the one-line help is the `Cmd::Apply` variant's).
pub(crate) const LONG_HELP: &str = "Make the running node's configuration the one in FILE (save_config's format), with live calls \
                  and without dropping sessions.\n\n\
                  Compares FILE with the node's own save_config and prints the plan: what is created, changed and \
                  removed (bdevs and their sizes, iobuf and iSCSI options, portal, initiator and auth groups, target \
                  nodes with their LUNs, maps, CHAP policy, ALUA and redirects, a portal group's discovery CHAP, rate limits of \
                  devices and of initiators on LUNs) and which live sessions each step \
                  affects; then runs it in a safe order (devices before the LUNs that use them, LUNs and maps removed \
                  before their devices and groups are deleted).\n\n\
                  Refused without --force: removing a LUN of a target with sessions (they may have I/O on it), \
                  deleting a target node or portal group with sessions. A change no call makes live (a portal \
                  group's portals, a device's type or block size, a node's queue depth) deletes and creates the object \
                  again when nothing uses it (a target node with sessions: only with --force); otherwise it is refused, \
                  naming the field.\n\n\
                  Applying the node's own save_config output changes nothing.\n\n\
                  Exit status: 0 done or nothing to change, 1 refused or a step failed (the steps already done are \
                  listed), 2 usage.";

#[derive(Args, Debug)]
pub(crate) struct Apply {
    /// Configuration to apply (as written by save_config)
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,
    /// Print the plan, change nothing
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Also remove LUNs, target nodes and portal groups that have sessions (those sessions
    /// lose them or are closed)
    #[arg(long)]
    pub(crate) force: bool,
}

/// The wanted configuration, from FILE (a usage error when unreadable).
pub(crate) fn read(args: &Apply) -> Result<Config, String> {
    let text = std::fs::read_to_string(&args.file).map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", args.file.display()))?;
    Config::from_json(&v).map_err(|e| format!("{}: {e}", args.file.display()))
}

/// Fetches the node's configuration and sessions, prints the plan, runs it.
pub(crate) fn run(client: &mut RpcClient, args: &Apply, wanted: &Config) -> ExitCode {
    let fetched = client.save_config().map_err(|e| format!("save_config: {e}")).and_then(|v| Config::from_json(&v)).and_then(|cur| {
        let conns = client.call("iscsi_get_connections", None).map_err(|e| format!("iscsi_get_connections: {e}"))?;
        let sessions: Vec<Session> = conns.as_array().map(|a| a.iter().map(Session::from_json).collect()).unwrap_or_default();
        Ok((cur, sessions))
    });
    let (current, sessions) = match fetched {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let plan = make_plan(&current, wanted, &sessions);
    if plan.is_empty() {
        println!("nothing to change");
        return ExitCode::SUCCESS;
    }
    print_plan(&plan);
    if !plan.refusals.is_empty() {
        eprintln!("error: refused, nothing changed:");
        for r in &plan.refusals {
            eprintln!("  - {r}");
        }
        return ExitCode::from(1);
    }
    if !args.force && plan.needs_force().next().is_some() {
        eprintln!("error: refused without --force, nothing changed:");
        for s in plan.needs_force() {
            eprintln!("  - {}: {}", s.what, s.force.as_deref().unwrap_or_default());
        }
        return ExitCode::from(1);
    }
    if args.dry_run {
        println!("dry run: nothing changed");
        return ExitCode::SUCCESS;
    }
    let n = plan.steps.len();
    for (i, step) in plan.steps.iter().enumerate() {
        if let Err(e) = client.call(step.method, Some(step.params.clone())) {
            eprintln!("error: step {}/{n} failed: {step}: {e}", i + 1);
            if i == 0 {
                eprintln!("nothing was changed");
            } else {
                eprintln!("already done: steps 1 to {i} (listed above as ok)");
            }
            return ExitCode::from(1);
        }
        println!("[{}/{n}] ok: {step}", i + 1);
    }
    println!("applied {n} step(s)");
    ExitCode::SUCCESS
}

/// `plan (N steps):`, one numbered line per step with the sessions it affects.
fn print_plan(plan: &Plan) {
    println!("plan ({} step(s)):", plan.steps.len());
    for (i, s) in plan.steps.iter().enumerate() {
        println!("  {}. {s}", i + 1);
        for session in &s.sessions {
            println!("       affects {session}");
        }
        if let Some(why) = &s.force {
            println!("       needs --force: {why}");
        }
    }
}

#[cfg(test)]
mod tests;
