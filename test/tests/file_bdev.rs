//! File and block-device LUNs (`bdev_uring_*`, `bdev_aio_*`) through the real riser, with
//! real initiators: writes survive a SIGKILL of riser and a restart from `save_config`'s
//! file; UNMAP frees space in the file and GET LBA STATUS says so; a grown file, rescanned,
//! reaches a logged-in session as CAPACITY DATA HAS CHANGED and the new size; bad input gets
//! errors that name the cause, and riser goes on serving.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use riser_tests::files::{allocated_sectors, DiskDir};
use riser_tests::iscsi::Client;
use riser_tests::{bin, free_port, json, rpc_code, rpc_message, Riser};

/// A riser with `bdev_uring_create` of `file` as `name`, exported as LUN 0 of `target`.
fn riser_with_file(file: &Path, name: &str, target: &str) -> (Riser, u16, String) {
    let riser = Riser::start();
    let port = free_port();
    let filename = file.to_str().expect("a UTF-8 path");
    riser
        .call("bdev_uring_create", Some(json!({"name": name, "filename": filename})))
        .unwrap_or_else(|e| panic!("bdev_uring_create: {e}\n{}", riser.log()));
    let iqn = riser.add_iscsi_target_on(target, port, vec![json!({"bdev_name": name, "lun_id": 0})]);
    (riser, port, iqn)
}

fn perf_output(args: &[&str], url: &str) -> std::process::Output {
    Command::new(bin("riser-perf"))
        .args(["-m", "0x2", "--no-pin", "--qd", "4"])
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("cannot run riser-perf: {e}"))
}

/// `sync: LABEL LBA A..B durable` -> B.
fn synced_end(line: &str) -> Option<u64> {
    let range = line.strip_prefix("sync: ")?.split(" LBA ").nth(1)?.split_whitespace().next()?;
    range.split_once("..")?.1.parse().ok()
}

#[test]
fn writes_synced_before_a_sigkill_survive_a_restart_from_save_config() {
    let disk = DiskDir::new("crash");
    let file = disk.sparse_file("crash.img", 256 << 20);
    let (mut riser, port, iqn) = riser_with_file(&file, "Crash0", "crash");
    let config = disk.path().join("riser.json");
    let out = riser.rpc(&["save_config", "-o", config.to_str().expect("a UTF-8 path")]);
    assert!(out.status.success(), "save_config: {out:?}");
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");

    // Write the whole LUN in verify format, SYNCHRONIZE CACHE every 50 ms; kill riser
    // (SIGKILL) after a few syncs, while writes are in flight.
    let mut perf = Command::new(bin("riser-perf"))
        .args(["-m", "0x2", "--no-pin", "--qd", "4", "--bs", "4096", "--verify", "--generation", "4242", "--sync-every", "50"])
        .arg(&url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run riser-perf: {e}"));
    let stdout = perf.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut durable = None;
    let mut syncs = 0;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while syncs < 4 && Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                if let Some(end) = synced_end(&line) {
                    syncs += 1;
                    durable = Some(end);
                }
                seen.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    riser.kill();
    let status = perf.wait().expect("riser-perf exits");
    // Lines printed after the last one read (a sync that completed just before the kill).
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
        if let Some(end) = synced_end(&line) {
            durable = Some(end);
        }
        seen.push(line);
    }
    let durable = durable.unwrap_or_else(|| panic!("riser-perf printed no sync line: {seen:?}"));
    let total = (256u64 << 20) / 512;
    assert!(syncs >= 4, "fewer than 4 syncs before the deadline: {seen:?}");
    assert!(durable > 0 && durable < total, "riser was killed mid-write (synced up to {durable} of {total}): {seen:?}");
    assert!(!status.success(), "riser-perf lost its target mid-write and must say so");

    // Restart from the saved config: same file, same bdev, same target and port.
    let riser = Riser::start_with(&["--json", config.to_str().expect("a UTF-8 path")]);
    let b = riser.call("bdev_get_bdevs", Some(json!({"name": "Crash0"}))).unwrap_or_else(|e| panic!("{e}\n{}", riser.log()));
    assert_eq!(b[0]["product_name"], "URING bdev", "{b}");
    let range = format!("0:{durable}");
    let out = perf_output(&["--bs", "4096", "--verify-only", "--generation", "4242", "--lba-range", &range], &url);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("verify: PASSED"), "blocks synced before the kill did not read back:\n{text}\nriser log:\n{}", riser.log());
}

