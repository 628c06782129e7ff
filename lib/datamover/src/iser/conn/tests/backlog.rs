//! The backlog queued for the initiator: receives held while it is over the limit, and
//! what counts in it.

use super::*;

/// A NOP-Out ping (immediate, TTT reserved) with `data` bytes of ping data.
fn ping(itt: u32, data: usize) -> Vec<u8> {
    let mut m = IserHeader::TARGET_CONTROL.to_vec();
    let pdu = Pdu::with_data(Op::NopOut(riser_iscsi::testing::nop_out(Itt(itt), Sn(1))), vec![0x77; data]);
    pdu.encode_message(&mut m).unwrap();
    m
}

/// One pass as the connection makes it: poll, answer each NOP-Out with its NOP-In echo
/// (ping data included), flush. Returns the PDUs received.
fn echo_pass(d: &mut IserDatamover<FakeQp>) -> usize {
    use riser_iscsi::pdu::NopIn;
    use riser_iscsi::serial::Ttt;
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let mut n = 0;
    for e in ev {
        let DmEvent::Control(p) = e else { panic!("only pings arrive") };
        let Op::NopOut(o) = p.op() else { panic!("only pings arrive") };
        let nop_in = NopIn { lun: Lun(0), itt: o.itt, ttt: Ttt::RESERVED, stat_sn: Sn(0), exp_cmd_sn: Sn(0), max_cmd_sn: Sn(0) };
        d.send_control(Pdu::with_data(Op::NopIn(nop_in), p.data.clone()));
        n += 1;
    }
    let mut ev = Vec::new();
    d.flush(&mut ev);
    assert!(ev.is_empty());
    n
}

/// Ping data of the flood: each echo takes a large send slot (8 of them).
const FLOOD_PING: usize = 4000;
const FLOOD_ECHO: usize = ISER_HDR_LEN + BHS_LEN + FLOOD_PING;

/// An initiator that posts no receives (none of our SENDs completes) and sends NOP-Out
/// pings with data as long as it has receive credits, under a limit of `limit` bytes.
/// Returns the pings it could send.
fn flood(d: &mut IserDatamover<FakeQp>, limit: TxLimit) -> usize {
    d.limit_tx_queue(limit);
    let s0 = d.tx_backlog().sent;
    let mut delivered = 0;
    while !d.qp.recvs.is_empty() && delivered < 5000 {
        deliver(d, &ping(delivered as u32, FLOOD_PING));
        delivered += 1;
        assert_eq!(echo_pass(d), 1);
    }
    let ring = d.recv.count();
    assert!(d.qp.recvs.is_empty(), "the initiator runs out of receive credits ({delivered} pings sent)");
    assert_eq!(d.rx_handled.len(), ring, "every handled receive held");
    // The backlog reached the limit, then the initiator could only use the receives
    // still posted: at most a ring's worth of answers beyond it.
    assert!(delivered <= limit.unbudgeted / FLOOD_ECHO + 1 + ring, "{delivered} pings");
    let b = d.tx_backlog();
    assert_eq!(b, TxBacklog { unbudgeted: delivered * FLOOD_ECHO, total: delivered * FLOOD_ECHO, sent: s0 });
    assert!(b.unbudgeted <= limit.unbudgeted + (ring + 1) * FLOOD_ECHO && limit.exceeded_by(&b));
    assert_eq!(d.pending.len(), delivered - SEND_ROOM, "all but the SENDs posted wait, bounded");
    // More passes without a completion repost nothing.
    for _ in 0..10 {
        assert_eq!(echo_pass(d), 0);
    }
    assert!(d.qp.recvs.is_empty());
    delivered
}

