//! Unit tests of the command line: what each subcommand sends, and usage errors.

use riser_config::target_node::{LunParam, PgIgMap};
use serde_json::json;

use super::*;

/// What `riser-rpc ARGS..` would send: (method, params), or the usage error and its exit
/// status.
fn sent(args: &[&str]) -> Result<(String, Option<Value>), (String, i32)> {
    let argv = std::iter::once("riser-rpc").chain(args.iter().copied());
    let m = Cli::command().try_get_matches_from(argv).map_err(|e| (e.to_string(), e.exit_code()))?;
    let cli = Cli::from_arg_matches(&m).map_err(|e| (e.to_string(), e.exit_code()))?;
    match cli.cmd.into_action(m.subcommand_name().unwrap_or_default().to_string()) {
        Ok(Action::Call(method, params)) => Ok((method, params)),
        Ok(_) => panic!("{args:?}: not a plain call"),
        Err(UsageError(msg)) => Err((msg, 2)),
    }
}

fn params(args: &[&str]) -> Value {
    let (method, p) = sent(args).unwrap_or_else(|e| panic!("{args:?}: {e:?}"));
    assert_eq!(method, args[0]);
    p.unwrap_or(Value::Null)
}

/// A usage error (exit 2) whose message contains `needle`.
fn refused(args: &[&str], needle: &str) {
    match sent(args) {
        Err((msg, code)) => {
            assert_eq!(code, 2, "{args:?}: {msg}");
            assert!(msg.contains(needle), "{args:?}: {msg:?} lacks {needle:?}");
        }
        Ok(p) => panic!("{args:?} was accepted: {p:?}"),
    }
}

#[test]
fn the_command_line_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn list_splitting() {
    let v = |s: &'static str| split_list(s).collect::<Vec<_>>();
    assert_eq!(v("a b"), ["a", "b"]);
    assert_eq!(v("  a \t b\n"), ["a", "b"]);
    assert_eq!(v("a,b c, d"), ["a", "b", "c", "d"]);
    assert!(v("").is_empty());
    assert!(v(" , ").is_empty());
}

#[test]
fn portals_parse() {
    let p = |host: &str, port: &str, iser: bool| PortalArg { host: host.into(), port: port.into(), iser, ignored_cpumask: None };
    assert_eq!(parse_portals("127.0.0.1:3260"), Ok(List(vec![p("127.0.0.1", "3260", false)])));
    assert_eq!(
        parse_portals("127.0.0.1:3260 10.0.0.1:3261,[::1]:3260 192.0.2.1:3260@iser [fe80::1]:860@ISER"),
        Ok(List(vec![
            p("127.0.0.1", "3260", false),
            p("10.0.0.1", "3261", false),
            p("[::1]", "3260", false),
            p("192.0.2.1", "3260", true),
            p("[fe80::1]", "860", true),
        ]))
    );
    // rpc.py's old CPU mask suffix is accepted and ignored.
    let got = parse_portals("0.0.0.0:3260@0x3").unwrap();
    assert_eq!((got.0[0].iser, got.0[0].ignored_cpumask.as_deref()), (false, Some("0x3")));
    assert_eq!(parse_portals(""), Ok(List(vec![])));
    for (bad, needle) in [
        ("127.0.0.1", "is not HOST:PORT"),
        (":3260", "has no host"),
        ("127.0.0.1:", "is not a port number"),
        ("127.0.0.1:x", "is not a port number"),
        ("127.0.0.1:0", "is not a port number"),
        ("127.0.0.1:65536", "is not a port number"),
        ("::1:3260", "IPv6 host must be in brackets"),
        ("127.0.0.1:3260@rdma", "unknown suffix @rdma"),
        ("127.0.0.1:3260@", "nothing after '@'"),
        ("1.2.3.4:3260 5.6.7.8", "\"5.6.7.8\""),
    ] {
        let e = parse_portals(bad).expect_err(bad);
        assert!(e.contains(needle), "{bad}: {e:?} lacks {needle:?}");
    }
}

