//! Zero copy: large reads and writes moved straight between the task's buffer and the
//! initiator's, iWARP read sinks, immediate data placed in the task's buffer, large
//! control PDUs.

use super::*;

/// A 32 MiB READ (the largest transfer riser takes; four times the old per-connection
/// data pool): RDMA Writes straight from the task's buffer (1 MiB each, its lkey, no
/// copy) chained with the response; the buffer is kept until the response's completion
/// proves the writes done, and released then.
#[test]
fn a_32_mib_read_is_written_from_the_task_buffer_and_released_after_completion() {
    const LEN: usize = 32 << 20;
    let mut d = dm(IserConfig::default());
    d.qp.read_buf = vec![0; LEN];
    deliver(&mut d, &command(1, true, false, LEN as u32, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let data: Vec<u8> = (0..LEN).map(|i| (i % 249) as u8).collect();
    let buf = IoBuf::from(data.as_slice());
    let addr = buf.as_ptr() as u64;
    d.put_data(PutData { itt: Itt(1), lun: Lun(0), buf, len: LEN as u32, offset: 0, response: Some(response(1)), sn: SnState::default() });
    d.poll(&mut ev);
    assert_eq!(d.qp.chains, vec![33], "32 RDMA Writes and the response in one post");
    let writes: Vec<SendWr> = d.qp.queued.iter().filter(|w| matches!(w.op, SendOp::RdmaWrite { .. })).copied().collect();
    assert_eq!(writes.len(), 32);
    for (i, w) in writes.iter().enumerate() {
        assert_eq!(w.sge, Sge { addr: addr + (i << 20) as u64, len: 1 << 20, lkey: IOBUF_LKEY }, "write {i}");
        assert!(!w.signaled, "only the response is signaled");
    }
    wire(&mut d);
    assert!(d.qp.read_buf == data, "the initiator got the data");
    assert_eq!(d.held.len(), 1, "kept until the response completes");
    assert_eq!(d.held[0].1.as_ptr() as u64, addr);
    d.poll(&mut ev);
    assert!(d.held.is_empty(), "released by the response's completion");
    assert_eq!(d.sq_posted, d.sq_retired);
    assert_eq!(d.qp.registrations, 1);
    assert_eq!(d.copies(), CopyStats::default(), "no byte copied");
}

/// iWARP (issue #22, item 11): the sink of a Get_Data's RDMA Reads is registered for that
/// transfer alone, over exactly the solicited range, never as the buffer's lasting
/// registration, and the registration ends (its STag revoked) once the last read has
/// completed, before the buffer is handed on.
#[test]
fn an_iwarp_read_sink_is_registered_for_its_transfer_alone() {
    let mut d = dm(IserConfig { max_rdma_len: 16 * 1024, max_rdma_reads: 2, ..Default::default() });
    d.qp.per_transfer_sinks = true;
    deliver(&mut d, &command(7, false, true, 64 * 1024, vec![0xee; 8192]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    ev.clear();
    let buf = IoBuf::zeroed(64 * 1024);
    d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf, offset: 8192, len: 56 * 1024, base: 0, more: false, sn: SnState::default() });
    assert_eq!(d.qp.sink_ranges, [(8192, 56 * 1024)], "the solicited range only");
    let mut rounds = 0;
    while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) {
        assert_eq!(live_sinks(&d), 1, "open while its reads run");
        d.poll(&mut ev);
        wire(&mut d);
        rounds += 1;
        assert!(rounds < 20);
    }
    assert_eq!(live_sinks(&d), 0, "closed before the buffer was handed on");
    assert_eq!(d.qp.registrations, 0, "no lasting registration of the sink");
    let (ready, _) = data_events(&ev);
    let pattern: Vec<u8> = (0..56 * 1024usize).map(|i| (i * 7) as u8).collect();
    assert_eq!(&ready[0].1[8192..], &pattern[..]);
}

/// iWARP: a task aborted with RDMA Reads in flight keeps its sink's registration, like its
/// buffer, until those reads have completed, then it ends; a failed read ends it too.
#[test]
fn an_iwarp_read_sink_of_an_aborted_task_ends_when_its_reads_do() {
    let mut d = dm(IserConfig { max_rdma_len: 4096, ..Default::default() });
    d.qp.per_transfer_sinks = true;
    deliver(&mut d, &command(5, false, true, 8192, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    d.get_data(get(5, 8192, 0, 8192));
    d.poll(&mut ev);
    assert_eq!(d.qp.queued.len(), 2, "two RDMA Reads in flight");
    assert!(d.deallocate_task_resources(Itt(5)).is_none(), "reads are landing in it: kept");
    assert_eq!(live_sinks(&d), 1, "the sink stays open while reads may land");
    wire(&mut d);
    d.poll(&mut ev);
    assert_eq!(live_sinks(&d), 0, "closed once they completed");
    assert!(d.held.is_empty() && d.held_transfers.is_empty());
    // Not yet posted when the task goes: closed at once.
    deliver(&mut d, &command(6, false, true, 8192, vec![]));
    d.poll(&mut ev);
    d.get_data(get(6, 8192, 0, 8192));
    assert_eq!(live_sinks(&d), 1);
    assert!(d.deallocate_task_resources(Itt(6)).is_some(), "no read posted: the buffer comes back");
    assert_eq!(live_sinks(&d), 0);
    // A failed read: the Get_Data fails and its sink closes.
    deliver(&mut d, &command(8, false, true, 4096, vec![]));
    d.poll(&mut ev);
    d.get_data(get(8, 4096, 0, 4096));
    d.poll(&mut ev);
    let wr = d.qp.queued.pop().expect("the read");
    d.qp.done.push_back(Completion { wr_id: wr.wr_id, error: Some(false), byte_len: 0 });
    ev.clear();
    d.poll(&mut ev);
    assert_eq!(live_sinks(&d), 0);
    assert!(ev.iter().any(|e| matches!(e, DmEvent::DataFailed { .. })));
}

/// Get_Data lands straight in the task's buffer at the solicited offset: RDMA Reads of
/// at most max_rdma_len bytes each, under the buffer's lkey, within the initiator depth;
/// the bytes before the offset (the immediate data the iSCSI layer put there) stay.
/// Only the immediate data was copied (out of its receive buffer).
#[test]
fn get_data_reads_into_the_task_buffer_at_its_offset() {
    let mut d = dm(IserConfig { max_rdma_len: 16 * 1024, max_rdma_reads: 2, ..Default::default() });
    deliver(&mut d, &command(7, false, true, 64 * 1024, vec![0xee; 8192]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    ev.clear();
    let mut buf = IoBuf::zeroed(64 * 1024);
    buf[..8192].fill(0xee);
    let addr = buf.as_ptr() as u64;
    d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf, offset: 8192, len: 56 * 1024, base: 0, more: false, sn: SnState::default() });
    let mut sges = Vec::new();
    let mut rounds = 0;
    while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) {
        d.poll(&mut ev);
        assert!(d.reads.len() <= 2, "never more reads in flight than the initiator depth");
        sges.extend(d.qp.queued.iter().filter(|w| matches!(w.op, SendOp::RdmaRead { .. })).map(|w| w.sge));
        wire(&mut d);
        rounds += 1;
        assert!(rounds < 20);
    }
    let want: Vec<Sge> =
        (0..4u64).map(|i| Sge { addr: addr + 8192 + i * 16384, len: if i < 3 { 16384 } else { 8192 }, lkey: IOBUF_LKEY }).collect();
    assert_eq!(sges, want, "into the buffer at offset 8 KiB, in pieces of at most 16 KiB");
    let (ready, failed) = data_events(&ev);
    assert!(failed.is_empty());
    let got = &ready[0].1;
    assert!(got[..8192].iter().all(|&b| b == 0xee), "the bytes before the offset are untouched");
    let pattern: Vec<u8> = (0..56 * 1024usize).map(|i| (i * 7) as u8).collect();
    assert_eq!(&got[8192..], &pattern[..]);
    assert_eq!(d.copies(), CopyStats { unsolicited_bytes: 8192, ..Default::default() });
    assert!(d.held.is_empty() && d.fetches.is_empty());
}

/// With write buffers from a pool (as the server gives them): the immediate data of a
/// write partly immediate is read out of the receive buffer once, straight into the
/// task's write buffer (delivered with the command); with the budget spent it comes in
/// the PDU's segment (the iSCSI layer queues the task); a write all immediate keeps its
/// segment. Each immediate byte is copied once.
#[test]
fn immediate_data_is_read_once_straight_into_the_task_buffer_when_the_budget_has_room() {
    let pool: &'static riser_buf::Pool = Box::leak(Box::new(riser_buf::Pool::new(riser_buf::MIN_MAX_BYTES)));
    let account = riser_buf::Account::new();
    let mut d = dm(IserConfig::default());
    d.set_write_buffers(WriteBuffers { pool, account: account.clone(), largest_write: 32 << 20, stream_above: 0 });
    let imm: Vec<u8> = (0..8192u32).map(|i| (i * 13) as u8).collect();
    deliver(&mut d, &command(7, false, true, 64 * 1024, imm.clone()));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let Some(DmEvent::Command { pdu, buf }) = ev.pop() else { panic!("expected the command with its buffer") };
    assert!(matches!(pdu.op(), Op::ScsiCommand(c) if c.itt == Itt(7)));
    assert_eq!((pdu.bhs.data_segment_length, pdu.data.len()), (8192, 0));
    assert_eq!(buf.len(), 64 * 1024);
    assert_eq!(&buf[..8192], &imm[..]);
    assert_eq!(account.held(), buf.capacity(), "budgeted, charged to the connection");
    assert_eq!(d.copies(), CopyStats { unsolicited_bytes: 8192, ..Default::default() });
    // The buffer is the one Get_Data then fills: zero copies of the solicited part.
    d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf, offset: 8192, len: 56 * 1024, base: 0, more: false, sn: SnState::default() });
    for _ in 0..10 {
        d.poll(&mut ev);
        wire(&mut d);
    }
    let (ready, failed) = data_events(&ev);
    assert!(failed.is_empty());
    assert_eq!(&ready[0].1[..8192], &imm[..]);
    assert_eq!(d.copies(), CopyStats { unsolicited_bytes: 8192, ..Default::default() });
    drop(ready);
    ev.clear();
    // The budget spent elsewhere: the immediate data comes in the segment, copied once.
    let hog = pool.try_alloc(riser_buf::MIN_MAX_BYTES, &mut None).expect("the whole budget");
    deliver(&mut d, &command(8, false, true, 64 * 1024, imm.clone()));
    d.poll(&mut ev);
    let Some(DmEvent::Control(pdu)) = ev.pop() else { panic!("expected the command with its segment") };
    assert_eq!(pdu.data, imm);
    assert_eq!(pool.stats().waiting, 0, "no place taken in the queue");
    drop(hog);
    // All immediate: in the segment (it becomes the buffer as it is).
    deliver(&mut d, &command(9, false, true, 8192, imm.clone()));
    d.poll(&mut ev);
    let Some(DmEvent::Control(pdu)) = ev.pop() else { panic!("expected the command with its segment") };
    assert_eq!(pdu.data, imm);
    assert_eq!(d.copies(), CopyStats { unsolicited_bytes: 3 * 8192, ..Default::default() });
    assert_eq!(d.qp.recvs.len(), IserConfig::default().recv_slots, "every receive reposted");
}

