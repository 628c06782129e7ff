//! The parameters of riser's JSON-RPC methods, defined once: the server decodes them (through
//! [`crate::server::decode_params`], which refuses unknown fields and names the offending one)
//! and `riser-rpc` builds its requests from them. Names, types, defaults and which fields may
//! be absent are SPDK's (rpc.py sends the same shapes), plus riser's extensions, each marked.
//!
//! Decoding is what the server accepts; encoding leaves out what the server would default
//! anyway (a `false` flag, an absent option, a zero default), as rpc.py leaves it out, so a
//! request built here stays SPDK's shape.
//!
//! A field that may be absent but not `null` is an `Option` decoded with `not_null`: absent
//! is `None`, `null` is refused as for a plain field. A plain `Option` field also takes `null`.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use uuid::Uuid;
pub use zeroize::Zeroizing;

/// A CHAP secret as the auth group methods carry it: overwritten when dropped (the decoded
/// request's copy; the request text and JSON values it was parsed from are the server's,
/// see [`crate::server`]).
pub type Secret = Zeroizing<String>;

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Decodes a field that may be absent (`#[serde(default)]` gives `None`) but not `null`.
fn not_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

// ---- shared -------------------------------------------------------------------------------

/// No parameters (the getters): absent params or `{}`; any field is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// `{name}`: `iscsi_delete_target_node`, `bdev_malloc_delete`, `bdev_null_delete`,
/// `bdev_uring_delete`, `bdev_uring_rescan`, `bdev_aio_delete`, `bdev_aio_rescan`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByName {
    pub name: String,
}

/// `{tag}`: `iscsi_start_portal_group`, `iscsi_delete_portal_group`,
/// `iscsi_delete_initiator_group`, `iscsi_delete_auth_group`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByTag {
    pub tag: u32,
}

// ---- iSCSI --------------------------------------------------------------------------------

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
}

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

/// A portal group ↔ initiator group pair: initiators of `ig_tag` may log in through the
/// portals of `pg_tag`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgIgMap {
    pub pg_tag: u32,
    pub ig_tag: u32,
}

/// One LUN of `iscsi_create_target_node`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LunParam {
    pub bdev_name: String,
    /// 0..=1023 (checked by the server).
    pub lun_id: u32,
    /// riser's extension: a removable medium.
    #[serde(default, skip_serializing_if = "is_false")]
    pub removable: bool,
    /// riser's extension: write-protected.
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
}

/// `iscsi_create_target_node`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiCreateTargetNode {
    /// A full `iqn.`/`eui.`/`naa.` name, or a short one the server puts after node_base.
    pub name: String,
    /// Required by SPDK; optional here (no alias).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias_name: Option<String>,
    pub pg_ig_maps: Vec<PgIgMap>,
    pub luns: Vec<LunParam>,
    /// Required by SPDK; defaults here to the max_queue_depth option.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub require_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub mutual_chap: bool,
    /// Absent: 0.
    #[serde(default, deserialize_with = "not_null", skip_serializing_if = "Option::is_none")]
    pub chap_group: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub header_digest: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub data_digest: bool,
}

/// `iscsi_target_node_add_lun`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeAddLun {
    /// The full name, or the short name given to `iscsi_create_target_node`.
    pub name: String,
    pub bdev_name: String,
    /// Absent or -1 (SPDK's "any"): the lowest free id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lun_id: Option<i64>,
    /// riser's extension (see [`LunParam`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub removable: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
}

/// `iscsi_target_node_add_pg_ig_maps` and `iscsi_target_node_remove_pg_ig_maps`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiNodeMaps {
    pub name: String,
    pub pg_ig_maps: Vec<PgIgMap>,
}

/// `iscsi_target_node_set_auth`: the node's whole CHAP policy is replaced (an absent flag is
/// `false`, an absent `chap_group` 0), as SPDK does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiTargetNodeSetAuth {
    /// The full name, or the short name given to `iscsi_create_target_node`.
    pub name: String,
    /// The auth group whose secrets CHAP logins to this node use; 0: none.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub chap_group: u32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub require_chap: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub mutual_chap: bool,
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

