//! Charts, as SVG drawn with plotters (its SVG backend only: no fonts, no bitmaps):
//! - the latency distribution of one run (`riser-perf [flags] URL... --plot FILE.svg`): the
//!   percentile spectrum (latency against 0 %, 90 %, 99 %, 99.9 %, ... on a log axis, as
//!   HdrHistogram plots it) beside the histogram of latencies (log-spaced buckets);
//! - the benchmark matrix (`riser-perf chart RESULTS.json -o FILE.svg`): throughput and p99
//!   latency ratios of one target against its peers, per case, after the medians of the
//!   rounds; the same command prints the table and can save the medians as JSON.
//!
//! RESULTS.json is what `scripts/bench-perf-matrix.sh` collects: a JSON array of runs,
//! `{"case": "randread 4k qd32", "target": "riser", "round": 1, "report": {...}}`, where
//! `report` is the `--json` output of one `riser-perf` run (a run that failed has
//! `"error": "..."` instead of `report`). The first target named is the subject of the
//! ratios; every other target is a peer.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use hdrhistogram::Histogram;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use serde::Serialize;

use crate::init::Plan;
use crate::report::new_histogram;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("chart: {e}")
}

const SUBJECT: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const PEERS: [RGBColor; 4] = [
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

// ---- the latency distribution of one run -------------------------------------------------

/// "0%", "90%", "99%", "99.9%", ... for a whole number of nines; "" between them.
fn nines_label(x: f64) -> String {
    let n = x.round();
    if (x - n).abs() > 1e-6 || n < 0.0 {
        return String::new();
    }
    match n as u32 {
        0 => "0%".into(),
        1 => "90%".into(),
        2 => "99%".into(),
        k => format!("99.{}%", "9".repeat(k as usize - 2)),
    }
}

/// A latency given in microseconds, for labels: "85.2 us", "123 us", "11.8 ms", "1.2 s".
fn us_label(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{} s", trim(v / 1_000_000.0))
    } else if v >= 1000.0 {
        format!("{} ms", trim(v / 1000.0))
    } else {
        format!("{} us", trim(v))
    }
}

