//! Logins that fail: versions, names, stage transitions, PDUs that do not belong, limits, duplicate keys, random PDUs.

use super::*;

#[test]
fn unsupported_version() {
    let mut login = Login::new(LoginContext::default());
    let mut p = pdu(req(true, OP, FFP, &[("InitiatorName", INITIATOR)]));
    if let Op::LoginRequest(r) = &mut p.bhs.op {
        r.version_max = 2;
        r.version_min = 1;
    }
    let out = run(&mut login, &mut Policy::default(), p);
    assert_eq!(out.order, "RF");
    assert_eq!(out.failed, Some(LoginStatus::UNSUPPORTED_VERSION));
    assert_eq!(
        only_response(&out).0.status,
        LoginStatus::UNSUPPORTED_VERSION
    );
    assert_eq!(only_response(&out).0.version_max, 0);
}

#[test]
fn target_not_found_and_missing_names() {
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(
            true,
            SEC,
            OP,
            &[("InitiatorName", INITIATOR), ("TargetName", "iqn.nope")],
        )),
    );
    assert_eq!(out.failed, Some(LoginStatus::NOT_FOUND));
    assert_eq!(out.allocate, 0);
    assert!(login.is_finished());

    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(true, SEC, OP, &[("TargetName", TARGET)])),
    );
    assert_eq!(out.failed, Some(LoginStatus::MISSING_PARAMETER));

    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(true, SEC, OP, &[("InitiatorName", INITIATOR)])),
    );
    assert_eq!(out.failed, Some(LoginStatus::MISSING_PARAMETER));

    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(
            true,
            SEC,
            OP,
            &[("InitiatorName", INITIATOR), ("SessionType", "Bogus")],
        )),
    );
    assert_eq!(out.failed, Some(LoginStatus::SESSION_TYPE_NOT_SUPPORTED));
}

#[test]
fn wrong_stage_transitions() {
    let first = || {
        pdu(req(
            true,
            SEC,
            OP,
            &[("InitiatorName", INITIATOR), ("TargetName", TARGET)],
        ))
    };
    // first PDU in full feature phase
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut Policy::default(),
        pdu(req(false, FFP, FFP, &[("InitiatorName", INITIATOR)])),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // CSG that is not the current stage
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy::default();
    run(&mut login, &mut policy, first());
    let out = run(&mut login, &mut policy, pdu(req(false, SEC, SEC, &[])));
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // backwards
    let mut login = Login::new(LoginContext::default());
    run(&mut login, &mut policy, first());
    let out = run(&mut login, &mut policy, pdu(req(true, OP, SEC, &[])));
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // reserved stage
    let mut login = Login::new(LoginContext::default());
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(
            true,
            SEC,
            Stage::Reserved,
            &[("InitiatorName", INITIATOR)],
        )),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    // ISID changes mid-login
    let mut login = Login::new(LoginContext::default());
    run(&mut login, &mut policy, first());
    let mut p = pdu(req(true, OP, FFP, &[]));
    if let Op::LoginRequest(r) = &mut p.bhs.op {
        r.isid = Isid([0; 6]);
    }
    let out = run(&mut login, &mut policy, p);
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
}

#[test]
fn scsi_command_during_login() {
    use crate::pdu::{Lun, ScsiCommand};
    let mut login = Login::new(LoginContext::default());
    let cmd = Pdu::new(Op::ScsiCommand(ScsiCommand {
        immediate: false,
        final_bit: true,
        read: true,
        write: false,
        attr: 1,
        lun: Lun(0),
        itt: Itt(0x99),
        expected_data_transfer_length: 512,
        cmd_sn: Sn(1),
        exp_stat_sn: Sn(0),
        cdb: [0; 16],
    }));
    let out = run(&mut login, &mut Policy::default(), cmd);
    assert_eq!(out.failed, Some(LoginStatus::INVALID_DURING_LOGIN));
    assert_eq!(only_response(&out).0.itt, Itt(0x99));
}

#[test]
fn malformed_header_during_login() {
    let mut login = Login::new(LoginContext::default());
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x43;
    raw[1] = 0xc0;
    raw[19] = 5;
    login.handle_malformed(&raw);
    let out = drain(&mut login);
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    assert_eq!(only_response(&out).0.itt, Itt(5));
}

