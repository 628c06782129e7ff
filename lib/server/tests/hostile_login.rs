//! Hostile logins (issue #22, items 1-3): peers that have not authenticated, or stop in the
//! middle of a login, or never read, against the real server.
//!
//! - Over the in-memory datamover: a login that has not completed leaves no session behind
//!   and ends no one's session or connection (the session is committed only when the login
//!   completes); discovery sessions have their own limit.
//! - Over real TCP sockets: a login whose initiator never reads ends at its deadline, and
//!   logins stalled from one address do not take every login slot.

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use riser_datamover::mem::{self, MemClient};
use riser_iscsi::chap::{ChapCredentials, ChapInitiatorConfig};
use riser_iscsi::login::{EnableDatamover, LoginRx, LoginTransport, PortalSpec, ResourceKeys, TransportError};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::pdu::{Isid, LoginRequest, Lun, Op, Pdu, Stage};
use riser_iscsi::serial::{Itt, Sn};
use riser_initiator::session::{KeyNegotiation, LoginParams, PduSession, SessionType, INITIATOR_NAME};
use serde_json::{json, Value};

use common::*;

/// Auth group 1 with alice's secret; the node requires CHAP.
fn require_chap(env: &Env) {
    env.call("iscsi_create_auth_group", json!({"tag": 1, "secrets": [{"user": "alice", "secret": "alice-secret-1"}]}));
    env.call("iscsi_target_node_set_auth", json!({"name": TARGET, "chap_group": 1, "require_chap": true}));
}

fn alice(secret: &str) -> ChapInitiatorConfig {
    ChapInitiatorConfig::new(ChapCredentials::new("alice", secret))
}

/// Port `n`'s normal login (ISID ends in `n`), with CHAP if given.
fn params(n: u8, chap: Option<ChapInitiatorConfig>) -> LoginParams {
    let p = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, n]);
    match chap {
        Some(c) => p.with_chap(c),
        None => p,
    }
}

/// A whole login over a new connection from port `from`.
fn login(env: &Env, from: u8, p: &LoginParams) -> (Client, Result<(), String>) {
    let mut c = Client { s: PduSession::new(format!("port {from}"), Lun(0)), c: env.connect(from) };
    let r = c.login_as(p, keys(true, false, 65536)).map(|_| ());
    (c, r)
}

/// A login that stops after the target's first Login Response (the initiator goes silent,
/// or away): the connection, still open.
fn first_response_only(env: &Env, from: u8, p: &LoginParams) -> MemClient {
    first_response_only_over(env.connect(from), p)
}

/// [`first_response_only`] over a connection of the test's own.
fn first_response_only_over(mut wire: MemClient, p: &LoginParams) -> MemClient {
    let mut s = PduSession::new("abandoned", Lun(0));
    let mut sent = 0;
    let r = s.login_via(p, KeyNegotiation::with_proposal(keys(true, false, 65536)), |req| {
        if sent == 1 {
            return Err("abandoned".to_string());
        }
        sent += 1;
        wire.send(&req).map_err(|e| e.to_string())?;
        wire.recv(WAIT).map_err(|e| e.to_string())?.ok_or_else(|| "closed during login".to_string())
    });
    assert_eq!(r.err().as_deref(), Some("abandoned"), "the first response came");
    wire
}

/// The TSIH of the only connection of port `n`'s session.
fn tsih_of(env: &Env, n: u8) -> u16 {
    let isid = format!("0x{:012x}", 0x8000_0000_0000u64 | n as u64);
    let conns = env.connections();
    let c = conns.iter().find(|c| c["isid"] == isid).unwrap_or_else(|| panic!("no connection of {isid}: {conns:?}"));
    c["tsih"].as_u64().expect("tsih") as u16
}

fn stats(env: &Env) -> Value {
    env.call("iscsi_get_stats", json!({}))
}

/// A connection the target was asked to close notices within a few of its timer ticks
/// (100 ms): a victim is checked after this.
const NOTICE: Duration = Duration::from_millis(500);

