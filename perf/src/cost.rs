//! The cost benchmark's arithmetic (`cargo run --release -p riser-perf --example cost`, `make
//! bench-cost`): instructions per I/O of riser's target side, counted by valgrind's callgrind
//! over a bounded in-process run. The run (the example) dumps callgrind's counters once per
//! workload (a client request named after the workload, one file per thread) and prints a
//! `phase` line per workload with its I/Os and the reactor's loop passes; this module reads
//! both back and makes the table. Instruction counts do not move with the machine's load,
//! so a change's cost can be judged on a busy 2-core machine.

use std::collections::BTreeMap;

/// One callgrind output file: a dump of one thread's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    /// The dump's number in the run (1, 2, ...).
    pub part: u32,
    /// valgrind's thread number (1: the main thread).
    pub thread: u32,
    /// What triggered it: the client request's name, or callgrind's own words.
    pub trigger: String,
    /// Instructions executed (Ir) while collection was on.
    pub instructions: u64,
}

/// Reads a callgrind output file (`name` is its file name, `cg.PID.PART-THREAD` with
/// `--separate-threads=yes`, for what its header leaves out).
pub fn parse_dump(name: &str, text: &str) -> Result<Dump, String> {
    let (mut part, mut thread, mut trigger, mut summary, mut totals) = (None, None, String::new(), None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match key {
            "part" => part = value.parse().ok(),
            "thread" => thread = value.parse().ok(),
            "desc" => {
                if let Some(t) = value.strip_prefix("Trigger:") {
                    let t = t.trim();
                    trigger = t.strip_prefix("Client Request:").map(str::trim).unwrap_or(t).to_string();
                }
            }
            "summary" => summary = first_number(value),
            "totals" => totals = first_number(value),
            _ => {}
        }
    }
    // From the name: ...PART-THREAD (either may be absent from the header).
    let tail = name.rsplit('.').next().unwrap_or("");
    let (name_part, name_thread) = match tail.split_once('-') {
        Some((p, t)) => (p.parse().ok(), t.parse().ok()),
        None => (None, tail.parse().ok()),
    };
    let instructions = totals.or(summary).ok_or_else(|| format!("{name}: no summary or totals line"))?;
    Ok(Dump {
        part: part.or(name_part).unwrap_or(0),
        thread: thread.or(name_thread).unwrap_or(1),
        trigger,
        instructions,
    })
}

fn first_number(s: &str) -> Option<u64> {
    s.split_whitespace().next()?.parse().ok()
}

/// What the run printed about one workload: `phase NAME ios N passes P busy_passes B`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    pub name: String,
    pub ios: u64,
    /// The target's reactor loop passes during the measured I/Os, and those with work.
    pub passes: u64,
    pub busy_passes: u64,
}

impl Phase {
    pub fn line(&self) -> String {
        format!("phase {} ios {} passes {} busy_passes {}", self.name, self.ios, self.passes, self.busy_passes)
    }

    /// The phase of a `phase ...` line; None for any other line.
    pub fn parse(line: &str) -> Option<Result<Phase, String>> {
        let rest = line.trim().strip_prefix("phase ")?;
        let words: Vec<&str> = rest.split_whitespace().collect();
        let field = |key: &str| -> Result<u64, String> {
            let i = words.iter().position(|w| *w == key).ok_or_else(|| format!("no {key} in {line:?}"))?;
            words.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(|| format!("bad {key} in {line:?}"))
        };
        let parsed = (|| {
            let name = words.first().ok_or_else(|| format!("no name in {line:?}"))?.to_string();
            Ok(Phase { name, ios: field("ios")?, passes: field("passes")?, busy_passes: field("busy_passes")? })
        })();
        Some(parsed)
    }
}

/// The phase with no I/O: the client sleeps while the target idles (its reactor passes that
/// find nothing, and its adaptive sleeps), to price an idle pass.
pub const IDLE: &str = "idle";

