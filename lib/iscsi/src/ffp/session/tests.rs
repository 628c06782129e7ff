//! Unit tests of the full-feature phase state machine.

use super::*;
use riser_scsi::task::{DataPiece, DataWant, SenseBuf};
use crate::pdu::{tmf, LogoutRequest, TaskMgmtRequest, TextResponse};
use crate::text::encode_pairs;
use crate::testing::{data_out, nop_out, read10, scsi_command, text_request};
use std::time::Duration;

/// A command whose CDB is READ(10) of one block (whatever the direction: the CDB is the SCSI
/// layer's business).
fn cmd(itt: u32, cmd_sn: u32, read: bool, write: bool, edtl: u32) -> ScsiCommand {
    scsi_command(Itt(itt), Sn(cmd_sn), read, write, edtl, &read10(0, 1))
}

fn ffp(cfg: FfpConfig) -> (Ffp, Instant) {
    let now = Instant::now();
    (Ffp::new(cfg, Sn(10), Sn(100), now), now)
}

fn drain(f: &mut Ffp) -> Vec<Action> {
    std::iter::from_fn(|| f.poll_action()).collect()
}

/// An immediate ABORT TASK (tag `itt`) of task `referenced`.
fn abort_task(itt: u32, referenced: u32, cmd_sn: u32, ref_cmd_sn: u32) -> Pdu {
    Pdu::new(Op::TaskMgmtRequest(TaskMgmtRequest {
        immediate: true,
        function: tmf::ABORT_TASK | 0x80,
        lun: Lun(0),
        itt: Itt(itt),
        referenced_task_tag: Itt(referenced),
        cmd_sn: Sn(cmd_sn),
        exp_stat_sn: Sn(0),
        ref_cmd_sn: Sn(ref_cmd_sn),
        exp_data_sn: Sn(0),
    }))
}

fn sent(a: &Action) -> &Pdu {
    match a {
        Action::Send(p) => p,
        _ => panic!("expected Send"),
    }
}

#[test]
fn read_executes_and_response_carries_window() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 4, ..Default::default() });
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, true, false, 512))), now);
    let a = drain(&mut f);
    let Action::Execute(req) = &a[0] else { panic!("expected Execute") };
    assert_eq!((req.itt, req.edtl, req.cdb[0]), (Itt(1), 512, 0x28));
    f.on_scsi(TaskEvent::Done(ScsiResult { tag: 1, status: Status::Good, sense: None, data_in: Some(IoBuf::from(vec![7u8; 512])), data_len: 512, data_offset: 0, residual: Residual::None }));
    let a = drain(&mut f);
    let Action::PutData(p) = &a[0] else { panic!("expected PutData") };
    let Op::ScsiResponse(r) = &p.response.as_ref().expect("a response").bhs.op else { panic!() };
    assert_eq!(r.stat_sn, Sn(100));
    assert_eq!(r.exp_cmd_sn, Sn(11));
    // Window: 10..=13 at start; one command done opens one more slot.
    assert_eq!(r.max_cmd_sn, Sn(14));
}

#[test]
fn out_of_window_commands_are_dropped_and_gaps_held() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 4, ..Default::default() });
    // A second connection of the same session shares the window.
    let mut g = Ffp::join(FfpConfig { queue_depth: 4, ..Default::default() }, f.window(), Sn(0), now);
    g.on_pdu(Pdu::new(Op::ScsiCommand(cmd(9, 12, false, false, 0))), now);
    assert!(drain(&mut g).is_empty(), "CmdSN 12 waits for 10 and 11");
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 20, false, false, 0))), now);
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(2, 9, false, false, 0))), now);
    assert!(drain(&mut f).is_empty(), "out-of-window CmdSNs must be ignored");
    // 11 arrives before 10: held, then both run in CmdSN order.
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(3, 11, false, false, 0))), now);
    assert!(drain(&mut f).is_empty());
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(4, 10, false, false, 0))), now);
    let itts: Vec<Itt> = drain(&mut f)
        .iter()
        .map(|a| match a {
            Action::Execute(r) => r.itt,
            _ => panic!(),
        })
        .collect();
    assert_eq!(itts, vec![Itt(4), Itt(3)]);
    assert_eq!(f.sn().exp_cmd_sn, Sn(12));
    g.release_held();
    assert!(matches!(drain(&mut g).as_slice(), [Action::Execute(r)] if r.itt == Itt(9)));
    assert_eq!(f.sn().exp_cmd_sn, Sn(13), "both connections see one window");
}

#[test]
fn write_with_immediate_unsolicited_and_solicited_data() {
    let (mut f, now) = ffp(FfpConfig {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 2048,
        ..Default::default()
    });
    let mut c = cmd(5, 10, false, true, 8192);
    c.final_bit = false;
    f.on_pdu(Pdu::with_data(Op::ScsiCommand(c), vec![1u8; 1024]), now);
    assert!(drain(&mut f).is_empty(), "waits for unsolicited Data-Out");
    let d = data_out(Itt(5), Ttt::RESERVED, Sn(0), 1024);
    f.on_pdu(Pdu::with_data(Op::DataOut(d), vec![2u8; 1024]), now);
    let a = drain(&mut f);
    let Action::GetData(g) = &a[0] else { panic!("expected GetData") };
    assert_eq!((g.offset, g.len), (2048, 8192 - 2048));
    assert_eq!(&g.buf.as_slice()[..1024], &[1u8; 1024][..]);
    assert_eq!(&g.buf.as_slice()[1024..2048], &[2u8; 1024][..]);
    let Some(Action::GetData(g)) = a.into_iter().next() else { unreachable!() };
    f.on_data_ready(g.itt, g.buf);
    let a = drain(&mut f);
    let Action::Execute(r) = &a[0] else { panic!("expected Execute") };
    assert_eq!(r.data_out_len(), 8192);
}

#[test]
fn bad_unsolicited_data_sn_fails_the_command_not_the_connection() {
    let (mut f, now) = ffp(FfpConfig { initial_r2t: false, ..Default::default() });
    let mut c = cmd(6, 10, false, true, 4096);
    c.final_bit = false;
    f.on_pdu(Pdu::new(Op::ScsiCommand(c)), now);
    let d = data_out(Itt(6), Ttt::RESERVED, Sn(3), 0);
    f.on_pdu(Pdu::with_data(Op::DataOut(d), vec![0u8; 512]), now);
    let a = drain(&mut f);
    let Op::ScsiResponse(r) = &sent(&a[0]).bhs.op else { panic!() };
    assert_eq!(r.status, STATUS_CHECK_CONDITION);
    assert!(!f.is_closing());
    assert_eq!(f.active_tasks(), 0);
}

#[test]
fn nop_echo_ping_and_timeout() {
    let (mut f, now) = ffp(FfpConfig {
        nop_in_interval: Duration::from_secs(5),
        nop_timeout: Duration::from_secs(10),
        ..Default::default()
    });
    let nop = nop_out(Itt(9), Sn(10));
    f.on_pdu(Pdu::with_data(Op::NopOut(nop), b"ping".to_vec()), now);
    let a = drain(&mut f);
    assert_eq!(sent(&a[0]).data, b"ping");
    f.on_timer(now + Duration::from_secs(6));
    let a = drain(&mut f);
    let Op::NopIn(n) = &sent(&a[0]).bhs.op else { panic!() };
    assert!(n.itt.is_reserved() && !n.ttt.is_reserved());
    f.on_timer(now + Duration::from_secs(17));
    assert!(matches!(drain(&mut f).as_slice(), [Action::Close { logout: false, .. }]));
}

