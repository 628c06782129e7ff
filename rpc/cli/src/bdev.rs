//! bdev subcommands (rpc.py's `rpc/bdev.py`): malloc, null, uring, aio, NVMe, iostat and
//! histograms, Ceph RBD. The parameters are riser-bdev's types ([`riser_bdev::rpc`], each
//! defined beside its handler); those whose fields are the command line's arguments are
//! subcommands themselves (`Cmd` names them), the others have an args struct here that
//! builds them (sizes in MiB, rpc.py's `key=value` lists, -e/-d flags).

use std::collections::BTreeMap;

use clap::Args;
use riser_bdev::rpc as params;
use uuid::Uuid;

use crate::UsageError;

#[derive(Args, Debug)]
pub(crate) struct BdevMallocCreate {
    /// Bdev name (riser picks one when absent)
    #[arg(short = 'b', long)]
    pub(crate) name: Option<String>,
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    pub(crate) uuid: Option<Uuid>,
    /// Size in MiB
    pub(crate) total_size: f64,
    /// Block size in bytes (512 or 4096)
    pub(crate) block_size: u32,
}

impl BdevMallocCreate {
    pub(crate) fn params(self) -> Result<params::BdevMallocCreate, UsageError> {
        let num_blocks = num_blocks(self.total_size, self.block_size)?;
        Ok(params::BdevMallocCreate {
            name: self.name,
            num_blocks,
            block_size: self.block_size,
            uuid: self.uuid,
            ..Default::default()
        })
    }
}

#[derive(Args, Debug)]
pub(crate) struct BdevNullCreate {
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    pub(crate) uuid: Option<Uuid>,
    /// Bdev name
    pub(crate) name: String,
    /// Size in MiB
    pub(crate) total_size: f64,
    /// Block size in bytes (512 or 4096)
    pub(crate) block_size: u32,
}

impl BdevNullCreate {
    pub(crate) fn params(self) -> Result<params::BdevNullCreate, UsageError> {
        let num_blocks = num_blocks(self.total_size, self.block_size)?;
        Ok(params::BdevNullCreate {
            name: self.name,
            num_blocks,
            block_size: self.block_size,
            uuid: self.uuid,
            ..Default::default()
        })
    }
}

#[derive(Args, Debug)]
pub(crate) struct BdevUringCreate {
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    pub(crate) uuid: Option<Uuid>,
    /// Path to the file or block device (e.g. /dev/nvme0n1)
    pub(crate) filename: String,
    /// Bdev name
    pub(crate) name: String,
    /// Block size in bytes (512 or 4096; detected when absent)
    pub(crate) block_size: Option<u32>,
}

impl BdevUringCreate {
    pub(crate) fn params(self) -> params::BdevUringCreate {
        params::BdevUringCreate { name: self.name, filename: self.filename, block_size: self.block_size, uuid: self.uuid }
    }
}

#[derive(Args, Debug)]
pub(crate) struct BdevAioCreate {
    /// UUID of the bdev (random when absent)
    #[arg(short = 'u', long)]
    pub(crate) uuid: Option<Uuid>,
    /// Open the file or device read-only
    #[arg(short = 'r', long)]
    pub(crate) readonly: bool,
    /// Path to the file or block device
    pub(crate) filename: String,
    /// Bdev name
    pub(crate) name: String,
    /// Block size in bytes (512 or 4096; detected when absent)
    pub(crate) block_size: Option<u32>,
}

impl BdevAioCreate {
    pub(crate) fn params(self) -> params::BdevAioCreate {
        params::BdevAioCreate {
            name: self.name,
            filename: self.filename,
            block_size: self.block_size,
            readonly: self.readonly,
            uuid: self.uuid,
            ..Default::default()
        }
    }
}

/// The local-PCIe subset of `bdev_nvme_attach_controller` (SPDK's fabrics parameters are
/// refused by riser, so the command line does not offer them).
#[derive(Args, Debug)]
pub(crate) struct BdevNvmeAttachController {
    /// Name of the controller (its bdevs are NAMEn1, NAMEn2, ...)
    #[arg(short = 'b', long)]
    pub(crate) name: String,
    /// Transport type: PCIe
    #[arg(short = 't', long)]
    pub(crate) trtype: String,
    /// PCI address of the controller, e.g. 0000:00:04.0
    #[arg(short = 'a', long)]
    pub(crate) traddr: String,
}

