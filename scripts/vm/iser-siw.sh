#!/usr/bin/env bash
# rxe-vm: needs siw
# riser's iSER over soft-iWARP (siw) instead of soft-RoCE, inside the VM:
#   scripts/rxe-vm.sh run scripts/vm/iser-siw.sh
# (the line above has rxe-vm.sh build Debian's missing siw module on the host first:
# scripts/vm/build-siw.sh).
#
# siw0 on a dummy interface d1 with 198.51.100.1/24 (ibv_devinfo must say iWARP); riser with
# a 64 MiB malloc LUN on an iSER portal there; riser-perf --verify over iser:// with 4 KiB,
# 256 KiB (8 MiB) and 1 MiB I/Os (all 64 MiB): every block checked, none mismatched, the session RDMAExtensions=Yes;
# then iscsi_get_stats: no read or solicited write byte copied by riser's CPU (RDMA Write
# from and RDMA Read into riser's I/O buffers, zero copy, on iWARP too); riser-perf logs out
# and riser frees the connection. Then the Linux initiator (ib_iser) over the same portal:
# login, 4 MiB of random data written and read back identical; then, with that session
# logged in, a hostile iWARP peer (riser-perf --iser-attack-write: its own connection to the
# portal, no login) RDMA-Writes to keys riser used for that session's data: a pooled I/O
# buffer's registration and the sink of a finished RDMA Read (taken from riser's debug log).
# Both writes must be refused (siw answers a TERMINATE and the attacker's connection fails
# before its login), and the session's next 4 MiB still verify (issue #22, item 11); logout,
# no connection left.
#
# First, riser under siw's default 8 MiB RLIMIT_MEMLOCK: it must say at the portal's start
# that the limit is below the I/O buffer budget and how to raise it, and again (once) at the
# first registration refused for it (issue #22, item 13).
#
# On iWARP the iSER portal must not share its address and port with a TCP portal: iWARP's
# connection manager listens on the kernel's TCP port itself (siw: a kernel socket), so the
# node record of the Linux initiator is made by hand, without discovery.
#
# Needs the host-built riser, riser-rpc and riser-perf in $RISER_BIN_DIR. Prints "ISER SIW OK"
# last on success, "ISER SIW FAILED: why" otherwise.
set -euo pipefail
name=iser-siw
. scripts/vm/lib.sh

SIW_IP=198.51.100.1
SIW_DEV=siw0
SIW_NETDEV=d1
# lib.sh's login() talks to $RXE_IP.
RXE_IP=$SIW_IP
port=3260
iqn=iqn.2016-06.io.riser:siw
lun_mib=64

[ -x "$bin/riser-perf" ] || fail "$bin/riser-perf missing: cargo build -p riser-perf on the host"

# ---- siw0 ------------------------------------------------------------------------------------
step "siw: $SIW_DEV on $SIW_NETDEV ($SIW_IP)"
# Network interfaces only inside the VM (guest-run.sh marks it), never on a host.
grep -q 'riser\.run=' /proc/cmdline && [ "${RISER_VM:-}" = 1 ] || fail "run inside the test VM only: scripts/rxe-vm.sh run $0"
# siw.ko comes from scripts/vm/build-siw.sh (/lib/modules/VER/updates); it needs ib_core
# (rdma_ucm pulls it in) and libcrc32c; its CRC32C comes through the crypto API.
modprobe -a dummy rdma_ucm ib_uverbs libcrc32c crc32c_generic ib_iser sd_mod \
  || fail "modprobe of the RDMA modules failed"
modprobe siw || fail "modprobe siw failed: is /lib/modules/$(uname -r)/updates/siw.ko on the host (scripts/vm/build-siw.sh)?"
ip link add "$SIW_NETDEV" type dummy && ip addr add "$SIW_IP/24" dev "$SIW_NETDEV" && ip link set "$SIW_NETDEV" up \
  || fail "cannot set up $SIW_NETDEV with $SIW_IP"
rdma link add "$SIW_DEV" type siw netdev "$SIW_NETDEV" || fail "rdma link add $SIW_DEV type siw netdev $SIW_NETDEV failed"
info=''
for _ in $(seq 50); do
  info=$(ibv_devinfo -d "$SIW_DEV" 2>&1 || true)
  grep -q 'state:.*PORT_ACTIVE' <<<"$info" && break
  sleep 0.1
done
echo "$info" >"$logs/ibv_devinfo.log"
grep -q 'state:.*PORT_ACTIVE' <<<"$info" || fail "$SIW_DEV port is not ACTIVE: $info"
grep -q 'transport:.*iWARP' <<<"$info" || fail "$SIW_DEV is not an iWARP device: $(grep transport: <<<"$info")"
echo "iser-siw: $SIW_DEV on $SIW_NETDEV ($SIW_IP) is ACTIVE, $(grep -o 'transport:.*' <<<"$info" | tr -s '\t ' ' ')"

