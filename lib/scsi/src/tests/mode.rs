//! MODE SENSE / MODE SELECT.

use super::*;

#[test]
fn mode_sense_and_select_round_trip() {
    let mut e = env();
    let (a, b) = (e.a.clone(), e.b.clone());
    let all = e.ok(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    assert_eq!(all[0] as usize, all.len() - 1);
    assert_eq!(all[2] & 0x10, 0x10, "DPOFUA");
    assert_eq!(all[3], 8, "block descriptor");
    let pages: Vec<u8> = {
        let mut v = vec![];
        let mut off = 4 + 8;
        while off < all.len() {
            v.push(all[off] & 0x3F);
            off += all[off + 1] as usize + 2;
        }
        v
    };
    assert_eq!(pages, vec![0x08, 0x0A, 0x1C]);
    // Residuals: 4 bytes requested, no overflow.
    let r = e.run(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 4, 0], 4, None);
    assert_eq!((r.data_len, r.residual), (4, Residual::None));
    // Saved values are not supported; unknown page.
    e.check(
        &a,
        &[op::MODE_SENSE6, 0, 0xC8, 0, 255, 0],
        255,
        None,
        (5, 0x39, 0),
    );
    e.check(
        &a,
        &[op::MODE_SENSE6, 0, 0x19, 0, 255, 0],
        255,
        None,
        ILLEGAL_FIELD,
    );
    // MODE SENSE(10) with LLBAA and DBD.
    let d = e.ok(
        &a,
        &[op::MODE_SENSE10, 0x10, 0x08, 0, 0, 0, 0, 0, 255, 0],
        255,
        None,
    );
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 16);
    let d = e.ok(
        &a,
        &[op::MODE_SENSE10, 0x08, 0x08, 0, 0, 0, 0, 0, 255, 0],
        255,
        None,
    );
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 0);
    assert_eq!(d[8], 0x08);
    assert_eq!(d[10] & 0x04, 0x04, "WCE on by default");
    // Changeable values show WCE, D_SENSE and SWP.
    let ch = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x4A, 0, 255, 0], 255, None);
    assert_eq!((ch[4 + 2], ch[4 + 4]), (0x04, 0x08));
    // Turn WCE off with MODE SELECT(6) of the current caching page.
    let cur = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x08, 0, 255, 0], 255, None);
    let mut page = cur[4..].to_vec();
    page[2] &= !0x04;
    let mut p = vec![0, 0, 0, 0];
    p.extend(page.clone());
    e.ok(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p.clone()),
    );
    let cur = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x08, 0, 255, 0], 255, None);
    assert_eq!(cur[6] & 0x04, 0);
    // The other nexus hears about it.
    e.check(
        &b,
        &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
        0,
        None,
        (6, 0x2A, 0x01),
    );
    // Changing a field that is not changeable, SP, a short list.
    let mut bad = p.clone();
    bad[4 + 2] |= 0x01; // RCD
    e.check(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, bad.len() as u8, 0],
        bad.len() as u32,
        Some(bad),
        (5, 0x26, 0),
    );
    e.check(
        &a,
        &[op::MODE_SELECT6, 0x11, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p.clone()),
        ILLEGAL_FIELD,
    );
    e.check(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, 3, 0],
        3,
        Some(vec![0; 3]),
        (5, 0x1A, 0),
    );
    // D_SENSE: descriptor sense data from now on.
    let cur = e.ok(&a, &[op::MODE_SENSE6, 0x08, 0x0A, 0, 255, 0], 255, None);
    let mut p = vec![0, 0, 0, 0];
    p.extend(cur[4..].to_vec());
    p[4 + 2] |= 0x04;
    e.ok(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p.clone()),
    );
    let r = e.run(&a, &rw16(op::READ16, u64::MAX, 1, 0), BS as u32, None);
    assert_eq!(r.sense_bytes()[0], 0x72);
    assert_eq!(r.sense_triplet(), Some(LBA_OOR));
    // SWP: writes fail with DATA PROTECT, reads work, WP shows in MODE SENSE.
    p[4 + 2] &= !0x04;
    p[4 + 4] |= 0x08;
    e.ok(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p.clone()),
    );
    e.ok(&a, &rw10(op::READ10, 0, 1, 0), BS as u32, None);
    e.check(
        &a,
        &rw10(op::WRITE10, 0, 1, 0),
        BS as u32,
        Some(vec![0; BS]),
        (7, 0x27, 0x02),
    );
    let ms = e.ok(&a, &[op::MODE_SENSE6, 0, 0x3F, 0, 255, 0], 255, None);
    assert_eq!(ms[2] & 0x80, 0x80);
    p[4 + 4] &= !0x08;
    e.ok(
        &a,
        &[op::MODE_SELECT6, 0x10, 0, 0, p.len() as u8, 0],
        p.len() as u32,
        Some(p),
    );
    e.ok(
        &a,
        &rw10(op::WRITE10, 0, 1, 0),
        BS as u32,
        Some(vec![0; BS]),
    );
}
