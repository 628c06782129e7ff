# Helpers for the in-guest iSCSI/iSER test scripts (sourced, never run): riser and iscsid
# start/stop, logins through named iscsiadm ifaces, the disk of a session's LUN, raw and file
# system data checks. The sourcing script sets `name` (the prefix of its OK/FAILED lines and
# step markers) before sourcing, then uses:
#
#   step TEXT                     marker with the guest's uptime
#   fail TEXT                     "$NAME FAILED: TEXT", the logs' tails, dmesg; exit 1
#   riser_start CONFIG [ARGS...]  riser --json CONFIG on $sock (log: $logs/riser.log), waits for RPC
#   riser_stop                    SIGTERM, must exit 0
#   rpc METHOD [ARGS...]          riser-rpc on $sock
#   wait_no_connections SECS      until iscsi_get_connections is [] (fails after SECS)
#   iscsid_start / iscsid_kill9   open-iscsi's daemon, in its own session
#   iface_iser                    an iscsiadm iface "iser0" with transport iser ("default" is tcp)
#   discover [IFACE...]           SendTargets over TCP to $RXE_IP; node records through each iface too
#   login IQN IFACE               login; prints the new session's id (SID)
#   logout_sid SID                logout of one session
#   disk_of SID LUN               waits for /dev/sdX of that LUN in that session; prints sdX
#   raw_verify DISK MIB TAG       MIB MiB of random data, dd oflag=direct, read back, cmp
#   make_tree DIR                 a file tree (3 MiB of /usr/share/doc + a 2 MiB random file)
#   fs_verify DISK TREE TAG       mkfs.ext4, mount, copy TREE, umount, fsck -fn, mount, sha256
#   lio_iser_target IQN MIB [IMG IMG_MIB]
#                                 the kernel's iSER target (LIO + ib_isert) through configfs:
#                                 IQN, LUN 0 an rd_mcp ramdisk of MIB MiB, LUN 1 (if IMG) a
#                                 fileio LUN on IMG (IMG_MIB MiB of zeros, written here), an iSER
#                                 portal on $RXE_IP:3260, no auth, any initiator; sets $tpg
#
# Everything is under set -euo pipefail in the caller.

bin=${RISER_BIN_DIR:-target/debug}
sock=${sock:-/tmp/r.sock}
logs=${logs:-/tmp/$name}
mkdir -p "$logs"
NAME=$(tr '[:lower:]-' '[:upper:] ' <<<"$name")

