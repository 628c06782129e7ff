#!/usr/bin/env bash
# iSER end to end, inside the VM: scripts/rxe-vm.sh run scripts/vm/iser.sh [RXE_KO]
#
# riser serves a malloc LUN on a portal group with an iSER portal and a TCP portal on the
# soft-RoCE address; the Linux initiator discovers over TCP, logs in with iface transport
# iser, writes random data with O_DIRECT, reads it back, compares; then the same in the
# largest commands the initiator allows (ib_iser's max_sectors and the disk's max_sectors_kb
# raised; the block layer's counters show the command size): 2044 KiB over stock soft-RoCE.
# Then the 8 MiB commands real RNICs carry: riser stopped, the stock rdma_rxe swapped for
# RXE_KO (scripts/vm/build-rxe.sh builds it on the host: the same rxe with 4096 fast-reg pages
# instead of 512, a test-environment change; default
# /var/cache/riser-vm/rdma_rxe-fr4096-$(uname -r).ko, or $RISER_RXE_KO), riser started again,
# a new iSER login, 8 MiB READs and WRITEs of a known pattern verified, each one command.
# Logs out; riser has no connections left. Prints "ISER OK" last on success, "ISER FAILED: why" otherwise.
set -euo pipefail
. scripts/vm/rxe-up.sh