/// The Async Message "logout requested" (RFC 7143 §11.9.1) takes a StatSN; the initiator's
/// Logout then closes as usual; none once closing.
#[test]
fn requested_logout_sends_async_event_1_with_the_wait() {
    let (mut f, now) = ffp(FfpConfig::default());
    f.request_logout(7);
    let a = drain(&mut f);
    let Op::AsyncMessage(m) = &sent(&a[0]).bhs.op else { panic!("expected an Async Message") };
    assert_eq!((m.async_event, m.parameter3, m.stat_sn, m.exp_cmd_sn), (1, 7, Sn(100), Sn(10)));
    assert!(sent(&a[0]).bhs.itt().is_reserved());
    let l = LogoutRequest { immediate: true, reason_code: logout::CLOSE_SESSION, itt: Itt(3), cid: 0, cmd_sn: Sn(10), exp_stat_sn: Sn(101) };
    f.on_pdu(Pdu::new(Op::LogoutRequest(l)), now);
    let a = drain(&mut f);
    let Op::LogoutResponse(r) = &sent(&a[0]).bhs.op else { panic!("expected a Logout Response") };
    assert_eq!(r.stat_sn, Sn(101), "the Async Message took StatSN 100");
    assert!(matches!(a[1], Action::Close { logout: true, .. }));
    f.request_logout(7);
    assert!(drain(&mut f).is_empty());
}

#[test]
fn logout_closes_and_tmf_aborts() {
    let (mut f, now) = ffp(FfpConfig::default());
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, true, false, 512))), now);
    drain(&mut f);
    f.on_pdu(abort_task(2, 1, 11, 10), now);
    let a = drain(&mut f);
    assert!(matches!(a[0], Action::Abort { itt: Itt(1), .. }));
    let Op::TaskMgmtResponse(r) = &sent(&a[1]).bhs.op else { panic!() };
    assert_eq!(r.response, tmf::response::FUNCTION_COMPLETE);
    // The aborted task's completion is dropped.
    f.on_scsi(TaskEvent::Done(ScsiResult { tag: 1, status: Status::Good, sense: None, data_in: None, data_len: 0, data_offset: 0, residual: Residual::None }));
    assert!(drain(&mut f).is_empty());
    let l = LogoutRequest { immediate: true, reason_code: logout::CLOSE_SESSION, itt: Itt(3), cid: 0, cmd_sn: Sn(11), exp_stat_sn: Sn(0) };
    f.on_pdu(Pdu::new(Op::LogoutRequest(l)), now);
    let a = drain(&mut f);
    assert!(matches!(sent(&a[0]).bhs.op, Op::LogoutResponse(_)));
    assert!(matches!(a[1], Action::Close { logout: true, whole_session: true, .. }));
}

#[test]
fn unknown_opcode_and_snack_are_rejected() {
    let (mut f, now) = ffp(FfpConfig::default());
    let mut raw = [0u8; 48];
    raw[0] = 0x1c;
    let bhs = Bhs::parse(&raw).unwrap();
    f.on_pdu(Pdu::new(bhs.op), now);
    let a = drain(&mut f);
    let Op::Reject(r) = &sent(&a[0]).bhs.op else { panic!() };
    assert_eq!(r.reason, RejectReason::CommandNotSupported as u8);
    assert_eq!(sent(&a[0]).data.len(), 48);
    assert!(!f.is_closing());
}

#[test]
fn text_with_continue_and_no_data_is_harmless() {
    struct R;
    impl TextResponder for R {
        fn respond(&mut self, _: &Pairs) -> Pairs {
            vec![("TargetName".into(), "iqn.x".into())]
        }
    }
    let (mut f, now) = ffp(FfpConfig::default());
    f.set_responder(Box::new(R));
    let t = text_request(Itt(4), Sn(10), true);
    f.on_pdu(Pdu::new(Op::TextRequest(t.clone())), now);
    let a = drain(&mut f);
    assert!(matches!(sent(&a[0]).bhs.op, Op::TextResponse(_)));
    let t2 = crate::pdu::TextRequest { final_bit: true, continue_bit: false, ..t };
    f.on_pdu(Pdu::with_data(Op::TextRequest(t2), b"SendTargets=All\0".to_vec()), now);
    let a = drain(&mut f);
    assert_eq!(sent(&a[0]).data, b"TargetName=iqn.x\0");
}

/// The fixed-format sense data (SPC-4 4.5.3) of a SCSI Response: SenseLength, then 18 bytes.
fn fixed_sense_segment(key: u8, asc: u8, ascq: u8) -> Vec<u8> {
    let mut v = vec![0, 18, 0x70, 0, key, 0, 0, 0, 0, 10];
    v.extend_from_slice(&[0, 0, 0, 0, asc, ascq, 0, 0, 0, 0]);
    v
}

#[test]
fn commands_failed_in_the_iscsi_layer_carry_fixed_sense() {
    // A write beyond largest_write: ILLEGAL REQUEST, INVALID FIELD IN CDB.
    let (mut f, now) = ffp(FfpConfig { largest_write: 4096, ..Default::default() });
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, false, true, 8192))), now);
    let a = drain(&mut f);
    let p = sent(&a[0]);
    let Op::ScsiResponse(r) = &p.bhs.op else { panic!() };
    assert_eq!((r.status, r.residual_underflow, r.residual_count), (STATUS_CHECK_CONDITION, true, 8192));
    assert_eq!(p.data, fixed_sense_segment(0x05, 0x24, 0x00));
    // Its slot of the window opens once (MaxCmdSN one further), not twice.
    assert_eq!(r.max_cmd_sn, Sn(10 + FfpConfig::default().queue_depth));
    // Unsolicited data out of order: ABORTED COMMAND, DATA PHASE ERROR.
    let (mut f, now) = ffp(FfpConfig { initial_r2t: false, ..Default::default() });
    let mut c = cmd(6, 10, false, true, 4096);
    c.final_bit = false;
    f.on_pdu(Pdu::new(Op::ScsiCommand(c)), now);
    let d = data_out(Itt(6), Ttt::RESERVED, Sn(0), 512);
    f.on_pdu(Pdu::with_data(Op::DataOut(d), vec![0u8; 512]), now);
    let a = drain(&mut f);
    assert_eq!(sent(&a[0]).data, fixed_sense_segment(0x0b, 0x4b, 0x00));
    // Failed solicited data: the same.
    let (mut f, now) = ffp(FfpConfig::default());
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(7, 10, false, true, 4096))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::GetData(_)]));
    f.on_data_failed(Itt(7), "digest error");
    let a = drain(&mut f);
    assert_eq!(sent(&a[0]).data, fixed_sense_segment(0x0b, 0x4b, 0x00));
}

#[test]
fn data_expected_without_r_or_w_is_rejected() {
    // RFC 7143 §11.3.1.1: R and W must not both be 0 when EDTL is not.
    let (mut f, now) = ffp(FfpConfig { queue_depth: 4, ..Default::default() });
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, false, false, 512))), now);
    let a = drain(&mut f);
    assert_eq!(a.len(), 1, "rejected, not executed");
    let p = sent(&a[0]);
    let Op::Reject(r) = &p.bhs.op else { panic!("expected Reject") };
    assert_eq!(r.reason, RejectReason::InvalidPduField as u8);
    assert_eq!(p.data.len(), 48);
    assert_eq!(r.max_cmd_sn, Sn(14), "its CmdSN slot is free again");
    assert!(!f.is_closing());
    assert_eq!(f.active_tasks(), 0);
    // neither bit with EDTL 0: a command without data, executed
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(2, 11, false, false, 0))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(r)] if r.itt == Itt(2)));
}

