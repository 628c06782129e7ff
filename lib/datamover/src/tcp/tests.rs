//! Tests of the TCP datamover over a loopback socket: Data-In cutting and phase collapse,
//! R2Ts and Data-Out checks, receiving paused for a full send queue, reads and writes in
//! pieces.

use super::*;
use riser_iscsi::ffp::SnState;
use riser_iscsi::pdu::{Lun, BHS_LEN};
use std::io::ErrorKind;
use riser_iscsi::pdu::ScsiResponse;
use riser_iscsi::testing::{data_out, scsi_response};
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn pair() -> (TcpDatamover, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (TcpDatamover::new(s, &[]).unwrap(), c)
}

fn read_pdus(c: &mut TcpStream, framer: &mut Framer, n: usize) -> Vec<Pdu> {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while out.len() < n {
        if let Some(p) = framer.next_pdu().unwrap() {
            out.push(p);
            continue;
        }
        let k = c.read(&mut buf).unwrap();
        assert!(k > 0, "closed early");
        framer.feed(&buf[..k]);
    }
    out
}

fn response(status: u8, sense: bool) -> Pdu {
    let sn = SnState { stat_sn: Sn(77), exp_cmd_sn: Sn(3), max_cmd_sn: Sn(9) };
    Pdu::with_data(
        Op::ScsiResponse(ScsiResponse { residual_underflow: true, residual_count: 512, ..scsi_response(Itt(5), status, sn) }),
        if sense { vec![0, 2, 0x70, 0] } else { Vec::new() },
    )
}

#[test]
fn put_data_cuts_data_in_and_folds_good_status() {
    let (mut dm, mut c) = pair();
    dm.notice_key_values(DatamoverParams { initiator_max_recv_data_segment_length: 4096, data_digest: true, header_digest: true, ..Default::default() });
    let data: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
    dm.put_data(PutData { itt: Itt(5), lun: Lun(0), buf: riser_bdev::IoBuf::from(data.clone()), len: 10000, offset: 0, response: Some(response(0, false)), sn: SnState::default() });
    let mut ev = Vec::new();
    while !dm.idle() {
        dm.poll(&mut ev);
    }
    let mut f = Framer::with_limits(FramerLimits { max_recv_data_segment_length: 8192, max_ahs_length: 1020 });
    f.set_digests(Digests { header: true, data: true });
    let pdus = read_pdus(&mut c, &mut f, 3);
    let mut got = Vec::new();
    for (i, p) in pdus.iter().enumerate() {
        let Op::DataIn(d) = &p.bhs.op else { panic!("expected Data-In") };
        assert_eq!(d.data_sn, Sn(i as u32));
        assert_eq!(d.buffer_offset as usize, got.len());
        assert_eq!(d.status_present, i == 2, "status only in the last Data-In");
        got.extend_from_slice(&p.data);
    }
    let Op::DataIn(last) = &pdus[2].bhs.op else { unreachable!() };
    assert!(last.final_bit && last.residual_underflow && last.residual_count == 512 && last.stat_sn == Sn(77));
    assert_eq!(got, data);
    // With sense data the response travels separately, after the data.
    dm.put_data(PutData { itt: Itt(5), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![1u8; 100]), len: 100, offset: 0, response: Some(response(2, true)), sn: SnState::default() });
    while !dm.idle() {
        dm.poll(&mut ev);
    }
    let pdus = read_pdus(&mut c, &mut f, 2);
    assert!(matches!(&pdus[0].bhs.op, Op::DataIn(d) if !d.status_present));
    assert!(matches!(&pdus[1].bhs.op, Op::ScsiResponse(r) if r.status == 2 && r.exp_data_sn == Sn(1)));
    assert_eq!(dm.copies().read_bytes, 0, "read data goes out from the task's buffer");
}

