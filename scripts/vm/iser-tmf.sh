#!/usr/bin/env bash
# iSER by the book, inside the VM: scripts/rxe-vm.sh run scripts/vm/iser-tmf.sh
#
# riser serves one target with queue depth 256 and two malloc LUNs on an iSER portal.
#   1. Full depth: riser-perf --verify over iser:// at QD 256 with immediate data (4 KiB and
#      64 KiB writes, then read back and compared), with no RNR NAK counted by soft-RoCE.
#   2. Task management under load: the Linux initiator (ib_iser) writes 16 MiB to LUN 0 while
#      sg_reset sends LOGICAL UNIT RESETs with its writes in flight (Linux reuses the ITTs of
#      the tasks a reset ends), and riser-perf writes and verifies LUN 1 at QD 64 meanwhile;
#      LUN 0 read back identical, LUN 1 verified again, LUN 0 rewritten and verified; no
#      connection left.
#   3. ABORT TASK under load: riser-perf randread QD 32 over iser:// with an ABORT TASK right
#      after every 7th command (--abort-every, riser-perf reusing the aborted tasks' ITTs):
#      every one answered Function complete or Task does not exist, no response for an
#      aborted task; then 16 MiB of LUN 0 written and verified with no aborts, read back again.
# Needs the host-built riser, riser-rpc and riser-perf. Prints "ISER TMF OK" last on success.
set -euo pipefail
. scripts/vm/rxe-up.sh
name=iser-tmf
. scripts/vm/lib.sh
[ -x "$bin/riser-perf" ] || fail "$bin/riser-perf missing: cargo build -p riser-perf on the host"

iqn=iqn.2016-06.io.riser:tmf
port=3260
url0="iser://$RXE_IP:$port/$iqn/0"
url1="iser://$RXE_IP:$port/$iqn/1"
perf() { "$bin/riser-perf" --login-timeout 30 "$@"; }
# soft-RoCE's RNR NAK counters (sent and received), summed.
rnr() { rdma statistic show link "$RXE_DEV/1" 2>/dev/null | tr ' ' '\n' | awk '/rnr/ {getline v; s += v} END {print s + 0}'; }

verify() { # LABEL URL QD BS [--verify-only] [FLAGS...]
  local label=$1 url=$2 qd=$3 bs=$4 mode=--verify out rc=0; shift 4
  [ "${1:-}" = --verify-only ] && { mode=--verify-only; shift; }
  out=$(perf "$mode" --qd "$qd" --bs "$bs" "$@" "$url" 2>&1) || rc=$?
  echo "$out" >"$logs/verify-$label.log"
  [ $rc = 0 ] || fail "$label: riser-perf --verify exited with $rc: $(tail -n 5 <<<"$out")"
  grep -q '^verify: PASSED$' <<<"$out" || fail "$label: not PASSED: $(tail -n 5 <<<"$out")"
  grep -q 'RDMAExtensions Yes' <<<"$out" || fail "$label: the session is not over iSER"
  echo "$label: $(grep '^verify: [0-9]* blocks checked' <<<"$out")"
}

