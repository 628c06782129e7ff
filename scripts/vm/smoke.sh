#!/usr/bin/env bash
# Smoke test of the VM harness, run inside the VM: scripts/rxe-vm.sh run scripts/vm/smoke.sh
#
# Proves each layer the iSER tests will stand on: soft-RoCE (rxe0 ACTIVE, rping over rdma_cm),
# the host-built riser binaries running in the guest, and the Linux kernel initiator logging in
# to riser over iSCSI/TCP and moving verified data through a /dev/sdX, then sg_persist's
# REGISTER AND MOVE and SPEC_I_PT on it (scripts/vm/pr-move.sh). iSER itself comes later.
# Prints "SMOKE OK" last on success; any failure prints "SMOKE FAILED: why" and the logs.
set -euo pipefail

echo "--- smoke [$(cut -d' ' -f1 /proc/uptime)s]: rxe up"
. scripts/vm/rxe-up.sh

bin=${RISER_BIN_DIR:-target/debug}
iqn=iqn.2016-06.io.riser:disk1
portal=127.0.0.1:3260
sock=/tmp/r.sock
logs=/tmp/smoke
mkdir -p "$logs"

# Each step is stamped with the guest's uptime: under TCG, where the time goes matters.
step() { echo "--- smoke [$(cut -d' ' -f1 /proc/uptime)s]: $*"; }
fail() {
  echo "SMOKE FAILED: $*"
  local f
  for f in "$logs"/*.log; do
    [ -s "$f" ] && { echo "----- $f"; tail -n 40 "$f"; }
  done
  echo "----- dmesg (last 30 lines)"
  dmesg | tail -n 30
  exit 1
}

# Background processes to stop on the way out, however it ends.
riser_pid='' iscsid_pid='' rping_pid=''
cleanup() {
  local p
  # kill and reap quietly: bash would print "Terminated" for each.
  for p in $rping_pid $iscsid_pid $riser_pid; do { kill "$p" && wait "$p"; } 2>/dev/null || true; done
}
trap cleanup EXIT

step "rxe0"
ibv_devinfo -d "$RXE_DEV" | grep -E 'hca_id|transport|state|link_layer'

step "rping over rdma_cm to $RXE_IP"
# The server handles one connection and exits; the client retries until it is listening.
timeout 60 rping -s -a "$RXE_IP" -C 3 -v >"$logs/rping-server.log" 2>&1 &
rping_pid=$!
ok=0
for _ in $(seq 20); do
  if timeout 30 rping -c -a "$RXE_IP" -C 3 -v >"$logs/rping-client.log" 2>&1; then ok=1; break; fi
  sleep 0.5
done
[ $ok = 1 ] || fail "rping client failed"
wait "$rping_pid" || fail "rping server failed"
rping_pid=
pings=$(grep -c 'ping data: rdma-ping-' "$logs/rping-client.log" || true)
[ "$pings" = 3 ] || fail "rping client showed $pings pings, not 3"
grep 'ping data' "$logs/rping-client.log"

step "riser (host-built $bin/riser) in the guest"
[ -x "$bin/riser" ] && [ -x "$bin/riser-rpc" ] || fail "$bin/riser or riser-rpc missing: cargo build -p riser -p riser-rpc-cli on the host"
"$bin/riser" --poll-mode adaptive -r "$sock" --default-config >"$logs/riser.log" 2>&1 &
riser_pid=$!
ok=0
for _ in $(seq 150); do   # 30 s: everything is 10-50x slower under TCG
  if "$bin/riser-rpc" -s "$sock" spdk_get_version >"$logs/version.log" 2>&1; then ok=1; break; fi
  kill -0 "$riser_pid" 2>/dev/null || fail "riser exited at start"
  sleep 0.2
done
[ $ok = 1 ] || fail "riser did not answer spdk_get_version within 30 s"
cat "$logs/version.log"

step "Linux iSCSI initiator over TCP: discovery"
mkdir -p /run/lock/iscsi /var/lib/iscsi /etc/iscsi
echo "InitiatorName=iqn.2016-06.io.riser:vm-smoke" >/etc/iscsi/initiatorname.iscsi
# Its own session: on SIGTERM iscsid signals its whole process group, which would be us.
setsid iscsid -f >"$logs/iscsid.log" 2>&1 &
iscsid_pid=$!
# Wait for iscsid's control socket (abstract, so it shows in /proc/net/unix): an iscsiadm
# that finds no iscsid tries to start one through systemd, which the guest does not have.
for _ in $(seq 100); do
  grep -q '@ISCSIADM_ABSTRACT_NAMESPACE' /proc/net/unix && break
  kill -0 "$iscsid_pid" 2>/dev/null || fail "iscsid exited at start"
  sleep 0.2
done
grep -q '@ISCSIADM_ABSTRACT_NAMESPACE' /proc/net/unix || fail "iscsid is not listening after 20 s"
iscsiadm -m discovery -t st -p "$portal" >"$logs/discovery.log" 2>&1 || fail "iscsiadm discovery failed"
cat "$logs/discovery.log"
grep -q "^$portal,1 $iqn\$" "$logs/discovery.log" || fail "discovery did not find $iqn at $portal"

step "login"
iscsiadm -m node -T "$iqn" -p "$portal" --login >"$logs/login.log" 2>&1 || fail "login failed"
cat "$logs/login.log"
disk=
for _ in $(seq 100); do   # the SCSI scan runs after the login returns
  disk=$(iscsiadm -m session -P 3 2>/dev/null | awk '/Attached scsi disk/ && !n++ {print $4}' || true)
  [ -n "$disk" ] && [ -b "/dev/$disk" ] && break
  sleep 0.2
done
[ -n "$disk" ] && [ -b "/dev/$disk" ] || fail "no SCSI disk appeared after login"
size=$(blockdev --getsize64 "/dev/$disk")
echo "/dev/$disk: $size bytes, vendor $(cat "/sys/block/$disk/device/vendor")"
[ "$size" = $((64 << 20)) ] || fail "/dev/$disk has $size bytes, not the default config's 64 MiB"

step "write 4 MiB of random data (O_DIRECT), read back (O_DIRECT), compare"
dd if=/dev/urandom of=/tmp/pattern bs=1M count=4 status=none
dd if=/tmp/pattern of="/dev/$disk" bs=1M oflag=direct status=none || fail "write to /dev/$disk failed"
dd if="/dev/$disk" of=/tmp/readback bs=1M count=4 iflag=direct status=none || fail "read from /dev/$disk failed"
cmp /tmp/pattern /tmp/readback || fail "data read back differs from data written"
echo "4 MiB verified"

# Persistent reservations through sg_persist: REGISTER AND MOVE, SPEC_I_PT (issue 23).
. scripts/vm/pr-move.sh

step "logout"
iscsiadm -m node -T "$iqn" -p "$portal" --logout >"$logs/logout.log" 2>&1 || fail "logout failed"
cat "$logs/logout.log"
conns=$("$bin/riser-rpc" -s "$sock" iscsi_get_connections | tr -d ' \n') || fail "iscsi_get_connections failed"
[ "$conns" = "[]" ] || fail "riser still has connections after logout: $conns"

step "stop riser"
kill "$riser_pid"
rc=0
wait "$riser_pid" || rc=$?
riser_pid=
[ $rc = 0 ] || fail "riser exited with status $rc on SIGTERM"

trap - EXIT
cleanup
step "done"
echo "SMOKE OK"
