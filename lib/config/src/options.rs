//! Global iSCSI options: SPDK's `iscsi_set_options` / `iscsi_get_options` parameters, their
//! defaults and ranges, the two methods and the `iscsi_set_options` call of save_config; and
//! `iscsi_set_discovery_auth`, which sets the four discovery CHAP options (save_config shows
//! them in `iscsi_set_options`, as SPDK does).
//! Session-wide keys (FirstBurstLength, ImmediateData, ...) are the values the target offers
//! in login negotiation (RFC 7143 §13).

use std::sync::Arc;

use riser_rpc::params::{is_false, is_zero_u32, NoParams};
use riser_rpc::RpcRegistry;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::rpc::ok;
use crate::target_node::Chap;
use crate::{IscsiTarget, TargetError};

/// `iscsi_set_options` parameters: each one given replaces the current value.
pub use self::IscsiSetOptions as OptionsUpdate;

/// Prefix put in front of target node names given without `iqn.`/`eui.`/`naa.`.
pub const DEFAULT_NODE_BASE: &str = "iqn.2016-06.io.riser";
/// Upper bound of `max_queue_depth` (SPDK's SPDK_ISCSI_MAX_QUEUE_DEPTH).
pub const MAX_QUEUE_DEPTH_LIMIT: u32 = 256;
/// FirstBurstLength may not be below 512 (RFC 7143 §13.14).
pub const MIN_FIRST_BURST_LENGTH: u32 = 512;
/// FirstBurstLength may not exceed MaxBurstLength (RFC 7143 §13.14); riser offers the default
/// MaxBurstLength, 262144 (§13.13), which is also below the 2^24-1 limit of both keys.
pub const MAX_BURST_LENGTH: u32 = 262_144;
/// Most seconds between NOP-Ins (SPDK's MAX_NOPININTERVAL).
pub const MAX_NOP_IN_INTERVAL: u32 = 60;
/// DefaultTime2Wait and DefaultTime2Retain are 0..=3600 seconds (RFC 7143 §13.15, §13.16).
pub const MAX_TIME2: u32 = 3600;
/// Default of `max_tx_queue_bytes` (riser_iscsi's `DEFAULT_MAX_TX_QUEUE_BYTES`, which says
/// why 1 MiB).
pub const DEFAULT_MAX_TX_QUEUE_BYTES: u32 = 1 << 20;
/// Range of `max_tx_queue_bytes`: below 64 KiB a healthy connection would stop reading
/// for every few responses; above 1 GiB it is no bound.
pub const MIN_TX_QUEUE_BYTES: u32 = 64 << 10;
pub const MAX_TX_QUEUE_BYTES: u32 = 1 << 30;
/// Most seconds `data_out_timeout` may be.
pub const MAX_DATA_OUT_TIMEOUT: u32 = 3600;
/// Most seconds `login_timeout` may be: a login holds a thread that long.
pub const MAX_LOGIN_TIMEOUT: u32 = 300;
/// Upper bound of `max_logins` and `max_logins_per_source`: each login in progress is a
/// thread.
pub const MAX_LOGINS_LIMIT: u32 = 65536;
/// Default of `discovery_idle_timeout`: an initiator logs out right after SendTargets, so a
/// discovery session idle this long is held, not used.
pub const DEFAULT_DISCOVERY_IDLE_TIMEOUT: u32 = 30;

