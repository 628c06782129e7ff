//! Auth groups: the CHAP secrets target nodes and discovery sessions authenticate initiators
//! with (RFC 7143 §12.1.3), grouped under a tag; their methods (`iscsi_create_auth_group`,
//! `iscsi_delete_auth_group`, `iscsi_get_auth_groups`, `iscsi_auth_group_add_secret`,
//! `iscsi_auth_group_remove_secret`), their save_config calls, and the query login code asks
//! ([`IscsiTarget::node_auth`], [`IscsiTarget::discovery_auth`]): how must this login
//! authenticate, with which secrets.
//!
//! A node or discovery names its group by `chap_group` (0: none), as SPDK does. As in SPDK the
//! group need not exist when it is named (SPDK's save_config writes the groups after the
//! nodes), and deleting a group that is named is allowed; CHAP then finds no secret, so every
//! CHAP login there fails until the group exists again. Both cases are logged as warnings.
//! Unlike SPDK, a node with chap_group 0 does not borrow the discovery group: it has no
//! secrets at all (SPDK's behaviour too: its node with group 0 looks up a group 0, which no
//! one creates).
//!
//! Secrets never reach a log line or an error message; [`AuthSecret`] and [`AuthGroup`] have
//! a Debug that leaves them out. `iscsi_get_auth_groups` and save_config show them, as SPDK
//! does: they are what recreates the group. They are held in [`Zeroizing`] strings: moved
//! from the decoded RPC parameters without a copy, overwritten when dropped (the snapshots
//! login code takes included).
//!
//! Beyond SPDK's checks (riser's, RFC 7143 §12.1.3):
//! - every secret, one-way or mutual, is at least [`MIN_CHAP_SECRET_LEN`] bytes (96 bits);
//! - no secret that authenticates initiators (`secret`) is a secret the target answers with
//!   (`msecret`), in any entry of any auth group. Every group counts, not only the one an
//!   entry is in: the reflection the RFC guards against takes two logins, each of which may go
//!   to any target node or to discovery, and any node may be pointed at any group (even one
//!   not created yet) by `iscsi_target_node_set_auth`. Checking all groups whenever a secret
//!   is added keeps that true of the whole configuration, whatever is named later;
//! - an entry may name an initiator group (`initiator_group`, riser's extension): its user
//!   may then log in only with an InitiatorName that group admits by name (its netmasks are
//!   not looked at; the node's own ACL checks addresses), as LIO binds CHAP credentials to an
//!   ACL. Checked at login once CHAP succeeded ([`AuthDecision::authorize`]); a refusal is an
//!   Authorization Failure (0x0202).

use std::sync::Arc;

use riser_rpc::params::{not_null, ByTag, NoParams, Secret};
use riser_rpc::RpcRegistry;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use crate::rpc::ok;
use crate::target_node::{Chap, TargetNode};
use crate::{InitiatorGroup, Inner, IscsiTarget, TargetError};

/// Longest CHAP user name (CHAP_N) and mutual user name (SPDK's ISCSI_CHAP_MAX_USER_LEN).
pub const MAX_CHAP_USER_LEN: usize = 255;
/// Longest CHAP secret, one-way or mutual (SPDK's ISCSI_CHAP_MAX_SECRET_LEN).
pub const MAX_CHAP_SECRET_LEN: usize = 255;
/// Shortest CHAP secret, one-way or mutual: RFC 7143 §12.1.3's 96 bits (SPDK takes 1 byte).
pub const MIN_CHAP_SECRET_LEN: usize = 12;
/// Most secrets in one group: SPDK's `iscsi_create_auth_group` takes at most 64, so a larger
/// group would not replay from save_config.
pub const MAX_SECRETS: usize = 64;