/// The connection is still served, some time after an attack: a write and read-back.
fn survives(c: &mut Client, lba: u64, seed: u8) {
    std::thread::sleep(NOTICE);
    io(c, lba, seed);
}

/// A write and read-back of `seed`'s pattern at block `lba`.
fn io(c: &mut Client, lba: u64, seed: u8) {
    let data = pattern(seed, 4096);
    good(&c.write(lba, &data));
    let back = c.read(lba, data.len());
    good(&back);
    assert!(back.data == data, "read back what was written");
}

/// 300 logins that stop after the first Login Response and 300 with a wrong CHAP response,
/// each with its own ISID, against a target that allows 4 sessions: a healthy login still
/// gets in (before, each put a session in the table on its first key list, for good).
#[test]
fn abandoned_and_failed_chap_logins_leave_no_session_behind() {
    let env = Env::new();
    require_chap(&env);
    env.call("iscsi_set_options", json!({"max_sessions": 4}));
    let mut open = Vec::new();
    for n in 0..150u8 {
        // Half go silent, half go away.
        let c = first_response_only(&env, 1 + n % 100, &params(n, Some(alice("alice-secret-1"))));
        if n % 2 == 0 {
            open.push(c);
        } else {
            c.close();
        }
    }
    for n in 150..=255u8 {
        let (_, r) = login(&env, 1 + n % 100, &params(n, Some(alice("not-the-secret"))));
        assert!(r.is_err(), "a wrong secret logged in");
    }
    assert_eq!(env.server.sessions_count(), 0, "no session for logins that did not complete");
    let (mut c, r) = login(&env, 200, &params(200, Some(alice("alice-secret-1"))));
    r.expect("a healthy login after 256 abandoned or failed ones");
    c.clear_unit_attention();
    io(&mut c, 8, 1);
    assert_eq!(env.server.sessions_count(), 1);
    assert!(stats(&env)["logins"]["failed"]["authentication"].as_u64().unwrap_or(0) >= 100);
    // The limit itself holds: 4 sessions, then Out of resources (0x0302).
    let mut held = vec![c];
    for n in 201..204u8 {
        let (c, r) = login(&env, n, &params(n, Some(alice("alice-secret-1"))));
        r.expect("within max_sessions");
        held.push(c);
    }
    let (_, r) = login(&env, 204, &params(204, Some(alice("alice-secret-1"))));
    let err = r.expect_err("a fifth session");
    assert!(err.contains("status class 0x03, detail 0x02"), "{err}");
    // A reinstatement does not need room: it replaces its session.
    let (mut again, r) = login(&env, 205, &params(201, Some(alice("alice-secret-1"))));
    r.expect("reinstatement with the table full");
    again.clear_unit_attention();
    io(&mut again, 16, 2);
    drop(open);
}

/// A session that logged in with CHAP survives logins that know its InitiatorName and ISID
/// (both travel in clear) but not the secret: none, a wrong one, or one that stops after the
/// first response. Its I/O goes on; only a login that completes CHAP reinstates it.
#[test]
fn a_chap_session_survives_logins_that_know_only_its_name_and_isid() {
    let env = Env::new();
    require_chap(&env);
    let (mut victim, r) = login(&env, 1, &params(1, Some(alice("alice-secret-1"))));
    r.expect("CHAP login");
    victim.clear_unit_attention();
    io(&mut victim, 0, 1);
    // No CHAP at all.
    let (_, r) = login(&env, 2, &params(1, None));
    assert!(r.is_err(), "logged in without CHAP");
    survives(&mut victim, 0, 2);
    // A wrong secret.
    let (_, r) = login(&env, 3, &params(1, Some(alice("guessed-secret"))));
    assert!(r.is_err(), "logged in with a wrong secret");
    survives(&mut victim, 0, 3);
    // The first step only, then silence.
    let _silent = first_response_only(&env, 4, &params(1, Some(alice("alice-secret-1"))));
    survives(&mut victim, 0, 4);
    assert_eq!(env.connections().len(), 1);
    assert_eq!(env.server.sessions_count(), 1);
    // The initiator itself, with its secret: session reinstatement (RFC 7143 §6.3.5).
    let (mut back, r) = login(&env, 5, &params(1, Some(alice("alice-secret-1"))));
    r.expect("reinstatement with the secret");
    assert!(matches!(victim.c.recv(WAIT), Ok(None)), "the old session's connection is closed");
    back.clear_unit_attention();
    io(&mut back, 0, 5);
    env.wait_connections(1);
}

