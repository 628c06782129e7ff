//! Verbs devices: the device list, a device `Context` and its `ProtectionDomain`.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use rdma_sys as sys;

use crate::error::{last_errno, RdmaError, Result};

/// Names of the verbs devices the kernel exposes (`rxe0`, `mlx5_0`, ...).
///
/// A kernel without RDMA support (no `/sys/class/infiniband_verbs`) is reported as no devices,
/// not as an error: libibverbs fails such a listing with ENOSYS.
pub fn devices() -> Result<Vec<String>> {
    let list = match DeviceList::get() {
        Ok(l) => l,
        Err(RdmaError::Call { errno, .. }) if errno == libc::ENOSYS || errno == libc::ENODEV => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e),
    };
    Ok(list.iter().map(device_name).collect())
}

/// Has librdmacm re-read the device list so that it lets go of devices that are gone; returns
/// how many devices it still lists.
///
/// librdmacm opens a device's context for the first rdma_cm id bound to it and keeps it open
/// after the last id is destroyed, until it notices that the device was removed, which it only
/// does when it re-reads the device list (`rdma_get_devices`, or binding an id to a device it
/// does not know yet). A device whose driver cannot take user contexts away (soft-RoCE: no
/// `disassociate_ucontext`) cannot finish unregistering while any process holds a context on
/// it: `rdma link delete` waits in `ib_uverbs_remove_one`. So after an
/// RDMA_CM_EVENT_DEVICE_REMOVAL, drop every id, QP, CQ, PD and [`Context`] of that device and
/// call this (before is fine too: librdmacm then closes the context when its last user goes).
///
/// librdmacm 44 skips the re-read when no device is left at all (it keeps its stale list), so
/// with the removed device being the only one, the context stays open until another device
/// appears and this is called again.
pub fn refresh_cm_devices() -> Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the call returns NULL or a NULL-terminated array of
    // librdmacm's contexts, each with its reference count raised until rdma_free_devices.
    let list = unsafe { sys::rdma_get_devices(&mut n) };
    match NonNull::new(list) {
        Some(list) => {
            // SAFETY: the array came from rdma_get_devices and is freed once, right here.
            unsafe { sys::rdma_free_devices(list.as_ptr()) };
            Ok(n.max(0) as usize)
        }
        None => match last_errno() {
            libc::ENODEV | libc::ENOSYS | libc::ENOENT | 0 => Ok(0),
            errno => Err(RdmaError::Call { call: "rdma_get_devices", errno }),
        },
    }
}

/// The array `ibv_get_device_list` returns, freed on drop.
struct DeviceList {
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the call returns NULL or a NULL-terminated array
        // of `n` devices that stays valid until ibv_free_device_list.
        let raw = unsafe { sys::ibv_get_device_list(&mut n) };
        match NonNull::new(raw) {
            Some(list) => Ok(DeviceList { list, len: n.max(0) as usize }),
            None => Err(RdmaError::last("ibv_get_device_list")),
        }
    }

    fn iter(&self) -> impl Iterator<Item = *mut sys::ibv_device> + '_ {
        // SAFETY: the array holds `len` valid device pointers (see `get`) and lives as long as
        // `self`, which the iterator borrows.
        (0..self.len).map(move |i| unsafe { *self.list.as_ptr().add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once; contexts opened
        // from its devices stay valid after this (libibverbs refcounts the devices).
        unsafe { sys::ibv_free_device_list(self.list.as_ptr()) }
    }
}

