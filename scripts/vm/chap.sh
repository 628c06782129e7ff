#!/usr/bin/env bash
# CHAP with the Linux initiator (open-iscsi), inside the VM: scripts/rxe-vm.sh run scripts/vm/chap.sh
#
# riser serves one target whose node requires mutual CHAP (auth group 1), on a portal group
# with an iSER and a TCP portal on the soft-RoCE address; discovery requires CHAP too.
#   - discovery without CHAP is refused; with the discovery secret it lists the target;
#   - a login over TCP with mutual CHAP and CHAP_A SHA-256 (node.session.auth.chap_algs),
#     8 MiB verified;
#   - a login over iSER with mutual CHAP and SHA3-256, 8 MiB verified;
#   - logins to a second target that requires one-way CHAP: MD5 over TCP and SHA-1 over
#     iSER, 4 MiB verified each;
#   - a login with a wrong password (through a third iface) fails cleanly, riser counts it,
#     while both authenticated sessions keep doing verified I/O;
#   - no secret in riser's log; logout leaves no connection.
# Prints "CHAP OK" last on success, "CHAP FAILED: why" otherwise.
set -euo pipefail
. scripts/vm/rxe-up.sh
name=chap
. scripts/vm/lib.sh

iqn=iqn.2016-06.io.riser:chap
user=vm-alice secret=alice-secret-01 muser=riser-target msecret=target-secret-02

step "riser: a mutual-CHAP target and CHAP discovery, iSER and TCP portals on $RXE_IP"
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[
{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":32768,"block_size":512}},
{"method":"bdev_malloc_create","params":{"name":"Malloc1","num_blocks":32768,"block_size":512}},
{"method":"bdev_malloc_create","params":{"name":"Malloc2","num_blocks":16384,"block_size":512}}]},
{"subsystem":"iscsi","config":[
{"method":"iscsi_create_auth_group","params":{"tag":1,"secrets":[{"user":"$user","secret":"$secret","muser":"$muser","msecret":"$msecret"}]}},
{"method":"iscsi_set_discovery_auth","params":{"require_chap":true,"chap_group":1}},
{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"3260","iser":true},{"host":"$RXE_IP","port":"3260"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"chap","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0},{"bdev_name":"Malloc1","lun_id":1}],"queue_depth":32,"require_chap":true,"mutual_chap":true,"chap_group":1}},
{"method":"iscsi_create_target_node","params":{"name":"oneway","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc2","lun_id":0}],"queue_depth":32,"require_chap":true,"chap_group":1}}]}]}
JSON
riser_start /tmp/riser.json --poll-mode adaptive

step "iscsid; discovery without CHAP is refused"
# iscsid on riser's reactor core (riser's -m is 0x1): over soft-RoCE the kernel handles
# riser's Login Responses in softirq on the core that posted them, and Linux's initiator
# hands a Login Response to iscsid before it frees its login task (see login() in lib.sh).
# On another vCPU iscsid can win that race whenever the host preempts the vCPU in between,
# which a loaded 2-core CI host does often enough to fail CHAP's four-step iSER logins;
# on the same core, the softirq always finishes first.
ISCSID_CPUS=0 iscsid_start
iface_iser
iscsiadm -m iface -I tcp2 -o new >>"$logs/iscsiadm.log" 2>&1 || fail "cannot create iface tcp2"
if iscsiadm -m discovery -t st -p "$RXE_IP" -I default >"$logs/discovery-noauth.log" 2>&1; then
  fail "discovery without CHAP succeeded: $(cat "$logs/discovery-noauth.log")"
fi
echo "discovery without CHAP refused"

step "discovery with CHAP"
dsc() { iscsiadm -m discoverydb -t sendtargets -p "$RXE_IP" "$@" >>"$logs/discovery.log" 2>&1; }
dsc -o new || true
dsc -o update -n discovery.sendtargets.auth.authmethod -v CHAP || fail "discoverydb update failed"
dsc -o update -n discovery.sendtargets.auth.username -v "$user" || fail "discoverydb update failed"
dsc -o update -n discovery.sendtargets.auth.password -v "$secret" || fail "discoverydb update failed"
iscsiadm -m discoverydb -t sendtargets -p "$RXE_IP" -I default --discover >"$logs/discovered.log" 2>&1 \
  || fail "discovery with CHAP failed"
cat "$logs/discovered.log"
grep -q "$iqn" "$logs/discovered.log" || fail "discovery did not list $iqn"
echo "discovery with CHAP lists $iqn"

