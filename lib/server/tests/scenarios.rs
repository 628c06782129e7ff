//! Scenarios: riser-initiator's session core ([`PduSession`]) against the
//! real server — the login driver, the session table, Enable_Datamover, the connection glue
//! on a reactor, the iSCSI full-feature phase, SCSI on a malloc bdev — over the in-memory
//! datamover (`riser_datamover::mem`: the TCP datamover on an in-memory byte pipe). No
//! sockets, no RDMA; the whole file runs in about a second.
//!
//! This is the place for the next cases of the data path, iSER fixes, CHAP and block
//! devices: one `#[test]` per scenario, built from [`Env`] and [`Client`].

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use riser_datamover::mem;
use riser_iscsi::chap::{ChapAlgorithm, ChapCredentials, ChapInitiatorConfig};
use riser_iscsi::login::{EnableDatamover, LoginRx, LoginTransport, PortalSpec, ResourceKeys, TransportError};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::pdu::{tmf, Lun, Pdu};
use riser_initiator::scsi::{rw_cdb, Dir};
use riser_initiator::session::{Event, LoginParams, Negotiated, PduSession, Unsolicited, INITIATOR_NAME};
use serde_json::json;

use common::*;

#[test]
fn login_reaches_full_feature_phase_and_logout_ends_the_connection() {
    let env = Env::new();
    let (client, neg) = Client::login(&env, 1, keys(true, false, 65536));
    // riser keeps InitialR2T=Yes (as SPDK does), and its FirstBurstLength option (8 KiB by
    // default) is the smaller one.
    assert!(neg.immediate_data && neg.initial_r2t, "{neg:?}");
    assert_eq!((neg.first_burst, neg.max_burst), (8192, 65536), "{neg:?}");
    env.wait_connections(1);
    let conns = env.connections();
    assert_eq!(conns[0]["target_node_name"], TARGET);
    assert_eq!(conns[0]["transport"], "tcp");
    client.logout();
    env.wait_connections(0);
}

#[test]
fn write_with_immediate_data_reads_back() {
    let env = Env::new();
    let (mut c, _) = Client::login(&env, 1, keys(true, true, 65536));
    let data = pattern(1, 4096);
    good(&c.write(8, &data));
    let r = c.read(8, 4096);
    good(&r);
    assert_eq!(r.data, data);
    c.logout();
}

/// A null LUN reads zeros, never another I/O's data, though its reads take their buffers
/// from the pool that solicited write data lands in (a buffer is known to be zero, and not
/// zeroed again, only until something could write to it).
#[test]
fn a_null_lun_reads_zeros_after_another_session_wrote_data_through_the_same_buffers() {
    let env = Env::null();
    // No immediate data: all of each write is solicited (R2T) into a pool buffer.
    let (mut a, _) = Client::login(&env, 1, keys(false, true, 65536));
    let (mut b, _) = Client::login(&env, 2, keys(true, true, 65536));
    for round in 0..8u8 {
        good(&a.write(8, &pattern(round.wrapping_add(1), 16384)));
        let r = b.read(8, 16384);
        good(&r);
        assert_eq!(r.data.len(), 16384);
        assert!(r.data.iter().all(|&x| x == 0), "round {round}: a null read showed non-zero bytes");
    }
    a.logout();
    b.logout();
}

#[test]
fn write_answering_r2ts_reads_back() {
    let env = Env::new();
    // No immediate data, InitialR2T=Yes: all 128 KiB comes solicited, in two bursts.
    let (mut c, neg) = Client::login(&env, 1, keys(false, true, 65536));
    assert!(!neg.immediate_data && neg.initial_r2t, "{neg:?}");
    let data = pattern(2, 131072);
    let (itt, pdus) = c.s.write(&rw_cdb(Dir::Write, 16, 256), &data).expect("write");
    assert_eq!(pdus.len(), 1, "only the command goes out unsolicited");
    c.send(pdus);
    let mut r2ts = 0;
    let done = c.until(|e| match e {
        Event::R2t { .. } => {
            r2ts += 1;
            None
        }
        Event::Complete(d) if d.itt == itt => Some(d.clone()),
        _ => None,
    });
    good(&done);
    assert!(r2ts >= 2, "{r2ts} R2T(s) for 128 KiB with MaxBurstLength 64 KiB");
    let r = c.read(16, 131072);
    good(&r);
    assert!(r.data == data, "read back differs");
    c.logout();
}

#[test]
fn write_with_immediate_data_then_r2ts_reads_back() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"first_burst_length": 16384}));
    // Immediate data up to FirstBurstLength and the target's MaxRecvDataSegmentLength, the
    // rest solicited.
    let (mut c, neg) = Client::login(&env, 1, keys(true, false, 16384));
    assert_eq!(neg.first_burst, 16384);
    let data = pattern(3, 65536);
    let (unsolicited, immediate) = neg.unsolicited(data.len() as u32);
    assert!(immediate > 0 && immediate == unsolicited, "immediate {immediate} of {unsolicited} unsolicited");
    good(&c.write(100, &data));
    let r = c.read(100, 65536);
    good(&r);
    assert!(r.data == data, "read back differs");
    c.logout();
}

