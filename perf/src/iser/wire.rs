//! The iSER message format as riser-perf's initiator uses it (RFC 7145 §9): the iSER header
//! in front of every SEND, advertising the task buffer of a READ (Read STag) or of the part
//! of a WRITE after its immediate data (Write STag), then the BHS.

use riser_datamover::iser::header::{IserHeader, TaggedBuffer, ISER_HDR_LEN};
use riser_iscsi::pdu::{raw_data_segment_len, raw_total_ahs_len, Bhs, Op, BHS_LEN};

use riser_initiator::scsi::Dir;

/// iSER header + BHS: a bare control-type PDU.
pub const HDRS: usize = ISER_HDR_LEN + BHS_LEN;

/// The iSER header of a READ or WRITE command whose data buffer is `len` bytes at `va` under
/// `stag`, `immediate` of them sent in the command's SEND (Linux's convention: the Write
/// Base Offset points past the unsolicited part, which the target does not read again).
pub fn rw_header(dir: Dir, len: u32, immediate: u32, stag: u32, va: u64) -> IserHeader {
    match dir {
        Dir::Read => IserHeader::Control {
            write: None,
            read: Some(TaggedBuffer {
                stag,
                base_offset: va,
            }),
        },
        Dir::Write => IserHeader::Control {
            write: (len > immediate).then_some(TaggedBuffer {
                stag,
                base_offset: va + immediate as u64,
            }),
            read: None,
        },
    }
}

/// The first 76 bytes of a SEND: iSER header, then the BHS with its data segment length
/// (the data, no padding and no digests, follows in the same SEND).
pub fn encode_headers(hdr: IserHeader, op: Op, data_len: usize) -> [u8; HDRS] {
    let mut out = [0u8; HDRS];
    let mut h = [0u8; ISER_HDR_LEN];
    hdr.write(&mut h);
    out[..ISER_HDR_LEN].copy_from_slice(&h);
    let bhs = Bhs {
        total_ahs_length: 0,
        data_segment_length: data_len as u32,
        op,
    };
    let mut b = [0u8; BHS_LEN];
    bhs.write(&mut b);
    out[ISER_HDR_LEN..].copy_from_slice(&b);
    out
}

