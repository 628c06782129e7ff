//! The JSON-RPC control plane, end to end: the real `riser` driven by the real `riser-rpc`
//! and by raw socket clients. Needs `cargo build --workspace` first.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use riser_tests::*;

const UUID_A: &str = "4f2c6e1a-9b7d-4c3e-8a5f-0d1e2f3a4b5c";
const UUID_B: &str = "a1b2c3d4-e5f6-4789-8abc-def012345678";

/// The bdevs of `bdev_get_bdevs` output, sorted by name.
fn bdev_list(v: &Value) -> Vec<Value> {
    let mut list = v.as_array().unwrap_or_else(|| panic!("bdev_get_bdevs is not an array: {v}")).clone();
    list.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    list
}

/// What must survive save_config + restart: identity and geometry of every bdev.
fn identity(list: &[Value]) -> Vec<(String, String, String, u64, u64)> {
    list.iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["product_name"].as_str().unwrap().to_string(),
                b["uuid"].as_str().unwrap().to_string(),
                b["block_size"].as_u64().unwrap(),
                b["num_blocks"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Reads one whole JSON value from a raw stream (SPDK framing: none), or None on EOF.
fn read_json(s: &mut std::os::unix::net::UnixStream) -> Option<Value> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => return Some(v),
            Some(Err(e)) if !e.is_eof() => panic!("reply is not JSON ({e}): {}", String::from_utf8_lossy(&buf)),
            _ => {}
        }
        match s.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("read failed: {e} after {}", String::from_utf8_lossy(&buf)),
        }
    }
}

#[test]
fn info_methods_print_pretty_json() {
    let riser = Riser::start();
    let out = riser.rpc(&["spdk_get_version"]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.starts_with("{\n  \""), "pretty JSON with indent 2: {:?}", out.stdout);
    assert!(out.json()["version"].is_string(), "{}", out.stdout);

    let methods = riser.rpc_json(&["rpc_get_methods"]);
    for m in [
        "spdk_get_version",
        "rpc_get_methods",
        "framework_get_reactors",
        "framework_get_subsystems",
        "framework_get_config",
        "bdev_malloc_create",
        "bdev_malloc_delete",
        "bdev_null_create",
        "bdev_null_delete",
        "bdev_get_bdevs",
    ] {
        assert!(methods.as_array().unwrap().iter().any(|x| x == m), "{m} missing from {methods}");
    }
    let reactors = riser.rpc_json(&["framework_get_reactors"]);
    assert!(reactors.is_object() || reactors.is_array(), "{reactors}");
    let subsystems = riser.rpc_json(&["framework_get_subsystems"]);
    assert!(subsystems.as_array().unwrap().iter().any(|s| s["subsystem"] == "bdev"), "{subsystems}");
    assert!(riser.rpc_json(&["framework_get_config", "bdev"]).is_array());

    // Raw mode and `call` reach the same method.
    assert_eq!(riser.rpc_json(&["call", "spdk_get_version"]), out.json());
}

