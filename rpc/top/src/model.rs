//! The data model, with no drawing and no I/O: RPC answers parsed into samples, two samples
//! turned into rows (busy %, rates), rows sorted by a column.
//!
//! Nothing here trusts the answer's shape: a field that is missing or of another type is
//! `None`, shown as "-"; an answer that is not the expected object or array gives no rows.

use std::cmp::Ordering;
use std::collections::HashMap;

use serde_json::Value;

/// A non-negative integer field (an integral float is accepted too: some JSON writers emit
/// `1e9` or `12.0`).
fn u64_of(v: &Value, key: &str) -> Option<u64> {
    let x = v.get(key)?;
    x.as_u64().or_else(|| x.as_f64().filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64))
}

fn f64_of(v: &Value, key: &str) -> Option<f64> {
    v.get(key)?.as_f64().filter(|f| f.is_finite())
}

/// A text field; a number is shown as its decimal text.
fn str_of(v: &Value, key: &str) -> Option<String> {
    match v.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The elements of `v[key]`, or of `v` itself when `key` is None; empty when it is no array.
fn array_of<'a>(v: &'a Value, key: Option<&str>) -> &'a [Value] {
    let a = match key {
        Some(k) => v.get(k),
        None => Some(v),
    };
    a.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

// -------------------------------------------------------------------------------------
// Samples: what one refresh read from riser

/// One reactor of `framework_get_reactors`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reactor {
    pub lcore: Option<u64>,
    pub busy_ns: Option<u64>,
    pub idle_ns: Option<u64>,
    pub sleeping: Option<bool>,
    pub pollers: Option<u64>,
    pub connections: Option<u64>,
}

/// `framework_get_reactors`: `{"tick_rate", "poll_mode", "reactors": [{"lcore", "busy",
/// "idle", "in_interrupt", "pollers", "connections"}]}`; busy and idle are in ticks of
/// `tick_rate` (riser: nanoseconds), only their ratio matters here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reactors {
    pub poll_mode: Option<String>,
    pub list: Vec<Reactor>,
}

impl Reactors {
    pub fn parse(v: &Value) -> Reactors {
        let list = array_of(v, Some("reactors"))
            .iter()
            .map(|r| Reactor {
                lcore: u64_of(r, "lcore"),
                busy_ns: u64_of(r, "busy"),
                idle_ns: u64_of(r, "idle"),
                sleeping: r.get("in_interrupt").and_then(Value::as_bool),
                pollers: u64_of(r, "pollers"),
                connections: u64_of(r, "connections"),
            })
            .collect();
        Reactors { poll_mode: str_of(v, "poll_mode"), list }
    }
}

/// One connection of `iscsi_get_connections`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conn {
    pub id: Option<u64>,
    pub initiator: Option<String>,
    pub initiator_addr: Option<String>,
    pub target: Option<String>,
    pub transport: Option<String>,
    pub reactor: Option<u64>,
    pub lcore: Option<u64>,
    pub queue_depth: Option<u64>,
    pub tasks_done: Option<u64>,
}

impl Conn {
    /// `iscsi_get_connections`: an array of connection objects.
    pub fn parse_list(v: &Value) -> Vec<Conn> {
        array_of(v, None)
            .iter()
            .map(|c| Conn {
                id: u64_of(c, "id"),
                initiator: str_of(c, "initiator_name"),
                initiator_addr: str_of(c, "initiator_addr"),
                target: str_of(c, "target_node_name"),
                transport: str_of(c, "transport"),
                reactor: u64_of(c, "reactor"),
                lcore: u64_of(c, "lcore_id"),
                queue_depth: u64_of(c, "queue_depth"),
                tasks_done: u64_of(c, "tasks_done"),
            })
            .collect()
    }
}

/// One device of `bdev_get_iostat` (SPDK's field names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DevStat {
    pub name: String,
    pub read_ops: Option<u64>,
    pub write_ops: Option<u64>,
    pub unmap_ops: Option<u64>,
    pub bytes_read: Option<u64>,
    pub bytes_written: Option<u64>,
    pub read_latency_ticks: Option<u64>,
    pub write_latency_ticks: Option<u64>,
    pub queue_depth: Option<u64>,
}

