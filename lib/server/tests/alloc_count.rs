//! Heap allocations per I/O on the reactor, in steady state: a counting global allocator
//! counts what reactor threads (named `reactor_*`) allocate while one session runs 4 KiB
//! reads and writes over the in-memory datamover (the TCP datamover on an in-memory pipe:
//! framer, Ffp, SCSI, malloc bdev, buffers). The client's own allocations run on the test
//! thread and are not counted.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;

struct Counting;

static REACTOR_ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Whether this thread is a reactor: unknown (None) until first asked.
    static IS_REACTOR: Cell<Option<bool>> = const { Cell::new(None) };
    /// Set while this thread is finding out (which may allocate).
    static ASKING: Cell<bool> = const { Cell::new(false) };
}

fn on_reactor() -> bool {
    IS_REACTOR
        .try_with(|r| match r.get() {
            Some(v) => v,
            None => {
                if ASKING.with(|a| a.replace(true)) {
                    return false;
                }
                let v = std::thread::current().name().is_some_and(|n| n.starts_with("reactor_"));
                r.set(Some(v));
                ASKING.with(|a| a.set(false));
                v
            }
        })
        .unwrap_or(false)
}

// SAFETY: every call is passed to the system allocator unchanged; the counter is a side effect.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if on_reactor() {
            REACTOR_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if on_reactor() {
            REACTOR_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if on_reactor() {
            REACTOR_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const IOS: u64 = 2000;

/// Reactor allocations per I/O over `IOS` I/Os of `op`, after as many to warm up.
fn per_io<W: Wire>(c: &mut Client<W>, mut op: impl FnMut(&mut Client<W>, u64)) -> f64 {
    for i in 0..IOS {
        op(c, i);
    }
    let before = REACTOR_ALLOCS.load(Ordering::Relaxed);
    for i in 0..IOS {
        op(c, i);
    }
    (REACTOR_ALLOCS.load(Ordering::Relaxed) - before) as f64 / IOS as f64
}

/// 4 KiB writes (immediate data, the whole write in the command PDU, as Linux sends it) and
/// 4 KiB reads, QD 1; allocations per I/O of each.
fn run<W: Wire>(c: &mut Client<W>) -> (f64, f64) {
    let data = pattern(3, 4096);
    let lbas = (2048 / 8) as u64;
    let writes = per_io(c, |c, i| good(&c.write((i % lbas) * 8, &data)));
    let reads = per_io(c, |c, i| good(&c.read((i % lbas) * 8, 4096)));
    (writes, reads)
}

/// Serialises the tests: the counter is global.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn over_tcp_4k_reads_and_writes_allocate_nothing_per_io_on_the_reactor() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let addr = format!("127.0.0.1:{port}");
    let _env = Env::tcp(&addr);
    let (mut c, _) = Client::login_over(TcpWire::connect(addr.parse().expect("address")), 1, keys(true, true, 65536));
    let (writes, reads) = run(&mut c);
    println!("TCP: reactor heap allocations per I/O: 4 KiB write {writes:.3}, 4 KiB read {reads:.3}");
    assert!(reads < 0.01, "4 KiB reads over TCP: {reads:.3} heap allocations per I/O on the reactor");
    assert!(writes < 0.01, "4 KiB writes over TCP: {writes:.3} heap allocations per I/O on the reactor");
    c.logout();
}

#[test]
fn over_tcp_on_a_file_lun_4k_reads_and_writes_allocate_nothing_per_io_on_the_reactor() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // On the build's disk, not /tmp (which may be tmpfs: no O_DIRECT).
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("alloc-count-{}.img", std::process::id()));
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let addr = format!("127.0.0.1:{port}");
    let env = Env::tcp_file(&addr, &path);
    let (mut c, _) = Client::login_over(TcpWire::connect(addr.parse().expect("address")), 1, keys(true, true, 65536));
    let (writes, reads) = run(&mut c);
    println!("TCP, file LUN (io_uring): reactor heap allocations per I/O: 4 KiB write {writes:.3}, 4 KiB read {reads:.3}");
    c.logout();
    drop(env);
    let _ = std::fs::remove_file(&path);
    assert!(reads < 0.01, "4 KiB reads from a file LUN: {reads:.3} heap allocations per I/O on the reactor");
    assert!(writes < 0.01, "4 KiB writes to a file LUN: {writes:.3} heap allocations per I/O on the reactor");
}

