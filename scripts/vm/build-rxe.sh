#!/usr/bin/env bash
# Soft-RoCE (rdma_rxe) with a larger fast-registration page list, for the test VM's kernel:
#
#   scripts/vm/build-rxe.sh [KERNEL_VERSION CACHE_DIR]     prints the module's path
#
# Why: ib_iser sizes its commands from the device's max_fast_reg_page_list_len
# (iser_calc_scsi_params: one 4 KiB page per entry, less one for a misaligned head, at most
# ISCSI_ISER_MAX_SG_TABLESIZE = 4096 pages). Stock rxe in 6.1 allows 512 pages
# (RXE_MAX_FMR_PAGE_LIST_LEN in rxe_param.h), so the Linux initiator over stock soft-RoCE never
# sends a command larger than 511 pages = 2044 KiB, whatever max_sectors_kb says; siw allows
# 256. Real RNICs allow far more (mlx5: hundreds of thousands), and ib_iser on them sends 8 MiB
# commands once max_sectors is raised. This module is a TEST-ENVIRONMENT change that lets the
# VM send riser what real hardware sends: the same rxe source with that one constant raised to
# 4096 (RXE_PAGES to change it). Nothing else needs to change in 6.1: a fast-reg MR's pages
# live in a two-level map (rxe_mr_alloc: num_buf / RXE_BUF_PER_MAP pages of 256 entries each,
# looked up by lookup_iova with map_shift/map_mask), which stock rxe already uses for its 512
# (two maps); 4096 pages are 16 maps per MR, nothing is sized by the constant but the limit
# reported to consumers.
#
# Built out of tree from Debian's linux-source-X.Y against linux-headers-VER, about 10 s, once
# per kernel version and page count; kept as CACHE_DIR/rdma_rxe-frPAGES-VER.ko. It is NOT
# installed under /lib/modules: every other VM test keeps the stock rdma_rxe, and only a guest
# script that asks for this file (scripts/vm/iser.sh, second part) swaps it in with insmod.
# Without arguments the kernel version and cache are those of scripts/rxe-vm.sh (its setup runs
# first when the cache has no kernel yet). Needs root when anything is missing. Every failure
# says why and exits non-zero: a test that needs this module must fail, never skip.
set -euo pipefail

say() { echo "build-rxe: $*" >&2; }
die() { echo "build-rxe: error: $*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=scripts/vm/kmod-lib.sh
. "$here/kmod-lib.sh"
pages=${RXE_PAGES:-4096}
[[ $pages =~ ^[0-9]+$ ]] && [ "$pages" -ge 512 ] && [ "$pages" -le 65536 ] || die "RXE_PAGES=$pages: 512..65536"

if [ $# -eq 0 ]; then
  cache=${RISER_VM_CACHE:-/var/cache/riser-vm}
  if [ ! -s "$cache/kernel-version" ]; then
    say "no guest kernel in $cache yet: scripts/rxe-vm.sh setup"
    "$here/../rxe-vm.sh" setup >&2 || die "scripts/rxe-vm.sh setup failed"
  fi
  kver=$(cat "$cache/kernel-version")
elif [ $# -eq 2 ]; then
  kver=$1 cache=$2
else
  die "usage: $0 [KERNEL_VERSION CACHE_DIR]"
fi
[[ $kver =~ ^([0-9]+)\.([0-9]+)\. ]] || die "kernel version '$kver' is not X.Y.Z..."
series=${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
cached=$cache/rdma_rxe-fr$pages-$kver.ko

# A module built for this kernel (the file name carries the page count).
module_ok() {
  [ "$(modinfo -F vermagic "$1" 2>/dev/null | awk '{print $1}')" = "$kver" ] \
    && [ "$(modinfo -F name "$1" 2>/dev/null)" = rdma_rxe ]
}

if [ -f "$cached" ] && module_ok "$cached"; then
  echo "$cached"
  exit 0
fi
[ "$(id -u)" -eq 0 ] || die "$cached is not built yet: run as root"
[ -d "/lib/modules/$kver/kernel" ] || die "/lib/modules/$kver is missing: the guest kernel is not set up (scripts/rxe-vm.sh setup)"
[ -d "$cache" ] && [ -w "$cache" ] || die "cache $cache missing or not writable"

# Under the cache's lock (the one scripts/rxe-vm.sh takes while it builds): two test runs do
# not build into the same tmp directory.
exec 9>>"$cache/.lock"
flock 9
if [ -f "$cached" ] && module_ok "$cached"; then
  echo "$cached"
  exit 0
fi

say "building rdma_rxe with $pages fast-reg pages for $kver from Debian's linux-source-$series"
kmod_extract rxe
param=$src/rxe_param.h
[ -f "$param" ] || die "$tarball has no drivers/infiniband/sw/rxe/rxe_param.h"
grep -Eq '^\s*RXE_MAX_FMR_PAGE_LIST_LEN\s*=\s*512,' "$param" \
  || die "rxe_param.h has no 'RXE_MAX_FMR_PAGE_LIST_LEN = 512,': this source differs from 6.1's; check rxe_mr.c before raising it"
# The one change (see the top of this file).
sed -Ei "s/^(\s*RXE_MAX_FMR_PAGE_LIST_LEN\s*=\s*)512,/\1$pages,/" "$param"
grep -Eq "^\s*RXE_MAX_FMR_PAGE_LIST_LEN\s*=\s*$pages," "$param" || die "raising RXE_MAX_FMR_PAGE_LIST_LEN in $param failed"
# The page map this relies on: several pages of RXE_BUF_PER_MAP entries per fast-reg MR.
grep -q 'num_map = (num_buf + RXE_BUF_PER_MAP - 1) / RXE_BUF_PER_MAP;' "$src/rxe_mr.c" \
  || die "rxe_mr.c does not size its page map from the MR's page count: the raised limit is unchecked for this source"
kmod_build rdma_rxe RDMA_RXE rdma_rxe "$cached" module_ok
say "rdma_rxe with $pages fast-reg pages for $kver: $cached"
echo "$cached"