/// The global options, as `iscsi_get_options` shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// SPDK's legacy CHAP secret file. Accepted and shown so SPDK configs replay; never read
    /// (CHAP secrets live in auth groups).
    pub auth_file: Option<String>,
    pub node_base: String,
    pub nop_timeout: u32,
    pub nop_in_interval: u32,
    /// Discovery-session CHAP policy ([`Options::discovery_chap`]); `chap_group` names the
    /// auth group (0: none).
    pub disable_chap: bool,
    pub require_chap: bool,
    pub mutual_chap: bool,
    pub chap_group: u32,
    pub max_sessions: u32,
    /// MaxConnections offered (RFC 7143 §13.2).
    pub max_connections_per_session: u32,
    pub max_queue_depth: u32,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub error_recovery_level: u32,
    pub allow_duplicated_isid: bool,
    pub max_large_datain_per_connection: u32,
    /// MaxOutstandingR2T offered (RFC 7143 §13.17).
    pub max_r2t_per_connection: u32,
    /// SPDK's buffer pool sizes: accepted and shown; riser sizes its pools itself.
    pub pdu_pool_size: u32,
    pub immediate_data_pool_size: u32,
    pub data_out_pool_size: u32,
    /// riser's extension: bytes a connection may queue for sending outside the I/O buffer
    /// budget before it stops reading the initiator until they are taken (a peer that sends
    /// and never reads fills its own socket buffers, not riser's memory).
    pub max_tx_queue_bytes: u32,
    /// riser's extension: seconds a write's data may be overdue (R2Ts or RDMA Reads
    /// unanswered, unsolicited Data-Out not sent) before its command fails with CHECK
    /// CONDITION and its buffers go back to the budget.
    pub data_out_timeout: u32,
    /// riser: seconds a login may take, sending included; then its connection is dropped.
    pub login_timeout: u32,
    /// riser: most logins in progress at once (each has a thread); more connections are
    /// refused at once.
    pub max_logins: u32,
    /// riser: most logins in progress from one source address, so that a few hosts cannot
    /// take every login slot.
    pub max_logins_per_source: u32,
    /// riser: most discovery sessions at once (they do not count against `max_sessions`).
    pub max_discovery_sessions: u32,
    /// riser: most discovery sessions from one source address (an IPv6 /64 counts as one),
    /// so that one host cannot hold every discovery session (an initiator opens one at a
    /// time and logs out after SendTargets).
    pub max_discovery_sessions_per_source: u32,
    /// riser: seconds a discovery session may go without a PDU from the initiator (answers
    /// to riser's NOP-In pings do not count) before it is closed; 0: never.
    pub discovery_idle_timeout: u32,
}

impl Default for Options {
    fn default() -> Self {
        // SPDK's defaults, so an SPDK script that sets nothing sees the same values.
        Options {
            auth_file: None,
            node_base: DEFAULT_NODE_BASE.to_string(),
            nop_timeout: 60,
            nop_in_interval: 30,
            disable_chap: false,
            require_chap: false,
            mutual_chap: false,
            chap_group: 0,
            max_sessions: 128,
            max_connections_per_session: 2,
            max_queue_depth: 64,
            default_time2wait: 2,
            default_time2retain: 20,
            first_burst_length: 8192,
            immediate_data: true,
            error_recovery_level: 0,
            allow_duplicated_isid: false,
            max_large_datain_per_connection: 64,
            max_r2t_per_connection: 4,
            pdu_pool_size: 36864,
            immediate_data_pool_size: 16384,
            data_out_pool_size: 2048,
            max_tx_queue_bytes: DEFAULT_MAX_TX_QUEUE_BYTES,
            data_out_timeout: 20,
            login_timeout: 15,
            max_logins: 1024,
            max_logins_per_source: 32,
            max_discovery_sessions: 64,
            max_discovery_sessions_per_source: 4,
            discovery_idle_timeout: DEFAULT_DISCOVERY_IDLE_TIMEOUT,
        }
    }
}

fn in_range(field: &str, v: u32, lo: u32, hi: u32) -> Result<(), TargetError> {
    if v < lo || v > hi {
        return Err(TargetError::Invalid(format!("{field}: {v} is out of range ({lo}..={hi})")));
    }
    Ok(())
}

/// SPDK's rule for a CHAP policy (`iscsi_check_chap_params`): CHAP cannot be both disabled
/// and required, and mutual CHAP needs required CHAP. The group need not exist (see
/// [`crate::auth_group`]).
pub(crate) fn check_chap(disable: bool, require: bool, mutual: bool) -> Result<(), TargetError> {
    if disable && require {
        return Err(TargetError::Invalid(
            "disable_chap and require_chap are mutually exclusive".into(),
        ));
    }
    if mutual && !require {
        return Err(TargetError::Invalid("mutual_chap requires require_chap".into()));
    }
    Ok(())
}

impl Options {
    /// The CHAP policy of discovery sessions.
    pub fn discovery_chap(&self) -> Chap {
        Chap {
            disable_chap: self.disable_chap,
            require_chap: self.require_chap,
            mutual_chap: self.mutual_chap,
            chap_group: self.chap_group,
        }
    }

