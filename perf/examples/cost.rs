//! The cost benchmark (`make bench-cost`): instructions per I/O of riser's target side, a
//! figure the machine's load cannot move. It runs itself under valgrind's callgrind
//! (`--inner`): riser's real server (lib/server) on one adaptive reactor, its TCP datamover
//! over the in-memory pipe (riser-datamover's `mem`), a null LUN, driven by one session of
//! riser-initiator's session core on the main thread at a fixed queue depth: N I/Os of 4 KiB
//! random read and write and of 128 KiB sequential read and write, in rounds of QD commands
//! sent at once (so the target does the same work whatever the timing). Before each workload's
//! measured I/Os (after as many to warm up) it zeroes callgrind's counters, after them it
//! dumps them (the reactor's and the client's, each from its own thread: one file each); the pipe's own copying (`MemStream`'s read and write,
//! the kernel's work over TCP) is left uncounted (`--toggle-collect`). Then it prints, per
//! workload, the instructions per I/O of the reactor's thread (the target), of the
//! client, and the reactor's loop passes per I/O (riser-perf's `cost` module does the sums);
//! and the target's instructions less its idle passes (how many the reactor makes between
//! rounds depends on timing), each at the price measured while the session idles 300 ms.
//!
//! `cargo run --release -p riser-perf --example cost -- [--ios N] [--ios-large N] [--qd Q]
//! [--out DIR]`; valgrind must be installed (scripts/setup.sh bench-cost).

use std::net::SocketAddr;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use riser_bdev::BdevRegistry;
use riser_config::IscsiTarget;
use riser_datamover::mem::{MemClient, MemPortal};
use riser_initiator::scsi::{rw_cdb, Dir};
use riser_initiator::session::{Event, KeyNegotiation, LoginParams, PduSession, Proposal, Unsolicited, INITIATOR_NAME};
use riser_iscsi::pdu::{logout, Digests, Lun, Pdu};
use riser_perf::cost::{costs, parse_dump, table, Phase, IDLE};
use riser_reactor::{PollMode, ReactorConfig, ReactorHandle, ReactorSet};
use riser_rpc::RpcRegistry;
use riser_server::IscsiServer;
use serde_json::{json, Value};

#[derive(Parser, Debug)]
#[command(about = "riser's instructions per I/O under callgrind (in memory, null LUN)")]
struct Args {
    /// Measured I/Os of each 4 KiB workload (as many again warm up).
    #[arg(long, default_value_t = 4000)]
    ios: u64,
    /// Measured I/Os of each 128 KiB workload.
    #[arg(long, default_value_t = 400)]
    ios_large: u64,
    /// Commands in flight.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Where callgrind's files go (kept); default: a temporary directory, removed.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Run the workloads (under callgrind: what the outer run starts).
    #[arg(long, hide = true)]
    inner: bool,
}

const PORTAL: &str = "127.0.0.1:3260";
const TARGET: &str = "iqn.2016-06.io.riser:disk1";
const BLOCK: u64 = 512;
/// The null LUN: 1 GiB.
const BLOCKS: u64 = 1 << 21;
const WAIT: Duration = Duration::from_secs(60);

/// The workloads: name, I/O size, write, random.
const WORKLOADS: [(&str, u32, bool, bool); 4] = [
    ("randread-4k", 4096, false, true),
    ("randwrite-4k", 4096, true, true),
    ("seqread-128k", 131_072, false, false),
    ("seqwrite-128k", 131_072, true, false),
];

/// The symbols of the in-memory pipe's copying, left uncounted.
const PIPE: [&str; 2] =
    ["<riser_datamover::mem::MemStream as std::io::Read>::read*", "<riser_datamover::mem::MemStream as std::io::Write>::write*"];

