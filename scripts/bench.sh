#!/usr/bin/env bash
# `make bench`: prints figures (never pass/fail). Each benchmark says what it measures.
# About 20 minutes, plus SPDK's build (about 10 minutes, once). BENCH_TIME / BENCH_ROUNDS set
# the seconds per run and the rounds of every part (defaults: bdev 5 s; peers 5 s x 3; matrix
# 3 s x 2, also MATRIX_TIME / MATRIX_ROUNDS); BENCH_PEERS (default "spdk,spdk-uring,tgt": SPDK with its
# posix and its io_uring sockets, the ratios against the better one) picks the peers riser is
# measured against (the matrix needs tgt); BENCH_QDS (default "16 32 64") the queue depths of
# the 4 KiB random runs on the null LUN. Tables and JSON go under target/bench/
# (BENCH_OUT=DIR: DIR/peers and DIR/matrix instead).
set -euo pipefail
cd "$(dirname "$0")/.."
perf=${CARGO_TARGET_DIR:-target}/release/riser-perf
time=${BENCH_TIME:-5}
peers=${BENCH_PEERS-spdk,spdk-uring,tgt}
export BENCH_PEERS=$peers

# SPDK's iscsi_tgt first (built once, then cached), so a failed build stops everything early.
if [[ ",${peers// /}," == *",spdk"* ]]; then
  scripts/bench-spdk.sh
fi

echo "== cost: riser's instructions per I/O under callgrind (in process, in-memory datamover, null LUN, QD 32; the machine's load does not move them) =="
scripts/bench-cost.sh
echo

echo "== bdev: in-process, 4 KiB random read, QD 128, one reactor (aim: >= 5 M IOPS per core on null) =="
for dev in null malloc; do
  echo "-- $dev"
  $perf bdev --bdev "$dev" --size-mib 1024 --bs 4096 --qd 128 --rw randread --time "$time" -m 0x1
done

echo
echo "== iSCSI over TCP: riser vs peers (${peers:-none}), each alone on core 0: 4 KiB random read/write QD ${BENCH_QDS-16 32 64} (riser-perf: 2 sessions x QD), 128 KiB sequential read/write, iscsi-perf and riser-perf, IOPS and busy time per I/O (aims: riser >= 1.2x SPDK IOPS, <= 0.7x its busy time per I/O, against SPDK's better socket implementation) =="
BENCH_QDS=${BENCH_QDS-16 32 64} BENCH_OUT=${BENCH_OUT:+$BENCH_OUT/peers} scripts/bench-peers.sh

echo
echo "== iSCSI over TCP on a 1 GiB file LUN: riser (bdev_uring) vs peers (${peers:-none}: SPDK bdev_aio, tgt rdwr), all O_DIRECT, each alone on core 0 (aim: riser >= 1.2x SPDK) =="
BENCH_LUN=file BENCH_OUT=${BENCH_OUT:+$BENCH_OUT/peers-file} scripts/bench-peers.sh

echo
if [[ ",${peers// /}," == *",tgt,"* ]]; then
  echo "== iSCSI over TCP: the riser-perf matrix, riser vs tgt (4 KiB random read/write QD 1/32/128, 128 KiB sequential read/write) =="
  BENCH_OUT=${BENCH_OUT:+$BENCH_OUT/matrix} scripts/bench-perf-matrix.sh
else
  echo "== the riser-perf matrix (riser vs tgt) is left out: BENCH_PEERS=\"$peers\" has no tgt =="
fi