/// One CHAP secret: the initiator named `user` proves it knows `secret`; with mutual CHAP the
/// target answers as `muser` with `msecret` (both or neither). `initiator_group`: the user may
/// log in only with an InitiatorName that initiator group admits (riser's extension).
///
/// The secrets do not outlive the group in freed memory: they are overwritten when dropped
/// (the copies a hash makes of them live on the stack of the exchange, briefly). Debug shows
/// the names only.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthSecret {
    pub user: String,
    pub secret: Zeroizing<String>,
    pub muser: Option<String>,
    pub msecret: Option<Zeroizing<String>>,
    pub initiator_group: Option<u32>,
}

impl std::fmt::Debug for AuthSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("AuthSecret");
        d.field("user", &self.user).field("secret", &"<redacted>").field("muser", &self.muser);
        if self.msecret.is_some() {
            d.field("msecret", &"<redacted>");
        }
        if let Some(ig) = self.initiator_group {
            d.field("initiator_group", &ig);
        }
        d.finish()
    }
}

/// Checks a user name or secret: `min..=max` bytes, no control characters. The value itself
/// is never put in the message.
fn check_text(field: &str, v: &str, min: usize, max: usize) -> Result<(), TargetError> {
    if v.len() < min || v.len() > max {
        let why = if min == MIN_CHAP_SECRET_LEN { " (RFC 7143 §12.1.3: at least 96 bits)" } else { "" };
        return Err(TargetError::Invalid(format!("{field}: must be {min}..={max} bytes{why}")));
    }
    if v.chars().any(char::is_control) {
        return Err(TargetError::Invalid(format!("{field}: must not contain control characters")));
    }
    Ok(())
}

impl AuthSecret {
    /// A secret as `iscsi_create_auth_group` / `iscsi_auth_group_add_secret` take it, checked;
    /// `at` (e.g. `secrets[0].`) prefixes the field names of error messages.
    ///
    /// SPDK's rules (lengths, muser needs msecret) and riser's: nothing empty or with control
    /// characters, secrets of at least [`MIN_CHAP_SECRET_LEN`] bytes, msecret needs muser
    /// (SPDK drops it silently), and the mutual secret differs from the one-way one (RFC 7143
    /// §12.1.3: a CHAP secret authenticates one direction only; a compliant peer refuses a
    /// login where both are the same). An `initiator_group` is a tag (1..); whether that group
    /// exists, and secrets shared with other entries, are checked against the whole
    /// configuration by [`IscsiTarget`]'s methods.
    pub fn from_param(p: AuthSecretParam, at: &str) -> Result<AuthSecret, TargetError> {
        check_text(&format!("{at}user"), &p.user, 1, MAX_CHAP_USER_LEN)?;
        check_text(&format!("{at}secret"), &p.secret, MIN_CHAP_SECRET_LEN, MAX_CHAP_SECRET_LEN)?;
        match (&p.muser, &p.msecret) {
            (Some(mu), Some(ms)) => {
                check_text(&format!("{at}muser"), mu, 1, MAX_CHAP_USER_LEN)?;
                check_text(&format!("{at}msecret"), ms, MIN_CHAP_SECRET_LEN, MAX_CHAP_SECRET_LEN)?;
                if *ms == p.secret {
                    return Err(TargetError::Invalid(format!(
                        "{at}msecret: must differ from secret (RFC 7143 §12.1.3: one secret per direction)"
                    )));
                }
            }
            (Some(_), None) => {
                return Err(TargetError::Invalid(format!("{at}msecret: required with muser (mutual CHAP)")))
            }
            (None, Some(_)) => {
                return Err(TargetError::Invalid(format!("{at}muser: required with msecret (mutual CHAP)")))
            }
            (None, None) => {}
        }
        if p.initiator_group == Some(0) {
            return Err(TargetError::Invalid(format!("{at}initiator_group: 0 is out of range (1..)")));
        }
        Ok(AuthSecret {
            user: p.user,
            secret: p.secret,
            muser: p.muser,
            msecret: p.msecret,
            initiator_group: p.initiator_group,
        })
    }

