//! Portal groups: the network portals (IP address, port) a target answers on, grouped under a
//! Target Portal Group Tag (RFC 7143 §4.4.1), their methods (`iscsi_create_portal_group`,
//! `iscsi_start_portal_group`, `iscsi_delete_portal_group`, `iscsi_get_portal_groups`) and
//! their save_config calls. riser adds one flag per portal: `iser`, the portal speaks iSER
//! (RDMA CM on that address and port) instead of TCP. `iscsi_portal_group_set_auth` (SPDK)
//! sets the CHAP policy of discovery sessions through the group; deleting a group removes it
//! from every node's maps (SPDK) and closes the connections that came in through it.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use riser_rpc::params::{is_false, is_zero_u32, ByTag, NoParams};
use riser_rpc::RpcRegistry;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::rpc::ok;
use crate::options::check_chap;
use crate::{Chap, Inner, IscsiTarget, TargetError};

/// Portal group tags are the 16-bit TPGT (RFC 7143 §13.9); 0 is refused, as SPDK does.
pub const MAX_PORTAL_GROUP_TAG: u32 = 65535;

/// One network portal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Portal {
    pub addr: SocketAddr,
    /// riser's extension: an iSER portal (RDMA) rather than a TCP one.
    pub iser: bool,
}

impl Portal {
    /// Validates a portal as `iscsi_create_portal_group` takes it; `field` (e.g. `portals[0]`)
    /// prefixes error messages.
    pub fn parse(p: &PortalParam, field: &str) -> Result<Portal, String> {
        let ip = parse_host(p.host.trim()).map_err(|e| format!("{field}.host: {e}"))?;
        let port = match p.port.0.trim().parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => return Err(format!("{field}.port: {:?} is not a port number (1..=65535)", p.port.0)),
        };
        Ok(Portal { addr: SocketAddr::new(ip, port), iser: p.iser })
    }

    /// The host as SPDK shows it: dotted IPv4, or IPv6 in brackets.
    pub fn host(&self) -> String {
        host_string(self.addr.ip())
    }

    /// Listening on every address of the family (`0.0.0.0` or `[::]`).
    pub fn is_wildcard(&self) -> bool {
        self.addr.ip().is_unspecified()
    }

    fn info_json(&self) -> Value {
        let mut v = json!({"host": self.host(), "port": self.addr.port().to_string()});
        // Shown only when set, so the output stays SPDK's shape for TCP portals.
        if let (true, Some(m)) = (self.iser, v.as_object_mut()) {
            m.insert("iser".into(), Value::Bool(true));
        }
        v
    }
}

/// IPv4 dotted, IPv6 in brackets (the form of TargetAddress, RFC 7143 §13.8).
pub fn host_string(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    }
}

/// Parses a portal host: IPv4, IPv6 with or without brackets. Host names are refused: a
/// portal must name an address to listen on.
pub fn parse_host(host: &str) -> Result<IpAddr, String> {
    let bad = || format!("{host:?} is not an IPv4 or IPv6 address");
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or_else(bad)?;
        return inner.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| bad());
    }
    host.parse::<IpAddr>().map_err(|_| bad())
}

/// A portal group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortalGroup {
    pub tag: u32,
    pub portals: Vec<Portal>,
    /// Not returned by SendTargets (SPDK: used for login redirection).
    pub private: bool,
    /// Whether listeners should run: false after `wait: true` until
    /// `iscsi_start_portal_group`.
    pub started: bool,
    /// The CHAP policy of discovery sessions through this group
    /// (`iscsi_portal_group_set_auth`); None: the global one (`iscsi_set_discovery_auth`).
    pub auth: Option<Chap>,
}

impl PortalGroup {
    /// What `iscsi_get_portal_groups` shows (SPDK's `iscsi_portal_grp_info_json`).
    /// With `iscsi_portal_group_set_auth`'s four values once set (riser shows them; SPDK
    /// keeps them unshown).
    pub fn info_json(&self) -> Value {
        let mut v = self.create_params();
        if let (Some(c), Some(m)) = (self.auth, v.as_object_mut()) {
            m.extend([
                ("disable_chap".to_string(), json!(c.disable_chap)),
                ("require_chap".to_string(), json!(c.require_chap)),
                ("mutual_chap".to_string(), json!(c.mutual_chap)),
                ("chap_group".to_string(), json!(c.chap_group)),
            ]);
        }
        v
    }

    fn create_params(&self) -> Value {
        json!({
            "tag": self.tag,
            "portals": self.portals.iter().map(Portal::info_json).collect::<Vec<_>>(),
            "private": self.private,
        })
    }

