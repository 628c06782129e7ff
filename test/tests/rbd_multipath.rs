//! Linux dm-multipath over two riser gateways on one RBD image (issue 23's first acceptance
//! test): the Linux initiator in the VM (open-iscsi over TCP, multipath-tools with the alua
//! hardware handler and grouping by priority) writes and verifies while gateway A is
//! (a) SIGKILLed, (b) SIGSTOPped for longer than its lease and then continued, (c) cut off
//! from the network and then restored. In each case I/O must go on through gateway B with no
//! verify error, and the image read back with `rbd export` must hold what the initiator wrote
//! last. In (b) and (c) A must write nothing after it was fenced: `ceph osd blocklist ls`
//! gains A's address, A's log says it was fenced, and a marker write sent to A after the cut
//! (over a side portal that stays reachable) never reaches the image.
//!
//! Layout (Ceph runs on the host, not in the TCG guest, which would make it 10-50x slower):
//!
//! ```text
//!  root namespace                                   namespace riser-gwA
//!  Ceph (mon, osd, mgr) on 10.99.0.1                gateway A: portal 10.99.0.2:PA
//!  gateway B: portal 10.99.0.1:PB       veth rgwa0 ====== rgwa1  (A's only way to Ceph)
//!  this test (side client)  10.99.1.1   veth rgws0 ====== rgws1  10.99.1.2:PA, side portal
//!  qemu (slirp) <- the guest: its TCP connections to 10.99.0.x leave as sockets of this
//!                  namespace, so the guest reaches B directly and A through rgwa0.
//! ```
//!
//! The namespace has no route to 10.99.0.1 but through rgwa (no default route): taking rgwa1
//! down cuts A off from Ceph and from the initiator, while the side portal stays reachable from
//! here. The guest side is scripts/vm/multipath.sh (the multipath settings are there); the two
//! talk through files in the VM's shared directory.
//!
//! Before the gateways fenced each other (issue 23, items 1-2), case (a) passed and the
//! fencing checks of (b) and (c) failed, each with its own message (in (b) sometimes also a
//! verify error: A, continued unfenced, executed a write it received before SIGSTOP over
//! newer data written through B). A fenced gateway must fail I/O the way multipath retries
//! elsewhere (NOT READY 04h/0Ch, not HARDWARE ERROR: see the message of that check).
//!
//! Takes about 3.5 minutes (VM boot and setup about 1, each case about 40 s).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use riser_tests::ceph::CephCluster;
use riser_tests::iscsi::Client;
use riser_tests::vm::{vm_spawn, VmChild, VmLock};
use riser_tests::{free_port, json, Riser, Value};

const NS: &str = "riser-gwA";
const TARGET: &str = "iqn.2016-06.io.riser:gw";
const UUID: &str = "6c0b7a1e-15a2-4a10-9a5e-0000000a1a23";
const CEPH_ADDR: &str = "10.99.0.1";
const A_ADDR: &str = "10.99.0.2";
const A_SIDE: &str = "10.99.1.2";
const IMAGE: &str = "mp";
const IMAGE_MIB: u64 = 32;
/// Each case's writer works on its own region (case index * REGION_MIB).
const REGION_MIB: u64 = 8;
/// The lease passed to bdev_rbd_create when it takes one (`lease_s`).
const LEASE_S: u64 = 10;
/// How long A stays stopped or cut off: longer than its lease, then until B has fenced it
/// (a new blocklist entry for A), at most three leases.
const OUTAGE_MIN: Duration = Duration::from_secs(LEASE_S + 2);
const OUTAGE_MAX: Duration = Duration::from_secs(3 * LEASE_S);
/// How long to wait for each file the guest writes (the VM's boot and setup included).
const GUEST_WAIT: Duration = Duration::from_secs(420);

fn run(args: &[&str]) -> Result<String, String> {
    let o = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{args:?}: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!("{args:?} failed ({}): {}{}", o.status, String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    }
}