#[test]
fn luns_and_maps_parse() {
    let l = |b: &str, id: u32| LunParam { bdev_name: b.into(), lun_id: id, removable: false, read_only: false };
    assert_eq!(parse_luns("Malloc0:0 Malloc1:1"), Ok(List(vec![l("Malloc0", 0), l("Malloc1", 1)])));
    assert_eq!(parse_luns(" Malloc5:2 "), Ok(List(vec![l("Malloc5", 2)])));
    // The id is after the last colon.
    assert_eq!(parse_luns("ns:a:7"), Ok(List(vec![l("ns:a", 7)])));
    // riser's LUN options, in any order, after the id.
    let opts = |b: &str, id: u32, removable, read_only| LunParam { bdev_name: b.into(), lun_id: id, removable, read_only };
    assert_eq!(
        parse_luns("M0:0:removable M1:1:read_only M2:2:read_only:removable"),
        Ok(List(vec![opts("M0", 0, true, false), opts("M1", 1, false, true), opts("M2", 2, true, true)]))
    );
    assert!(parse_luns("M0:removable").is_err());
    for (bad, needle) in [
        ("Malloc0", "is not BDEV:LUN_ID"),
        (":0", "has no bdev name"),
        ("Malloc0:", "is not a LUN id"),
        ("Malloc0:x", "is not a LUN id"),
        ("Malloc0:-1", "is not a LUN id"),
        ("Malloc0:0 Malloc1", "\"Malloc1\""),
    ] {
        let e = parse_luns(bad).expect_err(bad);
        assert!(e.contains(needle), "{bad}: {e:?} lacks {needle:?}");
    }

    let m = |pg: u32, ig: u32| PgIgMap { pg_tag: pg, ig_tag: ig };
    assert_eq!(parse_pg_ig_maps("1:1 2:2 2:1"), Ok(List(vec![m(1, 1), m(2, 2), m(2, 1)])));
    assert_eq!(parse_pg_ig_maps("1:1,3:4"), Ok(List(vec![m(1, 1), m(3, 4)])));
    for bad in ["1", "1:", ":1", "a:1", "1:b", "1:1:1", "1-1", "1:-1"] {
        let e = parse_pg_ig_maps(bad).expect_err(bad);
        assert!(e.contains("is not PG_TAG:IG_TAG"), "{bad}: {e:?}");
    }

    assert_eq!(parse_words("ANY"), Ok(List(vec!["ANY".to_string()])));
    assert_eq!(
        parse_words("iqn.2016-06.io.spdk:h1  !iqn.2016-06.io.spdk:h2"),
        Ok(List(vec!["iqn.2016-06.io.spdk:h1".to_string(), "!iqn.2016-06.io.spdk:h2".to_string()]))
    );
    assert_eq!(parse_tag("7"), Ok(7));
    assert!(parse_tag("x").unwrap_err().contains("is not a tag"));
    assert!(parse_tag("-1").is_err());
}

