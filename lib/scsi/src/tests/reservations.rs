//! Persistent reservations and RESERVE/RELEASE.

use super::*;

fn prout(sa: u8, ty: u8, key: u64, sark: u64) -> (Vec<u8>, Vec<u8>) {
    let mut c = vec![0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_OUT;
    c[1] = sa;
    c[2] = ty;
    c[8] = 24;
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    (c, p)
}

fn prin(sa: u8) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_IN;
    c[1] = sa;
    c[7] = 0x10;
    c
}

impl Env {
    fn pr_ok(&mut self, n: &Arc<Nexus>, sa: u8, ty: u8, key: u64, sark: u64) {
        let (c, p) = prout(sa, ty, key, sark);
        self.ok(n, &c, 24, Some(p));
    }
    fn pr_conflict(&mut self, n: &Arc<Nexus>, sa: u8, ty: u8, key: u64, sark: u64) {
        let (c, p) = prout(sa, ty, key, sark);
        self.conflict(n, &c, 24, Some(p));
    }
    fn keys(&mut self, n: &Arc<Nexus>) -> (u32, Vec<u64>) {
        let d = self.ok(n, &prin(0), 4096, None);
        let gen = u32::from_be_bytes(d[0..4].try_into().unwrap());
        let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
        (
            gen,
            d[8..8 + len]
                .chunks(8)
                .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
                .collect(),
        )
    }
    fn reservation(&mut self, n: &Arc<Nexus>) -> Option<(u64, u8)> {
        let d = self.ok(n, &prin(1), 4096, None);
        if u32::from_be_bytes(d[4..8].try_into().unwrap()) == 0 {
            return None;
        }
        Some((
            u64::from_be_bytes(d[8..16].try_into().unwrap()),
            d[21] & 0x0F,
        ))
    }
    fn can_read(&mut self, n: &Arc<Nexus>) -> bool {
        let r = self.run(n, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
        assert!(
            matches!(r.status, Status::Good | Status::ReservationConflict),
            "{r:?}"
        );
        r.status == Status::Good
    }
    fn can_write(&mut self, n: &Arc<Nexus>) -> bool {
        let r = self.run(n, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
        assert!(
            matches!(r.status, Status::Good | Status::ReservationConflict),
            "{r:?}"
        );
        r.status == Status::Good
    }
}

#[test]
fn pr_register_reserve_release_each_type() {
    use crate::pr_type::*;
    // (type, registered b reads, registered b writes, unregistered b reads, writes)
    let table = [
        (EXCLUSIVE_ACCESS, false, false, false, false),
        (WRITE_EXCLUSIVE, true, false, true, false),
        (EXCLUSIVE_ACCESS_RO, true, true, false, false),
        (WRITE_EXCLUSIVE_RO, true, true, true, false),
        (EXCLUSIVE_ACCESS_AR, true, true, false, false),
        (WRITE_EXCLUSIVE_AR, true, true, true, false),
    ];
    for (ty, rr, rw, ur, uw) in table {
        let mut e = env();
        let (a, b) = (e.a.clone(), e.b.clone());
        e.pr_ok(&a, 6, 0, 0, 0xAA);
        e.pr_ok(&b, 6, 0, 0, 0xBB);
        assert_eq!(e.keys(&a), (2, vec![0xAA, 0xBB]));
        e.pr_ok(&a, 1, ty, 0xAA, 0);
        let all_reg = ty == EXCLUSIVE_ACCESS_AR || ty == WRITE_EXCLUSIVE_AR;
        assert_eq!(
            e.reservation(&b),
            Some((if all_reg { 0 } else { 0xAA }, ty))
        );
        assert!(e.can_read(&a) && e.can_write(&a));
        assert_eq!(
            (e.can_read(&b), e.can_write(&b)),
            (rr, rw),
            "type {ty} registered"
        );
        // Reserving again with the same type is fine, another type or nexus conflicts.
        e.pr_ok(&a, 1, ty, 0xAA, 0);
        if !all_reg {
            e.pr_conflict(&b, 1, ty, 0xBB, 0);
        }
        e.pr_conflict(&a, 1, if ty == 1 { 3 } else { 1 }, 0xAA, 0);
        // Unregister b.
        e.pr_ok(&b, 0, 0, 0xBB, 0);
        assert_eq!(
            (e.can_read(&b), e.can_write(&b)),
            (ur, uw),
            "type {ty} unregistered"
        );
        // Release with the wrong type, then properly.
        let (c, p) = prout(2, if ty == 1 { 3 } else { 1 }, 0xAA, 0);
        e.check(&a, &c, 24, Some(p), (5, 0x26, 0x04));
        e.pr_ok(&a, 2, ty, 0xAA, 0);
        assert_eq!(e.reservation(&a), None);
        assert!(e.can_write(&b));
        e.pr_ok(&a, 0, 0, 0xAA, 0);
        assert_eq!(e.keys(&a).1, Vec::<u64>::new());
    }
}

#[test]
fn pr_ownership_register_rules_and_preempt() {
    use crate::pr_type::*;
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    // REGISTER with a wrong key conflicts; unregistered RESERVE conflicts.
    e.pr_conflict(&a, 0, 0, 0x1, 0x2);
    e.pr_conflict(&a, 1, WRITE_EXCLUSIVE, 0x1, 0);
    e.pr_ok(&a, 0, 0, 0, 0x11);
    e.pr_conflict(&a, 0, 0, 0x99, 0x12);
    e.pr_ok(&a, 0, 0, 0x11, 0x12); // change key
    e.pr_ok(&b, 0, 0, 0, 0x22);
    // Holder unregisters: a registrants-only reservation goes, b is told.
    e.pr_ok(&a, 1, WRITE_EXCLUSIVE_RO, 0x12, 0);
    e.pr_ok(&a, 0, 0, 0x12, 0);
    assert_eq!(e.reservation(&a), None);
    e.check(
        &b,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x2A, 0x04),
    );
    // All registrants: survives until the last registrant leaves; any registrant releases.
    e.pr_ok(&a, 0, 0, 0, 0x12);
    e.pr_ok(&a, 1, EXCLUSIVE_ACCESS_AR, 0x12, 0);
    e.pr_ok(&a, 0, 0, 0x12, 0);
    assert_eq!(e.reservation(&a), Some((0, EXCLUSIVE_ACCESS_AR)));
    e.pr_ok(&b, 2, EXCLUSIVE_ACCESS_AR, 0x22, 0);
    assert_eq!(e.reservation(&a), None);
    // PREEMPT: b removes a's registration and takes the reservation.
    e.pr_ok(&a, 0, 0, 0, 0x12);
    e.pr_ok(&a, 1, EXCLUSIVE_ACCESS, 0x12, 0);
    assert!(!e.can_read(&b));
    let (gen, _) = e.keys(&a);
    e.pr_ok(&b, 4, WRITE_EXCLUSIVE, 0x22, 0x12);
    assert_eq!(e.keys(&b), (gen + 1, vec![0x22]));
    assert_eq!(e.reservation(&b), Some((0x22, WRITE_EXCLUSIVE)));
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x2A, 0x05),
    );
    assert!(e.can_read(&a) && !e.can_write(&a));
    // PREEMPT of a key nobody has, and with SARK 0 without all-registrants.
    e.pr_conflict(&b, 4, WRITE_EXCLUSIVE, 0x22, 0x77);
    let (c, p) = prout(4, WRITE_EXCLUSIVE, 0x22, 0);
    e.check(&b, &c, 24, Some(p), (5, 0x26, 0));
    // CLEAR.
    e.pr_ok(&a, 6, 0, 0, 0x33);
    e.pr_ok(&b, 3, 0, 0x22, 0);
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x2A, 0x03),
    );
    assert_eq!(e.keys(&a).1, Vec::<u64>::new());
    assert_eq!(e.reservation(&a), None);
    // Parameter list length, SPEC_I_PT, APTPL, unknown service actions.
    let (mut c, p) = prout(6, 0, 0, 0x44);
    c[8] = 20;
    e.check(&a, &c, 20, Some(p[..20].to_vec()), (5, 0x1A, 0));
    let (c, mut p) = prout(6, 0, 0, 0x44);
    p[20] = 0x01;
    e.check(&a, &c, 24, Some(p), (5, 0x26, 0));
    for sa in 4..0x20u8 {
        e.check(&a, &prin(sa), 4096, None, ILLEGAL_FIELD);
    }
    // REGISTER AND MOVE without a TransportID.
    let (c, p) = prout(7, 0, 0, 0x44);
    e.check(&a, &c, 24, Some(p), (5, 0x1A, 0));
    // REPORT CAPABILITIES and READ FULL STATUS.
    let d = e.ok(&a, &prin(2), 4096, None);
    assert_eq!(u16::from_be_bytes([d[0], d[1]]), 8);
    assert_eq!((d[4], d[5]), (0xEA, 0x01));
    e.pr_ok(&a, 6, 0, 0, 0x55);
    e.pr_ok(&a, 1, WRITE_EXCLUSIVE, 0x55, 0);
    let d = e.ok(&a, &prin(3), 4096, None);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 0x55);
    assert_eq!(d[8 + 12] & 1, 1);
    assert_eq!(d[8 + 13], WRITE_EXCLUSIVE);
    let tid_len = u32::from_be_bytes(d[28..32].try_into().unwrap()) as usize;
    let tid = &d[32..32 + tid_len];
    assert_eq!(tid[0], 0x45);
    assert!(tid[4..].starts_with(b"iqn.2024-01.test:init1,i,0x23d000000001"));
    // Truncated READ KEYS keeps the header.
    let mut c = prin(0);
    c[7] = 0;
    c[8] = 4;
    assert_eq!(e.ok(&a, &c, 4, None).len(), 4);
}