# ---- riser, riser-perf -------------------------------------------------------------------------
# siw pins registered memory against RLIMIT_MEMLOCK even for root (siw_umem_get checks the
# limit without looking at CAP_IPC_LOCK, unlike ib_umem_get for rxe and hardware): with the
# default 8 MiB, riser's pooled, registered I/O buffers (up to its 48 MiB budget) hit
# ENOMEM in ibv_reg_mr at the first 1 MiB I/Os. riser and riser-perf inherit this.
ncpu=$(nproc)
core=$((ncpu - 1))
cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":$((lun_mib * 2048)),"block_size":512}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$SIW_IP","port":"$port","iser":true}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"siw","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Malloc0","lun_id":0}],"queue_depth":64}}]}]}
JSON
url="iser://$SIW_IP:$port/$iqn/0"

# ---- RLIMIT_MEMLOCK too low: riser says why and how to fix it -------------------------------
step "riser under the default 8 MiB RLIMIT_MEMLOCK: the limit, the budget and the fix in its log"
ulimit -l 8192 || fail "cannot set RLIMIT_MEMLOCK to 8 MiB"
RISER_LOG=info riser_start /tmp/riser.json --poll-mode adaptive -m "[$core]"
for _ in $(seq 50); do grep -q "iSER portal $SIW_IP:$port (portal group 1): listening" "$logs/riser.log" && break; sleep 0.2; done
grep -q "iSER portal $SIW_IP:$port: RLIMIT_MEMLOCK is 8 MiB (siw counts it even with CAP_IPC_LOCK), below what iSER registers with the RDMA device: the I/O buffer budget (48 MiB) plus about .* Fix: raise it above the budget: .ulimit -l unlimited.* LimitMEMLOCK=infinity" "$logs/riser.log" \
  || fail "memlock: riser did not warn at the portal's start: $(grep -i memlock "$logs/riser.log" | head -n 3)"
echo "iser-siw: memlock at start: $(grep -o 'RLIMIT_MEMLOCK is 8 MiB.*per connection' "$logs/riser.log" | head -n 1)"
# 1 MiB writes at QD 16 need more registered memory than 8 MiB: riser-perf (not limited)
# fails, riser logs the first refusal once, with the fix.
rc=0
timeout 120 prlimit --memlock=unlimited "$bin/riser-perf" --login-timeout 30 --qd 16 --bs 1048576 --rw write --time 2 --ramp 0 "$url" \
  >"$logs/perf-memlock.log" 2>&1 || rc=$?
n=$(grep -c 'iSER: registering .* with the RDMA device was refused (ENOMEM) under RLIMIT_MEMLOCK 8 MiB (siw counts it even with CAP_IPC_LOCK); .*Fix: raise it' "$logs/riser.log" || true)
[ "$n" = 1 ] || fail "memlock: riser logged the refused registration $n times, not once (riser-perf exited $rc): $(grep -i 'memlock\|register' "$logs/riser.log" | head -n 5)"
echo "iser-siw: memlock refusal logged once: $(grep -o 'registering .* was refused (ENOMEM) under RLIMIT_MEMLOCK 8 MiB' "$logs/riser.log")"
riser_stop
: >"$logs/riser.log"

ulimit -l unlimited || fail "cannot lift RLIMIT_MEMLOCK (siw counts every registration against it)"
step "riser: malloc LUN ${lun_mib} MiB, iSER portal $SIW_IP:$port, reactor on vCPU $core"
# The iSER verbs glue at debug level: it logs the keys riser registers (the hostile peer
# below takes them from there).
RISER_LOG=${RISER_LOG:-info,riser_datamover::iser::verbs=debug} riser_start /tmp/riser.json --poll-mode adaptive -m "[$core]"