fn trim(v: f64) -> String {
    let s = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The percentile spectrum: (nines, latency in us) points, nines = -log10(1 - q), up to
/// what the sample count supports (at most 6 nines).
pub fn percentile_curve(h: &Histogram<u64>) -> (f64, Vec<(f64, f64)>) {
    let n = h.len().max(1) as f64;
    let max_nines = n.log10().clamp(1.0, 6.0);
    const STEPS: u32 = 400;
    let pts = (0..=STEPS)
        .map(|k| {
            let x = max_nines * k as f64 / STEPS as f64;
            let q = (1.0 - 10f64.powf(-x)).clamp(0.0, 1.0);
            (x, h.value_at_quantile(q) as f64 / 1000.0)
        })
        .collect();
    (max_nines, pts)
}

/// Latencies in log-spaced buckets: (low us, high us, % of I/Os) each.
pub fn latency_buckets(h: &Histogram<u64>) -> Vec<(f64, f64, f64)> {
    let total = h.len();
    if total == 0 {
        return Vec::new();
    }
    let lo = (h.min().max(1)) as f64;
    let mut hi = h.max().max(1) as f64;
    if hi < lo * 1.05 {
        hi = lo * 1.05;
    }
    let span = (hi / lo).ln();
    // About 25 buckets per decade, 10 to 200 in all.
    let n = ((span / 10f64.ln()) * 25.0).ceil().clamp(10.0, 200.0) as usize;
    let mut counts = vec![0u64; n];
    for v in h.iter_recorded() {
        let x = (v.value_iterated_to().max(1) as f64).clamp(lo, hi);
        let i = ((x / lo).ln() / span * n as f64) as usize;
        counts[i.min(n - 1)] += v.count_at_value();
    }
    let edge = |i: usize| lo * (span * i as f64 / n as f64).exp() / 1000.0;
    counts
        .iter()
        .enumerate()
        .map(|(i, c)| (edge(i), edge(i + 1), *c as f64 * 100.0 / total as f64))
        .collect()
}

/// The latency chart of one run as an SVG document.
pub fn latency_svg(h: &Histogram<u64>, title: &str, subtitle: &str) -> Result<String, String> {
    if h.is_empty() {
        return Err("no I/O completed in the measured window: no latency chart".into());
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 540)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (head, body) = root.split_vertically(64);
        head.draw_text(
            title,
            &("sans-serif", 20).into_font().color(&BLACK),
            (16, 10),
        )
        .map_err(err)?;
        head.draw_text(
            subtitle,
            &("sans-serif", 14).into_font().color(&RGBColor(80, 80, 80)),
            (16, 38),
        )
        .map_err(err)?;
        let (left, right) = body.split_horizontally(600);
        percentile_panel(&left, h)?;
        histogram_panel(&right, h)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn percentile_panel(area: &Area, h: &Histogram<u64>) -> Result<(), String> {
    let (max_nines, pts) = percentile_curve(h);
    let lo = (h.min().max(1) as f64 / 1000.0) * 0.8;
    let hi = (h.max().max(1) as f64 / 1000.0 * 1.3).max(lo * 2.0);
    let mut chart = ChartBuilder::on(area)
        .caption("latency by percentile", ("sans-serif", 16))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..max_nines, (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(max_nines.floor() as usize + 1)
        .x_label_formatter(&|x| nines_label(*x))
        .y_label_formatter(&|y| us_label(*y))
        .x_desc("percentile")
        .y_desc("latency")
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|&(x, y)| (x, y.max(lo))),
            SUBJECT.stroke_width(2),
        ))
        .map_err(err)?;
    // The percentiles of the summary, as labelled points.
    let marks = [
        (0.5, "p50"),
        (0.9, "p90"),
        (0.99, "p99"),
        (0.999, "p99.9"),
        (0.9999, "p99.99"),
    ];
    for (q, name) in marks {
        let x = -(1.0f64 - q).log10();
        if x > max_nines + 1e-9 {
            continue;
        }
        let v = (h.value_at_quantile(q) as f64 / 1000.0).max(lo);
        chart
            .draw_series(std::iter::once(Circle::new((x, v), 4, SUBJECT.filled())))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{name} {}", us_label(v)),
                (x, v),
                ("sans-serif", 12).into_font().color(&BLACK),
            )))
            .map_err(err)?;
    }
    Ok(())
}

fn histogram_panel(area: &Area, h: &Histogram<u64>) -> Result<(), String> {
    let buckets = latency_buckets(h);
    let (Some(first), Some(last)) = (buckets.first(), buckets.last()) else {
        return Ok(());
    };
    let (lo, hi) = (first.0, last.1);
    let top = buckets.iter().map(|b| b.2).fold(0.0, f64::max).max(0.1) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption("latency histogram", ("sans-serif", 16))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| us_label(*x))
        .y_label_formatter(&|y| format!("{y:.0}%"))
        .x_desc("latency")
        .y_desc("share of I/Os")
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    // Steps: each bucket a flat top from its low to its high edge.
    let steps: Vec<(f64, f64)> = buckets
        .iter()
        .flat_map(|&(a, b, p)| [(a, p), (b, p)])
        .collect();
    chart
        .draw_series(
            AreaSeries::new(steps, 0.0, SUBJECT.mix(0.35)).border_style(SUBJECT.stroke_width(1)),
        )
        .map_err(err)?;
    for (q, name) in [(0.5, "p50"), (0.99, "p99"), (0.999, "p99.9")] {
        let v = (h.value_at_quantile(q) as f64 / 1000.0).clamp(lo, hi);
        chart
            .draw_series(std::iter::once(DashedPathElement::new(
                vec![(v, 0.0), (v, top * 0.92)],
                4,
                3,
                RGBColor(200, 40, 40).stroke_width(1),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                name.to_string(),
                (v, top * 0.97),
                ("sans-serif", 12).into_font().color(&RGBColor(200, 40, 40)),
            )))
            .map_err(err)?;
    }
    Ok(())
}