#[test]
fn spc2_reserve_release() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    let r6 = [op::RESERVE6, 0, 0, 0, 0, 0];
    let rl6 = [op::RELEASE6, 0, 0, 0, 0, 0];
    e.ok(&a, &r6, 0, None);
    e.ok(&a, &r6, 0, None);
    e.conflict(&b, &r6, 0, None);
    e.ok(&b, &rl6, 0, None); // not the holder: no effect
    e.conflict(&b, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    e.conflict(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&b, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    e.ok(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    e.ok(&a, &rl6, 0, None);
    e.ok(&b, &r6, 0, None);
    // The holder's nexus goes away: the reservation goes with it.
    e.lun.nexus_lost(&b);
    e.ch().forget_nexus(&b);
    e.ok(&a, &r6, 0, None);
    // A LUN reset releases it too.
    e.lun.reset(crate::ResetKind::LunReset);
    e.run(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.run(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&b, &r6, 0, None);
    e.ok(&b, &rl6, 0, None);
    // Persistent reservations and RESERVE do not mix.
    e.run(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.pr_ok(&a, 6, 0, 0, 0x1);
    e.conflict(&a, &r6, 0, None);
}

// ------------------------------------------------------------------------------------
// APTPL: persist through power loss (SPC-4 5.12.5), the state file under the state dir

mod aptpl {
    use std::fs;
    use std::path::Path;

    use riser_bdev::Bdev;

    use super::*;
    use crate::pr::store::{file_name, tests::Dir};
    use crate::pr_type::*;

    /// The env's two nexuses on a new LUN over `bdev` with state directory `dir`, their
    /// POWER ON unit attentions consumed.
    fn env_in(dir: &Path, bdev: Arc<dyn Bdev>) -> Env {
        let lun = Lun::new(
            LunConfig {
                target_name: "iqn.2024-01.test:tgt".into(),
                state_dir: Some(dir.to_path_buf()),
                ..LunConfig::default()
            },
            bdev,
        );
        let mut e = env();
        e.lun = lun.clone();
        e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
        let (a, b) = (e.a.clone(), e.b.clone());
        for n in [&a, &b] {
            e.run(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None); // POWER ON
            e.ok(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
        }
        e
    }

    fn device() -> Arc<dyn Bdev> {
        let mut reg = BdevRegistry::new();
        let name = reg.create_malloc(None, BLOCKS, BS as u32, None).unwrap();
        reg.get(&name).unwrap()
    }

    fn state_file(dir: &Path, bdev: &Arc<dyn Bdev>) -> std::path::PathBuf {
        dir.join(file_name(bdev.info().uuid, 0))
    }

    impl Env {
        fn register_aptpl(&mut self, n: &Arc<Nexus>, sa: u8, key: u64, sark: u64, aptpl: bool) -> ScsiResult {
            let (c, mut p) = prout(sa, 0, key, sark);
            p[20] = u8::from(aptpl);
            self.run(n, &c, 24, Some(p))
        }
        /// REPORT CAPABILITIES: (PTPL_C, PTPL_A).
        fn ptpl(&mut self, n: &Arc<Nexus>) -> (bool, bool) {
            let d = self.ok(n, &prin(2), 4096, None);
            (d[2] & 1 != 0, d[3] & 1 != 0)
        }
        fn full_status(&mut self, n: &Arc<Nexus>) -> Vec<u8> {
            self.ok(n, &prin(3), 4096, None)
        }
    }

    #[test]
    fn no_state_dir_no_ptpl() {
        let mut e = env();
        let a = e.a.clone();
        assert_eq!(e.ptpl(&a), (false, false));
        // The APTPL bit of service actions other than REGISTER is ignored (SPC-4 6.16.4).
        e.pr_ok(&a, 6, 0, 0, 0x11);
        let (c, mut p) = prout(1, WRITE_EXCLUSIVE, 0x11, 0);
        p[20] = 1;
        e.ok(&a, &c, 24, Some(p));
    }

    #[test]
    fn registrations_and_reservation_survive_a_new_lun() {
        let d = Dir::new("restore");
        let bdev = device();
        let file = state_file(&d.0, &bdev);
        let mut e = env_in(&d.0, bdev.clone());
        let (a, b) = (e.a.clone(), e.b.clone());
        assert_eq!(e.ptpl(&a), (true, false));
        assert_eq!(e.register_aptpl(&a, 0, 0, 0xA1, true).status, Status::Good);
        assert!(file.exists(), "REGISTER with APTPL=1 writes {}", file.display());
        assert_eq!(e.ptpl(&a), (true, true));
        assert_eq!(e.register_aptpl(&b, 6, 0, 0xB2, true).status, Status::Good);
        e.pr_ok(&a, 1, WRITE_EXCLUSIVE, 0xA1, 0);
        let keys = e.keys(&a);
        assert_eq!(keys, (2, vec![0xA1, 0xB2]));
        let full = e.full_status(&a);
        drop(e);

        // "Power on": a new LUN over the same device and number.
        let mut e = env_in(&d.0, bdev.clone());
        assert_eq!(e.keys(&a), keys, "keys and generation restored");
        assert_eq!(e.reservation(&b), Some((0xA1, WRITE_EXCLUSIVE)));
        assert_eq!(e.full_status(&b), full, "READ FULL STATUS restored (holder, type, TransportIDs)");
        assert_eq!(e.ptpl(&a), (true, true));
        assert!(e.can_read(&b) && !e.can_write(&b), "write exclusive holds for the other nexus");
        assert!(e.can_write(&a), "the holder writes");

        // Another LUN number of the same device has its own (no) state.
        let other = Lun::new(
            LunConfig { id: 1, state_dir: Some(d.0.clone()), ..LunConfig::default() },
            bdev.clone(),
        );
        assert_eq!(other.lock().pr, Default::default());

        // REGISTER with APTPL=0 removes the file; the state itself stays until power off.
        assert_eq!(e.register_aptpl(&b, 0, 0xB2, 0xB2, false).status, Status::Good);
        assert!(!file.exists(), "APTPL=0 removes {}", file.display());
        assert_eq!(e.ptpl(&a), (true, false));
        assert_eq!(e.keys(&a).1, vec![0xA1, 0xB2]);
        drop(e);
        let mut e = env_in(&d.0, bdev);
        assert_eq!(e.keys(&a), (0, vec![]));
        assert_eq!(e.reservation(&a), None);
        assert!(e.can_write(&b));
    }

    #[test]
    fn every_change_under_aptpl_is_saved() {
        let d = Dir::new("changes");
        let bdev = device();
        let mut e = env_in(&d.0, bdev.clone());
        let (a, b) = (e.a.clone(), e.b.clone());
        let saved = |e: &Env| {
            let fresh = Lun::new(
                LunConfig { state_dir: Some(d.0.clone()), ..LunConfig::default() },
                bdev.clone(),
            );
            let on_disk = fresh.lock().pr.clone();
            assert_eq!(on_disk, e.lun.lock().pr, "the file holds the state in memory");
            on_disk
        };
        assert_eq!(e.register_aptpl(&a, 0, 0, 0xA1, true).status, Status::Good);
        saved(&e);
        // A REGISTER without the bit would turn APTPL off: b's carries it too.
        assert_eq!(e.register_aptpl(&b, 0, 0, 0xB2, true).status, Status::Good);
        saved(&e);
        e.pr_ok(&a, 1, WRITE_EXCLUSIVE, 0xA1, 0);
        assert!(saved(&e).reservation.is_some());
        // b preempts a: a's registration and reservation go, b holds EXCLUSIVE ACCESS.
        e.pr_ok(&b, 4, EXCLUSIVE_ACCESS, 0xB2, 0xA1);
        let s = saved(&e);
        assert_eq!(s.regs.len(), 1);
        assert_eq!(s.reservation.as_ref().map(|r| r.ty), Some(EXCLUSIVE_ACCESS));
        // Key change by REGISTER AND IGNORE EXISTING KEY with APTPL=1.
        assert_eq!(e.register_aptpl(&b, 6, 0, 0xB3, true).status, Status::Good);
        assert_eq!(saved(&e).regs[0].key, 0xB3);
        e.pr_ok(&b, 2, EXCLUSIVE_ACCESS, 0xB3, 0);
        assert!(saved(&e).reservation.is_none());
        e.pr_ok(&b, 3, 0, 0xB3, 0);
        let s = saved(&e);
        assert!(s.regs.is_empty() && s.aptpl, "CLEAR keeps APTPL: the empty state is saved");
    }

    #[test]
    fn an_unwritable_state_dir_fails_the_command_and_changes_nothing() {
        let d = Dir::new("unwritable");
        fs::create_dir_all(&d.0).unwrap();
        let blocker = d.0.join("not-a-dir");
        fs::write(&blocker, b"x").unwrap();
        let mut e = env_in(&blocker.join("state"), device());
        let (a, b) = (e.a.clone(), e.b.clone());
        let r = e.register_aptpl(&a, 0, 0, 0xA1, true);
        assert_eq!(r.status, Status::CheckCondition, "{r:?}");
        assert_eq!(r.sense_triplet(), Some((5, 0x55, 0x04)), "INSUFFICIENT REGISTRATION RESOURCES");
        assert_eq!(e.keys(&a), (0, vec![]), "the registration was undone");
        assert_eq!(e.ptpl(&a), (true, false));
        // Without APTPL nothing is written, so it works.
        e.pr_ok(&b, 0, 0, 0, 0xB2);
        e.pr_ok(&b, 1, WRITE_EXCLUSIVE, 0xB2, 0);
        assert!(!e.can_write(&a));
    }

    #[test]
    fn a_torn_state_file_is_ignored() {
        let d = Dir::new("torn-lun");
        let bdev = device();
        let file = state_file(&d.0, &bdev);
        let mut e = env_in(&d.0, bdev.clone());
        let (a, b) = (e.a.clone(), e.b.clone());
        assert_eq!(e.register_aptpl(&a, 0, 0, 0xA1, true).status, Status::Good);
        e.pr_ok(&a, 1, EXCLUSIVE_ACCESS, 0xA1, 0);
        drop(e);
        let bytes = fs::read(&file).unwrap();
        fs::write(&file, &bytes[..bytes.len() - 20]).unwrap();
        let mut e = env_in(&d.0, bdev.clone());
        assert_eq!(e.keys(&a), (0, vec![]));
        assert_eq!(e.reservation(&b), None);
        assert!(e.can_write(&b), "no reservation from a torn file");
        assert!(!file.exists());
        assert!(d.0.join(format!("{}.corrupt", file_name(bdev.info().uuid, 0))).exists());
        // And APTPL works again from there.
        assert_eq!(e.register_aptpl(&a, 0, 0, 0xA2, true).status, Status::Good);
        assert!(file.exists());
    }
}

/// Reservations kept in a device's shared state (several gateways): two LUNs (two
/// gateways' views of one device) over one in-memory shared object whose notify calls every
/// watcher before returning, as the RADOS one waits for their acks.
mod shared_state {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use super::super::fake_shared::{shared_lun, Store};
    use super::*;
    use crate::pr_type::WRITE_EXCLUSIVE;

    /// One gateway's view: a LUN over the shared device, nexuses a and b powered on.
    fn gateway(store: &Arc<Store>, uuid: uuid::Uuid) -> Env {
        let lun = shared_lun(store, uuid);
        let mut e = env();
        e.lun = lun.clone();
        e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
        let (a, b) = (e.a.clone(), e.b.clone());
        for n in [&a, &b] {
            e.run(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
        }
        e
    }

    fn two_gateways() -> (Arc<Store>, Env, Env) {
        let store = Arc::new(Store::default());
        let uuid = uuid::Uuid::new_v4();
        let ga = gateway(&store, uuid);
        let gb = gateway(&store, uuid);
        (store, ga, gb)
    }

    #[test]
    fn a_reservation_made_through_one_gateway_holds_through_the_other() {
        let (store, mut ga, mut gb) = two_gateways();
        let (a, b) = (ga.a.clone(), ga.b.clone());
        // PTPL_C: the state persists with the device; ATP_C.
        let caps = ga.ok(&a, &prin(2), 4096, None);
        assert_eq!(caps[2] & 0x05, 0x05, "{caps:?}");
        ga.pr_ok(&a, 0, 0, 0, 0xA1);
        ga.pr_ok(&a, 1, WRITE_EXCLUSIVE, 0xA1, 0);
        assert_eq!(store.writes.load(Ordering::Relaxed), 2);
        // Gateway B learnt it from the notify.
        assert_eq!(gb.keys(&b), (1, vec![0xA1]));
        assert_eq!(gb.reservation(&b), Some((0xA1, WRITE_EXCLUSIVE)));
        assert!(!gb.can_write(&b));
        assert!(gb.can_read(&b));
        assert!(gb.can_write(&a), "the same I_T nexus key through the other LUN copy holds it");
        // B registers and preempts through gateway B: A's copy changes, a gets the UA there.
        gb.pr_ok(&b, 0, 0, 0, 0xB2);
        gb.pr_ok(&b, 4, WRITE_EXCLUSIVE, 0xB2, 0xA1);
        let r = ga.run(&a, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
        assert_eq!(r.sense_triplet(), Some((6, 0x2A, 0x05)), "REGISTRATIONS PREEMPTED on gateway A: {r:?}");
        assert!(!ga.can_write(&a));
        assert_eq!(ga.reservation(&a), Some((0xB2, WRITE_EXCLUSIVE)));
        // A third gateway opening the device later reads the state.
        let mut gc = gateway(&store, uuid::Uuid::new_v4());
        assert_eq!(gc.reservation(&a), Some((0xB2, WRITE_EXCLUSIVE)));
        assert!(!gc.can_write(&a));
        // A conflict through one gateway writes nothing.
        let before = store.writes.load(Ordering::Relaxed);
        ga.pr_conflict(&a, 1, WRITE_EXCLUSIVE, 0xA1, 0);
        assert_eq!(store.writes.load(Ordering::Relaxed), before);
    }

    #[test]
    fn a_slow_cluster_does_not_hold_up_the_executor_and_a_gone_one_fails_pr_out() {
        let (store, mut ga, mut gb) = two_gateways();
        let (a, b) = (ga.a.clone(), ga.b.clone());
        store.stalled.store(true, Ordering::Release);
        let (c, p) = prout(0, 0, 0, 0xA1);
        let t = ga.task(&a, &c, 24, Some(p));
        let tag = t.tag;
        ga.dc.submit(t);
        let mut out = Vec::new();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(100) {
            ga.dc.poll_results(&mut out);
        }
        assert!(out.iter().all(|r| r.tag != tag), "PR OUT finished while the cluster stalled");
        // The executor goes on with other commands meanwhile.
        assert!(ga.can_read(&b));
        assert!(ga.can_write(&b));
        store.stalled.store(false, Ordering::Release);
        let t0 = Instant::now();
        let r = loop {
            ga.dc.poll_results(&mut out);
            if let Some(i) = out.iter().position(|r| r.tag == tag) {
                break out.swap_remove(i);
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "PR OUT never completed");
        };
        assert_eq!(r.status, Status::Good, "{r:?}");
        assert_eq!(gb.keys(&b), (1, vec![0xA1]));
        // The cluster gone: PR OUT fails with LOGICAL UNIT COMMUNICATION FAILURE, nothing changes.
        store.down.store(true, Ordering::Release);
        let (c, p) = prout(1, WRITE_EXCLUSIVE, 0xA1, 0);
        let t = ga.task(&a, &c, 24, Some(p));
        let tag = t.tag;
        ga.dc.submit(t);
        let t0 = Instant::now();
        let r = loop {
            ga.dc.poll_results(&mut out);
            if let Some(i) = out.iter().position(|r| r.tag == tag) {
                break out.swap_remove(i);
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "PR OUT never completed");
        };
        assert_eq!(r.sense_triplet(), Some((4, 0x08, 0x00)), "{r:?}");
        assert_eq!(ga.reservation(&a), None);
        assert!(ga.can_write(&b), "reads and writes go on from the local copy");
    }
}

/// A reinstated session is the same I_T nexus (same initiator port, same target port) with
/// a new `Nexus`; the old session's connection may be torn down seconds later (it had data
/// queued for an initiator that no longer reads). Its nexus loss then takes nothing the new
/// session holds: not the RESERVE it took, not its PREVENT, not its state (no second POWER
/// ON). The new session's own end still releases them.
#[test]
fn the_old_sessions_nexus_loss_leaves_what_the_new_session_holds() {
    let mut e = env();
    let (old, b) = (e.a.clone(), e.b.clone());
    let new = Arc::new(Nexus::new(&old.initiator_name, old.isid, &old.target_name, old.tpgt));
    assert_eq!(new.key(), old.key(), "the same I_T nexus");
    let r6 = [op::RESERVE6, 0, 0, 0, 0, 0];
    let tur = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];
    e.ok(&new, &r6, 0, None);
    e.conflict(&b, &tur, 0, None);
    // The old session's connection ends after the new session reserved.
    e.lun.nexus_lost(&old);
    e.ch().forget_nexus(&old);
    e.conflict(&b, &tur, 0, None);
    e.conflict(&b, &r6, 0, None);
    e.ok(&new, &tur, 0, None);
    // The new session ends: its reservation goes with it.
    e.lun.nexus_lost(&new);
    e.ch().forget_nexus(&new);
    e.ok(&b, &r6, 0, None);
    e.ok(&b, &[op::RELEASE6, 0, 0, 0, 0, 0], 0, None);
    // What the old session held itself is still released by its end, a new session or not.
    let newer = Arc::new(Nexus::new(&old.initiator_name, old.isid, &old.target_name, old.tpgt));
    e.run(&new, &tur, 0, None);
    e.ok(&new, &r6, 0, None);
    e.run(&newer, &tur, 0, None);
    e.lun.nexus_lost(&new);
    e.ok(&b, &r6, 0, None);
}
