//! The login phase of RFC 5047's Datamover Interface: what a transport (TCP, iSER, the
//! in-memory one of the tests) offers the one login driver, next to the full-feature
//! [`Datamover`].
//!
//! A [`PortalTransport`] listens on a portal and hands every new connection, as a
//! [`LoginTransport`], to a [`LoginSink`] (the server). The login driver then exchanges Login
//! PDUs through it, asks it for Allocate_Connection_Resources once the login has got past any
//! security stage (never before: the rule against denial of service), and finally calls
//! Enable_Datamover, which consumes the login transport and yields the connection's
//! [`Datamover`] for full-feature phase.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;

use crate::ffp::Datamover;
use crate::negotiate::Transport;
use crate::pdu::{LoginStatus, Op, Pdu, BHS_LEN};
use crate::serial::Itt;

use super::{Fail, Login, LoginOutput, State};

/// Why a login transport gave up. The driver logs it and drops the connection.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TransportError {
    /// The initiator closed the connection (or the link / device went away).
    #[error("closed by the initiator")]
    Closed,
    /// Nothing arrived, or what was sent was not taken, before the login's deadline.
    #[error("timed out")]
    TimedOut,
    /// The transport cannot go on (I/O error, unparseable stream, no resources); the text says
    /// what happened.
    #[error("{0}")]
    Failed(String),
}

/// What [`LoginTransport::recv_login`] got.
#[derive(Debug)]
pub enum LoginRx {
    /// A Login (or other) PDU for the login state machine.
    Pdu(Pdu),
    /// A PDU that could not be decoded. With its header the state machine answers it (a
    /// Login Response with Initiator Error); without, the driver logs it and waits for more.
    Malformed { header: Option<[u8; BHS_LEN]>, reason: String },
}

/// What Allocate_Connection_Resources (RFC 5047 §7.1) may size its resources by: the values
/// known for the connection when the login reaches operational negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceKeys {
    /// Commands the target lets the session have outstanding (its queue depth).
    pub queue_depth: u32,
}

/// One connection during login, on any transport (RFC 5047's login-phase primitives).
pub trait LoginTransport: Send {
    /// The transport, as negotiation needs it (iSER has its own keys and limits).
    fn kind(&self) -> Transport;
    /// The initiator's address.
    fn peer(&self) -> SocketAddr;
    /// The target portal's address the connection came in on, if known.
    fn local(&self) -> Option<SocketAddr>;
    /// The reactor whose resources the connection already uses (an iSER QP completes on that
    /// reactor's CQ): a new session goes there. None: the server picks.
    fn reactor_hint(&self) -> Option<usize> {
        None
    }
    /// Waits, at most until `deadline`, for the next PDU of the login (Receive_Login_PDU).
    fn recv_login(&mut self, deadline: Instant) -> Result<LoginRx, TransportError>;
    /// Sends a Login Response (Send_Control during login), giving up with
    /// [`TransportError::TimedOut`] at `deadline` (the login's own): an initiator that does not
    /// read must not hold the login past its deadline. The transport sees from the PDU
    /// whether it is the last one (final status or transit to full-feature phase).
    fn send_login(&mut self, pdu: Pdu, deadline: Instant) -> Result<(), TransportError>;
    /// Allocate_Connection_Resources: called once, when the login got past any security
    /// stage, before the final Login Response.
    fn allocate_connection_resources(&mut self, keys: &ResourceKeys) -> Result<(), TransportError>;
    /// Enable_Datamover: the final Login Response is out; the connection becomes a
    /// [`Datamover`] for full-feature phase, built by the returned [`EnableDatamover`] on the
    /// reactor that will own it.
    fn enable_datamover(self: Box<Self>) -> Result<EnableDatamover, TransportError>;
    /// The login failed and its last response was sent: let it reach the initiator before the
    /// connection is dropped (best effort).
    fn linger(&mut self) {}
}

/// The second half of Enable_Datamover, run on the reactor that will own the connection: it
/// yields the connection's datamover there (a datamover belongs to one reactor and need not be
/// `Send`; what it is built from is).
pub type EnableDatamover = Box<dyn FnOnce() -> Result<Box<dyn Datamover>, TransportError> + Send>;

/// A portal, as the server tells a transport's listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortalSpec {
    pub addr: SocketAddr,
    /// The Target Portal Group Tag of the portal's group.
    pub portal_group_tag: u16,
}

/// The server's side of a listener: takes new connections and places them on reactors.
pub trait LoginSink: Send + Sync {
    /// A new connection arrived on `portal`: the sink runs its login. False: refused (too many
    /// logins in progress, in all or from its address; the sink logs why); the listener drops
    /// the connection.
    fn accept(&self, portal: PortalSpec, conn: Box<dyn LoginTransport>) -> bool;
    /// Whether a connection from `peer` would be accepted now (the limits on logins in
    /// progress, in all and from its source). A transport that spends resources on a
    /// connection before [`Self::accept`] (an iSER QP, CQ entries and a registered login
    /// buffer) asks first, so that a source at its limit costs it nothing and cannot crowd
    /// out other sources; a refusal is logged by the sink. A yes reserves nothing: `accept`
    /// decides. Default: yes.
    fn may_accept(&self, peer: SocketAddr) -> bool {
        let _ = peer;
        true
    }
    /// The most logins the sink runs at once (`max_logins`), None: it does not say. A
    /// transport's own cap on connections logging in should not be lower, or it would refuse
    /// what the sink's limits allow.
    fn max_logins(&self) -> Option<usize> {
        None
    }
    /// The reactor a connection that is about to log in should be prepared for.
    fn place(&self) -> usize;
    /// Runs `poller` on reactor `reactor`, once per pass, until it says [`PollerStatus::Done`]
    /// (then drops it there): how a transport's per-reactor object (an iSER completion queue)
    /// is owned and polled by that reactor alone. False: the reactor is stopping (the poller
    /// is dropped).
    fn attach_poller(&self, reactor: usize, poller: ReactorPoller) -> bool;
}

/// What a poller attached with [`LoginSink::attach_poller`] says after one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollerStatus {
    Busy,
    Idle,
    Done,
}

/// A transport's poller for a reactor (see [`LoginSink::attach_poller`]).
pub type ReactorPoller = Box<dyn FnMut() -> PollerStatus + Send>;

/// A transport's listeners: TCP's accept loop, iSER's RDMA CM portal.
pub trait PortalTransport: Send + Sync {
    /// Which transport this listens for.
    fn kind(&self) -> Transport;
    /// Starts listening on `portal` (in a thread of its own); runs until `stop` is set.
    fn listen(&self, portal: PortalSpec, sink: Arc<dyn LoginSink>, stop: Arc<AtomicBool>) -> Result<(), String>;
}

impl Login {
    /// Allocate_Connection_Resources failed (RFC 5047 §7.1): the login ends with `status`
    /// (Target Error / Out of Resources, 0x0302) answering the Login Request `itt`, instead of
    /// whatever it had queued; the caller sends that response and closes.
    pub fn resources_failed(&mut self, itt: Itt, status: LoginStatus, reason: impl Into<String>) {
        // Responses not sent yet give way to the failure, which takes the first one's StatSN.
        let mut stat_sn = None;
        for out in self.output.drain(..) {
            if let LoginOutput::Transmit(p) = out {
                if let Op::LoginResponse(r) = p.op() {
                    stat_sn.get_or_insert(r.stat_sn);
                }
            }
        }
        if let Some(sn) = stat_sn {
            self.stat_sn = sn;
        }
        if self.state != State::Failed {
            self.fail(itt, None, Fail(status, reason.into()));
        }
    }
}
