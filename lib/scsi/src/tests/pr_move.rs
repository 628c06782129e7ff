//! PERSISTENT RESERVE OUT REGISTER AND MOVE and REGISTER with SPEC_I_PT (SPC-4 5.12.7,
//! 5.12.8): iSCSI TransportIDs of format 00b (an initiator device) and 01b (an initiator
//! port), on a local LUN and on a device's shared state (two gateways).

use super::fake_shared::{shared_lun, Store};
use super::*;
use crate::pr_type::{WRITE_EXCLUSIVE, WRITE_EXCLUSIVE_AR, WRITE_EXCLUSIVE_RO};

const TGT: &str = "iqn.2024-01.test:tgt";
const INIT2_PORT: &str = "iqn.2024-01.test:init2,i,0x23d000000002";
const INIT3: &str = "iqn.2024-01.test:init3";

/// An iSCSI TransportID: format 01b (`port`: name,i,0xISID) or 00b (a name).
fn tid(text: &str) -> Vec<u8> {
    let mut body = text.as_bytes().to_vec();
    body.push(0);
    while !body.len().is_multiple_of(4) || body.len() < 20 {
        body.push(0);
    }
    let mut v = vec![if text.contains(",i,0x") { 0x45 } else { 0x05 }, 0];
    v.extend_from_slice(&(body.len() as u16).to_be_bytes());
    v.extend(body);
    v
}

/// PERSISTENT RESERVE OUT with parameter list `p`.
fn prout_list(sa: u8, ty: u8, p: &[u8]) -> Vec<u8> {
    let mut c = vec![0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_OUT;
    c[1] = sa;
    c[2] = ty;
    c[5..9].copy_from_slice(&(p.len() as u32).to_be_bytes());
    c
}

fn header(key: u64, sark: u64) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p
}

/// REGISTER with SPEC_I_PT (and ALL_TG_PT when asked) listing `tids`.
fn spec_i_pt(sark: u64, all_tg_pt: bool, tids: &[Vec<u8>]) -> (Vec<u8>, Vec<u8>) {
    let mut p = header(0, sark);
    p[20] = 0x08 | if all_tg_pt { 0x04 } else { 0 };
    let list: Vec<u8> = tids.concat();
    p.extend_from_slice(&(list.len() as u32).to_be_bytes());
    p.extend(list);
    (prout_list(0, 0, &p), p)
}

