//! What the scenario tests share: a target on one reactor behind an in-memory portal
//! ([`Env`]) and one initiator session on it ([`Client`], riser-initiator's [`PduSession`]).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use riser_bdev::BdevRegistry;
use riser_config::IscsiTarget;
use riser_datamover::mem::{MemClient, MemPortal};
use riser_iscsi::pdu::{logout, Lun, Pdu};
use riser_iscsi::serial::Itt;
use riser_initiator::scsi::{rw_cdb, Dir};
use riser_initiator::session::{
    Completed, Event, KeyNegotiation, LoginParams, Negotiated, PduSession, Proposal, Unsolicited, INITIATOR_NAME,
};
use riser_reactor::{PollMode, ReactorConfig, ReactorSet};
use riser_rpc::RpcRegistry;
use riser_server::IscsiServer;
use serde_json::{json, Value};

pub const PORTAL: &str = "127.0.0.1:3260";
pub const TARGET: &str = "iqn.2016-06.io.riser:disk1";
pub const BLOCK: usize = 512;
/// How long any one answer may take before the scenario fails.
pub const WAIT: Duration = Duration::from_secs(5);

/// A target with one malloc LUN (1 MiB, 512-byte blocks) behind an in-memory portal, served
/// by one reactor in adaptive mode (it sleeps when idle).
pub struct Env {
    reactors: Option<ReactorSet>,
    pub server: Arc<IscsiServer>,
    pub portal: MemPortal,
    pub rpc: RpcRegistry,
    _target: Arc<IscsiTarget>,
}

impl Env {
    pub fn new() -> Env {
        Env::serving(None, PORTAL)
    }

    /// The same target behind riser's real TCP portal on `addr` (127.0.0.1:PORT).
    pub fn tcp(addr: &str) -> Env {
        Env::serving(Some(Arc::new(riser_datamover::TcpPortal)), addr)
    }

    /// Behind the TCP portal on `addr`, its LUN a file (`path`, 1 MiB, created) on riser's
    /// io_uring engine instead of RAM.
    pub fn tcp_file(addr: &str, path: &std::path::Path) -> Env {
        std::fs::File::create(path).and_then(|f| f.set_len((2048 * BLOCK) as u64)).expect("the LUN's file");
        let bdev = json!({"name": "Malloc0", "filename": path.to_string_lossy(), "block_size": BLOCK});
        Env::serving_bdev(Some(Arc::new(riser_datamover::TcpPortal)), addr, ("bdev_uring_create", bdev))
    }

    /// The usual target over the in-memory portal, its LUN a null device (reads zeros,
    /// discards writes) of the same size, still named Malloc0.
    pub fn null() -> Env {
        let null = json!({"name": "Malloc0", "num_blocks": 2048, "block_size": BLOCK});
        Env::serving_bdev(None, PORTAL, ("bdev_null_create", null))
    }

    fn serving(transport: Option<Arc<dyn riser_iscsi::login::PortalTransport>>, addr: &str) -> Env {
        let malloc = json!({"name": "Malloc0", "num_blocks": 2048, "block_size": BLOCK});
        Env::serving_bdev(transport, addr, ("bdev_malloc_create", malloc))
    }

