//! libiscsi's command-line tools against the real riser over TCP: discovery, INQUIRY (the
//! standard page and every VPD page), READ CAPACITY(16), and the README's default config.

use std::process::Command;

use riser_tests::{free_port, Riser};

/// Runs a libiscsi tool; panics (loudly, no skipping) if it is not installed.
fn tool(name: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(name)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{name} is not installed ({e}): run `scripts/setup.sh test` (Debian package libiscsi-bin)"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn iscsi_ls_inq_and_readcapacity16() {
    let riser = Riser::start();
    let port = free_port();
    let iqn = riser.add_iscsi_target("tools", port, &[16, 8]);
    let portal = format!("iscsi://127.0.0.1:{port}");

    let (ok, ls) = tool("iscsi-ls", &["-s", &portal]);
    assert!(ok, "iscsi-ls failed:\n{ls}\n{}", riser.log());
    assert!(ls.contains(&format!("Target:{iqn} Portal:127.0.0.1:{port},1")), "{ls}");
    assert!(ls.contains("Lun:0") && ls.contains("Lun:1"), "both LUNs listed:\n{ls}");
    // iscsi-ls prints (last LBA x block size) in whole MiB: 15M and 7M for 16 and 8 MiB.
    assert!(ls.contains("Size:15M") && ls.contains("Size:7M"), "{ls}");

    let url0 = format!("{portal}/{iqn}/0");
    let (ok, inq) = tool("iscsi-inq", &[&url0]);
    assert!(ok, "{inq}");
    assert!(inq.contains("Peripheral Device Type:DIRECT_ACCESS"), "{inq}");
    assert!(inq.contains("Vendor:RISER"), "{inq}");
    assert!(inq.contains("Product:Malloc disk"), "{inq}");

    // iscsi-inq takes the page code in decimal.
    let (ok, pages) = tool("iscsi-inq", &["-e", "1", "-c", "0", &url0]);
    assert!(ok, "{pages}");
    for page in ["0x80 UNIT_SERIAL_NUMBER", "0x83 DEVICE_IDENTIFICATION", "0xb0 BLOCK_LIMITS", "0xb1 BLOCK_DEVICE_CHARACTERISTICS", "0xb2 LOGICAL_BLOCK_PROVISIONING"] {
        assert!(pages.contains(page), "VPD page {page} missing from the supported list:\n{pages}");
    }
    let (ok, serial) = tool("iscsi-inq", &["-e", "1", "-c", "128", &url0]);
    assert!(ok && serial.contains("Unit Serial Number:["), "{serial}");
    let (ok, ident) = tool("iscsi-inq", &["-e", "1", "-c", "131", &url0]);
    assert!(ok, "{ident}");
    assert!(ident.contains("NAA"), "an NAA designator:\n{ident}");
    assert!(ident.contains(&format!("Designator:[{iqn}]")), "the SCSI target name designator:\n{ident}");
    let (ok, limits) = tool("iscsi-inq", &["-e", "1", "-c", "176", &url0]);
    assert!(ok && limits.contains("maximum transfer length:") && limits.contains("maximum unmap lba count:"), "{limits}");
    let (ok, chars) = tool("iscsi-inq", &["-e", "1", "-c", "177", &url0]);
    assert!(ok && chars.contains("Medium Rotation Rate:1"), "non-rotating medium:\n{chars}");
    let (ok, lbp) = tool("iscsi-inq", &["-e", "1", "-c", "178", &url0]);
    assert!(ok && lbp.contains("lbpu:1") && lbp.contains("lbprz:1"), "{lbp}");

    let (ok, cap) = tool("iscsi-readcapacity16", &[&url0]);
    assert!(ok, "{cap}");
    assert!(cap.contains("RETURNED LOGICAL BLOCK ADDRESS:32767"), "{cap}");
    assert!(cap.contains("LOGICAL BLOCK LENGTH IN BYTES:512"), "{cap}");
    assert!(cap.contains("Total size:16777216"), "{cap}");
    let (ok, cap1) = tool("iscsi-readcapacity16", &[&format!("{portal}/{iqn}/1")]);
    assert!(ok && cap1.contains("Total size:8388608"), "{cap1}");

    // A LUN that does not exist is an error, not a crash.
    let (ok, _) = tool("iscsi-readcapacity16", &[&format!("{portal}/{iqn}/7")]);
    assert!(!ok, "LUN 7 does not exist");
    // An unknown target is a login failure.
    let (ok, _) = tool("iscsi-inq", &[&format!("{portal}/iqn.2016-06.io.riser:nope/0")]);
    assert!(!ok);
    let conns = riser.call("iscsi_get_connections", None).unwrap();
    assert!(conns.as_array().is_some_and(|a| a.is_empty()), "all tools logged out: {conns}");
}

