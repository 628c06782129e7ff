//! What the initiator mode prints: the description of the run, the live line, and the
//! summary of a benchmark (human text and JSON).

use serde::Serialize;

use super::client::{Failover, SessionInfo, ThreadResult};
use super::{Geometry, Mode, Plan};
use crate::report::{Latency, Report, WorkerResult};
use crate::workload::PollModeArg;

const MIB: f64 = 1024.0 * 1024.0;

pub(super) fn live_line(
    label: &str,
    secs: u64,
    ios: u64,
    lat_ns: u64,
    dt: f64,
    bs: u64,
    to_stderr: bool,
) {
    let iops = ios as f64 / dt;
    let mean_us = if ios > 0 {
        lat_ns as f64 / ios as f64 / 1000.0
    } else {
        0.0
    };
    let line = format!(
        "[{secs:>4} s]{label} {iops:>10.0} IOPS, {:>9.2} MiB/s, mean latency {mean_us:>8.1} us",
        iops * bs as f64 / MIB
    );
    if to_stderr {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

#[derive(Serialize)]
struct Cpu {
    user_s: f64,
    sys_s: f64,
    /// Of one core, over the measured window.
    pct_of_core: f64,
    us_per_io: f64,
    /// Whole process, whole run (login and teardown included).
    process_user_s: f64,
    process_sys_s: f64,
}

#[derive(Serialize)]
pub(super) struct VerifyOut {
    pub(super) passed: bool,
    pub(super) generation: u64,
    pub(super) blocks_checked: u64,
    pub(super) mismatched_blocks: u64,
    pub(super) mismatches: Vec<String>,
    pub(super) write_s: Option<f64>,
    pub(super) read_s: f64,
}

pub(super) fn describe(plan: &Plan, infos: &[Option<SessionInfo>], geoms: &[Geometry]) -> String {
    let mut s = String::new();
    for (i, g) in infos.iter().zip(geoms) {
        let Some(i) = i else { continue };
        s += &format!(
            "{}: {} blocks of {} B ({:.1} GiB), using {}:{}; {} session(s); HeaderDigest {}, DataDigest {}, ImmediateData {}, InitialR2T {}, FirstBurstLength {}, {} {}\n",
            i.url,
            g.num_blocks,
            g.block_size,
            g.num_blocks as f64 * g.block_size as f64 / (1u64 << 30) as f64,
            g.start,
            g.count,
            plan.sessions,
            if i.header_digest { "CRC32C" } else { "None" },
            if i.data_digest { "CRC32C" } else { "None" },
            if i.immediate_data { "Yes" } else { "No" },
            if i.initial_r2t { "Yes" } else { "No" },
            i.first_burst_length,
            if i.transport == "iser" {
                "RDMAExtensions Yes, TargetRecvDataSegmentLength"
            } else {
                "target MaxRecvDataSegmentLength"
            },
            i.target_max_recv_data_segment_length,
        );
    }
    if plan.mode == Mode::Bench {
        let mix = if plan.workload.mixed() {
            format!(" ({} % reads)", plan.read_pct)
        } else {
            String::new()
        };
        s += &format!(
            "{}{mix}, {} B I/Os, qd {} per session, {} client thread(s) on cores {:?}, {} s measured after {} s ramp\n",
            plan.workload.name(),
            plan.bs,
            plan.qd,
            plan.cores.len(),
            plan.cores,
            plan.time.as_secs(),
            plan.ramp.as_secs()
        );
    } else {
        s += &format!(
            "verify: {} B I/Os, qd {} per session, {} client thread(s)\n",
            plan.bs,
            plan.qd,
            plan.cores.len()
        );
    }
    s
}

/// The summary: (JSON text, human text).
pub(super) fn bench_report(
    plan: &Plan,
    rs: &[(usize, Box<ThreadResult>)],
    geoms: &[Geometry],
    proc0: (u64, u64),
    proc1: (u64, u64),
    infos: &[SessionInfo],
    failovers: &[Failover],
) -> (String, String) {
    let workers: Vec<WorkerResult> = rs
        .iter()
        .map(|(t, r)| {
            let busy = r.cpu_user_ns + r.cpu_sys_ns;
            WorkerResult {
                reactor: *t,
                core: r.core,
                ios: r.ios,
                reads: r.reads,
                errors: 0,
                elapsed_ns: r.elapsed_ns,
                busy_ns: busy,
                idle_ns: r.elapsed_ns.saturating_sub(busy),
                hist: r.hist.clone(),
            }
        })
        .collect();
    let config = serde_json::json!({
        "urls": plan.targets.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        "paths": plan.paths.iter().map(|p| p.iter().map(|t| t.to_string()).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "rw": plan.workload,
        "rwmixread": plan.read_pct,
        "bs": plan.bs,
        "qd": plan.qd,
        "sessions_per_url": plan.sessions,
        "time_s": plan.time.as_secs(),
        "ramp_s": plan.ramp.as_secs(),
        "cores": plan.cores,
        "pin": plan.pin,
        "poll_mode": if plan.poll_mode == PollModeArg::Busy { "busy" } else { "adaptive" },
        "lun": geoms,
    });
    let report = Report::build(String::new(), config, plan.bs, &workers);
    let user: u64 = rs.iter().map(|(_, r)| r.cpu_user_ns).sum();
    let sys: u64 = rs.iter().map(|(_, r)| r.cpu_sys_ns).sum();
    let window = rs.iter().map(|(_, r)| r.elapsed_ns).max().unwrap_or(0);
    let t = &report.total;
    let cpu = Cpu {
        user_s: user as f64 / 1e9,
        sys_s: sys as f64 / 1e9,
        pct_of_core: if window > 0 {
            (user + sys) as f64 * 100.0 / window as f64
        } else {
            0.0
        },
        us_per_io: if t.ios > 0 {
            (user + sys) as f64 / 1000.0 / t.ios as f64
        } else {
            0.0
        },
        process_user_s: proc1.0.saturating_sub(proc0.0) as f64 / 1e9,
        process_sys_s: proc1.1.saturating_sub(proc0.1) as f64 / 1e9,
    };
    let mut v = serde_json::to_value(&report).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        if let Some(r) = o.remove("reactors") {
            o.insert("threads".into(), r);
        }
        o.insert(
            "client_cpu".into(),
            serde_json::to_value(&cpu).unwrap_or_default(),
        );
        o.insert(
            "sessions".into(),
            serde_json::to_value(infos).unwrap_or_default(),
        );
        if plan.paths.iter().any(|p| p.len() > 1) {
            o.insert(
                "failovers".into(),
                serde_json::to_value(failovers).unwrap_or_default(),
            );
        }
    }
    let json = serde_json::to_string_pretty(&v).unwrap_or_default();

    let mut s = String::new();
    for w in &report.reactors {
        s += &format!(
            "thread {} (core {}): {:.0} IOPS, {:.2} MiB/s, CPU {:.1} %\n",
            w.reactor, w.core, w.iops, w.mib_per_s, w.busy_pct
        );
    }
    let l: &Latency = &t.latency;
    s += "total:\n";
    s += &format!(
        "  IOPS:       {:.0} (read {:.0}, write {:.0})\n",
        t.iops, t.read_iops, t.write_iops
    );
    s += &format!("  MiB/s:      {:.2}\n", t.mib_per_s);
    s += &format!("  I/Os:       {} ({} errors)\n", t.ios, t.errors);
    s += &format!(
        "  latency us: min {:.1}, p50 {:.1}, p90 {:.1}, p99 {:.1}, p99.9 {:.1}, p99.99 {:.1}, max {:.1} (mean {:.1})\n",
        l.min_us, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.p9999_us, l.max_us, l.avg_us
    );
    s += &format!(
        "  client CPU: {:.2} s (user {:.2} s, sys {:.2} s) = {:.1} % of one core, {:.2} us per I/O\n",
        cpu.user_s + cpu.sys_s,
        cpu.user_s,
        cpu.sys_s,
        cpu.pct_of_core,
        cpu.us_per_io
    );
    (json, s)
}
