#!/usr/bin/env bash
# In-guest half of scripts/bench-matrix-rxe.sh (run that one): the riser-perf benchmark
# matrix of scripts/bench-perf-matrix.sh, over iSER on soft-RoCE, riser against the kernel's
# own iSER target (LIO + ib_isert), both measured with riser-perf's iSER initiator (iser://).
#
# Cases: 4 KiB random read and write at QD 1, 32 and 128; 128 KiB sequential read and write
# at QD RISER_MATRIX_SEQ_QD (default 8). Targets: riser (malloc LUN, reactor pinned to the
# last vCPU, --poll-mode RISER_MATRIX_MODE, default adaptive) and LIO (rd_mcp ramdisk of the
# same size), both with a CmdSN window of 128. They alternate case by case (the order flips
# every round); riser runs only during its own turns (started and stopped around each run),
# LIO is idle during riser's. riser-perf: one client thread pinned to vCPU 0 (-m 0x1), one
# session, --json.
#
# Writes $RISER_VM_OUT/results.json in the format `riser-perf chart` reads (the same as
# scripts/bench-perf-matrix.sh: [{"case", "target", "round", "report"|"error"}, ...], targets
# "riser" and "LIO", riser first so that the ratios are riser / LIO), every run's report
# under $RISER_VM_OUT/runs/, and prints each run's IOPS as it goes. Not a test: it fails only
# when something breaks (a failed run is recorded as an error entry and the matrix goes on).
#
# Environment (scripts/bench-matrix-rxe.sh passes them through): RISER_MATRIX_TIME (seconds
# measured per run, default 3), RISER_MATRIX_RAMP (default 1), RISER_MATRIX_ROUNDS (default
# 1), RISER_MATRIX_SEQ_QD (default 8), RISER_MATRIX_MODE (riser's poll mode: adaptive or
# busy), RISER_MATRIX_CLIENT_MODE (riser-perf's --poll-mode: adaptive, the default, sleeps on
# its completion channel when idle, so at QD 1 every response wakes it; busy spins, so the
# latency is the target's and not a cross-vCPU wake-up of the client, which only a target on
# another vCPU than the client's pays: LIO answers in softirq on the client's own vCPU),
# RISER_MATRIX_SIZE_MIB (LUN size, default 256), RISER_MATRIX_CASES (a regular expression: only
# the cases whose name matches, e.g. 'qd1$').
set -euo pipefail
. scripts/vm/rxe-up.sh
name=bench-matrix-rxe
. scripts/vm/lib.sh

[ -x "$bin/riser-perf" ] || fail "$bin/riser-perf missing: cargo build -p riser-perf on the host"
command -v jq >/dev/null || fail "jq missing"
secs=${RISER_MATRIX_TIME:-3}
ramp=${RISER_MATRIX_RAMP:-1}
rounds=${RISER_MATRIX_ROUNDS:-1}
seq_qd=${RISER_MATRIX_SEQ_QD:-8}
mode=${RISER_MATRIX_MODE:-adaptive}
client_mode=${RISER_MATRIX_CLIENT_MODE:-adaptive}
case_filter=${RISER_MATRIX_CASES:-}
size_mib=${RISER_MATRIX_SIZE_MIB:-256}
case $mode in adaptive|busy) ;; *) fail "RISER_MATRIX_MODE must be adaptive or busy, not '$mode'" ;; esac
case $client_mode in adaptive|busy) ;; *) fail "RISER_MATRIX_CLIENT_MODE must be adaptive or busy, not '$client_mode'" ;; esac
ncpu=$(nproc)
riser_core=$((ncpu - 1))
riser_port=3261
riser_iqn=iqn.2016-06.io.riser:matrix
lio_iqn=iqn.2003-01.org.linux-iscsi.riser-vm:matrix
export RISER_LOG=${RISER_LOG:-info}
out=$RISER_VM_OUT
mkdir -p "$out/runs"

step "setup: $ncpu vCPUs, ${size_mib} MiB LUNs, $secs s measured after $ramp s ramp, $rounds round(s); riser --poll-mode $mode on vCPU $riser_core, riser-perf --poll-mode $client_mode on vCPU 0"

# ---- LIO + isert (configfs), CmdSN window 128 like riser's ---------------------------------
step "LIO: rd_mcp ${size_mib} MiB, iSER portal $RXE_IP:3260"
lio_iser_target "$lio_iqn" "$size_mib"
echo 128 >"$tpg/attrib/default_cmdsn_depth" || fail "cannot set LIO's default_cmdsn_depth"
echo "LIO: $lio_iqn, default_cmdsn_depth $(cat "$tpg/attrib/default_cmdsn_depth")"

