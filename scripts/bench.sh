#!/usr/bin/env bash
# `make bench`: prints figures (never pass/fail). Each benchmark says what it measures.
set -euo pipefail
cd "$(dirname "$0")/.."
perf=./target/release/riser-perf
time=${BENCH_TIME:-5}

echo "== bdev: in-process, 4 KiB random read, QD 128, one reactor (aim: >= 5 M IOPS per core on null) =="
for dev in null malloc; do
  echo "-- $dev"
  $perf bdev --bdev "$dev" --size-mib 1024 --bs 4096 --qd 128 --rw randread --time "$time" -m 0x1
done

echo
echo "== iSCSI over TCP: riser vs tgt, 4 KiB random read, QD 32, null LUN, iscsi-perf (aim: riser >= 1.5x tgt) =="
scripts/bench-iscsi.sh