#[test]
fn bdev_commands() {
    assert_eq!(
        params(&["bdev_malloc_create", "-b", "Malloc0", "64", "512"]),
        json!({"name": "Malloc0", "num_blocks": 131072, "block_size": 512})
    );
    let u = "4f2c6e1a-9b7d-4c3e-8a5f-0d1e2f3a4b5c";
    assert_eq!(params(&["bdev_malloc_create", "-u", u, "0.5", "4096"]), json!({"num_blocks": 128, "block_size": 4096, "uuid": u}));
    let upper = u.to_uppercase();
    assert_eq!(
        params(&["bdev_null_create", "-u", &upper, "Null0", "16", "4096"]),
        json!({"name": "Null0", "num_blocks": 4096, "block_size": 4096, "uuid": u})
    );
    assert_eq!(
        params(&["bdev_uring_create", "/tmp/disk.img", "Uring0"]),
        json!({"name": "Uring0", "filename": "/tmp/disk.img"})
    );
    assert_eq!(
        params(&["bdev_aio_create", "-r", "/dev/sdb", "Aio0", "4096"]),
        json!({"name": "Aio0", "filename": "/dev/sdb", "block_size": 4096, "readonly": true})
    );
    for m in ["bdev_malloc_delete", "bdev_null_delete", "bdev_uring_delete", "bdev_uring_rescan", "bdev_aio_delete", "bdev_aio_rescan"] {
        assert_eq!(params(&[m, "Malloc0"]), json!({"name": "Malloc0"}));
    }
    assert_eq!(params(&["bdev_get_bdevs"]), Value::Null);
    assert_eq!(params(&["bdev_get_bdevs", "-b", "Null0"]), json!({"name": "Null0"}));
    assert_eq!(
        params(&["bdev_nvme_attach_controller", "-b", "Nvme0", "-t", "PCIe", "-a", "0000:00:04.0"]),
        json!({"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:00:04.0"})
    );
    assert_eq!(params(&["bdev_nvme_detach_controller", "Nvme0"]), json!({"name": "Nvme0"}));
    assert_eq!(params(&["bdev_nvme_get_controllers"]), Value::Null);
    assert_eq!(params(&["bdev_nvme_get_controllers", "-n", "Nvme0"]), json!({"name": "Nvme0"}));
    refused(&["bdev_malloc_create", "1", "3000"], "not a multiple of the block size");
    refused(&["bdev_malloc_create", "1", "0"], "block size must be greater than 0");
    refused(&["bdev_null_create", "N", "0", "512"], "invalid total size");
    refused(&["bdev_malloc_create", "-u", "not-a-uuid", "1", "512"], "invalid value");
    // rpc.py's bdev_null_resize NAME NEW_SIZE (MiB), and riser's malloc one alike.
    for m in ["bdev_null_resize", "bdev_malloc_resize"] {
        assert_eq!(params(&[m, "Null0", "64"]), json!({"name": "Null0", "new_size": 64}));
        refused(&[m, "Null0", "big"], "invalid value");
        refused(&[m, "Null0"], "required");
    }
}

#[test]
fn statistics_commands() {
    assert_eq!(params(&["bdev_get_iostat"]), Value::Null);
    assert_eq!(params(&["bdev_get_iostat", "-b", "Malloc0", "-c"]), json!({"name": "Malloc0", "per_channel": true}));
    refused(&["bdev_get_iostat", "-c"], "--name");
    assert_eq!(params(&["bdev_reset_iostat", "-m", "maxmin"]), json!({"mode": "maxmin"}));
    assert_eq!(params(&["bdev_reset_iostat", "-b", "N", "-m", "all"]), json!({"name": "N", "mode": "all"}));
    refused(&["bdev_reset_iostat", "-m", "some"], "invalid value");
    assert_eq!(
        params(&["bdev_set_qos_limit", "-b", "N", "--rw-ios-per-sec", "2000", "--r-mbytes-per-sec", "0"]),
        json!({"name": "N", "rw_ios_per_sec": 2000, "r_mbytes_per_sec": 0})
    );
    assert_eq!(
        params(&["iscsi_target_node_set_qos_limit", "t1", "iqn.2016-06.io.x:h", "-l", "0", "--w-mbytes-per-sec", "5"]),
        json!({"name": "t1", "initiator_name": "iqn.2016-06.io.x:h", "lun_id": 0, "w_mbytes_per_sec": 5})
    );
    assert_eq!(params(&["bdev_enable_histogram", "N"]), json!({"name": "N", "enable": true}));
    assert_eq!(params(&["bdev_enable_histogram", "--enable", "N"]), json!({"name": "N", "enable": true}));
    assert_eq!(params(&["bdev_enable_histogram", "-d", "N"]), json!({"name": "N", "enable": false}));
    refused(&["bdev_enable_histogram", "-e", "-d", "N"], "cannot be used with");
    assert_eq!(params(&["bdev_get_histogram", "N"]), json!({"name": "N"}));
    refused(&["bdev_get_histogram"], "required");
}

