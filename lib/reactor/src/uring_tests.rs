//! The io_uring readiness of `uring.rs` on socket pairs: readable after a write, not after
//! a drain, a partly read socket still readable, a poll that ended armed again, and a
//! removed descriptor's late completion ignored by the slot's next owner.

use super::*;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    (a, b)
}

/// Reads what `s` holds; whether it found the end (fewer bytes than asked).
fn drain(s: &mut UnixStream) -> usize {
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        match s.read(&mut buf) {
            Ok(n) => {
                total += n;
                if n < buf.len() {
                    return total;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return total,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn ready_after_a_write_not_after_a_drain_and_still_ready_when_read_partly() {
    let mut u = UringReady::new().expect("io_uring with multishot poll (kernel 5.13+)");
    let (mut a, mut peer) = pair();
    let id = u.add(a.as_raw_fd(), 1);
    u.check();
    assert_eq!(u.readable(id), Some(true), "nothing known yet: readable until found empty");
    assert_eq!(drain(&mut a), 0);
    u.drained(id);
    let enters = u.enters;
    for _ in 0..1000 {
        u.check();
    }
    assert_eq!(u.readable(id), Some(false), "an empty socket");
    assert_eq!(u.enters, enters, "idle passes entered the kernel");
    peer.write_all(&[7u8; 100]).unwrap();
    // The poll's completion may come as task work the kernel runs at the next entry
    // (flagged in shared memory): a few passes at most.
    for _ in 0..100 {
        u.check();
        if u.readable(id) == Some(true) {
            break;
        }
    }
    assert_eq!(u.readable(id), Some(true), "data came");
    // Read partly: still readable next pass, with no new completion.
    let mut ten = [0u8; 10];
    a.read_exact(&mut ten).unwrap();
    u.check();
    assert_eq!(u.readable(id), Some(true), "90 bytes still in the socket");
    assert_eq!(drain(&mut a), 90);
    u.drained(id);
    u.check();
    assert_eq!(u.readable(id), Some(false));
    // EOF is an event too.
    drop(peer);
    for _ in 0..100 {
        u.check();
        if u.readable(id) == Some(true) {
            break;
        }
    }
    assert_eq!(u.readable(id), Some(true), "the peer hung up");
    assert!(u.remove(id));
    assert_eq!(u.readable(id), None, "a removed descriptor");
}

#[test]
fn a_multishot_poll_that_ends_is_armed_again() {
    let mut u = UringReady::new().unwrap();
    let (mut a, mut peer) = pair();
    let id = u.add(a.as_raw_fd(), 1);
    u.check();
    drain(&mut a);
    u.drained(id);
    // End the poll as the kernel would (a cancellation: no IORING_CQE_F_MORE).
    u.push(opcode::PollRemove::new(id).build().user_data(CANCEL));
    let _ = u.enter();
    for _ in 0..100 {
        u.check();
        if u.rearms > 0 {
            break;
        }
    }
    assert_eq!(u.rearms, 1, "the ended poll was not armed again");
    drain(&mut a);
    u.drained(id);
    u.check();
    assert_eq!(u.readable(id), Some(false));
    peer.write_all(b"after").unwrap();
    for _ in 0..100 {
        u.check();
        if u.readable(id) == Some(true) {
            break;
        }
    }
    assert_eq!(u.readable(id), Some(true), "data after the re-arm went unseen");
}

#[test]
fn a_removed_descriptors_late_completion_is_ignored() {
    let mut u = UringReady::new().unwrap();
    let (mut a, mut pa) = pair();
    let (mut b, _pb) = pair();
    let ida = u.add(a.as_raw_fd(), 1);
    u.check();
    drain(&mut a);
    u.drained(ida);
    // Data for a, whose completion is not looked at before a goes.
    pa.write_all(b"late").unwrap();
    assert!(u.remove(ida));
    // b takes a's slot under another id.
    let idb = u.add(b.as_raw_fd(), 2);
    assert_ne!(ida, idb);
    assert_eq!(ida >> 32, idb >> 32, "b did not reuse a's slot");
    // b is empty: its reader says so before any pass looks at the queue, which holds a's
    // data completion and a's last one (cancelled).
    assert_eq!(drain(&mut b), 0);
    u.drained(idb);
    for _ in 0..100 {
        u.check();
    }
    assert_eq!(u.readable(idb), Some(false), "a's completion was taken for b's");
    assert_eq!(u.rearms, 0, "a's cancelled poll was armed again for b");
    assert_eq!(u.readable(ida), None);
    assert!(!u.remove(ida), "removed twice");
    drop(a);
}
