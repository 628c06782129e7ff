//! File-backed LUNs for the integration tests: sparse files on the real disk (under the
//! build's target directory, not a tmpfs) and targets over existing bdevs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{workspace_root, Riser};

/// A directory on the disk the workspace is on (O_DIRECT, holes), removed on drop.
pub struct DiskDir {
    path: PathBuf,
}

impl DiskDir {
    pub fn new(tag: &str) -> DiskDir {
        let base = workspace_root().join("target").join("test-files");
        std::fs::create_dir_all(&base).unwrap_or_else(|e| panic!("cannot create {}: {e}", base.display()));
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        DiskDir { path }
    }

    /// A new sparse file of `size` bytes in the directory.
    pub fn sparse_file(&self, name: &str, size: u64) -> PathBuf {
        let p = self.path.join(name);
        let f = std::fs::File::create(&p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
        f.set_len(size).unwrap_or_else(|e| panic!("cannot size {}: {e}", p.display()));
        p
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DiskDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// 512-byte units allocated to a file (st_blocks).
pub fn allocated_sectors(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map(|m| m.blocks()).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
}

impl Riser {
    /// An iSCSI target `iqn.2016-06.io.riser:NAME` on 127.0.0.1:`port` (portal group 1,
    /// initiator group 1, created if missing) with the given LUN objects (`bdev_name`,
    /// `lun_id`, options), open to any initiator. Returns the IQN once the port accepts.
    pub fn add_iscsi_target_on(&self, name: &str, port: u16, luns: Vec<Value>) -> String {
        let call = |m: &str, p: Value| {
            self.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", self.log()))
        };
        if self.call("iscsi_get_portal_groups", None).map(|v| v.as_array().map_or(0, |a| a.len())).unwrap_or(0) == 0 {
            call("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": port.to_string()}]}));
            call("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
        }
        call(
            "iscsi_create_target_node",
            json!({"name": name, "alias_name": name, "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}], "luns": luns, "queue_depth": 64}),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "riser did not listen on port {port}:\n{}", self.log());
            thread::sleep(Duration::from_millis(20));
        }
        format!("iqn.2016-06.io.riser:{name}")
    }
}
