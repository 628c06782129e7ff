#!/usr/bin/env bash
# rxe-vm: needs net
# Linux dm-multipath over two riser gateways on one RBD image, in the VM (issue 23's first
# acceptance test). The host side, test/tests/rbd_multipath.rs, runs the Ceph cluster and the
# two gateways and injects the failures; this script is the initiator: open-iscsi (iscsi_tcp)
# logs in to gateway A (RISER_MP_A, HOST:PORT, reached through qemu's user networking) and
# gateway B (RISER_MP_B), multipath-tools builds one map over both paths (the settings are in
# write_multipath_conf), and for each case of RISER_MP_CASES (default "a b c") a writer with
# verification writes and reads back a region of the map while the host breaks gateway A.
#
# Host and guest talk through files in $RISER_VM_OUT/mp (9p: the guest sees a host's file at
# its next stat):
#   guest: ready                   the map is up, both paths active, A's group (prio 50) in use
#   guest: writing-C               case C's writer has written and verified one pass through A
#   host:  inject-done-C           the failure was injected and repaired (A continued, its link
#                                  up again, or a new A started)
#   guest: done-C.json, pattern-C.bin
#                                  the case's result (below) and the data of the last pass
#   host:  checked-C               the host has checked the image; the next case may start
#
# The writer (python, O_DIRECT on the map) writes a fresh random pattern over the case's region
# (RISER_MP_REGION_MIB MiB at offset index*region) in 256 KiB chunks and reads it all back and
# compares, pass after pass, until a pass that started after inject-done-C ends: that last
# pass's data is what the image must hold (pattern-C.bin). done-C.json: passes, chunks written,
# chunks that read back different (verify_errors), I/O errors, the longest time with no I/O
# completed (max_stall_s: from the failure to I/O resuming through B) and the guest's clock at
# its start, the sectors written through A's and B's disks during the case (from
# /sys/block/sdX/stat), and the priorities multipathd gave B's path, sampled once a pass
# (prio_b, changes only: 10 is active/non-optimized, 50 active/optimized).
#
# Ends with "MULTIPATH OK" (every case ran; the host judges the results) or "MULTIPATH FAILED: why".
set -euo pipefail
name=multipath
. scripts/vm/lib.sh
. scripts/vm/net-up.sh

target=${RISER_MP_TARGET:-iqn.2016-06.io.riser:gw}
portal_a=${RISER_MP_A:?RISER_MP_A=HOST:PORT of gateway A}
portal_b=${RISER_MP_B:?RISER_MP_B=HOST:PORT of gateway B}
cases=${RISER_MP_CASES:-a b c}
region_mib=${RISER_MP_REGION_MIB:-8}
# Seconds to wait for each of the host's signals (a case: the failure plus the repair).
signal_s=${RISER_MP_SIGNAL_S:-300}
mp=$RISER_VM_OUT/mp
mkdir -p "$mp"

write_multipath_conf() {
  # group_by_prio + prio alua: A's path (active/optimized, prio 50) in one group, B's
  # (active/non-optimized, prio 10) in another; the alua hardware handler follows the target
  # port groups' states. failback immediate: back to A as soon as its path is up again.
  # no_path_retry 30 with polling_interval 2: queue for 60 s when no path is left, then fail
  # (a bounded queue: a broken test ends instead of hanging). The short iSCSI timeouts that
  # make a dead path fail fast are set per node (login_node).
  cat >/etc/multipath.conf <<'EOF'
defaults {
    user_friendly_names no
    find_multipaths no
    polling_interval 2
}
blacklist {
    devnode "^(ram|loop|fd|md|dm-|sr|scd|st|nvme|vd)[0-9]*"
}
devices {
    device {
        vendor "RISER"
        product ".*"
        path_grouping_policy group_by_prio
        prio alua
        hardware_handler "1 alua"
        path_checker tur
        path_selector "service-time 0"
        failback immediate
        no_path_retry 30
        fast_io_fail_tmo 5
        dev_loss_tmo 600
    }
}
EOF
}

