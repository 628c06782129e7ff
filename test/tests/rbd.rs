//! Ceph RBD bdevs against a real single-node Ceph cluster (scripts/ceph-test-cluster.sh: a
//! monitor on 127.0.0.1, one memstore OSD, a mgr), started once for this file and shared by
//! its checks, which run in order in one test (one of them stops the cluster). The guard stops
//! the daemons when the test ends, panics included.
//!
//! - bdev_rbd_* RPCs: a registered cluster, a bdev with a connection of its own, bad input
//!   (unknown cluster, missing pool or image, bad block size, cluster_name with config, a
//!   cluster in use), get_clusters_info, save_config (clusters before bdevs), resize, delete.
//! - Data: blocks written through riser read back identical with `rbd export`; an image made
//!   with `rbd import` and then overwritten by `rbd bench` while riser has it open reads back
//!   identical through riser (riser caches nothing); riser-perf --verify at QD 16.
//! - COMPARE AND WRITE goes to the cluster (rbd_aio_compare_and_write): success, and a
//!   miscompare with the offset of the first differing byte.
//! - libiscsi's compliance suite on an RBD LUN: 0 failed.
//! - The cluster stopped (SIGSTOP) mid-I/O: I/O to the RBD LUN fails with HARDWARE ERROR /
//!   LOGICAL UNIT COMMUNICATION FAILURE after the configured op timeout while a malloc LUN on
//!   the same riser keeps serving; continued (SIGCONT), the RBD LUN serves again.

use std::process::Command;
use std::time::{Duration, Instant};

use riser_tests::ceph::CephCluster;
use riser_tests::compliance::{run_tests, Outcome};
use riser_tests::iscsi::Client;
use riser_tests::{bin, free_port, json, rpc_code, rpc_message, Riser, TempDir, Value};

/// Bytes of a deterministic pattern for `len` bytes starting at byte `at` of a LUN.
fn pattern(seed: u8, at: usize, len: usize) -> Vec<u8> {
    (at..at + len).map(|i| ((i / 512) as u8).wrapping_mul(31) ^ (i as u8).wrapping_add(seed)).collect()
}

fn login(port: u16, iqn: &str) -> Client {
    let mut c = Client::connect(port);
    c.login(iqn, &[]).unwrap_or_else(|e| panic!("login to {iqn}: {e:?}"));
    assert!(c.clear_unit_attentions(), "{iqn} did not become ready");
    c
}

/// Reads `blocks` 512-byte blocks from `lba` in 64-block commands.
fn read_all(c: &mut Client, lba: u32, blocks: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(blocks as usize * 512);
    let mut at = lba;
    while at < lba + blocks {
        let n = (lba + blocks - at).min(64) as u16;
        let (status, data) = c.read10(at, n).expect("an answer to READ(10)");
        assert_eq!(status, 0, "READ(10) at {at} failed");
        assert_eq!(data.len(), n as usize * 512);
        out.extend_from_slice(&data);
        at += n as u32;
    }
    out
}

fn write_all(c: &mut Client, lba: u32, data: &[u8]) {
    for (i, chunk) in data.chunks(8192).enumerate() {
        let at = lba + (i * 16) as u32;
        assert_eq!(c.write10(at, chunk), Some(0), "WRITE(10) at {at} failed");
    }
}

/// COMPARE AND WRITE of one block at `lba`; (status, sense key/ASC/ASCQ, INFORMATION).
fn compare_and_write(c: &mut Client, lba: u64, verify: &[u8], write: &[u8]) -> (u8, Option<(u8, u8, u8)>, Option<u64>) {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = 1;
    let mut data = verify.to_vec();
    data.extend_from_slice(write);
    let pdu = c.scsi_command(&cdb, false, true, data.len() as u32, data);
    c.send(&pdu).expect("send COMPARE AND WRITE");
    let r = c.reply().expect("an answer to COMPARE AND WRITE");
    // Fixed-format sense: INFORMATION in bytes 3..7 when VALID is set.
    let info = r
        .sense_segment
        .get(2..)
        .filter(|s| s.len() >= 7 && s[0] & 0x80 != 0 && s[0] & 0x7f == 0x70)
        .map(|s| u32::from_be_bytes([s[3], s[4], s[5], s[6]]) as u64);
    (r.status, r.sense(), info)
}