# `grep -q` for the end of a pipeline under pipefail: it reads all its input. grep -q stops at
# the first match, and a writer with more to write (a long riser log) then dies of SIGPIPE,
# which fails the whole pipeline although the line was there.
has() { grep -c -- "$@" >/dev/null; }
step() { echo "--- $name [$(cut -d' ' -f1 /proc/uptime)s]: $*"; }
# To stderr: fail may run inside $(...), whose stdout is captured.
fail() {
  {
    echo "$NAME FAILED: $*"
    local f
    for f in "$logs"/*.log; do [ -s "$f" ] && { echo "----- $f"; tail -n 60 "$f"; }; done
    echo "----- dmesg (last 50 lines)"; dmesg | tail -n 50
  } >&2
  exit 1
}
# Anything else that ends the script under set -e says where.
set -E
trap 'echo "$NAME FAILED: status $? at ${BASH_SOURCE[0]##*/} line $LINENO: $BASH_COMMAND" >&2' ERR

riser_pid='' iscsid_pid='' extra_pids=''
lib_cleanup() {
  local rc=$? p
  set +e; trap - ERR
  for p in $extra_pids; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
  # Unmount whatever is still mounted from an iSCSI disk before the daemons go.
  grep -o '^/dev/sd[a-z]* [^ ]*' /proc/mounts | while read -r _ m; do umount -l "$m" 2>/dev/null || true; done
  if [ -n "$iscsid_pid" ]; then iscsiadm -m session -u >/dev/null 2>&1 || true; fi
  for p in $iscsid_pid $riser_pid; do { kill "$p" && wait "$p"; } 2>/dev/null || true; done
  # The logs outlive the VM in the results share (rxe-vm.sh keeps it after a failure).
  if [ -n "${RISER_VM_OUT:-}" ] && [ -d "$RISER_VM_OUT" ]; then
    mkdir -p "$RISER_VM_OUT/logs-$name" && cp -r "$logs"/. "$RISER_VM_OUT/logs-$name/" 2>/dev/null
    dmesg >"$RISER_VM_OUT/logs-$name/dmesg.txt" 2>/dev/null
  fi
  exit "$rc"
}
trap lib_cleanup EXIT

rpc() { "$bin/riser-rpc" -s "$sock" "$@"; }

riser_start() {
  local config=$1; shift
  [ -x "$bin/riser" ] && [ -x "$bin/riser-rpc" ] || fail "$bin/riser or riser-rpc missing: cargo build -p riser -p riser-rpc-cli on the host"
  RISER_LOG=${RISER_LOG:-debug} "$bin/riser" -r "$sock" --json "$config" "$@" >>"$logs/riser.log" 2>&1 &
  riser_pid=$!
  local _
  for _ in $(seq 150); do
    rpc spdk_get_version >/dev/null 2>&1 && return 0
    kill -0 "$riser_pid" 2>/dev/null || fail "riser exited at start"
    sleep 0.2
  done
  fail "riser did not answer RPC within 30 s"
}

riser_stop() {
  local rc=0
  kill "$riser_pid"
  wait "$riser_pid" || rc=$?
  riser_pid=
  [ $rc = 0 ] || fail "riser exited with $rc on SIGTERM"
}

connections() { rpc iscsi_get_connections | tr -d ' \n'; }

wait_no_connections() {
  local secs=$1 conns='' t0=$SECONDS
  while :; do
    conns=$(connections) || fail "iscsi_get_connections failed (riser alive: $(kill -0 "$riser_pid" 2>/dev/null && echo yes || echo no))"
    [ "$conns" = "[]" ] && { echo "no connections left after $((SECONDS - t0)) s"; return 0; }
    [ $((SECONDS - t0)) -ge "$secs" ] && fail "connections left after ${secs} s: $conns"
    sleep 0.5
  done
}

iscsid_start() {
  mkdir -p /run/lock/iscsi /var/lib/iscsi /etc/iscsi
  [ -s /etc/iscsi/initiatorname.iscsi ] || echo "InitiatorName=iqn.2016-06.io.riser:vm-$name" >/etc/iscsi/initiatorname.iscsi
  # Its own session: on SIGTERM iscsid signals its whole process group.
  # ISCSID_CPUS pins it (taskset -c): see chap.sh, which puts it on riser's reactor core.
  if [ -n "${ISCSID_CPUS:-}" ]; then
    setsid taskset -c "$ISCSID_CPUS" iscsid -f >>"$logs/iscsid.log" 2>&1 &
  else
    setsid iscsid -f >>"$logs/iscsid.log" 2>&1 &
  fi
  iscsid_pid=$!
  local _
  for _ in $(seq 100); do
    grep -q '@ISCSIADM_ABSTRACT_NAMESPACE' /proc/net/unix && return 0
    kill -0 "$iscsid_pid" 2>/dev/null || fail "iscsid exited at start"
    sleep 0.2
  done
  fail "iscsid is not listening after 20 s"
}

iscsid_kill9() {
  kill -9 "$iscsid_pid" 2>/dev/null || true
  wait "$iscsid_pid" 2>/dev/null || true
  iscsid_pid=
}

iface_iser() {
  iscsiadm -m iface -I iser0 -o new >>"$logs/iscsiadm.log" 2>&1 || true
  iscsiadm -m iface -I iser0 -o update -n iface.transport_name -v iser >>"$logs/iscsiadm.log" 2>&1 \
    || fail "cannot create the iser0 iface"
}

# SendTargets discovery over TCP (the default iface); then a node record of each discovered
# target through each iface named (iser0: the same target, logged in over iSER).
discover() {
  local i t
  iscsiadm -m discovery -t st -p "$RXE_IP" -I default >"$logs/discovery.log" 2>&1 || fail "discovery over TCP failed"
  cat "$logs/discovery.log"
  for i in "$@"; do
    [ "$i" = default ] && continue
    for t in $(awk '{print $2}' "$logs/discovery.log"); do
      iscsiadm -m node -T "$t" -p "$RXE_IP" -I "$i" -o new >>"$logs/iscsiadm.log" 2>&1 || fail "cannot add node $t through iface $i"
    done
  done
}

sids() { { iscsiadm -m session 2>/dev/null || true; } | sed -n 's/^[a-z]*: \[\([0-9]*\)\].*/\1/p' | sort -n; }

# Linux's initiator has a race of its own in login: libiscsi hands a Login Response to
# iscsid (iscsi_recv_pdu) before it frees the login task (iscsi_complete_task), so a
# fast iscsid can send the next Login Request while the task is still busy; the kernel
# then prints "Login/Text in progress. Cannot start new task." and the login fails with
# iscsid's "Login I/O error". A fast target on a loaded TCG guest hits it now and then.
# Only that failure, recognised by the kernel's own line, is retried, once, and said.
login_race_count() { dmesg 2>/dev/null | grep -c 'Login/Text in progress. Cannot start new task' || true; }

login() {
  local iqn=$1 iface=$2 before after sid races
  before=$(sids | tr '\n' ' ')
  races=$(login_race_count)
  if ! iscsiadm -m node -T "$iqn" -p "$RXE_IP" -I "$iface" --login >>"$logs/login.log" 2>&1; then
    [ "$(login_race_count)" -gt "$races" ] || fail "login to $iqn through iface $iface failed"
    echo "login to $iqn through $iface hit the Linux initiator's login-task race; retrying once" >&2
    iscsiadm -m node -T "$iqn" -p "$RXE_IP" -I "$iface" --logout >>"$logs/login.log" 2>&1 || true
    iscsiadm -m node -T "$iqn" -p "$RXE_IP" -I "$iface" --login >>"$logs/login.log" 2>&1 \
      || fail "login to $iqn through iface $iface failed (twice)"
  fi
  after=$(sids)
  for sid in $after; do
    case " $before " in *" $sid "*) ;; *) echo "$sid"; return 0 ;; esac
  done
  fail "no new session after the login to $iqn through $iface"
}