    /// Whether this secret can answer mutual CHAP (it has muser and msecret).
    pub fn is_mutual(&self) -> bool {
        self.muser.is_some() && self.msecret.is_some()
    }

    /// As `iscsi_get_auth_groups` shows it (SPDK: muser and msecret only when set; riser's
    /// initiator_group only when set).
    fn info_json(&self) -> Value {
        let mut v = json!({"user": self.user, "secret": self.secret.as_str()});
        if let Some(m) = v.as_object_mut() {
            if let (Some(mu), Some(ms)) = (&self.muser, &self.msecret) {
                m.insert("muser".into(), json!(mu));
                m.insert("msecret".into(), json!(ms.as_str()));
            }
            if let Some(ig) = self.initiator_group {
                m.insert("initiator_group".into(), json!(ig));
            }
        }
        v
    }
}

/// How a login must authenticate (RFC 7143 §12: AuthMethod), from SPDK's three flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// `disable_chap`: AuthMethod=None only.
    None,
    /// Neither flag: the initiator chooses CHAP or None.
    Optional,
    /// `require_chap`: AuthMethod=CHAP only.
    Required,
}

impl AuthMode {
    /// The mode of a CHAP policy (`disable_chap` wins; [`Chap`]s are checked on the way in, so
    /// both flags are never set).
    pub fn of(chap: &Chap) -> AuthMode {
        if chap.disable_chap {
            AuthMode::None
        } else if chap.require_chap {
            AuthMode::Required
        } else {
            AuthMode::Optional
        }
    }
}

/// What a login must do to authenticate, read once when the login needs it: a snapshot, no
/// lock held. `secrets` are those of the policy's auth group (empty for [`AuthMode::None`],
/// for chap_group 0, or when the group does not exist: then no CHAP login succeeds).
/// `mutual`: the initiator must also authenticate the target (only with [`AuthMode::Required`]).
/// `initiator_groups`: the initiator groups the secrets are bound to (those that exist), for
/// [`AuthDecision::authorize`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthDecision {
    pub mode: AuthMode,
    pub mutual: bool,
    pub secrets: Vec<AuthSecret>,
    pub initiator_groups: Vec<InitiatorGroup>,
}

impl AuthDecision {
    /// The secret of the CHAP user `user` (CHAP_N), compared exactly as SPDK does.
    pub fn secret_for(&self, user: &str) -> Option<&AuthSecret> {
        self.secrets.iter().find(|s| s.user == user)
    }

    /// Once `user` proved its secret: may it log in as `initiator_name`? Yes unless its
    /// entry is bound to an initiator group (`initiator_group`) that does not admit that name
    /// (a `!` entry denies it, or no entry lists it), or that no longer exists (fails
    /// closed). Err: why, for the login's log line (names and tags, never a secret).
    pub fn authorize(&self, user: &str, initiator_name: &str) -> Result<(), String> {
        let Some(tag) = self.secret_for(user).and_then(|s| s.initiator_group) else {
            return Ok(());
        };
        match self.initiator_groups.iter().find(|g| g.tag == tag) {
            None => Err(format!("CHAP user {user} is bound to initiator group {tag}, which does not exist")),
            Some(g) if g.name_verdict(initiator_name) == Some(true) => Ok(()),
            Some(_) => Err(format!(
                "CHAP user {user} is bound to initiator group {tag}, which does not admit InitiatorName {initiator_name}"
            )),
        }
    }
}

/// An auth group: a tag and its secrets, one per user, in the order added.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthGroup {
    pub tag: u32,
    secrets: Vec<AuthSecret>,
}

impl AuthGroup {
    /// The user of an entry bound to initiator group `tag`, if any.
    pub(crate) fn user_bound_to(&self, tag: u32) -> Option<&str> {
        self.secrets.iter().find(|s| s.initiator_group == Some(tag)).map(|s| s.user.as_str())
    }
}

