//! The [`IoBuf`] type: an owned, page-aligned buffer that goes back to its [`Pool`] when
//! dropped, and the per-thread spare vectors of [`IoBuf::from_vec`] buffers ([`take_vec`]).

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;

use crate::{Mapping, Pool, Registration};

/// An owned, page-aligned I/O buffer of `len()` bytes (its mapping may be larger: the size
/// class). Its contents are unspecified when it comes from [`IoBuf::alloc`] (a reused
/// buffer holds old data): whoever fills it fills all of it, or uses [`IoBuf::zeroed`].
///
/// Small (32 bytes: it moves by value through every queue of the data path): what is rare
/// or per mapping (its pool, the account charged, the reserve held, its registrations)
/// lives in the pooled [`Mapping`], boxed once when mapped and reused with it.
pub struct IoBuf {
    pub(crate) backing: Backing,
    pub(crate) len: usize,
}

/// What holds an [`IoBuf`]'s bytes.
pub(crate) enum Backing {
    /// A pooled mapping (boxed: it goes back to its pool, box and all, for the next I/O).
    Map(Box<Mapping>),
    /// A vector adopted without copying ([`IoBuf::from_vec`]); its length is the buffer's
    /// capacity. An empty buffer holds an empty vector (which allocates nothing).
    Heap(Vec<u8>),
}

/// Most vectors a thread keeps for [`take_vec`].
const MAX_SPARE_VECS: usize = 64;

thread_local! {
    /// Vectors of dropped [`IoBuf::from_vec`] buffers, for this thread's next segments.
    static SPARE_VECS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty vector with room for `cap` bytes: one this thread's dropped
/// [`IoBuf::from_vec`] buffers left behind if one is big enough, else a new one. With
/// [`IoBuf::from_vec`] it lets a data segment become an I/O buffer and come back as the next
/// segment without allocating or copying.
pub fn take_vec(cap: usize) -> Vec<u8> {
    let reused = SPARE_VECS
        .try_with(|s| {
            let mut s = s.borrow_mut();
            let i = s.iter().rposition(|v| v.capacity() >= cap)?;
            Some(s.swap_remove(i))
        })
        .ok()
        .flatten();
    reused.unwrap_or_else(|| Vec::with_capacity(cap))
}

/// Largest vector kept as a spare: bigger ones are freed (spares stay small).
pub const MAX_SPARE_VEC: usize = 256 * 1024;

fn keep_vec(mut v: Vec<u8>) {
    if v.capacity() > MAX_SPARE_VEC {
        return;
    }
    v.clear();
    let _ = SPARE_VECS.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < MAX_SPARE_VECS {
            s.push(v);
        }
    });
}

impl IoBuf {
    /// An unbudgeted buffer of `len` bytes from the global pool, contents unspecified.
    pub fn alloc(len: usize) -> IoBuf {
        Pool::global().alloc(len)
    }

