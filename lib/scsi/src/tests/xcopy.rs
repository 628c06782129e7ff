//! EXTENDED COPY and RECEIVE COPY RESULTS.

use super::*;

fn xcopy_list(
    e: &mut Env,
    list_id: u8,
    usage: u8,
    tgts: usize,
    segs: &[(u64, u64, u16)],
) -> Vec<u8> {
    let a = e.a.clone();
    let di = e.ok(&a, &[op::INQUIRY, 1, 0x83, 0, 255, 0], 255, None);
    // The NAA designator (first one).
    let naa = &di[4..4 + 20];
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = usage << 3;
    p[2..4].copy_from_slice(&((32 * tgts) as u16).to_be_bytes());
    p[8..12].copy_from_slice(&((28 * segs.len()) as u32).to_be_bytes());
    for _ in 0..tgts {
        let mut t = vec![0u8; 32];
        t[0] = 0xE4;
        t[4..24].copy_from_slice(naa);
        t[29..32].copy_from_slice(&(BS as u32).to_be_bytes()[1..]);
        p.extend(t);
    }
    for &(src, dst, n) in segs {
        let mut s = vec![0u8; 28];
        s[0] = 0x02;
        s[2..4].copy_from_slice(&0x18u16.to_be_bytes());
        s[10..12].copy_from_slice(&n.to_be_bytes());
        s[12..20].copy_from_slice(&src.to_be_bytes());
        s[20..28].copy_from_slice(&dst.to_be_bytes());
        p.extend(s);
    }
    p
}

fn xcopy_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op::EXTENDED_COPY;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

#[test]
fn extended_copy_and_results() {
    let mut e = env();
    let a = e.a.clone();
    let data = pattern(40 * BS, 5);
    e.write16(&a, 0, data.clone());
    // No copy yet with list id 1.
    let mut rcr = vec![0u8; 16];
    rcr[0] = op::RECEIVE_COPY_RESULTS;
    rcr[2] = 1;
    rcr[13] = 255;
    e.check(&a, &rcr, 255, None, ILLEGAL_FIELD);
    let p = xcopy_list(&mut e, 1, 0, 1, &[(0, 4000, 40), (0, 5000, 2)]);
    e.ok(&a, &xcopy_cdb(p.len()), p.len() as u32, Some(p));
    assert_eq!(e.read16(&a, 4000, 40), data);
    assert_eq!(e.read16(&a, 5000, 2), &data[..2 * BS]);
    let d = e.ok(&a, &rcr, 255, None);
    assert_eq!(d[4] & 0x7F, 1);
    assert_eq!(u16::from_be_bytes([d[5], d[6]]), 2);
    // Operating parameters.
    rcr[1] = op::RCR_OPERATING_PARAMETERS;
    let d = e.ok(&a, &rcr, 255, None);
    let max_tgt = u16::from_be_bytes([d[8], d[9]]) as usize;
    let max_seg = u16::from_be_bytes([d[10], d[11]]) as usize;
    // Truncated lists, zero length.
    let p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    for cut in [16 + 31, 16 + 32 + 27] {
        e.check(
            &a,
            &xcopy_cdb(cut),
            cut as u32,
            Some(p[..cut].to_vec()),
            (5, 0x1A, 0),
        );
    }
    e.ok(&a, &xcopy_cdb(0), 0, None);
    // Too many descriptors.
    let p = xcopy_list(&mut e, 2, 0, max_tgt + 1, &[(0, 4000, 4)]);
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (5, 0x26, 0x06),
    );
    let segs = vec![(0u64, 4000u64, 1u16); max_seg + 1];
    let p = xcopy_list(&mut e, 2, 0, 1, &segs);
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (5, 0x26, 0x08),
    );
    // Unsupported descriptor types.
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[16] = 0xE0;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (5, 0x26, 0x07),
    );
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[48] = 0x03;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (5, 0x26, 0x09),
    );
    // LU ID TYPE (SPC-3) is ignored in SPC-4: a reserved value still copies, as libiscsi's
    // ExtendedCopy.ValidTgtDescr expects of an SPC-4 target.
    let src = pattern(4 * BS, 77);
    e.write16(&a, 100, src.clone());
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(100, 4100, 4)]);
    p[17] |= 0xC0;
    e.ok(&a, &xcopy_cdb(p.len()), p.len() as u32, Some(p));
    assert_eq!(e.read16(&a, 4100, 4), src);
    // NUL; bad index; beyond the end.
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[17] = 0x20;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (0x0A, 0x0D, 0x02),
    );
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[48 + 7] = 1;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (0x0A, 0x0D, 0x02),
    );
    let p = xcopy_list(&mut e, 2, 0, 1, &[(0, BLOCKS - 1, 4)]);
    let r = e.run(&a, &xcopy_cdb(p.len()), p.len() as u32, Some(p));
    assert_eq!(r.sense_triplet().map(|t| t.0), Some(0x0A));
    // A designator that is not this LU.
    let mut p = xcopy_list(&mut e, 2, 0, 1, &[(0, 4000, 4)]);
    p[16 + 10] ^= 0xFF;
    e.check(
        &a,
        &xcopy_cdb(p.len()),
        p.len() as u32,
        Some(p),
        (0x0A, 0x0D, 0x02),
    );
}
