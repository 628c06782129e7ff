#!/usr/bin/env bash
# rxe-vm: needs nvme
# NVMe acceptance, inside the VM, in two boots that share qemu's NVMe backing file and
# $RISER_VM_OUT (scripts/rxe-vm.sh gives the guest `-device nvme` with cache=none and
# nvme.poll_queues=2 because of the header line above):
#
#   scripts/rxe-vm.sh run scripts/vm/nvme.sh first    (a), (b), first half of (c); ends by
#                                                     cutting the VM off (sysrq b)
#   scripts/rxe-vm.sh run scripts/vm/nvme.sh second   second half of (c)
#
# (a) riser attaches the emulated controller (bdev_nvme_attach_controller, trtype PCIe, its
#     PCI address from sysfs) and serves Nvme0n1 on an iSER + TCP portal group; riser-perf
#     --verify over iser:// (4 KiB, 256 KiB and 1 MiB I/Os: the last split into several NVMe
#     commands by the driver's transfer limit): zero mismatches. Then the proof the I/O went
#     by io_uring passthrough on the poll queues: riser's log names the path
#     "passthrough+iopoll", bdev_get_bdevs' driver_specific says io_path passthrough+iopoll
#     with reads and writes reaped by polling (polled_commands; data-less commands, Flush and
#     Write Zeroes, go by interrupt: Linux 6.1 cannot poll them), and the controller's I/O
#     queue interrupts (/proc/interrupts) barely move meanwhile: poll queues have none.
# (b) libiscsi's compliance suite (one iscsi-test-cu run over TCP: the suites that reach the
#     device, see below; RISER_NVME_COMPLIANCE=ALL for all of it) on the NVMe LUN:
#     prints "nvme compliance: ran R, passed P, failed F, skipped S: [names]" (the host test
#     judges F = 0 and S against the malloc LUN's skips).
# (c) crash: Linux ib_iser logs in to the NVMe LUN, mkfs.ext4, a file tree copied, `sync`;
#     the tree's checksums and riser's save_config go to $RISER_VM_OUT; more writes start
#     (never synced) and the VM is cut off with `echo b >/proc/sysrq-trigger` (qemu's
#     -no-reboot ends it: no shutdown, no unmount, riser and the initiator gone mid-I/O).
#     Second boot: riser --json with the saved config (the same PCI address), login over
#     iSER, mount (journal replay) and umount, fsck.ext4 -fn clean, every synced file's
#     sha256 identical.
#
# Prints "NVME FIRST OK" (then the VM is cut) or "NVME CRASH OK" last on success,
# "NVME FAILED: why" otherwise.
set -euo pipefail
phase=${1:?usage: nvme.sh first|second}
. scripts/vm/rxe-up.sh
name=nvme
. scripts/vm/lib.sh

iqn=iqn.2016-06.io.riser:nvme
state=$RISER_VM_OUT/nvme-state
mkdir -p "$state"
riser_args=(--poll-mode busy -m "[$(($(nproc) - 1))]")

step "nvme driver with poll queues"
modprobe nvme || fail "modprobe nvme failed"
ctrl=
for _ in $(seq 100); do
  for c in /sys/class/nvme/nvme*; do [ -e "$c/device" ] && ctrl=$c && break; done
  [ -n "$ctrl" ] && [ -e /dev/ng0n1 ] && break
  sleep 0.2
done
[ -n "$ctrl" ] || fail "no NVMe controller in the VM (is qemu's -device nvme there? the script needs the '# rxe-vm: needs nvme' header)"
[ -c /dev/ng0n1 ] || fail "no /dev/ng0n1: the kernel has no NVMe generic char devices"
traddr=$(basename "$(readlink -f "$ctrl/device")")
ns=$(cd /sys/block && ls -d nvme0n* | head -n 1)
echo "controller ${ctrl##*/} at $traddr, namespace $ns ($(blockdev --getsize64 "/dev/$ns") bytes), poll_queues=$(cat /sys/module/nvme/parameters/poll_queues), io_poll=$(cat "/sys/block/$ns/queue/io_poll")"
[ "$(cat "/sys/block/$ns/queue/io_poll")" = 1 ] || fail "the nvme driver has no poll queues (nvme.poll_queues on the kernel command line?)"

