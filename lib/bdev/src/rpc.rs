//! Block device methods (SPDK names and parameters): create, delete and list null,
//! malloc, uring and aio bdevs in a [`BdevRegistry`]; rescan uring and aio bdevs; attach,
//! detach and list NVMe controllers; I/O statistics and latency histograms. Each device's
//! own methods are registered from its folder (`modules/*/rpc.rs`, RBD in `modules/rbd`);
//! [`register`] calls them.

use std::sync::{Arc, Mutex, MutexGuard};

use riser_rpc::params::{is_false, is_zero_u64, ByName};
use riser_rpc::{RpcError, RpcRegistry};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::qos::QosLimits;
use crate::stats::{now_ticks, ResetMode, TICK_RATE};
use crate::{info_json, BdevRegistry, BdevStats, RegistryError};

// Each device's parameter types, defined beside its handlers, for the `riser-rpc` CLI.
pub use crate::file::rpc::{BdevAioCreate, BdevUringCreate};
pub use crate::malloc::rpc::{BdevMallocCreate, BdevMallocResize};
pub use crate::null::rpc::{BdevNullCreate, BdevNullResize};
pub use crate::nvme::rpc::{BdevNvmeAttachController, BdevNvmeDetachController, BdevNvmeGetControllers};
pub use crate::rbd::{BdevRbdCreate, BdevRbdGetClustersInfo, BdevRbdRegisterCluster, BdevRbdResize};

// ---- RPC parameters (the server decodes them, riser-rpc encodes them) -------------------

/// `bdev_get_bdevs`: all bdevs, or the one of that name or UUID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevGetBdevs {
    /// Only this bdev
    #[cfg_attr(feature = "cli", arg(short = 'b', long))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// SPDK's wait-for-bdev timeout; riser's bdevs exist as soon as they are created.
    #[cfg_attr(feature = "cli", arg(skip))]
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub timeout: u64,
}

/// `bdev_get_iostat`: all bdevs, or one (per reactor with `per_channel`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevGetIostat {
    /// Only this bdev
    #[cfg_attr(feature = "cli", arg(short = 'b', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Per reactor (needs -b)
    #[cfg_attr(feature = "cli", arg(short = 'c', long = "per-channel", requires = "name"))]
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_channel: bool,
}

/// `bdev_reset_iostat`: all bdevs, or one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevResetIostat {
    /// Only this bdev
    #[cfg_attr(feature = "cli", arg(short = 'b', long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What to reset: all (default) or maxmin (the min/max latencies only)
    #[cfg_attr(feature = "cli", arg(short = 'm', long, value_parser = ["all", "maxmin"]))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// `bdev_enable_histogram`: turn a bdev's latency histogram on or off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevEnableHistogram {
    pub name: String,
    pub enable: bool,
}

/// `bdev_set_qos_limit` (SPDK): a device's rate limits; a limit left out stays as it is,
/// 0 removes it. I/O over a limit waits (queued, never failed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct BdevSetQosLimit {
    /// The bdev
    #[cfg_attr(feature = "cli", arg(short = 'b', long))]
    pub name: String,
    /// I/Os per second, reads and writes together (a multiple of 1000; 0: no limit)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rw_ios_per_sec: Option<u64>,
    /// MiB per second, reads and writes together (0: no limit)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rw_mbytes_per_sec: Option<u64>,
    /// MiB per second read (0: no limit)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r_mbytes_per_sec: Option<u64>,
    /// MiB per second written (0: no limit)
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_mbytes_per_sec: Option<u64>,
}

