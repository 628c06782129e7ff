//! rdma_probe: checks riser-rdma against a real verbs device.
//!
//! ```text
//! rdma_probe                          list devices; open each, allocate a PD, register 1 MiB,
//!                                     create a CQ, print the device limits
//! rdma_probe --loopback 192.0.2.1     also connect to itself through rdma_cm (listener and
//!            [--port 7471]            client in two threads on the same device) and check a
//!            [--size 65536]           SEND (inline), RDMA WRITEs chained with a SEND, an RDMA
//!            [--srq]                  READ, then disconnect and see the spare receives flush;
//!                                     --srq: the listener's QP receives from an SRQ
//! ```
//!
//! The last line is `RDMA_PROBE_RESULT=PASS` or `RDMA_PROBE_RESULT=FAIL <why>`; the exit code
//! is 0 or 1 (2 for a usage error). Without devices and without --loopback it reports 0
//! devices and passes.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use riser_rdma::{
    devices, Access, CmEvent, CmEventType, CmId, CompletionChannel, CompletionQueue, ConnParam, Context, EventChannel,
    MemoryRegion, ProtectionDomain, QpCaps, QpInitAttr, RdmaError, RecvWr, SendWr, SharedReceiveQueue, WcOpcode,
    WorkCompletion,
};

/// Everything waits at most this long: the soft-RoCE VM runs under TCG, 10-50x slower.
const TIMEOUT: Duration = Duration::from_secs(30);
const MAGIC: &[u8; 4] = b"RSRP";
const CTRL_SLOT: usize = 256;

struct Args {
    loopback: Option<IpAddr>,
    port: u16,
    size: usize,
    srq: bool,
}