    /// The `iscsi_portal_group_set_auth` call that restores this group's discovery CHAP
    /// policy, if it has one (save_config writes it after the auth groups).
    pub fn auth_config_json(&self) -> Option<Value> {
        let c = self.auth?;
        let p = IscsiPortalGroupSetAuth {
            tag: self.tag,
            disable_chap: c.disable_chap,
            require_chap: c.require_chap,
            mutual_chap: c.mutual_chap,
            chap_group: c.chap_group,
        };
        Some(json!({"method": "iscsi_portal_group_set_auth", "params": p}))
    }

    /// The `iscsi_create_portal_group` call that recreates this group.
    pub fn config_json(&self) -> Value {
        let mut params = self.create_params();
        // A group still waiting for iscsi_start_portal_group must come back waiting.
        if let (false, Some(m)) = (self.started, params.as_object_mut()) {
            m.insert("wait".into(), Value::Bool(true));
        }
        json!({"method": "iscsi_create_portal_group", "params": params})
    }
}

impl Inner {
    pub(crate) fn pg(&self, tag: u32) -> Option<&PortalGroup> {
        self.portal_groups.iter().find(|g| g.tag == tag)
    }

}

impl IscsiTarget {
    /// The portal groups (listeners should serve the portals of the started ones; a
    /// connection accepted on a portal belongs to that portal's group).
    pub fn portal_groups(&self) -> Vec<PortalGroup> {
        self.lock().portal_groups.clone()
    }

    /// Bumped whenever [`IscsiTarget::portal_groups`] changes: a listener thread may poll it
    /// instead of (or besides) registering [`IscsiTarget::on_portals_changed`].
    pub fn portal_generation(&self) -> u64 {
        self.portal_generation.load(Ordering::Acquire)
    }

    /// `iscsi_create_portal_group`. A portal (address, port, transport) may belong to one
    /// group only. With `wait`, listeners stay off until [`Self::start_portal_group`].
    pub fn create_portal_group(&self, tag: u32, portals: &[PortalParam], private: bool, wait: bool) -> Result<(), TargetError> {
        {
            let mut inner = self.lock();
            if tag == 0 || tag > MAX_PORTAL_GROUP_TAG {
                return Err(TargetError::Invalid(format!("tag: {tag} is out of range (1..={MAX_PORTAL_GROUP_TAG})")));
            }
            if inner.pg(tag).is_some() {
                return Err(TargetError::Exists(format!("portal group {tag} already exists")));
            }
            if portals.is_empty() {
                return Err(TargetError::Invalid("portals: at least one portal is required".into()));
            }
            let mut parsed: Vec<Portal> = Vec::new();
            for (i, p) in portals.iter().enumerate() {
                let field = format!("portals[{i}]");
                let p = Portal::parse(p, &field).map_err(TargetError::Invalid)?;
                let clash = |q: &Portal| q.addr == p.addr && q.iser == p.iser;
                if parsed.iter().any(clash) {
                    return Err(TargetError::Exists(format!("{field}: {} is given twice", p.addr)));
                }
                if let Some(g) = inner.portal_groups.iter().find(|g| g.portals.iter().any(clash)) {
                    return Err(TargetError::Exists(format!("{field}: {} is already in portal group {}", p.addr, g.tag)));
                }
                parsed.push(p);
            }
            inner.portal_groups.push(PortalGroup { tag, portals: parsed, private, started: !wait, auth: None });
        }
        self.portals_changed();
        Ok(())
    }

    /// `iscsi_start_portal_group`: lets a group created with `wait` listen. Starting a
    /// started group succeeds (SPDK).
    pub fn start_portal_group(&self, tag: u32) -> Result<(), TargetError> {
        let changed = {
            let mut inner = self.lock();
            let g = inner
                .portal_groups
                .iter_mut()
                .find(|g| g.tag == tag)
                .ok_or_else(|| TargetError::NotFound(format!("portal group {tag} not found")))?;
            !std::mem::replace(&mut g.started, true)
        };
        if changed {
            self.portals_changed();
        }
        Ok(())
    }

    /// `iscsi_delete_portal_group`: as SPDK, the group leaves every node's maps (and
    /// redirects) with it; its listeners stop, then the connections that came in through its
    /// portals are closed (the portal-group-deleted hook), and only those: sessions of the
    /// same nodes through other groups go on.
    pub fn delete_portal_group(&self, tag: u32) -> Result<(), TargetError> {
        let unmapped = {
            let mut inner = self.lock();
            if inner.pg(tag).is_none() {
                return Err(TargetError::NotFound(format!("portal group {tag} not found")));
            }
            inner.portal_groups.retain(|g| g.tag != tag);
            let mut unmapped = Vec::new();
            for n in inner.nodes.iter().filter(|n| n.is_mapped_to(tag)) {
                n.change(|st| {
                    st.maps.retain(|(pg, _)| *pg != tag);
                    st.redirects.retain(|r| r.pg_tag != tag);
                });
                unmapped.push(n.clone());
            }
            unmapped
        };
        for n in &unmapped {
            log::info!("portal group {tag} deleted: target node {} is no longer mapped to it", n.name());
            n.publish_served();
        }
        log::info!("portal group {tag} deleted");
        self.portals_changed();
        self.portal_group_deleted(tag);
        Ok(())
    }

