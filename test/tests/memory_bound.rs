//! Bounded memory for writes: riser must not hold a write command's whole buffer while the
//! initiator is slow to send the data, and writes that wait for buffer memory must still
//! complete.
//!
//! 1. Slow writers: 4 sessions each queue 32 WRITE(16)s of 16 MiB (InitialR2T=Yes,
//!    ImmediateData=No, so nothing arrives before an R2T) on a 2 GiB null LUN and answer the
//!    R2Ts at 2 MiB/s per connection for 3 s, then drop their sockets. riser's resident
//!    memory may grow by at most 64 MiB over the baseline, during the phase and after the
//!    close, and riser must still serve a fresh login and a 4 KiB READ.
//! 2. Writers that send: 4 sessions each write their own 16 MiB region of a 64 MiB malloc
//!    LUN 4 times (16 MiB WRITE(16)s, all outstanding at once, R2Ts answered at once and in
//!    full); every write ends GOOD and each region reads back as the write that completed
//!    last.
//!
//! The two tests take turns (a lock), so one's traffic does not slow the other's clock on a
//! small machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use riser_tests::iscsi::Client;
use riser_tests::slow_writer::{open_session, run_prompt_writer, run_slow_writer, PromptPlan, PromptReport, SlowPlan, SlowReport};
use riser_tests::{free_port, json, Riser, Value};

const MIB: u64 = 1 << 20;
/// EDTL of every write.
const COMMAND_BYTES: u32 = 16 << 20;
const BLOCK: u32 = 512;
const SESSIONS: usize = 4;
/// Slow phase: commands per session, rate per connection, how long.
const SLOW_COMMANDS: u32 = 32;
const SLOW_RATE: u64 = 2 * MIB;
const SLOW_PHASE: Duration = Duration::from_secs(3);
const AFTER_CLOSE: Duration = Duration::from_millis(1500);
/// The acceptance bound on riser's RSS growth.
const MAX_GROWTH_KIB: u64 = 64 * 1024;

static TURNS: Mutex<()> = Mutex::new(());

fn take_turn() -> MutexGuard<'static, ()> {
    TURNS.lock().unwrap_or_else(|e| e.into_inner())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The last `n` characters of riser's log, for failure messages.
fn log_tail(riser: &Riser, n: usize) -> String {
    let log = riser.log();
    let start = log.len().saturating_sub(n);
    let start = (start..log.len()).find(|i| log.is_char_boundary(*i)).unwrap_or(log.len());
    log[start..].to_string()
}

/// A target `iqn.2016-06.io.riser:NAME` on 127.0.0.1:`port` with one null LUN of `mib` MiB
/// (`block` bytes per block), queue depth 64 (the CmdSN window), open to any initiator.
fn add_null_target(riser: &Riser, name: &str, port: u16, mib: u64, block: u32) -> String {
    let call = |m: &str, p: Value| {
        riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", riser.log()))
    };
    let bdev = format!("{name}_null");
    call("bdev_null_create", json!({"name": bdev, "num_blocks": mib * MIB / u64::from(block), "block_size": block}));
    call("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": port.to_string()}]}));
    call("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
    call(
        "iscsi_create_target_node",
        json!({"name": name, "alias_name": name, "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
               "luns": [{"bdev_name": bdev, "lun_id": 0}], "queue_depth": 64}),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "riser did not listen on port {port}:\n{}", riser.log());
        thread::sleep(Duration::from_millis(20));
    }
    format!("iqn.2016-06.io.riser:{name}")
}

/// A fresh session logs in, clears its unit attention and reads 4 KiB.
fn login_and_read_4k(riser: &Riser, port: u16, iqn: &str, what: &str) {
    let mut c = Client::connect(port);
    c.login(iqn, &[]).unwrap_or_else(|s| panic!("{what}: login failed {s:?}\nriser log:\n{}", log_tail(riser, 4000)));
    assert!(c.clear_unit_attentions(), "{what}: TEST UNIT READY never succeeded\nriser log:\n{}", log_tail(riser, 4000));
    let (status, data) = c
        .read10(0, (4096 / BLOCK) as u16)
        .unwrap_or_else(|| panic!("{what}: connection lost during a 4 KiB READ\nriser log:\n{}", log_tail(riser, 4000)));
    assert_eq!(status, 0, "{what}: 4 KiB READ status");
    assert_eq!(data.len(), 4096, "{what}: 4 KiB READ length");
}

