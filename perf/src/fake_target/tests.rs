//! riser-initiator's session logic against the fake target, over TCP (the initiator crate
//! has no sockets): [`PduSession`] with a socket and a framer, and the TCP transport's
//! ([`Conn`]) CHAP login.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use riser_initiator::scsi::{rw_cdb, status, Dir, Sense};
use riser_initiator::session::{
    Completed, Event, KeyNegotiation, LoginOptions, LoginParams, PduSession, Proposal, Unsolicited, INITIATOR_NAME,
};
use riser_iscsi::chap::{ChapCredentials, ChapInitiatorConfig, ChapSecret};
use riser_iscsi::framer::{Framer, FramerLimits};
use riser_iscsi::pdu::{logout, tmf, Digests, Lun, Op, Pdu};
use riser_iscsi::serial::Itt;

use crate::conn::Conn;
use crate::fake_target::{self as ft, FakeChap};
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

const USER: &str = "perf-user";
const SECRET: &str = "perf-secret-0123";
const MUSER: &str = "riser-target";
const MSECRET: &str = "target-secret-4567";

fn secrets() -> Vec<ChapSecret> {
    vec![ChapSecret {
        user: USER.into(),
        secret: SECRET.into(),
        muser: Some(MUSER.into()),
        msecret: Some(MSECRET.into()),
    }]
}

/// What riser-perf's flags make: `--chap USER:secret [--chap-mutual MUSER:msecret]`.
fn chap(secret: &str, msecret: Option<&str>) -> ChapInitiatorConfig {
    ChapInitiatorConfig {
        mutual: msecret.map(|m| ChapCredentials::new(MUSER, m)),
        ..ChapInitiatorConfig::new(ChapCredentials::new(USER, secret))
    }
}

fn tcp_login(chap_target: FakeChap, chap: Option<ChapInitiatorConfig>) -> (Result<Conn, String>, ft::Observed) {
    let (port, obs, h) = ft::start_with(Some(chap_target));
    let url = riser_initiator::url::parse(&format!("iscsi://127.0.0.1:{port}/iqn.2024-01.test:fake/0")).unwrap();
    let opts = LoginOptions {
        initiator_name: INITIATOR_NAME.into(),
        header_digest: false,
        data_digest: false,
        timeout: Duration::from_secs(10),
        isid: [0x80, 0, 0, 0, 0, 5],
        chap,
    };
    let r = Conn::login(&url, &opts).map(|mut c| {
        c.wait_ready().unwrap();
        c.logout().unwrap();
        c
    });
    h.join().unwrap();
    let o = std::mem::take(&mut *obs.lock().unwrap());
    (r, o)
}

/// riser-perf's TCP transport logs in with CHAP: AuthMethod=CHAP, CHAP_A with T=0, the
/// response with T=1, then the operational stage.
#[test]
fn chap_over_tcp_with_the_fake_target() {
    for (mutual, msecret) in [(false, None), (true, Some(MSECRET))] {
        let target = FakeChap {
            secrets: secrets(),
            mutual,
        };
        let (r, o) = tcp_login(target, Some(chap(SECRET, msecret)));
        r.unwrap();
        assert!(o.violations.is_empty(), "{:?}", o.violations);
        assert_eq!(o.chap_user.as_deref(), Some(USER));
        assert!(o.logins == 1 && o.logged_out);
    }
    // A wrong secret.
    let target = FakeChap {
        secrets: secrets(),
        mutual: false,
    };
    let (r, o) = tcp_login(target, Some(chap("wrong-secret-000", None)));
    assert!(r.err().unwrap().contains("authentication failed"));
    assert!(o.chap_failure.unwrap().contains("wrong CHAP response"));
    // The target proves itself with the wrong secret: refused.
    let mut wrong = secrets();
    wrong[0].msecret = Some("not-the-target-secret".into());
    let (r, o) = tcp_login(
        FakeChap {
            secrets: wrong,
            mutual: true,
        },
        Some(chap(SECRET, Some(MSECRET))),
    );
    assert!(r.err().unwrap().contains("mutual CHAP response is wrong"));
    assert_eq!(o.logins, 0);
}
