//! Round trips and wire checks of the PDU codec.

use super::*;
use crate::serial::{Itt, Sn, Ttt};

fn all_ops() -> Vec<Op> {
    let lun = Lun(0x0001_0000_0000_0000);
    vec![
        Op::NopOut(NopOut {
            immediate: true,
            lun,
            itt: Itt(1),
            ttt: Ttt::RESERVED,
            cmd_sn: Sn(5),
            exp_stat_sn: Sn(6),
        }),
        Op::ScsiCommand(ScsiCommand {
            immediate: false,
            final_bit: true,
            read: true,
            write: false,
            attr: 1,
            lun,
            itt: Itt(2),
            expected_data_transfer_length: 4096,
            cmd_sn: Sn(7),
            exp_stat_sn: Sn(8),
            cdb: [0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
        }),
        Op::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: tmf::ABORT_TASK,
            lun,
            itt: Itt(3),
            referenced_task_tag: Itt(2),
            cmd_sn: Sn(9),
            exp_stat_sn: Sn(10),
            ref_cmd_sn: Sn(7),
            exp_data_sn: Sn(0),
        }),
        Op::LoginRequest(LoginRequest {
            transit_bit: true,
            continue_bit: false,
            csg: Stage::LoginOperationalNegotiation,
            nsg: Stage::FullFeaturePhase,
            version_max: 0,
            version_min: 0,
            isid: Isid([0x80, 1, 2, 3, 4, 5]),
            tsih: 0,
            itt: Itt(4),
            cid: 1,
            cmd_sn: Sn(11),
            exp_stat_sn: Sn(12),
        }),
        Op::TextRequest(TextRequest {
            immediate: true,
            final_bit: false,
            continue_bit: true,
            lun,
            itt: Itt(5),
            ttt: Ttt::RESERVED,
            cmd_sn: Sn(13),
            exp_stat_sn: Sn(14),
        }),
        Op::DataOut(DataOut {
            final_bit: true,
            lun,
            itt: Itt(6),
            ttt: Ttt(0x77),
            exp_stat_sn: Sn(15),
            data_sn: Sn(3),
            buffer_offset: 8192,
        }),
        Op::LogoutRequest(LogoutRequest {
            immediate: true,
            reason_code: logout::CLOSE_CONNECTION,
            itt: Itt(7),
            cid: 3,
            cmd_sn: Sn(16),
            exp_stat_sn: Sn(17),
        }),
        Op::SnackRequest(SnackRequest {
            snack_type: 1,
            lun,
            itt: Itt(8),
            ttt_or_snack_tag: 0x99,
            exp_stat_sn: Sn(18),
            beg_run: 4,
            run_length: 2,
        }),
        Op::NopIn(NopIn {
            lun,
            itt: Itt::RESERVED,
            ttt: Ttt(0x55),
            stat_sn: Sn(1),
            exp_cmd_sn: Sn(2),
            max_cmd_sn: Sn(33),
        }),
        Op::ScsiResponse(ScsiResponse {
            bidi_read_residual_overflow: true,
            bidi_read_residual_underflow: false,
            residual_overflow: false,
            residual_underflow: true,
            response: response::COMMAND_COMPLETED_AT_TARGET,
            status: 0x02,
            itt: Itt(9),
            snack_tag: 0,
            stat_sn: Sn(19),
            exp_cmd_sn: Sn(20),
            max_cmd_sn: Sn(51),
            exp_data_sn: Sn(2),
            bidi_read_residual_count: 12,
            residual_count: 512,
        }),
        Op::TaskMgmtResponse(TaskMgmtResponse {
            response: tmf::response::TASK_DOES_NOT_EXIST,
            itt: Itt(10),
            stat_sn: Sn(21),
            exp_cmd_sn: Sn(22),
            max_cmd_sn: Sn(53),
        }),
        Op::LoginResponse(LoginResponse {
            transit_bit: false,
            continue_bit: true,
            csg: Stage::SecurityNegotiation,
            nsg: Stage::SecurityNegotiation,
            version_max: 0,
            version_active: 0,
            isid: Isid([0x40, 0, 0, 0, 0, 9]),
            tsih: 0x1234,
            itt: Itt(11),
            stat_sn: Sn(23),
            exp_cmd_sn: Sn(24),
            max_cmd_sn: Sn(24),
            status: LoginStatus::NOT_FOUND,
        }),
        Op::TextResponse(TextResponse {
            final_bit: true,
            continue_bit: false,
            lun,
            itt: Itt(12),
            ttt: Ttt::RESERVED,
            stat_sn: Sn(25),
            exp_cmd_sn: Sn(26),
            max_cmd_sn: Sn(57),
        }),
        Op::DataIn(DataIn {
            final_bit: true,
            acknowledge: false,
            residual_overflow: true,
            residual_underflow: false,
            status_present: true,
            status: 0,
            lun,
            itt: Itt(13),
            ttt: Ttt::RESERVED,
            stat_sn: Sn(27),
            exp_cmd_sn: Sn(28),
            max_cmd_sn: Sn(59),
            data_sn: Sn(4),
            buffer_offset: 65536,
            residual_count: 100,
        }),
        Op::LogoutResponse(LogoutResponse {
            response: logout::response::CLOSED_SUCCESSFULLY,
            itt: Itt(14),
            stat_sn: Sn(29),
            exp_cmd_sn: Sn(30),
            max_cmd_sn: Sn(61),
            time2wait: 2,
            time2retain: 20,
        }),
        Op::R2t(R2t {
            lun,
            itt: Itt(15),
            ttt: Ttt(0x42),
            stat_sn: Sn(31),
            exp_cmd_sn: Sn(32),
            max_cmd_sn: Sn(63),
            r2t_sn: Sn(1),
            buffer_offset: 65536,
            desired_data_transfer_length: 262144,
        }),
        Op::AsyncMessage(AsyncMessage {
            lun,
            stat_sn: Sn(33),
            exp_cmd_sn: Sn(34),
            max_cmd_sn: Sn(65),
            async_event: 1,
            async_vcode: 0,
            parameter1: 3,
            parameter2: 2,
            parameter3: 20,
        }),
        Op::Reject(Reject {
            reason: RejectReason::ProtocolError as u8,
            stat_sn: Sn(35),
            exp_cmd_sn: Sn(36),
            max_cmd_sn: Sn(67),
            data_sn_or_r2t_sn: Sn(0),
        }),
    ]
}

