//! Initiator groups: which initiators (by iSCSI name) from which networks may log in to the
//! target nodes a group is mapped to; their methods (`iscsi_create_initiator_group`,
//! `iscsi_initiator_group_add_initiators`, `iscsi_initiator_group_remove_initiators`,
//! `iscsi_delete_initiator_group`, `iscsi_get_initiator_groups`) and save_config calls.
//!
//! Names: an iSCSI name (`iqn.`, `eui.`, `naa.`), `ANY`, or either with a leading `!` that
//! denies it (SPDK's syntax; SPDK's `ALL` is taken as `ANY`). Netmasks: `ANY`, an address
//! (IPv4, IPv6 with or without brackets) or a CIDR prefix (`192.168.2.0/24`, `[fe80::]/64`).
//!
//! Unlike SPDK, whose first matching entry decides, a deny here wins wherever it stands:
//! `["ANY", "!iqn.bad"]` keeps `iqn.bad` out (in SPDK it lets it in).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use riser_rpc::params::{not_null, ByTag, NoParams};
use riser_rpc::RpcRegistry;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::rpc::ok;
use crate::{Inner, IscsiTarget, TargetError};

/// Most names and most netmasks one group holds (SPDK's MAX_INITIATOR / MAX_NETMASK).
pub const MAX_INITIATORS: usize = 256;
pub const MAX_NETMASKS: usize = 256;
/// iSCSI names are at most 223 bytes (RFC 7143 §4.2.7.1).
pub const MAX_ISCSI_NAME_LEN: usize = 223;

/// A parsed netmask.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mask {
    Any,
    V4(Ipv4Addr, u8),
    V6(Ipv6Addr, u8),
}

/// A netmask entry: the text as shown (normalised `ANY`) and what it matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netmask {
    text: String,
    mask: Mask,
}

impl Netmask {
    pub fn parse(s: &str) -> Result<Netmask, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("ANY") || s.eq_ignore_ascii_case("ALL") {
            return Ok(Netmask { text: "ANY".into(), mask: Mask::Any });
        }
        let bad = || format!("{s:?} is not ANY, an IP address or an address/prefix-length");
        // Split "addr" and the optional "/bits"; IPv6 may sit in brackets.
        let (addr, bits) = if let Some(rest) = s.strip_prefix('[') {
            let (a, tail) = rest.split_once(']').ok_or_else(bad)?;
            match tail {
                "" => (a, None),
                t => (a, Some(t.strip_prefix('/').ok_or_else(bad)?)),
            }
        } else {
            match s.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (s, None),
            }
        };
        let ip: IpAddr = addr.parse().map_err(|_| bad())?;
        if s.starts_with('[') && ip.is_ipv4() {
            return Err(bad());
        }
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => match b.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{s:?}: prefix length must be 0..={max}")),
            },
        };
        let mask = match ip {
            IpAddr::V4(a) => Mask::V4(a, bits),
            IpAddr::V6(a) => Mask::V6(a, bits),
        };
        Ok(Netmask { text: s.to_string(), mask })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `addr` is inside this netmask. IPv4-mapped IPv6 addresses (from a dual-stack
    /// listener) count as the IPv4 address.
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (&self.mask, addr.to_canonical()) {
            (Mask::Any, _) => true,
            (Mask::V4(net, bits), IpAddr::V4(a)) => {
                let m = if *bits == 0 { 0 } else { u32::MAX << (32 - u32::from(*bits)) };
                u32::from(*net) & m == u32::from(a) & m
            }
            (Mask::V6(net, bits), IpAddr::V6(a)) => {
                let m = if *bits == 0 { 0 } else { u128::MAX << (128 - u32::from(*bits)) };
                u128::from(*net) & m == u128::from(a) & m
            }
            _ => false,
        }
    }
}

