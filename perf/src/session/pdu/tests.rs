//! [`PduSession`] against the fake target, and the PDUs it builds and takes.

use std::io::{Read, Write};
use std::net::TcpStream;

use riser_iscsi::framer::{Framer, FramerLimits};
use riser_iscsi::pdu::{
    logout, Digests, Isid, LoginResponse, LoginStatus, NopIn, Reject, ScsiResponse, Stage,
};
use riser_iscsi::text::{encode_pairs, parse_pairs};

use super::*;
use crate::fake_target as ft;
use crate::scsi::{rw_cdb, status};
use crate::session::{Proposal, SessionType, INITIATOR_NAME};
use crate::verify;

/// The test's transport: PDUs over a socket to the fake target.
struct Wire {
    sock: TcpStream,
    framer: Framer,
}

impl Wire {
    fn send(&mut self, p: &Pdu) {
        self.sock
            .write_all(&p.to_bytes(Digests::default()).unwrap())
            .unwrap();
    }

    fn recv(&mut self) -> Pdu {
        let mut buf = [0u8; 65536];
        loop {
            if let Some(p) = self.framer.next_pdu().unwrap() {
                return p;
            }
            let n = self.sock.read(&mut buf).unwrap();
            assert!(n > 0, "the fake target closed the connection");
            self.framer.feed(&buf[..n]);
        }
    }

    /// Sends `pdus`, then takes what comes back (answering R2Ts) until `itt` completes.
    fn run(&mut self, s: &mut PduSession, itt: Itt, pdus: Vec<Pdu>) -> (Completed, usize) {
        let (mut data_ins, mut r2ts) = (0, 0);
        for p in &pdus {
            self.send(p);
        }
        loop {
            match s.receive(&self.recv()).unwrap() {
                Event::DataIn { itt: i, .. } if i == itt => data_ins += 1,
                Event::R2t { itt: i, reply, .. } if i == itt => {
                    r2ts += 1;
                    for p in &reply {
                        self.send(p);
                    }
                }
                Event::Complete(c) if c.itt == itt => return (c, data_ins + r2ts),
                e => panic!("unexpected {e:?}"),
            }
        }
    }

    /// Sends one request and returns the event of its answer.
    fn ask(&mut self, s: &mut PduSession, p: &Pdu) -> Event {
        self.send(p);
        s.receive(&self.recv()).unwrap()
    }
}

