//! Tests of the pool, the budget and its fair shares, and of [`IoBuf`].

use super::*;

fn pool(max: usize) -> &'static Pool {
    Box::leak(Box::new(Pool::new(max)))
}

#[test]
fn classes_cover_every_size_once() {
    assert_eq!(class_of(0), Some(0));
    assert_eq!(class_of(1), Some(0));
    assert_eq!(class_of(PAGE), Some(0));
    assert_eq!(class_of(PAGE + 1), Some(1));
    assert_eq!(class_of(MIB), Some(SMALL_CLASSES - 1));
    assert_eq!(class_of(MIB + 1), Some(SMALL_CLASSES));
    assert_eq!(class_size(SMALL_CLASSES), 2 * MIB);
    assert_eq!(class_of(MAX_POOLED), Some(CLASSES - 1));
    assert_eq!(class_size(CLASSES - 1), MAX_POOLED);
    assert_eq!(class_of(MAX_POOLED + 1), None);
    for len in [1, 4095, 4096, 4097, 65536, 100_000, MIB, MIB + 1, 5 * MIB + 3, MAX_POOLED] {
        let c = class_of(len).unwrap();
        assert!(class_size(c) >= len, "class {c} too small for {len}");
        if c > 0 {
            assert!(class_size(c - 1) < len, "class {} would do for {len}", c - 1);
        }
    }
}

#[test]
fn buffers_are_aligned_and_reused() {
    let p = pool(64 * MIB);
    let mut a = p.alloc(5000);
    assert_eq!(a.len(), 5000);
    assert_eq!(a.capacity(), 8192);
    assert_eq!(a.as_ptr() as usize % PAGE, 0);
    a.fill(7);
    let addr = a.as_ptr();
    drop(a);
    assert_eq!(p.stats().cached_bytes, 8192);
    let b = p.alloc(8000);
    assert_eq!(b.as_ptr(), addr, "the kept buffer of the class is reused");
    let s = p.stats();
    assert_eq!((s.maps, s.reuses, s.in_use_bytes, s.cached_bytes), (1, 1, 8192, 0));
    let c = p.alloc(3 * PAGE);
    assert_eq!(p.stats().peak_in_use_bytes, 8192 + 16384, "the most in use at once");
    drop((b, c));
    assert_eq!(p.stats().peak_in_use_bytes, 8192 + 16384, "the peak stays");
    p.trim();
    let s = p.stats();
    assert_eq!((s.mapped_bytes, s.unmaps), (0, 2));
}

#[test]
fn empty_and_oversized_buffers() {
    let p = pool(MIN_MAX_BYTES);
    let e = p.alloc(0);
    assert!(e.is_empty() && e.capacity() == 0);
    let big = p.alloc(MAX_POOLED + 1);
    assert_eq!(big.capacity(), MAX_POOLED + PAGE);
    drop(big);
    // Not pooled: unmapped at once.
    assert_eq!(p.stats().mapped_bytes, 0);
}

#[test]
fn budgeted_requests_wait_in_order() {
    let p = pool(MIN_MAX_BYTES);
    let (mut w1, mut w2, mut w3) = (None, None, None);
    let a = p.try_alloc(16 * MIB, &mut w1).expect("fits");
    assert!(w1.is_none());
    let b = p.try_alloc(16 * MIB, &mut w1).expect("fits exactly");
    // Spent: the next two queue, in order.
    assert!(p.try_alloc(16 * MIB, &mut w2).is_none());
    assert!(p.try_alloc(4096, &mut w3).is_none(), "a small request waits behind an older one");
    assert_eq!(p.stats().waiting, 2);
    drop(a);
    // w3 is not at the head: still waiting even though 4 KiB would fit.
    assert!(p.try_alloc(4096, &mut w3).is_none());
    let c = p.try_alloc(16 * MIB, &mut w2).expect("the head is served");
    assert!(w2.is_none());
    drop(b);
    let d = p.try_alloc(4096, &mut w3).expect("then the next");
    assert_eq!(p.stats().waiting, 0);
    assert_eq!(p.stats().waits, 2);
    drop((c, d));
    assert!(p.stats().mapped_bytes <= MIN_MAX_BYTES);
}

