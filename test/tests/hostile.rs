//! Hostile input against the real riser over TCP: every bad connection gets a Reject, a
//! login failure or a close, while a healthy session keeps doing verified reads and writes,
//! and the daemon's memory stays bounded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use riser_iscsi::pdu::{Digests, Op, Stage};
use riser_tests::iscsi::{raw_header, reject_reason, Client};
use riser_tests::{free_port, Riser};

/// A session that writes a pattern, reads it back and compares, until told to stop.
fn healthy_session(port: u16, iqn: String, stop: Arc<AtomicBool>, ok: Arc<AtomicU64>) -> thread::JoinHandle<Result<(), String>> {
    thread::spawn(move || {
        let mut c = Client::connect(port);
        c.login(&iqn, &[]).map_err(|s| format!("healthy login failed: {s:?}"))?;
        if !c.clear_unit_attentions() {
            return Err("TEST UNIT READY never succeeded".into());
        }
        let mut round: u32 = 0;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let lba = (round * 8) % 8192;
            let data: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(31) ^ round) as u8).collect();
            match c.write10(lba, &data) {
                Some(0) => {}
                s => return Err(format!("write {round} at {lba}: status {s:?}")),
            }
            match c.read10(lba, 8) {
                Some((0, back)) if back == data => {}
                Some((s, back)) => return Err(format!("read {round} at {lba}: status {s}, data equal: {}", back == data)),
                None => return Err(format!("read {round}: connection lost")),
            }
            ok.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    })
}

fn expect_reject_or_close(c: &mut Client, what: &str) {
    match c.recv() {
        None => {}
        Some(p) => assert!(
            reject_reason(&p).is_some() || matches!(p.bhs.op, Op::LoginResponse(_)),
            "{what}: expected a Reject, a login failure or a close, got {:?}",
            p.bhs.op
        ),
    }
}