impl BdevSetQosLimit {
    /// `current` with the limits given here applied; an error if none is given or one
    /// breaks SPDK's rules.
    pub fn apply_to(&self, current: QosLimits) -> Result<QosLimits, RpcError> {
        let given = [self.rw_ios_per_sec, self.rw_mbytes_per_sec, self.r_mbytes_per_sec, self.w_mbytes_per_sec];
        if given.iter().all(Option::is_none) {
            return Err(RpcError::invalid_params(
                "no rate limit given: rw_ios_per_sec, rw_mbytes_per_sec, r_mbytes_per_sec or w_mbytes_per_sec",
            ));
        }
        let l = QosLimits {
            rw_ios_per_sec: self.rw_ios_per_sec.unwrap_or(current.rw_ios_per_sec),
            rw_mbytes_per_sec: self.rw_mbytes_per_sec.unwrap_or(current.rw_mbytes_per_sec),
            r_mbytes_per_sec: self.r_mbytes_per_sec.unwrap_or(current.r_mbytes_per_sec),
            w_mbytes_per_sec: self.w_mbytes_per_sec.unwrap_or(current.w_mbytes_per_sec),
        };
        l.validate().map_err(RpcError::invalid_params)?;
        Ok(l)
    }
}

/// The `bdev_set_qos_limit` calls that restore the devices' limits (`save_config`), after
/// the calls that create them.
pub fn qos_config_calls(bdevs: &BdevRegistry) -> Vec<Value> {
    bdevs
        .iter_stats()
        .filter_map(|(b, s)| {
            let l = s.qos.limits();
            (!l.is_none()).then(|| {
                let mut p = l.json();
                p["name"] = json!(b.info().name);
                json!({"method": "bdev_set_qos_limit", "params": p})
            })
        })
        .collect()
}

/// One device's `bdev_get_iostat` entry (SPDK's shape, plus the queue depth now).
fn iostat_json(name: &str, stats: &BdevStats) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("name".into(), json!(name));
    stats.snapshot().write_json(&mut o);
    o.insert("queue_depth".into(), json!(stats.queue_depth()));
    let (ns, ios) = stats.qos.throttled();
    o.insert("qos_throttled_ticks".into(), json!(ns));
    o.insert("qos_throttled_ios".into(), json!(ios));
    Value::Object(o)
}

/// `bdev_get_histogram`'s result (riser's shape: percentiles, not SPDK's private encoding).
fn histogram_json(name: &str, stats: &BdevStats) -> Value {
    let p = stats.percentiles();
    json!({
        "name": name,
        "enabled": stats.histogram_enabled(),
        "count": p.count,
        "latency_us": {
            "min": p.min, "p50": p.p50, "p90": p.p90, "p99": p.p99,
            "p99_9": p.p99_9, "p99_99": p.p99_99, "max": p.max
        }
    })
}

fn stats_of(bdevs: &BdevRegistry, name: &str) -> Result<Arc<BdevStats>, RpcError> {
    bdevs.stats(name).ok_or_else(|| RpcError::not_found(format!("bdev {name} not found")))
}

