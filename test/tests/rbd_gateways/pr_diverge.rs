//! Reservations across gateways that cannot diverge (issue 23, item 3), on the real
//! cluster: two riser processes export one RBD image (lib/scsi/src/pr/shared.rs,
//! lib/bdev/src/modules/rbd/pr.rs).
//!
//! * **A gateway that missed a notify raises the unit attention it owes.** The OSD times
//!   watches out after 6 s here (`osd_client_watch_timeout`, set for this check and put back
//!   after; the gateways ping every second) and gateway B is stopped (SIGSTOP) long enough
//!   for the OSD to drop its watch; meanwhile Y preempts X's registration made
//!   through B. B is continued: it re-establishes its watch, re-reads the object, and X
//!   through B gets REGISTRATIONS PREEMPTED (from the unit-attention log in the object: the
//!   notify never reached B).
//! * **An undecodable object** (a newer format: `rados put` of the object with its version
//!   bumped): PR OUT through either gateway fails with HARDWARE ERROR, LOGICAL UNIT FAILED
//!   SELF-CONFIGURATION, the object is left as it is, and PR IN and the I/O checks keep the
//!   last good state. **A failed re-read is not acknowledged**: `rados notify` on the object
//!   times out (neither gateway can re-read it), where it is acknowledged at once once the
//!   object is readable again.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use riser_tests::ceph::CephCluster;
use riser_tests::json;
use riser_tests::iscsi::{Client, Reply};

use super::{create_image, Gateway, TARGET};

const UUID: &str = "6c0b7a1e-15a2-4a10-9a5e-0000000a1a23";
const IMAGE: &str = "gw_pr_diverge";

const GOOD: u8 = 0x00;
const CHECK_CONDITION: u8 = 0x02;
const RESERVATION_CONFLICT: u8 = 0x18;
const WRITE_EXCLUSIVE: u8 = 1;
const REGISTER: u8 = 0x00;
const RESERVE: u8 = 0x01;
const CLEAR: u8 = 0x03;
const PREEMPT: u8 = 0x04;

const ISID_X: [u8; 6] = [0x23, 0xd0, 0, 0, 0x0b, 0x01];
const ISID_Y: [u8; 6] = [0x23, 0xd0, 0, 0, 0x0b, 0x02];

fn session(gw: &Gateway, isid: [u8; 6]) -> Client {
    let mut c = Client::connect(gw.port);
    c.isid = isid;
    c.login(TARGET, &[]).unwrap_or_else(|e| panic!("login through port group {} failed: {e:?}", gw.pg_tag));
    assert!(c.clear_unit_attentions(), "TEST UNIT READY never became GOOD");
    c
}

fn pr_out(c: &mut Client, sa: u8, ty: u8, key: u64, sark: u64) -> (u8, Option<(u8, u8, u8)>) {
    let r = c.pr_out(sa, ty, key, sark, 0);
    (r.status, r.sense())
}