    /// The options with `u` applied, validated; `self` is unchanged on error.
    pub fn updated(&self, u: OptionsUpdate) -> Result<Options, TargetError> {
        let mut o = self.clone();
        if let Some(v) = u.auth_file {
            o.auth_file = Some(v);
        }
        macro_rules! take {
            ($($f:ident),*) => { $( if let Some(v) = u.$f { o.$f = v; } )* };
        }
        take!(
            node_base, nop_timeout, nop_in_interval, disable_chap, require_chap, mutual_chap,
            chap_group, max_sessions, max_connections_per_session, max_queue_depth,
            default_time2wait, default_time2retain, first_burst_length, immediate_data,
            error_recovery_level, allow_duplicated_isid, max_large_datain_per_connection,
            max_r2t_per_connection, pdu_pool_size, immediate_data_pool_size, data_out_pool_size,
            max_tx_queue_bytes, login_timeout, max_logins, max_logins_per_source, max_discovery_sessions,
            max_discovery_sessions_per_source, discovery_idle_timeout
        );
        take!(data_out_timeout);
        o.validate()?;
        Ok(o)
    }

    /// Checks every range (SPDK's `iscsi_opts_verify`, plus RFC 7143 limits).
    pub fn validate(&self) -> Result<(), TargetError> {
        crate::target_node::check_iscsi_name(&self.node_base)
            .map_err(|e| TargetError::Invalid(format!("node_base: {e}")))?;
        // MaxSessions and MaxConnections: TSIH and CID are 16-bit.
        in_range("max_sessions", self.max_sessions, 1, 65535)?;
        in_range("max_connections_per_session", self.max_connections_per_session, 1, 65535)?;
        in_range("max_queue_depth", self.max_queue_depth, 1, MAX_QUEUE_DEPTH_LIMIT)?;
        in_range("default_time2wait", self.default_time2wait, 0, MAX_TIME2)?;
        in_range("default_time2retain", self.default_time2retain, 0, MAX_TIME2)?;
        in_range("first_burst_length", self.first_burst_length, MIN_FIRST_BURST_LENGTH, MAX_BURST_LENGTH)?;
        in_range("error_recovery_level", self.error_recovery_level, 0, 2)?;
        in_range("nop_in_interval", self.nop_in_interval, 0, MAX_NOP_IN_INTERVAL)?;
        in_range("max_large_datain_per_connection", self.max_large_datain_per_connection, 1, u32::MAX)?;
        // MaxOutstandingR2T is 1..=65535 (RFC 7143 §13.17).
        in_range("max_r2t_per_connection", self.max_r2t_per_connection, 1, 65535)?;
        in_range("pdu_pool_size", self.pdu_pool_size, 1, u32::MAX)?;
        in_range("immediate_data_pool_size", self.immediate_data_pool_size, 1, u32::MAX)?;
        in_range("data_out_pool_size", self.data_out_pool_size, 1, u32::MAX)?;
        in_range("max_tx_queue_bytes", self.max_tx_queue_bytes, MIN_TX_QUEUE_BYTES, MAX_TX_QUEUE_BYTES)?;
        in_range("data_out_timeout", self.data_out_timeout, 1, MAX_DATA_OUT_TIMEOUT)?;
        in_range("login_timeout", self.login_timeout, 1, MAX_LOGIN_TIMEOUT)?;
        in_range("max_logins", self.max_logins, 1, MAX_LOGINS_LIMIT)?;
        in_range("max_logins_per_source", self.max_logins_per_source, 1, MAX_LOGINS_LIMIT)?;
        // Normal and discovery sessions share the 65535 TSIHs.
        in_range("max_discovery_sessions", self.max_discovery_sessions, 1, 65535)?;
        in_range("max_discovery_sessions_per_source", self.max_discovery_sessions_per_source, 1, 65535)?;
        in_range("discovery_idle_timeout", self.discovery_idle_timeout, 0, MAX_TIME2)?;
        check_chap(self.disable_chap, self.require_chap, self.mutual_chap)?;
        Ok(())
    }