/// Parses the headers of a received message of `len` bytes whose first bytes are `head`:
/// the BHS and where its data segment lies (offset from the message start, length).
pub fn parse_message(head: &[u8; HDRS], len: usize) -> Result<(Bhs, usize, usize), String> {
    if len < HDRS {
        return Err(format!(
            "a {len}-byte message, shorter than the iSER and iSCSI headers ({HDRS} bytes)"
        ));
    }
    match IserHeader::parse(head) {
        Ok(IserHeader::Control { .. }) => {}
        Ok(other) => return Err(format!("unexpected iSER message {other:?}")),
        Err(e) => return Err(format!("bad iSER header: {e}")),
    }
    let mut b = [0u8; BHS_LEN];
    b.copy_from_slice(&head[ISER_HDR_LEN..]);
    let ahs = raw_total_ahs_len(&b);
    let dsl = raw_data_segment_len(&b);
    if HDRS + ahs + dsl > len {
        return Err(format!(
            "a PDU with {ahs} bytes of AHS and a {dsl}-byte data segment in a {len}-byte message"
        ));
    }
    let bhs = Bhs::parse(&b).map_err(|e| format!("malformed PDU: {e}"))?;
    Ok((bhs, HDRS + ahs, dsl))
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_initiator::scsi::rw_cdb;
    use riser_iscsi::pdu::Lun;
    use riser_iscsi::pdu::{Opcode, ScsiCommand, ScsiResponse};
    use riser_iscsi::serial::Itt;
    use riser_iscsi::serial::Sn;

    fn cmd(dir: Dir, len: u32) -> ScsiCommand {
        ScsiCommand {
            immediate: false,
            final_bit: true,
            read: dir == Dir::Read,
            write: dir == Dir::Write,
            attr: 1,
            lun: Lun(0x0001_0000_0000_0000),
            itt: Itt(0x0003_0007),
            expected_data_transfer_length: len,
            cmd_sn: Sn(42),
            exp_stat_sn: Sn(9),
            cdb: rw_cdb(dir, 0x1000, len / 512),
        }
    }

    #[test]
    fn read_command_advertises_the_read_stag() {
        let h = rw_header(Dir::Read, 65536, 0, 0xabcd_0123, 0x7f00_0001_0000);
        let m = encode_headers(h, Op::ScsiCommand(cmd(Dir::Read, 65536)), 0);
        // Control, R bit only; Write STag/VA zero; Read STag and VA big-endian.
        assert_eq!(m[0], 0x14);
        assert_eq!(&m[1..16], &[0u8; 15]);
        assert_eq!(&m[16..20], &[0xab, 0xcd, 0x01, 0x23]);
        assert_eq!(&m[20..28], &0x7f00_0001_0000u64.to_be_bytes());
        // BHS: SCSI Command, F and R set, no data segment, EDTL 64 KiB, CmdSN 42.
        assert_eq!(m[28] & 0x3f, 0x01);
        assert_eq!(m[29], 0x80 | 0x40 | 1);
        assert_eq!(&m[28 + 4..28 + 8], &[0, 0, 0, 0]);
        assert_eq!(&m[28 + 20..28 + 24], &65536u32.to_be_bytes());
        assert_eq!(&m[28 + 24..28 + 28], &42u32.to_be_bytes());
        assert_eq!(m[28 + 32], 0x28, "READ (10) CDB");
        let (bhs, ds, dl) = parse_message(&m, HDRS).unwrap();
        assert_eq!((ds, dl), (HDRS, 0));
        assert_eq!(bhs.op.opcode(), Some(Opcode::ScsiCommand));
    }

    #[test]
    fn write_command_with_immediate_data() {
        // 64 KiB write, 8 KiB immediate: W bit, Write VA past the immediate part.
        let h = rw_header(Dir::Write, 65536, 8192, 0x55, 0x1000_0000);
        let m = encode_headers(h, Op::ScsiCommand(cmd(Dir::Write, 65536)), 8192);
        assert_eq!(m[0], 0x18);
        assert_eq!(&m[4..8], &0x55u32.to_be_bytes());
        assert_eq!(&m[8..16], &(0x1000_0000u64 + 8192).to_be_bytes());
        assert_eq!(&m[16..28], &[0u8; 12]);
        assert_eq!(m[29], 0x80 | 0x20 | 1, "F and W");
        assert_eq!(&m[28 + 5..28 + 8], &[0, 0x20, 0], "DataSegmentLength 8192");
        // Everything immediate: no Write STag at all.
        let h = rw_header(Dir::Write, 4096, 4096, 0x55, 0x1000_0000);
        assert_eq!(
            h,
            IserHeader::Control {
                write: None,
                read: None
            }
        );
        // No immediate data: the whole buffer is advertised.
        let h = rw_header(Dir::Write, 4096, 0, 0x55, 0x1000_0000);
        assert_eq!(
            h,
            IserHeader::Control {
                write: Some(TaggedBuffer {
                    stag: 0x55,
                    base_offset: 0x1000_0000
                }),
                read: None
            }
        );
    }

    #[test]
    fn received_messages_are_checked() {
        let resp = ScsiResponse {
            bidi_read_residual_overflow: false,
            bidi_read_residual_underflow: false,
            residual_overflow: false,
            residual_underflow: false,
            response: 0,
            status: 2,
            itt: Itt(5),
            snack_tag: 0,
            stat_sn: Sn(1),
            exp_cmd_sn: Sn(2),
            max_cmd_sn: Sn(33),
            exp_data_sn: Sn(0),
            bidi_read_residual_count: 0,
            residual_count: 0,
        };
        let plain = IserHeader::Control {
            write: None,
            read: None,
        };
        let m = encode_headers(plain, Op::ScsiResponse(resp), 20);
        assert_eq!(m[0], 0x10);
        let (bhs, ds, dl) = parse_message(&m, HDRS + 20).unwrap();
        assert!(matches!(bhs.op, Op::ScsiResponse(ref r) if r.status == 2 && r.itt == Itt(5)));
        assert_eq!((ds, dl), (HDRS, 20));
        // The data segment must fit the message.
        assert!(parse_message(&m, HDRS + 19)
            .unwrap_err()
            .contains("20-byte data segment"));
        assert!(parse_message(&m, 40).unwrap_err().contains("shorter"));
        let mut hello = m;
        hello[0] = 0x20;
        assert!(parse_message(&hello, HDRS + 20)
            .unwrap_err()
            .contains("unexpected iSER message"));
        hello[0] = 0x70;
        assert!(parse_message(&hello, HDRS + 20)
            .unwrap_err()
            .contains("bad iSER header"));
    }
}