/// Runs a write (W=1) whose CDB is READ(10) of one block through to its SCSI completion, with
/// what the SCSI layer presents; returns what the iSCSI layer then does.
fn read_cdb_sent_as_write(edtl: u32, data_in_len: u32, residual: Residual) -> Vec<Action> {
    let (mut f, now) = ffp(FfpConfig::default());
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, false, true, edtl))), now);
    let Some(Action::GetData(g)) = drain(&mut f).into_iter().next() else { panic!("expected GetData") };
    f.on_data_ready(g.itt, g.buf);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(_)]));
    f.on_scsi(TaskEvent::Done(ScsiResult { tag: 1, status: Status::Good, sense: None, data_in: Some(IoBuf::from(vec![7u8; data_in_len as usize])), data_len: data_in_len as usize, data_offset: 0, residual }));
    drain(&mut f)
}

#[test]
fn data_in_without_the_r_bit_is_a_residual_overflow() {
    // libiscsi's iSCSIResiduals.Read10Invalid: READ(10) of one block flagged as a write. The
    // block cannot go (no R bit: no Data-In expected); GOOD stays, with the whole block as a
    // residual overflow instead of a silent GOOD.
    let a = read_cdb_sent_as_write(512, 512, Residual::None);
    assert_eq!(a.len(), 1, "no Put_Data");
    let Op::ScsiResponse(r) = &sent(&a[0]).bhs.op else { panic!("expected SCSI Response") };
    assert_eq!((r.status, r.residual_overflow, r.residual_underflow, r.residual_count), (STATUS_GOOD, true, false, 512));
    // The SCSI layer cut its 512 bytes to EDTL 200 and counted 312 over: 512 presented.
    let a = read_cdb_sent_as_write(200, 200, Residual::Overflow(312));
    let Op::ScsiResponse(r) = &sent(&a[0]).bhs.op else { panic!("expected SCSI Response") };
    assert_eq!((r.residual_overflow, r.residual_count), (true, 512));
}

/// A SendTargets answer of many targets, each with two portals.
struct ManyTargets(usize);

impl TextResponder for ManyTargets {
    fn respond(&mut self, _: &Pairs) -> Pairs {
        let mut out = Pairs::new();
        for i in 0..self.0 {
            out.push(("TargetName".into(), format!("iqn.2016-06.io.riser:a-rather-long-target-name-{i:04}")));
            out.push(("TargetAddress".into(), format!("192.0.2.{}:3260,1", i % 250)));
            out.push(("TargetAddress".into(), format!("[2001:db8::{i:x}]:3260,2")));
        }
        out
    }
}

/// Sends SendTargets=All and fetches the answer the way an initiator does (RFC 7143 §11.10.2,
/// §11.11): an empty Text Request with the response's TTT for every piece sent with C=1.
/// Returns each Text Response with its data.
fn send_targets(cfg: FfpConfig, targets: usize) -> Vec<(TextResponse, Vec<u8>)> {
    let (mut f, now) = ffp(cfg);
    f.set_responder(Box::new(ManyTargets(targets)));
    let t = text_request(Itt(4), Sn(10), false);
    f.on_pdu(Pdu::with_data(Op::TextRequest(t.clone()), b"SendTargets=All\0".to_vec()), now);
    let mut pieces = Vec::new();
    for _ in 0..1000 {
        let a = drain(&mut f);
        assert_eq!(a.len(), 1);
        let p = sent(&a[0]);
        let Op::TextResponse(r) = &p.bhs.op else { panic!("expected Text Response") };
        pieces.push((r.clone(), p.data.clone()));
        if !r.continue_bit {
            return pieces;
        }
        let next = crate::pdu::TextRequest { ttt: r.ttt, ..t.clone() };
        f.on_pdu(Pdu::new(Op::TextRequest(next)), now);
    }
    panic!("the answer never ended");
}

#[test]
fn long_send_targets_answer_is_continued_not_cut() {
    let expected = encode_pairs(&ManyTargets(40).respond(&Pairs::new()));
    assert!(expected.len() > 4000);
    // iSER: the initiator receives 128 bytes of data per PDU whatever it declared.
    let iser = FfpConfig { initiator_mrdsl: crate::ffp::ISER_INITIATOR_RECV_DATA_SEGMENT, discovery: true, ..Default::default() };
    // TCP: the initiator's MaxRecvDataSegmentLength.
    let tcp = FfpConfig { initiator_mrdsl: 1024, discovery: true, ..Default::default() };
    for (cfg, max) in [(iser, 128), (tcp, 1024)] {
        let pieces = send_targets(cfg, 40);
        assert!(pieces.len() >= expected.len() / max, "{} pieces", pieces.len());
        let (last, init) = pieces.split_last().unwrap();
        for (i, (r, data)) in init.iter().enumerate() {
            assert!(r.continue_bit && !r.final_bit && !r.ttt.is_reserved(), "piece {i}: {r:?}");
            assert_eq!(data.len(), max, "piece {i} fills the initiator's buffer");
        }
        assert!(!last.0.continue_bit && last.0.final_bit && last.0.ttt.is_reserved());
        assert!(!last.1.is_empty() && last.1.len() <= max);
        // one StatSN per response, in order
        for (i, (r, _)) in pieces.iter().enumerate() {
            assert_eq!(r.stat_sn, Sn(100 + i as u32));
        }
        let whole: Vec<u8> = pieces.iter().flat_map(|(_, d)| d.iter().copied()).collect();
        assert_eq!(whole, expected, "reassembled, nothing lost");
        assert_eq!(crate::text::parse_pairs(&whole).unwrap(), ManyTargets(40).respond(&Pairs::new()));
    }
}

#[test]
fn nop_in_echo_is_limited_to_what_the_initiator_receives() {
    // RFC 7143 §11.18: the echo is limited to the initiator's receive size; on iSER 128 bytes.
    let ping: Vec<u8> = (0..=255u8).cycle().take(4000).collect();
    for (mrdsl, expect) in [(crate::ffp::ISER_INITIATOR_RECV_DATA_SEGMENT as usize, 128), (8192, 4000)] {
        let (mut f, now) = ffp(FfpConfig { initiator_mrdsl: mrdsl as u32, ..Default::default() });
        f.on_pdu(Pdu::with_data(Op::NopOut(nop_out(Itt(9), Sn(10))), ping.clone()), now);
        let a = drain(&mut f);
        assert_eq!(sent(&a[0]).data, &ping[..expect]);
    }
}

/// A pool of its own for a test: the budget is per pool.
fn small_pool() -> &'static Pool {
    Box::leak(Box::new(Pool::new(riser_buf::MIN_MAX_BYTES)))
}

/// The SCSI layer finishing task `itt` with GOOD and no data.
fn done(f: &mut Ffp, itt: u32) {
    f.on_scsi(TaskEvent::Done(ScsiResult { tag: itt.into(), status: Status::Good, sense: None, data_in: None, data_len: 0, data_offset: 0, residual: Residual::None }));
}

#[test]
fn writes_wait_for_buffer_memory_in_order() {
    let cfg = FfpConfig { queue_depth: 8, largest_write: 32 << 20, ..Default::default() };
    let (mut f, now) = ffp(cfg.clone());
    let (mut g, _) = ffp(cfg);
    let pool = small_pool();
    f.set_pool(pool);
    g.set_pool(pool);
    // InitialR2T=Yes, no immediate data: nothing is taken until the data is solicited.
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, false, true, 32 << 20))), now);
    let Some(Action::GetData(g1)) = drain(&mut f).into_iter().next() else { panic!("expected GetData") };
    assert_eq!(pool.stats().in_use_bytes, 32 << 20);
    // The budget is spent: the next writes wait, no Get_Data, no failure. This connection
    // already holds more than its share, so its own wait without a place in the queue;
    // another connection's write takes one.
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(2, 11, false, true, 4096))), now);
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(3, 12, false, true, 8192))), now);
    g.on_pdu(Pdu::new(Op::ScsiCommand(cmd(7, 10, false, true, 16 << 20))), now);
    assert!(drain(&mut f).is_empty() && drain(&mut g).is_empty());
    assert_eq!((f.waiting_for_buffers(), g.waiting_for_buffers(), pool.stats().waiting), (2, 1, 1));
    assert_eq!(f.grant_buffers(), 0);
    // The first write completes and gives its buffer back: the other connection's write,
    // first in the queue, goes first, then this one's, oldest first.
    f.on_data_ready(g1.itt, g1.buf);
    let Some(Action::Execute(req)) = drain(&mut f).into_iter().next() else { panic!("expected Execute") };
    drop(req);
    done(&mut f, 1);
    drain(&mut f);
    assert_eq!(f.grant_buffers(), 0, "behind the other connection's write");
    assert_eq!(g.grant_buffers(), 1);
    assert!(matches!(&drain(&mut g)[..], [Action::GetData(a)] if a.itt == Itt(7)));
    assert_eq!(f.grant_buffers(), 2);
    let a = drain(&mut f);
    assert!(matches!(&a[..], [Action::GetData(a), Action::GetData(b)] if a.itt == Itt(2) && b.itt == Itt(3)));
    assert_eq!((f.waiting_for_buffers(), pool.stats().waiting), (0, 0));
}

