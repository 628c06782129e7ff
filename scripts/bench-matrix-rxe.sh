#!/usr/bin/env bash
# The riser-perf benchmark matrix over iSER, in the soft-RoCE VM (second half of `make
# bench-rxe`): riser against the kernel's iSER target (LIO + ib_isert), both measured with
# riser-perf's own iSER initiator (iser://), 4 KiB random read and write at QD 1, 32 and 128,
# 128 KiB sequential read and write at QD 8, alternated case by case (scripts/vm/bench-matrix-rxe.sh
# does the runs in the guest). Then, on the host, `riser-perf chart` prints one table of
# medians with riser/LIO ratios and saves the medians (summary.json) and the chart
# (matrix.svg) next to every run's report (results.json, runs/). TCG VM: only the ratios
# between the targets measured in the same VM mean anything. A benchmark, not a test: it
# fails only when something breaks.
#
# Environment:
#   RISER_MATRIX_TIME     seconds measured per run (default 3), after RISER_MATRIX_RAMP (default 1)
#   RISER_MATRIX_ROUNDS   rounds of the whole matrix (default 1; the order flips every round)
#   RISER_MATRIX_MODE     riser's poll mode, adaptive (default) or busy (reactor on the last vCPU)
#   RISER_MATRIX_CLIENT_MODE riser-perf's --poll-mode, adaptive (default) or busy (the client
#                         spins: at QD 1 no response has to wake it across vCPUs)
#   RISER_MATRIX_CASES    only the cases whose name matches this regular expression (e.g. 'qd1$')
#   RISER_MATRIX_SEQ_QD   QD of the 128 KiB cases (default 8)
#   RISER_MATRIX_SIZE_MIB LUN size, both targets (default 256)
#   RISER_BIN_DIR         default target/release when riser, riser-rpc and riser-perf are
#                         built there, else target/debug
#   RISER_VM_SMP          vCPUs (default 2: riser's reactor on one, riser-perf on the other)
#   BENCH_OUT             where the files go (default target/bench/matrix-rxe-DATE)
#   RISER_VM_OUT          the VM's results share (default a new directory under /tmp, copied
#                         to BENCH_OUT and removed; the repo's own tree is read-only in the guest)
set -euo pipefail
cd "$(dirname "$0")/.."

bins=(riser riser-rpc riser-perf)
if [ -z "${RISER_BIN_DIR:-}" ]; then
  RISER_BIN_DIR=$PWD/target/release
  for b in "${bins[@]}"; do [ -x "target/release/$b" ] || RISER_BIN_DIR=$PWD/target/debug; done
fi
for b in "${bins[@]}"; do
  [ -x "$RISER_BIN_DIR/$b" ] || { echo "bench-matrix-rxe: $RISER_BIN_DIR/$b missing: cargo build --release -p riser -p riser-rpc-cli -p riser-perf" >&2; exit 1; }
done
export RISER_BIN_DIR
export RISER_VM_SMP=${RISER_VM_SMP:-2}
out=${BENCH_OUT:-target/bench/matrix-rxe-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
own_vm_out=0
[ -n "${RISER_VM_OUT:-}" ] || { RISER_VM_OUT=$(mktemp -d /tmp/riser-bench-matrix.XXXXXX); own_vm_out=1; }
export RISER_VM_OUT
secs=${RISER_MATRIX_TIME:-3}
ramp=${RISER_MATRIX_RAMP:-1}
rounds=${RISER_MATRIX_ROUNDS:-1}
mode=${RISER_MATRIX_MODE:-adaptive}
# 8 cases x 2 targets per round, each run TIME + RAMP plus a login, and riser's start and stop
# around its own runs; leave room for the boot.
export RISER_VM_TIMEOUT=${RISER_VM_TIMEOUT:-$((300 + rounds * 16 * (secs + ramp + 30)))}

echo "bench-matrix-rxe: binaries from $RISER_BIN_DIR, ${RISER_VM_SMP} vCPUs, results in $out (waiting for /tmp/riser-vm.lock if another VM runs)"
rc=0
flock /tmp/riser-vm.lock scripts/rxe-vm.sh run scripts/vm/bench-matrix-rxe.sh || rc=$?
cp -r "$RISER_VM_OUT"/. "$out"/ 2>/dev/null || true
[ "$own_vm_out" = 0 ] || rm -rf "$RISER_VM_OUT"
echo
# A guest script that stopped half-way left the array open: close it so the runs done count.
if [ -s "$out/results.json" ] && ! jq -e . "$out/results.json" >/dev/null 2>&1 \
    && [ "$(tail -c 2 "$out/results.json")" = "}" ]; then
  echo "]" >>"$out/results.json"
fi
if [ -s "$out/results.json" ] && jq -e 'length > 0' "$out/results.json" >/dev/null 2>&1; then
  echo "== riser-perf matrix, iSER over soft-RoCE (TCG VM, $RISER_VM_SMP vCPUs), malloc vs rd_mcp LUNs, medians of $rounds round(s) of $secs s; ratio = riser / LIO (IOPS: higher is better; p99: lower is better); CPU/IO = riser-perf's own CPU us per I/O =="
  "$RISER_BIN_DIR/riser-perf" chart "$out/results.json" -o "$out/matrix.svg" \
    --summary "$out/summary.json" \
    --title "riser ($mode) vs LIO/isert over iSER, soft-RoCE VM (riser-perf iser://, 1 client thread, medians of $rounds x $secs s)" \
    || rc=$?
  echo "saved: $out/results.json, $out/summary.json, $out/matrix.svg (each run under $out/runs/)"
else
  echo "bench-matrix-rxe: no results in $out/results.json" >&2
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