    /// `iscsi_portal_group_set_auth` (SPDK): the CHAP policy of discovery sessions through
    /// portal group `tag` (SPDK's checks: disable and require exclusive, mutual needs
    /// require). Applies to the next discovery logins; live discovery sessions it no longer
    /// admits are asked to log out.
    pub fn set_portal_group_auth(&self, tag: u32, chap: Chap) -> Result<(), TargetError> {
        {
            let mut inner = self.lock();
            if inner.pg(tag).is_none() {
                return Err(TargetError::NotFound(format!("portal group {tag} not found")));
            }
            check_chap(chap.disable_chap, chap.require_chap, chap.mutual_chap)?;
            inner.warn_unusable_chap(&format!("discovery through portal group {tag}"), &chap);
            if let Some(g) = inner.portal_groups.iter_mut().find(|g| g.tag == tag) {
                g.auth = Some(chap);
            }
        }
        log::info!("iSCSI portal group {tag}: discovery {}", chap.describe());
        self.access_changed(&format!("iscsi_portal_group_set_auth on portal group {tag}"));
        Ok(())
    }

    pub(crate) fn portal_groups_json(&self) -> Value {
        Value::Array(self.lock().portal_groups.iter().map(PortalGroup::info_json).collect())
    }
}

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `iscsi_create_portal_group`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiCreatePortalGroup {
    pub tag: u32,
    pub portals: Vec<PortalParam>,
    /// Not returned by SendTargets.
    #[serde(default, skip_serializing_if = "is_false")]
    pub private: bool,
    /// Do not listen until `iscsi_start_portal_group`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub wait: bool,
}

/// `iscsi_portal_group_set_auth` (SPDK's parameters; absent flags are false, an absent
/// chap_group 0).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IscsiPortalGroupSetAuth {
    /// Portal group tag
    pub tag: u32,
    /// CHAP disabled for discovery through this group (exclusive with --require-chap)
    #[cfg_attr(feature = "cli", arg(short = 'd', long, conflicts_with = "require_chap"))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_chap: bool,
    /// CHAP required for discovery through this group
    #[cfg_attr(feature = "cli", arg(short = 'r', long))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub require_chap: bool,
    /// Mutual (bidirectional) CHAP (needs --require-chap)
    #[cfg_attr(feature = "cli", arg(short = 'm', long))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub mutual_chap: bool,
    /// Auth group whose secrets discovery CHAP logins through this group use (0: none)
    #[cfg_attr(feature = "cli", arg(short = 'g', long, value_name = "TAG", default_value_t = 0))]
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub chap_group: u32,
}

/// One portal of `iscsi_create_portal_group`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortalParam {
    /// IPv4, or IPv6 with or without brackets (checked by the server).
    pub host: String,
    pub port: PortParam,
    /// riser's extension: an iSER portal (RDMA CM on that address and port), not a TCP one.
    #[serde(default, skip_serializing_if = "is_false")]
    pub iser: bool,
}

/// A port as SPDK sends it (a string, "3260") or as a number; sent as a string, as rpc.py
/// does. The server checks it is a port number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortParam(pub String);