#[test]
fn portal_group_commands() {
    assert_eq!(
        params(&["iscsi_create_portal_group", "1", "127.0.0.1:3260 [::1]:3261"]),
        json!({"tag": 1, "portals": [{"host": "127.0.0.1", "port": "3260"}, {"host": "[::1]", "port": "3261"}]})
    );
    // Several arguments, commas, flags, @iser.
    assert_eq!(
        params(&["iscsi_create_portal_group", "-p", "2", "10.0.0.1:3260,10.0.0.2:3260", "192.0.2.1:3260@iser", "-w"]),
        json!({"tag": 2, "portals": [
            {"host": "10.0.0.1", "port": "3260"},
            {"host": "10.0.0.2", "port": "3260"},
            {"host": "192.0.2.1", "port": "3260", "iser": true}
        ], "private": true, "wait": true})
    );
    assert_eq!(params(&["iscsi_start_portal_group", "3"]), json!({"tag": 3}));
    assert_eq!(params(&["iscsi_delete_portal_group", "3"]), json!({"tag": 3}));
    assert_eq!(params(&["iscsi_get_portal_groups"]), Value::Null);
    refused(&["iscsi_create_portal_group", "x", "127.0.0.1:3260"], "is not a tag");
    refused(&["iscsi_create_portal_group", "1", "127.0.0.1"], "is not HOST:PORT");
    refused(&["iscsi_create_portal_group", "1"], "required");
    refused(&["iscsi_delete_portal_group", "one"], "is not a tag");
    refused(&["iscsi_get_portal_groups", "1"], "unexpected argument");
}

#[test]
fn initiator_group_commands() {
    assert_eq!(
        params(&["iscsi_create_initiator_group", "1", "ANY", "127.0.0.0/8 [::1]/128"]),
        json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["127.0.0.0/8", "[::1]/128"]})
    );
    assert_eq!(
        params(&["iscsi_initiator_group_add_initiators", "1", "-n", "iqn.a:x iqn.a:y", "-m", "10.0.0.0/8"]),
        json!({"tag": 1, "initiators": ["iqn.a:x", "iqn.a:y"], "netmasks": ["10.0.0.0/8"]})
    );
    assert_eq!(
        params(&["iscsi_initiator_group_remove_initiators", "1", "-m", "10.0.0.0/8"]),
        json!({"tag": 1, "netmasks": ["10.0.0.0/8"]})
    );
    assert_eq!(
        params(&["iscsi_initiator_group_remove_initiators", "4", "--initiators", "ANY"]),
        json!({"tag": 4, "initiators": ["ANY"]})
    );
    assert_eq!(params(&["iscsi_delete_initiator_group", "2"]), json!({"tag": 2}));
    assert_eq!(params(&["iscsi_get_initiator_groups"]), Value::Null);
    refused(&["iscsi_create_initiator_group", "1", "ANY"], "required");
    refused(&["iscsi_create_initiator_group", "1.5", "ANY", "ANY"], "is not a tag");
}

