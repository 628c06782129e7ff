#!/usr/bin/env bash
# Makes sure SPDK v24.01's iscsi_tgt (the peer of scripts/bench-peers.sh) is built: runs
# SPDK_PEER_DIR/build.sh (default ../shared/peers/spdk, offline, about 10 minutes on 2 cores, as
# root) once into SPDK_PREFIX (default /opt/spdk-peer/spdk, where peers.md keeps it) and does
# nothing when the binary is already there. Fails loudly when the sources or the build are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${SPDK_PREFIX:-/opt/spdk-peer/spdk}
dir=${SPDK_PEER_DIR:-../shared/peers/spdk}
die() { echo "bench-spdk: $*" >&2; exit 1; }
if [ -x "$prefix/build/bin/iscsi_tgt" ] && [ -f "$prefix/scripts/rpc.py" ]; then
  exit 0
fi
[ -x "$dir/build.sh" ] || die "SPDK's build.sh not found in $dir (set SPDK_PEER_DIR, or leave spdk out of BENCH_PEERS)"
echo "bench-spdk: building SPDK v24.01's iscsi_tgt into $prefix (once; about 10 minutes on 2 cores; log $prefix.build.log)"
mkdir -p "$(dirname "$prefix")"
if ! "$dir/build.sh" "$prefix" >"$prefix.build.log" 2>&1; then
  tail -20 "$prefix.build.log" >&2
  die "SPDK build failed: $dir/build.sh $prefix (full log $prefix.build.log)"
fi
[ -x "$prefix/build/bin/iscsi_tgt" ] || die "no $prefix/build/bin/iscsi_tgt after the build (log $prefix.build.log)"
echo "bench-spdk: built $prefix/build/bin/iscsi_tgt"
