//! Live sessions after a change of the rules (issue 26, item 2). On the control thread of the
//! RPC that made the change, never on a reactor:
//! - a change of access rules (the configuration's access-changed hook): every live
//!   connection is checked against the rules as they are now ([`IscsiTarget::recheck`]);
//!   one they no longer admit is asked to log out through its [`crate::logout::LogoutSlot`],
//!   as `iscsi_target_node_request_logout` asks (its reactor sends the Async Message and drops
//!   it after the wait); one still admitted is left alone;
//! - a portal group deleted: the connections that came in through its portals are closed,
//!   and only those.
//!
//! [`IscsiTarget::recheck`]: riser_config::IscsiTarget::recheck

use std::net::{IpAddr, SocketAddr};

use riser_config::node::LOGOUT_REQUEST_TIMEOUT;
use riser_config::recheck::SessionOf;

use crate::logout::LogoutRequest;
use crate::registry::ConnInfo;
use crate::IscsiServer;

/// The initiator's address of a connection (as `iscsi_get_connections` shows it).
fn peer_ip(c: &ConnInfo) -> Option<IpAddr> {
    c.initiator_addr.parse::<SocketAddr>().ok().map(|a| a.ip())
}

/// "connection 7 (TSIH 3, INITIATOR from ADDR to TARGET through portal group 1)".
fn describe(c: &ConnInfo) -> String {
    let to = if c.target_node_name.is_empty() { "discovery" } else { c.target_node_name.as_str() };
    format!(
        "connection {} (TSIH {}, {} from {} to {to} through portal group {})",
        c.id, c.tsih, c.initiator_name, c.initiator_addr, c.pg_tag
    )
}

impl IscsiServer {
    /// Checks every live connection against the rules as they are now, after `cause`
    /// changed them; a connection they no longer admit is asked to log out within
    /// [`LOGOUT_REQUEST_TIMEOUT`] seconds (then dropped), and the log says which and why
    /// (once: a connection already asked is skipped). Returns how many were asked.
    pub fn recheck_sessions(&self, cause: &str) -> usize {
        let mut asked = 0;
        // A connection already asked (by an earlier change, or iscsi_target_node_request_logout)
        // is on its way out: asked and logged once.
        for c in self.conns.list().into_iter().filter(|c| !c.logout.requested()) {
            let Some(addr) = peer_ip(&c) else { continue };
            let node = (!c.target_node_name.is_empty()).then_some(c.target_node_name.as_str());
            let s = SessionOf { node, initiator_name: &c.initiator_name, addr, pg_tag: c.pg_tag, auth: &c.auth };
            if let Err(why) = self.target.recheck(s) {
                let wait = LOGOUT_REQUEST_TIMEOUT;
                log::warn!("{}: {why} (after {cause}): asked to log out within {wait} s", describe(&c));
                c.logout.request(LogoutRequest { time2wait: wait, why: format!("{why}, after {cause}") });
                asked += 1;
            }
        }
        asked
    }

    /// Portal group `tag` was deleted (its listeners are stopping): closes the connections
    /// that came in through its portals, naming them in the log; the others go on. Returns
    /// how many.
    pub fn close_portal_group(&self, tag: u32) -> usize {
        let closing: Vec<String> = self.conns.list().iter().filter(|c| c.pg_tag == tag).map(|c| describe(c)).collect();
        let n = self.conns.kill_where(|c| c.pg_tag == tag);
        if closing.is_empty() {
            log::info!("portal group {tag} deleted: no connection came in through it");
        } else {
            log::warn!("portal group {tag} deleted: closing {n} connection(s): {}", closing.join("; "));
        }
        n
    }
}
