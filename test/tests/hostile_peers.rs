//! "Hostile peers" (issue #22, ../shared/threat-model.md): the release riser with a malloc LUN,
//! a target without authentication and one that requires CHAP, against peers that try to lock
//! everyone else out, end a live CHAP session, grow riser's memory or starve the others. After
//! each attack a healthy initiator must still be served, and when every connection is gone
//! riser is alive and its memory back near where it started.
//!
//! Each phase asserts what failed on the code before the hardening: 300 abandoned or failed
//! logins filled the session table (max_sessions 128) for good; a login with a live session's
//! InitiatorName and ISID and no secret reinstated (ended) it; 1024 stalled logins used up every
//! login thread; unread NOP-In echoes grew the daemon by hundreds of MiB; and silent writers held
//! the I/O buffer budget so that a fifth session's 64 KiB write never completed.

use std::io::Write;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use riser_iscsi::pdu::{Digests, Lun, NopOut, Op, Pdu, ScsiCommand, Stage};
use riser_iscsi::testing::{nop_out, scsi_command};
use riser_tests::iscsi::{connect_from, Client, INITIATOR};
use riser_tests::{free_port, Riser};
use serde_json::{json, Value};

const CHAP_USER: &str = "alice";
const CHAP_SECRET: &str = "alice-secret-0123456789";
/// The CHAP session's own initiator name (the attackers copy it and its ISID).
const CHAP_INITIATOR: &str = "iqn.2024-01.io.riser.test:chap-victim";
/// The malloc LUN (LUN 0 of both targets' nodes): what healthy sessions write and read back.
const MALLOC_MIB: u64 = 64;
/// A null LUN (LUN 1 of the open target) that silent writers aim at, large enough that
/// their commands do not overlap (overlapping writes would wait on each other, not on memory).
const NULL_BLOCKS: u64 = 16 << 21; // 16 GiB of 512-byte blocks

fn call(riser: &Riser, method: &str, params: Value) -> Value {
    riser.call(method, Some(params)).unwrap_or_else(|e| panic!("{method}: {e}\nriser log:\n{}", riser.log()))
}

struct Node {
    riser: Riser,
    port: u16,
    open: String,
    chap: String,
}

/// The release riser: portal 127.0.0.1:PORT, initiator group ANY, target `open` (malloc LUN 0,
/// null LUN 1, no authentication) and target `chap` (its own malloc LUN 0, CHAP required).
fn node() -> Node {
    let riser = Riser::start_release(&[]);
    let port = free_port();
    call(&riser, "bdev_malloc_create", json!({"name": "m_open", "num_blocks": MALLOC_MIB * 2048, "block_size": 512}));
    call(&riser, "bdev_malloc_create", json!({"name": "m_chap", "num_blocks": 16 * 2048, "block_size": 512}));
    call(&riser, "bdev_null_create", json!({"name": "n_open", "num_blocks": NULL_BLOCKS, "block_size": 512}));
    let luns = vec![json!({"bdev_name": "m_open", "lun_id": 0}), json!({"bdev_name": "n_open", "lun_id": 1})];
    let open = riser.add_iscsi_target_on("open", port, luns);
    let chap = riser.add_iscsi_target_on("chap", port, vec![json!({"bdev_name": "m_chap", "lun_id": 0})]);
    call(&riser, "iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": CHAP_USER, "secret": CHAP_SECRET}]}));
    call(&riser, "iscsi_target_node_set_auth", json!({"name": chap, "chap_group": 1, "require_chap": true}));
    Node { riser, port, open, chap }
}

/// A healthy session: logged in (CHAP when `chap`), unit attentions cleared.
fn healthy(n: &Node, chap: bool) -> Client {
    let mut c = Client::connect(n.port);
    let r = if chap { c.login_chap(INITIATOR, &n.chap, CHAP_USER, CHAP_SECRET) } else { c.login(&n.open, &[]) };
    r.unwrap_or_else(|s| panic!("a healthy {} login was refused: {s:x?}\nriser log:\n{}", if chap { "CHAP" } else { "plain" }, log_tail(&n.riser)));
    assert!(c.clear_unit_attentions(), "TEST UNIT READY never succeeded\n{}", log_tail(&n.riser));
    c
}

