#!/bin/sh
# /init of the test VM's initramfs (busybox ash, PID 1). scripts/rxe-vm.sh copies this file
# into the initramfs it builds; editing it makes rxe-vm.sh build a new one (the cached image's
# name carries a hash of this file).
#
# Its only job is to get to the host's root file system: load the virtio/9p/overlay modules
# (Debian's kernel has them as modules, and the guest cannot load them from a disk it does not
# have yet), mount the host root (9p, read-only) under a tmpfs overlay so the guest can write
# without touching the host, mount the writable results share, and switch_root into the
# harness script named on the kernel command line (scripts/vm/guest-run.sh of the repo, read
# live from the host so it needs no rebuild).
export PATH=/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

# On any failure: say why on the console and power off, so the host sees no exit status and
# reports the VM's failure instead of waiting for its timeout.
fail() {
  echo "riser-vm init: $*"
  echo "riser-vm init: cannot continue, powering off"
  echo o >/proc/sysrq-trigger
  sleep 60
}

# The modules, in dependency order (rxe-vm.sh wrote the list with `modprobe --show-depends`).
for m in $(cat /modules.order); do
  insmod "/modules/$m" || fail "insmod $m failed"
done

# Read the command line before /proc moves. riser.out: the writable results share's path;
# riser.run: the program to run as PID 1 in the new root.
out=
run=
for w in $(cat /proc/cmdline); do
  case "$w" in
    riser.out=*) out=${w#riser.out=} ;;
    riser.run=*) run=${w#riser.run=} ;;
    riser.repo=*) repo=${w#riser.repo=} ;;
  esac
done
[ -n "$out" ] && [ -n "$run" ] || fail "riser.out= or riser.run= missing from the kernel command line"

mkdir -p /lower /rw /newroot
# msize: 9p's default (8 KiB) makes every file read a crawl under TCG.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 hostroot /lower \
  || fail "cannot mount the host root (9p tag hostroot)"
mount -t tmpfs -o mode=0755 rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
  || fail "cannot mount the overlay on the host root"

# Fresh kernel file systems and fresh tmpfs for /tmp and /run: the host's own would be stale
# or meaningless inside the guest.
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
mount -t tmpfs -o mode=1777 tmp /newroot/tmp
mount -t tmpfs -o mode=0755 run /newroot/run

# The results share, at the same path as on the host (it may be under /tmp: hence after the
# tmpfs above).
mkdir -p "/newroot$out"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 riserout "/newroot$out" \
  || fail "cannot mount the results share (9p tag riserout) at $out"

# The repository, read-only at its own path: a checkout under /tmp (CI clones anywhere)
# would otherwise be hidden by the guest's fresh /tmp.
if [ -n "${repo:-}" ]; then
  mkdir -p "/newroot$repo"
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 riserrepo "/newroot$repo" \
    || fail "cannot mount the repository share (9p tag riserrepo) at $repo"
fi

[ -f "/newroot$run" ] || fail "$run not found in the host root"
# shellcheck disable=SC2093 # if exec itself fails, ash exits: PID 1 dies, the kernel panics
# and panic=-1 plus qemu's -no-reboot end the VM, which the host reports as a failed boot.
exec switch_root /newroot /bin/bash "$run" "$out"