#[test]
fn slow_writers_do_not_make_riser_hold_their_write_buffers() {
    let _turn = take_turn();
    let t0 = Instant::now();
    let mut riser = Riser::start();
    let port = free_port();
    let iqn = add_null_target(&riser, "mbnull", port, 2048, BLOCK);

    // Warm up: one small login, write and read, so the baseline includes a session's cost.
    {
        let mut c = Client::connect(port);
        c.login(&iqn, &[]).unwrap_or_else(|s| panic!("warm-up login failed {s:?}\n{}", riser.log()));
        assert!(c.clear_unit_attentions(), "warm-up: TEST UNIT READY never succeeded");
        assert_eq!(c.write10(0, &[0x5a; 4096]), Some(0), "warm-up 4 KiB write");
        let r = c.read10(0, (4096 / BLOCK) as u16).expect("warm-up read: connection lost");
        assert_eq!(r.0, 0, "warm-up read status");
    }
    thread::sleep(Duration::from_millis(300));
    let baseline = riser.rss_kib();
    assert!(baseline > 0, "cannot read riser's RSS from /proc");

    // 4 sessions, each its own 512 MiB area of the LUN (32 x 16 MiB).
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<String, String>>();
    let area_blocks = u64::from(SLOW_COMMANDS) * u64::from(COMMAND_BYTES / BLOCK);
    let writers: Vec<thread::JoinHandle<Result<SlowReport, String>>> = (0..SESSIONS)
        .map(|i| {
            let (stop, go, ready, iqn) = (stop.clone(), go.clone(), ready_tx.clone(), iqn.clone());
            thread::spawn(move || {
                let (conn, neg) = match open_session(port, &iqn, &[]) {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = ready.send(Err(format!("session {i}: {e}")));
                        return Err(e);
                    }
                };
                let _ = ready.send(Ok(format!(
                    "session {i}: InitialR2T=Yes ImmediateData=No agreed, target MRDSL {}, MaxBurstLength {}, CmdSN window {}",
                    neg.target_mrdsl,
                    neg.max_burst_length,
                    conn.cmd_sn.distance_to(conn.max_cmd_sn).wrapping_add(1)
                )));
                // All four start writing together, once all are logged in.
                while !go.load(Ordering::Relaxed) {
                    if stop.load(Ordering::Relaxed) {
                        return Err("stopped before the phase began".into());
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                let plan = SlowPlan {
                    commands: SLOW_COMMANDS,
                    command_bytes: COMMAND_BYTES,
                    block_size: BLOCK,
                    lba: i as u64 * area_blocks,
                    area_blocks,
                    bytes_per_sec: SLOW_RATE,
                    max_pdu: 64 * 1024,
                };
                run_slow_writer(conn, &neg, &plan, &stop).map_err(|e| format!("session {i}: {e}"))
            })
        })
        .collect();
    drop(ready_tx);
    let mut login_errors = Vec::new();
    for _ in 0..SESSIONS {
        match ready_rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(line)) => println!("{line}"),
            Ok(Err(e)) => login_errors.push(e),
            Err(e) => login_errors.push(format!("a session did not log in within 20 s: {e}")),
        }
    }
    if !login_errors.is_empty() {
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            let _ = w.join();
        }
        panic!("slow writers could not start: {login_errors:?}\nriser log:\n{}", log_tail(&riser, 4000));
    }

    // The phase: the writers queue their commands and trickle data; sample riser's RSS
    // every 100 ms.
    go.store(true, Ordering::Relaxed);
    let phase_start = Instant::now();
    let mut peak = baseline;
    let mut phase_samples = 0;
    while phase_start.elapsed() < SLOW_PHASE {
        thread::sleep(Duration::from_millis(100));
        peak = peak.max(riser.rss_kib());
        phase_samples += 1;
    }
    let peak_during = peak;
    let phase_len = phase_start.elapsed();
    // Drop all 4 connections abruptly (no logout): the writer threads end and close them.
    stop.store(true, Ordering::Relaxed);
    let mut reports = Vec::new();
    let mut writer_errors = Vec::new();
    for (i, w) in writers.into_iter().enumerate() {
        match w.join() {
            Ok(Ok(r)) => reports.push(r),
            Ok(Err(e)) => writer_errors.push(e),
            Err(_) => writer_errors.push(format!("session {i}: writer thread panicked")),
        }
    }
    let closed = Instant::now();
    let mut after_close = riser.rss_kib();
    while closed.elapsed() < AFTER_CLOSE {
        thread::sleep(Duration::from_millis(100));
        after_close = riser.rss_kib();
        peak = peak.max(after_close);
    }

    for (i, r) in reports.iter().enumerate() {
        let mut statuses: Vec<u8> = r.responses.iter().map(|(_, s)| *s).collect();
        statuses.sort_unstable();
        println!(
            "slow writer {i}: {} WRITE(16) x 16 MiB sent (first window {}), {} R2Ts (first after {}) asking {:.1} MiB, {:.1} MiB of Data-Out sent, \
             {} completed (statuses {statuses:?}), {} rejects",
            r.commands_sent,
            r.first_window,
            r.r2ts,
            r.first_r2t_after.map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64())),
            r.r2t_bytes_asked as f64 / MIB as f64,
            r.data_bytes_sent as f64 / MIB as f64,
            r.responses.len(),
            r.rejects
        );
    }
    let growth = peak.saturating_sub(baseline);
    println!(
        "riser RSS: baseline {:.1} MiB, peak {:.1} MiB during the {:.1} s slow phase ({phase_samples} samples), \
         {:.1} MiB after close; peak overall {:.1} MiB: growth {:.1} MiB (bound {:.0} MiB)",
        mib(baseline),
        mib(peak_during),
        phase_len.as_secs_f64(),
        mib(after_close),
        mib(peak),
        mib(growth),
        mib(MAX_GROWTH_KIB)
    );
    assert!(writer_errors.is_empty(), "slow writers failed: {writer_errors:?}\nriser log:\n{}", log_tail(&riser, 4000));

    // riser lives and still serves a new session.
    assert!(riser.is_running(), "riser died during the slow-writer phase:\n{}", log_tail(&riser, 8000));
    login_and_read_4k(&riser, port, &iqn, "after the slow writers");
    println!("slow-writer test took {:.1} s", t0.elapsed().as_secs_f64());

    assert!(
        growth <= MAX_GROWTH_KIB,
        "riser's RSS grew by {:.1} MiB (baseline {:.1} MiB, peak {:.1} MiB, {:.1} MiB after close) while 4 slow \
         writers had {} x 16 MiB WRITEs outstanding; at most {:.0} MiB is allowed: write buffers must be bounded",
        mib(growth),
        mib(baseline),
        mib(peak),
        mib(after_close),
        reports.iter().map(|r| r.commands_sent).sum::<u32>(),
        mib(MAX_GROWTH_KIB)
    );
}