#[test]
fn one_connection_takes_a_quarter_of_the_budget_while_holding_some() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 8, largest_write: 32 << 20, ..Default::default() });
    let pool = small_pool(); // 32 MiB: a quarter is 8 MiB
    f.set_pool(pool);
    for (i, sn) in (1..=3).zip(10..) {
        f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(i, sn, false, true, 4 << 20))), now);
    }
    let a = drain(&mut f);
    assert_eq!(a.len(), 2, "two 4 MiB writes make the quarter; the third waits");
    assert_eq!((f.waiting_for_buffers(), pool.stats().waiting, pool.stats().in_use_bytes), (1, 0, 8 << 20));
    for x in a {
        let Action::GetData(g) = x else { panic!("expected GetData") };
        f.on_data_ready(g.itt, g.buf);
    }
    drain(&mut f);
    done(&mut f, 1);
    drain(&mut f);
    assert_eq!(f.grant_buffers(), 1);
}

/// A connection on a pool of its own whose whole budget another connection holds: the
/// connection, the pool, the other's Get_Data (drop it to give the budget back), the time.
fn budget_held_elsewhere() -> (Ffp, &'static Pool, GetData, Instant) {
    let cfg = FfpConfig { queue_depth: 8, largest_write: 32 << 20, ..Default::default() };
    let (mut f, now) = ffp(cfg.clone());
    let (mut h, _) = ffp(cfg);
    let pool = small_pool();
    f.set_pool(pool);
    h.set_pool(pool);
    h.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, false, true, 32 << 20))), now);
    let Some(Action::GetData(g)) = drain(&mut h).into_iter().next() else { panic!("expected GetData") };
    (f, pool, g, now)
}

#[test]
fn an_aborted_waiting_write_leaves_the_queue() {
    let (mut f, pool, _held, now) = budget_held_elsewhere();
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(2, 10, false, true, 4096))), now);
    drain(&mut f);
    assert_eq!((f.waiting_for_buffers(), pool.stats().waiting), (1, 1));
    f.on_pdu(abort_task(9, 2, 12, 11), now);
    let a = drain(&mut f);
    assert!(matches!(a[0], Action::Abort { itt: Itt(2), .. }));
    assert_eq!(pool.stats().waiting, 0, "the aborted write gave its place up");
    assert_eq!(f.grant_buffers(), 0);
    assert_eq!(f.waiting_for_buffers(), 0);
}

#[test]
fn immediate_data_waits_in_its_segment_then_is_copied_once() {
    let (mut f, _pool, g1, now) = budget_held_elsewhere();
    // 512 bytes of immediate data, the rest solicited: waits with its data.
    let mut c = cmd(2, 10, false, true, 4096);
    c.final_bit = true;
    f.on_pdu(Pdu::with_data(Op::ScsiCommand(c), vec![0x5a; 512]), now);
    assert!(drain(&mut f).is_empty());
    assert_eq!(f.staged_bytes(), 0);
    drop(g1);
    assert_eq!(f.grant_buffers(), 1);
    let Some(Action::GetData(g2)) = drain(&mut f).into_iter().next() else { panic!("expected GetData") };
    assert_eq!((g2.offset, g2.len), (512, 4096 - 512));
    assert!(g2.buf[..512].iter().all(|&b| b == 0x5a));
    assert_eq!(f.staged_bytes(), 512);
    // A write that is all immediate data takes its buffer at once, outside the budget.
    let c = cmd(3, 11, false, true, 1024);
    f.on_pdu(Pdu::with_data(Op::ScsiCommand(c), vec![1; 1024]), now);
    let a = drain(&mut f);
    assert!(matches!(&a[..], [Action::Execute(r)] if r.data_out.buf().map(|b| b.len()) == Some(1024)));
}

#[test]
fn an_unsolicited_burst_ended_early_keeps_its_data() {
    // InitialR2T=No: 512 bytes immediate, an unsolicited Data-Out of 512 with F=1 (the burst
    // ends early), the rest solicited: the first 1024 bytes must reach the buffer Get_Data
    // fills, and nothing is taken before the data is there.
    let (mut f, now) = ffp(FfpConfig { initial_r2t: false, ..Default::default() });
    let pool = small_pool();
    f.set_pool(pool);
    let mut c = cmd(1, 10, false, true, 4096);
    c.final_bit = false;
    f.on_pdu(Pdu::with_data(Op::ScsiCommand(c), vec![0x11; 512]), now);
    assert!(drain(&mut f).is_empty());
    assert_eq!(pool.stats().in_use_bytes, 0, "no buffer before the data");
    f.on_pdu(Pdu::with_data(Op::DataOut(data_out(Itt(1), Ttt::RESERVED, Sn(0), 512)), vec![0x22; 512]), now);
    let Some(Action::GetData(g)) = drain(&mut f).into_iter().next() else { panic!("expected GetData") };
    assert_eq!((g.offset, g.len), (1024, 3072));
    assert!(g.buf[..512].iter().all(|&b| b == 0x11) && g.buf[512..1024].iter().all(|&b| b == 0x22));
    // All unsolicited, in two segments: one buffer, nothing budgeted.
    let mut c = cmd(2, 11, false, true, 1024);
    c.final_bit = false;
    f.on_pdu(Pdu::with_data(Op::ScsiCommand(c), vec![0x33; 512]), now);
    f.on_pdu(Pdu::with_data(Op::DataOut(data_out(Itt(2), Ttt::RESERVED, Sn(0), 512)), vec![0x44; 512]), now);
    let a = drain(&mut f);
    let [Action::Execute(r)] = &a[..] else { panic!("expected Execute") };
    let b = r.data_out.buf().expect("the write buffer");
    assert!(b[..512].iter().all(|&x| x == 0x33) && b[512..].iter().all(|&x| x == 0x44));
}

#[test]
fn abort_of_a_task_already_answered_does_not_exist() {
    // RFC 7143 §11.5.1 c): the WRITE was answered before the ABORT TASK came (its CmdSN is
    // below ExpCmdSN): Task does not exist, as libiscsi's AbortTaskSimpleAsync expects.
    let (mut f, now) = ffp(FfpConfig::default());
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, true, false, 512))), now);
    drain(&mut f);
    done(&mut f, 1);
    drain(&mut f);
    f.on_pdu(abort_task(2, 1, 11, 10), now);
    let a = drain(&mut f);
    let Op::TaskMgmtResponse(r) = &sent(&a[0]).bhs.op else { panic!("expected a TMF response") };
    assert_eq!(r.response, tmf::response::TASK_DOES_NOT_EXIST);
    // b): a command not received yet (RefCmdSN in the window, before the TMF's CmdSN) is
    // considered received and aborted: Function complete.
    f.on_pdu(abort_task(3, 7, 12, 11), now);
    let a = drain(&mut f);
    let Op::TaskMgmtResponse(r) = &sent(&a[0]).bhs.op else { panic!("expected a TMF response") };
    assert_eq!(r.response, tmf::response::FUNCTION_COMPLETE);
}

