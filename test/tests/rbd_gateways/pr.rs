//! Persistent reservations across gateways (issue 15, item 3): two riser processes export
//! one RBD image (portal groups 1 and 2, same bdev uuid); the reservation state lives in
//! the RADOS object `riser_pr.<image id>` next to the image, with watch/notify between the
//! gateways (lib/scsi/src/pr/shared.rs, lib/bdev/src/modules/rbd/pr.rs).
//!
//! Initiator ports X and Y (one initiator name, two ISIDs) log in through both gateways:
//! * X registers through A without ALL_TG_PT and reserves WRITE EXCLUSIVE; through B, Y's
//!   WRITE conflicts and READ KEYS / READ RESERVATION / READ FULL STATUS show X's key and
//!   reservation; X through B is another I_T nexus, unregistered: its WRITE conflicts too.
//!   Y registers through B (seen through A); Y PREEMPTs X through B: X through A gets
//!   REGISTRATIONS PREEMPTED and then conflicts; RELEASE and CLEAR through B are seen
//!   through A.
//! * libiscsi's PersistentReserve suite through gateway A (B watching): 0 failed.
//! * X registers through A with ALL_TG_PT=1 and reserves: X through B writes, Y conflicts;
//!   READ FULL STATUS through B shows the ALL_TG_PT bit.
//! * Both gateways are killed (SIGKILL) and started again: the reservation is still there,
//!   honoured through both.

use std::time::Instant;

use riser_tests::ceph::CephCluster;
use riser_tests::compliance::run_tests;
use riser_tests::iscsi::{Client, Reply, INITIATOR};

use super::{create_image, Gateway, TARGET};

const UUID: &str = "6c0b7a1e-15a2-4a10-9a5e-0000000a1a03";
const IMAGE: &str = "gw_pr";

const GOOD: u8 = 0x00;
const CHECK_CONDITION: u8 = 0x02;
const RESERVATION_CONFLICT: u8 = 0x18;
const WRITE_EXCLUSIVE: u8 = 1;
const REGISTER: u8 = 0x00;
const RESERVE: u8 = 0x01;
const RELEASE: u8 = 0x02;
const CLEAR: u8 = 0x03;
const PREEMPT: u8 = 0x04;

/// libiscsi's persistent reservation test families.
const SUITES: [&str; 7] =
    ["PrinReadKeys", "PrinServiceactionRange", "PrinReportCapabilities", "ProutRegister", "ProutReserve", "ProutClear", "ProutPreempt"];

const ISID_X: [u8; 6] = [0x23, 0xd0, 0, 0, 0x0a, 0x01];
const ISID_Y: [u8; 6] = [0x23, 0xd0, 0, 0, 0x0a, 0x02];

/// A session through `gw` as initiator port `isid`, unit attentions consumed.
fn session(gw: &Gateway, isid: [u8; 6]) -> Client {
    let mut c = Client::connect(gw.port);
    c.isid = isid;
    c.login(TARGET, &[]).unwrap_or_else(|e| panic!("login through port group {} failed: {e:?}", gw.pg_tag));
    assert!(c.clear_unit_attentions(), "TEST UNIT READY never became GOOD");
    c
}

fn pr_out_ok(c: &mut Client, sa: u8, ty: u8, key: u64, sark: u64, flags: u8) {
    let t = Instant::now();
    let r = c.pr_out(sa, ty, key, sark, flags);
    assert_eq!(r.status, GOOD, "PERSISTENT RESERVE OUT sa {sa} key {key:#x} sark {sark:#x}: {r:?} (sense {:?})", r.sense());
    eprintln!("rbd_gateways pr: PR OUT sa {sa} in {:?}", t.elapsed());
}