# node.session.timeo.replacement_timeout 5: commands of a broken session go back to
# dm-multipath 5 s after the connection fails; NOP-Out every 2 s with a 2 s timeout: a gateway
# that stops answering (SIGSTOP, network cut) is noticed within about 4 s.
login_node() {
  local p=$1 kv
  iscsiadm -m node -o new -T "$target" -p "$p" >>"$logs/iscsiadm.log" 2>&1 || fail "cannot add the node $target at $p"
  for kv in node.session.timeo.replacement_timeout=5 node.conn[0].timeo.noop_out_interval=2 \
            node.conn[0].timeo.noop_out_timeout=2 node.conn[0].timeo.login_timeout=5; do
    iscsiadm -m node -T "$target" -p "$p" -o update -n "${kv%%=*}" -v "${kv#*=}" >>"$logs/iscsiadm.log" 2>&1 \
      || fail "cannot set ${kv%%=*} on $p"
  done
  iscsiadm -m node -T "$target" -p "$p" --login >>"$logs/login.log" 2>&1 || fail "login to $target at $p failed: $(tail -n 3 "$logs/login.log")"
}

# The disk (sdX) of LUN 0 of the session to portal $1.
disk_at() {
  local sid
  sid=$(iscsiadm -m session 2>/dev/null | awk -v p="$1" '$3 ~ "^"p"," {gsub(/[][]/, "", $2); print $2}')
  [ -n "$sid" ] || fail "no session to $1: $(iscsiadm -m session 2>&1)"
  disk_of "$sid" 0
}

# Until both paths are "active ready" and A's group is the one in use (after a failback).
wait_paths() {
  local why=$1 t0=$SECONDS ll
  while :; do
    ll=$(multipath -ll "$map" 2>&1 || true)
    if [ "$(grep -c 'active ready running' <<<"$ll")" = 2 ] && has 'prio=50 status=active' <<<"$ll" \
       && has "$disk_a .*active ready running" <<<"$ll"; then
      echo "paths ready $why after $((SECONDS - t0)) s"
      return 0
    fi
    [ $((SECONDS - t0)) -lt 180 ] || fail "the paths did not come back $why within 180 s: $ll"
    sleep 1
  done
}

wait_signal() {
  local f=$mp/$1 t0=$SECONDS
  until [ -e "$f" ]; do
    [ $((SECONDS - t0)) -lt "$signal_s" ] || fail "no $1 from the host within $signal_s s"
    sleep 0.2
  done
}

sectors_written() { awk '{print $7}' "/sys/block/$1/stat"; }

step "network, modules, udev, multipathd, iscsid"
modprobe -a iscsi_tcp sd_mod dm_multipath dm_service_time scsi_dh_alua || fail "cannot load iscsi_tcp, dm_multipath, scsi_dh_alua"
mkdir -p /run/udev
# udev names the map's device and gives multipathd the paths' ids and events.
/lib/systemd/systemd-udevd --daemon >>"$logs/udevd.log" 2>&1 || fail "systemd-udevd did not start"
udevadm trigger --action=add >/dev/null 2>&1 || true
timeout 60 udevadm settle || true
write_multipath_conf
multipathd -d -s >>"$logs/multipathd.log" 2>&1 &
extra_pids="$extra_pids $!"
iscsid_start

step "login to A ($portal_a) and B ($portal_b)"
login_node "$portal_a"
login_node "$portal_b"
disk_a=$(disk_at "$portal_a")
disk_b=$(disk_at "$portal_b")
timeout 60 udevadm settle || true
map=
for _ in $(seq 120); do
  map=$(multipathd show maps raw format "%n" 2>/dev/null | head -n 1 || true)
  [ -n "$map" ] && [ -b "/dev/mapper/$map" ] && break
  map=
  sleep 0.5
done
[ -n "$map" ] || fail "multipathd built no map over $disk_a and $disk_b: $(multipath -ll 2>&1; tail -n 20 "$logs/multipathd.log")"
wait_paths "at start"
multipath -ll "$map"
echo "$map $disk_a $disk_b" >"$mp/ready"
echo "map /dev/mapper/$map: A $portal_a = $disk_a, B $portal_b = $disk_b"

index=0
for c in $cases; do
  step "case $c: waiting for both paths"
  wait_paths "before case $c"
  a0=$(sectors_written "$disk_a"); b0=$(sectors_written "$disk_b")
  step "case $c: writer on /dev/mapper/$map, $region_mib MiB at $((index * region_mib)) MiB"
  python3 - "/dev/mapper/$map" $((index * region_mib << 20)) $((region_mib << 20)) \
      "$mp/writing-$c" "$mp/inject-done-$c" "$mp/pattern-$c.bin" "$mp/writer-$c.json" "$signal_s" "$disk_b" <<'PY' || fail "case $c: the writer failed"
