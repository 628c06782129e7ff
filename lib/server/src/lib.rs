//! The iSCSI server: portal listeners over any transport, ONE login driver for every
//! transport, the session table and TSIH, reactor placement, the connection glue between the
//! iSCSI layer, the datamover and SCSI, and the connection registry.
//!
//! Transports reach the server only as trait objects ([`PortalTransport`] listeners yielding
//! [`riser_iscsi::login::LoginTransport`]s): the server names no socket, verb or rdma_cm call.
//!
//! - [`listeners`]: one listener per configured portal, started and stopped as portal groups
//!   change.
//! - [`login`]: the login driver (timeouts, policy and ACLs, reinstatement, RFC 5047's events
//!   in order), a thread per login, bounded in all and per source address.
//! - [`sessions`]: the session table (TSIH, reinstatement, connections joining a session).
//! - [`enable`]: Enable_Datamover: keys to parameters, reactor placement, the connection
//!   moves to its reactor.
//! - [`conn`]: a connection in full-feature phase on its reactor.
//! - [`registry`]: every live connection, for listing and for closing.
//! - [`recheck`]: live sessions after a change of access rules or a portal group deleted.
//! - [`stats`]: login outcomes by reason; refusals by limit (counted, logged rate-limited).
//! - [`rpc`]: `iscsi_get_connections`, `iscsi_get_stats`.

pub mod conn;
pub mod enable;
pub mod listeners;
pub mod login;
pub mod logout;
pub mod recheck;
pub mod registry;
pub mod rpc;
pub mod sessions;
pub mod stats;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use riser_config::{IscsiTarget, TargetNode};
use riser_iscsi::login::PortalTransport;
use riser_iscsi::negotiate::Transport;
use riser_reactor::ReactorHandle;

pub use conn::Connection;
pub use registry::{ConnInfo, ConnRegistry};

use login::LoginSlots;
use sessions::Sessions;
use stats::{LoginStats, Refusals};

/// Everything the listeners and login threads share.
pub struct IscsiServer {
    target: Arc<IscsiTarget>,
    reactors: ReactorHandle,
    conns: Arc<ConnRegistry>,
    sessions: Sessions,
    /// The transports portals can listen with (TCP, iSER).
    transports: Vec<Arc<dyn PortalTransport>>,
    /// Running listeners by (address, transport).
    listeners: Mutex<HashMap<(SocketAddr, Transport), Arc<AtomicBool>>>,
    /// Logins in progress, in all and by source address.
    logins: Arc<LoginSlots>,
    /// Login outcomes by reason.
    login_stats: LoginStats,
    /// Connections and sessions refused by a limit.
    refusals: Refusals,
    stopping: AtomicBool,
}

