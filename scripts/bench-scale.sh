#!/usr/bin/env bash
# Multi-reactor scaling of riser over iSCSI/TCP on loopback (a benchmark, not a test):
# a null LUN, 4 KiB random reads, riser on reactors 0..R-1 (pinned, busy poll) for each R of
# BENCH_REACTORS, riser-perf on the cores of BENCH_CLIENT_MASK with BENCH_SESSIONS sessions
# (QD BENCH_QD each). Needs a machine with cores to spare: e.g. 16 cores for the defaults.
#
# Environment: BENCH_REACTORS (default "1 2 4 8"), BENCH_CLIENT_MASK (default [8-15]),
# BENCH_SESSIONS (16), BENCH_QD (32), BENCH_TIME (8 s, after a 2 s ramp), RISER_BIN_DIR
# (default target/release), BENCH_PORT (3260), BENCH_OUT (where the JSON reports go; default
# a new directory under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RISER_BIN_DIR:-target/release}
for b in riser riser-rpc riser-perf; do
  [ -x "$bin/$b" ] || { echo "bench-scale: $bin/$b missing: cargo build --release --workspace" >&2; exit 2; }
done
reactors=${BENCH_REACTORS:-1 2 4 8}
client=${BENCH_CLIENT_MASK:-[8-15]}
sessions=${BENCH_SESSIONS:-16}
qd=${BENCH_QD:-32}
time_s=${BENCH_TIME:-8}
port=${BENCH_PORT:-3260}
out=${BENCH_OUT:-$(mktemp -d /tmp/riser-bench-scale.XXXXXX)}
mkdir -p "$out"
echo "bench-scale: $(nproc) cores; riser-perf on $client, $sessions sessions at QD $qd, 4 KiB randread, ${time_s} s; reports in $out"
printf '%-9s %12s %9s %9s %9s\n' reactors IOPS p50_us p99_us client%
for r in $reactors; do
  mask=$(printf '0x%x' $(( (1 << r) - 1 )))
  sock=$out/riser-$r.sock
  "$bin/riser" -m "$mask" -r "$sock" --poll-mode busy >"$out/riser-$r.log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null' EXIT
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  rpc=("$bin/riser-rpc" -s "$sock")
  "${rpc[@]}" bdev_null_create Null0 1024 512 >/dev/null
  "${rpc[@]}" iscsi_create_portal_group 1 "127.0.0.1:$port" >/dev/null
  "${rpc[@]}" iscsi_create_initiator_group 1 ANY ANY >/dev/null
  "${rpc[@]}" iscsi_create_target_node scale scale Null0:0 1:1 64 -d >/dev/null
  "$bin/riser-perf" --rw randread --bs 4096 --qd "$qd" --time "$time_s" --ramp 2 -m "$client" \
    --sessions "$sessions" --poll-mode busy --json "iscsi://127.0.0.1:$port/iqn.2016-06.io.riser:scale/0" \
    >"$out/perf-$r.json" 2>"$out/perf-$r.err" || { echo "riser-perf failed with $r reactor(s):"; tail -5 "$out/perf-$r.err"; }
  python3 - "$out/perf-$r.json" "$r" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1])); t = d["total"]; l = t["latency"]
print(f"{sys.argv[2]:<9} {t['iops']:12.0f} {l['p50_us']:9.0f} {l['p99_us']:9.0f} {d['client_cpu']['pct_of_core']:9.0f}")
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true
  trap - EXIT
done