fn device_name(dev: *mut sys::ibv_device) -> String {
    // SAFETY: `dev` is a live device of a live list; the name is a NUL-terminated string
    // inside the device struct (or NULL, handled).
    unsafe {
        let p = sys::ibv_get_device_name(dev);
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// A verbs device context (`ibv_context`).
///
/// Two kinds, one type:
/// - [`Context::open`] opens a device by name (`ibv_open_device`) and closes it on drop: for
///   tools that only query or register memory;
/// - the context of an rdma_cm id ([`crate::CmId::context`]) is librdmacm's own context for
///   that device. A queue pair created through rdma_cm must use a protection domain of *that*
///   context, so the datamover gets its contexts from its cm ids. Such a `Context` holds a
///   reference on librdmacm's device list (`rdma_get_devices`) so the context cannot be closed
///   under it, and the same `Arc<Context>` is handed out for the same device while one is alive.
///
/// Drop order is enforced by `Arc`s: every PD, CQ and completion channel holds its context.
pub struct Context {
    raw: NonNull<sys::ibv_context>,
    owner: Owner,
    name: String,
}

enum Owner {
    /// From ibv_open_device: ibv_close_device on drop.
    Opened,
    /// librdmacm's context; we hold the `rdma_get_devices` array to pin it.
    RdmaCm(NonNull<*mut sys::ibv_context>),
}

// SAFETY: libibverbs contexts are thread safe (every verb may be called from any thread); the
// struct only holds pointers to objects libibverbs owns and frees on drop exactly once.
unsafe impl Send for Context {}
// SAFETY: as above; no method mutates Rust-side state.
unsafe impl Sync for Context {}

/// Contexts handed out for rdma_cm devices, so one device gets one `Arc<Context>`.
static CM_CONTEXTS: Mutex<Vec<(usize, Weak<Context>)>> = Mutex::new(Vec::new());

impl Context {
    /// Opens the verbs device named `name` (as listed by [`devices`]).
    pub fn open(name: &str) -> Result<Arc<Context>> {
        let list = DeviceList::get()?;
        let dev = list
            .iter()
            .find(|d| device_name(*d) == name)
            .ok_or_else(|| RdmaError::NoSuchDevice(name.to_string()))?;
        // SAFETY: `dev` is a device of the live list `list`.
        let raw = unsafe { sys::ibv_open_device(dev) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_open_device"))?;
        Ok(Arc::new(Context { raw, owner: Owner::Opened, name: name.to_string() }))
    }

    /// The context librdmacm uses for `verbs` (an rdma_cm id's `verbs` field).
    pub(crate) fn from_cm(verbs: *mut sys::ibv_context) -> Result<Arc<Context>> {
        let key = verbs as usize;
        let mut cache = CM_CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(_, w)| w.strong_count() > 0);
        if let Some(ctx) = cache.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
            return Ok(ctx);
        }
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the call returns NULL or a NULL-terminated array
        // of librdmacm's device contexts, each with its reference count raised until
        // rdma_free_devices.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| RdmaError::last("rdma_get_devices"))?;
        // SAFETY: the array holds `n` context pointers followed by NULL.
        let found = (0..n.max(0) as usize).any(|i| unsafe { *list.as_ptr().add(i) } == verbs);
        if !found {
            // SAFETY: the array came from rdma_get_devices and is freed once.
            unsafe { sys::rdma_free_devices(list.as_ptr()) };
            return Err(RdmaError::invalid("rdma_get_devices", "cm id's device is not in librdmacm's list"));
        }
        let raw = NonNull::new(verbs).expect("checked non-null by the caller's list match");
        // SAFETY: `raw` is a live context (librdmacm's, pinned by `list`); its device pointer
        // is valid for the context's life.
        let name = device_name(unsafe { (*raw.as_ptr()).device });
        let ctx = Arc::new(Context { raw, owner: Owner::RdmaCm(list), name });
        cache.push((key, Arc::downgrade(&ctx)));
        Ok(ctx)
    }

    /// The device's name (`rxe0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the device is iWARP (siw, hardware iWARP) rather than InfiniBand or RoCE. On
    /// iWARP the memory an RDMA Read lands in must allow remote write.
    pub fn is_iwarp(&self) -> bool {
        // SAFETY: `self.raw` is a live context; its device pointer is valid for its life.
        let t = unsafe { (*(*self.raw.as_ptr()).device).transport_type };
        t == sys::ibv_transport_type::IBV_TRANSPORT_IWARP
    }

    /// The raw context, for calls this crate does not wrap. Using it is `unsafe`; it stays
    /// valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.raw.as_ptr()
    }

    /// Device limits (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: ibv_device_attr is plain data (integers and a char array): all-zero is valid.
        let mut a: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `self.raw` is a live context and `a` a valid out-struct.
        let ret = unsafe { sys::ibv_query_device(self.raw.as_ptr(), &mut a) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_query_device", ret));
        }
        Ok(DeviceAttr::from_raw(&a))
    }

    /// Port attributes (`ibv_query_port`); ports count from 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: ibv_port_attr is plain integers: all-zero is valid.
        let mut a: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-struct of the size the provider is told.
        let ret = unsafe { sys::___ibv_query_port(self.raw.as_ptr(), port, &mut a) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_query_port", ret));
        }
        Ok(PortAttr {
            state: PortState::from_raw(a.state),
            max_mtu: mtu_bytes(a.max_mtu),
            active_mtu: mtu_bytes(a.active_mtu),
            gid_tbl_len: a.gid_tbl_len,
            max_msg_sz: a.max_msg_sz,
            lid: a.lid,
            link_layer: LinkLayer::from_raw(a.link_layer),
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        match self.owner {
            Owner::Opened => {
                // SAFETY: opened by ibv_open_device and closed once; every PD/CQ/channel holds
                // an Arc of this context, so none is left.
                let ret = unsafe { sys::ibv_close_device(self.raw.as_ptr()) };
                if ret != 0 {
                    log::error!("ibv_close_device({}) failed: errno {}", self.name, last_errno());
                }
            }
            Owner::RdmaCm(list) => {
                // SAFETY: the array came from rdma_get_devices and is freed once; librdmacm
                // keeps or closes its context by its own reference count.
                unsafe { sys::rdma_free_devices(list.as_ptr()) }
            }
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).field("raw", &self.raw).finish()
    }
}