/// Connection reinstatement (a login with the session's TSIH and a live connection's CID,
/// RFC 7143 §6.3.4) closes the old connection only once the new login completes: not for a
/// login that stops after its first response, nor for one that fails CHAP.
#[test]
fn connection_reinstatement_waits_for_the_login_to_complete() {
    // No authentication: the join is allowed, but only its completion closes the old one.
    let env = Env::new();
    let (mut first, _) = Client::login(&env, 1, keys(true, false, 65536));
    io(&mut first, 0, 1);
    let tsih = tsih_of(&env, 1);
    let join = LoginParams { tsih, cid: 0, ..params(1, None) };
    let _silent = first_response_only(&env, 2, &join);
    survives(&mut first, 0, 2);
    assert_eq!(env.connections().len(), 1);
    let (mut second, r) = login(&env, 3, &join);
    r.expect("connection reinstatement");
    assert!(matches!(first.c.recv(WAIT), Ok(None)), "the connection with the same CID is closed");
    env.wait_connections(1);
    assert_eq!(tsih_of(&env, 1), tsih, "the same session");
    second.clear_unit_attention();
    io(&mut second, 0, 3);
    drop(env);

    // CHAP: a join without the secret disturbs nothing.
    let env = Env::new();
    require_chap(&env);
    let (mut victim, r) = login(&env, 1, &params(1, Some(alice("alice-secret-1"))));
    r.expect("CHAP login");
    victim.clear_unit_attention();
    io(&mut victim, 0, 1);
    let tsih = tsih_of(&env, 1);
    for (from, chap) in [(2, None), (3, Some(alice("guessed-secret")))] {
        let (_, r) = login(&env, from, &LoginParams { tsih, cid: 0, ..params(1, chap) });
        assert!(r.is_err(), "joined without the secret");
        survives(&mut victim, 0, from);
    }
    let _silent = first_response_only(&env, 4, &LoginParams { tsih, cid: 0, ..params(1, Some(alice("alice-secret-1"))) });
    survives(&mut victim, 0, 4);
    assert_eq!(env.connections().len(), 1);
}

/// A login transport whose final Login Response cannot be sent (the link went down just
/// then): the login has committed its session, and must take it back.
struct FinalSendFails<T: LoginTransport>(T);

impl<T: LoginTransport> LoginTransport for FinalSendFails<T> {
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
        if matches!(&pdu.bhs.op, Op::LoginResponse(r) if r.transit_bit && r.nsg == Stage::FullFeaturePhase) {
            return Err(TransportError::Failed("link down".into()));
        }
        self.0.send_login(pdu, deadline)
    }
    fn allocate_connection_resources(&mut self, keys: &ResourceKeys) -> Result<(), TransportError> {
        self.0.allocate_connection_resources(keys)
    }
    fn enable_datamover(self: Box<Self>) -> Result<EnableDatamover, TransportError> {
        Box::new(self.0).enable_datamover()
    }
}