#[test]
fn unsolicited_data_out_under_initial_r2t_is_rejected_and_solicited_again() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"first_burst_length": 16384}));
    let (mut c, neg) = Client::login(&env, 1, keys(true, false, 16384));
    assert!(neg.initial_r2t);
    // 512 bytes immediate, then 1 KiB of Data-Out nobody asked for (InitialR2T=Yes).
    let data = pattern(4, 8192);
    let (itt, pdus) = c
        .s
        .scsi_command(&rw_cdb(Dir::Write, 300, 16), 0, &data, Unsolicited::Exactly { immediate: 512, data_out: 1024 })
        .expect("write");
    assert_eq!(pdus.len(), 2, "command with immediate data, one Data-Out");
    c.send(pdus);
    // The stray Data-Out is rejected as a protocol error; the target then asks for
    // everything after the immediate data with R2Ts and the write completes.
    let reason = c.until(|e| match e {
        Event::Reject { reason, .. } => Some(*reason),
        Event::Complete(d) => panic!("the write completed before the Reject: {d:?}"),
        _ => None,
    });
    assert_eq!(reason, 0x04, "Reject: Protocol Error");
    good(&c.completion(itt));
    let r = c.read(300, 8192);
    good(&r);
    assert!(r.data == data, "read back differs");
    c.logout();
}

#[test]
fn abort_task_with_the_write_in_flight() {
    let env = Env::new();
    let (mut c, _) = Client::login(&env, 1, keys(false, true, 65536));
    let before = pattern(5, 4096);
    good(&c.write(40, &before));
    // A WRITE whose R2T is never answered stays in flight at the target.
    let (stuck, pdus) = c.s.write(&rw_cdb(Dir::Write, 40, 8), &pattern(6, 4096)).expect("write");
    c.send(pdus);
    assert!(matches!(c.next(), Event::R2t { itt, .. } if itt == stuck), "an R2T for the write");
    let (tm, abort) = c.s.abort_task(stuck);
    c.send([abort]);
    let (response, ended) = match c.next() {
        Event::TaskMgmt { itt, response, ended } if itt == tm => (response, ended),
        other => panic!("expected the TMF response first (no SCSI Response for the aborted task): {other:?}"),
    };
    assert_eq!(response, tmf::response::FUNCTION_COMPLETE);
    assert_eq!(ended, vec![stuck]);
    // The aborted write changed nothing; the session goes on.
    let r = c.read(40, 4096);
    good(&r);
    assert!(r.data == before, "the aborted write must not land");
    c.logout();
}

#[test]
fn lun_reset_with_writes_in_flight() {
    let env = Env::new();
    let (mut c, _) = Client::login(&env, 1, keys(false, true, 65536));
    let mut stuck = Vec::new();
    for lba in [0u64, 64] {
        let (itt, pdus) = c.s.write(&rw_cdb(Dir::Write, lba, 8), &pattern(7, 4096)).expect("write");
        c.send(pdus);
        stuck.push(itt);
    }
    for _ in 0..2 {
        assert!(matches!(c.next(), Event::R2t { .. }), "an R2T for each write");
    }
    let (tm, reset) = c.s.lun_reset();
    c.send([reset]);
    let ended = c.until(|e| match e {
        Event::TaskMgmt { itt, response, ended } if *itt == tm => {
            assert_eq!(*response, tmf::response::FUNCTION_COMPLETE);
            Some(ended.clone())
        }
        Event::Complete(d) => panic!("no SCSI Response for a task the reset ended: {d:?}"),
        _ => None,
    });
    stuck.sort_by_key(|i| i.0);
    let mut ended = ended;
    ended.sort_by_key(|i| i.0);
    assert_eq!(ended, stuck);
    // Commands work after the reset (a unit attention first is allowed).
    let r = c.read(0, 4096);
    if r.status != 0 {
        assert_eq!(r.sense.map(|s| s.key), Some(0x06), "only a UNIT ATTENTION may precede: {r:?}");
        good(&c.read(0, 4096));
    }
    c.logout();
}

#[test]
fn nop_out_is_echoed_and_target_pings_are_answered() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"nop_in_interval": 1}));
    let (mut c, _) = Client::login(&env, 1, keys(true, false, 65536));
    let (itt, nop) = c.s.nop_out(b"are you there");
    c.send([nop]);
    let echoed = c.until(|e| match e {
        Event::NopIn { itt: i, data } if *i == itt => Some(data.clone()),
        _ => None,
    });
    assert_eq!(echoed, b"are you there");
    // The target pings an idle connection after nop_in_interval; the answer keeps it up.
    let reply = c.until(|e| match e {
        Event::Ping { reply } => Some(reply.clone()),
        _ => None,
    });
    c.send([reply]);
    good(&c.read(0, 512));
    env.wait_connections(1);
    c.logout();
}

