//! Registered memory (`ibv_mr`) and scatter/gather elements.
//!
//! The memory-safety rule this module keeps: a registered buffer is released only after
//! `ibv_dereg_mr` has returned success. Deregistration revokes the lkey and rkey in the device,
//! so no DMA (a local receive, a peer's RDMA Write) can reach the buffer after that; a work
//! request still outstanding on it completes with an error instead (a protection / access
//! error, and the QP goes to the error state). If deregistration fails the buffer is leaked on
//! purpose, never freed under the device.
//!
//! What stays the caller's job (it is a correctness rule, not a memory-safety one): drain a QP
//! (disconnect or [`crate::QueuePair::set_error`], then poll until every outstanding work
//! request has completed or flushed) before dropping the regions it uses, or the connection
//! fails with protection errors.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use crate::device::ProtectionDomain;
use crate::error::{RdmaError, Result};

/// Access rights of a memory region (`IBV_ACCESS_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    /// Local writes (receives, RDMA Read responses land here). Required by remote write.
    pub const LOCAL_WRITE: Access = Access(sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    pub const REMOTE_WRITE: Access = Access(sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    pub const REMOTE_READ: Access = Access(sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    pub const REMOTE_ATOMIC: Access = Access(sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// What riser's buffer pools use: local write + remote read + remote write.
    pub const DATA: Access = Access(
        Self::LOCAL_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_WRITE.0,
    );

    pub const fn bits(self) -> u32 {
        self.0
    }

    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// One scatter/gather element: `length` bytes at `addr` under `lkey` (an `ibv_sge`).
///
/// Any value is safe to post: the device checks the address range against the region the lkey
/// names and fails the work request otherwise. Build them with [`MemoryRegion::sge`] to get
/// the bounds checked here instead.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Sge(pub(crate) sys::ibv_sge);

impl Sge {
    pub const fn new(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge(sys::ibv_sge { addr, length, lkey })
    }
    pub const fn addr(&self) -> u64 {
        self.0.addr
    }
    pub const fn length(&self) -> u32 {
        self.0.length
    }
    pub const fn lkey(&self) -> u32 {
        self.0.lkey
    }
}

impl std::fmt::Debug for Sge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sge {{ addr: {:#x}, length: {}, lkey: {:#x} }}", self.addr(), self.length(), self.lkey())
    }
}

impl PartialEq for Sge {
    fn eq(&self, o: &Sge) -> bool {
        self.addr() == o.addr() && self.length() == o.length() && self.lkey() == o.lkey()
    }
}
impl Eq for Sge {}

/// Checks that `[offset, offset + len)` lies inside a region of `total` bytes and that `len`
/// fits an SGE's 32-bit length.
pub(crate) fn check_range(call: &'static str, total: usize, offset: usize, len: usize) -> Result<()> {
    let end = offset.checked_add(len).ok_or_else(|| RdmaError::invalid(call, "offset + len overflows"))?;
    if end > total {
        return Err(RdmaError::invalid(
            call,
            format!("range {offset}..{end} outside the {total}-byte region"),
        ));
    }
    if len > u32::MAX as usize {
        return Err(RdmaError::invalid(call, format!("length {len} does not fit an SGE (u32)")));
    }
    Ok(())
}

/// A registered buffer. Owns both the `ibv_mr` and the memory; see the module docs for the
/// rule that makes posting work requests on it memory safe.
pub struct MemoryRegion {
    mr: NonNull<sys::ibv_mr>,
    /// The buffer, taken out of its Box: the device may write it at any time, so no Rust
    /// reference to it is kept.
    ptr: NonNull<u8>,
    len: usize,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the region owns its buffer (a raw Box) and its ibv_mr; verbs objects are thread
// safe. Writes through Rust go through `&mut self` (`write_at`) or the `unsafe` accessors.
unsafe impl Send for MemoryRegion {}
// SAFETY: `&self` methods only read the buffer (copying out) or hand out keys/addresses.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `buf` (a `Vec<u8>` or `Box<[u8]>`) with `access` (usually [`Access::DATA`]).
    /// The region keeps the memory alive until it is dropped or [`Self::into_inner`] is called.
    pub fn register(pd: &Arc<ProtectionDomain>, buf: impl Into<Box<[u8]>>, access: Access) -> Result<Self> {
        let buf: Box<[u8]> = buf.into();
        let len = buf.len();
        if len == 0 {
            return Err(RdmaError::invalid("ibv_reg_mr", "cannot register an empty buffer"));
        }
        let ptr = NonNull::new(Box::into_raw(buf) as *mut u8).expect("Box pointer is never null");
        // SAFETY: `ptr` points to `len` bytes we own (taken out of the Box above) and keep
        // allocated until the MR is deregistered; `pd` is a live PD.
        let mr = unsafe {
            sys::ibv_reg_mr(pd.as_raw(), ptr.as_ptr() as *mut libc::c_void, len, access.bits() as libc::c_int)
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(MemoryRegion { mr, ptr, len, pd: pd.clone() }),
            None => {
                let err = RdmaError::last("ibv_reg_mr");
                // SAFETY: registration failed, so the device never saw the buffer; rebuild the
                // Box from the pointer and length it was taken apart into.
                drop(unsafe { rebuild_box(ptr, len) });
                Err(err)
            }
        }
    }

    /// Allocates and registers `len` zeroed bytes.
    pub fn zeroed(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> Result<Self> {
        Self::register(pd, vec![0u8; len], access)
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: `self.mr` is a live MR; lkey is set at registration and never changes.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The STag a peer uses for RDMA Read/Write of this region.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The region's first byte as the virtual address work requests and peers use.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// An SGE for `len` bytes at `offset`, bounds-checked.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        check_range("MemoryRegion::sge", self.len, offset, len)?;
        Ok(Sge::new(self.addr() + offset as u64, len as u32, self.lkey()))
    }

    /// Copies `dst.len()` bytes from `offset` out of the region. Meaningful only while no work
    /// request writing these bytes is outstanding (otherwise the bytes are whatever the device
    /// has written so far).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range("MemoryRegion::read_at", self.len, offset, dst.len())?;
        // SAFETY: the range is inside our live buffer (checked); `dst` is a distinct Rust
        // buffer; a raw copy creates no reference into memory the device may write.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the region at `offset`.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        check_range("MemoryRegion::write_at", self.len, offset, src.len())?;
        // SAFETY: range checked; `&mut self` excludes other Rust access; `src` cannot overlap
        // the region's buffer, which no safe reference ever points into.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Zero-copy view of `[offset, offset + len)`.
    ///
    /// # Safety
    /// No work request that writes these bytes (a posted receive, an RDMA Read into them, a
    /// peer's RDMA Write to this region) may be outstanding while the slice lives, and no
    /// `slice_mut` of an overlapping range may exist.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> Result<&[u8]> {
        check_range("MemoryRegion::slice", self.len, offset, len)?;
        // SAFETY: range checked; the caller guarantees nothing writes the bytes meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }

    /// Zero-copy mutable view of `[offset, offset + len)`.
    ///
    /// # Safety
    /// No work request that reads or writes these bytes may be outstanding while the slice
    /// lives, and no other slice of an overlapping range may exist.
    #[allow(clippy::mut_from_ref)] // the buffer is shared with the device, not owned by &self
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        check_range("MemoryRegion::slice_mut", self.len, offset, len)?;
        // SAFETY: range checked; the caller guarantees exclusive access for the slice's life.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }

    /// Deregisters and hands the buffer back. On failure the buffer stays registered and is
    /// leaked (it cannot be freed safely) and the error is returned.
    pub fn into_inner(self) -> Result<Box<[u8]>> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this.mr` is live and deregistered exactly once (Drop will not run).
        let ret = unsafe { sys::ibv_dereg_mr(this.mr.as_ptr()) };
        // SAFETY: read the Arc out of the ManuallyDrop once, so the PD reference is released.
        let _pd: Arc<ProtectionDomain> = unsafe { std::ptr::read(&this.pd) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_dereg_mr", ret));
        }
        // SAFETY: deregistered, so the device can no longer reach the buffer; the pointer and
        // length are those the Box was taken apart into.
        Ok(unsafe { rebuild_box(this.ptr, this.len) })
    }
}

/// # Safety
/// `ptr`/`len` must come from `Box::<[u8]>::into_raw` of a box of `len` bytes, not yet rebuilt.
unsafe fn rebuild_box(ptr: NonNull<u8>, len: usize) -> Box<[u8]> {
    // SAFETY: guaranteed by the caller.
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len)) }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: live MR, deregistered exactly once.
        let ret = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if ret == 0 {
            // SAFETY: deregistered: no DMA can reach the buffer any more; pointer and length
            // are those the Box was taken apart into.
            drop(unsafe { rebuild_box(self.ptr, self.len) });
        } else {
            log::error!(
                "ibv_dereg_mr failed (errno {ret}); leaking {} bytes at {:#x} rather than freeing them under the device",
                self.len,
                self.addr()
            );
        }
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

/// The registration domain of `pd` in riser-buf's terms ([`riser_buf::IoBuf::reg_key`]): the
/// address of its `ibv_pd`. Unique while the PD lives, and every registration holds the PD.
pub fn iobuf_domain(pd: &ProtectionDomain) -> usize {
    pd.as_raw() as usize
}

/// Registers the whole mapping of `buf` ([`riser_buf::IoBuf::mapping_ptr`],
/// [`riser_buf::IoBuf::capacity`]) with `pd` and records the registration in the buffer, so
/// that work requests can name the buffer's own memory (zero copy); returns the lkey. A buffer
/// whose mapping is registered with `pd` already (pooled mappings keep their registrations
/// from one I/O to the next) costs nothing: its key is returned.
///
/// The registration lives with the mapping, not with the I/O: riser-buf drops it (here:
/// `ibv_dereg_mr`) before the memory is unmapped, and it holds an `Arc` of `pd`, so the PD
/// outlives every registration made with it. A device being removed is therefore held until
/// the buffers registered with its PD are unmapped (`riser_buf::Pool::trim`).
pub fn register_iobuf(pd: &Arc<ProtectionDomain>, buf: &mut riser_buf::IoBuf, access: Access) -> Result<u32> {
    let domain = iobuf_domain(pd);
    if let Some(key) = buf.reg_key(domain) {
        return Ok(key);
    }
    let len = buf.capacity();
    if len == 0 {
        return Err(RdmaError::invalid("ibv_reg_mr", "cannot register an empty buffer"));
    }
    let ptr = buf.mapping_ptr();
    if ptr.is_null() {
        // A vector adopted without copying (IoBuf::from_vec) has no mapping to register.
        return Err(RdmaError::invalid("ibv_reg_mr", "the buffer is not a pooled mapping"));
    }
    // SAFETY: `ptr` and `len` are the buffer's whole mapping (riser-buf's contract for
    // mapping_ptr/capacity), which stays mapped until the guard recorded below is dropped:
    // riser-buf drops a mapping's registrations before unmapping it and never while a buffer
    // of it is in use. `pd` is a live PD.
    let mr = unsafe { sys::ibv_reg_mr(pd.as_raw(), ptr as *mut libc::c_void, len, access.bits() as libc::c_int) };
    let mr = NonNull::new(mr).ok_or_else(|| RdmaError::last("ibv_reg_mr"))?;
    // SAFETY: `mr` was just returned by ibv_reg_mr; lkey is set at registration.
    let lkey = unsafe { (*mr.as_ptr()).lkey };
    buf.add_registration(domain, lkey, Box::new(IoBufRegistration { mr, _pd: pd.clone() }));
    Ok(lkey)
}

/// A registration of part of an I/O buffer for one transfer, not kept with the mapping:
/// dropping it deregisters (`ibv_dereg_mr`), which revokes its key in the device, so a peer
/// that learns the key can use it only while the transfer it was made for runs. riser's iSER
/// datamover registers the sink of each RDMA Read on iWARP this way (the sink must allow
/// remote write there; see [`register_iobuf_range`]).
pub struct TransferRegistration {
    mr: NonNull<sys::ibv_mr>,
    addr: u64,
    len: usize,
    /// The PD outlives the MR (ibv_dealloc_pd fails while MRs exist).
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the registration only holds the MR to read its keys and deregister it once, from
// whichever thread drops it; verbs objects are thread safe.
unsafe impl Send for TransferRegistration {}
// SAFETY: `&self` methods only read the keys, set at registration and never changed.
unsafe impl Sync for TransferRegistration {}

impl TransferRegistration {
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live MR; lkey is set at registration and never changes.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The key a peer would name (on iWARP the same STag as the lkey).
    pub fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The first registered byte's address (the registration's base VA).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for TransferRegistration {
    fn drop(&mut self) {
        // SAFETY: a live MR, deregistered exactly once. Should deregistration fail, the pages
        // stay pinned by the kernel for the MR, so the device never reaches memory reused by
        // anyone else (as for IoBufRegistration).
        let ret = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if ret != 0 {
            log::error!("ibv_dereg_mr of a transfer registration failed (errno {ret}); its key stays valid and its pages pinned");
        }
    }
}

impl std::fmt::Debug for TransferRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferRegistration")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .finish()
    }
}

/// Registers `len` bytes of `buf` from `offset` (within its length) with `pd` under `access`,
/// for one transfer: the registration is returned, not recorded in the buffer, and ends when
/// it is dropped. Drop it once the work requests naming it have completed, before the buffer
/// goes back to its pool.
///
/// Memory safety does not depend on that order: the kernel pins the pages for the MR, so
/// should the buffer be unmapped first, the device still reaches only those pinned pages
/// (freed at deregistration), never memory the process or anyone else reuses.
pub fn register_iobuf_range(
    pd: &Arc<ProtectionDomain>,
    buf: &mut riser_buf::IoBuf,
    offset: usize,
    len: usize,
    access: Access,
) -> Result<TransferRegistration> {
    check_range("register_iobuf_range", buf.len(), offset, len)?;
    if len == 0 {
        return Err(RdmaError::invalid("ibv_reg_mr", "cannot register an empty range"));
    }
    let base = buf.mapping_ptr();
    if base.is_null() {
        return Err(RdmaError::invalid("ibv_reg_mr", "the buffer is not a pooled mapping"));
    }
    // SAFETY: `base + offset .. + len` lies inside the buffer's mapping (checked against its
    // length, which is at most its capacity); `pd` is a live PD. The kernel pins the pages
    // for the MR's life (see above).
    let ptr = unsafe { base.add(offset) };
    // SAFETY: as above.
    let mr = unsafe { sys::ibv_reg_mr(pd.as_raw(), ptr as *mut libc::c_void, len, access.bits() as libc::c_int) };
    let mr = NonNull::new(mr).ok_or_else(|| RdmaError::last("ibv_reg_mr"))?;
    Ok(TransferRegistration { mr, addr: ptr as u64, len, _pd: pd.clone() })
}

/// The process's soft `RLIMIT_MEMLOCK` in bytes; None when unlimited (or unreadable).
/// Memory registered with an RDMA device is pinned against it: always on soft-iWARP (siw
/// checks the limit whatever the process's capabilities), otherwise unless the process has
/// `CAP_IPC_LOCK`.
pub fn memlock_limit() -> Option<u64> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    let ret = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    (ret == 0 && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur)
}

/// Unmaps the I/O buffers riser-buf keeps for reuse ([`riser_buf::Pool::trim`] of the
/// global pool), dropping the registrations they carry and the PDs those hold. After a
/// device removal that is what lets the device go: a PD kept by an idle buffer keeps the
/// device's context open, and soft-RoCE's removal waits for every context to close.
/// Buffers in use keep theirs until they come back (call it again then).
pub fn release_idle_iobuf_registrations() {
    riser_buf::Pool::global().trim();
}

/// An `ibv_mr` over an [`riser_buf::IoBuf`]'s mapping, owned by that mapping (riser-buf
/// keeps it as the registration's guard): dropping it deregisters.
struct IoBufRegistration {
    mr: NonNull<sys::ibv_mr>,
    /// The PD outlives the MR (ibv_dealloc_pd fails while MRs exist).
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the guard only holds the MR to deregister it once, from whichever thread drops it;
// verbs objects are thread safe.
unsafe impl Send for IoBufRegistration {}
// SAFETY: no `&self` method touches the MR.
unsafe impl Sync for IoBufRegistration {}

impl Drop for IoBufRegistration {
    fn drop(&mut self) {
        // SAFETY: a live MR, deregistered exactly once. riser-buf drops this guard before it
        // unmaps the memory, so the memory is still mapped here. Should deregistration fail,
        // the pages stay pinned by the kernel for the MR, so the device can never reach memory
        // reused by anyone else after the unmapping.
        let ret = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        if ret != 0 {
            log::error!("ibv_dereg_mr of an I/O buffer failed (errno {ret}); its pages stay pinned");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits_match_verbs() {
        assert_eq!(Access::LOCAL_WRITE.bits(), 1);
        assert_eq!(Access::REMOTE_WRITE.bits(), 2);
        assert_eq!(Access::REMOTE_READ.bits(), 4);
        assert_eq!(Access::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(Access::DATA.bits(), 7);
        assert!(Access::DATA.contains(Access::REMOTE_READ));
        assert!(!Access::DATA.contains(Access::REMOTE_ATOMIC));
        assert_eq!((Access::LOCAL_WRITE | Access::REMOTE_READ).bits(), 5);
    }

    #[test]
    fn sge_is_an_ibv_sge() {
        assert_eq!(std::mem::size_of::<Sge>(), 16);
        assert_eq!(std::mem::size_of::<Sge>(), std::mem::size_of::<sys::ibv_sge>());
        let s = Sge::new(0x1000, 512, 0x42);
        assert_eq!((s.addr(), s.length(), s.lkey()), (0x1000, 512, 0x42));
    }

    #[test]
    fn memlock_limit_reads_the_soft_limit() {
        let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct we pass.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) }, 0);
        let want = (rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur);
        assert_eq!(memlock_limit(), want);
    }

    /// A transfer registration covers the range asked for, in the buffer's own memory, and
    /// ends when dropped (on a machine with an RDMA device; without one there is nothing to
    /// register with, but the range is still checked first).
    #[test]
    fn transfer_registration_covers_its_range_and_ends_when_dropped() {
        let pool: &'static riser_buf::Pool = Box::leak(Box::new(riser_buf::Pool::new(riser_buf::MIN_MAX_BYTES)));
        let Ok(names) = crate::devices() else { return };
        let Some(name) = names.first() else { return };
        let ctx = crate::Context::open(name).expect("open the device");
        let pd = ProtectionDomain::new(&ctx).expect("a PD");
        let mut b = pool.alloc(3 * 4096);
        assert!(register_iobuf_range(&pd, &mut b, 4096, 3 * 4096, Access::LOCAL_WRITE).is_err(), "beyond the buffer");
        let r = register_iobuf_range(&pd, &mut b, 4096, 8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE).expect("ibv_reg_mr");
        assert_eq!((r.addr(), r.len()), (b.as_ptr() as u64 + 4096, 8192));
        assert_eq!(b.reg_key(iobuf_domain(&pd)), None, "not kept with the mapping");
        assert_eq!(Arc::strong_count(&pd), 2);
        drop(r);
        assert_eq!(Arc::strong_count(&pd), 1, "deregistered");
    }

    #[test]
    fn range_checks() {
        assert!(check_range("t", 4096, 0, 4096).is_ok());
        assert!(check_range("t", 4096, 4096, 0).is_ok());
        assert!(check_range("t", 4096, 1, 4096).is_err());
        assert!(check_range("t", 4096, usize::MAX, 2).is_err());
        let big = u32::MAX as usize + 1;
        assert!(check_range("t", usize::MAX, 0, big).is_err());
        let e = check_range("MemoryRegion::sge", 100, 90, 20).unwrap_err();
        assert_eq!(e.call(), "MemoryRegion::sge");
    }

    /// On a machine with an RDMA device (the soft-RoCE VM), an I/O buffer is registered once
    /// per PD, the key travels with its pooled mapping, and the MR goes when the mapping is
    /// unmapped. Without a device (this machine, CI) there is nothing to register with.
    #[test]
    fn iobuf_registration_travels_with_the_mapping() {
        let Ok(names) = crate::devices() else { return };
        let Some(name) = names.first() else { return };
        let ctx = crate::Context::open(name).expect("open the device");
        let pd = ProtectionDomain::new(&ctx).expect("a PD");
        let pool: &'static riser_buf::Pool = Box::leak(Box::new(riser_buf::Pool::new(riser_buf::MIN_MAX_BYTES)));
        let mut b = pool.alloc(5000);
        let key = register_iobuf(&pd, &mut b, Access::LOCAL_WRITE).expect("ibv_reg_mr");
        assert_eq!(b.reg_key(iobuf_domain(&pd)), Some(key));
        assert_eq!(register_iobuf(&pd, &mut b, Access::LOCAL_WRITE).unwrap(), key, "registered once");
        drop(b);
        let b = pool.alloc(8192);
        assert_eq!(b.reg_key(iobuf_domain(&pd)), Some(key), "the reused mapping is registered already");
        drop(b);
        assert_eq!(Arc::strong_count(&pd), 2, "the registration holds the PD");
        pool.trim();
        assert_eq!(Arc::strong_count(&pd), 1, "unmapping deregistered it");
        let mut e = pool.alloc(0);
        assert!(register_iobuf(&pd, &mut e, Access::LOCAL_WRITE).is_err());
    }
}
