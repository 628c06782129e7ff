//! A logged-in initiator that sends and never reads (issue #22, item 4), against the real
//! riser over TCP: it floods 64 KiB NOP-Out pings, each of which riser answers with a 64 KiB
//! NOP-In echo. riser must stop reading such a connection while its send queue is over
//! `max_tx_queue_bytes` (the flood then fills the kernel's socket buffers and the sender
//! blocks), keep its memory within 64 MiB of where it was, close the connection once its
//! queue has not moved for `nop_timeout`, give the memory back when it closes, and go on
//! serving new sessions.

use std::io::{ErrorKind, Write};
use std::thread;
use std::time::{Duration, Instant};

use riser_iscsi::pdu::{NopOut, Op, Pdu};
use riser_iscsi::serial::Itt;
use riser_iscsi::testing::nop_out;
use riser_tests::iscsi::Client;
use riser_tests::{free_port, json, Riser};

/// Pings sent at most, and the size of each (the probe: 4096 × 64 KiB).
const PINGS: u32 = 4096;
const PING_BYTES: usize = 64 << 10;
/// The acceptance bound on riser's RSS growth while the flood is on.
const MAX_GROWTH_KIB: u64 = 64 * 1024;

/// A session that logs in declaring a MaxRecvDataSegmentLength that takes a whole echo.
fn flooder(riser: &Riser, port: u16, iqn: &str) -> Client {
    let mut c = Client::connect(port);
    c.login(iqn, &[("MaxRecvDataSegmentLength", "262144")]).unwrap_or_else(|s| panic!("login: {s:?}\n{}", riser.log()));
    assert_eq!(c.nop(b"before"), Some(b"before".to_vec()), "the session works before the flood");
    c
}

/// Sends up to PINGS immediate NOP-Outs of PING_BYTES without ever reading, with
/// non-blocking writes: stops once riser has taken nothing for `blocked_for` (its socket
/// buffers are full: riser stopped reading), when the connection fails, or after `limit`.
/// Returns the pings sent whole and whether the writes ended up blocked.
fn flood(c: &mut Client, blocked_for: Duration, limit: Duration) -> (u32, bool) {
    let itt0 = c.itt();
    let nop = NopOut { immediate: true, exp_stat_sn: c.exp_stat_sn, ..nop_out(itt0, c.cmd_sn) };
    let mut bytes = Pdu::with_data(Op::NopOut(nop), vec![0x5a; PING_BYTES]).to_bytes(c.digests).expect("encode");
    c.sock.set_nonblocking(true).expect("nonblocking");
    let t0 = Instant::now();
    let mut last_progress = Instant::now();
    let mut sent = 0;
    let mut blocked = false;
    'pings: while sent < PINGS && t0.elapsed() < limit {
        bytes[16..20].copy_from_slice(&Itt(itt0.0 + sent).0.to_be_bytes());
        let mut off = 0;
        while off < bytes.len() {
            match c.sock.write(&bytes[off..]) {
                Ok(n) => {
                    off += n;
                    last_progress = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if last_progress.elapsed() >= blocked_for {
                        blocked = true;
                        break 'pings;
                    }
                    if t0.elapsed() >= limit {
                        break 'pings;
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                Err(_) => break 'pings,
            }
        }
        sent += 1;
    }
    c.sock.set_nonblocking(false).expect("blocking");
    (sent, blocked)
}

fn connections(riser: &Riser) -> usize {
    riser.call("iscsi_get_connections", None).ok().and_then(|v| v.as_array().map(Vec::len)).unwrap_or(usize::MAX)
}

/// 4096 unread 64 KiB NOP-Outs: riser stops reading, its RSS stays within +64 MiB, another
/// session is served meanwhile; once the flooder closes, riser's memory comes back and a new
/// session works.
#[test]
fn unread_pings_keep_riser_memory_bounded() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("hostiletx", port, &[8]);
    // Warm up (a login, the reactor's first connection) before the baseline.
    {
        let mut c = Client::connect(port);
        c.login(&iqn, &[]).unwrap_or_else(|s| panic!("login: {s:?}\n{}", riser.log()));
        assert_eq!(c.nop(b"warm"), Some(b"warm".to_vec()));
    }
    thread::sleep(Duration::from_millis(300));
    let rss_before = riser.rss_kib();

    let mut c = flooder(&riser, port, &iqn);
    let (sent, blocked) = flood(&mut c, Duration::from_secs(2), Duration::from_secs(60));
    let rss_flood = riser.rss_kib();
    eprintln!("sent {sent} of {PINGS} pings of {PING_BYTES} bytes (blocked: {blocked}); riser RSS {rss_before} -> {rss_flood} KiB");
    assert!(
        rss_flood < rss_before + MAX_GROWTH_KIB,
        "riser grew from {rss_before} KiB to {rss_flood} KiB with {sent} unread 64 KiB pings\n{}",
        riser.log()
    );
    assert!(blocked && sent < PINGS, "riser read all {sent} pings of a peer that reads nothing (RSS {rss_before} -> {rss_flood} KiB)");

    // The reactor is not held up: another session works while the flooder sits there.
    {
        let mut other = Client::connect(port);
        other.login(&iqn, &[]).unwrap_or_else(|s| panic!("login during the flood: {s:?}\n{}", riser.log()));
        assert_eq!(other.nop(b"alive"), Some(b"alive".to_vec()), "a second session is served during the flood");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while connections(&riser) != 1 {
        assert!(Instant::now() < deadline, "the flooder's connection stays (nop_timeout is 60 s), the other one goes\n{}", riser.log());
        thread::sleep(Duration::from_millis(50));
    }

    // The flooder goes away: its queue is freed, a new session works.
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    while connections(&riser) != 0 {
        assert!(Instant::now() < deadline, "the flooder's connection is still there\n{}", riser.log());
        thread::sleep(Duration::from_millis(50));
    }
    thread::sleep(Duration::from_millis(500));
    let rss_after = riser.rss_kib();
    assert!(rss_after < rss_before + 16 * 1024, "riser's RSS did not come back: {rss_before} -> {rss_flood} -> {rss_after} KiB");
    let mut c = Client::connect(port);
    c.login(&iqn, &[]).unwrap_or_else(|s| panic!("login after the flood: {s:?}\n{}", riser.log()));
    assert_eq!(c.nop(b"after"), Some(b"after".to_vec()));
}

/// With nop_timeout 2 s, a flooder that never reads is disconnected, with a log line that
/// says why, well before a NOP-In ping could time out (nop_in_interval 30 s).
#[test]
fn a_peer_that_stops_reading_is_closed_at_nop_timeout() {
    let riser = Riser::start();
    riser.call("iscsi_set_options", Some(json!({"nop_timeout": 2, "nop_in_interval": 30}))).expect("iscsi_set_options");
    let port = free_port();
    let iqn = riser.add_iscsi_target("stalltx", port, &[8]);
    let mut c = flooder(&riser, port, &iqn);
    let t0 = Instant::now();
    let _ = flood(&mut c, Duration::from_secs(1), Duration::from_secs(20));
    while connections(&riser) != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(25),
            "a connection whose peer has read nothing for nop_timeout is still open\n{}",
            riser.log()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let log = riser.log();
    assert!(log.contains("stopped reading"), "no log line says why the connection closed:\n{log}");
    // Nothing was held for it: a new session works.
    let mut c2 = Client::connect(port);
    c2.login(&iqn, &[]).unwrap_or_else(|s| panic!("login after: {s:?}\n{}", riser.log()));
    assert_eq!(c2.nop(b"next"), Some(b"next".to_vec()));
    drop(c);
}