#[test]
fn a_session_whose_connection_never_reaches_full_feature_phase_is_removed() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"max_sessions": 1}));
    let portal: SocketAddr = PORTAL.parse().expect("portal");
    for n in 1..=3u8 {
        let (login, client) = mem::connection(format!("127.0.0.{n}:4000{n}").parse().expect("addr"), portal);
        assert!(env.server.start_login(PortalSpec { addr: portal, portal_group_tag: 1 }, Box::new(FinalSendFails(login))));
        let mut c = Client { s: PduSession::new("link down", Lun(0)), c: client };
        assert!(c.login_as(&params(n, None), keys(true, false, 65536)).is_err());
        let deadline = Instant::now() + WAIT;
        while env.server.sessions_count() != 0 {
            assert!(Instant::now() < deadline, "the session of a login that never completed stays");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let (c, _) = Client::login(&env, 9, keys(true, false, 65536));
    c.logout();
}

fn discovery(n: u8) -> LoginParams {
    LoginParams { session_type: SessionType::Discovery, target_name: None, ..params(n, None) }
}

/// Discovery sessions are in the session table (a TSIH of their own, never another
/// session's) and count against `max_discovery_sessions`, not against `max_sessions`.
#[test]
fn discovery_sessions_count_against_their_own_limit() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"max_discovery_sessions": 2, "max_sessions": 1}));
    let (d1, r) = login(&env, 1, &discovery(1));
    r.expect("discovery 1");
    let (d2, r) = login(&env, 2, &discovery(2));
    r.expect("discovery 2");
    // A third from a source that holds one already (a source holding none would make one
    // give way: a_newcomer_always_gets_a_discovery_session).
    let (_, r) = login_from(&env, "127.0.0.11:41000", &discovery(3));
    let err = r.expect_err("a third discovery session");
    assert!(err.contains("status class 0x03, detail 0x02"), "{err}");
    // A normal session still gets in, with a TSIH no discovery session has.
    let (mut c, r) = login(&env, 4, &params(4, None));
    r.expect("a normal session");
    c.clear_unit_attention();
    env.wait_connections(3);
    let mut tsihs: Vec<u64> = env.connections().iter().map(|c| c["tsih"].as_u64().expect("tsih")).collect();
    tsihs.sort();
    tsihs.dedup();
    assert_eq!(tsihs.len(), 3, "one TSIH per session");
    assert_eq!(env.server.session_counts(), (1, 2));
    assert_eq!(stats(&env)["refused"]["max_discovery_sessions"], 1);
    // A discovery session that ends makes room.
    d1.logout();
    env.wait_connections(2);
    let (_, r) = login(&env, 5, &discovery(5));
    r.expect("discovery after one ended");
    drop(d2);
}

/// A new in-memory connection from `from` (any address, IPv6 too).
fn connect_from(env: &Env, from: &str) -> std::io::Result<MemClient> {
    env.portal.connect(from.parse().expect("address"), PORTAL.parse().expect("portal"))
}

/// A whole login from `from`.
fn login_from(env: &Env, from: &str, p: &LoginParams) -> (Option<Client>, Result<(), String>) {
    let wire = match connect_from(env, from) {
        Ok(w) => w,
        Err(e) => return (None, Err(format!("connect: {e}"))),
    };
    let mut c = Client { s: PduSession::new(from, Lun(0)), c: wire };
    let r = c.login_as(p, keys(true, false, 65536)).map(|_| ());
    (Some(c), r)
}

