//! Gateway liveness and fencing (issue 23, item 1): two riser gateways A and B export one
//! RBD image and know each other through the group object `riser_gw.<image id>`
//! (lib/bdev/src/modules/rbd/group.rs; `bdev_get_bdevs`' `driver_specific.rbd.gateways`).
//!
//! * A is stopped (SIGSTOP) beyond the lease (the default 10 s): B fences it — A's client
//!   address is on the OSD blocklist (`ceph osd blocklist ls`), B's view lists A fenced —
//!   and B's I/O goes on meanwhile.
//! * A is continued (SIGCONT): a WRITE sent through A's old session at once does not reach
//!   the image (B reads the blocks unchanged) and does not complete GOOD; A logs that it was
//!   fenced, rejoins as a new member (a new client id) within a generous bound, and I/O
//!   through A works again (B reads what A wrote), persistent reservations included (A's
//!   shared-state handles moved to its new connection).
//! * The new A takes a WRITE EXCLUSIVE reservation and is killed (SIGKILL): B enforces it;
//!   B's next PR OUT fences the silent A (its watch lingers) before it returns GOOD; B
//!   fences it within the lease and some slack either way.

use std::process::Command;
use std::time::{Duration, Instant};

use riser_tests::ceph::CephCluster;
use riser_tests::iscsi::Client;
use riser_tests::{json, Value};

use super::{create_image, Gateway, TARGET};

const UUID: &str = "6c0b7a1e-15a2-4a10-9a5e-00000000fe0c";
const IMAGE: &str = "gw-fencing";
/// The default lease (bdev_rbd_create without lease_s).
const LEASE: Duration = Duration::from_secs(10);
/// What a fence may take beyond the lease here: the notify timeout of a round, the
/// monitors committing the blocklist, a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(30);
const GOOD: u8 = 0;
/// PERSISTENT RESERVE OUT service actions REGISTER, RESERVE, CLEAR; type WRITE EXCLUSIVE.
const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const CLEAR: u8 = 3;
const WRITE_EXCLUSIVE: u8 = 1;
const RESERVATION_CONFLICT: u8 = 0x18;
const CHECK_CONDITION: u8 = 0x02;

/// PERSISTENT RESERVE IN READ KEYS: the registered keys.
fn read_keys(c: &mut Client) -> Vec<u64> {
    let d = c.pr_in(0);
    let n = d.get(4..8).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    (0..n / 8).filter_map(|i| d.get(8 + 8 * i..16 + 8 * i)).map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes"))).collect()
}

/// `driver_specific.rbd.gateways` of `Rbd0` on `gw`.
fn view(gw: &Gateway) -> Value {
    let b = gw.riser.call("bdev_get_bdevs", Some(json!({"name": "Rbd0"}))).unwrap_or_else(|e| panic!("bdev_get_bdevs: {e}\n{}", gw.riser.log()));
    b[0]["driver_specific"]["rbd"]["gateways"].clone()
}

/// The state of member `id` in `v` ("live", "fenced"), if listed.
fn state_of(v: &Value, id: u64) -> Option<String> {
    v["members"].as_array()?.iter().find(|m| m["id"].as_u64() == Some(id)).and_then(|m| m["state"].as_str().map(str::to_string))
}