/// REGISTER AND MOVE to `tid` through relative target port `rel_port`.
fn register_and_move(key: u64, sark: u64, unreg: bool, rel_port: u16, tid: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut p = header(key, sark);
    p[17] = if unreg { 0x02 } else { 0 };
    p[18..20].copy_from_slice(&rel_port.to_be_bytes());
    p[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
    p.extend_from_slice(tid);
    (prout_list(7, 0, &p), p)
}

fn simple(sa: u8, ty: u8, key: u64, sark: u64) -> (Vec<u8>, Vec<u8>) {
    let p = header(key, sark);
    (prout_list(sa, ty, &p), p)
}

impl Env {
    fn out(&mut self, n: &Arc<Nexus>, (c, p): (Vec<u8>, Vec<u8>)) -> ScsiResult {
        let len = p.len() as u32;
        self.run(n, &c, len, Some(p))
    }
    fn out_ok(&mut self, n: &Arc<Nexus>, cp: (Vec<u8>, Vec<u8>)) {
        let r = self.out(n, cp);
        assert_eq!(r.status, Status::Good, "{r:?}");
    }
    fn out_sense(&mut self, n: &Arc<Nexus>, cp: (Vec<u8>, Vec<u8>)) -> Option<(u8, u8, u8)> {
        let r = self.out(n, cp);
        assert_eq!(r.status, Status::CheckCondition, "{r:?}");
        r.sense_triplet()
    }
    fn out_status(&mut self, n: &Arc<Nexus>, cp: (Vec<u8>, Vec<u8>)) -> Status {
        self.out(n, cp).status
    }
    fn prin_data(&mut self, n: &Arc<Nexus>, sa: u8) -> Vec<u8> {
        self.ok(n, &[op::PERSISTENT_RESERVE_IN, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], 4096, None)
    }
    fn key_list(&mut self, n: &Arc<Nexus>) -> Vec<u64> {
        let d = self.prin_data(n, 0);
        let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
        d[8..8 + len].chunks(8).map(|k| u64::from_be_bytes(k.try_into().unwrap())).collect()
    }
    fn holder_key(&mut self, n: &Arc<Nexus>) -> Option<u64> {
        let d = self.prin_data(n, 1);
        (u32::from_be_bytes(d[4..8].try_into().unwrap()) != 0).then(|| u64::from_be_bytes(d[8..16].try_into().unwrap()))
    }
    fn can_write_now(&mut self, n: &Arc<Nexus>) -> bool {
        let r = self.run(n, &rw10(op::WRITE10, 0, 1, 0), BS as u32, Some(vec![0; BS]));
        assert!(matches!(r.status, Status::Good | Status::ReservationConflict), "{r:?}");
        r.status == Status::Good
    }
    /// A new I_T nexus of this env's target, powered on and its unit attention read.
    fn nexus(&mut self, init: &str, isid: u64, tpgt: u16) -> Arc<Nexus> {
        let n = Arc::new(Nexus::new(init, isid, TGT, tpgt));
        self.run(&n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
        n
    }
}

#[test]
fn report_capabilities_says_spec_i_pt_and_report_opcodes_lists_register_and_move() {
    let mut e = env();
    let a = e.a.clone();
    let caps = e.prin_data(&a, 2);
    assert_eq!(caps[2] & 0x08, 0x08, "SIP_C: {caps:?}");
    // REPORT SUPPORTED OPERATION CODES for PR OUT service action 7.
    let mut c = vec![0u8; 12];
    c[0] = op::MAINTENANCE_IN;
    c[1] = op::MI_REPORT_SUPPORTED_OPCODES;
    c[2] = 0x02;
    c[3] = op::PERSISTENT_RESERVE_OUT;
    c[5] = 0x07;
    c[9] = 64;
    let d = e.ok(&a, &c, 64, None);
    assert_eq!(d[1] & 0x07, 0x03, "REGISTER AND MOVE is supported: {d:?}");
}

#[test]
fn spec_i_pt_registers_the_listed_initiator_ports_and_devices() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    let c1 = e.nexus(INIT3, 0x11, 1);
    let c2 = e.nexus(INIT3, 0x22, 1);
    let c_other_port = e.nexus(INIT3, 0x11, 2);
    let d = e.nexus("iqn.2024-01.test:init4", 0x44, 1);
    // Errors first, each registering nothing.
    let mut bad_len = spec_i_pt(0xA1, false, &[tid(INIT2_PORT)]);
    bad_len.1[27] += 4;
    assert_eq!(e.out_sense(&a, bad_len), Some((5, 0x1A, 0)), "TransportID data length beyond the list");
    let mut not_iscsi = tid(INIT2_PORT);
    not_iscsi[0] = 0x46;
    assert_eq!(e.out_sense(&a, spec_i_pt(0xA1, false, &[not_iscsi])), Some((5, 0x26, 0)), "protocol 6 (SAS)");
    let (mut c, mut p) = spec_i_pt(0xA1, false, &[tid(INIT2_PORT)]);
    c[1] = 6;
    p[20] = 0x08;
    assert_eq!(e.out_sense(&a, (c, p)), Some((5, 0x26, 0)), "SPEC_I_PT with REGISTER AND IGNORE EXISTING KEY");
    assert_eq!(e.key_list(&a), Vec::<u64>::new());
    // a registers itself, b's initiator port (format 01b) and init3's device (format 00b).
    e.out_ok(&a, spec_i_pt(0xA1, false, &[tid(INIT2_PORT), tid(INIT3)]));
    assert_eq!(e.key_list(&a), vec![0xA1, 0xA1, 0xA1]);
    // READ FULL STATUS shows the TransportIDs as given.
    let fs = e.prin_data(&a, 3);
    let mut tids = Vec::new();
    let mut at = 8;
    while at < fs.len() {
        let n = u32::from_be_bytes(fs[at + 20..at + 24].try_into().unwrap()) as usize;
        tids.push(fs[at + 24..at + 24 + n].to_vec());
        at += 24 + n;
    }
    assert_eq!(tids[1], tid(INIT2_PORT));
    assert_eq!(tids[2], tid(INIT3));
    // b is registered: it reserves with the key; every port of init3 through port 1 is
    // registered (WRITE EXCLUSIVE - REGISTRANTS ONLY lets it write), not through port 2
    // (no ALL_TG_PT), nor init4.
    e.out_ok(&b, simple(1, WRITE_EXCLUSIVE_RO, 0xA1, 0));
    assert!(e.can_write_now(&c1));
    assert!(e.can_write_now(&c2));
    assert!(!e.can_write_now(&c_other_port));
    assert!(!e.can_write_now(&d));
    // SPEC_I_PT from a registered nexus: INVALID FIELD IN CDB.
    assert_eq!(e.out_sense(&a, spec_i_pt(0xA2, false, &[tid("iqn.2024-01.test:init4")])), Some((5, 0x24, 0)));
    // A listed nexus already registered: nothing is registered.
    assert_eq!(e.out_sense(&d, spec_i_pt(0xD1, false, &[tid("iqn.2024-01.test:init5"), tid(INIT2_PORT)])), Some((5, 0x26, 0)));
    assert_eq!(e.key_list(&a).len(), 3);
    // An initiator device one of whose ports is registered: refused too.
    assert_eq!(e.out_sense(&d, spec_i_pt(0xD1, false, &[tid("iqn.2024-01.test:init2")])), Some((5, 0x26, 0)));
    assert_eq!(e.key_list(&a).len(), 3);
    // With ALL_TG_PT, through every target port.
    e.out_ok(&d, spec_i_pt(0xD1, true, &[tid("iqn.2024-01.test:init5,i,0x000000000055")]));
    let e5 = e.nexus("iqn.2024-01.test:init5", 0x55, 7);
    assert!(e.can_write_now(&e5), "init5's port, registered through every target port");
}

#[test]
fn register_and_move_gives_the_reservation_to_another_initiator_port() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    e.out_ok(&a, simple(0, 0, 0, 0xA1));
    // No reservation to move.
    assert_eq!(e.out_status(&a, register_and_move(0xA1, 0xB1, false, 1, &tid(INIT2_PORT))), Status::ReservationConflict);
    e.out_ok(&a, simple(1, WRITE_EXCLUSIVE, 0xA1, 0));
    // The wrong key, an unregistered sender, a zero SARK, the sender itself.
    assert_eq!(e.out_status(&a, register_and_move(0xA9, 0xB1, false, 1, &tid(INIT2_PORT))), Status::ReservationConflict);
    assert_eq!(e.out_status(&b, register_and_move(0xB1, 0xB1, false, 1, &tid(INIT2_PORT))), Status::ReservationConflict);
    assert_eq!(e.out_sense(&a, register_and_move(0xA1, 0, false, 1, &tid(INIT2_PORT))), Some((5, 0x26, 0)));
    let me = "iqn.2024-01.test:init1,i,0x23d000000001";
    assert_eq!(e.out_sense(&a, register_and_move(0xA1, 0xB1, false, 1, &tid(me))), Some((5, 0x26, 0)));
    assert_eq!(e.out_sense(&a, register_and_move(0xA1, 0xB1, false, 0, &tid(INIT2_PORT))), Some((5, 0x26, 0)), "relative port 0");
    let (gen0, _) = (e.prin_data(&a, 0)[3], ());
    // a moves it to b (unregistered: registered with SARK), keeping its registration.
    e.out_ok(&a, register_and_move(0xA1, 0xB1, false, 1, &tid(INIT2_PORT)));
    assert_eq!(e.key_list(&a), vec![0xA1, 0xB1]);
    assert_eq!(e.holder_key(&a), Some(0xB1));
    assert_ne!(e.prin_data(&a, 0)[3], gen0, "the generation moves");
    assert!(e.can_write_now(&b));
    assert!(!e.can_write_now(&a));
    // b moves it back to a (registered: its key stays) and unregisters itself.
    e.out_ok(&b, register_and_move(0xB1, 0xBB, true, 1, &tid(me)));
    assert_eq!(e.key_list(&a), vec![0xA1]);
    assert_eq!(e.holder_key(&a), Some(0xA1));
    assert!(e.can_write_now(&a));
    assert!(!e.can_write_now(&b));
    // To b through another target port (another gateway's): b through port 1 does not hold it.
    e.out_ok(&a, register_and_move(0xA1, 0xB2, false, 2, &tid(INIT2_PORT)));
    let b2 = e.nexus("iqn.2024-01.test:init2", 0x23d0_0000_0002, 2);
    assert!(e.can_write_now(&b2));
    assert!(!e.can_write_now(&b));
    // All-registrants reservations do not move.
    e.out_ok(&b2, simple(2, WRITE_EXCLUSIVE, 0xB2, 0));
    e.out_ok(&a, simple(1, WRITE_EXCLUSIVE_AR, 0xA1, 0));
    assert_eq!(e.out_status(&a, register_and_move(0xA1, 0xB1, false, 1, &tid(INIT2_PORT))), Status::ReservationConflict);
}