impl std::fmt::Debug for AuthGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let users: Vec<&str> = self.secrets.iter().map(|s| s.user.as_str()).collect();
        f.debug_struct("AuthGroup").field("tag", &self.tag).field("users", &users).finish()
    }
}

impl AuthGroup {
    /// An empty group.
    pub fn new(tag: u32) -> Self {
        AuthGroup { tag, secrets: Vec::new() }
    }

    pub fn secrets(&self) -> &[AuthSecret] {
        &self.secrets
    }

    /// Adds secrets, all or none. `at(i)` names the i-th in error messages (`secrets[0].` for
    /// a create, empty for add_secret). A user already in the group (or given twice) is
    /// refused with Exists, as SPDK does; user names compare exactly. Only this group is
    /// looked at: [`IscsiTarget`]'s methods also check the new secrets against the others.
    pub fn add(&mut self, new: Vec<AuthSecretParam>, at: impl Fn(usize) -> String) -> Result<(), TargetError> {
        let mut all = self.secrets.clone();
        for (i, p) in new.into_iter().enumerate() {
            let s = AuthSecret::from_param(p, &at(i))?;
            if all.iter().any(|x| x.user == s.user) {
                return Err(TargetError::Exists(format!(
                    "{}user: {} is already in auth group {}",
                    at(i),
                    s.user,
                    self.tag
                )));
            }
            all.push(s);
        }
        if all.len() > MAX_SECRETS {
            return Err(TargetError::Invalid(format!("secrets: an auth group holds at most {MAX_SECRETS} secrets")));
        }
        self.secrets = all;
        Ok(())
    }

    /// Removes the secret of `user`.
    pub fn remove(&mut self, user: &str) -> Result<(), TargetError> {
        let at = self
            .secrets
            .iter()
            .position(|s| s.user == user)
            .ok_or_else(|| TargetError::NotFound(format!("user: {user} is not in auth group {}", self.tag)))?;
        self.secrets.remove(at);
        Ok(())
    }

    /// What `iscsi_get_auth_groups` shows (SPDK's `iscsi_auth_group_info_json`), secrets
    /// included.
    pub fn info_json(&self) -> Value {
        json!({"tag": self.tag, "secrets": self.secrets.iter().map(AuthSecret::info_json).collect::<Vec<_>>()})
    }

    /// The `iscsi_create_auth_group` call that recreates this group.
    pub fn config_json(&self) -> Value {
        json!({"method": "iscsi_create_auth_group", "params": self.info_json()})
    }
}

impl Inner {
    pub(crate) fn ag(&self, tag: u32) -> Option<&AuthGroup> {
        self.auth_groups.iter().find(|g| g.tag == tag)
    }

    /// The decision of a CHAP policy: its mode, the secrets of its group and the initiator
    /// groups they are bound to.
    pub(crate) fn decision(&self, chap: &Chap) -> AuthDecision {
        let mode = AuthMode::of(chap);
        let secrets: Vec<AuthSecret> = match mode {
            AuthMode::None => Vec::new(),
            _ => self.ag(chap.chap_group).map(|g| g.secrets.clone()).unwrap_or_default(),
        };
        let mut initiator_groups: Vec<InitiatorGroup> = Vec::new();
        for tag in secrets.iter().filter_map(|s| s.initiator_group) {
            if let (None, Some(g)) = (initiator_groups.iter().find(|g| g.tag == tag), self.ig(tag)) {
                initiator_groups.push(g.clone());
            }
        }
        AuthDecision { mode, mutual: chap.mutual_chap && mode == AuthMode::Required, secrets, initiator_groups }
    }