/// The PDU-level session against the strict fake target (ImmediateData=No,
/// InitialR2T=No, a 1 KiB MaxRecvDataSegmentLength, a 2-command window): login, a unit
/// attention, READ CAPACITY, a WRITE with unsolicited Data-Out then R2Ts, a READ in
/// 700-byte Data-Ins, a ping, ABORT TASK and LUN RESET of writes waiting for data, logout.
#[test]
fn pdu_session_against_the_fake_target() {
    let (port, obs, h) = ft::start();
    let mut w = Wire {
        sock: TcpStream::connect(("127.0.0.1", port)).unwrap(),
        framer: Framer::with_limits(FramerLimits::LOGIN),
    };
    let mut s = PduSession::new("fake", Lun(0));
    let proposal = Proposal {
        max_recv_dsl: 8192,
        ..Proposal::tcp(false, false)
    };
    let params = LoginParams::normal(
        INITIATOR_NAME,
        "iqn.2024-01.test:fake",
        [0x80, 0, 0, 0, 0, 2],
    );
    let neg = s
        .login_via(&params, KeyNegotiation::with_proposal(proposal), |req| {
            w.send(&req);
            Ok(w.recv())
        })
        .unwrap();
    assert!(s.logged_in());
    assert_eq!(
        (neg.immediate_data, neg.initial_r2t, neg.max_send_dsl),
        (false, false, ft::TARGET_MRDSL as u32)
    );
    assert_eq!(
        (neg.first_burst, neg.max_burst),
        (ft::FIRST_BURST as u32, ft::MAX_BURST as u32)
    );
    w.framer.set_limits(FramerLimits {
        max_recv_data_segment_length: 8192,
        max_ahs_length: 1020,
    });

    // TEST UNIT READY: the unit attention of a new nexus, then GOOD.
    let (itt, tur) = s.read(&[0u8; 6], 0).unwrap();
    let (c, _) = w.run(&mut s, itt, vec![tur.clone()]);
    assert_eq!(c.status, status::CHECK_CONDITION);
    assert_eq!(c.sense.map(|x| x.key), Some(Sense::UNIT_ATTENTION));
    let (itt, tur) = s.read(&[0u8; 6], 0).unwrap();
    assert_eq!(w.run(&mut s, itt, vec![tur]).0.status, status::GOOD);

    // READ CAPACITY (16): its data in a Data-In with status.
    let mut rc = [0u8; 16];
    (rc[0], rc[1], rc[13]) = (0x9e, 0x10, 32);
    let (itt, p) = s.read(&rc, 32).unwrap();
    let (c, _) = w.run(&mut s, itt, vec![p]);
    assert_eq!(c.data.len(), 32);
    assert_eq!(
        u64::from_be_bytes(c.data[..8].try_into().unwrap()),
        ft::BLOCKS - 1
    );

    // WRITE 16 blocks: 2 KiB unsolicited in two Data-Outs, the rest by R2T.
    let mut data = vec![0u8; 16 * ft::BLOCK];
    verify::fill(&mut data, ft::BLOCK, 100, 9);
    let (itt, pdus) = s.write(&rw_cdb(Dir::Write, 100, 16), &data).unwrap();
    assert_eq!(pdus.len(), 3, "the command and two unsolicited Data-Outs");
    assert!(
        pdus[0].data.is_empty(),
        "no immediate data: ImmediateData=No"
    );
    let cmd = match pdus[0].op() {
        Op::ScsiCommand(c) => c.clone(),
        o => panic!("{o:?}"),
    };
    assert!(cmd.write && !cmd.final_bit);
    assert_eq!(cmd.expected_data_transfer_length, data.len() as u32);
    let (c, r2ts) = w.run(&mut s, itt, pdus);
    assert_eq!((c.status, c.data.len()), (status::GOOD, 0));
    assert_eq!(r2ts, (data.len() - ft::FIRST_BURST).div_ceil(ft::MAX_BURST));

    // READ them back: 700-byte Data-Ins.
    let (itt, p) = s
        .read(&rw_cdb(Dir::Read, 100, 16), data.len() as u32)
        .unwrap();
    let (c, data_ins) = w.run(&mut s, itt, vec![p]);
    assert_eq!(c.status, status::GOOD);
    assert!(c.data == data, "the data read back differs");
    assert!(data_ins >= data.len() / 700);

    // A ping.
    let (itt, ping) = s.nop_out(b"hello");
    assert_eq!(
        w.ask(&mut s, &ping),
        Event::NopIn {
            itt,
            data: b"hello".to_vec()
        }
    );

    // ABORT TASK of a write waiting for its (never sent) data, then LUN RESET of another.
    let none = Unsolicited::Exactly {
        immediate: 0,
        data_out: 0,
    };
    let cdb = rw_cdb(Dir::Write, 0, 4);
    let (w1, pdus) = s.scsi_command(&cdb, 0, &data[..2048], none).unwrap();
    assert_eq!(pdus.len(), 1);
    w.send(&pdus[0]);
    assert_eq!(s.outstanding(), 1);
    let (itt, abort) = s.abort_task(w1);
    let Op::TaskMgmtRequest(t) = abort.op() else {
        panic!()
    };
    assert_eq!(
        (t.function, t.referenced_task_tag, t.ref_cmd_sn),
        (tmf::ABORT_TASK, w1, cmd.cmd_sn.add(2))
    );
    let ended = vec![w1];
    assert_eq!(
        w.ask(&mut s, &abort),
        Event::TaskMgmt {
            itt,
            response: 0,
            ended
        }
    );
    assert_eq!(s.outstanding(), 0);
    let (w2, pdus) = s.scsi_command(&cdb, 0, &data[..2048], none).unwrap();
    w.send(&pdus[0]);
    let (itt, reset) = s.lun_reset();
    let ended = vec![w2];
    assert_eq!(
        w.ask(&mut s, &reset),
        Event::TaskMgmt {
            itt,
            response: 0,
            ended
        }
    );

    // Logout.
    let (itt, bye) = s.logout(logout::CLOSE_SESSION);
    assert!(matches!(w.ask(&mut s, &bye), Event::Logout { itt: i, response: 0, .. } if i == itt));
    h.join().unwrap();
    let o = obs.lock().unwrap();
    assert!(o.violations.is_empty(), "{:?}", o.violations);
    assert!(o.answered_offer && o.logged_out);
    assert_eq!((o.nops, o.tmfs, o.commands), (1, 2, 7));
}

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