# Interrupts of the controller's I/O queues so far (/proc/interrupts, nvme0q1.., every CPU):
# the poll queues have none, so I/O completed by polling leaves this count alone, while the
# same I/O on the interrupt-driven queues would raise it by about one per command.
io_queue_irqs() {
  awk '$NF ~ /^nvme0q[1-9][0-9]*$/ { for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i } END { print s + 0 }' /proc/interrupts
}

check_path() {
  grep -q "NVMe Nvme0n1: .*I/O path passthrough+iopoll" "$logs/riser.log" \
    || fail "riser did not take the polled passthrough path: $(grep -E 'NVMe|nvme' "$logs/riser.log" | tail -n 5)"
}

if [ "$phase" = first ]; then
  rm -rf "${state:?}"/*
  step "riser: Nvme0 at $traddr, iSER and TCP portals on $RXE_IP"
  cat >/tmp/riser.json <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_nvme_attach_controller","params":{"name":"Nvme0","trtype":"pcie","traddr":"$traddr"}}]},
{"subsystem":"iscsi","config":[{"method":"iscsi_create_portal_group","params":{"tag":1,"portals":[{"host":"$RXE_IP","port":"3260","iser":true},{"host":"$RXE_IP","port":"3260"}]}},
{"method":"iscsi_create_initiator_group","params":{"tag":1,"initiators":["ANY"],"netmasks":["ANY"]}},
{"method":"iscsi_create_target_node","params":{"name":"nvme","pg_ig_maps":[{"pg_tag":1,"ig_tag":1}],"luns":[{"bdev_name":"Nvme0n1","lun_id":0}],"queue_depth":32}}]}]}
JSON
  RISER_LOG=${RISER_LOG:-info} riser_start /tmp/riser.json "${riser_args[@]}"
  check_path
  grep -E "NVMe Nvme0n1: " "$logs/riser.log" | head -n 3
  rpc bdev_nvme_get_controllers >"$logs/controllers.json"
  python3 - "$logs/controllers.json" "$traddr" <<'PY' || fail "bdev_nvme_get_controllers: $(cat "$logs/controllers.json")"
import json, sys
c = json.load(open(sys.argv[1]))
assert len(c) == 1 and c[0]["name"] == "Nvme0", c
t = c[0]["ctrlrs"][0]["trid"]
assert t == {"trtype": "PCIe", "traddr": sys.argv[2]}, t
assert c[0]["bdevs"] == ["Nvme0n1"], c
print("controllers:", json.dumps(c[0]["ctrlrs"][0].get("cdata")))
PY

  # ---- (a) -----------------------------------------------------------------------------
  before=$(io_queue_irqs)
  url="iser://$RXE_IP:3260/$iqn/0"
  for bs in 4096 262144 1048576; do
    step "(a) riser-perf --verify over iSER, $bs-byte I/Os"
    range=$((bs == 4096 ? 16384 : 131072))
    out=$("$bin/riser-perf" --login-timeout 30 --verify --qd 16 --bs "$bs" --lba-range "0:$range" "$url" 2>&1) \
      || fail "riser-perf --verify --bs $bs: $(tail -n 5 <<<"$out")"
    echo "$out" >"$logs/verify-$bs.log"
    grep -q '^verify: PASSED$' <<<"$out" || fail "no 'verify: PASSED' ($bs): $(tail -n 5 <<<"$out")"
    verify_checked "verify $bs" "$out"
    echo "nvme: verify $bs: PASSED, $verified_blocks blocks checked, 0 mismatched"
  done
  after=$(io_queue_irqs)
  rpc bdev_get_bdevs -b Nvme0n1 >"$logs/bdev.json"
  stats=$(python3 - "$logs/bdev.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))[0]
n = b["driver_specific"]["nvme"][0]
assert b["product_name"] == "NVMe disk", b["product_name"]
assert n["io_path"] == "passthrough+iopoll" and n["iopoll"] is True, n
assert n["polled_commands"] > 0 and n["polled_commands"] + n["interrupt_commands"] == n["passthrough_commands"], n
assert n["interrupt_commands"] * 100 < n["polled_commands"], n  # data-less commands only
assert n["failed_commands"] == 0, n
print(n["io_path"], n["passthrough_commands"], n["polled_commands"], b["block_size"], b["num_blocks"], b["write_cache"], n["unmap"])
PY
) || fail "bdev_get_bdevs driver_specific: $(cat "$logs/bdev.json")"
  read -r path cmds polled bsz nblk wc unmap <<<"$stats"
  irqs=$((after - before))
  # A handful of interrupts is the kernel's own business (none of riser's I/O goes there);
  # one per command would be thousands.
  [ "$irqs" -le $((cmds / 100 + 10)) ] || fail "the nvme I/O queues took $irqs interrupts during $cmds passthrough commands: completions were not polled"
  echo "nvme: I/O path $path: $cmds passthrough commands, $polled reaped by polling; the I/O queues' interrupts grew by $irqs meanwhile; $nblk blocks of $bsz, write cache $wc, unmap $unmap"
  grep nvme0q /proc/interrupts >"$logs/interrupts.txt" || true

  # ---- (b) -----------------------------------------------------------------------------
  # The suites that exercise the device under the LUN (reads, writes, verify, compare, write
  # same, unmap, LBA status, sanitize, copy, caching page, capacity): the whole suite (230
  # tests) under TCG outlasts a make test budget (over 9 minutes for part of it), and the
  # suites left out test the SCSI/iSCSI layers above the bdev (INQUIRY, reservations,
  # removable medium, TMF, CmdSN/DataSN, multipath), which the host runs in full on malloc
  # and file LUNs (test/tests/compliance.rs). RISER_NVME_COMPLIANCE=ALL runs everything.
  # One CDB size of each command family (10 and 16 bytes for READ and WRITE): the other sizes
  # reach the device through the same bdev calls, and the host runs them all on malloc and
  # file LUNs; the full list kept the VM busy 11 minutes of make test.
  subset=CompareAndWrite,ExtendedCopy,GetLBAStatus,ModeSense6,OrWrite,Prefetch16,Read10,Read16
  subset+=,ReadCapacity16,Sanitize,Unmap,Verify16,Write10,Write16,WriteSame16,WriteVerify16
  suites=${RISER_NVME_COMPLIANCE:-$(sed 's/\([A-Za-z0-9]*\)/ALL.\1.*/g' <<<"$subset")}
  step "(b) libiscsi compliance suite ($suites, over TCP) on the NVMe LUN"
  t0=$SECONDS
  # Straight into the results share: its progress can be followed from the host.
  clog=$RISER_VM_OUT/nvme-compliance.log
  timeout 1500 iscsi-test-cu --dataloss --allow-sanitize -i iqn.2024-01.io.riser.test:init1 -I iqn.2024-01.io.riser.test:init2 \
    -t "$suites" "iscsi://$RXE_IP:3260/$iqn/0" >"$clog" 2>&1 || true
  cp "$clog" "$logs/compliance.log"
  python3 - "$clog" $((SECONDS - t0)) <<'PY'