#[test]
fn reads_and_writes_of_4k_allocate_nothing_per_io_on_the_reactor() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::new();
    let (mut c, _) = Client::login(&env, 1, keys(true, true, 65536));
    let (writes, reads) = run(&mut c);
    println!("in memory: reactor heap allocations per I/O: 4 KiB write {writes:.3}, 4 KiB read {reads:.3}");
    assert!(reads < 0.01, "4 KiB reads: {reads:.3} heap allocations per I/O on the reactor");
    assert!(writes < 0.01, "4 KiB writes: {writes:.3} heap allocations per I/O on the reactor");
    c.logout();
}

/// 64 KiB writes with FirstBurstLength 8 KiB (InitialR2T=Yes): 8 KiB of immediate data in
/// the command, the rest solicited by an R2T. The immediate data goes straight into the
/// task's write buffer (the budget has room): copied once, never staged; and nothing is
/// allocated per I/O on the reactor.
#[test]
fn partly_immediate_writes_copy_their_immediate_data_once_and_allocate_nothing_per_io() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::new();
    let (mut c, neg) = Client::login(&env, 1, keys(true, true, 8192));
    assert_eq!((neg.first_burst, neg.immediate_data, neg.initial_r2t), (8192, true, true), "negotiated: {neg:?}");
    let copies = |env: &Env| env.call("iscsi_get_stats", serde_json::json!({}))["payload_copies"].clone();
    let data = pattern(5, 65536);
    let lbas = (2048 / 128) as u64;
    let before = copies(&env);
    let writes = per_io(&mut c, |c, i| good(&c.write((i % lbas) * 128, &data)));
    println!("in memory: reactor heap allocations per 64 KiB write (8 KiB immediate): {writes:.3}");
    // Counters are published on the connection's timer and at its end.
    c.logout();
    env.wait_connections(0);
    let after = copies(&env);
    let delta = |k: &str| after[k].as_u64().unwrap_or(u64::MAX) - before[k].as_u64().unwrap_or(0);
    let immediate = 2 * IOS * 8192;
    assert_eq!(delta("unsolicited_bytes"), immediate, "each immediate byte copied once: {before} -> {after}");
    assert_eq!(delta("staged_bytes"), 0, "none copied a second time: {after}");
    assert_eq!(delta("read_bytes"), 0, "{after}");
    assert!(writes < 0.01, "64 KiB writes, 8 KiB immediate: {writes:.3} heap allocations per I/O on the reactor");
}

/// With rate limits set on the device and on this initiator (5000 I/Os a second: I/Os
/// wait at times): the token buckets and the
/// waiting queues allocate nothing per I/O either.
#[test]
fn with_rate_limits_set_4k_reads_and_writes_allocate_nothing_per_io() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::new();
    let limits = serde_json::json!({"rw_ios_per_sec": 5000, "r_mbytes_per_sec": 100, "w_mbytes_per_sec": 100});
    let mut dev = limits.clone();
    dev["name"] = "Malloc0".into();
    assert_eq!(env.call("bdev_set_qos_limit", dev), serde_json::json!(true));
    let mut ini = limits;
    ini["name"] = TARGET.into();
    ini["initiator_name"] = riser_initiator::session::INITIATOR_NAME.into();
    assert_eq!(env.call("iscsi_target_node_set_qos_limit", ini), serde_json::json!(true));
    let (mut c, _) = Client::login(&env, 1, keys(true, true, 65536));
    let (writes, reads) = run(&mut c);
    println!("in memory, rate limits set: reactor heap allocations per I/O: 4 KiB write {writes:.3}, 4 KiB read {reads:.3}");
    let nodes = env.call("iscsi_get_target_nodes", serde_json::json!({}));
    let waited = nodes[0]["qos_limits"][0]["throttled_ios"].as_u64().unwrap_or(0);
    let stat = env.call("bdev_get_iostat", serde_json::json!({"name": "Malloc0"}));
    let waited = waited + stat["bdevs"][0]["qos_throttled_ios"].as_u64().unwrap_or(0);
    println!("I/Os that waited for the limits: {waited}");
    assert!(waited > 0, "the limits held I/Os back at times (the queues ran): {nodes}\n{stat}");
    assert!(reads < 0.01, "4 KiB reads: {reads:.3} heap allocations per I/O on the reactor");
    assert!(writes < 0.01, "4 KiB writes: {writes:.3} heap allocations per I/O on the reactor");
    c.logout();
}
