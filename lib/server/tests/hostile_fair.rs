//! Hostile initiators and the I/O buffer budget (issue #22, item 5): sessions that send large
//! writes and never answer the R2Ts must not starve the others, and what they pin is given
//! back by the Data-Out timeout. Over the in-memory datamover, against the real server (see
//! scenarios.rs); the budget is riser's global pool at its defaults (48 MiB).
//!
//! The tests share the global pool, so they run one at a time ([`serial`]).

mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use riser_buf::Pool;
use riser_iscsi::pdu::{Lun, Op, Pdu};
use riser_iscsi::serial::Itt;
use riser_initiator::scsi::{rw_cdb, Dir};
use riser_initiator::session::{Completed, Event};
use riser_initiator::url::lun_field;
use serde_json::json;

use common::*;

const MIB: usize = 1 << 20;
/// The LUN the silent writers write to: 32 MiB (room for the largest transfer).
const BIG_LUN: u64 = 1;
const BIG_BLOCKS: u32 = (32 * MIB / BLOCK) as u32;
/// The liveness bound: a healthy session's small write and read-back must be done by then
/// (they take milliseconds; this is no speed test).
const LIVENESS: Duration = Duration::from_secs(10);

/// One test at a time: they all fill the process's one buffer budget.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The target of [`Env::new`] with a second, 32 MiB LUN for the large writes.
fn env_with_big_lun() -> Env {
    let env = Env::new();
    env.call("bdev_malloc_create", json!({"name": "Big", "num_blocks": BIG_BLOCKS, "block_size": BLOCK}));
    env.call("iscsi_target_node_add_lun", json!({"name": "disk1", "bdev_name": "Big", "lun_id": BIG_LUN}));
    env
}

