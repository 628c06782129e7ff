//! Payload copies of write data over the in-memory stream ([`crate::mem`]): the TCP
//! datamover and the iSCSI layer glued as the server's connection glues them, an
//! initiator writing PDUs into the other end. Immediate data is copied at most once when
//! the budget has room for the task's buffer, and a second copy (staged) is counted when
//! the write had to wait for it.

use std::net::SocketAddr;
use std::time::Instant;

use riser_buf::{Pool, MIN_MAX_BYTES};
use riser_iscsi::ffp::{Action, Datamover, DatamoverParams, DmEvent, Ffp, FfpConfig, ScsiRequest};
use riser_iscsi::framer::Framer;
use riser_iscsi::pdu::{Digests, Op, Pdu};
use riser_iscsi::serial::{Itt, Sn};
use riser_iscsi::testing::{data_out, scsi_command};
use std::io::Write;

use super::TcpDatamover;
use crate::mem::{stream_pair, MemStream};
use crate::tcp::ByteStream;

const EDTL: u32 = 64 << 10;
const FIRST_BURST: u32 = 8192;

/// The target's connection (datamover + iSCSI layer) and the initiator's end.
struct Glue {
    dm: TcpDatamover<MemStream>,
    ffp: Ffp,
    initiator: MemStream,
    framer: Framer,
    executed: Vec<ScsiRequest>,
    now: Instant,
}

impl Glue {
    fn new(pool: &'static Pool) -> Glue {
        let a: SocketAddr = ([192, 0, 2, 7], 40_000).into();
        let b: SocketAddr = ([192, 0, 2, 1], 3260).into();
        let (target, mut initiator) = stream_pair(a, b);
        initiator.set_nonblocking().expect("in-memory stream");
        let mut dm = TcpDatamover::new(target, &[]).expect("in-memory stream");
        dm.notice_key_values(DatamoverParams {
            target_max_recv_data_segment_length: 65536,
            first_burst_length: FIRST_BURST,
            max_burst_length: 1 << 20,
            ..Default::default()
        });
        let now = Instant::now();
        let cfg = FfpConfig { first_burst_length: FIRST_BURST, target_mrdsl: 65536, largest_write: 32 << 20, ..Default::default() };
        let mut ffp = Ffp::new(cfg, Sn(1), Sn(1), now);
        ffp.set_pool(pool);
        dm.set_write_buffers(ffp.write_buffers());
        Glue { dm, ffp, initiator, framer: Framer::new(), executed: Vec::new(), now }
    }

    /// Polls the datamover and runs the iSCSI layer's actions until nothing moves.
    fn pump(&mut self) {
        for _ in 0..100 {
            let mut events = Vec::new();
            let mut work = self.dm.poll(&mut events);
            for ev in events {
                work += 1;
                match ev {
                    DmEvent::Control(pdu) => self.ffp.on_pdu(pdu, self.now),
                    DmEvent::Command { pdu, buf } => self.ffp.on_command_placed(pdu, buf, self.now),
                    DmEvent::DataReady { itt, buf } => self.ffp.on_data_ready(itt, buf),
                    DmEvent::DataFailed { itt, reason, .. } => self.ffp.on_data_failed(itt, reason),
                    DmEvent::Reject { .. } => panic!("unexpected Reject"),
                    DmEvent::Terminated(why) => panic!("connection ended: {why}"),
                }
            }
            work += self.ffp.grant_buffers();
            while let Some(a) = self.ffp.poll_action() {
                work += 1;
                match a {
                    Action::Send(p) => self.dm.send_control(p),
                    Action::GetData(g) => self.dm.get_data(g),
                    Action::Execute(req) => self.executed.push(req),
                    _ => panic!("unexpected action"),
                }
            }
            while let Some(v) = self.ffp.take_spare() {
                self.dm.recycle(v);
            }
            work += self.dm.flush(&mut Vec::new());
            if work == 0 {
                return;
            }
        }
        panic!("the connection never settled");
    }

    fn send(&mut self, pdu: &Pdu) {
        let bytes = pdu.to_bytes(Digests::default()).expect("encodes");
        self.send_raw(&bytes);
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.initiator.write_all(bytes).expect("in-memory stream");
    }

    /// Answers every R2T the target sent with Data-Out PDUs of `pattern`'s bytes.
    fn answer_r2ts(&mut self, pattern: &[u8]) -> usize {
        let mut buf = [0u8; 4096];
        let mut r2ts = 0;
        loop {
            match std::io::Read::read(&mut self.initiator, &mut buf) {
                Ok(n) if n > 0 => self.framer.feed(&buf[..n]),
                _ => break,
            }
        }
        while let Some(p) = self.framer.next_pdu().expect("target PDUs frame") {
            let Op::R2t(r) = p.bhs.op else { continue };
            r2ts += 1;
            let (off, len) = (r.buffer_offset as usize, r.desired_data_transfer_length as usize);
            let mut d = data_out(r.itt, r.ttt, Sn(0), r.buffer_offset);
            d.final_bit = true;
            self.send(&Pdu::with_data(Op::DataOut(d), pattern[off..off + len].to_vec()));
        }
        r2ts
    }

