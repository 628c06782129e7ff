#!/usr/bin/env bash
# Ceph RBD behind an iSCSI gateway (issue 15's benchmark), 4 KiB random read and write at QD
# BENCH_QD (default 32) on one image of the single-node test cluster (scripts/ceph-test-cluster.sh:
# one memstore OSD, pool size 1, data in RAM), written in full first so reads find data, then
# randomly over twice its size (the OSD's steady state, see below):
#   rbd bench         librbd itself (--io-threads QD), with riser's librbd settings
#                     (rbd_cache=false: riser caches no data): what a gateway can at best pass on
#   riser             one gateway (bdev_rbd_create), alone, its reactor on core 0, adaptive and
#                     busy polling; riser-perf (one session, QD)
#   tgt               Debian's tgt with its rbd backing store (tgt-rbd; librbd's defaults, so
#                     rbd_cache on: tgt's bsopts cannot turn it off), alone
#   riser x2          two riser gateways (portal groups 1 and 2, same image and uuid) at once,
#                     reactors on cores 0 and 1, adaptive; one riser-perf with one session per
#                     gateway (QD each), so twice the I/O outstanding of the single runs; and
#                     right after, one of the two driven alone (the ratio's denominator)
# rbd bench and riser (adaptive) on the same workload run back to back (riser's reactor sleeps
# meanwhile), and the table adds their paired ratio: the load of a shared machine swings more
# from minute to minute than the gap being measured. A second table says where a gateway I/O's
# time goes: the client's mean latency against librbd's (riser's bdev counters, submit to
# librbd -> completion collected; for rbd bench QD / IOPS), and CPU per I/O of the process that
# drives librbd (rbd; riser with all its threads) and of riser's reactor.
# A third table gives the CPU per I/O of every party (scripts/bench-rbd-cpu.py over the middle
# of each run): the OSD, mon + mgr, the process driving librbd (its reactor, librados'
# messenger, librbd's io_context_pool, the rest), riser-perf, and the whole machine's user,
# system, softirq and idle time. When $CARGO_TARGET_DIR/release/examples/rbd_qd is built (or
# RBD_QD names it), librbd through riser's binding alone (no iSCSI) runs after rbd bench too.
# Apart from rbd bench beside riser (adaptive), only one target process is alive during the
# single-gateway runs. Only riser's reactor thread
# is pinned (its -m): librados' and librbd's threads, tgtd, the client and the OSD float, as
# rbd bench's threads do (pinning a whole gateway process to one core puts librados' messenger
# threads on the core of its busy reactor, which cost riser 3-10x here). Prints a table with the
# ratios (aims: riser >= 0.9x rbd bench, >= 1.5x tgt; two gateways >= 1.6x one) and saves it,
# with every run's output, in BENCH_OUT (default target/bench/rbd-DATE). Figures, no asserts;
# non-zero exit when something is missing or a run fails. As root (the cluster, tgtd).
# The cluster, librbd's threads and the OSD share the machine with the target and the client:
# on a small machine the figures say as much about that as about the gateway.
#
# Environment: BENCH_TIME (seconds per run, default 10), BENCH_ROUNDS (default 1; the table
# shows medians), BENCH_QD, BENCH_RBD_MIB (image size, default 256), BENCH_OUT, RISER and
# RISER_PERF (the binaries, default $CARGO_TARGET_DIR/release/, else target/release/).
# About 2 minutes + ROUNDS x 12 x (BENCH_TIME + 3) seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_TIME:-10}
rounds=${BENCH_ROUNDS:-1}
qd=${BENCH_QD:-32}
mib=${BENCH_RBD_MIB:-256}
out=${BENCH_OUT:-target/bench/rbd-$(date +%Y%m%d-%H%M%S)}
riser=${RISER:-${CARGO_TARGET_DIR:-./target}/release/riser}
perf=${RISER_PERF:-${CARGO_TARGET_DIR:-./target}/release/riser-perf}
die() { echo "bench-rbd: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (the Ceph cluster, tgtd)"
scripts/setup.sh bench-rbd
for b in "$riser" "$perf"; do [ -x "$b" ] || die "$b missing: make release first"; done
[ -f /usr/lib/tgt/backing-store/bs_rbd.so ] ||
  die "tgt's rbd backing store (bs_rbd.so, package tgt-rbd) is not installed"
mkdir -p "$out"
work=$(mktemp -d /tmp/riser-bench-rbd.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
riser_port=$(free_port)
riser2_port=$(free_port)
tgt_port=$(free_port)
tgt_ctl=$((20000 + $$ % 10000))
# shellcheck source=lib-tgt.sh
. scripts/lib-tgt.sh
tgt_iqn=iqn.2024-01.test.peer:rbd

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  tgt_stop
  scripts/ceph-test-cluster.sh stop "$work/ceph" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

RPC_TIMEOUT=30
# shellcheck source=lib-bench.sh
. scripts/lib-bench.sh

# The test cluster's monitor ports are fixed: a second cluster (a running RBD test) cannot start.
(exec 3<>"/dev/tcp/127.0.0.1/${CEPH_MON_PORT:-13300}") 2>/dev/null &&
  die "127.0.0.1:${CEPH_MON_PORT:-13300} is taken: another test cluster is running (an RBD test?); try again after it"
echo "bench-rbd: starting the test cluster (about 20 s)"
CEPH_OWNER_PID=$$ scripts/ceph-test-cluster.sh start "$work/ceph" >"$out/ceph-start.log" 2>&1 ||
  die "the cluster did not start; see $out/ceph-start.log"
conf=$work/ceph/ceph.conf
keyring=$work/ceph/keyring
rbdc() { rbd -c "$conf" "$@"; }
rbdc create --image-feature layering --size "${mib}M" rbd/bench
echo "bench-rbd: writing the ${mib} MiB image in full"
rbdc bench --io-type write --io-pattern seq --io-size 4M --io-threads 4 --io-total "${mib}M" rbd/bench >"$out/prefill.log" 2>&1 ||
  die "prefill failed; see $out/prefill.log"
# The memstore OSD keeps an object as a list of buffers that every small write splits: right
# after the sequential prefill a random 4 KiB write cost the OSD about 180 us of CPU here, after
# about 1.5x the image in random writes 380-510 us (reads rise too), and there it stays. Without
# this the run that came first (rbd bench) got the cheap OSD and riser the dear one: random
# writes over twice the image bring every object to that steady state first.
echo "bench-rbd: random 4 KiB writes over twice the image (the OSD's steady state)"
rbdc bench --rbd_cache=false --io-type write --io-pattern rand --io-size 4K --io-threads "$qd" --io-total "$((2 * mib))M" rbd/bench >"$out/condition.log" 2>&1 ||
  die "conditioning failed; see $out/condition.log"

# rbd bench: KIND (read|write) LOG -> IOPS. A short run first sizes the measured one to about
# BENCH_TIME seconds (rbd bench runs for a number of bytes, not a time).
rbd_bench() {
  local rate ops
  rbdc bench --rbd_cache=false --io-type "$1" --io-pattern rand --io-size 4K --io-threads "$qd" --io-total 8M rbd/bench >"$2.calib" 2>&1 || { cat "$2.calib" >&2; return 1; }
  rate=$(sed -n 's/.*ops\/sec: *\([0-9.]*\).*/\1/p' "$2.calib" | tail -1)
  ops=$(python3 -c "print(max(2048, int(float('${rate:-1000}') * $secs)))")
  # Its CPU time (all of rbd's threads: librbd, librados) for the diagnostics, and every
  # party's over the middle of the run.
  parties_sample "$2.parties" 1 - &
  local sp=$!
  cpu_of "$2.cpu" rbd -c "$conf" bench --rbd_cache=false --io-type "$1" --io-pattern rand --io-size 4K --io-threads "$qd" --io-total $((ops * 4096)) rbd/bench >"$2" 2>&1 ||
    { cat "$2" >&2; wait "$sp"; return 1; }
  wait "$sp"
  rate=$(sed -n 's/.*ops\/sec: *\([0-9.]*\).*/\1/p' "$2" | tail -1)
  # Closed loop at QD: latency = QD / IOPS (Little's law).
  python3 -c 'import sys; q, r, c, n = int(sys.argv[1]), float(sys.argv[2]), float(open(sys.argv[3]).read()), int(sys.argv[4])
print(f"{q / r * 1e3:.2f}\t{q / r * 1e3:.2f}\t{c / n * 1e6:.0f}\t-")' "$qd" "$rate" "$2.cpu" "$ops" >"$2.diag"
  echo "$rate"
}

# FILE CMD...: runs CMD; its CPU seconds (user + system, all its threads) go to FILE.
cpu_of() {
  python3 -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[2:])
u = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write(f"{u.ru_utime + u.ru_stime}\n")
sys.exit(r.returncode)' "$@"
}

# CPU of every party (scripts/bench-rbd-cpu.py: the OSD, mon, mgr, the process driving librbd
# by thread, riser-perf, the machine) over BENCH_TIME - 2 seconds of a run that is about
# BENCH_TIME long: FILE DELAY DRIVER_PID|- (-: the rbd or rbd_qd process).
cpu_win=$((secs > 3 ? secs - 2 : 1))
parties_sample() {
  python3 scripts/bench-rbd-cpu.py "$2" "$cpu_win" "$work/ceph" "$3" "$1"
}
# ROUND SUBJECT RW IOPS FILE: the sample's CPU per I/O (us) by party, a row of parties.tsv.
parties_row() {
  python3 -c 'import json, sys
d = json.load(open(sys.argv[5])); n = max(1.0, float(sys.argv[4]) * d["secs"]); c = d["cpu"]
cols = ["ceph-osd", "ceph-mon+mgr", "driver", "driver:reactor", "driver:msgr", "driver:io_context", "driver:other", "client", "machine:user", "machine:system", "machine:softirq", "machine:idle"]
get = lambda k: c.get("ceph-mon", 0) + c.get("ceph-mgr", 0) if k == "ceph-mon+mgr" else c.get(k, 0)
print("\t".join(sys.argv[1:4] + [f"{get(k) / n * 1e6:.1f}" for k in cols]))' "$@" >>"$parties"
}

# What the gateway's I/O costs and where its time goes, from riser's own counters around a
# run: SOCK PID -> "ops latency_ns cpu_ticks reactor_ticks" (the bdev's completed I/O and
# their summed latency, submit to librbd -> completion collected by the reactor; the process's
# CPU ticks, and its reactor thread's).
riser_probe() {
  local ops lat cpu rt=0 t
  read -r ops lat < <(rpc "$1" bdev_get_iostat '{"name":"Rbd0"}' | python3 -c 'import json, sys
d = json.load(sys.stdin); b = d["bdevs"][0]
print(b["num_read_ops"] + b["num_write_ops"], (b["read_latency_ticks"] + b["write_latency_ticks"]) * 10**9 // d["tick_rate"])')
  cpu=$(awk '{print $14 + $15}' "/proc/$2/stat")
  for t in /proc/"$2"/task/*; do
    [ "$(cat "$t/comm" 2>/dev/null)" = reactor_0 ] && rt=$(awk '{print $14 + $15}' "$t/stat")
  done
  echo "$ops $lat $cpu $rt"
}

# One riser run with the diagnostics: RW LOG SOCK PID URL -> IOPS; LOG.diag gets the client's
# mean latency (ms), librbd's (ms), the process's CPU per I/O (us) and its reactor's.
riser_run() {
  local a b v
  a=$(riser_probe "$3" "$4") || return 1
  # riser-perf ramps up for 2 s, then measures BENCH_TIME seconds.
  parties_sample "$2.parties" 2.5 "$4" &
  local sp=$!
  v=$(perf_run "$1" "$2" "$5") || { wait "$sp"; return 1; }
  wait "$sp"
  b=$(riser_probe "$3" "$4") || return 1
  python3 -c 'import json, os, sys
a, b = [list(map(int, x.split())) for x in sys.argv[2:4]]
n = max(1, b[0] - a[0]); hz = os.sysconf("SC_CLK_TCK")
lat = json.load(open(sys.argv[1]))["total"]["latency"]["avg_us"] / 1e3
print(f"{lat:.2f}\t{(b[1] - a[1]) / n / 1e6:.2f}\t{(b[2] - a[2]) / hz / n * 1e6:.0f}\t{(b[3] - a[3]) / hz / n * 1e6:.0f}")' "$2" "$a" "$b" >"$2.diag"
  echo "$v"
}

# One riser gateway: NAME CORE PORT PG_TAG POLL_MODE; sets gw_pid
start_riser() {
  local sock=$work/$1.sock log=$out/$1.log
  rm -f "$sock"
  "$riser" -m "$((1 << $2))" --poll-mode "$5" -r "$sock" >"$log" 2>&1 &
  gw_pid=$!
  pids+=("$gw_pid")
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  {
    rpc "$sock" bdev_rbd_register_cluster '{"name":"c0","config_file":"'"$conf"'","key_file":"'"$keyring"'","user_id":"admin"}' &&
    rpc "$sock" bdev_rbd_create '{"name":"Rbd0","pool_name":"rbd","rbd_name":"bench","block_size":512,"cluster_name":"c0","uuid":"6c0b7a1e-15a2-4a10-9a5e-00000000be9c"}' &&
    rpc "$sock" iscsi_create_portal_group '{"tag":'"$4"',"portals":[{"host":"127.0.0.1","port":"'"$3"'"}]}' &&
    rpc "$sock" iscsi_create_initiator_group '{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}' &&
    rpc "$sock" iscsi_create_target_node '{"name":"rbd","pg_ig_maps":[{"pg_tag":'"$4"',"ig_tag":1}],"luns":[{"bdev_name":"Rbd0","lun_id":0}],"queue_depth":64,"disable_chap":true}'
  } >>"$log.rpc" 2>&1 || die "configuring riser $1 failed; see $log.rpc and $log"
  wait_port "$3" "$gw_pid" "riser $1" "$log"
}

stop_pid() {
  kill "$1" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# tgtd with the image as LUN 1, not pinned (librbd's threads need both cores).
tgt_start_rbd() { # LOGFILE
  local tgt_cpus='' tgt_bs=(--bstype rbd --backing-store rbd/bench --bsopts "conf=$conf;id=admin")
  tgt_start "$1"
}

# riser-perf (not pinned): RW LOG URL... -> IOPS (all URLs together)
perf_run() {
  local rw=$1 log=$2
  shift 2
  timeout $((secs + 60)) "$perf" --no-pin --rw "$rw" --bs 4096 --qd "$qd" --time "$secs" --ramp 2 --json "$@" >"$log" 2>"$log.err" ||
    { cat "$log.err" >&2; return 1; }
  python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["total"]; print(round(t["iops"]))' "$log"
}

url() { echo "iscsi://127.0.0.1:$1/iqn.2016-06.io.riser:rbd/0"; }
results=$out/runs.tsv
printf 'round\tsubject\tworkload\tiops\n' >"$results"
diag=$out/diag.tsv
printf 'round\tsubject\tworkload\tclient_ms\tlibrbd_ms\tcpu_us\treactor_us\n' >"$diag"
parties=$out/parties.tsv
printf 'round\tsubject\tworkload\tosd\tmon_mgr\tdriver\treactor\tmsgr\tio_context\tdriver_other\tclient\tuser\tsystem\tsoftirq\tidle\n' >"$parties"
qd_bin=${RBD_QD:-${CARGO_TARGET_DIR:-./target}/release/examples/rbd_qd}
for r in $(seq "$rounds"); do
  # rbd bench and riser (adaptive) on the same workload are neighbours in time (an adaptive
  # reactor with nothing to do sleeps while rbd bench runs): the machine's load swings from
  # minute to minute, so the paired ratio compares like with like.
  start_riser "riser-adaptive.$r" 0 "$riser_port" 1 adaptive
  for rw in randread randwrite; do
    kind=${rw#rand}
    v=$(rbd_bench "$kind" "$out/rbd-bench.$rw.$r.log") || die "rbd bench $kind failed"
    printf '%s\t%s\t%s\t%s\n' "$r" "rbd bench" "$rw" "$v" | tee -a "$results"
    printf '%s\t%s\t%s\t%s\n' "$r" "rbd bench" "$rw" "$(cat "$out/rbd-bench.$rw.$r.log.diag")" >>"$diag"
    parties_row "$r" "rbd bench" "$rw" "$v" "$out/rbd-bench.$rw.$r.log.parties"
    # librbd through riser's binding alone (no iSCSI), when built
    # (cargo build --release -p riser-rbd --example rbd_qd).
    if [ -x "$qd_bin" ]; then
      log=$out/rbd-qd.$rw.$r.log
      parties_sample "$log.parties" 1 - &
      sp=$!
      "$qd_bin" "$conf" rbd bench "$kind" "$qd" "$secs" "keyring=$keyring" >"$log" 2>&1 || { wait "$sp"; die "rbd_qd $kind failed; see $log"; }
      wait "$sp"
      v=$(sed -n 's/.*: \([0-9]*\) IOPS.*/\1/p' "$log" | tail -1)
      printf '%s\t%s\t%s\t%s\n' "$r" "binding (rbd_qd)" "$rw" "$v" | tee -a "$results"
      parties_row "$r" "binding (rbd_qd)" "$rw" "$v" "$log.parties"
    fi
    log=$out/riser-adaptive.$rw.$r.json
    v=$(riser_run "$rw" "$log" "$work/riser-adaptive.$r.sock" "$gw_pid" "$(url "$riser_port")") || die "riser-perf against riser (adaptive) failed"
    printf '%s\t%s\t%s\t%s\n' "$r" "riser (adaptive)" "$rw" "$v" | tee -a "$results"
    printf '%s\t%s\t%s\t%s\n' "$r" "riser (adaptive)" "$rw" "$(cat "$log.diag")" >>"$diag"
    parties_row "$r" "riser (adaptive)" "$rw" "$v" "$log.parties"
  done
  stop_pid "$gw_pid"
  start_riser "riser-busy.$r" 0 "$riser_port" 1 busy
  for rw in randread randwrite; do
    log=$out/riser-busy.$rw.$r.json
    v=$(riser_run "$rw" "$log" "$work/riser-busy.$r.sock" "$gw_pid" "$(url "$riser_port")") || die "riser-perf against riser (busy) failed"
    printf '%s\t%s\t%s\t%s\n' "$r" "riser (busy)" "$rw" "$v" | tee -a "$results"
    printf '%s\t%s\t%s\t%s\n' "$r" "riser (busy)" "$rw" "$(cat "$log.diag")" >>"$diag"
    parties_row "$r" "riser (busy)" "$rw" "$v" "$log.parties"
  done
  stop_pid "$gw_pid"
  tgt_start_rbd "$out/tgt.$r.log" >/dev/null
  wait_port "$tgt_port" "$tgt_pid" tgtd "$out/tgt.$r.log"
  for rw in randread randwrite; do
    v=$(perf_run "$rw" "$out/tgt.$rw.$r.json" "iscsi://127.0.0.1:$tgt_port/$tgt_iqn/1") || die "riser-perf against tgt failed"
    printf '%s\t%s\t%s\t%s\n' "$r" "tgt (rbd)" "$rw" "$v" | tee -a "$results"
  done
  tgt_stop
  tgt_pid=
  start_riser "riser-gw1.$r" 0 "$riser_port" 1 adaptive
  g1=$gw_pid
  start_riser "riser-gw2.$r" 1 "$riser2_port" 2 adaptive
  g2=$gw_pid
  for rw in randread randwrite; do
    v=$(perf_run "$rw" "$out/riser-x2.$rw.$r.json" "$(url "$riser_port")" "$(url "$riser2_port")") || die "riser-perf against two gateways failed"
    printf '%s\t%s\t%s\t%s\n' "$r" "riser x2 (adaptive)" "$rw" "$v" | tee -a "$results"
    # The same moment's single-gateway figure (both processes up, one driven): the machine's
    # load changes from minute to minute, so the ratio compares neighbours.
    v=$(perf_run "$rw" "$out/riser-x1.$rw.$r.json" "$(url "$riser_port")") || die "riser-perf against gateway 1 failed"
    printf '%s\t%s\t%s\t%s\n' "$r" "riser x1 of 2 (adaptive)" "$rw" "$v" | tee -a "$results"
  done
  stop_pid "$g1"
  stop_pid "$g2"
done

python3 - "$results" "$out/summary.txt" "$qd" "$diag" "$parties" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
diag = list(csv.DictReader(open(sys.argv[4]), delimiter="\t"))
med = {}
for s in dict.fromkeys(r["subject"] for r in rows):
    for w in ("randread", "randwrite"):
        v = [float(r["iops"]) for r in rows if r["subject"] == s and r["workload"] == w]
        if v: med[(s, w)] = statistics.median(v)
subjects = list(dict.fromkeys(r["subject"] for r in rows))
best1 = lambda w: max(med.get(("riser (adaptive)", w), 0), med.get(("riser (busy)", w), 0))
lines = [f"4 KiB random, QD {sys.argv[3]} per session, IOPS (median of {len(set(r['round'] for r in rows))} round(s)); ratios to rbd bench and to tgt", ""]
lines.append(f"{'':22}{'randread':>10}{'x rbd':>8}{'x tgt':>8}{'randwrite':>11}{'x rbd':>8}{'x tgt':>8}")
for s in subjects:
    cells = ""
    for w in ("randread", "randwrite"):
        v = med.get((s, w), 0)
        rb, tg = med.get(("rbd bench", w), 0), med.get(("tgt (rbd)", w), 0)
        cells += f"{v:>10.0f}" if w == "randread" else f"{v:>11.0f}"
        cells += f"{v / rb:>8.2f}" if rb else f"{'-':>8}"
        cells += f"{v / tg:>8.2f}" if tg else f"{'-':>8}"
    lines.append(f"{s:22}{cells}")
lines.append("")
for w in ("randread", "randwrite"):
    two, one = med.get(("riser x2 (adaptive)", w), 0), med.get(("riser x1 of 2 (adaptive)", w), 0)
    if one:
        lines.append(f"two gateways / one of them driven alone, {w}: {two / one:.2f}x")
# riser (adaptive) / rbd bench per round (neighbours in time), and their median.
for w in ("randread", "randwrite"):
    iops = {(r["round"], r["subject"]): float(r["iops"]) for r in rows if r["workload"] == w}
    pairs = [iops[(k, "riser (adaptive)")] / iops[(k, "rbd bench")] for k in sorted({r["round"] for r in rows})
             if iops.get((k, "rbd bench")) and (k, "riser (adaptive)") in iops]
    if pairs:
        lines.append(f"riser (adaptive) / rbd bench run just before it, {w}: median {statistics.median(pairs):.2f}x ("
                     + ", ".join(f"{p:.2f}" for p in pairs) + ")")
# Where the time goes (medians): the client's mean latency; librbd's (riser's bdev counters:
# submitted to librbd -> collected by the reactor; rbd bench: QD / IOPS); CPU per I/O of the
# process that drives librbd (rbd; riser, all threads) and of riser's reactor thread.
lines += ["", f"{'per I/O, medians':22}{'client ms':>11}{'librbd ms':>11}{'CPU us':>8}{'reactor us':>12}"]
for s in dict.fromkeys(r["subject"] for r in diag):
    for w in ("randread", "randwrite"):
        d = [r for r in diag if r["subject"] == s and r["workload"] == w]
        def m(k):
            v = [float(r[k]) for r in d if r.get(k) not in ("-", "", None)]
            return f"{statistics.median(v):.2f}" if v and k.endswith("ms") else f"{statistics.median(v):.0f}" if v else "-"
        if d:
            lines.append(f"{s + ' ' + w[4:]:22}{m('client_ms'):>11}{m('librbd_ms'):>11}{m('cpu_us'):>8}{m('reactor_us'):>12}")
# CPU per I/O of every party (medians; us): the OSD, mon + mgr, the process driving librbd (all
# threads; its reactor, librados' messenger, librbd's io_context_pool, the rest), the client
# (riser-perf), and the machine (user, system, softirq, idle: other processes included).
pt = list(csv.DictReader(open(sys.argv[5]), delimiter="\t"))
cols = [("osd", "OSD"), ("mon_mgr", "mon+mgr"), ("driver", "driver"), ("reactor", "reactor"), ("msgr", "msgr"),
        ("io_context", "io_ctx"), ("driver_other", "other"), ("client", "client"), ("user", "m:user"),
        ("system", "m:sys"), ("softirq", "m:sirq"), ("idle", "m:idle")]
lines += ["", "CPU us per I/O by party (medians; driver = the process calling librbd; m: the whole machine)",
          f"{'':24}" + "".join(f"{h:>8}" for _, h in cols)]
for s in dict.fromkeys(r["subject"] for r in pt):
    for w in ("randread", "randwrite"):
        d = [r for r in pt if r["subject"] == s and r["workload"] == w]
        if d:
            lines.append(f"{s + ' ' + w[4:]:24}" + "".join(f"{statistics.median(float(r[k]) for r in d):>8.1f}" for k, _ in cols))
text = "\n".join(lines) + "\n"
print(text, end="")
open(sys.argv[2], "w").write(text)
PY
echo "bench-rbd: runs and logs in $out"