import sys
suite = test = ""
skipped, failed = set(), set()
ran = passed = nfail = -1
for line in open(sys.argv[1], errors="replace"):
    t = line.strip()
    if t.startswith("Suite: "): suite = t[7:].strip()
    if t.startswith("Test: "): test = suite + "." + t[6:].split(" ...")[0].strip()
    if "[SKIPPED]" in line and test: skipped.add(test)
    if (t.startswith("FAILED") or "...FAILED" in line) and test: failed.add(test)
    c = t.split()
    if c[:1] == ["tests"] and len(c) >= 5:
        ran, passed, nfail = int(c[2]), int(c[3]), int(c[4])
print("nvme compliance: ran %d, passed %d, failed %d, skipped %d: %s (%s s)" % (ran, passed, nfail, len(skipped), sorted(skipped), sys.argv[2]))
if failed: print("nvme compliance failed tests:", sorted(failed))
PY
  kill -0 "$riser_pid" || fail "riser died during the compliance suite"
  wait_no_connections 60

  # ---- (c), first half ---------------------------------------------------------------------
  step "(c) ib_iser login, ext4, a file tree, sync"
  make_tree /tmp/tree >"$logs/tree.out" 2>&1 || fail "make_tree: $(cat "$logs/tree.out")"
  cat "$logs/tree.out"
  iscsid_start
  iface_iser
  discover iser0
  sid=$(login "$iqn" iser0)
  [ "$(transport_of "$sid")" = iser ] || fail "session $sid is not over iser"
  disk=$(disk_of "$sid" 0)
  mkfs.ext4 -q -F "/dev/$disk" >"$logs/mkfs.log" 2>&1 || fail "mkfs.ext4 /dev/$disk failed"
  mkdir -p /mnt/nvme
  mount "/dev/$disk" /mnt/nvme || fail "mount /dev/$disk failed"
  cp -a /tmp/tree/. /mnt/nvme/ || fail "copying the tree failed"
  sync
  cp /tmp/tree.sha256 "$state/tree.sha256"
  rpc save_config -o "$state/riser.json" || fail "save_config failed"
  grep -q '"bdev_nvme_attach_controller"' "$state/riser.json" || fail "save_config has no bdev_nvme_attach_controller"
  echo "nvme: $(wc -l <"$state/tree.sha256") files synced on /dev/$disk (iser session $sid); config saved"
  # Writes that are never synced, under way when the VM is cut.
  (dd if=/dev/urandom of=/mnt/nvme/unsynced.bin bs=64k count=256 status=none; cp -a /tmp/tree /mnt/nvme/again) >/dev/null 2>&1 &
  sleep 2
  mkdir -p "$RISER_VM_OUT/logs-$name-first" && cp -r "$logs"/. "$RISER_VM_OUT/logs-$name-first/" 2>/dev/null || true
  echo "NVME FIRST OK"
  # guest-run.sh never gets to write the status: this boot ends here, by design.
  echo 0 >"$RISER_VM_OUT/exit_status"
  sleep 1
  echo b >/proc/sysrq-trigger
  sleep 60
  fail "the VM was not cut off"
