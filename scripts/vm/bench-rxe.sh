#!/usr/bin/env bash
# In-guest half of scripts/bench-rxe.sh (run that one): riser vs the kernel's own iSER target
# (LIO + ib_isert) over soft-RoCE, both measured with the same client: Linux ib_iser + fio
# (libaio, O_DIRECT) on the resulting /dev/sdX.
#
# Workloads (each BENCH_TIME s, default 10, after a 2 s ramp): 4 KiB random read QD 32, 4 KiB random write
# QD 32, 128 KiB sequential read QD 8. Targets: riser in each of BENCH_MODES (busy: one
# reactor spinning, pinned to the last vCPU; adaptive: same core, naps when idle), and LIO
# (ramdisk rd_mcp of the same size). They alternate, BENCH_ROUNDS times:
#   riser-busy, LIO, riser-adaptive, LIO, riser-busy, LIO, ...
# Only the target being measured is logged in; riser does not run during LIO's turns (its
# polling would take CPU from LIO). fio runs on vCPU 0 for every target (BENCH_FIO_CPUS).
#
# Writes one line per run to $RISER_VM_OUT/bench-results.txt:
#   TARGET WORKLOAD IOPS BW_KIB GUEST_CPU_BUSY_PCT RISER_CPU_PCT_OF_ONE_VCPU (- for LIO)
# and prints the runs as they go and the table at the end (scripts/bench-rxe.sh prints the
# table again, clean of kernel messages). Not a test: it fails only when something breaks.
set -euo pipefail
. scripts/vm/rxe-up.sh
name=bench-rxe
. scripts/vm/lib.sh

# scripts/bench-rxe.sh hands BENCH_* over as RISER_BENCH_* (rxe-vm.sh passes RISER_* only).
time_s=${RISER_BENCH_TIME:-10}
rounds=${RISER_BENCH_ROUNDS:-2}
modes=${RISER_BENCH_MODES:-busy adaptive}
size_mib=${RISER_BENCH_SIZE_MIB:-256}
# fio's --cpus_allowed (default vCPU 0, away from riser's reactor); empty: not pinned.
fio_cpus=${RISER_BENCH_FIO_CPUS-0}
ncpu=$(nproc)
riser_core=$((ncpu - 1))
results=$RISER_VM_OUT/bench-results.txt
: >"$results"
export RISER_LOG=${RISER_LOG:-info}
riser_port=3261
riser_iqn=iqn.2016-06.io.riser:bench
lio_iqn=iqn.2003-01.org.linux-iscsi.riser-vm:lio

step "setup: fio on vCPU(s) ${fio_cpus:-any}, $ncpu vCPUs, ${size_mib} MiB LUNs, ${time_s} s per run, $rounds round(s) of: $(for m in $modes; do printf 'riser-%s, LIO, ' "$m"; done)"

# ---- LIO + isert through configfs (targetcli does not work here) ---------------------------
step "LIO: rd_mcp ramdisk ${size_mib} MiB, iSER portal $RXE_IP:3260"
lio_iser_target "$lio_iqn" "$size_mib"
echo "LIO: $lio_iqn, default_cmdsn_depth $(cat "$tpg/attrib/default_cmdsn_depth")"

