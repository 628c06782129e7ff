//! rdma_cm: the event channel, connection ids, and owned connection-manager events.
//!
//! Ownership: a [`CmId`] holds its event channel (an `Arc`), so the channel is destroyed after
//! its last id; an id owns its queue pair and destroys it before itself. Events are copied out
//! and acknowledged inside [`EventChannel::poll_event`], so `rdma_destroy_id` (which waits for
//! the acks of its id's events) never waits on us.
//!
//! Threading: librdmacm fills an id's fields (device, route, addresses) while its channel's
//! events are read (ADDR_RESOLVED, ROUTE_RESOLVED). Read an id's `context()` and addresses on
//! the thread that polls its channel, or after that event was seen; for a connection request
//! they are final when the event is returned.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::unix::io::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdma_sys as sys;

use crate::cq::set_nonblocking;
use crate::device::{Context, ProtectionDomain};
use crate::error::{last_errno, RdmaError, Result};
use crate::qp::{QpInitAttr, QueuePair};

/// Owns `rdma_event_channel`; shared by the `EventChannel` handle and every id created on it.
struct ChannelInner {
    raw: NonNull<sys::rdma_event_channel>,
}

// SAFETY: librdmacm is thread safe; the channel is destroyed once, after every id on it (each
// holds an Arc of this).
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: created by rdma_create_event_channel and destroyed once; no id is left (ids
        // hold Arcs of this).
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) }
    }
}

/// An rdma_cm event channel with a non-blocking fd: poll [`Self::fd`] or call
/// [`Self::poll_event`] from the control plane's loop.
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

impl EventChannel {
    /// Fails cleanly (ENODEV, or ENOENT when the rdma_cm device file is missing) on a machine
    /// without RDMA.
    pub fn new() -> Result<Self> {
        // SAFETY: no arguments; returns NULL with errno set on failure.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("rdma_create_event_channel"))?;
        let ch = EventChannel { inner: Arc::new(ChannelInner { raw }) };
        set_nonblocking(ch.fd(), "fcntl(rdma_cm channel fd)")?;
        Ok(ch)
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel; fd never changes.
        unsafe { (*self.inner.raw.as_ptr()).fd }
    }

    /// Sleeps until an event is queued or `timeout` has passed (an interrupted wait ends
    /// early). Whether an event is queued.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let mut p = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd on this live channel's descriptor, alive for the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 {
            let errno = last_errno();
            if errno == libc::EINTR {
                return Ok(false);
            }
            return Err(RdmaError::Call { call: "poll(rdma_cm channel fd)", errno });
        }
        Ok(n > 0)
    }

    /// Takes the next event, if one is queued, copies it out and acknowledges it.
    pub fn poll_event(&self) -> Result<Option<CmEvent>> {
        let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer; the fd is non-blocking, so this returns -1
        // with EAGAIN when nothing is queued.
        let ret = unsafe { sys::rdma_get_cm_event(self.inner.raw.as_ptr(), &mut ev) };
        if ret != 0 {
            let errno = last_errno();
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return Err(RdmaError::Call { call: "rdma_get_cm_event", errno });
        }
        // SAFETY: on success `ev` is a valid event until rdma_ack_cm_event below. librdmacm
        // zeroes every event and fills `param.conn` for connected ids (all ours: port space
        // TCP); only multicast events use `param.ud` (we never join one, but skip them anyway).
        // A non-NULL private_data points at `private_data_len` bytes inside the event.
        let out = unsafe {
            let e = &*ev;
            let event_type = CmEventType::from_raw(e.event);
            let conn = &e.param.conn;
            let multicast = matches!(event_type, CmEventType::MulticastJoin | CmEventType::MulticastError);
            let private_data = if multicast || conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(conn.private_data as *const u8, conn.private_data_len as usize).to_vec()
            };
            let new_id = if event_type == CmEventType::ConnectRequest {
                // The request's id is new and ours now (rdma_destroy_id on drop).
                NonNull::new(e.id).map(|raw| CmId { raw, qp: None, channel: self.inner.clone() })
            } else {
                None
            };
            CmEvent {
                event_type,
                status: e.status,
                id: CmIdKey(e.id as u64),
                listen_id: NonNull::new(e.listen_id).map(|p| CmIdKey(p.as_ptr() as u64)),
                new_id,
                private_data,
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
            }
        };
        // SAFETY: `ev` came from rdma_get_cm_event and is acked once; nothing points into it
        // any more (private data was copied).
        if unsafe { sys::rdma_ack_cm_event(ev) } != 0 {
            log::error!("rdma_ack_cm_event failed: errno {}", last_errno());
        }
        Ok(Some(out))
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel").field("fd", &self.fd()).finish()
    }
}

