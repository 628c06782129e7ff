//! INQUIRY, VPD pages, READ CAPACITY.

use super::*;

#[test]
fn inquiry_standard_and_alloc_length() {
    let mut e = env();
    let a = e.a.clone();
    let d = e.ok(&a, &[op::INQUIRY, 0, 0, 1, 4, 0], 260, None);
    assert_eq!(d.len(), 96);
    assert_eq!(d[0], 0);
    assert_eq!(d[2], 6);
    assert_eq!(d[3] & 0x0F, 2);
    assert_eq!(d[4] as usize, d.len() - 5);
    assert_eq!(&d[8..16], b"RISER   ");
    assert!(d[7] & 0x02 != 0, "CmdQue");
    assert_eq!(d[5] & 0x30, 0x10, "TPGS implicit");
    let descs: Vec<u16> = (0..8)
        .map(|i| u16::from_be_bytes([d[58 + 2 * i], d[59 + 2 * i]]))
        .collect();
    assert!(descs.contains(&0x04C0) && descs.contains(&0x0460));
    // Every allocation length works and truncates.
    for alloc in 0..=255u16 {
        let r = e.run(
            &a,
            &[op::INQUIRY, 0, 0, (alloc >> 8) as u8, alloc as u8, 0],
            alloc as u32,
            None,
        );
        assert_eq!(r.status, Status::Good);
        assert_eq!(r.data_len, (alloc as usize).min(96));
        let want = if alloc > 96 {
            Residual::Underflow(alloc as u32 - 96)
        } else {
            Residual::None
        };
        assert_eq!(r.residual, want);
    }
    // EVPD=0 with a page code; CMDDT.
    e.check(
        &a,
        &[op::INQUIRY, 0, 0x80, 0, 255, 0],
        255,
        None,
        ILLEGAL_FIELD,
    );
    e.check(
        &a,
        &[op::INQUIRY, 2, 0, 0, 255, 0],
        255,
        None,
        ILLEGAL_FIELD,
    );
}

#[test]
fn vpd_pages() {
    let mut e = env();
    let a = e.a.clone();
    let sup = e.ok(&a, &[op::INQUIRY, 1, 0, 0, 255, 0], 255, None);
    let pages = sup[4..4 + sup[3] as usize].to_vec();
    assert_eq!(pages, vec![0x00, 0x80, 0x83, 0x8F, 0xB0, 0xB1, 0xB2]);
    for p in pages {
        let d = e.ok(&a, &[op::INQUIRY, 1, p, 0, 255, 0], 255, None);
        assert_eq!(d[1], p);
        assert_eq!(
            u16::from_be_bytes([d[2], d[3]]) as usize + 4,
            d.len(),
            "page {p:02x}"
        );
    }
    e.check(
        &a,
        &[op::INQUIRY, 1, 0x99, 0, 255, 0],
        255,
        None,
        ILLEGAL_FIELD,
    );
    // Serial number is the bdev UUID.
    let sn = e.ok(&a, &[op::INQUIRY, 1, 0x80, 0, 255, 0], 255, None);
    assert_eq!(
        &sn[4..],
        e.lun.bdev().info().uuid.simple().to_string().as_bytes()
    );
    // Device identification: NAA 6 first, then T10, port designators, names.
    let di = e.ok(&a, &[op::INQUIRY, 1, 0x83, 0, 255, 0], 255, None);
    let mut off = 4;
    let mut types = vec![];
    while off < di.len() {
        let ty = di[off + 1] & 0x0F;
        let assoc = (di[off + 1] >> 4) & 3;
        let len = di[off + 3] as usize;
        if ty == 3 {
            assert_eq!(di[off + 4] >> 4, 6);
            assert_eq!(len, 16);
        }
        if ty == 4 {
            assert_eq!(u16::from_be_bytes([di[off + 6], di[off + 7]]), 1);
        }
        if ty == 8 && assoc == 2 {
            assert!(di[off + 4..off + 4 + len].starts_with(b"iqn.2024-01.test:tgt\0"));
        }
        types.push((ty, assoc));
        off += 4 + len;
    }
    assert_eq!(off, di.len());
    for t in [(3, 0), (1, 0), (4, 1), (5, 1), (8, 1), (8, 2)] {
        assert!(types.contains(&t), "{t:?} in {types:?}");
    }
    // Block limits: SBC-3 length, unmap limits when thin.
    let bl = e.ok(&a, &[op::INQUIRY, 1, 0xB0, 0, 255, 0], 255, None);
    assert_eq!(bl[3], 0x3C);
    assert!(u32::from_be_bytes(bl[20..24].try_into().unwrap()) > 0);
    let lbp = e.ok(&a, &[op::INQUIRY, 1, 0xB2, 0, 255, 0], 255, None);
    assert_eq!(lbp[5] & 0xE4, 0xE4, "LBPU LBPWS LBPWS10 LBPRZ");
    let bdc = e.ok(&a, &[op::INQUIRY, 1, 0xB1, 0, 255, 0], 255, None);
    assert_eq!(u16::from_be_bytes([bdc[4], bdc[5]]), 1);
}

#[test]
fn read_capacity() {
    let mut e = env();
    let a = e.a.clone();
    let d = e.ok(
        &a,
        &[op::READ_CAPACITY10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        8,
        None,
    );
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()) as u64,
        BLOCKS - 1
    );
    assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), BS as u32);
    let mut c = vec![0u8; 16];
    c[0] = op::SERVICE_ACTION_IN16;
    c[1] = op::SAI_READ_CAPACITY16;
    c[13] = 32;
    let d = e.ok(&a, &c, 32, None);
    assert_eq!(d.len(), 32);
    assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), BLOCKS - 1);
    assert_eq!(d[14] & 0xC0, 0xC0, "LBPME LBPRZ");
    // Allocation length 15: truncated.
    c[13] = 15;
    assert_eq!(e.ok(&a, &c, 15, None).len(), 15);
    // LBA without PMI.
    e.check(
        &a,
        &[op::READ_CAPACITY10, 0, 0, 0, 0, 1, 0, 0, 0, 0],
        8,
        None,
        ILLEGAL_FIELD,
    );
    // Unknown SERVICE ACTION IN(16) service action.
    c[1] = 0x1F;
    e.check(&a, &c, 32, None, ILLEGAL_FIELD);
}

#[test]
fn physical_block_size_is_reported() {
    let rc16 = |e: &mut Env| {
        let a = e.a.clone();
        let mut c = vec![0u8; 16];
        c[0] = op::SERVICE_ACTION_IN16;
        c[1] = op::SAI_READ_CAPACITY16;
        c[13] = 32;
        let d = e.ok(&a, &c, 32, None);
        let bl = e.ok(&a, &[op::INQUIRY, 1, 0xB0, 0, 64, 0], 64, None);
        (d[13] & 0x0F, u16::from_be_bytes([bl[6], bl[7]]))
    };
    let mut e = env();
    assert_eq!(rc16(&mut e), (0, 1));
    let mut e = env_with(LunConfig {
        physical_block_size: Some(4096),
        ..Default::default()
    });
    assert_eq!(rc16(&mut e), (3, 8));
    for bad in [1000, 1536, 256] {
        let mut e = env_with(LunConfig {
            physical_block_size: Some(bad),
            ..Default::default()
        });
        assert_eq!(rc16(&mut e), (0, 1), "{bad}");
    }
}