/// One workload's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Cost {
    pub name: String,
    pub ios: u64,
    /// Instructions per I/O of the dumped threads but the client's (the target: the example
    /// dumps its reactor), and of the client.
    pub target: f64,
    pub client: f64,
    /// `target` less the passes that found nothing, at the price of the [`IDLE`] phase's
    /// (how long the reactor spun between rounds depends on timing; the work does not).
    pub busy: Option<f64>,
    pub passes: f64,
    pub busy_passes: f64,
}

/// Per workload (in the order of `phases`, [`IDLE`] left out): the dumps its client request
/// triggered, the client's thread (`client_thread`) apart from the rest.
pub fn costs(phases: &[Phase], dumps: &[Dump], client_thread: u32) -> Result<Vec<Cost>, String> {
    let mut by_trigger: BTreeMap<&str, Vec<&Dump>> = BTreeMap::new();
    for d in dumps {
        by_trigger.entry(d.trigger.as_str()).or_default().push(d);
    }
    // (target, client) instructions of a phase.
    let totals = |p: &Phase| -> Result<(u64, u64), String> {
        let ds = by_trigger.get(p.name.as_str()).ok_or_else(|| format!("no callgrind dump for {}", p.name))?;
        let (client, target): (Vec<&&Dump>, Vec<&&Dump>) = ds.iter().partition(|d| d.thread == client_thread);
        let sum = |v: &[&&Dump]| v.iter().map(|d| d.instructions).sum::<u64>();
        Ok((sum(&target), sum(&client)))
    };
    let idle_passes = |p: &Phase| p.passes.saturating_sub(p.busy_passes);
    // Instructions per idle pass.
    let idle = match phases.iter().find(|p| p.name == IDLE) {
        Some(p) if idle_passes(p) > 0 => Some(totals(p)?.0 as f64 / idle_passes(p) as f64),
        _ => None,
    };
    phases
        .iter()
        .filter(|p| p.name != IDLE)
        .map(|p| {
            if p.ios == 0 {
                return Err(format!("{}: no I/Os", p.name));
            }
            let (target, client) = totals(p)?;
            let n = p.ios as f64;
            Ok(Cost {
                name: p.name.clone(),
                ios: p.ios,
                target: target as f64 / n,
                client: client as f64 / n,
                busy: idle.map(|c| (target as f64 - idle_passes(p) as f64 * c) / n),
                passes: p.passes as f64 / n,
                busy_passes: p.busy_passes as f64 / n,
            })
        })
        .collect()
}

