//! The I/O buffer budget (riser-buf's global pool): `iobuf_set_options`,
//! `iobuf_get_options`, `iobuf_get_stats`, and the "iobuf" subsystem's config.
//!
//! riser's buffers are sized per I/O from one pool, so its one setting is the pool's
//! budget, `max_bytes`. SPDK's four fields (`small_pool_count`, `large_pool_count`,
//! `small_bufsize`, `large_bufsize`) are accepted too, for SPDK scripts: they set the budget
//! to what those pools would hold.

use riser_buf::{Pool, MIN_MAX_BYTES};
use riser_rpc::{RpcError, RpcRegistry};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetOptions {
    /// The budget in bytes: memory mapped for I/O buffers, in use and kept for reuse.
    max_bytes: Option<u64>,
    small_pool_count: Option<u64>,
    large_pool_count: Option<u64>,
    small_bufsize: Option<u64>,
    large_bufsize: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

/// SPDK v24.01's defaults, for SPDK fields given without their partners.
const SPDK_SMALL: (u64, u64) = (8192, 8 * 1024);
const SPDK_LARGE: (u64, u64) = (1024, 132 * 1024);

fn budget_of(p: &SetOptions) -> Result<u64, RpcError> {
    let spdk = [p.small_pool_count, p.large_pool_count, p.small_bufsize, p.large_bufsize];
    match (p.max_bytes, spdk.iter().any(Option::is_some)) {
        (Some(_), true) => Err(RpcError::invalid_params(
            "give either max_bytes or SPDK's pool counts and sizes, not both",
        )),
        (Some(m), false) => Ok(m),
        (None, true) => {
            let small = p.small_pool_count.unwrap_or(SPDK_SMALL.0).saturating_mul(p.small_bufsize.unwrap_or(SPDK_SMALL.1));
            let large = p.large_pool_count.unwrap_or(SPDK_LARGE.0).saturating_mul(p.large_bufsize.unwrap_or(SPDK_LARGE.1));
            Ok(small.saturating_add(large))
        }
        (None, false) => Err(RpcError::invalid_params("max_bytes is required")),
    }
}

/// The "iobuf" subsystem's config: the budget, if it is not the default.
pub fn config_json() -> Vec<Value> {
    let max = Pool::global().max_bytes();
    if max == riser_buf::DEFAULT_MAX_BYTES {
        return Vec::new();
    }
    vec![json!({"method": "iobuf_set_options", "params": {"max_bytes": max}})]
}

pub fn register(reg: &mut RpcRegistry) {
    reg.add("iobuf_set_options", |p: SetOptions| {
        let bytes = budget_of(&p)?;
        let bytes = usize::try_from(bytes).map_err(|_| RpcError::invalid_params(format!("max_bytes {bytes} is too large")))?;
        if bytes < MIN_MAX_BYTES {
            return Err(RpcError::invalid_params(format!(
                "max_bytes {bytes} is below {MIN_MAX_BYTES} (32 MiB): the largest transfer must fit"
            )));
        }
        Pool::global().set_max_bytes(bytes).map_err(RpcError::invalid_params)?;
        Ok(Value::Bool(true))
    });
    reg.add("iobuf_get_options", |_: NoParams| Ok(json!({"max_bytes": Pool::global().max_bytes()})));
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
        assert_eq!(budget_of(&opts(json!({"max_bytes": 1 << 30}))).unwrap(), 1 << 30);
        assert_eq!(
            budget_of(&opts(json!({"small_pool_count": 1000, "small_bufsize": 8192, "large_pool_count": 100, "large_bufsize": 135168}))).unwrap(),
            1000 * 8192 + 100 * 135168
        );
        assert_eq!(budget_of(&opts(json!({"large_pool_count": 10}))).unwrap(), 8192 * 8192 + 10 * 132 * 1024);
        assert!(budget_of(&opts(json!({"max_bytes": 1, "small_pool_count": 2}))).is_err());
        assert!(budget_of(&opts(json!({}))).is_err());
        assert!(serde_json::from_value::<SetOptions>(json!({"bogus": 1})).is_err());
    }
}