    /// The target with its one LUN made by `bdev` (an RPC and its params; named Malloc0).
    fn serving_bdev(transport: Option<Arc<dyn riser_iscsi::login::PortalTransport>>, addr: &str, bdev: (&str, Value)) -> Env {
        let reactors = ReactorSet::start(ReactorConfig { cores: vec![0], mode: PollMode::Adaptive, ring_size: 1024, pin: false })
            .expect("reactors");
        let bdevs = Arc::new(Mutex::new(BdevRegistry::new()));
        let target = Arc::new(IscsiTarget::new(bdevs.clone()));
        let portal = MemPortal::default();
        let transport = transport.unwrap_or_else(|| Arc::new(portal.clone()));
        let server = IscsiServer::new(target.clone(), reactors.handle(), vec![transport]);
        let mut rpc = RpcRegistry::new();
        riser_bdev::rpc::register(&mut rpc, &bdevs);
        riser_config::rpc::register(&mut rpc, target.clone());
        riser_server::rpc::register(&mut rpc, &server);
        let env = Env { reactors: Some(reactors), server, portal, rpc, _target: target };
        env.call(bdev.0, bdev.1);
        let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
        env.call("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": host, "port": port}]}));
        env.call("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
        env.call(
            "iscsi_create_target_node",
            json!({"name": "disk1", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
                   "luns": [{"bdev_name": "Malloc0", "lun_id": 0}], "queue_depth": 32}),
        );
        env
    }

    /// The usual target, its LUN's device exported by a group of gateways (`group`, issue
    /// 23): `Malloc0` with the group attached, before the node is created.
    pub fn grouped(group: riser_bdev::GatewayGroupHandle) -> Env {
        let reactors = ReactorSet::start(ReactorConfig { cores: vec![0], mode: PollMode::Adaptive, ring_size: 1024, pin: false })
            .expect("reactors");
        let bdevs = Arc::new(Mutex::new(BdevRegistry::new()));
        {
            let mut b = bdevs.lock().expect("bdevs");
            let name = b.create_malloc(Some("Malloc0"), 2048, BLOCK as u32, None).expect("malloc");
            let inner = b.get(&name).expect("Malloc0");
            b.delete(&name, None).expect("delete");
            b.register(riser_bdev::testing::GroupedBdev::new(inner, group)).expect("register");
        }
        let target = Arc::new(IscsiTarget::new(bdevs.clone()));
        let portal = MemPortal::default();
        let server = IscsiServer::new(target.clone(), reactors.handle(), vec![Arc::new(portal.clone())]);
        let mut rpc = RpcRegistry::new();
        riser_bdev::rpc::register(&mut rpc, &bdevs);
        riser_config::rpc::register(&mut rpc, target.clone());
        riser_server::rpc::register(&mut rpc, &server);
        let env = Env { reactors: Some(reactors), server, portal, rpc, _target: target };
        let (host, port) = PORTAL.rsplit_once(':').expect("HOST:PORT");
        env.call("iscsi_create_portal_group", json!({"tag": 1, "portals": [{"host": host, "port": port}]}));
        env.call("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
        env.call(
            "iscsi_create_target_node",
            json!({"name": "disk1", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}],
                   "luns": [{"bdev_name": "Malloc0", "lun_id": 0}], "queue_depth": 32}),
        );
        env
    }

    pub fn call(&self, method: &str, params: Value) -> Value {
        self.rpc.call(method, params).unwrap_or_else(|e| panic!("{method}: {e:?}"))
    }

    /// A new connection from initiator port `n` (its own address).
    pub fn connect(&self, n: u8) -> MemClient {
        let from: SocketAddr = format!("127.0.0.{}:{}", 10 + n, 40000 + n as u16).parse().expect("address");
        self.portal.connect(from, PORTAL.parse().expect("portal")).expect("connect")
    }

    /// The server's live connections, as `iscsi_get_connections` shows them.
    pub fn connections(&self) -> Vec<Value> {
        match self.call("iscsi_get_connections", json!({})) {
            Value::Array(v) => v,
            other => panic!("iscsi_get_connections: {other}"),
        }
    }

    /// Waits until the server has `n` connections.
    pub fn wait_connections(&self, n: usize) {
        let deadline = Instant::now() + WAIT;
        while self.connections().len() != n {
            assert!(Instant::now() < deadline, "expected {n} connection(s), have {:?}", self.connections());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.server.shutdown();
        if let Some(r) = self.reactors.take() {
            r.shutdown();
        }
    }
}

/// How a test client moves whole PDUs: the in-memory pipe, or a real TCP socket.
pub trait Wire {
    fn send(&mut self, pdu: &Pdu) -> std::io::Result<()>;
    /// The next PDU, `None` once the target closed.
    fn recv(&mut self, timeout: Duration) -> std::io::Result<Option<Pdu>>;
}

impl Wire for MemClient {
    fn send(&mut self, pdu: &Pdu) -> std::io::Result<()> {
        MemClient::send(self, pdu)
    }
    fn recv(&mut self, timeout: Duration) -> std::io::Result<Option<Pdu>> {
        MemClient::recv(self, timeout)
    }
}

/// A client's TCP connection, PDUs cut by riser-iscsi's framer.
pub struct TcpWire {
    sock: std::net::TcpStream,
    framer: riser_iscsi::framer::Framer,
}

impl TcpWire {
    pub fn connect(addr: SocketAddr) -> TcpWire {
        let sock = std::net::TcpStream::connect(addr).expect("connect");
        let _ = sock.set_nodelay(true);
        let limits = riser_iscsi::framer::FramerLimits { max_recv_data_segment_length: 1 << 24, max_ahs_length: 1020 };
        TcpWire { sock, framer: riser_iscsi::framer::Framer::with_limits(limits) }
    }
}

