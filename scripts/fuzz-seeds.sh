#!/usr/bin/env bash
# Seed corpora for the fuzz targets (test/fuzz/) from real iSCSI traffic:
#   scripts/fuzz-seeds.sh [CORPUS_DIR]        (default: test/fuzz/corpus)
# Starts a riser of its own (debug build, adaptive polling, free ports, its own RPC socket;
# nothing else on the machine is touched) with four targets: no authentication, CHAP,
# mutual CHAP, and digests required. Every connection goes through a recording proxy
# (scripts/fuzz-seeds.py proxy) while libiscsi's tools run: discovery (iscsi-ls), iscsi-inq,
# a set of compliance families (iscsi-test-cu), CHAP one-way and mutual with right and wrong
# secrets, discovery with CHAP; and riser-perf with digests and with SHA-256 / SHA3-256 CHAP.
# The recorded streams are then cut into whole PDUs and written in each target's input
# layout (scripts/fuzz-seeds.py split), deduplicated by content hash: re-running adds seeds,
# it never removes any. A few minutes. Needs libiscsi-bin and python3. FUZZ_SEEDS_NO_BUILD=1
# skips the build and uses the binaries in target/debug as they are.
# The Linux initiator's traffic (scripts/rxe-vm.sh) is not captured here.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
corpus=$(realpath -m "${1:-test/fuzz/corpus}")
command -v iscsi-test-cu >/dev/null || { echo "libiscsi-bin missing: apt-get install libiscsi-bin" >&2; exit 2; }

[ -n "${FUZZ_SEEDS_NO_BUILD:-}" ] || cargo build -q -p riser -p riser-rpc-cli -p riser-perf
work=$(mktemp -d /tmp/fuzz-seeds.XXXXXX)
# A copy, so that a build running meanwhile does not swap them mid-capture.
bin=$work/bin
mkdir -p "$bin"
cp "$root"/target/debug/{riser,riser-rpc,riser-perf} "$bin/"
# FUZZ_SEEDS_REC=DIR keeps the recorded streams there (fuzz-seeds.py split DIR CORPUS re-cuts them).
rec=${FUZZ_SEEDS_REC:-$work/rec}
sock=$work/rpc.sock
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
tport=$(free_port)
pport=$(free_port)
while [ "$pport" = "$tport" ]; do pport=$(free_port); done
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/riser.json" <<EOF
{"subsystems": [
  {"subsystem": "bdev", "config": [
    {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 131072, "block_size": 512}},
    {"method": "bdev_malloc_create", "params": {"name": "Malloc1", "num_blocks": 16384, "block_size": 4096}},
    {"method": "bdev_malloc_create", "params": {"name": "Malloc2", "num_blocks": 16384, "block_size": 512}},
    {"method": "bdev_malloc_create", "params": {"name": "Malloc3", "num_blocks": 16384, "block_size": 512}},
    {"method": "bdev_malloc_create", "params": {"name": "Malloc4", "num_blocks": 4096, "block_size": 4096}}]},
  {"subsystem": "iscsi", "config": [
    {"method": "iscsi_create_portal_group", "params": {"tag": 1, "portals": [{"host": "127.0.0.1", "port": "$tport"}]}},
    {"method": "iscsi_create_initiator_group", "params": {"tag": 1, "initiators": ["ANY"], "netmasks": ["ANY"]}}]}
]}
EOF
"$bin/riser" --json "$work/riser.json" -r "$sock" --poll-mode adaptive --no-pin --log-level warn \
  > "$work/riser.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
rpc() { "$bin/riser-rpc" -s "$sock" "$@" >/dev/null; }
rpc iscsi_create_auth_group 1 -c 'user:alice secret:alice-secret-1 muser:riser msecret:riser-secret-2,user:bob secret:bob-secret-345'
rpc iscsi_create_target_node disk1 "no auth" "Malloc0:0 Malloc1:1" "1:1" 64 -d
rpc iscsi_create_target_node disk2 "chap" "Malloc2:0" "1:1" 64 -r -g 1
rpc iscsi_create_target_node disk3 "mutual chap" "Malloc3:0" "1:1" 64 -r -m -g 1
rpc iscsi_create_target_node disk4 "digests" "Malloc4:0" "1:1" 64 -d -H -D

python3 scripts/fuzz-seeds.py proxy "$pport" "$tport" "$rec" &
pids+=($!)
sleep 0.5