impl BdevNvmeAttachController {
    pub(crate) fn params(self) -> params::BdevNvmeAttachController {
        params::BdevNvmeAttachController { name: self.name, trtype: self.trtype, traddr: self.traddr, ..Default::default() }
    }
}

#[derive(Args, Debug)]
pub(crate) struct BdevName {
    /// Bdev name
    pub(crate) name: String,
}

/// bdev_enable_histogram: rpc.py's -e / -d flags.
#[derive(Args, Debug)]
pub(crate) struct BdevEnableHistogram {
    /// Turn it on (the default)
    #[arg(short = 'e', long = "enable", conflicts_with = "disable")]
    pub(crate) _enable: bool,
    /// Turn it off
    #[arg(short = 'd', long)]
    pub(crate) disable: bool,
    /// Bdev name
    pub(crate) name: String,
}

impl BdevEnableHistogram {
    pub(crate) fn params(self) -> params::BdevEnableHistogram {
        params::BdevEnableHistogram { name: self.name, enable: !self.disable }
    }
}

/// The number of blocks of a size in MiB, refusing a size that is not a whole number of
/// blocks (as rpc.py does) rather than silently rounding it down.
pub(crate) fn num_blocks(total_size_mib: f64, block_size: u32) -> Result<u64, UsageError> {
    if block_size == 0 {
        return Err(UsageError("block size must be greater than 0".into()));
    }
    let bytes = total_size_mib * 1024.0 * 1024.0;
    // Below 2^53 an f64 holds every integer exactly, so the fract() test is exact.
    if !bytes.is_finite() || bytes <= 0.0 || bytes >= 9_007_199_254_740_992.0 || bytes.fract() != 0.0 {
        return Err(UsageError(format!("invalid total size {total_size_mib} MiB")));
    }
    let bytes = bytes as u64;
    let num_blocks = bytes / u64::from(block_size);
    if num_blocks * u64::from(block_size) != bytes {
        return Err(UsageError(format!(
            "total size {total_size_mib} MiB ({bytes} bytes) is not a multiple of the block size {block_size}"
        )));
    }
    Ok(num_blocks)
}

// ---- Ceph RBD (rpc.py's bdev_rbd_* arguments) ---------------------------------------------

/// `key=value` list arguments (rpc.py's --config-param / --config), as a map (a key given
/// twice: the last value).
pub(crate) fn key_values(items: &[String], what: &str) -> Result<Option<BTreeMap<String, String>>, UsageError> {
    if items.is_empty() {
        return Ok(None);
    }
    let mut m = BTreeMap::new();
    for kv in items {
        let Some((k, v)) = kv.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(UsageError(format!("{what} {kv:?}: use key=value")));
        };
        m.insert(k.to_string(), v.to_string());
    }
    Ok(Some(m))
}

#[derive(Args, Debug)]
pub(crate) struct BdevRbdRegisterCluster {
    /// Name of the cluster registration
    pub(crate) name: String,
    /// Ceph id (admin, not client.admin)
    #[arg(long = "user-id")]
    pub(crate) user_id: Option<String>,
    /// A Ceph option key=value (repeatable), e.g. mon_host=127.0.0.1:3300 key=...
    #[arg(long = "config-param")]
    pub(crate) config_param: Vec<String>,
    /// Path of a ceph.conf
    #[arg(long = "config-file")]
    pub(crate) config_file: Option<String>,
    /// Path of a keyring
    #[arg(long = "key-file")]
    pub(crate) key_file: Option<String>,
}

impl BdevRbdRegisterCluster {
    pub(crate) fn params(self) -> Result<params::BdevRbdRegisterCluster, UsageError> {
        Ok(params::BdevRbdRegisterCluster {
            name: self.name,
            user_id: self.user_id,
            config_param: key_values(&self.config_param, "--config-param")?,
            config_file: self.config_file,
            key_file: self.key_file,
            core_mask: None,
        })
    }
}