/// A write of 64 KiB, 8 KiB of it immediate (FirstBurstLength 8 KiB, InitialR2T=Yes): the
/// SCSI Command as a datamover delivers it when it placed the immediate data in the task's
/// buffer (`placed`), or in the segment.
fn partly_immediate(itt: u32, cmd_sn: u32, fill: u8, pool: &'static Pool, f: &Ffp) -> (Pdu, Option<IoBuf>) {
    let mut c = cmd(itt, cmd_sn, false, true, 64 << 10);
    c.final_bit = true;
    let wb = f.write_buffers();
    let mut pdu = Pdu::with_data(Op::ScsiCommand(c), vec![fill; 8192]);
    // As decoded from the wire.
    pdu.bhs.data_segment_length = 8192;
    assert_eq!(wb.wants(&pdu.bhs), Some((64 << 10, 8192)), "a write partly immediate is placed");
    assert!(std::ptr::eq(wb.pool, pool));
    match wb.take_now(64 << 10) {
        Some(mut buf) => {
            buf[..8192].copy_from_slice(&pdu.data);
            pdu.data = Vec::new();
            (pdu, Some(buf))
        }
        None => (pdu, None),
    }
}

#[test]
fn placed_immediate_data_is_not_copied_again_and_its_buffer_is_fetched_into() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 8, first_burst_length: 8192, largest_write: 32 << 20, ..Default::default() });
    let pool = small_pool();
    f.set_pool(pool);
    // A write that is all immediate data is not placed (its segment is its buffer).
    let mut all = Pdu::with_data(Op::ScsiCommand(cmd(5, 10, false, true, 4096)), vec![0; 4096]);
    all.bhs.data_segment_length = 4096;
    assert_eq!(f.write_buffers().wants(&all.bhs), None);
    let (pdu, buf) = partly_immediate(1, 10, 0x5a, pool, &f);
    let buf = buf.expect("the budget has room");
    assert_eq!(f.account().held(), buf.capacity(), "charged to the connection");
    let addr = buf.as_ptr();
    f.on_command_placed(pdu, buf, now);
    let a = drain(&mut f);
    let [Action::GetData(g)] = &a[..] else { panic!("expected GetData at once") };
    assert_eq!((g.offset, g.len), (8192, 56 << 10));
    assert_eq!(g.buf.as_ptr(), addr, "the very buffer the immediate data was placed in");
    assert!(g.buf[..8192].iter().all(|&b| b == 0x5a));
    assert_eq!(f.staged_bytes(), 0, "not copied again");
    assert_eq!(f.waiting_for_buffers(), 0);
    assert_eq!(pool.stats().waits, 0);
}

#[test]
fn placed_commands_held_for_a_cmd_sn_gap_keep_their_buffers() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 8, first_burst_length: 8192, largest_write: 32 << 20, ..Default::default() });
    let pool = small_pool();
    f.set_pool(pool);
    let (pdu, buf) = partly_immediate(2, 11, 0x22, pool, &f);
    f.on_command_placed(pdu, buf.expect("room"), now);
    assert!(drain(&mut f).is_empty(), "CmdSN 11 waits for 10");
    let (pdu, buf) = partly_immediate(1, 10, 0x11, pool, &f);
    f.on_command_placed(pdu, buf.expect("room"), now);
    let a = drain(&mut f);
    let gets: Vec<(Itt, u8)> = a
        .iter()
        .map(|x| match x {
            Action::GetData(g) => (g.itt, g.buf[0]),
            _ => panic!("expected GetData"),
        })
        .collect();
    assert_eq!(gets, vec![(Itt(1), 0x11), (Itt(2), 0x22)]);
    assert_eq!(f.staged_bytes(), 0);
}

#[test]
fn immediate_data_waiting_for_the_budget_is_copied_a_second_time_and_counted_as_staged() {
    let (mut f, pool, held, now) = budget_held_elsewhere();
    // The datamover finds no room: the immediate data comes in its segment.
    let (pdu, buf) = partly_immediate(2, 10, 0x77, pool, &f);
    assert!(buf.is_none(), "the budget is spent");
    assert_eq!(pool.stats().waiting, 0, "the datamover's try took no place in the queue");
    f.on_pdu(pdu, now);
    assert!(drain(&mut f).is_empty());
    assert_eq!((f.waiting_for_buffers(), pool.stats().waiting), (1, 1), "the task queues");
    // A second such write while the first waits: it cannot pass it.
    drop(held);
    let (pdu, buf) = partly_immediate(3, 11, 0x88, pool, &f);
    assert!(buf.is_none(), "one waits before it");
    f.on_pdu(pdu, now);
    assert_eq!(f.grant_buffers(), 2);
    let a = drain(&mut f);
    let [Action::GetData(g2), Action::GetData(g3)] = &a[..] else { panic!("expected two GetData") };
    assert_eq!((g2.itt, g3.itt), (Itt(2), Itt(3)), "in order");
    assert!(g2.buf[..8192].iter().all(|&b| b == 0x77) && g3.buf[..8192].iter().all(|&b| b == 0x88));
    assert_eq!(f.staged_bytes(), 2 * 8192, "each waiting byte copied once more, and counted");
}

#[test]
fn query_task_and_query_task_set_answer_as_rfc_7144_says() {
    // A READ in flight (ITT 1, LUN 0): QUERY TASK of it and QUERY TASK SET of LUN 0 succeed
    // (7); of another tag, of LUN 1, or once it is done: Function complete (0).
    let (mut f, now) = ffp(FfpConfig::default());
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, true, false, 512))), now);
    drain(&mut f);
    let query = |f: &mut Ffp, itt: u32, function: u8, lun: u64, referenced: u32| {
        f.on_pdu(
            Pdu::new(Op::TaskMgmtRequest(TaskMgmtRequest {
                immediate: true,
                function: function | 0x80,
                lun: Lun(lun),
                itt: Itt(itt),
                referenced_task_tag: Itt(referenced),
                cmd_sn: Sn(11),
                exp_stat_sn: Sn(0),
                ref_cmd_sn: Sn(10),
                exp_data_sn: Sn(0),
            })),
            now,
        );
        let a = drain(f);
        let Op::TaskMgmtResponse(r) = &sent(&a[0]).bhs.op else { panic!("expected a TMF response") };
        r.response
    };
    assert_eq!(query(&mut f, 2, tmf::QUERY_TASK, 0, 1), tmf::response::FUNCTION_SUCCEEDED);
    assert_eq!(query(&mut f, 3, tmf::QUERY_TASK, 0, 9), tmf::response::FUNCTION_COMPLETE);
    assert_eq!(query(&mut f, 4, tmf::QUERY_TASK_SET, 0, 0xffff_ffff), tmf::response::FUNCTION_SUCCEEDED);
    assert_eq!(query(&mut f, 5, tmf::QUERY_TASK_SET, 1, 0xffff_ffff), tmf::response::FUNCTION_COMPLETE);
    assert_eq!(query(&mut f, 6, tmf::I_T_NEXUS_RESET, 0, 0xffff_ffff), tmf::response::FUNCTION_NOT_SUPPORTED);
    done(&mut f, 1);
    drain(&mut f);
    assert_eq!(query(&mut f, 7, tmf::QUERY_TASK, 0, 1), tmf::response::FUNCTION_COMPLETE);
    assert_eq!(query(&mut f, 8, tmf::QUERY_TASK_SET, 0, 0xffff_ffff), tmf::response::FUNCTION_COMPLETE);
}

