//! The completion router every layer uses to find who a completion belongs to: a typed
//! [`Tag`] (slot, generation, route), its u64 encoding ([`TagLayout`], the only place where
//! tag bits are packed), and [`Router`], a slot table with per-route [`Inboxes`].
//!
//! * A submitter reserves a slot ([`Router::reserve`]) and gets a tag; the tag travels with
//!   the request as a u64 (an io_uring `user_data`, an RDMA `wr_id`, a bdev I/O's tag).
//! * The completion comes back with that u64: [`Router::get_mut`] and [`Router::complete`]
//!   check the slot's generation (and route), so a completion whose slot has been given
//!   back and taken again never reaches the new owner; [`Router::complete`] frees the slot
//!   and puts the completion in the inbox of the slot's route.
//! * A stale or unknown tag is counted ([`Router::stale`]) and dropped: never a panic.
//! * An inbox (a route) is given back by its owner at any time ([`Inboxes::close`]): what it
//!   held is dropped, so are completions still to come for it, and the route is reused only
//!   once the last of them has come back.
//!
//! Nothing here allocates per request: slots and inboxes are reused (the tables grow only
//! when more requests are in flight than ever before, and can be sized up front).
//! Single-threaded (`&mut self`); a table shared across threads (the iSER shared CQ) uses
//! [`Tag`] and [`TagLayout`] with atomics of its own.

use std::collections::VecDeque;

/// Who a completion is for: a slot of a table, the slot's generation when it was reserved,
/// and a route (an inbox, a channel, a queue pair: whatever the table's owner routes to).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tag {
    pub slot: u32,
    pub gen: u32,
    pub route: u32,
}

/// Where a [`Tag`]'s fields lie in a u64, and how wide each is.
///
/// The tag takes `width = slot_bits + gen_bits + route_bits` contiguous bits, either at the
/// bottom of the u64 ([`TagLayout::low`]) or at its top ([`TagLayout::high`]). Inside those
/// bits, from the lowest: the slot, then the generation, then the route:
///
/// ```text
///   low:   63 ........ width | route | gen | slot | 0
///          (the owner's bits)
///   high:  63 | route | gen | slot | 64-width ........ 0
///                                     (the owner's bits)
/// ```
///
/// The bits outside the tag belong to whoever carries it ([`TagLayout::pack`],
/// [`TagLayout::unpack`]). A field wider than its bits keeps its low bits (a generation
/// wraps; a route is compared in its low bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagLayout {
    slot_bits: u32,
    gen_bits: u32,
    route_bits: u32,
    shift: u32,
}

const fn bits(n: u32) -> u64 {
    if n == 0 {
        0
    } else if n >= 64 {
        u64::MAX
    } else {
        (1 << n) - 1
    }
}

impl TagLayout {
    /// A tag in the low bits of the u64. Each field takes at most 32 bits, the tag at most 64.
    pub const fn low(slot_bits: u32, gen_bits: u32, route_bits: u32) -> TagLayout {
        assert!(slot_bits <= 32 && gen_bits <= 32 && route_bits <= 32, "a tag field has at most 32 bits");
        assert!(slot_bits + gen_bits + route_bits <= 64, "a tag has at most 64 bits");
        TagLayout { slot_bits, gen_bits, route_bits, shift: 0 }
    }

    /// A tag in the high bits of the u64.
    pub const fn high(slot_bits: u32, gen_bits: u32, route_bits: u32) -> TagLayout {
        let l = TagLayout::low(slot_bits, gen_bits, route_bits);
        TagLayout { shift: 64 - l.width(), ..l }
    }

    /// Bits the tag takes.
    pub const fn width(&self) -> u32 {
        self.slot_bits + self.gen_bits + self.route_bits
    }

    /// The tag's bits in the u64.
    pub const fn mask(&self) -> u64 {
        bits(self.width()) << self.shift
    }

    /// How many slots the layout can name.
    pub const fn slots(&self) -> u64 {
        1 << self.slot_bits
    }