#[derive(Args, Debug)]
pub(crate) struct BdevRbdCreate {
    /// Pool of the image
    pub(crate) pool_name: String,
    /// Image name
    pub(crate) rbd_name: String,
    /// Block size in bytes (512 or 4096)
    pub(crate) block_size: u32,
    /// Bdev name (default Ceph<n>)
    #[arg(short = 'b', long)]
    pub(crate) name: Option<String>,
    /// Ceph id, for a connection of the bdev's own (without -c)
    #[arg(long = "user-id")]
    pub(crate) user_id: Option<String>,
    /// A Ceph option key=value (repeatable), for a connection of the bdev's own
    #[arg(long = "config")]
    pub(crate) config: Vec<String>,
    /// A cluster registered with bdev_rbd_register_cluster
    #[arg(short = 'c', long = "cluster-name")]
    pub(crate) cluster_name: Option<String>,
    /// UUID of the bdev
    #[arg(short = 'u', long)]
    pub(crate) uuid: Option<Uuid>,
    /// riser: seconds a gateway exporting the image may go without answering before the
    /// others fence it (default 10)
    #[arg(long = "lease-s")]
    pub(crate) lease_s: Option<u32>,
}

impl BdevRbdCreate {
    pub(crate) fn params(self) -> Result<params::BdevRbdCreate, UsageError> {
        Ok(params::BdevRbdCreate {
            name: self.name,
            user_id: self.user_id,
            pool_name: self.pool_name,
            rbd_name: self.rbd_name,
            block_size: self.block_size,
            config: key_values(&self.config, "--config")?,
            cluster_name: self.cluster_name,
            uuid: self.uuid,
            lease_s: self.lease_s,
        })
    }
}

#[cfg(test)]
mod rbd_cli_tests {
    use clap::{CommandFactory, FromArgMatches};
    use serde_json::{json, Value};

    use super::*;
    use crate::{Action, Cli};

    fn sent(args: &[&str]) -> Result<Option<Value>, String> {
        let argv = std::iter::once("riser-rpc").chain(args.iter().copied());
        let m = Cli::command().try_get_matches_from(argv).map_err(|e| e.to_string())?;
        let cli = Cli::from_arg_matches(&m).map_err(|e| e.to_string())?;
        match cli.cmd.into_action(m.subcommand_name().unwrap_or_default().to_string()) {
            Ok(Action::Call(_, p)) => Ok(p),
            Ok(_) => Err("not a call".into()),
            Err(UsageError(msg)) => Err(msg),
        }
    }

    #[test]
    fn rbd_subcommands_send_spdks_params() {
        assert_eq!(
            sent(&["bdev_rbd_register_cluster", "c0", "--config-file", "/x/ceph.conf", "--user-id", "admin"]).unwrap(),
            Some(json!({"name": "c0", "user_id": "admin", "config_file": "/x/ceph.conf"}))
        );
        assert_eq!(
            sent(&["bdev_rbd_register_cluster", "c1", "--config-param", "mon_host=127.0.0.1:13300", "--config-param", "key=AQ=="]).unwrap(),
            Some(json!({"name": "c1", "config_param": {"mon_host": "127.0.0.1:13300", "key": "AQ=="}}))
        );
        assert!(sent(&["bdev_rbd_register_cluster", "c1", "--config-param", "novalue"]).unwrap_err().contains("key=value"));
        assert_eq!(
            sent(&["bdev_rbd_create", "rbd", "img", "4096", "-b", "Ceph0", "-c", "c0"]).unwrap(),
            Some(json!({"name": "Ceph0", "pool_name": "rbd", "rbd_name": "img", "block_size": 4096, "cluster_name": "c0"}))
        );
        assert_eq!(
            sent(&["bdev_rbd_create", "rbd", "img", "512", "--config", "mon_host=h"]).unwrap(),
            Some(json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 512, "config": {"mon_host": "h"}}))
        );
        assert_eq!(
            sent(&["bdev_rbd_create", "rbd", "img", "512", "-c", "c0", "--lease-s", "20"]).unwrap(),
            Some(json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 512, "cluster_name": "c0", "lease_s": 20}))
        );
        assert!(sent(&["bdev_rbd_create", "rbd", "img", "big"]).is_err());
        assert_eq!(sent(&["bdev_rbd_delete", "Ceph0"]).unwrap(), Some(json!({"name": "Ceph0"})));
        assert_eq!(sent(&["bdev_rbd_unregister_cluster", "c0"]).unwrap(), Some(json!({"name": "c0"})));
        assert_eq!(sent(&["bdev_rbd_resize", "Ceph0", "128"]).unwrap(), Some(json!({"name": "Ceph0", "new_size": 128})));
        assert_eq!(sent(&["bdev_rbd_get_clusters_info"]).unwrap(), None);
        assert_eq!(sent(&["bdev_rbd_get_clusters_info", "-b", "c0"]).unwrap(), Some(json!({"name": "c0"})));
    }
}