#[test]
fn a_second_login_with_the_same_isid_reinstates_the_session() {
    let env = Env::new();
    let (mut first, _) = Client::login(&env, 1, keys(true, false, 65536));
    good(&first.read(0, 512));
    env.wait_connections(1);
    // Same initiator name and ISID, TSIH 0: session reinstatement (RFC 7143 §6.3.5).
    let (mut second, _) = Client::login(&env, 1, keys(true, false, 65536));
    assert!(matches!(first.c.recv(WAIT), Ok(None)), "the old session's connection is closed");
    env.wait_connections(1);
    good(&second.read(0, 512));
    // The first session is gone; another ISID is a session of its own.
    let (third, _) = Client::login(&env, 2, keys(true, false, 65536));
    env.wait_connections(2);
    third.logout();
    second.logout();
    env.wait_connections(0);
}

#[test]
fn a_malformed_pdu_is_answered_and_the_connection_goes_on() {
    let env = Env::new();
    let (mut c, _) = Client::login(&env, 1, keys(true, false, 65536));
    // A 48-byte header with a reserved initiator opcode (0x1a) and no data.
    let mut bhs = [0u8; 48];
    bhs[0] = 0x1a;
    bhs[16..20].copy_from_slice(&0x1234u32.to_be_bytes());
    c.c.send_raw(&bhs).expect("send");
    let reason = c.until(|e| match e {
        Event::Reject { reason, .. } => Some(*reason),
        _ => None,
    });
    assert_eq!(reason, 0x05, "Reject: Command not supported");
    good(&c.read(0, 512));
    // A second connection is not disturbed by the first one's garbage.
    let (other, _) = Client::login(&env, 2, keys(true, false, 65536));
    other.logout();
    c.logout();
}

#[test]
fn login_to_an_unknown_target_is_refused_and_the_connection_closed() {
    let env = Env::new();
    let mut c = Client { s: PduSession::new("stranger", Lun(0)), c: env.connect(3) };
    let params = LoginParams::normal(INITIATOR_NAME, "iqn.2016-06.io.riser:nosuch", [0x80, 0, 0, 0, 0, 3]);
    let err = c.login_as(&params, keys(true, false, 65536)).expect_err("refused");
    assert!(err.contains("not found") || err.contains("0x0203") || err.contains("02"), "{err}");
    assert!(matches!(c.c.recv(WAIT), Ok(None)), "closed after the refusal");
    assert!(env.connections().is_empty());
    let stats = env.call("iscsi_get_stats", json!({}));
    assert_eq!(stats["logins"]["failed"]["not_found"], 1, "{stats}");
    assert_eq!(stats["logins"]["succeeded"], 0, "{stats}");
}

/// A login transport whose Allocate_Connection_Resources fails (no memory to register, say).
struct NoResources<T: LoginTransport>(T, Arc<Mutex<Option<ResourceKeys>>>);

impl<T: LoginTransport> LoginTransport for NoResources<T> {
    fn kind(&self) -> Transport {
        self.0.kind()
    }
    fn peer(&self) -> SocketAddr {
        self.0.peer()
    }
    fn local(&self) -> Option<SocketAddr> {
        self.0.local()
    }
    fn recv_login(&mut self, deadline: Instant) -> Result<LoginRx, TransportError> {
        self.0.recv_login(deadline)
    }
    fn send_login(&mut self, pdu: Pdu, deadline: Instant) -> Result<(), TransportError> {
        self.0.send_login(pdu, deadline)
    }
    fn allocate_connection_resources(&mut self, keys: &ResourceKeys) -> Result<(), TransportError> {
        *self.1.lock().unwrap_or_else(|p| p.into_inner()) = Some(*keys);
        Err(TransportError::Failed("no memory to register".into()))
    }
    fn enable_datamover(self: Box<Self>) -> Result<EnableDatamover, TransportError> {
        Box::new(self.0).enable_datamover()
    }
}