logout_sid() { iscsiadm -m session -r "$1" -u >>"$logs/logout.log" 2>&1 || fail "logout of session $1 failed"; }

# The transport a session runs over, as iscsiadm names it (tcp, iser).
transport_of() { { iscsiadm -m session 2>/dev/null || true; } | sed -n "s/^\([a-z]*\): \[$1\].*/\1/p"; }

disk_of() {
  local sid=$1 lun=$2 d _
  for _ in $(seq 150); do   # the SCSI scan runs after the login returns
    for d in /sys/class/iscsi_session/session"$sid"/device/target*/*:*:*:"$lun"/block/*; do
      [ -e "$d" ] && [ -b "/dev/${d##*/}" ] && { echo "${d##*/}"; return 0; }
    done
    sleep 0.2
  done
  fail "no disk for LUN $lun of session $sid"
}

raw_verify() {
  local disk=$1 mib=$2 tag=$3 t0=$SECONDS
  dd if=/dev/urandom of="/tmp/pattern.$tag" bs=1M count="$mib" status=none
  dd if="/tmp/pattern.$tag" of="/dev/$disk" bs=1M oflag=direct status=none || fail "$tag: write to /dev/$disk failed"
  dd if="/dev/$disk" of="/tmp/readback.$tag" bs=1M count="$mib" iflag=direct status=none || fail "$tag: read from /dev/$disk failed"
  cmp "/tmp/pattern.$tag" "/tmp/readback.$tag" || fail "$tag: data read back from /dev/$disk differs"
  rm -f "/tmp/pattern.$tag" "/tmp/readback.$tag"
  echo "$tag: $mib MiB verified on /dev/$disk ($((SECONDS - t0)) s)"
}

