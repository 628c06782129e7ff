//! Framework methods: version, method list, reactors, subsystems and their config.

use std::sync::{Arc, OnceLock};

use riser_rpc::params::{FrameworkGetConfig, NoParams, RpcGetMethods};
use riser_rpc::{RpcError, RpcRegistry};
use serde_json::{json, Value};

use crate::App;

/// Subsystems in dependency order, as `framework_get_subsystems` lists them.
const SUBSYSTEMS: &[(&str, &[&str])] = &[("iobuf", &[]), ("bdev", &["iobuf"]), ("iscsi", &["bdev"])];

static METHODS: OnceLock<Vec<String>> = OnceLock::new();

/// The config (list of calls) of one subsystem, in an order that replays cleanly.
pub fn subsystem_config(app: &App, name: &str) -> Option<Vec<Value>> {
    match name {
        "bdev" => {
            // The namespaces of one NVMe controller share one attach call: each call once.
            // Ceph clusters first: the RBD bdevs name them.
            let mut calls: Vec<Value> = app.bdevs().rbd_cluster_calls();
            for (b, _) in app.bdevs().iter() {
                let (method, params) = b.config_json();
                let call = json!({"method": method, "params": params});
                if !calls.contains(&call) {
                    calls.push(call);
                }
            }
            calls.extend(riser_bdev::rpc::qos_config_calls(&app.bdevs()));
            Some(calls)
        }
        "iscsi" => Some(app.target.config_json()),
        "iobuf" => Some(crate::iobuf::config_json()),
        _ => None,
    }
}

pub fn register(reg: &mut RpcRegistry, app: &Arc<App>) {
    reg.add("spdk_get_version", |_: NoParams| {
        let (major, minor, patch) = (
            env!("CARGO_PKG_VERSION_MAJOR").parse::<u32>().unwrap_or(0),
            env!("CARGO_PKG_VERSION_MINOR").parse::<u32>().unwrap_or(0),
            env!("CARGO_PKG_VERSION_PATCH").parse::<u32>().unwrap_or(0),
        );
        Ok(json!({
            "version": format!("riser v{}", env!("CARGO_PKG_VERSION")),
            "fields": {"major": major, "minor": minor, "patch": patch, "suffix": ""}
        }))
    });
    reg.add("rpc_get_methods", |_: RpcGetMethods| {
        Ok(json!(METHODS.get().cloned().unwrap_or_default()))
    });
    let a = app.clone();
    reg.add("framework_get_reactors", move |_: NoParams| {
        let reactors: Vec<Value> = a
            .reactors
            .stats()
            .into_iter()
            .map(|s| {
                json!({
                    "lcore": s.core,
                    "busy": s.busy_ns,
                    "idle": s.idle_ns,
                    "in_interrupt": s.sleeping,
                    "pollers": s.pollers,
                    "messages": s.messages,
                    "connections": s.load,
                    // Loop passes and those that found work (riser's own; SPDK has none).
                    "passes": s.passes,
                    "busy_passes": s.busy_passes,
                    // Adaptive sleeps ended by a wake-up descriptor (not by their timeout).
                    "woken": s.woken,
                    // Idle spells in which a spinning reactor yielded its core.
                    "yields": s.yields,
                    // Adaptive mode: how long it spins idle before it sleeps, now.
                    "spin_ns": s.spin_ns,
                    // Poller invocations (each pass calls every registered poller).
                    "poller_calls": s.poller_calls,
                })
            })
            .collect();
        let mode = match a.reactors.mode() {
            riser_reactor::PollMode::Busy => "busy",
            riser_reactor::PollMode::Adaptive => "adaptive",
        };
        // Counters are in nanoseconds, so the "tick" is one ns.
        Ok(json!({"tick_rate": 1_000_000_000u64, "poll_mode": mode, "reactors": reactors}))
    });
    reg.add("framework_get_subsystems", |_: NoParams| {
        Ok(Value::Array(
            SUBSYSTEMS.iter().map(|(n, d)| json!({"subsystem": n, "depends_on": d})).collect(),
        ))
    });
    let a = app.clone();
    reg.add("framework_get_config", move |p: FrameworkGetConfig| {
        subsystem_config(&a, &p.name)
            .map(Value::Array)
            .ok_or_else(|| RpcError::not_found(format!("subsystem {} not found", p.name)))
    });
}

/// Freezes the registry, recording the method list for `rpc_get_methods`.
pub fn finish(reg: RpcRegistry) -> Arc<RpcRegistry> {
    let _ = METHODS.set(reg.methods().to_vec());
    Arc::new(reg)
}