#[test]
fn writers_that_send_their_data_all_complete_and_read_back() {
    const COMMANDS: u8 = 4;
    let _turn = take_turn();
    let t0 = Instant::now();
    let riser = Riser::start();
    let port = free_port();
    // 64 MiB malloc LUN (512-byte blocks): one 16 MiB region per session.
    let iqn = riser.add_iscsi_target("mbmalloc", port, &[64]);
    let region_blocks = u64::from(COMMAND_BYTES / BLOCK);
    let deadline = Instant::now() + Duration::from_secs(45);
    let writers: Vec<thread::JoinHandle<Result<PromptReport, String>>> = (0..SESSIONS)
        .map(|i| {
            let iqn = iqn.clone();
            thread::spawn(move || {
                let (mut conn, neg) = open_session(port, &iqn, &[]).map_err(|e| format!("session {i}: {e}"))?;
                let plan = PromptPlan {
                    session: i as u8,
                    region_lba: i as u64 * region_blocks,
                    region_bytes: COMMAND_BYTES,
                    commands: COMMANDS,
                    block_size: BLOCK,
                    read_chunk: 1 << 20,
                    deadline,
                };
                run_prompt_writer(&mut conn, &neg, &plan).map_err(|e| format!("session {i}: {e}"))
            })
        })
        .collect();
    let mut errors = Vec::new();
    for (i, w) in writers.into_iter().enumerate() {
        match w.join() {
            Ok(Ok(r)) => println!(
                "prompt writer {i}: {} WRITE(16) x 16 MiB all GOOD, {} R2Ts answered, completion order {:?}, {:.0} MiB read back and verified",
                r.commands,
                r.r2ts,
                r.completion_order,
                r.verified_bytes as f64 / MIB as f64
            ),
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push(format!("session {i}: writer thread panicked")),
        }
    }
    println!("writers-that-send test took {:.1} s", t0.elapsed().as_secs_f64());
    assert!(errors.is_empty(), "writers that send their data failed: {errors:?}\nriser log:\n{}", log_tail(&riser, 4000));
}