# ---- riser: its own port, started for its turns only ----------------------------------------
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":$((size_mib * 2048)),"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"$riser_port","iser":true},{"host":"$RXE_IP","port":"$riser_port"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"bench","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0}],"queue_depth":64}}]}]}
JSON

iscsid_start
iface_iser
# Both targets' node records through iser0 (discovery over TCP).
for portal in "$RXE_IP:3260" "$RXE_IP:$riser_port"; do
  if [ "$portal" = "$RXE_IP:$riser_port" ]; then riser_start /tmp/riser.json --poll-mode adaptive -m "[$riser_core]"; fi
  iscsiadm -m discovery -t st -p "$portal" -I default >>"$logs/discovery.log" 2>&1 || fail "discovery at $portal failed"
  if [ "$portal" = "$RXE_IP:$riser_port" ]; then riser_stop; fi
done
for t in "$lio_iqn $RXE_IP:3260" "$riser_iqn $RXE_IP:$riser_port"; do
  set -- $t
  iscsiadm -m node -T "$1" -p "$2" -I iser0 -o new >>"$logs/iscsiadm.log" 2>&1 || fail "cannot add node $1 through iser0"
done

# utime + stime of a process, in jiffies.
proc_jiffies() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# /proc/stat's busy and total jiffies, all CPUs.
cpu_jiffies() { awk '/^cpu / {t=0; for (i=2;i<=NF;i++) t+=$i; print t - $5 - $6, t}' /proc/stat; }

runs=0
# One fio run: DISK LABEL WORKLOAD.
fio_run() {
  local disk=$1 label=$2 wl=$3 args=() out b0 t0 b1 t1 iops bw busy
  case $wl in
    randread-4k)  args=(--rw=randread --bs=4k --iodepth=32) ;;
    randwrite-4k) args=(--rw=randwrite --bs=4k --iodepth=32) ;;
    seqread-128k) args=(--rw=read --bs=128k --iodepth=8) ;;
  esac
  local s0=$SECONDS lat r0=0 r1=0 rcpu=-
  [ -n "$riser_pid" ] && r0=$(proc_jiffies "$riser_pid")
  read -r b0 t0 <<<"$(cpu_jiffies)"
  out=$(fio --name="$wl" --filename="/dev/$disk" --ioengine=libaio --direct=1 "${args[@]}" \
        --ramp_time=2 --runtime="$time_s" --time_based ${fio_cpus:+--cpus_allowed="$fio_cpus"} --output-format=json 2>"$logs/fio.err") \
    || fail "fio $wl on $label failed: $(cat "$logs/fio.err")"
  runs=$((runs + 1))
  echo "$out" >"$logs/fio-$runs-$label-$wl.json"
  read -r b1 t1 <<<"$(cpu_jiffies)"
  busy=$(( (b1 - b0) * 100 / (t1 - t0 > 0 ? t1 - t0 : 1) ))
  # riser's own CPU, in % of one vCPU (t1 - t0 counts all vCPUs' jiffies).
  if [ -n "$riser_pid" ]; then
    r1=$(proc_jiffies "$riser_pid")
    rcpu=$(( (r1 - r0) * 100 * ncpu / (t1 - t0 > 0 ? t1 - t0 : 1) ))
  fi
  case $wl in
    *write*) iops=$(jq '.jobs[0].write.iops' <<<"$out"); bw=$(jq '.jobs[0].write.bw' <<<"$out") ;;
    *)       iops=$(jq '.jobs[0].read.iops' <<<"$out");  bw=$(jq '.jobs[0].read.bw' <<<"$out") ;;
  esac
  iops=$(printf '%.0f' "$iops")
  echo "$label $wl $iops $bw $busy $rcpu" >>"$results"
  lat=$(jq -r '[.jobs[0].read, .jobs[0].write] | map(select(.total_ios > 0))[0] | "\(.clat_ns.mean / 1000 | floor) us mean, \(.clat_ns.max / 1000000 | floor) ms max"' <<<"$out")
  printf '%-16s %-13s %8s IOPS %9.1f MiB/s  guest CPU busy %3s%% (riser %s%% of a vCPU)  latency %s; fio took %s s\n' "$label" "$wl" "$iops" "$(echo "$bw / 1024" | bc -l)" "$busy" "$rcpu" "$lat" "$((SECONDS - s0))"
}