#[test]
fn get_data_solicits_with_r2t_and_fails_bad_datasn() {
    let (mut dm, mut c) = pair();
    dm.notice_key_values(DatamoverParams { max_burst_length: 4096, max_outstanding_r2t: 1, target_max_recv_data_segment_length: 8192, ..Default::default() });
    dm.get_data(GetData { itt: Itt(9), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; 8192]), offset: 0, len: 8192, base: 0, more: false, sn: SnState::default() });
    let mut ev = Vec::new();
    let mut f = Framer::new();
    let answer = |c: &mut TcpStream, ttt: Ttt, sn: u32, off: u32, fill: u8| {
        let p = Pdu::with_data(
            Op::DataOut(data_out(Itt(9), ttt, Sn(sn), off)),
            vec![fill; 4096],
        );
        c.write_all(&p.to_bytes(Digests::default()).unwrap()).unwrap();
    };
    for (burst, fill) in [(0u32, 1u8), (4096, 2)] {
        while !dm.idle() {
            dm.poll(&mut ev);
        }
        let r2t = read_pdus(&mut c, &mut f, 1).remove(0);
        let Op::R2t(r) = r2t.bhs.op else { panic!("expected R2T") };
        assert_eq!((r.buffer_offset, r.desired_data_transfer_length), (burst, 4096), "one burst at a time");
        answer(&mut c, r.ttt, 0, burst, fill);
        if burst == 0 {
            // Poll until the next R2T is on the wire.
            c.set_nonblocking(true).unwrap();
            let t0 = Instant::now();
            while c.peek(&mut [0u8; 1]).is_err() && t0.elapsed() < Duration::from_secs(5) {
                dm.poll(&mut ev);
            }
            c.set_nonblocking(false).unwrap();
        }
    }
    let t0 = Instant::now();
    while !ev.iter().any(|e| matches!(e, DmEvent::DataReady { .. })) && t0.elapsed() < Duration::from_secs(5) {
        dm.poll(&mut ev);
    }
    let Some(DmEvent::DataReady { itt, buf }) = std::mem::take(&mut ev).into_iter().find(|e| matches!(e, DmEvent::DataReady { .. })) else { panic!("no DataReady") };
    assert_eq!(itt, Itt(9));
    assert!(buf.as_slice()[..4096].iter().all(|&b| b == 1) && buf.as_slice()[4096..].iter().all(|&b| b == 2));
    // One copy: from the framer's buffer (where the socket's bytes land) into the task's.
    assert_eq!(dm.copies(), CopyStats { solicited_bytes: 8192, ..Default::default() });

    // A Data-Out with the wrong DataSN fails the task, not the connection.
    dm.get_data(GetData { itt: Itt(10), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; 4096]), offset: 0, len: 4096, base: 0, more: false, sn: SnState::default() });
    while !dm.idle() {
        dm.poll(&mut ev);
    }
    let r2t = read_pdus(&mut c, &mut f, 1).remove(0);
    let Op::R2t(r) = r2t.bhs.op else { panic!("expected R2T") };
    let p = Pdu::with_data(
        Op::DataOut(data_out(Itt(10), r.ttt, Sn(5), 0)),
        vec![0u8; 4096],
    );
    c.write_all(&p.to_bytes(Digests::default()).unwrap()).unwrap();
    let mut ev = Vec::new();
    let t0 = Instant::now();
    while ev.is_empty() && t0.elapsed() < Duration::from_secs(5) {
        dm.poll(&mut ev);
    }
    assert!(matches!(ev.as_slice(), [DmEvent::DataFailed { itt: Itt(10), .. }]));
}