# LABEL BS [FLAGS...]: riser-perf --verify, PASSED, blocks checked, none mismatched, over iSER,
# logged out without a complaint.
verify_ok() {
  local label=$1 bs=$2 out rc=0 t0=$SECONDS; shift 2
  out=$("$bin/riser-perf" --login-timeout 30 --verify --qd "${VERIFY_QD:-16}" --bs "$bs" "$@" "$url" 2>&1) || rc=$?
  echo "$out" >"$logs/verify-$label.log"
  [ $rc = 0 ] || fail "$label: riser-perf --verify --bs $bs exited with $rc: $(tail -n 5 <<<"$out")"
  grep -q '^verify: PASSED$' <<<"$out" || fail "$label: no 'verify: PASSED': $(tail -n 5 <<<"$out")"
  verify_checked "$label" "$out"
  local checked=$verified_blocks
  # A clean logout on riser's side: it took the Logout Request, answered it and said so.
  local logged_out
  logged_out=$(grep -c '): logged out$' "$logs/riser.log" || true)
  [ "$logged_out" -gt "$riser_logouts" ] || fail "$label: riser logged no logout of riser-perf's session"
  riser_logouts=$logged_out
  # On iWARP the target's close after the Logout Response flushes the initiator's spare
  # receives, maybe in the same CQ poll as that response: riser-perf ignores those flushes
  # once the response is in, so any complaint about the logout is a failure.
  if grep -qi 'logout' <<<"$out"; then
    fail "$label: riser-perf complained about the logout: $(grep -i 'logout' <<<"$out")"
  fi
  echo "iser-siw: riser-perf verify $label: PASSED, $checked blocks checked, 0 mismatched ($((SECONDS - t0)) s)"
}

riser_logouts=0
step "riser-perf --verify over iSER on siw"
verify_ok 4k 4096 --lba-range 0:4096
verify_ok 256k 262144 --lba-range 0:16384
VERIFY_QD=4 verify_ok 1m 1048576

# Zero copy on iWARP too: read data goes out by RDMA Write from riser's I/O buffer, solicited
# write data comes in by RDMA Read into it; the CPU copies neither (immediate data may be).
assert_zero_copy "iSER on siw"
wait_no_connections 30
echo "iser-siw: riser logged out riser-perf's $riser_logouts sessions"
# ---- the iSER Hello (RFC 7145 §5.1.4, §9.3) --------------------------------------------------
# No initiator here sends iSERHelloRequired=Yes but riser-perf --iser-hello: it offers the key
# (OR: riser answers Yes), sends the Hello (versions 10..10, its IRD) as the first message of
# full-feature phase, checks the HelloReply (version 10, ORD <= IRD), then runs I/O.
step "riser-perf --iser-hello --verify over siw: Hello / HelloReply, then I/O"
verify_ok hello 65536 --lba-range 0:8192 --iser-hello
grep -q 'iSER Hello: versions 10\.\.=10, IRD [0-9]*; HelloReply: version 10 (target.s highest 10), ORD [0-9]*' "$logs/verify-hello.log" \
  || fail "hello: riser-perf printed no accepted HelloReply: $(grep -i hello "$logs/verify-hello.log" | head -n 3)"
grep -o 'iSER Hello: versions .*' "$logs/verify-hello.log" | sed 's/^/iser-siw: riser-perf: /'
wait_no_connections 30
# A Hello without riser's version: riser answers a HelloReply with the reject bit and closes
# the connection; riser-perf reports the rejection and fails (exit status not 0).
step "riser-perf --iser-hello with versions 1..1: riser rejects the Hello"
mark=$(wc -l <"$logs/riser.log")
rc=0
out=$("$bin/riser-perf" --login-timeout 30 --iser-hello --iser-hello-versions 1:1 --time 1 --ramp 0 --qd 1 "$url" 2>&1) || rc=$?
echo "$out" >"$logs/hello-bad.log"
[ "$rc" != 0 ] || fail "bad hello: riser-perf exited 0 after a Hello with versions 1..1"
grep -q 'the target rejected our iSER Hello (versions 1..=1): HelloReply with the reject bit' <<<"$out" \
  || fail "bad hello: riser-perf did not report a rejected Hello: $(tail -n 3 <<<"$out")"
for _ in $(seq 20); do tail -n +"$((mark + 1))" "$logs/riser.log" | has 'ended: iSER Hello for versions 1..=1, not 10: rejected' && break; sleep 0.5; done
tail -n +"$((mark + 1))" "$logs/riser.log" | has 'iSER Hello for versions 1..=1, not 10: rejected' \
  || fail "bad hello: riser logged no rejected Hello: $(tail -n +"$((mark + 1))" "$logs/riser.log" | grep -i 'hello\|ended' | head -n 5)"
echo "iser-siw: a Hello with versions 1..1 was rejected (HelloReply reject bit) and the connection closed: $(grep -o 'rejected our iSER Hello.*' <<<"$out" | head -n 1)"
wait_no_connections 30

# ---- the Linux initiator (ib_iser) -------------------------------------------------------------
step "Linux ib_iser over siw"
iscsid_start
iface_iser
iscsiadm -m node -o new -T "$iqn" -p "$SIW_IP:$port" -I iser0 >>"$logs/iscsiadm.log" 2>&1 \
  || fail "cannot add the node record $iqn $SIW_IP:$port through iser0"
