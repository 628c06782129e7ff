//! Reads streamed and writes fetched in pieces.

use super::*;

/// A READ command whose Read STag's buffer starts at `base_offset` of the initiator's
/// read buffer.
fn read_command_at(itt: u32, edtl: u32, base_offset: u64) -> Vec<u8> {
    let h = IserHeader::Control { write: None, read: Some(TaggedBuffer { stag: 0x11, base_offset }) };
    let mut hb = [0u8; ISER_HDR_LEN];
    h.write(&mut hb);
    let mut msg = hb.to_vec();
    let pdu = Pdu::new(Op::ScsiCommand(scsi_command(Itt(itt), Sn(1), true, false, edtl, &[])));
    pdu.encode_message(&mut msg).unwrap();
    msg
}

/// One piece of a streamed read of task 1: `data[from..to]` in its own buffer.
fn piece(data: &[u8], from: usize, to: usize, response: Option<Pdu>) -> PutData {
    let buf = IoBuf::from(data[from..to].to_vec());
    PutData { itt: Itt(1), lun: Lun(0), buf, len: (to - from) as u32, offset: from as u32, response, sn: SnState::default() }
}

/// A read streamed in pieces: each piece is RDMA-Written at the Read STag's base + its
/// command offset; a piece with more to follow has its last write signaled and its
/// buffer goes back with that completion, not with the response; the task (its Read
/// STag) stays known until the final piece, whose writes are chained with the response
/// (Send with Invalidate of the Read STag).
#[test]
fn a_read_in_pieces_is_written_at_each_offset_and_each_piece_freed_once_written() {
    let mut d = dm(IserConfig { max_rdma_len: 4096, send_invalidate: true, ..Default::default() });
    deliver(&mut d, &read_command_at(1, 25_000, 0x1000));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let data: Vec<u8> = (0..25_000u32).map(|i| (i % 241) as u8).collect();
    for (from, to) in [(0usize, 10_000usize), (10_000, 20_000)] {
        d.put_data(piece(&data, from, to, None));
        d.poll(&mut ev);
        let wrs = d.qp.queued.clone();
        let remote: Vec<u64> = wrs.iter().map(|w| match w.op {
            SendOp::RdmaWrite { remote_addr, .. } => remote_addr,
            op => panic!("a piece with more to follow sends {op:?}"),
        }).collect();
        let want: Vec<u64> = (from..to).step_by(4096).map(|o| 0x1000 + o as u64).collect();
        assert_eq!(remote, want, "written at the Read STag's base + the piece's command offset");
        let signaled: Vec<bool> = wrs.iter().map(|w| w.signaled).collect();
        assert_eq!(signaled, [false, false, true], "only the piece's last write is signaled");
        assert_eq!(d.held.len(), 1, "the piece's buffer is held while its writes are in flight");
        wire(&mut d);
        d.poll(&mut ev);
        assert!(d.held.is_empty(), "the piece's buffer went with its last write's completion");
        assert!(d.tasks.contains_key(&Itt(1)), "the task stays known until its final piece");
        assert!(d.qp.sent.is_empty(), "no response before the final piece");
    }
    d.put_data(piece(&data, 20_000, 25_000, Some(response(1))));
    d.poll(&mut ev);
    let ops: Vec<SendOp> = d.qp.queued.iter().map(|w| w.op).collect();
    assert_eq!(
        ops,
        vec![
            SendOp::RdmaWrite { remote_addr: 0x1000 + 20_000, rkey: Stag(0x11) },
            SendOp::RdmaWrite { remote_addr: 0x1000 + 24_096, rkey: Stag(0x11) },
            SendOp::SendInvalidate(Stag(0x11)),
        ]
    );
    wire(&mut d);
    assert_eq!(d.held.len(), 1, "the final piece's buffer is kept until the response's completion");
    d.poll(&mut ev);
    assert!(d.held.is_empty() && d.pending.is_empty() && !d.tasks.contains_key(&Itt(1)));
    assert!(d.qp.read_buf[0x1000..0x1000 + 25_000] == data[..], "every piece in its place");
    assert_eq!(d.qp.sent.len(), 1, "one response");
    assert!(matches!(Pdu::decode_message(&d.qp.sent[0][ISER_HDR_LEN..], 8192).unwrap().op(), Op::ScsiResponse(_)));
    assert_eq!(d.copies(), CopyStats::default(), "no byte copied");
}

