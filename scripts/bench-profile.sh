#!/usr/bin/env bash
# `make bench-profile` (issue 25, item 1): where riser's and SPDK's cycles go under the same
# load. Each target runs alone on core 0 with a null LUN, started as bench-peers.sh starts it
# (lib-bench.sh; SPDK v24.01's iscsi_tgt built once by bench-spdk.sh), riser-perf on core 1:
# 2 sessions x QD 64, 4 KiB random read, PROFILE_TIME seconds (default 8). In a window of
# PROFILE_WINDOW seconds (default 3) after a 2 s ramp it counts, for the target process:
#   - its system calls, with the kernel's tracepoint counters (perf stat -e syscalls:...: no
#     ptrace, unlike strace, so the target runs at its own speed): all of them, receives
#     (read, readv, recvfrom, recvmsg), sends (write, writev, sendto, sendmsg) and those of each
#     that moved bytes (ret > 0), io_uring_enter, waits (epoll_wait, epoll_pwait, ppoll, futex);
#     sends made through io_uring (SPDK's uring sock) are no syscalls: their bytes per send
#     and PDUs per send show as io_uring;
#   - its sockets' bytes in and out (ss -ti: bytes_received, bytes_sent);
#   - the I/Os its bdev completed (bdev_get_iostat), its reactors' busy time and, for riser,
#     its reactor loop passes (framework_get_reactors; SPDK has no pass counter: n/a).
# Prints per I/O: syscalls, receives, sends, waits; bytes per receive and per send (of those
# that moved bytes); response PDUs per send (a 4 KiB read's response is one Data-In with status,
# 48 + 4096 bytes); loop passes; busy time. A benchmark of a possibly busy machine: the figures
# are indicative, never asserted. Files (perf stat's CSV, riser-perf's JSON, the table) in
# BENCH_OUT (default target/bench/profile-DATE).
# Environment: PROFILE_TIME, PROFILE_WINDOW, PROFILE_QD (default 64), BENCH_OUT, SPDK_PREFIX,
# SPDK_PEER_DIR, PROFILE_TARGETS (default "riser spdk").
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${PROFILE_TIME:-8}
window=${PROFILE_WINDOW:-3}
qd=${PROFILE_QD:-64}
targets=(${PROFILE_TARGETS:-riser spdk})
out=${BENCH_OUT:-target/bench/profile-$(date +%Y%m%d-%H%M%S)}
export SPDK_PREFIX=${SPDK_PREFIX:-/opt/spdk-peer/spdk}
spdk_dir=${SPDK_PEER_DIR:-../shared/peers/spdk}
bin=${CARGO_TARGET_DIR:-target}/release
riser=$bin/riser
perf=$bin/riser-perf
# Not bench-peers.sh's ports: both may run on one machine (not at once, for figures).
riser_port=3276
spdk_port=3277
die() { echo "bench-profile: $*" >&2; exit 1; }

[ "$secs" -ge $((window + 3)) ] || die "PROFILE_TIME ($secs) must be at least PROFILE_WINDOW ($window) + 3"
for b in "$riser" "$perf"; do [ -x "$b" ] || die "$b not built: make release"; done
for c in perf ss taskset python3; do command -v $c >/dev/null || die "$c missing: scripts/setup.sh bench"; done
[ "$(nproc)" -ge 2 ] || die "needs 2 cores (target on core 0, client on core 1)"
ev_dir=/sys/kernel/tracing/events/syscalls
[ -d "$ev_dir" ] || die "no syscall tracepoints in $ev_dir (tracefs not mounted?)"
if [[ " ${targets[*]} " == *" spdk "* ]]; then
  SPDK_PEER_DIR=$spdk_dir scripts/bench-spdk.sh || die "SPDK's iscsi_tgt is not available (see above)"
fi
for p in $riser_port $spdk_port; do
  if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then die "port $p is already in use on 127.0.0.1"; fi
done