fn read_keys(c: &mut Client) -> Vec<u64> {
    let d = c.pr_in(0);
    let n = u32::from_be_bytes(d[4..8].try_into().expect("4 bytes")) as usize;
    (0..n / 8).map(|i| u64::from_be_bytes(d[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"))).collect()
}

fn command(c: &mut Client, cdb: &[u8], data: Option<Vec<u8>>) -> Reply {
    let pdu = match data {
        Some(d) => c.scsi_command(cdb, false, true, d.len() as u32, d),
        None => c.scsi_command(cdb, false, false, 0, Vec::new()),
    };
    c.send(&pdu).expect("send");
    c.reply().expect("an answer")
}

fn write_status(c: &mut Client) -> u8 {
    command(c, &[0x2A, 0, 0, 0, 0, 16, 0, 0, 1, 0], Some(vec![0x5A; 512])).status
}

fn tur(c: &mut Client) -> (u8, Option<(u8, u8, u8)>) {
    let r = command(c, &[0; 6], None);
    (r.status, r.sense())
}

fn rados(ceph: &CephCluster, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("60")
        .arg("rados")
        .arg("-c")
        .arg(ceph.conf())
        .args(["-p", "rbd"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("rados {args:?}: {e}"))
}

fn get(ceph: &CephCluster, oid: &str, dir: &std::path::Path) -> Vec<u8> {
    let f = dir.join("got");
    let out = rados(ceph, &["get", oid, f.to_str().expect("utf-8")]);
    assert!(out.status.success(), "rados get {oid}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(&f).expect("read the object's copy")
}

fn put(ceph: &CephCluster, oid: &str, dir: &std::path::Path, bytes: &[u8]) {
    let f = dir.join("put");
    std::fs::write(&f, bytes).expect("write the object's new bytes");
    let out = rados(ceph, &["put", oid, f.to_str().expect("utf-8")]);
    assert!(out.status.success(), "rados put {oid}: {}", String::from_utf8_lossy(&out.stderr));
}

fn signal(gw: &Gateway, sig: &str) {
    let pid = gw.riser.pid().expect("the gateway runs");
    let st = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().expect("kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

/// The OSD's `osd_client_watch_timeout` for the time of the check (put back on drop: the
/// other checks use the default).
struct WatchTimeout<'a>(&'a CephCluster);

impl<'a> WatchTimeout<'a> {
    fn set(ceph: &'a CephCluster, secs: u32) -> WatchTimeout<'a> {
        let out = ceph_cmd(ceph, &["config", "set", "osd", "osd_client_watch_timeout", &secs.to_string()]);
        assert!(out.status.success(), "ceph config set: {}", String::from_utf8_lossy(&out.stderr));
        WatchTimeout(ceph)
    }
}

impl Drop for WatchTimeout<'_> {
    fn drop(&mut self) {
        let _ = ceph_cmd(self.0, &["config", "rm", "osd", "osd_client_watch_timeout"]);
    }
}

fn ceph_cmd(ceph: &CephCluster, args: &[&str]) -> Output {
    Command::new("timeout").arg("60").arg("ceph").arg("-c").arg(ceph.conf()).args(args).output().unwrap_or_else(|e| panic!("ceph {args:?}: {e}"))
}

/// Waits (20 s at most) until `f` holds.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn check(ceph: &CephCluster) {
    create_image(ceph, IMAGE, 16);
    let dir = riser_tests::TempDir::new("pr_diverge");
    // Watches expire 6 s after a gateway stops answering (the OSD's setting; the gateways'
    // clients ping every second instead of every 5 s).
    let _timeout = WatchTimeout::set(ceph, 6);
    let conf_gw = dir.join("ceph-gw.conf");
    let conf = std::fs::read_to_string(ceph.conf()).expect("the cluster's ceph.conf");
    std::fs::write(&conf_gw, conf.replacen("[global]\n", "[global]\nobjecter tick interval = 1\n", 1)).expect("write ceph-gw.conf");
    // A lease of 30 s: B stopped for 12 s misses a notify (its reservation watch expired
    // after 6 s, so A does not wait for it) without being fenced by the gateway group, which
    // is the case this check is about (a fenced gateway drops its sessions and rejoins).
    let lease = json!({"lease_s": 30});
    let a = Gateway::start_conf(ceph, &conf_gw, IMAGE, UUID, 1, &[], lease.clone());
    let b = Gateway::start_conf(ceph, &conf_gw, IMAGE, UUID, 2, &[], lease);
    let log = a.riser.log();
    let oid = log
        .split("persistent reservations live in rbd rbd/")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no shared reservation object in A's log:\n{log}"))
        .to_string();
    let mut xb = session(&b, ISID_X);
    let mut ya = session(&a, ISID_Y);
    let mut yb = session(&b, ISID_Y);

    // --- B misses the notify of a preemption of X's registration made through B.
    assert_eq!(pr_out(&mut xb, REGISTER, 0, 0, 0xB1), (GOOD, None));
    assert_eq!(pr_out(&mut ya, REGISTER, 0, 0, 0xA2), (GOOD, None));
    signal(&b, "STOP");
    // Past B's watch timeout (6 s) and the OSD's check of it.
    std::thread::sleep(Duration::from_secs(12));
    let t = Instant::now();
    let r = pr_out(&mut ya, PREEMPT, WRITE_EXCLUSIVE, 0xA2, 0xB1);
    signal(&b, "CONT");
    assert_eq!(r, (GOOD, None), "PREEMPT through A while B is stopped");
    eprintln!("rbd_gateways pr_diverge: PREEMPT with B stopped in {:?}", t.elapsed());
    assert_eq!(pr_out(&mut ya, RESERVE, WRITE_EXCLUSIVE, 0xA2, 0), (GOOD, None));
    wait_for("B re-establishes its watch", || b.riser.log().contains("watch re-established"));
    eprintln!("rbd_gateways pr_diverge: B's log after SIGCONT:\n{}", b.riser.log().lines().filter(|l| l.contains("watch") || l.contains("reservation")).collect::<Vec<_>>().join("\n"));
    let mut got = None;
    wait_for("X through B gets REGISTRATIONS PREEMPTED", || {
        let r = tur(&mut xb);
        if r.0 == CHECK_CONDITION {
            got = r.1;
        }
        got.is_some()
    });
    assert_eq!(got, Some((6, 0x2A, 0x05)), "the unit attention B owed X:\n{}", b.riser.log());
    assert_eq!(read_keys(&mut xb), vec![0xA2]);
    assert_eq!(write_status(&mut xb), RESERVATION_CONFLICT, "Y's WRITE EXCLUSIVE, read by B after its watch came back");

    // --- An object this riser cannot decode (a newer format).
    let good = get(ceph, &oid, dir.path());
    let text = String::from_utf8(good.clone()).expect("the object is JSON");
    assert!(text.contains("\"version\": 1"), "{text}");
    let newer = text.replacen("\"version\": 1", "\"version\": 2", 1).into_bytes();
    put(ceph, &oid, dir.path(), &newer);
    for (c, gw) in [(&mut ya, "A"), (&mut yb, "B")] {
        assert_eq!(pr_out(c, REGISTER, 0, 0, 0xC3), (CHECK_CONDITION, Some((4, 0x4C, 0x00))), "PR OUT through {gw}");
    }
    assert_eq!(pr_out(&mut ya, CLEAR, 0, 0xA2, 0), (CHECK_CONDITION, Some((4, 0x4C, 0x00))), "CLEAR through A");
    assert_eq!(get(ceph, &oid, dir.path()), newer, "the undecodable object was overwritten");
    assert!(a.riser.log().contains("cannot be decoded"), "{}", a.riser.log());
    // PR IN and the I/O checks: the last good state.
    assert_eq!(read_keys(&mut yb), vec![0xA2]);
    assert_eq!(write_status(&mut xb), RESERVATION_CONFLICT);
    assert_eq!(write_status(&mut ya), GOOD);
    // A notify on it: neither gateway can re-read the object, neither acknowledges.
    let t = Instant::now();
    let out = rados(ceph, &["notify", &oid, "re-read"]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!("rbd_gateways pr_diverge: rados notify on the undecodable object: {:?} in {:?}: {stderr}", out.status, t.elapsed());
    assert!(!out.status.success() || stderr.contains("timed out"), "a gateway acknowledged a notify it could not follow: {stderr}");
    for (gw, name) in [(&a, "A"), (&b, "B")] {
        assert!(gw.riser.log().contains("not acknowledging it"), "gateway {name}:\n{}", gw.riser.log());
    }
    // Readable again: the gateways follow (the owed re-read), and acknowledge.
    put(ceph, &oid, dir.path(), &good);
    let out = rados(ceph, &["notify", &oid, "re-read"]);
    assert!(out.status.success(), "rados notify on a readable object: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(pr_out(&mut yb, REGISTER, 0, 0, 0xC3), (GOOD, None));
    assert_eq!(read_keys(&mut ya), vec![0xA2, 0xC3]);
    assert_eq!(pr_out(&mut ya, CLEAR, 0, 0xA2, 0), (GOOD, None));
    assert_eq!(tur(&mut yb), (CHECK_CONDITION, Some((6, 0x2A, 0x03))), "CLEAR through A: RESERVATIONS PREEMPTED for Y through B");
    assert_eq!(read_keys(&mut yb), Vec::<u64>::new());
}