/// `bdev_get_iostat`: `{"tick_rate", "ticks", "bdevs": [...]}`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IoStat {
    pub tick_rate: Option<u64>,
    pub ticks: Option<u64>,
    pub devs: Vec<DevStat>,
}

impl IoStat {
    pub fn parse(v: &Value) -> IoStat {
        let devs = array_of(v, Some("bdevs"))
            .iter()
            .filter_map(|d| {
                Some(DevStat {
                    // A device without a name cannot be followed from one sample to the next.
                    name: str_of(d, "name")?,
                    read_ops: u64_of(d, "num_read_ops"),
                    write_ops: u64_of(d, "num_write_ops"),
                    unmap_ops: u64_of(d, "num_unmap_ops"),
                    bytes_read: u64_of(d, "bytes_read"),
                    bytes_written: u64_of(d, "bytes_written"),
                    read_latency_ticks: u64_of(d, "read_latency_ticks"),
                    write_latency_ticks: u64_of(d, "write_latency_ticks"),
                    queue_depth: u64_of(d, "queue_depth"),
                })
            })
            .collect();
        IoStat { tick_rate: u64_of(v, "tick_rate").filter(|r| *r > 0), ticks: u64_of(v, "ticks"), devs }
    }

    /// A device list without counters (from `bdev_get_bdevs`, when riser has no
    /// `bdev_get_iostat`): the devices show, their figures are "-".
    pub fn names_only(bdevs: &Value) -> IoStat {
        let devs = array_of(bdevs, None).iter().filter_map(|b| Some(DevStat { name: str_of(b, "name")?, ..Default::default() })).collect();
        IoStat { devs, ..Default::default() }
    }
}

/// `bdev_get_histogram`: `{"name", "enabled", "count", "latency_us": {"p50", "p99", ...}}`;
/// percentiles over everything since the histogram was enabled.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hist {
    pub enabled: Option<bool>,
    pub count: Option<u64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

impl Hist {
    pub fn parse(v: &Value) -> Hist {
        let lat = v.get("latency_us").unwrap_or(&Value::Null);
        Hist { enabled: v.get("enabled").and_then(Value::as_bool), count: u64_of(v, "count"), p50_us: f64_of(lat, "p50"), p99_us: f64_of(lat, "p99") }
    }
}

/// Everything one refresh read. A part is `None` when its method failed or riser does not
/// serve it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// When it was taken, in seconds on a monotonic clock.
    pub at_s: f64,
    pub version: Option<String>,
    pub reactors: Option<Reactors>,
    pub conns: Option<Vec<Conn>>,
    pub iostat: Option<IoStat>,
    /// By device name.
    pub hists: HashMap<String, Hist>,
}

impl Sample {
    /// Whether any device's latency histogram is on.
    pub fn any_histogram_on(&self) -> bool {
        self.hists.values().any(|h| h.enabled == Some(true))
    }
}

// -------------------------------------------------------------------------------------
// Rows: one sample, with rates against the sample before it