#[test]
fn reject_reason_codes() {
    for code in 0..=255u8 {
        if let Some(r) = RejectReason::from_code(code) {
            assert_eq!(r.code(), code);
        }
    }
    assert_eq!(RejectReason::ProtocolError.code(), 0x04);
    assert_eq!(RejectReason::from_code(0x09), Some(RejectReason::InvalidPduField));
    assert_eq!(RejectReason::from_code(0x0b), None, "deprecated");
    assert_eq!(RejectReason::from_code(0x01), None, "reserved");
}

#[test]
fn every_opcode_round_trips() {
    let ops = all_ops();
    assert_eq!(ops.len(), 18);
    for op in ops {
        let bhs = Bhs {
            total_ahs_length: 0,
            data_segment_length: 0x012345,
            op,
        };
        let raw = bhs.to_bytes();
        assert_eq!(raw_data_segment_len(&raw), 0x012345);
        let back = Bhs::parse(&raw).unwrap();
        assert_eq!(back, bhs, "opcode {:?}", bhs.opcode());
        assert_eq!(back.to_bytes(), raw);
    }
}

#[test]
fn opcode_bytes_and_bits_on_the_wire() {
    for op in all_ops() {
        let code = op.opcode().unwrap();
        let raw = Bhs {
            total_ahs_length: 0,
            data_segment_length: 0,
            op,
        }
        .to_bytes();
        assert_eq!(raw[0] & 0x3f, code as u8);
        assert_eq!(Opcode::from_u8(raw[0]), Some(code));
    }
    // Login Request: I bit always set, CSG/NSG packed in byte 1
    let ops = all_ops();
    let login = ops
        .iter()
        .find(|o| matches!(o, Op::LoginRequest(_)))
        .unwrap()
        .clone();
    let raw = Bhs {
        total_ahs_length: 0,
        data_segment_length: 0,
        op: login,
    }
    .to_bytes();
    assert_eq!(raw[0], 0x43);
    assert_eq!(raw[1], 0x80 | (1 << 2) | 3);
    // Reject and Async carry ITT 0xffffffff
    let rej = ops
        .iter()
        .find(|o| matches!(o, Op::Reject(_)))
        .unwrap()
        .clone();
    let raw = Bhs {
        total_ahs_length: 0,
        data_segment_length: 48,
        op: rej,
    }
    .to_bytes();
    assert_eq!(raw_itt(&raw), Itt::RESERVED);
}