#[test]
fn hostile_clients_do_not_hurt_a_healthy_session() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("hostile", port, &[8]);
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let healthy = healthy_session(port, iqn.clone(), stop.clone(), ok.clone());
    thread::sleep(Duration::from_millis(200));
    let rss_before = riser.rss_kib();

    // 1. A truncated BHS, then the peer goes away.
    {
        let mut c = Client::connect(port);
        c.send_raw(&raw_header(0x43, 0, 1)[..20]).unwrap();
    }
    // 2. SCSI command before login: the login phase refuses it.
    {
        let mut c = Client::connect(port);
        let cmd = c.scsi_command(&[0x00; 6], false, false, 0, Vec::new());
        c.send(&cmd).unwrap();
        match c.recv() {
            None => {}
            Some(p) => match p.bhs.op {
                Op::LoginResponse(r) => assert_ne!(r.status.class, 0, "a SCSI command must not log anyone in"),
                other => panic!("SCSI command before login answered with {other:?}"),
            },
        }
    }
    // 3. Unknown keys and out-of-range values at login: NotUnderstood / Reject, login goes on.
    {
        let mut c = Client::connect(port);
        let keys = c
            .login(&iqn, &[("X-riser-bogus", "1"), ("MaxBurstLength", "1"), ("FirstBurstLength", "zzz")])
            .expect("login with odd keys still succeeds");
        let get = |k: &str| keys.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("X-riser-bogus"), Some("NotUnderstood"), "{keys:?}");
        assert_eq!(get("FirstBurstLength"), Some("Reject"), "{keys:?}");
        assert!(matches!(get("MaxBurstLength"), Some("Reject")), "{keys:?}");
        assert_eq!(c.nop(b"alive"), Some(b"alive".to_vec()));
    }
    // 4. Unknown opcode in full-feature phase: Reject (command not supported), session lives.
    {
        let mut c = Client::connect(port);
        c.login(&iqn, &[]).unwrap_or_else(|s| panic!("login: {s:?}\n{}", riser.log()));
        c.send_raw(&raw_header(0x1c, 0, 7)).unwrap();
        let p = c.recv().expect("a Reject");
        assert_eq!(reject_reason(&p), Some(0x05), "unknown opcode: {:?}", p.bhs.op);
        assert_eq!(c.nop(b"x"), Some(b"x".to_vec()), "the session must survive a Reject");
    }
    // 5. A data segment beyond the negotiated maximum: Reject and/or close, never a crash.
    {
        let mut c = Client::connect(port);
        c.login(&iqn, &[]).unwrap_or_else(|s| panic!("login: {s:?}\n{}", riser.log()));
        let mut h = raw_header(0x40, (1 << 24) - 1, 9);
        h[20..24].copy_from_slice(&u32::MAX.to_be_bytes()); // TTT reserved
        c.send_raw(&h).unwrap();
        let _ = c.send_raw(&vec![0u8; 65536]);
        expect_reject_or_close(&mut c, "oversized data segment");
        assert!(c.closed_within(Duration::from_secs(10)), "an oversized segment must end the connection");
    }
    // 6. Wrong header digest: the connection is dropped (framing cannot be trusted).
    {
        let mut c = Client::connect(port);
        c.digests = Digests { header: true, data: true };
        c.login(&iqn, &[]).unwrap_or_else(|s| panic!("login: {s:?}\n{}", riser.log()));
        let nop = c.nop(b"digest ok");
        assert_eq!(nop, Some(b"digest ok".to_vec()), "digests negotiated and working");
        let mut bytes = c.scsi_command(&[0u8; 6], false, false, 0, Vec::new()).to_bytes(c.digests).unwrap();
        bytes[48] ^= 0xff; // corrupt the header digest
        c.send_raw(&bytes).unwrap();
        assert!(c.closed_within(Duration::from_secs(10)), "a header digest error must drop the connection");
    }
    // 7. Wrong data digest: Reject (data digest error), the connection goes on.
    {
        let mut c = Client::connect(port);
        c.digests = Digests { header: true, data: true };
        c.login(&iqn, &[]).unwrap_or_else(|s| panic!("login: {s:?}\n{}", riser.log()));
        let pdu = c.text(false, b"SendTargets=All\0");
        let mut bytes = pdu.to_bytes(c.digests).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        c.send_raw(&bytes).unwrap();
        let p = c.recv().expect("a Reject");
        assert_eq!(reject_reason(&p), Some(0x02), "data digest error: {:?}", p.bhs.op);
        assert_eq!(c.nop(b"y"), Some(b"y".to_vec()));
    }
    // 8. A Text PDU with C=1 and no data: answered, nothing crashes, session lives.
    {
        let mut c = Client::connect(port);
        c.login(&iqn, &[]).unwrap_or_else(|s| panic!("login: {s:?}\n{}", riser.log()));
        let t = c.text(true, b"");
        c.send(&t).unwrap();
        let p = c.recv().expect("an answer");
        assert!(matches!(p.bhs.op, Op::TextResponse(_) | Op::Reject(_)), "{:?}", p.bhs.op);
        assert_eq!(c.nop(b"z"), Some(b"z".to_vec()));
    }
    // 9. A login that stalls halfway, and 500 half-open connections, all at once.
    let mut stalled = Client::connect(port);
    let half = stalled.login_request(Stage::SecurityNegotiation, Stage::LoginOperationalNegotiation, true, &[("InitiatorName", "iqn.x")]);
    let bytes = half.to_bytes(Digests::default()).unwrap();
    stalled.send_raw(&bytes[..bytes.len() / 2]).unwrap();
    let half_open: Vec<_> = (0..500).map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect")).collect();
    let ok_before = ok.load(Ordering::Relaxed);
    thread::sleep(Duration::from_secs(2));
    if healthy.is_finished() {
        let r = healthy.join();
        panic!("healthy session ended early: {r:?}\nriser log:\n{}", riser.log());
    }
    assert!(
        ok.load(Ordering::Relaxed) > ok_before,
        "the healthy session made no progress while 500 connections were half open ({} rounds so far)",
        ok_before
    );
    drop(half_open);
    // The stalled login is dropped by the login timeout.
    let t0 = Instant::now();
    assert!(stalled.closed_within(Duration::from_secs(30)), "a stalled login must be dropped");
    assert!(t0.elapsed() < Duration::from_secs(30));

    stop.store(true, Ordering::Relaxed);
    let r = healthy.join().expect("healthy thread");
    assert!(r.is_ok(), "healthy session failed: {r:?}\nriser log:\n{}", riser.log());
    assert!(ok.load(Ordering::Relaxed) > 20, "too few verified rounds: {}", ok.load(Ordering::Relaxed));
    // Everything hostile is gone: memory back near where it was (threads and buffers freed).
    thread::sleep(Duration::from_millis(500));
    let rss_after = riser.rss_kib();
    assert!(
        rss_after < rss_before + 64 * 1024,
        "riser grew from {rss_before} KiB to {rss_after} KiB during the hostile run"
    );
    let conns = riser.call("iscsi_get_connections", None).unwrap();
    assert!(conns.as_array().is_some_and(|a| a.is_empty()), "connections left: {conns}");
}