    /// Checks the secrets of `candidate` from index `first_new` on (those being added; `at(i)`
    /// names the i-th of them in messages) against the whole configuration, with `candidate`
    /// in place of the group of the same tag:
    /// - none's `secret` is any entry's `msecret`, nor its `msecret` any entry's `secret`, in
    ///   any group (RFC 7143 §12.1.3: a secret that authenticates initiators must not be one
    ///   the target answers with; see the module's comment for why every group counts);
    /// - an `initiator_group` names an initiator group that exists (save_config writes the
    ///   initiator groups before the auth groups, so a replay finds them).
    ///
    /// Messages name fields, users and tags, never a secret.
    fn check_new_secrets(
        &self,
        candidate: &AuthGroup,
        first_new: usize,
        at: impl Fn(usize) -> String,
    ) -> Result<(), TargetError> {
        let all: Vec<(u32, &AuthSecret)> = self
            .auth_groups
            .iter()
            .filter(|g| g.tag != candidate.tag)
            .chain(std::iter::once(candidate))
            .flat_map(|g| g.secrets.iter().map(move |s| (g.tag, s)))
            .collect();
        let rfc = "a secret that authenticates initiators must not be one the target answers with (RFC 7143 §12.1.3)";
        for (i, new) in candidate.secrets.iter().enumerate().skip(first_new) {
            let at = at(i - first_new);
            for (tag, other) in &all {
                if other.msecret.as_ref().is_some_and(|ms| ms.as_str() == new.secret.as_str()) {
                    return Err(TargetError::Invalid(format!(
                        "{at}secret: is the msecret of user {} in auth group {tag}: {rfc}",
                        other.user
                    )));
                }
                if new.msecret.as_ref().is_some_and(|ms| ms.as_str() == other.secret.as_str()) {
                    return Err(TargetError::Invalid(format!(
                        "{at}msecret: is the secret of user {} in auth group {tag}: {rfc}",
                        other.user
                    )));
                }
            }
            if let Some(ig) = new.initiator_group {
                if self.ig(ig).is_none() {
                    return Err(TargetError::NotFound(format!("{at}initiator_group: initiator group {ig} not found")));
                }
            }
        }
        Ok(())
    }

    /// Logs why a CHAP policy about to be set cannot let anyone in by CHAP: its group does
    /// not exist (yet: SPDK's save_config creates groups after nodes), or CHAP is required
    /// with no group at all. `who`: "target node NAME" or "discovery".
    pub(crate) fn warn_unusable_chap(&self, who: &str, chap: &Chap) {
        match AuthMode::of(chap) {
            AuthMode::None => {}
            AuthMode::Required if chap.chap_group == 0 => {
                log::warn!("{who}: CHAP is required but no auth group is named (chap_group 0): every login will fail")
            }
            _ if chap.chap_group != 0 && self.ag(chap.chap_group).is_none() => log::warn!(
                "{who}: auth group {} does not exist (yet): CHAP logins fail until it is created",
                chap.chap_group
            ),
            _ => {}
        }
    }

    /// Who names auth group `tag` and may use CHAP: "discovery" and "target node NAME"s.
    fn ag_users(&self, tag: u32) -> Vec<String> {
        let mut users = Vec::new();
        let o = &self.options;
        let discovery = Chap {
            disable_chap: o.disable_chap,
            require_chap: o.require_chap,
            mutual_chap: o.mutual_chap,
            chap_group: o.chap_group,
        };
        if discovery.chap_group == tag && AuthMode::of(&discovery) != AuthMode::None {
            users.push("discovery".to_string());
        }
        for n in self.nodes.iter().filter(|n| !n.is_deleted()) {
            let c = n.chap();
            if c.chap_group == tag && AuthMode::of(&c) != AuthMode::None {
                users.push(format!("target node {}", n.name()));
            }
        }
        users
    }
}

impl IscsiTarget {
    /// The auth groups, in creation order.
    pub fn auth_groups(&self) -> Vec<AuthGroup> {
        self.lock().auth_groups.clone()
    }