#[test]
fn target_node_commands() {
    assert_eq!(
        params(&["iscsi_create_target_node", "disk1", "Disk 1", "Malloc0:0 Malloc1:1", "1:1 2:1", "64"]),
        json!({
            "name": "disk1", "alias_name": "Disk 1",
            "luns": [{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 1}],
            "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 2, "ig_tag": 1}],
            "queue_depth": 64
        })
    );
    assert_eq!(
        params(&["iscsi_create_target_node", "-r", "-m", "-g", "2", "-H", "-D", "n", "a", "M:0", "1:1", "8"]),
        json!({
            "name": "n", "alias_name": "a", "luns": [{"bdev_name": "M", "lun_id": 0}],
            "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}], "queue_depth": 8,
            "require_chap": true, "mutual_chap": true, "chap_group": 2, "header_digest": true, "data_digest": true
        })
    );
    assert_eq!(params(&["iscsi_create_target_node", "n", "a", "M:0", "1:1", "8", "-d"])["disable_chap"], json!(true));
    refused(&["iscsi_create_target_node", "n", "a", "Malloc0", "1:1", "8"], "is not BDEV:LUN_ID");
    refused(&["iscsi_create_target_node", "n", "a", "M:0", "1-1", "8"], "is not PG_TAG:IG_TAG");
    refused(&["iscsi_create_target_node", "n", "a", "M:0", "1:1", "deep"], "invalid value");
    refused(&["iscsi_create_target_node", "n", "a", "M:0", "1:1"], "required");
    refused(&["iscsi_create_target_node", "-d", "-r", "n", "a", "M:0", "1:1", "8"], "cannot be used with");

    assert_eq!(params(&["iscsi_target_node_add_lun", "disk1", "Malloc2"]), json!({"name": "disk1", "bdev_name": "Malloc2"}));
    assert_eq!(
        params(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "--removable", "--read-only"]),
        json!({"name": "disk1", "bdev_name": "Malloc2", "removable": true, "read_only": true})
    );
    // LUN 0 is sent (rpc.py drops a 0), and -1 ("any") too.
    assert_eq!(params(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "-i", "0"])["lun_id"], json!(0));
    assert_eq!(params(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "-i", "-1"])["lun_id"], json!(-1));
    assert_eq!(params(&["iscsi_target_node_add_lun", "-i", "5", "disk1", "Malloc2"])["lun_id"], json!(5));
    refused(&["iscsi_target_node_add_lun", "disk1", "Malloc2", "-i", "two"], "invalid value");
    assert_eq!(params(&["iscsi_target_node_remove_lun", "disk1", "3"]), json!({"name": "disk1", "lun_id": 3}));
    assert_eq!(params(&["iscsi_target_node_remove_lun", "disk1", "0"]), json!({"name": "disk1", "lun_id": 0}));
    refused(&["iscsi_target_node_remove_lun", "disk1", "-1"], "");
    refused(&["iscsi_target_node_remove_lun", "disk1"], "required");

    for m in ["iscsi_target_node_add_pg_ig_maps", "iscsi_target_node_remove_pg_ig_maps"] {
        assert_eq!(
            params(&[m, "iqn.2016-06.io.riser:disk1", "1:1 2:3"]),
            json!({"name": "iqn.2016-06.io.riser:disk1", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 1}, {"pg_tag": 2, "ig_tag": 3}]})
        );
        refused(&[m, "d", "1:x"], "is not PG_TAG:IG_TAG");
    }
    assert_eq!(params(&["iscsi_delete_target_node", "d"]), json!({"name": "d"}));
    assert_eq!(params(&["iscsi_delete_target_node", "d", "--force"]), json!({"name": "d", "force": true}));
    assert_eq!(params(&["iscsi_target_node_request_logout", "d"]), json!({"name": "d"}));
    assert_eq!(
        params(&["iscsi_target_node_request_logout", "d", "-t", "2", "-w", "5"]),
        json!({"name": "d", "pg_tag": 2, "logout_timeout": 5})
    );
    refused(&["iscsi_target_node_request_logout", "d", "-t", "x"], "invalid value");
    assert_eq!(
        params(&["iscsi_target_node_set_redirect", "d", "1", "-a", "10.0.0.2", "-p", "3261"]),
        json!({"name": "d", "pg_tag": 1, "redirect_host": "10.0.0.2", "redirect_port": "3261"})
    );
    assert_eq!(params(&["iscsi_target_node_set_redirect", "d", "1"]), json!({"name": "d", "pg_tag": 1}));
    refused(&["iscsi_target_node_set_redirect", "d"], "required");
    assert_eq!(params(&["iscsi_get_target_nodes"]), Value::Null);
}