// ---- bdev ---------------------------------------------------------------------------------

/// `bdev_malloc_create`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevMallocCreate {
    /// The server picks one when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub num_blocks: u64,
    pub block_size: u32,
    /// Random when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
    /// Accepted for SPDK configs; riser's malloc has no I/O boundary.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub optimal_io_boundary: u32,
    /// Separate metadata per block: only 0 is supported.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub md_size: u32,
    /// SPDK's name: several logical blocks per physical block (e.g. 4096 over 512).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical_block_size: Option<u32>,
}

/// `bdev_null_create`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevNullCreate {
    pub name: String,
    pub num_blocks: u64,
    pub block_size: u32,
    /// Random when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
    /// Separate metadata per block: only 0 is supported.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub md_size: u32,
}

/// `bdev_uring_create`: a file or block device through io_uring.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevUringCreate {
    pub name: String,
    pub filename: String,
    /// Detected when absent (or 0): the device's logical block size, 512 for a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Random when absent (SPDK v24.05's field; riser's save_config keeps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
}

/// `bdev_aio_create`: the same engine as `bdev_uring_create`, SPDK's AIO parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevAioCreate {
    pub name: String,
    pub filename: String,
    /// Detected when absent (or 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub readonly: bool,
    /// SPDK's: write zeroes by fallocate. riser probes the file system for it instead.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fallocate: bool,
    /// Random when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
}

/// `bdev_nvme_attach_controller`: a local NVMe controller (trtype PCIe) through the
/// kernel's nvme driver. SPDK's fabrics and protection parameters are accepted only with
/// their defaults (they mean nothing for a local PCIe controller, or riser does not do them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevNvmeAttachController {
    pub name: String,
    /// "PCIe" (any case).
    pub trtype: String,
    /// The PCI address, e.g. 0000:00:04.0.
    pub traddr: String,
    /// Fabrics only: refused when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adrfam: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trsvcid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnqn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostnqn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostaddr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostsvcid: Option<String>,
    /// End-to-end protection checks: refused when true (riser serves no PI namespaces).
    #[serde(default, skip_serializing_if = "is_false")]
    pub prchk_reftag: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub prchk_guard: bool,
    /// NVMe/TCP digests: refused when true.
    #[serde(default, skip_serializing_if = "is_false")]
    pub hdgst: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub ddgst: bool,
    /// Reconnect and multipath tuning of SPDK's own driver: accepted and ignored (the kernel's
    /// driver does its own resets and multipathing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctrlr_loss_timeout_sec: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect_delay_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_io_fail_timeout_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipath: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_io_queues: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabrics_connect_timeout_us: Option<u64>,
}

/// `bdev_nvme_detach_controller` (SPDK's trid filters are accepted only empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevNvmeDetachController {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traddr: Option<String>,
}

