#!/usr/bin/env bash
# The riser-perf benchmark matrix over iSCSI/TCP: 4 KiB random read and write at QD 1, 32
# and 128, 128 KiB sequential read and write, against riser and against tgt (Debian's
# user-space target), both with a null LUN, measured in the same run and alternated case by
# case (the order flips every round). Target pinned to core 0, riser-perf (one client
# thread, one session) to core 1. Prints one table of medians with riser/tgt ratios, and
# saves every run's report (results.json), the medians (summary.json) and the chart
# (matrix.svg). A benchmark: it prints figures, it asserts nothing.
#
# Environment: MATRIX_TIME (seconds measured per run, default BENCH_TIME or 3), MATRIX_RAMP
# (default 1), MATRIX_ROUNDS (default BENCH_ROUNDS or 2), MATRIX_SEQ_QD (QD of the 128 KiB
# cases, default 8), BENCH_OUT (where the files go, default target/bench/matrix-DATE).
# About 16 x ROUNDS x (TIME + RAMP + 1) seconds: 2.5 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
perf=${CARGO_TARGET_DIR:-./target}/release/riser-perf
riser=${CARGO_TARGET_DIR:-./target}/release/riser
secs=${MATRIX_TIME:-${BENCH_TIME:-3}}
ramp=${MATRIX_RAMP:-1}
rounds=${MATRIX_ROUNDS:-${BENCH_ROUNDS:-2}}
seq_qd=${MATRIX_SEQ_QD:-8}
out=${BENCH_OUT:-target/bench/matrix-$(date +%Y%m%d-%H%M%S)}
riser_port=3264
tgt_port=3265
# tgtd's management instance (see lib-tgt.sh): not bench-peers.sh's.
tgt_ctl=3265
. scripts/lib-tgt.sh
for b in "$perf" "$riser"; do
  [ -x "$b" ] || { echo "bench-perf-matrix: $b not built: make release" >&2; exit 1; }
done
command -v /usr/sbin/tgtd >/dev/null || { echo "bench-perf-matrix: tgtd missing: scripts/setup.sh bench" >&2; exit 1; }
mkdir -p "$out/runs"
work=$(mktemp -d /tmp/bench-matrix.XXXXXX)
riser_pid=
cleanup() {
  [ -n "$riser_pid" ] && kill "$riser_pid" 2>/dev/null || true
  tgt_stop
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/riser.json" <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_set_options","params":{"max_queue_depth":128}},
{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"127.0.0.1","port":"$riser_port"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"null","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Null0","lun_id":0}],"queue_depth":128}}]}]}
JSON
taskset -c 0 "$riser" -m 0x1 --poll-mode busy -r "$work/riser.sock" --json "$work/riser.json" >"$out/riser.log" 2>&1 &
riser_pid=$!
tgt_start "$out/tgtd.log"
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$riser_port) 2>/dev/null && break
  sleep 0.1
done

declare -A url=(
  [riser]="iscsi://127.0.0.1:$riser_port/iqn.2016-06.io.riser:null/0"
  [tgt]="iscsi://127.0.0.1:$tgt_port/$tgt_iqn/1"
)
# case name | --rw | --bs | --qd
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

results="$out/results.json"
echo "[" > "$results"
first=1
add() { # case target round file-or-empty error
  local sep=","; [ $first -eq 1 ] && sep=" " && first=0
  if [ -n "$4" ]; then
    printf '%s{"case": "%s", "target": "%s", "round": %d, "report":\n' "$sep" "$1" "$2" "$3" >> "$results"
    cat "$4" >> "$results"
    printf '}\n' >> "$results"
  else
    printf '%s{"case": "%s", "target": "%s", "round": %d, "error": "%s"}\n' "$sep" "$1" "$2" "$3" "$5" >> "$results"
  fi
}

echo "riser-perf matrix: $secs s measured after $ramp s ramp, $rounds round(s), null LUNs; files in $out"
for round in $(seq "$rounds"); do
  order=(riser tgt); [ $((round % 2)) -eq 0 ] && order=(tgt riser)
  for c in "${cases[@]}"; do
    IFS='|' read -r name rw bs qd <<<"$c"
    for t in "${order[@]}"; do
      f="$out/runs/${name// /-}.$t.$round.json"
      if timeout $((secs + ramp + 40)) "$perf" -m 0x2 --rw "$rw" --bs "$bs" --qd "$qd" --time "$secs" --ramp "$ramp" \
          --json "${url[$t]}" >"$f" 2>"${f%.json}.err"; then
        add "$name" "$t" "$round" "$f" ""
        iops=$(sed -n 's/^    "iops": \([0-9.]*\),*$/\1/p' "$f" | head -1)
        printf 'round %d %-20s %-5s %10.0f IOPS\n' "$round" "$name" "$t" "${iops:-0}"
      else
        add "$name" "$t" "$round" "" "riser-perf exited $?: see ${f%.json}.err"
        printf 'round %d %-20s %-5s FAILED (%s)\n' "$round" "$name" "$t" "$(tail -1 "${f%.json}.err")"
      fi
    done
  done
done
echo "]" >> "$results"

echo
echo "== riser-perf matrix, iSCSI/TCP, null LUNs, medians of $rounds round(s) of $secs s; ratio = riser / tgt (IOPS: higher is better; p99: lower is better); CPU/IO = riser-perf's own CPU us per I/O =="
"$perf" chart "$results" -o "$out/matrix.svg" --summary "$out/summary.json" \
  --title "riser vs tgt over iSCSI/TCP (null LUNs, riser-perf, 1 client thread, medians of $rounds x $secs s)"
echo "saved: $results, $out/summary.json, $out/matrix.svg"