fn main() -> ExitCode {
    let args = Args::parse();
    let r = if args.inner { inner(&args) } else { outer(&args) };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cost: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs this program under callgrind with `--inner`, then reads its dumps.
fn outer(args: &Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let (dir, keep) = match &args.out {
        Some(d) => (d.clone(), true),
        None => (std::env::temp_dir().join(format!("riser-cost-{}", std::process::id())), false),
    };
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg("--separate-threads=yes")
        .arg("--dump-instr=no")
        // Each dump names its functions in full: with compressed names, a per-thread dump
        // refers to names defined in another, and callgrind_annotate cannot read it alone.
        .arg("--compress-strings=no")
        .arg(format!("--callgrind-out-file={}/cg.%p", dir.display()))
        .arg(format!("--log-file={}/valgrind.log", dir.display()));
    for f in PIPE {
        cmd.arg(format!("--toggle-collect={f}"));
    }
    // After the toggles, which turn it off.
    cmd.arg("--collect-atstart=yes");
    cmd.arg(&exe)
        .args(["--inner", "--ios", &args.ios.to_string(), "--ios-large", &args.ios_large.to_string()])
        .args(["--qd", &args.qd.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    let out = cmd.output().map_err(|e| format!("valgrind: {e} (scripts/setup.sh bench-cost installs it)"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("the run under callgrind failed ({}); its log: {}/valgrind.log\n{stdout}", out.status, dir.display()));
    }
    let phases = stdout.lines().filter_map(Phase::parse).collect::<Result<Vec<_>, _>>()?;
    let mut dumps = Vec::new();
    let mut pipe_seen = false;
    for e in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("cg.") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).map_err(|e| format!("{name}: {e}"))?;
        if text.is_empty() {
            continue; // the file named by --callgrind-out-file itself: the dumps are per thread
        }
        // Collected (it should not be: its calls are toggled off, so never named).
        pipe_seen |= text.contains("MemStream as std::io::Read>::read");
        dumps.push(parse_dump(&name, &text)?);
    }
    let costs = costs(&phases, &dumps, 1)?;
    println!("riser's cost per I/O in instructions (callgrind), in memory, null LUN, rounds of {} commands:", args.qd);
    println!("target: the reactor's thread, the pipe's copying left out; less idle: without the reactor's idle passes");
    print!("{}", table(&costs));
    if pipe_seen {
        println!("(warning: MemStream::read was counted: the pipe's copying is in the figures)");
    }
    if keep {
        println!("callgrind files: {} (callgrind_annotate FILE)", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// Under callgrind: the target, one session, the workloads.
fn inner(args: &Args) -> Result<(), String> {
    let reactors = ReactorSet::start(ReactorConfig { cores: vec![0], mode: PollMode::Adaptive, ring_size: 1024, pin: false })
        .map_err(|e| format!("reactors: {e}"))?;
    let handle = reactors.handle();
    let bdevs = Arc::new(Mutex::new(BdevRegistry::new()));
    let target = Arc::new(IscsiTarget::new(bdevs.clone()));
    let portal = MemPortal::default();
    let server = IscsiServer::new(target.clone(), reactors.handle(), vec![Arc::new(portal.clone())]);
    let mut rpc = RpcRegistry::new();
    riser_bdev::rpc::register(&mut rpc, &bdevs);
    riser_config::rpc::register(&mut rpc, target.clone());
    riser_server::rpc::register(&mut rpc, &server);
    let call = |method: &str, params: Value| rpc.call(method, params).map_err(|e| format!("{method}: {e:?}"));
    let run = || -> Result<(), String> {
        call("bdev_null_create", json!({"name": "Null0", "num_blocks": BLOCKS, "block_size": BLOCK}))?;
        let (host, port) = PORTAL.rsplit_once(':').ok_or("portal")?;
        call("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": host, "port": port}]}))?;
        call("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}))?;
        call(
            "iscsi_create_target_node",
            json!({"name": "disk1", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
                   "luns": [{"bdev_name": "Null0", "lun_id": 0}], "queue_depth": 64}),
        )?;
        let from: SocketAddr = "127.0.0.11:40001".parse().map_err(|e| format!("{e}"))?;
        let wire = portal.connect(from, PORTAL.parse().map_err(|e| format!("{e}"))?).map_err(|e| format!("connect: {e}"))?;
        let mut c = Client::login(wire)?;
        for (name, size, write, random) in WORKLOADS {
            let n = if size > 4096 { args.ios_large } else { args.ios };
            let mut w = Workload::new(size, write, random);
            c.run(&mut w, n, args.qd)?;
            let before = handle.stats()[0].clone();
            zero(&handle)?;
            c.run(&mut w, n, args.qd)?;
            dump(&handle, name)?;
            let after = handle.stats()[0].clone();
            let phase = Phase {
                name: name.to_string(),
                ios: n,
                passes: after.passes - before.passes,
                busy_passes: after.busy_passes - before.busy_passes,
            };
            println!("{}", phase.line());
        }
        // The idle price: the session open, nothing sent.
        let before = handle.stats()[0].clone();
        zero(&handle)?;
        std::thread::sleep(Duration::from_millis(300));
        dump(&handle, IDLE)?;
        let after = handle.stats()[0].clone();
        let idle = Phase { name: IDLE.to_string(), ios: 0, passes: after.passes - before.passes, busy_passes: after.busy_passes - before.busy_passes };
        println!("{}", idle.line());
        c.logout()
    };
    let r = run();
    server.shutdown();
    reactors.shutdown();
    r
}

/// Zeroes callgrind's counters of this thread (the client's) and of the reactor's: a client
/// request acts on the thread that makes it.
fn zero(reactors: &ReactorHandle) -> Result<(), String> {
    callgrind::zero_stats();
    reactors.call(0, |_| callgrind::zero_stats()).map_err(|e| format!("reactor: {e}"))
}

/// Dumps the reactor's counters and this thread's, as `name`.
fn dump(reactors: &ReactorHandle, name: &'static str) -> Result<(), String> {
    reactors.call(0, move |_| callgrind::dump_stats_at(name)).map_err(|e| format!("reactor: {e}"))?;
    callgrind::dump_stats_at(name);
    Ok(())
}

/// What a workload issues next.
struct Workload {
    size: u32,
    write: bool,
    random: bool,
    next: u64,
    rng: u64,
    data: Vec<u8>,
}

impl Workload {
    fn new(size: u32, write: bool, random: bool) -> Workload {
        let data = if write { (0..size).map(|i| (i as u8).wrapping_mul(31)).collect() } else { Vec::new() };
        // A fixed seed: the same LBAs every run.
        Workload { size, write, random, next: 0, rng: 0x9e37_79b9_7f4a_7c15, data }
    }

    /// The next I/O's first block.
    fn lba(&mut self) -> u64 {
        let blocks = self.size as u64 / BLOCK;
        let slots = BLOCKS / blocks;
        let slot = if self.random {
            // xorshift64
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            self.rng % slots
        } else {
            self.next = (self.next + 1) % slots;
            self.next
        };
        slot * blocks
    }
}

/// One initiator session over the in-memory pipe.
struct Client {
    s: PduSession,
    wire: MemClient,
}

impl Client {
    fn login(wire: MemClient) -> Result<Client, String> {
        let mut c = Client { s: PduSession::new("cost", Lun(0)), wire };
        let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, 1]);
        let wire = &mut c.wire;
        // riser-perf's keys, but the MaxRecvDataSegmentLength the in-memory client's framer
        // takes (8 KiB: a 128 KiB read comes in 16 Data-In PDUs).
        let proposal = Proposal { max_recv_dsl: 8192, ..Proposal::tcp(false, false) };
        c.s.login_via(&params, KeyNegotiation::with_proposal(proposal), |req| {
            wire.send(&req).map_err(|e| e.to_string())?;
            wire.recv(WAIT).map_err(|e| e.to_string())?.ok_or_else(|| "closed during login".to_string())
        })?;
        // A new I_T nexus first sees a UNIT ATTENTION.
        for _ in 0..3 {
            let (itt, pdus) = c.s.scsi_command(&[0u8; 6], 0, &[], Unsolicited::Negotiated)?;
            c.send(pdus)?;
            loop {
                if let Event::Complete(done) = c.next()? {
                    if done.itt == itt && done.status == 0 {
                        return Ok(c);
                    }
                    break;
                }
            }
        }
        Err("TEST UNIT READY never became GOOD".into())
    }

    fn send(&mut self, pdus: impl IntoIterator<Item = Pdu>) -> Result<(), String> {
        for p in pdus {
            self.wire.send(&p).map_err(|e| format!("send: {e}"))?;
        }
        Ok(())
    }

    fn next(&mut self) -> Result<Event, String> {
        let pdu = self.wire.recv(WAIT).map_err(|e| format!("receive: {e}"))?.ok_or("the target closed the connection")?;
        self.s.receive(&pdu)
    }

    /// `n` I/Os of `w` in rounds of `qd`: the round's commands in one write (the target
    /// finds them all at once, whenever it looks: the same work every run), then every
    /// answer (R2Ts answered at once); every command must end GOOD.
    fn run(&mut self, w: &mut Workload, n: u64, qd: usize) -> Result<(), String> {
        let (mut issued, mut done) = (0u64, 0u64);
        let blocks = w.size / BLOCK as u32;
        let mut batch = Vec::new();
        while done < n {
            batch.clear();
            while issued < n && self.s.outstanding() < qd && self.s.window_open() {
                let lba = w.lba();
                let pdus = if w.write {
                    self.s.write(&rw_cdb(Dir::Write, lba, blocks), &w.data)?.1
                } else {
                    vec![self.s.read(&rw_cdb(Dir::Read, lba, blocks), w.size)?.1]
                };
                for p in pdus {
                    batch.extend(p.to_bytes(Digests::default()).map_err(|e| format!("encoding: {e}"))?);
                }
                issued += 1;
            }
            if batch.is_empty() {
                return Err("the target's command window is closed with nothing in flight".into());
            }
            self.wire.send_raw(&batch).map_err(|e| format!("send: {e}"))?;
            while self.s.outstanding() > 0 {
                match self.next()? {
                    Event::Complete(c) => {
                        if (c.response, c.status) != (0, 0) {
                            return Err(format!("{:?} ended with response {} status {} ({:?})", c.itt, c.response, c.status, c.sense));
                        }
                        done += 1;
                    }
                    Event::R2t { reply, .. } => self.send(reply)?,
                    Event::Ping { reply } => self.send([reply])?,
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn logout(mut self) -> Result<(), String> {
        let (_, pdu) = self.s.logout(logout::CLOSE_SESSION);
        self.send([pdu])?;
        while !matches!(self.next()?, Event::Logout { .. }) {}
        Ok(())
    }
}

/// callgrind's client requests (valgrind/callgrind.h): no-ops when not under valgrind.
mod callgrind {
    /// VG_USERREQ_TOOL_BASE('C', 'T').
    const BASE: u64 = ((b'C' as u64) << 24) | ((b'T' as u64) << 16);
    const ZERO_STATS: u64 = BASE + 1;
    const DUMP_STATS_AT: u64 = BASE + 3;

    /// Zeroes the calling thread's counters (with `--separate-threads=yes`).
    pub fn zero_stats() {
        request(ZERO_STATS, 0);
    }

    /// Dumps the calling thread's counters (with `--separate-threads=yes`), named `name`.
    pub fn dump_stats_at(name: &str) {
        let c = std::ffi::CString::new(name).unwrap_or_default();
        request(DUMP_STATS_AT, c.as_ptr() as u64);
    }

    /// valgrind's client request: the magic preamble (four rotations of rdi that add up to
    /// none) then `xchg rbx, rbx`, the request's words pointed to by rax, its answer in rdx.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    fn request(code: u64, arg: u64) {
        let words: [u64; 6] = [code, arg, 0, 0, 0, 0];
        let mut answer: u64 = 0;
        // SAFETY: outside valgrind the sequence leaves every register as it was (rdi turns
        // by 128 bits in all, rbx is swapped with itself) and touches no memory; under
        // valgrind, callgrind reads `words` (alive for the call) and the string its second
        // word points to (alive in the caller), and writes rdx only.
        unsafe {
            std::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") words.as_ptr(),
                inout("rdx") answer,
                inout("rdi") 0u64 => _,
                options(nostack),
            );
        }
        let _ = answer;
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn request(_code: u64, _arg: u64) {}
}
