//! Reservations across gateways that cannot diverge (issue 23, item 3), on the real
//! cluster: two riser processes export one RBD image (lib/scsi/src/pr/shared.rs,
//! lib/bdev/src/modules/rbd/pr.rs).
//!
//! * **A gateway that stops answering is fenced before a change it did not follow
//!   completes, whatever the OSD's watch timeout.** The OSD times watches out after 6 s here
//!   (`osd_client_watch_timeout`, set for this check and put back after; the gateways ping
//!   every second), the gateways' lease is 30 s, and gateway B is stopped (SIGSTOP) for
//!   12 s; then Y preempts X's registration made through B, through A, and reserves. B's
//!   reservation watch outlives the OSD's default (twice the lease,
//!   lib/bdev/src/modules/rbd/pr.rs `watch_timeout_s`), so A's notify waits for B, which is
//!   fenced before the PREEMPT returns GOOD. X's WRITE, sent to the stopped B and carried
//!   out when B is continued, does not reach the image (B still holds X's registration
//!   and no reservation in memory until it re-reads); B rejoins, and X through it gets
//!   RESERVATION CONFLICT. (A watch dropped after the OSD's 6 s let the PREEMPT complete at
//!   once with B unfenced, and B wrote for X: the hole this closes.) The unit-attention log
//!   of a gateway that missed changes is unit tested (lib/scsi/src/tests/pr_diverge.rs).
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

/// Waits (`limit` at most) until `f` holds.
fn wait_for_long(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
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
    // A lease of 30 s, longer than the OSD's watch timeout: B stopped for 12 s has no
    // watch left by the OSD's own rule, but is not yet fenced by the gateway group.
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

    // --- B stops answering; A preempts X's registration made through B and reserves.
    assert_eq!(pr_out(&mut xb, REGISTER, 0, 0, 0xB1), (GOOD, None));
    assert_eq!(pr_out(&mut ya, REGISTER, 0, 0, 0xA2), (GOOD, None));
    signal(&b, "STOP");
    // Past the OSD's watch timeout (6 s) and its check of it, within the lease (30 s).
    std::thread::sleep(Duration::from_secs(12));
    let t = Instant::now();
    // The PREEMPT waits for B's acknowledgement until B is fenced (the lease): its client
    // must not give up first.
    ya.set_read_timeout(Duration::from_secs(90));
    let r = pr_out(&mut ya, PREEMPT, WRITE_EXCLUSIVE, 0xA2, 0xB1);
    let took = t.elapsed();
    assert_eq!(r, (GOOD, None), "PREEMPT through A while B is stopped");
    eprintln!("rbd_gateways pr_diverge: PREEMPT with B stopped in {took:?}");
    assert_eq!(pr_out(&mut ya, RESERVE, WRITE_EXCLUSIVE, 0xA2, 0), (GOOD, None));
    assert_eq!(ya.read10(16, 1).map(|(s, _)| s), Some(GOOD), "Y reads through A");
    // X's WRITE waits in B's socket while B is stopped; continued, B must not carry it out
    // on the registration it held (X's was preempted, Y holds WRITE EXCLUSIVE): B was
    // fenced before the PREEMPT completed, so the image refuses B's old client whatever B
    // still believes. A B whose reservation watch the OSD had dropped after its 6 s would
    // not have been waited for, and would write GOOD here.
    let pdu = xb.scsi_command(&[0x2A, 0, 0, 0, 0, 16, 0, 0, 1, 0], false, true, 512, vec![0x5A; 512]);
    xb.send(&pdu).expect("send X's WRITE to the stopped B");
    signal(&b, "CONT");
    let r = xb.reply();
    assert!(r.as_ref().is_none_or(|r| r.status != GOOD), "B wrote for X on a preempted registration:\n{}", b.riser.log());
    let (st, data) = ya.read10(16, 1).expect("READ through A");
    assert_eq!(st, GOOD);
    assert_ne!(data, vec![0x5A; 512], "X's WRITE through B reached the image");
    wait_for_long("B rejoins as a new client", Duration::from_secs(60), || b.riser.log().contains("rejoined as a new client"));
    eprintln!("rbd_gateways pr_diverge: B's log after SIGCONT:\n{}", b.riser.log().lines().filter(|l| l.contains("watch") || l.contains("fenced") || l.contains("rejoin")).collect::<Vec<_>>().join("\n"));
    // B's sessions went with its old client: X and Y log in again through B.
    let mut xb = session(&b, ISID_X);
    let mut yb = session(&b, ISID_Y);
    assert_eq!(read_keys(&mut xb), vec![0xA2]);
    assert_eq!(write_status(&mut xb), RESERVATION_CONFLICT, "Y's WRITE EXCLUSIVE, read by the rejoined B");

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
