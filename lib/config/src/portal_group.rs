//! Portal groups: the network portals (IP address, port) a target answers on, grouped under a
//! Target Portal Group Tag (RFC 7143 §4.4.1). riser adds one flag per portal: `iser`, the
//! portal speaks iSER (RDMA CM on that address and port) instead of TCP.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

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

/// A port as SPDK sends it (a string, "3260") or as a number.
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

/// A portal as `iscsi_create_portal_group` takes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortalParam {
    pub host: String,
    pub port: PortParam,
    #[serde(default)]
    pub iser: bool,
}

impl PortalParam {
    /// Validates the address; `field` (e.g. `portals[0]`) prefixes error messages.
    pub fn parse(&self, field: &str) -> Result<Portal, String> {
        let ip = parse_host(self.host.trim()).map_err(|e| format!("{field}.host: {e}"))?;
        let port = match self.port.0.trim().parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(format!("{field}.port: {:?} is not a port number (1..=65535)", self.port.0)),
        };
        Ok(Portal { addr: SocketAddr::new(ip, port), iser: self.iser })
    }
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
}

impl PortalGroup {
    /// What `iscsi_get_portal_groups` shows (SPDK's `iscsi_portal_grp_info_json`).
    pub fn info_json(&self) -> Value {
        json!({
            "tag": self.tag,
            "portals": self.portals.iter().map(Portal::info_json).collect::<Vec<_>>(),
            "private": self.private,
        })
    }

    /// The `iscsi_create_portal_group` call that recreates this group.
    pub fn config_json(&self) -> Value {
        let mut params = self.info_json();
        // A group still waiting for iscsi_start_portal_group must come back waiting.
        if let (false, Some(m)) = (self.started, params.as_object_mut()) {
            m.insert("wait".into(), Value::Bool(true));
        }
        json!({"method": "iscsi_create_portal_group", "params": params})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(host: &str, port: &str) -> PortalParam {
        PortalParam { host: host.into(), port: PortParam(port.into()), iser: false }
    }

    #[test]
    fn hosts_parse_in_all_spdk_forms() {
        assert_eq!(p("127.0.0.1", "3260").parse("portals[0]").unwrap().host(), "127.0.0.1");
        assert_eq!(p("[::1]", "3260").parse("portals[0]").unwrap().host(), "[::1]");
        assert_eq!(p("::1", "3260").parse("portals[0]").unwrap().host(), "[::1]");
        let w = p("0.0.0.0", "3261").parse("portals[0]").unwrap();
        assert!(w.is_wildcard());
        assert_eq!(w.addr.port(), 3261);
        assert!(p("[::]", "3260").parse("x").unwrap().is_wildcard());
    }

    #[test]
    fn bad_hosts_and_ports_name_the_field() {
        assert_eq!(
            p("localhost", "3260").parse("portals[1]"),
            Err("portals[1].host: \"localhost\" is not an IPv4 or IPv6 address".into())
        );
        assert!(p("[::1", "3260").parse("x").is_err());
        assert!(p("1.2.3.4.5", "3260").parse("x").is_err());
        assert_eq!(
            p("1.2.3.4", "0").parse("portals[0]"),
            Err("portals[0].port: \"0\" is not a port number (1..=65535)".into())
        );
        assert!(p("1.2.3.4", "65536").parse("x").is_err());
        assert!(p("1.2.3.4", "http").parse("x").is_err());
    }

    #[test]
    fn port_accepts_string_or_number() {
        let a: PortalParam = serde_json::from_value(json!({"host": "1.2.3.4", "port": "3260"})).unwrap();
        let b: PortalParam = serde_json::from_value(json!({"host": "1.2.3.4", "port": 3260, "iser": true})).unwrap();
        assert_eq!(a.port, b.port);
        assert!(b.iser);
        assert!(serde_json::from_value::<PortalParam>(json!({"host": "1.2.3.4", "port": true})).is_err());
        assert!(serde_json::from_value::<PortalParam>(json!({"host": "h", "port": 1, "cpumask": "0x1"})).is_err());
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
}
