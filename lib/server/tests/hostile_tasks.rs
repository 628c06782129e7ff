//! Hostile initiators and their tasks (issue #22, items 6 and 8), over the in-memory datamover
//! against the real server: immediate commands beyond the queue depth, and an ITT reused
//! before the ABORT TASK of its old command is answered.
//!
//! These tests send raw PDUs (their own ITTs, immediate commands, several PDUs in one write,
//! so the target reads them at once) and read the target's PDUs raw, since a well-behaved
//! initiator ([`PduSession`]) would never send them.
//!
//! [`PduSession`]: riser_initiator::session::PduSession

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use riser_iscsi::pdu::{tmf, DataOut, Digests, Lun, NopOut, Op, Pdu};
use riser_iscsi::serial::{Itt, Sn, Ttt};
use riser_initiator::scsi::{rw_cdb, Dir};
use serde_json::json;

use common::*;

/// Counts the live heap bytes of the whole process (the server runs in it, on its reactor
/// thread): what data held in segments outside the buffer budget costs.
struct LiveBytes;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the counter is a side effect.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

/// One test at a time: the heap measured is the process's.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The target node's queue depth (see `Env`): the most tasks one connection may hold.
const QUEUE_DEPTH: u32 = 32;
/// ITTs of the raw commands (PduSession's own are small, or have the top bit set).
const RAW: u32 = 0x4000_0000;
/// SCSI status TASK SET FULL.
const TASK_SET_FULL: u8 = 0x28;
/// Reject reasons (RFC 7143 §11.17.1).
const REJECT_IMMEDIATE: u8 = 0x06;
const REJECT_INVALID_PDU_FIELD: u8 = 0x09;

/// A SCSI Command with the session's next CmdSN (used up), for any ITT and LUN, no data.
fn command(c: &mut Client, itt: u32, lun: Lun, cdb: &[u8], read: bool, edtl: u32) -> Pdu {
    let mut cdb16 = [0u8; 16];
    cdb16[..cdb.len()].copy_from_slice(cdb);
    let mut cmd = c.s.state_mut().command(Itt(itt), read, !read && edtl > 0, edtl, cdb16, true);
    cmd.lun = lun;
    Pdu::new(Op::ScsiCommand(cmd))
}

/// [`command`] for immediate delivery, with `data` as its immediate data: the current CmdSN,
/// which does not advance (RFC 7143 §3.2.2.1).
fn immediate(c: &mut Client, itt: u32, cdb: &[u8], edtl: u32, data: Vec<u8>) -> Pdu {
    let mut p = command(c, itt, Lun(0), cdb, false, edtl);
    if let Op::ScsiCommand(cmd) = &mut p.bhs.op {
        cmd.immediate = true;
        c.s.state_mut().cmd_sn = cmd.cmd_sn;
    }
    p.data = data;
    p
}

/// Sends `pdus` in one write: the target reads them together (in one poll, below 1 MiB).
fn send_at_once(c: &mut Client, pdus: &[Pdu]) {
    let mut bytes = Vec::new();
    for p in pdus {
        bytes.extend(p.to_bytes(Digests::default()).expect("encode"));
    }
    c.c.send_raw(&bytes).expect("send");
}

fn recv(c: &mut Client) -> Pdu {
    c.c.recv(WAIT).expect("a PDU in time").expect("the target closed the connection")
}

/// The PDUs that come within `quiet` of each other (none waiting after).
fn drain(c: &mut Client, quiet: Duration) -> Vec<Pdu> {
    let mut out = Vec::new();
    while let Ok(Some(p)) = c.c.recv(quiet) {
        out.push(p);
    }
    out
}