/// A 32 MiB WRITE: RDMA Reads straight into the task's buffer, 1 MiB each, the initiator
/// depth (16) at most in flight; the buffer comes back whole, nothing copied.
#[test]
fn a_32_mib_write_is_read_into_the_task_buffer() {
    const LEN: usize = 32 << 20;
    let mut d = dm(IserConfig::default());
    d.qp.write_buf = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
    deliver(&mut d, &command(9, false, true, LEN as u32, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    ev.clear();
    d.get_data(get(9, LEN, 0, LEN as u32));
    let mut rounds = 0;
    while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. } | DmEvent::DataFailed { .. })) {
        d.poll(&mut ev);
        assert!(d.reads.len() <= 16);
        wire(&mut d);
        rounds += 1;
        assert!(rounds < 10);
    }
    let Some(DmEvent::DataReady { buf, .. }) = ev.pop() else { panic!("the Get_Data failed") };
    assert!(buf.as_slice() == d.qp.write_buf.as_slice());
    assert_eq!(d.qp.registrations, 1);
    assert_eq!(d.copies(), CopyStats::default());
    assert_eq!(d.sq_posted, d.sq_retired);
}

/// A control PDU with more data than a small send slot takes (a Text or NOP-In response)
/// goes whole in a large slot; a SCSI Response in a small one; both slots come back.
#[test]
fn large_control_pdus_take_a_large_send_slot() {
    let mut d = ffp_dm(IserConfig::default());
    let big = Pdu::with_data(response(1).bhs.op.clone(), vec![0x5a; 4000]);
    d.send_control(big);
    d.send_control(response(2));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let sends: Vec<SendWr> = d.qp.queued.clone();
    assert_eq!(sends.len(), 2);
    assert_ne!(wr_idx(sends[0].wr_id) & IserDatamover::<FakeQp>::LARGE_SLOT, 0, "a large slot");
    assert_eq!(sends[0].sge.len as usize, ISER_HDR_LEN + BHS_LEN + 4000, "not truncated");
    assert_eq!(wr_idx(sends[1].wr_id) & IserDatamover::<FakeQp>::LARGE_SLOT, 0, "a small slot");
    wire(&mut d);
    d.poll(&mut ev);
    assert_eq!(d.send.free.len(), d.send.count());
    assert_eq!(d.send_large.free.len(), d.send_large.count());
    let p = Pdu::decode_message(&d.qp.sent[0][ISER_HDR_LEN..], 8192).unwrap();
    assert_eq!(p.data.len(), 4000);
}
