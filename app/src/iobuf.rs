//! The I/O buffer budget (riser-buf's global pool): `iobuf_set_options`,
//! `iobuf_get_options`, `iobuf_get_stats`, and the "iobuf" subsystem's config.
//!
//! riser's buffers are sized per I/O from one pool, so its main setting is the pool's
//! budget, `max_bytes`. SPDK's four fields (`small_pool_count`, `large_pool_count`,
//! `small_bufsize`, `large_bufsize`) are accepted too, for SPDK scripts: they set the budget
//! to what those pools would hold. riser's extensions share the budget fairly between
//! connections (riser-buf's crate docs, "Fair shares"): `max_buffer_share_percent`, the
//! most of it one connection holds while it holds any, and `buffer_reserve_percent`, the
//! part kept for connections holding little. The parameters are
//! [`riser_rpc::params::IobufSetOptions`] (the `riser-rpc` CLI's arguments too).

use riser_buf::{Pool, DEFAULT_RESERVE_PERCENT, DEFAULT_SHARE_PERCENT, MIN_MAX_BYTES};
use riser_rpc::params::{IobufSetOptions as SetOptions, NoParams};
use riser_rpc::{RpcError, RpcRegistry};
use serde_json::{json, Value};

/// SPDK v24.01's defaults, for SPDK fields given without their partners.
const SPDK_SMALL: (u64, u64) = (8192, 8 * 1024);
const SPDK_LARGE: (u64, u64) = (1024, 132 * 1024);

/// The budget the call sets, if it sets one.
fn budget_of(p: &SetOptions) -> Result<Option<u64>, RpcError> {
    let spdk = [p.small_pool_count, p.large_pool_count, p.small_bufsize, p.large_bufsize];
    match (p.max_bytes, spdk.iter().any(Option::is_some)) {
        (Some(_), true) => Err(RpcError::invalid_params(
            "give either max_bytes or SPDK's pool counts and sizes, not both",
        )),
        (Some(m), false) => Ok(Some(m)),
        (None, true) => {
            let small = p.small_pool_count.unwrap_or(SPDK_SMALL.0).saturating_mul(p.small_bufsize.unwrap_or(SPDK_SMALL.1));
            let large = p.large_pool_count.unwrap_or(SPDK_LARGE.0).saturating_mul(p.large_bufsize.unwrap_or(SPDK_LARGE.1));
            Ok(Some(small.saturating_add(large)))
        }
        (None, false) if p.max_buffer_share_percent.is_some() || p.buffer_reserve_percent.is_some() => Ok(None),
        (None, false) => Err(RpcError::invalid_params("max_bytes is required")),
    }
}

/// The "iobuf" subsystem's config: what is not the default.
pub fn config_json() -> Vec<Value> {
    let pool = Pool::global();
    let mut params = serde_json::Map::new();
    let max = pool.max_bytes();
    if max != riser_buf::DEFAULT_MAX_BYTES {
        params.insert("max_bytes".into(), json!(max));
    }
    let (share, reserve) = pool.shares();
    if (share, reserve) != (DEFAULT_SHARE_PERCENT, DEFAULT_RESERVE_PERCENT) {
        params.insert("max_buffer_share_percent".into(), json!(share));
        params.insert("buffer_reserve_percent".into(), json!(reserve));
    }
    if params.is_empty() {
        return Vec::new();
    }
    vec![json!({"method": "iobuf_set_options", "params": params})]
}

pub fn register(reg: &mut RpcRegistry) {
    reg.add("iobuf_set_options", |p: SetOptions| {
        let pool = Pool::global();
        let bytes = budget_of(&p)?;
        let bytes = match bytes {
            Some(b) => Some(usize::try_from(b).map_err(|_| RpcError::invalid_params(format!("max_bytes {b} is too large")))?),
            None => None,
        };
        if let Some(bytes) = bytes.filter(|&b| b < MIN_MAX_BYTES) {
            return Err(RpcError::invalid_params(format!(
                "max_bytes {bytes} is below {MIN_MAX_BYTES} (32 MiB): the largest transfer must fit"
            )));
        }
        // The shares first: they are checked, and nothing changes when they are refused.
        let (share, reserve) = pool.shares();
        let shares = (p.max_buffer_share_percent.unwrap_or(share), p.buffer_reserve_percent.unwrap_or(reserve));
        if shares != (share, reserve) {
            pool.set_shares(shares.0, shares.1).map_err(RpcError::invalid_params)?;
        }
        if let Some(bytes) = bytes {
            pool.set_max_bytes(bytes).map_err(RpcError::invalid_params)?;
        }
        Ok(Value::Bool(true))
    });
    reg.add("iobuf_get_options", |_: NoParams| {
        let pool = Pool::global();
        let (share, reserve) = pool.shares();
        Ok(json!({"max_bytes": pool.max_bytes(), "max_buffer_share_percent": share, "buffer_reserve_percent": reserve}))
    });
    reg.add("iobuf_get_stats", |_: NoParams| {
        let s = Pool::global().stats();
        Ok(json!({
            "max_bytes": s.max_bytes,
            "mapped_bytes": s.mapped_bytes,
            "in_use_bytes": s.in_use_bytes,
            "peak_in_use_bytes": s.peak_in_use_bytes,
            "cached_bytes": s.cached_bytes,
            "waiting": s.waiting,
            "waits": s.waits,
            "reserve_bytes": s.reserve_bytes,
            "reserve_in_use_bytes": s.reserve_in_use_bytes,
            "reserve_grants": s.reserve_grants,
            "maps": s.maps,
            "reuses": s.reuses,
            "unmaps": s.unmaps,
        }))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(v: Value) -> SetOptions {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn budget_from_max_bytes_or_spdk_fields() {
        assert_eq!(budget_of(&opts(json!({"max_bytes": 1 << 30}))).unwrap(), Some(1 << 30));
        assert_eq!(
            budget_of(&opts(json!({"small_pool_count": 1000, "small_bufsize": 8192, "large_pool_count": 100, "large_bufsize": 135168}))).unwrap(),
            Some(1000 * 8192 + 100 * 135168)
        );
        assert_eq!(budget_of(&opts(json!({"large_pool_count": 10}))).unwrap(), Some(8192 * 8192 + 10 * 132 * 1024));
        assert!(budget_of(&opts(json!({"max_bytes": 1, "small_pool_count": 2}))).is_err());
        assert!(budget_of(&opts(json!({}))).is_err());
        // The shares alone leave the budget as it is.
        assert_eq!(budget_of(&opts(json!({"max_buffer_share_percent": 10}))).unwrap(), None);
        assert_eq!(budget_of(&opts(json!({"buffer_reserve_percent": 0, "max_bytes": 1 << 30}))).unwrap(), Some(1 << 30));
        assert!(serde_json::from_value::<SetOptions>(json!({"bogus": 1})).is_err());
    }
}