/// `bdev_nvme_get_controllers`: all, or the one named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevNvmeGetControllers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `bdev_get_bdevs`: all bdevs, or the one of that name or UUID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevGetBdevs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// SPDK's wait-for-bdev timeout; riser's bdevs exist as soon as they are created.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub timeout: u64,
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::server::decode_params;

    fn encode<T: Serialize>(p: &T) -> Value {
        serde_json::to_value(p).unwrap()
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

    /// What is encoded leaves the server's defaults out and decodes back to the same value.
    #[test]
    fn encoding_leaves_defaults_out_and_round_trips() {
        let pg = IscsiCreatePortalGroup {
            tag: 1,
            portals: vec![PortalParam { host: "[::1]".into(), port: PortParam("3260".into()), iser: true }],
            ..Default::default()
        };
        assert_eq!(encode(&pg), json!({"tag": 1, "portals": [{"host": "[::1]", "port": "3260", "iser": true}]}));
        let node = IscsiCreateTargetNode {
            name: "d".into(),
            luns: vec![LunParam { bdev_name: "M0".into(), lun_id: 0, ..Default::default() }],
            chap_group: Some(0),
            ..Default::default()
        };
        assert_eq!(
            encode(&node),
            json!({"name": "d", "pg_ig_maps": [], "luns": [{"bdev_name": "M0", "lun_id": 0}], "chap_group": 0})
        );
        let malloc = BdevMallocCreate { num_blocks: 8, block_size: 512, ..Default::default() };
        assert_eq!(encode(&malloc), json!({"num_blocks": 8, "block_size": 512}));
        assert_eq!(encode(&BdevGetBdevs::default()), json!({}));
        assert_eq!(encode(&IscsiSetOptions::default()), json!({}));
        assert_eq!(encode(&IscsiChangeInitiatorGroup { tag: 2, netmasks: Some(vec![]), ..Default::default() }), json!({"tag": 2, "netmasks": []}));

        assert_eq!(decode_params::<IscsiCreatePortalGroup>(encode(&pg)), Ok(pg));
        assert_eq!(decode_params::<IscsiCreateTargetNode>(encode(&node)), Ok(node));
        assert_eq!(decode_params::<BdevMallocCreate>(encode(&malloc)), Ok(malloc));
    }

    /// Fields that may be absent but were never nullable stay so; plain options take null.
    #[test]
    fn absent_is_not_null() {
        let p: IscsiChangeInitiatorGroup = decode_params(json!({"tag": 1})).unwrap();
        assert_eq!((p.initiators, p.netmasks), (None, None));
        let e = decode_params::<IscsiChangeInitiatorGroup>(json!({"tag": 1, "initiators": null})).unwrap_err();
        assert!(e.message.contains("initiators"), "{e}");
        let base = json!({"name": "d", "pg_ig_maps": [], "luns": []});
        let mut with_null = base.clone();
        with_null["chap_group"] = Value::Null;
        assert!(decode_params::<IscsiCreateTargetNode>(with_null).unwrap_err().message.contains("chap_group"));
        let mut alias_null = base;
        alias_null["alias_name"] = Value::Null;
        assert_eq!(decode_params::<IscsiCreateTargetNode>(alias_null).map(|p| p.alias_name), Ok(None));
        assert_eq!(decode_params::<IscsiSetOptions>(json!({"max_sessions": null})), Ok(IscsiSetOptions::default()));
        assert!(decode_params::<NoParams>(json!({"x": 1})).is_err());
        assert_eq!(decode_params::<NoParams>(Value::Null), Ok(NoParams {}));
    }

    /// The CHAP methods: SPDK's shapes, defaults left out, absent optional fields but no nulls.
    #[test]
    fn auth_params_round_trip_with_spdk_defaults() {
        let group = IscsiCreateAuthGroup {
            tag: 1,
            secrets: vec![
                AuthSecretParam { user: "u".into(), secret: sec("s"), ..Default::default() },
                AuthSecretParam {
                    user: "u2".into(),
                    secret: sec("s2"),
                    muser: Some("mu".into()),
                    msecret: Some(sec("ms")),
                    initiator_group: Some(3),
                },
            ],
        };
        let v = encode(&group);
        assert_eq!(
            v,
            json!({"tag": 1, "secrets": [
                {"user": "u", "secret": "s"},
                {"user": "u2", "secret": "s2", "muser": "mu", "msecret": "ms", "initiator_group": 3}
            ]})
        );
        assert_eq!(decode_params::<IscsiCreateAuthGroup>(v), Ok(group));
        assert_eq!(encode(&IscsiCreateAuthGroup { tag: 3, secrets: vec![] }), json!({"tag": 3}));
        assert_eq!(decode_params::<IscsiCreateAuthGroup>(json!({"tag": 3})).map(|p| p.secrets.len()), Ok(0));
        for (bad, field) in [
            (json!({"tag": 1, "secrets": null}), "secrets"),
            (json!({"tag": 1, "secrets": [{"user": "u"}]}), "secret"),
            (json!({"tag": 1, "secrets": [{"user": "u", "secret": "s", "muser": null}]}), "muser"),
            (json!({"tag": 1, "secrets": [{"user": "u", "secret": "s", "initiator_group": null}]}), "initiator_group"),
            (json!({"tag": 1, "secrets": [{"user": "u", "secret": "s", "initiator_group": -1}]}), "initiator_group"),
            (json!({"tag": 1, "secrets": [{"user": "u", "secret": "s", "x": 1}]}), "x"),
            (json!({"tag": -1}), "tag"),
        ] {
            let e = decode_params::<IscsiCreateAuthGroup>(bad.clone()).expect_err("refused");
            assert!(e.message.contains(field), "{bad}: {e}");
        }

        let add = IscsiAuthGroupAddSecret {
            tag: 2,
            user: "u".into(),
            secret: sec("s"),
            muser: Some("m".into()),
            msecret: None,
            initiator_group: Some(4),
        };
        assert_eq!(encode(&add), json!({"tag": 2, "user": "u", "secret": "s", "muser": "m", "initiator_group": 4}));
        assert_eq!(decode_params::<IscsiAuthGroupAddSecret>(encode(&add)), Ok(add.clone()));
        let p = add.secret_param();
        assert_eq!((p.muser.as_deref(), p.initiator_group), (Some("m"), Some(4)));
        assert!(decode_params::<IscsiAuthGroupAddSecret>(json!({"tag": 2, "user": "u"})).is_err());
        let rm = IscsiAuthGroupRemoveSecret { tag: 2, user: "u".into() };
        assert_eq!(decode_params::<IscsiAuthGroupRemoveSecret>(encode(&rm)), Ok(rm));

        // Both set_auth methods replace the whole policy: absent is false / 0.
        assert_eq!(decode_params::<IscsiSetDiscoveryAuth>(Value::Null), Ok(IscsiSetDiscoveryAuth::default()));
        let d = IscsiSetDiscoveryAuth { require_chap: true, mutual_chap: true, chap_group: 4, ..Default::default() };
        assert_eq!(encode(&d), json!({"require_chap": true, "mutual_chap": true, "chap_group": 4}));
        assert_eq!(decode_params::<IscsiSetDiscoveryAuth>(encode(&d)), Ok(d));
        assert!(decode_params::<IscsiSetDiscoveryAuth>(json!({"chap_group": null})).is_err());
        let n = IscsiTargetNodeSetAuth { name: "d".into(), disable_chap: true, ..Default::default() };
        assert_eq!(encode(&n), json!({"name": "d", "disable_chap": true}));
        assert_eq!(decode_params::<IscsiTargetNodeSetAuth>(encode(&n)), Ok(n));
        assert!(decode_params::<IscsiTargetNodeSetAuth>(json!({"chap_group": 1})).unwrap_err().message.contains("name"));
    }

    #[test]
    fn debug_never_shows_secrets() {
        let group = IscsiCreateAuthGroup {
            tag: 1,
            secrets: vec![AuthSecretParam {
                user: "alice".into(),
                secret: sec("TOPSECRET1"),
                muser: Some("tgt".into()),
                msecret: Some(sec("TOPSECRET2")),
                initiator_group: Some(2),
            }],
        };
        let add = IscsiAuthGroupAddSecret { tag: 1, user: "bob".into(), secret: sec("TOPSECRET3"), ..Default::default() };
        for text in [format!("{group:?}"), format!("{group:#?}"), format!("{add:?}")] {
            assert!(!text.contains("TOPSECRET"), "{text}");
            assert!(text.contains("<redacted>"), "{text}");
        }
        assert!(format!("{group:?}").contains("alice") && format!("{group:?}").contains("tgt"));
        assert!(format!("{add:?}").contains("bob"));
        assert!(format!("{group:?}").contains("initiator_group: 2"));
    }

    fn sec(s: &str) -> Secret {
        Zeroizing::new(s.to_string())
    }
}
