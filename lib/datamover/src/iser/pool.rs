//! The control-buffer pools: fixed-size slots carved from one registered region (the
//! receive ring and the send slots), over [`RegisteredMemory`].

use super::wr::Sge;

/// Memory registered with the device (or plain memory in tests). Access is by copy: the
/// device may read or write it at any time while a work request names it.
// `len` is the size of a registered region, which is never empty: no `is_empty` to ask.
#[allow(clippy::len_without_is_empty)]
pub trait RegisteredMemory: Send {
    /// Address of the first byte as the device sees it (the SGE address).
    fn base(&self) -> u64;
    fn len(&self) -> usize;
    fn lkey(&self) -> u32;
    fn read_at(&self, offset: usize, dst: &mut [u8]);
    fn write_at(&mut self, offset: usize, src: &[u8]);
}

/// Plain memory: for unit tests, where an in-memory queue pair plays the device.
impl RegisteredMemory for Box<[u8]> {
    fn base(&self) -> u64 {
        self.as_ptr() as u64
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn lkey(&self) -> u32 {
        0
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        if let Some(src) = self.get(offset..offset + dst.len()) {
            dst.copy_from_slice(src);
        }
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) {
        if let Some(dst) = self.get_mut(offset..offset + src.len()) {
            dst.copy_from_slice(src);
        }
    }
}

/// A pool of fixed-size slots in one registered region.
pub struct Pool {
    pub(super) mem: Box<dyn RegisteredMemory>,
    slot: usize,
    pub(super) free: Vec<u32>,
    /// Which slots are handed out: a completion naming a slot that is not (a bogus or
    /// repeated work request id) frees nothing twice.
    busy: Vec<bool>,
}

impl Pool {
    /// `count` slots of `slot` bytes over `mem` (at least `count * slot` bytes).
    pub fn new(mem: Box<dyn RegisteredMemory>, count: usize, slot: usize) -> Pool {
        let count = count.min(mem.len() / slot.max(1));
        Pool { mem, slot, free: (0..count as u32).rev().collect(), busy: vec![false; count] }
    }

    /// A pool over plain memory (tests).
    pub fn plain(count: usize, slot: usize) -> Pool {
        Pool::new(Box::new(vec![0u8; count * slot].into_boxed_slice()), count, slot)
    }

    pub fn slot_size(&self) -> usize {
        self.slot
    }

    pub(super) fn alloc(&mut self) -> Option<u32> {
        let i = self.free.pop()?;
        if let Some(b) = self.busy.get_mut(i as usize) {
            *b = true;
        }
        Some(i)
    }

    pub(super) fn release(&mut self, i: u32) {
        match self.busy.get_mut(i as usize) {
            Some(b) if *b => {
                *b = false;
                self.free.push(i);
            }
            _ => log::debug!("iSER: slot {i} freed but not in use; ignored"),
        }
    }

    /// Bytes `off..off + dst.len()` of slot `i` into `dst` (nothing past the slot).
    pub fn read_into(&self, i: u32, off: usize, dst: &mut [u8]) {
        if off + dst.len() <= self.slot {
            self.mem.read_at(i as usize * self.slot + off, dst);
        }
    }

    /// The first `len` bytes of slot `i`.
    pub fn read(&self, i: u32, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len.min(self.slot)];
        self.mem.read_at(i as usize * self.slot, &mut v);
        v
    }

    /// Writes `src` at the start of slot `i`.
    pub fn write(&mut self, i: u32, src: &[u8]) {
        let n = src.len().min(self.slot);
        self.mem.write_at(i as usize * self.slot, &src[..n]);
    }

    /// The SGE of the first `len` bytes of slot `i`.
    pub fn sge(&self, i: u32, len: usize) -> Sge {
        Sge { addr: self.mem.base() + (i as usize * self.slot) as u64, len: len as u32, lkey: self.mem.lkey() }
    }

    pub fn count(&self) -> usize {
        self.mem.len() / self.slot.max(1)
    }
}