iqn=iqn.2016-06.io.riser
url=iscsi://127.0.0.1:$pport
quiet() { timeout 120 "$@" >/dev/null 2>&1 || true; }

echo "capturing: discovery, inquiry"
quiet iscsi-ls -s "$url"
quiet iscsi-inq "$url/$iqn:disk1/0"
quiet iscsi-inq -e 1 -c 0x83 "$url/$iqn:disk1/0"
quiet iscsi-inq -e 1 -c 0xb0 "$url/$iqn:disk1/1"
quiet iscsi-readcapacity16 "$url/$iqn:disk4/0"

echo "capturing: compliance families (iscsi-test-cu)"
for t in Inquiry TestUnitReady ReadCapacity10 ReadCapacity16 Read6 Read10 Read16 Write10 Write16 \
         WriteVerify16 Verify16 CompareAndWrite OrWrite WriteSame10 WriteSame16 Unmap GetLBAStatus \
         Prefetch10 ModeSense6 ReportSupportedOpcodes ProutRegister ProutReserve PrinReadKeys \
         PrinReportCapabilities Reserve6 PreventAllow StartStopUnit ExtendedCopy ReceiveCopyResults \
         WriteAtomic16 iSCSIcmdsn iSCSIdatasn iSCSIResiduals iSCSITMF; do
  quiet iscsi-test-cu --dataloss -s -i iqn.2024-01.test:init1 -I iqn.2024-01.test:init2 \
    -t "ALL.$t" "$url/$iqn:disk1/0"
done
quiet iscsi-test-cu --dataloss --allow-sanitize -s -t ALL.Sanitize "$url/$iqn:disk1/1"
quiet iscsi-test-cu -s -t ALL.Read10 "$url/$iqn:disk4/0"
quiet iscsi-test-cu --dataloss -s -t ALL.Write10 "$url/$iqn:disk4/0"

echo "capturing: CHAP"
quiet iscsi-inq "iscsi://alice%alice-secret-1@127.0.0.1:$pport/$iqn:disk2/0"
quiet iscsi-inq "iscsi://bob%bob-secret-345@127.0.0.1:$pport/$iqn:disk2/0"
quiet iscsi-inq "iscsi://alice%wrong-secret@127.0.0.1:$pport/$iqn:disk2/0"
quiet iscsi-inq "iscsi://nobody%alice-secret-1@127.0.0.1:$pport/$iqn:disk2/0"
quiet iscsi-inq "$url/$iqn:disk2/0"
quiet iscsi-inq "iscsi://alice%alice-secret-1@127.0.0.1:$pport/$iqn:disk3/0?target_user=riser&target_password=riser-secret-2"
quiet iscsi-inq "iscsi://alice%alice-secret-1@127.0.0.1:$pport/$iqn:disk3/0?target_user=riser&target_password=wrong"
quiet iscsi-test-cu -s -t ALL.TestUnitReady "iscsi://alice%alice-secret-1@127.0.0.1:$pport/$iqn:disk2/0"

echo "capturing: riser-perf (digests, CHAP with SHA-256 and SHA3-256)"
perf() { quiet "$bin/riser-perf" --time 1 --ramp 0 --qd 4 "$@"; }
perf --rw randrw --digest both "$url/$iqn:disk1/0"
perf --rw randread --digest both --bs 65536 "$url/$iqn:disk4/0"
perf --rw randwrite --digest header --bs 512 "$url/$iqn:disk1/0"
perf --rw randwrite --digest data --bs 8192 "$url/$iqn:disk1/1"
perf --rw randwrite --chap alice:alice-secret-1 "$url/$iqn:disk2/0"
perf --rw randread --chap alice:alice-secret-1 --chap-mutual riser:riser-secret-2 --chap-digest sha3-256 "$url/$iqn:disk3/0"
perf --rw randread --chap alice:alice-secret-1 --chap-digest sha1,md5 "$url/$iqn:disk3/0"

echo "capturing: discovery with CHAP"
rpc iscsi_set_discovery_auth -r -m -g 1
quiet iscsi-ls "$url"
quiet iscsi-ls "iscsi://alice%alice-secret-1@127.0.0.1:$pport"
quiet iscsi-ls "iscsi://alice%alice-secret-1@127.0.0.1:$pport?target_user=riser&target_password=riser-secret-2"

for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()
echo "$(ls "$rec" | grep -c i2t) connections recorded; seeds into $corpus:"
python3 scripts/fuzz-seeds.py split "$rec" "$corpus"
