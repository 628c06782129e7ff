# tgtd (Debian's user-space iSCSI target) for the benchmarks, sourced by bench-peers.sh and
# bench-perf-matrix.sh: started on its own management instance (tgtd -C / tgtadm -C, never
# the default 0, so a tgtd of the machine or of the other script is never touched), pinned
# to core 0, with one target (tgt_iqn) whose LUN 1 is a null device (or the backing store
# options in the caller's array tgt_bs).
#
# The caller sets tgt_ctl (the management instance) and tgt_port (the iSCSI portal on
# 127.0.0.1), calls tgt_start LOGFILE, and tgt_stop from its EXIT trap. tgt_cpus (default 0)
# is tgtd's taskset core list; set it empty to leave tgtd unpinned.
tgt_pid=
tgt_iqn=iqn.2024-01.test.peer:null
tadm() { tgtadm -C "$tgt_ctl" "$@"; }

tgt_start() { # LOGFILE
  local pin=()
  [ -z "${tgt_cpus-0}" ] || pin=(taskset -c "${tgt_cpus-0}")
  setsid "${pin[@]}" /usr/sbin/tgtd -f -C "$tgt_ctl" --iscsi portal=127.0.0.1:$tgt_port >"$1" 2>&1 </dev/null &
  tgt_pid=$!
  for _ in $(seq 100); do
    tadm --lld iscsi --mode target --op show >/dev/null 2>&1 && break
    sleep 0.1
  done
  tadm --lld iscsi --mode target --op new --tid 1 --targetname "$tgt_iqn"
  local bs=("${tgt_bs[@]}")
  [ ${#bs[@]} -gt 0 ] || bs=(--bstype null --backing-store /dev/null)
  tadm --lld iscsi --mode logicalunit --op new --tid 1 --lun 1 "${bs[@]}"
  tadm --lld iscsi --mode target --op bind --tid 1 --initiator-address ALL
}

tgt_stop() {
  if [ -n "$tgt_pid" ]; then
    # tgtd ignores SIGTERM.
    tadm --lld iscsi --mode target --op delete --tid 1 --force >/dev/null 2>&1 || true
    tadm --op delete --mode system >/dev/null 2>&1 || true
    sleep 0.5
    kill -9 "$tgt_pid" 2>/dev/null || true
    rm -f "/var/run/tgtd/socket.$tgt_ctl" "/var/run/tgtd/socket.$tgt_ctl.lock"
  fi
}