/// The limits the datamover sizes its queues by (a subset of `ibv_device_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    /// Node GUID as the device reports it (big-endian on the wire, shown as a number here).
    pub node_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_mr_size: u64,
    pub max_qp: i32,
    pub max_qp_wr: i32,
    pub max_sge: i32,
    /// SGEs per RDMA Read work request (often lower than `max_sge`).
    pub max_sge_rd: i32,
    pub max_cq: i32,
    pub max_cqe: i32,
    pub max_mr: i32,
    pub max_pd: i32,
    /// RDMA Reads a QP can have outstanding as responder (our IRD).
    pub max_qp_rd_atom: i32,
    /// RDMA Reads a QP can have outstanding as initiator (our ORD).
    pub max_qp_init_rd_atom: i32,
    pub max_res_rd_atom: i32,
    pub max_srq: i32,
    pub max_srq_wr: i32,
    pub max_srq_sge: i32,
    pub max_mw: i32,
    pub phys_port_cnt: u8,
    pub device_cap_flags: u32,
}

impl DeviceAttr {
    fn from_raw(a: &sys::ibv_device_attr) -> Self {
        let fw: Vec<u8> = a.fw_ver.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: u64::from_be(a.node_guid),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_mr_size: a.max_mr_size,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_sge: a.max_sge,
            max_sge_rd: a.max_sge_rd,
            max_cq: a.max_cq,
            max_cqe: a.max_cqe,
            max_mr: a.max_mr,
            max_pd: a.max_pd,
            max_qp_rd_atom: a.max_qp_rd_atom,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom,
            max_res_rd_atom: a.max_res_rd_atom,
            max_srq: a.max_srq,
            max_srq_wr: a.max_srq_wr,
            max_srq_sge: a.max_srq_sge,
            max_mw: a.max_mw,
            phys_port_cnt: a.phys_port_cnt,
            device_cap_flags: a.device_cap_flags,
        }
    }
}