#[test]
fn a_dropped_waiter_leaves_the_queue() {
    let p = pool(MIN_MAX_BYTES);
    let mut w = None;
    let a = p.try_alloc(MIN_MAX_BYTES, &mut w).unwrap();
    let (mut w1, mut w2) = (None, None);
    assert!(p.try_alloc(MIB, &mut w1).is_none());
    assert!(p.try_alloc(MIB, &mut w2).is_none());
    drop(w1);
    drop(a);
    assert!(p.try_alloc(MIB, &mut w2).is_some(), "the second waiter moved to the head");
    assert_eq!(p.stats().waiting, 0);
}

#[test]
fn kept_buffers_make_room_for_other_classes() {
    let p = pool(MIN_MAX_BYTES);
    let mut w = None;
    drop(p.try_alloc(MIN_MAX_BYTES, &mut w).unwrap());
    assert_eq!(p.stats().cached_bytes, MIN_MAX_BYTES);
    // The kept 32 MiB buffer is unmapped to map two 16 MiB ones.
    let a = p.try_alloc(16 * MIB, &mut w).expect("trimmed to fit");
    let b = p.try_alloc(16 * MIB, &mut w).expect("trimmed to fit");
    let s = p.stats();
    assert_eq!((s.mapped_bytes, s.cached_bytes, s.unmaps), (MIN_MAX_BYTES, 0, 1));
    drop((a, b));
}

#[test]
fn unbudgeted_buffers_count_and_are_unmapped_over_budget() {
    let p = pool(MIN_MAX_BYTES);
    let a = p.alloc(MIN_MAX_BYTES);
    let b = p.alloc(MIB);
    assert_eq!(p.stats().mapped_bytes, MIN_MAX_BYTES + MIB);
    let mut w = None;
    assert!(p.try_alloc(4096, &mut w).is_none(), "no room while unbudgeted buffers hold it");
    drop(b); // over budget: unmapped, not kept
    assert_eq!(p.stats().cached_bytes, 0);
    drop(a);
    assert!(p.try_alloc(4096, &mut w).is_some());
}

#[test]
fn set_max_bytes_checks_and_trims() {
    let p = pool(64 * MIB);
    assert!(p.set_max_bytes(MIB).is_err());
    drop(p.alloc(48 * MIB));
    assert_eq!(p.stats().cached_bytes, 0, "48 MiB is beyond the pooled classes");
    drop(p.alloc(MAX_POOLED));
    drop(p.alloc(16 * MIB));
    assert_eq!(p.stats().cached_bytes, 48 * MIB);
    p.set_max_bytes(MIN_MAX_BYTES).unwrap();
    assert!(p.stats().mapped_bytes <= MIN_MAX_BYTES);
}

#[test]
fn registrations_travel_with_the_mapping_and_end_before_it() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    struct Guard(Arc<AtomicBool>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let p = pool(64 * MIB);
    let mut a = p.alloc(4096);
    assert_eq!(a.reg_key(1), None);
    let gone = Arc::new(AtomicBool::new(false));
    let base = a.mapping_ptr();
    a.add_registration(1, 77, Box::new(Guard(gone.clone())));
    assert_eq!(a.reg_key(1), Some(77));
    assert_eq!(a.reg_key(2), None);
    drop(a);
    let b = p.alloc(100);
    assert_eq!(b.reg_key(1), Some(77), "the pooled mapping kept its registration");
    assert_eq!(b.as_ptr(), base as *const u8);
    drop(b);
    assert!(!gone.load(Ordering::SeqCst));
    p.trim();
    assert!(gone.load(Ordering::SeqCst), "unmapping deregisters");
    let mut e = p.alloc(0);
    e.add_registration(1, 5, Box::new(()));
    assert_eq!(e.reg_key(1), None);
}

#[test]
fn adopted_vectors_are_not_copied_and_come_back_as_spares() {
    let v = vec![7u8; 5000];
    let addr = v.as_ptr();
    let mut b = IoBuf::from_vec(v);
    assert_eq!((b.len(), b.capacity()), (5000, 5000));
    assert_eq!(b.as_ptr(), addr, "no copy");
    assert!(b.mapping_ptr().is_null(), "not registrable");
    b.add_registration(1, 9, Box::new(()));
    assert_eq!(b.reg_key(1), None);
    drop(b);
    let again = take_vec(4096);
    assert_eq!(again.as_ptr(), addr, "the vector is this thread's next one");
    assert!(again.is_empty() && again.capacity() >= 5000);
    assert!(take_vec(4096).capacity() >= 4096);
}