/// The type of an rdma_cm event (`enum rdma_cm_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmEventType {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    MulticastJoin,
    MulticastError,
    AddrChange,
    TimewaitExit,
    Unknown(u32),
}

impl CmEventType {
    pub fn from_raw(v: u32) -> Self {
        use sys::rdma_cm_event_type::*;
        use CmEventType::*;
        match v {
            RDMA_CM_EVENT_ADDR_RESOLVED => AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => Unreachable,
            RDMA_CM_EVENT_REJECTED => Rejected,
            RDMA_CM_EVENT_ESTABLISHED => Established,
            RDMA_CM_EVENT_DISCONNECTED => Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => DeviceRemoval,
            RDMA_CM_EVENT_MULTICAST_JOIN => MulticastJoin,
            RDMA_CM_EVENT_MULTICAST_ERROR => MulticastError,
            RDMA_CM_EVENT_ADDR_CHANGE => AddrChange,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => TimewaitExit,
            other => Unknown(other),
        }
    }

    /// Events that end a connection attempt in failure.
    pub fn is_failure(self) -> bool {
        use CmEventType::*;
        matches!(self, AddrError | RouteError | ConnectError | Unreachable | Rejected | DeviceRemoval)
    }
}

/// Identifies a cm id in events: the id's address, stable while the id lives. Compare with
/// [`CmId::key`]; do not keep one past the id's drop (a new id may reuse the address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmIdKey(pub u64);

/// An rdma_cm event, copied out and already acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    pub event_type: CmEventType,
    /// The event's status (0, or a negative errno / a reject reason for failures).
    pub status: i32,
    /// The id the event is about; for CONNECT_REQUEST, the new connection's id.
    pub id: CmIdKey,
    /// CONNECT_REQUEST: the listener that got it.
    pub listen_id: Option<CmIdKey>,
    /// CONNECT_REQUEST: the new connection's id, owned by whoever takes it. Dropping it
    /// without `accept` destroys it (the peer sees a reject).
    pub new_id: Option<CmId>,
    /// The peer's private data (CONNECT_REQUEST: e.g. iSER's `iser_cm_hdr`; ESTABLISHED on
    /// the active side and REJECTED: the peer's reply). May be padded with zeros to the CM
    /// message's size.
    pub private_data: Vec<u8>,
    /// CONNECT_REQUEST: the RDMA Reads the peer can have in flight towards us as responder
    /// (its IRD): our `initiator_depth` must not exceed it.
    pub responder_resources: u8,
    /// CONNECT_REQUEST: the RDMA Reads the peer will issue (its ORD): our
    /// `responder_resources` should cover it.
    pub initiator_depth: u8,
}

/// Parameters of `rdma_connect` / `rdma_accept`.
#[derive(Clone, Copy, Debug)]
pub struct ConnParam<'a> {
    /// At most 255 bytes here; the transport allows less (56 in a RoCE/IB connect request
    /// through rdma_cm's TCP port space, 196 in the reply).
    pub private_data: &'a [u8],
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    /// Transport retries (0..=7); ignored when accepting.
    pub retry_count: u8,
    /// RNR retries (0..=7, 7 = forever).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        ConnParam { private_data: &[], responder_resources: 0, initiator_depth: 0, flow_control: 1, retry_count: 7, rnr_retry_count: 7 }
    }
}

impl ConnParam<'_> {
    /// The C struct, pointing at `self.private_data` (valid while `self` is borrowed).
    pub(crate) fn as_raw(&self, call: &'static str) -> Result<sys::rdma_conn_param> {
        if self.private_data.len() > u8::MAX as usize {
            return Err(RdmaError::invalid(call, format!("{} bytes of private data (max 255)", self.private_data.len())));
        }
        if self.retry_count > 7 || self.rnr_retry_count > 7 {
            return Err(RdmaError::invalid(call, "retry counts are 3-bit (0..=7)"));
        }
        Ok(sys::rdma_conn_param {
            private_data: if self.private_data.is_empty() { std::ptr::null() } else { self.private_data.as_ptr() as *const libc::c_void },
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        })
    }
}