# The node record of target T (default $iqn) through IFACE with CHAP: USER PASSWORD, CHAP_A
# ALGS, mutual with $muser unless MUTUAL=no.
node_chap() {
  local iface=$1 pass=$2 algs=$3 t=${T:-$iqn} n
  iscsiadm -m node -T "$t" -p "$RXE_IP" -I "$iface" -o new >>"$logs/iscsiadm.log" 2>&1 || true
  n() { iscsiadm -m node -T "$t" -p "$RXE_IP" -I "$iface" -o update -n "$1" -v "$2" >>"$logs/iscsiadm.log" 2>&1 \
          || fail "iscsiadm: cannot set $1 on $iface"; }
  n node.session.auth.authmethod CHAP
  n node.session.auth.username "$user"
  n node.session.auth.password "$pass"
  if [ "${MUTUAL:-yes}" = yes ]; then
    n node.session.auth.username_in "$muser"
    n node.session.auth.password_in "$msecret"
  fi
  n node.session.auth.chap_algs "$algs"
}

step "login over TCP: mutual CHAP, SHA-256"
node_chap default "$secret" SHA256
sid_tcp=$(login "$iqn" default)
[ "$(transport_of "$sid_tcp")" = tcp ] || fail "session $sid_tcp is not tcp"
disk_tcp=$(disk_of "$sid_tcp" 0)
raw_verify "$disk_tcp" 8 tcp

step "login over iSER: mutual CHAP, SHA3-256"
node_chap iser0 "$secret" SHA3-256
sid_iser=$(login "$iqn" iser0)
[ "$(transport_of "$sid_iser")" = iser ] || fail "session $sid_iser is not iser"
disk_iser=$(disk_of "$sid_iser" 1)
raw_verify "$disk_iser" 8 iser

step "one-way CHAP to a second target: MD5 over TCP, SHA-1 over iSER"
T=iqn.2016-06.io.riser:oneway MUTUAL=no node_chap default "$secret" MD5
sid_one=$(login iqn.2016-06.io.riser:oneway default)
disk_one=$(disk_of "$sid_one" 0)
raw_verify "$disk_one" 4 oneway
logout_sid "$sid_one"
T=iqn.2016-06.io.riser:oneway MUTUAL=no node_chap iser0 "$secret" SHA1
sid_one=$(login iqn.2016-06.io.riser:oneway iser0)
[ "$(transport_of "$sid_one")" = iser ] || fail "session $sid_one is not iser"
disk_one=$(disk_of "$sid_one" 0)
raw_verify "$disk_one" 4 oneway-iser
logout_sid "$sid_one"

step "a wrong password fails cleanly"
node_chap tcp2 wrong-password-0 "SHA256,MD5"
if iscsiadm -m node -T "$iqn" -p "$RXE_IP" -I tcp2 --login >"$logs/login-wrong.log" 2>&1; then
  fail "a login with a wrong password succeeded"
fi
grep -i "authorization failure\|authentication failure\|auth" "$logs/login-wrong.log" | head -n 3 || true
rpc iscsi_get_stats | tr -d ' \n' >"$logs/stats.json"
cat "$logs/stats.json"; echo
grep -q '"authentication":[1-9]' "$logs/stats.json" || fail "riser did not count the authentication failure"
grep -q 'failed (0x0201)' "$logs/riser.log" || fail "riser did not log the authentication failure"

grep -q 'authenticated with sha256' "$logs/riser.log" || fail "no CHAP_A SHA-256 login in riser's log"
grep -q 'authenticated with sha3-256' "$logs/riser.log" || fail "no CHAP_A SHA3-256 login in riser's log"
grep -q 'authenticated with md5' "$logs/riser.log" || fail "no CHAP_A MD5 login in riser's log"
grep -q 'authenticated with sha1' "$logs/riser.log" || fail "no CHAP_A SHA-1 login in riser's log"
echo "CHAP_A: sha256 over TCP, sha3-256 over iSER, md5 one-way over TCP, sha1 one-way over iSER"

step "the authenticated sessions still do verified I/O"
raw_verify "$disk_tcp" 8 tcp-again
raw_verify "$disk_iser" 8 iser-again

step "no secret in riser's log; logout"
for s in "$secret" "$msecret"; do
  ! grep -q -- "$s" "$logs/riser.log" || fail "riser's log shows a secret"
done
logout_sid "$sid_tcp"
logout_sid "$sid_iser"
wait_no_connections 30
riser_stop
echo "CHAP OK"