fn log_tail(riser: &Riser) -> String {
    let log = riser.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// Writes a pattern of `len` bytes at `lba`, reads it back and compares.
fn write_read_back(c: &mut Client, lba: u32, len: usize, seed: u32) -> Result<(), String> {
    let data: Vec<u8> = (0..len as u32).map(|i| (i.wrapping_mul(131) ^ seed.wrapping_mul(7)) as u8).collect();
    match c.write10_solicited(lba, &data) {
        Some(0) => {}
        s => return Err(format!("write at {lba}: status {s:?}")),
    }
    match c.read10(lba, (len / 512) as u16) {
        Some((0, back)) if back == data => Ok(()),
        Some((s, back)) => Err(format!("read at {lba}: status {s}, data equal: {}", back == data)),
        None => Err(format!("read at {lba}: connection lost")),
    }
}

fn rss_mib(riser: &Riser) -> f64 {
    riser.rss_kib() as f64 / 1024.0
}

/// The first Login Request of a normal session to `target` (security stage, T=0 for CHAP so
/// the target offers its methods), as a fresh initiator with its own ISID.
fn first_request(c: &mut Client, initiator: &str, target: &str, auth: &str) -> Pdu {
    let keys = [("InitiatorName", initiator), ("TargetName", target), ("SessionType", "Normal"), ("AuthMethod", auth)];
    c.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, auth == "None", &keys)
}

/// 1. 300 logins that stop after the first Login Response (both targets), and 300 that send a
///    wrong CHAP_R, each with its own ISID; then a healthy login of each kind.
fn abandoned_and_failed_logins(n: &Node) {
    for i in 0..300 {
        let mut c = Client::connect(n.port);
        let (target, auth) = if i % 2 == 0 { (&n.open, "None") } else { (&n.chap, "CHAP") };
        let req = first_request(&mut c, INITIATOR, target, auth);
        let r = c.login_step(&req);
        assert!(r.is_ok(), "abandoned login {i}: its first request was refused: {r:x?}\n{}", log_tail(&n.riser));
        // Abandoned: the connection closes with the login half done.
    }
    for i in 0..300 {
        let mut c = Client::connect(n.port);
        let r = c.login_chap(INITIATOR, &n.chap, CHAP_USER, "not-the-secret-0123");
        assert_eq!(r.err(), Some((0x02, 0x01)), "failed CHAP login {i} must end in Authentication failure");
    }
    let mut plain = healthy(n, false);
    write_read_back(&mut plain, 64, 4096, 1).unwrap_or_else(|e| panic!("after 600 bad logins: {e}"));
    let mut chap = healthy(n, true);
    write_read_back(&mut chap, 64, 4096, 2).unwrap_or_else(|e| panic!("after 600 bad logins (CHAP): {e}"));
}

/// A session that writes and reads back until told to stop; counts verified rounds.
fn io_loop(mut c: Client, stop: Arc<AtomicBool>, ok: Arc<AtomicU64>) -> thread::JoinHandle<Result<(), String>> {
    thread::spawn(move || {
        let mut round = 0u32;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            write_read_back(&mut c, (round * 8) % 4096, 4096, round)?;
            ok.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    })
}

/// 2. A CHAP session doing I/O survives 3 logins that copy its InitiatorName and ISID without
///    its secret (session reinstatement), and one that copies its TSIH and CID (connection
///    reinstatement).
fn no_reinstatement_without_authentication(n: &Node) {
    let mut victim = Client::connect(n.port);
    victim.login_chap(CHAP_INITIATOR, &n.chap, CHAP_USER, CHAP_SECRET).unwrap_or_else(|s| panic!("CHAP login: {s:x?}"));
    assert!(victim.clear_unit_attentions());
    let (isid, tsih, cid) = (victim.isid, victim.tsih, victim.cid);
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let io = io_loop(victim, stop.clone(), ok.clone());
    thread::sleep(Duration::from_millis(300));
    for attempt in 0..3 {
        let mut c = Client::connect(n.port);
        c.isid = isid;
        let r = if attempt == 0 {
            // No credentials at all: AuthMethod=None, straight to the operational stage.
            let req = first_request(&mut c, CHAP_INITIATOR, &n.chap, "None");
            c.login_step(&req).map(|_| ())
        } else {
            c.login_chap(CHAP_INITIATOR, &n.chap, CHAP_USER, "guessed-secret-0123").map(|_| ())
        };
        assert!(r.is_err(), "an unauthenticated login with the victim's ISID succeeded");
    }
    {
        let mut c = Client::connect(n.port);
        (c.isid, c.tsih, c.cid) = (isid, tsih, cid);
        let r = c.login_chap(CHAP_INITIATOR, &n.chap, CHAP_USER, "guessed-secret-0123");
        assert!(r.is_err(), "an unauthenticated connection reinstatement succeeded");
    }
    let before = ok.load(Ordering::Relaxed);
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let r = io.join().expect("I/O thread");
    assert!(r.is_ok(), "the CHAP session was disturbed by unauthenticated logins: {r:?}\n{}", log_tail(&n.riser));
    assert!(ok.load(Ordering::Relaxed) > before, "the CHAP session made no progress after the attempts");
}