#[test]
fn malformed_header_of_another_opcode_is_invalid_during_login() {
    // A SCSI Command header that did not decode: the same answer as a decodable one (0x020b).
    let mut login = Login::new(LoginContext::default());
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x01;
    raw[1] = 0x60; // R and W without F
    raw[19] = 9;
    login.handle_malformed(&raw);
    let out = drain(&mut login);
    assert_eq!(out.failed, Some(LoginStatus::INVALID_DURING_LOGIN));
    assert_eq!(only_response(&out).0.itt, Itt(9));
    assert!(login.is_finished());
}

#[test]
fn malformed_first_login_request_is_answered_for_its_session() {
    let mut login = Login::new(LoginContext::default());
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x43;
    raw[1] = 0xc0; // T and C both set
    raw[8..14].copy_from_slice(&[0x80, 0, 0, 0x12, 0x34, 0x56]);
    raw[14..16].copy_from_slice(&7u16.to_be_bytes());
    raw[19] = 5;
    login.handle_malformed(&raw);
    let out = drain(&mut login);
    assert_eq!(out.order, "RF");
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    let r = &only_response(&out).0;
    assert_eq!((r.itt, r.isid, r.tsih), (Itt(5), Isid([0x80, 0, 0, 0x12, 0x34, 0x56]), 7));
}

#[test]
fn any_other_pdu_ends_the_login_at_once() {
    use crate::pdu::{DataOut, LogoutRequest, SnackRequest, TaskMgmtRequest};
    use crate::testing::{nop_out, scsi_command, text_request};
    let itt = Itt(0x77);
    let others = || {
        vec![
            Op::NopOut(nop_out(itt, Sn(100))),
            Op::ScsiCommand(scsi_command(itt, Sn(100), true, false, 512, &[0x28; 10])),
            Op::TaskMgmtRequest(TaskMgmtRequest {
                immediate: true,
                function: 0x81,
                lun: Default::default(),
                itt,
                referenced_task_tag: Itt(1),
                cmd_sn: Sn(100),
                exp_stat_sn: Sn(0),
                ref_cmd_sn: Sn(100),
                exp_data_sn: Sn(0),
            }),
            Op::TextRequest(text_request(itt, Sn(100), false)),
            Op::DataOut(DataOut {
                final_bit: true,
                lun: Default::default(),
                itt,
                ttt: crate::serial::Ttt::RESERVED,
                exp_stat_sn: Sn(0),
                data_sn: Sn(0),
                buffer_offset: 0,
            }),
            Op::LogoutRequest(LogoutRequest { immediate: true, reason_code: 0, itt, cid: 0, cmd_sn: Sn(100), exp_stat_sn: Sn(0) }),
            Op::SnackRequest(SnackRequest { snack_type: 0, lun: Default::default(), itt, ttt_or_snack_tag: 0, exp_stat_sn: Sn(0), beg_run: 0, run_length: 0 }),
        ]
    };
    let first = || pdu(req(true, SEC, OP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None")]));
    // Before any Login Request; after the security stage; in the middle of the initiator's
    // C=1 key list; while the target's long answer is still being fetched.
    for when in 0..4 {
        for op in others() {
            let mut login = Login::new(LoginContext::default());
            let mut policy = Policy::default();
            match when {
                0 => {}
                1 => assert!(run(&mut login, &mut policy, first()).failed.is_none()),
                2 => {
                    let mut r = req(false, SEC, SEC, &[("InitiatorName", INITIATOR)]);
                    r.c = true;
                    assert!(run(&mut login, &mut policy, pdu(r)).failed.is_none());
                }
                _ => {
                    // 150 NotUnderstood answers of ~78 bytes: more than one Login Response
                    let names: Vec<String> = (0..150).map(|i| format!("X-com.example.{i:03}.{}", "k".repeat(40))).collect();
                    let mut keys = vec![("InitiatorName", INITIATOR), ("TargetName", TARGET)];
                    keys.extend(names.iter().map(|k| (k.as_str(), "1")));
                    let out = run(&mut login, &mut policy, pdu(req(false, OP, OP, &keys)));
                    assert!(out.responses[0].0.continue_bit, "the answer continues");
                }
            }
            let opcode = format!("{:?}", op);
            let out = run(&mut login, &mut policy, Pdu::new(op));
            assert_eq!(out.order, "RF", "{when} {opcode}");
            assert_eq!(out.failed, Some(LoginStatus::INVALID_DURING_LOGIN));
            assert_eq!(only_response(&out).0.itt, itt);
            assert!(login.is_finished());
            assert!(run(&mut login, &mut policy, first()).order.is_empty(), "nothing after the end");
        }
    }
}

#[test]
fn a_message_that_is_no_pdu_ends_the_login_at_once() {
    // An iSER Hello during login: Initiator Error, answering the last Login Request.
    let mut login = Login::new(LoginContext { transport: Transport::Iser, ..LoginContext::default() });
    let mut policy = Policy::default();
    run(&mut login, &mut policy, pdu(req(true, SEC, OP, &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None")])));
    login.handle_unexpected("iSER Hello during login");
    let out = drain(&mut login);
    assert_eq!(out.order, "RF");
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
    assert_eq!(only_response(&out).0.itt, Itt(0x10));
    assert!(login.is_finished());
    // before any Login Request there is nothing to answer: the login just ends
    let mut login = Login::new(LoginContext::default());
    login.handle_unexpected("iSER Hello during login");
    let out = drain(&mut login);
    assert_eq!((out.order.as_str(), out.failed), ("F", Some(LoginStatus::INITIATOR_ERROR)));
    assert!(login.is_finished());
}

#[test]
fn too_many_pdus_and_too_much_text() {
    let ctx = LoginContext {
        limits: LoginLimits {
            max_pdus: 3,
            ..LoginLimits::default()
        },
        ..LoginContext::default()
    };
    let mut login = Login::new(ctx);
    let mut policy = Policy::default();
    for _ in 0..3 {
        let out = run(
            &mut login,
            &mut policy,
            pdu(Req {
                t: false,
                c: true,
                csg: SEC,
                nsg: SEC,
                keys: vec![],
            }),
        );
        assert!(out.failed.is_none());
    }
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: SEC,
            nsg: SEC,
            keys: vec![],
        }),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));

    let ctx = LoginContext {
        limits: LoginLimits {
            max_text_bytes: 10_000,
            ..LoginLimits::default()
        },
        ..LoginContext::default()
    };
    let mut login = Login::new(ctx);
    let chunk = vec![b'a'; 8192];
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: SEC,
            nsg: SEC,
            keys: chunk.clone(),
        }),
    );
    assert!(out.failed.is_none());
    let out = run(
        &mut login,
        &mut policy,
        pdu(Req {
            t: false,
            c: true,
            csg: SEC,
            nsg: SEC,
            keys: chunk,
        }),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
}