#[test]
fn register_and_move_and_spec_i_pt_on_a_shared_state_reach_the_other_gateway() {
    let store = Arc::new(Store::default());
    let uuid = uuid::Uuid::new_v4();
    let gateway = |store: &Arc<Store>| {
        let lun = shared_lun(store, uuid);
        let mut e = env();
        e.lun = lun.clone();
        e.dc = DeviceChannel::new(Arc::new(ScsiDevice::new(vec![lun])));
        let (a, b) = (e.a.clone(), e.b.clone());
        for n in [&a, &b] {
            e.run(n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
        }
        e
    };
    let mut ga = gateway(&store);
    let mut gb = gateway(&store);
    let (a, b) = (ga.a.clone(), ga.b.clone());
    assert_eq!(ga.prin_data(&a, 2)[2] & 0x08, 0x08, "SIP_C");
    ga.out_ok(&a, spec_i_pt(0xA1, false, &[tid(INIT3)]));
    let c = gb.nexus(INIT3, 0x33, 1);
    assert_eq!(gb.key_list(&c), vec![0xA1, 0xA1], "init3's registration, through gateway B");
    ga.out_ok(&a, simple(1, WRITE_EXCLUSIVE, 0xA1, 0));
    ga.out_ok(&a, register_and_move(0xA1, 0xB1, true, 1, &tid(INIT2_PORT)));
    assert_eq!(gb.holder_key(&b), Some(0xB1));
    assert!(gb.can_write_now(&b));
    assert!(!gb.can_write_now(&a));
    assert!(!gb.can_write_now(&c));
    assert_eq!(gb.key_list(&b), vec![0xA1, 0xB1], "a unregistered, init3 and b remain");
}