/// One host (one IPv4 address, or one IPv6 /64 whatever its addresses) holds at most
/// `max_discovery_sessions_per_source` discovery sessions, refused with Out of resources
/// past it and counted; the other hosts still discover. Before, one unauthenticated host
/// could take all `max_discovery_sessions` and keep every initiator from SendTargets.
#[test]
fn one_source_cannot_hold_every_discovery_session() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"max_discovery_sessions": 16, "max_discovery_sessions_per_source": 3}));
    let mut held = Vec::new();
    for port in 1..=3 {
        let (c, r) = login_from(&env, &format!("10.9.0.1:{port}"), &discovery(port as u8));
        r.expect("discovery within the source's share");
        held.push(c);
    }
    let (_, r) = login_from(&env, "10.9.0.1:4", &discovery(4));
    let err = r.expect_err("a fourth discovery session from 10.9.0.1");
    assert!(err.contains("status class 0x03, detail 0x02"), "{err}");
    // An IPv4-mapped IPv6 address is the same host.
    let (_, r) = login_from(&env, "[::ffff:10.9.0.1]:5", &discovery(5));
    assert!(r.is_err(), "the same address, IPv4-mapped");
    // Another host discovers.
    let (c, r) = login_from(&env, "10.9.0.2:1", &discovery(6));
    r.expect("discovery from another address");
    held.push(c);
    // One IPv6 /64 is one source, whatever address in it each connection picks.
    for i in 1..=3 {
        let (c, r) = login_from(&env, &format!("[2001:db8:1:2::{i}]:1"), &discovery(10 + i));
        r.expect("discovery within the /64's share");
        held.push(c);
    }
    let (_, r) = login_from(&env, "[2001:db8:1:2:ffff::9]:1", &discovery(20));
    assert!(r.is_err(), "a fourth discovery session from the same /64");
    let (c, r) = login_from(&env, "[2001:db8:1:3::1]:1", &discovery(21));
    r.expect("discovery from another /64");
    held.push(c);
    assert_eq!(env.server.session_counts(), (0, 8));
    let st = stats(&env);
    assert_eq!(
        (&st["refused"]["max_discovery_sessions_per_source"], &st["refused"]["max_discovery_sessions"]),
        (&json!(3), &json!(0)),
        "{st}"
    );
    // A discovery session that ends gives its source room again.
    let first = held.remove(0).expect("connected");
    first.logout();
    env.wait_connections(7);
    let (c, r) = login_from(&env, "10.9.0.1:7", &discovery(7));
    r.expect("discovery after one of the source's ended");
    drop((c, held));
}

/// Logins stalled from many addresses of one IPv6 /64 share that source's
/// `max_logins_per_source`: a host with a /64 is one source, not 2^64 of them.
#[test]
fn stalled_logins_from_one_ipv6_64_share_one_source_limit() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"max_logins_per_source": 4, "login_timeout": 30}));
    let mut stalled = Vec::new();
    let mut refused = 0;
    for i in 1..=20u8 {
        match connect_from(&env, &format!("[2001:db8:7:7::{i:x}]:3000")) {
            Ok(w) => stalled.push(first_response_only_over(w, &params(i, None))),
            Err(_) => refused += 1,
        }
    }
    assert_eq!((stalled.len(), refused), (4, 16));
    assert_eq!(env.server.logins_in_progress(), 4);
    assert_eq!(env.server.refusals().count(riser_server::stats::Refusal::LoginsPerSource), 16);
    // Another /64, and an IPv4 host, log in.
    let (c, r) = login_from(&env, "[2001:db8:7:8::1]:3000", &params(30, None));
    r.expect("a login from another /64");
    drop(c);
    let (c, r) = login_from(&env, "10.7.0.1:3000", &params(31, None));
    r.expect("a login from IPv4");
    drop((c, stalled));
}

/// What a transport asks before it spends anything on a connection (an iSER QP): a source at
/// its `max_logins_per_source` is refused there, others are not, and the sink says the
/// server's `max_logins` (the iSER portal's own cap follows it).
#[test]
fn the_login_sink_refuses_a_source_at_its_limit_before_the_transport_builds_anything() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"max_logins": 100, "max_logins_per_source": 2, "login_timeout": 30}));
    let sink = env.server.login_sink();
    assert_eq!(sink.max_logins(), Some(100));
    let at = |a: &str| -> SocketAddr { a.parse().expect("address") };
    let mut stalled = Vec::new();
    for (i, a) in ["10.8.0.1:1", "10.8.0.1:2", "[2001:db8:8::1]:1", "[2001:db8:8::2]:1"].into_iter().enumerate() {
        assert!(sink.may_accept(at(a)), "{a} below its limit");
        stalled.push(first_response_only_over(connect_from(&env, a).expect("connect"), &params(i as u8, None)));
    }
    assert!(!sink.may_accept(at("10.8.0.1:3")), "10.8.0.1 holds its 2");
    assert!(!sink.may_accept(at("[2001:db8:8::ffff]:3")), "the /64 holds its 2");
    assert!(sink.may_accept(at("10.8.0.2:1")));
    assert!(sink.may_accept(at("[2001:db8:8:1::1]:1")));
    assert_eq!(env.server.logins_in_progress(), 4, "asking reserved nothing");
    assert_eq!(env.server.refusals().count(riser_server::stats::Refusal::LoginsPerSource), 2, "refusals are counted");
    drop(stalled);
}