    /// What `iscsi_get_options` returns (SPDK's `iscsi_opts_info_json`); also the params of
    /// the `iscsi_set_options` call in save_config.
    pub fn info_json(&self) -> Value {
        let mut v = json!({
            "node_base": self.node_base,
            "max_sessions": self.max_sessions,
            "max_connections_per_session": self.max_connections_per_session,
            "max_queue_depth": self.max_queue_depth,
            "default_time2wait": self.default_time2wait,
            "default_time2retain": self.default_time2retain,
            "first_burst_length": self.first_burst_length,
            "immediate_data": self.immediate_data,
            "allow_duplicated_isid": self.allow_duplicated_isid,
            "error_recovery_level": self.error_recovery_level,
            "nop_timeout": self.nop_timeout,
            "nop_in_interval": self.nop_in_interval,
            "disable_chap": self.disable_chap,
            "require_chap": self.require_chap,
            "mutual_chap": self.mutual_chap,
            "chap_group": self.chap_group,
            "max_large_datain_per_connection": self.max_large_datain_per_connection,
            "max_r2t_per_connection": self.max_r2t_per_connection,
            "pdu_pool_size": self.pdu_pool_size,
            "immediate_data_pool_size": self.immediate_data_pool_size,
            "data_out_pool_size": self.data_out_pool_size,
            "max_tx_queue_bytes": self.max_tx_queue_bytes,
            "data_out_timeout": self.data_out_timeout,
            "login_timeout": self.login_timeout,
            "max_logins": self.max_logins,
            "max_logins_per_source": self.max_logins_per_source,
            "max_discovery_sessions": self.max_discovery_sessions,
            "max_discovery_sessions_per_source": self.max_discovery_sessions_per_source,
            "discovery_idle_timeout": self.discovery_idle_timeout,
        });
        if let (Some(f), Some(m)) = (&self.auth_file, v.as_object_mut()) {
            m.insert("auth_file".into(), json!(f));
        }
        v
    }

    /// The `iscsi_set_options` call that restores these options (all of them, as SPDK
    /// writes them).
    pub fn config_json(&self) -> Value {
        json!({"method": "iscsi_set_options", "params": self.info_json()})
    }
}

impl IscsiTarget {
    /// A copy of the global options (the values login negotiation offers).
    pub fn options(&self) -> Options {
        self.lock().options.clone()
    }

    /// `iscsi_set_options`: given values replace current ones. `max_queue_depth` may not go
    /// below an existing node's queue_depth.
    pub fn set_options(&self, update: OptionsUpdate) -> Result<(), TargetError> {
        let mut inner = self.lock();
        let o = inner.options.updated(update)?;
        if let Some(n) = inner.nodes.iter().find(|n| n.queue_depth() > o.max_queue_depth) {
            return Err(TargetError::Invalid(format!(
                "max_queue_depth: {} is below queue_depth {} of target node {}",
                o.max_queue_depth,
                n.queue_depth(),
                n.name()
            )));
        }
        let discovery_changed = o.discovery_chap() != inner.options.discovery_chap();
        inner.options = o;
        drop(inner);
        if discovery_changed {
            // The four discovery CHAP options, as iscsi_set_discovery_auth sets them.
            self.access_changed("iscsi_set_options (discovery CHAP)");
        }
        Ok(())
    }

    /// `iscsi_set_discovery_auth`: the whole discovery CHAP policy is replaced. Applies to the
    /// next discovery logins.
    pub fn set_discovery_auth(&self, chap: Chap) -> Result<(), TargetError> {
        check_chap(chap.disable_chap, chap.require_chap, chap.mutual_chap)?;
        let mut inner = self.lock();
        inner.warn_unusable_chap("discovery", &chap);
        let o = &mut inner.options;
        (o.disable_chap, o.require_chap, o.mutual_chap, o.chap_group) =
            (chap.disable_chap, chap.require_chap, chap.mutual_chap, chap.chap_group);
        log::info!("iSCSI discovery authentication: {}", chap.describe());
        drop(inner);
        self.access_changed("iscsi_set_discovery_auth");
        Ok(())
    }

