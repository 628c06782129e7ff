//! REPORT SUPPORTED OPERATION CODES.

use super::*;

#[test]
fn supported_opcodes_match_what_is_accepted() {
    let mut e = env();
    let a = e.a.clone();
    let mut c = vec![0u8; 12];
    c[0] = op::MAINTENANCE_IN;
    c[1] = op::MI_REPORT_SUPPORTED_OPCODES;
    c[6..10].copy_from_slice(&65535u32.to_be_bytes());
    let d = e.ok(&a, &c, 65535, None);
    let n = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    assert_eq!(n + 4, d.len());
    let mut listed = vec![];
    for desc in d[4..].chunks(8) {
        let sa = if desc[5] & 1 != 0 {
            Some(u16::from_be_bytes([desc[2], desc[3]]) as u8)
        } else {
            None
        };
        listed.push((desc[0], sa, u16::from_be_bytes([desc[6], desc[7]])));
    }
    // Every listed command is accepted (never INVALID COMMAND OPERATION CODE or an
    // invalid service action), and its one-command report agrees.
    for &(opc, sa, len) in &listed {
        let mut cdb = vec![0u8; len as usize];
        cdb[0] = opc;
        if let Some(s) = sa {
            cdb[1] = s;
        }
        let r = e.run(&a, &cdb, 0, None);
        if r.status == Status::CheckCondition {
            let (k, asc, _) = r.sense_triplet().unwrap();
            assert!(
                !(k == 5 && asc == 0x20),
                "{opc:02x}/{sa:?} rejected as invalid opcode"
            );
            // Unknown service actions point at byte 1.
            assert!(
                !(k == 5
                    && asc == 0x24
                    && sa.is_some()
                    && r.sense_bytes()[17] == 1
                    && r.sense_bytes()[15] & 0x80 != 0),
                "{opc:02x}/{sa:?} rejected as invalid service action"
            );
        }
        let mut one = c.clone();
        one[2] = if sa.is_some() { 2 } else { 1 };
        one[3] = opc;
        one[4..6].copy_from_slice(&(sa.unwrap_or(0) as u16).to_be_bytes());
        let d = e.ok(&a, &one, 65535, None);
        assert_eq!(d[1] & 7, 3, "{opc:02x} supported");
        assert_eq!(u16::from_be_bytes([d[2], d[3]]), len);
        assert_eq!(d[4], opc);
        // The other reporting option is refused.
        one[2] = if sa.is_some() { 1 } else { 2 };
        e.check(&a, &one, 65535, None, ILLEGAL_FIELD);
    }
    // Every other opcode is rejected as such.
    for opc in 0..=255u8 {
        if listed.iter().any(|l| l.0 == opc) {
            continue;
        }
        let len = crate::cdb::cdb_len(opc).unwrap_or(16);
        let mut cdb = vec![0u8; len];
        cdb[0] = opc;
        e.check(&a, &cdb, 0, None, (5, 0x20, 0));
    }
    // With timeouts descriptors.
    c[2] = 0x80;
    let d = e.ok(&a, &c, 65535, None);
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize,
        listed.len() * 20
    );
    assert!(d[4..]
        .chunks(20)
        .all(|x| x[5] & 2 != 0 && u16::from_be_bytes([x[8], x[9]]) == 0x0A));
}