/// An initiator that sends and does not read: once more than the limit is queued for
/// it outside the I/O buffers, the datamover stops reading its PDUs (they wait in the
/// socket, which leaves the reactor's wake set), and reads them again once the
/// initiator has taken enough; the backlog counts what is queued and what was sent.
#[test]
fn receiving_waits_while_the_send_queue_is_over_its_limit_and_resumes_when_drained() {
    use riser_iscsi::pdu::NopIn;
    use riser_iscsi::testing::nop_out;
    let (mut dm, mut c) = pair();
    let limit = TxLimit::new(1 << 20);
    dm.limit_tx_queue(limit);
    let mut ev = Vec::new();
    let ping = |c: &mut TcpStream, itt: u32| {
        let p = Pdu::new(Op::NopOut(nop_out(Itt(itt), Sn(itt))));
        c.write_all(&p.to_bytes(Digests::default()).unwrap()).unwrap();
    };
    let wait_ping = |dm: &mut TcpDatamover, ev: &mut Vec<DmEvent>, within: Duration| {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            dm.poll(ev);
            if let Some(i) = ev.iter().position(|e| matches!(e, DmEvent::Control(_))) {
                let DmEvent::Control(p) = ev.remove(i) else { unreachable!() };
                return Some(p);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    };
    // Under the limit: read at once.
    ping(&mut c, 1);
    assert!(wait_ping(&mut dm, &mut ev, Duration::from_secs(5)).is_some(), "a ping is read while the queue is empty");

    // 32 MiB of NOP-In echoes (outside the I/O buffers): more than the socket buffers
    // take, so the queue stays over the limit while the initiator does not read.
    let echo = || {
        Pdu::with_data(
            Op::NopIn(NopIn { lun: Lun(0), itt: Itt(1), ttt: Ttt::RESERVED, stat_sn: Sn(0), exp_cmd_sn: Sn(0), max_cmd_sn: Sn(0) }),
            vec![7u8; 1 << 20],
        )
    };
    let pdu_len = (BHS_LEN + (1 << 20)) as u64;
    for _ in 0..32 {
        dm.send_control(echo());
    }
    let b = dm.tx_backlog();
    assert_eq!((b.total as u64, b.unbudgeted as u64, b.sent), (32 * pdu_len, 32 * pdu_len, 0));
    ping(&mut c, 2);
    assert!(wait_ping(&mut dm, &mut ev, Duration::from_millis(300)).is_none(), "receiving waits while the queue is over the limit");
    let b = dm.tx_backlog();
    // (A chunk partly written counts whole until it is all out.)
    let accounted = b.sent + b.total as u64;
    assert!(limit.exceeded_by(&b) && b.sent > 0 && accounted >= 32 * pdu_len && accounted < 33 * pdu_len, "{b:?}");
    assert!(dm.rx_paused && !matches!(dm.wake, Wake::In(_)));

    // The initiator reads everything: the queue drains and the ping is read.
    let mut reader = c.try_clone().unwrap();
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0u64;
        while got < 32 * pdu_len {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
        got
    });
    let p = wait_ping(&mut dm, &mut ev, Duration::from_secs(10)).expect("receiving goes on once the queue drains");
    assert!(matches!(p.bhs.op, Op::NopOut(n) if n.itt == Itt(2)));
    assert!(!dm.rx_paused);
    let t0 = Instant::now();
    while !dm.idle() && t0.elapsed() < Duration::from_secs(10) {
        dm.poll(&mut ev);
    }
    assert_eq!(drain.join().unwrap(), 32 * pdu_len);
    assert_eq!(dm.tx_backlog(), TxBacklog { unbudgeted: 0, total: 0, sent: 32 * pdu_len });

    // Read data in held buffers counts in the total only.
    dm.put_data(PutData { itt: Itt(5), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![1u8; 8192]), len: 8192, offset: 0, response: Some(response(0, false)), sn: SnState::default() });
    let b = dm.tx_backlog();
    assert_eq!((b.total - b.unbudgeted, b.unbudgeted), (8192, BHS_LEN), "{b:?}");
}

