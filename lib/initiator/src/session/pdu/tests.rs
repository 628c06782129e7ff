//! The PDUs [`PduSession`] builds and takes (against the fake target over TCP: riser-perf's
//! `fake_target` tests).

use riser_iscsi::pdu::{
    Isid, LoginResponse, LoginStatus, NopIn, Reject, ScsiResponse, Stage,
};
use riser_iscsi::text::{encode_pairs, parse_pairs};

use super::*;
use crate::scsi::rw_cdb;
use crate::session::{Proposal, SessionType, INITIATOR_NAME};

fn login_response(transit: bool, nsg: Stage, keys: &[(&str, &str)]) -> Pdu {
    let r = LoginResponse {
        transit_bit: transit,
        continue_bit: false,
        csg: Stage::LoginOperationalNegotiation,
        nsg,
        version_max: 0,
        version_active: 0,
        isid: Isid([0x80, 0, 0, 0, 0, 3]),
        tsih: 12,
        itt: Itt(MGMT_ITT),
        stat_sn: Sn(40),
        exp_cmd_sn: Sn(7),
        max_cmd_sn: Sn(20),
        status: LoginStatus::SUCCESS,
    };
    Pdu::with_data(Op::LoginResponse(r), encode_pairs(keys))
}

use crate::session::MGMT_ITT;

