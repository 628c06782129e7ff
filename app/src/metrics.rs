//! `riser --metrics ADDR:PORT`: Prometheus metrics at `/metrics` (OpenMetrics text, the
//! `prometheus-client` crate). Every scrape reads the same counters the RPCs show, at that
//! moment: per-device operations, bytes, errors, queue depth and latency histograms; per-reactor
//! busy and idle time; sessions and connections per target and transport; logins and login
//! failures by reason; payload copies; the I/O buffer pool. A small HTTP/1.1 server on its
//! own thread answers one request per connection (at most [`MAX_ACTIVE`] at once, each
//! within [`REQUEST_DEADLINE`] from accept to the last byte of the answer, a new connection
//! cutting the oldest when all are taken, so slow clients cannot keep a scrape out);
//! anything but `GET /metrics` gets 404, 405 or 400.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::net::Shutdown;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use riser_bdev::stats::{kind_name, lat_bucket_le_seconds, KINDS, LAT_BUCKETS};
use riser_buf::Pool;

use crate::App;

/// The longest request head read (a scrape's is a few hundred bytes).
const MAX_REQUEST: usize = 8192;
/// Requests served at once; a connection beyond them cuts the oldest request short.
const MAX_ACTIVE: usize = 8;
/// How long a request may take in all, from accept to the last byte of the answer: a
/// client that sends its request a byte at a time, or never reads the answer, is cut off
/// then (a deadline per read or write would let it go on for ever, a byte at a time). A
/// scrape on the same host takes milliseconds; Prometheus' default scrape timeout is 10 s.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// The requests being served: (id, accepted at, a handle on the connection to cut it).
type Active = Arc<Mutex<Vec<(u64, Instant, TcpStream)>>>;

/// Binds `addr` and serves `/metrics` on a thread of its own.
pub fn start(addr: &str, app: Arc<App>) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("--metrics {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| format!("--metrics {addr}: {e}"))?;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(RiserCollector { app }));
    let registry = Arc::new(registry);
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let active: Active = Arc::default();
            for (id, conn) in (0u64..).zip(listener.incoming()) {
                let s = match conn {
                    Ok(s) => s,
                    Err(e) => {
                        log::warn!("metrics: accept: {e}");
                        continue;
                    }
                };
                let accepted = Instant::now();
                let handle = match s.try_clone() {
                    Ok(h) => h,
                    Err(e) => {
                        log::warn!("metrics: {e}");
                        continue;
                    }
                };
                admit(&active, id, accepted, handle);
                let (registry, done) = (registry.clone(), active.clone());
                let spawned = std::thread::Builder::new().name("metrics-req".into()).spawn(move || {
                    if let Err(e) = serve(s, &registry, accepted + REQUEST_DEADLINE) {
                        log::debug!("metrics: {e}");
                    }
                    lock(&done).retain(|(i, _, _)| *i != id);
                });
                if let Err(e) = spawned {
                    lock(&active).retain(|(i, _, _)| *i != id);
                    log::warn!("metrics: cannot start a request thread: {e}");
                }
            }
        })
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    log::info!("Prometheus metrics on http://{local}/metrics");
    Ok(local)
}

fn lock(active: &Active) -> std::sync::MutexGuard<'_, Vec<(u64, Instant, TcpStream)>> {
    active.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts a new request in; when MAX_ACTIVE are in progress the oldest is cut short (its
/// socket shut down, so its thread's read or write fails at once): clients that dawdle can
/// delay a scrape by no more than it takes to serve it, and each goes at its deadline
/// anyway.
fn admit(active: &Active, id: u64, accepted: Instant, handle: TcpStream) {
    let mut a = lock(active);
    if a.len() >= MAX_ACTIVE {
        if let Some(i) = a.iter().enumerate().min_by_key(|(_, (_, t, _))| *t).map(|(i, _)| i) {
            let (_, t, old) = a.swap_remove(i);
            log::debug!("metrics: {MAX_ACTIVE} requests in progress; cutting the oldest ({} ms old)", t.elapsed().as_millis());
            let _ = old.shutdown(Shutdown::Both);
        }
    }
    a.push((id, accepted, handle));
}

/// The time left before `deadline`, or a TimedOut error once it has passed.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "request deadline passed"));
    }
    Ok(left)
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Metrics,
    NotFound,
    BadMethod,
    Bad,
}

