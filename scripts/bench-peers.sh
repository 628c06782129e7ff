#!/usr/bin/env bash
# iSCSI over TCP, riser against its peers: SPDK v24.01's iscsi_tgt (built once by
# ../shared/peers/spdk/build.sh into SPDK_PREFIX, default /opt/spdk-peer/spdk) and tgt (Debian's
# user-space target). Every target serves a null LUN (512-byte blocks) on 127.0.0.1 and runs
# ALONE (one target process alive at a time: a busy-polling target steals the core of whatever
# runs beside it), pinned to core 0; the clients run on core 1. Each round starts and stops every
# target in turn (the order rotates round by round) and drives it with both clients:
#   libiscsi's iscsi-perf (one session; it only reads, so it runs the two read workloads) and
#   riser-perf (one client thread, 2 sessions, the QD below per session),
# over 4 KiB random read and write at QD 32 and 128 KiB sequential read and write at QD
# BENCH_SEQ_QD (default 8). Around every run it samples the target's CPU cost: the reactor busy
# time of framework_get_reactors (riser: ns; SPDK: ticks at its reply's tick_rate) or, for tgt
# (event-driven, no such counter), the utime+stime of tgtd from /proc; divided by the I/Os the
# client completed, it is the busy time per I/O.
# Prints each run, then a table of medians with riser/SPDK and riser/tgt ratios (aims: riser >=
# 1.2x SPDK's IOPS, busy time per I/O <= 0.7x SPDK's), saved with a JSON version and every run
# (runs.tsv) in BENCH_OUT (default target/bench/peers-DATE). A benchmark: figures, no asserts;
# it exits non-zero when something is missing or a run fails.
#
# BENCH_LUN=file serves a file instead (BENCH_FILE, default a 1 GiB file written once under
# target/bench/, on this machine's disk, not tmpfs): riser's bdev_uring_create, SPDK's
# bdev_aio_create (both O_DIRECT), tgt's rdwr backing store with bsoflags=direct.
#
# Environment: BENCH_TIME (seconds per run, default 5), BENCH_ROUNDS (default 3), BENCH_PEERS
# (comma-separated, default "spdk,tgt"; riser always runs; "spdk-uring" is SPDK again with its
# io_uring socket implementation, sock_set_default_impl -i uring, beside "spdk" = posix: the
# ratios then compare riser with the better of the two for each workload), BENCH_SEQ_QD, BENCH_OUT, BENCH_LUN,
# BENCH_FILE, BENCH_QDS (riser-perf's 4 KiB random workloads at more queue depths per session,
# e.g. "16 32 64": each becomes a workload of its own, randread-4k-qd16...; default only 32),
# SPDK_PREFIX, SPDK_PEER_DIR (default ../shared/peers/spdk: build.sh and start.sh).
# About ROUNDS x (1 + peers) x (6 x (TIME + 2) + 5) seconds: 4 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_TIME:-5}
rounds=${BENCH_ROUNDS:-3}
seq_qd=${BENCH_SEQ_QD:-8}
peers_csv=${BENCH_PEERS-spdk,tgt}
lun_kind=${BENCH_LUN:-null}
out=${BENCH_OUT:-target/bench/peers-$(date +%Y%m%d-%H%M%S)}
export SPDK_PREFIX=${SPDK_PREFIX:-/opt/spdk-peer/spdk}
spdk_dir=${SPDK_PEER_DIR:-../shared/peers/spdk}
riser=${CARGO_TARGET_DIR:-target}/release/riser
perf=${CARGO_TARGET_DIR:-target}/release/riser-perf
riser_port=3266
spdk_port=3267
tgt_port=3268
tgt_ctl=3268
die() { echo "bench-peers: $*" >&2; exit 1; }

# --- what is needed, checked before anything runs ---------------------------------------
targets=(riser)
IFS=',' read -r -a want <<<"$peers_csv"
for p in "${want[@]}"; do
  p=${p// /}
  case "$p" in
    spdk|spdk-uring|tgt) [[ " ${targets[*]} " == *" $p "* ]] || targets+=("$p") ;;
    riser|"") ;;
    *) die "BENCH_PEERS: unknown peer '$p' (spdk, spdk-uring, tgt)" ;;
  esac