#[test]
fn options_and_getters() {
    assert_eq!(params(&["iscsi_set_options"]), Value::Null);
    assert_eq!(
        params(&[
            "iscsi_set_options", "-f", "/etc/auth", "-b", "iqn.2024-01.com.example", "-o", "10", "-n", "5", "-r", "-m",
            "-g", "1", "-a", "16", "-q", "32", "-c", "4", "-w", "0", "-v", "30", "-s", "65536", "-i", "-l", "0", "-p",
            "-x", "8", "-k", "2", "-u", "1024", "-j", "512", "-z", "256",
        ]),
        json!({
            "auth_file": "/etc/auth", "node_base": "iqn.2024-01.com.example", "nop_timeout": 10, "nop_in_interval": 5,
            "require_chap": true, "mutual_chap": true, "chap_group": 1, "max_sessions": 16, "max_queue_depth": 32,
            "max_connections_per_session": 4, "default_time2wait": 0, "default_time2retain": 30,
            "first_burst_length": 65536, "immediate_data": true, "error_recovery_level": 0,
            "allow_duplicated_isid": true, "max_large_datain_per_connection": 8, "max_r2t_per_connection": 2,
            "pdu_pool_size": 1024, "immediate_data_pool_size": 512, "data_out_pool_size": 256
        })
    );
    assert_eq!(params(&["iscsi_set_options", "--no-immediate-data", "-d"]), json!({"disable_chap": true, "immediate_data": false}));
    assert_eq!(params(&["iscsi_set_options", "--first-burst-length", "4096"]), json!({"first_burst_length": 4096}));
    assert_eq!(params(&["iscsi_set_options", "--data-out-timeout", "5"]), json!({"data_out_timeout": 5}));
    assert_eq!(
        params(&["iobuf_set_options", "--max-buffer-share-percent", "20", "--buffer-reserve-percent", "10"]),
        json!({"max_buffer_share_percent": 20, "buffer_reserve_percent": 10})
    );
    assert_eq!(
        params(&["iscsi_set_options", "--login-timeout", "5", "--max-logins", "64", "--max-logins-per-source", "4", "--max-discovery-sessions", "8"]),
        json!({"login_timeout": 5, "max_logins": 64, "max_logins_per_source": 4, "max_discovery_sessions": 8})
    );
    assert_eq!(
        params(&["iscsi_set_options", "--max-discovery-sessions-per-source", "2", "--discovery-idle-timeout", "0"]),
        json!({"max_discovery_sessions_per_source": 2, "discovery_idle_timeout": 0})
    );
    refused(&["iscsi_set_options", "-i", "--no-immediate-data"], "cannot be used with");
    refused(&["iscsi_set_options", "-d", "-r"], "cannot be used with");
    refused(&["iscsi_set_options", "-q", "many"], "invalid value");
    refused(&["iscsi_set_options", "-q", "-1"], "-1");
    for m in ["iscsi_get_options", "iscsi_get_connections", "iscsi_get_stats"] {
        assert_eq!(sent(&[m]), Ok((m.to_string(), None)));
    }
}

#[test]
fn every_iscsi_subcommand_has_help() {
    let cmd = Cli::command();
    let iscsi: Vec<_> = cmd.get_subcommands().filter(|c| c.get_name().starts_with("iscsi_")).collect();
    assert_eq!(iscsi.len(), 34);
    for c in iscsi {
        assert!(c.get_about().is_some(), "{} has no help line", c.get_name());
        let e = sent(&[c.get_name(), "--help"]).expect_err("--help");
        assert_eq!(e.1, 0, "{}: {}", c.get_name(), e.0);
        for a in c.get_arguments().filter(|a| a.get_id() != "help") {
            assert!(a.get_help().is_some(), "{} {}: no help", c.get_name(), a.get_id());
        }
    }
}