/// Parses a request head (up to the blank line).
fn parse_request(head: &[u8]) -> Request {
    let Ok(text) = std::str::from_utf8(head) else {
        return Request::Bad;
    };
    let Some(line) = text.lines().next() else {
        return Request::Bad;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Request::Bad;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Request::Bad;
    }
    if method != "GET" && method != "HEAD" {
        return Request::BadMethod;
    }
    let path = target.split('?').next().unwrap_or(target);
    if path == "/metrics" {
        Request::Metrics
    } else {
        Request::NotFound
    }
}

/// Reads one request and answers it, all before `deadline`: every read and write waits at
/// most for the time left.
fn serve(mut s: TcpStream, registry: &Registry, deadline: Instant) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let complete = loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break true;
        }
        if head.len() >= MAX_REQUEST {
            break false;
        }
        s.set_read_timeout(Some(left(deadline)?))?;
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "request not received within the deadline"))
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            break false;
        }
        head.extend_from_slice(&buf[..n]);
    };
    let head_only = head.starts_with(b"HEAD ");
    let req = if complete { parse_request(&head) } else { Request::Bad };
    let (status, ctype, body) = match req {
        Request::Metrics => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", body),
                Err(_) => ("500 Internal Server Error", "text/plain", "encoding failed\n".into()),
            }
        }
        Request::NotFound => ("404 Not Found", "text/plain", "riser serves /metrics only\n".into()),
        Request::BadMethod => ("405 Method Not Allowed", "text/plain", "use GET\n".into()),
        Request::Bad => ("400 Bad Request", "text/plain", "bad request\n".into()),
    };
    let mut out = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    if req == Request::BadMethod {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(&body);
    }
    let mut out = out.as_bytes();
    while !out.is_empty() {
        s.set_write_timeout(Some(left(deadline)?))?;
        match s.write(out) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => out = &out[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "answer not taken within the deadline"))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads everything at scrape time.
struct RiserCollector {
    app: Arc<App>,
}

impl fmt::Debug for RiserCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RiserCollector")
    }
}

