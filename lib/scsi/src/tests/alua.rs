//! ALUA: REPORT TARGET PORT GROUPS bytes, access by state, ASYMMETRIC ACCESS STATE CHANGED.

use super::*;
use crate::alua::{AccessState, Alua, PortGroup};
use crate::Asc;

const RTPG: [u8; 12] = [op::MAINTENANCE_IN, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
const RTPG_EXT: [u8; 12] = [op::MAINTENANCE_IN, 0x2A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
const READ10: [u8; 10] = [op::READ10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
const TUR: [u8; 6] = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];

/// A nexus through portal group `tpg` under `alua`, its POWER ON unit attention drained.
fn nexus(e: &mut Env, tpg: u16, alua: &Arc<Alua>) -> Arc<Nexus> {
    let n = Arc::new(Nexus::new("iqn.2024-01.test:alua", 0x23d0_0000_0100 + tpg as u64, "iqn.2024-01.test:tgt", tpg).with_alua(alua.clone()));
    e.check(&n, &TUR, 0, None, (6, 0x29, 0x00));
    n
}

#[test]
fn without_a_description_one_active_optimized_group() {
    let mut e = env();
    let a = e.a.clone();
    let d = e.ok(&a, &RTPG, 256, None);
    assert_eq!(d, [0, 0, 0, 12, 0x80, 0x8F, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]);
    let d = e.ok(&a, &RTPG_EXT, 256, None);
    assert_eq!(d, [0, 0, 0, 16, 0x10, 0, 0, 0, 0x80, 0x8F, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]);
}

#[test]
fn every_group_with_its_state_ports_and_status() {
    let mut e = env();
    let alua = Alua::new();
    let mut g2 = PortGroup::new(2, AccessState::ActiveNonOptimized);
    g2.rel_port_ids = vec![20, 21];
    let mut g1 = PortGroup::new(1, AccessState::ActiveOptimized);
    g1.pref = true;
    assert!(alua.set_groups(vec![g2, g1]));
    let n1 = nexus(&mut e, 1, &alua);
    let want = [
        0, 0, 0, 28, // RETURN DATA LENGTH
        0x80, 0x8F, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, // group 1: PREF, AO, status 0, port 1
        0x01, 0x8F, 0, 2, 0, 2, 0, 2, 0, 0, 0, 20, 0, 0, 0, 21, // group 2: ANO, implicit change
    ];
    assert_eq!(e.ok(&n1, &RTPG, 256, None), want);
    let ext = e.ok(&n1, &RTPG_EXT, 256, None);
    assert_eq!(&ext[..8], [0, 0, 0, 32, 0x10, 0, 0, 0]);
    assert_eq!(&ext[8..], &want[4..]);
    // Allocation length cuts the data, RETURN DATA LENGTH stays whole.
    let mut short = RTPG;
    short[9] = 8;
    short[8] = 0;
    assert_eq!(e.ok(&n1, &short, 8, None), &want[..8]);
    // A group the description leaves out (the nexus's own) is listed, active/optimized.
    let n3 = nexus(&mut e, 3, &alua);
    let d = e.ok(&n3, &RTPG, 256, None);
    assert_eq!(d[3], 40);
    assert_eq!(&d[32..44], [0, 0x8F, 0, 3, 0, 0, 0, 1, 0, 0, 0, 3]);
    // VPD 0x83 keeps the nexus's own group.
    let vpd = e.ok(&n3, &[op::INQUIRY, 1, 0x83, 1, 0, 0], 256, None);
    assert!(vpd.windows(8).any(|w| w == [0x51, 0x95, 0, 4, 0, 0, 0, 3]), "{vpd:02x?}");
}

#[test]
fn standby_and_unavailable_refuse_media_access_but_not_inquiry() {
    let mut e = env();
    let alua = Alua::new();
    alua.set_groups(vec![PortGroup::new(1, AccessState::ActiveOptimized), PortGroup::new(2, AccessState::Standby)]);
    let n1 = nexus(&mut e, 1, &alua);
    let n2 = e.run(&Arc::new(Nexus::new("iqn.2024-01.test:alua", 7, "iqn.2024-01.test:tgt", 2).with_alua(alua.clone())), &TUR, 0, None);
    assert_eq!(n2.sense_triplet(), Some((6, 0x29, 0x00)), "the unit attention comes first");
    let n2 = Arc::new(Nexus::new("iqn.2024-01.test:alua", 7, "iqn.2024-01.test:tgt", 2).with_alua(alua.clone()));
    e.check(&n2, &READ10, 512, None, (2, 0x04, 0x0B));
    e.check(&n2, &TUR, 0, None, (2, 0x04, 0x0B));
    e.check(&n2, &[op::WRITE10, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512, Some(vec![0; 512]), (2, 0x04, 0x0B));
    e.ok(&n2, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, None);
    e.ok(&n2, &RTPG, 256, None);
    e.ok(&n2, &[op::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0, 8, 0], 8, None);
    e.ok(&n2, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    e.ok(&n1, &READ10, 512, None);
    alua.set_state(2, AccessState::Unavailable);
    e.check(&n2, &READ10, 512, None, (2, 0x04, 0x0C));
    e.check(&n2, &[op::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0, 8, 0], 8, None, (2, 0x04, 0x0C));
    e.ok(&n2, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, None);
    alua.set_state(2, AccessState::Transitioning);
    e.check(&n2, &READ10, 512, None, (2, 0x04, 0x0A));
    alua.set_state(2, AccessState::ActiveNonOptimized);
    e.ok(&n2, &READ10, 512, None);
}

#[test]
fn a_state_change_raises_asymmetric_access_state_changed() {
    let mut e = env();
    let alua = Alua::new();
    let n1 = nexus(&mut e, 1, &alua);
    alua.set_groups(vec![PortGroup::new(1, AccessState::ActiveOptimized), PortGroup::new(2, AccessState::Standby)]);
    // What the control plane does after a change: every nexus of the LUN hears of it.
    e.lun.establish_ua_all(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
    let a = e.a.clone();
    e.check(&n1, &READ10, 512, None, (6, 0x2A, 0x06));
    e.ok(&n1, &READ10, 512, None);
    e.check(&a, &TUR, 0, None, (6, 0x2A, 0x06));
    let d = e.ok(&n1, &RTPG, 256, None);
    assert_eq!(&d[16..22], [0x02, 0x8F, 0, 2, 0, 2], "group 2 standby, implicit change");
}