    /// How many routes the layout can name.
    pub const fn routes(&self) -> u64 {
        1 << self.route_bits
    }

    /// The generation after `gen` (wrapping in the layout's bits).
    pub const fn next_gen(&self, gen: u32) -> u32 {
        (gen.wrapping_add(1) as u64 & bits(self.gen_bits)) as u32
    }

    /// `t` as the layout keeps it: each field cut to its bits.
    pub const fn fit(&self, t: Tag) -> Tag {
        Tag {
            slot: (t.slot as u64 & bits(self.slot_bits)) as u32,
            gen: (t.gen as u64 & bits(self.gen_bits)) as u32,
            route: (t.route as u64 & bits(self.route_bits)) as u32,
        }
    }

    /// The u64 of `t` (zero outside the tag's bits).
    pub const fn encode(&self, t: Tag) -> u64 {
        let t = self.fit(t);
        let v = t.slot as u64 | ((t.gen as u64) << self.slot_bits) | ((t.route as u64) << (self.slot_bits + self.gen_bits));
        v << self.shift
    }

    /// The tag in `v` (whatever `v` holds outside the tag's bits is ignored).
    pub const fn decode(&self, v: u64) -> Tag {
        let v = (v & self.mask()) >> self.shift;
        Tag {
            slot: (v & bits(self.slot_bits)) as u32,
            gen: ((v >> self.slot_bits) & bits(self.gen_bits)) as u32,
            route: ((v >> (self.slot_bits + self.gen_bits)) & bits(self.route_bits)) as u32,
        }
    }

    /// `rest` (the carrier's own bits, zero where the tag goes) with `t` in the tag's bits.
    pub fn pack(&self, t: Tag, rest: u64) -> u64 {
        debug_assert_eq!(rest & self.mask(), 0, "{rest:#x} uses the tag's bits ({:#x})", self.mask());
        (rest & !self.mask()) | self.encode(t)
    }

    /// The tag in `v`, and `v`'s other bits (the tag's bits zero).
    pub const fn unpack(&self, v: u64) -> (Tag, u64) {
        (self.decode(v), v & !self.mask())
    }
}

/// Per route: completions not yet taken, requests still in flight, whether its owner holds it.
struct Inbox<C> {
    done: VecDeque<C>,
    inflight: usize,
    open: bool,
}

/// The inboxes of a table's routes. A route is reused only once it is closed and every
/// request in flight for it has come back, so no late completion reaches a newer owner.
pub struct Inboxes<C> {
    boxes: Vec<Inbox<C>>,
    free: Vec<u32>,
    stale: u64,
}

impl<C> Default for Inboxes<C> {
    fn default() -> Self {
        Inboxes { boxes: Vec::new(), free: Vec::new(), stale: 0 }
    }
}

impl<C> Inboxes<C> {
    /// A route for a new owner.
    pub fn open(&mut self) -> u32 {
        match self.free.pop() {
            Some(r) => {
                let b = &mut self.boxes[r as usize];
                b.open = true;
                b.done.clear();
                r
            }
            None => {
                self.boxes.push(Inbox { done: VecDeque::new(), inflight: 0, open: true });
                (self.boxes.len() - 1) as u32
            }
        }
    }

    /// The owner of `route` is gone: what it had waiting is dropped, and so is whatever
    /// still comes for it.
    pub fn close(&mut self, route: u32) {
        let Some(b) = self.boxes.get_mut(route as usize).filter(|b| b.open) else { return };
        b.open = false;
        b.done.clear();
        if b.inflight == 0 {
            self.free.push(route);
        }
    }

    /// One more request in flight for `route` (its completion comes through [`Self::deliver`]).
    pub fn expect(&mut self, route: u32) {
        if let Some(b) = self.boxes.get_mut(route as usize).filter(|b| b.open) {
            b.inflight += 1;
        }
    }

