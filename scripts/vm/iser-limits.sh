#!/usr/bin/env bash
# iSER under pressure before login, inside the VM: scripts/rxe-vm.sh run scripts/vm/iser-limits.sh
#
#   1. riser without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 1 MiB: the login buffer registers,
#      the connection's pools (about 1.4 MiB at queue depth 128) do not; an iSER login (libiscsi) is answered Target Error / Out
#      of Resources (0x0302), riser logs why and counts it, and keeps serving TCP.
#   2. riser as usual while 200 rping clients connect to its iSER portal (they speak no iSER:
#      each connection ends at its first message): a healthy iSER login and 4 MiB verified
#      with the Linux initiator succeed meanwhile, and no connection is left afterwards.
# Prints "ISER LIMITS OK" last on success, "ISER LIMITS FAILED: why" otherwise.
set -euo pipefail
. scripts/vm/rxe-up.sh
name=iser-limits
. scripts/vm/lib.sh

iqn=iqn.2016-06.io.riser:lim
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[
{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":16384,"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_set_options","params":{"max_queue_depth":128}},{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"3260","iser":true},{"host":"$RXE_IP","port":"3260"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"lim","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0}],"queue_depth":128}}]}]}
JSON
wait_iser_listener() {
  local _
  for _ in $(seq 50); do grep -q "iSER portal $RXE_IP:3260 (portal group 1): listening" "$logs/riser.log" && return 0; sleep 0.2; done
  fail "no iSER listener"
}

step "riser without CAP_IPC_LOCK, RLIMIT_MEMLOCK 1 MiB"
# Root ignores RLIMIT_MEMLOCK through CAP_IPC_LOCK: drop it from the bounding set, so the
# exec'd riser has it nowhere.
RISER_LOG=debug setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock \
  prlimit --memlock=1048576:1048576 "$bin/riser" -r "$sock" --json /tmp/riser.json --poll-mode adaptive \
  >>"$logs/riser.log" 2>&1 &
riser_pid=$!
for _ in $(seq 150); do rpc spdk_get_version >/dev/null 2>&1 && break; kill -0 "$riser_pid" 2>/dev/null || fail "riser exited at start"; sleep 0.2; done
grep -q 'CapEff:.*' "/proc/$riser_pid/status" && echo "riser CapEff: $(awk '/CapEff/ {print $2}' "/proc/$riser_pid/status"), memlock: $(awk '/locked memory/ {print $5}' "/proc/$riser_pid/limits")"
wait_iser_listener
if timeout 60 iscsi-inq "iser://$RXE_IP/$iqn/0" >"$logs/inq-memlock.log" 2>&1; then
  fail "the iSER login succeeded without the memory for its pools: $(cat "$logs/inq-memlock.log")"
fi
cat "$logs/inq-memlock.log"
grep -q 'cannot allocate connection resources' "$logs/riser.log" || fail "riser did not log why the login failed"
grep -q 'failed (0x0302)' "$logs/riser.log" || fail "riser did not answer 0x0302"
rpc iscsi_get_stats | tr -d ' \n' >"$logs/stats.json"
grep -q '"target_error":[1-9]' "$logs/stats.json" || fail "riser did not count the failure: $(cat "$logs/stats.json")"
echo "iSER login under RLIMIT_MEMLOCK answered 0x0302"
timeout 60 iscsi-inq "iscsi://$RXE_IP/$iqn/0" >"$logs/inq-tcp.log" 2>&1 || fail "TCP login failed meanwhile"
grep -q 'Vendor:RISER' "$logs/inq-tcp.log" || fail "no INQUIRY over TCP"
echo "TCP still served"
riser_stop

step "riser as usual; 200 rping clients against its iSER portal"
: >"$logs/riser.log"
riser_start /tmp/riser.json --poll-mode adaptive
wait_iser_listener
for i in $(seq 200); do
  timeout 30 rping -c -a "$RXE_IP" -p 3260 -C 1 -S 64 >>"$logs/rping.log" 2>&1 &
  extra_pids="$extra_pids $!"
done
iscsid_start
iface_iser
discover iser0
sid=$(login "$iqn" iser0)
disk=$(disk_of "$sid" 0)
raw_verify "$disk" 4 iser
logout_sid "$sid"
for p in $extra_pids; do wait "$p" 2>/dev/null || true; done
extra_pids=
rejected=$(grep -c 'unexpected iSER message\|undecodable message\|logins in progress' "$logs/riser.log" || true)
echo "rping connections ended by riser: $rejected"
[ "$rejected" -ge 1 ] || fail "no rping connection reached riser"
wait_no_connections 30
riser_stop
echo "ISER LIMITS OK"
