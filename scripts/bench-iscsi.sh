#!/usr/bin/env bash
# iSCSI over TCP: 4 KiB random read, QD 32, null LUN, libiscsi's iscsi-perf as the client,
# against riser and against tgt (Debian's user-space target) set up the same way,
# alternated over ROUNDS rounds on this machine. Target pinned to core 0, client to core 1.
# Prints each run, the medians and the ratio. A benchmark: it prints figures, it asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_TIME:-10}
rounds=${BENCH_ROUNDS:-3}
riser_port=3262
tgt_port=3263
work=$(mktemp -d /tmp/bench-iscsi.XXXXXX)
riser_pid=; tgt_pid=
cleanup() {
  [ -n "$riser_pid" ] && kill "$riser_pid" 2>/dev/null || true
  if [ -n "$tgt_pid" ]; then
    tgtadm --lld iscsi --mode target --op delete --tid 1 --force >/dev/null 2>&1 || true
    tgtadm --op delete --mode system >/dev/null 2>&1 || true
    kill "$tgt_pid" 2>/dev/null || true
  fi
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
setsid taskset -c 0 /usr/sbin/tgtd -f --iscsi portal=127.0.0.1:$tgt_port >"$work/tgtd.log" 2>&1 </dev/null &
tgt_pid=$!
sleep 1
tgtadm --lld iscsi --mode target --op new --tid 1 --targetname iqn.2024-01.test.peer:null
tgtadm --lld iscsi --mode logicalunit --op new --tid 1 --lun 1 --bstype null --backing-store /dev/null
tgtadm --lld iscsi --mode target --op bind --tid 1 --initiator-address ALL

perf() { # URL -> IOPS
  timeout $((secs + 30)) taskset -c 1 iscsi-perf -t "$secs" -m 32 -b 8 -r "$1" 2>&1 | tr '\r' '\n' |
    sed -n 's/^ *iops average \([0-9]*\).*/\1/p' | tail -1
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }

: > "$work/riser.txt"; : > "$work/tgt.txt"
for i in $(seq "$rounds"); do
  r=$(perf "iscsi://127.0.0.1:$riser_port/iqn.2016-06.io.riser:null/0"); echo "round $i riser: ${r:-0} IOPS"; echo "${r:-0}" >> "$work/riser.txt"
  t=$(perf "iscsi://127.0.0.1:$tgt_port/iqn.2024-01.test.peer:null/1"); echo "round $i tgt:   ${t:-0} IOPS"; echo "${t:-0}" >> "$work/tgt.txt"
done
rm=$(median < "$work/riser.txt"); tm=$(median < "$work/tgt.txt")
echo "iSCSI/TCP 4 KiB randread QD32 null LUN (iscsi-perf, ${secs}s x $rounds): riser ${rm} IOPS, tgt ${tm} IOPS, ratio $(awk -v a="$rm" -v b="$tm" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')x (aim >= 1.5x)"