/// 3. 1024 connections from 4 other source addresses that start a discovery login padded with
///    unknown keys (each echoed NotUnderstood) and never read; then a healthy login from
///    127.0.0.1 succeeds at once.
fn logins_that_never_read(n: &Node) {
    let mut padding = String::new();
    for k in 0..400 {
        padding.push_str(&format!("X-riser-pad-{k:04}=1\0"));
    }
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..1024u32 {
        let src = Ipv4Addr::new(127, 0, 0, 2 + (i % 4) as u8);
        let sock = match connect_from(src, n.port, Some(4096)) {
            Ok(s) => s,
            Err(_) => {
                refused += 1;
                continue;
            }
        };
        sock.set_write_timeout(Some(Duration::from_millis(200))).ok();
        let mut c = Client::over(sock);
        let keys = [("InitiatorName", INITIATOR), ("SessionType", "Discovery"), ("AuthMethod", "None")];
        let mut req = c.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, false, &keys);
        req.data.extend_from_slice(padding.as_bytes());
        if let Ok(bytes) = req.to_bytes(Digests::default()) {
            let _ = c.sock.write_all(&bytes);
        }
        held.push(c);
    }
    let t0 = Instant::now();
    let mut c = healthy(n, false);
    write_read_back(&mut c, 128, 4096, 3).unwrap_or_else(|e| panic!("beside 1024 stalled logins: {e}"));
    assert!(t0.elapsed() < Duration::from_secs(10), "a healthy login took {:?} beside 1024 stalled logins", t0.elapsed());
    let mut d = healthy(n, true);
    write_read_back(&mut d, 128, 4096, 4).unwrap_or_else(|e| panic!("beside 1024 stalled logins (CHAP): {e}"));
    eprintln!("hostile_peers: 1024 stalled logins ({refused} not even connected), healthy logins served");
    drop(held);
}

/// 4. A logged-in initiator sends 4096 immediate NOP-Outs with 64 KiB pings and never reads
///    the NOP-Ins: riser's RSS stays within +64 MiB (it stops reading the connection).
fn unread_pings(n: &Node) {
    let rss0 = rss_mib(&n.riser);
    let mut c = Client::connect(n.port);
    c.login(&n.open, &[]).unwrap_or_else(|s| panic!("login: {s:x?}"));
    c.sock.set_write_timeout(Some(Duration::from_secs(3))).ok();
    let ping = vec![0x5au8; 65536];
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..4096 {
        let itt = c.itt();
        let nop = NopOut { exp_stat_sn: c.exp_stat_sn, ..nop_out(itt, c.cmd_sn) };
        let Ok(bytes) = Pdu::with_data(Op::NopOut(nop), ping.clone()).to_bytes(Digests::default()) else { break };
        if c.sock.write_all(&bytes).is_err() || Instant::now() > deadline {
            break; // riser stopped reading: the socket buffers are full
        }
        sent += 1;
    }
    thread::sleep(Duration::from_millis(500));
    let grown = rss_mib(&n.riser) - rss0;
    eprintln!("hostile_peers: {sent} unread 64 KiB NOP-Outs written; RSS grew {grown:.1} MiB");
    assert!(grown < 64.0, "{sent} unread 64 KiB NOP-Outs grew riser by {grown:.1} MiB (bound 64 MiB)\n{}", log_tail(&n.riser));
    // A healthy session is still served meanwhile.
    let mut h = healthy(n, false);
    write_read_back(&mut h, 256, 4096, 5).unwrap_or_else(|e| panic!("beside the unread pings: {e}"));
}

