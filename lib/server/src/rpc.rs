//! The iSCSI server's methods: `iscsi_get_connections`, `iscsi_get_stats` and
//! `iscsi_target_node_request_logout` (SPDK's names).

use std::sync::Arc;

use riser_config::node::{IscsiTargetNodeRequestLogout, LOGOUT_REQUEST_TIMEOUT};
use riser_rpc::params::NoParams;
use riser_rpc::{RpcError, RpcRegistry};
use serde_json::{json, Value};

use crate::IscsiServer;

/// Registers the server's methods on `reg`.
pub fn register(reg: &mut RpcRegistry, server: &Arc<IscsiServer>) {
    let s = server.clone();
    reg.add("iscsi_get_connections", move |_: NoParams| {
        Ok(Value::Array(s.connections().list().iter().map(|c| c.to_json()).collect()))
    });
    let s = server.clone();
    reg.add("iscsi_target_node_request_logout", move |p: IscsiTargetNodeRequestLogout| {
        let node = s.target().node_named(&p.name).map_err(RpcError::from)?;
        let wait = p.logout_timeout.unwrap_or(LOGOUT_REQUEST_TIMEOUT);
        if !(1..=3600).contains(&wait) {
            return Err(RpcError::invalid_params(format!("logout_timeout: {wait} is out of range (1..=3600 seconds)")));
        }
        let why = match p.pg_tag {
            Some(t) => format!("iscsi_target_node_request_logout for portal group {t}"),
            None => "iscsi_target_node_request_logout".to_string(),
        };
        s.request_logout(&node, p.pg_tag, wait, &why);
        Ok(Value::Bool(true))
    });
    let s = server.clone();
    reg.add("iscsi_get_stats", move |_: NoParams| {
        // SPDK's shape: connections by state (riser's are running until they are gone).
        // riser's extensions: logins by outcome, failures by reason; payload bytes the CPU
        // copied between I/O buffers and the wire, by direction, since start; staged_bytes:
        // unsolicited data copied a second time, having waited in its segment for its buffer;
        // logins in progress, sessions by type, and connections or sessions refused by a limit
        // (by the option that sets it).
        let running = s.connections().list().len();
        let (normal, discovery) = s.session_counts();
        Ok(json!({
            "invalid": 0, "running": running, "exiting": 0, "idle": 0,
            "logins": s.login_stats().to_json(),
            "logins_in_progress": s.logins_in_progress(),
            "sessions": {"normal": normal, "discovery": discovery},
            "refused": s.refusals().to_json(),
            "payload_copies": crate::registry::copies_json(s.connections().copies()),
        }))
    });
}