fn be32(d: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(d[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(d: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(d[at..at + 8].try_into().expect("8 bytes"))
}

fn read_keys(c: &mut Client) -> Vec<u64> {
    let d = c.pr_in(0);
    let n = be32(&d, 4) as usize;
    (0..n / 8).map(|i| be64(&d, 8 + 8 * i)).collect()
}

fn read_reservation(c: &mut Client) -> Option<(u64, u8)> {
    let d = c.pr_in(1);
    (be32(&d, 4) != 0).then(|| (be64(&d, 8), d[21] & 0x0F))
}

fn port_name(isid: [u8; 6]) -> String {
    let isid: String = isid.iter().map(|b| format!("{b:02x}")).collect();
    format!("{INITIATOR},i,0x{isid}")
}

fn write(c: &mut Client) -> Reply {
    let pdu = c.scsi_command(&[0x2A, 0, 0, 0, 0, 16, 0, 0, 1, 0], false, true, 512, vec![0x5A; 512]);
    c.send(&pdu).expect("send WRITE(10)");
    c.reply().expect("an answer to WRITE(10)")
}

fn write_status(c: &mut Client) -> u8 {
    write(c).status
}

fn read_status(c: &mut Client) -> u8 {
    c.read10(16, 1).expect("an answer to READ(10)").0
}

/// Both gateways on the image.
fn gateways(ceph: &CephCluster) -> (Gateway, Gateway) {
    (Gateway::start(ceph, IMAGE, UUID, 1, &[]), Gateway::start(ceph, IMAGE, UUID, 2, &[]))
}

pub fn check(ceph: &CephCluster) {
    create_image(ceph, IMAGE, 16);
    let (a, b) = gateways(ceph);
    for gw in [&a, &b] {
        assert!(gw.riser.log().contains("persistent reservations live in rbd rbd/riser_pr."), "{}", gw.riser.log());
    }
    let mut xa = session(&a, ISID_X);
    let mut xb = session(&b, ISID_X);
    let mut ya = session(&a, ISID_Y);
    let mut yb = session(&b, ISID_Y);
    let caps = yb.pr_in(2);
    assert_eq!(caps[2] & 0x05, 0x05, "REPORT CAPABILITIES: ATP_C and PTPL_C (the state persists in the cluster): {caps:?}");
    assert_eq!(read_keys(&mut xa), Vec::<u64>::new(), "a fresh image has no registrations");

    // --- Per I_T nexus: X registers and reserves through A.
    pr_out_ok(&mut xa, REGISTER, 0, 0, 0xA1, 0);
    pr_out_ok(&mut xa, RESERVE, WRITE_EXCLUSIVE, 0xA1, 0, 0);
    assert_eq!(write_status(&mut yb), RESERVATION_CONFLICT, "Y through B under X's WRITE EXCLUSIVE made through A");
    assert_eq!(read_status(&mut yb), GOOD, "WRITE EXCLUSIVE lets others read");
    assert_eq!(read_keys(&mut yb), vec![0xA1], "READ KEYS through B");
    assert_eq!(read_reservation(&mut yb), Some((0xA1, WRITE_EXCLUSIVE)), "READ RESERVATION through B");
    assert_eq!(yb.pr_full_status(), vec![(0xA1, true, false, WRITE_EXCLUSIVE, port_name(ISID_X))], "READ FULL STATUS through B");
    assert_eq!(write_status(&mut xb), RESERVATION_CONFLICT, "X through B is another I_T nexus, not registered (no ALL_TG_PT)");
    assert_eq!(write_status(&mut xa), GOOD, "the holder writes through A");
    assert_eq!(write_status(&mut ya), RESERVATION_CONFLICT);

    // Y registers through B: A sees it.
    pr_out_ok(&mut yb, REGISTER, 0, 0, 0xB2, 0);
    assert_eq!(read_keys(&mut xa), vec![0xA1, 0xB2], "Y's registration through B, read through A");
    // X registering through B again is a second registration (another nexus), not a change.
    pr_out_ok(&mut xb, REGISTER, 0, 0, 0xC3, 0);
    assert_eq!(read_keys(&mut ya), vec![0xA1, 0xB2, 0xC3]);
    assert_eq!(write_status(&mut xb), RESERVATION_CONFLICT, "registered, but WRITE EXCLUSIVE is the holder's only");

    // Y preempts X's reservation (and X's registration through A) through B.
    pr_out_ok(&mut yb, PREEMPT, WRITE_EXCLUSIVE, 0xB2, 0xA1, 0);
    let r = write(&mut xa);
    assert_eq!((r.status, r.sense()), (CHECK_CONDITION, Some((6, 0x2A, 0x05))), "REGISTRATIONS PREEMPTED reaches X through A");
    assert_eq!(write_status(&mut xa), RESERVATION_CONFLICT, "X through A lost the reservation");
    assert_eq!(read_reservation(&mut xa), Some((0xB2, WRITE_EXCLUSIVE)), "Y holds it now, seen through A");
    assert_eq!(read_keys(&mut xa), vec![0xB2, 0xC3]);
    assert_eq!(write_status(&mut yb), GOOD);
    assert_eq!(write_status(&mut ya), RESERVATION_CONFLICT, "Y through A is not the holder (Y registered through B only)");

    // RELEASE through B ends it on A; CLEAR through B empties it on A.
    pr_out_ok(&mut yb, RELEASE, WRITE_EXCLUSIVE, 0xB2, 0, 0);
    assert_eq!(read_reservation(&mut xa), None, "RELEASE through B, read through A");
    assert_eq!(write_status(&mut xa), GOOD, "no reservation: X writes through A");
    pr_out_ok(&mut yb, CLEAR, 0, 0xB2, 0, 0);
    assert_eq!(read_keys(&mut ya), Vec::<u64>::new(), "CLEAR through B, read through A");
    let r = write(&mut xb);
    assert_eq!((r.status, r.sense()), (CHECK_CONDITION, Some((6, 0x2A, 0x03))), "RESERVATIONS PREEMPTED for X through B (CLEAR)");
    drop((xa, xb, ya, yb));

    // --- libiscsi's persistent reservation tests (PERSISTENT RESERVE IN and OUT families)
    // through gateway A, B watching every change; then with both URLs (the tests that log in
    // a second initiator use the second URL when there is one: gateway B).
    for urls in [vec![a.url()], vec![a.url(), b.url()]] {
        for family in SUITES {
            let t = Instant::now();
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            let suite = run_tests(&format!("ALL.{family}"), &urls);
            eprintln!(
                "rbd_gateways pr: {family} through {} gateway(s) in {:?}: ran {}, passed {}, failed {}, skipped {:?}",
                urls.len(),
                t.elapsed(),
                suite.ran,
                suite.passed,
                suite.failed,
                suite.skipped
            );
            assert!(
                suite.ran > 0 && suite.failed == 0,
                "{family}: failed {:?}\n{}\n--- gateway A log ---\n{}\n--- gateway B log ---\n{}",
                suite.failed_tests,
                suite.output,
                a.riser.log(),
                b.riser.log()
            );
        }
    }

    // --- ALL_TG_PT: X registers through A for every target port, and reserves.
    let mut xa = session(&a, ISID_X);
    let mut xb = session(&b, ISID_X);
    let mut yb = session(&b, ISID_Y);
    // The suite's tests unregister what they registered.
    assert_eq!(read_keys(&mut yb), Vec::<u64>::new(), "registrations left behind by the suite");
    pr_out_ok(&mut xa, REGISTER, 0, 0, 0xA3, 0x04);
    pr_out_ok(&mut xa, RESERVE, WRITE_EXCLUSIVE, 0xA3, 0, 0);
    assert_eq!(write_status(&mut xb), GOOD, "X registered with ALL_TG_PT through A holds the reservation through B");
    assert_eq!(write_status(&mut yb), RESERVATION_CONFLICT);
    assert_eq!(yb.pr_full_status(), vec![(0xA3, true, true, WRITE_EXCLUSIVE, port_name(ISID_X))], "one descriptor, ALL_TG_PT set");
    drop((xa, xb, yb));

    // --- Both gateways killed and started again: the state is the cluster's.
    drop((a, b));
    let (a, b) = gateways(ceph);
    let mut xb = session(&b, ISID_X);
    let mut ya = session(&a, ISID_Y);
    let mut yb = session(&b, ISID_Y);
    let mut xa = session(&a, ISID_X);
    assert_eq!(read_reservation(&mut ya), Some((0xA3, WRITE_EXCLUSIVE)), "after a restart of both gateways");
    assert_eq!(read_keys(&mut yb), vec![0xA3]);
    assert_eq!(write_status(&mut ya), RESERVATION_CONFLICT, "Y through A after the restart");
    assert_eq!(write_status(&mut yb), RESERVATION_CONFLICT, "Y through B after the restart");
    assert_eq!(write_status(&mut xb), GOOD, "X (ALL_TG_PT) through B after the restart");
    assert_eq!(write_status(&mut xa), GOOD, "X (ALL_TG_PT) through A after the restart");
    // Leave the image without reservations. The killed gateways' watches linger for the
    // cluster's watch timeout, and a notify waits up to the lease for them (then fences
    // them): wait until the new gateways have fenced the killed ones, which drops their
    // watches, so the CLEAR answers within the test client's 10 s.
    let t = Instant::now();
    let ids = |gw: &Gateway| -> Vec<u64> {
        let v = gw.riser.call("bdev_get_bdevs", Some(serde_json::json!({"name": "Rbd0"}))).expect("bdev_get_bdevs");
        let g = &v[0]["driver_specific"]["rbd"]["gateways"];
        g["members"].as_array().map(|m| m.iter().filter(|m| m["state"] == "live").filter_map(|m| m["id"].as_u64()).collect()).unwrap_or_default()
    };
    while ids(&a).len() > 2 || ids(&b).len() > 2 {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "the killed gateways were not fenced: {:?} {:?}", ids(&a), ids(&b));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    eprintln!("rbd_gateways pr: the killed gateways fenced {:?} after the restart", t.elapsed());
    pr_out_ok(&mut xa, CLEAR, 0, 0xA3, 0, 0);
    assert_eq!(read_keys(&mut yb), Vec::<u64>::new());
}
