//! `riser-rpc apply` against the real `riser`: applying save_config's own output changes
//! nothing; a changed file's plan (--dry-run) is what is then done, and save_config then
//! equals the file; removing a LUN with I/O running on it is refused without --force and
//! done with it, the session kept.
//! Needs `cargo build --workspace` first.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use riser_iscsi::pdu::{Lun, Op};
use riser_tests::iscsi::{Client, INITIATOR};
use riser_tests::*;

/// The 8-byte LUN field for LUN `id` < 256 (SAM peripheral addressing).
fn lun_field(id: u8) -> Lun {
    Lun(u64::from_be_bytes([0, id, 0, 0, 0, 0, 0, 0]))
}

/// WRITE(10) of 4 KiB at `lba` to LUN `lun`: the status, None if the connection closed.
fn write_lun(c: &mut Client, lun: u8, lba: u32) -> Option<u8> {
    let mut cdb = [0u8; 10];
    cdb[0] = 0x2a;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&8u16.to_be_bytes());
    let mut pdu = c.scsi_command(&cdb, false, true, 4096, vec![0x5a; 4096]);
    if let Op::ScsiCommand(cmd) = &mut pdu.bhs.op {
        cmd.lun = lun_field(lun);
    }
    c.send(&pdu).ok()?;
    c.reply().map(|r| r.status)
}

/// The configuration with every array sorted, so that two differ only in what they hold.
fn normalized(v: &Value) -> Value {
    match v {
        Value::Array(a) => {
            let mut items: Vec<Value> = a.iter().map(normalized).collect();
            items.sort_by_key(|x| x.to_string());
            Value::Array(items)
        }
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), normalized(v))).collect()),
        v => v.clone(),
    }
}

/// The `config` array of subsystem `name`.
fn calls<'a>(cfg: &'a mut Value, name: &str) -> &'a mut Vec<Value> {
    cfg["subsystems"]
        .as_array_mut()
        .and_then(|s| s.iter_mut().find(|s| s["subsystem"] == name))
        .and_then(|s| s["config"].as_array_mut())
        .unwrap_or_else(|| panic!("no subsystem {name}"))
}

/// The params of the call of `method` whose `key` is `val`.
fn params<'a>(cfg: &'a mut Value, sub: &str, method: &str, key: &str, val: Value) -> &'a mut Value {
    calls(cfg, sub)
        .iter_mut()
        .find(|c| c["method"] == method && c["params"][key] == val)
        .map(|c| &mut c["params"])
        .unwrap_or_else(|| panic!("no {method} with {key} = {val}"))
}

fn save_config(riser: &Riser) -> Value {
    riser.client().save_config().unwrap_or_else(|e| panic!("save_config: {e}"))
}

/// Writes `cfg` into riser's directory and runs `riser-rpc apply FILE ARGS..`.
fn apply(riser: &Riser, cfg: &Value, args: &[&str]) -> RpcOutput {
    let file = riser.dir().join("apply.json");
    std::fs::write(&file, serde_json::to_string_pretty(cfg).unwrap_or_default()).expect("write the file to apply");
    let file = file.to_string_lossy().into_owned();
    let mut all = vec!["apply", file.as_str()];
    all.extend_from_slice(args);
    riser.rpc(&all)
}

/// The steps of a printed plan (`  N. STEP`) or of a run (`[N/M] ok: STEP`).
fn plan_lines(out: &str) -> Vec<String> {
    out.lines().filter_map(|l| l.trim_start().split_once(". ").filter(|(n, _)| n.parse::<u32>().is_ok()).map(|(_, s)| s.to_string())).collect()
}

fn done_lines(out: &str) -> Vec<String> {
    out.lines().filter_map(|l| l.strip_prefix('[')?.split_once("] ok: ").map(|(_, s)| s.to_string())).collect()
}

/// riser with t1 (LUN 0 on Null0, LUN 1 on M0) on 127.0.0.1:`port`, open to anyone.
fn setup(port: u16) -> Riser {
    let riser = Riser::start();
    let call = |m: &str, p: Value| riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\n{}", riser.log()));
    call("bdev_null_create", json!({"name": "Null0", "num_blocks": 131072, "block_size": 512}));
    call("bdev_malloc_create", json!({"name": "M0", "num_blocks": 16384, "block_size": 512}));
    riser.add_iscsi_target_on("t1", port, vec![json!({"bdev_name": "Null0", "lun_id": 0}), json!({"bdev_name": "M0", "lun_id": 1})]);
    riser
}