/// A 16-byte CDB with a 64-bit LBA (WRITE(16), WRITE AND VERIFY(16)).
fn cdb16(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

const READ_16: u8 = 0x88;
const WRITE_16: u8 = 0x8a;
const WRITE_AND_VERIFY_16: u8 = 0x8e;

/// Logs in as initiator port `n`, on the big LUN, without immediate data (InitialR2T=Yes:
/// every byte solicited), and sends `writes` (opcode, blocks), all at LBA 0; it answers no
/// R2T (it reads nothing at all). Returns the client and the writes' ITTs.
fn silent_writer(env: &Env, n: u8, writes: &[(u8, u32)]) -> (Client, Vec<Itt>) {
    let (mut c, _) = Client::login(env, n, keys(false, true, 65536));
    c.s.state_mut().lun = Lun(lun_field(BIG_LUN));
    // The new I_T nexus's unit attention on this LUN would fail the first command.
    c.clear_unit_attention();
    let mut itts = Vec::new();
    for (i, &(opcode, blocks)) in writes.iter().enumerate() {
        // Tags of its own, outside the client's task table (its data never exists here).
        let itt = Itt(0x4000_0000 + i as u32);
        let len = blocks * BLOCK as u32;
        let cmd = c.s.state_mut().command(itt, false, true, len, cdb16(opcode, 0, blocks), true);
        c.send([Pdu::new(Op::ScsiCommand(cmd))]);
        itts.push(itt);
    }
    (c, itts)
}

/// Waits (up to 10 s) until `cond` holds of the global pool's figures.
fn wait_pool(what: &str, cond: impl Fn(&riser_buf::Stats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = Pool::global().stats();
        if cond(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Task `itt`'s completion, answering R2Ts and pings, by `deadline`.
fn completion_by<W: Wire>(c: &mut Client<W>, itt: Itt, deadline: Instant) -> Completed {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let pdu = match c.c.recv(left) {
            Ok(Some(p)) => p,
            Ok(None) => panic!("the target closed the connection before task {itt:?} completed"),
            Err(e) => panic!("task {itt:?} did not complete within the liveness bound ({e}): {:?}", Pool::global().stats()),
        };
        match c.s.receive(&pdu).unwrap_or_else(|e| panic!("{e}: {pdu:?}")) {
            Event::Complete(d) if d.itt == itt => return d,
            Event::R2t { reply, .. } => c.send(reply),
            Event::Ping { reply } => c.send([reply]),
            _ => {}
        }
    }
}

/// A healthy session (initiator port `n`): logs in, writes 64 KiB (8 KiB immediate, the
/// rest solicited) and reads it back, within [`LIVENESS`].
fn healthy_session_is_served(env: &Env, n: u8) {
    let deadline = Instant::now() + LIVENESS;
    let (c, _) = Client::login(env, n, keys(true, false, 65536));
    healthy_io(c, n, deadline);
}

/// A healthy session's 64 KiB write and read-back, by `deadline`; then it logs out.
fn healthy_io<W: Wire>(mut c: Client<W>, n: u8, deadline: Instant) {
    let data = pattern(n, 65536);
    let (itt, pdus) = c.s.write(&rw_cdb(Dir::Write, 64, 128), &data).expect("write");
    c.send(pdus);
    good(&completion_by(&mut c, itt, deadline));
    let (itt, pdu) = c.s.read(&rw_cdb(Dir::Read, 64, 128), 65536).expect("read");
    c.send([pdu]);
    let r = completion_by(&mut c, itt, deadline);
    good(&r);
    assert!(r.data == data, "read back differs");
    c.logout();
}

#[test]
fn four_silent_writers_of_32_large_writes_leave_room_for_a_fifth_session() {
    let _one = serial();
    let env = env_with_big_lun();
    // Streamed: each WRITE(16) asks for its data in 1 MiB pieces, each piece's buffer from
    // the budget when its R2T goes out; 32 of them per session would want 32 MiB at once.
    let writes = [(WRITE_16, (16 * MIB / BLOCK) as u32); 32];
    let silent: Vec<_> = (1..=4).map(|n| silent_writer(&env, n, &writes)).collect();
    // They hold what the fair shares let them have (riser before: all 48 MiB).
    wait_pool("the silent writers take their shares", |s| s.in_use_bytes >= 36 * MIB);
    healthy_session_is_served(&env, 5);
    drop(silent);
    env.wait_connections(0);
    wait_pool("the silent writers' buffers come back", |s| s.in_use_bytes < 4 * MIB && s.waiting == 0);
}

#[test]
fn two_silent_32_mib_write_and_verify_leave_room_for_a_fifth_session() {
    let _one = serial();
    let env = env_with_big_lun();
    // Not streamed: the iSCSI layer takes one 32 MiB buffer for all the data before the R2Ts.
    let writes = [(WRITE_AND_VERIFY_16, BIG_BLOCKS)];
    let first = silent_writer(&env, 1, &writes);
    wait_pool("the first takes 32 MiB", |s| s.in_use_bytes >= 32 * MIB);
    let second = silent_writer(&env, 2, &writes);
    wait_pool("the second waits for 32 MiB", |s| s.waiting >= 1);
    // The fifth session's small buffers pass the big waiter at the head of the queue.
    healthy_session_is_served(&env, 5);
    drop((first, second));
    env.wait_connections(0);
    wait_pool("the silent writers' buffers come back", |s| s.in_use_bytes < 4 * MIB && s.waiting == 0);
}

#[test]
fn four_sessions_that_never_read_their_data_in_pin_at_most_their_shares() {
    let _one = serial();
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let addr = format!("127.0.0.1:{port}");
    let env = Env::tcp(&addr);
    env.call("bdev_malloc_create", json!({"name": "Big", "num_blocks": BIG_BLOCKS, "block_size": BLOCK}));
    env.call("iscsi_target_node_add_lun", json!({"name": "disk1", "bdev_name": "Big", "lun_id": BIG_LUN}));
    let connect = || TcpWire::connect(addr.parse().expect("address"));
    // Over real sockets, so that what a session does not read backs up: 32 streamed
    // 16 MiB READs each, never read. Once the kernel's socket buffers are full, the pieces
    // wait in the datamover's transmit queue, charged to their connection.
    let silent: Vec<Client<TcpWire>> = (1..=4)
        .map(|n| {
            let (mut c, _) = Client::login_over(connect(), n, keys(false, true, 65536));
            c.s.state_mut().lun = Lun(lun_field(BIG_LUN));
            c.clear_unit_attention();
            let blocks = (16 * MIB / BLOCK) as u32;
            for i in 0..32 {
                let cmd = c.s.state_mut().command(Itt(0x4000_0000 + i), true, false, blocks * BLOCK as u32, cdb16(READ_16, 0, blocks), true);
                c.send([Pdu::new(Op::ScsiCommand(cmd))]);
            }
            c
        })
        .collect();
    wait_pool("the unread pieces pile up", |s| s.in_use_bytes >= 36 * MIB);
    std::thread::sleep(Duration::from_millis(200));
    let pool = Pool::global();
    let s = pool.stats();
    // Each holds at most its share (12 MiB), and together they leave the reserve alone
    // (what reactor threads keep for their next small I/O aside).
    assert!(s.in_use_bytes <= 4 * pool.share_bytes() + 2 * MIB, "{s:?}");
    assert!(s.in_use_bytes <= pool.max_bytes() - pool.reserve_bytes() + 2 * MIB, "{s:?}");
    // A fifth session is served (riser before: the four held the whole budget).
    let deadline = Instant::now() + LIVENESS;
    let (c, _) = Client::login_over(connect(), 5, keys(true, false, 65536));
    healthy_io(c, 5, deadline);
    drop(silent);
    env.wait_connections(0);
    wait_pool("the unread pieces come back", |s| s.in_use_bytes < 4 * MIB && s.waiting == 0);
}

/// The SCSI Responses of `itts`, read raw (the client's task table does not know them),
/// R2Ts and anything else skipped: (ITT, status, fixed-format sense bytes).
fn raw_responses(c: &mut Client, itts: &[Itt], limit: Duration) -> Vec<(Itt, u8, Vec<u8>)> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while out.len() < itts.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let pdu = match c.c.recv(left) {
            Ok(Some(p)) => p,
            Ok(None) => panic!("the target closed the connection; responses so far {out:?}"),
            Err(e) => panic!("no response for {itts:?} in {limit:?} ({e}); so far {out:?}; {:?}", Pool::global().stats()),
        };
        if let Op::ScsiResponse(r) = pdu.op() {
            let s = c.s.state_mut();
            s.saw_stat_sn(r.stat_sn);
            s.update_window(r.exp_cmd_sn, r.max_cmd_sn);
            if itts.contains(&r.itt) {
                out.push((r.itt, r.status, pdu.data.get(2..).unwrap_or_default().to_vec()));
            }
        }
    }
    out
}

#[test]
fn a_silent_writers_commands_fail_after_the_data_out_timeout_and_give_their_buffers_back() {
    let _one = serial();
    let env = env_with_big_lun();
    env.call("iscsi_set_options", json!({"data_out_timeout": 1}));
    assert_eq!(env.call("iscsi_get_options", json!({}))["data_out_timeout"], 1);
    // One unstreamed 32 MiB WRITE AND VERIFY, then a streamed 16 MiB WRITE(16): the second's
    // first piece waits for the first's buffer (the connection is over its share), then
    // its own R2T goes unanswered too.
    let writes = [(WRITE_AND_VERIFY_16, BIG_BLOCKS), (WRITE_16, (16 * MIB / BLOCK) as u32)];
    let (mut c, itts) = silent_writer(&env, 1, &writes);
    wait_pool("the write takes 32 MiB", |s| s.in_use_bytes >= 32 * MIB);
    let started = Instant::now();
    let responses = raw_responses(&mut c, &itts, Duration::from_secs(15));
    assert!(started.elapsed() >= Duration::from_millis(900), "failed before the timeout: {:?}", started.elapsed());
    for (itt, status, sense) in &responses {
        // CHECK CONDITION, ABORTED COMMAND, INITIATOR RESPONSE TIMEOUT (4Bh/06h).
        assert_eq!(*status, 2, "{itt:?}");
        assert_eq!((sense[2] & 0x0f, sense[12], sense[13]), (0x0b, 0x4b, 0x06), "{itt:?}: sense {sense:02x?}");
    }
    // Its budget is back (what a reactor thread keeps for its next small I/O aside).
    wait_pool("the buffers come back", |s| s.in_use_bytes < 4 * MIB && s.waiting == 0 && s.reserve_in_use_bytes == 0);
    // The connection lives on: a write answering its R2Ts completes.
    let data = pattern(9, 8192);
    let (itt, pdus) = c.s.write(&rw_cdb(Dir::Write, 0, 16), &data).expect("write");
    c.send(pdus);
    good(&completion_by(&mut c, itt, Instant::now() + LIVENESS));
    c.logout();
}