# One target's turn: LABEL IQN PORTAL.
turn() {
  local label=$1 iqn=$2 portal=$3 sid disk wl
  iscsiadm -m node -T "$iqn" -p "$portal" -I iser0 --login >>"$logs/login.log" 2>&1 || fail "$label: iSER login failed"
  sid=$(sids | tail -n 1)
  [ "$(transport_of "$sid")" = iser ] || fail "$label: session $sid is not over iSER"
  disk=$(disk_of "$sid" 0)
  echo none >"/sys/block/$disk/queue/scheduler" 2>/dev/null || true
  step "$label: logged in, /dev/$disk"
  for wl in randread-4k randwrite-4k seqread-128k; do fio_run "$disk" "$label" "$wl"; done
  iscsiadm -m session -r "$sid" -u >>"$logs/logout.log" 2>&1 || fail "$label: logout failed"
  for _ in $(seq 100); do [ -z "$(sids)" ] && break; sleep 0.2; done
  step "$label: logged out"
}

for r in $(seq "$rounds"); do
  for mode in $modes; do
    step "round $r: riser --poll-mode $mode, reactor pinned to vCPU $riser_core"
    riser_start /tmp/riser.json --poll-mode "$mode" -m "[$riser_core]"
    step "riser started"
    turn "riser-$mode" "$riser_iqn" "$RXE_IP:$riser_port"
    wait_no_connections 30 >/dev/null
    riser_stop
    step "riser stopped"
    step "round $r: LIO (isert, rd_mcp)"
    turn "LIO" "$lio_iqn" "$RXE_IP:3260"
  done
done

# ---- the table: medians per target and workload, ratio riser/LIO ----------------------------
median() { sort -n | awk '{v[NR]=$1} END {if (NR == 0) print 0; else if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
{
  echo
  echo "iSER over soft-RoCE in the VM ($ncpu vCPUs, TCG): Linux ib_iser + fio libaio direct, ${time_s} s runs, medians of $rounds riser run(s) per mode and $((rounds * $(wc -w <<<"$modes"))) LIO runs"
  printf '%-13s' workload
  for mode in $modes; do printf ' %15s' "riser-$mode"; done
  printf ' %15s' LIO
  for mode in $modes; do printf ' %16s' "$mode/LIO"; done
  echo
  for wl in randread-4k randwrite-4k seqread-128k; do
    lio=$(awk -v w="$wl" '$1 == "LIO" && $2 == w {print $3}' "$results" | median)
    printf '%-13s' "$wl"
    for mode in $modes; do
      printf ' %10.0f IOPS' "$(awk -v t="riser-$mode" -v w="$wl" '$1 == t && $2 == w {print $3}' "$results" | median)"
    done
    printf ' %10.0f IOPS' "$lio"
    for mode in $modes; do
      v=$(awk -v t="riser-$mode" -v w="$wl" '$1 == t && $2 == w {print $3}' "$results" | median)
      printf ' %15.2fx' "$(echo "if ($lio > 0) $v / $lio else 0" | bc -l)"
    done
    echo
  done
  echo "(128 KiB: MiB/s = IOPS / 8.) Aim: riser >= 1.5x LIO."
  echo "Guest CPU (median % of all $ncpu vCPUs busy during the runs; riser's own share in % of one vCPU):"
  for t in $(for mode in $modes; do echo "riser-$mode"; done) LIO; do
    printf '  %-15s' "$t"
    for wl in randread-4k randwrite-4k seqread-128k; do
      printf ' %s %3s%%' "$wl" "$(awk -v t="$t" -v w="$wl" '$1 == t && $2 == w {print $5}' "$results" | median)"
      [ "$t" = LIO ] || printf ' (riser %s%%)' "$(awk -v t="$t" -v w="$wl" '$1 == t && $2 == w {print $6}' "$results" | median)"
    done
    echo
  done
} | tee "$RISER_VM_OUT/bench-table.txt"

step "teardown"
iscsiadm -m session -u >/dev/null 2>&1 || true
echo 0 >"$tpg/enable" 2>/dev/null || true
echo "BENCH RXE DONE"
