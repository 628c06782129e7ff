//! A connection's tasks by ITT: direct-mapped slots (the ITT's low bits pick the slot), so
//! that a task is built where it stays and freed where it lies, with no hashing; a task
//! whose slot another task holds goes to an overflow map.
//!
//! Initiators number their tasks densely (open-iscsi: a task index in the low bits;
//! libiscsi and riser-initiator: a counter), so with as many slots as the queue depth
//! (rounded up to a power of two) the overflow map stays empty. Memory: the slots (at most
//! [`MAX_SLOTS`]) are taken at the first insert and kept; the overflow map holds at most
//! the tasks beyond them, which the task cap bounds (as it bounded the map this replaces).

use crate::serial::{Itt, TagMap};

/// Most slots a table takes (beyond them, tasks go to the overflow map).
pub(super) const MAX_SLOTS: usize = 256;

pub(super) struct TaskTable<V> {
    /// Empty until the first insert, then `size` slots ...
    slots: Vec<Option<V>>,
    /// ... and the tag of each full one (kept apart: a task goes into its slot as it is).
    keys: Vec<Itt>,
    /// A power of two.
    size: usize,
    overflow: TagMap<Itt, V>,
    len: usize,
}

impl<V> TaskTable<V> {
    /// A table for about `queue_depth` tasks at a time.
    pub(super) fn new(queue_depth: u32) -> TaskTable<V> {
        let size = (queue_depth.max(1) as usize).next_power_of_two().min(MAX_SLOTS);
        TaskTable { slots: Vec::new(), keys: Vec::new(), size, overflow: TagMap::default(), len: 0 }
    }

    #[inline]
    fn index(&self, itt: Itt) -> usize {
        itt.0 as usize & (self.size - 1)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn contains_key(&self, itt: &Itt) -> bool {
        self.get(itt).is_some()
    }

    /// The slot of `itt` if it holds that task.
    #[inline]
    fn slot_of(&self, itt: Itt) -> Option<usize> {
        let i = self.index(itt);
        (self.keys.get(i) == Some(&itt) && self.slots[i].is_some()).then_some(i)
    }

    #[inline]
    pub(super) fn get(&self, itt: &Itt) -> Option<&V> {
        match self.slot_of(*itt) {
            Some(i) => self.slots[i].as_ref(),
            None if self.overflow.is_empty() => None,
            None => self.overflow.get(itt),
        }
    }

    #[inline]
    pub(super) fn get_mut(&mut self, itt: &Itt) -> Option<&mut V> {
        match self.slot_of(*itt) {
            Some(i) => self.slots[i].as_mut(),
            None if self.overflow.is_empty() => None,
            None => self.overflow.get_mut(itt),
        }
    }

    /// Puts `v` under `itt` (replacing what was there) and returns it where it lies.
    #[inline(always)]
    pub(super) fn insert(&mut self, itt: Itt, v: V) -> &mut V {
        if self.slots.is_empty() {
            self.slots.resize_with(self.size, || None);
            self.keys.resize(self.size, Itt::RESERVED);
        }
        let i = self.index(itt);
        if self.overflow.is_empty() && self.slots[i].is_none() {
            // The usual case: a free slot, and no copy of the tag elsewhere.
            self.len += 1;
            self.keys[i] = itt;
            return self.slots[i].insert(v);
        }
        self.insert_slow(i, itt, v)
    }

    #[inline(never)]
    fn insert_slow(&mut self, i: usize, itt: Itt, v: V) -> &mut V {
        if self.slots[i].is_none() || self.keys[i] == itt {
            if self.overflow.remove(&itt).is_some() {
                self.len -= 1;
            }
            if self.slots[i].is_none() {
                self.len += 1;
            }
            self.keys[i] = itt;
            self.slots[i].insert(v)
        } else {
            if !self.overflow.contains_key(&itt) {
                self.len += 1;
            }
            self.overflow.entry(itt).insert_entry(v).into_mut()
        }
    }

    /// Takes the task out.
    pub(super) fn remove(&mut self, itt: &Itt) -> Option<V> {
        let v = match self.slot_of(*itt) {
            Some(i) => self.slots[i].take(),
            None if self.overflow.is_empty() => None,
            None => self.overflow.remove(itt),
        };
        if v.is_some() {
            self.len -= 1;
        }
        v
    }

    /// Drops the task where it lies (no move out of the table); whether it was there.
    #[inline]
    pub(super) fn free(&mut self, itt: &Itt) -> bool {
        let found = match self.slot_of(*itt) {
            Some(i) => {
                self.slots[i] = None;
                true
            }
            None if self.overflow.is_empty() => false,
            None => self.overflow.remove(itt).is_some(),
        };
        if found {
            self.len -= 1;
        }
        found
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&Itt, &V)> {
        self.keys.iter().zip(&self.slots).filter_map(|(k, s)| s.as_ref().map(|v| (k, v))).chain(self.overflow.iter())
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&Itt, &mut V)> {
        self.keys.iter().zip(&mut self.slots).filter_map(|(k, s)| s.as_mut().map(|v| (k, v))).chain(self.overflow.iter_mut())
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(t: &TaskTable<u32>) -> Vec<u32> {
        let mut k: Vec<u32> = t
            .iter()
            .map(|(k, v)| {
                assert_eq!(k.0 * 10, *v);
                k.0
            })
            .collect();
        k.sort_unstable();
        k
    }

    #[test]
    fn slots_and_overflow_behave_as_one_map() {
        // 4 slots: 1, 5 and 9 share slot 1 (5 and 9 overflow).
        let mut t = TaskTable::new(3);
        assert!(t.is_empty() && t.get(&Itt(1)).is_none() && !t.free(&Itt(1)) && t.remove(&Itt(1)).is_none());
        for k in [1, 5, 9, 2] {
            *t.insert(Itt(k), 0) = k * 10;
        }
        assert_eq!((t.len(), keys(&t)), (4, vec![1, 2, 5, 9]));
        assert_eq!((t.get(&Itt(5)), t.get(&Itt(13)), t.contains_key(&Itt(9))), (Some(&50), None, true));
        // Replacing keeps one entry.
        *t.insert(Itt(9), 0) = 90;
        assert_eq!(t.len(), 4);
        // The slot's owner leaves: a later insert of an overflowed tag takes the slot and
        // leaves no stale copy in the overflow map.
        assert_eq!(t.remove(&Itt(1)), Some(10));
        *t.insert(Itt(5), 1) = 50;
        assert_eq!((t.len(), keys(&t)), (3, vec![2, 5, 9]));
        assert!(t.free(&Itt(5)) && !t.free(&Itt(5)));
        assert_eq!((t.len(), keys(&t)), (2, vec![2, 9]));
        if let Some(v) = t.get_mut(&Itt(9)) {
            *v = 90;
        }
        assert!(t.free(&Itt(9)) && t.free(&Itt(2)) && t.is_empty() && keys(&t).is_empty());
    }

    #[test]
    fn slots_are_bounded() {
        let t: TaskTable<u8> = TaskTable::new(100_000);
        assert_eq!(t.size, MAX_SLOTS);
        let t: TaskTable<u8> = TaskTable::new(0);
        assert_eq!(t.size, 1);
    }
}