#[test]
fn auth_group_commands() {
    assert_eq!(params(&["iscsi_create_auth_group", "1"]), json!({"tag": 1}));
    // rpc.py's -c form.
    assert_eq!(
        params(&["iscsi_create_auth_group", "1", "-c", "user:u secret:s muser:mu msecret:ms,user:u2 secret:s2"]),
        json!({"tag": 1, "secrets": [
            {"user": "u", "secret": "s", "muser": "mu", "msecret": "ms"},
            {"user": "u2", "secret": "s2"}
        ]})
    );
    // Looser than rpc.py: any order and whitespace, empty items, a ':' inside a value.
    assert_eq!(
        params(&["iscsi_create_auth_group", "--secrets", " secret:a:b \t user:x ,", "2"]),
        json!({"tag": 2, "secrets": [{"user": "x", "secret": "a:b"}]})
    );
    assert_eq!(params(&["iscsi_create_auth_group", "3", "-c", ""]), json!({"tag": 3}));
    assert_eq!(
        params(&["iscsi_create_auth_group", "4", "-c", "user:u secret:s initiator_group:2"]),
        json!({"tag": 4, "secrets": [{"user": "u", "secret": "s", "initiator_group": 2}]})
    );
    for (bad, needle) in [
        ("user:u secret:SECRETX extra", "--secrets item 1, word 3: not KEY:VALUE"),
        ("user:u secret:SECRETX,user:v", "--secrets item 2: no secret:"),
        ("secret:SECRETX", "--secrets item 1: no user:"),
        ("user:u secret:SECRETX secret:SECRETY", "--secrets item 1, word 3: secret given twice"),
        ("user:u secret:SECRETX pass:SECRETY", "--secrets item 1, word 3: unknown key"),
        // A secret with a space: its second half looks like a word of its own.
        ("user:u secret:SECRET X:SECRETY", "--secrets item 1, word 3: unknown key"),
        ("user:u secret:SECRETX initiator_group:x", "--secrets item 1: initiator_group: not a tag"),
    ] {
        let (msg, code) = sent(&["iscsi_create_auth_group", "1", "-c", bad]).expect_err(bad);
        assert_eq!(code, 2, "{bad}: {msg}");
        assert!(msg.contains(needle), "{bad}: {msg:?} lacks {needle:?}");
        assert!(!msg.contains("SECRET"), "{bad}: the message shows a secret: {msg}");
    }
    refused(&["iscsi_create_auth_group", "0x1"], "is not a tag");

    assert_eq!(params(&["iscsi_delete_auth_group", "4"]), json!({"tag": 4}));
    assert_eq!(params(&["iscsi_get_auth_groups"]), Value::Null);
    assert_eq!(
        params(&["iscsi_auth_group_add_secret", "1", "-u", "u", "-s", "s"]),
        json!({"tag": 1, "user": "u", "secret": "s"})
    );
    assert_eq!(
        params(&["iscsi_auth_group_add_secret", "--user", "u", "--secret", "s", "-m", "mu", "-r", "ms", "1"]),
        json!({"tag": 1, "user": "u", "secret": "s", "muser": "mu", "msecret": "ms"})
    );
    assert_eq!(
        params(&["iscsi_auth_group_add_secret", "1", "-u", "u", "-s", "s", "-i", "3"]),
        json!({"tag": 1, "user": "u", "secret": "s", "initiator_group": 3})
    );
    refused(&["iscsi_auth_group_add_secret", "1", "-u", "u"], "--secret");
    refused(&["iscsi_auth_group_add_secret", "1", "-s", "s"], "--user");
    assert_eq!(params(&["iscsi_auth_group_remove_secret", "1", "-u", "u"]), json!({"tag": 1, "user": "u"}));
    refused(&["iscsi_auth_group_remove_secret", "1"], "--user");
    // The global -s (socket) still works before the method.
    let argv = ["riser-rpc", "-s", "/tmp/x.sock", "iscsi_auth_group_add_secret", "1", "-u", "u", "-s", "s"];
    let cli = Cli::try_parse_from(argv).unwrap();
    assert_eq!(cli.server, PathBuf::from("/tmp/x.sock"));
}

