#!/usr/bin/env bash
# riser-perf's own iSER initiator (iser://), inside the VM: scripts/rxe-vm.sh run scripts/vm/perf-iser.sh
#
# (a) riser serves a malloc LUN on an iSER portal on the soft-RoCE address; riser-perf --verify
#     over iser:// writes every block of a range in its self-checking format and reads it back,
#     with 4 KiB I/Os and with 256 KiB I/Os (several RDMA chunks per command), QD 16: zero
#     mismatches, some I/O done; then 16 MiB and 32 MiB I/Os (riser's largest; QD 2), which
#     riser moves by RDMA straight between its I/O buffers and the initiator's (zero copy):
#     iscsi_get_stats must show no read or solicited write byte copied; then 64 KiB writes
#     with 8 KiB of immediate data each: immediate data copied at most once, none staged.
# (b) The same against the kernel's iSER target, LIO + ib_isert (configfs, rd_mcp ramdisk), in
#     the same boot.
# (c) A mismatch injected behind riser-perf's back: a verify write pass to a LIO fileio LUN
#     backed by a file in the guest's tmpfs, one 512-byte block of the file overwritten with dd,
#     then a --verify-only read pass must name that LBA and exit non-zero.
# Then, not asserted (for the notes): riser-perf iser:// 4 KiB random read QD 32 IOPS against
# riser and against LIO.
#
# Needs the host-built riser, riser-rpc and riser-perf in $RISER_BIN_DIR. Prints "PERF ISER OK"
# last on success, "PERF ISER FAILED: why" otherwise.
set -euo pipefail
. scripts/vm/rxe-up.sh
name=perf-iser
. scripts/vm/lib.sh

[ -x "$bin/riser-perf" ] || fail "$bin/riser-perf missing: cargo build -p riser-perf on the host"
time_s=${RISER_PERF_TIME:-5}
ncpu=$(nproc)
riser_core=$((ncpu - 1))
riser_port=3261
riser_iqn=iqn.2016-06.io.riser:perf
lio_iqn=iqn.2003-01.org.linux-iscsi.riser-vm:perf
lun_mib=32
file_mib=8

perf() { "$bin/riser-perf" --login-timeout 30 "$@"; }

# One verify run: LABEL URL BS [FLAGS...]; asserts PASSED with every block checked and none
# mismatched; prints one summary line.
verify_ok() {
  local label=$1 url=$2 bs=$3 out rc=0 t0=$SECONDS; shift 3
  out=$(perf --verify --qd "${VERIFY_QD:-16}" --bs "$bs" "$@" "$url" 2>&1) || rc=$?
  echo "$out" >"$logs/verify-$label-$bs.log"
  [ $rc = 0 ] || fail "$label: riser-perf --verify --bs $bs exited with $rc: $(tail -n 5 <<<"$out")"
  grep -q '^verify: PASSED$' <<<"$out" || fail "$label: no 'verify: PASSED' ($bs B I/Os): $(tail -n 5 <<<"$out")"
  verify_checked "$label" "$out"
  local checked=$verified_blocks
  echo "perf-iser: $label verify $((bs / 1024))k: PASSED, $checked blocks checked, 0 mismatched ($((SECONDS - t0)) s)"
}

# 4 KiB random read QD 32 for $time_s s with --poll-mode MODE: prints the IOPS.
iops_of() {
  local label=$1 url=$2 mode=$3 out
  out=$(perf --rw randread --bs 4096 --qd 32 --time "$time_s" --ramp 1 --poll-mode "$mode" "$url" 2>&1) \
    || fail "$label: riser-perf randread failed: $(tail -n 5 <<<"$out")"
  echo "$out" >"$logs/randread-$label-$mode.log"
  awk '/^  IOPS:/ {print $2}' <<<"$out"
}

# ---- (a) riser ----------------------------------------------------------------------------
step "riser: malloc LUN ${lun_mib} MiB, iSER portal $RXE_IP:$riser_port, reactor on vCPU $riser_core"
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":$((lun_mib * 2048)),"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"$riser_port","iser":true}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"perf","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0}],"queue_depth":64}}]}]}
JSON
RISER_LOG=${RISER_LOG:-info} riser_start /tmp/riser.json --poll-mode adaptive -m "[$riser_core]"
riser_url="iser://$RXE_IP:$riser_port/$riser_iqn/0"
step "riser-perf --verify over iSER against riser"
verify_ok riser "$riser_url" 4096 --lba-range 0:16384
verify_ok riser "$riser_url" 262144
# 1 MiB per command: one RDMA Write / Read per command.
verify_ok riser "$riser_url" 1048576
# Zero-copy iSER: 16 MiB commands, RDMA Writes / Reads straight from / into riser's buffers
# (1 MiB per work request). Commands over 1 MiB stream in 1 MiB pieces: a read's pieces are
# RDMA-written as the device fills them, a write's are RDMA-read as the SCSI layer asks.
VERIFY_QD=2 verify_ok riser "$riser_url" 16777216
# 32 MiB, riser's largest transfer. libiscsi's iscsi-perf cannot send a 32 MiB READ(16) over
# iser:// (it crashes: double free), riser-perf can.
VERIFY_QD=2 verify_ok riser "$riser_url" 33554432
# Streamed in pieces: the most buffer memory ever in use stays below one 32 MiB command's.
rpc iobuf_get_stats >"$logs/iobuf-stats.json"
peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_in_use_bytes"])' "$logs/iobuf-stats.json") \
  || fail "cannot read iobuf_get_stats: $(head -c 300 "$logs/iobuf-stats.json")"