/// A streamed read: each piece goes out when the next one comes (the latest is held so the
/// last Data-In always closes the stream), the last one with the response; a piece out of
/// order or for a task that is gone is dropped.
#[test]
fn a_streamed_read_goes_out_piece_by_piece() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 4, ..Default::default() });
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, true, false, 2500))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(_)]));
    f.on_scsi(TaskEvent::Data(DataPiece { tag: 1, offset: 0, buf: IoBuf::from(vec![1u8; 1024]), len: 1024 }));
    assert!(drain(&mut f).is_empty(), "the latest piece waits for the next");
    f.on_scsi(TaskEvent::Data(DataPiece { tag: 1, offset: 2048, buf: IoBuf::from(vec![9u8; 1024]), len: 1024 })); // out of order: dropped
    f.on_scsi(TaskEvent::Data(DataPiece { tag: 1, offset: 1024, buf: IoBuf::from(vec![2u8; 1024]), len: 1024 }));
    f.on_scsi(TaskEvent::Data(DataPiece { tag: 7, offset: 0, buf: IoBuf::from(vec![3u8; 1024]), len: 1024 })); // no such task
    let a = drain(&mut f);
    let [Action::PutData(p)] = a.as_slice() else { panic!("expected one PutData") };
    assert_eq!((p.offset, p.len, p.response.is_none()), (0, 1024, true));
    assert_eq!(p.sn.stat_sn, Sn(100), "no StatSN taken by a piece");
    // The last piece: 1024 bytes presented, 452 of them within EDTL.
    f.on_scsi(TaskEvent::Done(ScsiResult { tag: 1, status: Status::Good, sense: None, data_in: Some(IoBuf::from(vec![4u8; 1024])), data_len: 1024, data_offset: 2048, residual: Residual::Overflow(572) }));
    let a = drain(&mut f);
    let [Action::PutData(held), Action::PutData(p)] = a.as_slice() else { panic!("expected two PutData") };
    assert_eq!((held.offset, held.len, held.response.is_none()), (1024, 1024, true));
    assert_eq!((p.offset, p.len), (2048, 452));
    let Op::ScsiResponse(r) = &p.response.as_ref().expect("the response with the last piece").bhs.op else { panic!() };
    assert_eq!((r.stat_sn, r.residual_overflow, r.residual_count), (Sn(100), true, 572));

    // A piece out, then the read fails: the held piece goes with the response.
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(2, 11, true, false, 4096))), now);
    drain(&mut f);
    f.on_scsi(TaskEvent::Data(DataPiece { tag: 2, offset: 0, buf: IoBuf::from(vec![1u8; 1024]), len: 1024 }));
    f.on_scsi(TaskEvent::Done(ScsiResult { tag: 2, status: Status::CheckCondition, sense: Some(SenseBuf::from_slice(&[0x70; 18])), data_in: None, data_len: 0, data_offset: 0, residual: Residual::None }));
    let a = drain(&mut f);
    let [Action::PutData(p)] = a.as_slice() else { panic!("expected one PutData") };
    assert_eq!((p.offset, p.len), (0, 1024));
    assert!(matches!(&p.response.as_ref().expect("a response").bhs.op, Op::ScsiResponse(r) if r.status == STATUS_CHECK_CONDITION));
}

/// A streamed write: executed once its unsolicited data is in; each piece the SCSI layer
/// asks for gets its own buffer, the immediate data it covers, and a Get_Data for the rest
/// at absolute offsets; the data goes to the SCSI layer as WriteData.
#[test]
fn a_large_write_is_fetched_piece_by_piece() {
    const MIB: u32 = 1 << 20;
    let pool: &'static Pool = Box::leak(Box::new(Pool::new(riser_buf::MIN_MAX_BYTES)));
    let (mut f, now) = ffp(FfpConfig { queue_depth: 4, ..Default::default() });
    f.set_pool(pool);
    f.set_write_stream_chunk(MIB);
    let edtl = 2 * MIB + 4096;
    let mut cdb = [0u8; 10];
    cdb[0] = 0x2a;
    cdb[7..9].copy_from_slice(&((edtl / 512) as u16).to_be_bytes());
    let mut c = scsi_command(Itt(1), Sn(10), false, true, edtl, &cdb);
    c.final_bit = true;
    f.on_pdu(Pdu::with_data(Op::ScsiCommand(c), vec![5u8; 8192]), now);
    let a = drain(&mut f);
    let [Action::Execute(req)] = a.as_slice() else { panic!("executed at once") };
    assert!(req.data_out.is_streamed());
    assert_eq!(pool.stats().in_use_bytes, 0, "no buffer before the SCSI layer asks");
    // The first piece: the immediate data copied in, the rest asked for.
    f.on_scsi(TaskEvent::Want(DataWant { tag: 1, lun: 0, offset: 0, len: MIB }));
    let a = drain(&mut f);
    let [Action::GetData(g)] = a.as_slice() else { panic!("expected GetData") };
    assert_eq!((g.offset, g.len, g.base, g.more, g.buf.len()), (8192, MIB - 8192, 0, true, MIB as usize));
    assert!(g.buf.as_slice()[..8192].iter().all(|&b| b == 5));
    let Some(Action::GetData(g)) = a.into_iter().next() else { unreachable!() };
    f.on_data_ready(Itt(1), g.buf);
    let a = drain(&mut f);
    let [Action::WriteData { itt: Itt(1), offset: 0, buf, .. }] = a.as_slice() else { panic!("expected WriteData") };
    assert_eq!(buf.len(), MIB as usize);
    // The last piece (4 KiB), with nothing unsolicited in it.
    f.on_scsi(TaskEvent::Want(DataWant { tag: 1, lun: 0, offset: 2 * MIB, len: 4096 }));
    let a = drain(&mut f);
    let [Action::GetData(g)] = a.as_slice() else { panic!("expected GetData") };
    assert_eq!((g.offset, g.len, g.base, g.more), (2 * MIB, 4096, 2 * MIB, false));
    // The Get_Data fails: CHECK CONDITION, and the SCSI layer's task is aborted.
    f.on_data_failed(Itt(1), "test");
    let a = drain(&mut f);
    assert!(matches!(a.as_slice(), [Action::Abort { itt: Itt(1), .. }, Action::Send(_)]));
    // A want this layer cannot serve (beyond EDTL) fails the command the same way.
    f.on_pdu(Pdu::with_data(Op::ScsiCommand(scsi_command(Itt(2), Sn(11), false, true, edtl, &cdb)), vec![5u8; 8192]), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(_)]));
    f.on_scsi(TaskEvent::Want(DataWant { tag: 2, lun: 0, offset: 2 * MIB, len: 8192 }));
    let a = drain(&mut f);
    assert!(matches!(a.as_slice(), [Action::Abort { itt: Itt(2), .. }, Action::Send(_)]), "{}", a.len());
}