    /// An unbudgeted buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> IoBuf {
        let mut b = IoBuf::alloc(len);
        b.fill_zero();
        b
    }

    /// Makes the buffer's `len()` bytes zero. A pooled mapping remembers how many of its
    /// leading bytes are zero (all of a new one; what the last fill zeroed), until a mutable
    /// slice, a pointer or a registration of it is handed out ([`as_mut_slice`],
    /// [`as_ptr`], [`mapping_ptr`], [`add_registration`]): only the rest is written. A null
    /// device's reads cost no memset once their buffers are zero, and still never show
    /// another I/O's data.
    ///
    /// [`as_mut_slice`]: Self::as_mut_slice
    /// [`as_ptr`]: Self::as_ptr
    /// [`mapping_ptr`]: Self::mapping_ptr
    /// [`add_registration`]: Self::add_registration
    pub fn fill_zero(&mut self) {
        let len = self.len;
        match &mut self.backing {
            Backing::Map(m) => {
                let known = m.zeroed.get_mut();
                if *known < len {
                    m.map[*known..len].fill(0);
                    *known = len;
                }
            }
            Backing::Heap(v) => v[..len].fill(0),
        }
    }

    /// How many leading bytes of the mapping are known to be zero (see
    /// [`fill_zero`](Self::fill_zero)); 0 for a buffer that is not pooled.
    pub fn known_zero(&self) -> usize {
        match &self.backing {
            Backing::Map(m) => m.zeroed.load(Ordering::Relaxed),
            Backing::Heap(_) => 0,
        }
    }

    /// An unbudgeted buffer holding a copy of `data`.
    pub fn copy_from(data: &[u8]) -> IoBuf {
        let mut b = IoBuf::alloc(data.len());
        b.copy_from_slice(data);
        b
    }

    /// An empty buffer (maps nothing).
    pub fn empty() -> IoBuf {
        IoBuf { backing: Backing::Heap(Vec::new()), len: 0 }
    }

    /// Adopts `v` as an I/O buffer without copying it (a received data segment that is the
    /// whole of a write). Such a buffer is not page-aligned and cannot be registered
    /// ([`mapping_ptr`](Self::mapping_ptr) is null); when dropped, its vector goes to this
    /// thread's spares ([`take_vec`]).
    pub fn from_vec(v: Vec<u8>) -> IoBuf {
        IoBuf { len: v.len(), backing: Backing::Heap(v) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes mapped for this buffer (its size class).
    pub fn capacity(&self) -> usize {
        match &self.backing {
            Backing::Map(m) => m.len(),
            Backing::Heap(v) => v.len(),
        }
    }

    /// The start of the whole mapping ([`capacity`](Self::capacity) bytes), for registering
    /// it with a device; null for an empty buffer.
    pub fn mapping_ptr(&mut self) -> *mut u8 {
        match &mut self.backing {
            Backing::Map(m) => {
                *m.zeroed.get_mut() = 0;
                m.map.as_mut_ptr()
            }
            Backing::Heap(_) => std::ptr::null_mut(),
        }
    }

    /// The key (an RDMA lkey) this buffer's mapping is registered under with `domain`
    /// (an RDMA protection domain, by address), if it is. Registrations stay with the
    /// mapping while the pool keeps it, so a buffer reused for the next I/O is registered
    /// already.
    pub fn reg_key(&self, domain: usize) -> Option<u32> {
        match &self.backing {
            Backing::Map(m) => m.regs.iter().find(|r| r.domain == domain).map(|r| r.key),
            Backing::Heap(_) => None,
        }
    }

    /// Records that the whole mapping ([`mapping_ptr`](Self::mapping_ptr),
    /// [`capacity`](Self::capacity)) is registered with `domain` under `key`. `guard` undoes
    /// the registration when dropped; riser-buf drops it before the mapping is unmapped
    /// (never while the buffer is in use), so a registration never outlives the memory.
    /// Registering an empty buffer does nothing.
    pub fn add_registration(&mut self, domain: usize, key: u32, guard: Box<dyn Any + Send + Sync>) {
        if let Backing::Map(m) = &mut self.backing {
            *m.zeroed.get_mut() = 0;
            m.regs.retain(|r| r.domain != domain);
            m.regs.push(Registration { domain, key, _guard: guard });
        }
    }

    /// Shortens (or, up to [`capacity`](Self::capacity), lengthens) the buffer. Bytes
    /// uncovered by lengthening are unspecified.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "IoBuf::set_len({len}) beyond its capacity {}", self.capacity());
        self.len = len;
    }

    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.backing {
            Backing::Map(m) => &m.map[..self.len],
            Backing::Heap(v) => &v[..self.len],
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.backing {
            Backing::Map(m) => {
                *m.zeroed.get_mut() = 0;
                &mut m.map[..self.len]
            }
            Backing::Heap(v) => &mut v[..self.len],
        }
    }

    /// The address of the first byte (page-aligned), for registering or posting it. A
    /// device may write through it (an RDMA READ lands there): the bytes are no longer
    /// known to be zero.
    pub fn as_ptr(&self) -> *const u8 {
        if let Backing::Map(m) = &self.backing {
            m.zeroed.store(0, Ordering::Relaxed);
        }
        self.as_slice().as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.backing, Backing::Heap(Vec::new())) {
            Backing::Map(mut m) => {
                if let Some(a) = m.account.take() {
                    a.0.fetch_sub(m.len(), Ordering::Relaxed);
                }
                let pool = m.pool;
                if m.reserved > 0 {
                    pool.reserved_in_use.fetch_sub(m.reserved, Ordering::Relaxed);
                    m.reserved = 0;
                }
                pool.give_back(m);
            }
            Backing::Heap(v) => {
                if v.capacity() > 0 {
                    keep_vec(v);
                }
            }
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl AsRef<[u8]> for IoBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for IoBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl From<&[u8]> for IoBuf {
    fn from(data: &[u8]) -> IoBuf {
        IoBuf::copy_from(data)
    }
}

/// A copy of the vector's bytes (for tests and control paths; the data path never has a
/// `Vec` to convert).
impl From<Vec<u8>> for IoBuf {
    fn from(data: Vec<u8>) -> IoBuf {
        IoBuf::copy_from(&data)
    }
}

impl Clone for IoBuf {
    fn clone(&self) -> IoBuf {
        IoBuf::copy_from(self.as_slice())
    }
}

impl PartialEq for IoBuf {
    fn eq(&self, other: &IoBuf) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("heap", &matches!(self.backing, Backing::Heap(ref v) if v.capacity() > 0))
            .finish()
    }
}
