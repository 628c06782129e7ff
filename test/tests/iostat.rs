//! Device statistics on the real riser: `bdev_get_iostat` counts what riser-perf did over
//! iSCSI/TCP (reads, writes, bytes within 1 %), per reactor too; latency histograms;
//! resets; SPDK's own `scripts/rpc.py` (v24.01, from ../shared/peers/spdk) parses and drives
//! the four methods; riser-rpc's subcommands; bad input gets SPDK's error codes.

use std::process::Command;

use riser_tests::{bin, free_port, rpc_code, spdk_rpc_py, Riser, TempDir};
use serde_json::{json, Value};

/// riser-perf's `--json` report (what follows its progress lines).
fn perf_json(args: &[&str]) -> Value {
    let out = Command::new(bin("riser-perf"))
        .args(["--no-pin", "-m", "0x1", "--login-timeout", "10", "--json"])
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

fn within_1pct(got: u64, want: u64, what: &str) {
    let diff = got.abs_diff(want) as f64;
    assert!(want > 0 && diff <= want as f64 * 0.01, "{what}: riser counted {got}, riser-perf did {want}");
}

/// A null LUN served on a free port; returns (riser, url).
fn null_target(name: &str) -> (Riser, String) {
    let riser = Riser::start();
    riser.call("bdev_null_create", Some(json!({"name": "Null0", "num_blocks": 16384, "block_size": 4096}))).unwrap();
    let port = free_port();
    let iqn = riser.add_iscsi_target_on(name, port, vec![json!({"bdev_name": "Null0", "lun_id": 0})]);
    (riser, format!("iscsi://127.0.0.1:{port}/{iqn}/0"))
}

#[test]
fn bdev_get_iostat_counts_what_riser_perf_did_and_spdk_rpc_py_reads_it() {
    let (riser, url) = null_target("iostat");
    let ctx = || format!("riser log:\n{}", riser.log());
    riser.rpc_json(&["bdev_enable_histogram", "Null0"]);
    let report = perf_json(&["--rw", "randrw", "--rwmixread", "70", "--qd", "16", "--bs", "8192", "--time", "2", "--ramp", "0", &url]);
    let (reads, writes) = (u(&report["total"], "reads"), u(&report["total"], "writes"));
    assert_eq!(u(&report["total"], "errors"), 0, "{report}");

    let all = riser.rpc_json(&["bdev_get_iostat"]);
    assert_eq!(u(&all, "tick_rate"), 1_000_000_000);
    assert!(u(&all, "ticks") > 0);
    let bdevs = all["bdevs"].as_array().unwrap_or_else(|| panic!("{all}"));
    assert_eq!(bdevs.len(), 1, "{all}");
    let s = &bdevs[0];
    assert_eq!(s["name"], "Null0");
    within_1pct(u(s, "num_read_ops"), reads, "reads");
    within_1pct(u(s, "num_write_ops"), writes, "writes");
    within_1pct(u(s, "bytes_read"), reads * 8192, "bytes read");
    within_1pct(u(s, "bytes_written"), writes * 8192, "bytes written");
    assert_eq!(u(s, "bytes_read"), u(s, "num_read_ops") * 8192, "{s}");
    assert_eq!(u(s, "bytes_written"), u(s, "num_write_ops") * 8192, "{s}");
    assert_eq!((u(s, "num_unmap_ops"), u(s, "queue_depth")), (0, 0), "nothing unmapped, nothing in flight: {s}");
    for k in ["read", "write"] {
        let (sum, min, max) = (u(s, &format!("{k}_latency_ticks")), u(s, &format!("min_{k}_latency_ticks")), u(s, &format!("max_{k}_latency_ticks")));
        assert!(0 < min && min <= max && max <= sum, "{k} latency ticks: {s}");
        // A null device answers in well under a millisecond on average.
        let mean_ns = sum / u(s, &format!("num_{k}_ops"));
        assert!(mean_ns < 1_000_000, "{k}: mean {mean_ns} ns: {s}");
    }

    // Per reactor: one reactor here, the same counts (the connection is gone; its counts stay).
    let per = riser.rpc_json(&["bdev_get_iostat", "-b", "Null0", "-c"]);
    assert_eq!(per["name"], "Null0");
    let chans = per["channels"].as_array().unwrap_or_else(|| panic!("{per}"));
    assert_eq!(chans.len(), 1, "{per}");
    assert_eq!(u(&chans[0], "thread_id"), 0, "reactor_0: {per}");
    assert_eq!(u(&chans[0], "num_read_ops"), u(s, "num_read_ops"), "{per}");

    // The histogram saw every I/O.
    let h = riser.rpc_json(&["bdev_get_histogram", "Null0"]);
    assert_eq!((h["name"].clone(), h["enabled"].clone()), (json!("Null0"), json!(true)), "{h}");
    within_1pct(u(&h, "count"), reads + writes, "histogram count");
    let l = &h["latency_us"];
    let f = |k: &str| l[k].as_f64().unwrap_or_else(|| panic!("no {k} in {h}"));
    assert!(f("min") > 0.0, "{h}");
    let order = ["min", "p50", "p90", "p99", "p99_9", "p99_99", "max"];
    assert!(order.windows(2).all(|w| f(w[0]) <= f(w[1])), "percentiles in order: {h}");

    // SPDK's rpc.py reads the same answer, and drives reset and histograms.
    let dir = TempDir::new("spdk");
    let rpc_py = spdk_rpc_py(&dir);
    let sock = riser.socket().to_string_lossy().to_string();
    let py = |args: &[&str]| -> String {
        let out = Command::new("python3").arg(&rpc_py).args(["-s", &sock]).args(args).output().expect("python3 runs");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "rpc.py {args:?}: {text}\n{}", ctx());
        text
    };
    let spdk: Value = serde_json::from_str(&py(&["bdev_get_iostat", "-b", "Null0"])).expect("rpc.py prints JSON");
    assert_eq!(u(&spdk["bdevs"][0], "num_read_ops"), u(s, "num_read_ops"), "{spdk}");
    assert_eq!(u(&spdk["bdevs"][0], "bytes_written"), u(s, "bytes_written"), "{spdk}");
    let spdk: Value = serde_json::from_str(&py(&["bdev_get_iostat", "-b", "Null0", "-c"])).expect("rpc.py prints JSON");
    assert_eq!(u(&spdk["channels"][0], "num_write_ops"), u(s, "num_write_ops"), "{spdk}");
    py(&["bdev_reset_iostat", "-b", "Null0", "-m", "maxmin"]);
    let s2 = &riser.rpc_json(&["bdev_get_iostat", "-b", "Null0"])["bdevs"][0];
    assert_eq!(u(s2, "num_read_ops"), u(s, "num_read_ops"), "maxmin keeps the counts: {s2}");
    assert_eq!((u(s2, "max_read_latency_ticks"), u(s2, "min_write_latency_ticks")), (0, 0), "{s2}");
    py(&["bdev_reset_iostat", "-b", "Null0"]);
    let s3 = &riser.rpc_json(&["bdev_get_iostat", "-b", "Null0"])["bdevs"][0];
    assert_eq!((u(s3, "num_read_ops"), u(s3, "bytes_written"), u(s3, "read_latency_ticks")), (0, 0, 0), "{s3}");
    py(&["bdev_enable_histogram", "-d", "Null0"]);
    let h: Value = serde_json::from_str(&py(&["bdev_get_histogram", "Null0"])).expect("rpc.py prints JSON");
    assert_eq!(h["enabled"], false, "{h}");

    // Counting starts again after a reset: sequential writes only.
    let report = perf_json(&["--rw", "write", "--qd", "4", "--bs", "4096", "--time", "1", "--ramp", "0", &url]);
    let s4 = &riser.rpc_json(&["bdev_get_iostat", "-b", "Null0"])["bdevs"][0];
    within_1pct(u(s4, "num_write_ops"), u(&report["total"], "writes"), "writes after the reset");
    assert_eq!(u(s4, "num_read_ops"), 0, "{s4}");
}