    /// `iscsi_create_auth_group`: a new group with `secrets` (all valid, or nothing created).
    pub fn create_auth_group(&self, tag: u32, secrets: Vec<AuthSecretParam>) -> Result<(), TargetError> {
        let mut inner = self.lock();
        if tag == 0 {
            return Err(TargetError::Invalid("tag: 0 is out of range (1..)".into()));
        }
        if inner.ag(tag).is_some() {
            return Err(TargetError::Exists(format!("auth group {tag} already exists")));
        }
        let mut g = AuthGroup::new(tag);
        let at = |i: usize| format!("secrets[{i}].");
        g.add(secrets, at)?;
        inner.check_new_secrets(&g, 0, at)?;
        log::info!("iSCSI auth group {tag} created with {} secret(s)", g.secrets.len());
        inner.auth_groups.push(g);
        Ok(())
    }

    /// `iscsi_auth_group_add_secret`. Applies to the next logins.
    pub fn auth_group_add_secret(&self, tag: u32, secret: AuthSecretParam) -> Result<(), TargetError> {
        let user = secret.user.clone();
        let mut inner = self.lock();
        let mut g = inner.ag(tag).cloned().ok_or_else(|| TargetError::NotFound(format!("auth group {tag} not found")))?;
        let first_new = g.secrets.len();
        g.add(vec![secret], |_| String::new())?;
        inner.check_new_secrets(&g, first_new, |_| String::new())?;
        if let Some(slot) = inner.auth_groups.iter_mut().find(|x| x.tag == tag) {
            *slot = g;
        }
        log::info!("iSCSI auth group {tag}: secret of user {user} added");
        Ok(())
    }

    /// `iscsi_auth_group_remove_secret`. Live sessions that authenticated as that user are
    /// asked to log out (the access-changed hook).
    pub fn auth_group_remove_secret(&self, tag: u32, user: &str) -> Result<(), TargetError> {
        let mut inner = self.lock();
        let g = inner
            .auth_groups
            .iter_mut()
            .find(|g| g.tag == tag)
            .ok_or_else(|| TargetError::NotFound(format!("auth group {tag} not found")))?;
        g.remove(user)?;
        drop(inner);
        log::info!("iSCSI auth group {tag}: secret of user {user} removed");
        self.access_changed(&format!("iscsi_auth_group_remove_secret of user {user} from auth group {tag}"));
        Ok(())
    }

    /// `iscsi_delete_auth_group`. As in SPDK, a group still named by a node or by discovery
    /// may go (a warning names them): their CHAP logins fail until it is created again.
    /// Live sessions that authenticated with its secrets are asked to log out.
    pub fn delete_auth_group(&self, tag: u32) -> Result<(), TargetError> {
        let mut inner = self.lock();
        if inner.ag(tag).is_none() {
            return Err(TargetError::NotFound(format!("auth group {tag} not found")));
        }
        inner.auth_groups.retain(|g| g.tag != tag);
        let users = inner.ag_users(tag);
        if users.is_empty() {
            log::info!("iSCSI auth group {tag} deleted");
        } else {
            log::warn!(
                "iSCSI auth group {tag} deleted while {} name(s) it: their CHAP logins fail until it is created again",
                users.join(", ")
            );
        }
        drop(inner);
        self.access_changed(&format!("iscsi_delete_auth_group {tag}"));
        Ok(())
    }

    // ---- queries for login code -----------------------------------------------------------

    /// How a login to `node` must authenticate: the node's CHAP policy and the secrets of its
    /// auth group (`chap_group`; none for 0: a node does not fall back to the discovery group,
    /// as in SPDK). A snapshot: later changes apply to later calls.
    pub fn node_auth(&self, node: &TargetNode) -> AuthDecision {
        let inner = self.lock();
        inner.decision(&node.chap())
    }

    /// How a discovery login must authenticate (`iscsi_set_discovery_auth`, or the same four
    /// options of `iscsi_set_options`). A snapshot.
    pub fn discovery_auth(&self) -> AuthDecision {
        let inner = self.lock();
        let chap = inner.options.discovery_chap();
        inner.decision(&chap)
    }