    pub(crate) fn options_json(&self) -> Value {
        self.lock().options.info_json()
    }
}

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `iscsi_set_options`: each option given replaces the current value (a `null` one is taken
/// as not given).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiSetOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_base: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nop_timeout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nop_in_interval: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_chap: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_chap: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chap_group: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections_per_session: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue_depth: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_time2wait: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_time2retain: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_burst_length: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immediate_data: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_recovery_level: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_duplicated_isid: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_large_datain_per_connection: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_r2t_per_connection: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdu_pool_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immediate_data_pool_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_out_pool_size: Option<u32>,
    /// riser's extension: bytes a connection may queue for sending outside the I/O buffer
    /// budget (NOP-In echoes, Rejects, text responses, headers) before it stops reading the
    /// initiator's PDUs until they are taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tx_queue_bytes: Option<u32>,
    /// riser's extension: seconds before overdue write data fails its command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_out_timeout: Option<u32>,
    /// riser extension: seconds a login may take (default 15).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login_timeout: Option<u32>,
    /// riser extension: most logins in progress (default 1024).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_logins: Option<u32>,
    /// riser extension: most logins in progress from one source address (default 32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_logins_per_source: Option<u32>,
    /// riser extension: most discovery sessions (default 64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_discovery_sessions: Option<u32>,
    /// riser extension: most discovery sessions from one source address, an IPv6 /64
    /// counting as one (default 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_discovery_sessions_per_source: Option<u32>,
    /// riser extension: seconds a discovery session may be idle before it is closed; 0:
    /// never (default 30).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_idle_timeout: Option<u32>,
}

/// `iscsi_set_discovery_auth`: the CHAP policy of discovery sessions, replaced whole (an
/// absent flag is `false`, an absent `chap_group` 0), as SPDK does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiSetDiscoveryAuth {
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub require_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub mutual_chap: bool,
    /// The auth group whose secrets discovery logins use; 0: none.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub chap_group: u32,
}

