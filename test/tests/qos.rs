//! Quality of service on the real riser, two reactors, riser-perf over iSCSI/TCP: a device's
//! I/O and byte limits (`bdev_set_qos_limit`, set by SPDK's own rpc.py and by riser-rpc) hold
//! within 10 % over 5 s at QD 32 on two sessions, reads and writes, with no I/O failed; the
//! throttled time shows in `bdev_get_iostat` and the Prometheus metrics; `save_config` keeps
//! the limits across a restart. Per initiator (riser's extension): a limit on one initiator
//! leaves another's I/O on the same LUN untouched.

use std::io::{Read, Write};
use std::process::Command;

use riser_tests::{bin, free_port, spdk_rpc_py, Riser, TempDir};
use serde_json::{json, Value};

/// The limits, well below what this machine does on a null device.
const IOPS: u64 = 2000;
const MIBPS: u64 = 20;
const SECONDS: u64 = 5;

/// riser-perf's `--json` report, with its initiator name.
fn perf_json(initiator: &str, args: &[&str]) -> Value {
    let out = Command::new(bin("riser-perf"))
        .args(["--no-pin", "-m", "0x1", "--login-timeout", "10", "--json", "--initiator-name", initiator])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("riser-perf runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "riser-perf {args:?}:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let start = stdout.find("\n{").map(|i| i + 1).or_else(|| stdout.starts_with('{').then_some(0));
    let start = start.unwrap_or_else(|| panic!("no JSON report:\n{stdout}"));
    serde_json::from_str(&stdout[start..]).unwrap_or_else(|e| panic!("riser-perf's report: {e}\n{stdout}"))
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no number {k:?} in {v}"))
}

/// Two sessions at QD 32, reads and writes mixed, for [`SECONDS`]: (I/Os per second, MiB per
/// second, reads, writes). No I/O may fail.
fn load(initiator: &str, url: &str, bs: &str) -> (f64, f64, u64, u64) {
    let t = SECONDS.to_string();
    let r = perf_json(initiator, &["--sessions", "2", "--qd", "32", "--rw", "randrw", "--rwmixread", "50", "--bs", bs, "--time", &t, "--ramp", "1", url]);
    let total = &r["total"];
    assert_eq!(u(total, "errors"), 0, "no I/O fails while throttled: {r}");
    let (reads, writes) = (u(total, "reads"), u(total, "writes"));
    let bs: u64 = bs.parse().unwrap_or(4096);
    let secs = SECONDS as f64;
    ((reads + writes) as f64 / secs, ((reads + writes) * bs) as f64 / secs / 1048576.0, reads, writes)
}

/// As [`load`], one direction (`randread`, `randwrite`), 16 KiB I/Os: (I/Os, MiB per second).
fn load_rw(initiator: &str, url: &str, rw: &str) -> (f64, f64) {
    let t = SECONDS.to_string();
    let r = perf_json(initiator, &["--sessions", "2", "--qd", "32", "--rw", rw, "--bs", "16384", "--time", &t, "--ramp", "1", url]);
    let total = &r["total"];
    assert_eq!(u(total, "errors"), 0, "no I/O fails while throttled: {r}");
    let n = u(total, "reads") + u(total, "writes");
    (n as f64 / SECONDS as f64, (n * 16384) as f64 / SECONDS as f64 / 1048576.0)
}

fn within_10pct(got: f64, limit: u64, what: &str) {
    println!("{what}: {got:.1} measured, limit {limit}");
    assert!((got - limit as f64).abs() <= limit as f64 * 0.10, "{what}: {got:.1} is not within 10 % of the limit {limit}");
}

/// riser on two reactors with a 1 GiB null device as LUN 0 of a target; (riser, url).
fn null_target(extra: &[&str]) -> (Riser, String, u16) {
    let mut args = vec!["-m", "0x3"];
    args.extend(extra);
    let riser = Riser::start_with(&args);
    riser.call("bdev_null_create", Some(json!({"name": "Null0", "num_blocks": 262144, "block_size": 4096}))).unwrap();
    let port = free_port();
    let iqn = riser.add_iscsi_target_on("qos", port, vec![json!({"bdev_name": "Null0", "lun_id": 0})]);
    (riser, format!("iscsi://127.0.0.1:{port}/{iqn}/0"), port)
}

fn rpc_py(riser: &Riser, dir: &TempDir) -> impl Fn(&[&str]) -> (bool, String) {
    let script = spdk_rpc_py(dir);
    let sock = riser.socket().to_string_lossy().to_string();
    move |args: &[&str]| {
        let out = Command::new("python3").arg(&script).args(["-s", &sock]).args(args).output().expect("python3");
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics port");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    text
}

#[test]
fn device_limits_hold_on_two_reactors_and_survive_a_restart() {
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let (riser, url, _) = null_target(&["--metrics", &maddr]);
    let ctx = || format!("riser log:\n{}", riser.log());

    // SPDK's rpc.py sets the I/O limit, unchanged; riser refuses what SPDK refuses.
    let dir = TempDir::new("spdk");
    let py = rpc_py(&riser, &dir);
    let (ok, text) = py(&["bdev_set_qos_limit", "Null0", "--rw_ios_per_sec", &IOPS.to_string()]);
    assert!(ok, "rpc.py bdev_set_qos_limit: {text}\n{}", ctx());
    let (ok, text) = py(&["bdev_set_qos_limit", "Null0", "--rw_ios_per_sec", "1500"]);
    assert!(!ok && text.contains("multiple of 1000"), "rpc.py shows the refusal: {text}");
    let (ok, text) = py(&["bdev_set_qos_limit", "Nope", "--rw_ios_per_sec", "1000"]);
    assert!(!ok && text.contains("not found"), "{text}");
    let b = riser.rpc_json(&["bdev_get_bdevs", "-b", "Null0"]);
    assert_eq!(
        b[0]["assigned_rate_limits"],
        json!({"rw_ios_per_sec": IOPS, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0}),
        "{b}"
    );

    let (iops, _, reads, writes) = load("iqn.2016-06.io.riser:host-a", &url, "4096");
    within_10pct(iops, IOPS, "I/Os per second under rw_ios_per_sec");
    assert!(reads > 0 && writes > 0, "reads and writes both ran: {reads} {writes}");
    let per = riser.rpc_json(&["bdev_get_iostat", "-b", "Null0", "-c"]);
    let chans = per["channels"].as_array().map_or(0, |c| c.len());
    assert_eq!(chans, 2, "the two sessions ran on two reactors: {per}");
    let s = riser.rpc_json(&["bdev_get_iostat", "-b", "Null0"]);
    let throttled = u(&s["bdevs"][0], "qos_throttled_ticks");
    assert!(throttled > 0 && u(&s["bdevs"][0], "qos_throttled_ios") > 0, "throttled time is counted: {s}");
    let m = scrape(mport);
    let line = m.lines().find(|l| l.starts_with("riser_bdev_qos_throttled_seconds_total{bdev=\"Null0\"}"));
    let secs: f64 = line.and_then(|l| l.split(' ').nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(secs > 0.0, "the metrics show the throttled time: {line:?}\n{m}");

    // The byte limit through riser-rpc, with the I/O limit removed (0).
    let out = riser.rpc(&["bdev_set_qos_limit", "-b", "Null0", "--rw-ios-per-sec", "0", "--rw-mbytes-per-sec", &MIBPS.to_string()]);
    assert_eq!(out.json(), json!(true), "{out:?}");
    let (iops, mibps, _, _) = load("iqn.2016-06.io.riser:host-a", &url, "16384");
    within_10pct(mibps, MIBPS, "MiB per second under rw_mbytes_per_sec");
    assert!(iops > IOPS as f64 * 0.5, "no I/O limit left: {iops:.0} I/Os per second");

    // Reads count against r_mbytes_per_sec, writes against w_mbytes_per_sec (and not the
    // other way): reads alone at the read limit, writes alone unhindered by it.
    riser.rpc(&["bdev_set_qos_limit", "-b", "Null0", "--rw-mbytes-per-sec", "0", "--r-mbytes-per-sec", "10", "--w-mbytes-per-sec", "40"]);
    let (_, mibps) = load_rw("iqn.2016-06.io.riser:host-a", &url, "randread");
    within_10pct(mibps, 10, "MiB per second read under r_mbytes_per_sec");
    let (_, mibps) = load_rw("iqn.2016-06.io.riser:host-a", &url, "randwrite");
    within_10pct(mibps, 40, "MiB per second written under w_mbytes_per_sec");

    // save_config writes the limits; a restart from it keeps them.
    let keep = TempDir::new("qos-config");
    let cfg = keep.join("saved.json");
    let out = riser.rpc(&["save_config", "-o", cfg.to_str().expect("UTF-8")]);
    assert!(out.status.success(), "{out:?}");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).expect("saved")).expect("JSON");
    let calls = saved["subsystems"].as_array().and_then(|s| s.iter().find(|s| s["subsystem"] == "bdev")).map(|s| s["config"].clone());
    let calls = calls.unwrap_or_else(|| panic!("{saved}"));
    let want = json!({"method": "bdev_set_qos_limit", "params": {"name": "Null0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 10, "w_mbytes_per_sec": 40}});
    assert!(calls.as_array().is_some_and(|c| c.contains(&want)), "{calls}");
    drop(riser);
    let again = Riser::start_with(&["-m", "0x3", "--json", cfg.to_str().expect("UTF-8")]);
    let b = again.rpc_json(&["bdev_get_bdevs", "-b", "Null0"]);
    assert_eq!(b[0]["assigned_rate_limits"], want["params"].as_object().map(|o| { let mut o = o.clone(); o.remove("name"); Value::Object(o) }).unwrap_or_default(), "{b}");
}

#[test]
fn a_limit_on_one_initiator_leaves_another_untouched() {
    let (riser, url, _) = null_target(&[]);
    let iqn = "iqn.2016-06.io.riser:qos";
    let (noisy, quiet) = ("iqn.2016-06.io.riser:noisy-host", "iqn.2016-06.io.riser:quiet-host");
    let out = riser.rpc(&["iscsi_target_node_set_qos_limit", iqn, noisy, "-l", "0", "--rw-ios-per-sec", &IOPS.to_string()]);
    assert_eq!(out.json(), json!(true), "{out:?}");
    let bad = riser.rpc(&["iscsi_target_node_set_qos_limit", iqn, noisy, "-l", "7", "--rw-ios-per-sec", "1000"]);
    assert!(!bad.status.success(), "no LUN 7: {bad:?}");
    let bad = riser.rpc(&["iscsi_target_node_set_qos_limit", iqn, noisy, "--rw-ios-per-sec", "999"]);
    assert!(!bad.status.success(), "SPDK's rule: {bad:?}");

    // Both at once: the noisy host at its limit, the quiet one far above it.
    let u2 = url.clone();
    let a = std::thread::spawn(move || load(noisy, &u2, "4096"));
    let t = SECONDS.to_string();
    let b = perf_json(quiet, &["--qd", "32", "--rw", "randrw", "--rwmixread", "50", "--time", &t, "--ramp", "1", &url]);
    let (iops_a, _, _, _) = a.join().expect("the noisy host's run");
    assert_eq!(u(&b["total"], "errors"), 0, "{b}");
    let iops_b = (u(&b["total"], "reads") + u(&b["total"], "writes")) as f64 / SECONDS as f64;
    within_10pct(iops_a, IOPS, "the limited initiator's I/Os per second");
    println!("the other initiator, on the same LUN at the same time: {iops_b:.0} I/Os per second");
    assert!(iops_b > 3.0 * IOPS as f64, "the other initiator is not held to the first one's limit: {iops_b:.0}");

    // Shown, with the time the limited host's I/Os waited, and saved.
    let nodes = riser.rpc_json(&["iscsi_get_target_nodes"]);
    let q = &nodes[0]["qos_limits"][0];
    assert_eq!((q["initiator_name"].as_str(), q["lun_id"].as_u64(), q["rw_ios_per_sec"].as_u64()), (Some(noisy), Some(0), Some(IOPS)), "{nodes}");
    assert!(u(q, "throttled_ios") > 0 && u(q, "throttled_ticks") > 0, "{q}");
    let saved = riser.rpc_json(&["save_config"]);
    let iscsi = saved["subsystems"].as_array().and_then(|s| s.iter().find(|s| s["subsystem"] == "iscsi")).map(|s| s["config"].clone());
    let want = json!({"method": "iscsi_target_node_set_qos_limit", "params": {"name": iqn, "initiator_name": noisy, "lun_id": 0,
        "rw_ios_per_sec": IOPS, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0}});
    assert!(iscsi.as_ref().and_then(|c| c.as_array()).is_some_and(|c| c.contains(&want)), "{iscsi:?}");

    // Removed (0): the host runs free again.
    let out = riser.rpc(&["iscsi_target_node_set_qos_limit", iqn, noisy, "--rw-ios-per-sec", "0"]);
    assert_eq!(out.json(), json!(true), "{out:?}");
    let nodes = riser.rpc_json(&["iscsi_get_target_nodes"]);
    assert!(nodes[0].get("qos_limits").is_none(), "{nodes}");
    let (iops, _, _, _) = load(noisy, &url, "4096");
    assert!(iops > 1.5 * IOPS as f64, "no limit left: {iops:.0}");
}