fi

[ "$phase" = second ] || fail "unknown phase $phase (first or second)"
[ -s "$state/riser.json" ] && [ -s "$state/tree.sha256" ] || fail "no saved config or checksums from the first boot in $state"
step "(c) second boot: riser from the saved config"
RISER_LOG=${RISER_LOG:-info} riser_start "$state/riser.json" "${riser_args[@]}"
check_path
iscsid_start
iface_iser
discover iser0
sid=$(login "$iqn" iser0)
[ "$(transport_of "$sid")" = iser ] || fail "session $sid is not over iser"
disk=$(disk_of "$sid" 0)
mkdir -p /mnt/nvme
step "(c) mount (journal replay), umount, fsck, checksums"
mount "/dev/$disk" /mnt/nvme || fail "mount after the cut failed: $(dmesg | tail -n 5)"
umount /mnt/nvme || fail "umount failed"
fsck.ext4 -fn "/dev/$disk" >"$logs/fsck.log" 2>&1 || fail "fsck.ext4 -fn /dev/$disk is not clean after the cut: $(tail -n 20 "$logs/fsck.log")"
tail -n 1 "$logs/fsck.log"
echo 3 >/proc/sys/vm/drop_caches
mount -o ro "/dev/$disk" /mnt/nvme || fail "read-only mount failed"
(cd /mnt/nvme && sha256sum --quiet -c "$state/tree.sha256") >"$logs/sha.log" 2>&1 \
  || fail "checksums of synced files differ after the cut: $(head -n 10 "$logs/sha.log")"
echo "nvme: after the cut: fsck clean, $(wc -l <"$state/tree.sha256") synced files' checksums identical"
umount /mnt/nvme
logout_sid "$sid"
wait_no_connections 30
riser_stop
echo "NVME CRASH OK"