impl Wire for TcpWire {
    fn send(&mut self, pdu: &Pdu) -> std::io::Result<()> {
        use std::io::Write;
        let bytes = pdu.to_bytes(Default::default()).map_err(|e| std::io::Error::other(e.to_string()))?;
        self.sock.write_all(&bytes)
    }
    fn recv(&mut self, timeout: Duration) -> std::io::Result<Option<Pdu>> {
        use std::io::Read;
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 64 * 1024];
        loop {
            match self.framer.next_pdu() {
                Ok(Some(p)) => return Ok(Some(p)),
                Ok(None) => {}
                Err(e) => return Err(std::io::Error::other(e.to_string())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.sock.set_read_timeout(Some(left))?;
            match self.sock.read(&mut buf)? {
                0 => return Ok(None),
                n => self.framer.feed(&buf[..n]),
            }
        }
    }
}

/// One initiator session on one connection (in memory unless said otherwise).
pub struct Client<W: Wire = MemClient> {
    pub s: PduSession,
    pub c: W,
}

/// Keys for a scenario: TCP defaults with these data-transfer keys.
pub fn keys(immediate_data: bool, initial_r2t: bool, first_burst: u32) -> Proposal {
    Proposal { immediate_data, initial_r2t, first_burst, max_burst: 65536, max_recv_dsl: 8192, ..Proposal::tcp(false, false) }
}

impl Client {
    /// Connects as initiator port `n` (ISID ends in `n`) and logs in with `proposal`.
    pub fn login(env: &Env, n: u8, proposal: Proposal) -> (Client, Negotiated) {
        Client::login_over(env.connect(n), n, proposal)
    }
}

impl<W: Wire> Client<W> {
    /// Logs in over `wire` as initiator port `n` (ISID ends in `n`) with `proposal`.
    pub fn login_over(wire: W, n: u8, proposal: Proposal) -> (Client<W>, Negotiated) {
        let mut c = Client { s: PduSession::new(format!("client {n}"), Lun(0)), c: wire };
        let params = LoginParams::normal(INITIATOR_NAME, TARGET, [0x80, 0, 0, 0, 0, n]);
        let neg = c.login_as(&params, proposal).expect("login");
        c.clear_unit_attention();
        (c, neg)
    }

    /// TEST UNIT READY until GOOD: a new I_T nexus first sees POWER ON, RESET, OR BUS
    /// DEVICE RESET OCCURRED (and a reset leaves its unit attention), as initiators expect.
    pub fn clear_unit_attention(&mut self) {
        for _ in 0..3 {
            let (itt, pdus) = self.s.scsi_command(&[0u8; 6], 0, &[], Unsolicited::Negotiated).expect("TEST UNIT READY");
            self.send(pdus);
            let done = self.completion(itt);
            if done.status == 0 {
                return;
            }
            assert_eq!(done.sense.map(|s| s.key), Some(0x06), "only UNIT ATTENTION before GOOD: {done:?}");
        }
        panic!("TEST UNIT READY never became GOOD");
    }

    pub fn login_as(&mut self, params: &LoginParams, proposal: Proposal) -> Result<Negotiated, String> {
        let c = &mut self.c;
        self.s.login_via(params, KeyNegotiation::with_proposal(proposal), |req| {
            c.send(&req).map_err(|e| e.to_string())?;
            c.recv(WAIT).map_err(|e| e.to_string())?.ok_or_else(|| "closed during login".to_string())
        })
    }

    pub fn send(&mut self, pdus: impl IntoIterator<Item = Pdu>) {
        for p in pdus {
            self.c.send(&p).expect("send");
        }
    }

    /// The next PDU's meaning; panics if none comes in time or the target closed.
    pub fn next(&mut self) -> Event {
        let pdu = self.c.recv(WAIT).expect("a PDU in time").expect("the target closed the connection");
        self.s.receive(&pdu).unwrap_or_else(|e| panic!("{e}: {pdu:?}"))
    }

    /// Reads events, answering R2Ts and pings, until `want` picks one.
    pub fn until<T>(&mut self, mut want: impl FnMut(&Event) -> Option<T>) -> T {
        loop {
            let ev = self.next();
            if let Some(t) = want(&ev) {
                return t;
            }
            match ev {
                Event::R2t { reply, .. } => self.send(reply),
                Event::Ping { reply } => self.send([reply]),
                _ => {}
            }
        }
    }

    /// Waits for task `itt` to complete.
    pub fn completion(&mut self, itt: Itt) -> Completed {
        self.until(|e| match e {
            Event::Complete(c) if c.itt == itt => Some(c.clone()),
            _ => None,
        })
    }

    pub fn write(&mut self, lba: u64, data: &[u8]) -> Completed {
        let (itt, pdus) = self.s.write(&rw_cdb(Dir::Write, lba, (data.len() / BLOCK) as u32), data).expect("write");
        self.send(pdus);
        self.completion(itt)
    }

    pub fn read(&mut self, lba: u64, len: usize) -> Completed {
        let (itt, pdu) = self.s.read(&rw_cdb(Dir::Read, lba, (len / BLOCK) as u32), len as u32).expect("read");
        self.send([pdu]);
        self.completion(itt)
    }

    /// Logs out (closing the session) and checks the target answers and closes.
    pub fn logout(mut self) {
        let (itt, pdu) = self.s.logout(logout::CLOSE_SESSION);
        self.send([pdu]);
        let response = self.until(|e| match e {
            Event::Logout { itt: i, response, .. } if *i == itt => Some(*response),
            _ => None,
        });
        assert_eq!(response, 0, "logout response");
        assert!(matches!(self.c.recv(WAIT), Ok(None)), "the target closes after the Logout Response");
    }
}

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub fn good(c: &Completed) {
    assert_eq!((c.response, c.status), (0, 0), "status of {:?}: sense {:?}", c.itt, c.sense);
}