    /// A request of `route` is back: `c` goes to its inbox, or is dropped if its owner left
    /// (the route is free once nothing of it is in flight) or the route is unknown
    /// (counted as stale). Whether it was delivered.
    pub fn deliver(&mut self, route: u32, c: C) -> bool {
        let Some(b) = self.boxes.get_mut(route as usize) else {
            self.stale += 1;
            return false;
        };
        if b.inflight == 0 && !b.open {
            // Nothing of it was in flight: not one of its requests.
            self.stale += 1;
            return false;
        }
        b.inflight = b.inflight.saturating_sub(1);
        if b.open {
            b.done.push_back(c);
            return true;
        }
        if b.inflight == 0 {
            self.free.push(route);
        }
        false
    }

    /// Like [`deliver`](Self::deliver), for a caller that owns route `own` and has just
    /// drained its inbox into `out`: a completion of `own` goes straight into `out` (nothing
    /// waits before it in the inbox, so the order is kept), with no trip through the inbox;
    /// any other goes to its route's inbox. Whether it was delivered (into either).
    pub fn deliver_to(&mut self, route: u32, c: C, own: u32, out: &mut Vec<C>) -> bool {
        if route == own {
            if let Some(b) = self.boxes.get_mut(route as usize).filter(|b| b.open && b.done.is_empty()) {
                b.inflight = b.inflight.saturating_sub(1);
                out.push(c);
                return true;
            }
        }
        self.deliver(route, c)
    }

    /// A completion for `route` that was never in flight (a request refused at submission).
    pub fn push(&mut self, route: u32, c: C) {
        if let Some(b) = self.boxes.get_mut(route as usize).filter(|b| b.open) {
            b.done.push_back(c);
        }
    }

    /// Moves `route`'s completions into `out`; how many.
    pub fn drain(&mut self, route: u32, out: &mut Vec<C>) -> usize {
        match self.boxes.get_mut(route as usize).filter(|b| b.open) {
            Some(b) => {
                let n = b.done.len();
                out.extend(b.done.drain(..));
                n
            }
            None => 0,
        }
    }

    /// Requests in flight plus completions waiting, of an open `route`.
    pub fn outstanding(&self, route: u32) -> usize {
        self.boxes.get(route as usize).filter(|b| b.open).map_or(0, |b| b.done.len() + b.inflight)
    }

    /// Completions dropped because their route was unknown.
    pub fn stale(&self) -> u64 {
        self.stale
    }
}

struct Slot<T> {
    gen: u32,
    route: u32,
    value: Option<T>,
}

/// A slot table of requests in flight (`T`: what each keeps until its completion) and the
/// inboxes of their routes (`C`: the completion delivered).
pub struct Router<T, C> {
    layout: TagLayout,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    in_use: usize,
    stale: u64,
    inboxes: Inboxes<C>,
}

impl<T, C> Router<T, C> {
    /// An empty table whose tags are encoded with `layout`, with room for `slots` requests
    /// in flight before it grows.
    pub fn new(layout: TagLayout, slots: usize) -> Router<T, C> {
        let slots = slots.min(layout.slots() as usize);
        Router {
            layout,
            slots: (0..slots).map(|_| Slot { gen: 0, route: 0, value: None }).collect(),
            free: (0..slots as u32).rev().collect(),
            in_use: 0,
            stale: 0,
            inboxes: Inboxes::default(),
        }
    }

    pub fn layout(&self) -> TagLayout {
        self.layout
    }

    pub fn inboxes(&self) -> &Inboxes<C> {
        &self.inboxes
    }

    pub fn inboxes_mut(&mut self) -> &mut Inboxes<C> {
        &mut self.inboxes
    }