sid=$(login "$iqn" iser0)
[ "$(transport_of "$sid")" = iser ] || fail "session $sid runs over $(transport_of "$sid"), not iser"
disk=$(disk_of "$sid" 0)
raw_verify "$disk" 4 linux-iser

# ---- a hostile iWARP peer (issue #22, item 11) -----------------------------------------------
# Every connection of the device shares riser's protection domain, and a connection has a QP
# before any login: a key valid for remote write on that PD is open to every peer. The keys
# riser used for the session above, from its debug log: the lasting registration of a pooled
# I/O buffer (what the session's READs were RDMA-Written from) and the sink of an RDMA Read
# (a WRITE's data) after it completed. An attacker connects on its own and RDMA-Writes to each
# before logging in; riser's RNIC must refuse both (TERMINATE, the attacker's connection
# fails), and the session's I/O goes on, verified.
step "hostile iWARP peer: RDMA Writes to the keys of another connection's buffers"
# attack TAG WHAT STAG ADDR
attack() {
  local tag=$1 what=$2 stag=$3 addr=$4 out rc=0 before
  before=$(dmesg | grep -c 'siw: got TERMINATE. layer 1, type 1' || true)
  out=$(timeout 60 "$bin/riser-perf" --login-timeout 10 --time 1 --ramp 0 --qd 1 --iser-attack-write "$stag:$addr" "$url" 2>&1) || rc=$?
  echo "$out" >"$logs/attack-$tag.log"
  [ "$rc" != 0 ] || fail "attack $what: riser-perf --iser-attack-write exited 0: $(tail -n 3 <<<"$out")"
  grep -q 'attack: ACCEPTED' <<<"$out" && fail "attack $what: riser took an RDMA Write to STag $stag at $addr from a peer that never logged in: $(grep -o 'attack: .*' <<<"$out")"
  grep -q 'attack: REFUSED' <<<"$out" || fail "attack $what: no verdict from riser-perf: $(tail -n 3 <<<"$out")"
  grep -q 'timed out' <<<"$out" && fail "attack $what: the connection timed out instead of failing: $(grep -o 'attack: .*' <<<"$out")"
  local terms
  terms=$(( $(dmesg | grep -c 'siw: got TERMINATE. layer 1, type 1' || true) - before ))
  echo "iser-siw: hostile peer: RDMA Write to $what (STag $stag at $addr) refused; siw TERMINATEs (DDP tagged buffer) to the attacker: $terms; $(grep -o 'failed the connection before the login completed.*' <<<"$out" | head -n 1)"
}
reg=$(grep -o 'iSER: I/O buffer 0x[0-9a-f]*+[0-9]* registered: lkey 0x[0-9a-f]*' "$logs/riser.log" | tail -n 1 || true)
[ -n "$reg" ] || fail "attack: riser logged no I/O buffer registration at debug level"
pool_addr=$(sed 's/.*buffer \(0x[0-9a-f]*\)+.*/\1/' <<<"$reg")
pool_key=$(sed 's/.*lkey \(0x[0-9a-f]*\).*/\1/' <<<"$reg")
# The registration must still be live (else a refusal proves nothing): rdma's resource
# tracking lists the device's MRs with their keys (and the registering thread's id, not
# riser's pid; a key is unique on the device).
rdma resource show mr >"$logs/rdma-mr.log" 2>&1 || true
if grep -q ' rkey 0x' "$logs/rdma-mr.log"; then
  grep -q " rkey $pool_key " "$logs/rdma-mr.log" || fail "attack: the pool registration $pool_key is no longer live: $(head -n 5 "$logs/rdma-mr.log")"
  echo "iser-siw: the pool registration $pool_key at $pool_addr is live (rdma resource show mr: $(grep " rkey $pool_key " "$logs/rdma-mr.log" | grep -o 'mrlen [0-9]*'))"
fi
attack pool "a pooled I/O buffer" "$pool_key" "$pool_addr"
sink=$(grep -o 'iSER: RDMA Read sink 0x[0-9a-f]*+[0-9]*: STag 0x[0-9a-f]* revoked' "$logs/riser.log" | tail -n 1 || true)
[ -n "$sink" ] || fail "attack: riser logged no revoked RDMA Read sink at debug level"
sink_addr=$(sed 's/.*sink \(0x[0-9a-f]*\)+.*/\1/' <<<"$sink")
sink_key=$(sed 's/.*STag \(0x[0-9a-f]*\) revoked.*/\1/' <<<"$sink")
attack sink "a finished RDMA Read's sink" "$sink_key" "$sink_addr"
[ "$(transport_of "$sid")" = iser ] || fail "the Linux session $sid is gone after the attacks"
raw_verify "$disk" 4 linux-iser-after-attack
logout_sid "$sid"
wait_no_connections 30

riser_stop
echo "ISER SIW OK"