fn unmap_cdb(len: u16) -> Vec<u8> {
    let mut c = vec![0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}

fn unmap_param(lba: u64, blocks: u32) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..2].copy_from_slice(&22u16.to_be_bytes());
    p[2..4].copy_from_slice(&16u16.to_be_bytes());
    p[8..16].copy_from_slice(&lba.to_be_bytes());
    p[16..20].copy_from_slice(&blocks.to_be_bytes());
    p
}

fn get_lba_status(c: &mut Client, lba: u64) -> Vec<(u64, u32, u8)> {
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x9E;
    cdb[1] = 0x12;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&256u32.to_be_bytes());
    let pdu = c.scsi_command(&cdb, true, false, 256, Vec::new());
    c.send(&pdu).expect("send GET LBA STATUS");
    let r = c.reply().expect("GET LBA STATUS answered");
    assert_eq!(r.status, 0, "GET LBA STATUS: {r:?}");
    r.data[8..]
        .chunks_exact(16)
        .map(|d| (u64::from_be_bytes(d[0..8].try_into().unwrap()), u32::from_be_bytes(d[8..12].try_into().unwrap()), d[12]))
        .collect()
}

fn login(port: u16, iqn: &str) -> Client {
    let mut c = Client::connect(port);
    c.login(iqn, &[]).unwrap_or_else(|e| panic!("login to {iqn}: {e:?}"));
    assert!(c.clear_unit_attentions(), "the LUN did not become ready");
    c
}

#[test]
fn unmap_frees_space_in_the_file_and_get_lba_status_shows_it() {
    let disk = DiskDir::new("unmap");
    let file = disk.sparse_file("unmap.img", 64 << 20);
    let (riser, port, iqn) = riser_with_file(&file, "Thin0", "thin");
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    // Fill the first 8 MiB.
    let out = perf_output(&["--bs", "65536", "--verify", "--lba-range", "0:16384"], &url);
    assert!(out.status.success(), "riser-perf --verify: {}", String::from_utf8_lossy(&out.stdout));
    let before = allocated_sectors(&file);
    assert!(before >= 16384, "8 MiB written, {before} sectors allocated");
    let mut c = login(port, &iqn);
    assert_eq!(get_lba_status(&mut c, 0), vec![(0, 16384, 0), (16384, 131072 - 16384, 1)]);
    // UNMAP 4 MiB in the middle of what was written.
    let pdu = c.scsi_command(&unmap_cdb(24), false, true, 24, unmap_param(4096, 8192));
    c.send(&pdu).expect("send UNMAP");
    let r = c.reply().expect("UNMAP answered");
    assert_eq!(r.status, 0, "UNMAP: {r:?}");
    let after = allocated_sectors(&file);
    assert!(after + 8192 <= before, "allocated sectors {before} -> {after}: UNMAP of 4 MiB freed less");
    assert_eq!(
        get_lba_status(&mut c, 0),
        vec![(0, 4096, 0), (4096, 8192, 1), (12288, 4096, 0), (16384, 131072 - 16384, 1)]
    );
    let (st, data) = c.read10(5000, 8).expect("READ answered");
    assert_eq!(st, 0);
    assert!(data.iter().all(|&b| b == 0), "an unmapped block reads as zeros");
    // The Logical Block Provisioning VPD page says thin, unmap supported, zeros read back.
    let pdu = c.scsi_command(&[0x12, 1, 0xB2, 0, 64, 0], true, false, 64, Vec::new());
    c.send(&pdu).expect("send INQUIRY");
    let vpd = c.reply().expect("INQUIRY answered").data;
    assert_eq!(vpd[5] & 0x84, 0x84, "LBPU and LBPRZ: {vpd:02x?}");
    assert_eq!(vpd[6] & 0x07, 0x02, "thin provisioned: {vpd:02x?}");
    drop(riser);
}