fn usage() -> ExitCode {
    eprintln!("usage: rdma_probe [--loopback ADDR] [--port PORT] [--size BYTES] [--srq]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = Args { loopback: None, port: 7471, size: 64 * 1024, srq: false };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = match a.as_str() {
            "--loopback" | "--port" | "--size" => match it.next() {
                Some(v) => v,
                None => return usage(),
            },
            "--srq" => {
                args.srq = true;
                continue;
            }
            "-h" | "--help" => return usage(),
            _ => return usage(),
        };
        let ok = match a.as_str() {
            "--loopback" => v.parse().map(|ip| args.loopback = Some(ip)).is_ok(),
            "--port" => v.parse().map(|p| args.port = p).is_ok(),
            _ => v.parse().map(|s| args.size = s).is_ok() && args.size > 0 && args.size <= u32::MAX as usize,
        };
        if !ok {
            return usage();
        }
    }
    match run(&args) {
        Ok(()) => {
            println!("RDMA_PROBE_RESULT=PASS");
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("RDMA_PROBE_RESULT=FAIL {why}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let names = devices().map_err(|e| format!("listing devices: {e}"))?;
    println!("rdma_probe: {} verbs device(s): {:?}", names.len(), names);
    for name in &names {
        probe_device(name)?;
    }
    match EventChannel::new() {
        Ok(ch) => println!("rdma_probe: rdma_cm event channel ok (fd {})", ch.fd()),
        Err(e) => println!("rdma_probe: rdma_cm unavailable: {e}"),
    }
    let Some(ip) = args.loopback else { return Ok(()) };
    if names.is_empty() {
        return Err("--loopback needs an RDMA device (none found)".into());
    }
    loopback(SocketAddr::new(ip, args.port), args.size, args.srq)
}

/// Open the device, allocate a PD, register 1 MiB, create a CQ, print the limits.
fn probe_device(name: &str) -> Result<(), String> {
    let ctx = Context::open(name).map_err(|e| e.to_string())?;
    let a = ctx.query_device().map_err(|e| e.to_string())?;
    println!(
        "rdma_probe: {name}: fw {} vendor {:#x}/{:#x} ports {} | max_qp {} max_qp_wr {} max_sge {} max_sge_rd {} \
         max_cq {} max_cqe {} max_mr {} max_mr_size {} max_pd {} max_qp_rd_atom {} max_qp_init_rd_atom {} \
         max_srq {} max_srq_wr {} max_srq_sge {} max_mw {}",
        a.fw_ver, a.vendor_id, a.vendor_part_id, a.phys_port_cnt, a.max_qp, a.max_qp_wr, a.max_sge, a.max_sge_rd,
        a.max_cq, a.max_cqe, a.max_mr, a.max_mr_size, a.max_pd, a.max_qp_rd_atom, a.max_qp_init_rd_atom, a.max_srq,
        a.max_srq_wr, a.max_srq_sge, a.max_mw
    );
    for port in 1..=a.phys_port_cnt {
        match ctx.query_port(port) {
            Ok(p) => println!(
                "rdma_probe: {name} port {port}: {:?}, link {:?}, mtu {} (max {}), gids {}",
                p.state, p.link_layer, p.active_mtu, p.max_mtu, p.gid_tbl_len
            ),
            Err(e) => println!("rdma_probe: {name} port {port}: {e}"),
        }
    }
    let pd = ProtectionDomain::new(&ctx).map_err(|e| e.to_string())?;
    let mr = MemoryRegion::zeroed(&pd, 1 << 20, Access::DATA).map_err(|e| e.to_string())?;
    let ch = CompletionChannel::new(&ctx).map_err(|e| e.to_string())?;
    let cq = CompletionQueue::new(&ctx, 256, Some(&ch), 42).map_err(|e| e.to_string())?;
    cq.req_notify(false).map_err(|e| e.to_string())?;
    let mut wcs = [WorkCompletion::default(); 32];
    let n = cq.poll(&mut wcs).map_err(|e| e.to_string())?;
    let ev = ch.get_event().map_err(|e| e.to_string())?;
    println!(
        "rdma_probe: {name}: PD ok, MR 1 MiB lkey {:#x} rkey {:#x} at {:#x}, CQ {} entries (poll {n}, event {ev:?}), \
         completion channel fd {}",
        mr.lkey(),
        mr.rkey(),
        mr.addr(),
        cq.capacity(),
        ch.fd()
    );
    // Drop order (MR, CQ, channel, PD, context) is forced by the Arcs whatever we write here.
    Ok(())
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
}

fn first_mismatch(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or(if a.len() == b.len() { None } else { Some(a.len().min(b.len())) })
}

fn wait_event(ch: &EventChannel, want: CmEventType, who: &str) -> Result<CmEvent, String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match ch.poll_event() {
            Ok(Some(ev)) if ev.event_type == want => return Ok(ev),
            Ok(Some(ev)) if ev.event_type.is_failure() || ev.event_type == CmEventType::Disconnected => {
                return Err(format!("{who}: {:?} (status {}) while waiting for {want:?}", ev.event_type, ev.status))
            }
            Ok(Some(ev)) => println!("rdma_probe: {who}: (ignoring {:?})", ev.event_type),
            Ok(None) => {}
            Err(e) => return Err(format!("{who}: {e}")),
        }
        if Instant::now() > deadline {
            return Err(format!("{who}: timed out waiting for {want:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Polls one CQ and hands out completions by wr_id, whatever order they arrive in.
struct Poller {
    cq: Arc<CompletionQueue>,
    pending: Vec<WorkCompletion>,
    who: &'static str,
}

impl Poller {
    /// The completion of `wr_id`; it must be a success unless `flush_ok` and it was flushed.
    fn wait(&mut self, wr_id: u64, flush_ok: bool) -> Result<WorkCompletion, String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(i) = self.pending.iter().position(|w| w.wr_id == wr_id) {
                let wc = self.pending.remove(i);
                if wc.is_success() || (flush_ok && wc.is_flush()) {
                    return Ok(wc);
                }
                return Err(format!("{}: wr {wr_id} completed with {} (vendor_err {:#x})", self.who, wc.status, wc.vendor_err));
            }
            let mut wcs = [WorkCompletion::default(); 32];
            let n = self.cq.poll(&mut wcs).map_err(|e| format!("{}: {e}", self.who))?;
            self.pending.extend_from_slice(&wcs[..n]);
            if n == 0 {
                if Instant::now() > deadline {
                    return Err(format!("{}: timed out waiting for wr {wr_id} (have {:?})", self.who, self.pending));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

fn e2s<E: std::fmt::Display>(who: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{who}: {e}")
}

fn loopback(addr: SocketAddr, size: usize, use_srq: bool) -> Result<(), String> {
    println!(
        "rdma_probe: loopback through rdma_cm at {addr}, {size} bytes per RDMA op{}",
        if use_srq { ", server receives from an SRQ" } else { "" }
    );
    let t0 = Instant::now();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || server(addr, size, use_srq, ready_tx));
    let client = match ready_rx.recv_timeout(TIMEOUT) {
        Ok(()) => Some(std::thread::spawn(move || client(addr, size))),
        Err(_) => None,
    };
    let s = server.join().map_err(|_| "server thread panicked".to_string())?;
    let c = match client {
        Some(c) => c.join().map_err(|_| "client thread panicked".to_string())?,
        None => Err("client not started: the server never listened".to_string()),
    };
    s?;
    c?;
    println!("rdma_probe: loopback ok in {:.2?}: SEND, RDMA WRITE {size} B, RDMA READ {size} B verified", t0.elapsed());
    Ok(())
}

/// Passive side: the role riser's iSER target plays.
fn server(addr: SocketAddr, size: usize, use_srq: bool, ready: mpsc::Sender<()>) -> Result<(), String> {
    let who = "server";
    let ch = EventChannel::new().map_err(e2s(who))?;
    let listener = CmId::new(&ch).map_err(e2s(who))?;
    listener.bind_addr(addr).map_err(e2s(who))?;
    listener.listen(4).map_err(e2s(who))?;
    println!("rdma_probe: server: listening on {:?}", listener.local_addr());
    let _ = ready.send(());

    let mut req = wait_event(&ch, CmEventType::ConnectRequest, who)?;
    let mut id = req.new_id.take().ok_or("server: CONNECT_REQUEST without an id")?;
    println!(
        "rdma_probe: server: connect request from {:?}: responder_resources {} initiator_depth {} private data {:02x?}",
        id.peer_addr(),
        req.responder_resources,
        req.initiator_depth,
        &req.private_data[..req.private_data.len().min(8)]
    );
    let ctx = id.context().map_err(e2s(who))?.ok_or("server: request id has no device")?;
    let dev = ctx.query_device().map_err(e2s(who))?;
    let pd = ProtectionDomain::new(&ctx).map_err(e2s(who))?;
    let cq = CompletionQueue::new(&ctx, 64, None, 0).map_err(e2s(who))?;
    let ctrl_recv = MemoryRegion::zeroed(&pd, 2 * CTRL_SLOT, Access::LOCAL_WRITE).map_err(e2s(who))?;
    let mut ctrl_send = MemoryRegion::zeroed(&pd, 2 * CTRL_SLOT, Access::LOCAL_WRITE).map_err(e2s(who))?;
    let src = MemoryRegion::register(&pd, pattern(0xa5a5, size), Access::DATA).map_err(e2s(who))?;
    let dst = MemoryRegion::zeroed(&pd, size, Access::DATA).map_err(e2s(who))?;
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 1, max_inline_data: 64 };
    let srq = if use_srq { Some(SharedReceiveQueue::new(&pd, 16, 1).map_err(e2s(who))?) } else { None };
    let attr = QpInitAttr { send_cq: cq.clone(), recv_cq: cq.clone(), srq: srq.clone(), caps, sq_sig_all: false };
    let qp = id.create_qp(&pd, &attr).map_err(e2s(who))?;
    println!("rdma_probe: server: QP {} caps {:?}{}", qp.qp_num(), qp.caps(), if use_srq { " (SRQ)" } else { "" });
    // The first receive goes up before accept (iser-wire.md, setup step 2); the second is
    // never used and must come back flushed after the disconnect.
    let s0 = [ctrl_recv.sge(0, CTRL_SLOT).map_err(e2s(who))?];
    let s1 = [ctrl_recv.sge(CTRL_SLOT, CTRL_SLOT).map_err(e2s(who))?];
    let recvs = [RecvWr { wr_id: 200, sges: &s0 }, RecvWr { wr_id: 201, sges: &s1 }];
    match &srq {
        Some(srq) => {
            if !matches!(qp.post_recv(999, &s0), Err(RdmaError::InvalidArgument { .. })) {
                return Err("server: posting a receive to a QP that uses an SRQ was not refused".into());
            }
            srq.post_recvs(&recvs).map_err(e2s(who))?
        }
        None => qp.post_recvs(&recvs).map_err(e2s(who))?,
    }
    let ird = req.initiator_depth.min(dev.max_qp_rd_atom.clamp(0, 255) as u8);
    let ord = req.responder_resources.min(dev.max_qp_init_rd_atom.clamp(0, 255) as u8);
    if ord == 0 {
        return Err(format!("server: cannot issue RDMA Reads (peer IRD {}, device ORD {})", req.responder_resources, dev.max_qp_init_rd_atom));
    }
    id.accept(&ConnParam { private_data: &[0x80, 0, 0, 0], responder_resources: ird, initiator_depth: ord, ..Default::default() })
        .map_err(e2s(who))?;
    wait_event(&ch, CmEventType::Established, who)?;
    println!("rdma_probe: server: established (IRD {ird}, ORD {ord})");

    let mut poll = Poller { cq: cq.clone(), pending: Vec::new(), who };
    let qp = id.qp().ok_or("server: QP vanished")?;

    // 1. The client's hello (an inline SEND): its buffers' addresses and rkeys.
    let wc = poll.wait(200, false)?;
    if wc.opcode != WcOpcode::Recv || wc.byte_len != 32 {
        return Err(format!("server: hello: {:?}, {} bytes (want Recv, 32)", wc.opcode, wc.byte_len));
    }
    let mut hello = [0u8; 32];
    ctrl_recv.read_at(0, &mut hello).map_err(e2s(who))?;
    if &hello[..4] != MAGIC {
        return Err(format!("server: bad hello {:02x?}", &hello[..8]));
    }
    let u64_at = |o: usize| u64::from_le_bytes(hello[o..o + 8].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(hello[o..o + 4].try_into().unwrap());
    let (w_addr, w_rkey, r_addr, r_rkey, len) = (u64_at(4), u32_at(12), u64_at(16), u32_at(24), u32_at(28) as usize);
    if len != size {
        return Err(format!("server: client buffer is {len} bytes, want {size}"));
    }
    println!("rdma_probe: server: hello ok: write STag {w_rkey:#x} @ {w_addr:#x}, read STag {r_rkey:#x} @ {r_addr:#x}");

    // 2. RDMA WRITE the data (two writes, the first with two SGEs), then SEND "WDONE": one
    //    chain, one doorbell, only the SEND signaled (design.md's read path).
    let half = size / 2;
    let quarter = half / 2;
    let w1 = [src.sge(0, quarter).map_err(e2s(who))?, src.sge(quarter, half - quarter).map_err(e2s(who))?];
    let w2 = [src.sge(half, size - half).map_err(e2s(who))?];
    ctrl_send.write_at(0, b"WDONE\0\0\0").map_err(e2s(who))?;
    let done = [ctrl_send.sge(0, 8).map_err(e2s(who))?];
    let mut chain = Vec::new();
    if half > 0 {
        chain.push(SendWr::rdma_write(300, &w1, w_addr, w_rkey));
    }
    chain.push(SendWr::rdma_write(301, &w2, w_addr + half as u64, w_rkey));
    chain.push(SendWr::send(302, &done).signaled());
    qp.post_send(&chain).map_err(e2s(who))?;
    let wc = poll.wait(302, false)?;
    if wc.opcode != WcOpcode::Send {
        return Err(format!("server: WDONE completion opcode {:?}", wc.opcode));
    }
    if let Some(w) = poll.pending.iter().find(|w| w.wr_id == 300 || w.wr_id == 301) {
        return Err(format!("server: an unsignaled RDMA WRITE produced a completion: {w:?}"));
    }
    println!("rdma_probe: server: RDMA WRITE x{} + SEND chain completed", chain.len() - 1);

    // 3. RDMA READ the client's buffer and check it.
    let rd = [dst.sge(0, size).map_err(e2s(who))?];
    qp.post_send(&[SendWr::rdma_read(303, &rd, r_addr, r_rkey).signaled()]).map_err(e2s(who))?;
    let wc = poll.wait(303, false)?;
    if wc.opcode != WcOpcode::RdmaRead {
        return Err(format!("server: RDMA READ completion opcode {:?}", wc.opcode));
    }
    let mut got = vec![0u8; size];
    dst.read_at(0, &mut got).map_err(e2s(who))?;
    let read_ok = first_mismatch(&got, &pattern(0x5a5a, size));
    println!("rdma_probe: server: RDMA READ completed, data {}", if read_ok.is_none() { "ok" } else { "MISMATCH" });

    // 4. Tell the client how the read went (SEND from the second send slot).
    ctrl_send.write_at(CTRL_SLOT, &[b'R', b'D', b'O', b'N', b'E', read_ok.is_none() as u8, 0, 0]).map_err(e2s(who))?;
    let rdone = [ctrl_send.sge(CTRL_SLOT, 8).map_err(e2s(who))?];
    qp.post_send(&[SendWr::send(304, &rdone).signaled()]).map_err(e2s(who))?;
    poll.wait(304, false)?;
    if let Some(at) = read_ok {
        return Err(format!("server: RDMA READ data differs at byte {at}"));
    }

    // 5. The client disconnects; complete ours, then the spare receive must flush.
    wait_event(&ch, CmEventType::Disconnected, who)?;
    let _ = id.disconnect();
    let state = id.qp().map(|q| q.state());
    if srq.is_none() {
        let wc = poll.wait(201, true)?;
        if !wc.is_flush() {
            return Err(format!("server: spare receive completed with {} instead of a flush", wc.status));
        }
        println!("rdma_probe: server: disconnected; spare receive flushed ({}); QP state {state:?}", wc.status);
    } else {
        // An SRQ's receives belong to the SRQ, not the QP: a QP error does not flush them.
        println!("rdma_probe: server: disconnected; QP state {state:?} (the spare receive stays on the SRQ)");
    }

    // Teardown in the documented order: the QP (with its id) first, then SRQ, buffers, CQ, PD.
    drop(id);
    drop(srq);
    drop((ctrl_recv, ctrl_send, src, dst));
    drop(poll);
    drop(cq);
    drop(pd);
    drop(listener);
    drop(ch);
    Ok(())
}

/// Active side: the role riser-perf (and the Linux initiator) plays.
fn client(addr: SocketAddr, size: usize) -> Result<(), String> {
    let who = "client";
    let ch = EventChannel::new().map_err(e2s(who))?;
    let mut id = CmId::new(&ch).map_err(e2s(who))?;
    id.resolve_addr(None, addr, Duration::from_secs(10)).map_err(e2s(who))?;
    wait_event(&ch, CmEventType::AddrResolved, who)?;
    id.resolve_route(Duration::from_secs(10)).map_err(e2s(who))?;
    wait_event(&ch, CmEventType::RouteResolved, who)?;
    let ctx = id.context().map_err(e2s(who))?.ok_or("client: resolved id has no device")?;
    println!("rdma_probe: client: route to {addr} resolved on {} port {}", ctx.name(), id.port_num());
    let dev = ctx.query_device().map_err(e2s(who))?;
    let pd = ProtectionDomain::new(&ctx).map_err(e2s(who))?;
    let cch = CompletionChannel::new(&ctx).map_err(e2s(who))?;
    let cq = CompletionQueue::new(&ctx, 64, Some(&cch), 1).map_err(e2s(who))?;
    let ctrl_recv = MemoryRegion::zeroed(&pd, 3 * CTRL_SLOT, Access::LOCAL_WRITE).map_err(e2s(who))?;
    let wbuf = MemoryRegion::zeroed(&pd, size, Access::DATA).map_err(e2s(who))?;
    let rbuf = MemoryRegion::register(&pd, pattern(0x5a5a, size), Access::DATA).map_err(e2s(who))?;
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
    let attr = QpInitAttr { send_cq: cq.clone(), recv_cq: cq.clone(), srq: None, caps, sq_sig_all: false };
    id.create_qp(&pd, &attr).map_err(e2s(who))?;
    let qp = id.qp().ok_or("client: no QP")?;
    let slots: Vec<[riser_rdma::Sge; 1]> =
        (0..3).map(|i| ctrl_recv.sge(i * CTRL_SLOT, CTRL_SLOT).map(|s| [s])).collect::<Result<_, _>>().map_err(e2s(who))?;
    let recvs: Vec<RecvWr<'_>> = slots.iter().enumerate().map(|(i, s)| RecvWr { wr_id: 100 + i as u64, sges: s }).collect();
    qp.post_recvs(&recvs).map_err(e2s(who))?;
    let ird = dev.max_qp_rd_atom.clamp(1, 16) as u8;
    let ord = dev.max_qp_init_rd_atom.clamp(0, 16) as u8;
    // 0xC0: libiscsi's iser_cm_hdr flags (no zero-based VA, no send-with-invalidate).
    id.connect(&ConnParam { private_data: &[0xC0, 0, 0, 0], responder_resources: ird, initiator_depth: ord, ..Default::default() })
        .map_err(e2s(who))?;
    let est = wait_event(&ch, CmEventType::Established, who)?;
    println!(
        "rdma_probe: client: established, server private data {:02x?}",
        &est.private_data[..est.private_data.len().min(4)]
    );
    let mut poll = Poller { cq: cq.clone(), pending: Vec::new(), who };
    let qp = id.qp().ok_or("client: QP vanished")?;

    // Hello: where the server may write and read, as an inline SEND when the QP allows it.
    let mut hello = [0u8; 32];
    hello[..4].copy_from_slice(MAGIC);
    hello[4..12].copy_from_slice(&wbuf.addr().to_le_bytes());
    hello[12..16].copy_from_slice(&wbuf.rkey().to_le_bytes());
    hello[16..24].copy_from_slice(&rbuf.addr().to_le_bytes());
    hello[24..28].copy_from_slice(&rbuf.rkey().to_le_bytes());
    hello[28..32].copy_from_slice(&(size as u32).to_le_bytes());
    let inline = qp.caps().max_inline_data as usize >= hello.len();
    let send_buf;
    let sge;
    let wr = if inline {
        SendWr::send_inline(1, &hello).signaled()
    } else {
        let mut b = MemoryRegion::zeroed(&pd, 32, Access::LOCAL_WRITE).map_err(e2s(who))?;
        b.write_at(0, &hello).map_err(e2s(who))?;
        send_buf = b;
        sge = [send_buf.sge(0, 32).map_err(e2s(who))?];
        SendWr::send(1, &sge).signaled()
    };
    // Arm the CQ first: the hello's completion must raise an event on the completion channel.
    cq.req_notify(false).map_err(e2s(who))?;
    qp.post_send(&[wr]).map_err(e2s(who))?;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match cch.get_event().map_err(e2s(who))? {
            Some(1) => break,
            Some(t) => return Err(format!("client: completion event for unknown CQ token {t}")),
            None if Instant::now() > deadline => return Err("client: no completion channel event".into()),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    println!("rdma_probe: client: completion channel event for CQ token 1");
    poll.wait(1, false)?;
    println!("rdma_probe: client: hello sent ({})", if inline { "inline" } else { "registered buffer" });

    // WDONE: the server's RDMA WRITEs landed before its SEND (RC ordering).
    let wc = poll.wait(100, false)?;
    let mut msg = [0u8; 8];
    ctrl_recv.read_at(0, &mut msg).map_err(e2s(who))?;
    if wc.byte_len != 8 || &msg[..5] != b"WDONE" {
        return Err(format!("client: expected WDONE, got {} bytes {msg:02x?}", wc.byte_len));
    }
    let mut got = vec![0u8; size];
    wbuf.read_at(0, &mut got).map_err(e2s(who))?;
    if let Some(at) = first_mismatch(&got, &pattern(0xa5a5, size)) {
        return Err(format!("client: RDMA WRITE data differs at byte {at}"));
    }
    println!("rdma_probe: client: RDMA WRITE data ok");

    // RDONE: the server's verdict on its RDMA READ.
    poll.wait(101, false)?;
    ctrl_recv.read_at(CTRL_SLOT, &mut msg).map_err(e2s(who))?;
    if &msg[..5] != b"RDONE" || msg[5] != 1 {
        return Err(format!("client: server reports RDMA READ failure {msg:02x?}"));
    }
    println!("rdma_probe: client: server verified RDMA READ");

    // Disconnect; the third receive was never used and must flush.
    id.disconnect().map_err(e2s(who))?;
    wait_event(&ch, CmEventType::Disconnected, who)?;
    let wc = poll.wait(102, true)?;
    if !wc.is_flush() {
        return Err(format!("client: spare receive completed with {} instead of a flush", wc.status));
    }
    println!("rdma_probe: client: disconnected; spare receive flushed ({})", wc.status);

    drop(id);
    drop((ctrl_recv, wbuf, rbuf));
    drop(poll);
    drop(cq);
    drop(cch);
    drop(pd);
    drop(ch);
    Ok(())
}
