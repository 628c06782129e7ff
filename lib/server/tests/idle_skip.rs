//! Idle connections cost a reactor pass almost nothing (issue 25, item 2): a TCP connection
//! with provably nothing to do returns at once (`ConnInfo::skipped_polls`), and one that
//! then gets a command, a NOP-Out, a logout request or a timer's ping is still served.
mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{good, keys, pattern, Client, Env, TcpWire, BLOCK, WAIT};
use riser_initiator::session::Event;
use riser_server::registry::ConnInfo;
use serde_json::json;

/// A target behind the real TCP portal on a free port, and that port's address.
fn tcp_env() -> (Env, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let addr = format!("127.0.0.1:{port}");
    (Env::tcp(&addr), addr)
}

fn login(addr: &str, n: u8) -> Client<TcpWire> {
    Client::login_over(TcpWire::connect(addr.parse().expect("address")), n, keys(true, false, 65536)).0
}

/// The connection of initiator port `n` (ISID ending in `n`).
fn info(env: &Env, n: u8) -> Arc<ConnInfo> {
    env.server.connections().list().into_iter().find(|c| c.isid & 0xff == u64::from(n)).expect("the connection")
}

fn polls(c: &ConnInfo) -> (u64, u64) {
    (c.full_polls.load(Ordering::Relaxed), c.skipped_polls.load(Ordering::Relaxed))
}

/// Waits until connection `c` skips passes (it is idle and its reactor passes).
fn wait_skipping(c: &ConnInfo) {
    let (_, before) = polls(c);
    let deadline = Instant::now() + WAIT;
    while polls(c).1 == before {
        assert!(Instant::now() < deadline, "an idle connection never skips a pass: {:?}", polls(c));
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn sixty_four_idle_connections_skip_their_passes_while_a_busy_one_does_verified_io() {
    let (env, addr) = tcp_env();
    let idle: Vec<Client<TcpWire>> = (1..=64).map(|n| login(&addr, n)).collect();
    let mut busy = login(&addr, 100);
    env.wait_connections(65);
    let idle_infos: Vec<Arc<ConnInfo>> = (1..=64).map(|n| info(&env, n)).collect();
    let before: Vec<(u64, u64)> = idle_infos.iter().map(|c| polls(c)).collect();
    let busy_info = info(&env, 100);
    let busy_before = polls(&busy_info);
    // 4 KiB writes, each read back and compared, over the LUN's 1 MiB.
    let len = 4096;
    for i in 0..1500u32 {
        let lba = u64::from(i * 8) % (2048 - 8);
        let data = pattern(i as u8, len);
        good(&busy.write(lba, &data));
        let r = busy.read(lba, len);
        good(&r);
        assert_eq!(r.data, data, "I/O {i} at LBA {lba} reads back what it wrote");
    }
    let (mut full, mut skipped) = (0u64, 0u64);
    for (c, b) in idle_infos.iter().zip(&before) {
        let (f, s) = polls(c);
        full += f - b.0;
        skipped += s - b.1;
    }
    let busy_full = polls(&busy_info).0 - busy_before.0;
    println!(
        "64 idle connections over 3000 I/Os of the busy one: {full} full polls, {skipped} skipped; the busy one polled {busy_full} times"
    );
    // Every idle connection skips; their full polls (their timer, 10 a second) are a small
    // fraction of the passes.
    assert!(idle_infos.iter().zip(&before).all(|(c, b)| polls(c).1 > b.1), "every idle connection skipped passes");
    assert!(full * 10 < skipped, "idle connections polled fully {full} times and skipped {skipped} passes");
    assert!(busy_full >= 3000, "the busy connection polled fully on every pass it had work ({busy_full})");
    // The idle ones are still served.
    for mut c in idle {
        good(&c.read(0, BLOCK));
        c.logout();
    }
    busy.logout();
}

#[test]
fn an_idle_connection_is_served_a_command_a_nop_out_a_ping_and_a_logout_request() {
    let (env, addr) = tcp_env();
    env.call("iscsi_set_options", json!({"nop_in_interval": 1}));
    let mut c = login(&addr, 1);
    let ci = info(&env, 1);
    // A command after idle passes: a write, then its data read back.
    wait_skipping(&ci);
    let data = pattern(7, 8192);
    good(&c.write(16, &data));
    wait_skipping(&ci);
    let r = c.read(16, data.len());
    good(&r);
    assert_eq!(r.data, data);
    // A NOP-Out after idle passes is echoed.
    wait_skipping(&ci);
    let (itt, nop) = c.s.nop_out(b"still there");
    c.send([nop]);
    let echoed = c.until(|e| match e {
        Event::NopIn { itt: i, data } if *i == itt => Some(data.clone()),
        _ => None,
    });
    assert_eq!(echoed, b"still there");
    // The timer still runs on an idle connection: the target pings it after
    // nop_in_interval (1 s) without a PDU, and takes the answer.
    wait_skipping(&ci);
    let reply = c.until(|e| match e {
        Event::Ping { reply } => Some(reply.clone()),
        _ => None,
    });
    c.send([reply]);
    // A logout request through the RPC reaches the idle connection (the Async Message
    // asking for a logout, AsyncEvent 1).
    wait_skipping(&ci);
    env.call("iscsi_target_node_request_logout", json!({"name": "disk1"}));
    let event = c.until(|e| match e {
        Event::Async(a) => Some(a.async_event),
        _ => None,
    });
    assert_eq!(event, 1, "the Async Message asks for a logout");
    let (full, skipped) = polls(&ci);
    println!("the connection polled fully {full} times and skipped {skipped} passes");
    c.logout();
    env.wait_connections(0);
}