#[test]
fn an_account_holding_memory_takes_at_most_a_quarter() {
    let p = pool(64 * MIB); // a quarter: 16 MiB
    let (a, b) = (Account::new(), Account::new());
    let mut w = None;
    let x = p.try_alloc_for(8 * MIB, &mut w, &a).expect("holds nothing yet");
    assert_eq!(a.held(), 8 * MIB);
    let y = p.try_alloc_for(8 * MIB, &mut w, &a).expect("16 MiB: a quarter");
    assert!(p.try_alloc_for(4096, &mut w, &a).is_none(), "beyond its quarter");
    assert!(w.is_none() && p.stats().waiting == 0, "waits outside the queue");
    let big = p.try_alloc_for(32 * MIB, &mut w, &b).expect("another account holding nothing");
    drop(x);
    assert_eq!(a.held(), 8 * MIB);
    assert!(p.try_alloc_for(4096, &mut w, &a).is_some());
    drop((y, big));
    assert_eq!((a.held(), b.held()), (0, 0));
}

#[test]
fn now_or_never_takes_no_place_in_the_queue() {
    let p = pool(MIN_MAX_BYTES); // a quarter: 8 MiB
    let (a, b) = (Account::new(), Account::new());
    let x = p.try_alloc_now_for(16 * MIB, &a).expect("room, nobody waits");
    assert_eq!(a.held(), 16 * MIB);
    assert!(p.try_alloc_now_for(4096, &a).is_none(), "beyond its quarter");
    let y = p.try_alloc_now_for(16 * MIB, &b).expect("another account, room left");
    assert!(p.try_alloc_now_for(4096, &Account::new()).is_none(), "the budget is spent");
    assert_eq!((p.stats().waiting, p.stats().waits), (0, 0), "never queued");
    // Someone queues: a newcomer does not pass them, even when its buffer would fit.
    let mut w = None;
    assert!(p.try_alloc_for(16 * MIB, &mut w, &Account::new()).is_none());
    drop(x);
    assert!(p.try_alloc_now_for(4096, &Account::new()).is_none(), "one waits before it");
    let z = p.try_alloc_for(16 * MIB, &mut w, &Account::new()).expect("the waiter is served");
    let small = p.try_alloc_now_for(4096, &Account::new());
    assert!(small.is_none(), "the budget is spent again");
    drop((y, z));
    assert_eq!(p.try_alloc_now_for(4096, &a).map(|b| b.len()), Some(4096));
    assert_eq!(a.held(), 0, "the charge went back with the buffer");
}

#[test]
fn the_reserve_is_kept_for_accounts_holding_little_and_passes_a_big_waiter() {
    let p = pool(DEFAULT_MAX_BYTES); // 48 MiB: share 12 MiB, reserve 7.2 MiB, "little" 1.8 MiB
    assert_eq!(p.reserve_bytes(), percent_of(DEFAULT_MAX_BYTES, 15));
    let (a, b, c, d) = (Account::new(), Account::new(), Account::new(), Account::new());
    let (mut wa, mut wb, mut wc) = (None, None, None);
    let big_a = p.try_alloc_for(32 * MIB, &mut wa, &a).expect("holds nothing: one request of any size");
    // 32 + 16 MiB would fit the budget, not the budget less the unused reserve.
    assert!(p.try_alloc_for(16 * MIB, &mut wb, &b).is_none(), "the reserve is not a big request's room");
    assert!(wb.is_some() && p.stats().waiting == 1, "b waits in the queue");
    // A small request of another connection passes the waiter, from the reserve.
    let c1 = p.try_alloc_for(64 * 1024, &mut wc, &c).expect("holds little: the reserve");
    let c2 = p.try_alloc_for(MIB, &mut wc, &c).expect("still little (1.06 MiB of 1.8)");
    assert!(wc.is_none(), "took no place in the queue");
    assert_eq!(p.stats().reserve_grants, 2);
    assert!(p.try_alloc_for(MIB, &mut wc, &c).is_none(), "2.06 MiB is not little: c queues behind b");
    assert!(wc.is_some() && p.stats().waiting == 2);
    let d1 = p.try_alloc_now_for(64 * 1024, &d).expect("now or never: the reserve too");
    assert_eq!(p.stats().reserve_in_use_bytes, 64 * 1024 + MIB + 64 * 1024);
    assert!(p.try_alloc_for(16 * MIB, &mut wb, &b).is_none(), "b still waits for a's memory");
    drop(big_a);
    let big_b = p.try_alloc_for(16 * MIB, &mut wb, &b).expect("the head of the queue, once a's memory came back");
    let c3 = p.try_alloc_for(MIB, &mut wc, &c).expect("then c");
    assert_eq!((p.stats().waiting, p.stats().reserve_grants), (0, 3));
    drop((c1, c2, c3, d1, big_b));
    assert_eq!(p.stats().reserve_in_use_bytes, 0, "the reserve came back with the buffers");
    assert_eq!((a.held(), b.held(), c.held(), d.held()), (0, 0, 0, 0));
}