/// The PDUs a PduSession builds, and what it makes of PDUs handed to it, without a target:
/// the keys and identifiers of the login, immediate data, a target's ping, a Reject,
/// a response to an unknown task.
#[test]
fn pdus_built_and_taken() {
    let mut s = PduSession::new("mem", Lun(crate::url::lun_field(3)));
    let proposal = Proposal {
        immediate_data: true,
        initial_r2t: true,
        first_burst: 16384,
        max_burst: 65536,
        max_recv_dsl: 4096,
        extra: vec![
            ("MaxOutstandingR2T".into(), "4".into()),
            ("X-test.Key".into(), "1".into()),
        ],
        ..Proposal::tcp(false, false)
    };
    let params = LoginParams {
        tsih: 12,
        cid: 2,
        ..LoginParams::normal(INITIATOR_NAME, "iqn.x:y", [0x80, 0, 0, 0, 0, 3])
    };
    let req = s
        .login(&params, KeyNegotiation::with_proposal(proposal))
        .unwrap();
    let Op::LoginRequest(r) = req.op() else {
        panic!()
    };
    assert_eq!(
        (r.isid, r.tsih, r.cid, r.csg, r.nsg),
        (
            Isid([0x80, 0, 0, 0, 0, 3]),
            12,
            2,
            Stage::SecurityNegotiation,
            Stage::LoginOperationalNegotiation
        )
    );
    let keys = parse_pairs(&req.data).unwrap();
    let get = |keys: &[(String, String)], k: &str| {
        keys.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone())
    };
    assert_eq!(get(&keys, "TargetName").as_deref(), Some("iqn.x:y"));
    assert_eq!(get(&keys, "SessionType").as_deref(), Some("Normal"));
    // The security stage ends: the operational keys go out.
    let mut resp = login_response(
        true,
        Stage::LoginOperationalNegotiation,
        &[("AuthMethod", "None")],
    );
    if let Op::LoginResponse(r) = &mut resp.bhs.op {
        r.csg = Stage::SecurityNegotiation;
    }
    let LoginProgress::Send(req) = s.login_response(&resp).unwrap() else {
        panic!()
    };
    let Op::LoginRequest(r) = req.op() else {
        panic!()
    };
    assert_eq!(
        (r.tsih, r.exp_stat_sn, r.nsg),
        (12, Sn(41), Stage::FullFeaturePhase)
    );
    let keys = parse_pairs(&req.data).unwrap();
    for (k, v) in [
        ("ImmediateData", "Yes"),
        ("InitialR2T", "Yes"),
        ("FirstBurstLength", "16384"),
        ("MaxBurstLength", "65536"),
        ("MaxRecvDataSegmentLength", "4096"),
        ("MaxOutstandingR2T", "4"),
        ("X-test.Key", "1"),
    ] {
        assert_eq!(get(&keys, k).as_deref(), Some(v), "{k}");
    }
    let resp = login_response(
        true,
        Stage::FullFeaturePhase,
        &[
            ("ImmediateData", "Yes"),
            ("InitialR2T", "Yes"),
            ("FirstBurstLength", "16384"),
            ("MaxRecvDataSegmentLength", "8192"),
        ],
    );
    let LoginProgress::Done(n) = s.login_response(&resp).unwrap() else {
        panic!()
    };
    assert_eq!((n.max_send_dsl, n.first_burst), (8192, 16384));
    assert_eq!((s.state().cmd_sn, s.state().max_cmd_sn), (Sn(7), Sn(20)));

    // A 4 KiB WRITE goes out whole as immediate data, in the command PDU.
    let data = vec![7u8; 4096];
    let (w1, pdus) = s.write(&rw_cdb(Dir::Write, 8, 8), &data).unwrap();
    assert_eq!(pdus.len(), 1);
    let Op::ScsiCommand(c) = pdus[0].op() else {
        panic!()
    };
    assert!(c.final_bit && c.write && !c.read && !c.immediate);
    assert_eq!(
        (c.cmd_sn, c.exp_stat_sn, c.lun),
        (Sn(7), Sn(41), Lun(crate::url::lun_field(3)))
    );
    assert_eq!(pdus[0].data, data);
    // A long CDB continues in an AHS; CmdSN moves on.
    let (_, p) = s.read(&[0x7f; 32], 512).unwrap();
    let Op::ScsiCommand(c) = p.op() else { panic!() };
    assert_eq!((c.cmd_sn, c.read, c.cdb), (Sn(8), true, [0x7f; 16]));
    assert!(!p.ahs.is_empty());
    assert_eq!(s.outstanding(), 2);

    // Data-Out for a whole write answering an R2T, split at 8 KiB... of 4 KiB: one PDU.
    let d = s.data_out(w1, Ttt(5), 0, 4096).unwrap();
    assert_eq!(d.len(), 1);
    assert!(
        matches!(d[0].op(), Op::DataOut(o) if o.final_bit && o.ttt == Ttt(5) && o.exp_stat_sn == Sn(41))
    );
    assert!(s.data_out(w1, Ttt(5), 4000, 200).is_err());

    // A ping from the target: the reply echoes its TTT and data; ExpStatSN unchanged.
    let ping = NopIn {
        lun: Lun(0),
        itt: Itt::RESERVED,
        ttt: Ttt(77),
        stat_sn: Sn(41),
        exp_cmd_sn: Sn(9),
        max_cmd_sn: Sn(30),
    };
    let Event::Ping { reply } = s
        .receive(&Pdu::with_data(Op::NopIn(ping), b"x".to_vec()))
        .unwrap()
    else {
        panic!()
    };
    assert!(
        matches!(reply.op(), Op::NopOut(n) if n.ttt == Ttt(77) && n.itt == Itt::RESERVED && n.immediate)
    );
    assert_eq!(reply.data, b"x");
    assert_eq!(
        (s.state().exp_stat_sn, s.state().max_cmd_sn),
        (Sn(41), Sn(30))
    );

    // The SCSI Response of the write: GOOD; ExpStatSN moves on.
    let resp = ScsiResponse {
        bidi_read_residual_overflow: false,
        bidi_read_residual_underflow: false,
        residual_overflow: false,
        residual_underflow: false,
        response: 0,
        status: 0,
        itt: w1,
        snack_tag: 0,
        stat_sn: Sn(41),
        exp_cmd_sn: Sn(9),
        max_cmd_sn: Sn(30),
        exp_data_sn: Sn(0),
        bidi_read_residual_count: 0,
        residual_count: 0,
    };
    let Event::Complete(c) = s
        .receive(&Pdu::new(Op::ScsiResponse(resp.clone())))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((c.itt, c.status, s.state().exp_stat_sn), (w1, 0, Sn(42)));
    // Its second response is an answer to an unknown task.
    assert!(s
        .receive(&Pdu::new(Op::ScsiResponse(resp)))
        .unwrap_err()
        .contains("unknown task"));

    // A Reject quotes the rejected header.
    let (_, bad) = s.nop_out(b"");
    let rej = Reject {
        reason: 9,
        stat_sn: Sn(42),
        exp_cmd_sn: Sn(9),
        max_cmd_sn: Sn(30),
        data_sn_or_r2t_sn: Sn(0),
    };
    let quoted = bad.header_bytes().unwrap().to_vec();
    match s.receive(&Pdu::with_data(Op::Reject(rej), quoted)).unwrap() {
        Event::Reject {
            reason: 9,
            rejected: Some(h),
        } => assert_eq!(h.op, bad.bhs.op),
        e => panic!("{e:?}"),
    }

    // A discovery session sends no TargetName and only the keys that apply to it.
    let mut d = PduSession::new("disc", Lun(0));
    let params = LoginParams {
        target_name: None,
        session_type: SessionType::Discovery,
        ..LoginParams::normal(INITIATOR_NAME, "", [0x80, 0, 0, 0, 0, 4])
    };
    let req = d.login(&params, KeyNegotiation::new(false, false)).unwrap();
    let keys = parse_pairs(&req.data).unwrap();
    assert_eq!(get(&keys, "TargetName"), None);
    assert_eq!(get(&keys, "SessionType").as_deref(), Some("Discovery"));
    let mut resp = login_response(true, Stage::LoginOperationalNegotiation, &[]);
    if let Op::LoginResponse(r) = &mut resp.bhs.op {
        r.csg = Stage::SecurityNegotiation;
    }
    let LoginProgress::Send(req) = d.login_response(&resp).unwrap() else {
        panic!()
    };
    let keys: Vec<String> = parse_pairs(&req.data)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        keys,
        ["HeaderDigest", "DataDigest", "MaxRecvDataSegmentLength"]
    );
}