done
case "$lun_kind" in
  null) ;;
  file)
    lun_file=${BENCH_FILE:-target/bench/lun-1g.img}
    if [ ! -f "$lun_file" ]; then
      mkdir -p "$(dirname "$lun_file")"
      echo "bench-peers: writing $lun_file (1 GiB, once)" >&2
      dd if=/dev/zero of="$lun_file.tmp" bs=1M count=1024 oflag=direct status=none || die "cannot write $lun_file"
      mv "$lun_file.tmp" "$lun_file"
    fi
    lun_file=$(realpath "$lun_file")
    lun_blocks=$(( $(stat -c %s "$lun_file") / 512 ))
    ;;
  *) die "BENCH_LUN: '$lun_kind' (null or file)" ;;
esac
for b in "$riser" "$perf"; do [ -x "$b" ] || die "$b not built: make release"; done
command -v iscsi-perf >/dev/null || die "iscsi-perf missing (Debian libiscsi-bin): scripts/setup.sh bench"
command -v python3 >/dev/null || die "python3 missing: scripts/setup.sh bench"
command -v taskset >/dev/null || die "taskset missing (util-linux): scripts/setup.sh bench"
[ "$(nproc)" -ge 2 ] || die "needs 2 cores (target on core 0, client on core 1); this machine has $(nproc)"
if [[ " ${targets[*]} " == *" tgt "* ]]; then
  [ -x /usr/sbin/tgtd ] && command -v tgtadm >/dev/null || die "tgt missing: scripts/setup.sh bench (or BENCH_PEERS without tgt)"
  . scripts/lib-tgt.sh
fi
if [[ " ${targets[*]} " == *" spdk"* ]]; then
  [ -x "$spdk_dir/build.sh" ] && [ -x "$spdk_dir/start.sh" ] ||
    die "SPDK's build.sh/start.sh not found in $spdk_dir (set SPDK_PEER_DIR, or BENCH_PEERS without spdk)"
  SPDK_PEER_DIR=$spdk_dir scripts/bench-spdk.sh || die "SPDK's iscsi_tgt is not available (see above)"
  [ -x "$SPDK_PREFIX/build/bin/iscsi_tgt" ] || die "no $SPDK_PREFIX/build/bin/iscsi_tgt after the build"
  [ -f "$SPDK_PREFIX/scripts/rpc.py" ] || die "no $SPDK_PREFIX/scripts/rpc.py"
fi
for port in $riser_port $spdk_port $tgt_port; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then die "port $port is already in use on 127.0.0.1"; fi
done

mkdir -p "$out"
work=$(mktemp -d /tmp/bench-peers.XXXXXX)
pid=        # the running target's process (riser or iscsi_tgt); tgt's is tgt_pid
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  declare -F tgt_stop >/dev/null && tgt_stop
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=lib-bench.sh
. scripts/lib-bench.sh

# The LUN's device is called Null0 and its target "null" whatever backs it (the URLs stay).
if [ "$lun_kind" = file ]; then
  riser_bdev='{"method":"bdev_uring_create","params":{"name":"Null0","filename":"'"$lun_file"'","block_size":512}}'
  spdk_bdev=(bdev_aio_create "$lun_file" Null0 512)
  tgt_bs=(--bstype rdwr --bsoflags direct --backing-store "$lun_file")
else
  riser_bdev='{"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}}'
  spdk_bdev=(bdev_null_create Null0 1024 512)
  tgt_bs=(--bstype null --backing-store /dev/null)
fi
write_riser_config

declare -A url=(
  [riser]="iscsi://127.0.0.1:$riser_port/iqn.2016-06.io.riser:null/0"
  [spdk]="iscsi://127.0.0.1:$spdk_port/iqn.2016-06.io.spdk:null/0"
  [spdk-uring]="iscsi://127.0.0.1:$spdk_port/iqn.2016-06.io.spdk:null/0"
  [tgt]="iscsi://127.0.0.1:$tgt_port/iqn.2024-01.test.peer:null/1"
)
sock=$work/target.sock

# workload | riser-perf --rw | --bs | --qd (per session) | iscsi-perf flags ("" = it cannot)
workloads=(
  "randread-4k|randread|4096|32|-r -m 32 -b 8"
  "randwrite-4k|randwrite|4096|32|"
  "read-128k|read|131072|$seq_qd|-m $seq_qd -b 256"
  "write-128k|write|131072|$seq_qd|"
)
for q in ${BENCH_QDS:-}; do
  [[ "$q" =~ ^[0-9]+$ ]] && [ "$q" -ge 1 ] && [ "$q" -le 128 ] || die "BENCH_QDS: '$q' is not a queue depth (1-128)"
  [ "$q" = 32 ] && continue
  workloads+=("randread-4k-qd$q|randread|4096|$q|" "randwrite-4k-qd$q|randwrite|4096|$q|")