// ---- real TCP sockets ------------------------------------------------------------------

/// A client TCP socket from `from` (any 127.0.0.x is loopback on Linux) to `to`, with a
/// receive buffer of `rcvbuf` bytes and a maximum segment of `mss` bytes when given (set
/// before connecting, so that the window and segment sizes are small from the start).
#[allow(unsafe_code)]
fn tcp_from(from: Ipv4Addr, to: SocketAddrV4, rcvbuf: Option<i32>, mss: Option<i32>) -> std::io::Result<TcpStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    fn check(rc: i32) -> std::io::Result<()> {
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
    fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
            sin_zero: [0; 8],
        }
    }
    fn setopt(fd: i32, level: i32, name: i32, v: i32) -> std::io::Result<()> {
        // SAFETY: `fd` is an open socket; the option value is an i32 of the size given.
        check(unsafe {
            libc::setsockopt(fd, level, name, (&v as *const i32).cast(), std::mem::size_of::<i32>() as libc::socklen_t)
        })
    }
    // SAFETY: plain socket(2); the descriptor is owned by `owned` right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    check(fd)?;
    // SAFETY: `fd` is a new, open descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(b) = rcvbuf {
        setopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, b)?;
    }
    if let Some(m) = mss {
        setopt(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, m)?;
    }
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let local = sockaddr(SocketAddrV4::new(from, 0));
    // SAFETY: `local` is a valid sockaddr_in of `len` bytes, alive for the call.
    check(unsafe { libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) })?;
    let remote = sockaddr(to);
    // SAFETY: `remote` is a valid sockaddr_in of `len` bytes, alive for the call.
    check(unsafe { libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) })?;
    Ok(TcpStream::from(owned))
}

fn login_request(continue_bit: bool, itt: u32, data: Vec<u8>) -> Pdu {
    let op = Stage::LoginOperationalNegotiation;
    Pdu::with_data(
        Op::LoginRequest(LoginRequest {
            transit_bit: false,
            continue_bit,
            csg: op,
            nsg: op,
            version_max: 0,
            version_min: 0,
            isid: Isid([0x80, 0, 0, 0, 0, 0x77]),
            tsih: 0,
            itt: Itt(itt),
            cid: 0,
            cmd_sn: Sn(1),
            exp_stat_sn: Sn(0),
        }),
        data,
    )
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A discovery login padded with unknown keys (each answered NotUnderstood, so the answers
/// outgrow the requests), from a socket with a tiny receive buffer that is never read: the
/// target's send blocks on the zero window. The login must still end at its deadline
/// (login_timeout), not hold its thread for ever.
#[test]
fn a_login_whose_initiator_never_reads_ends_at_its_deadline() {
    let env = Env::tcp("127.0.0.1:43261");
    env.call("iscsi_set_options", json!({"login_timeout": 2}));
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 43261);
    let mut sock = tcp_from(Ipv4Addr::LOCALHOST, to, Some(1), Some(536)).expect("client socket");
    sock.set_write_timeout(Some(Duration::from_secs(2))).expect("write timeout");
    let mut text = format!("InitiatorName={INITIATOR_NAME}\0SessionType=Discovery\0").into_bytes();
    let mut k = 0;
    while text.len() < 60 * 1024 {
        text.extend_from_slice(format!("k{k}=v\0").as_bytes());
        k += 1;
    }
    let started = Instant::now();
    let chunks: Vec<&[u8]> = text.chunks(8192).collect();
    let mut itt = 1;
    let mut pdus: Vec<Pdu> = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        pdus.push(login_request(i + 1 < chunks.len(), itt, c.to_vec()));
        itt += 1;
    }
    // Then empty requests, each fetching the next piece of the target's answer, and more
    // than a login may have (64): a target that is not blocked sending fails the login at
    // once (checked below), one that is blocked never gets to them.
    while pdus.len() < 70 {
        pdus.push(login_request(false, itt, Vec::new()));
        itt += 1;
    }
    for p in pdus {
        let bytes = p.to_bytes(Default::default()).expect("encode");
        if sock.write_all(&bytes).is_err() {
            break; // the target stopped reading: it is blocked sending
        }
    }
    wait_until("the login thread started", WAIT, || env.server.logins_in_progress() == 1);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        env.server.logins_in_progress(),
        1,
        "the login is blocked sending (the test's premise: the target's send buffer, small for a 536-byte MSS, is full)"
    );
    wait_until("the login thread ended", Duration::from_secs(20), || env.server.logins_in_progress() == 0);
    assert!(started.elapsed() < Duration::from_secs(10), "ended by its deadline: {:?}", started.elapsed());
    assert_eq!(stats(&env)["logins"]["failed"]["timeout"], 1, "counted as a timeout");
    // The connection was closed: the target is gone once the client reads.
    drop(sock);
    let (c, _) = Client::login_over(TcpWire::connect("127.0.0.1:43261".parse().expect("addr")), 1, keys(true, false, 65536));
    c.logout();
}