/// A streamed write whose immediate data the datamover placed in its first piece's buffer:
/// that buffer serves the first want, the immediate data copied no second time.
#[test]
fn a_streamed_write_uses_its_placed_first_piece() {
    const MIB: u32 = 1 << 20;
    let pool: &'static Pool = Box::leak(Box::new(Pool::new(riser_buf::MIN_MAX_BYTES)));
    let (mut f, now) = ffp(FfpConfig { queue_depth: 4, ..Default::default() });
    f.set_pool(pool);
    f.set_write_stream_chunk(MIB);
    let edtl = 4 * MIB;
    let mut cdb = [0u8; 10];
    cdb[0] = 0x2a;
    cdb[7..9].copy_from_slice(&((edtl / 512) as u16).to_be_bytes());
    let c = scsi_command(Itt(3), Sn(10), false, true, edtl, &cdb);
    let pdu = Pdu::new(Op::ScsiCommand(c));
    let mut bhs = pdu.bhs.clone();
    bhs.data_segment_length = 8192;
    let wb = f.write_buffers();
    assert_eq!(wb.wants(&bhs), Some((MIB, 8192)), "the first piece's buffer, not EDTL's");
    let mut first = wb.take_now(MIB).expect("room in the budget");
    first.as_mut_slice()[..8192].fill(9);
    let mut pdu = pdu;
    pdu.bhs.data_segment_length = 8192;
    f.on_command_placed(pdu, first, now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(r)] if r.data_out.is_streamed()));
    f.on_scsi(TaskEvent::Want(DataWant { tag: 3, lun: 0, offset: 0, len: MIB }));
    let a = drain(&mut f);
    let [Action::GetData(g)] = a.as_slice() else { panic!("expected GetData") };
    assert_eq!((g.offset, g.len, g.base), (8192, MIB - 8192, 0));
    assert!(g.buf.as_slice()[..8192].iter().all(|&b| b == 9), "the placed immediate data");
    assert_eq!(f.staged_bytes(), 0, "no second copy");
}

// Hostile initiators (issue #22 items 6 and 8): the task cap and reused tags.

/// A command with the I bit (immediate delivery: no CmdSN used, outside the window).
fn immediate(itt: u32, cmd_sn: u32, read: bool, write: bool, edtl: u32) -> ScsiCommand {
    ScsiCommand { immediate: true, ..cmd(itt, cmd_sn, read, write, edtl) }
}

fn reject_reason(a: &Action) -> u8 {
    match &sent(a).bhs.op {
        Op::Reject(r) => r.reason,
        other => panic!("expected a Reject, got {other:?}"),
    }
}

#[test]
fn immediate_commands_beyond_the_queue_depth_are_rejected_and_in_window_ones_get_task_set_full() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 4, ..Default::default() });
    for itt in 1..=4 {
        f.on_pdu(Pdu::new(Op::ScsiCommand(immediate(itt, 10, true, false, 512))), now);
    }
    assert_eq!(drain(&mut f).iter().filter(|a| matches!(a, Action::Execute(_))).count(), 4);
    // The fifth immediate command: Reject, too many immediate commands (RFC 7143 §11.17.1).
    f.on_pdu(Pdu::new(Op::ScsiCommand(immediate(5, 10, true, false, 512))), now);
    let a = drain(&mut f);
    assert_eq!(a.len(), 1);
    assert_eq!(reject_reason(&a[0]), RejectReason::ImmediateCommandReject.code());
    assert_eq!((f.active_tasks(), f.sn().exp_cmd_sn, f.sn().max_cmd_sn), (4, Sn(10), Sn(13)), "no CmdSN used");
    // A command within the window finds the task set full: TASK SET FULL, its CmdSN used and
    // its window slot given back.
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(6, 10, true, false, 512))), now);
    let a = drain(&mut f);
    let [Action::Send(p)] = &a[..] else { panic!("expected one response") };
    let Op::ScsiResponse(r) = &p.bhs.op else { panic!("expected a SCSI Response") };
    assert_eq!((r.itt, r.status, r.residual_underflow, r.residual_count), (Itt(6), STATUS_TASK_SET_FULL, true, 512));
    assert_eq!((r.exp_cmd_sn, r.max_cmd_sn), (Sn(11), Sn(14)));
    assert_eq!(f.active_tasks(), 4);
    // One task ends: there is room for one more, immediate or not.
    done(&mut f, 1);
    drain(&mut f);
    f.on_pdu(Pdu::new(Op::ScsiCommand(immediate(7, 11, true, false, 512))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(r)] if r.itt == Itt(7)));
    assert!(!f.is_closing());
}

#[test]
fn immediate_writes_with_their_data_staged_are_capped_at_the_queue_depth() {
    // The budget is spent elsewhere: immediate data waits in its segment, outside the budget.
    let (mut f, _pool, _held, now) = budget_held_elsewhere();
    let qd = f.config().queue_depth as usize;
    let first_burst = f.config().first_burst_length as usize;
    let mut rejected = 0;
    for itt in 2..2 + 10 * qd as u32 {
        let mut c = immediate(itt, 10, false, true, 4 * first_burst as u32);
        c.final_bit = true;
        f.on_pdu(Pdu::with_data(Op::ScsiCommand(c), vec![0x5a; first_burst]), now);
        for a in drain(&mut f) {
            assert_eq!(reject_reason(&a), RejectReason::ImmediateCommandReject.code());
            rejected += 1;
        }
    }
    assert_eq!((f.active_tasks(), f.waiting_for_buffers(), rejected), (qd, qd, 9 * qd));
    assert_eq!(f.staged_held_bytes(), qd * first_burst, "at most queue depth times FirstBurstLength");
}

/// The SCSI layer finishing READ `itt` with `len` bytes of `fill`.
fn read_done(f: &mut Ffp, itt: u32, fill: u8, len: u32) {
    let data = IoBuf::from(vec![fill; len as usize]);
    f.on_scsi(TaskEvent::Done(ScsiResult { tag: itt.into(), status: Status::Good, sense: None, data_in: Some(data), data_len: len as usize, data_offset: 0, residual: Residual::None }));
}

#[test]
fn a_tag_reused_before_its_abort_is_carried_out_is_rejected_and_never_gets_the_old_completion() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 8, ..Default::default() });
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, true, false, 512))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(_)]));
    // ABORT TASK and a new READ with the same tag in one read: both before the driver
    // carries anything out.
    f.on_pdu(abort_task(2, 1, 11, 10), now);
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 11, true, false, 512))), now);
    // The old READ's data comes back from the SCSI layer meanwhile.
    read_done(&mut f, 1, 0xaa, 512);
    let a = drain(&mut f);
    assert!(matches!(a[0], Action::Abort { itt: Itt(1), .. }));
    let Op::TaskMgmtResponse(r) = &sent(&a[1]).bhs.op else { panic!("expected the TMF response") };
    assert_eq!(r.response, tmf::response::FUNCTION_COMPLETE);
    assert_eq!(reject_reason(&a[2]), RejectReason::InvalidPduField.code(), "the tag is still in use");
    assert_eq!(a.len(), 3, "no Execute, no Data-In of the old READ");
    assert_eq!(f.sn().exp_cmd_sn, Sn(12), "the rejected command's CmdSN is used");
    // Once the abort is carried out (the driver took it), the tag is free again.
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 12, true, false, 512))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(r)] if r.itt == Itt(1)));
    read_done(&mut f, 1, 0xbb, 512);
    let a = drain(&mut f);
    let [Action::PutData(p)] = &a[..] else { panic!("expected the new READ's data") };
    assert!(p.buf.as_slice().iter().all(|&b| b == 0xbb));
}

#[test]
fn a_write_tag_reused_before_its_abort_is_carried_out_never_takes_the_old_data() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 8, ..Default::default() });
    f.set_pool(small_pool());
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, false, true, 4096))), now);
    let Some(Action::GetData(old)) = drain(&mut f).into_iter().next() else { panic!("expected GetData") };
    // ABORT TASK, a new WRITE with the same tag, then the old WRITE's last Data-Out (the
    // datamover completes the old Get_Data): all in one read.
    f.on_pdu(abort_task(2, 1, 11, 10), now);
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 11, false, true, 4096))), now);
    let mut old_buf = old.buf;
    old_buf.as_mut_slice().fill(0xaa);
    f.on_data_ready(Itt(1), old_buf);
    let a = drain(&mut f);
    assert!(a.iter().all(|a| !matches!(a, Action::Execute(_) | Action::GetData(_))), "nothing runs with the old data");
    assert_eq!(reject_reason(&a[2]), RejectReason::InvalidPduField.code());
    assert_eq!(f.active_tasks(), 0);
}