/// Polls the datamover until the initiator's end has a whole PDU, and returns it.
fn next_pdu(dm: &mut TcpDatamover, c: &mut TcpStream, f: &mut Framer, ev: &mut Vec<DmEvent>) -> Pdu {
    TcpStream::set_nonblocking(c, true).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 65536];
    loop {
        if let Some(p) = f.next_pdu().unwrap() {
            TcpStream::set_nonblocking(c, false).unwrap();
            return p;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no PDU from the target");
        dm.poll(ev);
        match c.read(&mut buf) {
            Ok(0) => panic!("closed early"),
            Ok(n) => f.feed(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
}

/// Polls until an event about Get_Data comes (DataReady or DataFailed), and returns it.
fn data_event(dm: &mut TcpDatamover, ev: &mut Vec<DmEvent>) -> DmEvent {
    let t0 = Instant::now();
    loop {
        if let Some(i) = ev.iter().position(|e| matches!(e, DmEvent::DataReady { .. } | DmEvent::DataFailed { .. })) {
            return ev.remove(i);
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no DataReady / DataFailed");
        dm.poll(ev);
    }
}

/// `data[range]` as one piece of a streamed read (its own buffer, as the SCSI layer
/// gives each piece).
fn piece(data: &[u8], from: usize, to: usize, response: Option<Pdu>) -> PutData {
    let buf = riser_bdev::IoBuf::from(data[from..to].to_vec());
    PutData { itt: Itt(5), lun: Lun(0), buf, len: (to - from) as u32, offset: from as u32, response, sn: SnState::default() }
}

/// Checks the Data-In of one task against the rules of RFC 7143 §11.7 for a read of
/// `total` bytes with MaxRecvDataSegmentLength `seg` and MaxBurstLength `burst`: DataSN
/// 0, 1, ...; absolute, contiguous buffer offsets; no PDU across a burst boundary; the F
/// bit exactly at each burst's end and at the very end; status only where `status_last`
/// says. Returns the data.
fn check_data_in(pdus: &[Pdu], total: usize, seg: usize, burst: usize, status_last: bool) -> Vec<u8> {
    let mut got = Vec::new();
    for (i, p) in pdus.iter().enumerate() {
        let Op::DataIn(d) = &p.bhs.op else { panic!("expected Data-In, got {:?}", p.opcode()) };
        let (start, n) = (d.buffer_offset as usize, p.data.len());
        let end = start + n;
        assert_eq!(d.data_sn, Sn(i as u32), "DataSN goes on across the pieces");
        assert_eq!(start, got.len(), "BufferOffset absolute and contiguous");
        assert!(n > 0 && n <= seg, "segment of {n} bytes");
        assert_eq!(start / burst, (end - 1) / burst, "Data-In [{start}, {end}) crosses a burst boundary");
        assert_eq!(d.final_bit, end % burst == 0 || end == total, "F bit of Data-In [{start}, {end})");
        let last = i + 1 == pdus.len();
        assert_eq!(d.status_present, last && status_last, "status only in the task's last Data-In");
        assert_eq!(d.itt, Itt(5));
        got.extend_from_slice(&p.data);
    }
    assert_eq!(got.len(), total);
    got
}

/// A read streamed in three pieces (10000 + 10000 + 5000 bytes, MaxRecvDataSegmentLength
/// 4096, MaxBurstLength 8192) goes out as one task's Data-In: DataSN and offsets go on
/// across the pieces, bursts are cut on the command's offsets, a GOOD status rides in the
/// last Data-In of the final piece; with sense the response follows with ExpDataSN = the
/// Data-In count; a final piece of 0 bytes sends the response alone. Each piece's buffer
/// goes once it is sent.
#[test]
fn put_data_in_pieces_continues_data_sn_and_cuts_bursts_on_the_command_offset() {
    let (mut dm, mut c) = pair();
    dm.notice_key_values(DatamoverParams { initiator_max_recv_data_segment_length: 4096, max_burst_length: 8192, ..Default::default() });
    let data: Vec<u8> = (0..25_000u32).map(|i| (i % 251) as u8).collect();
    let mut f = Framer::with_limits(FramerLimits { max_recv_data_segment_length: 8192, max_ahs_length: 1020 });
    let mut ev = Vec::new();

    // GOOD: phase collapse in the last Data-In of the final piece.
    dm.put_data(piece(&data, 0, 10_000, None));
    // The first piece goes out before the next exists, and its buffer goes with it.
    let first: Vec<Pdu> = (0..3).map(|_| next_pdu(&mut dm, &mut c, &mut f, &mut ev)).collect();
    while !dm.idle() {
        dm.poll(&mut ev);
    }
    assert!(dm.held.slots.iter().all(Option::is_none), "the piece's buffer went once sent");
    assert_eq!(dm.streams.get(&Itt(5)), Some(&Sn(3)), "the task's next DataSN is kept");
    dm.put_data(piece(&data, 10_000, 20_000, None));
    dm.put_data(piece(&data, 20_000, 25_000, Some(response(0, false))));
    let mut pdus = first;
    // 0-4096, 4096-8192 F, 8192-10000 | 10000-14096, 14096-16384 F, 16384-20000 |
    // 20000-24096, 24096-24576 F, 24576-25000 F+S.
    pdus.extend((0..6).map(|_| next_pdu(&mut dm, &mut c, &mut f, &mut ev)));
    assert!(check_data_in(&pdus, 25_000, 4096, 8192, true) == data, "the data, in order");
    let Op::DataIn(last) = &pdus[8].bhs.op else { unreachable!() };
    assert!(last.residual_underflow && last.residual_count == 512 && last.stat_sn == Sn(77) && last.status == 0);
    assert!(dm.streams.is_empty(), "the final piece forgets the task");

    // With sense: the status travels in the response, ExpDataSN = the Data-In count.
    dm.put_data(piece(&data, 0, 10_000, None));
    dm.put_data(piece(&data, 10_000, 20_000, None));
    dm.put_data(piece(&data, 20_000, 25_000, Some(response(2, true))));
    let pdus: Vec<Pdu> = (0..10).map(|_| next_pdu(&mut dm, &mut c, &mut f, &mut ev)).collect();
    assert!(check_data_in(&pdus[..9], 25_000, 4096, 8192, false) == data, "the data, in order");
    let Op::ScsiResponse(r) = &pdus[9].bhs.op else { panic!("expected the SCSI Response") };
    assert_eq!((r.status, r.exp_data_sn), (2, Sn(9)));
    assert_eq!(pdus[9].data, vec![0, 2, 0x70, 0], "sense data");

    // A final piece of 0 bytes: the response alone, ExpDataSN = the Data-In sent before.
    dm.put_data(piece(&data, 0, 10_000, None));
    dm.put_data(piece(&data, 10_000, 20_000, None));
    dm.put_data(piece(&data, 20_000, 20_000, Some(response(0, false))));
    let pdus: Vec<Pdu> = (0..7).map(|_| next_pdu(&mut dm, &mut c, &mut f, &mut ev)).collect();
    for (i, p) in pdus[..6].iter().enumerate() {
        let Op::DataIn(d) = &p.bhs.op else { panic!("expected Data-In") };
        assert_eq!(d.data_sn, Sn(i as u32));
        assert!(!d.status_present);
    }
    let Op::ScsiResponse(r) = &pdus[6].bhs.op else { panic!("expected the SCSI Response") };
    assert_eq!((r.status, r.exp_data_sn, r.residual_count), (0, Sn(6), 512));
    assert!(dm.streams.is_empty());

    // Deallocate_Task_Resources drops a streamed read's state: the task's next read (its
    // ITT reused) starts at DataSN 0 even if it came in pieces again from offset 0.
    dm.put_data(piece(&data, 0, 10_000, None));
    assert!(dm.deallocate_task_resources(Itt(5)).is_none(), "TCP holds no buffer of a read");
    assert!(dm.streams.is_empty());
    assert_eq!(dm.copies().read_bytes, 0, "read data goes out from the pieces' buffers");
}

/// A write fetched in two Get_Data (more = true, then false), each with its own buffer
/// (base = its first byte's command offset): R2TSN goes on across them, R2Ts carry the
/// command's offsets, Data-Out lands at buf[BufferOffset - base]; a fresh task starts at
/// R2TSN 0; a Data-Out outside the current piece fails the task.
#[test]
fn get_data_in_pieces_continues_r2t_sn_and_places_data_at_offset_minus_base() {
    let (mut dm, mut c) = pair();
    dm.notice_key_values(DatamoverParams { max_burst_length: 4096, max_outstanding_r2t: 1, target_max_recv_data_segment_length: 8192, ..Default::default() });
    let mut ev = Vec::new();
    let mut f = Framer::new();
    let send = |c: &mut TcpStream, itt: u32, ttt: Ttt, off: u32, data: Vec<u8>| {
        let p = Pdu::with_data(Op::DataOut(data_out(Itt(itt), ttt, Sn(0), off)), data);
        c.write_all(&p.to_bytes(Digests::default()).unwrap()).unwrap();
    };
    // The command's bytes 8192.. (the first 8 KiB came as immediate data): 24 KiB.
    let cmd: Vec<u8> = (0..32_768u32).map(|i| (i % 239) as u8).collect();
    let mut r2t_sns = Vec::new();
    for (k, (offset, len, more)) in [(8192u32, 8192u32, true), (16_384, 16_384, false)].into_iter().enumerate() {
        let buf = riser_bdev::IoBuf::from(vec![0u8; len as usize]);
        dm.get_data(GetData { itt: Itt(9), lun: Lun(0), buf, offset, len, base: offset, more, sn: SnState::default() });
        let mut burst = offset;
        while burst < offset + len {
            let p = next_pdu(&mut dm, &mut c, &mut f, &mut ev);
            let Op::R2t(r) = p.bhs.op else { panic!("expected R2T") };
            assert_eq!((r.buffer_offset, r.desired_data_transfer_length), (burst, 4096), "R2T at the command's offset");
            r2t_sns.push(r.r2t_sn.get());
            send(&mut c, 9, r.ttt, burst, cmd[burst as usize..burst as usize + 4096].to_vec());
            burst += 4096;
        }
        let DmEvent::DataReady { itt, buf } = data_event(&mut dm, &mut ev) else { panic!("expected DataReady") };
        assert_eq!(itt, Itt(9));
        assert!(buf.as_slice() == &cmd[offset as usize..(offset + len) as usize], "piece {k} at buf[BufferOffset - base]");
        assert_eq!(dm.r2t_sns.contains_key(&Itt(9)), more, "R2TSN kept only while more pieces follow");
    }
    assert_eq!(r2t_sns, vec![0, 1, 2, 3, 4, 5], "R2TSN numbers every R2T of the task");

    // The ITT reused by a new write: R2TSN from 0 again.
    dm.get_data(GetData { itt: Itt(9), lun: Lun(0), buf: riser_bdev::IoBuf::from(vec![0u8; 4096]), offset: 4096, len: 4096, base: 4096, more: true, sn: SnState::default() });
    let Op::R2t(r) = next_pdu(&mut dm, &mut c, &mut f, &mut ev).bhs.op else { panic!("expected R2T") };
    assert_eq!((r.r2t_sn, r.buffer_offset), (Sn(0), 4096));
    // Data-Out for the current R2T but at an offset of an earlier piece: the task fails.
    send(&mut c, 9, r.ttt, 0, vec![1u8; 4096]);
    let DmEvent::DataFailed { itt, buf, reason } = data_event(&mut dm, &mut ev) else { panic!("expected DataFailed") };
    assert_eq!((itt, reason), (Itt(9), "bad buffer offset"));
    assert!(buf.as_slice().iter().all(|&b| b == 0), "nothing of it landed in the buffer");
    assert!(dm.solicits.is_empty());
    assert!(dm.deallocate_task_resources(Itt(9)).is_none());
    assert!(dm.r2t_sns.is_empty(), "Deallocate_Task_Resources forgets the task's R2TSN");

    // A write that ends (its response goes out) between two Get_Data: its R2TSN is
    // forgotten, the next task with its ITT starts at 0.
    let buf = riser_bdev::IoBuf::from(vec![0u8; 4096]);
    dm.get_data(GetData { itt: Itt(12), lun: Lun(0), buf, offset: 0, len: 4096, base: 0, more: true, sn: SnState::default() });
    let Op::R2t(r) = next_pdu(&mut dm, &mut c, &mut f, &mut ev).bhs.op else { panic!("expected R2T") };
    send(&mut c, 12, r.ttt, 0, vec![2u8; 4096]);
    assert!(matches!(data_event(&mut dm, &mut ev), DmEvent::DataReady { itt: Itt(12), .. }));
    assert!(dm.r2t_sns.contains_key(&Itt(12)));
    dm.send_control(Pdu::new(Op::ScsiResponse(scsi_response(Itt(12), 2, SnState::default()))));
    assert!(dm.r2t_sns.is_empty(), "the response ends the task's pieces");
    assert!(matches!(next_pdu(&mut dm, &mut c, &mut f, &mut ev).bhs.op, Op::ScsiResponse(_)));
    let buf = riser_bdev::IoBuf::from(vec![0u8; 4096]);
    dm.get_data(GetData { itt: Itt(12), lun: Lun(0), buf, offset: 0, len: 4096, base: 0, more: false, sn: SnState::default() });
    let Op::R2t(r) = next_pdu(&mut dm, &mut c, &mut f, &mut ev).bhs.op else { panic!("expected R2T") };
    assert_eq!(r.r2t_sn, Sn(0), "a new task's R2TSN starts at 0");
    assert!(dm.deallocate_task_resources(Itt(12)).is_some(), "the Get_Data's buffer comes back");

    // A piece outside its buffer fails at once, without an R2T.
    for (offset, len, base) in [(4096u32, 4096u32, 8192u32), (8192, 8192, 4096)] {
        let buf = riser_bdev::IoBuf::from(vec![0u8; 8192]);
        dm.get_data(GetData { itt: Itt(11), lun: Lun(0), buf, offset, len, base, more: false, sn: SnState::default() });
        let DmEvent::DataFailed { itt, reason, .. } = data_event(&mut dm, &mut ev) else { panic!("expected DataFailed") };
        assert_eq!((itt, reason), (Itt(11), "solicited data outside the task's buffer"));
    }
    assert!(dm.idle(), "no R2T for a piece that does not fit its buffer");
}