/// Registers `bdev_get_iostat`, `bdev_reset_iostat`, `bdev_enable_histogram` and
/// `bdev_get_histogram`.
fn register_stats(reg: &mut RpcRegistry, app: &Arc<Bdevs>) {
    let a = app.clone();
    reg.add("bdev_get_iostat", move |p: BdevGetIostat| {
        let bdevs = a.bdevs();
        let head = |o: &mut serde_json::Map<String, Value>| {
            o.insert("tick_rate".into(), json!(TICK_RATE));
            o.insert("ticks".into(), json!(now_ticks()));
        };
        let mut o = serde_json::Map::new();
        match (&p.name, p.per_channel) {
            (None, true) => {
                return Err(RpcError::invalid_params("per_channel needs a bdev name (name)"));
            }
            (Some(n), true) => {
                let stats = stats_of(&bdevs, n)?;
                head(&mut o);
                o.insert("name".into(), json!(n));
                let channels: Vec<Value> = stats
                    .per_thread()
                    .into_iter()
                    .map(|(thread, s)| {
                        let mut c = serde_json::Map::new();
                        c.insert("thread_id".into(), json!(thread));
                        s.write_json(&mut c);
                        Value::Object(c)
                    })
                    .collect();
                o.insert("channels".into(), json!(channels));
            }
            (Some(n), false) => {
                let stats = stats_of(&bdevs, n)?;
                head(&mut o);
                o.insert("bdevs".into(), json!([iostat_json(n, &stats)]));
            }
            (None, false) => {
                head(&mut o);
                let list: Vec<Value> = bdevs.iter_stats().map(|(b, s)| iostat_json(&b.info().name, s)).collect();
                o.insert("bdevs".into(), json!(list));
            }
        }
        Ok(Value::Object(o))
    });
    let a = app.clone();
    reg.add("bdev_reset_iostat", move |p: BdevResetIostat| {
        let mode = match p.mode.as_deref() {
            None | Some("all") => ResetMode::All,
            Some("maxmin") => ResetMode::MaxMin,
            Some(m) => return Err(RpcError::invalid_params(format!("mode {m:?}: use \"all\" or \"maxmin\""))),
        };
        let bdevs = a.bdevs();
        match &p.name {
            Some(n) => stats_of(&bdevs, n)?.reset(mode),
            None => bdevs.iter_stats().for_each(|(_, s)| s.reset(mode)),
        }
        Ok(Value::Bool(true))
    });
    let a = app.clone();
    reg.add("bdev_enable_histogram", move |p: BdevEnableHistogram| {
        stats_of(&a.bdevs(), &p.name)?.enable_histogram(p.enable);
        Ok(Value::Bool(true))
    });
    let a = app.clone();
    reg.add("bdev_get_histogram", move |p: ByName| {
        let stats = stats_of(&a.bdevs(), &p.name)?;
        Ok(histogram_json(&p.name, &stats))
    });
}

/// The registry behind its lock; a poisoned lock (a panicked RPC thread) is still usable data.
pub(crate) struct Bdevs(Arc<Mutex<BdevRegistry>>);

impl Bdevs {
    pub(crate) fn bdevs(&self) -> MutexGuard<'_, BdevRegistry> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) fn to_rpc(e: RegistryError) -> RpcError {
    match e {
        RegistryError::Exists(_) => RpcError::exists(e.to_string()),
        RegistryError::NotFound(_) => RpcError::not_found(e.to_string()),
        RegistryError::Claimed { .. } => RpcError::busy(e.to_string()),
        RegistryError::BadName(_)
        | RegistryError::BadBlockSize(_)
        | RegistryError::ZeroBlocks
        | RegistryError::BadPhysicalBlockSize { .. } => {
            RpcError::invalid_params(e.to_string())
        }
        RegistryError::Device(_) => RpcError::new(-12, e.to_string()),
        RegistryError::File { errno, .. } => RpcError::new(errno as i64, e.to_string()),
        RegistryError::NotResizable(_) => RpcError::new(-(libc::EOPNOTSUPP as i64), e.to_string()),
        RegistryError::ShrinkClaimed { .. } => RpcError::busy(e.to_string()),
        // SPDK's bdev_null_resize answers -EINVAL.
        RegistryError::NoShrink { .. } => RpcError::new(-(libc::EINVAL as i64), e.to_string()),
        RegistryError::NoMemory(_) => RpcError::new(-(libc::ENOMEM as i64), e.to_string()),
    }
}

pub(crate) fn no_metadata(md_size: u32) -> Result<(), RpcError> {
    if md_size != 0 {
        return Err(RpcError::invalid_params("md_size: separate metadata is not supported (use 0)"));
    }
    Ok(())
}