/// `--plot FILE.svg` of the initiator mode: merges the threads' histograms and writes the
/// chart. `window_ns` is the measured window (for the IOPS in the subtitle).
pub fn plot_run(
    path: &Path,
    plan: &Plan,
    hists: &[&Histogram<u64>],
    window_ns: u64,
) -> Result<(), String> {
    let mut merged = new_histogram();
    for h in hists {
        // Same bounds everywhere: adding cannot fail; were it to, the chart undercounts.
        let _ = merged.add(*h);
    }
    let urls: Vec<String> = plan.targets.iter().map(|t| t.to_string()).collect();
    let title = format!(
        "riser-perf: {} {}, QD {} x {} session(s), {} client thread(s)",
        plan.workload.name(),
        size_label(plan.bs),
        plan.qd,
        plan.sessions * plan.targets.len(),
        plan.cores.len()
    );
    let iops = if window_ns > 0 {
        merged.len() as f64 * 1e9 / window_ns as f64
    } else {
        0.0
    };
    let subtitle = format!(
        "{}; {} I/Os in {:.1} s, {:.0} IOPS; p50 {}, p99 {}, p99.9 {}, max {}",
        urls.join(" "),
        merged.len(),
        window_ns as f64 / 1e9,
        iops,
        us_label(merged.value_at_quantile(0.5) as f64 / 1000.0),
        us_label(merged.value_at_quantile(0.99) as f64 / 1000.0),
        us_label(merged.value_at_quantile(0.999) as f64 / 1000.0),
        us_label(merged.max() as f64 / 1000.0),
    );
    let svg = latency_svg(&merged, &title, &subtitle)?;
    std::fs::write(path, svg).map_err(|e| format!("--plot {}: {e}", path.display()))
}