/// Normalises an initiator entry (`ALL` → `ANY`, keeping a leading `!`) and checks it.
/// Names are checked loosely (length, no spaces or control characters): a name no initiator
/// can have would simply never match, and refusing an unusual real one would lock it out.
pub fn parse_initiator(s: &str) -> Result<String, String> {
    let s = s.trim();
    let (deny, name) = match s.strip_prefix('!') {
        Some(n) => ("!", n),
        None => ("", s),
    };
    if name.eq_ignore_ascii_case("ANY") || name.eq_ignore_ascii_case("ALL") {
        return Ok(format!("{deny}ANY"));
    }
    if name.is_empty() || name.len() > MAX_ISCSI_NAME_LEN || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{s:?} is not an initiator name (1..={MAX_ISCSI_NAME_LEN} bytes, no spaces), ANY, or either after '!'"
        ));
    }
    Ok(format!("{deny}{name}"))
}

/// An initiator group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitiatorGroup {
    pub tag: u32,
    initiators: Vec<String>,
    netmasks: Vec<Netmask>,
}

impl InitiatorGroup {
    /// An empty group (it admits nobody); fill it with [`InitiatorGroup::add`].
    pub fn new(tag: u32) -> Self {
        InitiatorGroup { tag, initiators: Vec::new(), netmasks: Vec::new() }
    }

    pub fn initiators(&self) -> &[String] {
        &self.initiators
    }

    pub fn netmasks(&self) -> &[Netmask] {
        &self.netmasks
    }

    /// What this group says of an initiator name: `Some(false)` denied (a `!` entry
    /// matches), `Some(true)` allowed (an entry matches, no deny does), `None` not listed.
    /// Names compare case-insensitively, as SPDK does (RFC 3722 names are lower case).
    pub fn name_verdict(&self, initiator_name: &str) -> Option<bool> {
        let matches = |e: &str| e == "ANY" || e.eq_ignore_ascii_case(initiator_name);
        let mut allowed = false;
        for e in &self.initiators {
            match e.strip_prefix('!') {
                Some(d) if matches(d) => return Some(false),
                Some(_) => {}
                None => allowed |= matches(e),
            }
        }
        allowed.then_some(true)
    }

    /// Whether `addr` is inside one of the netmasks.
    pub fn allows_addr(&self, addr: IpAddr) -> bool {
        self.netmasks.iter().any(|m| m.contains(addr))
    }

    /// SPDK's rule: the name matches an allowed entry and no denied one, and the address
    /// matches one netmask.
    pub fn allows(&self, initiator_name: &str, addr: IpAddr) -> bool {
        self.name_verdict(initiator_name) == Some(true) && self.allows_addr(addr)
    }

    /// Adds names and netmasks, all or none: a duplicate (already present, or given twice)
    /// or a full list refuses the whole call.
    pub fn add(&mut self, initiators: &[String], netmasks: &[String]) -> Result<(), TargetError> {
        let mut names = self.initiators.clone();
        for (i, s) in initiators.iter().enumerate() {
            let n = parse_initiator(s).map_err(|e| TargetError::Invalid(format!("initiators[{i}]: {e}")))?;
            if names.iter().any(|x| x.eq_ignore_ascii_case(&n)) {
                return Err(TargetError::Exists(format!(
                    "initiators[{i}]: {n} is already in initiator group {}",
                    self.tag
                )));
            }
            names.push(n);
        }
        if names.len() > MAX_INITIATORS {
            return Err(TargetError::Invalid(format!(
                "initiators: an initiator group holds at most {MAX_INITIATORS} names"
            )));
        }
        let mut masks = self.netmasks.clone();
        for (i, s) in netmasks.iter().enumerate() {
            let m = Netmask::parse(s).map_err(|e| TargetError::Invalid(format!("netmasks[{i}]: {e}")))?;
            if masks.iter().any(|x| x.text.eq_ignore_ascii_case(&m.text)) {
                return Err(TargetError::Exists(format!(
                    "netmasks[{i}]: {} is already in initiator group {}",
                    m.text, self.tag
                )));
            }
            masks.push(m);
        }
        if masks.len() > MAX_NETMASKS {
            return Err(TargetError::Invalid(format!(
                "netmasks: an initiator group holds at most {MAX_NETMASKS} netmasks"
            )));
        }
        self.initiators = names;
        self.netmasks = masks;
        Ok(())
    }