/// `cur - prev` of two counters; `None` when either is missing or the counter went back
/// (riser restarted, `bdev_reset_iostat`).
fn delta(cur: Option<u64>, prev: Option<u64>) -> Option<u64> {
    cur?.checked_sub(prev?)
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReactorRow {
    pub index: usize,
    pub lcore: Option<u64>,
    /// Busy share of the last interval, 0-100.
    pub busy_pct: Option<f64>,
    pub connections: Option<u64>,
    pub pollers: Option<u64>,
    pub sleeping: Option<bool>,
}

/// The reactors of `cur`, busy % from the counters' change since `prev` (the same reactor:
/// same core, else same position).
pub fn reactor_rows(prev: Option<&Sample>, cur: &Sample) -> Vec<ReactorRow> {
    let Some(rs) = &cur.reactors else { return Vec::new() };
    let before = prev.and_then(|p| p.reactors.as_ref());
    rs.list
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let old = before.and_then(|b| match r.lcore {
                Some(core) => b.list.iter().find(|o| o.lcore == Some(core)),
                None => b.list.get(i),
            });
            let busy_pct = old.and_then(|o| {
                let busy = delta(r.busy_ns, o.busy_ns)?;
                let idle = delta(r.idle_ns, o.idle_ns)?;
                let total = busy.checked_add(idle).filter(|t| *t > 0)?;
                Some(100.0 * busy as f64 / total as f64)
            });
            // riser counts connections per reactor; otherwise count them here.
            let connections = r.connections.or_else(|| cur.conns.as_ref().map(|cs| cs.iter().filter(|c| c.reactor == Some(i as u64)).count() as u64));
            ReactorRow { index: i, lcore: r.lcore, busy_pct, connections, pollers: r.pollers, sleeping: r.sleeping }
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConnRow {
    pub id: Option<u64>,
    pub initiator: Option<String>,
    pub initiator_addr: Option<String>,
    pub target: Option<String>,
    pub transport: Option<String>,
    pub reactor: Option<u64>,
    pub lcore: Option<u64>,
    pub queue_depth: Option<u64>,
    /// SCSI tasks completed per second over the last interval.
    pub tasks_per_s: Option<f64>,
}

pub fn conn_rows(prev: Option<&Sample>, cur: &Sample) -> Vec<ConnRow> {
    let Some(cs) = &cur.conns else { return Vec::new() };
    let dt = prev.map(|p| cur.at_s - p.at_s).filter(|d| *d > 0.0);
    cs.iter()
        .map(|c| {
            let old = prev.and_then(|p| p.conns.as_ref()).and_then(|l| match c.id {
                Some(id) => l.iter().find(|o| o.id == Some(id)),
                None => None,
            });
            let tasks_per_s = old.and_then(|o| Some(delta(c.tasks_done, o.tasks_done)? as f64 / dt?));
            ConnRow {
                id: c.id,
                initiator: c.initiator.clone(),
                initiator_addr: c.initiator_addr.clone(),
                target: c.target.clone(),
                transport: c.transport.clone(),
                reactor: c.reactor,
                lcore: c.lcore,
                queue_depth: c.queue_depth,
                tasks_per_s,
            }
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
pub struct DevRow {
    pub name: String,
    pub iops: Option<f64>,
    pub read_iops: Option<f64>,
    pub write_iops: Option<f64>,
    pub read_mibs: Option<f64>,
    pub write_mibs: Option<f64>,
    /// Mean read/write latency over the last interval (from the latency tick sums).
    pub avg_us: Option<f64>,
    pub queue_depth: Option<u64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub histogram: Option<bool>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// The interval between two `bdev_get_iostat` answers: riser's own clock (`ticks` /
/// `tick_rate`) when both carry it, else the time the samples were taken.
fn iostat_interval(prev: &Sample, cur: &Sample) -> Option<f64> {
    let (p, c) = (prev.iostat.as_ref()?, cur.iostat.as_ref()?);
    let by_ticks = match (c.tick_rate, delta(c.ticks, p.ticks)) {
        (Some(rate), Some(d)) if d > 0 && p.tick_rate == Some(rate) => Some(d as f64 / rate as f64),
        _ => None,
    };
    by_ticks.or(Some(cur.at_s - prev.at_s)).filter(|d| *d > 0.0)
}

pub fn dev_rows(prev: Option<&Sample>, cur: &Sample) -> Vec<DevRow> {
    let Some(io) = &cur.iostat else { return Vec::new() };
    let dt = prev.and_then(|p| iostat_interval(p, cur));
    io.devs
        .iter()
        .map(|d| {
            let old = prev.and_then(|p| p.iostat.as_ref()).and_then(|s| s.devs.iter().find(|o| o.name == d.name));
            let rate = |cur: Option<u64>, old_v: Option<u64>| -> Option<f64> { Some(delta(cur, old_v)? as f64 / dt?) };
            let (read_iops, write_iops) = match old {
                Some(o) => (rate(d.read_ops, o.read_ops), rate(d.write_ops, o.write_ops)),
                None => (None, None),
            };
            let unmap_iops = old.and_then(|o| rate(d.unmap_ops, o.unmap_ops));
            let iops = match (read_iops, write_iops) {
                (Some(r), Some(w)) => Some(r + w + unmap_iops.unwrap_or(0.0)),
                _ => None,
            };
            let (read_mibs, write_mibs) = match old {
                Some(o) => (rate(d.bytes_read, o.bytes_read).map(|b| b / MIB), rate(d.bytes_written, o.bytes_written).map(|b| b / MIB)),
                None => (None, None),
            };
            let avg_us = old.and_then(|o| {
                let ops = delta(d.read_ops, o.read_ops)? + delta(d.write_ops, o.write_ops)?;
                let ticks = delta(d.read_latency_ticks, o.read_latency_ticks)? + delta(d.write_latency_ticks, o.write_latency_ticks)?;
                let rate = io.tick_rate?;
                (ops > 0).then(|| ticks as f64 / ops as f64 / rate as f64 * 1e6)
            });
            let h = cur.hists.get(&d.name);
            // Percentiles of an empty or switched-off histogram mean nothing.
            let live = h.filter(|h| h.enabled == Some(true) && h.count.is_some_and(|n| n > 0));
            DevRow {
                name: d.name.clone(),
                iops,
                read_iops,
                write_iops,
                read_mibs,
                write_mibs,
                avg_us,
                queue_depth: d.queue_depth,
                p50_us: live.and_then(|h| h.p50_us),
                p99_us: live.and_then(|h| h.p99_us),
                histogram: h.and_then(|h| h.enabled),
            }
        })
        .collect()
}

// -------------------------------------------------------------------------------------
// Columns and sorting

/// A table column: its title, its width on screen, and how it sorts.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub title: &'static str,
    /// Characters; 0: takes a share of what is left (names).
    pub width: u16,
    /// Numbers are right-aligned.
    pub numeric: bool,
    /// Sorts biggest first (rates, counts) rather than smallest or A first (names, ids).
    pub desc: bool,
}

/// Text, sorted A to Z.
const fn text(title: &'static str, width: u16) -> Column {
    Column { title, width, numeric: false, desc: false }
}

/// A figure, sorted biggest first.
const fn num(title: &'static str, width: u16) -> Column {
    Column { title, width, numeric: true, desc: true }
}

/// A number that names something (id, core), sorted smallest first.
const fn id(title: &'static str, width: u16) -> Column {
    Column { title, width, numeric: true, desc: false }
}

/// What a cell sorts by.
#[derive(Clone, Debug, PartialEq)]
pub enum Key {
    Num(Option<f64>),
    Text(Option<String>),
}

/// A table row: its cells as text and its sort keys.
pub trait Row {
    const COLUMNS: &'static [Column];
    fn key(&self, col: usize) -> Key;
    fn cells(&self) -> Vec<String>;
}

/// "-" for a missing value, else the number with `decimals`.
pub fn fmt_f(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.decimals$}"))
}

pub fn fmt_u(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| x.to_string())
}

pub fn fmt_s(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "-".to_string())
}

fn n(v: Option<u64>) -> Key {
    Key::Num(v.map(|x| x as f64))
}

impl Row for ReactorRow {
    const COLUMNS: &'static [Column] =
        &[id("Reactor", 7), id("Core", 5), num("Busy %", 8), num("Connections", 11), num("Pollers", 7), text("State", 0)];

    fn key(&self, col: usize) -> Key {
        match col {
            0 => n(Some(self.index as u64)),
            1 => n(self.lcore),
            2 => Key::Num(self.busy_pct),
            3 => n(self.connections),
            4 => n(self.pollers),
            _ => Key::Text(self.state()),
        }
    }

    fn cells(&self) -> Vec<String> {
        vec![self.index.to_string(), fmt_u(self.lcore), fmt_f(self.busy_pct, 1), fmt_u(self.connections), fmt_u(self.pollers), fmt_s(&self.state())]
    }
}

impl ReactorRow {
    fn state(&self) -> Option<String> {
        self.sleeping.map(|s| if s { "sleeping" } else { "polling" }.to_string())
    }
}

impl Row for ConnRow {
    const COLUMNS: &'static [Column] = &[
        id("ID", 5),
        text("Initiator", 0),
        text("Address", 21),
        text("Target", 0),
        text("Transport", 9),
        id("Reactor", 7),
        id("Core", 5),
        num("QD", 5),
        num("Tasks/s", 10),
    ];

    fn key(&self, col: usize) -> Key {
        match col {
            0 => n(self.id),
            1 => Key::Text(self.initiator.clone()),
            2 => Key::Text(self.initiator_addr.clone()),
            3 => Key::Text(self.target.clone()),
            4 => Key::Text(self.transport.clone()),
            5 => n(self.reactor),
            6 => n(self.lcore),
            7 => n(self.queue_depth),
            _ => Key::Num(self.tasks_per_s),
        }
    }

    fn cells(&self) -> Vec<String> {
        vec![
            fmt_u(self.id),
            fmt_s(&self.initiator),
            fmt_s(&self.initiator_addr),
            fmt_s(&self.target),
            fmt_s(&self.transport),
            fmt_u(self.reactor),
            fmt_u(self.lcore),
            fmt_u(self.queue_depth),
            fmt_f(self.tasks_per_s, 0),
        ]
    }
}

impl Row for DevRow {
    const COLUMNS: &'static [Column] = &[
        text("Device", 0),
        num("IOPS", 10),
        num("Read IOPS", 10),
        num("Write IOPS", 10),
        num("Read MiB/s", 10),
        num("Write MiB/s", 11),
        num("Avg us", 9),
        num("QD", 5),
        num("p50 us", 9),
        num("p99 us", 9),
        text("Histogram", 9),
    ];

    fn key(&self, col: usize) -> Key {
        match col {
            0 => Key::Text(Some(self.name.clone())),
            1 => Key::Num(self.iops),
            2 => Key::Num(self.read_iops),
            3 => Key::Num(self.write_iops),
            4 => Key::Num(self.read_mibs),
            5 => Key::Num(self.write_mibs),
            6 => Key::Num(self.avg_us),
            7 => n(self.queue_depth),
            8 => Key::Num(self.p50_us),
            9 => Key::Num(self.p99_us),
            _ => Key::Text(self.hist_text()),
        }
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            fmt_f(self.iops, 0),
            fmt_f(self.read_iops, 0),
            fmt_f(self.write_iops, 0),
            fmt_f(self.read_mibs, 2),
            fmt_f(self.write_mibs, 2),
            fmt_f(self.avg_us, 1),
            fmt_u(self.queue_depth),
            fmt_f(self.p50_us, 1),
            fmt_f(self.p99_us, 1),
            fmt_s(&self.hist_text()),
        ]
    }
}

