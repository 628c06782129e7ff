#!/usr/bin/env bash
# A single-node Ceph cluster for riser's RBD tests (/work/shared/ceph.md): one monitor on
# 127.0.0.1 or CEPH_ADDR (non-default ports), one OSD on the memstore object store (data in RAM: keep images
# small), one mgr, and the pool `rbd` with size 1. As root.
#
#   scripts/ceph-test-cluster.sh start [DIR]    bring it up, wait for active+clean, print the paths
#   scripts/ceph-test-cluster.sh stop [DIR]     kill its daemons (TERM, then KILL), keep DIR
#   scripts/ceph-test-cluster.sh status [DIR]   "running" (exit 0) or "stopped" (exit 1)
#
# DIR defaults to $CEPH_TEST_DIR, else /tmp/riser-ceph; start wipes it first. Environment:
# CEPH_ADDR (the address every daemon binds to, default 127.0.0.1: another address of this
# machine, such as the host side of a veth pair, lets clients in other network namespaces
# reach the cluster), CEPH_MON_PORT (v2, default 13300; v1 is CEPH_MON_PORT_V1, default 16789), CEPH_MEMSTORE_BYTES
# (default 1 GiB), CEPH_START_TIMEOUT (seconds to active+clean, default 120), CEPH_OWNER_PID (a
# watchdog stops the cluster once that process is gone: a test killed before its cleanup ran).
# start prints lines "CEPH_CONF=..." and "CEPH_KEYRING=..." (the client.admin keyring) last.
set -euo pipefail

cmd=${1:-}
dir=${2:-${CEPH_TEST_DIR:-/tmp/riser-ceph}}
here=$(cd "$(dirname "$0")" && pwd)
addr=${CEPH_ADDR:-127.0.0.1}
port2=${CEPH_MON_PORT:-13300}
port1=${CEPH_MON_PORT_V1:-16789}
memstore=${CEPH_MEMSTORE_BYTES:-1073741824}
timeout=${CEPH_START_TIMEOUT:-120}

die() { echo "ceph-test-cluster: $*" >&2; exit 1; }