/// A port's state and MTU (a subset of `ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    /// Bytes (256..4096); 0 if the device reported an unknown MTU.
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: i32,
    pub max_msg_sz: u32,
    pub lid: u16,
    pub link_layer: LinkLayer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown(u32),
}

impl PortState {
    pub fn from_raw(v: u32) -> Self {
        use sys::ibv_port_state::*;
        match v {
            IBV_PORT_NOP => PortState::Nop,
            IBV_PORT_DOWN => PortState::Down,
            IBV_PORT_INIT => PortState::Init,
            IBV_PORT_ARMED => PortState::Armed,
            IBV_PORT_ACTIVE => PortState::Active,
            IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            other => PortState::Unknown(other),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    Unspecified,
    InfiniBand,
    /// RoCE (and soft-RoCE, rxe).
    Ethernet,
    Unknown(u8),
}

impl LinkLayer {
    pub fn from_raw(v: u8) -> Self {
        // IBV_LINK_LAYER_* are #defines that bindgen does not carry: 0, 1, 2 in verbs.h.
        match v {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            other => LinkLayer::Unknown(other),
        }
    }
}

/// `enum ibv_mtu` to bytes; 0 for a value verbs.h does not define.
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

/// A protection domain (`ibv_pd`). Memory regions and queue pairs hold an `Arc` of it, so it is
/// deallocated only after all of them.
pub struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread safe; the PD is only freed in Drop, after every holder of
// its Arc is gone.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; no Rust-side mutation.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: `ctx` is a live context.
        let raw = unsafe { sys::ibv_alloc_pd(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::last("ibv_alloc_pd"))?;
        Ok(Arc::new(ProtectionDomain { raw, ctx: ctx.clone() }))
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw PD, valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd and freed once; MRs and QPs hold Arcs of this PD,
        // so none is left.
        let ret = unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
        if ret != 0 {
            log::error!("ibv_dealloc_pd failed: errno {}", ret);
        }
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain").field("device", &self.ctx.name()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_is_empty_or_clean_error() {
        // On this kind of host (no RDMA in the kernel) this is an empty list; in the soft-RoCE
        // VM it lists rxe0. Either way: no panic.
        match devices() {
            Ok(list) => eprintln!("verbs devices: {list:?}"),
            Err(e) => eprintln!("devices() error (clean): {e}"),
        }
    }

    #[test]
    fn refresh_cm_devices_is_a_count_or_clean_error() {
        // No RDMA here: 0 (librdmacm reports ENODEV) or a clean error; rxe0 in the VM: 1.
        match refresh_cm_devices() {
            Ok(n) => eprintln!("librdmacm lists {n} device(s)"),
            Err(e) => eprintln!("refresh_cm_devices() error (clean): {e}"),
        }
    }

    #[test]
    fn opening_a_missing_device_is_an_error() {
        let e = Context::open("riser-no-such-device").unwrap_err();
        assert!(
            matches!(e, RdmaError::NoSuchDevice(_) | RdmaError::Call { .. }),
            "unexpected error {e:?}"
        );
    }

    #[test]
    fn mtu_and_port_decoding() {
        assert_eq!(mtu_bytes(sys::ibv_mtu::IBV_MTU_256), 256);
        assert_eq!(mtu_bytes(sys::ibv_mtu::IBV_MTU_1024), 1024);
        assert_eq!(mtu_bytes(sys::ibv_mtu::IBV_MTU_4096), 4096);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(9), 0);
        assert_eq!(PortState::from_raw(sys::ibv_port_state::IBV_PORT_ACTIVE), PortState::Active);
        assert_eq!(PortState::from_raw(77), PortState::Unknown(77));
        assert_eq!(LinkLayer::from_raw(2), LinkLayer::Ethernet);
    }
}