# A file tree: the first $TREE_KIB KiB (default 3072) of a tar of /usr/share/doc (many small
# files; tar stops at the cut, so only that much is read through the slow 9p root; the last
# file is cut short, which is fine) and one 2 MiB random file: many small writes and a long one.
make_tree() {
  local dir=$1 cap=${TREE_KIB:-3072} n
  mkdir -p "$dir"
  { tar -C / -cf - usr/share/doc 2>/dev/null || true; } | head -c $((cap * 1024)) \
    | { tar -C "$dir" -xf - 2>/dev/null || true; }
  dd if=/dev/urandom of="$dir/random.bin" bs=1M count=2 status=none
  (cd "$dir" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$dir.sha256"
  n=$(wc -l <"$dir.sha256")
  [ "$n" -ge 20 ] || fail "the file tree has only $n files"
  echo "tree: $n files, $(du -sk "$dir" | cut -f1) KiB"
}

fs_verify() {
  local disk=$1 tree=$2 tag=$3 mnt=/mnt/$3 t0=$SECONDS
  mkdir -p "$mnt"
  local times=''
  lap() { times+=" $1 $((SECONDS - t0))s"; }
  mkfs.ext4 -q -F "/dev/$disk" >"$logs/mkfs-$tag.log" 2>&1 || fail "$tag: mkfs.ext4 /dev/$disk failed"
  lap mkfs
  mount "/dev/$disk" "$mnt" || fail "$tag: mount /dev/$disk failed"
  cp -a "$tree/." "$mnt/" || fail "$tag: copying the tree failed"
  lap copy
  umount "$mnt" || fail "$tag: umount failed"
  lap umount
  # From here on every read goes to the target, not to the guest's page cache.
  sync; echo 3 >/proc/sys/vm/drop_caches
  fsck.ext4 -fn "/dev/$disk" >"$logs/fsck-$tag.log" 2>&1 || fail "$tag: fsck.ext4 -fn /dev/$disk is not clean"
  lap fsck
  tail -n 1 "$logs/fsck-$tag.log"
  echo 3 >/proc/sys/vm/drop_caches
  mount -o ro "/dev/$disk" "$mnt" || fail "$tag: second mount failed"
  (cd "$mnt" && sha256sum --quiet -c "$tree.sha256") >"$logs/sha-$tag.log" 2>&1 || fail "$tag: checksums differ after remount"
  umount "$mnt" || fail "$tag: second umount failed"
  lap sha256
  echo "$tag: ext4 on /dev/$disk: $(wc -l <"$tree.sha256") files copied, fsck clean, checksums identical after remount (at:$times)"
}

# LIO + isert through configfs (targetcli does not work here). Sets tpg, the target portal
# group's configfs directory (teardown: echo 0 >"$tpg/enable").
lio_iser_target() {
  local iqn=$1 mib=$2 img=${3:-} img_mib=${4:-} a cfs=/sys/kernel/config/target
  local mods=(target_core_mod iscsi_target_mod ib_isert)
  [ -z "$img" ] || mods+=(target_core_file)
  modprobe -a "${mods[@]}" || fail "cannot load LIO's modules"
  mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
  mkdir -p "$cfs/core/rd_mcp_0/rd0"
  echo "rd_pages=$((mib * 256))" >"$cfs/core/rd_mcp_0/rd0/control"
  echo 1 >"$cfs/core/rd_mcp_0/rd0/enable"
  if [ -n "$img" ]; then
    dd if=/dev/zero of="$img" bs=1M count="$img_mib" status=none
    mkdir -p "$cfs/core/fileio_0/f0"
    echo "fd_dev_name=$img,fd_dev_size=$((img_mib << 20))" >"$cfs/core/fileio_0/f0/control"
    echo 1 >"$cfs/core/fileio_0/f0/enable"
  fi
  tpg=$cfs/iscsi/$iqn/tpgt_1
  mkdir -p "$tpg/lun/lun_0" ${img:+"$tpg/lun/lun_1"}
  ln -s "$cfs/core/rd_mcp_0/rd0" "$tpg/lun/lun_0/rd0"
  [ -z "$img" ] || ln -s "$cfs/core/fileio_0/f0" "$tpg/lun/lun_1/f0"
  mkdir -p "$tpg/np/$RXE_IP:3260"
  echo 1 >"$tpg/np/$RXE_IP:3260/iser"
  for a in authentication=0 generate_node_acls=1 demo_mode_write_protect=0 cache_dynamic_acls=1; do
    echo "${a#*=}" >"$tpg/attrib/${a%=*}"
  done
  echo 1 >"$tpg/enable"
}

# Zero copy over iSER (iscsi_get_stats "payload_copies"): LABEL. Read data goes out by RDMA
# Write from riser's I/O buffers and solicited write data comes in by RDMA Read into them, so
# riser's CPU copies neither; immediate data (copied out of the receive buffers) must have
# been counted, which shows the counters are wired.
# riser's payload_copies (iscsi_get_stats) as "read solicited unsolicited staged" bytes.
payload_copies() {
  local f=$logs/riser-stats.json
  rpc iscsi_get_stats >"$f"
  python3 - "$f" <<'PY' || fail "cannot read iscsi_get_stats: $(head -c 300 "$f")"
import json, sys
c = json.load(open(sys.argv[1])).get("payload_copies")
if c is None:
    sys.exit("no payload_copies")
print("%d %d %d %d" % (c["read_bytes"], c["solicited_bytes"], c["unsolicited_bytes"], c["staged_bytes"]))
PY
}

assert_zero_copy() {
  local label=$1 copies copied_read copied_solicited copied_unsolicited copied_staged
  copies=$(payload_copies) || exit 1
  read -r copied_read copied_solicited copied_unsolicited copied_staged <<<"$copies"
  [ "$copied_read" = 0 ] || fail "riser copied $copied_read bytes of read data over $label (payload_copies.read_bytes)"
  [ "$copied_solicited" = 0 ] || fail "riser copied $copied_solicited bytes of solicited write data over $label (payload_copies.solicited_bytes)"
  [ "$copied_unsolicited" -gt 0 ] || fail "no immediate data counted in payload_copies: are the iSER counters wired?"
  echo "$name: payload copies after $label traffic: read 0, solicited 0, unsolicited $copied_unsolicited bytes (copied again after waiting for the budget: $copied_staged)"
}

# LABEL URL: riser-perf writes 64 KiB at QD 16 for 3 s, each with FirstBurstLength (riser's
# default 8 KiB) of immediate data, the rest solicited, well within the I/O buffer budget:
# immediate data must be copied at most once (payload_copies.unsolicited_bytes grows by at most
# the immediate bytes sent: 8 KiB per write counted, plus 16 still in flight at the end), never
# staged, and no read or solicited byte copied.
assert_immediate_copied_once() {
  local label=$1 url=$2 before after out ios r0 s0 u0 st0 r1 s1 u1 st1 sent
  before=$(payload_copies) || exit 1
  out=$("$bin/riser-perf" --login-timeout 30 --rw write --bs 65536 --qd 16 --time 3 --ramp 0 "$url" 2>&1) \
    || fail "$label: riser-perf 64 KiB writes failed: $(tail -n 5 <<<"$out")"
  echo "$out" >"$logs/write-64k-$label.log"
  ios=$(awk '/^  I\/Os:/ {print $2}' <<<"$out")
  [ -n "$ios" ] && [ "$ios" -gt 0 ] || fail "$label: no 64 KiB write done: $(tail -n 5 <<<"$out")"
  wait_no_connections 30
  after=$(payload_copies) || exit 1
  read -r r0 s0 u0 st0 <<<"$before"
  read -r r1 s1 u1 st1 <<<"$after"
  sent=$(((ios + 16) * 8192))
  [ $((r1 - r0)) = 0 ] && [ $((s1 - s0)) = 0 ] || fail "$label: 64 KiB writes copied read $((r1 - r0)) / solicited $((s1 - s0)) bytes"
  [ $((u1 - u0)) -gt 0 ] || fail "$label: no immediate data counted for $ios writes"
  [ $((u1 - u0)) -le "$sent" ] || fail "$label: $((u1 - u0)) immediate bytes copied for $ios writes of 8 KiB immediate data each (at most $sent bytes sent): more than one copy"
  [ $((st1 - st0)) = 0 ] || fail "$label: $((st1 - st0)) immediate bytes copied a second time (staged) with the budget free"
  echo "$name: $ios writes of 64 KiB (8 KiB immediate) over $label: immediate bytes copied $((u1 - u0)) <= sent ~$((ios * 8192)) (+16 in flight), staged 0, read and solicited 0"
}

# LABEL OUTPUT: the summary of a riser-perf --verify run over iSER (OUTPUT, its stdout and
# stderr): fails unless blocks were checked, none mismatched and the session ran over iSER;
# sets verified_blocks to how many blocks were checked (no subshell, so a failure ends the
# script with its reason).
verify_checked() {
  local label=$1 out=$2 line checked mism
  line=$(grep '^verify: [0-9]* blocks checked' <<<"$out") || fail "$label: no verify summary line"
  checked=$(awk '{print $2}' <<<"$line")
  mism=$(sed -n 's/.*, \([0-9]*\) mismatched.*/\1/p' <<<"$line")
  [ "$checked" -gt 0 ] || fail "$label: no block checked"
  [ "$mism" = 0 ] || fail "$label: $mism mismatched blocks"
  grep -q 'RDMAExtensions Yes' <<<"$out" || fail "$label: the session is not over iSER: $(head -n 2 <<<"$out")"
  verified_blocks=$checked
}
