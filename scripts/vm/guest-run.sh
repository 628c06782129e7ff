#!/bin/bash
# PID 1 of the test VM once the initramfs has switched to the host's root (see init.sh).
# Usage (by init.sh only): guest-run.sh OUTDIR
#
# OUTDIR is the writable results share. scripts/rxe-vm.sh wrote OUTDIR/.job there: the repo
# root, the mode (run or shell), the script and its arguments, and the RISER_* variables to
# export. This script runs the job, keeps a clean copy of its output in OUTDIR/output.log,
# writes its exit status to OUTDIR/exit_status (the host's only source of truth: the console
# mixes in kernel messages) and powers the VM off.
#
# Deliberately no `set -e`: whatever happens, this must reach the power-off at the end.
set -uo pipefail

out=${1:?usage: guest-run.sh OUTDIR}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=${TERM:-linux}
# Marks the environment as the test VM: in-guest scripts refuse to run anywhere else.
export RISER_VM=1 RISER_VM_OUT=$out

# The power-off is asynchronous and must not be followed by exec'ing anything: the 9p root is
# going away (`sleep` would fail to load libc). So wait with a bash builtin on a fifo that
# nobody writes. If PID 1 exits anyway, the kernel panics, panic=-1 reboots and qemu's
# -no-reboot ends the VM: the same result, louder.
wait_fifo=/run/riser-vm.wait
mkfifo "$wait_fifo" 2>/dev/null
power_off() {
  sync
  echo o >/proc/sysrq-trigger
  read -r -t 60 _ <>"$wait_fifo"
  exit 1
}

job="$out/.job"
# shellcheck source=/dev/null # written by rxe-vm.sh for each run
if ! . "$job"; then
  echo "riser-vm: cannot read $job"
  power_off
fi

hostname riser-vm
# Nothing brings loopback up without an init system; iSCSI over TCP to 127.0.0.1 needs it.
ip link set lo up
cd "$REPO" || { echo "riser-vm: cannot cd to $REPO"; power_off; }

if [ "$MODE" = shell ]; then
  echo "riser-vm: interactive shell in $REPO (exit or Ctrl-D powers off; Ctrl-A X kills qemu)"
  echo "riser-vm: set up soft-RoCE with: . scripts/vm/rxe-up.sh"
  # setsid -c: the console becomes the shell's controlling tty, so Ctrl-C and job control work.
  setsid -c bash -l </dev/console >/dev/console 2>&1
  power_off
fi

# Guest uptime in the markers: where the time goes (boot vs script) under TCG.
uptime_s() { cut -d' ' -f1 /proc/uptime; }
echo "===== riser-vm: BEGIN ${SCRIPT#"$REPO"/}${ARGS[*]:+ ${ARGS[*]@Q}} (guest uptime $(uptime_s)s) ====="
# An executable runs as itself (any interpreter); anything else is taken as a bash script.
if [ -x "$SCRIPT" ]; then cmd=("$SCRIPT"); else cmd=(bash "$SCRIPT"); fi
"${cmd[@]}" "${ARGS[@]}" </dev/null 2>&1 | tee "$out/output.log"
rc=${PIPESTATUS[0]}
echo "$rc" >"$out/exit_status"
echo "===== riser-vm: END ${SCRIPT#"$REPO"/}: exit status $rc (guest uptime $(uptime_s)s) ====="
power_off