/// The README's run command serves a malloc LUN on 127.0.0.1:3260 that iscsi-inq reads.
#[test]
fn default_config_serves_a_lun_on_3260() {
    let riser = Riser::start_with(&["--default-config"]);
    let (ok, inq) = tool("iscsi-inq", &["iscsi://127.0.0.1:3260/iqn.2016-06.io.riser:disk1/0"]);
    assert!(ok, "iscsi-inq against the default config failed:\n{inq}\n{}", riser.log());
    assert!(inq.contains("Vendor:RISER"), "{inq}");
}

/// Two sessions at once on the same target; connections spread over two reactors.
#[test]
fn sessions_spread_over_reactors() {
    let riser = Riser::start_with(&["-m", "0x3", "--no-pin"]);
    let port = free_port();
    let iqn = riser.add_iscsi_target("spread", port, &[8]);
    let mut a = riser_tests::iscsi::Client::connect(port);
    a.login(&iqn, &[]).unwrap();
    let mut b = riser_tests::iscsi::Client::connect(port);
    b.login(&iqn, &[]).unwrap();
    assert!(a.clear_unit_attentions() && b.clear_unit_attentions());
    let conns = riser.call("iscsi_get_connections", None).unwrap();
    let reactors: std::collections::BTreeSet<u64> =
        conns.as_array().unwrap().iter().filter_map(|c| c["reactor"].as_u64()).collect();
    assert_eq!(reactors.len(), 2, "two sessions of one target on two reactors: {conns}");
    let data = vec![0x5au8; 4096];
    assert_eq!(a.write10(100, &data), Some(0));
    assert_eq!(b.read10(100, 8).map(|(s, d)| (s, d == data)), Some((0, true)), "b sees a's write");
}

/// Two connections in one session (MC/S): they share the session's CmdSN window, see the
/// same data, a third is refused (MaxConnections), and logging the session out closes both.
#[test]
fn multiple_connections_per_session() {
    use riser_tests::iscsi::Client;
    let riser = Riser::start_with(&["-m", "0x3", "--no-pin"]);
    let port = free_port();
    let iqn = riser.add_iscsi_target("mcs", port, &[8]);
    let mut a = Client::connect(port);
    let keys = a.login(&iqn, &[("MaxConnections", "4")]).expect("leading login");
    let max: u16 = keys.iter().find(|(k, _)| k == "MaxConnections").and_then(|(_, v)| v.parse().ok()).expect("MaxConnections answered");
    assert_eq!(max, 2, "riser's default max_connections_per_session");
    assert!(a.tsih != 0);
    let mut b = Client::connect(port);
    b.isid = a.isid;
    b.tsih = a.tsih;
    b.cid = 2;
    b.login(&iqn, &[]).expect("second connection joins the session");
    assert_eq!(b.tsih, a.tsih);
    // One window: b continues where a's CmdSN is.
    assert!(a.clear_unit_attentions());
    b.cmd_sn = a.cmd_sn;
    let data = vec![0xc3u8; 4096];
    assert_eq!(b.write10(64, &data), Some(0), "a command on the second connection");
    a.cmd_sn = b.cmd_sn;
    assert_eq!(a.read10(64, 8).map(|(s, d)| (s, d == data)), Some((0, true)));
    let conns = riser.call("iscsi_get_connections", None).unwrap();
    let list = conns.as_array().unwrap();
    assert_eq!(list.len(), 2, "{conns}");
    assert_eq!(list[0]["reactor"], list[1]["reactor"], "a session's connections share a reactor: {conns}");
    // A third connection exceeds MaxConnections=2.
    let mut c = Client::connect(port);
    c.isid = a.isid;
    c.tsih = a.tsih;
    c.cid = 3;
    assert_eq!(c.login(&iqn, &[]).err(), Some((2, 6)), "too many connections");
    // Logout of the whole session (reason 0) on a closes b too.
    let itt = a.itt();
    let logout = riser_iscsi::pdu::Pdu::new(riser_iscsi::pdu::Op::LogoutRequest(riser_iscsi::pdu::LogoutRequest {
        immediate: true,
        reason_code: 0,
        itt,
        cid: 1,
        cmd_sn: a.cmd_sn,
        exp_stat_sn: a.exp_stat_sn,
    }));
    a.send(&logout).unwrap();
    assert!(matches!(a.recv().map(|p| p.bhs.op), Some(riser_iscsi::pdu::Op::LogoutResponse(_))));
    assert!(b.closed_within(std::time::Duration::from_secs(5)), "the session's other connection closes");
}
