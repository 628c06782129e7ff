//! What the parameters of riser's JSON-RPC methods share: the serde helpers every parameter
//! type uses, the shapes several methods take ([`NoParams`], [`ByName`], [`ByTag`]), and the
//! parameters of the methods the `riser` binary serves itself (rpc, framework, log, iobuf).
//!
//! Each method's parameter type is defined once, next to its handler in the module that owns
//! the concept, and registered there: the iSCSI methods' in riser-config (`options.rs`,
//! `portal_group.rs`, `initiator_group.rs`, `auth_group.rs`, `target_node.rs`,
//! `target_node/alua.rs`), the bdev methods' in riser-bdev (`rpc.rs`, `modules/*/rpc.rs`,
//! `modules/rbd/`). The server decodes them (through [`crate::server::decode_params`], which
//! refuses unknown fields and names the offending one); `riser-rpc` (rpc/cli) builds its
//! requests from the same types, most of them carrying its subcommand's arguments too (clap,
//! behind each crate's `cli` feature). The methods of the `riser` binary (app/) have theirs
//! here: no library holds their handlers, and the CLI cannot depend on a binary.
//!
//! Names, types, defaults and which fields may be absent are SPDK's (rpc.py sends the same
//! shapes), plus riser's extensions, each marked. Decoding is what the server accepts;
//! encoding leaves out what the server would default anyway (a `false` flag, an absent
//! option, a zero default), as rpc.py leaves it out, so a request built from these types
//! stays SPDK's shape.
//!
//! A field that may be absent but not `null` is an `Option` decoded with [`not_null`]: absent
//! is `None`, `null` is refused as for a plain field. A plain `Option` field also takes `null`.

use serde::{Deserialize, Deserializer, Serialize};
pub use zeroize::Zeroizing;

/// A CHAP secret as the auth group methods carry it: overwritten when dropped (the decoded
/// request's copy; the request text and JSON values it was parsed from are the server's,
/// see [`crate::server`]).
pub type Secret = Zeroizing<String>;

/// `skip_serializing_if` of a flag whose absence means `false`.
pub fn is_false(b: &bool) -> bool {
    !*b
}

/// `skip_serializing_if` of a number whose absence means 0.
pub fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// `skip_serializing_if` of a number whose absence means 0.
pub fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Decodes a field that may be absent (`#[serde(default)]` gives `None`) but not `null`.
pub fn not_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

// ---- shared -------------------------------------------------------------------------------

/// No parameters (the getters): absent params or `{}`; any field is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// `{name}`: `bdev_malloc_delete`, `bdev_null_delete`,
/// `bdev_uring_delete`, `bdev_uring_rescan`, `bdev_aio_delete`, `bdev_aio_rescan`,
/// `bdev_get_histogram`, `bdev_rbd_*` ...
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

// ---- the riser binary's methods (app/) ----------------------------------------------------

/// `rpc_get_methods` (app/src/framework.rs): both flags are accepted and change nothing
/// (every method is allowed in every state, and riser has no deprecated aliases).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct RpcGetMethods {
    /// Only the methods allowed in the current state
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub current: bool,
    /// Include deprecated alias names
    #[cfg_attr(feature = "cli", arg(short = 'i', long))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub include_aliases: bool,
}

/// `framework_get_config` (app/src/framework.rs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct FrameworkGetConfig {
    /// Subsystem name (see framework_get_subsystems)
    pub name: String,
}

/// `log_set_level` and `log_set_print_level` (app/src/logging.rs, which checks the name).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct LogSetLevel {
    /// ERROR, WARNING (or WARN), NOTICE, INFO or DEBUG (any case)
    pub level: String,
}

/// `iobuf_set_options` (app/src/iobuf.rs): the budget of riser-buf's pool, `max_bytes`, or
/// SPDK's four pool fields that set it to what those pools would hold; riser's fair-share
/// settings (riser-buf's crate docs, "Fair shares").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct IobufSetOptions {
    /// The budget in bytes (at least 33554432, the largest transfer)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// SPDK's fields, for rpc.py habits: the budget becomes what these pools would hold
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_pool_count: Option<u64>,
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub large_pool_count: Option<u64>,
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_bufsize: Option<u64>,
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub large_bufsize: Option<u64>,
    /// The most of the budget one connection holds while it holds any (percent)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_buffer_share_percent: Option<u32>,
    /// The part of the budget kept for connections holding little (percent)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_reserve_percent: Option<u32>,
}

/// Methods SPDK writes into its configs that riser has nothing to do for: `riser --json`
/// skips them with a note (so an SPDK config still loads) and `riser-rpc apply` ignores them.
pub const IGNORED_SPDK_METHODS: &[&str] = &[
    "bdev_set_options",
    "bdev_wait_for_examine",
    "bdev_nvme_set_options",
    "bdev_nvme_set_hotplug",
    "bdev_iscsi_set_options",
    "sock_impl_set_options",
    "sock_set_default_impl",
    "accel_set_options",
    "vmd_enable",
];

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::server::decode_params;

    #[test]
    fn no_params_refuses_fields() {
        assert!(decode_params::<NoParams>(json!({"x": 1})).is_err());
        assert_eq!(decode_params::<NoParams>(Value::Null), Ok(NoParams {}));
    }

    #[test]
    fn app_params_leave_defaults_out() {
        assert_eq!(serde_json::to_value(RpcGetMethods::default()).ok(), Some(json!({})));
        assert_eq!(serde_json::to_value(IobufSetOptions::default()).ok(), Some(json!({})));
        let io = IobufSetOptions { max_bytes: Some(1 << 30), buffer_reserve_percent: Some(0), ..Default::default() };
        let v = serde_json::to_value(&io).unwrap();
        assert_eq!(v, json!({"max_bytes": 1 << 30, "buffer_reserve_percent": 0}));
        assert_eq!(decode_params::<IobufSetOptions>(v), Ok(io));
        assert!(decode_params::<IobufSetOptions>(json!({"bogus": 1})).is_err());
        assert!(decode_params::<LogSetLevel>(json!({})).unwrap_err().message.contains("level"));
    }
}