/// The table `make bench-cost` prints.
pub fn table(costs: &[Cost]) -> String {
    let mut s = format!(
        "{:<16} {:>6} {:>15} {:>15} {:>15} {:>10} {:>13}\n",
        "workload", "I/Os", "target instr/IO", "less idle", "client instr/IO", "passes/IO", "busy passes/IO"
    );
    for c in costs {
        let busy = c.busy.map_or("-".to_string(), |b| format!("{b:.0}"));
        s += &format!(
            "{:<16} {:>6} {:>15.0} {:>15} {:>15.0} {:>10.3} {:>13.3}\n",
            c.name, c.ios, c.target, busy, c.client, c.passes, c.busy_passes
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npid: 4242\ncmd:  ./cost --inner\npart: 3\n\n\ndesc: I1 cache: \ndesc: D1 cache: \ndesc: LL cache: \n\ndesc: Timerange: Basic block 100 - 200\ndesc: Trigger: Client Request: randread-4k\n\npositions: line\nevents: Ir\nsummary: 123456\n\n\nob=(1) /x\nfl=(1) a.rs\nfn=(1) f\n10 5\n\ntotals: 123400\n";

    #[test]
    fn a_dump_gives_its_part_trigger_thread_and_totals() {
        let d = parse_dump("cg.4242.3-02", DUMP).unwrap();
        // totals (what was collected) wins over the header's summary; the thread is the name's.
        assert_eq!(d, Dump { part: 3, thread: 2, trigger: "randread-4k".into(), instructions: 123_400 });
        let header_thread = DUMP.replace("part: 3\n", "part: 3\nthread: 5\n");
        assert_eq!(parse_dump("cg.4242.3-02", &header_thread).unwrap().thread, 5);
        let no_totals = DUMP.replace("totals: 123400\n", "");
        assert_eq!(parse_dump("x", &no_totals).unwrap().instructions, 123_456);
        let at_exit = DUMP.replace("Client Request: randread-4k", "Program termination");
        assert_eq!(parse_dump("cg.1.4-01", &at_exit).unwrap().trigger, "Program termination");
        assert!(parse_dump("x", "part: 1\n").unwrap_err().contains("no summary"));
    }

    #[test]
    fn phase_lines_round_trip_and_bad_ones_are_errors() {
        let p = Phase { name: "seqwrite-128k".into(), ios: 400, passes: 1234, busy_passes: 800 };
        assert_eq!(Phase::parse(&p.line()), Some(Ok(p)));
        assert_eq!(Phase::parse("valgrind says hello"), None);
        assert!(Phase::parse("phase x ios 10 passes many busy_passes 1").unwrap().unwrap_err().contains("bad passes"));
        assert!(Phase::parse("phase x ios 10").unwrap().unwrap_err().contains("no passes"));
    }

    #[test]
    fn costs_divide_the_target_threads_and_the_client_by_the_ios_and_price_idle_passes() {
        let d = |part, thread, trigger: &str, instructions| Dump { part, thread, trigger: trigger.into(), instructions };
        let dumps = vec![
            d(1, 1, "a", 9_000),
            d(1, 2, "a", 40_000),
            d(1, 3, "a", 2_000),
            d(2, 1, "b", 100),
            d(2, 2, "b", 300),
            d(3, 2, "Program termination", 7),
        ];
        let phases = vec![
            Phase { name: "a".into(), ios: 1000, passes: 1500, busy_passes: 500 },
            Phase { name: "b".into(), ios: 10, passes: 20, busy_passes: 10 },
        ];
        let c = costs(&phases, &dumps, 1).unwrap();
        assert_eq!(
            c[0],
            Cost { name: "a".into(), ios: 1000, target: 42.0, client: 9.0, busy: None, passes: 1.5, busy_passes: 0.5 }
        );
        assert_eq!((c[1].target, c[1].client), (30.0, 10.0));
        let t = table(&c);
        assert!(t.lines().nth(1).unwrap().starts_with("a ") && t.contains("42"), "{t}");
        // An idle phase: 2 instructions per idle pass (600 over 300 passes, 10 of them busy
        // with a timer); "a" had 1000 idle passes: 2000 instructions less, 40 per I/O.
        let mut with_idle = phases.clone();
        with_idle.push(Phase { name: IDLE.into(), ios: 0, passes: 310, busy_passes: 10 });
        let mut dumps = dumps;
        dumps.extend([d(4, 1, IDLE, 5), d(4, 2, IDLE, 600)]);
        let c = costs(&with_idle, &dumps, 1).unwrap();
        assert_eq!(c.len(), 2, "the idle phase is no workload");
        assert_eq!((c[0].target, c[0].busy), (42.0, Some(40.0)));
        assert_eq!(c[1].busy, Some(28.0));
        assert!(table(&c).lines().nth(1).unwrap().contains(" 40 "), "{}", table(&c));
        let missing = vec![Phase { name: "c".into(), ios: 1, passes: 0, busy_passes: 0 }];
        assert!(costs(&missing, &dumps, 1).unwrap_err().contains("no callgrind dump for c"));
        let none = vec![Phase { name: "a".into(), ios: 0, passes: 0, busy_passes: 0 }];
        assert!(costs(&none, &dumps, 1).is_err());
    }
}