/// Registers `iscsi_set_options` and `iscsi_get_options`.
pub(crate) fn register(reg: &mut RpcRegistry, target: &Arc<IscsiTarget>) {
    let t = target.clone();
    reg.add("iscsi_set_options", move |p: OptionsUpdate| ok(t.set_options(p)));
    let t = target.clone();
    reg.add("iscsi_get_options", move |_: NoParams| Ok(t.options_json()));
    let t = target.clone();
    reg.add("iscsi_set_discovery_auth", move |p: IscsiSetDiscoveryAuth| {
        ok(t.set_discovery_auth(Chap {
            disable_chap: p.disable_chap,
            require_chap: p.require_chap,
            mutual_chap: p.mutual_chap,
            chap_group: p.chap_group,
        }))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::env;

    #[test]
    fn defaults_are_valid_and_updates_validate() {
        let d = Options::default();
        assert_eq!(d.validate(), Ok(()));
        let o = d
            .updated(OptionsUpdate { first_burst_length: Some(65536), ..Default::default() })
            .unwrap();
        assert_eq!(o.first_burst_length, 65536);
        assert_eq!(o.max_queue_depth, 64);
        let e = d.updated(OptionsUpdate { first_burst_length: Some(511), ..Default::default() });
        assert_eq!(
            e,
            Err(TargetError::Invalid("first_burst_length: 511 is out of range (512..=262144)".into()))
        );
        let e = d.updated(OptionsUpdate { first_burst_length: Some(1 << 24), ..Default::default() });
        assert!(matches!(e, Err(TargetError::Invalid(m)) if m.starts_with("first_burst_length:")));
        let e = d.updated(OptionsUpdate { require_chap: Some(true), disable_chap: Some(true), ..Default::default() });
        assert!(matches!(e, Err(TargetError::Invalid(m)) if m.contains("mutually exclusive")));
        let e = d.updated(OptionsUpdate { mutual_chap: Some(true), ..Default::default() });
        assert!(matches!(e, Err(TargetError::Invalid(m)) if m.contains("mutual_chap")));
        let e = d.updated(OptionsUpdate { node_base: Some("iqn.bad".into()), ..Default::default() });
        assert!(matches!(e, Err(TargetError::Invalid(m)) if m.starts_with("node_base:")));
    }

    #[test]
    fn info_json_shows_auth_file_only_when_set() {
        let mut o = Options::default();
        assert!(o.info_json().get("auth_file").is_none());
        o.auth_file = Some("/etc/riser/auth.conf".into());
        assert_eq!(o.info_json()["auth_file"], "/etc/riser/auth.conf");
        assert_eq!(o.info_json()["node_base"], DEFAULT_NODE_BASE);
    }

    #[test]
    fn set_options_validates_and_names_the_field() {
        let e = env();
        let cases = [
            (json!({"first_burst_length": 511}), "first_burst_length: 511 is out of range (512..=262144)"),
            (json!({"first_burst_length": 262145}), "first_burst_length:"),
            (json!({"first_burst_length": 16777215}), "first_burst_length:"),
            (json!({"error_recovery_level": 3}), "error_recovery_level: 3 is out of range (0..=2)"),
            (json!({"max_queue_depth": 0}), "max_queue_depth: 0"),
            (json!({"max_queue_depth": 257}), "max_queue_depth: 257"),
            (json!({"max_sessions": 0}), "max_sessions"),
            (json!({"max_connections_per_session": 65536}), "max_connections_per_session"),
            (json!({"default_time2wait": 3601}), "default_time2wait"),
            (json!({"nop_in_interval": 61}), "nop_in_interval"),
            (json!({"max_r2t_per_connection": 0}), "max_r2t_per_connection"),
            (json!({"max_tx_queue_bytes": 65535}), "max_tx_queue_bytes: 65535 is out of range (65536..=1073741824)"),
            (json!({"max_tx_queue_bytes": 1073741825}), "max_tx_queue_bytes"),
            (json!({"data_out_timeout": 0}), "data_out_timeout: 0 is out of range (1..=3600)"),
            (json!({"data_out_timeout": 3601}), "data_out_timeout"),
            (json!({"login_timeout": 0}), "login_timeout: 0 is out of range (1..=300)"),
            (json!({"max_logins": 0}), "max_logins: 0"),
            (json!({"max_logins_per_source": 65537}), "max_logins_per_source"),
            (json!({"max_discovery_sessions": 0}), "max_discovery_sessions"),
            (json!({"max_discovery_sessions_per_source": 0}), "max_discovery_sessions_per_source: 0"),
            (json!({"discovery_idle_timeout": 3601}), "discovery_idle_timeout: 3601 is out of range (0..=3600)"),
            (json!({"node_base": "not a name"}), "node_base:"),
            (json!({"disable_chap": true, "require_chap": true}), "mutually exclusive"),
            (json!({"first_burst_length": -1}), "first_burst_length"),
            (json!({"immediate_data": "yes"}), "immediate_data"),
            (json!({"no_such_option": 1}), "no_such_option"),
        ];
        for (p, needle) in cases {
            assert_eq!(e.err("iscsi_set_options", p.clone(), needle), -32602, "{p}");
        }
        // Nothing changed by the refused calls.
        assert_eq!(e.target.options(), crate::Options::default());
        e.ok("iscsi_set_options", json!({"first_burst_length": 262144, "error_recovery_level": 2, "pdu_pool_size": 1024, "auth_file": "/x", "max_tx_queue_bytes": 65536}));
        let o = e.target.options();
        assert_eq!((o.first_burst_length, o.error_recovery_level, o.pdu_pool_size, o.max_tx_queue_bytes), (262144, 2, 1024, 65536));
        assert_eq!(e.ok("iscsi_get_options", json!({}))["max_tx_queue_bytes"], 65536);
        assert_eq!((o.first_burst_length, o.error_recovery_level, o.pdu_pool_size), (262144, 2, 1024));
        assert_eq!(o.data_out_timeout, 20, "the default");
        e.ok("iscsi_set_options", json!({"data_out_timeout": 5}));
        assert_eq!(e.target.options().data_out_timeout, 5);
        assert_eq!(e.target.options_json()["data_out_timeout"], 5);
        e.ok("iscsi_set_options", json!({"login_timeout": 5, "max_logins": 64, "max_logins_per_source": 4, "max_discovery_sessions": 8}));
        let o = e.target.options();
        assert_eq!((o.login_timeout, o.max_logins, o.max_logins_per_source, o.max_discovery_sessions), (5, 64, 4, 8));
        assert_eq!(o.info_json()["max_logins_per_source"], 4);
        assert_eq!(o.max_discovery_sessions_per_source, 4, "the default");
        e.ok("iscsi_set_options", json!({"max_discovery_sessions_per_source": 2}));
        assert_eq!(e.target.options().info_json()["max_discovery_sessions_per_source"], 2);
        assert_eq!(o.discovery_idle_timeout, 30, "the default");
        e.ok("iscsi_set_options", json!({"discovery_idle_timeout": 0}));
        assert_eq!(e.ok("iscsi_get_options", json!({}))["discovery_idle_timeout"], 0);
        assert_eq!(e.err("iscsi_get_options", json!({"x": 1}), "x"), -32602);
    }
}