mkdir -p "$out"
work=$(mktemp -d /tmp/bench-profile.XXXXXX)
pid=
cpid=
cleanup() {
  [ -n "$cpid" ] && kill "$cpid" 2>/dev/null || true
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=lib-bench.sh
. scripts/lib-bench.sh

riser_bdev='{"method":"bdev_null_create","params":{"name":"Null0","num_blocks":2097152,"block_size":512}}'
spdk_bdev=(bdev_null_create Null0 1024 512)
write_riser_config
sock=$work/target.sock
declare -A url=(
  [riser]="iscsi://127.0.0.1:$riser_port/iqn.2016-06.io.riser:null/0"
  [spdk]="iscsi://127.0.0.1:$spdk_port/iqn.2016-06.io.spdk:null/0"
)
declare -A port=([riser]=$riser_port [spdk]=$spdk_port)

# The counters: every syscall, then each family's entries, then the receives and sends that
# moved bytes (only the tracepoints this kernel has).
events=(-e raw_syscalls:sys_enter)
for s in read readv recvfrom recvmsg write writev sendto sendmsg epoll_wait epoll_pwait ppoll io_uring_enter futex; do
  [ -d "$ev_dir/sys_enter_$s" ] && events+=(-e "syscalls:sys_enter_$s")
done
for s in read readv recvfrom recvmsg write writev sendto sendmsg; do
  [ -d "$ev_dir/sys_exit_$s" ] && events+=(-e "syscalls:sys_exit_$s" --filter 'ret > 0')
done

sock_bytes() { # PORT -> "RECEIVED SENT": the target's established connections on PORT
  ss -tinH state established "( sport = :$1 )" | grep -o 'bytes_\(sent\|received\):[0-9]*' |
    awk -F: '{a[$1] += $2} END {printf "%.0f %.0f\n", a["bytes_received"], a["bytes_sent"]}'
}
bdev_ios() {
  rpc "$sock" bdev_get_iostat '{"name":"Null0"}' |
    python3 -c 'import json,sys; b=json.load(sys.stdin)["bdevs"][0]; print(b["num_read_ops"] + b["num_write_ops"])'
}
passes() { # riser's reactor loop passes (SPDK: n/a)
  rpc "$sock" framework_get_reactors |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["reactors"]; print(sum(x["passes"] for x in r) if all("passes" in x for x in r) else "n/a")'
}

samples=$out/samples.tsv
printf 'target\tios0\tios1\trecv0\tsent0\trecv1\tsent1\tpasses0\tpasses1\tbusy0\tbusy1\ttick_rate\n' >"$samples"
echo "profile: ${targets[*]}, each alone on core 0; riser-perf on core 1: 2 sessions x QD $qd, 4 KiB random read, $secs s; counted over $window s; files in $out"
for t in "${targets[@]}"; do
  case "$t" in riser|spdk) ;; *) die "PROFILE_TARGETS: unknown target $t (riser, spdk)" ;; esac
  start_target "$t" 1
  taskset -c 1 "$perf" -m 0x2 --sessions 2 --rw randread --bs 4096 --qd "$qd" --time "$secs" --ramp 0 \
    --json "${url[$t]}" >"$out/perf.$t.json" 2>"$out/perf.$t.err" &
  cpid=$!
  sleep 2
  read -r r0 s0 < <(sock_bytes "${port[$t]}")
  i0=$(bdev_ios); p0=$(passes); c0=$(cost_sample "$t")
  perf stat -x, -o "$out/syscalls.$t.csv" "${events[@]}" -p "$pid" -- sleep "$window" || die "perf stat on $t failed"
  read -r r1 s1 < <(sock_bytes "${port[$t]}")
  i1=$(bdev_ios); p1=$(passes); c1=$(cost_sample "$t")
  wait "$cpid" || die "riser-perf against $t failed: see $out/perf.$t.err"
  cpid=
  stop_target "$t" 1
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$i0" "$i1" "$r0" "$s0" "$r1" "$s1" "$p0" "$p1" "${c0% *}" "${c1% *}" "${c1#* }" >>"$samples"
done

python3 - "$samples" "$out" "$window" "$qd" <<'PY'
import csv, json, sys
samples, out, window, qd = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
RECV, SEND = ("read", "readv", "recvfrom", "recvmsg"), ("write", "writev", "sendto", "sendmsg")
WAIT = ("epoll_wait", "epoll_pwait", "ppoll", "futex")
def counters(path):
    c = {}
    for line in open(path):
        f = line.strip().split(",")
        if len(f) < 3 or not f[0].replace(".", "").isdigit(): continue
        c[f[2]] = c.get(f[2], 0) + float(f[0])
    return c
rows = []
for s in csv.DictReader(open(samples), delimiter="\t"):
    t = s["target"]; c = counters(f"{out}/syscalls.{t}.csv")
    ios = int(s["ios1"]) - int(s["ios0"])
    if ios <= 0: sys.exit(f"bench-profile: {t} completed no I/O in the window")
    # The counters read around perf stat (RPCs, ss) take time of their own: their deltas span
    # more than the window. Per-I/O figures of those deltas divide by the I/Os of the same
    # span (ios); the syscall counts cover perf stat's window alone and divide by the I/Os of
    # that window, from riser-perf's own rate (IOPS over its whole run).
    iops = json.load(open(f"{out}/perf.{t}.json"))["total"]["iops"]
    win_ios = iops * window
    get = lambda kind, names: sum(c.get(f"syscalls:sys_{kind}_{n}", 0) for n in names)
    recvs, sends = get("enter", RECV), get("enter", SEND)
    recv_ok, send_ok = get("exit", RECV), get("exit", SEND)
    # Bytes per call: the bytes of the span scaled to the window.
    span = ios / win_ios if win_ios else 1.0
    bin_, bout = int(s["recv1"]) - int(s["recv0"]), int(s["sent1"]) - int(s["sent0"])
    passes = "n/a" if s["passes0"] == "n/a" else f"{(int(s['passes1']) - int(s['passes0'])) / ios:.3f}"
    busy = (float(s["busy1"]) - float(s["busy0"])) / float(s["tick_rate"]) * 1e6 / ios
    uring = get("enter", ("io_uring_enter",))
    # No send syscalls but io_uring: its sends are io_uring submissions (SPDK's uring sock).
    na = "io_uring" if not send_ok and uring else "-"
    d = lambda a, b: f"{a / b:.3f}" if b else na
    w = win_ios
    rows.append([t, f"{iops:.0f}", d(c.get("raw_syscalls:sys_enter", 0), w), d(recvs, w), d(recv_ok, w),
                 d(sends, w), d(send_ok, w), d(uring, w), d(get("enter", WAIT), w),
                 f"{bin_ / span / recv_ok:.0f}" if recv_ok else na, f"{bout / span / send_ok:.0f}" if send_ok else na,
                 d(bout / span / (48 + 4096), send_ok), passes, f"{busy:.3f}"])
head = ["target", "IOPS", "syscalls/IO", "recvs/IO", "recvs>0/IO", "sends/IO", "sends>0/IO", "io_uring_enter/IO",
        "waits/IO", "B/recv", "B/send", "PDUs/send", "passes/IO", "busy us/IO"]
wid = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
line = lambda r: "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, wid)))
text = [f"4 KiB random read, riser-perf 2 sessions x QD {qd} on core 1, each target alone on core 0, syscalls counted over {window:.0f} s",
        "(IOPS: riser-perf's over its whole run; syscalls per I/O: over perf stat's window, at that rate; bytes, passes and busy",
        " time per I/O: deltas around the window, over the bdev's I/Os of the same span)",
        "(syscalls: kernel tracepoint counters for the target process; bytes: its sockets' tcp_info; I/Os: its bdev's iostat;",
        " recvs>0 / sends>0: calls that moved bytes, B/recv and B/send per such call; PDUs/send: response PDUs of 48 + 4096 bytes;",
        " waits: epoll_wait, epoll_pwait, ppoll, futex; io_uring: sends submitted through io_uring, not counted as syscalls).",
        line(head), line(["-" * w for w in wid])] + [line(r) for r in rows]
print("\n".join(text))
open(f"{out}/table.txt", "w").write("\n".join(text) + "\n")
PY
