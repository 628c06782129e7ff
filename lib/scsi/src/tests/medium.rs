//! Removable medium, PREVENT ALLOW MEDIUM REMOVAL, START STOP UNIT.

use super::*;

#[test]
fn removable_medium_eject_load_prevent() {
    let mut e = env_with(LunConfig {
        removable: true,
        ..Default::default()
    });
    let (a, b) = (e.a.clone(), e.b.clone());
    let ssu = |start: bool, loej: bool| {
        [
            op::START_STOP_UNIT,
            0,
            0,
            0,
            (loej as u8) << 1 | start as u8,
            0,
        ]
    };
    let inq = e.ok(&a, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    assert_eq!(inq[1], 0x80);
    e.ok(&a, &ssu(false, true), 0, None);
    let no_medium = (2, 0x3A, 0);
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        no_medium,
    );
    e.check(&a, &rw10(op::READ10, 0, 1, 0), BS as u32, None, no_medium);
    e.check(
        &a,
        &rw16(op::WRITE16, 0, 1, 0),
        BS as u32,
        Some(vec![0; BS]),
        no_medium,
    );
    e.check(
        &a,
        &[op::READ_CAPACITY10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        8,
        None,
        no_medium,
    );
    e.ok(&a, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    e.ok(&a, &ssu(true, true), 0, None);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // Power conditions and LOEJ=0 never eject.
    for pc in 1..16u8 {
        e.ok(
            &a,
            &[op::START_STOP_UNIT, 0, 0, 0, pc << 4 | 0x02, 0],
            0,
            None,
        );
    }
    e.ok(&a, &ssu(false, false), 0, None);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // PREVENT from a: neither a nor b can eject (or load).
    e.ok(&a, &[op::PREVENT_ALLOW, 0, 0, 0, 1, 0], 0, None);
    let prevented = (5, 0x53, 0x02);
    e.check(&a, &ssu(false, true), 0, None, prevented);
    e.check(&b, &ssu(false, true), 0, None, prevented);
    e.check(&a, &ssu(true, true), 0, None, prevented);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // a's nexus goes away: prevention ends.
    e.lun.nexus_lost(&a);
    e.ch().forget_nexus(&a);
    e.ok(&b, &ssu(false, true), 0, None);
    e.ok(&b, &ssu(true, true), 0, None);
    // A LUN reset ends it too.
    e.ok(&b, &[op::PREVENT_ALLOW, 0, 0, 0, 1, 0], 0, None);
    e.lun.reset(crate::ResetKind::LunReset);
    e.run(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&b, &ssu(false, true), 0, None);
    e.ok(&b, &ssu(true, true), 0, None);
}

#[test]
fn fixed_medium_cannot_be_ejected() {
    let mut e = env();
    let a = e.a.clone();
    e.check(
        &a,
        &[op::START_STOP_UNIT, 1, 0, 0, 0x02, 0],
        0,
        None,
        ILLEGAL_FIELD,
    );
    e.ok(&a, &[op::START_STOP_UNIT, 1, 0, 0, 0x01, 0], 0, None);
    e.ok(&a, &[op::START_STOP_UNIT, 1, 0, 0, 0x00, 0], 0, None);
    e.ok(&a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.ok(&a, &[op::PREVENT_ALLOW, 0, 0, 0, 1, 0], 0, None);
    e.ok(&a, &[op::PREVENT_ALLOW, 0, 0, 0, 0, 0], 0, None);
}