/// Registers the bdev methods on `reg`, acting on `bdevs`.
pub fn register(reg: &mut RpcRegistry, bdevs: &Arc<Mutex<BdevRegistry>>) {
    let app = Arc::new(Bdevs(bdevs.clone()));
    crate::stats::start_clocks(); // "ticks" count from here, about when riser started
    register_stats(reg, &app);
    crate::rbd::register(reg, bdevs, to_rpc);
    crate::malloc::rpc::register(reg, &app);
    crate::null::rpc::register(reg, &app);
    crate::file::rpc::register(reg, &app);
    crate::nvme::rpc::register(reg, &app);
    let a = app.clone();
    reg.add("bdev_set_qos_limit", move |p: BdevSetQosLimit| {
        let stats = stats_of(&a.bdevs(), &p.name)?;
        let limits = p.apply_to(stats.qos.limits())?;
        if !crate::stats::counting_on() && !limits.is_none() {
            // The counting channels apply the limits: without them nothing would.
            return Err(RpcError::new(-(libc::EOPNOTSUPP as i64), "device rate limits need the I/O counters (RISER_IOSTAT=off)"));
        }
        stats.qos.set(limits);
        log::info!("bdev {}: QoS limits {limits:?}", p.name);
        Ok(Value::Bool(true))
    });
    let a = app.clone();
    reg.add("bdev_get_bdevs", move |p: BdevGetBdevs| {
        let bdevs = a.bdevs();
        let list: Vec<Value> = bdevs
            .iter()
            .filter(|(b, _)| match &p.name {
                None => true,
                Some(n) => &b.info().name == n || b.info().uuid.to_string() == *n,
            })
            .map(|(b, claimed)| {
                let mut j = info_json(b.as_ref(), claimed);
                if let Some(s) = bdevs.stats(&b.info().name) {
                    j["assigned_rate_limits"] = s.qos.limits().json();
                }
                j
            })
            .collect();
        if let (Some(n), true) = (&p.name, list.is_empty()) {
            return Err(RpcError::not_found(format!("bdev {n} not found")));
        }
        Ok(json!(list))
    });
}

#[cfg(test)]
mod tests {
    use riser_rpc::server::decode_params;
    use serde_json::json;

    use super::*;

    /// What is encoded leaves the server's defaults out and decodes back to the same value.
    #[test]
    fn encoding_leaves_defaults_out_and_round_trips() {
        let malloc = BdevMallocCreate { num_blocks: 8, block_size: 512, ..Default::default() };
        let encoded = serde_json::to_value(&malloc).unwrap();
        assert_eq!(encoded, json!({"num_blocks": 8, "block_size": 512}));
        assert_eq!(serde_json::to_value(BdevGetBdevs::default()).unwrap(), json!({}));
        assert_eq!(decode_params::<BdevMallocCreate>(encoded), Ok(malloc));
        let h = BdevEnableHistogram { name: "M0".into(), enable: false };
        assert_eq!(serde_json::to_value(&h).unwrap(), json!({"name": "M0", "enable": false}));
        assert_eq!(serde_json::to_value(BdevGetIostat::default()).unwrap(), json!({}));
        assert!(decode_params::<BdevResetIostat>(json!({"mode": "all", "x": 1})).is_err());
    }

    #[test]
    fn qos_limits_left_out_stay_and_spdks_rules_hold() {
        let p: BdevSetQosLimit = decode_params(json!({"name": "Null0", "rw_ios_per_sec": 2000})).unwrap();
        let cur = QosLimits { rw_mbytes_per_sec: 5, ..Default::default() };
        assert_eq!(p.apply_to(cur).unwrap(), QosLimits { rw_ios_per_sec: 2000, rw_mbytes_per_sec: 5, ..Default::default() });
        let zero: BdevSetQosLimit = decode_params(json!({"name": "Null0", "rw_mbytes_per_sec": 0})).unwrap();
        assert_eq!(zero.apply_to(cur).unwrap(), QosLimits::default(), "0 removes a limit");
        let none: BdevSetQosLimit = decode_params(json!({"name": "Null0"})).unwrap();
        assert!(none.apply_to(cur).is_err(), "at least one limit");
        let odd: BdevSetQosLimit = decode_params(json!({"name": "Null0", "rw_ios_per_sec": 1500})).unwrap();
        assert!(odd.apply_to(cur).is_err(), "a multiple of 1000");
    }
}