fn session(riser: &Riser, port: u16, target: &str) -> Client {
    let mut c = Client::connect(port);
    c.login(target, &[]).unwrap_or_else(|s| panic!("login to {target}: {s:?}\n{}", riser.log()));
    assert!(c.clear_unit_attentions(), "TEST UNIT READY never succeeded");
    c
}

#[test]
fn applying_the_nodes_own_configuration_changes_nothing() {
    let port = free_port();
    let riser = setup(port);
    let _s = session(&riser, port, "iqn.2016-06.io.riser:t1");
    // Rate limits and a portal group's discovery CHAP are part of the configuration too.
    let call = |m: &str, p: Value| riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\n{}", riser.log()));
    call("bdev_set_qos_limit", json!({"name": "Null0", "rw_ios_per_sec": 100000, "w_mbytes_per_sec": 500}));
    call(
        "iscsi_target_node_set_qos_limit",
        json!({"name": "iqn.2016-06.io.riser:t1", "initiator_name": INITIATOR, "lun_id": 1, "rw_mbytes_per_sec": 800}),
    );
    call("iscsi_portal_group_set_auth", json!({"tag": 1, "disable_chap": true}));
    let before = save_config(&riser);
    for (m, what) in [("bdev_set_qos_limit", "device limit"), ("iscsi_target_node_set_qos_limit", "initiator limit"), ("iscsi_portal_group_set_auth", "discovery CHAP")] {
        assert!(before.to_string().contains(m), "save_config has no {what}: {before}");
    }
    for args in [&["--dry-run"][..], &[], &["--force"]] {
        let out = apply(&riser, &before, args);
        assert_eq!(out.code(), Some(0), "{out:?}");
        assert_eq!(out.stdout.trim(), "nothing to change", "{out:?}");
    }
    assert_eq!(save_config(&riser), before, "nothing changed");
    // Usage: no such file (2), --help explains.
    assert_eq!(riser.rpc(&["apply", "/nonexistent/apply.json"]).code(), Some(2));
    let help = riser.rpc(&["apply", "--help"]);
    assert!(help.stdout.contains("--dry-run") && help.stdout.contains("--force") && help.stdout.contains("save_config"), "{help:?}");
}

#[test]
fn a_changed_file_is_applied_as_planned_and_save_config_then_equals_it() {
    let port = free_port();
    let riser = setup(port);
    let mut live = session(&riser, port, "iqn.2016-06.io.riser:t1");
    let mut want = save_config(&riser);
    // A device added (and exported as LUN 2 of t1), M0 grown, the initiator group changed,
    // and a target t2 on a new device.
    calls(&mut want, "bdev").push(json!({"method": "bdev_null_create", "params": {"name": "Null1", "num_blocks": 4096, "block_size": 512, "uuid": "6f3a1c2e-0000-4000-8000-000000000001"}}));
    calls(&mut want, "bdev").push(json!({"method": "bdev_malloc_create", "params": {"name": "M2", "num_blocks": 2048, "block_size": 512, "uuid": "6f3a1c2e-0000-4000-8000-000000000002"}}));
    params(&mut want, "bdev", "bdev_malloc_create", "name", json!("M0"))["num_blocks"] = json!(32768);
    let ig = params(&mut want, "iscsi", "iscsi_create_initiator_group", "tag", json!(1));
    ig["initiators"] = json!(["ANY", "iqn.2000-01.com.example:other"]);
    ig["netmasks"] = json!(["127.0.0.0/8"]);
    let t1 = params(&mut want, "iscsi", "iscsi_create_target_node", "name", json!("iqn.2016-06.io.riser:t1"));
    let mut t2 = t1.clone();
    t1["luns"].as_array_mut().expect("luns").push(json!({"bdev_name": "Null1", "lun_id": 2}));
    t2["name"] = json!("iqn.2016-06.io.riser:t2");
    t2["alias_name"] = json!("t2");
    t2["luns"] = json!([{"bdev_name": "M2", "lun_id": 0}]);
    calls(&mut want, "iscsi").push(json!({"method": "iscsi_create_target_node", "params": t2}));
    // And a rate limit on the new device (set once it exists).
    calls(&mut want, "bdev").push(json!({"method": "bdev_set_qos_limit", "params": {"name": "M2", "rw_ios_per_sec": 5000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0}}));

    let before = save_config(&riser);
    let dry = apply(&riser, &want, &["--dry-run"]);
    assert_eq!(dry.code(), Some(0), "{dry:?}");
    assert!(dry.stdout.contains("dry run: nothing changed"), "{dry:?}");
    assert_eq!(save_config(&riser), before, "--dry-run changes nothing");
    let planned = plan_lines(&dry.stdout);
    assert_eq!(planned.len(), 8, "{}", dry.stdout);
    assert!(dry.stdout.contains(&format!("affects {INITIATOR}")), "the resize and LUN add name the session: {}", dry.stdout);

    let out = apply(&riser, &want, &[]);
    assert_eq!(out.code(), Some(0), "{out:?}\n{}", riser.log());
    assert_eq!(done_lines(&out.stdout), planned, "what was done is what --dry-run printed");
    assert_eq!(normalized(&save_config(&riser)), normalized(&want), "save_config equals the file, modulo ordering");
    assert_eq!(apply(&riser, &want, &[]).stdout.trim(), "nothing to change");

    // The session was kept: it sees the changes as unit attentions, then works, LUN 2 too.
    assert!(live.clear_unit_attentions(), "the session on t1 survived");
    for _ in 0..4 {
        if write_lun(&mut live, 2, 0) == Some(0) {
            break;
        }
    }
    assert_eq!(write_lun(&mut live, 2, 8), Some(0), "LUN 2 (the new Null1) takes writes");
    let _t2 = session(&riser, port, "iqn.2016-06.io.riser:t2");
}

