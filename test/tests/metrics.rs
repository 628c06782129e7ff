//! `riser --metrics`: a real Prometheus server (Debian's `prometheus`, installed by
//! scripts/setup.sh's test group) scrapes riser every second while riser-perf loads a null
//! LUN over iSCSI/TCP; PromQL through Prometheus' HTTP API then answers `rate()` of the read
//! counter with riser-perf's IOPS (same order of magnitude), a latency quantile from the
//! histogram buckets, the connection gauge and reactor time; every query of the sample Grafana
//! dashboard (scripts/grafana) runs. Bad HTTP requests get 404/405/400 and riser keeps serving.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use riser_tests::{bin, free_port, Riser, TempDir};
use serde_json::{json, Value};

/// One HTTP/1.1 request over a fresh connection: (status code, body).
fn http(port: u16, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect to {port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(request).expect("send");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn get(port: u16, path: &str) -> (u16, String) {
    http(port, format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server with its own config and data directory, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: riser\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus ({e}): scripts/setup.sh test installs Debian's prometheus"));
        let p = Prometheus { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() && get(port, "/-/ready").0 == 200 {
                return p;
            }
            assert!(Instant::now() < deadline, "prometheus not ready in 60 s:\n{}", p.log());
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// An instant PromQL query (at `time`, Unix seconds, if given): the result vector.
    fn query(&self, q: &str, time: Option<f64>) -> Vec<Value> {
        let mut path = format!("/api/v1/query?query={}", percent_encode(q));
        if let Some(t) = time {
            path.push_str(&format!("&time={t:.3}"));
        }
        let (status, body) = get(self.port, &path);
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{q}: HTTP {status}: {e}: {body}"));
        assert_eq!(v["status"], "success", "{q}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The value of a query's only sample.
    fn value(&self, q: &str, time: Option<f64>) -> f64 {
        let r = self.query(q, time);
        assert_eq!(r.len(), 1, "{q}: one series expected: {r:?}\nprometheus log:\n{}", self.log());
        r[0]["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{q}: {r:?}"))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

#[test]
fn prometheus_scrapes_riser_under_load_and_rate_matches_riser_perf() {
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let riser = Riser::start_with(&["--metrics", &maddr]);
    let ctx = || format!("riser log:\n{}", riser.log());
    riser.call("bdev_null_create", Some(json!({"name": "Null0", "num_blocks": 262144, "block_size": 4096}))).unwrap();
    let port = free_port();
    let iqn = riser.add_iscsi_target_on("metrics", port, vec![json!({"bdev_name": "Null0", "lun_id": 0})]);
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");

    // The exposition itself, and bad requests.
    let (status, body) = get(mport, "/metrics");
    assert_eq!(status, 200, "{body}\n{}", ctx());
    for name in [
        "riser_bdev_ops_total{bdev=\"Null0\",op=\"read\"} 0",
        "riser_bdev_latency_seconds_bucket{le=\"+Inf\",bdev=\"Null0\",op=\"read\"} 0",
        "riser_reactor_busy_seconds_total{reactor=\"0\",core=\"0\"}",
        "riser_iscsi_login_failures_total{reason=\"authentication\"} 0",
        "riser_iscsi_payload_copied_bytes_total{direction=\"read\"}",
        "riser_iobuf_budget_bytes ",
        "# EOF",
    ] {
        assert!(body.contains(name), "no {name:?} in:\n{body}");
    }
    assert_eq!(get(mport, "/").0, 404);
    assert_eq!(get(mport, "/metricsx").0, 404);
    assert_eq!(http(mport, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").0, 405);
    assert_eq!(http(mport, b"garbage\r\n\r\n").0, 400);
    assert_eq!(http(mport, &[0xffu8; 9000]).0, 400, "an endless head is cut off");
    {
        // Clients that connect and say nothing do not hold up the next scrape.
        let _idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(("127.0.0.1", mport)).expect("connect")).collect();
        let t = Instant::now();
        assert_eq!(get(mport, "/metrics").0, 200);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    let prom = Prometheus::start(&maddr);
    let deadline = Instant::now() + Duration::from_secs(30);
    while prom.query("up{job=\"riser\"} == 1", None).is_empty() {
        assert!(Instant::now() < deadline, "prometheus never scraped riser up:\n{}\n{}", prom.log(), ctx());
        thread::sleep(Duration::from_millis(250));
    }

    let start = now();
    let out = Command::new(bin("riser-perf"))
        .args(["--no-pin", "-m", "0x1", "--login-timeout", "10", "--json"])
        .args(["--rw", "randread", "--qd", "32", "--bs", "4096", "--time", "6", "--ramp", "0", &url])
        .env("RUST_LOG", "warn")
        .output()
        .expect("riser-perf runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "riser-perf: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let start_json = stdout.find("\n{").map(|i| i + 1).or_else(|| stdout.starts_with('{').then_some(0));
    let report: Value = start_json.and_then(|i| serde_json::from_str(&stdout[i..]).ok()).unwrap_or_else(|| panic!("no JSON report:\n{stdout}"));
    let iops = report["total"]["iops"].as_f64().unwrap_or_else(|| panic!("{report}"));
    assert!(iops > 1000.0, "{report}");
    // Let the last scrape of the load land.
    thread::sleep(Duration::from_secs(2));

    // In the middle of the load (its 1 s ramp-up and the login are behind it).
    let t = start + 4.5;
    let rate = prom.value("rate(riser_bdev_ops_total{job=\"riser\",bdev=\"Null0\",op=\"read\"}[3s])", Some(t));
    eprintln!("riser-perf: {iops:.0} IOPS; Prometheus: rate {rate:.0}/s");
    assert!(rate > iops / 3.0 && rate < iops * 3.0, "rate {rate} vs riser-perf {iops} IOPS\n{}", prom.log());
    let bytes = prom.value("rate(riser_bdev_bytes_total{bdev=\"Null0\",op=\"read\"}[3s])", Some(t));
    assert!((bytes / rate - 4096.0).abs() < 1.0, "{bytes} B/s for {rate} reads/s");
    let p50 = prom.value("histogram_quantile(0.5, rate(riser_bdev_latency_seconds_bucket{bdev=\"Null0\",op=\"read\"}[3s]))", Some(t));
    assert!(p50 > 0.0 && p50 < 0.01, "median read latency {p50} s");
    let conns = prom.value("riser_iscsi_connections{target=\"iqn.2016-06.io.riser:metrics\",transport=\"tcp\"}", Some(t));
    assert_eq!(conns, 1.0);
    assert_eq!(prom.value("riser_iscsi_sessions{target=\"iqn.2016-06.io.riser:metrics\"}", Some(t)), 1.0);
    let busy = prom.value("rate(riser_reactor_busy_seconds_total{reactor=\"0\"}[3s])", Some(t));
    let idle = prom.value("rate(riser_reactor_idle_seconds_total{reactor=\"0\"}[3s])", Some(t));
    assert!(busy > 0.0 && (busy + idle - 1.0).abs() < 0.3, "busy {busy} + idle {idle} seconds per second");
    assert!(prom.value("riser_iscsi_logins_total", None) >= 1.0);
    assert_eq!(prom.query("riser_iscsi_connections", None).len(), 0, "the connection is gone after riser-perf");
    assert_eq!(get(mport, "/metrics").0, 200, "{}", ctx());

    // Every query of the sample Grafana dashboard is valid PromQL and finds series.
    let dash = std::fs::read_to_string(riser_tests::workspace_root().join("scripts/grafana/riser-dashboard.json")).expect("dashboard");
    let dash: Value = serde_json::from_str(&dash).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    for target in panels.iter().flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default()) {
        let expr = target["expr"].as_str().expect("expr").replace("$instance", ".*").replace("$__rate_interval", "3s");
        let found = prom.query(&expr, Some(t));
        let optional = expr.contains("login_failures") || expr.contains("copied");
        assert!(optional || !found.is_empty(), "dashboard query {expr} found nothing");
    }
}

/// Whether the server has closed `s` (EOF or reset) within `within`; what it sent before
/// is skipped.
fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left.min(Duration::from_millis(200)))).expect("timeout");
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
}

/// Slow clients do not keep scrapes out (issue #22, item 12): a client that sends its
/// request one byte a second is cut at the request deadline (5 s from accept, however
/// often it sends), not kept for ever; while it dawdles, and while more such clients than
/// the server serves at once hold it, a normal scrape is answered at once.
#[test]
fn slow_clients_are_cut_at_the_request_deadline_and_do_not_block_scrapes() {
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let riser = Riser::start_with(&["--metrics", &maddr]);
    assert_eq!(get(mport, "/metrics").0, 200, "riser log:\n{}", riser.log());

    // One slow-loris: a byte a second, a head that never ends.
    let t0 = Instant::now();
    let mut slow = TcpStream::connect(("127.0.0.1", mport)).expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ").expect("send");
    let slow_thread = thread::spawn(move || {
        let t0 = Instant::now();
        loop {
            if slow.write_all(b"a").is_err() {
                return Some(t0.elapsed());
            }
            if closed_by_server(&mut slow, Duration::from_secs(1)) {
                return Some(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(15) {
                return None;
            }
        }
    });
    thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    assert_eq!(get(mport, "/metrics").0, 200, "a scrape while a slow client dawdles");
    assert!(t.elapsed() < Duration::from_secs(2), "scrape took {:?}", t.elapsed());
    let cut = slow_thread.join().expect("slow client");
    let cut = cut.unwrap_or_else(|| panic!("a client sending a byte a second was still connected after 15 s ({:?})", t0.elapsed()));
    assert!(cut >= Duration::from_secs(3) && cut < Duration::from_secs(9), "the slow client was cut after {cut:?}, not at the 5 s deadline");

    // More slow clients than requests served at once (each sent part of a head), then a
    // scrape: answered at once, at the expense of the oldest slow one.
    let mut lorises: Vec<TcpStream> = (0..12)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", mport)).expect("connect");
            s.write_all(b"GET /metrics HTTP/1.1\r\n").expect("send");
            s
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let (status, body) = get(mport, "/metrics");
    assert_eq!(status, 200, "a scrape while 12 slow clients hold the server: {body}");
    assert!(body.contains("# EOF") && t.elapsed() < Duration::from_secs(2), "scrape took {:?}", t.elapsed());
    // And every slow one is gone by its deadline.
    for (i, s) in lorises.iter_mut().enumerate() {
        assert!(closed_by_server(s, Duration::from_secs(8)), "slow client {i} still connected after its deadline");
    }
    assert_eq!(get(mport, "/metrics").0, 200, "riser log:\n{}", riser.log());
}