/// The ITT in the header a Reject carries back.
fn rejected_itt(p: &Pdu) -> Option<u32> {
    p.data.get(16..20).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// ABORT TASK of raw task `itt` sent with CmdSN `ref_cmd_sn`.
fn abort(c: &mut Client, itt: u32, ref_cmd_sn: Sn) -> (Itt, Pdu) {
    c.s.task_mgmt(tmf::ABORT_TASK, Itt(itt), ref_cmd_sn)
}

fn cmd_sn(p: &Pdu) -> Sn {
    match p.op() {
        Op::ScsiCommand(c) => c.cmd_sn,
        _ => panic!("not a command"),
    }
}

#[test]
fn immediate_commands_beyond_the_queue_depth_are_refused_and_the_session_goes_on() {
    let _serial = serial();
    let env = Env::new();
    // ImmediateData=Yes, InitialR2T=Yes: each write carries FirstBurstLength of immediate
    // data and waits for an R2T for the rest, which this initiator never answers.
    let (mut c, neg) = Client::login(&env, 1, keys(true, true, 65536));
    let imm = neg.first_burst.min(neg.max_send_dsl);
    let edtl = 8 * imm;
    let n = 4 * QUEUE_DEPTH;
    let mut writes = Vec::new();
    for i in 0..n {
        let cdb = rw_cdb(Dir::Write, 0, edtl / BLOCK as u32);
        writes.push(immediate(&mut c, RAW + i, &cdb, edtl, pattern(i as u8, imm as usize)));
    }
    for chunk in writes.chunks(32) {
        send_at_once(&mut c, chunk);
    }
    // Every immediate write beyond the queue depth is rejected (too many immediate
    // commands), its data dropped; the others wait for their data.
    let (mut rejected, mut r2ts) = (Vec::new(), Vec::new());
    while rejected.len() < (n - QUEUE_DEPTH) as usize {
        let p = recv(&mut c);
        match p.op() {
            Op::Reject(r) => {
                assert_eq!(r.reason, REJECT_IMMEDIATE, "Reject reason");
                rejected.push(rejected_itt(&p).expect("the rejected header"));
            }
            Op::R2t(r) => r2ts.push(r.itt.0),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(rejected.iter().all(|&i| i >= RAW + QUEUE_DEPTH), "only commands beyond the queue depth: {rejected:x?}");
    // A command within the CmdSN window finds the task set full.
    let read = command(&mut c, RAW + n, Lun(0), &rw_cdb(Dir::Read, 0, 1), true, BLOCK as u32);
    c.send([read]);
    let status = loop {
        let p = recv(&mut c);
        match p.op() {
            Op::ScsiResponse(r) if r.itt == Itt(RAW + n) => break r.status,
            Op::R2t(r) => r2ts.push(r.itt.0),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(status, TASK_SET_FULL);
    assert!(r2ts.iter().all(|&i| i < RAW + QUEUE_DEPTH), "R2Ts only for the tasks taken: {r2ts:x?}");
    // ABORT TASK SET ends the stalled writes; the session goes on.
    let (tm, abort_all) = c.s.task_mgmt(tmf::ABORT_TASK_SET, Itt::RESERVED, Sn(0));
    c.send([abort_all]);
    loop {
        let p = recv(&mut c);
        match p.op() {
            Op::TaskMgmtResponse(r) if r.itt == tm => {
                assert_eq!(r.response, tmf::response::FUNCTION_COMPLETE);
                break;
            }
            Op::R2t(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(drain(&mut c, Duration::from_millis(100)).iter().all(|p| matches!(p.op(), Op::R2t(_))));
    let data = pattern(9, 4096);
    good(&c.write(8, &data));
    let r = c.read(8, 4096);
    good(&r);
    assert!(r.data == data, "read back differs");
    c.logout();
}

#[test]
fn a_write_tag_reused_before_its_abort_is_answered_never_gets_good_for_data_not_written() {
    let _serial = serial();
    let env = Env::new();
    // No immediate data, InitialR2T=Yes: all write data is solicited.
    let (mut c, neg) = Client::login(&env, 1, keys(false, true, 65536));
    assert!(neg.max_send_dsl >= 4096, "{neg:?}");
    const X: u32 = RAW + 1;
    let (old_lba, new_lba) = (40u64, 48u64);
    let (old_data, new_data) = (pattern(0xa0, 4096), pattern(0xb0, 4096));
    let old = command(&mut c, X, Lun(0), &rw_cdb(Dir::Write, old_lba, 8), false, 4096);
    let old_sn = cmd_sn(&old);
    c.send([old]);
    let old_ttt = match recv(&mut c).op() {
        Op::R2t(r) if r.itt == Itt(X) => r.ttt,
        other => panic!("expected the old write's R2T: {other:?}"),
    };
    // In one write: ABORT TASK, a new WRITE with the same tag (to another place), then the
    // old write's data for its R2T.
    let (tm, abort_pdu) = abort(&mut c, X, old_sn);
    let new = command(&mut c, X, Lun(0), &rw_cdb(Dir::Write, new_lba, 8), false, 4096);
    let d = DataOut { final_bit: true, lun: Lun(0), itt: Itt(X), ttt: old_ttt, exp_stat_sn: Sn(0), data_sn: Sn(0), buffer_offset: 0 };
    send_at_once(&mut c, &[abort_pdu, new, Pdu::with_data(Op::DataOut(d), old_data.clone())]);
    // Everything the target has to say before the new write's data is sent.
    let mut pdus = vec![recv(&mut c)];
    pdus.extend(drain(&mut c, Duration::from_millis(200)));
    let mut new_r2t = None;
    let mut rejected = false;
    let mut tmf_done = false;
    for p in &pdus {
        match p.op() {
            Op::TaskMgmtResponse(r) if r.itt == tm => tmf_done = true,
            Op::Reject(r) if rejected_itt(p) == Some(X) => {
                assert_eq!(r.reason, REJECT_INVALID_PDU_FIELD, "Reject reason for a tag in use");
                rejected = true;
            }
            Op::R2t(r) if r.itt == Itt(X) => new_r2t = Some(r.clone()),
            Op::ScsiResponse(r) if r.itt == Itt(X) => {
                assert_ne!(r.status, 0, "GOOD for the new write before its data was sent (the old write's data, or none)")
            }
            Op::DataIn(d) if d.itt == Itt(X) => panic!("Data-In for a write: {d:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(tmf_done, "the ABORT TASK is answered: {pdus:?}");
    if let Some(r) = &new_r2t {
        // The target took the new write: its own data, then GOOD.
        assert!(!rejected);
        assert_eq!((r.buffer_offset, r.desired_data_transfer_length), (0, 4096));
        let d = DataOut { final_bit: true, lun: Lun(0), itt: Itt(X), ttt: r.ttt, exp_stat_sn: Sn(0), data_sn: Sn(0), buffer_offset: 0 };
        c.send([Pdu::with_data(Op::DataOut(d), new_data.clone())]);
        match recv(&mut c).op() {
            Op::ScsiResponse(r) if r.itt == Itt(X) => assert_eq!(r.status, 0),
            other => panic!("expected the new write's response: {other:?}"),
        }
    } else {
        assert!(rejected, "the new write is rejected or served: {pdus:?}");
    }
    assert!(drain(&mut c, Duration::from_millis(100)).is_empty());
    // The old write's data never landed where the new write goes.
    let r = c.read(new_lba, 4096);
    good(&r);
    assert!(r.data != old_data, "the aborted write's data landed under the new command");
    if new_r2t.is_some() {
        assert!(r.data == new_data, "the new write's data");
    }
    c.logout();
}

#[test]
fn a_read_tag_reused_before_its_abort_is_answered_never_gets_the_old_reads_completion() {
    let _serial = serial();
    let env = Env::new();
    // LUN 1: 16 MiB, so that a READ of 5 MiB streams in pieces of 1 MiB (four read ahead,
    // the fifth read once the first is handed on, completing one poll later).
    env.call("bdev_malloc_create", json!({"name": "Malloc1", "num_blocks": 32768, "block_size": BLOCK}));
    env.call("iscsi_target_node_add_lun", json!({"name": "disk1", "bdev_name": "Malloc1", "lun_id": 1}));
    let (mut c, neg) = Client::login(&env, 1, keys(true, false, 65536));
    let lun1 = Lun(1 << 48);
    // The new I_T nexus's unit attention on LUN 1.
    for i in 0.. {
        assert!(i < 3, "TEST UNIT READY on LUN 1 never became GOOD");
        let tur = command(&mut c, RAW + 0x100 + i, lun1, &[0u8; 6], false, 0);
        c.send([tur]);
        match recv(&mut c).op() {
            Op::ScsiResponse(r) if r.status == 0 => break,
            Op::ScsiResponse(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // LUN 1 holds zeros; the block the new READ reads on LUN 0 a pattern of its own.
    let new_data = pattern(0xb0, 4096);
    good(&c.write(8, &new_data));

    const X: u32 = RAW + 2;
    const OLD_LEN: u32 = 5 << 20;
    let old = command(&mut c, X, lun1, &rw_cdb(Dir::Read, 0, OLD_LEN / BLOCK as u32), true, OLD_LEN);
    let old_sn = cmd_sn(&old);
    // The target reads at most 1 MiB a poll: the READ starts in one poll, the ABORT TASK
    // and the new READ with the same tag come in the next, the one in which the old READ's
    // last piece completes.
    let seg = neg.max_send_dsl.min(8192) as usize;
    let mut pdus = vec![old];
    let mut filler = 0;
    while filler < 3 << 19 {
        // Answers to no ping (ITT and TTT reserved): the target says nothing back.
        let nop = NopOut { immediate: true, lun: Lun(0), itt: Itt::RESERVED, ttt: Ttt::RESERVED, cmd_sn: c.s.state().cmd_sn, exp_stat_sn: Sn(0) };
        pdus.push(Pdu::with_data(Op::NopOut(nop), vec![0x5a; seg]));
        filler += seg + 48;
    }
    let (tm, abort_pdu) = abort(&mut c, X, old_sn);
    pdus.push(abort_pdu);
    pdus.push(command(&mut c, X, Lun(0), &rw_cdb(Dir::Read, 8, 8), true, 4096));
    send_at_once(&mut c, &pdus);
    // Before the TMF response: the old READ's pieces. After it, whatever comes under the tag
    // is the new READ's: a Reject, or its own data with its status; never the old READ's.
    let deadline = Instant::now() + WAIT;
    let mut after_tmf: Option<Vec<u8>> = None;
    loop {
        assert!(Instant::now() < deadline, "no answer for the new READ");
        let p = recv(&mut c);
        match (p.op(), after_tmf.as_mut()) {
            (Op::TaskMgmtResponse(r), None) if r.itt == tm => after_tmf = Some(Vec::new()),
            (Op::DataIn(d), None) if d.itt == Itt(X) => assert!(!d.status_present, "the old READ ended before its ABORT TASK was answered"),
            (Op::DataIn(d), Some(data)) if d.itt == Itt(X) => {
                assert_eq!(d.buffer_offset as usize, data.len(), "the new READ's data comes in order from 0");
                data.extend_from_slice(&p.data);
                if d.status_present {
                    assert_eq!(d.status, 0);
                    assert!(*data == new_data, "the new READ got data that is not its own ({} bytes)", data.len());
                    break;
                }
            }
            (Op::ScsiResponse(r), Some(data)) if r.itt == Itt(X) => {
                assert!(r.status != 0 || *data == new_data, "GOOD for the new READ without its own data ({} bytes)", data.len());
                break;
            }
            (Op::Reject(r), Some(data)) if rejected_itt(&p) == Some(X) => {
                assert_eq!(r.reason, REJECT_INVALID_PDU_FIELD, "Reject reason for a tag in use");
                assert!(data.is_empty());
                break;
            }
            (other, _) => panic!("unexpected {other:?}"),
        }
    }
    assert!(drain(&mut c, Duration::from_millis(200)).is_empty(), "nothing more under the tag");
    // The session goes on.
    let r = c.read(8, 4096);
    good(&r);
    assert!(r.data == new_data);
    c.logout();
}

#[test]
fn immediate_writes_whose_data_waits_outside_the_budget_do_not_grow_the_heap() {
    let _serial = serial();
    let env = Env::new();
    let (mut c, neg) = Client::login(&env, 1, keys(true, true, 65536));
    let imm = neg.first_burst.min(neg.max_send_dsl);
    // Writes of 1 MiB, each with FirstBurstLength of immediate data: the first ones take
    // their buffers from the budget (the datamover puts the immediate data there); once the
    // connection holds its share of the budget, the immediate data of the next ones waits in
    // its segment, on the heap, until their buffers come.
    let edtl = 1 << 20;
    let cdb = rw_cdb(Dir::Write, 0, edtl / BLOCK as u32);
    good(&c.write(8, &pattern(1, 4096)));
    let before = LIVE.load(Ordering::Relaxed);
    let n = 2048;
    let mut rejected = 0;
    for chunk in 0..n / 64 {
        let pdus: Vec<Pdu> = (0..64).map(|i| immediate(&mut c, RAW + chunk * 64 + i, &cdb, edtl, vec![0x5a; imm as usize])).collect();
        send_at_once(&mut c, &pdus);
        // What the target answers (Rejects, R2Ts), so the pipes stay short.
        rejected += drain(&mut c, Duration::from_millis(30)).iter().filter(|p| matches!(p.op(), Op::Reject(_))).count();
    }
    let grown = LIVE.load(Ordering::Relaxed) - before;
    // Each write beyond the queue depth is rejected, its data dropped: what stays is at most
    // the queue depth's worth of immediate data, however many writes come.
    assert!(grown < 4 << 20, "the heap grew by {} KiB for {n} writes with {imm} bytes of immediate data each ({rejected} rejected)", grown >> 10);
    rejected += drain(&mut c, Duration::from_millis(100)).iter().filter(|p| matches!(p.op(), Op::Reject(_))).count();
    assert_eq!(rejected, (n - QUEUE_DEPTH) as usize);
    let (tm, abort_all) = c.s.task_mgmt(tmf::ABORT_TASK_SET, Itt::RESERVED, Sn(0));
    c.send([abort_all]);
    loop {
        match recv(&mut c).op() {
            Op::TaskMgmtResponse(r) if r.itt == tm => break,
            Op::R2t(_) | Op::Reject(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    drain(&mut c, Duration::from_millis(100));
    good(&c.read(8, 4096));
    c.logout();
}