type Labels = Vec<(&'static str, String)>;

/// One metric family: a descriptor and one sample per label set.
fn counters(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, samples: &[(Labels, u64)]) -> fmt::Result {
    let mut d = e.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (labels, v) in samples {
        ConstCounter::new(*v).encode(d.encode_family(labels)?)?;
    }
    Ok(())
}

fn counters_f64(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, samples: &[(Labels, f64)]) -> fmt::Result {
    let mut d = e.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (labels, v) in samples {
        ConstCounter::new(*v).encode(d.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauges(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, samples: &[(Labels, i64)]) -> fmt::Result {
    let mut d = e.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, v) in samples {
        ConstGauge::new(*v).encode(d.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, v: i64) -> fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?)
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

impl prometheus_client::collector::Collector for RiserCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        self.bdevs(&mut e)?;
        self.reactors(&mut e)?;
        self.iscsi(&mut e)?;
        alua(&mut e, &self.app.server.target().target_nodes())?;
        self.iobuf(&mut e)
    }
}

/// The ALUA view of every target node (issue 23): each target port group's effective state
/// (one sample per state, 1 for the group's, as a state set), and the gateways of each
/// device's group by state, as this gateway sees them (with whether it is fenced itself).
fn alua(e: &mut DescriptorEncoder, nodes: &[Arc<riser_config::TargetNode>]) -> fmt::Result {
    let (states, members, fenced) = alua_samples(nodes);
    gauges(e, "riser_alua_group_state", "Effective asymmetric access state of a target port group (1 for its state)", None, &states)?;
    gauges(e, "riser_gateway_members", "Gateways of a device's group by state, as this gateway sees them", None, &members)?;
    gauges(e, "riser_gateway_self_fenced", "Whether this gateway is fenced from a device's group", None, &fenced)
}

type Samples = Vec<(Labels, i64)>;

fn alua_samples(nodes: &[Arc<riser_config::TargetNode>]) -> (Samples, Samples, Samples) {
    let (mut states, mut members, mut fenced) = (Vec::new(), Vec::new(), Vec::new());
    for n in nodes {
        let views = n.gateway_views();
        // Groups described or changed by liveness, and, on a node with gateways, its local
        // groups (active/optimized unless said otherwise).
        let mut groups: Vec<(u16, riser_scsi::AccessState)> = n.alua().view().iter().map(|g| (g.group.id, g.effective)).collect();
        if !views.is_empty() {
            for id in n.local_tpgs().into_iter().filter_map(|t| u16::try_from(t).ok()) {
                if !groups.iter().any(|(g, _)| *g == id) {
                    groups.push((id, riser_scsi::AccessState::ActiveOptimized));
                }
            }
            groups.sort_by_key(|(id, _)| *id);
        }
        for (id, effective) in groups {
            for s in riser_scsi::AccessState::ALL {
                let labels = vec![("target", n.name().to_string()), ("tpg_id", id.to_string()), ("state", s.name().to_string())];
                states.push((labels, i64::from(effective == s)));
            }
        }
        for v in views {
            let labels = |extra: Option<&str>| {
                let mut l = vec![("target", n.name().to_string()), ("bdev", v.bdev_name.clone())];
                if let Some(s) = extra {
                    l.push(("state", s.to_string()));
                }
                l
            };
            for (name, st) in [("live", riser_bdev::MemberState::Live), ("fenced", riser_bdev::MemberState::Fenced)] {
                members.push((labels(Some(name)), v.members.iter().filter(|m| m.state == st).count() as i64));
            }
            fenced.push((labels(None), i64::from(v.fenced)));
        }
    }
    (states, members, fenced)
}

impl RiserCollector {
    fn bdevs(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let snaps: Vec<(String, riser_bdev::IoStat, u64)> =
            self.app.bdevs().iter_stats().map(|(b, s)| (b.info().name.clone(), s.snapshot(), s.queue_depth())).collect();
        let per_kind = |f: &dyn Fn(riser_bdev::stats::KindStat) -> u64| -> Vec<(Labels, u64)> {
            snaps
                .iter()
                .flat_map(|(name, s, _)| KINDS.iter().map(move |k| (vec![("bdev", name.clone()), ("op", kind_name(*k).to_string())], f(s.of(*k)))))
                .collect()
        };
        counters(e, "riser_bdev_ops", "Completed I/Os by device and operation", None, &per_kind(&|k| k.ops))?;
        counters(e, "riser_bdev", "Bytes read, written, unmapped, zeroed by device", Some(Unit::Bytes), &per_kind(&|k| k.bytes))?;
        let errors: Vec<(Labels, u64)> = snaps.iter().map(|(n, s, _)| (vec![("bdev", n.clone())], s.errors)).collect();
        counters(e, "riser_bdev_errors", "I/Os that completed with an error", None, &errors)?;
        let qd: Vec<(Labels, i64)> = snaps.iter().map(|(n, _, q)| (vec![("bdev", n.clone())], *q as i64)).collect();
        gauges(e, "riser_bdev_queue_depth", "I/Os submitted to the device and not completed", None, &qd)?;
        let throttled: Vec<(Labels, f64)> = self
            .app
            .bdevs()
            .iter_stats()
            .map(|(b, s)| (vec![("bdev", b.info().name.clone())], s.qos.throttled().0 as f64 / 1e9))
            .collect();
        counters_f64(e, "riser_bdev_qos_throttled", "Time I/Os spent queued by the device's rate limits (bdev_set_qos_limit)", Some(Unit::Seconds), &throttled)?;
        let mut d = e.encode_descriptor(
            "riser_bdev_latency",
            "Submit-to-completion latency by device and operation",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (name, s, _) in &snaps {
            for k in KINDS {
                let ks = s.of(k);
                // Per-bucket counts: the encoder sums them; f64::MAX is its "+Inf".
                let buckets: Vec<(f64, u64)> = (0..LAT_BUCKETS).map(|i| (lat_bucket_le_seconds(i).min(f64::MAX), ks.buckets[i])).collect();
                let count = ks.buckets.iter().sum();
                let labels: Labels = vec![("bdev", name.clone()), ("op", kind_name(k).to_string())];
                let sum = ks.latency_ticks as f64 / riser_bdev::stats::TICK_RATE as f64;
                d.encode_family(&labels)?.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }

    fn reactors(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let stats = self.app.reactors.stats();
        let labels = |s: &riser_reactor::ReactorStatsSnapshot| vec![("reactor", s.reactor.to_string()), ("core", s.core.to_string())];
        let busy: Vec<(Labels, f64)> = stats.iter().map(|s| (labels(s), s.busy_ns as f64 * 1e-9)).collect();
        let idle: Vec<(Labels, f64)> = stats.iter().map(|s| (labels(s), s.idle_ns as f64 * 1e-9)).collect();
        let conns: Vec<(Labels, i64)> = stats.iter().map(|s| (labels(s), s.load as i64)).collect();
        counters_f64(e, "riser_reactor_busy", "Time a reactor spent doing work", Some(Unit::Seconds), &busy)?;
        counters_f64(e, "riser_reactor_idle", "Time a reactor spent polling with nothing to do or asleep", Some(Unit::Seconds), &idle)?;
        gauges(e, "riser_reactor_connections", "Connections placed on a reactor", None, &conns)
    }

    fn iscsi(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let server = &self.app.server;
        let conns = server.connections().list();
        // (target, transport) -> connections, and the distinct sessions (initiator, ISID, TSIH).
        type Session = (String, u64, u16);
        let mut by: BTreeMap<(String, String), (i64, Vec<Session>)> = BTreeMap::new();
        for c in &conns {
            let entry = by.entry((c.target_node_name.clone(), c.transport.to_string())).or_default();
            entry.0 += 1;
            let session = (c.initiator_name.clone(), c.isid, c.tsih);
            if !entry.1.contains(&session) {
                entry.1.push(session);
            }
        }
        let labels = |t: &str, tr: &str| vec![("target", t.to_string()), ("transport", tr.to_string())];
        let c: Vec<(Labels, i64)> = by.iter().map(|((t, tr), (n, _))| (labels(t, tr), *n)).collect();
        let s: Vec<(Labels, i64)> = by.iter().map(|((t, tr), (_, ss))| (labels(t, tr), ss.len() as i64)).collect();
        gauges(e, "riser_iscsi_connections", "Connections in full-feature phase by target and transport", None, &c)?;
        gauges(e, "riser_iscsi_sessions", "Sessions by target and transport", None, &s)?;
        let logins = server.login_stats().to_json();
        counter(e, "riser_iscsi_logins", "Logins that reached full-feature phase", logins["succeeded"].as_u64().unwrap_or(0))?;
        let failed: Vec<(Labels, u64)> = logins["failed"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (vec![("reason", k.clone())], v.as_u64().unwrap_or(0))).collect())
            .unwrap_or_default();
        counters(e, "riser_iscsi_login_failures", "Logins that failed, by reason", None, &failed)?;
        let copies = server.connections().copies();
        let copied: Vec<(Labels, u64)> =
            [
                ("read", copies.read_bytes),
                ("solicited", copies.solicited_bytes),
                ("unsolicited", copies.unsolicited_bytes),
                ("staged", copies.staged_bytes),
            ]
                .into_iter()
                .map(|(k, v)| (vec![("direction", k.to_string())], v))
                .collect();
        counters(e, "riser_iscsi_payload_copied", "Payload bytes the CPU copied between I/O buffers and the wire", Some(Unit::Bytes), &copied)
    }

    fn iobuf(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let s = Pool::global().stats();
        gauge(e, "riser_iobuf_budget", "The I/O buffer budget", Some(Unit::Bytes), s.max_bytes as i64)?;
        gauge(e, "riser_iobuf_mapped", "I/O buffer bytes mapped (in use and kept)", Some(Unit::Bytes), s.mapped_bytes as i64)?;
        gauge(e, "riser_iobuf_in_use", "I/O buffer bytes in use", Some(Unit::Bytes), s.in_use_bytes as i64)?;
        gauge(e, "riser_iobuf_cached", "I/O buffer bytes kept for reuse", Some(Unit::Bytes), s.cached_bytes as i64)?;
        gauge(e, "riser_iobuf_waiting", "Requests waiting for buffer budget now", None, s.waiting as i64)?;
        counter(e, "riser_iobuf_waits", "Requests that had to wait for buffer budget", s.waits)?;
        counter(e, "riser_iobuf_maps", "Buffers mapped", s.maps)?;
        counter(e, "riser_iobuf_reuses", "Buffers reused from the pool", s.reuses)?;
        counter(e, "riser_iobuf_unmaps", "Buffers unmapped", s.unmaps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes only the ALUA families of `nodes`.
    #[derive(Debug)]
    struct AluaOnly(Vec<Arc<riser_config::TargetNode>>);

    impl prometheus_client::collector::Collector for AluaOnly {
        fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
            alua(&mut e, &self.0)
        }
    }

    #[test]
    fn alua_groups_and_gateways_are_gauges() {
        use riser_bdev::testing::{FakeGatewayGroup, GroupedBdev};
        let mut reg = riser_bdev::BdevRegistry::new();
        let name = reg.create_malloc(Some("Malloc0"), 64, 512, None).unwrap();
        let inner = reg.get(&name).unwrap();
        reg.delete(&name, None).unwrap();
        let g = FakeGatewayGroup::new(1, "a:1");
        reg.register(GroupedBdev::new(inner, g.clone())).unwrap();
        let target = riser_config::IscsiTarget::new(Arc::new(std::sync::Mutex::new(reg)));
        target.create_portal_group(1, &[serde_json::from_value(serde_json::json!({"host": "127.0.0.1", "port": "3260"})).unwrap()], false, false).unwrap();
        target.create_initiator_group(1, &["ANY".into()], &["ANY".into()]).unwrap();
        let node = target
            .create_target_node(riser_config::NodeParams {
                name: "gw".into(),
                pg_ig_maps: vec![riser_config::PgIgMap { pg_tag: 1, ig_tag: 1 }],
                luns: vec![riser_config::LunSpec::new(0, "Malloc0")],
                ..Default::default()
            })
            .unwrap();
        g.set_peer(2, "b:2", &[2], riser_bdev::MemberState::Fenced);
        let mut r = Registry::default();
        r.register_collector(Box::new(AluaOnly(vec![node])));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let t = "target=\"iqn.2016-06.io.riser:gw\"";
        for line in [
            format!("riser_alua_group_state{{{t},tpg_id=\"1\",state=\"active_optimized\"}} 1"),
            format!("riser_alua_group_state{{{t},tpg_id=\"1\",state=\"unavailable\"}} 0"),
            format!("riser_gateway_members{{{t},bdev=\"Malloc0\",state=\"live\"}} 1"),
            format!("riser_gateway_members{{{t},bdev=\"Malloc0\",state=\"fenced\"}} 1"),
            format!("riser_gateway_self_fenced{{{t},bdev=\"Malloc0\"}} 0"),
        ] {
            assert!(text.contains(&line), "{line} not in:\n{text}");
        }
        // This gateway fenced: its group unavailable.
        g.fence_me();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(text.contains(&format!("riser_alua_group_state{{{t},tpg_id=\"1\",state=\"unavailable\"}} 1")), "{text}");
        assert!(text.contains(&format!("riser_gateway_self_fenced{{{t},bdev=\"Malloc0\"}} 1")), "{text}");
    }

    #[test]
    fn requests_parse() {
        assert_eq!(parse_request(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Request::Metrics);
        assert_eq!(parse_request(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Request::Metrics);
        assert_eq!(parse_request(b"HEAD /metrics HTTP/1.1\r\n\r\n"), Request::Metrics);
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\n\r\n"), Request::NotFound);
        assert_eq!(parse_request(b"POST /metrics HTTP/1.1\r\n\r\n"), Request::BadMethod);
        assert_eq!(parse_request(b"GET /metrics\r\n\r\n"), Request::Bad);
        assert_eq!(parse_request(b"GET metrics HTTP/1.1\r\n\r\n"), Request::Bad);
        assert_eq!(parse_request(b"\xff\xfe\r\n\r\n"), Request::Bad);
        assert_eq!(parse_request(b""), Request::Bad);
        assert_eq!(parse_request(b"GET /metrics HTTP/1.1 extra\r\n\r\n"), Request::Bad);
    }
}