impl DevRow {
    fn hist_text(&self) -> Option<String> {
        self.histogram.map(|on| if on { "on" } else { "off" }.to_string())
    }
}

/// A table's sort: the column, and whether its natural order is turned around.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sort {
    pub col: usize,
    pub reverse: bool,
}

impl Sort {
    /// Whether the rows end up biggest (or Z) first: the column's own order, turned
    /// around by `reverse`.
    pub fn descending<R: Row>(&self) -> bool {
        let desc = R::COLUMNS.get(self.col).is_some_and(|c| c.desc);
        desc != self.reverse
    }
}

/// Sorts rows by `sort`: figures biggest first, names and ids smallest (A) first, either
/// turned around by `reverse`; missing values always last; equal keys keep riser's order.
pub fn sort_rows<R: Row>(rows: &mut [R], sort: Sort) {
    let desc = sort.descending::<R>();
    rows.sort_by(|a, b| {
        let (ka, kb) = (a.key(sort.col), b.key(sort.col));
        let ord = match (&ka, &kb) {
            (Key::Num(Some(x)), Key::Num(Some(y))) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
            (Key::Text(Some(x)), Key::Text(Some(y))) => x.cmp(y),
            (Key::Num(None), Key::Num(None)) | (Key::Text(None), Key::Text(None)) => return Ordering::Equal,
            (Key::Num(None), _) | (Key::Text(None), _) => return Ordering::Greater,
            (_, Key::Num(None)) | (_, Key::Text(None)) => return Ordering::Less,
            _ => Ordering::Equal,
        };
        if desc {
            ord.reverse()
        } else {
            ord
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(at_s: f64) -> Sample {
        Sample { at_s, ..Default::default() }
    }

    #[test]
    fn busy_percent_from_two_samples() {
        let mut a = sample(0.0);
        a.reactors = Some(Reactors::parse(&json!({"poll_mode": "busy", "reactors": [
            {"lcore": 0, "busy": 1000, "idle": 9000, "connections": 2, "pollers": 3, "in_interrupt": false},
            {"lcore": 3, "busy": 0, "idle": 0},
        ]})));
        let mut b = sample(1.0);
        b.reactors = Some(Reactors::parse(&json!({"reactors": [
            {"lcore": 3, "busy": 750, "idle": 250},
            {"lcore": 0, "busy": 1250, "idle": 9750, "connections": 2, "pollers": 3, "in_interrupt": true},
        ]})));
        assert_eq!(a.reactors.as_ref().and_then(|r| r.poll_mode.clone()).as_deref(), Some("busy"));
        // The first sample alone has no interval: busy % unknown.
        assert!(reactor_rows(None, &a).iter().all(|r| r.busy_pct.is_none()));
        let rows = reactor_rows(Some(&a), &b);
        assert_eq!(rows.len(), 2);
        // Matched by core, not by position: core 3 went from 0/0 to 750/250.
        assert_eq!(rows[0].lcore, Some(3));
        assert_eq!(rows[0].busy_pct, Some(75.0));
        assert_eq!(rows[1].busy_pct, Some(25.0));
        assert_eq!(rows[1].cells(), vec!["1", "0", "25.0", "2", "3", "sleeping"]);
        // No connections field and no connection list: "-".
        assert_eq!(rows[0].cells(), vec!["0", "3", "75.0", "-", "-", "-"]);
    }

    #[test]
    fn reactor_counters_going_back_or_missing_show_dash() {
        let mut a = sample(0.0);
        a.reactors = Some(Reactors::parse(&json!({"reactors": [{"lcore": 0, "busy": 5000, "idle": 5000}]})));
        let mut b = sample(1.0);
        // riser restarted: the counters start again from zero.
        b.reactors = Some(Reactors::parse(&json!({"reactors": [{"lcore": 0, "busy": 10, "idle": 10}]})));
        assert_eq!(reactor_rows(Some(&a), &b)[0].busy_pct, None);
        // Wrong types and no interval at all.
        b.reactors = Some(Reactors::parse(&json!({"reactors": [{"lcore": "zero", "busy": "x", "idle": -1}]})));
        let rows = reactor_rows(Some(&a), &b);
        assert_eq!(rows[0].cells(), vec!["0", "-", "-", "-", "-", "-"]);
        // Not the expected shape at all: no rows, no panic.
        b.reactors = Some(Reactors::parse(&json!([1, 2, 3])));
        assert!(reactor_rows(Some(&a), &b).is_empty());
    }

    #[test]
    fn connections_per_reactor_counted_when_riser_does_not_say() {
        let mut s = sample(0.0);
        s.reactors = Some(Reactors::parse(&json!({"reactors": [{"lcore": 0}, {"lcore": 1}]})));
        s.conns = Some(Conn::parse_list(&json!([{"reactor": 1}, {"reactor": 1}, {"reactor": 0}, {}])));
        let rows = reactor_rows(None, &s);
        assert_eq!(rows[0].connections, Some(1));
        assert_eq!(rows[1].connections, Some(2));
    }

    #[test]
    fn connection_rows_and_task_rate() {
        let c = |done: u64, qd: Value| {
            json!([{"id": 7, "initiator_name": "iqn.x:init", "initiator_addr": "127.0.0.1:5000",
                   "target_node_name": "iqn.t:disk", "transport": "tcp", "reactor": 0, "lcore_id": 2,
                   "queue_depth": qd, "tasks_done": done},
                  {"id": 8, "tasks_done": 5}])
        };
        let mut a = sample(10.0);
        a.conns = Some(Conn::parse_list(&c(1000, json!(4))));
        let mut b = sample(12.0);
        b.conns = Some(Conn::parse_list(&c(5000, json!(31))));
        let rows = conn_rows(Some(&a), &b);
        assert_eq!(rows[0].tasks_per_s, Some(2000.0));
        assert_eq!(rows[0].cells(), vec!["7", "iqn.x:init", "127.0.0.1:5000", "iqn.t:disk", "tcp", "0", "2", "31", "2000"]);
        // A connection with almost nothing known (no queue_depth on an older riser).
        assert_eq!(rows[1].cells(), vec!["8", "-", "-", "-", "-", "-", "-", "-", "0"]);
        // Not an array: no rows.
        b.conns = Some(Conn::parse_list(&json!({"error": "?"})));
        assert!(conn_rows(Some(&a), &b).is_empty());
    }

    fn iostat(ticks: u64, reads: u64, writes: u64, lat: u64) -> Value {
        json!({"tick_rate": 1_000_000_000u64, "ticks": ticks, "bdevs": [
            {"name": "Null0", "num_read_ops": reads, "num_write_ops": writes, "num_unmap_ops": 0,
             "bytes_read": reads * 4096, "bytes_written": writes * 4096,
             "read_latency_ticks": lat, "write_latency_ticks": lat, "queue_depth": 12},
            {"name": "Malloc1"}
        ]})
    }

    #[test]
    fn device_rates_from_riser_ticks() {
        let mut a = sample(0.0);
        a.iostat = Some(IoStat::parse(&iostat(1_000_000_000, 0, 0, 0)));
        // Taken 3 s apart on our clock, but riser's ticks say 2 s: riser's clock wins.
        let mut b = sample(3.0);
        b.iostat = Some(IoStat::parse(&iostat(3_000_000_000, 100_000, 60_000, 8_000_000_000)));
        b.hists.insert(
            "Null0".into(),
            Hist::parse(&json!({"name": "Null0", "enabled": true, "count": 10,
                                "latency_us": {"p50": 12.3, "p99": 80.0}})),
        );
        let rows = dev_rows(Some(&a), &b);
        let r = &rows[0];
        assert_eq!(r.read_iops, Some(50_000.0));
        assert_eq!(r.write_iops, Some(30_000.0));
        assert_eq!(r.iops, Some(80_000.0));
        assert_eq!(r.read_mibs, Some(50_000.0 * 4096.0 / MIB));
        // 16e9 ns of latency over 160000 I/Os = 100 us.
        assert_eq!(r.avg_us, Some(100.0));
        assert_eq!(r.cells(), vec!["Null0", "80000", "50000", "30000", "195.31", "117.19", "100.0", "12", "12.3", "80.0", "on"]);
        // A device with no counters at all: its row shows, every figure "-".
        assert_eq!(rows[1].cells()[1..], ["-", "-", "-", "-", "-", "-", "-", "-", "-", "-"]);
        // The first sample: names only.
        assert_eq!(dev_rows(None, &b)[0].iops, None);
    }

    #[test]
    fn device_rates_fall_back_to_wall_clock_and_reset_counters() {
        let mut a = sample(0.0);
        a.iostat = Some(IoStat::parse(&json!({"bdevs": [{"name": "D", "num_read_ops": 10, "num_write_ops": 0}]})));
        let mut b = sample(2.0);
        b.iostat = Some(IoStat::parse(&json!({"bdevs": [{"name": "D", "num_read_ops": 410, "num_write_ops": 0}]})));
        let r = &dev_rows(Some(&a), &b)[0];
        assert_eq!(r.iops, Some(200.0));
        // No latency ticks, no tick rate: no average.
        assert_eq!(r.avg_us, None);
        // bdev_reset_iostat between the samples: the counters went back, no rate.
        let mut c = sample(3.0);
        c.iostat = Some(IoStat::parse(&json!({"bdevs": [{"name": "D", "num_read_ops": 5, "num_write_ops": 0}]})));
        assert_eq!(dev_rows(Some(&b), &c)[0].iops, None);
    }

    #[test]
    fn histogram_off_or_empty_shows_no_percentiles() {
        let mut s = sample(0.0);
        s.iostat = Some(IoStat::names_only(&json!([{"name": "A"}, {"name": "B"}, {"no": "name"}])));
        s.hists.insert("A".into(), Hist::parse(&json!({"enabled": false, "count": 5, "latency_us": {"p50": 1.0}})));
        s.hists.insert("B".into(), Hist::parse(&json!({"enabled": true, "count": 0, "latency_us": {"p50": 0.0}})));
        let rows = dev_rows(None, &s);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].p50_us, rows[0].histogram), (None, Some(false)));
        assert_eq!((rows[1].p50_us, rows[1].histogram), (None, Some(true)));
        assert!(s.any_histogram_on());
        // Garbage in the histogram answer.
        assert_eq!(Hist::parse(&json!("nope")), Hist::default());
        assert_eq!(Hist::parse(&json!({"latency_us": [1]})), Hist::default());
    }

    #[test]
    fn sorting_numbers_text_missing_and_reverse() {
        let row = |name: &str, iops: Option<f64>| DevRow {
            name: name.into(),
            iops,
            read_iops: None,
            write_iops: None,
            read_mibs: None,
            write_mibs: None,
            avg_us: None,
            queue_depth: None,
            p50_us: None,
            p99_us: None,
            histogram: None,
        };
        let mut rows = vec![row("b", Some(5.0)), row("c", None), row("a", Some(50.0)), row("d", Some(5.0))];
        let names = |rs: &[DevRow]| rs.iter().map(|r| r.name.clone()).collect::<Vec<_>>().join("");
        // IOPS: biggest first, missing last, ties in riser's order.
        sort_rows(&mut rows, Sort { col: 1, reverse: false });
        assert_eq!(names(&rows), "abdc");
        sort_rows(&mut rows, Sort { col: 1, reverse: true });
        assert_eq!(names(&rows), "bdac");
        // Name: A to Z; reversed Z to A.
        sort_rows(&mut rows, Sort { col: 0, reverse: false });
        assert_eq!(names(&rows), "abcd");
        sort_rows(&mut rows, Sort { col: 0, reverse: true });
        assert_eq!(names(&rows), "dcba");
        assert!(Sort { col: 1, reverse: false }.descending::<DevRow>());
        assert!(!Sort { col: 0, reverse: false }.descending::<DevRow>());
        // A column past the end sorts by the last one, without a panic.
        sort_rows(&mut rows, Sort { col: 99, reverse: false });
    }

    #[test]
    fn every_row_has_one_cell_per_column() {
        let s = sample(0.0);
        let r = ReactorRow { index: 0, lcore: None, busy_pct: None, connections: None, pollers: None, sleeping: None };
        assert_eq!(r.cells().len(), ReactorRow::COLUMNS.len());
        let mut s2 = s.clone();
        s2.conns = Some(Conn::parse_list(&json!([{}])));
        assert_eq!(conn_rows(None, &s2)[0].cells().len(), ConnRow::COLUMNS.len());
        s2.iostat = Some(IoStat::parse(&json!({"bdevs": [{"name": "x"}]})));
        assert_eq!(dev_rows(None, &s2)[0].cells().len(), DevRow::COLUMNS.len());
    }
}