# The PIDs of this cluster's daemons: their pid files, and any process started with this conf.
pids() {
  local p
  for f in "$dir"/run/*.pid; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null || true)
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$p"
  done
  pgrep -f -- "-c $dir/ceph.conf" 2>/dev/null || true
}

stop() {
  local ps
  ps=$(pids | sort -u)
  [ -z "$ps" ] && return 0
  # shellcheck disable=SC2086
  kill -TERM $ps 2>/dev/null || true
  for _ in $(seq 50); do
    ps=$(pids | sort -u)
    [ -z "$ps" ] && return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $ps 2>/dev/null || true
  for _ in $(seq 50); do
    [ -z "$(pids)" ] && return 0
    sleep 0.1
  done
  die "daemons still alive after SIGKILL: $(pids | sort -u | tr '\n' ' ')"
}

start() {
  [ "$(id -u)" -eq 0 ] || die "run as root"
  "$here/setup.sh" ceph
  for b in ceph-mon ceph-osd ceph-mgr ceph ceph-authtool monmaptool rbd; do
    command -v "$b" >/dev/null || die "$b not found after setup.sh ceph"
  done
  stop
  rm -rf "$dir"
  mkdir -p "$dir"/{run,log,mon-a,osd-0,mgr-x}
  local fsid mon conf=$dir/ceph.conf
  fsid=$(cat /proc/sys/kernel/random/uuid)
  [[ $addr =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "CEPH_ADDR '$addr' is not an IPv4 address"
  # The OSD and the mgr bind to the address of this machine inside the public network: the
  # loopback network as always, else exactly CEPH_ADDR.
  local public=$addr/32
  [ "$addr" = 127.0.0.1 ] && public=127.0.0.0/8
  if [ "$addr" != 127.0.0.1 ]; then
    # What matters is that the daemons can bind to it: try that (no parsing of ip's output;
    # an `ip ... | grep -q` under pipefail can fail by SIGPIPE even when the address is there).
    if ! python3 -c 'import socket, sys; socket.socket().bind((sys.argv[1], 0))' "$addr" 2>/dev/null; then
      ip -o -4 addr show >&2 || true
      die "CEPH_ADDR $addr is not an address of this machine: cannot bind to it (ip -4 addr above)"
    fi
  fi
  mon="[v2:$addr:$port2,v1:$addr:$port1]"
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = $mon
public network = $public
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
# The monitor refuses to start when its file system has 5 % or less free (a big, busy disk
# can: 13 GiB free of 252 stopped it once); its store here is a few MiB, the OSD is in RAM.
mon data avail crit = 0
mon data avail warn = 1
osd crush chooseleaf type = 0
ms bind port min = 16800
ms bind port max = 17300
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
keyring = $dir/keyring
[mon.a]
mon data = $dir/mon-a
[osd.0]
osd data = $dir/osd-0
osd objectstore = memstore
memstore device bytes = $memstore
keyring = $dir/osd-0/keyring
[mgr.x]
mgr data = $dir/mgr-x
keyring = $dir/mgr-x/keyring
EOF
  local c=(-c "$conf")
  ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/keyring" >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "$mon" "$dir/monmap" >/dev/null
  ceph-mon "${c[@]}" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring"
  ceph-mon "${c[@]}" -i a || die "ceph-mon did not start (see $dir/log/mon.a.log)"

  local uuid id
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(timeout 60 ceph "${c[@]}" osd new "$uuid") || die "ceph osd new failed (monitor not answering? see $dir/log/mon.a.log)"
  ceph "${c[@]}" auth get-or-create "osd.$id" mon 'allow profile osd' mgr 'allow profile osd' osd 'allow *' \
    -o "$dir/osd-0/keyring" >/dev/null
  ceph-osd "${c[@]}" -i "$id" --mkfs --osd-uuid "$uuid" >/dev/null 2>&1 || die "ceph-osd --mkfs failed (see $dir/log/osd.$id.log)"
  ceph-osd "${c[@]}" -i "$id" 2>/dev/null || die "ceph-osd did not start (see $dir/log/osd.$id.log)"
  ceph "${c[@]}" auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
    -o "$dir/mgr-x/keyring" >/dev/null
  ceph-mgr "${c[@]}" -i x || die "ceph-mgr did not start (see $dir/log/mgr.x.log)"

  ceph "${c[@]}" osd pool create rbd 8 >/dev/null 2>&1
  ceph "${c[@]}" osd pool application enable rbd rbd >/dev/null 2>&1
  timeout 60 rbd "${c[@]}" pool init rbd || die "rbd pool init failed"
  local t0=$SECONDS st=""
  while :; do
    st=$(timeout 20 ceph "${c[@]}" pg stat 2>/dev/null || true)
    # "8 pgs: 8 active+clean; ..." with no other state
    if [[ $st =~ ^([0-9]+)\ pgs:\ ([0-9]+)\ active\+clean\; ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ]; then
      break
    fi
    if [ $((SECONDS - t0)) -ge "$timeout" ]; then
      die "not active+clean after ${timeout}s: pg stat '${st}'; osd: $(ceph "${c[@]}" osd stat 2>&1 | head -1); logs in $dir/log"
    fi
    sleep 1
  done
  echo "ceph-test-cluster: active+clean in $((SECONDS - t0))s after pool creation ($dir)"
  if [ -n "${CEPH_OWNER_PID:-}" ]; then
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$3" ]; do sleep 2; done; "$2" stop "$3"' \
      watchdog "$CEPH_OWNER_PID" "$here/ceph-test-cluster.sh" "$dir" </dev/null >/dev/null 2>&1 &
  fi
  echo "CEPH_CONF=$conf"
  echo "CEPH_KEYRING=$dir/keyring"
}

case "$cmd" in
  start) start ;;
  stop) stop; echo "ceph-test-cluster: stopped ($dir)" ;;
  status)
    if [ -n "$(pids)" ]; then echo running; else echo stopped; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status [DIR]" >&2; exit 2 ;;
esac