#[test]
fn an_aborted_task_keeps_its_place_under_the_cap_until_the_scsi_layer_gives_it_back() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 2, ..Default::default() });
    f.set_aborted_results(true);
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(1, 10, true, false, 512))), now);
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(2, 11, true, false, 512))), now);
    assert_eq!(drain(&mut f).len(), 2);
    f.on_pdu(abort_task(9, 1, 12, 10), now);
    drain(&mut f);
    // The abort went to the SCSI layer, which has not given the task back: the set is full.
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(3, 12, true, false, 512))), now);
    let a = drain(&mut f);
    let [Action::Send(p)] = &a[..] else { panic!("expected one response") };
    assert!(matches!(&p.bhs.op, Op::ScsiResponse(r) if r.itt == Itt(3) && r.status == STATUS_TASK_SET_FULL));
    // Its aborted result comes back (the driver drops it): room again.
    f.on_scsi(TaskEvent::Aborted { tag: 1 });
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(4, 13, true, false, 512))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(r)] if r.itt == Itt(4)));
    // A task that finished before its abort reached the SCSI layer is given back by its
    // (dropped) completion.
    f.on_pdu(abort_task(10, 2, 14, 11), now);
    drain(&mut f);
    done(&mut f, 2);
    assert!(drain(&mut f).is_empty(), "the aborted task's completion is dropped");
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(5, 14, true, false, 512))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(r)] if r.itt == Itt(5)));
    // A task aborted before it reached the SCSI layer is not waited for.
    f.set_pool(small_pool());
    done(&mut f, 4);
    drain(&mut f);
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(6, 15, false, true, 4096))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::GetData(_)]));
    f.on_pdu(abort_task(11, 6, 16, 15), now);
    drain(&mut f);
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(7, 16, true, false, 512))), now);
    assert!(matches!(drain(&mut f).as_slice(), [Action::Execute(r)] if r.itt == Itt(7)));
}

/// The iSCSI layer builds the SCSI task itself: tag = ITT, the LUN number from the LUN
/// field, the task attribute from ATTR, the write data as a `DataOut`.
#[test]
fn a_request_becomes_the_scsi_task() {
    let (mut f, now) = ffp(FfpConfig::default());
    let mut c = cmd(5, 10, true, false, 512);
    c.lun = Lun(0x0001_0000_0000_0000);
    c.attr = 2;
    f.on_pdu(Pdu::new(Op::ScsiCommand(c)), now);
    let Some(Action::Execute(req)) = drain(&mut f).into_iter().next() else { panic!("expected Execute") };
    let nexus = Arc::new(riser_scsi::Nexus::new("iqn.2024-01.test:i", 1, "iqn.2024-01.test:t", 1));
    let t = req.into_task(&nexus);
    assert_eq!((t.tag, t.lun, t.edtl, t.read, t.write), (5, 1, 512, true, false));
    assert_eq!((t.cdb.opcode(), t.attr), (0x28, riser_scsi::TaskAttr::Ordered));
    assert!(matches!(t.data_out, DataOut::None));
    assert!(Arc::ptr_eq(t.nexus, &nexus));
}

/// A datamover that records what it is handed (for `on_scsi_now`).
#[derive(Default)]
struct Recorder {
    put: Vec<Itt>,
    sent: usize,
}

impl crate::ffp::Datamover for Recorder {
    fn send_control(&mut self, _: Pdu) {
        self.sent += 1;
    }
    fn put_data(&mut self, req: PutData) {
        self.put.push(req.itt);
    }
    fn get_data(&mut self, _: GetData) {}
    fn notice_key_values(&mut self, _: crate::ffp::DatamoverParams) {}
    fn deallocate_task_resources(&mut self, _: Itt) -> Option<IoBuf> {
        None
    }
    fn connection_terminate(&mut self) {}
    fn poll(&mut self, _: &mut Vec<crate::ffp::DmEvent>) -> usize {
        0
    }
    fn idle(&self) -> bool {
        true
    }
}

fn done_event(itt: u32, data: Option<Vec<u8>>) -> TaskEvent {
    let data_len = data.as_ref().map_or(0, |d| d.len());
    TaskEvent::Done(ScsiResult { tag: itt as u64, status: Status::Good, sense: None, data_in: data.map(IoBuf::from), data_len, data_offset: 0, residual: Residual::None })
}

/// Read data and responses go straight to the datamover only while no action waits in the
/// queue: once one does, they queue behind it, in order.
#[test]
fn on_scsi_now_goes_past_the_queue_only_while_it_is_empty() {
    let (mut f, now) = ffp(FfpConfig { queue_depth: 8, ..Default::default() });
    for (itt, cmd_sn) in [(1, 10), (2, 11), (3, 12)] {
        f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(itt, cmd_sn, true, false, 512))), now);
    }
    assert_eq!(drain(&mut f).len(), 3, "three Executes");
    let mut dm = Recorder::default();
    f.on_scsi_now(done_event(1, Some(vec![7u8; 512])), &mut dm);
    f.on_scsi_now(done_event(2, None), &mut dm);
    assert_eq!((dm.put.as_slice(), dm.sent), (&[Itt(1)][..], 1), "the data and the response went at once");
    assert!(drain(&mut f).is_empty(), "nothing queued");
    // A NOP-In echo waits in the queue: the next read's data queues behind it.
    f.on_pdu(Pdu::with_data(Op::NopOut(nop_out(Itt(9), Sn(13))), b"ping".to_vec()), now);
    f.on_scsi_now(done_event(3, Some(vec![8u8; 512])), &mut dm);
    assert_eq!((dm.put.len(), dm.sent), (1, 1), "nothing more went past the queue");
    let a = drain(&mut f);
    assert!(matches!(a.as_slice(), [Action::Send(_), Action::PutData(p)] if p.itt == Itt(3)), "in order behind the echo");
}

#[test]
fn tags_sharing_a_task_slot_are_kept_apart() {
    // Queue depth 4: four task slots; ITTs 1, 5 and 9 all map to slot 1 (5 and 9 go to the
    // overflow map), and each is found, refused again while in use, aborted and completed
    // as its own task.
    let (mut f, now) = ffp(FfpConfig { queue_depth: 4, ..Default::default() });
    for (itt, sn) in [(1, 10), (5, 11), (9, 12)] {
        f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(itt, sn, true, false, 512))), now);
    }
    let itts: Vec<Itt> = drain(&mut f).iter().map(|a| if let Action::Execute(r) = a { r.itt } else { panic!("expected Execute") }).collect();
    assert_eq!((itts, f.active_tasks()), (vec![Itt(1), Itt(5), Itt(9)], 3));
    f.on_pdu(Pdu::new(Op::ScsiCommand(cmd(9, 13, true, false, 512))), now);
    assert!(matches!(&drain(&mut f)[..], [Action::Send(p)] if matches!(p.bhs.op, Op::Reject(_))), "ITT 9 is in use");
    f.on_pdu(abort_task(50, 5, f.sn().exp_cmd_sn.get(), 11), now);
    assert!(matches!(&drain(&mut f)[..], [Action::Abort { itt: Itt(5), .. }, Action::Send(_)]));
    let done = |tag| {
        TaskEvent::Done(ScsiResult {
            tag,
            status: Status::Good,
            sense: None,
            data_in: Some(IoBuf::from(vec![7u8; 512])),
            data_len: 512,
            data_offset: 0,
            residual: Residual::None,
        })
    };
    for tag in [9, 5, 1] {
        f.on_scsi(done(tag));
    }
    let answered: Vec<Itt> = drain(&mut f).iter().map(|a| if let Action::PutData(p) = a { p.itt } else { panic!("expected PutData") }).collect();
    assert_eq!((answered, f.active_tasks()), (vec![Itt(9), Itt(1)], 0), "the aborted task's result is dropped");
}