/// An rdma_cm id (port space TCP, RC): a listener, or one connection with its queue pair.
pub struct CmId {
    raw: NonNull<sys::rdma_cm_id>,
    qp: Option<QueuePair>,
    channel: Arc<ChannelInner>,
}

// SAFETY: librdmacm calls are thread safe; the id is destroyed once, in Drop, after its QP.
unsafe impl Send for CmId {}
// SAFETY: as above; see the module docs for which fields librdmacm updates while events are
// read.
unsafe impl Sync for CmId {}

impl CmId {
    /// Creates an id on `channel`: its events arrive there.
    pub fn new(channel: &EventChannel) -> Result<CmId> {
        let mut raw: *mut sys::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer; context NULL (events are matched by key).
        let ret = unsafe {
            sys::rdma_create_id(channel.inner.raw.as_ptr(), &mut raw, std::ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP)
        };
        if ret != 0 {
            return Err(RdmaError::last("rdma_create_id"));
        }
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::invalid("rdma_create_id", "returned no id"))?;
        Ok(CmId { raw, qp: None, channel: channel.inner.clone() })
    }

    pub fn key(&self) -> CmIdKey {
        CmIdKey(self.raw.as_ptr() as u64)
    }

    /// The raw id, valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// Binds to a local address (port 0 picks one); binds the id to that address's device
    /// unless it is a wildcard. Fails (ENODEV / EADDRNOTAVAIL) when no RDMA device has it.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let (mut sa, _) = to_sockaddr(&addr);
        // SAFETY: live id; `sa` holds a valid sockaddr_in/in6 for the family it names.
        let ret = unsafe { sys::rdma_bind_addr(self.raw.as_ptr(), &mut sa as *mut _ as *mut libc::sockaddr) };
        check(ret, "rdma_bind_addr")
    }

    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: live id.
        let ret = unsafe { sys::rdma_listen(self.raw.as_ptr(), backlog) };
        check(ret, "rdma_listen")
    }

    /// Active side, step 1: resolves `dst` (and binds to a device); ADDR_RESOLVED follows.
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()> {
        let mut src_sa = src.map(|a| to_sockaddr(&a).0);
        let (mut dst_sa, _) = to_sockaddr(&dst);
        let src_ptr = src_sa.as_mut().map_or(std::ptr::null_mut(), |s| s as *mut _ as *mut libc::sockaddr);
        // SAFETY: live id; the sockaddrs are valid for their families and outlive the call
        // (librdmacm copies them).
        let ret = unsafe {
            sys::rdma_resolve_addr(self.raw.as_ptr(), src_ptr, &mut dst_sa as *mut _ as *mut libc::sockaddr, timeout_ms(timeout))
        };
        check(ret, "rdma_resolve_addr")
    }

    /// Active side, step 2: ROUTE_RESOLVED follows.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        // SAFETY: live id.
        let ret = unsafe { sys::rdma_resolve_route(self.raw.as_ptr(), timeout_ms(timeout)) };
        check(ret, "rdma_resolve_route")
    }

    /// Active side, step 3 (after create_qp): ESTABLISHED (or REJECTED / UNREACHABLE) follows.
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut raw = param.as_raw("rdma_connect")?;
        // SAFETY: live id; `raw` points at private data borrowed for this call (the kernel
        // copies it).
        let ret = unsafe { sys::rdma_connect(self.raw.as_ptr(), &mut raw) };
        check(ret, "rdma_connect")
    }

    /// Passive side: accepts the connection request this id came from. Create the QP and
    /// post its first receive before calling this (iser-wire.md, connection setup step 2).
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut raw = param.as_raw("rdma_accept")?;
        // SAFETY: live id; private data borrowed for the call and copied by the kernel.
        let ret = unsafe { sys::rdma_accept(self.raw.as_ptr(), &mut raw) };
        check(ret, "rdma_accept")
    }

    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > u8::MAX as usize {
            return Err(RdmaError::invalid("rdma_reject", "more than 255 bytes of private data"));
        }
        let p = if private_data.is_empty() { std::ptr::null() } else { private_data.as_ptr() as *const libc::c_void };
        // SAFETY: live id; `p` is NULL or `len` readable bytes, copied by the kernel.
        let ret = unsafe { sys::rdma_reject(self.raw.as_ptr(), p, private_data.len() as u8) };
        check(ret, "rdma_reject")
    }

    /// Starts the disconnect; the QP moves to the error state and outstanding requests flush.
    /// DISCONNECTED follows on both sides.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: live id.
        let ret = unsafe { sys::rdma_disconnect(self.raw.as_ptr()) };
        check(ret, "rdma_disconnect")
    }

    /// The device context the id is bound to (None before binding / address resolution, e.g. a
    /// wildcard listener). Memory and CQs for this id's QP must come from this context.
    pub fn context(&self) -> Result<Option<Arc<Context>>> {
        // SAFETY: live id; `verbs` is set by librdmacm once the id is bound to a device.
        let verbs = unsafe { (*self.raw.as_ptr()).verbs };
        if verbs.is_null() {
            return Ok(None);
        }
        Context::from_cm(verbs).map(Some)
    }

    /// The port of the device the id is bound to (0 when unbound).
    pub fn port_num(&self) -> u8 {
        // SAFETY: live id; plain integer field.
        unsafe { (*self.raw.as_ptr()).port_num }
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; the union's storage arm covers every address librdmacm stores.
        let st = unsafe { &(*self.raw.as_ptr()).route.addr.src_addr_union.src_storage };
        from_sockaddr(st)
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as for local_addr.
        let st = unsafe { &(*self.raw.as_ptr()).route.addr.dst_addr_union.dst_storage };
        from_sockaddr(st)
    }

    /// Creates the id's RC queue pair (`rdma_create_qp`). `pd` and the CQs must belong to
    /// [`Self::context`]. The id owns the QP; see [`QueuePair`] for the teardown rule.
    pub fn create_qp(&mut self, pd: &Arc<ProtectionDomain>, attr: &QpInitAttr) -> Result<&QueuePair> {
        let call = "rdma_create_qp";
        if self.qp.is_some() {
            return Err(RdmaError::invalid(call, "the id already has a QP"));
        }
        // SAFETY: live id; plain pointer field.
        let verbs = unsafe { (*self.raw.as_ptr()).verbs };
        if verbs.is_null() {
            return Err(RdmaError::invalid(call, "the id is not bound to a device yet"));
        }
        if verbs != pd.context().as_raw() {
            return Err(RdmaError::invalid(call, "the PD belongs to another device context than the id (use CmId::context)"));
        }
        let qp = QueuePair::create(self.raw.as_ptr(), pd, attr)?;
        Ok(self.qp.insert(qp))
    }

    pub fn qp(&self) -> Option<&QueuePair> {
        self.qp.as_ref()
    }

    /// Destroys the QP now (drain it first); the id stays.
    pub fn destroy_qp(&mut self) {
        if let Some(qp) = self.qp.take() {
            // SAFETY: the id's QP was created by rdma_create_qp on this id and is destroyed
            // once; its CQs/PD stay alive until `qp` (holding their Arcs) drops below.
            unsafe { sys::rdma_destroy_qp(self.raw.as_ptr()) };
            drop(qp);
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        self.destroy_qp();
        // SAFETY: created by rdma_create_id (or handed over by a CONNECT_REQUEST) and destroyed
        // once, after its QP; every event of it we read was acked, so this does not wait on
        // us. The channel (our Arc) is released only after this, by field drop.
        let ret = unsafe { sys::rdma_destroy_id(self.raw.as_ptr()) };
        if ret != 0 {
            log::error!("rdma_destroy_id failed: errno {}", last_errno());
        }
        let _ = &self.channel;
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId").field("key", &self.key()).field("qp", &self.qp).finish()
    }
}