    pub(crate) fn auth_groups_json(&self) -> Value {
        Value::Array(self.lock().auth_groups.iter().map(AuthGroup::info_json).collect())
    }
}

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// One CHAP secret of an auth group: what the initiator `user` proves it knows (`secret`),
/// and for mutual CHAP what the target answers with (`muser`, `msecret`, both or neither;
/// checked by the server). Debug never shows the secrets.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSecretParam {
    pub user: String,
    pub secret: Secret,
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub muser: Option<String>,
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub msecret: Option<Secret>,
    /// riser's extension: the user may log in only as one of the initiator names this
    /// initiator group admits (as LIO binds credentials to an ACL). Absent: any name.
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub initiator_group: Option<u32>,
}

impl std::fmt::Debug for AuthSecretParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (m, ms, ig) = (self.muser.as_deref(), self.msecret.is_some(), self.initiator_group);
        debug_secret(f, "AuthSecretParam", None, &self.user, m, ms, ig)
    }
}

/// Debug of a secret-holding parameter: names shown, secrets never.
fn debug_secret(
    f: &mut std::fmt::Formatter<'_>,
    ty: &str,
    tag: Option<u32>,
    user: &str,
    muser: Option<&str>,
    msecret: bool,
    initiator_group: Option<u32>,
) -> std::fmt::Result {
    let mut d = f.debug_struct(ty);
    if let Some(t) = tag {
        d.field("tag", &t);
    }
    d.field("user", &user).field("secret", &"<redacted>").field("muser", &muser);
    if msecret {
        d.field("msecret", &"<redacted>");
    }
    if let Some(ig) = initiator_group {
        d.field("initiator_group", &ig);
    }
    d.finish()
}

/// `iscsi_create_auth_group`: a new group, with its secrets (none when absent).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiCreateAuthGroup {
    /// 1 or more (checked by the server).
    pub tag: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<AuthSecretParam>,
}

/// `iscsi_auth_group_add_secret`. Debug never shows the secrets.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiAuthGroupAddSecret {
    pub tag: u32,
    pub user: String,
    pub secret: Secret,
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub muser: Option<String>,
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub msecret: Option<Secret>,
    /// riser's extension: see [`AuthSecretParam::initiator_group`].
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub initiator_group: Option<u32>,
}

impl IscsiAuthGroupAddSecret {
    /// The secret without its group tag.
    pub fn secret_param(self) -> AuthSecretParam {
        AuthSecretParam {
            user: self.user,
            secret: self.secret,
            muser: self.muser,
            msecret: self.msecret,
            initiator_group: self.initiator_group,
        }
    }
}

impl std::fmt::Debug for IscsiAuthGroupAddSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (m, ms, ig) = (self.muser.as_deref(), self.msecret.is_some(), self.initiator_group);
        debug_secret(f, "IscsiAuthGroupAddSecret", Some(self.tag), &self.user, m, ms, ig)
    }
}

/// `iscsi_auth_group_remove_secret`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiAuthGroupRemoveSecret {
    pub tag: u32,
    pub user: String,
}

/// Registers the auth group methods.
pub(crate) fn register(reg: &mut RpcRegistry, target: &Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_create_auth_group", move |p: IscsiCreateAuthGroup| ok(t.create_auth_group(p.tag, p.secrets)));
    let t = target.clone();
    reg.add("iscsi_delete_auth_group", move |p: ByTag| ok(t.delete_auth_group(p.tag)));
    let t = target.clone();
    reg.add("iscsi_get_auth_groups", move |_: NoParams| Ok(t.auth_groups_json()));
    let t = target.clone();
    reg.add("iscsi_auth_group_add_secret", move |p: IscsiAuthGroupAddSecret| {
        let tag = p.tag;
        ok(t.auth_group_add_secret(tag, p.secret_param()))
    });
    let t = target.clone();
    reg.add("iscsi_auth_group_remove_secret", move |p: IscsiAuthGroupRemoveSecret| {
        ok(t.auth_group_remove_secret(p.tag, &p.user))
    });
}

#[cfg(test)]
mod tests;
