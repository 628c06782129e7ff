#!/usr/bin/env bash
# `make bench-rxe`: riser's iSER target against the Linux kernel's (LIO + ib_isert), in the
# soft-RoCE VM (scripts/rxe-vm.sh; TCG, so only the ratio between targets in the same VM means
# anything). Client: Linux ib_iser + fio (libaio, O_DIRECT) on the resulting /dev/sdX; 4 KiB
# random read QD 32, 4 KiB random write QD 32, 128 KiB sequential read QD 8; riser in busy
# (pinned) and adaptive poll modes, LIO on a ramdisk (rd_mcp) of the same size, alternated.
# Prints every run and a final table with the ratio riser/LIO. Aim: riser >= 1.5x LIO.
# A benchmark, not a test: it fails only when something breaks.
#
# Environment:
#   BENCH_TIME      seconds per run, after a 2 s ramp (default 10)
#   BENCH_ROUNDS    rounds of riser-MODE, LIO for each mode (default 2)
#   BENCH_MODES     riser's poll modes (default "busy adaptive")
#   BENCH_SIZE_MIB  LUN size, both targets (default 256)
#   BENCH_FIO_CPUS  fio's --cpus_allowed (default 0, away from riser's reactor on the last
#                   vCPU; set but empty: fio not pinned)
#   RISER_BIN_DIR   default target/release when riser is built there, else target/debug
#   RISER_VM_SMP    vCPUs (default 2: busy polling takes one of its own)
#   RISER_VM_OUT    where bench-results.txt, bench-table.txt and logs-bench-rxe/ are left
#                   (default a new directory under /tmp, printed at the end)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${RISER_BIN_DIR:-}" ]; then
  if [ -x target/release/riser ] && [ -x target/release/riser-rpc ]; then RISER_BIN_DIR=$PWD/target/release
  else RISER_BIN_DIR=$PWD/target/debug; fi
fi
for b in riser riser-rpc; do
  [ -x "$RISER_BIN_DIR/$b" ] || { echo "bench-rxe: $RISER_BIN_DIR/$b missing: cargo build --release -p riser -p riser-rpc-cli" >&2; exit 1; }
done
export RISER_BIN_DIR
export RISER_VM_SMP=${RISER_VM_SMP:-2}
export RISER_VM_OUT=${RISER_VM_OUT:-$(mktemp -d /tmp/riser-bench-rxe.XXXXXX)}
# Each round is about 3 x (BENCH_TIME + 4) s plus a login; leave room for the boot.
rounds=${BENCH_ROUNDS:-2}
nmodes=$(wc -w <<<"${BENCH_MODES:-busy adaptive}")
export RISER_VM_TIMEOUT=${RISER_VM_TIMEOUT:-$((300 + rounds * nmodes * 2 * (3 * (${BENCH_TIME:-10} + 15) + 40)))}
# rxe-vm.sh passes RISER_* variables only: hand the BENCH_* ones over through the job.
for v in BENCH_TIME BENCH_ROUNDS BENCH_MODES BENCH_SIZE_MIB BENCH_FIO_CPUS; do
  if [ -n "${!v+set}" ]; then export "RISER_$v=${!v}"; fi
done

echo "bench-rxe: riser from $RISER_BIN_DIR, ${RISER_VM_SMP} vCPUs, results in $RISER_VM_OUT"
rc=0
scripts/rxe-vm.sh run scripts/vm/bench-rxe.sh || rc=$?
echo
if [ -s "$RISER_VM_OUT/bench-results.txt" ]; then
  echo "== runs (target workload IOPS KiB/s guest-CPU-busy% riser-CPU%-of-a-vCPU) =="
  cat "$RISER_VM_OUT/bench-results.txt"
fi
[ -s "$RISER_VM_OUT/bench-table.txt" ] && cat "$RISER_VM_OUT/bench-table.txt"
echo "bench-rxe: results in $RISER_VM_OUT"
exit "$rc"