#[test]
fn removing_a_lun_with_io_running_needs_force() {
    let port = free_port();
    let riser = setup(port);
    let mut c = session(&riser, port, "iqn.2016-06.io.riser:t1");
    // LUN 1's own unit attention (power on) first.
    assert!((0..8).any(|_| write_lun(&mut c, 1, 0) == Some(0)), "LUN 1 never took a write");
    // Writes to LUN 1 until one fails (the LUN is gone) or the test says stop.
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let (s, w) = (stop.clone(), writes.clone());
    let io = thread::spawn(move || {
        let mut lba = 0u32;
        loop {
            let status = write_lun(&mut c, 1, lba);
            if status != Some(0) || s.load(Ordering::Relaxed) {
                return (c, status);
            }
            w.fetch_add(1, Ordering::Relaxed);
            lba = (lba + 8) % 8192;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while writes.load(Ordering::Relaxed) < 10 {
        assert!(Instant::now() < deadline && !io.is_finished(), "I/O to LUN 1 does not run");
        thread::sleep(Duration::from_millis(10));
    }
    let before = save_config(&riser);
    let mut want = before.clone();
    let t1 = params(&mut want, "iscsi", "iscsi_create_target_node", "name", json!("iqn.2016-06.io.riser:t1"));
    t1["luns"].as_array_mut().expect("luns").retain(|l| l["lun_id"] != 1);
    calls(&mut want, "bdev").retain(|c| c["params"]["name"] != "M0");

    let refused = apply(&riser, &want, &[]);
    assert_eq!(refused.code(), Some(1), "{refused:?}");
    assert!(refused.stderr.contains("--force") && refused.stderr.contains(INITIATOR), "names the session: {refused:?}");
    assert!(refused.stderr.contains("LUN 1 of iqn.2016-06.io.riser:t1"), "{refused:?}");
    assert_eq!(save_config(&riser), before, "refused: nothing changed");
    let n = writes.load(Ordering::Relaxed);
    thread::sleep(Duration::from_millis(200));
    assert!(writes.load(Ordering::Relaxed) > n && !io.is_finished(), "I/O went on");

    let out = apply(&riser, &want, &["--force"]);
    assert_eq!(out.code(), Some(0), "{out:?}\n{}", riser.log());
    let done = done_lines(&out.stdout);
    assert_eq!(done.len(), 2, "{out:?}");
    assert!(done[0].contains("iscsi_target_node_remove_lun") && done[1].contains("bdev_malloc_delete"), "LUN first: {done:?}");
    assert_eq!(normalized(&save_config(&riser)), normalized(&want));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !io.is_finished() {
        if Instant::now() > deadline {
            stop.store(true, Ordering::Relaxed);
        }
        thread::sleep(Duration::from_millis(10));
    }
    let (mut c, status) = io.join().expect("the I/O thread");
    assert_eq!(status, Some(2), "writes to the removed LUN end with CHECK CONDITION, the connection kept");
    assert!(c.clear_unit_attentions(), "the session goes on with LUN 0");

    // Deleting the target under that session: refused without --force, naming it.
    let mut gone = want.clone();
    calls(&mut gone, "iscsi").retain(|c| c["method"] != "iscsi_create_target_node");
    let refused = apply(&riser, &gone, &[]);
    assert_eq!(refused.code(), Some(1), "{refused:?}");
    assert!(refused.stderr.contains("target node iqn.2016-06.io.riser:t1") && refused.stderr.contains(INITIATOR), "{refused:?}");
    assert!(c.clear_unit_attentions(), "the session is still there");
}