/// Waits up to `limit` for `f`; panics with `what` and the gateways' logs.
fn wait_for(what: &str, limit: Duration, gws: &[&Gateway], mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        if t.elapsed() > limit {
            let logs: Vec<String> = gws.iter().map(|g| format!("--- gateway pg {} log:\n{}", g.pg_tag, g.riser.log())).collect();
            panic!("fencing: {what} did not happen within {limit:?}\n{}", logs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    t.elapsed()
}

/// `ceph -c CONF osd blocklist ls` (stdout and stderr: the count goes to stderr).
fn blocklist(ceph: &CephCluster) -> String {
    let o = Command::new("ceph").arg("-c").arg(ceph.conf()).args(["osd", "blocklist", "ls"]).output().expect("run ceph osd blocklist ls");
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The `ip:port/nonce` part of an address as rados_getaddrs gives it (`v2:1.2.3.4:0/5`,
/// `[v2:...,v1:...]`), as the blocklist lists it.
fn addr_key(addr: &str) -> String {
    let first = addr.trim_start_matches('[').split(',').next().unwrap_or(addr).trim_end_matches(']');
    first.trim_start_matches("v2:").trim_start_matches("v1:").trim_start_matches("any:").to_string()
}

fn session(gw: &Gateway) -> Client {
    let mut c = Client::connect(gw.port);
    c.login(TARGET, &[]).unwrap_or_else(|e| panic!("login through port group {} failed: {e:?}\n{}", gw.pg_tag, gw.riser.log()));
    assert!(c.clear_unit_attentions(), "TEST UNIT READY never became GOOD through pg {}", gw.pg_tag);
    c
}

fn read_block(c: &mut Client, lba: u32) -> Vec<u8> {
    let (st, data) = c.read10(lba, 1).expect("an answer to READ(10)");
    assert_eq!(st, GOOD, "READ(10) at {lba}");
    data
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
    assert!(st.is_ok_and(|s| s.success()), "kill -{sig} {pid} failed");
}

/// Both gateways list `ids` live.
fn all_live(gws: &[&Gateway], ids: &[u64]) -> bool {
    gws.iter().all(|g| {
        let v = view(g);
        ids.iter().all(|id| state_of(&v, *id).as_deref() == Some("live"))
    })
}

/// WRITE(10) of one block of `byte` at `lba`; a unit attention (CHECK CONDITION: ALUA states
/// move when a gateway is fenced or rejoins) is taken and the write sent again, three times
/// at most. The last status.
fn write_past_ua(c: &mut Client, lba: u32, byte: u8) -> Option<u8> {
    let mut st = c.write10(lba, &[byte; 512]);
    for _ in 0..3 {
        if st != Some(CHECK_CONDITION) {
            break;
        }
        st = c.write10(lba, &[byte; 512]);
    }
    st
}

pub fn check(ceph: &CephCluster) {
    create_image(ceph, IMAGE, 16);
    let mut a = Gateway::start(ceph, IMAGE, UUID, 1, &[]);
    let b = Gateway::start(ceph, IMAGE, UUID, 2, &[]);
    let (va, vb) = (view(&a), view(&b));
    let a_id = va["me"].as_u64().unwrap_or_else(|| panic!("no gateways view on A: {va}"));
    let b_id = vb["me"].as_u64().unwrap_or_else(|| panic!("no gateways view on B: {vb}"));
    assert_ne!(a_id, b_id);
    assert_eq!(va["lease_s"], LEASE.as_secs(), "{va}");
    wait_for("both gateways listing each other live", Duration::from_secs(30), &[&a, &b], || all_live(&[&a, &b], &[a_id, b_id]));
    let a_addr = view(&b)["members"].as_array().and_then(|m| m.iter().find(|m| m["id"] == a_id).map(|m| m["addr"].as_str().unwrap_or("").to_string()));
    let a_addr = a_addr.filter(|s| !s.is_empty()).expect("A's address in B's view");
    eprintln!("fencing: A is client {a_id} at {a_addr}, B is client {b_id}");

    let mut ca = session(&a);
    let mut cb = session(&b);
    assert_eq!(ca.write10(10, &[0xA1; 512]), Some(GOOD), "write through A");
    assert_eq!(cb.write10(11, &[0xB1; 512]), Some(GOOD), "write through B");

    // 1. A stopped beyond the lease: B fences it, B's I/O goes on.
    let a_pid = a.riser.pid().expect("A runs");
    signal(a_pid, "STOP");
    let t = Instant::now();
    let mut i = 0u8;
    let took = wait_for("B fencing the stopped A", LEASE + SLACK, &[&b], || {
        i = i.wrapping_add(1);
        assert_eq!(cb.write10(20, &[i; 512]), Some(GOOD), "B's I/O stopped while A was stopped");
        state_of(&view(&b), a_id).as_deref() == Some("fenced")
    });
    eprintln!("fencing: stopped A fenced by B after {took:?}");
    assert!(t.elapsed() >= LEASE, "A was fenced before its lease ran out ({:?})", t.elapsed());
    let bl = blocklist(ceph);
    assert!(bl.contains(&addr_key(&a_addr)), "A's address {a_addr} is not on the blocklist:\n{bl}");
    assert!(b.riser.log().contains(&format!("blocklisted {a_addr}")), "B did not log the blocklisting:\n{}", b.riser.log());
    assert_eq!(cb.write10(21, &[0xB2; 512]), Some(GOOD), "write through B after the fence");

    // 2. A continued: its first write must not reach the image; A notices, rejoins as a new client.
    signal(a_pid, "CONT");
    let st = ca.write10(30, &[0xA2; 512]);
    eprintln!("fencing: a write through A right after SIGCONT: status {st:?} (None: the connection closed)");
    assert_ne!(st, Some(GOOD), "a write through the fenced A completed GOOD");
    assert_eq!(read_block(&mut cb, 30), vec![0u8; 512], "a write through the fenced A reached the image");
    wait_for("A logging that it was fenced", Duration::from_secs(30), &[&a], || a.riser.log().contains("was fenced by the others"));
    let took = wait_for("A rejoining as a new member", Duration::from_secs(90), &[&a, &b], || {
        let v = view(&a);
        let me = v["me"].as_u64().unwrap_or(a_id);
        me != a_id && v["fenced"] == false && state_of(&view(&b), me).as_deref() == Some("live")
    });
    let a2_id = view(&a)["me"].as_u64().expect("A's new id");
    eprintln!("fencing: A rejoined as client {a2_id} {took:?} after SIGCONT");
    assert!(a.riser.log().contains("rejoined as a new client"), "{}", a.riser.log());
    assert_eq!(state_of(&view(&a), a_id).as_deref(), Some("fenced"), "A's old incarnation stays listed fenced");
    // I/O through A works again (a new session: the target layer may drop the fenced ones).
    drop(ca);
    let mut ca = session(&a);
    let mut ok = false;
    for _ in 0..20 {
        if ca.write10(31, &[0xA3; 512]) == Some(GOOD) {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(ok, "I/O through A does not work after it rejoined:\n{}", a.riser.log());
    assert_eq!(read_block(&mut cb, 31), vec![0xA3u8; 512], "B does not read what the rejoined A wrote");
    assert_eq!(read_block(&mut ca, 21), vec![0xB2u8; 512], "the rejoined A does not read what B wrote");
    assert_eq!(read_block(&mut cb, 30), vec![0u8; 512], "the fenced write showed up later");
    // The shared state (persistent reservations) moved to A's new connection too: a key
    // registered through A is seen through B, and one registered through B through A.
    assert_eq!(ca.pr_out(REGISTER, 0, 0, 0xA4, 0).status, GOOD, "PR OUT REGISTER through the rejoined A");
    assert_eq!(read_keys(&mut cb), vec![0xA4], "B does not see the key registered through the rejoined A");
    assert_eq!(cb.pr_out(REGISTER, 0, 0, 0xB4, 0).status, GOOD, "PR OUT REGISTER through B");
    let mut keys = read_keys(&mut ca);
    keys.sort_unstable();
    assert_eq!(keys, vec![0xA4, 0xB4], "the rejoined A does not see the key registered through B");
    assert_eq!(ca.pr_out(REGISTER, 0, 0xA4, 0, 0).status, GOOD, "unregister through A");
    assert_eq!(cb.pr_out(REGISTER, 0, 0xB4, 0, 0).status, GOOD, "unregister through B");

    // 3. A WRITE EXCLUSIVE reservation taken through the new A, then A killed: B enforces
    // it. B's next PERSISTENT RESERVE OUT waits for the acknowledgement of A's lingering
    // watch, and fences A before it returns GOOD. A is fenced within the lease and some slack.
    let a2_addr = view(&a)["members"].as_array().and_then(|m| m.iter().find(|m| m["id"] == a2_id).map(|m| m["addr"].as_str().unwrap_or("").to_string()));
    let a2_addr = a2_addr.filter(|s| !s.is_empty()).expect("A's new address");
    assert_eq!(ca.pr_out(REGISTER, 0, 0, 0xA5, 0).status, GOOD, "REGISTER through A");
    assert_eq!(ca.pr_out(RESERVE, WRITE_EXCLUSIVE, 0xA5, 0, 0).status, GOOD, "RESERVE WRITE EXCLUSIVE through A");
    assert_eq!(write_past_ua(&mut cb, 41, 0xB4), Some(RESERVATION_CONFLICT), "a write through B while A holds WRITE EXCLUSIVE");
    drop(ca);
    a.riser.kill();
    assert_eq!(write_past_ua(&mut cb, 41, 0xB4), Some(RESERVATION_CONFLICT), "a write through B after the holder's gateway was killed");
    assert_eq!(read_block(&mut cb, 41), vec![0u8; 512], "reads through B are not reserved");
    // It may wait the whole lease for A's acknowledgement, then fence A.
    cb.set_read_timeout(LEASE + SLACK);
    let t = Instant::now();
    let mut r = cb.pr_out(REGISTER, 0, 0, 0xB5, 0).status;
    if r == CHECK_CONDITION {
        // A unit attention first (the fence may have moved the ALUA states already).
        r = cb.pr_out(REGISTER, 0, 0, 0xB5, 0).status;
    }
    eprintln!("fencing: PR OUT through B with the killed A's watch lingering: {r:#x} after {:?}", t.elapsed());
    assert_eq!(r, GOOD, "REGISTER through B");
    let bl = blocklist(ceph);
    assert!(bl.contains(&addr_key(&a2_addr)), "B's PR OUT completed before the silent A ({a2_addr}) was fenced:\n{bl}");
    let took = wait_for("B fencing the killed A", LEASE + SLACK, &[&b], || state_of(&view(&b), a2_id).as_deref() == Some("fenced"));
    eprintln!("fencing: killed A fenced by B after {took:?}");
    // The fence moved the ALUA states: B's nexus has ASYMMETRIC ACCESS STATE CHANGED to
    // report first, then the answer.
    assert_eq!(write_past_ua(&mut cb, 41, 0xB4), Some(RESERVATION_CONFLICT), "the reservation held through the fenced A still holds");
    assert_eq!(cb.pr_out(CLEAR, 0, 0xB5, 0, 0).status, GOOD, "CLEAR through B");
    assert_eq!(cb.write10(40, &[0xB3; 512]), Some(GOOD), "write through B after A was killed");
    assert_eq!(state_of(&view(&b), b_id).as_deref(), Some("live"));
}