    /// The write data the iSCSI layer handed to the SCSI layer for `itt`.
    fn written(&self, itt: u32) -> &[u8] {
        let req = self.executed.iter().find(|r| r.itt == Itt(itt)).expect("the write executed");
        req.data_out.buf().map(|b| b.as_slice()).expect("with its data")
    }

    /// (unsolicited bytes copied once, staged bytes copied again).
    fn copies(&self) -> (u64, u64) {
        (self.dm.copies().unsolicited_bytes, self.dm.copies().staged_bytes + self.ffp.staged_bytes())
    }
}

fn pool() -> &'static Pool {
    Box::leak(Box::new(Pool::new(MIN_MAX_BYTES)))
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..EDTL as usize).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed ^ (i >> 12) as u8)).collect()
}

/// A WRITE of `edtl` bytes, the first `imm` of `data` immediate, no unsolicited Data-Out
/// (F set; InitialR2T=Yes).
fn write_cmd(itt: u32, cmd_sn: u32, edtl: u32, data: &[u8], imm: usize) -> Pdu {
    let c = scsi_command(Itt(itt), Sn(cmd_sn), false, true, edtl, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    Pdu::with_data(Op::ScsiCommand(c), data[..imm].to_vec())
}

#[test]
fn all_immediate_data_is_copied_once_into_the_segment_that_becomes_the_buffer() {
    let mut g = Glue::new(pool());
    let data = pattern(1);
    g.send(&write_cmd(1, 1, 4096, &data, 4096));
    g.pump();
    assert_eq!(g.written(1), &data[..4096]);
    assert_eq!(g.copies(), (4096, 0));
}

#[test]
fn partly_immediate_data_goes_straight_into_the_task_buffer_when_the_budget_has_room() {
    let pool = pool();
    let mut g = Glue::new(pool);
    let data = pattern(2);
    g.send(&write_cmd(1, 1, EDTL, &data, FIRST_BURST as usize));
    g.pump();
    assert_eq!(g.answer_r2ts(&data), 1, "the rest asked for at once, no wait");
    g.pump();
    assert_eq!(g.written(1), &data[..]);
    assert_eq!(g.copies(), (FIRST_BURST as u64, 0), "copied once, out of the framer's buffer");
    assert_eq!(pool.stats().waits, 0);
    // The header alone first, then its immediate data: received from the stream straight
    // into the task's buffer, not even one copy of riser's.
    let data = pattern(3);
    let bytes = write_cmd(2, 2, EDTL, &data, FIRST_BURST as usize).to_bytes(Digests::default()).expect("encodes");
    g.send_raw(&bytes[..48]);
    g.pump();
    g.send_raw(&bytes[48..]);
    g.pump();
    assert_eq!(g.answer_r2ts(&data), 1);
    g.pump();
    assert_eq!(g.written(2), &data[..]);
    assert_eq!(g.copies(), (FIRST_BURST as u64, 0), "nothing more copied");
}

#[test]
fn partly_immediate_data_waiting_for_the_budget_is_copied_again_and_counted_as_staged() {
    let pool = pool();
    let mut g = Glue::new(pool);
    // Another connection holds the whole budget.
    let hog = pool.try_alloc(MIN_MAX_BYTES, &mut None).expect("the whole budget");
    let data = pattern(4);
    g.send(&write_cmd(1, 1, EDTL, &data, FIRST_BURST as usize));
    g.pump();
    assert_eq!(g.answer_r2ts(&data), 0, "nothing solicited before the buffer is granted");
    assert_eq!(g.ffp.waiting_for_buffers(), 1);
    assert_eq!(g.copies(), (FIRST_BURST as u64, 0), "the immediate data waits in its segment");
    drop(hog);
    g.pump();
    assert_eq!(g.answer_r2ts(&data), 1);
    g.pump();
    assert_eq!(g.written(1), &data[..]);
    assert_eq!(g.copies(), (FIRST_BURST as u64, FIRST_BURST as u64), "copied a second time, and counted so");
    // Buffers are taken in order: a partly immediate write behind a waiting one waits too.
    let hog = pool.try_alloc(MIN_MAX_BYTES - (1 << 20), &mut None).expect("most of the budget");
    let mut w = None;
    let big = pool.try_alloc(2 << 20, &mut w);
    assert!(big.is_none() && pool.stats().waiting == 1, "someone else waits");
    let data = pattern(5);
    g.send(&write_cmd(2, 2, EDTL, &data, FIRST_BURST as usize));
    g.pump();
    assert_eq!(g.answer_r2ts(&data), 0, "64 KiB would fit, but one waits before it");
    drop(hog);
    let big = pool.try_alloc(2 << 20, &mut w).expect("the first in the queue first");
    g.pump();
    assert_eq!(g.answer_r2ts(&data), 1);
    g.pump();
    assert_eq!(g.written(2), &data[..]);
    assert_eq!(g.copies(), (2 * FIRST_BURST as u64, 2 * FIRST_BURST as u64));
    drop(big);
}