/// A SCSI command on LUN `lun` with a 16-byte CDB, no immediate data.
fn cmd16(c: &mut Client, opcode: u8, lun: u64, lba: u64, blocks: u32) -> Pdu {
    let mut cdb = [0u8; 16];
    cdb[0] = opcode;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    let itt = c.itt();
    let cmd = ScsiCommand {
        lun: Lun(lun << 48),
        exp_stat_sn: c.exp_stat_sn,
        ..scsi_command(itt, c.cmd_sn, false, true, blocks * 512, &cdb)
    };
    c.cmd_sn = c.cmd_sn.next();
    Pdu::with_data(Op::ScsiCommand(cmd), Vec::new())
}

/// 5. Silent writers: four sessions each send 32 WRITE(16) of 16 MiB (streamed), then two
///    sessions one WRITE AND VERIFY(16) of 32 MiB each (one whole buffer), and never answer an
///    R2T. A fifth session's 64 KiB write and read-back completes meanwhile.
fn silent_writers(n: &Node) {
    const WRITE16: u8 = 0x8a;
    const WRITE_AND_VERIFY16: u8 = 0x8e;
    let mut silent = Vec::new();
    let mut next_lba = 0u64;
    let mut start = |commands: &[(u8, u32)]| {
        let mut c = Client::connect(n.port);
        c.login(&n.open, &[]).unwrap_or_else(|s| panic!("silent writer login: {s:x?}"));
        for &(op, blocks) in commands {
            let pdu = cmd16(&mut c, op, 1, next_lba, blocks);
            next_lba += blocks as u64;
            c.send(&pdu).expect("send a silent write");
        }
        silent.push(c);
    };
    for _ in 0..4 {
        start(&[(WRITE16, 32768); 32]);
    }
    for _ in 0..2 {
        start(&[(WRITE_AND_VERIFY16, 65536)]);
    }
    // Let the writers take what they can.
    thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let (port, open, d2) = (n.port, n.open.clone(), done.clone());
    let fifth = thread::spawn(move || -> Result<(), String> {
        let mut c = Client::connect(port);
        c.login(&open, &[]).map_err(|s| format!("login {s:x?}"))?;
        if !c.clear_unit_attentions() {
            return Err("TEST UNIT READY failed".into());
        }
        write_read_back(&mut c, 1024, 65536, 6)?;
        d2.store(true, Ordering::Relaxed);
        Ok(())
    });
    // A liveness check with a generous bound, below the default Data-Out timeout: the fifth
    // session is served because the writers cannot take its share, not because they time out.
    while !done.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(15) && !fifth.is_finished() {
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        done.load(Ordering::Relaxed),
        "a fifth session's 64 KiB write and read-back did not complete within 15 s beside silent writers ({:?})\n{}",
        if fifth.is_finished() { fifth.join().ok() } else { None },
        log_tail(&n.riser)
    );
    fifth.join().expect("fifth").unwrap_or_else(|e| panic!("fifth session: {e}"));
    eprintln!("hostile_peers: fifth session served in {:?} beside 6 silent writers", t0.elapsed());
    drop(silent);
}

fn wait_no_connections(n: &Node) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let conns = call(&n.riser, "iscsi_get_connections", json!({}));
        if conns.as_array().is_some_and(|a| a.is_empty()) {
            return;
        }
        assert!(Instant::now() < deadline, "connections left 30 s after every client closed: {conns}");
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn hostile_peers() {
    let mut n = node();
    // Warm up (first login, first I/O, pools) before taking the starting figure.
    {
        let mut c = healthy(&n, false);
        write_read_back(&mut c, 0, 65536, 0).unwrap_or_else(|e| panic!("warm-up: {e}"));
    }
    wait_no_connections(&n);
    let rss_start = rss_mib(&n.riser);

    abandoned_and_failed_logins(&n);
    no_reinstatement_without_authentication(&n);
    logins_that_never_read(&n);
    unread_pings(&n);
    silent_writers(&n);

    wait_no_connections(&n);
    thread::sleep(Duration::from_secs(1));
    assert!(n.riser.is_running(), "riser died\n{}", log_tail(&n.riser));
    let rss_end = rss_mib(&n.riser);
    eprintln!("hostile_peers: RSS {rss_start:.1} MiB at the start, {rss_end:.1} MiB after every connection closed");
    assert!(
        rss_end < rss_start + 16.0,
        "riser's RSS is {rss_end:.1} MiB after every hostile connection closed, {rss_start:.1} MiB at the start (bound +16 MiB)\n{}",
        log_tail(&n.riser)
    );
    // And it still serves.
    let mut c = healthy(&n, true);
    write_read_back(&mut c, 512, 4096, 7).unwrap_or_else(|e| panic!("at the end: {e}"));
}