#[test]
fn silent_holders_at_their_share_leave_the_rest_to_others() {
    let p = pool(DEFAULT_MAX_BYTES);
    let share = p.share_bytes();
    assert_eq!(share, DEFAULT_MAX_BYTES / 4);
    // Four connections take 1 MiB pieces until they are refused (their writes' R2Ts
    // never answered: nothing comes back).
    let hogs: Vec<Account> = (0..4).map(|_| Account::new()).collect();
    let mut held = Vec::new();
    let mut waiters: Vec<Option<Waiter>> = (0..4).map(|_| None).collect();
    for _ in 0..64 {
        for (h, w) in hogs.iter().zip(waiters.iter_mut()) {
            if let Some(b) = p.try_alloc_for(MIB, w, h) {
                held.push(b);
            }
        }
    }
    for h in &hogs {
        assert!(h.held() <= share, "{} over the share {share}", h.held());
    }
    let total: usize = hogs.iter().map(Account::held).sum();
    assert!(total <= DEFAULT_MAX_BYTES - p.reserve_bytes(), "{total}: the hogs reached into the reserve");
    assert_eq!(p.stats().reserve_grants, 0, "none of them holds little");
    // A fifth connection's write and read go on.
    let fifth = Account::new();
    let mut w = None;
    let wr = p.try_alloc_for(64 * 1024, &mut w, &fifth).expect("the fifth connection's write");
    let rd = p.try_alloc_for(64 * 1024, &mut w, &fifth).expect("and its read");
    assert!(w.is_none());
    drop((wr, rd, held, waiters));
    assert_eq!(p.stats().in_use_bytes, 0);
}

#[test]
fn percentages_are_exact() {
    for bytes in [0, 1, 99, 100, 12345, DEFAULT_MAX_BYTES, 64 * MIB + 7, usize::MAX] {
        for pct in [0, 1, 15, 25, 50, 99, 100] {
            assert_eq!(percent_of(bytes, pct) as u128, bytes as u128 * pct as u128 / 100, "{pct}% of {bytes}");
        }
    }
}

#[test]
fn shares_are_settable_and_the_reserve_leaves_the_largest_transfer_room() {
    let p = pool(DEFAULT_MAX_BYTES);
    assert_eq!(p.shares(), (DEFAULT_SHARE_PERCENT, DEFAULT_RESERVE_PERCENT));
    assert!(p.set_shares(0, 10).is_err());
    assert!(p.set_shares(101, 10).is_err());
    assert!(p.set_shares(50, MAX_RESERVE_PERCENT + 1).unwrap_err().contains("buffer_reserve_percent"));
    assert_eq!(p.shares(), (DEFAULT_SHARE_PERCENT, DEFAULT_RESERVE_PERCENT), "unchanged by refused values");
    p.set_shares(50, 50).unwrap();
    assert_eq!(p.share_bytes(), 24 * MIB);
    // Half of 48 MiB would leave 24 MiB: the reserve stops where 32 MiB still fit.
    assert_eq!(p.reserve_bytes(), 16 * MIB);
    let a = Account::new();
    let mut w = None;
    let x = p.try_alloc_for(16 * MIB, &mut w, &a).unwrap();
    let y = p.try_alloc_for(8 * MIB, &mut w, &a).expect("24 MiB: half");
    assert!(p.try_alloc_for(PAGE, &mut w, &a).is_none());
    drop((x, y));
    // The smallest budget has no reserve: every request may use all of it.
    let small = pool(MIN_MAX_BYTES);
    assert_eq!(small.reserve_bytes(), 0);
    let all = small.try_alloc_for(MIN_MAX_BYTES, &mut None, &Account::new()).expect("all of it");
    assert!(small.try_alloc_now_for(PAGE, &Account::new()).is_none(), "and no reserve to take from");
    drop(all);
    p.set_shares(25, 0).unwrap();
    assert_eq!(p.reserve_bytes(), 0);
}