fn export(ceph: &CephCluster, tmp: &TempDir, image: &str) -> Vec<u8> {
    let f = tmp.join(&format!("{image}.export"));
    let _ = std::fs::remove_file(&f);
    ceph.rbd_ok(&["export", &format!("rbd/{image}"), f.to_str().expect("utf-8 path")]);
    std::fs::read(&f).expect("read the export")
}

#[test]
fn rbd_bdevs_on_a_real_ceph_cluster() {
    let t0 = Instant::now();
    let ceph = CephCluster::start("rbd");
    eprintln!("rbd: cluster up in {:?}", t0.elapsed());
    let riser = Riser::start();
    let tmp = TempDir::new("rbd");
    let conf = ceph.conf().to_str().expect("utf-8 path").to_string();
    let keyring = ceph.keyring().to_str().expect("utf-8 path").to_string();
    let port = free_port();

    // ---- RPCs and their errors ----
    // Images without the exclusive-lock feature: no lock moves between riser's image handles (one
    // per channel), and several gateways can write one image (riser caches no data).
    ceph.rbd_ok(&["create", "--image-feature", "layering", "--size", "16M", "rbd/a"]);
    let r = riser.rpc(&[
        "bdev_rbd_register_cluster",
        "c0",
        "--config-file",
        &conf,
        "--key-file",
        &keyring,
        "--user-id",
        "admin",
        "--config-param",
        "rados_osd_op_timeout=5",
    ]);
    assert_eq!(r.code(), Some(0), "bdev_rbd_register_cluster: {r:?}\n{}", riser.log());
    let e = riser.call("bdev_rbd_register_cluster", Some(json!({"name": "c0", "config_file": conf})));
    assert_eq!(rpc_code(&e), -17, "{e:?}");
    let e = riser.call("bdev_rbd_register_cluster", Some(json!({"name": "bad", "config_file": "/nonexistent/ceph.conf"})));
    assert!(rpc_message(&e).contains("rados_conf_read_file") && rpc_message(&e).contains("No such file"), "{e:?}");
    let info = riser.call("bdev_rbd_get_clusters_info", Some(json!({"name": "c0"}))).expect("get_clusters_info");
    assert_eq!(info["cluster_name"], "c0");
    assert_eq!(info["config_param"]["rados_osd_op_timeout"], "5");
    assert_eq!(info["fsid"].as_str().map(str::len), Some(36), "{info}");
    let create = |p: Value| riser.call("bdev_rbd_create", Some(p));
    let e = create(json!({"name": "X", "pool_name": "rbd", "rbd_name": "a", "block_size": 512, "cluster_name": "nope"}));
    assert_eq!(rpc_code(&e), -19);
    assert!(rpc_message(&e).contains("rbd cluster nope"), "{e:?}");
    let e = create(json!({"name": "X", "pool_name": "nopool", "rbd_name": "a", "block_size": 512, "cluster_name": "c0"}));
    assert!(rpc_message(&e).contains("rbd pool nopool not found"), "{e:?}");
    let e = create(json!({"name": "X", "pool_name": "rbd", "rbd_name": "nothere", "block_size": 512, "cluster_name": "c0"}));
    assert!(rpc_message(&e).contains("rbd image rbd/nothere not found"), "{e:?}");
    let e = create(json!({"name": "X", "pool_name": "rbd", "rbd_name": "a", "block_size": 1000, "cluster_name": "c0"}));
    assert_eq!(rpc_code(&e), -32602);
    assert!(rpc_message(&e).contains("block_size 1000"), "{e:?}");
    let e = create(json!({"name": "X", "pool_name": "rbd", "block_size": 512, "cluster_name": "c0"}));
    assert_eq!(rpc_code(&e), -32602, "missing rbd_name: {e:?}");
    let e = create(json!({"name": "X", "pool_name": "rbd", "rbd_name": "a", "block_size": 512, "cluster_name": "c0", "user_id": "admin"}));
    assert!(rpc_message(&e).contains("cluster_name excludes"), "{e:?}");
    assert!(riser.call("bdev_get_bdevs", Some(json!({"name": "X"}))).is_err(), "a failed create left a bdev");
    let r = riser.rpc(&["bdev_rbd_create", "rbd", "a", "512", "-b", "Rbd0", "-c", "c0"]);
    assert_eq!(r.code(), Some(0), "bdev_rbd_create: {r:?}\n{}", riser.log());
    let e = riser.call("bdev_rbd_unregister_cluster", Some(json!({"name": "c0"})));
    assert_eq!(rpc_code(&e), -16, "a cluster in use: {e:?}");
    assert!(rpc_message(&e).contains("Rbd0"), "{e:?}");
    let b = riser.call("bdev_get_bdevs", Some(json!({"name": "Rbd0"}))).expect("bdev_get_bdevs");
    assert_eq!(b[0]["num_blocks"], 32768);
    assert_eq!(b[0]["product_name"], "Ceph Rbd Disk");
    assert_eq!(b[0]["supported_io_types"]["compare_and_write"], true);
    assert_eq!(b[0]["driver_specific"]["rbd"]["rbd_name"], "a");

    // A bdev with a connection of its own (SPDK's user_id + config), on an image made by `rbd import`.
    let imported = pattern(7, 0, 4 << 20);
    let src = tmp.join("b.src");
    std::fs::write(&src, &imported).expect("write the import source");
    ceph.rbd_ok(&["import", "--image-feature", "layering", src.to_str().expect("utf-8 path"), "rbd/b"]);
    let mon_host = std::fs::read_to_string(ceph.conf())
        .expect("ceph.conf")
        .lines()
        .find_map(|l| l.strip_prefix("mon host = ").map(str::to_string))
        .expect("mon host in ceph.conf");
    let r = create(json!({
        "name": "Rbd1", "pool_name": "rbd", "rbd_name": "b", "block_size": 512, "user_id": "admin",
        "config": {"mon_host": mon_host, "keyring": keyring}
    }));
    assert!(r.is_ok(), "bdev_rbd_create with its own connection: {r:?}\n{}", riser.log());

    // save_config: the cluster, then the bdevs that name it.
    let cfg = riser.call("framework_get_config", Some(json!({"name": "bdev"}))).expect("framework_get_config");
    let methods: Vec<&str> = cfg.as_array().expect("a list").iter().filter_map(|c| c["method"].as_str()).collect();
    let reg = methods.iter().position(|m| *m == "bdev_rbd_register_cluster").expect("the cluster in save_config");
    let first_bdev = methods.iter().position(|m| *m == "bdev_rbd_create").expect("the bdevs in save_config");
    assert!(reg < first_bdev, "{methods:?}");
    let rbd0 = cfg.as_array().and_then(|a| a.iter().find(|c| c["params"]["name"] == "Rbd0")).expect("Rbd0's call");
    assert_eq!(rbd0["params"]["cluster_name"], "c0");
    assert_eq!(rbd0["params"]["pool_name"], "rbd");

    // ---- Data, both ways ----
    let a_iqn = riser.add_iscsi_target_on("rbd-a", port, vec![json!({"bdev_name": "Rbd0", "lun_id": 0})]);
    let b_iqn = riser.add_iscsi_target_on("rbd-b", port, vec![json!({"bdev_name": "Rbd1", "lun_id": 0})]);
    let m_iqn = riser.add_iscsi_target_luns("mal", port, &[(8, json!({}))]);
    // riser-perf: a write-and-read-back pass over the whole LUN at QD 16.
    let url_a = format!("iscsi://127.0.0.1:{port}/{a_iqn}/0");
    let out = Command::new(bin("riser-perf"))
        .args(["--no-pin", "-m", "0x1", "--qd", "16", "--login-timeout", "10", "--verify", "--generation", "3", "--bs", "4096"])
        .arg(&url_a)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run riser-perf");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("verify: PASSED"), "riser-perf --verify on RBD:\n{text}{}", String::from_utf8_lossy(&out.stderr));

    // Written through riser, read by `rbd export`.
    let mut ca = login(port, &a_iqn);
    let at_lba = 1000u32;
    let written = pattern(42, at_lba as usize * 512, 1 << 20);
    write_all(&mut ca, at_lba, &written);
    let exp = export(&ceph, &tmp, "a");
    assert_eq!(exp.len(), 16 << 20);
    let off = at_lba as usize * 512;
    assert!(exp[off..off + written.len()] == written[..], "rbd export differs from what riser wrote");
    // And riser reads its own writes back.
    assert!(read_all(&mut ca, at_lba, 2048) == written, "riser read back differs");

    // Imported by `rbd import`, read through riser.
    let mut cb = login(port, &b_iqn);
    assert!(read_all(&mut cb, 0, 8192) == imported, "riser reads differ from the imported file");
    // Overwritten by `rbd bench` while riser has the image open: riser reads what rbd export reads.
    ceph.rbd_ok(&["bench", "--io-type", "write", "--io-size", "4096", "--io-pattern", "rand", "--io-total", "2M", "--io-threads", "8", "rbd/b"]);
    let exp = export(&ceph, &tmp, "b");
    assert!(exp != imported, "rbd bench wrote nothing");
    assert!(read_all(&mut cb, 0, 8192) == exp, "riser reads differ from rbd export after rbd bench");

    // ---- COMPARE AND WRITE in the cluster ----
    let old = pattern(42, off, 512);
    let new = vec![0x5Au8; 512];
    let (st, sense, _) = compare_and_write(&mut ca, at_lba as u64, &old, &new);
    assert_eq!((st, sense), (0, None), "COMPARE AND WRITE with matching data");
    let mut wrong = new.clone();
    wrong[300] ^= 0xFF;
    let (st, sense, info) = compare_and_write(&mut ca, at_lba as u64, &wrong, &old);
    assert_eq!(st, 2, "a miscompare is CHECK CONDITION");
    assert_eq!(sense, Some((0x0E, 0x1D, 0x00)), "MISCOMPARE / MISCOMPARE DURING VERIFY OPERATION");
    assert_eq!(info, Some(300), "INFORMATION: the offset of the first differing byte");
    let exp = export(&ceph, &tmp, "a");
    assert!(exp[off..off + 512] == new[..], "the matching COMPARE AND WRITE is in the image, the miscompare wrote nothing");

    // ---- libiscsi's compliance suite on an RBD LUN ----
    ceph.rbd_ok(&["create", "--image-feature", "layering", "--size", "32M", "rbd/comp"]);
    riser
        .call("bdev_rbd_create", Some(json!({"name": "RbdComp", "pool_name": "rbd", "rbd_name": "comp", "block_size": 512, "cluster_name": "c0"})))
        .expect("create RbdComp");
    let comp_iqn = riser.add_iscsi_target_on("rbd-comp", port, vec![json!({"bdev_name": "RbdComp", "lun_id": 0})]);
    let t = Instant::now();
    let suite = run_suite(&format!("iscsi://127.0.0.1:{port}/{comp_iqn}/0"));
    eprintln!(
        "rbd: compliance suite in {:?}: ran {}, passed {}, failed {}, skipped {} {:?}",
        t.elapsed(),
        suite.ran,
        suite.passed,
        suite.failed,
        suite.skipped.len(),
        suite.skipped
    );
    assert!(suite.ran >= 200, "the suite did not run:\n{}", suite.output);
    assert_eq!(
        suite.failed,
        0,
        "failed {:?}\n{}\n--- riser log (tail) ---\n{}",
        suite.failed_tests,
        tail(&suite.output, 150),
        tail(&riser.log(), 60)
    );
    // As on a malloc LUN with the defaults (compliance.rs: 23).
    assert!(suite.skipped.len() <= 23, "{} skipped: {:?}", suite.skipped.len(), suite.skipped);

    // ---- Resize ----
    riser.call("bdev_rbd_resize", Some(json!({"name": "Rbd0", "new_size": 24}))).expect("bdev_rbd_resize");
    let b = riser.call("bdev_get_bdevs", Some(json!({"name": "Rbd0"}))).expect("bdev_get_bdevs");
    assert_eq!(b[0]["num_blocks"], 24 * 2048);
    assert!(ceph.rbd_ok(&["info", "rbd/a"]).contains("size 24 MiB"), "the image grew");
    let e = riser.call("bdev_rbd_resize", Some(json!({"name": "Rbd0", "new_size": 8})));
    assert!(rpc_message(&e).contains("only grow"), "{e:?}");

    // ---- The cluster goes away mid-I/O, and comes back ----
    let mut cm = login(port, &m_iqn);
    // A new session (the first one idled through the suite: riser's NOP-In pings go unanswered
    // by this test client, so it may be gone).
    let mut ca = login(port, &a_iqn);
    ceph.signal_all("STOP");
    let t = Instant::now();
    let pdu = ca.scsi_command(&write10_cdb(2000, 16), false, true, 8192, vec![0xA5; 8192]);
    ca.send(&pdu).expect("send WRITE(10)");
    // Meanwhile the malloc LUN on the same riser serves.
    for i in 0..20u32 {
        assert_eq!(cm.write10(i * 16, &[i as u8; 8192]), Some(0), "the malloc LUN stopped serving");
        let (st, data) = cm.read10(i * 16, 16).expect("READ(10) on malloc");
        assert!(st == 0 && data == vec![i as u8; 8192], "malloc read back");
    }
    let r = ca.reply().expect("an answer to the WRITE on the stopped cluster (within the client's 10 s)");
    assert_eq!(r.status, 2, "the write to the stopped cluster fails");
    assert_eq!(r.sense(), Some((0x04, 0x08, 0x00)), "HARDWARE ERROR / LOGICAL UNIT COMMUNICATION FAILURE");
    assert!(t.elapsed() >= Duration::from_secs(4), "failed before the 5 s op timeout: {:?}", t.elapsed());
    assert!(riser.log().contains("the Ceph cluster does not answer"), "a clear log line");
    ceph.signal_all("CONT");
    let t = Instant::now();
    loop {
        match ca.write10(2000, &[0xC3; 8192]) {
            Some(0) => break,
            Some(_) if t.elapsed() < Duration::from_secs(60) => std::thread::sleep(Duration::from_millis(500)),
            other => panic!("the RBD LUN did not serve again after the cluster came back: {other:?}\n{}", tail(&riser.log(), 40)),
        }
    }
    assert_eq!(ca.read10(2000, 16).map(|(s, d)| (s, d == vec![0xC3; 8192])), Some((0, true)));
    eprintln!("rbd: served again {:?} after the cluster came back", t.elapsed());

    // ---- Delete, then unregister ----
    drop((ca, cb, cm));
    for (node, bdev) in [("rbd-a", "Rbd0"), ("rbd-b", "Rbd1"), ("rbd-comp", "RbdComp")] {
        // force: the sessions just dropped may not be gone from riser yet.
        riser.call("iscsi_delete_target_node", Some(json!({"name": format!("iqn.2016-06.io.riser:{node}"), "force": true}))).expect("delete node");
        riser.call("bdev_rbd_delete", Some(json!({"name": bdev}))).unwrap_or_else(|e| panic!("bdev_rbd_delete {bdev}: {e}"));
    }
    let e = riser.call("bdev_rbd_delete", Some(json!({"name": "Rbd0"})));
    assert_eq!(rpc_code(&e), -19);
    // The channels of deleted bdevs close with their sessions: the cluster is free soon.
    let t = Instant::now();
    while let Err(e) = riser.call("bdev_rbd_unregister_cluster", Some(json!({"name": "c0"}))) {
        assert!(t.elapsed() < Duration::from_secs(10), "unregister after the bdevs went: {e}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(riser.call("bdev_rbd_get_clusters_info", None).expect("info"), json!([]));
    eprintln!("rbd: all checks in {:?}", t0.elapsed());
}

fn write10_cdb(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x2A;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// libiscsi's whole suite, as test/tests/compliance.rs runs it.
fn run_suite(url: &str) -> Outcome {
    run_tests("ALL", &[url])
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