impl<'de> Deserialize<'de> for PortParam {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PortParam;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a port number or a string holding one")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PortParam, E> {
                Ok(PortParam(s.to_string()))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<PortParam, E> {
                Ok(PortParam(n.to_string()))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<PortParam, E> {
                Ok(PortParam(n.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for PortParam {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Registers the portal group methods.
pub(crate) fn register(reg: &mut RpcRegistry, target: &Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_create_portal_group", move |p: IscsiCreatePortalGroup| {
        ok(t.create_portal_group(p.tag, &p.portals, p.private, p.wait))
    });
    let t = target.clone();
    reg.add("iscsi_start_portal_group", move |p: ByTag| ok(t.start_portal_group(p.tag)));
    let t = target.clone();
    reg.add("iscsi_delete_portal_group", move |p: ByTag| ok(t.delete_portal_group(p.tag)));
    let t = target.clone();
    reg.add("iscsi_get_portal_groups", move |_: NoParams| Ok(t.portal_groups_json()));
    let t = target.clone();
    reg.add("iscsi_portal_group_set_auth", move |p: IscsiPortalGroupSetAuth| {
        let chap = Chap {
            disable_chap: p.disable_chap,
            require_chap: p.require_chap,
            mutual_chap: p.mutual_chap,
            chap_group: p.chap_group,
        };
        ok(t.set_portal_group_auth(p.tag, chap))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::env;

    fn p(host: &str, port: &str) -> PortalParam {
        PortalParam { host: host.into(), port: PortParam(port.into()), iser: false }
    }

    #[test]
    fn hosts_parse_in_all_spdk_forms() {
        assert_eq!(Portal::parse(&p("127.0.0.1", "3260"), "portals[0]").unwrap().host(), "127.0.0.1");
        assert_eq!(Portal::parse(&p("[::1]", "3260"), "portals[0]").unwrap().host(), "[::1]");
        assert_eq!(Portal::parse(&p("::1", "3260"), "portals[0]").unwrap().host(), "[::1]");
        let w = Portal::parse(&p("0.0.0.0", "3261"), "portals[0]").unwrap();
        assert!(w.is_wildcard());
        assert_eq!(w.addr.port(), 3261);
        assert!(Portal::parse(&p("[::]", "3260"), "x").unwrap().is_wildcard());
    }

    #[test]
    fn bad_hosts_and_ports_name_the_field() {
        assert_eq!(
            Portal::parse(&p("localhost", "3260"), "portals[1]"),
            Err("portals[1].host: \"localhost\" is not an IPv4 or IPv6 address".into())
        );
        assert!(Portal::parse(&p("[::1", "3260"), "x").is_err());
        assert!(Portal::parse(&p("1.2.3.4.5", "3260"), "x").is_err());
        assert_eq!(
            Portal::parse(&p("1.2.3.4", "0"), "portals[0]"),
            Err("portals[0].port: \"0\" is not a port number (1..=65535)".into())
        );
        assert!(Portal::parse(&p("1.2.3.4", "65536"), "x").is_err());
        assert!(Portal::parse(&p("1.2.3.4", "http"), "x").is_err());
    }

    #[test]
    fn json_shows_iser_only_when_set_and_wait_only_when_not_started() {
        let g = PortalGroup {
            tag: 1,
            portals: vec![
                Portal { addr: "10.0.0.1:3260".parse().unwrap(), iser: false },
                Portal { addr: "[fe80::1]:3260".parse().unwrap(), iser: true },
            ],
            private: false,
            started: true,
            auth: None,
        };
        assert_eq!(
            g.info_json(),
            json!({"tag": 1, "private": false, "portals": [
                {"host": "10.0.0.1", "port": "3260"},
                {"host": "[fe80::1]", "port": "3260", "iser": true}
            ]})
        );
        assert!(g.config_json()["params"].get("wait").is_none());
        let w = PortalGroup { started: false, ..g };
        assert_eq!(w.config_json()["params"]["wait"], true);
    }

    #[test]
    fn portal_group_errors() {
        let e = env();
        let pg = |tag: u32, host: &str| json!({"tag": tag, "portals": [{"host": host, "port": "3260"}]});
        e.ok("iscsi_create_portal_group", pg(1, "127.0.0.1"));
        assert_eq!(e.err("iscsi_create_portal_group", pg(1, "127.0.0.2"), "portal group 1 already exists"), -17);
        assert_eq!(e.err("iscsi_create_portal_group", pg(2, "127.0.0.1"), "portals[0]: 127.0.0.1:3260 is already in portal group 1"), -17);
        assert_eq!(e.err("iscsi_create_portal_group", pg(0, "127.0.0.2"), "tag: 0 is out of range"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", pg(65536, "127.0.0.2"), "tag:"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", pg(2, "example.com"), "portals[0].host:"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", json!({"tag": 2, "portals": []}), "portals: at least one"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "1.2.3.4", "port": "x"}]}), "portals[0].port:"), -32602);
        assert_eq!(e.err("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "1.2.3.4"}]}), "port"), -32602);
        let twice = json!({"tag": 2, "portals": [{"host": "1.2.3.4", "port": "1"}, {"host": "1.2.3.4", "port": 1}]});
        assert_eq!(e.err("iscsi_create_portal_group", twice, "portals[1]: 1.2.3.4:1 is given twice"), -17);
        // The same address may carry a TCP and an iSER portal.
        e.ok("iscsi_create_portal_group", json!({"tag": 2, "portals": [{"host": "127.0.0.1", "port": "3260", "iser": true}]}));
        assert_eq!(e.err("iscsi_delete_portal_group", json!({"tag": 9}), "portal group 9 not found"), -19);
        assert_eq!(e.err("iscsi_start_portal_group", json!({"tag": 9}), "portal group 9 not found"), -19);
        e.ok("iscsi_start_portal_group", json!({"tag": 2}));
        e.ok("iscsi_delete_portal_group", json!({"tag": 2}));
        assert_eq!(e.target.portal_groups().len(), 1);
    }
}