/// Pieces larger than the send queue go out in batches (each ended by a signaled write),
/// the send queue never over-full; a final piece of 0 bytes sends the response alone.
#[test]
fn pieces_larger_than_the_send_queue_go_out_in_batches_and_a_final_piece_may_be_empty() {
    let mut d = dm(IserConfig { max_rdma_len: 4096, send_queue_depth: 4, ..Default::default() });
    deliver(&mut d, &read_command_at(1, 14 * 4096, 0));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let data: Vec<u8> = (0..14 * 4096u32).map(|i| (i % 233) as u8).collect();
    d.put_data(piece(&data, 0, 10 * 4096, None));
    d.put_data(piece(&data, 10 * 4096, 14 * 4096, None));
    d.put_data(piece(&data, 14 * 4096, 14 * 4096, Some(response(1))));
    for _ in 0..20 {
        d.poll(&mut ev);
        assert!(d.sq_posted - d.sq_retired <= 4, "never more work requests than the send queue holds");
        wire(&mut d);
    }
    assert!(d.qp.read_buf[..data.len()] == data[..], "all the pieces were written in place");
    assert_eq!(d.qp.sent.len(), 1, "the response went out, once");
    assert!(d.held.is_empty() && d.pending.is_empty() && d.tasks.is_empty());
    assert_eq!(d.send.free.len(), d.send.count());
}

/// Deallocate_Task_Resources between pieces: the queued pieces are dropped; a piece whose
/// writes are on the wire keeps its buffer until they complete.
#[test]
fn deallocate_between_pieces_drops_what_is_queued() {
    let mut d = dm(IserConfig { max_rdma_len: 4096, send_queue_depth: 2, ..Default::default() });
    deliver(&mut d, &read_command_at(1, 16 * 4096, 0));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let data = vec![3u8; 16 * 4096];
    d.put_data(piece(&data, 0, 4 * 4096, None));
    d.put_data(piece(&data, 4 * 4096, 8 * 4096, None));
    d.poll(&mut ev);
    assert_eq!(d.qp.queued.len(), 2, "the first batch of the first piece");
    assert_eq!(d.pending.len(), 2);
    assert!(d.deallocate_task_resources(Itt(1)).is_some(), "a queued piece's buffer comes back");
    assert!(d.pending.is_empty() && !d.tasks.contains_key(&Itt(1)));
    assert_eq!(d.held.len(), 1, "the first piece's buffer waits for its writes on the wire");
    wire(&mut d);
    d.poll(&mut ev);
    wire(&mut d);
    assert!(d.held.is_empty() && d.qp.sent.is_empty());
    assert!(d.qp.read_buf[2 * 4096..16 * 4096].iter().all(|&b| b == 0), "nothing more written");
}

/// A write fetched in pieces, each Get_Data with its own buffer (`base` = the command
/// offset of its first byte): RDMA Reads from the Write STag at the command's offsets,
/// into buf[offset - base ..]; a piece outside its buffer fails at once.
#[test]
fn get_data_in_pieces_reads_into_offset_minus_base() {
    let mut d = dm(IserConfig { max_rdma_len: 16 * 1024, ..Default::default() });
    deliver(&mut d, &command(7, false, true, 64 * 1024, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    ev.clear();
    let pattern: Vec<u8> = (0..64 * 1024usize).map(|i| (i * 7) as u8).collect();
    for (offset, len, more) in [(0u32, 24 * 1024u32, true), (24 * 1024, 40 * 1024, false)] {
        let buf = IoBuf::zeroed(len as usize);
        let addr = buf.as_ptr() as u64;
        d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf, offset, len, base: offset, more, sn: SnState::default() });
        d.poll(&mut ev);
        let reads: Vec<(u64, Sge)> = d.qp.queued.iter().map(|w| match w.op {
            SendOp::RdmaRead { remote_addr, .. } => (remote_addr, w.sge),
            op => panic!("expected RDMA Reads, got {op:?}"),
        }).collect();
        let want: Vec<(u64, Sge)> = (0..len.div_ceil(16 * 1024))
            .map(|i| {
                let o = i * 16 * 1024;
                (u64::from(offset + o), Sge { addr: addr + u64::from(o), len: (len - o).min(16 * 1024), lkey: IOBUF_LKEY })
            })
            .collect();
        assert_eq!(reads, want, "from the command's offset into the piece's buffer at offset - base");
        wire(&mut d);
        ev.clear();
        d.poll(&mut ev);
        let (ready, failed) = data_events(&ev);
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(ready.len(), 1);
        assert!(ready[0].1 == pattern[offset as usize..(offset + len) as usize], "the piece at buf[offset - base]");
        assert!(d.tasks.contains_key(&Itt(7)), "the task stays known for its next piece");
    }
    for (offset, len, base) in [(4096u32, 4096u32, 8192u32), (8192, 8192, 4096)] {
        d.get_data(GetData { itt: Itt(7), lun: Lun(0), buf: IoBuf::zeroed(8192), offset, len, base, more: false, sn: SnState::default() });
        ev.clear();
        d.poll(&mut ev);
        let (_, failed) = data_events(&ev);
        assert_eq!(failed, vec![(Itt(7), "solicited data outside the task's buffer")]);
    }
    assert!(d.qp.queued.is_empty(), "no RDMA Read for a piece outside its buffer");
}