done

run_client() { # CLIENT TARGET WORKLOAD-SPEC LOG -> "IOPS IOS" or nothing
  local name rw bs qd ip
  IFS='|' read -r name rw bs qd ip <<<"$3"
  if [ "$1" = iscsi-perf ]; then
    timeout $((secs + 30)) taskset -c 1 iscsi-perf -t "$secs" $ip "${url[$2]}" 2>&1 | tr '\r' '\n' >"$4" || true
    # "iops average N" over the whole run: I/Os = N x seconds.
    sed -n 's/^ *iops average \([0-9]*\).*/\1/p' "$4" | tail -1 | awk -v s="$secs" '$1 > 0 {print $1, $1 * s}'
  else
    timeout $((secs + 30)) "$perf" -m 0x2 --sessions 2 --rw "$rw" --bs "$bs" --qd "$qd" --time "$secs" --ramp 0 \
      --json "${url[$2]}" >"$4" 2>"$4.err" || { cat "$4.err" >>"$4"; rm -f "$4.err"; return 0; }
    [ -s "$4.err" ] || rm -f "$4.err"
    python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["total"]; print(t["iops"], t["ios"]) if t["ios"] > 0 else None' "$4"
  fi
}

runs=$out/runs.tsv
printf 'round\ttarget\tclient\tworkload\tiops\tios\tbusy_us_per_io\n' >"$runs"
failed=0
echo "peers: riser vs ${targets[*]:1}; each target alone on core 0, clients on core 1; $rounds round(s) x $secs s per run; files in $out"
for round in $(seq "$rounds"); do
  n=${#targets[@]}
  for k in $(seq 0 $((n - 1))); do
    t=${targets[$(( (k + round - 1) % n ))]}
    start_target "$t" "$round"
    m=0
    for w in "${workloads[@]}"; do
      for c in iscsi-perf riser-perf; do
        [ "$c" = iscsi-perf ] && [ -z "${w##*|}" ] && continue
        m=$((m + 1))
        wname=${w%%|*}
        log="$out/run.$round.$t.$c.$wname.log"
        s0=$(cost_sample "$t") || die "reading $t's busy time failed"
        res=$(run_client "$c" "$t" "$w" "$log")
        s1=$(cost_sample "$t") || die "reading $t's busy time failed (did $t die? see $out)"
        if [ -z "$res" ]; then
          printf 'round %d %-10s %-10s %-16s FAILED (see %s)\n' "$round" "$t" "$c" "$wname" "$log"
          failed=$((failed + 1))
          continue
        fi
        read -r iops ios <<<"$res"
        busy=$(awk -v a="${s0% *}" -v b="${s1% *}" -v hz="${s1#* }" -v n="$ios" 'BEGIN {printf "%.3f", (b - a) / hz * 1e6 / n}')
        printf 'round %d %-10s %-10s %-16s %9.0f IOPS  %8s us busy/IO\n' "$round" "$t" "$c" "$wname" "$iops" "$busy"
        printf '%d\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$t" "$c" "$wname" "$iops" "$ios" "$busy" >>"$runs"
      done
    done
    stop_target "$t" "$round"
  done
done

python3 - "$runs" "$out" "$secs" "$rounds" "$seq_qd" "$lun_kind" <<'PY'
import csv, json, statistics, sys
runs, out, secs, rounds, seq_qd = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lun_kind = sys.argv[6]
lun_text = "null LUNs" if lun_kind == "null" else "a 1 GiB file LUN (riser bdev_uring, SPDK bdev_aio, tgt rdwr, all O_DIRECT)"
rows = list(csv.DictReader(open(runs), delimiter="\t"))
targets = [t for t in ("riser", "spdk", "spdk-uring", "tgt") if any(r["target"] == t for r in rows)]
spdks = [t for t in targets if t.startswith("spdk")]
wl = {"randread-4k": "4 KiB random read QD 32", "randwrite-4k": "4 KiB random write QD 32",
      "read-128k": f"128 KiB sequential read QD {seq_qd}", "write-128k": f"128 KiB sequential write QD {seq_qd}"}
for w in sorted({r["workload"] for r in rows if "-qd" in r["workload"]}, key=lambda w: (w.split("-")[0], int(w.rsplit("qd", 1)[1]))):
    q = w.rsplit("qd", 1)[1]
    wl[w] = f"4 KiB random {'read' if w.startswith('randread') else 'write'} QD {q}"
AIM_IOPS, AIM_BUSY = 1.2, 0.7
def med(t, c, w, k):
    v = [float(r[k]) for r in rows if (r["target"], r["client"], r["workload"]) == (t, c, w)]
    return statistics.median(v) if v else None
def ratio(a, b): return a / b if a is not None and b else None
cases = []
for w in wl:
    for c in ("iscsi-perf", "riser-perf"):
        if not any(r["workload"] == w and r["client"] == c for r in rows): continue
        e = {"workload": w, "description": wl[w], "client": c, "targets": {}}
        for t in targets:
            e["targets"][t] = {"iops": med(t, c, w, "iops"), "busy_us_per_io": med(t, c, w, "busy_us_per_io"),
                               "runs": sum(1 for r in rows if (r["target"], r["client"], r["workload"]) == (t, c, w))}
        R = e["targets"].get("riser", {})
        # SPDK's better socket implementation for this workload (the higher IOPS).
        got = [t for t in spdks if e["targets"][t]["iops"] is not None]
        if got:
            best = max(got, key=lambda t: e["targets"][t]["iops"])
            e["spdk_best"] = best
            e["targets"]["spdk_best"] = e["targets"][best]
        for p in ("spdk_best", "tgt"):
            if p in e["targets"]:
                P = e["targets"][p]
                e[f"riser_over_{p}"] = {"iops": ratio(R.get("iops"), P["iops"]),
                                        "busy_us_per_io": ratio(R.get("busy_us_per_io"), P["busy_us_per_io"])}
        cases.append(e)
def f(v, spec): return "-" if v is None else format(v, spec)
def mark(v, ok): return "" if v is None else (" ok" if ok(v) else " MISS")
head = ["workload", "client"]
for t in targets: head += [f"{t} IOPS", f"{t} us/IO"]
if spdks: head += ["riser/SPDK IOPS (aim>=1.2)", "riser/SPDK us/IO (aim<=0.7)"] + (["SPDK best"] if len(spdks) > 1 else [])
if "tgt" in targets: head += ["riser/tgt IOPS", "riser/tgt us/IO"]
table = []
for e in cases:
    row = [e["workload"], e["client"]]
    for t in targets:
        row += [f(e["targets"][t]["iops"], ".0f"), f(e["targets"][t]["busy_us_per_io"], ".2f")]
    if spdks:
        o = e.get("riser_over_spdk_best", {"iops": None, "busy_us_per_io": None})
        a, b = o["iops"], o["busy_us_per_io"]
        row += [f(a, ".2f") + "x" + mark(a, lambda v: v >= AIM_IOPS), f(b, ".2f") + "x" + mark(b, lambda v: v <= AIM_BUSY)]
        if len(spdks) > 1:
            row += [e.get("spdk_best", "-")]
    if "tgt" in targets:
        row += [f(e["riser_over_tgt"]["iops"], ".2f") + "x", f(e["riser_over_tgt"]["busy_us_per_io"], ".2f") + "x"]
    table.append(row)
wid = [max(len(str(x)) for x in col) for col in zip(head, *table)]
line = lambda r: "  ".join(str(x).rjust(w) if i >= 2 else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, wid)))
text = [f"iSCSI/TCP, {lun_text}, each target alone on core 0, clients on core 1; medians of {rounds} round(s) x {secs} s.",
        "us/IO = target busy time per I/O: reactor busy delta of framework_get_reactors (riser, SPDK);",
        "for tgt, tgtd's CPU time (utime+stime), it has no busy counter. iscsi-perf only reads; riser-perf: 2 sessions, QD per session.",
        "Aims: riser >= 1.2x SPDK's IOPS and <= 0.7x SPDK's busy time per I/O (ok / MISS)"
        + (", against the better of SPDK's posix (spdk) and io_uring (spdk-uring) sockets per workload." if len(spdks) > 1 else "."),
        line(head), line(["-" * w for w in wid])] + [line(r) for r in table]
print("\n".join(text))
open(f"{out}/table.txt", "w").write("\n".join(text) + "\n")
json.dump({"time_s": secs, "rounds": rounds, "lun": lun_kind, "aims": {"riser_over_spdk_iops_min": AIM_IOPS, "riser_over_spdk_busy_per_io_max": AIM_BUSY},
           "busy_units": "microseconds of target busy time per I/O (tgt: process CPU time)",
           "cases": cases, "runs": rows}, open(f"{out}/summary.json", "w"), indent=2)
print(f"saved: {out}/table.txt, {out}/summary.json, {runs}")
PY
[ "$failed" -eq 0 ] || die "$failed run(s) failed: see the FAILED lines above"
