//! iSCSI over TCP during login: the portal's accept loop and the [`LoginTransport`] of one
//! accepted socket. Login PDUs are read exactly as far as the next PDU needs, so nothing of
//! full-feature phase is read here and lost; Enable_Datamover turns the socket into a
//! [`TcpDatamover`]. Reads and writes both give up at the login's deadline: an initiator that
//! stops reading (a zero window) cannot hold its login thread longer than one that stops
//! sending.

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use riser_iscsi::ffp::Datamover;
use riser_iscsi::framer::{Framer, FramerLimits};
use riser_iscsi::login::{
    EnableDatamover, LoginRx, LoginSink, LoginTransport, PortalSpec, PortalTransport, ResourceKeys, TransportError,
};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::pdu::{Digests, Pdu};

use super::{ByteStream, TcpDatamover};

/// How long the accept loop sleeps when no connection is waiting.
const ACCEPT_IDLE: Duration = Duration::from_millis(10);

/// How long a failed login's socket stays open after its last response, waiting for the
/// initiator to close first (bounded: a peer that never closes holds its login thread no
/// longer than this).
const FAILED_LINGER: Duration = Duration::from_secs(1);

/// TCP portals: one accept thread per portal.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpPortal;

impl PortalTransport for TcpPortal {
    fn kind(&self) -> Transport {
        Transport::Tcp
    }

    fn listen(&self, portal: PortalSpec, sink: Arc<dyn LoginSink>, stop: Arc<AtomicBool>) -> Result<(), String> {
        let addr = portal.addr;
        let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen: {e}"))?;
        l.set_nonblocking(true).map_err(|e| format!("cannot listen: {e}"))?;
        thread::Builder::new()
            .name(format!("portal-{}", addr.port()))
            .spawn(move || accept_loop(l, portal, sink, stop))
            .map_err(|e| format!("cannot start listener: {e}"))?;
        Ok(())
    }
}

fn accept_loop(l: TcpListener, portal: PortalSpec, sink: Arc<dyn LoginSink>, stop: Arc<AtomicBool>) {
    let addr = portal.addr;
    while !stop.load(Ordering::Acquire) {
        match l.accept() {
            Ok((sock, peer)) => {
                let local = sock.local_addr().ok();
                let _ = sock.set_nodelay(true);
                let conn = TcpLogin::new(sock, peer, local);
                if !sink.accept(portal, Box::new(conn)) {
                    // The server logged why (rate-limited); the socket closes here.
                    log::debug!("iSCSI portal {addr}: login refused; dropping {peer}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(ACCEPT_IDLE),
            Err(e) => {
                log::warn!("iSCSI portal {addr}: accept: {e}");
                thread::sleep(ACCEPT_IDLE);
            }
        }
    }
}

/// What a login needs of its byte stream beyond [`ByteStream`]: blocking writes that give up,
/// so that the login's deadline holds for sending too.
pub trait LoginStream: ByteStream {
    /// Blocking writes that give up after `timeout` (login phase).
    fn set_write_timeout(&mut self, timeout: Duration) -> io::Result<()>;
}

impl LoginStream for TcpStream {
    fn set_write_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        TcpStream::set_write_timeout(self, Some(timeout))
    }
}

/// One TCP connection during login (blocking reads and writes with the login's deadline); over
/// any [`LoginStream`] (the in-memory one of `crate::mem` in tests).
pub struct TcpLogin<S: LoginStream = TcpStream> {
    sock: S,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    framer: Framer,
    buf: Vec<u8>,
}

impl<S: LoginStream> TcpLogin<S> {
    pub fn new(sock: S, peer: SocketAddr, local: Option<SocketAddr>) -> TcpLogin<S> {
        TcpLogin { sock, peer, local, framer: Framer::with_limits(FramerLimits::LOGIN), buf: vec![0u8; 16 * 1024] }
    }
}

impl<S: LoginStream> LoginTransport for TcpLogin<S> {
    fn kind(&self) -> Transport {
        Transport::Tcp
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn local(&self) -> Option<SocketAddr> {
        self.local
    }

    fn recv_login(&mut self, deadline: Instant) -> Result<LoginRx, TransportError> {
        loop {
            match self.framer.next_pdu() {
                Ok(Some(pdu)) => return Ok(LoginRx::Pdu(pdu)),
                Ok(None) => {}
                Err(e) => {
                    let reason = e.to_string();
                    return match e.header() {
                        Some(h) => Ok(LoginRx::Malformed { header: Some(*h), reason }),
                        None => Err(TransportError::Failed(reason)),
                    };
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::TimedOut);
            }
            let _ = self.sock.set_read_timeout(deadline - now);
            // Read exactly what the next PDU needs, so nothing of full-feature phase is read
            // here and lost.
            let want = self.framer.bytes_needed().clamp(1, self.buf.len());
            match self.sock.read(&mut self.buf[..want]) {
                Ok(0) => return Err(TransportError::Closed),
                Ok(n) => self.framer.feed(&self.buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(TransportError::TimedOut)
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(TransportError::Failed(e.to_string())),
            }
        }
    }

    fn send_login(&mut self, pdu: Pdu, deadline: Instant) -> Result<(), TransportError> {
        let bytes = pdu
            .to_bytes(Digests::default())
            .map_err(|e| TransportError::Failed(format!("cannot encode response: {e}")))?;
        let mut sent = 0;
        while sent < bytes.len() {
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::TimedOut);
            }
            // Each write gives up at the deadline (a peer advertising a zero window never
            // takes the bytes); a partial write comes back and the loop checks again.
            self.sock
                .set_write_timeout(deadline - now)
                .map_err(|e| TransportError::Failed(format!("cannot set the send timeout: {e}")))?;
            match self.sock.write(&bytes[sent..]) {
                Ok(0) => return Err(TransportError::Closed),
                Ok(n) => sent += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(TransportError::TimedOut)
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(TransportError::Failed(format!("send failed: {e}"))),
            }
        }
        Ok(())
    }

    fn allocate_connection_resources(&mut self, _keys: &ResourceKeys) -> Result<(), TransportError> {
        // A byte stream needs nothing beyond its socket.
        Ok(())
    }

    fn linger(&mut self) {
        // The initiator closes first: a close from here, while it is still handling the
        // response, reaches a kernel initiator as a connection failure that races its own
        // teardown of the failed login (an oops in some Linux versions' iscsi_tcp). Whatever
        // it still sends is read and dropped; the wait ends at its FIN, an error or the bound.
        let until = Instant::now() + FAILED_LINGER;
        loop {
            let now = Instant::now();
            if now >= until || self.sock.set_read_timeout(until - now).is_err() {
                return;
            }
            match self.sock.read(&mut self.buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    fn enable_datamover(self: Box<Self>) -> Result<EnableDatamover, TransportError> {
        let sock = self.sock;
        Ok(Box::new(move || {
            let dm = TcpDatamover::new(sock, &[]).map_err(|e| TransportError::Failed(e.to_string()))?;
            Ok(Box::new(dm) as Box<dyn Datamover>)
        }))
    }
}