// `u64::is_multiple_of` is newer than the workspace's rust-version (1.75).
#[allow(unknown_lints, clippy::manual_is_multiple_of)]
fn size_label(bytes: u64) -> String {
    if bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes % 1024 == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

// ---- the benchmark matrix ----------------------------------------------------------------

/// `riser-perf chart RESULTS.json`: the table of medians (stdout), and optionally the chart
/// and the medians as JSON.
#[derive(Args, Debug, Clone)]
pub struct ChartArgs {
    /// The runs: a JSON array of {"case", "target", "round", "report"} (see
    /// scripts/bench-perf-matrix.sh); the first target named is compared with the others.
    #[arg(value_name = "RESULTS.json")]
    pub input: PathBuf,

    /// Write the chart (SVG) here.
    #[arg(short = 'o', long = "output", value_name = "FILE.svg")]
    pub output: Option<PathBuf>,

    /// Write the medians and ratios as JSON here.
    #[arg(long, value_name = "FILE.json")]
    pub summary: Option<PathBuf>,

    /// Title of the chart.
    #[arg(long, default_value = "riser-perf benchmark matrix")]
    pub title: String,
}

/// Medians of one (case, target) over its rounds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Stat {
    pub runs: usize,
    pub failed: usize,
    pub iops: f64,
    pub mib_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub client_cpu_us_per_io: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CaseSummary {
    pub case: String,
    /// One per target of [`Summary::targets`], None when no run of it succeeded.
    pub stats: Vec<Option<Stat>>,
    /// Subject / peer for every peer (targets[1..]): throughput and p99 latency.
    pub iops_ratio: Vec<Option<f64>>,
    pub p99_ratio: Vec<Option<f64>>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub targets: Vec<String>,
    pub cases: Vec<CaseSummary>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    if b > 0.0 && a.is_finite() {
        Some(a / b)
    } else {
        None
    }
}

/// Reads the runs and takes the medians. Errors name what is wrong with the input.
pub fn summarize(runs: &serde_json::Value) -> Result<Summary, String> {
    let arr = runs
        .as_array()
        .ok_or("the results are not a JSON array of runs")?;
    let mut targets: Vec<String> = Vec::new();
    let mut cases: Vec<String> = Vec::new();
    // (case, target) -> (metrics of each good run, failed runs)
    type Acc = (Vec<[f64; 6]>, usize);
    let mut acc: Vec<Vec<Acc>> = Vec::new();
    for (i, r) in arr.iter().enumerate() {
        let s = |k: &str| -> Result<String, String> {
            r.get(k)
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .ok_or_else(|| format!("run {i}: no \"{k}\" string"))
        };
        let (case, target) = (s("case")?, s("target")?);
        let ti = match targets.iter().position(|t| *t == target) {
            Some(t) => t,
            None => {
                targets.push(target);
                for c in &mut acc {
                    c.push((Vec::new(), 0));
                }
                targets.len() - 1
            }
        };
        let ci = match cases.iter().position(|c| *c == case) {
            Some(c) => c,
            None => {
                cases.push(case);
                acc.push(vec![(Vec::new(), 0); targets.len()]);
                cases.len() - 1
            }
        };
        let slot = &mut acc[ci][ti];
        let Some(rep) = r.get("report").filter(|v| v.is_object()) else {
            slot.1 += 1;
            continue;
        };
        let num = |path: &[&str]| -> Option<f64> {
            let mut v = rep;
            for p in path {
                v = v.get(p)?;
            }
            v.as_f64()
        };
        let m = [
            num(&["total", "iops"]),
            num(&["total", "mib_per_s"]),
            num(&["total", "latency", "p50_us"]),
            num(&["total", "latency", "p99_us"]),
            num(&["total", "latency", "p999_us"]),
            num(&["client_cpu", "us_per_io"]),
        ];
        if m[..5].iter().any(Option::is_none) {
            return Err(format!(
                "run {i}: the report has no total.iops / total.mib_per_s / total.latency (not riser-perf --json output?)"
            ));
        }
        slot.0.push(m.map(|x| x.unwrap_or(0.0)));
    }
    if targets.is_empty() {
        return Err("no runs in the results".into());
    }
    let mut out = Vec::new();
    for (ci, case) in cases.into_iter().enumerate() {
        let stats: Vec<Option<Stat>> = acc[ci]
            .iter()
            .map(|(good, failed)| {
                if good.is_empty() {
                    return None;
                }
                let col = |k: usize| median(good.iter().map(|m| m[k]).collect());
                Some(Stat {
                    runs: good.len(),
                    failed: *failed,
                    iops: col(0),
                    mib_per_s: col(1),
                    p50_us: col(2),
                    p99_us: col(3),
                    p999_us: col(4),
                    client_cpu_us_per_io: col(5),
                })
            })
            .collect();
        let (mut iops_ratio, mut p99_ratio) = (Vec::new(), Vec::new());
        for peer in stats.iter().skip(1) {
            match (&stats[0], peer) {
                (Some(a), Some(b)) => {
                    iops_ratio.push(ratio(a.iops, b.iops));
                    p99_ratio.push(ratio(a.p99_us, b.p99_us));
                }
                _ => {
                    iops_ratio.push(None);
                    p99_ratio.push(None);
                }
            }
        }
        out.push(CaseSummary {
            case,
            stats,
            iops_ratio,
            p99_ratio,
        });
    }
    Ok(Summary {
        targets,
        cases: out,
    })
}

/// The table: one line per case, each target's medians, then the ratios.
pub fn table(s: &Summary) -> String {
    let mut t = String::new();
    let w = s
        .cases
        .iter()
        .map(|c| c.case.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let subject = &s.targets[0];
    let _ = write!(t, "{:<w$}", "case");
    for name in &s.targets {
        let _ = write!(
            t,
            " | {:>10} {:>9} {:>8} {:>8} {:>7}",
            format!("{name} IOPS"),
            "MiB/s",
            "p50 us",
            "p99 us",
            "CPU/IO"
        );
    }
    for peer in s.targets.iter().skip(1) {
        let _ = write!(
            t,
            " | {:>14} {:>9}",
            format!("{subject}/{peer} IOPS"),
            "p99"
        );
    }
    t.push('\n');
    let dash = t.len().saturating_sub(1);
    t += &"-".repeat(dash);
    t.push('\n');
    for c in &s.cases {
        let _ = write!(t, "{:<w$}", c.case);
        for st in &c.stats {
            match st {
                Some(st) => {
                    let _ = write!(
                        t,
                        " | {:>10.0} {:>9.1} {:>8.1} {:>8.1} {:>7.2}",
                        st.iops, st.mib_per_s, st.p50_us, st.p99_us, st.client_cpu_us_per_io
                    );
                }
                None => {
                    let _ = write!(
                        t,
                        " | {:>10} {:>9} {:>8} {:>8} {:>7}",
                        "failed", "-", "-", "-", "-"
                    );
                }
            }
        }
        for (a, b) in c.iops_ratio.iter().zip(&c.p99_ratio) {
            let f = |r: &Option<f64>| r.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "-".into());
            let _ = write!(t, " | {:>14} {:>9}", f(a), f(b));
        }
        t.push('\n');
    }
    t
}

/// The matrix chart: throughput ratio (top) and p99 latency ratio (bottom), subject / each
/// peer, one group of bars per case, with the 1.0 line.
pub fn matrix_svg(s: &Summary, title: &str) -> Result<String, String> {
    if s.targets.len() < 2 {
        return Err(format!(
            "the results name one target ({}): a ratio chart needs a second one",
            s.targets.first().map(String::as_str).unwrap_or("none")
        ));
    }
    if s.cases.is_empty() {
        return Err("no cases in the results".into());
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 760)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (head, body) = root.split_vertically(40);
        head.draw_text(
            title,
            &("sans-serif", 20).into_font().color(&BLACK),
            (16, 10),
        )
        .map_err(err)?;
        let (top, bottom) = body.split_vertically(360);
        let subject = &s.targets[0];
        let tp: Vec<Vec<Option<f64>>> = s.cases.iter().map(|c| c.iops_ratio.clone()).collect();
        let lat: Vec<Vec<Option<f64>>> = s.cases.iter().map(|c| c.p99_ratio.clone()).collect();
        ratio_panel(
            &top,
            s,
            &tp,
            &format!("throughput, {subject} / peer (higher is better)"),
        )?;
        ratio_panel(
            &bottom,
            s,
            &lat,
            &format!("p99 latency, {subject} / peer (lower is better)"),
        )?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn ratio_panel(
    area: &Area,
    s: &Summary,
    values: &[Vec<Option<f64>>],
    caption: &str,
) -> Result<(), String> {
    let n = s.cases.len();
    let peers = s.targets.len() - 1;
    let max = values
        .iter()
        .flatten()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max);
    let top = (max * 1.2).max(1.5);
    let names: Vec<String> = s.cases.iter().map(|c| c.case.clone()).collect();
    let label = |x: &f64| -> String {
        let r = x.round();
        if (x - r).abs() > 1e-6 || r < 0.0 {
            return String::new();
        }
        names.get(r as usize).cloned().unwrap_or_default()
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .y_label_formatter(&|y| format!("{y:.1}x"))
        .label_style(("sans-serif", 12))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    let width = 0.8 / peers as f64;
    for p in 0..peers {
        let color = PEERS[p % PEERS.len()];
        let bars: Vec<(usize, f64)> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.get(p).copied().flatten().map(|r| (i, r)))
            .collect();
        let x0 = |i: usize| i as f64 - 0.4 + p as f64 * width;
        chart
            .draw_series(bars.iter().map(|&(i, r)| {
                Rectangle::new(
                    [(x0(i) + 0.02, 0.0), (x0(i) + width - 0.02, r.min(top))],
                    color.mix(0.8).filled(),
                )
            }))
            .map_err(err)?
            .label(format!("vs {}", s.targets[p + 1]))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart
            .draw_series(bars.iter().map(|&(i, r)| {
                Text::new(
                    format!("{r:.2}x"),
                    (x0(i) + 0.04, (r + top * 0.05).min(top * 0.97)),
                    ("sans-serif", 12).into_font().color(&BLACK),
                )
            }))
            .map_err(err)?;
    }
    chart
        .draw_series(std::iter::once(DashedPathElement::new(
            vec![(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
            6,
            4,
            BLACK.stroke_width(1),
        )))
        .map_err(err)?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(RGBColor(180, 180, 180))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// `riser-perf chart ...`.
pub fn chart_main(a: &ChartArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&a.input)
        .map_err(|e| format!("cannot read {}: {e}", a.input.display()))?;
    let runs: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", a.input.display()))?;
    let s = summarize(&runs).map_err(|e| format!("{}: {e}", a.input.display()))?;
    print!("{}", table(&s));
    if let Some(p) = &a.summary {
        let j = serde_json::to_string_pretty(&s).map_err(|e| e.to_string())?;
        std::fs::write(p, j + "\n").map_err(|e| format!("--summary {}: {e}", p.display()))?;
    }
    if let Some(p) = &a.output {
        let svg = matrix_svg(&s, &a.title)?;
        std::fs::write(p, svg).map_err(|e| format!("-o {}: {e}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hist(values: &[(u64, u64)]) -> Histogram<u64> {
        let mut h = new_histogram();
        for &(v, n) in values {
            h.saturating_record_n(v, n);
        }
        h
    }

    #[test]
    fn labels() {
        assert_eq!(nines_label(0.0), "0%");
        assert_eq!(nines_label(1.0), "90%");
        assert_eq!(nines_label(2.0), "99%");
        assert_eq!(nines_label(4.0), "99.99%");
        assert_eq!(nines_label(2.5), "");
        assert_eq!(us_label(12.34), "12.3 us");
        assert_eq!(us_label(1500.0), "1.5 ms");
        assert_eq!(us_label(0.25), "0.25 us");
        assert_eq!(us_label(100.0), "100 us");
        assert_eq!(us_label(2_500_000.0), "2.5 s");
        assert_eq!(size_label(4096), "4 KiB");
        assert_eq!(size_label(1 << 20), "1 MiB");
        assert_eq!(size_label(1536), "1536 B");
    }

    #[test]
    fn curve_and_buckets_follow_the_histogram() {
        // 99 % at 10 us, 1 % at 1 ms.
        let h = hist(&[(10_000, 9_900), (1_000_000, 100)]);
        let (nines, pts) = percentile_curve(&h);
        assert!((nines - 4.0).abs() < 1e-9, "{nines}");
        assert!((pts[0].1 - 10.0).abs() < 0.05);
        // Below 2 nines (99 %) the curve is at 10 us, past it at 1 ms.
        let at = |x: f64| pts.iter().find(|p| p.0 >= x).map(|p| p.1).unwrap_or(0.0);
        assert!((at(1.9) - 10.0).abs() < 0.05, "{}", at(1.9));
        assert!((at(2.1) - 1000.0).abs() < 1.0, "{}", at(2.1));
        let b = latency_buckets(&h);
        let total: f64 = b.iter().map(|x| x.2).sum();
        assert!((total - 100.0).abs() < 1e-9);
        assert!((b[0].2 - 99.0).abs() < 1e-9, "{:?}", b[0]);
        assert!((b[b.len() - 1].2 - 1.0).abs() < 1e-9);
        // Edges are contiguous and span min..max.
        assert!(b.windows(2).all(|w| (w[0].1 - w[1].0).abs() < 1e-9));
        assert!(b[0].0 <= 10.0 && b[b.len() - 1].1 >= 1000.0);
    }

    #[test]
    fn latency_svg_is_an_svg_with_its_labels() {
        let h = hist(&[(20_000, 5000), (35_000, 4000), (400_000, 10)]);
        let svg = latency_svg(&h, "my title", "my subtitle").unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for s in [
            "my title",
            "my subtitle",
            "latency by percentile",
            "p99.9",
            "99.9%",
            "share of I/Os",
        ] {
            assert!(svg.contains(s), "no {s:?} in the SVG");
        }
        assert!(latency_svg(&new_histogram(), "t", "s")
            .unwrap_err()
            .contains("no I/O"));
    }

    fn run(case: &str, target: &str, iops: f64, p99: f64) -> serde_json::Value {
        json!({"case": case, "target": target, "round": 1, "report": {
            "total": {"iops": iops, "mib_per_s": iops / 256.0,
                      "latency": {"p50_us": p99 / 2.0, "p99_us": p99, "p999_us": p99 * 2.0}},
            "client_cpu": {"us_per_io": 3.0}}})
    }

    #[test]
    fn summary_takes_medians_and_ratios() {
        let runs = json!([
            run("randread 4k qd1", "riser", 100.0, 50.0),
            run("randread 4k qd1", "tgt", 50.0, 100.0),
            run("randread 4k qd1", "riser", 300.0, 30.0),
            run("randread 4k qd1", "tgt", 70.0, 80.0),
            run("randread 4k qd1", "riser", 200.0, 40.0),
            {"case": "randread 4k qd1", "target": "tgt", "round": 3, "error": "login failed"},
            run("write 128k qd8", "riser", 10.0, 1000.0),
        ]);
        let s = summarize(&runs).unwrap();
        assert_eq!(s.targets, vec!["riser", "tgt"]);
        assert_eq!(s.cases.len(), 2);
        let c = &s.cases[0];
        let r = c.stats[0].as_ref().unwrap();
        assert_eq!((r.runs, r.failed, r.iops, r.p99_us), (3, 0, 200.0, 40.0));
        let t = c.stats[1].as_ref().unwrap();
        // Two good runs: the mean of the middle two; one failed.
        assert_eq!((t.runs, t.failed, t.iops, t.p99_us), (2, 1, 60.0, 90.0));
        assert!((c.iops_ratio[0].unwrap() - 200.0 / 60.0).abs() < 1e-9);
        assert!((c.p99_ratio[0].unwrap() - 40.0 / 90.0).abs() < 1e-9);
        // No tgt run of the second case: no ratio, and the table says so.
        assert_eq!(s.cases[1].stats[1], None);
        assert_eq!(s.cases[1].iops_ratio, vec![None]);
        let tab = table(&s);
        assert!(tab.contains("riser/tgt IOPS"), "{tab}");
        assert!(tab.contains("3.33x"), "{tab}");
        assert!(tab.contains("failed"), "{tab}");
        let svg = matrix_svg(&s, "the matrix").unwrap();
        for x in [
            "the matrix",
            "3.33x",
            "vs tgt",
            "randread 4k qd1",
            "write 128k qd8",
        ] {
            assert!(svg.contains(x), "no {x:?} in the SVG");
        }
    }

    #[test]
    fn bad_results_are_errors_not_panics() {
        assert!(summarize(&json!({"a": 1})).unwrap_err().contains("array"));
        assert!(summarize(&json!([])).unwrap_err().contains("no runs"));
        assert!(summarize(&json!([{"target": "x"}]))
            .unwrap_err()
            .contains("\"case\""));
        assert!(
            summarize(&json!([{"case": "c", "target": "x", "report": {"total": 3}}]))
                .unwrap_err()
                .contains("not riser-perf")
        );
        let one = summarize(&json!([run("c", "riser", 1.0, 1.0)])).unwrap();
        assert!(matrix_svg(&one, "t").unwrap_err().contains("one target"));
        // The table still prints with one target.
        assert!(table(&one).contains("riser IOPS"));
    }

    #[test]
    fn plot_flag_writes_the_chart_of_a_real_run() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: crate::init::InitArgs,
        }
        let (port, _obs, h) = crate::fake_target::start();
        let dir = std::env::temp_dir().join(format!("riser-perf-plot-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let svg = dir.join("lat.svg");
        let url = format!("iscsi://127.0.0.1:{port}/iqn.2024-01.test:fake/0");
        let svg_arg = svg.display().to_string();
        let t = T::try_parse_from([
            "t", "--time", "1", "--ramp", "0", "--qd", "2", "--bs", "4096", "--no-pin", "--json",
            "--plot", &svg_arg, &url,
        ])
        .unwrap();
        assert_eq!(t.a.plot.as_deref(), Some(svg.as_path()));
        assert_eq!(crate::init::main(&t.a), Ok(true));
        let _ = h.join();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.starts_with("<svg") && text.contains("riser-perf: randread 4 KiB, QD 2"),
            "{text:.300}"
        );
        assert!(text.contains(&format!("127.0.0.1:{port}")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn chart_main_writes_both_files() {
        let dir = std::env::temp_dir().join(format!("riser-perf-chart-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let input = dir.join("r.json");
        let runs = json!([run("a", "riser", 2.0, 1.0), run("a", "tgt", 1.0, 2.0)]);
        std::fs::write(&input, runs.to_string()).unwrap();
        let a = ChartArgs {
            input: input.clone(),
            output: Some(dir.join("m.svg")),
            summary: Some(dir.join("s.json")),
            title: "t".into(),
        };
        chart_main(&a).unwrap();
        let svg = std::fs::read_to_string(dir.join("m.svg")).unwrap();
        assert!(svg.contains("2.00x"));
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("s.json")).unwrap()).unwrap();
        assert_eq!(s["cases"][0]["iops_ratio"][0], 2.0);
        std::fs::write(&input, "not json").unwrap();
        assert!(chart_main(&a).unwrap_err().contains("not JSON"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