fn check(ret: i32, call: &'static str) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(RdmaError::last(call))
    }
}

fn timeout_ms(t: Duration) -> i32 {
    t.as_millis().min(i32::MAX as u128) as i32
}

/// A `SocketAddr` as the C sockaddr librdmacm takes (`sockaddr_in` / `sockaddr_in6` inside a
/// `sockaddr_storage`), with its length.
pub(crate) fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain bytes: all-zero is valid (AF_UNSPEC).
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for every sockaddr type.
            unsafe { std::ptr::write(&mut st as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write(&mut st as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (st, len as libc::socklen_t)
}

/// The address in a `sockaddr_storage`, if it is IPv4 or IPv6.
pub(crate) fn from_sockaddr(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match st.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in; storage is aligned and
            // large enough for it.
            let sin = unsafe { &*(st as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &*(st as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trips() {
        for s in ["127.0.0.1:3260", "192.0.2.1:0", "[::1]:3260", "[fe80::1%2]:4420"] {
            let a: SocketAddr = s.parse().unwrap();
            let (st, len) = to_sockaddr(&a);
            assert_eq!(from_sockaddr(&st), Some(a), "{s}");
            let want = if a.is_ipv4() { 16 } else { 28 };
            assert_eq!(len as usize, want);
        }
        // The port is stored big-endian, as the kernel expects.
        let (st, _) = to_sockaddr(&"10.1.2.3:3260".parse().unwrap());
        // SAFETY: test: the storage holds a sockaddr_in.
        let sin = unsafe { &*(&st as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_port, 3260u16.to_be());
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 1, 2, 3]);
        // SAFETY: all-zero storage is AF_UNSPEC.
        let unspec: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_sockaddr(&unspec), None);
    }

    #[test]
    fn event_type_decoding() {
        for v in 0..=15u32 {
            assert!(!matches!(CmEventType::from_raw(v), CmEventType::Unknown(_)));
        }
        assert_eq!(CmEventType::from_raw(4), CmEventType::ConnectRequest);
        assert_eq!(CmEventType::from_raw(9), CmEventType::Established);
        assert_eq!(CmEventType::from_raw(10), CmEventType::Disconnected);
        assert_eq!(CmEventType::from_raw(15), CmEventType::TimewaitExit);
        assert_eq!(CmEventType::from_raw(16), CmEventType::Unknown(16));
        assert!(CmEventType::Rejected.is_failure());
        assert!(!CmEventType::Established.is_failure());
    }

    #[test]
    fn conn_param_as_raw() {
        let pd = [0x80u8 | 0x40, 0, 0, 0];
        let p = ConnParam { private_data: &pd, responder_resources: 4, initiator_depth: 8, ..Default::default() };
        let raw = p.as_raw("rdma_accept").unwrap();
        assert_eq!(raw.private_data_len, 4);
        assert_eq!(raw.private_data as *const u8, pd.as_ptr());
        assert_eq!((raw.responder_resources, raw.initiator_depth), (4, 8));
        assert_eq!((raw.retry_count, raw.rnr_retry_count), (7, 7));

        let empty = ConnParam::default().as_raw("rdma_connect").unwrap();
        assert!(empty.private_data.is_null());
        assert_eq!(empty.private_data_len, 0);

        let big = [0u8; 256];
        assert!(ConnParam { private_data: &big, ..Default::default() }.as_raw("rdma_connect").is_err());
        assert!(ConnParam { retry_count: 8, ..Default::default() }.as_raw("rdma_connect").is_err());
    }

    #[test]
    fn cm_layouts_match_c() {
        // Measured from rdma-core 44's <rdma/rdma_cma.h> with gcc; rdma-sys writes the event
        // and address structs by hand.
        assert_eq!(std::mem::size_of::<sys::rdma_cm_event>(), 80);
        assert_eq!(std::mem::size_of::<sys::rdma_cm_id>(), 416);
        assert_eq!(std::mem::size_of::<sys::rdma_addr>(), 296);
        assert_eq!(std::mem::size_of::<sys::rdma_conn_param>(), 24);
    }

    /// On a host without RDMA every step fails with an error, never a panic; with a device
    /// (the soft-RoCE VM), a wildcard-free listener on 127.0.0.1 may still fail (rxe on `lo`
    /// is not reachable through rdma_cm), so only "no panic" holds there.
    #[test]
    fn listener_on_loopback_without_devices_fails_cleanly() {
        let attempt = || -> Result<(CmId, EventChannel)> {
            let ch = EventChannel::new()?;
            let id = CmId::new(&ch)?;
            id.bind_addr("127.0.0.1:0".parse().unwrap())?;
            id.listen(8)?;
            Ok((id, ch))
        };
        let r = attempt();
        match &r {
            Ok(_) => eprintln!("listener on 127.0.0.1 came up (an RDMA device is present)"),
            Err(e) => eprintln!("listener on 127.0.0.1: clean error: {e}"),
        }
        if crate::devices().map(|d| d.is_empty()).unwrap_or(true) {
            assert!(r.is_err(), "no RDMA device, yet a listener came up");
        }
    }

    #[test]
    fn event_channel_creation_is_ok_or_clean_error() {
        match EventChannel::new() {
            Ok(ch) => {
                assert!(ch.fd() >= 0);
                // Nothing queued: a non-blocking poll returns None at once.
                assert!(ch.poll_event().unwrap().is_none());
            }
            Err(e) => {
                eprintln!("rdma_create_event_channel: clean error: {e}");
                assert_eq!(e.call(), "rdma_create_event_channel");
            }
        }
    }
}
