//! The TCP datamover on a real reactor: a pass reads the socket only when the reactor's
//! readiness check found data in it, and what comes later is still received.

use super::*;
use riser_iscsi::testing::nop_out;
use riser_reactor::{PollMode, PollStatus, ReactorConfig, ReactorSet};
use std::net::TcpListener;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A socket that counts the reads asked of it.
struct Counted {
    s: TcpStream,
    reads: Arc<AtomicUsize>,
}

impl Read for Counted {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.s.read(b)
    }
}

impl Write for Counted {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.s.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.s.flush()
    }
}

impl ByteStream for Counted {
    fn set_read_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        ByteStream::set_read_timeout(&mut self.s, timeout)
    }
    fn set_nonblocking(&mut self) -> std::io::Result<()> {
        ByteStream::set_nonblocking(&mut self.s)
    }
    fn shutdown(&mut self) {
        ByteStream::shutdown(&mut self.s)
    }
    fn peer_addr(&self) -> Option<SocketAddr> {
        ByteStream::peer_addr(&self.s)
    }
    fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.s.as_fd())
    }
}

fn wait_for(what: &str, f: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_pass_reads_only_a_socket_with_data_and_data_that_comes_later_is_received() {
    let set = ReactorSet::start(ReactorConfig { cores: vec![0], mode: PollMode::Busy, ring_size: 64, pin: false }).unwrap();
    let h = set.handle();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    // Two connections on the reactor (with one, the reactor skips the check: it would cost
    // what one read costs); the first is driven, the second stays idle.
    let reads = Arc::new(AtomicUsize::new(0));
    let (passes, pdus) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let ended = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    let mut dms = Vec::new();
    for _ in 0..2 {
        clients.push(TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let (s, _) = l.accept().unwrap();
        dms.push(TcpDatamover::new(Counted { s, reads: reads.clone() }, &[]).unwrap());
    }
    let (p2, n2, e2) = (passes.clone(), pdus.clone(), ended.clone());
    h.call(0, move |ctx| {
        let mut ev = Vec::new();
        ctx.add_poller(move |_| {
            for dm in dms.iter_mut() {
                dm.poll(&mut ev);
            }
            for e in ev.drain(..) {
                match e {
                    DmEvent::Control(_) => n2.fetch_add(1, Ordering::Relaxed),
                    DmEvent::Terminated(_) => e2.fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
            }
            p2.fetch_add(1, Ordering::Relaxed);
            PollStatus::Idle
        });
    })
    .unwrap();
    let mut c = clients.remove(0);
    let nop = |i: u32| Pdu::with_data(Op::NopOut(nop_out(Itt(i), Sn(i))), Vec::new()).to_bytes(Digests::default()).unwrap();
    for round in 1..=3usize {
        // Idle: thousands of passes, no read (the pass that joined the reactor's set reads
        // each socket once without knowing; each PDU takes a read or two).
        let (p0, r0) = (passes.load(Ordering::Relaxed), reads.load(Ordering::Relaxed));
        wait_for("the reactor made no passes", &|| passes.load(Ordering::Relaxed) >= p0 + 2000);
        let idle_reads = reads.load(Ordering::Relaxed) - r0;
        assert!(idle_reads <= 2, "round {round}: {idle_reads} reads of an idle socket in 2000 passes");
        c.write_all(&nop(round as u32)).unwrap();
        wait_for("the NOP-Out never arrived", &|| pdus.load(Ordering::Relaxed) >= round);
    }
    assert!(reads.load(Ordering::Relaxed) <= 9, "{} reads for 3 PDUs", reads.load(Ordering::Relaxed));
    // Closed by the initiator: the reactor's check sees the end of the stream.
    let r0 = reads.load(Ordering::Relaxed);
    drop(c);
    wait_for("EOF never read", &|| ended.load(Ordering::Relaxed) == 1);
    assert!(reads.load(Ordering::Relaxed) > r0);
    set.shutdown();
}
