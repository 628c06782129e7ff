//! Persistent reservations that survive a restart (APTPL, SPC-4 5.12.5) with the real riser:
//! two initiator ports register with APTPL=1, one reserves WRITE EXCLUSIVE; riser is
//! stopped (SIGTERM, then SIGKILL) and started again from its saved config with the same
//! `--state-dir`; PERSISTENT RESERVE IN shows the same keys, holder and type, and the other
//! initiator's WRITE still gets RESERVATION CONFLICT. APTPL=0 removes the state file, and a
//! torn (truncated) state file is reported in riser's log and ignored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use riser_tests::iscsi::Client;
use riser_tests::{free_port, json, Riser, TempDir};

const GOOD: u8 = 0x00;
const RESERVATION_CONFLICT: u8 = 0x18;
const WRITE_EXCLUSIVE: u8 = 1;
const REGISTER: u8 = 0x00;
const RESERVE: u8 = 0x01;

/// A logged-in session on LUN 0's target with this ISID (`None`: a new one), unit
/// attentions (POWER ON) consumed.
fn session(port: u16, iqn: &str, isid: Option<[u8; 6]>) -> Client {
    let mut c = Client::connect(port);
    if let Some(isid) = isid {
        c.isid = isid;
    }
    c.login(iqn, &[]).unwrap_or_else(|e| panic!("login to {iqn} failed: {e:?}"));
    assert!(c.clear_unit_attentions(), "TEST UNIT READY never became GOOD");
    c
}

fn pr_out_ok(c: &mut Client, sa: u8, ty: u8, key: u64, sark: u64, aptpl: bool) {
    let r = c.pr_out(sa, ty, key, sark, u8::from(aptpl));
    assert_eq!(r.status, GOOD, "PERSISTENT RESERVE OUT sa {sa} key {key:#x} sark {sark:#x}: {r:?} (sense {:?})", r.sense());
}