    /// Removes names and netmasks, all or none: one not in the group refuses the call.
    pub fn remove(&mut self, initiators: &[String], netmasks: &[String]) -> Result<(), TargetError> {
        let mut names = self.initiators.clone();
        for (i, s) in initiators.iter().enumerate() {
            let n = parse_initiator(s).map_err(|e| TargetError::Invalid(format!("initiators[{i}]: {e}")))?;
            let at = names.iter().position(|x| x.eq_ignore_ascii_case(&n)).ok_or_else(|| {
                TargetError::NotFound(format!("initiators[{i}]: {n} is not in initiator group {}", self.tag))
            })?;
            names.remove(at);
        }
        let mut masks = self.netmasks.clone();
        for (i, s) in netmasks.iter().enumerate() {
            let m = Netmask::parse(s).map_err(|e| TargetError::Invalid(format!("netmasks[{i}]: {e}")))?;
            let at = masks.iter().position(|x| x.text.eq_ignore_ascii_case(&m.text)).ok_or_else(|| {
                TargetError::NotFound(format!("netmasks[{i}]: {} is not in initiator group {}", m.text, self.tag))
            })?;
            masks.remove(at);
        }
        self.initiators = names;
        self.netmasks = masks;
        Ok(())
    }

    /// What `iscsi_get_initiator_groups` shows (SPDK's `iscsi_init_grp_info_json`).
    pub fn info_json(&self) -> Value {
        json!({
            "tag": self.tag,
            "initiators": self.initiators,
            "netmasks": self.netmasks.iter().map(|m| m.text.clone()).collect::<Vec<_>>(),
        })
    }

    /// The `iscsi_create_initiator_group` call that recreates this group.
    pub fn config_json(&self) -> Value {
        json!({"method": "iscsi_create_initiator_group", "params": self.info_json()})
    }
}

impl Inner {
    pub(crate) fn ig(&self, tag: u32) -> Option<&InitiatorGroup> {
        self.initiator_groups.iter().find(|g| g.tag == tag)
    }

    /// A node whose maps use initiator group `tag`, if any.
    fn ig_user(&self, tag: u32) -> Option<&str> {
        self.nodes.iter().find(|n| n.pg_ig_maps().iter().any(|m| m.ig_tag == tag)).map(|n| n.name())
    }
}

impl IscsiTarget {
    /// The initiator groups.
    pub fn initiator_groups(&self) -> Vec<InitiatorGroup> {
        self.lock().initiator_groups.clone()
    }

    /// `iscsi_create_initiator_group`.
    pub fn create_initiator_group(&self, tag: u32, initiators: &[String], netmasks: &[String]) -> Result<(), TargetError> {
        let mut inner = self.lock();
        if tag == 0 {
            return Err(TargetError::Invalid("tag: 0 is out of range (1..)".into()));
        }
        if inner.ig(tag).is_some() {
            return Err(TargetError::Exists(format!("initiator group {tag} already exists")));
        }
        let mut g = InitiatorGroup::new(tag);
        g.add(initiators, netmasks)?;
        inner.initiator_groups.push(g);
        Ok(())
    }

    fn with_ig(&self, tag: u32, f: impl FnOnce(&mut InitiatorGroup) -> Result<(), TargetError>) -> Result<(), TargetError> {
        let mut inner = self.lock();
        let g = inner
            .initiator_groups
            .iter_mut()
            .find(|g| g.tag == tag)
            .ok_or_else(|| TargetError::NotFound(format!("initiator group {tag} not found")))?;
        f(g)
    }

