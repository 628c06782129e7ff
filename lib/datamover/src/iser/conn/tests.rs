//! Tests of the iSER datamover against an in-memory queue pair ([`FakeQp`]), which a
//! "wire" plays the initiator's side of: the harness, and the basic send, receive, Hello
//! and Get_Data paths. Zero-copy transfers, streamed pieces and the send backlog are in
//! the submodules.

use super::*;
use crate::iser::config::{EXPECTED_PDU_ROOM, IMMEDIATE_PDU_ROOM};
use riser_iscsi::ffp::SnState;
use riser_iscsi::pdu::Lun;
use riser_iscsi::serial::Sn;
use riser_iscsi::testing::{scsi_command, scsi_response};

mod backlog;
mod pieces;
mod zero_copy;

/// An in-memory "initiator" at the other end of the QP: it owns a read buffer and a
/// write buffer (registered as STags 0x11 / 0x22). Work requests are only recorded;
/// [`wire`] carries them out against the datamover's pools.
#[derive(Default)]
struct FakeQp {
    recvs: VecDeque<(u64, Sge)>,
    done: VecDeque<Completion>,
    queued: Vec<SendWr>,
    sent: Vec<Vec<u8>>,
    read_buf: Vec<u8>,
    write_buf: Vec<u8>,
    chains: Vec<usize>,
    disconnected: bool,
    registrations: usize,
    /// Plays iWARP: RDMA Read sinks get a registration of their own per transfer
    /// ([`IserQp::register_read_sink`]); the ranges asked for, and how many are live.
    per_transfer_sinks: bool,
    sink_ranges: Vec<(usize, usize)>,
    live_sinks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A transfer registration of FakeQp: counted live until dropped.
struct FakeSink(std::sync::Arc<std::sync::atomic::AtomicUsize>);
impl Drop for FakeSink {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The lkey FakeQp gives every task buffer: SGEs under it name an IoBuf the datamover
/// holds (zero copy), those under 0 its pools.
const IOBUF_LKEY: u32 = 0x10b0f;

impl IserQp for FakeQp {
    fn post_recv(&mut self, wr_id: u64, sge: Sge) -> Result<(), IserError> {
        // The QP's route on the shared CQ goes there: every test checks it stays clear.
        assert_eq!(wr_id & super::super::shared_cq::ROUTE_MASK, 0, "receive {wr_id:#x} uses the route bits");
        self.recvs.push_back((wr_id, sge));
        Ok(())
    }
    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), IserError> {
        for w in wrs {
            assert_eq!(w.wr_id & super::super::shared_cq::ROUTE_MASK, 0, "{:?} uses the route bits", w.op);
        }
        self.chains.push(wrs.len());
        self.queued.extend_from_slice(wrs);
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let n = self.done.len().min(max);
        out.extend(self.done.drain(..n));
        n
    }
    fn disconnect(&mut self) {
        self.disconnected = true;
    }
    fn register(&mut self, buf: &mut IoBuf) -> Result<u32, IserError> {
        assert!(!buf.is_empty(), "nothing to register");
        self.registrations += 1;
        Ok(IOBUF_LKEY)
    }
    fn register_read_sink(&mut self, buf: &mut IoBuf, offset: usize, len: usize) -> Result<ReadSink, IserError> {
        if !self.per_transfer_sinks {
            return Ok(ReadSink { lkey: self.register(buf)?, transfer: None });
        }
        assert!(len > 0 && offset + len <= buf.len(), "sink {offset}+{len} outside the {}-byte buffer", buf.len());
        self.sink_ranges.push((offset, len));
        self.live_sinks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(ReadSink { lkey: IOBUF_LKEY, transfer: Some(Box::new(FakeSink(self.live_sinks.clone()))) })
    }
}

fn live_sinks(d: &IserDatamover<FakeQp>) -> usize {
    d.qp.live_sinks.load(std::sync::atomic::Ordering::SeqCst)
}

/// The pool and offset an SGE names.
fn locate(d: &mut IserDatamover<FakeQp>, sge: Sge) -> (&mut Pool, usize) {
    assert_eq!(sge.lkey, 0, "pool memory");
    for pool in [&mut d.recv, &mut d.send, &mut d.send_large] {
        let base = pool.mem.base();
        if sge.addr >= base && sge.addr + sge.len as u64 <= base + pool.mem.len() as u64 {
            return (pool, (sge.addr - base) as usize);
        }
    }
    panic!("SGE {sge:?} outside every registered pool");
}

/// The bytes of the task buffer an SGE under [`IOBUF_LKEY`] names: a buffer the datamover
/// holds while the device may use it (queued or batched Put_Data, a Get_Data, a buffer
/// kept until its work requests retire). Panics otherwise: the device would touch memory
/// nobody keeps.
fn iobuf_bytes(d: &mut IserDatamover<FakeQp>, sge: Sge) -> &mut [u8] {
    assert_eq!(sge.lkey, IOBUF_LKEY);
    let mut bufs: Vec<&mut IoBuf> = d.held.iter_mut().map(|(_, b)| b).collect();
    bufs.extend(d.fetches.values_mut().map(|f| &mut f.buf));
    bufs.extend(d.pending.iter_mut().filter_map(|p| match p {
        Pending::Put { put, .. } => Some(&mut put.buf),
        _ => None,
    }));
    for b in bufs {
        let base = b.as_ptr() as u64;
        if sge.addr >= base && sge.addr + sge.len as u64 <= base + b.len() as u64 {
            let o = (sge.addr - base) as usize;
            return &mut b.as_mut_slice()[o..o + sge.len as usize];
        }
    }
    panic!("SGE {sge:?} names no buffer the datamover holds");
}

fn read_sge(d: &mut IserDatamover<FakeQp>, sge: Sge) -> Vec<u8> {
    if sge.lkey == IOBUF_LKEY {
        return iobuf_bytes(d, sge).to_vec();
    }
    let (pool, off) = locate(d, sge);
    let mut v = vec![0u8; sge.len as usize];
    pool.mem.read_at(off, &mut v);
    v
}

fn write_sge(d: &mut IserDatamover<FakeQp>, sge: Sge, src: &[u8]) {
    if sge.lkey == IOBUF_LKEY {
        return iobuf_bytes(d, sge).copy_from_slice(src);
    }
    let (pool, off) = locate(d, sge);
    pool.mem.write_at(off, src);
}

/// The "wire": executes queued work requests in order and completes the signaled ones.
fn wire(d: &mut IserDatamover<FakeQp>) {
    for wr in std::mem::take(&mut d.qp.queued) {
        let bytes = match wr.op {
            SendOp::RdmaRead { .. } => vec![0u8; wr.sge.len as usize],
            _ => read_sge(d, wr.sge),
        };
        match wr.op {
            SendOp::Send | SendOp::SendInvalidate(_) => d.qp.sent.push(bytes),
            SendOp::RdmaWrite { remote_addr, rkey } => {
                assert_eq!(rkey, Stag(0x11));
                let o = remote_addr as usize;
                d.qp.read_buf[o..o + bytes.len()].copy_from_slice(&bytes);
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                assert_eq!(rkey, Stag(0x22));
                let o = remote_addr as usize;
                let src = d.qp.write_buf[o..o + bytes.len()].to_vec();
                write_sge(d, wr.sge, &src);
            }
        }
        if wr.signaled {
            d.qp.done.push_back(Completion { wr_id: wr.wr_id, error: None, byte_len: wr.sge.len });
        }
    }
}

/// The initiator SENDs `msg` into the next posted receive.
fn deliver(d: &mut IserDatamover<FakeQp>, msg: &[u8]) {
    let (wr_id, sge) = d.qp.recvs.pop_front().expect("a posted receive (else RNR)");
    write_sge(d, sge, msg);
    d.qp.done.push_back(Completion { wr_id, error: None, byte_len: msg.len() as u32 });
}

fn dm(cfg: IserConfig) -> IserDatamover<FakeQp> {
    let qp = FakeQp { read_buf: vec![0; 1 << 20], write_buf: (0..1 << 20).map(|i| (i * 7) as u8).collect(), ..Default::default() };
    let pools = IserDatamover::<FakeQp>::plain_pools(&cfg);
    IserDatamover::new(qp, cfg, pools).unwrap()
}

fn command(itt: u32, read: bool, write: bool, edtl: u32, imm: Vec<u8>) -> Vec<u8> {
    let h = IserHeader::Control {
        write: write.then_some(TaggedBuffer { stag: 0x22, base_offset: 0 }),
        read: read.then_some(TaggedBuffer { stag: 0x11, base_offset: 0 }),
    };
    let mut msg = [0u8; ISER_HDR_LEN].to_vec();
    let mut hb = [0u8; ISER_HDR_LEN];
    h.write(&mut hb);
    msg.copy_from_slice(&hb);
    let pdu = Pdu::with_data(Op::ScsiCommand(scsi_command(Itt(itt), Sn(1), read, write, edtl, &[])), imm);
    pdu.encode_message(&mut msg).unwrap();
    msg
}

fn response(itt: u32) -> Pdu {
    let sn = SnState { stat_sn: Sn(5), exp_cmd_sn: Sn(2), max_cmd_sn: Sn(9) };
    Pdu::new(Op::ScsiResponse(scsi_response(Itt(itt), 0, sn)))
}

#[test]
fn read_is_rdma_written_and_chained_with_the_response() {
    let mut d = dm(IserConfig { max_rdma_len: 64 * 1024, ..Default::default() });
    assert_eq!(d.qp.recvs.len(), IserConfig::default().recv_slots, "the whole ring is posted up front");
    deliver(&mut d, &command(1, true, false, 200_000, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert!(matches!(ev.as_slice(), [DmEvent::Control(p)] if matches!(p.op(), Op::ScsiCommand(_))));
    assert_eq!(d.qp.recvs.len(), IserConfig::default().recv_slots, "receive reposted at once");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    d.put_data(PutData { itt: Itt(1), lun: Lun(0), buf: riser_bdev::IoBuf::from(data.clone()), len: 200_000, offset: 0, response: Some(response(1)), sn: SnState::default() });
    d.poll(&mut ev);
    assert!(d.qp.queued[..4].iter().all(|w| w.sge.lkey == IOBUF_LKEY), "written from the task's own buffer");
    wire(&mut d);
    assert_eq!(d.qp.chains, vec![5], "4 RDMA Writes and the SEND in one post");
    assert_eq!(d.held.len(), 1, "the buffer is kept until the response's completion");
    assert_eq!(&d.qp.read_buf[..200_000], &data[..]);
    let sent = &d.qp.sent[0];
    assert_eq!(sent[0], 0x10, "target header: control, no STags");
    assert!(matches!(Pdu::decode_message(&sent[ISER_HDR_LEN..], 8192).unwrap().op(), Op::ScsiResponse(_)));
    d.poll(&mut ev);
    assert!(d.held.is_empty(), "the buffer went back with the SEND completion");
    assert_eq!(d.send.free.len(), d.send.count());
    assert_eq!(d.copies(), CopyStats::default(), "no byte copied");
}

/// Everything one pass produces goes out in one chain: the responses of three reads (one
/// with data) and a control PDU, and, with Send with Invalidate agreed, each response
/// invalidates its command's STag (the Read STag, else the Write STag).
#[test]
fn one_doorbell_per_pass_and_send_with_invalidate() {
    let mut d = dm(IserConfig { max_rdma_len: 64 * 1024, send_invalidate: true, ..Default::default() });
    deliver(&mut d, &command(1, true, false, 4096, vec![]));
    deliver(&mut d, &command(2, false, false, 0, vec![]));
    deliver(&mut d, &command(3, false, true, 4096, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert_eq!(ev.len(), 3);
    assert_eq!(d.qp.chains.len(), 0, "receives only: no send posted");
    d.put_data(PutData { itt: Itt(1), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![5u8; 4096]), len: 4096, offset: 0, response: Some(response(1)), sn: SnState::default() });
    d.send_control(response(2));
    d.send_control(response(3));
    d.poll(&mut ev);
    assert_eq!(d.qp.chains, vec![4], "RDMA Write + 3 SENDs in one post");
    let ops: Vec<SendOp> = d.qp.queued.iter().map(|w| w.op).collect();
    assert_eq!(
        ops,
        vec![
            SendOp::RdmaWrite { remote_addr: 0, rkey: Stag(0x11) },
            SendOp::SendInvalidate(Stag(0x11)),
            SendOp::Send,
            SendOp::SendInvalidate(Stag(0x22))
        ]
    );
    wire(&mut d);
    // Without the agreement, plain SENDs.
    let mut d = dm(IserConfig::default());
    deliver(&mut d, &command(1, true, false, 4096, vec![]));
    d.poll(&mut ev);
    d.send_control(response(1));
    d.poll(&mut ev);
    assert_eq!(d.qp.queued.iter().map(|w| w.op).collect::<Vec<_>>(), vec![SendOp::Send]);
}

#[test]
fn write_is_rdma_read_within_the_initiator_depth() {
    let mut d = dm(IserConfig { max_rdma_len: 4096, max_rdma_reads: 2, ..Default::default() });
    deliver(&mut d, &command(2, false, true, 8192 + 20_000, vec![9u8; 8192]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    ev.clear();
    d.get_data(GetData { itt: Itt(2), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; 28_192]), offset: 8192, len: 20_000, base: 0, more: false, sn: SnState::default() });
    let mut rounds = 0;
    while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) {
        d.poll(&mut ev);
        assert!(d.reads.len() <= 2, "never more reads in flight than the initiator depth");
        wire(&mut d);
        rounds += 1;
        assert!(rounds < 50);
    }
    let Some(DmEvent::DataReady { buf, .. }) = ev.pop() else { unreachable!() };
    let want: Vec<u8> = (0..20_000usize).map(|i| (i * 7) as u8).collect();
    assert_eq!(&buf.as_slice()[8192..], &want[..], "solicited data starts at the Write STag's base");
    assert!(d.qp.chains.iter().all(|&n| n <= 2));
}

fn put(itt: u32, data: Vec<u8>, response: Pdu) -> PutData {
    let len = data.len() as u32;
    PutData { itt: Itt(itt), lun: Lun(0), buf: riser_bdev::IoBuf::from(data), len, offset: 0, response: Some(response), sn: SnState::default() }
}

fn get(itt: u32, buf_len: usize, offset: u32, len: u32) -> GetData {
    GetData { itt: Itt(itt), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; buf_len]), offset, len, base: 0, more: false, sn: SnState::default() }
}

type DataEvents = (Vec<(Itt, Vec<u8>)>, Vec<(Itt, &'static str)>);

/// The buffers of the DataReady / DataFailed events in `ev`, by kind.
fn data_events(ev: &[DmEvent]) -> DataEvents {
    let mut ready = Vec::new();
    let mut failed = Vec::new();
    for e in ev {
        match e {
            DmEvent::DataReady { itt, buf } => ready.push((*itt, buf.as_slice().to_vec())),
            DmEvent::DataFailed { itt, reason, .. } => failed.push((*itt, *reason)),
            _ => {}
        }
    }
    (ready, failed)
}

/// RFC 5047 §8.9: after Deallocate_Task_Resources nothing of the task reaches the
/// initiator; a Put_Data still queued (here: no send slot yet) is dropped and its buffer
/// comes back.
#[test]
fn deallocate_drops_a_queued_put_data() {
    let mut d = dm(IserConfig { send_slots: 1, ..Default::default() });
    deliver(&mut d, &command(1, true, false, 4096, vec![]));
    deliver(&mut d, &command(2, true, false, 4096, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    d.send_control(response(2));
    d.put_data(put(1, vec![7u8; 4096], response(1)));
    d.poll(&mut ev);
    assert_eq!(d.pending.len(), 1, "the Put_Data waits for the only send slot");
    let buf = d.deallocate_task_resources(Itt(1));
    assert!(buf.is_some_and(|b| b.as_slice() == [7u8; 4096]), "its buffer comes back");
    wire(&mut d);
    d.poll(&mut ev);
    wire(&mut d);
    assert_eq!(d.qp.sent.len(), 1, "only task 2's response went out");
    assert!(d.qp.read_buf[..4096].iter().all(|&b| b == 0), "no RDMA Write of the aborted task");
    assert!(d.pending.is_empty());
}

/// ABORT TASK with RDMA Reads in flight, then the initiator reuses the ITT (Linux and
/// libiscsi do): the old reads' completions are recognised by their generation and
/// dropped; they neither write into the new task's buffer nor complete its Get_Data.
#[test]
fn rdma_reads_of_an_aborted_task_never_reach_a_new_task_with_its_itt() {
    let mut d = dm(IserConfig { max_rdma_len: 4096, ..Default::default() });
    deliver(&mut d, &command(5, false, true, 8192, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    d.get_data(get(5, 8192, 0, 8192));
    d.poll(&mut ev);
    let stale = std::mem::take(&mut d.qp.queued);
    assert_eq!(stale.len(), 2, "two RDMA Reads in flight");
    assert!(d.deallocate_task_resources(Itt(5)).is_none(), "reads are landing in it: kept");
    assert_eq!(d.held.len(), 1);
    // The new WRITE with the same ITT, and its own reads.
    deliver(&mut d, &command(5, false, true, 8192, vec![]));
    d.poll(&mut ev);
    d.get_data(get(5, 8192, 0, 8192));
    d.poll(&mut ev);
    let fresh = std::mem::take(&mut d.qp.queued);
    assert_eq!(fresh.len(), 2);
    // The old reads complete first, with what the initiator's buffer held then.
    d.qp.write_buf[..8192].fill(0xaa);
    d.qp.queued = stale;
    wire(&mut d);
    ev.clear();
    d.poll(&mut ev);
    let (ready, failed) = data_events(&ev);
    assert!(ready.is_empty() && failed.is_empty(), "stale completions complete nothing: {} {failed:?}", ready.len());
    d.qp.write_buf[..8192].fill(0x55);
    d.qp.queued = fresh;
    wire(&mut d);
    d.poll(&mut ev);
    let (ready, _) = data_events(&ev);
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].0, Itt(5));
    assert!(ready[0].1.iter().all(|&b| b == 0x55), "only the new reads' data lands in the new buffer");
    assert!(d.held.is_empty(), "the aborted task's buffer went once its reads completed");
}

/// A response that cannot be encoded fails the connection cleanly instead of staying at
/// the head of the send queue forever (every later send stalled behind it).
#[test]
fn a_response_that_cannot_be_encoded_fails_the_connection() {
    let mut d = dm(IserConfig::default());
    deliver(&mut d, &command(1, true, false, 4096, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    ev.clear();
    let mut bad = response(1);
    bad.ahs = vec![1, 2, 3];
    d.put_data(put(1, vec![1u8; 4096], bad));
    d.send_control(response(9));
    d.poll(&mut ev);
    assert!(matches!(ev.as_slice(), [DmEvent::Terminated(why)] if why.contains("encode")), "{}", ev.len());
    assert!(d.qp.disconnected);
    assert!(d.held.is_empty(), "no buffer kept");
}

/// Read data that would fall outside the task's buffer is not silently skipped: the
/// Get_Data fails.
#[test]
fn read_data_outside_the_task_buffer_fails_the_get_data() {
    let mut d = dm(IserConfig { max_rdma_len: 4096, ..Default::default() });
    deliver(&mut d, &command(3, false, true, 8192, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    ev.clear();
    d.get_data(get(3, 100, 0, 8192));
    for _ in 0..10 {
        d.poll(&mut ev);
        wire(&mut d);
    }
    let (ready, failed) = data_events(&ev);
    assert!(ready.is_empty(), "no DataReady with data missing");
    assert_eq!(failed.len(), 1);
    assert!(d.held.is_empty() && d.fetches.is_empty());
}

/// A session at queue depth 256 (the most riser allows) with immediate data: all its
/// commands, the immediate PDUs beside them and the answers to our NOP-In pings arrive
/// before the target polls once, and every SEND finds a posted receive (FakeQp panics
/// otherwise: an RNR NAK on a real QP). The ring was a fixed 160.
#[test]
fn the_receive_ring_holds_a_full_queue_depth_and_the_unexpected_pdus_beside_it() {
    let cfg = IserConfig::for_queue_depth(256, 0);
    assert_eq!(cfg.recv_slots, 256 + IMMEDIATE_PDU_ROOM + EXPECTED_PDU_ROOM);
    assert_eq!(cfg.max_outstanding_unexpected_pdus(), 256 + IMMEDIATE_PDU_ROOM as u32);
    for qd in [1, 64, 128, 256] {
        assert_eq!(
            IserConfig::for_queue_depth(qd, 0).max_outstanding_unexpected_pdus(),
            riser_iscsi::negotiate::iser_max_outstanding_unexpected_pdus(qd),
            "the ring holds what the negotiation declares"
        );
    }
    assert_eq!(cfg.send_slots, 256 + SEND_ROOM);
    assert_eq!(cfg.recv_wr(), cfg.recv_slots as u32 + 1);
    let mut d = dm(IserConfig { ..cfg });
    assert_eq!(d.qp.recvs.len(), cfg.recv_slots);
    for itt in 0..256 {
        deliver(&mut d, &command(itt, false, true, 8192, vec![3u8; 512]));
    }
    let nop = |itt: u32| {
        let mut m = IserHeader::TARGET_CONTROL.to_vec();
        Pdu::new(Op::NopOut(riser_iscsi::testing::nop_out(Itt(itt), Sn(1)))).encode_message(&mut m).unwrap();
        m
    };
    for i in 0..(IMMEDIATE_PDU_ROOM + EXPECTED_PDU_ROOM) as u32 {
        deliver(&mut d, &nop(1000 + i));
    }
    let mut ev = Vec::new();
    while !d.qp.done.is_empty() {
        d.poll(&mut ev);
    }
    assert_eq!(ev.iter().filter(|e| matches!(e, DmEvent::Control(_))).count(), 256 + IMMEDIATE_PDU_ROOM + EXPECTED_PDU_ROOM);
    assert_eq!(d.qp.recvs.len(), cfg.recv_slots, "every receive reposted");
    // With unsolicited Data-Out allowed, the ring grows by their number.
    let cfg = IserConfig::for_queue_depth(32, 8);
    assert_eq!(cfg.max_outstanding_unexpected_pdus(), 32 * 9 + IMMEDIATE_PDU_ROOM as u32);
}

/// The final Login Response, as the login sends it through the datamover.
fn final_login_response() -> Pdu {
    use riser_iscsi::pdu::{Isid, LoginResponse, LoginStatus};
    Pdu::new(Op::LoginResponse(LoginResponse {
        transit_bit: true,
        continue_bit: false,
        csg: Stage::LoginOperationalNegotiation,
        nsg: Stage::FullFeaturePhase,
        version_max: 0,
        version_active: 0,
        isid: Isid::default(),
        tsih: 1,
        itt: Itt(0),
        stat_sn: Sn(0),
        exp_cmd_sn: Sn(1),
        max_cmd_sn: Sn(64),
        status: LoginStatus::SUCCESS,
    }))
}

fn hello(max_ver: u8, min_ver: u8, ird: u16) -> Vec<u8> {
    let mut b = [0u8; ISER_HDR_LEN];
    IserHeader::Hello { max_ver, min_ver, ird }.write(&mut b);
    b[..crate::iser::header::HELLO_LEN].to_vec()
}

/// A datamover in full-feature phase (its final Login Response went out).
fn ffp_dm(cfg: IserConfig) -> IserDatamover<FakeQp> {
    let mut d = dm(cfg);
    d.send_control(final_login_response());
    let mut ev = Vec::new();
    d.poll(&mut ev);
    wire(&mut d);
    d.poll(&mut ev);
    d.qp.sent.clear();
    assert!(ev.is_empty());
    d
}

fn terminated(ev: &[DmEvent]) -> Option<&str> {
    ev.iter().find_map(|e| match e {
        DmEvent::Terminated(why) => Some(why.as_str()),
        _ => None,
    })
}

/// RFC 7145 §5.1 with iSERHelloRequired=Yes: the Hello (12 bytes) is the first message of
/// full-feature phase; the HelloReply carries our version and an ORD capped by the
/// initiator's IRD, which then bounds our RDMA Reads. A second Hello is an error.
#[test]
fn a_required_hello_is_answered_with_the_ord_capped_by_the_ird() {
    let mut d = ffp_dm(IserConfig { hello_required: true, max_rdma_reads: 16, max_rdma_len: 4096, ..Default::default() });
    deliver(&mut d, &hello(ISER_VERSION, ISER_VERSION, 2));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    wire(&mut d);
    assert!(ev.is_empty());
    assert_eq!(d.qp.sent, vec![vec![0x30, 0xaa, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0]], "HelloReply: version 10, ORD 2");
    // The ORD bounds the RDMA Reads from now on.
    deliver(&mut d, &command(1, false, true, 6 * 4096, vec![]));
    d.poll(&mut ev);
    d.get_data(get(1, 6 * 4096, 0, 6 * 4096));
    d.poll(&mut ev);
    assert_eq!(d.qp.queued.len(), 2, "as many reads in flight as the initiator's IRD, no more");
    // A second Hello is a protocol error.
    deliver(&mut d, &hello(ISER_VERSION, ISER_VERSION, 2));
    ev.clear();
    d.poll(&mut ev);
    assert!(terminated(&ev).is_some_and(|w| w.contains("Hello")), "{:?}", terminated(&ev));
    assert!(d.qp.disconnected);
}

/// A Hello where none is expected closes the connection: with iSERHelloRequired=No (all
/// of IB/RoCE), during login, or after other messages. It used to be answered at any time.
#[test]
fn an_unexpected_hello_closes_the_connection() {
    // iSERHelloRequired=No (a 28-byte Hello, which the old code parsed and answered).
    let mut d = ffp_dm(IserConfig::default());
    let mut h = [0u8; ISER_HDR_LEN];
    IserHeader::Hello { max_ver: ISER_VERSION, min_ver: ISER_VERSION, ird: 4 }.write(&mut h);
    deliver(&mut d, &h);
    let mut ev = Vec::new();
    d.poll(&mut ev);
    wire(&mut d);
    assert!(d.qp.sent.is_empty(), "no HelloReply");
    assert!(terminated(&ev).is_some_and(|w| w.contains("iSERHelloRequired=No")));
    // Required, but during login.
    let mut d = dm(IserConfig { hello_required: true, ..Default::default() });
    deliver(&mut d, &hello(ISER_VERSION, ISER_VERSION, 4));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert!(terminated(&ev).is_some_and(|w| w.contains("during login")));
    // Required, and the first message of full-feature phase is something else.
    let mut d = ffp_dm(IserConfig { hello_required: true, ..Default::default() });
    deliver(&mut d, &command(1, true, false, 512, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert!(matches!(ev.as_slice(), [DmEvent::Terminated(w)] if w.contains("not a Hello")));
}

/// A Hello whose version range does not hold ours gets a HelloReply with REJ, then the
/// connection closes; what arrives meanwhile is not taken.
#[test]
fn a_hello_without_our_version_is_rejected() {
    let mut d = ffp_dm(IserConfig { hello_required: true, ..Default::default() });
    d.set_hello_required(true);
    deliver(&mut d, &hello(2, 1, 8));
    deliver(&mut d, &command(1, true, false, 512, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert!(ev.is_empty(), "the reply goes out first, and the command is not taken");
    wire(&mut d);
    assert_eq!(d.qp.sent, vec![vec![0x31, 0xaa, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], "HelloReply with REJ");
    d.poll(&mut ev);
    assert!(terminated(&ev).is_some_and(|w| w.contains("versions 1..=2")), "{:?}", terminated(&ev));
    assert!(d.qp.disconnected);
}

/// A WRITE with 4 KiB immediate data and 4 KiB unsolicited Data-Out, then 12 KiB
/// solicited (offset 8 KiB), against a Write STag whose base is 0x1000 into the
/// initiator's buffer. Returns where the solicited data was read from, in that buffer.
fn solicited_read_source(tagged_buffer_for_solicited_data_only: Option<bool>) -> usize {
    let mut d = dm(IserConfig { max_rdma_len: 4096, tagged_buffer_for_solicited_data_only, ..Default::default() });
    let h = IserHeader::Control { write: Some(TaggedBuffer { stag: 0x22, base_offset: 0x1000 }), read: None };
    let mut msg = [0u8; ISER_HDR_LEN];
    h.write(&mut msg);
    let mut msg = msg.to_vec();
    let mut cmd = scsi_command(Itt(4), Sn(1), false, true, 20480, &[]);
    cmd.final_bit = false;
    Pdu::with_data(Op::ScsiCommand(cmd), vec![1u8; 4096]).encode_message(&mut msg).unwrap();
    deliver(&mut d, &msg);
    let mut msg = IserHeader::TARGET_CONTROL.to_vec();
    let dout = riser_iscsi::testing::data_out(Itt(4), riser_iscsi::serial::Ttt::RESERVED, Sn(0), 4096);
    Pdu::with_data(Op::DataOut(dout), vec![2u8; 4096]).encode_message(&mut msg).unwrap();
    deliver(&mut d, &msg);
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert_eq!(ev.len(), 2);
    d.get_data(get(4, 20480, 8192, 12288));
    d.poll(&mut ev);
    let read_at = |w: &SendWr| match w.op {
        SendOp::RdmaRead { remote_addr, .. } => Some(remote_addr),
        _ => None,
    };
    let addrs: Vec<u64> = d.qp.queued.iter().filter_map(read_at).collect();
    assert_eq!(addrs.len(), 3);
    assert!(addrs.windows(2).all(|w| w[1] == w[0] + 4096), "{addrs:?}");
    let mut rounds = 0;
    while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) {
        wire(&mut d);
        d.poll(&mut ev);
        rounds += 1;
        assert!(rounds < 10);
    }
    let (ready, _) = data_events(&ev);
    let want = addrs[0] as usize;
    let pattern: Vec<u8> = (want..want + 12288).map(|i| (i * 7) as u8).collect();
    assert_eq!(&ready[0].1[8192..], &pattern[..], "the solicited data lands at its offset in the task's buffer");
    want
}

/// RFC 7145 §6.9: with TaggedBufferForSolicitedDataOnly=No (the RFC's default, declared)
/// the Write STag's buffer holds all the write data, so the RDMA Reads start at the base
/// plus the immediate and unsolicited bytes; with Yes, and with the key not sent (Linux,
/// libiscsi), at the base itself. The old code always read at the base.
#[test]
fn rdma_read_offsets_follow_tagged_buffer_for_solicited_data_only() {
    assert_eq!(solicited_read_source(Some(false)), 0x1000 + 8192);
    assert_eq!(solicited_read_source(Some(true)), 0x1000);
    assert_eq!(solicited_read_source(None), 0x1000);
    // Yes, and a Get_Data starting inside the unsolicited part: the buffer does not
    // hold it.
    let mut d = dm(IserConfig { tagged_buffer_for_solicited_data_only: Some(true), ..Default::default() });
    deliver(&mut d, &command(6, false, true, 8192, vec![5u8; 4096]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    d.get_data(get(6, 8192, 0, 8192));
    ev.clear();
    d.poll(&mut ev);
    assert_eq!(data_events(&ev).1, vec![(Itt(6), "solicited data outside the Write STag's buffer")]);
}

/// A READ needing more RDMA Writes than the send queue holds goes out in batches, each
/// ended by a signaled write whose completion makes room, then the response; the send
/// queue never holds more than its depth.
#[test]
fn a_read_larger_than_the_send_queue_goes_out_in_batches() {
    let mut d = dm(IserConfig { max_rdma_len: 4096, send_queue_depth: 4, ..Default::default() });
    deliver(&mut d, &command(1, true, false, 10 * 4096 + 100, vec![]));
    deliver(&mut d, &command(2, false, false, 0, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let data: Vec<u8> = (0..10 * 4096 + 100u32).map(|i| (i % 253) as u8).collect();
    d.put_data(put(1, data.clone(), response(1)));
    d.send_control(response(2));
    for _ in 0..20 {
        d.poll(&mut ev);
        assert!(d.sq_posted - d.sq_retired <= 4, "never more work requests than the send queue holds");
        wire(&mut d);
    }
    assert!(d.qp.read_buf[..data.len()] == data[..], "all the data was written");
    assert_eq!(d.qp.sent.len(), 2, "both responses went out");
    assert!(d.qp.chains.len() >= 3, "two batches of 4 RDMA Writes, then the last 3 with the response");
    assert!(d.held.is_empty() && d.pending.is_empty());
    assert_eq!(d.send.free.len(), d.send.count());
}

/// Notice_Key_Values carries the negotiated iSER keys into the datamover: a Hello becomes
/// required; TaggedBufferForSolicitedDataOnly=Yes is applied, while a negotiated No (also
/// what an initiator that never sends the key gets, like Linux) keeps the peers' layout,
/// so a Linux write with immediate data is still read from the Write STag's base.
#[test]
fn notice_key_values_applies_the_iser_keys() {
    let mut d = dm(IserConfig::default());
    let keys = DatamoverParams { iser_hello_required: true, tagged_buffer_for_solicited_data_only: true, ..Default::default() };
    d.notice_key_values(keys);
    assert!(d.cfg.hello_required);
    assert_eq!(d.cfg.tagged_buffer_for_solicited_data_only, Some(true));
    let mut d = dm(IserConfig { max_rdma_len: 4096, ..Default::default() });
    d.notice_key_values(DatamoverParams::default());
    assert!(!d.cfg.hello_required);
    assert_eq!(d.cfg.tagged_buffer_for_solicited_data_only, None);
    deliver(&mut d, &command(2, false, true, 8192 + 4096, vec![9u8; 8192]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    d.get_data(get(2, 8192 + 4096, 8192, 4096));
    d.poll(&mut ev);
    assert!(matches!(d.qp.queued.as_slice(), [w] if w.op == SendOp::RdmaRead { remote_addr: 0, rkey: Stag(0x22) }));
}

#[test]
fn completion_error_terminates_and_bad_header_closes() {
    let mut d = dm(IserConfig::default());
    d.qp.done.push_back(Completion { wr_id: KIND_SEND, error: Some(false), byte_len: 0 });
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert!(matches!(ev.as_slice(), [DmEvent::Terminated(_)]));
    assert!(d.qp.disconnected);
    let mut d = dm(IserConfig::default());
    deliver(&mut d, &[0x70; 40]);
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert!(matches!(ev.as_slice(), [DmEvent::Terminated(_)]));
    // A flushed receive means the peer is gone: one Terminated, then quiet.
    let mut d = dm(IserConfig::default());
    d.qp.done.push_back(Completion { wr_id: KIND_RECV, error: Some(true), byte_len: 0 });
    d.qp.done.push_back(Completion { wr_id: KIND_RECV | 1, error: Some(true), byte_len: 0 });
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert!(matches!(ev.as_slice(), [DmEvent::Terminated(_)]), "{}", ev.len());
    d.poll(&mut ev);
    assert_eq!(ev.len(), 1);
}