fn be32(d: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(d[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(d: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(d[at..at + 8].try_into().expect("8 bytes"))
}

/// READ KEYS: (PRgeneration, keys).
fn read_keys(c: &mut Client) -> (u32, Vec<u64>) {
    let d = c.pr_in(0);
    let n = be32(&d, 4) as usize;
    (be32(&d, 0), (0..n / 8).map(|i| be64(&d, 8 + 8 * i)).collect())
}

/// READ RESERVATION: (key, type) of the reservation, if any.
fn read_reservation(c: &mut Client) -> Option<(u64, u8)> {
    let d = c.pr_in(1);
    (be32(&d, 4) != 0).then(|| (be64(&d, 8), d[21] & 0x0F))
}

/// REPORT CAPABILITIES: (PTPL_C, PTPL_A).
fn ptpl(c: &mut Client) -> (bool, bool) {
    let d = c.pr_in(2);
    (d[2] & 0x01 != 0, d[3] & 0x01 != 0)
}

/// The initiator port name of a session (SPC-4 7.6.4.6): name, ",i,0x", the ISID.
fn initiator_port(c: &Client) -> String {
    let isid: String = c.isid.iter().map(|b| format!("{b:02x}")).collect();
    format!("{},i,0x{isid}", riser_tests::iscsi::INITIATOR)
}

fn write_status(c: &mut Client) -> u8 {
    c.write10(8, &[0x5A; 512]).expect("an answer to WRITE(10)")
}

fn read_status(c: &mut Client) -> u8 {
    c.read10(8, 1).expect("an answer to READ(10)").0
}

fn start(state: &Path, config: Option<&Path>) -> Riser {
    let mut args = vec!["--state-dir", state.to_str().expect("a UTF-8 path")];
    if let Some(cfg) = config {
        args.extend(["--json", cfg.to_str().expect("a UTF-8 path")]);
    }
    Riser::start_with(&args)
}

#[test]
fn reservations_with_aptpl_survive_sigterm_and_sigkill_restarts() {
    let state_tmp = TempDir::new("aptpl-state");
    // A directory riser creates itself.
    let state = state_tmp.join("state");
    let cfg_dir = TempDir::new("aptpl-cfg");
    let config = cfg_dir.join("riser.json");

    let mut riser = start(&state, None);
    let port = free_port();
    let iqn = riser.add_iscsi_target("aptpl", port, &[16]);
    let bdevs = riser.call("bdev_get_bdevs", Some(json!({"name": "aptpl_m0"}))).expect("bdev_get_bdevs");
    let uuid = bdevs[0]["uuid"].as_str().expect("the bdev's uuid").to_string();
    let file: PathBuf = state.join(format!("pr-{uuid}-lun0.json"));

    // Two initiator ports register with APTPL=1; the first reserves WRITE EXCLUSIVE.
    let mut a = session(port, &iqn, None);
    let mut b = session(port, &iqn, None);
    assert_eq!(ptpl(&mut a), (true, false), "PTPL_C with a state directory; APTPL not active yet");
    pr_out_ok(&mut a, REGISTER, 0, 0, 0xA1, true);
    assert!(file.is_file(), "REGISTER with APTPL=1 wrote no {}: {:?}", file.display(), std::fs::read_dir(&state).map(|d| d.count()));
    pr_out_ok(&mut b, REGISTER, 0, 0, 0xB2, true);
    pr_out_ok(&mut a, RESERVE, WRITE_EXCLUSIVE, 0xA1, 0, false);
    assert_eq!(ptpl(&mut a), (true, true));
    assert_eq!(write_status(&mut b), RESERVATION_CONFLICT);
    assert_eq!(write_status(&mut a), GOOD);
    let keys = read_keys(&mut a);
    assert_eq!(keys.1, vec![0xA1, 0xB2]);
    let full = b.pr_full_status();
    assert_eq!(
        full,
        vec![(0xA1, true, false, WRITE_EXCLUSIVE, initiator_port(&a)), (0xB2, false, false, 0, initiator_port(&b))],
        "holder and type before the restart"
    );
    let text = std::fs::read_to_string(&file).expect("the state file");
    assert!(text.contains("\"version\": 1") && text.contains("crc32c:") && text.contains(&initiator_port(&a)), "{text}");

    // SIGTERM, then a start from save_config's output with the same state directory.
    let out = riser.rpc(&["save_config", "-o", config.to_str().expect("a UTF-8 path")]);
    assert!(out.status.success(), "save_config: {out:?}");
    let (isid_a, isid_b) = (a.isid, b.isid);
    drop((a, b));
    let status = riser.terminate(Duration::from_secs(15)).unwrap_or_else(|| panic!("riser ignored SIGTERM:\n{}", riser.log()));
    assert!(status.success(), "riser exited with {status} on SIGTERM:\n{}", riser.log());
    drop(riser);

    let mut riser = start(&state, Some(&config));
    assert!(riser.log().contains("restored 2 registration(s) and a WRITE EXCLUSIVE reservation"), "{}", riser.log());
    let mut a = session(port, &iqn, Some(isid_a));
    let mut b = session(port, &iqn, Some(isid_b));
    assert_eq!(read_keys(&mut b), keys, "same keys and PRgeneration after SIGTERM and restart");
    assert_eq!(read_reservation(&mut b), Some((0xA1, WRITE_EXCLUSIVE)));
    assert_eq!(a.pr_full_status(), full, "same holder and type after SIGTERM and restart");
    assert_eq!(ptpl(&mut b), (true, true));
    assert_eq!(write_status(&mut b), RESERVATION_CONFLICT, "the other initiator's WRITE still conflicts");
    assert_eq!(read_status(&mut b), GOOD, "WRITE EXCLUSIVE lets others read");
    assert_eq!(write_status(&mut a), GOOD, "the holder writes");

    // A change made with APTPL in force survives a SIGKILL.
    pr_out_ok(&mut b, REGISTER, 0, 0xB2, 0xB3, true);
    drop((a, b));
    riser.kill();
    assert!(!riser.is_running());
    drop(riser);
    let mut riser = start(&state, Some(&config));
    let mut a = session(port, &iqn, Some(isid_a));
    let mut b = session(port, &iqn, Some(isid_b));
    assert_eq!(read_keys(&mut a), (keys.0 + 1, vec![0xA1, 0xB3]), "after SIGKILL");
    assert_eq!(read_reservation(&mut a), Some((0xA1, WRITE_EXCLUSIVE)));
    assert_eq!(write_status(&mut b), RESERVATION_CONFLICT);
    assert_eq!(write_status(&mut a), GOOD);

    // REGISTER with APTPL=0 removes the file; APTPL=1 brings it back.
    pr_out_ok(&mut b, REGISTER, 0, 0xB3, 0xB3, false);
    assert!(!file.exists(), "APTPL=0 left {}", file.display());
    assert_eq!(ptpl(&mut a), (true, false));
    pr_out_ok(&mut a, REGISTER, 0, 0xA1, 0xA1, true);
    assert!(file.is_file());
    drop((a, b));
    let status = riser.terminate(Duration::from_secs(15)).unwrap_or_else(|| panic!("riser ignored SIGTERM:\n{}", riser.log()));
    assert!(status.success(), "{}", riser.log());
    drop(riser);

    // A torn state file: reported, set aside, ignored; riser serves the LUN without it.
    let bytes = std::fs::read(&file).expect("the state file");
    std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate the state file");
    let mut riser = start(&state, Some(&config));
    let log = riser.log();
    let name = file.file_name().and_then(|n| n.to_str()).expect("a file name");
    assert!(log.lines().any(|l| l.contains(name) && l.contains("corrupt")), "no log line names the torn file {name}:\n{log}");
    assert!(state.join(format!("{name}.corrupt")).is_file(), "the torn file is kept aside");
    let mut a = session(port, &iqn, Some(isid_a));
    let mut b = session(port, &iqn, Some(isid_b));
    assert_eq!(read_keys(&mut a), (0, vec![]), "a torn file gives no registrations");
    assert_eq!(read_reservation(&mut a), None);
    assert_eq!(write_status(&mut b), GOOD);
    assert!(riser.is_running(), "riser survived the torn file:\n{}", riser.log());
}

#[test]
fn an_unwritable_state_dir_is_logged_and_fails_aptpl_only() {
    let tmp = TempDir::new("aptpl-bad");
    let blocker = tmp.join("a-file");
    std::fs::write(&blocker, b"not a directory").expect("write a file");
    // A directory below a regular file can never be created, not even by root.
    let state = blocker.join("state");
    let riser = start(&state, None);
    let log = riser.log();
    assert!(log.lines().any(|l| l.contains("state directory") && l.contains("a-file/state")), "no warning at start:\n{log}");
    let port = free_port();
    let iqn = riser.add_iscsi_target("aptplbad", port, &[16]);
    let mut a = session(port, &iqn, None);
    let mut b = session(port, &iqn, None);
    let r = a.pr_out(REGISTER, 0, 0, 0xA1, 1);
    assert_eq!(r.status, 0x02, "CHECK CONDITION: {r:?}");
    assert_eq!(r.sense(), Some((0x05, 0x55, 0x04)), "ILLEGAL REQUEST, INSUFFICIENT REGISTRATION RESOURCES");
    assert!(
        riser.log().lines().any(|l| l.contains("cannot write persistent reservation state") && l.contains("a-file/state/pr-")),
        "no log line names the file:\n{}",
        riser.log()
    );
    assert_eq!(read_keys(&mut a), (0, vec![]), "the failed REGISTER left nothing behind");
    // Without APTPL reservations work as ever.
    pr_out_ok(&mut a, REGISTER, 0, 0, 0xA1, false);
    pr_out_ok(&mut a, RESERVE, WRITE_EXCLUSIVE, 0xA1, 0, false);
    assert_eq!(write_status(&mut b), RESERVATION_CONFLICT);
    assert_eq!(ptpl(&mut a), (true, false));
}