#[test]
fn duplicate_key_fails_login() {
    let mut login = Login::new(LoginContext::default());
    let mut policy = Policy::default();
    run(
        &mut login,
        &mut policy,
        pdu(req(
            false,
            OP,
            OP,
            &[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("MaxBurstLength", "65536"),
            ],
        )),
    );
    let out = run(
        &mut login,
        &mut policy,
        pdu(req(true, OP, FFP, &[("MaxBurstLength", "65536")])),
    );
    assert_eq!(out.failed, Some(LoginStatus::INITIATOR_ERROR));
}

#[test]
fn random_login_pdus_never_panic() {
    let mut seed = 0x9e37_79b9u32;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    let stages = [SEC, OP, Stage::Reserved, FFP];
    let texts: [&[u8]; 6] = [
        b"InitiatorName=iqn.x\0TargetName=iqn.2016-06.io.riser:disk1\0",
        b"AuthMethod=None\0",
        b"\0\0=\0",
        b"CHAP_A=5\0",
        b"MaxBurstLength=0x\0HeaderDigest=\0",
        b"\xff\xfe",
    ];
    for _ in 0..500 {
        let mut login = Login::new(LoginContext::default());
        let mut policy = Policy::default();
        for _ in 0..6 {
            let r = next();
            let t = r & 1 != 0;
            let c = !t && r & 2 != 0;
            let keys = texts[(r as usize >> 4) % texts.len()].to_vec();
            let p = pdu(Req {
                t,
                c,
                csg: stages[(r >> 8) as usize % 4],
                nsg: stages[(r >> 10) as usize % 4],
                keys,
            });
            login.handle(&p, &mut policy);
            drain(&mut login);
        }
    }
}