import hashlib, json, mmap, os, subprocess, sys, time
dev, off, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
start_sig, stop_sig, pattern_out, result_out, signal_s, disk_b = sys.argv[4:10]
deadline = time.monotonic() + int(signal_s)
chunk = 256 << 10
fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
# O_DIRECT wants aligned buffers: anonymous mmaps are page-aligned.
wbuf, rbuf = mmap.mmap(-1, chunk), mmap.mmap(-1, chunk)
r = {"prio_b": [], "passes": 0, "chunks": 0, "verify_errors": 0, "io_errors": 0, "max_stall_s": 0.0, "stall_began": None, "errors": []}
last = time.monotonic()
def done_io():
    global last
    now = time.monotonic()
    if now - last > r["max_stall_s"]:
        r["max_stall_s"] = round(now - last, 3)
        r["stall_began"] = time.strftime("%H:%M:%S", time.gmtime(time.time() - (now - last)))
    last = now
def io(f, buf, at):
    try:
        n = f(fd, buf, at)
        if n != chunk:
            raise OSError(0, "short transfer %d" % n)
        done_io()
        return True
    except OSError as e:
        r["io_errors"] += 1
        if len(r["errors"]) < 5:
            r["errors"].append("%s at %d: %s" % (f.__name__, at, e))
        done_io()
        return False
def sample_prio_b():
    # B's path priority as multipathd has it (prio alua: 50 active/optimized, 10
    # active/non-optimized, 1 standby, 0 unavailable): whether B's port group took over.
    try:
        out = subprocess.run(["multipathd", "show", "paths", "raw", "format", "%d %p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return
    for line in out.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == disk_b and (not r["prio_b"] or r["prio_b"][-1] != f[1]):
            r["prio_b"].append(f[1])
while True:
    sample_prio_b()
    final = os.path.exists(stop_sig)
    pattern = os.urandom(length)
    for i in range(0, length, chunk):
        wbuf[:] = pattern[i:i + chunk]
        io(os.pwrite, wbuf, off + i)
        r["chunks"] += 1
    for i in range(0, length, chunk):
        if io(os.preadv, [rbuf], off + i) and rbuf[:] != pattern[i:i + chunk]:
            r["verify_errors"] += 1
            if len(r["errors"]) < 5:
                r["errors"].append("pass %d: chunk at %d reads back different" % (r["passes"], off + i))
    r["passes"] += 1
    if r["passes"] == 1:
        open(start_sig, "w").write("%.3f\n" % time.time())
    if final:
        break
    if time.monotonic() > deadline:
        sys.exit("writer: no %s from the host within %s s" % (os.path.basename(stop_sig), signal_s))
# The last pass started after the host's repair: its data is what the image must hold.
with open(pattern_out, "wb") as f:
    f.write(pattern)
r["sha256"] = hashlib.sha256(pattern).hexdigest()
r["offset"], r["length"] = off, length
json.dump(r, open(result_out, "w"))
print("writer: %(passes)d passes, %(chunks)d chunks written, %(verify_errors)d verify errors, %(io_errors)d I/O errors, longest stall %(max_stall_s).1f s (from %(stall_began)s)" % r)
PY
  a1=$(sectors_written "$disk_a"); b1=$(sectors_written "$disk_b")
  python3 - "$mp/writer-$c.json" "$mp/done-$c.json" "$((a1 - a0))" "$((b1 - b0))" "$c" <<'PY' || fail "case $c: cannot write the result"
import json, sys
r = json.load(open(sys.argv[1]))
r["sectors_written_a"], r["sectors_written_b"], r["case"] = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
json.dump(r, open(sys.argv[2] + ".tmp", "w"))
PY
  mv "$mp/done-$c.json.tmp" "$mp/done-$c.json"
  echo "case $c: sectors written through A $((a1 - a0)), through B $((b1 - b0))"
  multipath -ll "$map" || true
  step "case $c: waiting for the host's checks"
  wait_signal "checked-$c"
  index=$((index + 1))
done
echo "MULTIPATH OK"