    /// Takes a slot for `value`, a request of `route`: its tag (as the layout keeps it) and
    /// the value in place. `Err(value)` when every slot the layout can name is taken.
    pub fn reserve(&mut self, route: u32, value: T) -> Result<(Tag, &mut T), T> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None if (self.slots.len() as u64) < self.layout.slots() => {
                self.slots.push(Slot { gen: 0, route: 0, value: None });
                (self.slots.len() - 1) as u32
            }
            None => return Err(value),
        };
        self.inboxes.expect(route);
        self.in_use += 1;
        let layout = self.layout;
        let s = &mut self.slots[slot as usize];
        s.gen = layout.next_gen(s.gen);
        s.route = route;
        let tag = layout.fit(Tag { slot, gen: s.gen, route });
        Ok((tag, s.value.insert(value)))
    }

    /// The slot `tag` names, if the tag is current.
    fn check(&mut self, tag: Tag) -> Option<usize> {
        let layout = self.layout;
        let ok = self.slots.get(tag.slot as usize).is_some_and(|s| {
            s.value.is_some() && layout.fit(Tag { slot: tag.slot, gen: s.gen, route: s.route }) == layout.fit(tag)
        });
        if ok {
            Some(tag.slot as usize)
        } else {
            self.stale += 1;
            None
        }
    }

    /// The request `tag` names; `None` (counted) when the tag is stale or unknown.
    pub fn get_mut(&mut self, tag: Tag) -> Option<&mut T> {
        let i = self.check(tag)?;
        self.slots[i].value.as_mut()
    }

    /// The request `tag` names is done: its slot is freed and `done(value)` goes to the
    /// inbox of its route. `false` when the tag is stale or unknown (counted, nothing
    /// delivered) or the route's owner is gone (the completion is dropped).
    pub fn complete(&mut self, tag: Tag, done: impl FnOnce(T) -> C) -> bool {
        let Some(i) = self.check(tag) else { return false };
        let s = &mut self.slots[i];
        let (Some(value), route) = (s.value.take(), s.route) else { return false };
        self.free.push(i as u32);
        self.in_use -= 1;
        self.inboxes.deliver(route, done(value))
    }

    /// Requests in flight.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Completions dropped because their tag was stale or unknown (slots and routes).
    pub fn stale(&self) -> u64 {
        self.stale + self.inboxes.stale()
    }

    /// Forgets every request in flight without dropping it (memory a device may still
    /// write into at teardown).
    pub fn leak(&mut self) {
        for s in &mut self.slots {
            if let Some(v) = s.value.take() {
                std::mem::forget(v);
            }
        }
        self.in_use = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_in_every_layout() {
        let layouts = [TagLayout::low(32, 16, 16), TagLayout::low(20, 12, 16), TagLayout::low(8, 8, 0), TagLayout::high(0, 0, 16), TagLayout::high(10, 6, 4)];
        for l in layouts {
            for t in [Tag::default(), Tag { slot: 1, gen: 2, route: 3 }, Tag { slot: u32::MAX, gen: u32::MAX, route: u32::MAX }] {
                let t = l.fit(t);
                let v = l.encode(t);
                assert_eq!(v & !l.mask(), 0, "{l:?}: {v:#x} outside the tag's bits");
                assert_eq!(l.decode(v), t, "{l:?}");
                let rest = !l.mask() & 0xa5a5_a5a5_a5a5_a5a5;
                let packed = l.pack(t, rest);
                assert_eq!(l.unpack(packed), (t, rest), "{l:?}");
            }
        }
        // The documented positions.
        let l = TagLayout::low(8, 8, 0);
        assert_eq!(l.encode(Tag { slot: 0x12, gen: 0x34, route: 0 }), 0x3412);
        assert_eq!(l.mask(), 0xffff);
        let h = TagLayout::high(0, 0, 16);
        assert_eq!(h.encode(Tag { slot: 0, gen: 0, route: 7 }), 7 << 48);
        assert_eq!(h.mask(), 0xffff << 48);
        let w = TagLayout::low(32, 16, 16);
        assert_eq!(w.encode(Tag { slot: 1, gen: 2, route: 3 }), 1 | (2 << 32) | (3 << 48));
        assert_eq!(w.mask(), u64::MAX);
        assert_eq!(l.next_gen(0xff), 0, "generations wrap in their bits");
    }

    #[test]
    fn a_completion_reaches_its_route_once_and_a_stale_tag_is_counted_and_dropped() {
        let mut r: Router<&str, String> = Router::new(TagLayout::low(8, 4, 8), 2);
        let (a, b) = (r.inboxes_mut().open(), r.inboxes_mut().open());
        let (ta, _) = r.reserve(a, "to a").unwrap();
        let (tb, v) = r.reserve(b, "to b").unwrap();
        *v = "to b, changed";
        assert_eq!(r.in_use(), 2);
        assert_eq!(r.inboxes_mut().outstanding(a), 1);
        assert!(r.complete(tb, |v| v.to_string()));
        assert!(!r.complete(tb, |v| v.to_string()), "twice");
        assert_eq!(r.stale(), 1);
        // The slot is reused under another generation: the old tag no longer names it.
        let (tc, _) = r.reserve(b, "again").unwrap();
        assert_eq!(tc.slot, tb.slot);
        assert_ne!(tc.gen, tb.gen);
        assert!(r.get_mut(tb).is_none());
        assert!(!r.complete(tb, |v| v.to_string()));
        // Unknown slots, a wrong route: counted, nothing delivered, no panic.
        assert!(r.get_mut(Tag { slot: 200, gen: 0, route: 0 }).is_none());
        assert!(r.get_mut(Tag { route: a, ..tc }).is_none());
        assert_eq!(r.stale(), 5);
        assert!(r.complete(ta, |v| v.to_string()));
        assert!(r.complete(tc, |v| v.to_string()));
        let mut out = Vec::new();
        assert_eq!(r.inboxes_mut().drain(a, &mut out), 1);
        assert_eq!(r.inboxes_mut().drain(b, &mut out), 2);
        assert_eq!(out, ["to a", "to b, changed", "again"]);
        assert_eq!(r.in_use(), 0);
    }

    #[test]
    fn a_closed_route_is_reused_only_once_its_requests_are_back() {
        let mut r: Router<u32, u32> = Router::new(TagLayout::low(16, 16, 16), 0);
        let a = r.inboxes_mut().open();
        let (t, _) = r.reserve(a, 1).unwrap();
        r.inboxes_mut().push(a, 99);
        r.inboxes_mut().close(a);
        let b = r.inboxes_mut().open();
        assert_ne!(a, b, "a route with a request in flight is not reused");
        assert!(!r.complete(t, |v| v), "its owner left: dropped");
        assert_eq!(r.inboxes_mut().open(), a, "reused once it is back");
        assert_eq!(r.inboxes_mut().drain(a, &mut Vec::new()), 0, "nothing of the last owner's");
        assert_eq!(r.stale(), 0);
        // A completion for a route nothing was sent to.
        assert!(!r.inboxes_mut().deliver(42, 0));
        assert_eq!(r.stale(), 1);
    }

    #[test]
    fn deliver_to_hands_the_own_route_straight_out_and_files_the_others() {
        let mut ib: Inboxes<u32> = Inboxes::default();
        let (own, other) = (ib.open(), ib.open());
        for r in [own, own, other] {
            ib.expect(r);
        }
        let mut out = Vec::new();
        assert!(ib.deliver_to(own, 1, own, &mut out));
        assert!(ib.deliver_to(other, 2, own, &mut out));
        assert_eq!(out, [1], "the own route's completion, not the other's");
        assert_eq!(ib.outstanding(own), 1, "one still in flight, nothing waiting");
        assert_eq!(ib.outstanding(other), 1, "filed in its inbox");
        // A closed own route: dropped like `deliver` drops it, its route freed.
        ib.close(own);
        assert!(!ib.deliver_to(own, 3, own, &mut out));
        assert_eq!(out, [1]);
        assert_eq!(ib.open(), own, "free again once its last request is back");
        assert_eq!(ib.drain(other, &mut out), 1);
        assert_eq!(out, [1, 2]);
        assert_eq!(ib.stale(), 0);
    }

    #[test]
    fn a_full_table_gives_the_request_back() {
        let mut r: Router<u8, u8> = Router::new(TagLayout::low(1, 0, 0), 0);
        assert!(r.reserve(0, 1).is_ok());
        assert!(r.reserve(0, 2).is_ok());
        assert_eq!(r.reserve(0, 3).err(), Some(3));
    }
}