#[test]
fn unknown_opcode_keeps_the_header() {
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x1c; // vendor-specific initiator opcode
    raw[7] = 8;
    raw[16..20].copy_from_slice(&[0, 0, 0, 42]);
    raw[40] = 0xee;
    let bhs = Bhs::parse(&raw).unwrap();
    match &bhs.op {
        Op::Unknown(u) => {
            assert_eq!(u.opcode, 0x1c);
            assert_eq!(u.raw, raw);
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert_eq!(bhs.itt(), Itt(42));
    assert_eq!(bhs.data_segment_length, 8);
    assert_eq!(bhs.to_bytes(), raw);
}

#[test]
fn contradictory_bits_are_errors() {
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x04;
    raw[1] = 0xc0; // F and C
    assert!(matches!(
        Bhs::parse(&raw),
        Err(PduError::InvalidField { opcode: 0x04, .. })
    ));
    raw[0] = 0x43;
    raw[1] = 0xc0 | 0x07; // T and C
    assert!(matches!(
        Bhs::parse(&raw),
        Err(PduError::InvalidField { opcode: 0x03, .. })
    ));
    assert!(matches!(
        Bhs::parse_slice(&raw[..47]),
        Err(PduError::Truncated { .. })
    ));
}

#[test]
fn any_header_parses_without_panic() {
    // every opcode byte with every byte-1 pattern
    for b0 in 0..=255u8 {
        for b1 in [0u8, 0x7f, 0x80, 0xc0, 0xff] {
            let mut raw = [0xa5u8; BHS_LEN];
            raw[0] = b0;
            raw[1] = b1;
            let _ = Bhs::parse(&raw);
        }
    }
}

#[test]
fn encode_pads_and_digests() {
    let op = all_ops()
        .into_iter()
        .find(|o| matches!(o, Op::TextRequest(_)))
        .unwrap();
    let pdu = Pdu::with_data(op, b"SendTargets=All\0".to_vec()[..15].to_vec());
    let plain = pdu.to_bytes(Digests::default()).unwrap();
    assert_eq!(plain.len(), 48 + 16);
    assert_eq!(raw_data_segment_len(plain[..48].try_into().unwrap()), 15);
    assert_eq!(plain[63], 0);
    let dig = pdu
        .to_bytes(Digests {
            header: true,
            data: true,
        })
        .unwrap();
    assert_eq!(dig.len(), 48 + 4 + 16 + 4);
    assert_eq!(
        dig.len(),
        pdu.encoded_len(Digests {
            header: true,
            data: true
        })
    );
    let hd = u32::from_le_bytes(dig[48..52].try_into().unwrap());
    assert_eq!(hd, crate::digest::crc32c(&dig[..48]));
    let dd = u32::from_le_bytes(dig[68..72].try_into().unwrap());
    assert_eq!(dd, crate::digest::crc32c(&dig[52..68]));
    // no data: no data digest
    let nop = Pdu::new(all_ops().remove(0));
    assert_eq!(
        nop.to_bytes(Digests {
            header: true,
            data: true
        })
        .unwrap()
        .len(),
        52
    );
}

#[test]
fn message_round_trip_and_length_checks() {
    let op = all_ops()
        .into_iter()
        .find(|o| matches!(o, Op::DataOut(_)))
        .unwrap();
    let pdu = Pdu::with_data(op, vec![7u8; 13]);
    let mut m = Vec::new();
    pdu.encode_message(&mut m).unwrap();
    assert_eq!(m.len(), 48 + 13);
    let mut back = Pdu::decode_message(&m, 8192).unwrap();
    back.bhs.data_segment_length = 0;
    let mut want = pdu.clone();
    want.bhs.data_segment_length = 0;
    assert_eq!(back, want);
    assert!(matches!(
        Pdu::decode_message(&m, 12),
        Err(PduError::DataSegmentTooLong { len: 13 })
    ));
    assert!(matches!(
        Pdu::decode_message(&m[..50], 8192),
        Err(PduError::LengthMismatch { .. })
    ));
    assert!(matches!(
        Pdu::decode_message(&m[..20], 8192),
        Err(PduError::Truncated { .. })
    ));
}

#[test]
fn extended_cdb() {
    let mut cdb32 = [0u8; 32];
    for (i, b) in cdb32.iter_mut().enumerate() {
        *b = i as u8;
    }
    let ops = all_ops();
    let Op::ScsiCommand(mut cmd) = ops[1].clone() else {
        unreachable!()
    };
    cmd.cdb.copy_from_slice(&cdb32[..16]);
    let mut pdu = Pdu::new(Op::ScsiCommand(cmd));
    pdu.ahs = extended_cdb_ahs(&cdb32[16..]);
    pdu.ahs.extend_from_slice(&bidi_read_edtl_ahs(777));
    assert_eq!(pdu.ahs.len() % 4, 0);
    assert_eq!(pdu.cdb().unwrap().unwrap(), cdb32.to_vec());
    assert_eq!(
        pdu.bidi_read_expected_data_transfer_length().unwrap(),
        Some(777)
    );
    let bytes = pdu.to_bytes(Digests::default()).unwrap();
    assert_eq!(usize::from(bytes[4]) * 4, pdu.ahs.len());
    // a truncated AHS is an error, not a panic
    assert!(ahs_segments(&[0, 40, 1, 0]).is_err());
    assert!(ahs_segments(&[0]).is_err());
}

#[test]
fn oversized_data_is_refused() {
    let mut pdu = Pdu::new(all_ops().remove(0));
    pdu.ahs = vec![0; 6];
    assert!(matches!(
        pdu.to_bytes(Digests::default()),
        Err(PduError::BadAhsLength { len: 6 })
    ));
}