#[test]
fn statistics_methods_refuse_bad_input_with_spdk_codes() {
    let riser = Riser::start();
    riser.call("bdev_malloc_create", Some(json!({"name": "M0", "num_blocks": 2048, "block_size": 512}))).unwrap();
    let code = |m: &str, p: Value| rpc_code(&riser.call(m, Some(p)));
    assert_eq!(code("bdev_get_iostat", json!({"name": "nope"})), -19);
    assert_eq!(code("bdev_get_iostat", json!({"per_channel": true})), -32602, "per_channel needs a name");
    assert_eq!(code("bdev_get_iostat", json!({"name": "M0", "bogus": 1})), -32602);
    assert_eq!(code("bdev_reset_iostat", json!({"mode": "some"})), -32602);
    assert_eq!(code("bdev_reset_iostat", json!({"name": "nope"})), -19);
    assert_eq!(code("bdev_enable_histogram", json!({"name": "M0"})), -32602, "enable is required");
    assert_eq!(code("bdev_enable_histogram", json!({"name": "nope", "enable": true})), -19);
    assert_eq!(code("bdev_get_histogram", json!({})), -32602);
    assert_eq!(code("bdev_get_histogram", json!({"name": "nope"})), -19);
    // A device never used: zeros, histogram off, and riser still answers.
    let h = riser.rpc_json(&["bdev_get_histogram", "M0"]);
    assert_eq!(
        h,
        json!({"name": "M0", "enabled": false, "count": 0, "latency_us":
        {"min": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "p99_9": 0.0, "p99_99": 0.0, "max": 0.0}})
    );
    let s = riser.rpc_json(&["bdev_get_iostat", "-b", "M0"]);
    assert_eq!(u(&s["bdevs"][0], "num_read_ops"), 0, "{s}");
    assert_eq!(riser.rpc(&["bdev_get_iostat", "-c"]).code(), Some(2), "riser-rpc: -c needs -b");
    assert!(riser.call("spdk_get_version", None).is_ok(), "{}", riser.log());
}
