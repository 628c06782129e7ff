#!/usr/bin/env bash
# iSER and iSCSI/TCP at once, inside the VM: scripts/rxe-vm.sh run scripts/vm/iser-tcp.sh
#
# riser serves ONE target with two 64 MiB malloc LUNs on a portal group with an iSER portal
# and a TCP portal on the soft-RoCE address (same address and port: rdma_cm and TCP port
# spaces are apart). The Linux initiator logs in to that target twice, through an iface with
# transport iser and through the default (tcp) iface: two sessions of one target, one per
# transport. At the same time:
#   - over iSER, on LUN 0: 64 MiB of random data (dd oflag=direct) read back identical, then
#     mkfs.ext4, copy a file tree, unmount, fsck.ext4 -fn clean, remount, sha256 identical;
#   - over TCP, on LUN 1: the same.
# Then both log out and riser's iscsi_get_connections is empty.
# Prints "ISER TCP OK" last on success, "ISER TCP FAILED: why" otherwise.
set -euo pipefail
. scripts/vm/rxe-up.sh
name=iser-tcp
. scripts/vm/lib.sh

iqn=iqn.2016-06.io.riser:disks
mib=${ISER_TEST_MIB:-64}

step "riser: one target, two LUNs, an iSER and a TCP portal on $RXE_IP"
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[
{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":$((mib * 2048)),"block_size":512}},
{"method":"bdev_malloc_create","params":{"name":"Malloc1","num_blocks":$((mib * 2048)),"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"3260","iser":true},{"host":"$RXE_IP","port":"3260"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"disks","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0},{"bdev_name":"Malloc1","lun_id":1}],"queue_depth":32}}]}]}
JSON
riser_start /tmp/riser.json --poll-mode adaptive
make_tree /tmp/tree >"$logs/tree.out" 2>&1 &
tree_pid=$!

step "iscsid, discovery over TCP, one login through iface iser0 (iser), one through default (tcp)"
iscsid_start
iface_iser
discover iser0 default
step "login over iSER"
sid_iser=$(login "$iqn" iser0)
step "login over TCP"
sid_tcp=$(login "$iqn" default)
step "logged in"
[ "$(transport_of "$sid_iser")" = iser ] || fail "session $sid_iser runs over '$(transport_of "$sid_iser")', not iser"
[ "$(transport_of "$sid_tcp")" = tcp ] || fail "session $sid_tcp runs over '$(transport_of "$sid_tcp")', not tcp"
disk_iser=$(disk_of "$sid_iser" 0)
disk_tcp=$(disk_of "$sid_tcp" 1)
echo "session $sid_iser (iser): LUN 0 is /dev/$disk_iser; session $sid_tcp (tcp): LUN 1 is /dev/$disk_tcp"
conns=$(connections)
echo "$conns" >"$logs/conns.json"
grep -q '"transport":"iser"' <<<"$conns" && grep -q '"transport":"tcp"' <<<"$conns" \
  || fail "riser does not show one iser and one tcp connection: $conns"
wait "$tree_pid" || fail "building the file tree failed: $(cat "$logs/tree.out")"
cat "$logs/tree.out"

step "both at once: $mib MiB raw + ext4 over iSER (LUN 0) and over TCP (LUN 1)"
( raw_verify "$disk_iser" "$mib" iser && fs_verify "$disk_iser" /tmp/tree iser ) >"$logs/io-iser.out" 2>&1 &
io_iser=$!
( raw_verify "$disk_tcp" "$mib" tcp && fs_verify "$disk_tcp" /tmp/tree tcp ) >"$logs/io-tcp.out" 2>&1 &
io_tcp=$!
extra_pids="$io_iser $io_tcp"
rc_iser=0; wait "$io_iser" || rc_iser=$?
step "iSER side done (status $rc_iser)"
rc_tcp=0; wait "$io_tcp" || rc_tcp=$?
step "TCP side done (status $rc_tcp)"
extra_pids=
cat "$logs/io-iser.out" "$logs/io-tcp.out"
[ $rc_iser = 0 ] || fail "the iSER side failed"
[ $rc_tcp = 0 ] || fail "the TCP side failed"

step "logout of both"
logout_sid "$sid_iser"
logout_sid "$sid_tcp"
wait_no_connections 30

step "stop riser"
riser_stop
grep -E 'WARN|ERROR' "$logs/riser.log" | head -n 20 || true
echo "ISER TCP OK"