step "riser: queue depth 256, LUN 0 and LUN 1 (32 MiB each), iSER and TCP (discovery) portals $RXE_IP:$port"
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[
{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":65536,"block_size":512}},
{"method":"bdev_malloc_create","params":{"name":"Malloc1","num_blocks":65536,"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_set_options","params":{"max_queue_depth":256}},
{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"$port","iser":true},{"host":"$RXE_IP","port":"$port"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"tmf","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0},{"bdev_name":"Malloc1","lun_id":1}],"queue_depth":256}}]}]}
JSON
RISER_LOG=${RISER_LOG:-info} riser_start /tmp/riser.json --poll-mode adaptive

step "QD 256 with immediate data over iSER"
rdma statistic show link "$RXE_DEV/1" 2>/dev/null | has rnr || fail "soft-RoCE shows no RNR counters: $(rdma statistic show link "$RXE_DEV/1" 2>&1)"
rnr0=$(rnr)
verify qd256-4k "$url0" 256 4096 --lba-range 0:16384
verify qd256-64k "$url0" 256 65536
rnr1=$(rnr)
echo "RNR NAKs during the QD 256 runs: $((rnr1 - rnr0))"
[ "$((rnr1 - rnr0))" = 0 ] || fail "$((rnr1 - rnr0)) RNR NAKs at QD 256: the receive ring is too small"
wait_no_connections 30

step "LUN RESETs under load over iSER: Linux ib_iser writing LUN 0, riser-perf loading LUN 1"
# (libiscsi 1.19's own iSCSITMF tests crash in its iSER code, so the resets come from the Linux
# initiator: sg_reset --device sends LOGICAL UNIT RESET with its writes in flight, and Linux
# reuses the ITTs of the tasks it ends.)
perf --verify --qd 64 --bs 65536 --generation 7 "$url1" >"$logs/load.log" 2>&1 &
load=$!
extra_pids="$load"
iscsid_start
iface_iser
discover iser0
sid=$(login "$iqn" iser0)
disk=$(disk_of "$sid" 0)
dd if=/dev/urandom of=/tmp/pattern bs=1M count=16 status=none
# The writer rewrites the same 16 MiB in passes until told to stop, so the resets always
# meet writes in flight however fast the target is, and the data to compare stays the same.
rm -f /tmp/stop-writer
( while [ ! -e /tmp/stop-writer ]; do dd if=/tmp/pattern of="/dev/$disk" bs=64k oflag=direct status=none || exit 1; done ) 2>"$logs/dd.log" &
writer=$!
resets=0
for _ in 1 2 3; do
  sleep 0.5
  kill -0 "$writer" 2>/dev/null || break
  sg_reset --device "/dev/$disk" >>"$logs/sg_reset.log" 2>&1 && resets=$((resets + 1))
done
touch /tmp/stop-writer
rc=0; wait "$writer" || rc=$?
[ $rc = 0 ] || fail "the writes under LUN reset failed: $(cat "$logs/dd.log")"
dmesg | grep -ciE 'reset|abort' >/dev/null || true
echo "LUN resets sent during the writes: $resets"
[ "$resets" -ge 1 ] || fail "no LUN reset was sent while the writes ran"
grep -qiE 'lun reset|LOGICAL UNIT RESET|LunReset|reset' "$logs/riser.log" || echo "(riser logged no reset line)"
echo 3 >/proc/sys/vm/drop_caches
dd if="/dev/$disk" of=/tmp/readback bs=1M count=16 iflag=direct status=none || fail "read back failed"
cmp /tmp/pattern /tmp/readback || fail "data read back after the LUN resets differs"
echo "16 MiB written through LUN resets over iSER, read back identical"
logout_sid "$sid"
rc=0; wait "$load" || rc=$?
extra_pids=
[ $rc = 0 ] && grep -q '^verify: PASSED$' "$logs/load.log" || fail "the load on LUN 1 failed meanwhile: $(tail -n 5 "$logs/load.log")"
echo "LUN 1 under load meanwhile: $(grep '^verify: [0-9]* blocks checked' "$logs/load.log")"
verify after-tmf-lun1 "$url1" 32 65536 --verify-only --generation 7
verify after-tmf-lun0 "$url0" 32 65536 --generation 9
wait_no_connections 30

step "ABORT TASK under load over iSER: riser-perf randread QD 32, an ABORT TASK after every 7th command"
rc=0
out=$(perf --rw randread --qd 32 --bs 4096 --time 4 --ramp 0 --abort-every 7 "$url0" 2>&1) || rc=$?
echo "$out" >"$logs/abort.log"
[ $rc = 0 ] || fail "riser-perf --abort-every exited with $rc: $(tail -n 5 <<<"$out")"
line=$(grep '^aborts: ' <<<"$out") || fail "riser-perf printed no aborts line: $(tail -n 5 <<<"$out")"
echo "abort-iser: $line"
verify after-abort-16m "$url0" 32 65536 --lba-range 0:32768 --generation 11
verify after-abort-readback "$url0" 8 4096 --verify-only --lba-range 0:32768 --generation 11
wait_no_connections 30
riser_stop
echo "ISER TMF OK"