/// A peer that never posts receives, so that none of our SENDs completes (rnr_retry_count
/// 7 retries for ever), and floods NOP-Outs with ping data, each answered by a NOP-In
/// echo: once more than the limit is queued for it, its receive slots are held, not
/// reposted, so the pending sends stay bounded by the limit and the ring. When its SENDs
/// complete the backlog drains, every echo goes out in order, `sent` advances with the
/// completions, and the receives are reposted: the next request gets through. (Before
/// the bound, every receive was reposted at once and the flood ran to its 5000 pings.)
#[test]
fn a_flood_of_pings_that_nobody_takes_holds_the_receives_until_the_answers_complete() {
    let limit = TxLimit::new(64 << 10);
    let mut d = ffp_dm(IserConfig::default());
    let ring = d.recv.count();
    let s0 = d.tx_backlog().sent;
    let delivered = flood(&mut d, limit);

    // The initiator takes the SENDs: the first 8 complete, `sent` moves.
    wire(&mut d);
    echo_pass(&mut d);
    assert_eq!(d.tx_backlog().sent, s0 + (SEND_ROOM * FLOOD_ECHO) as u64, "sent advances with the completions");
    let mut passes = 0;
    while d.qp.sent.len() < delivered || !d.qp.queued.is_empty() || !d.qp.done.is_empty() {
        wire(&mut d);
        assert_eq!(echo_pass(&mut d), 0);
        passes += 1;
        assert!(passes < 10_000, "the backlog drains");
    }
    assert_eq!(d.tx_backlog(), TxBacklog { unbudgeted: 0, total: 0, sent: s0 + (delivered * FLOOD_ECHO) as u64 });
    assert!(d.pending.is_empty() && d.idle());
    for (i, m) in d.qp.sent.iter().enumerate() {
        let p = Pdu::decode_message(&m[ISER_HDR_LEN..], 8192).unwrap();
        assert!(matches!(p.op(), Op::NopIn(n) if n.itt == Itt(i as u32)), "echo {i} in order");
        assert_eq!(p.data, vec![0x77; FLOOD_PING]);
    }
    assert_eq!(d.qp.recvs.len(), ring, "every receive reposted");
    assert!(d.rx_handled.is_empty() && !d.rx_paused);
    // The initiator's next request (a Logout, a TMF, a SNACK: here a ping) gets through.
    deliver(&mut d, &ping(9999, 16));
    assert_eq!(echo_pass(&mut d), 1);
    assert_eq!(d.qp.recvs.len(), ring);
}

/// With every receive held for the backlog, a QP that goes to error still tears the
/// connection down: no receive is posted to flush, so the flushed SENDs say so.
#[test]
fn a_qp_in_error_with_every_receive_held_terminates() {
    let mut d = ffp_dm(IserConfig::default());
    flood(&mut d, TxLimit::new(64 << 10));
    let flushed: Vec<Completion> =
        d.qp.queued.iter().filter(|w| w.signaled).map(|w| Completion { wr_id: w.wr_id, error: Some(true), byte_len: 0 }).collect();
    assert_eq!(flushed.len(), SEND_ROOM);
    d.qp.done.extend(flushed);
    let mut ev = Vec::new();
    d.poll(&mut ev);
    assert_eq!(terminated(&ev), Some("connection lost (receive queue flushed)"));
    assert!(d.qp.disconnected && d.dead);
    let mut ev = Vec::new();
    assert_eq!(d.poll(&mut ev), 0);
    assert!(ev.is_empty());
}

/// Read data counts in the total backlog (it lives in the task's budgeted buffer), its
/// response outside the I/O buffers, from Put_Data until the response SEND completes.
#[test]
fn read_data_counts_in_the_backlog_until_its_writes_complete() {
    let mut d = ffp_dm(IserConfig::default());
    let before = d.tx_backlog().sent;
    deliver(&mut d, &command(1, true, false, 200_000, vec![]));
    let mut ev = Vec::new();
    d.poll(&mut ev);
    let r = response(1);
    let r_len = message_len(&r);
    d.put_data(PutData {
        itt: Itt(1),
        lun: Lun(0),
        buf: riser_bdev::IoBuf::from(vec![1u8; 200_000]),
        len: 200_000,
        offset: 0,
        response: Some(r),
        sn: SnState::default(),
    });
    let queued = TxBacklog { unbudgeted: r_len, total: r_len + 200_000, sent: before };
    assert_eq!(d.tx_backlog(), queued);
    d.poll(&mut ev);
    assert!(!d.qp.queued.is_empty());
    assert_eq!(d.tx_backlog(), queued, "posted, not yet completed");
    wire(&mut d);
    d.poll(&mut ev);
    assert_eq!(d.tx_backlog(), TxBacklog { unbudgeted: 0, total: 0, sent: before + (r_len + 200_000) as u64 });
}