    /// `iscsi_initiator_group_add_initiators`. Applies to the next logins; a live session it
    /// shuts out (a `!name` entry) is asked to log out.
    pub fn initiator_group_add(&self, tag: u32, initiators: &[String], netmasks: &[String]) -> Result<(), TargetError> {
        self.with_ig(tag, |g| g.add(initiators, netmasks))?;
        self.access_changed(&format!("iscsi_initiator_group_add_initiators on initiator group {tag}"));
        Ok(())
    }

    /// `iscsi_initiator_group_remove_initiators`. Applies to the next logins; live sessions
    /// the group no longer admits are asked to log out.
    pub fn initiator_group_remove(&self, tag: u32, initiators: &[String], netmasks: &[String]) -> Result<(), TargetError> {
        self.with_ig(tag, |g| g.remove(initiators, netmasks))?;
        self.access_changed(&format!("iscsi_initiator_group_remove_initiators on initiator group {tag}"));
        Ok(())
    }

    /// `iscsi_delete_initiator_group`: refused while a target node maps it or a CHAP user is
    /// bound to it (its auth group's save_config call would no longer load).
    pub fn delete_initiator_group(&self, tag: u32) -> Result<(), TargetError> {
        let mut inner = self.lock();
        if inner.ig(tag).is_none() {
            return Err(TargetError::NotFound(format!("initiator group {tag} not found")));
        }
        if let Some(n) = inner.ig_user(tag) {
            return Err(TargetError::Busy(format!("initiator group {tag} is mapped by target node {n}")));
        }
        if let Some((group, user)) = inner.auth_groups.iter().find_map(|g| g.user_bound_to(tag).map(|u| (g.tag, u))) {
            return Err(TargetError::Busy(format!(
                "initiator group {tag} binds CHAP user {user} of auth group {group} (remove that secret or its binding first)"
            )));
        }
        inner.initiator_groups.retain(|g| g.tag != tag);
        Ok(())
    }

    pub(crate) fn initiator_groups_json(&self) -> Value {
        Value::Array(self.lock().initiator_groups.iter().map(InitiatorGroup::info_json).collect())
    }
}

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `iscsi_create_initiator_group`: both lists are required (they may be empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiCreateInitiatorGroup {
    pub tag: u32,
    /// iSCSI names or `ANY`, either after `!` to deny it.
    pub initiators: Vec<String>,
    /// `ANY`, an address or address/prefix-length.
    pub netmasks: Vec<String>,
}

/// `iscsi_initiator_group_add_initiators` and `iscsi_initiator_group_remove_initiators`:
/// either list may be absent (nothing of that kind changes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiChangeInitiatorGroup {
    pub tag: u32,
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub initiators: Option<Vec<String>>,
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub netmasks: Option<Vec<String>>,
}

