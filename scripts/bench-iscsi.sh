#!/usr/bin/env bash
# iSCSI over TCP: 4 KiB random read, QD 32, null LUN, against riser and against tgt (Debian's
# user-space target) set up the same way, each driven by two clients: libiscsi's iscsi-perf
# and riser-perf (one client thread, one session), all alternated over ROUNDS rounds on this
# machine. Target pinned to core 0, client to core 1. Prints each run, the medians, riser/tgt
# for each client, and the two clients side by side against the same target (riser-perf is
# meant to drive at least as many IOPS as iscsi-perf). A benchmark: it prints figures, it
# asserts nothing. BENCH_TIME (seconds per run, default 5), BENCH_ROUNDS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_TIME:-5}
rounds=${BENCH_ROUNDS:-3}
riser_port=3262
tgt_port=3263
# tgtd's management instance (see lib-tgt.sh).
tgt_ctl=3263
. scripts/lib-tgt.sh
work=$(mktemp -d /tmp/bench-iscsi.XXXXXX)
riser_pid=
cleanup() {
  [ -n "$riser_pid" ] && kill "$riser_pid" 2>/dev/null || true
  tgt_stop
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/riser.json" <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"127.0.0.1","port":"$riser_port"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"null","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Null0","lun_id":0}],"queue_depth":64}}]}]}
JSON
taskset -c 0 ./target/release/riser -m 0x1 --poll-mode busy -r "$work/riser.sock" --json "$work/riser.json" >"$work/riser.log" 2>&1 &
riser_pid=$!
tgt_start "$work/tgtd.log"
sleep 0.5

riser_url="iscsi://127.0.0.1:$riser_port/iqn.2016-06.io.riser:null/0"
tgt_url="iscsi://127.0.0.1:$tgt_port/$tgt_iqn/1"
iperf() { # URL -> IOPS (libiscsi's iscsi-perf; -b in 512-byte blocks)
  timeout $((secs + 30)) taskset -c 1 iscsi-perf -t "$secs" -m 32 -b 8 -r "$1" 2>&1 | tr '\r' '\n' |
    sed -n 's/^ *iops average \([0-9]*\).*/\1/p' | tail -1
}
rperf() { # URL -> IOPS (riser-perf: one client thread pinned to core 1, one session)
  timeout $((secs + 30)) ./target/release/riser-perf -m 0x2 --rw randread --bs 4096 --qd 32 --time "$secs" --ramp 0 \
    --json "$1" 2>/dev/null | sed -n 's/^    "iops": \([0-9]*\).*/\1/p' | head -1
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }

for f in ip-riser ip-tgt rp-riser rp-tgt; do : > "$work/$f.txt"; done
for i in $(seq "$rounds"); do
  # The order rotates every round: no client or target always goes first.
  runs=("ip riser" "ip tgt" "rp riser" "rp tgt")
  for k in 0 1 2 3; do
    read -r client target <<<"${runs[$(( (k + i - 1) % 4 ))]}"
    u=$riser_url; [ "$target" = tgt ] && u=$tgt_url
    if [ "$client" = ip ]; then v=$(iperf "$u"); name=iscsi-perf; else v=$(rperf "$u"); name=riser-perf; fi
    printf 'round %d %-10s -> %-5s %8s IOPS\n' "$i" "$name" "$target" "${v:-0}"
    echo "${v:-0}" >> "$work/$client-$target.txt"
  done
done
ipr=$(median < "$work/ip-riser.txt"); ipt=$(median < "$work/ip-tgt.txt")
rpr=$(median < "$work/rp-riser.txt"); rpt=$(median < "$work/rp-tgt.txt")
echo "iSCSI/TCP 4 KiB randread QD32 null LUN, medians of $rounds x ${secs}s:"
echo "  iscsi-perf: riser ${ipr} IOPS, tgt ${ipt} IOPS, ratio $(ratio "$ipr" "$ipt")x (aim >= 1.5x)"
echo "  riser-perf: riser ${rpr} IOPS, tgt ${rpt} IOPS, ratio $(ratio "$rpr" "$rpt")x"
echo "  clients against tgt:   iscsi-perf ${ipt} IOPS, riser-perf (1 thread) ${rpt} IOPS, riser-perf/iscsi-perf $(ratio "$rpt" "$ipt")x (aim >= 1.0x)"
echo "  clients against riser: iscsi-perf ${ipr} IOPS, riser-perf (1 thread) ${rpr} IOPS, riser-perf/iscsi-perf $(ratio "$rpr" "$ipr")x"