#[test]
fn malloc_and_null_lifecycle() {
    let riser = Riser::start();

    let out = riser.rpc_json(&["bdev_malloc_create", "-b", "Malloc0", "-u", UUID_A, "8", "512"]);
    assert_eq!(out, json!("Malloc0"), "create returns the name");
    let out = riser.rpc_json(&["bdev_null_create", "-u", UUID_B, "Null0", "16", "4096"]);
    assert_eq!(out, json!("Null0"));
    // No name: riser picks one and returns it.
    let auto = riser.rpc_json(&["bdev_malloc_create", "1", "4096"]);
    let auto = auto.as_str().unwrap_or_else(|| panic!("expected a name, got {auto}")).to_string();
    assert!(!auto.is_empty());

    let list = bdev_list(&riser.rpc_json(&["bdev_get_bdevs"]));
    assert_eq!(list.len(), 3, "{list:?}");
    let find = |name: &str| list.iter().find(|b| b["name"] == name).cloned().unwrap_or_else(|| panic!("{name} not listed"));
    let m = find("Malloc0");
    assert_eq!(m["product_name"], "Malloc disk");
    assert_eq!(m["block_size"], 512);
    assert_eq!(m["num_blocks"], 8 * 1024 * 1024 / 512);
    assert_eq!(m["uuid"], UUID_A);
    assert_eq!(m["claimed"], false);
    let n = find("Null0");
    assert_eq!(n["product_name"], "Null disk");
    assert_eq!(n["block_size"], 4096);
    assert_eq!(n["num_blocks"], 16 * 1024 * 1024 / 4096);
    assert_eq!(n["uuid"], UUID_B);
    assert_eq!(n["claimed"], false);
    let a = find(&auto);
    assert_eq!(a["num_blocks"], 256);
    assert!(a["uuid"].as_str().is_some_and(|u| u.len() == 36), "a random uuid: {a}");

    let one = riser.rpc_json(&["bdev_get_bdevs", "-b", "Null0"]);
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one[0]["name"], "Null0");

    // Delete through the method of the right kind.
    riser.rpc_json(&["bdev_malloc_delete", "Malloc0"]);
    let names: Vec<Value> = bdev_list(&riser.rpc_json(&["bdev_get_bdevs"])).iter().map(|b| b["name"].clone()).collect();
    assert_eq!(names.len(), 2);
    assert!(!names.contains(&json!("Malloc0")));
    riser.rpc_json(&["bdev_null_delete", "Null0"]);
    riser.rpc_json(&["bdev_malloc_delete", &auto]);
    assert_eq!(riser.rpc_json(&["bdev_get_bdevs"]), json!([]));

    // Asking for a deleted bdev by name is an error, as in SPDK.
    let out = riser.rpc(&["bdev_get_bdevs", "-b", "Malloc0"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
}

#[test]
fn cli_errors_and_exit_codes() {
    let riser = Riser::start();
    riser.rpc_json(&["bdev_malloc_create", "-b", "Dup", "1", "512"]);

    // Refused by the server: exit 1, method and code on stderr.
    let out = riser.rpc(&["bdev_malloc_create", "-b", "Dup", "1", "512"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.starts_with("error: bdev_malloc_create: "), "{out:?}");
    assert!(out.stderr.contains("(code -17)"), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");

    let out = riser.rpc(&["no_such_method"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("error: no_such_method: ") && out.stderr.contains("(code -32601)"), "{out:?}");

    let out = riser.rpc(&["bdev_null_delete", "Missing"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("(code -19)"), "{out:?}");

    // Refused before sending: exit 2.
    let out = riser.rpc(&["bdev_malloc_create", "1", "3000"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("not a multiple of the block size"), "{out:?}");
    let out = riser.rpc(&["some_method", "{not json"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("not valid JSON"), "{out:?}");
    let out = riser.rpc(&["bdev_malloc_create"]);
    assert_eq!(out.code(), Some(2), "clap usage error: {out:?}");

    // Raw mode: `call METHOD JSON` sends the object as params; an unknown method name is
    // passed through to the server (which refuses it) rather than rejected by the CLI.
    let out = riser.rpc_json(&["bdev_null_create", "-u", UUID_A, "RawNull", "1", "512"]);
    assert_eq!(out, json!("RawNull"));
    let listed = riser.rpc_json(&["call", "bdev_get_bdevs", r#"{"name":"RawNull"}"#]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["uuid"], UUID_A);
    let out = riser.rpc(&["not_a_subcommand", r#"{"name":"RawNull"}"#]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("error: not_a_subcommand: ") && out.stderr.contains("(code -32601)"), "{out:?}");

    // No riser at the socket: a clear message, exit 1.
    let dir = TempDir::new("nosock");
    let out = riser_rpc(&dir.join("none.sock"), &["spdk_get_version"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("cannot connect to") && out.stderr.contains("is riser running?"), "{out:?}");
}

#[test]
fn rpc_error_codes() {
    let riser = Riser::start();
    let mut c = riser.client();
    let create = |name: &str| json!({"name": name, "num_blocks": 16, "block_size": 512});

    assert_eq!(c.call("bdev_malloc_create", Some(create("Dup0"))).unwrap(), json!("Dup0"));
    let r = c.call("bdev_malloc_create", Some(create("Dup0")));
    assert_eq!(rpc_code(&r), -17, "{r:?}");
    assert!(rpc_message(&r).contains("Dup0"), "{r:?}");
    // The name space is shared by all kinds of bdev.
    let r = c.call("bdev_null_create", Some(create("Dup0")));
    assert_eq!(rpc_code(&r), -17, "{r:?}");

    let r = c.call("no_such_method", None);
    assert_eq!(rpc_code(&r), -32601, "{r:?}");

    let r = c.call("bdev_malloc_create", Some(json!({"name": "A", "block_size": 512})));
    assert_eq!(rpc_code(&r), -32602, "{r:?}");
    assert!(rpc_message(&r).contains("num_blocks"), "{r:?}");
    let r = c.call("bdev_null_create", Some(json!({"name": "A", "num_blocks": 8, "block_size": "x"})));
    assert_eq!(rpc_code(&r), -32602, "{r:?}");
    assert!(rpc_message(&r).contains("block_size"), "{r:?}");
    let r = c.call("bdev_malloc_create", Some(json!({"name": "A", "num_blocks": 8, "block_size": 512, "bogus": 1})));
    assert_eq!(rpc_code(&r), -32602, "{r:?}");
    assert!(rpc_message(&r).contains("bogus"), "{r:?}");

    let r = c.call("bdev_malloc_delete", Some(json!({"name": "Missing"})));
    assert_eq!(rpc_code(&r), -19, "{r:?}");
    let r = c.call("bdev_null_delete", Some(json!({"name": "Missing"})));
    assert_eq!(rpc_code(&r), -19, "{r:?}");

    // None of the refused calls created anything.
    let names: Vec<Value> = bdev_list(&c.call("bdev_get_bdevs", None).unwrap()).iter().map(|b| b["name"].clone()).collect();
    assert_eq!(names, vec![json!("Dup0")]);
}

#[test]
fn malformed_requests_do_not_kill_the_server() {
    let mut riser = Riser::start();

    // Garbage: a parse error reply (if any) and the server lives on.
    {
        let mut s = riser.raw_stream();
        s.write_all(b"\x00\xffhello }{ garbage").unwrap();
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        // The server may answer with a parse error, and may close the connection.
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        if let Some(Ok(v)) = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>().next() {
            assert_eq!(v["error"]["code"], -32700, "{v}");
        }
    }
    assert!(riser.is_running(), "riser died on garbage:\n{}", riser.log());
    riser.call("spdk_get_version", None).unwrap();

    // A truncated request, then the client goes away.
    {
        let mut s = riser.raw_stream();
        s.write_all(br#"{"jsonrpc":"2.0","method":"bdev_malloc_create","id":1,"params":{"name":"Tr"#).unwrap();
        s.shutdown(Shutdown::Both).unwrap();
    }
    riser.call("spdk_get_version", None).unwrap();
    assert_eq!(riser.call("bdev_get_bdevs", None).unwrap(), json!([]), "the truncated call did nothing");

    // A batch of two calls: one array of two replies.
    {
        let mut s = riser.raw_stream();
        s.write_all(
            br#"[{"jsonrpc":"2.0","method":"spdk_get_version","id":1},{"jsonrpc":"2.0","method":"bdev_get_bdevs","id":2}]"#,
        )
        .unwrap();
        let reply = read_json(&mut s).expect("a batch reply");
        let replies = reply.as_array().unwrap_or_else(|| panic!("batch reply is not an array: {reply}"));
        assert_eq!(replies.len(), 2, "{reply}");
        let by_id = |id: i64| replies.iter().find(|r| r["id"] == id).unwrap_or_else(|| panic!("no reply {id}: {reply}"));
        assert!(by_id(1)["result"]["version"].is_string(), "{reply}");
        assert_eq!(by_id(2)["result"], json!([]), "{reply}");
    }

    assert!(riser.is_running(), "riser died:\n{}", riser.log());
    riser.call("spdk_get_version", None).unwrap();
    riser.rpc_json(&["spdk_get_version"]);
}

#[test]
fn pipelined_requests_get_replies_in_order() {
    let riser = Riser::start();
    let mut c = riser.client();
    // Both requests in one write, no separator, as the SPDK wire format allows.
    c.send_raw(
        br#"{"jsonrpc":"2.0","method":"spdk_get_version","id":7}{"jsonrpc":"2.0","method":"no_such","id":8}"#,
    )
    .unwrap();
    let first = c.recv_value().unwrap();
    let second = c.recv_value().unwrap();
    assert_eq!(first["id"], 7, "{first}");
    assert!(first["result"]["version"].is_string(), "{first}");
    assert_eq!(second["id"], 8, "{second}");
    assert_eq!(second["error"]["code"], -32601, "{second}");
}

#[test]
fn save_config_then_restart_with_json() {
    let dir = TempDir::new("cfg");
    let cfg = dir.join("config.json");
    let before;
    {
        let mut riser = Riser::start();
        riser.rpc_json(&["bdev_malloc_create", "-b", "Malloc0", "-u", UUID_A, "8", "512"]);
        riser.rpc_json(&["bdev_malloc_create", "-b", "Malloc1", "4", "4096"]);
        riser.rpc_json(&["bdev_null_create", "-u", UUID_B, "Null0", "16", "4096"]);
        before = identity(&bdev_list(&riser.rpc_json(&["bdev_get_bdevs"])));
        assert_eq!(before.len(), 3);

        let out = riser.rpc(&["save_config"]);
        let saved = out.json();
        let bdev = saved["subsystems"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["subsystem"] == "bdev"))
            .unwrap_or_else(|| panic!("no bdev subsystem in {saved}"));
        assert_eq!(bdev["config"].as_array().map(Vec::len), Some(3), "{saved}");
        std::fs::write(&cfg, &out.stdout).unwrap();

        // -i changes the indentation only.
        let out4 = riser.rpc(&["save_config", "-i", "4"]);
        assert!(out4.stdout.starts_with("{\n    \"subsystems\""), "{:?}", out4.stdout);
        assert_eq!(out4.json(), saved);

        assert!(riser.terminate(Duration::from_secs(10)).is_some(), "riser ignored SIGTERM");
    }

    let riser = Riser::start_with(&["--json", cfg.to_str().unwrap()]);
    let after = identity(&bdev_list(&riser.rpc_json(&["bdev_get_bdevs"])));
    assert_eq!(after, before, "riser --json restores the saved bdevs");
    drop(riser);

    // The same file replayed with load_config, from a file and from stdin.
    let riser = Riser::start();
    let out = riser.rpc(&["load_config", "-j", cfg.to_str().unwrap()]);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert_eq!(identity(&bdev_list(&riser.rpc_json(&["bdev_get_bdevs"]))), before);
    // A second load fails on the first duplicate, naming the method.
    let text = std::fs::read(&cfg).unwrap();
    let out = riser_rpc_stdin(riser.socket(), &["load_config"], Some(&text));
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("load_config: bdev_"), "{out:?}");
    assert!(out.stderr.contains("(code -17)"), "{out:?}");
    drop(riser);

    let riser = Riser::start();
    let out = riser_rpc_stdin(riser.socket(), &["load_config"], Some(&text));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(identity(&bdev_list(&riser.rpc_json(&["bdev_get_bdevs"]))), before);
}

#[test]
fn sigterm_exits_cleanly_and_removes_the_socket() {
    let mut riser = Riser::start();
    riser.rpc_json(&["bdev_malloc_create", "-b", "M", "1", "512"]);
    // A client that stays connected must not keep riser alive.
    let _idle = riser.raw_stream();
    let sock = riser.socket().to_path_buf();
    let t0 = Instant::now();
    let status = riser.terminate(Duration::from_secs(10));
    let status = status.unwrap_or_else(|| panic!("riser still running 10 s after SIGTERM:\n{}", riser.log()));
    assert!(status.success(), "exit status {status} after SIGTERM:\n{}", riser.log());
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(!sock.exists(), "{} left behind", sock.display());
}

/// CHAP configuration with riser-rpc's rpc.py-shaped commands, saved to a private file and
/// replayed with `--json`; no secret reaches riser's log, even at trace level, nor an error.
#[test]
fn chap_configuration_saves_privately_and_replays_without_logging_secrets() {
    use std::os::unix::fs::PermissionsExt;
    const SECRETS: [&str; 5] = ["AliceSecret-1", "RiserSecret-1", "BobSecret-123", "CarolSecret-1", "DiscSecret-1"];
    let dir = TempDir::new("chap");
    let cfg = dir.join("config.json");
    let port = free_port().to_string();
    let (groups, nodes, options);
    {
        let mut riser = Riser::start_with(&["--log-level", "trace"]);
        let portal = format!("127.0.0.1:{port}");
        for args in [
            &["bdev_malloc_create", "-b", "Malloc0", "8", "512"][..],
            &["bdev_malloc_create", "-b", "Malloc1", "8", "512"],
            &["iscsi_create_portal_group", "1", &portal, "-w"],
            &["iscsi_create_initiator_group", "1", "ANY", "ANY"],
            &["iscsi_create_auth_group", "1", "-c", "user:alice secret:AliceSecret-1 muser:riser msecret:RiserSecret-1,user:bob secret:BobSecret-123"],
            &["iscsi_auth_group_add_secret", "1", "-u", "carol", "-s", "CarolSecret-1"],
            &["iscsi_auth_group_remove_secret", "1", "-u", "bob"],
            &["iscsi_create_auth_group", "2", "-c", "user:disc secret:DiscSecret-1"],
            &["iscsi_set_discovery_auth", "-r", "-g", "2"],
            &["iscsi_create_target_node", "disk1", "Disk1", "Malloc0:0", "1:1", "32", "-r", "-m", "-g", "1"],
            &["iscsi_create_target_node", "disk2", "Disk2", "Malloc1:0", "1:1", "32", "-d"],
            &["iscsi_target_node_set_auth", "disk2", "-g", "1"],
        ] {
            let out = riser.rpc(args);
            assert!(out.status.success(), "riser-rpc {args:?}: {out:?}\n{}", riser.log());
        }
        // Refusals carry the crate's codes, and no secret.
        for (args, code) in [
            (&["iscsi_create_auth_group", "1", "-c", "user:x secret:AliceSecret-1"][..], "(code -17)"),
            (&["iscsi_auth_group_add_secret", "1", "-u", "alice", "-s", "BobSecret-123"], "(code -17)"),
            (&["iscsi_auth_group_add_secret", "9", "-u", "dan", "-s", "BobSecret-123"], "(code -19)"),
            (&["iscsi_auth_group_add_secret", "1", "-u", "dan", "-s", "BobSecret-123", "-m", "m", "-r", "BobSecret-123"], "(code -32602)"),
            (&["iscsi_target_node_set_auth", "disk2", "-m"], "(code -32602)"),
            (&["iscsi_target_node_set_auth", "nope", "-r"], "(code -19)"),
        ] {
            let out = riser.rpc(args);
            assert_eq!(out.code(), Some(1), "{args:?}: {out:?}");
            assert!(out.stderr.contains(code), "{args:?}: {out:?}");
            assert!(SECRETS.iter().all(|s| !out.stderr.contains(s)), "{args:?}: {out:?}");
        }
        groups = riser.rpc_json(&["iscsi_get_auth_groups"]);
        assert_eq!(
            groups,
            json!([
                {"tag": 1, "secrets": [
                    {"user": "alice", "secret": "AliceSecret-1", "muser": "riser", "msecret": "RiserSecret-1"},
                    {"user": "carol", "secret": "CarolSecret-1"}
                ]},
                {"tag": 2, "secrets": [{"user": "disc", "secret": "DiscSecret-1"}]}
            ])
        );
        nodes = riser.rpc_json(&["iscsi_get_target_nodes"]);
        let chap = |n: &Value| (n["disable_chap"].clone(), n["require_chap"].clone(), n["mutual_chap"].clone(), n["chap_group"].clone());
        assert_eq!(chap(&nodes[0]), (json!(false), json!(true), json!(true), json!(1)), "{nodes}");
        assert_eq!(chap(&nodes[1]), (json!(false), json!(false), json!(false), json!(1)), "{nodes}");
        options = riser.rpc_json(&["iscsi_get_options"]);
        assert_eq!((&options["require_chap"], &options["chap_group"]), (&json!(true), &json!(2)), "{options}");

        let out = riser.rpc(&["save_config", "-o", cfg.to_str().unwrap()]);
        assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
        let mode = std::fs::metadata(&cfg).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "save_config -o wrote mode {mode:o}");
        let saved: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
        let iscsi = saved["subsystems"].as_array().and_then(|s| s.iter().find(|s| s["subsystem"] == "iscsi")).cloned();
        let iscsi = iscsi.unwrap_or_else(|| panic!("no iscsi subsystem in {saved}"));
        let methods: Vec<&str> = iscsi["config"].as_array().unwrap().iter().filter_map(|c| c["method"].as_str()).collect();
        let first_node = methods.iter().position(|m| *m == "iscsi_create_target_node").unwrap();
        let auth: Vec<usize> = (0..methods.len()).filter(|&i| methods[i] == "iscsi_create_auth_group").collect();
        assert!(auth.len() == 2 && auth.iter().all(|&i| i < first_node), "auth groups before the nodes: {methods:?}");
        assert_eq!(methods[0], "iscsi_set_options", "discovery auth travels in iscsi_set_options, as in SPDK");

        assert!(riser.terminate(Duration::from_secs(10)).is_some(), "riser ignored SIGTERM");
        // (Without the RPC server's own request handling, jsonrpc-core's trace lines would
        // show every secret here.)
        let log = riser.log();
        for s in SECRETS {
            assert!(!log.contains(s), "{s} in riser's log:\n{log}");
        }
    }

    let riser = Riser::start_with(&["--json", cfg.to_str().unwrap(), "--log-level", "trace"]);
    assert_eq!(riser.rpc_json(&["iscsi_get_auth_groups"]), groups);
    assert_eq!(riser.rpc_json(&["iscsi_get_target_nodes"]), nodes);
    assert_eq!(riser.rpc_json(&["iscsi_get_options"]), options);
    let log = riser.log();
    for s in SECRETS {
        assert!(!log.contains(s), "{s} in riser's log after --json:\n{log}");
    }
}

/// The I/O buffer budget: iobuf_set_options (riser's max_bytes or SPDK's pool fields),
/// iobuf_get_options, iobuf_get_stats, bad values refused, and the budget in save_config
/// and back through --json.
#[test]
fn iobuf_budget_options_stats_and_save_config() {
    let dir = TempDir::new("iobuf");
    let cfg = dir.join("config.json");
    {
        let mut riser = Riser::start();
        let opts = riser.rpc_json(&["iobuf_get_options"]);
        assert_eq!(opts["max_bytes"], json!(48u64 << 20), "the default budget: {opts}");
        // Below the largest transfer (32 MiB): refused with a reason, nothing changes.
        let r = riser.call("iobuf_set_options", Some(json!({"max_bytes": 1 << 20})));
        assert_eq!(rpc_code(&r), -32602, "{r:?}");
        assert!(rpc_message(&r).contains("32 MiB"), "{}", rpc_message(&r));
        let r = riser.call("iobuf_set_options", Some(json!({"max_bytes": 64u64 << 20, "small_pool_count": 1})));
        assert_eq!(rpc_code(&r), -32602, "{r:?}");
        assert_eq!(riser.rpc_json(&["iobuf_get_options"])["max_bytes"], json!(48u64 << 20));
        // SPDK's fields: the budget is what those pools would hold.
        riser
            .call("iobuf_set_options", Some(json!({"small_pool_count": 4096, "small_bufsize": 8192, "large_pool_count": 512, "large_bufsize": 135168})))
            .expect("SPDK's iobuf_set_options");
        assert_eq!(riser.rpc_json(&["iobuf_get_options"])["max_bytes"], json!(4096u64 * 8192 + 512 * 135168));
        assert_eq!(riser.rpc_json(&["iobuf_set_options", "--max-bytes", "100663296"]), json!(true));
        let stats = riser.rpc_json(&["iobuf_get_stats"]);
        assert_eq!(stats["max_bytes"], json!(96u64 << 20), "{stats}");
        for k in ["mapped_bytes", "in_use_bytes", "cached_bytes", "waiting", "waits", "maps", "reuses", "unmaps"] {
            assert!(stats[k].is_u64(), "{k} missing from {stats}");
        }
        let out = riser.rpc(&["save_config"]);
        let saved = out.json();
        let subsystems = saved["subsystems"].as_array().cloned().unwrap_or_default();
        assert_eq!(subsystems.first().map(|s| s["subsystem"].clone()), Some(json!("iobuf")), "iobuf comes first: {saved}");
        assert_eq!(
            subsystems[0]["config"],
            json!([{"method": "iobuf_set_options", "params": {"max_bytes": 96u64 << 20}}]),
            "{saved}"
        );
        std::fs::write(&cfg, &out.stdout).unwrap();
        assert!(riser.terminate(Duration::from_secs(10)).is_some(), "riser ignored SIGTERM");
    }
    let riser = Riser::start_with(&["--json", cfg.to_str().unwrap()]);
    assert_eq!(riser.rpc_json(&["iobuf_get_options"])["max_bytes"], json!(96u64 << 20), "--json restores the budget");
}