bin=${RISER_BIN_DIR:-target/debug}
iqn=iqn.2016-06.io.riser:iser
sock=/tmp/r.sock
logs=/tmp/iser
size_mib=${ISER_TEST_MIB:-16}
rxe_ko=${1:-${RISER_RXE_KO:-/var/cache/riser-vm/rdma_rxe-fr4096-$(uname -r).ko}}
mkdir -p "$logs"
step() { echo "--- iser [$(cut -d' ' -f1 /proc/uptime)s]: $*"; }
fail() {
  echo "ISER FAILED: $*"
  local f
  for f in "$logs"/*.log; do [ -s "$f" ] && { echo "----- $f"; tail -n 60 "$f"; }; done
  echo "----- dmesg (last 40 lines)"; dmesg | tail -n 40
  exit 1
}
riser_pid='' iscsid_pid=''
cleanup() { local p; for p in $iscsid_pid $riser_pid; do { kill "$p" && wait "$p"; } 2>/dev/null || true; done; }
trap cleanup EXIT

# Checked first: the 8 MiB part cannot run without it, and a missing module is a failure.
[ -f "$rxe_ko" ] || fail "no $rxe_ko: build it on the host with scripts/vm/build-rxe.sh (soft-RoCE with 4096 fast-reg pages for the 8 MiB commands)"

cat > /tmp/iser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":131072,"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"3260","iser":true},{"host":"$RXE_IP","port":"3260"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"iser","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0}],"queue_depth":32}}]}]}
JSON
start_riser() {
  step "riser with an iSER and a TCP portal on $RXE_IP"
  # The first riser's log is kept beside the second's.
  [ -f "$logs/riser.log" ] && mv "$logs/riser.log" "$logs/riser-stock-rxe.log"
  RISER_LOG=debug "$bin/riser" --poll-mode adaptive -r "$sock" --json /tmp/iser.json >"$logs/riser.log" 2>&1 &
  riser_pid=$!
  for _ in $(seq 150); do
    "$bin/riser-rpc" -s "$sock" spdk_get_version >/dev/null 2>&1 && break
    kill -0 "$riser_pid" 2>/dev/null || fail "riser exited at start"
    sleep 0.2
  done
  grep -q "iSER portal $RXE_IP:3260 (portal group 1): listening" "$logs/riser.log" || { sleep 1; grep -q "iSER portal" "$logs/riser.log" || fail "no iSER listener"; }
}
stop_riser() {
  kill "$riser_pid"; local rc=0; wait "$riser_pid" || rc=$?; riser_pid=
  [ $rc = 0 ] || fail "riser exited with $rc on SIGTERM"
}

# Login over iSER; sets $disk.
login() {
  step "login over iSER"
  iscsiadm -m node -T "$iqn" -p "$RXE_IP" --login >"$logs/login.log" 2>&1 || fail "iSER login failed"
  cat "$logs/login.log"
  disk=
  for _ in $(seq 150); do
    disk=$(iscsiadm -m session -P 3 2>/dev/null | awk '/Attached scsi disk/ && !n++ {print $4}' || true)
    [ -n "$disk" ] && [ -b "/dev/$disk" ] && break
    sleep 0.2
  done
  [ -n "$disk" ] && [ -b "/dev/$disk" ] || fail "no SCSI disk after the iSER login"
  iscsiadm -m session -P 1 | grep -i "iface.transport\|Iface Transport" || true
  "$bin/riser-rpc" -s "$sock" iscsi_get_connections >"$logs/conns.json"
  grep -q '"transport": "iser"' "$logs/conns.json" || { cat "$logs/conns.json"; fail "riser does not show an iser connection"; }
}

logout() {
  step "logout"
  iscsiadm -m node -T "$iqn" -p "$RXE_IP" --logout >"$logs/logout.log" 2>&1 || fail "logout failed"
  for _ in $(seq 50); do
    conns=$("$bin/riser-rpc" -s "$sock" iscsi_get_connections | tr -d ' \n')
    [ "$conns" = "[]" ] && break
    sleep 0.2
  done
  [ "$conns" = "[]" ] || fail "connections left after logout: $conns"
}

# /sys/block/X/stat: reads, -, sectors read, -, writes, -, sectors written, ...
stat_of() { read -r r _ rs _ w _ ws _ <"/sys/block/$disk/stat"; echo "$r $rs $w $ws"; }

# big_io KB COUNT TAG: max_sectors_kb set to KB, COUNT commands of KB KiB of a known pattern
# written and read back with O_DIRECT (dd bs=KB), compared; the block layer's counters must
# show exactly one request (one SCSI command) per KB KiB in each direction.
big_io() {
  local kb=$1 count=$2 tag=$3 q=/sys/block/$disk/queue r0 rs0 w0 ws0 r1 rs1 w1 ws1 r2 rs2 w2 ws2 writes reads
  step "$tag: ${kb} KiB commands: max_sectors_kb raised, written and read back with O_DIRECT"
  echo "$kb" >"$q/max_sectors_kb" || fail "cannot raise max_sectors_kb to $kb"
  [ "$(cat "$q/max_sectors_kb")" = "$kb" ] || fail "max_sectors_kb is $(cat "$q/max_sectors_kb"), not $kb"
  dd if=/dev/urandom of=/tmp/big bs=${kb}K count="$count" status=none
  read -r r0 rs0 w0 ws0 <<<"$(stat_of)"
  dd if=/tmp/big of="/dev/$disk" bs=${kb}K count="$count" oflag=direct status=none || fail "${kb} KiB writes failed"
  read -r r1 rs1 w1 ws1 <<<"$(stat_of)"
  dd if="/dev/$disk" of=/tmp/big-back bs=${kb}K count="$count" iflag=direct status=none || fail "${kb} KiB reads failed"
  read -r r2 rs2 w2 ws2 <<<"$(stat_of)"
  cmp /tmp/big /tmp/big-back || fail "${kb} KiB commands: data read back differs"
  writes=$((w1 - w0)) reads=$((r2 - r1))
  echo "$tag: block layer: $writes writes of $(( (ws1 - ws0) / 2 / (writes > 0 ? writes : 1) )) KiB, $reads reads of $(( (rs2 - rs1) / 2 / (reads > 0 ? reads : 1) )) KiB"
  [ "$writes" -ge 1 ] && [ $(( (ws1 - ws0) / writes )) -ge $((kb * 2)) ] || fail "the writes were not ${kb} KiB commands"
  [ "$reads" -ge 1 ] && [ $(( (rs2 - rs1) / reads )) -ge $((kb * 2)) ] || fail "the reads were not ${kb} KiB commands"
  echo "$tag: md5 written $(md5sum </tmp/big | cut -c1-32), read back $(md5sum </tmp/big-back | cut -c1-32)"
  echo "$((count * kb)) KiB in ${kb} KiB commands verified over iSER"
}

start_riser

step "iscsid, discovery over TCP"
mkdir -p /run/lock/iscsi /var/lib/iscsi /etc/iscsi
echo "InitiatorName=iqn.2016-06.io.riser:vm-iser" >/etc/iscsi/initiatorname.iscsi
setsid iscsid -f >"$logs/iscsid.log" 2>&1 &
iscsid_pid=$!
for _ in $(seq 100); do grep -q '@ISCSIADM_ABSTRACT_NAMESPACE' /proc/net/unix && break; sleep 0.2; done
iscsiadm -m discovery -t st -p "$RXE_IP" >"$logs/discovery.log" 2>&1 || fail "discovery failed"
cat "$logs/discovery.log"
iscsiadm -m node -T "$iqn" -p "$RXE_IP" --op update -n iface.transport_name -v iser >"$logs/update.log" 2>&1 || fail "iface update failed"

# Large commands: ib_iser's max_sectors (512-byte sectors per command, 1024 by default) is
# raised before the login, so the session may carry up to 8 MiB commands.
modprobe ib_iser 2>/dev/null || true
echo 16384 >/sys/module/ib_iser/parameters/max_sectors || fail "cannot raise ib_iser's max_sectors"

login
cat "$logs/conns.json"

step "write ${size_mib} MiB of random data (O_DIRECT), read back, compare"
dd if=/dev/urandom of=/tmp/pattern bs=1M count="$size_mib" status=none
dd if=/tmp/pattern of="/dev/$disk" bs=1M oflag=direct status=none || fail "write failed"
dd if="/dev/$disk" of=/tmp/readback bs=1M count="$size_mib" iflag=direct status=none || fail "read failed"
cmp /tmp/pattern /tmp/readback || fail "data read back differs"
echo "${size_mib} MiB verified over iSER"

# Large commands over stock soft-RoCE: as large as the initiator allows, which is 2044 KiB:
# rxe registers at most 512 pages per fast registration, and ib_iser sizes its commands from
# that (511 pages: one is kept for a misaligned head).
q=/sys/block/$disk/queue
echo "stock rxe: max_hw_sectors_kb $(cat $q/max_hw_sectors_kb), max_sectors_kb $(cat $q/max_sectors_kb), max_segments $(cat $q/max_segments)"
big_kb=$(cat $q/max_hw_sectors_kb)
[ "$big_kb" -gt 8192 ] && big_kb=8192
big_kb=$((big_kb / 4 * 4))
[ "$big_kb" -ge 1024 ] || fail "the initiator allows only $big_kb KiB per command (ib_iser's max_sectors not raised?)"
big_io "$big_kb" 4 "stock rxe"
logout
stop_riser

# 8 MiB commands, what ib_iser sends over a real RNIC once max_sectors_kb is raised: the same
# rxe with 4096 fast-reg pages (a test-environment change, see scripts/vm/build-rxe.sh).
step "soft-RoCE swapped for $rxe_ko (4096 fast-reg pages)"
rdma link delete "$RXE_DEV" || fail "rdma link delete $RXE_DEV failed"
for _ in $(seq 50); do rmmod rdma_rxe 2>/dev/null && break; sleep 0.2; done
! grep -q '^rdma_rxe ' /proc/modules || fail "the stock rdma_rxe cannot be unloaded"
insmod "$rxe_ko" || fail "insmod $rxe_ko failed"
. scripts/vm/rxe-up.sh
start_riser
login
q=/sys/block/$disk/queue
echo "raised rxe: max_hw_sectors_kb $(cat $q/max_hw_sectors_kb), max_segments $(cat $q/max_segments)"
[ "$(cat $q/max_hw_sectors_kb)" -ge 8192 ] \
  || fail "with 4096 fast-reg pages ib_iser still allows only $(cat $q/max_hw_sectors_kb) KiB per command"
big_io 8192 4 "raised rxe"
# Payload bytes riser's CPU copied since this riser started (the 8 MiB commands only): RDMA
# Write / RDMA Read straight from / into its I/O buffers, none for reads and solicited data.
stats=$("$bin/riser-rpc" -s "$sock" iscsi_get_stats | tr -d ' \n')
echo "raised rxe: iscsi_get_stats $stats"
# 8 MiB writes stream in 1 MiB pieces; the immediate data goes straight into the first
# piece's buffer: copied once (unsolicited), never a second time (staged).
copies=$(python3 -c 'import json,sys; c=json.loads(sys.argv[1])["payload_copies"]; print(c["read_bytes"], c["solicited_bytes"], c["staged_bytes"])' "$stats") \
  || fail "cannot read payload_copies: $stats"
[ "$copies" = "0 0 0" ] || fail "8 MiB commands over iSER: read, solicited and staged bytes copied should be 0 0 0, are $copies"
logout
stop_riser
echo "ISER OK"
trap - EXIT
cleanup
