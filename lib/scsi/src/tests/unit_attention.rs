//! Target level, TEST UNIT READY, REQUEST SENSE, unit attentions.

use super::*;

#[test]
fn report_luns_and_missing_lun() {
    let mut e = env();
    let a = e.a.clone();
    e.set_luns(&[0, 3, 300]);
    let mut c = vec![0u8; 12];
    c[0] = op::REPORT_LUNS;
    c[9] = 255;
    let r = e.run(&a, &c, 255, None);
    assert_eq!(r.status, Status::Good);
    let d = r.data();
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 24);
    assert_eq!(&d[8..16], &[0; 8]);
    assert_eq!(&d[16..24], &[0, 3, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&d[24..32], &[0x41, 0x2C, 0, 0, 0, 0, 0, 0]);
    assert_eq!(r.residual, Residual::Underflow(255 - 32));
    // Allocation length below 16 (sent to a LUN that does not exist).
    c[9] = 8;
    assert_eq!(e.run_to(9, &a, &c, 8, None).status, Status::CheckCondition);
    // A LUN that does not exist.
    let r = e.run_to(9, &a, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, None);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data()[0], 0x7F);
    let r = e.run_to(9, &a, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    assert_eq!(r.sense_triplet(), Some((5, 0x25, 0)));
    let r = e.run_to(9, &a, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None);
    assert_eq!(r.status, Status::Good);
    assert_eq!((r.data()[2], r.data()[12]), (5, 0x25));
}

#[test]
fn unit_attentions_and_request_sense() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    // A new nexus sees POWER ON first, but INQUIRY is not held up by it.
    let c = Arc::new(Nexus::new(
        "iqn.2024-01.test:init3",
        3,
        "iqn.2024-01.test:tgt",
        1,
    ));
    e.ok(&c, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    let s = e.ok(&c, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None);
    assert_eq!((s[2], s[12], s[13]), (6, 0x29, 0));
    let s = e.ok(&c, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None);
    assert_eq!((s[2], s[12]), (0, 0));
    // Descriptor format.
    let s = e.ok(&c, &[op::REQUEST_SENSE, 1, 0, 0, 18, 0], 18, None);
    assert_eq!(s[0], 0x72);
    // A nexus whose first command is INQUIRY still gets POWER ON on the next command.
    let d = Arc::new(Nexus::new(
        "iqn.2024-01.test:init4",
        4,
        "iqn.2024-01.test:tgt",
        1,
    ));
    e.ok(&d, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None);
    e.check(
        &d,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x29, 0),
    );
    e.ok(&d, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // The LUN inventory changes.
    e.set_luns(&[0, 1]);
    e.lun.set_target_luns(&[0, 1]);
    e.ok(&d, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    e.set_luns(&[0, 1, 2]);
    e.lun.set_target_luns(&[0, 1, 2]);
    e.check(
        &d,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x3F, 0x0E),
    );
    let mut rl = vec![0u8; 12];
    rl[0] = op::REPORT_LUNS;
    rl[9] = 64;
    let l = e.ok(&d, &rl, 64, None);
    assert_eq!(u32::from_be_bytes(l[0..4].try_into().unwrap()), 24);
    // LUN reset: everybody gets 29/03 once.
    e.lun.reset(crate::ResetKind::LunReset);
    e.check(
        &a,
        &rw10(op::READ10, 0, 1, 0),
        BS as u32,
        None,
        (6, 0x29, 3),
    );
    e.ok(&a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    e.check(
        &b,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x29, 3),
    );
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
    // REPORTED LUNS DATA HAS CHANGED is cleared by REPORT LUNS.
    e.lun
        .establish_ua_all(crate::Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
    e.check(
        &a,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x3F, 0x0E),
    );
    let mut rl = vec![0u8; 12];
    rl[0] = op::REPORT_LUNS;
    rl[9] = 64;
    e.ok(&b, &rl, 64, None);
    e.ok(&b, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None);
}
