# PERSISTENT RESERVE OUT REGISTER AND MOVE and REGISTER with SPEC_I_PT (issue 23) through the
# Linux initiator, with sg_persist (sg3-utils) on the /dev/sdX of a riser LUN. Sourced by
# smoke.sh after its data check, with $disk set and its step/fail functions: no boot of its own.
#
# The VM's initiator registers itself and another initiator port (SPEC_I_PT, format 01b) and
# another initiator device (format 00b), reserves WRITE EXCLUSIVE, moves the reservation to
# the other port (REGISTER AND MOVE): its own O_DIRECT write then fails with RESERVATION
# CONFLICT; it preempts the reservation back, writes again, and clears everything.

pr_dev=/dev/$disk
pr_other="iqn.2016-06.io.riser:vm-other,i,0x1234567890ab"
pr_device="iqn.2016-06.io.riser:vm-device"
pr_out() { sg_persist -n -o "$@" "$pr_dev" >"$logs/sg_persist.log" 2>&1 || fail "sg_persist -o $*: $(cat "$logs/sg_persist.log")"; }
pr_in() { sg_persist -n -i "$@" "$pr_dev" 2>&1 || fail "sg_persist -i $*"; }
pr_has() { grep -c -- "$2" <<<"$1" >/dev/null || fail "sg_persist: no '$2' in: $1"; }

step "sg_persist: REPORT CAPABILITIES says SIP_C"
pr_has "$(pr_in -c)" "Specify Initiator Ports Capable(SIP_C): 1"

step "sg_persist: REGISTER with SPEC_I_PT (an initiator port and an initiator device)"
# Several TransportIDs go one a line on stdin (repeated -X options overwrite each other).
printf '%s\n' "$pr_other" "$pr_device" | pr_out -G -S 0xa1 -X -
keys=$(pr_in -k)
echo "$keys"
pr_has "$keys" "3 registered reservation keys follow"
status=$(pr_in -s)
pr_has "$status" "vm-other"
pr_has "$status" "vm-device"

step "sg_persist: RESERVE, REGISTER AND MOVE to $pr_other"
pr_out -R -K 0xa1 -T 1
dd if=/tmp/pattern of="$pr_dev" bs=4k count=1 oflag=direct status=none || fail "the holder's write failed"
pr_out -M -K 0xa1 -S 0xa1 -T 1 -Q 1 -X "$pr_other"
res=$(pr_in -r)
echo "$res"
pr_has "$res" "Key=0xa1"
status=$(pr_in -s)
# The holder is now the other port's registration.
holder=$(awk 'BEGIN { RS = "Key=" } /Reservation holder/' <<<"$status")
grep -c "vm-other" <<<"$holder" >/dev/null || fail "the reservation did not move: $status"
if dd if=/tmp/pattern of="$pr_dev" bs=4k count=1 oflag=direct status=none 2>"$logs/dd-conflict.log"; then
  fail "a write after the reservation moved away succeeded"
fi
echo "write after the move refused: $(head -1 "$logs/dd-conflict.log")"

step "sg_persist: PREEMPT back, write, CLEAR"
pr_out -P -K 0xa1 -S 0xa1 -T 1
dd if=/tmp/pattern of="$pr_dev" bs=4k count=1 oflag=direct status=none || fail "write after preempting back failed"
pr_out -C -K 0xa1
pr_has "$(pr_in -k)" "there are NO registered reservation keys"
