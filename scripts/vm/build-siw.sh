#!/usr/bin/env bash
# Soft-iWARP (siw) for the test VM's kernel. Debian's 6.1 kernel ships no siw module, so it is
# built out of tree from Debian's own kernel source (linux-source-X.Y) against that kernel's
# headers (linux-headers-VER), about 15 s, once per kernel version:
#
#   scripts/vm/build-siw.sh KERNEL_VERSION CACHE_DIR
#
# The module is kept as CACHE_DIR/siw-KERNEL_VERSION.ko and installed as
# /lib/modules/KERNEL_VERSION/updates/siw.ko (depmod'ed), where the guest's `modprobe siw`
# finds it: the guest runs modprobe on the host's root file system (scripts/rxe-vm.sh). A
# later run with both in place does nothing. scripts/rxe-vm.sh calls this, under its cache
# lock, for a guest script that has the line `# rxe-vm: needs siw`.
#
# Needs root when anything is missing (apt-get, /lib/modules). Every failure says why and
# exits non-zero: a test that needs siw must fail, never skip.
set -euo pipefail

say() { echo "build-siw: $*" >&2; }
die() { echo "build-siw: error: $*" >&2; exit 1; }
# shellcheck source=scripts/vm/kmod-lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/kmod-lib.sh"

[ $# -eq 2 ] || die "usage: $0 KERNEL_VERSION CACHE_DIR"
kver=$1 cache=$2
[[ $kver =~ ^([0-9]+)\.([0-9]+)\. ]] || die "kernel version '$kver' is not X.Y.Z..."
series=${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
cached=$cache/siw-$kver.ko
installed=/lib/modules/$kver/updates/siw.ko

# The vermagic a module built for this kernel carries first.
vermagic_ok() { [ "$(modinfo -F vermagic "$1" 2>/dev/null | awk '{print $1}')" = "$kver" ]; }

installed_ok() {
  [ -f "$installed" ] && cmp -s "$cached" "$installed" \
    && grep -q '^updates/siw\.ko:' "/lib/modules/$kver/modules.dep" 2>/dev/null
}

if [ -f "$cached" ] && vermagic_ok "$cached" && installed_ok; then
  exit 0
fi
[ "$(id -u)" -eq 0 ] || die "the siw module for $kver is not built or not installed yet: run as root (scripts/rxe-vm.sh run scripts/vm/iser-siw.sh does it)"
[ -d "/lib/modules/$kver/kernel" ] || die "/lib/modules/$kver is missing: the guest kernel is not set up (scripts/rxe-vm.sh setup)"

if [ ! -f "$cached" ] || ! vermagic_ok "$cached"; then
  say "building siw for $kver from Debian's linux-source-$series"
  kmod_extract siw
  [ -f "$src/siw_main.c" ] || die "$tarball has no drivers/infiniband/sw/siw/siw_main.c"
  kmod_build siw RDMA_SIW siw "$cached" vermagic_ok
fi

mkdir -p "/lib/modules/$kver/updates"
cp "$cached" "$installed.tmp"
mv "$installed.tmp" "$installed"
depmod -a "$kver" || die "depmod -a $kver failed"
installed_ok || die "siw.ko installed as $installed, but modules.dep does not list updates/siw.ko"
say "siw for $kver: $cached, installed as $installed"