/// 40 connections from 127.0.0.2 that never send: only max_logins_per_source of them get a
/// login slot (the others are closed at once), so a login from 127.0.0.1 still gets in
/// although max_logins is below 40.
#[test]
fn stalled_logins_from_one_address_leave_room_for_others() {
    let env = Env::tcp("127.0.0.1:43262");
    env.call("iscsi_set_options", json!({"max_logins": 16, "max_logins_per_source": 4, "login_timeout": 30}));
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 43262);
    let flood = Ipv4Addr::new(127, 0, 0, 2);
    let mut stalled = Vec::new();
    for _ in 0..40 {
        stalled.push(tcp_from(flood, to, None, None).expect("connect from 127.0.0.2"));
    }
    let refusals = || env.server.refusals().count(riser_server::stats::Refusal::LoginsPerSource);
    wait_until("36 connections refused", WAIT, || refusals() == 36);
    assert_eq!(env.server.logins_in_progress(), 4);
    // A refused connection is closed.
    let mut closed = 0;
    for s in &mut stalled {
        s.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        if matches!(std::io::Read::read(s, &mut [0u8; 1]), Ok(0)) {
            closed += 1;
        }
    }
    assert_eq!(closed, 36);
    let st = stats(&env);
    assert_eq!((&st["refused"]["max_logins_per_source"], &st["logins_in_progress"]), (&json!(36), &json!(4)), "{st}");
    // Another address logs in, and does I/O.
    let wire = TcpWire::connect("127.0.0.1:43262".parse().expect("addr"));
    let (mut c, _) = Client::login_over(wire, 1, keys(true, false, 65536));
    good(&c.write(0, &pattern(1, 512)));
    c.logout();
    // A second flooding address gets its own 4.
    let other: Vec<TcpStream> =
        (0..6).map(|_| tcp_from(Ipv4Addr::new(127, 0, 0, 3), to, None, None).expect("connect from 127.0.0.3")).collect();
    wait_until("2 more refused", WAIT, || refusals() == 38);
    assert_eq!(env.server.logins_in_progress(), 8);
    drop(other);
    drop(stalled);
}

/// The address of the connection of port `n`'s discovery session (ISID ends in `n`), if
/// it is still connected.
fn connected(env: &Env, n: u8) -> bool {
    let isid = format!("0x{:012x}", 0x8000_0000_0000u64 | n as u64);
    env.connections().iter().any(|c| c["isid"] == isid)
}