impl IscsiServer {
    /// A server for `target`'s configuration, running connections on `reactors`, with one
    /// listener kind per transport in `transports`.
    pub fn new(target: Arc<IscsiTarget>, reactors: ReactorHandle, transports: Vec<Arc<dyn PortalTransport>>) -> Arc<IscsiServer> {
        let conns = Arc::new(ConnRegistry::with_reactors(reactors.clone()));
        let server = Arc::new(IscsiServer {
            target: target.clone(),
            reactors,
            conns,
            sessions: Sessions::default(),
            transports,
            listeners: Mutex::new(HashMap::new()),
            logins: Arc::new(LoginSlots::default()),
            login_stats: LoginStats::default(),
            refusals: Refusals::default(),
            stopping: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&server);
        target.on_portals_changed(move || {
            if let Some(s) = weak.upgrade() {
                s.sync_listeners();
            }
        });
        let weak = Arc::downgrade(&server);
        server.conns.on_gone(move |c| {
            if let Some(s) = weak.upgrade() {
                s.connection_gone(c.tsih);
            }
        });
        let weak = Arc::downgrade(&server);
        target.on_node_deleting(move |node| {
            if let Some(s) = weak.upgrade() {
                s.close_node(node);
            }
        });
        let weak = Arc::downgrade(&server);
        target.on_node_sessions(move |node| {
            weak.upgrade().map_or(0, |s| s.node_sessions(node))
        });
        let weak = Arc::downgrade(&server);
        target.on_access_changed(move |cause| {
            if let Some(s) = weak.upgrade() {
                s.recheck_sessions(cause);
            }
        });
        let weak = Arc::downgrade(&server);
        target.on_portal_group_deleted(move |tag| {
            if let Some(s) = weak.upgrade() {
                s.close_portal_group(tag);
            }
        });
        let weak = Arc::downgrade(&server);
        target.on_node_fenced(move |node, why| {
            if let Some(s) = weak.upgrade() {
                s.drop_fenced_sessions(node, why);
            }
        });
        server
    }

    pub fn connections(&self) -> &Arc<ConnRegistry> {
        &self.conns
    }

    /// Login outcomes by reason.
    pub fn login_stats(&self) -> &LoginStats {
        &self.login_stats
    }

    /// Connections and sessions refused by a limit, by the option that sets it.
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// Logins in progress (each on a thread of its own).
    pub fn logins_in_progress(&self) -> usize {
        self.logins.in_progress()
    }

    pub fn target(&self) -> &Arc<IscsiTarget> {
        &self.target
    }

    /// Stops listening and closes every connection.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        for stop in self.listeners.lock().unwrap_or_else(|p| p.into_inner()).values() {
            stop.store(true, Ordering::Release);
        }
        self.conns.kill_where(|_| true);
    }

    fn close_node(&self, node: &Arc<TargetNode>) {
        let name = node.name().to_string();
        let n = self.conns.kill_where(|c| c.target_node_name == name);
        if n > 0 {
            log::info!("target node {name} deleted: closing {n} connection(s)");
            // Let the reactors see the kill flag and tear down before the node goes.
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && self.conns.list().iter().any(|c| c.target_node_name == name) {
                thread::sleep(Duration::from_millis(20));
            }
        }
        self.sessions.forget_target(&name);
    }

    /// This gateway was fenced from the group of a device `node` exports (issue 23): every
    /// session of the node is dropped (its connections closed), so initiators stop waiting
    /// on commands the device fails and retry them on another path. New logins are let in
    /// (the node reports its target port groups unavailable until the gateway rejoins).
    /// Runs on the gateway group's thread; only flags the connections, never waits.
    pub fn drop_fenced_sessions(&self, node: &Arc<TargetNode>, why: &str) {
        let name = node.name().to_string();
        let n = self.conns.kill_where(|c| c.target_node_name == name);
        log::warn!("target node {name}: closing {n} connection(s): {why}");
    }

    /// How many sessions of `node` are logged in (`iscsi_delete_target_node` refuses a node
    /// with sessions unless forced).
    pub fn node_sessions(&self, node: &TargetNode) -> usize {
        let mut tsihs: Vec<u16> =
            self.conns.list().iter().filter(|c| c.target_node_name == node.name()).map(|c| c.tsih).collect();
        tsihs.sort_unstable();
        tsihs.dedup();
        tsihs.len()
    }

    /// `iscsi_target_node_request_logout`: asks every connection of `node` (through
    /// portal group `pg_tag` if given) to log out within `time2wait` seconds; returns how
    /// many were asked.
    pub fn request_logout(&self, node: &TargetNode, pg_tag: Option<u32>, time2wait: u16, why: &str) -> usize {
        let mut n = 0;
        for c in self.conns.list() {
            if c.target_node_name == node.name() && pg_tag.is_none_or(|t| t == c.pg_tag) {
                c.logout.request(logout::LogoutRequest { time2wait, why: why.to_string() });
                n += 1;
            }
        }
        log::info!("target node {}: {n} connection(s) asked to log out within {time2wait} s: {why}", node.name());
        n
    }

    /// Forgets a session once its last connection is gone.
    pub fn connection_gone(&self, tsih: u16) {
        if !self.conns.list().iter().any(|c| c.tsih == tsih) {
            self.sessions.forget(tsih);
        }
    }

    /// Sessions in the table, normal and discovery.
    pub fn sessions_count(&self) -> usize {
        self.sessions.len()
    }
}