#[test]
fn auth_policy_commands() {
    assert_eq!(params(&["iscsi_set_discovery_auth"]), Value::Null);
    assert_eq!(
        params(&["iscsi_set_discovery_auth", "-r", "-m", "-g", "2"]),
        json!({"require_chap": true, "mutual_chap": true, "chap_group": 2})
    );
    assert_eq!(params(&["iscsi_set_discovery_auth", "--disable-chap"]), json!({"disable_chap": true}));
    refused(&["iscsi_set_discovery_auth", "-d", "-r"], "cannot be used with");
    refused(&["iscsi_set_discovery_auth", "-g", "x"], "is not a tag");
    assert_eq!(params(&["iscsi_target_node_set_auth", "disk1"]), json!({"name": "disk1"}));
    assert_eq!(
        params(&["iscsi_target_node_set_auth", "disk1", "-g", "1", "-r", "-m"]),
        json!({"name": "disk1", "chap_group": 1, "require_chap": true, "mutual_chap": true})
    );
    assert_eq!(params(&["iscsi_target_node_set_auth", "-d", "disk1"]), json!({"name": "disk1", "disable_chap": true}));
    refused(&["iscsi_target_node_set_auth", "disk1", "-d", "-r"], "cannot be used with");
    refused(&["iscsi_target_node_set_auth"], "required");
}

#[test]
fn log_level_subcommands() {
    assert_eq!(params(&["log_set_level", "DEBUG"]), json!({"level": "DEBUG"}));
    assert_eq!(params(&["log_set_print_level", "warn"]), json!({"level": "warn"}));
    assert_eq!(params(&["log_get_level"]), Value::Null);
    assert_eq!(params(&["log_get_print_level"]), Value::Null);
    refused(&["log_set_level"], "required");
    refused(&["log_set_level", "INFO", "DEBUG"], "unexpected argument");
    refused(&["log_get_level", "INFO"], "unexpected argument");
}

#[test]
fn debug_of_a_command_line_never_shows_secrets() {
    for argv in [
        &["riser-rpc", "iscsi_create_auth_group", "1", "-c", "user:u secret:SECRETX muser:m msecret:SECRETY"][..],
        &["riser-rpc", "iscsi_auth_group_add_secret", "1", "-u", "u", "-s", "SECRETX", "-m", "m", "-r", "SECRETY"][..],
    ] {
        let cli = Cli::try_parse_from(argv).unwrap();
        let text = format!("{cli:?} {cli:#?}");
        assert!(!text.contains("SECRET"), "{text}");
    }
}

#[test]
fn save_config_output_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let cli = Cli::try_parse_from(["riser-rpc", "save_config", "-o", "cfg.json", "-i", "4"]).unwrap();
    match cli.cmd.into_action("save_config".into()) {
        Ok(Action::SaveConfig { indent: 4, output: Some(p) }) => assert_eq!(p, PathBuf::from("cfg.json")),
        _ => panic!("not save_config to cfg.json"),
    }
    let dir = std::env::temp_dir().join(format!("riser-rpc-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cfg.json");
    // An existing file readable by all is replaced by a private one.
    std::fs::write(&path, "old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    write_private(&path, "{\"subsystems\": []}\n").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"subsystems\": []}\n");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    write_private(&dir.join("new.json"), "x").unwrap();
    assert_eq!(std::fs::metadata(dir.join("new.json")).unwrap().permissions().mode() & 0o777, 0o600);
    // Nothing else left behind; a missing directory is an error, not a panic.
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["cfg.json", "new.json"]);
    let e = write_private(&dir.join("no/such/dir.json"), "x").unwrap_err();
    assert!(e.starts_with("cannot write"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