# ---- riser: started for its turns only ------------------------------------------------------
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":$((size_mib * 2048)),"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_set_options","params":{"max_queue_depth":128}},
{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"$riser_port","iser":true}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"matrix","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0}],"queue_depth":128}}]}]}
JSON

declare -A url=(
  [riser]="iser://$RXE_IP:$riser_port/$riser_iqn/0"
  [LIO]="iser://$RXE_IP/$lio_iqn/0"
)
# case name | --rw | --bs | --qd (names as in scripts/bench-perf-matrix.sh)
cases=(
  "randread 4k qd1|randread|4096|1"
  "randread 4k qd32|randread|4096|32"
  "randread 4k qd128|randread|4096|128"
  "randwrite 4k qd1|randwrite|4096|1"
  "randwrite 4k qd32|randwrite|4096|32"
  "randwrite 4k qd128|randwrite|4096|128"
  "read 128k qd$seq_qd|read|131072|$seq_qd"
  "write 128k qd$seq_qd|write|131072|$seq_qd"
)

results=$out/results.json
echo "[" >"$results"
first=1
add() { # case target round file-or-empty error
  local sep=","; [ $first -eq 1 ] && sep=" " && first=0
  if [ -n "$4" ]; then
    printf '%s{"case": "%s", "target": "%s", "round": %d, "report":\n' "$sep" "$1" "$2" "$3" >>"$results"
    cat "$4" >>"$results"
    printf '}\n' >>"$results"
  else
    printf '%s{"case": "%s", "target": "%s", "round": %d, "error": %s}\n' "$sep" "$1" "$2" "$3" "$(jq -Rn --arg e "$5" '$e')" >>"$results"
  fi
}

# One run: CASE TARGET ROUND RW BS QD. riser is started before and stopped after its run.
run_one() {
  local cname=$1 t=$2 round=$3 rw=$4 bs=$5 qd=$6 f err rc=0 iops
  f="$out/runs/${cname// /-}.$t.$round.json"
  err="${f%.json}.err"
  [ "$t" = riser ] && riser_start /tmp/riser.json --poll-mode "$mode" -m "[$riser_core]"
  timeout $((secs + ramp + 90)) "$bin/riser-perf" --login-timeout 30 -m 0x1 --poll-mode "$client_mode" --rw "$rw" --bs "$bs" --qd "$qd" \
    --time "$secs" --ramp "$ramp" --json "${url[$t]}" >"$f" 2>"$err" || rc=$?
  if [ $rc = 0 ] && iops=$(jq -e '.total.iops' "$f" 2>/dev/null); then
    add "$cname" "$t" "$round" "$f" ""
    printf 'round %d %-20s %-5s %10.0f IOPS %8.1f MiB/s  p99 %s us\n' "$round" "$cname" "$t" "$iops" \
      "$(jq '.total.mib_per_s' "$f")" "$(jq '.total.latency.p99_us' "$f")"
  else
    add "$cname" "$t" "$round" "" "riser-perf exited $rc: $(tail -n 1 "$err")"
    printf 'round %d %-20s %-5s FAILED (exit %s: %s)\n' "$round" "$cname" "$t" "$rc" "$(tail -n 1 "$err")"
  fi
  if [ "$t" = riser ]; then
    wait_no_connections 30 >/dev/null
    riser_stop
  fi
}

echo "riser-perf matrix over iSER (soft-RoCE, TCG VM): $secs s measured after $ramp s ramp, $rounds round(s); files in $out"
for round in $(seq "$rounds"); do
  order=(riser LIO); [ $((round % 2)) -eq 0 ] && order=(LIO riser)
  for c in "${cases[@]}"; do
    IFS='|' read -r cname rw bs qd <<<"$c"
    [ -z "$case_filter" ] || [[ "$cname" =~ $case_filter ]] || continue
    for t in "${order[@]}"; do run_one "$cname" "$t" "$round" "$rw" "$bs" "$qd"; done
  done
done
echo "]" >>"$results"
jq -e 'length' "$results" >/dev/null || fail "$results is not valid JSON"

step "teardown"
echo 0 >"$tpg/enable" 2>/dev/null || true
echo "BENCH MATRIX RXE DONE"