/// Waits (up to 10 s) for `what`.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Held discovery sessions cannot lock everyone out of SendTargets: when they fill
/// `max_discovery_sessions`, a discovery login from a source that holds none gets in, and
/// the longest-idle discovery session of the source holding the most is closed for it. A
/// source that holds one already is refused as before (it has its share). Before, sources
/// holding `max_discovery_sessions_per_source` each filled the table for good.
#[test]
fn a_newcomer_always_gets_a_discovery_session() {
    let env = Env::new();
    env.call("iscsi_set_options", json!({"max_discovery_sessions": 6, "max_discovery_sessions_per_source": 3}));
    // 127.0.0.1 holds 3 (its first the longest idle), 127.0.0.2 two, 127.0.0.3 one.
    let mut held = Vec::new();
    for (n, from) in [(1, "127.0.0.1:1"), (2, "127.0.0.1:2"), (3, "127.0.0.1:3"), (4, "127.0.0.2:1"), (5, "127.0.0.2:2"), (6, "127.0.0.3:1")] {
        let (c, r) = login_from(&env, from, &discovery(n));
        r.expect("discovery within the limits");
        held.push(c);
        if n == 1 {
            // Idle longer than the others by more than a timer tick.
            std::thread::sleep(Duration::from_millis(400));
        }
    }
    assert_eq!(env.server.session_counts(), (0, 6));
    // A source that holds one: the table is full for it.
    let (_, r) = login_from(&env, "127.0.0.3:2", &discovery(7));
    let err = r.expect_err("a second discovery session from 127.0.0.3 with the table full");
    assert!(err.contains("status class 0x03, detail 0x02"), "{err}");
    // Newcomers get in: the first makes 127.0.0.1's longest-idle session give way.
    std::thread::sleep(Duration::from_millis(300));
    let (c, r) = login_from(&env, "127.0.0.4:1", &discovery(8));
    r.expect("a discovery login from a source holding none, the table full");
    held.push(c);
    eventually("the longest-idle session of the source holding the most closed", || !connected(&env, 1));
    for n in [2, 3, 4, 5, 6, 8] {
        assert!(connected(&env, n), "discovery session {n} kept");
    }
    assert_eq!(env.server.session_counts(), (0, 6));
    // Another: 127.0.0.1 and .2 hold two each now; one of theirs gives way.
    let (c, r) = login_from(&env, "[2001:db8::1]:1", &discovery(9));
    r.expect("a second newcomer");
    held.push(c);
    eventually("one more closed", || [2, 3, 4, 5].iter().filter(|n| connected(&env, **n)).count() == 3);
    assert!(connected(&env, 6) && connected(&env, 8), "sources holding one keep theirs");
    assert_eq!(env.server.session_counts(), (0, 6));
    assert_eq!(stats(&env)["refused"]["max_discovery_sessions"], 1, "only 127.0.0.3's second was refused");
    drop(held);
}

/// A discovery session the initiator leaves idle for `discovery_idle_timeout` seconds is
/// closed (and leaves the session table); a normal session idle as long is not. With 0 it
/// stays.
#[test]
fn an_idle_discovery_session_is_closed() {
    let env = Env::new();
    assert_eq!(env.call("iscsi_get_options", json!({}))["discovery_idle_timeout"], 30, "the default");
    env.call("iscsi_set_options", json!({"discovery_idle_timeout": 1}));
    let (d, r) = login(&env, 1, &discovery(1));
    r.expect("discovery");
    let (mut c, r) = login(&env, 2, &params(2, None));
    r.expect("a normal session");
    c.clear_unit_attention();
    assert_eq!(env.server.session_counts(), (1, 1));
    eventually("the idle discovery session closed", || !connected(&env, 1));
    assert_eq!(env.server.session_counts(), (1, 0));
    // The normal session, as idle, is still served.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(connected(&env, 2), "a normal session is not closed for being idle");
    good(&c.write(0, &pattern(1, BLOCK)));
    drop(d);
    // 0: never.
    env.call("iscsi_set_options", json!({"discovery_idle_timeout": 0}));
    let (d, r) = login(&env, 3, &discovery(3));
    r.expect("discovery");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(connected(&env, 3), "closed with discovery_idle_timeout 0");
    d.logout();
    c.logout();
}
