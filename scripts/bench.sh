#!/usr/bin/env bash
# `make bench`: prints figures (never pass/fail). Each benchmark says what it measures.
# A few minutes in all. BENCH_TIME / BENCH_ROUNDS set the seconds per run and the rounds of
# every part (defaults: bdev 5 s; iscsi 5 s x 3; matrix 3 s x 2, also MATRIX_TIME /
# MATRIX_ROUNDS); BENCH_OUT is where the matrix's JSON and chart go.
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
echo "== iSCSI over TCP: riser vs tgt, 4 KiB random read, QD 32, null LUN, iscsi-perf and riser-perf (aims: riser >= 1.5x tgt; riser-perf >= iscsi-perf against tgt) =="
scripts/bench-iscsi.sh

echo
echo "== iSCSI over TCP: the riser-perf matrix, riser vs tgt (4 KiB random read/write QD 1/32/128, 128 KiB sequential read/write) =="
scripts/bench-perf-matrix.sh