#[test]
fn a_login_whose_resources_cannot_be_allocated_is_answered_out_of_resources() {
    let env = Env::new();
    let (login, client) = mem::connection("127.0.0.9:40009".parse().expect("addr"), PORTAL.parse().expect("portal"));
    let asked = Arc::new(Mutex::new(None));
    let portal = PortalSpec { addr: PORTAL.parse().expect("portal"), portal_group_tag: 1 };
    assert!(env.server.start_login(portal, Box::new(NoResources(login, asked.clone()))));
    let mut c = Client { s: PduSession::new("no resources", Lun(0)), c: client };
    let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, 9]);
    let err = c.login_as(&params, keys(true, false, 65536)).expect_err("the login cannot complete");
    // Answered Target Error / Out of Resources (0x0302), then closed.
    assert!(err.contains("status class 0x03, detail 0x02"), "{err}");
    assert!(matches!(c.c.recv(WAIT), Ok(None)), "closed after the refusal");
    let stats = env.call("iscsi_get_stats", json!({}));
    assert_eq!(stats["logins"]["failed"]["target_error"], 1, "{stats}");
    // Allocate_Connection_Resources was asked once, with the target's queue depth.
    assert_eq!(*asked.lock().unwrap_or_else(|p| p.into_inner()), Some(ResourceKeys { queue_depth: 32 }));
    assert!(env.connections().is_empty());
    // The server goes on serving others.
    let (other, _) = Client::login(&env, 2, keys(true, false, 65536));
    other.logout();
}

/// Auth group 1 with one secret (mutual with `riser`) on the node, which requires CHAP.
fn require_chap(env: &Env, mutual: bool) {
    env.call(
        "iscsi_create_auth_group",
        json!({"tag": 1, "secrets": [{"user": "alice", "secret": "alice-secret-1", "muser": "riser", "msecret": "riser-secret-2"}]}),
    );
    env.call(
        "iscsi_target_node_set_auth",
        json!({"name": TARGET, "chap_group": 1, "require_chap": true, "mutual_chap": mutual}),
    );
}

fn chap_login(env: &Env, n: u8, chap: ChapInitiatorConfig) -> (Client, Result<Negotiated, String>) {
    let mut c = Client { s: PduSession::new(format!("chap {n}"), Lun(0)), c: env.connect(n) };
    let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, n]).with_chap(chap);
    let r = c.login_as(&params, keys(true, false, 65536));
    (c, r)
}

#[test]
fn chap_one_way_and_mutual_log_in_and_wrong_secrets_are_refused() {
    let env = Env::new();
    require_chap(&env, true);
    let alice = || ChapCredentials::new("alice", "alice-secret-1");
    // Mutual, SHA-256 only offered.
    let mut cfg = ChapInitiatorConfig::new(alice());
    cfg.mutual = Some(ChapCredentials::new("riser", "riser-secret-2"));
    cfg.algorithms = vec![ChapAlgorithm::Sha256];
    let (mut c, r) = chap_login(&env, 1, cfg.clone());
    r.expect("mutual CHAP login");
    c.clear_unit_attention();
    good(&c.read(0, 512));
    c.logout();
    // One-way does not satisfy mutual_chap.
    let (_, r) = chap_login(&env, 2, ChapInitiatorConfig::new(alice()));
    assert!(r.is_err(), "one-way CHAP logged in to a mutual_chap node");
    // A wrong secret, an unknown user.
    let (_, r) = chap_login(&env, 3, ChapInitiatorConfig { credentials: ChapCredentials::new("alice", "not-the-secret"), ..cfg.clone() });
    assert!(r.is_err(), "a wrong secret logged in");
    let (_, r) = chap_login(&env, 4, ChapInitiatorConfig { credentials: ChapCredentials::new("mallory", "alice-secret-1"), ..cfg.clone() });
    assert!(r.is_err(), "an unknown user logged in");
    // The initiator refuses a target that answers for another secret.
    let (_, r) = chap_login(&env, 5, ChapInitiatorConfig { mutual: Some(ChapCredentials::new("riser", "wrong-target-9")), ..cfg });
    assert!(r.is_err(), "the initiator accepted a wrong mutual answer");
    let stats = env.call("iscsi_get_stats", json!({}));
    assert!(stats["logins"]["failed"]["authentication"].as_u64().unwrap_or(0) >= 3, "{stats}");
    // No CHAP at all: refused.
    let mut c = Client { s: PduSession::new("none", Lun(0)), c: env.connect(6) };
    let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, 6]);
    assert!(c.login_as(&params, keys(true, false, 65536)).is_err(), "no CHAP logged in to a require_chap node");
}

#[test]
fn chap_every_algorithm_one_way() {
    let env = Env::new();
    require_chap(&env, false);
    for (n, alg) in [ChapAlgorithm::Md5, ChapAlgorithm::Sha1, ChapAlgorithm::Sha256, ChapAlgorithm::Sha3_256].into_iter().enumerate() {
        let mut cfg = ChapInitiatorConfig::new(ChapCredentials::new("alice", "alice-secret-1"));
        cfg.algorithms = vec![alg];
        let (c, r) = chap_login(&env, 10 + n as u8, cfg);
        r.unwrap_or_else(|e| panic!("{}: {e}", alg.name()));
        c.logout();
    }
}
