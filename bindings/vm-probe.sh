#!/usr/bin/env bash
# riser-rdma against real verbs, inside the soft-RoCE test VM:
#
#   cargo build -p riser-rdma --examples && cargo test -p riser-rdma --no-run   # on the host
#   scripts/rxe-vm.sh run bindings/vm-probe.sh
#
# Brings up rxe0 on 192.0.2.1, runs the crate's unit tests with a device present, then
# rdma_probe: device limits, and RC loopbacks through rdma_cm (64 KiB, 1 MiB, and with the
# listener's receives on an SRQ). Prints "VM-PROBE OK" last, or "VM-PROBE FAILED: what".
set -uo pipefail

. scripts/vm/rxe-up.sh

probe=target/debug/examples/rdma_probe
[ -x "$probe" ] || { echo "VM-PROBE FAILED: $probe missing: cargo build -p riser-rdma --examples"; exit 1; }
# The newest unit-test binary of the crate (cargo names it riser_rdma-<hash>).
tests=$(ls -t target/debug/deps/riser_rdma-* 2>/dev/null | while read -r f; do
  [ -f "$f" ] && [ -x "$f" ] && { echo "$f"; break; }
done)

failed=()
run() {
  local name=$1; shift
  echo "=== $name: $*"
  timeout 300 "$@" || failed+=("$name")
}
if [ -n "$tests" ]; then
  run unit-tests "$tests" --test-threads=1
else
  echo "=== unit tests skipped: no binary (cargo test -p riser-rdma --no-run)"
fi
run probe "$probe"
run loopback-64k "$probe" --loopback "$RXE_IP" --port 7471
run loopback-1m "$probe" --loopback "$RXE_IP" --port 7472 --size 1048576
run loopback-srq "$probe" --loopback "$RXE_IP" --port 7473 --srq

if [ ${#failed[@]} -eq 0 ]; then
  echo "VM-PROBE OK"
else
  echo "----- dmesg (last 20 lines)"; dmesg | tail -n 20
  echo "VM-PROBE FAILED: ${failed[*]}"
  exit 1
fi