#[test]
fn zeroed_copy_and_len() {
    let mut a = IoBuf::alloc(100);
    a.fill(0xAA);
    drop(a);
    let z = IoBuf::zeroed(100);
    assert!(z.iter().all(|&b| b == 0));
    let mut c = IoBuf::copy_from(b"hello");
    assert_eq!(&c[..], b"hello");
    c.truncate(2);
    assert_eq!(c.as_slice(), b"he");
    c.set_len(5);
    assert_eq!(c.len(), 5);
    assert_eq!(IoBuf::from(vec![1u8, 2, 3]).as_slice(), &[1, 2, 3]);
}

#[test]
fn a_zero_fill_skips_bytes_known_zero_and_forgets_them_once_they_can_change() {
    let p = pool(64 * MIB);
    let mut a = p.alloc(8192);
    assert_eq!(a.known_zero(), 8192, "a new mapping holds the kernel's zeros");
    a.as_mut_slice().fill(0xAA);
    assert_eq!(a.known_zero(), 0, "a mutable slice was handed out");
    a.set_len(4096);
    a.fill_zero();
    assert_eq!(a.known_zero(), 4096);
    a.set_len(8192);
    assert!(a[..4096].iter().all(|&b| b == 0) && a[4096..].iter().all(|&b| b == 0xAA), "only len() is zeroed");
    let addr = a.as_slice().as_ptr();
    drop(a);
    let mut b = p.alloc(8192);
    assert_eq!(b.as_slice().as_ptr(), addr, "the same mapping, reused");
    assert_eq!(b.known_zero(), 4096, "what is known stays with the mapping");
    b.fill_zero();
    assert!(b.iter().all(|&x| x == 0), "the rest is zeroed too");
    assert_eq!(b.known_zero(), 8192);
    // Whatever could write to the bytes makes them unknown again.
    let _ = b.as_ptr();
    assert_eq!(b.known_zero(), 0, "a pointer (a device may write through it)");
    b.fill_zero();
    let _ = b.mapping_ptr();
    assert_eq!(b.known_zero(), 0, "the mapping's pointer");
    b.fill_zero();
    b.add_registration(1, 9, Box::new(()));
    assert_eq!(b.known_zero(), 0, "a registration");
    b.fill_zero();
    b[10] = 1;
    assert_eq!(b.known_zero(), 0, "a write through DerefMut");
    b.fill_zero();
    assert_eq!(b[10], 0);
    // Reading does not forget.
    assert!(b.as_slice().iter().all(|&x| x == 0));
    assert_eq!(b.known_zero(), 8192);
    let mut h = IoBuf::from_vec(vec![3u8; 10]);
    h.fill_zero();
    assert_eq!((h.as_slice(), h.known_zero()), (&[0u8; 10][..], 0), "an adopted vector is zeroed every time");
}

#[test]
fn a_thread_reuses_its_own_small_unregistered_buffers_and_a_trim_drops_registrations_at_once() {
    // Its own thread: the cache is per thread, and no other test's buffers land in it.
    std::thread::spawn(|| {
        let a = IoBuf::alloc(4096);
        let gone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Guard(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let p = a.as_ptr();
        drop(a);
        let mut b = IoBuf::alloc(4000);
        assert_eq!(b.as_ptr(), p, "the same mapping, from the thread's cache");
        // A registered buffer goes back to the shared queue: a trim (a device went away)
        // drops its registration at once, whatever this thread does next.
        b.add_registration(7, 42, Box::new(Guard(gone.clone())));
        drop(b);
        Pool::global().trim();
        assert!(gone.load(Ordering::SeqCst), "the registration was dropped by the trim");
    })
    .join()
    .expect("thread");
}
