//! Live sessions against changed access rules (issue 26, item 2): after a change of a node's
//! maps or CHAP policy, an initiator group, an auth group's secrets or a portal group's
//! discovery authentication, the session layer asks here, for each live session, whether the
//! rules as they are now would still let it in, and if not, why (for the log line and the
//! logout request). The same rule as a login's ([`Inner::access_why`] is what
//! `login_allowed` uses), plus what a session proved at login ([`SessionAuth`]).
//!
//! Runs on the control thread that made the change (the access-changed hook), never on a
//! reactor.

use std::net::IpAddr;
use std::sync::Arc;

use crate::{AuthMode, Chap, Inner, IscsiTarget, TargetNode};

/// What a session proved when it logged in: the CHAP user it authenticated as (None: it
/// logged in without CHAP), and whether the policy then required mutual CHAP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionAuth {
    pub chap_user: Option<String>,
    pub mutual: bool,
}

/// Who a live session is, as the re-check needs it.
#[derive(Clone, Copy, Debug)]
pub struct SessionOf<'a> {
    /// The target node's name; None: a discovery session.
    pub node: Option<&'a str>,
    pub initiator_name: &'a str,
    pub addr: IpAddr,
    pub pg_tag: u32,
    pub auth: &'a SessionAuth,
}

type AccessHook = Arc<dyn Fn(&str) + Send + Sync>;
type PgHook = Arc<dyn Fn(u32) + Send + Sync>;

/// The hooks of this module (kept in [`crate::Hooks`]).
#[derive(Default, Clone)]
pub(crate) struct RecheckHooks {
    pub(crate) access_changed: Option<AccessHook>,
    pub(crate) pg_deleted: Option<PgHook>,
}

impl Inner {
    /// SPDK's access rule (`iscsi_tgt_node_access`) with the reason of a refusal: over the
    /// maps of portal group `pg_tag`, in order, the first initiator group that denies the name
    /// refuses, the first that admits name and address accepts. Err: why not (names, tags
    /// and the address, for log lines; a login answers only Authorization Failure).
    pub(crate) fn access_why(&self, node: &TargetNode, initiator_name: &str, addr: IpAddr, pg_tag: u32) -> Result<(), String> {
        let st = node.lock();
        let Some((_, igs)) = st.maps.iter().find(|(pg, _)| *pg == pg_tag) else {
            return Err(format!("target node {} is not mapped to portal group {pg_tag}", node.name()));
        };
        let mut why = Vec::new();
        for (tag, ig) in igs.iter().filter_map(|t| self.ig(*t).map(|g| (*t, g))) {
            match ig.name_verdict(initiator_name) {
                Some(false) => return Err(format!("initiator {initiator_name} is denied by initiator group {tag}")),
                Some(true) if ig.allows_addr(addr) => return Ok(()),
                Some(true) => why.push(format!("initiator {} not in initiator group {tag}'s netmasks", addr.to_canonical())),
                None => why.push(format!("initiator {initiator_name} not in initiator group {tag}'s initiators")),
            }
        }
        if why.is_empty() {
            why.push(format!("no initiator group is mapped with portal group {pg_tag} on target node {}", node.name()));
        }
        Err(why.join("; "))
    }

    /// Would the CHAP policy `chap` (of `what`) let a session that proved `auth` in now?
    fn auth_why(&self, chap: &Chap, what: &str, initiator_name: &str, auth: &SessionAuth) -> Result<(), String> {
        let d = self.decision(chap);
        match (&auth.chap_user, d.mode) {
            (None, AuthMode::Required) => Err(format!("{what} now requires CHAP; the session logged in without it")),
            (Some(user), AuthMode::Required | AuthMode::Optional) => {
                if d.secret_for(user).is_none() {
                    return Err(format!(
                        "CHAP user {user} has no secret in auth group {} any more (the session authenticated with one)",
                        chap.chap_group
                    ));
                }
                if d.mutual && !auth.mutual {
                    return Err(format!("{what} now requires mutual CHAP; the session logged in without it"));
                }
                d.authorize(user, initiator_name)
            }
            // Logged in without CHAP where CHAP is optional or off; or with CHAP where it is
            // now off (a new login would use none: nothing the session lacks).
            _ => Ok(()),
        }
    }

    /// The CHAP policy of discovery sessions through portal group `pg_tag`: the group's own
    /// (`iscsi_portal_group_set_auth`), else the global one (`iscsi_set_discovery_auth`).
    pub(crate) fn discovery_chap(&self, pg_tag: u32) -> Chap {
        self.pg(pg_tag).and_then(|g| g.auth).unwrap_or_else(|| self.options.discovery_chap())
    }
}

impl IscsiTarget {
    /// Called after a change of access rules (a node's maps or CHAP policy, an initiator
    /// group, an auth group's secrets, a portal group's or the global discovery
    /// authentication), with what changed: the session layer re-checks its live sessions
    /// ([`Self::recheck`]). Runs on the thread of the RPC, no lock held.
    pub fn on_access_changed(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).recheck.access_changed = Some(Arc::new(f));
    }

    /// Called after a portal group was deleted (its listeners already asked to stop), with
    /// its tag: the session layer closes the connections that came in through it.
    pub fn on_portal_group_deleted(&self, f: impl Fn(u32) + Send + Sync + 'static) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).recheck.pg_deleted = Some(Arc::new(f));
    }

    pub(crate) fn access_changed(&self, cause: &str) {
        if let Some(h) = self.hooks().recheck.access_changed {
            h(cause);
        }
    }

    pub(crate) fn portal_group_deleted(&self, tag: u32) {
        if let Some(h) = self.hooks().recheck.pg_deleted {
            h(tag);
        }
    }

    /// Would the rules as they are now let session `s` in? Err: why not. A node that is gone
    /// or being deleted says so; otherwise the node's maps and initiator groups
    /// ([`Inner::access_why`]) and its CHAP policy against what the session proved; a
    /// discovery session, its portal group's discovery authentication.
    pub fn recheck(&self, s: SessionOf<'_>) -> Result<(), String> {
        let inner = self.lock();
        let Some(name) = s.node else {
            let chap = inner.discovery_chap(s.pg_tag);
            let what = format!("discovery through portal group {}", s.pg_tag);
            return inner.auth_why(&chap, &what, s.initiator_name, s.auth);
        };
        let Some(node) = inner.nodes.iter().find(|n| n.name() == name && !n.is_deleted()) else {
            return Err(format!("target node {name} is gone"));
        };
        inner.access_why(node, s.initiator_name, s.addr, s.pg_tag)?;
        inner.auth_why(&node.chap(), &format!("target node {name}"), s.initiator_name, s.auth)
    }

    /// The CHAP policy and secrets of a discovery login through portal group `pg_tag`
    /// (the group's own policy if `iscsi_portal_group_set_auth` set one, else the global
    /// discovery policy). A snapshot.
    pub fn discovery_auth_for(&self, pg_tag: u32) -> crate::AuthDecision {
        let inner = self.lock();
        let chap = inner.discovery_chap(pg_tag);
        inner.decision(&chap)
    }
}

#[cfg(test)]
#[path = "recheck_tests.rs"]
mod tests;