[ "$peak" -lt 33554432 ] || fail "16/32 MiB I/Os over iSER took whole-command buffers: peak_in_use_bytes $peak"
echo "$name: 16 and 32 MiB I/Os over iSER streamed: peak buffer memory in use $((peak >> 20)) MiB"
# Payload bytes copied by riser's CPU (iscsi_get_stats "payload_copies"): none for read data
# (Put_Data) nor solicited write data (Get_Data) over iSER; immediate data may be copied.
assert_zero_copy "iSER"
# Writes partly immediate (64 KiB, 8 KiB immediate): the immediate data is copied once, out of
# the receive buffer straight into the task's write buffer.
wait_no_connections 30
assert_immediate_copied_once "iSER" "$riser_url"
rpc iscsi_get_connections >"$logs/riser-conns.json"
wait_no_connections 30
step "riser-perf randread 4 KiB QD 32 against riser"
riser_iops=$(iops_of riser "$riser_url" adaptive)
riser_iops_busy=$(iops_of riser "$riser_url" busy)
wait_no_connections 30
riser_stop

# ---- (b) LIO + isert ------------------------------------------------------------------------
step "LIO: rd_mcp ${lun_mib} MiB (LUN 0) and fileio on tmpfs ${file_mib} MiB (LUN 1), iSER portal $RXE_IP:3260"
img=/tmp/lio-file.img
lio_iser_target "$lio_iqn" "$lun_mib" "$img" "$file_mib"
lio_url="iser://$RXE_IP/$lio_iqn/0"
step "riser-perf --verify over iSER against LIO"
verify_ok LIO "$lio_url" 4096 --lba-range 0:16384
verify_ok LIO "$lio_url" 262144
step "riser-perf randread 4 KiB QD 32 against LIO"
lio_iops=$(iops_of LIO "$lio_url" adaptive)
lio_iops_busy=$(iops_of LIO "$lio_url" busy)

# ---- (c) a mismatch behind riser-perf's back -----------------------------------------------
step "mismatch injection: LIO fileio LUN 1 on $img"
file_url="iser://$RXE_IP/$lio_iqn/1"
gen=4242
verify_ok LIO-fileio "$file_url" 4096 --generation $gen
bad_lba=5000
dd if=/dev/urandom of="$img" bs=512 seek=$bad_lba count=1 conv=notrunc status=none
sync
rc=0
out=$(perf --verify-only --generation $gen --qd 16 --bs 4096 "$file_url" 2>&1) || rc=$?
echo "$out" >"$logs/verify-only-injected.log"
[ $rc != 0 ] || fail "riser-perf --verify-only exited 0 after a block was overwritten: $(tail -n 5 <<<"$out")"
grep -q "^MISMATCH LBA $bad_lba: " <<<"$out" || fail "no MISMATCH line for LBA $bad_lba: $(grep -E 'MISMATCH|verify' <<<"$out" | head -n 5)"
grep -q '^verify: FAILED$' <<<"$out" || fail "no 'verify: FAILED' after the injected mismatch"
n=$(grep -c '^MISMATCH ' <<<"$out")
[ "$n" = 1 ] || fail "$n MISMATCH lines, expected only LBA $bad_lba: $(grep '^MISMATCH' <<<"$out" | head -n 5)"
echo "perf-iser: injected mismatch reported: $(grep '^MISMATCH ' <<<"$out"), exit status $rc"

echo "perf-iser: IOPS riser-perf iser:// randread 4 KiB QD 32 (${time_s} s, TCG VM, $ncpu vCPUs; riser adaptive on vCPU $riser_core, riser-perf on vCPU 0): riser $riser_iops, LIO $lio_iops (riser-perf --poll-mode busy: riser $riser_iops_busy, LIO $lio_iops_busy)"
step "teardown"
echo 0 >"$tpg/enable" 2>/dev/null || true
echo "PERF ISER OK"