#[test]
fn a_grown_file_reaches_a_logged_in_session_as_capacity_data_has_changed() {
    let disk = DiskDir::new("grow");
    let file = disk.sparse_file("grow.img", 16 << 20);
    let (riser, port, iqn) = riser_with_file(&file, "Grow0", "grow");
    let mut c = login(port, &iqn);
    let read_capacity16 = |c: &mut Client| -> (u8, Option<(u8, u8, u8)>, u64) {
        let mut cdb = vec![0u8; 16];
        cdb[0] = 0x9E;
        cdb[1] = 0x10;
        cdb[13] = 32;
        let pdu = c.scsi_command(&cdb, true, false, 32, Vec::new());
        c.send(&pdu).expect("send READ CAPACITY(16)");
        let r = c.reply().expect("READ CAPACITY(16) answered");
        let last = if r.data.len() >= 8 { u64::from_be_bytes(r.data[0..8].try_into().unwrap()) } else { 0 };
        (r.status, r.sense(), last)
    };
    assert_eq!(read_capacity16(&mut c), (0, None, 32767));
    std::fs::OpenOptions::new().write(true).open(&file).and_then(|f| f.set_len(32 << 20)).expect("grow the file");
    // Not seen before the rescan.
    assert_eq!(read_capacity16(&mut c), (0, None, 32767));
    let out = riser.rpc(&["bdev_uring_rescan", "Grow0"]);
    assert!(out.status.success(), "bdev_uring_rescan: {out:?}");
    let (status, sense, _) = read_capacity16(&mut c);
    assert_eq!((status, sense), (2, Some((6, 0x2A, 0x09))), "CHECK CONDITION, CAPACITY DATA HAS CHANGED");
    assert_eq!(read_capacity16(&mut c), (0, None, 65535), "the new size");
    assert_eq!(c.write10(65535, &[7u8; 512]), Some(0), "the new last block is writable");
    // libiscsi sees the new size too.
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let out = Command::new("iscsi-readcapacity16").arg(&url).output().expect("iscsi-readcapacity16 (libiscsi-bin)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("RETURNED LOGICAL BLOCK ADDRESS:65535"), "iscsi-readcapacity16: {text}");
    let b = riser.call("bdev_get_bdevs", Some(json!({"name": "Grow0"}))).expect("bdev_get_bdevs");
    assert_eq!(b[0]["num_blocks"], 65536);
}

#[test]
fn bad_input_gets_clear_errors_and_riser_keeps_serving() {
    let disk = DiskDir::new("bad");
    let riser = Riser::start();
    let call = |m: &str, p: serde_json::Value| riser.call(m, Some(p));
    let missing = disk.path().join("missing.img");
    let r = call("bdev_uring_create", json!({"name": "X", "filename": missing.to_str().unwrap()}));
    assert_eq!(rpc_code(&r), -2, "{r:?}");
    assert!(rpc_message(&r).contains("No such file") && rpc_message(&r).contains("missing.img"), "{r:?}");
    let good = disk.sparse_file("good.img", 1 << 20);
    let good = good.to_str().unwrap();
    let r = call("bdev_aio_create", json!({"name": "X", "filename": good, "block_size": 1000}));
    assert_eq!(rpc_code(&r), -32602, "{r:?}");
    assert!(rpc_message(&r).contains("block_size 1000"), "{r:?}");
    let odd = disk.sparse_file("odd.img", (1 << 20) + 1000);
    let r = call("bdev_uring_create", json!({"name": "X", "filename": odd.to_str().unwrap(), "block_size": 4096}));
    assert_eq!(rpc_code(&r), -22, "{r:?}");
    assert!(rpc_message(&r).contains("not a multiple of block_size 4096"), "{r:?}");
    let r = call("bdev_uring_create", json!({"name": "X", "filename": disk.path().to_str().unwrap()}));
    assert!(rpc_message(&r).contains("neither a regular file nor a block device"), "{r:?}");
    let r = call("bdev_uring_create", json!({"name": "X", "filename": good, "bogus": 1}));
    assert_eq!(rpc_code(&r), -32602, "{r:?}");
    let r = call("bdev_uring_create", json!({"name": "X"}));
    assert!(rpc_code(&r) == -32602 && rpc_message(&r).contains("filename"), "{r:?}");
    let list = riser.call("bdev_get_bdevs", None).expect("bdev_get_bdevs");
    assert_eq!(list.as_array().map(|a| a.len()), Some(0), "nothing half-created: {list}");

    assert_eq!(call("bdev_uring_create", json!({"name": "F0", "filename": good})).expect("create"), json!("F0"));
    let r = call("bdev_aio_create", json!({"name": "F0", "filename": good}));
    assert_eq!(rpc_code(&r), -17, "{r:?}");
    let port = free_port();
    riser.add_iscsi_target_on("bad", port, vec![json!({"bdev_name": "F0", "lun_id": 0})]);
    let r = call("bdev_uring_delete", json!({"name": "F0"}));
    assert_eq!(rpc_code(&r), -16, "a claimed bdev is not deleted: {r:?}");
    let r = call("bdev_aio_delete", json!({"name": "F0"}));
    assert_eq!(rpc_code(&r), -19, "an aio delete of a uring bdev: {r:?}");
    let r = call("bdev_malloc_create", json!({"name": "M0", "num_blocks": 64, "block_size": 512}));
    assert!(r.is_ok(), "{r:?}");
    let r = call("bdev_uring_rescan", json!({"name": "M0"}));
    assert_eq!(rpc_code(&r), -19, "a malloc bdev is not a uring bdev: {r:?}");
    let r = call("bdev_aio_rescan", json!({"name": "Nope"}));
    assert_eq!(rpc_code(&r), -19, "{r:?}");
    // Shrinking a claimed file is refused at rescan.
    std::fs::OpenOptions::new().write(true).open(good).and_then(|f| f.set_len(512 << 10)).expect("shrink");
    let r = call("bdev_uring_rescan", json!({"name": "F0"}));
    assert_eq!(rpc_code(&r), -16, "{r:?}");
    assert!(rpc_message(&r).contains("shrink"), "{r:?}");
    // Still serving: the LUN answers.
    let mut c = login(port, "iqn.2016-06.io.riser:bad");
    assert_eq!(c.write10(0, &[1u8; 512]), Some(0));
    // A read-only aio bdev: a LUN on it refuses writes with DATA PROTECT.
    let ro = disk.sparse_file("ro.img", 1 << 20);
    assert_eq!(call("bdev_aio_create", json!({"name": "RO0", "filename": ro.to_str().unwrap(), "readonly": true})).expect("create"), json!("RO0"));
    riser.add_iscsi_target_on("ro", port, vec![json!({"bdev_name": "RO0", "lun_id": 0})]);
    let mut c = login(port, "iqn.2016-06.io.riser:ro");
    let pdu = c.scsi_command(&[0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0], false, true, 512, vec![1u8; 512]);
    c.send(&pdu).expect("send WRITE");
    let r = c.reply().expect("WRITE answered");
    assert_eq!((r.status, r.sense().map(|s| s.0)), (2, Some(7)), "DATA PROTECT: {r:?}");
}

/// A loop device with 4096-byte sectors: a smaller block size is refused, the detected one
/// is 4096; a device held by one bdev (O_EXCL) is busy for another.
#[test]
fn block_devices_detect_their_block_size_and_refuse_a_smaller_one() {
    let disk = DiskDir::new("loop");
    let img = disk.sparse_file("loop.img", 16 << 20);
    let out = Command::new("losetup")
        .args(["-f", "--show", "-b", "4096"])
        .arg(&img)
        .output()
        .unwrap_or_else(|e| panic!("losetup (util-linux, run as root) is needed for this test: {e}"));
    assert!(out.status.success(), "losetup -f --show -b 4096 failed (root and loop devices are needed): {}", String::from_utf8_lossy(&out.stderr));
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(dev.clone());
    let riser = Riser::start();
    let r = riser.call("bdev_uring_create", Some(json!({"name": "L0", "filename": dev, "block_size": 512})));
    assert_eq!(rpc_code(&r), -22, "{r:?}");
    assert!(rpc_message(&r).contains("below the logical block size") && rpc_message(&r).contains("4096"), "{r:?}");
    assert_eq!(riser.call("bdev_uring_create", Some(json!({"name": "L0", "filename": dev}))).expect("create"), json!("L0"));
    let b = riser.call("bdev_get_bdevs", Some(json!({"name": "L0"}))).expect("bdev_get_bdevs");
    assert_eq!((b[0]["block_size"].clone(), b[0]["num_blocks"].clone()), (json!(4096), json!(4096)), "{b}");
    let r = riser.call("bdev_aio_create", Some(json!({"name": "L1", "filename": dev})));
    assert_eq!(rpc_code(&r), -16, "the device is held by L0: {r:?}");
    assert!(rpc_message(&r).contains(&dev), "{r:?}");
    // save_config writes it back as it was made.
    let cfg = riser.call("framework_get_config", Some(json!({"name": "bdev"}))).expect("framework_get_config");
    let entry = cfg.as_array().and_then(|a| a.iter().find(|c| c["params"]["name"] == "L0")).cloned().unwrap_or_default();
    assert_eq!(entry["method"], "bdev_uring_create", "{cfg}");
    assert_eq!(entry["params"]["filename"], json!(dev));
    assert_eq!(entry["params"]["block_size"], 4096);
    riser.call("bdev_uring_delete", Some(json!({"name": "L0"}))).expect("delete");
}