/// `args` run inside A's namespace.
fn ns<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["ip", "netns", "exec", NS];
    v.extend_from_slice(args);
    v
}

/// The namespace of gateway A and its two veth pairs; removed on drop (also while a test
/// unwinds), with whatever a killed run left behind removed before.
struct Net;

impl Net {
    fn up() -> Net {
        Net::remove();
        let net = Net;
        let steps: Vec<Vec<&str>> = vec![
            vec!["ip", "netns", "add", NS],
            vec!["ip", "link", "add", "rgwa0", "type", "veth", "peer", "name", "rgwa1"],
            vec!["ip", "link", "add", "rgws0", "type", "veth", "peer", "name", "rgws1"],
            vec!["ip", "link", "set", "rgwa1", "netns", NS],
            vec!["ip", "link", "set", "rgws1", "netns", NS],
            vec!["ip", "addr", "add", "10.99.0.1/24", "dev", "rgwa0"],
            vec!["ip", "addr", "add", "10.99.1.1/24", "dev", "rgws0"],
            vec!["ip", "link", "set", "rgwa0", "up"],
            vec!["ip", "link", "set", "rgws0", "up"],
            ns(&["ip", "addr", "add", "10.99.0.2/24", "dev", "rgwa1"]),
            ns(&["ip", "addr", "add", "10.99.1.2/24", "dev", "rgws1"]),
            ns(&["ip", "link", "set", "lo", "up"]),
            ns(&["ip", "link", "set", "rgwa1", "up"]),
            ns(&["ip", "link", "set", "rgws1", "up"]),
        ];
        for s in steps {
            run(&s).unwrap_or_else(|e| panic!("network namespace setup: {e}"));
        }
        // The cluster's script checks that it can bind to CEPH_ADDR: see that it can first
        // (with the host's addresses in the message when it never can).
        let t = Instant::now();
        while let Err(e) = std::net::TcpListener::bind((CEPH_ADDR, 0)) {
            if t.elapsed() > Duration::from_secs(5) {
                panic!("cannot bind to {CEPH_ADDR} 5 s after it was added to rgwa0 ({e}):\n{}", run(&["ip", "-4", "addr", "show"]).unwrap_or_else(|e| e));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        net
    }

    /// A's link to Ceph and to the initiator (the side link stays).
    fn set_link(&self, up: bool) {
        run(&ns(&["ip", "link", "set", "rgwa1", if up { "up" } else { "down" }])).unwrap_or_else(|e| panic!("{e}"));
    }

    fn remove() {
        // Deleting the namespace deletes its ends of the veth pairs, and with them the pairs.
        let _ = run(&["ip", "netns", "del", NS]);
        for l in ["rgwa0", "rgws0"] {
            let _ = run(&["ip", "link", "del", l]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        Net::remove();
    }
}

/// The VM's shared directory (the guest's logs in logs-multipath/, the console in vm.log, the
/// case files in mp/): removed after a passing run, kept after a failing one.
struct OutDir(PathBuf);

impl OutDir {
    fn new() -> OutDir {
        let p = std::env::temp_dir().join(format!("riser-mp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
        OutDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("rbd_multipath: the VM's files are kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Starts a gateway (in A's namespace when `in_ns`) exporting rbd/IMAGE as LUN 0 of TARGET
/// through portal group `tag` on `portals`, with the ALUA description (group 1, A's, preferred
/// and active/optimized; group 2, B's, active/non-optimized). Returns it and whether
/// bdev_rbd_create took the lease (`lease_s`).
fn gateway(ceph: &CephCluster, in_ns: bool, tag: u32, portals: &[(&str, u16)]) -> (Riser, bool) {
    let prefix: &[&str] = if in_ns { &["ip", "netns", "exec", NS] } else { &[] };
    let riser = Riser::start_in(prefix, &[]);
    let call = |m: &str, p: Value| riser.call(m, Some(p)).unwrap_or_else(|e| panic!("{m}: {e}\nriser log:\n{}", riser.log()));
    let conf = ceph.conf().to_str().expect("utf-8 path");
    let keyring = ceph.keyring().to_str().expect("utf-8 path");
    call("bdev_rbd_register_cluster", json!({"name": "c0", "config_file": conf, "key_file": keyring, "user_id": "admin"}));
    let mut create = json!({"name": "Rbd0", "pool_name": "rbd", "rbd_name": IMAGE, "block_size": 512, "cluster_name": "c0", "uuid": UUID});
    create["lease_s"] = json!(LEASE_S);
    let leased = match riser.call("bdev_rbd_create", Some(create.clone())) {
        Ok(_) => true,
        Err(e) if e.to_string().contains("lease_s") => {
            create.as_object_mut().expect("object").remove("lease_s");
            call("bdev_rbd_create", create);
            false
        }
        Err(e) => panic!("bdev_rbd_create: {e}\nriser log:\n{}", riser.log()),
    };
    let portals: Vec<Value> = portals.iter().map(|(h, p)| json!({"host": h, "port": p.to_string()})).collect();
    call("iscsi_create_portal_group", json!({"tag": tag, "portals": portals}));
    call("iscsi_create_initiator_group", json!({"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}));
    call(
        "iscsi_create_target_node",
        json!({"name": TARGET, "alias_name": "gw", "pg_ig_maps": [{"pg_tag": tag, "ig_tag": 1}],
               "luns": [{"bdev_name": "Rbd0", "lun_id": 0}], "queue_depth": 64}),
    );
    call(
        "iscsi_target_node_set_alua",
        json!({"name": TARGET, "groups": [{"tpg_id": 1, "state": "active_optimized", "pref": true},
                                          {"tpg_id": 2, "state": "active_non_optimized"}]}),
    );
    for (h, p) in portals.iter().map(|p| (p["host"].as_str().unwrap_or_default().to_string(), p["port"].as_str().unwrap_or_default().to_string())) {
        let addr = format!("{h}:{p}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "gateway {tag} does not listen on {addr}:\n{}", riser.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (riser, leased)
}

fn start_a(ceph: &CephCluster, port: u16) -> Riser {
    gateway(ceph, true, 1, &[(A_ADDR, port), (A_SIDE, port)]).0
}

fn signal(riser: &Riser, sig: libc::c_int) {
    let pid = riser.pid().and_then(|p| libc::pid_t::try_from(p).ok()).expect("gateway A's pid");
    // SAFETY: kill(2) of a child this test spawned and has not reaped; no memory is involved.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
}

/// Waits for the guest's file `name`; panics with the VM's output when it does not come.
fn wait_guest(vm: &mut VmChild, dir: &Path, name: &str, gws: &[&Riser]) -> PathBuf {
    let path = dir.join(name);
    let deadline = Instant::now() + GUEST_WAIT;
    while !path.exists() {
        let alive = vm.running();
        if !alive || Instant::now() > deadline {
            let logs: Vec<String> = gws.iter().map(|g| tail(&g.log(), 40)).collect();
            panic!(
                "the guest wrote no {name} ({}):\n{}\ngateway logs:\n{}",
                if alive { "timed out" } else { "the VM ended" },
                tail(&vm.output(), 150),
                logs.join("\n-----\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    path
}

fn signal_guest(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), b"").unwrap_or_else(|e| panic!("cannot write {name}: {e}"));
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The whole image, through `rbd export`.
fn export(ceph: &CephCluster, dir: &Path) -> Vec<u8> {
    let f = dir.join("export.img");
    let _ = std::fs::remove_file(&f);
    ceph.rbd_ok(&["export", "--no-progress", &format!("rbd/{IMAGE}"), f.to_str().expect("utf-8 path")]);
    std::fs::read(&f).unwrap_or_else(|e| panic!("cannot read {}: {e}", f.display()))
}

/// The entries of `ceph osd blocklist ls`.
fn blocklist(ceph: &CephCluster) -> Vec<String> {
    let c = ceph.conf().to_str().expect("utf-8 path");
    run(&["ceph", "-c", c, "osd", "blocklist", "ls"])
        .unwrap_or_else(|e| panic!("{e}"))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// A's new entries in `ceph osd blocklist ls` (A's RADOS clients are 10.99.0.2:0/nonce).
fn new_a_entries(listed: &[String], before: &[String]) -> Vec<String> {
    listed.iter().filter(|l| !before.contains(l) && l.starts_with(&format!("{A_ADDR}:"))).cloned().collect()
}

/// Waits out A's outage from `since`: at least OUTAGE_MIN, then until the blocklist gains an
/// entry for A (B fenced it), at most OUTAGE_MAX. Prints when the entry showed up.
fn outage(ceph: &CephCluster, before: &[String], since: Instant) {
    std::thread::sleep(OUTAGE_MIN.saturating_sub(since.elapsed()));
    while since.elapsed() < OUTAGE_MAX {
        if !new_a_entries(&blocklist(ceph), before).is_empty() {
            eprintln!("rbd_multipath: A blocklisted {:.1?} after the failure", since.elapsed());
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A session to gateway A through its side portal (reachable while A is cut off).
fn side_session(port: u16, a: &Riser) -> Client {
    let sock = std::net::TcpStream::connect((A_SIDE, port)).unwrap_or_else(|e| panic!("connect to A's side portal: {e}"));
    let mut c = Client::over(sock);
    c.login(TARGET, &[]).unwrap_or_else(|e| panic!("login to A's side portal: {e:?}\n{}", tail(&a.log(), 40)));
    // The new I_T nexus's unit attention would otherwise answer the marker write instead.
    assert!(c.clear_unit_attentions(), "A's side session did not become ready:\n{}", tail(&a.log(), 40));
    c
}

/// 4 KiB that cannot be mistaken for the writers' random data.
fn marker(case: &str) -> Vec<u8> {
    format!("RISER-FENCE-MARKER-{case}-").into_bytes().into_iter().cycle().take(4096).collect()
}

/// Sends WRITE(10) of `data` at byte offset `at`, without waiting.
fn send_write(c: &mut Client, at: u64, data: &[u8]) {
    let lba = u32::try_from(at / 512).expect("LBA");
    let blocks = u16::try_from(data.len() / 512).expect("blocks");
    let mut cdb = vec![0x2A, 0];
    cdb.extend_from_slice(&lba.to_be_bytes());
    cdb.push(0);
    cdb.extend_from_slice(&blocks.to_be_bytes());
    cdb.push(0);
    let pdu = c.scsi_command(&cdb, false, true, data.len() as u32, data.to_vec());
    c.send(&pdu).unwrap_or_else(|e| panic!("send the marker write: {e}"));
}

/// What the marker write got back, for the messages.
fn marker_reply(c: &mut Client) -> String {
    match c.reply() {
        Some(r) if r.status == 0 => "GOOD".into(),
        Some(r) => format!("status {:#x}, sense {:?}", r.status, r.sense()),
        None => "no reply (connection closed or 10 s passed)".into(),
    }
}

#[test]
fn dm_multipath_over_two_gateways() {
    // One VM at a time, and one run of this test: the namespace and addresses are fixed.
    let _vm_lock = VmLock::take();
    let t0 = Instant::now();
    let net = Net::up();
    let ceph = CephCluster::start_on("mp", CEPH_ADDR);
    ceph.rbd_ok(&["create", "--image-feature", "layering", "--size", &format!("{IMAGE_MIB}M"), &format!("rbd/{IMAGE}")]);
    let (pa, pb) = (free_port(), free_port());
    let (b, leased) = gateway(&ceph, false, 2, &[(CEPH_ADDR, pb)]);
    let mut a = start_a(&ceph, pa);
    if !leased {
        eprintln!("rbd_multipath: bdev_rbd_create takes no lease_s: the gateways do not fence each other (issue 23 item 1 not built)");
    }
    eprintln!("rbd_multipath: cluster and gateways up in {:.0?}", t0.elapsed());

    let out = OutDir::new();
    let mp = out.path().join("mp");
    let env = [
        ("RISER_VM_OUT", out.path().to_str().expect("utf-8 path").to_string()),
        ("RISER_MP_A", format!("{A_ADDR}:{pa}")),
        ("RISER_MP_B", format!("{CEPH_ADDR}:{pb}")),
        ("RISER_MP_TARGET", TARGET.to_string()),
        ("RISER_MP_REGION_MIB", REGION_MIB.to_string()),
        ("RISER_VM_TIMEOUT", "1500".to_string()),
    ];
    let mut vm = vm_spawn("scripts/vm/multipath.sh", 2, &[], &env, &out.path().join("vm.log"));
    wait_guest(&mut vm, &mp, "ready", &[&a, &b]);
    eprintln!("rbd_multipath: map up in the guest after {:.0?}", t0.elapsed());

    let mut failures: Vec<String> = Vec::new();
    let cases = [("a", "SIGKILL", 28u64 << 20), ("b", "SIGSTOP", 28 << 20), ("c", "network cut", 30 << 20)];
    for (i, (case, what, marker_at)) in cases.into_iter().enumerate() {
        let mut fail = |m: String| failures.push(format!("case ({case}) {what}: {m}"));
        wait_guest(&mut vm, &mp, &format!("writing-{case}"), &[&a, &b]);
        let listed_before = blocklist(&ceph);
        let log_before = a.log().len();
        let mut marker_sent = None;
        eprintln!("rbd_multipath: case ({case}): {what} of gateway A");
        match case {
            "a" => {
                a.kill();
                std::thread::sleep(Duration::from_secs(15));
            }
            "b" => {
                let mut side = side_session(pa, &a);
                signal(&a, libc::SIGSTOP);
                outage(&ceph, &listed_before, Instant::now());
                // Sent while A is stopped: A reads it the moment it runs again, fenced.
                send_write(&mut side, marker_at, &marker(case));
                signal(&a, libc::SIGCONT);
                marker_sent = Some(marker_reply(&mut side));
            }
            _ => {
                let cut = Instant::now();
                net.set_link(false);
                std::thread::sleep(Duration::from_secs(2));
                // A cannot reach Ceph: the write waits in A's RADOS client for the link.
                let mut side = side_session(pa, &a);
                send_write(&mut side, marker_at, &marker(case));
                marker_sent = Some(marker_reply(&mut side));
                outage(&ceph, &listed_before, cut);
                net.set_link(true);
                std::thread::sleep(Duration::from_secs(5));
            }
        }
        signal_guest(&mp, &format!("inject-done-{case}"));
        let done = wait_guest(&mut vm, &mp, &format!("done-{case}.json"), &[&a, &b]);
        let r: Value = serde_json::from_slice(&std::fs::read(&done).expect("done json")).expect("the guest's result is JSON");
        eprintln!(
            "rbd_multipath: case ({case}) {what}: I/O resumed after {} s (longest stall, from {} guest time); {} passes, sectors written through A {} and B {}; verify errors {}, I/O errors {}",
            r["max_stall_s"], r["stall_began"], r["passes"], r["sectors_written_a"], r["sectors_written_b"], r["verify_errors"], r["io_errors"]
        );
        eprintln!("rbd_multipath: case ({case}): B's path priority (prio alua) during the case: {}", r["prio_b"]);
        if r["verify_errors"] != 0 || r["io_errors"] != 0 {
            let mut hints = Vec::new();
            if case != "a" && r["verify_errors"] != 0 {
                hints.push("verify errors: a write A still held, applied after newer data written through B: was A fenced?");
            }
            if r["io_errors"] != 0 {
                // Seen with A blocklisted by hand: its rbd I/O failed with HARDWARE ERROR /
                // LOGICAL UNIT COMMUNICATION FAILURE, which Linux passes up as a target error
                // (ENODATA), never retried on another path.
                hints.push(
                    "I/O errors: dm-multipath retries on another path only after a transport failure or a path-type sense \
                     (ALUA: NOT READY 04/0A transitioning, 04/0B standby, 04/0C unavailable); a fenced gateway must fail \
                     its I/O that way or drop the session, not with HARDWARE ERROR or MEDIUM ERROR",
                );
            }
            fail(format!(
                "the initiator saw {} verify errors and {} I/O errors: {} ({})",
                r["verify_errors"],
                r["io_errors"],
                r["errors"],
                hints.join("; ")
            ));
        }
        if r["sectors_written_b"].as_u64().unwrap_or(0) == 0 {
            fail("no I/O went through gateway B".into());
        }

        // The image holds the writer's last pass.
        let pattern = std::fs::read(mp.join(format!("pattern-{case}.bin"))).expect("the guest's last pattern");
        let off = ((i as u64 * REGION_MIB) << 20) as usize;
        let mut image = export(&ceph, out.path());
        let region = &image[off..off + pattern.len()];
        if let Some(at) = region.iter().zip(&pattern).position(|(x, y)| x != y) {
            fail(format!("rbd export differs from what the initiator wrote last, first at byte {} of the image", off + at));
        }

        if case != "a" {
            // Nothing A sent after it was fenced reaches the image: give a write still queued in
            // A's RADOS client time to be resent and land (it must not).
            let m = marker(case);
            let at = marker_at as usize;
            for _ in 0..5 {
                if image[at..at + m.len()] == m[..] {
                    break;
                }
                std::thread::sleep(Duration::from_secs(4));
                image = export(&ceph, out.path());
            }
            if image[at..at + m.len()] == m[..] {
                fail(format!(
                    "the marker write sent to A after it was {} reached the image (A answered it: {})",
                    if case == "b" { "stopped past its lease" } else { "cut off" },
                    marker_sent.as_deref().unwrap_or("-")
                ));
            }
            let listed = blocklist(&ceph);
            let new = new_a_entries(&listed, &listed_before);
            if new.is_empty() {
                fail(format!("`ceph osd blocklist ls` gained no entry for A ({A_ADDR}:...): it lists {listed:?}"));
            } else {
                eprintln!("rbd_multipath: case ({case}): blocklisted {new:?}");
            }
            eprintln!("rbd_multipath: case ({case}): the marker write through A was answered {}", marker_sent.as_deref().unwrap_or("-"));
            let log = a.log();
            let new_log = log.get(log_before..).unwrap_or_default();
            if !new_log.to_lowercase().contains("fenced") {
                fail(format!("gateway A's log does not say it was fenced; its last lines:\n{}", tail(&log, 15)));
            }
        }

        // A fresh gateway A for the next case (the guest waits for its path and the failback).
        a.kill();
        a = start_a(&ceph, pa);
        signal_guest(&mp, &format!("checked-{case}"));
    }

    let run = vm.wait();
    assert!(
        run.success && run.has_line("MULTIPATH OK"),
        "scripts/vm/multipath.sh failed ({}):\n{}\nfailures before:\n{}",
        run.status,
        tail(&run.text, 150),
        failures.join("\n")
    );
    eprintln!("rbd_multipath: done in {:.0?}", t0.elapsed());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\n----- gateway A (the last one):\n{}\n----- gateway B:\n{}",
        failures.len(),
        failures.join("\n"),
        tail(&a.log(), 40),
        tail(&b.log(), 60)
    );
}
