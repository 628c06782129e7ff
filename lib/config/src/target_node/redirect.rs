//! Login redirection (SPDK's `iscsi_target_node_set_redirect`): while a node's portal group
//! has a redirect address, new logins to the node through that group are answered with
//! Target moved temporarily (0x0101) and `TargetAddress=host:port,tag`; sessions already
//! logged in are untouched.

use std::net::IpAddr;
use std::sync::Arc;

use riser_rpc::RpcRegistry;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::TargetNode;
use crate::rpc::ok;
use crate::{IscsiTarget, TargetError};

/// `iscsi_target_node_set_redirect` (SPDK): an absent or empty `redirect_host` clears it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeSetRedirect {
    /// Target node name (full, or as given to iscsi_create_target_node)
    pub name: String,
    /// Portal group tag (public, mapped to the node) whose logins are redirected
    pub pg_tag: u32,
    /// Numeric IP address new logins are sent to (absent or empty: clear the redirect)
    #[cfg_attr(feature = "cli", arg(short = 'a', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_host: Option<String>,
    /// TCP port new logins are sent to (default 3260)
    #[cfg_attr(feature = "cli", arg(short = 'p', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_port: Option<String>,
}

/// Where logins through one portal group are sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Redirect {
    pub pg_tag: u32,
    pub host: IpAddr,
    pub port: u16,
}

impl Redirect {
    /// The `TargetAddress` value (RFC 7143 §13.8): an IPv6 address in brackets.
    pub fn target_address(&self) -> String {
        match self.host {
            IpAddr::V4(a) => format!("{a}:{},{}", self.port, self.pg_tag),
            IpAddr::V6(a) => format!("[{a}]:{},{}", self.port, self.pg_tag),
        }
    }

    fn json(&self) -> Value {
        json!({"pg_tag": self.pg_tag, "redirect_host": self.host.to_string(), "redirect_port": self.port.to_string()})
    }
}

/// Checks a redirect address as SPDK does (a numeric IP and a port); None: clear.
fn parse(pg_tag: u32, host: Option<&str>, port: Option<&str>) -> Result<Option<Redirect>, TargetError> {
    let host = host.map(str::trim).filter(|h| !h.is_empty());
    let Some(host) = host else {
        return Ok(None);
    };
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let host: IpAddr = bare
        .parse()
        .map_err(|_| TargetError::Invalid(format!("redirect_host: {host:?} is not a numeric IP address")))?;
    let port = port.map(str::trim).filter(|p| !p.is_empty()).unwrap_or("3260");
    let port: u16 = match port.parse() {
        Ok(p) if p > 0 => p,
        _ => return Err(TargetError::Invalid(format!("redirect_port: {port:?} is not a TCP port (1..=65535)"))),
    };
    Ok(Some(Redirect { pg_tag, host, port }))
}

impl TargetNode {
    /// The `TargetAddress` a login through portal group `pg_tag` is redirected to, if any.
    pub fn redirect_for(&self, pg_tag: u32) -> Option<String> {
        self.lock().redirects.iter().find(|r| r.pg_tag == pg_tag).map(Redirect::target_address)
    }

    /// The redirects, for `iscsi_get_target_nodes` (None when there are none).
    pub(crate) fn redirects_json(&self) -> Option<Value> {
        let st = self.lock();
        (!st.redirects.is_empty()).then(|| Value::Array(st.redirects.iter().map(Redirect::json).collect()))
    }

    /// The `iscsi_target_node_set_redirect` calls that restore the redirects.
    pub(crate) fn redirect_config_json(&self) -> Vec<Value> {
        let st = self.lock();
        st.redirects
            .iter()
            .map(|r| {
                let mut params = r.json();
                if let Some(m) = params.as_object_mut() {
                    m.insert("name".into(), json!(self.name()));
                }
                json!({"method": "iscsi_target_node_set_redirect", "params": params})
            })
            .collect()
    }
}

impl IscsiTarget {
    /// `iscsi_target_node_set_redirect`: the portal group must exist, be public and be mapped
    /// to the node; the address must not be one of that group's own portals (SPDK's checks).
    pub fn set_target_node_redirect(
        &self,
        name: &str,
        pg_tag: u32,
        host: Option<&str>,
        port: Option<&str>,
    ) -> Result<(), TargetError> {
        let inner = self.lock();
        let node = inner.node_for_change(name)?;
        let Some(pg) = inner.pg(pg_tag) else {
            return Err(TargetError::NotFound(format!("portal group {pg_tag} not found")));
        };
        if pg.private {
            return Err(TargetError::Invalid(format!("portal group {pg_tag} is private: only a public group redirects")));
        }
        if !node.is_mapped_to(pg_tag) {
            return Err(TargetError::Invalid(format!("portal group {pg_tag} is not mapped to target node {}", node.name())));
        }
        let r = parse(pg_tag, host, port)?;
        if let Some(r) = &r {
            if pg.portals.iter().any(|p| p.addr.ip() == r.host && p.addr.port() == r.port) {
                return Err(TargetError::Invalid(format!(
                    "redirect address {} is a portal of portal group {pg_tag} itself: choose one of another group",
                    r.target_address()
                )));
            }
        }
        drop(inner);
        let what = r.as_ref().map(Redirect::target_address);
        node.change(|st| {
            st.redirects.retain(|x| x.pg_tag != pg_tag);
            st.redirects.extend(r);
        });
        match what {
            Some(a) => log::info!("target node {}: logins through portal group {pg_tag} are redirected to {a}", node.name()),
            None => log::info!("target node {}: redirect of portal group {pg_tag} cleared", node.name()),
        }
        Ok(())
    }
}

/// Registers `iscsi_target_node_set_redirect`.
pub(crate) fn register(reg: &mut RpcRegistry, target: &Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_target_node_set_redirect", move |p: IscsiTargetNodeSetRedirect| {
        ok(t.set_target_node_redirect(&p.name, p.pg_tag, p.redirect_host.as_deref(), p.redirect_port.as_deref()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_addresses_are_checked_and_formatted() {
        let r = parse(2, Some("10.0.0.9"), Some("3261")).unwrap().unwrap();
        assert_eq!(r.target_address(), "10.0.0.9:3261,2");
        let r = parse(1, Some("::1"), None).unwrap().unwrap();
        assert_eq!(r.target_address(), "[::1]:3260,1");
        assert_eq!(parse(1, Some(""), Some("3260")).unwrap(), None);
        assert_eq!(parse(1, None, None).unwrap(), None);
        assert!(parse(1, Some("example.com"), Some("3260")).is_err());
        assert!(parse(1, Some("10.0.0.1"), Some("0")).is_err());
        assert!(parse(1, Some("10.0.0.1"), Some("70000")).is_err());
    }
}