/// Registers the initiator group methods.
pub(crate) fn register(reg: &mut RpcRegistry, target: &Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_create_initiator_group", move |p: IscsiCreateInitiatorGroup| {
        ok(t.create_initiator_group(p.tag, &p.initiators, &p.netmasks))
    });
    let t = target.clone();
    reg.add("iscsi_initiator_group_add_initiators", move |p: IscsiChangeInitiatorGroup| {
        ok(t.initiator_group_add(p.tag, p.initiators.as_deref().unwrap_or_default(), p.netmasks.as_deref().unwrap_or_default()))
    });
    let t = target.clone();
    reg.add("iscsi_initiator_group_remove_initiators", move |p: IscsiChangeInitiatorGroup| {
        ok(t.initiator_group_remove(p.tag, p.initiators.as_deref().unwrap_or_default(), p.netmasks.as_deref().unwrap_or_default()))
    });
    let t = target.clone();
    reg.add("iscsi_delete_initiator_group", move |p: ByTag| ok(t.delete_initiator_group(p.tag)));
    let t = target.clone();
    reg.add("iscsi_get_initiator_groups", move |_: NoParams| Ok(t.initiator_groups_json()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::env;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn group(names: &[&str], masks: &[&str]) -> InitiatorGroup {
        let mut g = InitiatorGroup::new(1);
        let n: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let m: Vec<String> = masks.iter().map(|s| s.to_string()).collect();
        g.add(&n, &m).unwrap();
        g
    }

    const A: &str = "iqn.1994-05.com.redhat:a";
    const B: &str = "iqn.1994-05.com.redhat:b";

    #[test]
    fn netmasks_parse_and_match() {
        let m = Netmask::parse("192.168.2.0/24").unwrap();
        assert!(m.contains(ip("192.168.2.77")));
        assert!(!m.contains(ip("192.168.3.1")));
        assert!(!m.contains(ip("::1")));
        // Host bits in the network part are ignored, as SPDK does.
        assert!(Netmask::parse("192.168.2.9/24").unwrap().contains(ip("192.168.2.1")));
        let one = Netmask::parse("10.0.0.1").unwrap();
        assert!(one.contains(ip("10.0.0.1")) && !one.contains(ip("10.0.0.2")));
        // A dual-stack listener reports IPv4 peers as IPv4-mapped IPv6.
        assert!(one.contains(ip("::ffff:10.0.0.1")));
        assert!(Netmask::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        let v6 = Netmask::parse("[fe80::]/10").unwrap();
        assert!(v6.contains(ip("fe80::1234")) && !v6.contains(ip("fec0::1")) && !v6.contains(ip("10.0.0.1")));
        assert!(Netmask::parse("[::1]/128").unwrap().contains(ip("::1")));
        assert!(Netmask::parse("[::1]").unwrap().contains(ip("::1")));
        assert!(Netmask::parse("2001:db8::/32").unwrap().contains(ip("2001:db8:1::1")));
        let any = Netmask::parse("any").unwrap();
        assert_eq!(any.as_str(), "ANY");
        assert!(any.contains(ip("1.2.3.4")) && any.contains(ip("::2")));
        assert_eq!(Netmask::parse("ALL").unwrap().as_str(), "ANY");
        for bad in ["", "foo", "10.0.0.0/33", "[::1]/129", "[10.0.0.1]", "[::1", "[::1]x", "10.0.0.0/", "10.0.0.0/-1", "1.2.3/24"] {
            assert!(Netmask::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn names_and_addresses_must_both_match() {
        let g = group(&[A], &["10.0.0.0/8"]);
        assert!(g.allows(A, ip("10.1.2.3")));
        assert!(g.allows(&A.to_uppercase(), ip("10.1.2.3")), "names compare case-insensitively");
        assert!(!g.allows(A, ip("11.0.0.1")), "address outside every netmask");
        assert!(!g.allows(B, ip("10.1.2.3")), "name not listed");
        assert_eq!(g.name_verdict(B), None);
        // No netmask: nobody gets in.
        assert!(!group(&[A], &[]).allows(A, ip("10.0.0.1")));
        // No name: nobody gets in.
        assert!(!group(&[], &["ANY"]).allows(A, ip("10.0.0.1")));
    }

    #[test]
    fn any_and_deny_entries() {
        let g = group(&["ANY"], &["ANY"]);
        assert!(g.allows(A, ip("1.2.3.4")) && g.allows(B, ip("::1")));
        // A deny wins wherever it stands.
        for names in [&["ANY", "!iqn.1994-05.com.redhat:b"][..], &["!iqn.1994-05.com.redhat:b", "ANY"][..]] {
            let g = group(names, &["ANY"]);
            assert!(g.allows(A, ip("1.2.3.4")));
            assert!(!g.allows(B, ip("1.2.3.4")));
            assert_eq!(g.name_verdict(B), Some(false));
        }
        // Deny everyone, even when also listed by name.
        let g = group(&[A, "!ANY"], &["ANY"]);
        assert_eq!(g.name_verdict(A), Some(false));
        // A deny of someone else says nothing about A.
        assert_eq!(group(&["!iqn.x:y"], &["ANY"]).name_verdict(A), None);
        assert_eq!(parse_initiator("!all").unwrap(), "!ANY");
    }

    #[test]
    fn add_and_remove_are_all_or_nothing() {
        let mut g = group(&[A], &["10.0.0.0/8"]);
        let e = g.add(&[B.into(), A.to_uppercase()], &[]).unwrap_err();
        assert!(matches!(&e, TargetError::Exists(m) if m.starts_with("initiators[1]:")), "{e:?}");
        assert_eq!(g.initiators(), [A], "nothing added");
        let e = g.add(&[B.into(), B.into()], &[]).unwrap_err();
        assert!(matches!(e, TargetError::Exists(_)));
        let e = g.add(&[B.into()], &["bogus".into()]).unwrap_err();
        assert!(matches!(&e, TargetError::Invalid(m) if m.starts_with("netmasks[0]:")), "{e:?}");
        assert_eq!(g.initiators(), [A]);
        let e = g.add(&["has space".into()], &[]).unwrap_err();
        assert!(matches!(&e, TargetError::Invalid(m) if m.starts_with("initiators[0]:")), "{e:?}");
        g.add(&[B.into()], &["[::1]/128".into()]).unwrap();
        assert_eq!(g.initiators(), [A, B]);
        let e = g.remove(&[B.into(), "iqn.x:gone".into()], &[]).unwrap_err();
        assert!(matches!(&e, TargetError::NotFound(m) if m.starts_with("initiators[1]:")), "{e:?}");
        assert_eq!(g.initiators(), [A, B], "nothing removed");
        g.remove(&[B.into()], &["10.0.0.0/8".into()]).unwrap();
        assert_eq!(g.initiators(), [A]);
        assert_eq!(g.info_json(), json!({"tag": 1, "initiators": [A], "netmasks": ["[::1]/128"]}));
        let many: Vec<String> = (0..MAX_INITIATORS).map(|i| format!("iqn.2000-01.x:{i}")).collect();
        assert!(matches!(g.add(&many, &[]), Err(TargetError::Invalid(_))));
    }

    #[test]
    fn initiator_group_errors() {
        let e = env();
        e.ok("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ALL"], "netmasks": ["any"]}));
        assert_eq!(e.ok("iscsi_get_initiator_groups", Value::Null)[0]["initiators"], json!(["ANY"]));
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 1, "initiators": [], "netmasks": []}), "initiator group 1 already exists"), -17);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 0, "initiators": [], "netmasks": []}), "tag: 0"), -32602);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["ANY"], "netmasks": ["300.0.0.0/8"]}), "netmasks[0]:"), -32602);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["a b"], "netmasks": []}), "initiators[0]:"), -32602);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["ANY", "any"], "netmasks": []}), "initiators[1]: ANY is already"), -17);
        assert_eq!(e.err("iscsi_initiator_group_add_initiators", json!({"tag": 5, "initiators": ["ANY"]}), "initiator group 5 not found"), -19);
        assert_eq!(e.err("iscsi_initiator_group_add_initiators", json!({"tag": 1, "initiators": ["ANY"]}), "already in initiator group 1"), -17);
        assert_eq!(e.err("iscsi_initiator_group_remove_initiators", json!({"tag": 1, "netmasks": ["10.0.0.0/8"]}), "netmasks[0]: 10.0.0.0/8 is not in initiator group 1"), -19);
        assert_eq!(e.err("iscsi_delete_initiator_group", json!({"tag": 5}), "initiator group 5 not found"), -19);
        assert_eq!(e.err("iscsi_create_initiator_group", json!({"tag": 2, "initiators": ["ANY"]}), "netmasks"), -32602);
    }
}
