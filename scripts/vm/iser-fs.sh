#!/usr/bin/env bash
# iSER acceptance, inside the VM: scripts/rxe-vm.sh run scripts/vm/iser-fs.sh
#
# riser serves a 64 MiB malloc LUN on a portal group with an iSER portal and a TCP portal on
# the soft-RoCE address. The Linux initiator discovers over TCP and logs in through an iface
# with transport iser; then:
#   - 64 MiB of random data written with dd oflag=direct reads back identical;
#   - mkfs.ext4, mount, copy a file tree (3 MiB of /usr/share/doc and a 2 MiB random
#     file), unmount, fsck.ext4 -fn clean, mount again, sha256 of every file identical;
#   - logout; riser's iscsi_get_connections is empty.
# (libiscsi over iSER is in iser-fault.sh.) Prints "ISER FS OK" last on success, "ISER FS FAILED: why" otherwise.
set -euo pipefail
. scripts/vm/rxe-up.sh
name=iser-fs
. scripts/vm/lib.sh

iqn=iqn.2016-06.io.riser:iser
mib=${ISER_TEST_MIB:-64}

step "riser with an iSER and a TCP portal on $RXE_IP"
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":$((mib * 2048)),"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"3260","iser":true},{"host":"$RXE_IP","port":"3260"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"iser","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0}],"queue_depth":32}}]}]}
JSON
riser_start /tmp/riser.json --poll-mode adaptive
# The tree comes through the slow 9p root: build it while the login goes on.
make_tree /tmp/tree >"$logs/tree.out" 2>&1 &
tree_pid=$!

step "iscsid, discovery over TCP, login through an iser iface"
iscsid_start
iface_iser
discover iser0
sid=$(login "$iqn" iser0)
[ "$(transport_of "$sid")" = iser ] || fail "session $sid runs over '$(transport_of "$sid")', not iser"
disk=$(disk_of "$sid" 0)
echo "session $sid (iser): /dev/$disk, $(blockdev --getsize64 "/dev/$disk") bytes"
conns=$(connections)
grep -q '"transport":"iser"' <<<"$conns" || fail "riser does not show an iser connection: $conns"

step "$mib MiB of random data, O_DIRECT, read back"
raw_verify "$disk" "$mib" iser

step "ext4: mkfs, copy a tree, fsck, remount, checksums"
wait "$tree_pid" || fail "building the file tree failed: $(cat "$logs/tree.out")"
cat "$logs/tree.out"
fs_verify "$disk" /tmp/tree iser

step "logout"
logout_sid "$sid"
wait_no_connections 30

step "stop riser"
riser_stop
grep -E 'WARN|ERROR' "$logs/riser.log" | head -n 20 || true
echo "ISER FS OK"
