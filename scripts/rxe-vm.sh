#!/usr/bin/env bash
# Real RDMA (soft-RoCE) for tests on a machine whose kernel has none: boots Debian's kernel in
# qemu (TCG; no KVM needed) with this machine's root file system shared read-only over 9p under
# a tmpfs overlay, and runs a script inside. See /work/shared/rxe-vm.md for the recipe and
# scripts/vm/ for the in-guest side.
#
#   scripts/rxe-vm.sh setup                 install packages, fetch the kernel, build the initramfs
#   scripts/rxe-vm.sh run SCRIPT [ARGS...]  boot, run SCRIPT as root in the guest, exit with its status
#   scripts/rxe-vm.sh shell                 boot to an interactive shell (Ctrl-A X kills qemu)
#
# In the guest: cwd is the repo root (the host's files, read-only underneath, writable through
# the overlay; writes vanish with the VM); /tmp and /run are fresh and empty; $RISER_VM_OUT is
# a directory shared read-write with the host at the same path, for results; RISER_* variables
# of the caller are exported. `. scripts/vm/rxe-up.sh` creates rxe0 on 192.0.2.1. The guest
# has no network card at all. A SCRIPT with the line `# rxe-vm: needs siw` gets soft-iWARP:
# Debian's kernel has no siw module, so scripts/vm/build-siw.sh builds it on the host first
# (once per kernel version, into the cache and /lib/modules/VER/updates; `modprobe siw` in
# the guest). A SCRIPT with the line `# rxe-vm: needs nvme` gets an emulated NVMe controller
# (qemu's `-device nvme`, serial riser-nvme0) backed by a raw file (RISER_VM_NVME_IMG, default
# $RISER_VM_OUT/nvme.img, created sparse with RISER_VM_NVME_MIB MiB, default 1024, when
# missing; kept between runs that share it), with cache=none (writethrough where the file's
# file system has no O_DIRECT) so a flush in the guest reaches the host's disk, and
# nvme.poll_queues=2 on the kernel command line (the guest loads the nvme module itself).
# A SCRIPT with the line `# rxe-vm: needs net` gets a network card (virtio-net, MAC
# 52:54:00:12:34:56) on qemu's user networking (slirp): the guest is 10.0.2.15/24 with the
# gateway 10.0.2.2 (scripts/vm/net-up.sh configures it; there is no DHCP client), and each TCP
# connection it opens to any other address is made by qemu as an ordinary socket of the host,
# in the host's root network namespace, so it reaches whatever the host reaches (addresses
# inside the host's own network namespaces through their veth pairs included). Nothing
# connects into the guest. Without the line the guest has no network card at all.
#
# Environment:
#   RISER_VM_CACHE    kernel and initramfs cache (default /var/cache/riser-vm)
#   RISER_VM_OUT      results directory (default: a new /tmp/riser-vm.XXXXXX, removed after a
#                     successful run, kept and named after a failed one)
#   RISER_VM_TIMEOUT  seconds before qemu is killed (default 900)
#   RISER_VM_MEM      guest memory in MiB (default 4096); RISER_VM_SMP vCPUs (default 2)
#
# Exit status of `run`: the script's own; 124 when the VM timed out; 125 when the VM ended
# without reporting a status (boot failure, kernel panic, script killed the VM).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(dirname "$here")
cache=${RISER_VM_CACHE:-/var/cache/riser-vm}
timeout_s=${RISER_VM_TIMEOUT:-900}
mem=${RISER_VM_MEM:-4096}
smp=${RISER_VM_SMP:-2}

# What the host needs: qemu and busybox to boot, kmod/cpio to build the initramfs; the rest is
# what the guest runs (it uses the host's root, so the host's packages are the guest's):
# multipath-tools and udev for scripts/vm/multipath.sh (the guest writes its own
# /etc/multipath.conf into its overlay; the host's multipathd, if systemd starts one, keeps
# Debian's default find_multipaths and takes no single-path disk).
packages=(qemu-system-x86 busybox-static kmod cpio rdma-core ibverbs-utils rdmacm-utils perftest
          open-iscsi libiscsi-bin fio e2fsprogs iproute2 util-linux xz-utils zstd sg3-utils
          multipath-tools udev python3)
# The modules the initramfs needs to reach the host root; modprobe adds their dependencies
# (virtio_ring, netfs, fscache, ...) in load order.
initrd_modules=(virtio_pci 9pnet_virtio 9p overlay)

say() { echo "rxe-vm: $*" >&2; }
die() { echo "rxe-vm: error: $*" >&2; exit 1; }

usage() {
  sed -n '/^#   scripts/p' "${BASH_SOURCE[0]}" | sed 's/^#   /usage: /' >&2
  exit 2
}

# Paths that go on qemu's or the kernel's command line: no spaces (kernel command line), no
# commas (qemu option syntax).
check_plain_path() {
  [[ $2 =~ ^/[A-Za-z0-9._/+@-]*$ ]] || die "$1 '$2' must be an absolute path of letters, digits and ._/+@- only"
}

need_root() {
  [ "$(id -u)" -eq 0 ] || die "$1: run as root (or have root run \`scripts/rxe-vm.sh setup\` once)"
}

install_packages() {
  local missing=() p
  for p in "${packages[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  need_root "packages ${missing[*]} are missing"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
}

# The guest kernel: Debian's current linux-image-amd64 flavour, downloaded once into the cache
# (vmlinuz) and into /lib/modules/<ver> (the guest runs modprobe from the shared host root, so
# the modules must be where modprobe looks for that kernel's version; the host's own kernel
# does not care). The chosen version is pinned in $cache/kernel-version: later runs neither
# consult apt nor follow Debian's updates until the cache is removed.
kernel_ver=
ensure_kernel() {
  if [ -s "$cache/kernel-version" ]; then
    kernel_ver=$(cat "$cache/kernel-version")
    if [ -f "$cache/vmlinuz-$kernel_ver" ] && [ -f "/lib/modules/$kernel_ver/modules.dep" ]; then
      return 0
    fi
  fi
  need_root "the guest kernel is not cached yet"
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ && !n++ {print $2}' || true)
  if [ -z "$pkg" ]; then
    apt-get update -qq || die "apt-get update failed"
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ && !n++ {print $2}' || true)
  fi
  [ -n "$pkg" ] || die "apt-cache depends linux-image-amd64 names no linux-image-* package (not a Debian machine?)"
  kernel_ver=${pkg#linux-image-}
  say "fetching Debian's kernel $pkg"
  local tmp="$cache/tmp.kernel"
  rm -rf "$tmp"
  mkdir -p "$tmp/x"
  # Sandbox user root: apt's _apt user cannot write into a root-owned cache dir.
  (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg") || die "apt-get download $pkg failed"
  dpkg-deb -x "$tmp"/*.deb "$tmp/x" || die "cannot unpack $(ls "$tmp"/*.deb)"
  [ -f "$tmp/x/boot/vmlinuz-$kernel_ver" ] || die "$pkg has no boot/vmlinuz-$kernel_ver"
  local mods
  mods=$(find "$tmp/x" -maxdepth 4 -type d -path "*/modules/$kernel_ver" -print -quit)
  [ -n "$mods" ] || die "$pkg has no modules/$kernel_ver directory"
  if [ ! -f "/lib/modules/$kernel_ver/modules.dep" ]; then
    # Copy next to the target and rename: an interrupted copy never looks installed.
    rm -rf "/lib/modules/$kernel_ver.riser-tmp"
    mkdir -p /lib/modules
    cp -a "$mods" "/lib/modules/$kernel_ver.riser-tmp"
    rm -rf "/lib/modules/$kernel_ver"
    mv "/lib/modules/$kernel_ver.riser-tmp" "/lib/modules/$kernel_ver"
    depmod -a "$kernel_ver" || die "depmod -a $kernel_ver failed"
  fi
  cp "$tmp/x/boot/vmlinuz-$kernel_ver" "$cache/vmlinuz-$kernel_ver"
  rm -f "$cache/vmlinux-$kernel_ver"
  if grep -q '^CONFIG_PVH=y' "$tmp/x/boot/config-$kernel_ver" 2>/dev/null; then
    extract_vmlinux "$cache/vmlinuz-$kernel_ver" "$cache/vmlinux-$kernel_ver"
  fi
  echo "$kernel_ver" >"$cache/kernel-version"
  rm -rf "$tmp"
}

# A kernel built with CONFIG_PVH can be booted by qemu straight from its uncompressed ELF
# image, skipping the firmware and, above all, the in-guest decompression of the bzImage: that
# is 5-8 s of every boot under TCG. The ELF is the compressed payload inside the bzImage;
# when it cannot be found the VM simply boots the bzImage.
extract_vmlinux() {
  local bz=$1 elf=$2 off magic tool ok
  for magic in xz zstd; do
    case $magic in
      xz)   off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$bz" | head -n1 | cut -d: -f1 || true); tool=(xz -dc --single-stream) ;;
      zstd) off=$(LC_ALL=C grep -obUaP '\x28\xb5\x2f\xfd' "$bz" | head -n1 | cut -d: -f1 || true); tool=(zstd -qdc) ;;
    esac
    [ -n "$off" ] || continue
    # The stream is followed by the rest of the bzImage: xz --single-stream stops at its end
    # (tail then dies of SIGPIPE: ignored) and still reports a damaged stream; zstd complains
    # about the trailing bytes whatever happens, so for zstd only the ELF magic vouches.
    ok=1
    { tail -c +$((off + 1)) "$bz" || true; } | "${tool[@]}" >"$elf.tmp" 2>/dev/null || ok=0
    [ "$magic" = zstd ] && ok=1
    if [ "$ok" = 1 ] && [ "$(head -c4 "$elf.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      mv "$elf.tmp" "$elf"
      return 0
    fi
  done
  rm -f "$elf.tmp"
  say "note: no uncompressed kernel found in $bz; booting the bzImage (slower)"
}

# The initramfs: static busybox, the modules to reach the host root, scripts/vm/init.sh. Its
# name carries a hash of init.sh and the module list, so editing either builds a new one.
initrd=
ensure_initrd() {
  local order hash
  # `insmod /lib/modules/.../x.ko[.xz|.zst] [params]` lines in load order; "builtin" lines are
  # modules this kernel has built in.
  order=$(modprobe -a -S "$kernel_ver" --show-depends "${initrd_modules[@]}" | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++') \
    || die "modprobe -a -S $kernel_ver --show-depends ${initrd_modules[*]} failed"
  [ -n "$order" ] || die "no modules to load for ${initrd_modules[*]} (kernel $kernel_ver)"
  hash=$( (cat "$here/vm/init.sh"; echo "$order") | sha256sum | cut -c1-12)
  initrd="$cache/initrd-$kernel_ver-$hash.gz"
  [ -f "$initrd" ] && return 0

  [ -w "$cache" ] || need_root "the initramfs is not cached yet"
  local bb
  bb=$(command -v busybox) || die "busybox not found (package busybox-static)"
  # The initramfs has no libc: ldd must find nothing to load.
  if ldd "$bb" >/dev/null 2>&1; then die "$bb is dynamically linked: install busybox-static"; fi
  say "building the initramfs for $kernel_ver"
  local tmp="$cache/tmp.initrd"
  rm -rf "$tmp"
  mkdir -p "$tmp/root/bin" "$tmp/root/modules" "$tmp/root/proc" "$tmp/root/sys" "$tmp/root/dev"
  cp "$bb" "$tmp/root/bin/busybox"
  local applet
  for applet in sh mount insmod mkdir cat echo sleep switch_root; do
    ln -s busybox "$tmp/root/bin/$applet"
  done
  install -m 0755 "$here/vm/init.sh" "$tmp/root/init"
  local ko name list=()
  for ko in $order; do
    name=$(basename "$ko")
    # busybox insmod takes plain .ko files only.
    case "$name" in
      *.ko.xz)  xz -dc "$ko" >"$tmp/root/modules/${name%.xz}"; name=${name%.xz} ;;
      *.ko.zst) zstd -qdc "$ko" >"$tmp/root/modules/${name%.zst}"; name=${name%.zst} ;;
      *.ko)     cp "$ko" "$tmp/root/modules/$name" ;;
      *) die "unexpected module file $ko" ;;
    esac
    list+=("$name")
  done
  printf '%s\n' "${list[@]}" >"$tmp/root/modules.order"
  (cd "$tmp/root" && find . | cpio -o -H newc --quiet | gzip -1) >"$tmp/initrd.gz"
  mv "$tmp/initrd.gz" "$initrd"
  rm -rf "$tmp"
  say "initramfs $initrd: ${list[*]}"
}

# Whether a guest script asks for an NVMe controller (`# rxe-vm: needs nvme`).
needs_nvme() {
  [ -f "$1" ] && grep -q '^# rxe-vm: needs nvme$' "$1"
}

# Whether a guest script asks for a network card (`# rxe-vm: needs net`).
needs_net() {
  [ -f "$1" ] && grep -q '^# rxe-vm: needs net$' "$1"
}

# Whether a guest script asks for soft-iWARP (`# rxe-vm: needs siw`).
needs_siw() {
  [ -f "$1" ] && grep -q '^# rxe-vm: needs siw$' "$1"
}

# Everything a run needs, under a lock so parallel runs do not build the cache twice. $1: the
# guest script, if any.
prepare() {
  install_packages
  if [ ! -d "$cache" ]; then
    need_root "cache $cache does not exist"
    mkdir -p "$cache"
  fi
  # A reader without write access (non-root, cache built) needs no lock.
  if [ -w "$cache" ]; then
    exec 9>>"$cache/.lock"
    flock 9
  fi
  ensure_kernel
  ensure_initrd
  if [ -n "${1:-}" ] && needs_siw "$1"; then
    "$here/vm/build-siw.sh" "$kernel_ver" "$cache" || die "soft-iWARP (siw) for $kernel_ver is not available; $1 needs it"
  fi
  if [ -w "$cache" ]; then
    flock -u 9
    exec 9>&-
  fi
}

# Boots the VM. $1: run or shell; then the script and its arguments for run.
boot() {
  local mode=$1; shift
  local out keep_out=1 script=
  if [ -n "${RISER_VM_OUT:-}" ]; then
    out=$RISER_VM_OUT
    mkdir -p "$out"
    out=$(cd "$out" && pwd -P)
  else
    out=$(mktemp -d /tmp/riser-vm.XXXXXX)
    keep_out=0
  fi
  check_plain_path "results directory" "$out"
  check_plain_path "script directory" "$here"
  check_plain_path "cache directory" "$cache"
  rm -f "$out/.job" "$out/exit_status" "$out/output.log" "$out/console.log"

  if [ "$mode" = run ]; then
    script=$1; shift
    [ -f "$script" ] || die "script $script not found"
    script=$(cd "$(dirname "$script")" && pwd -P)/$(basename "$script")
    # The guest has its own empty /tmp, /run, /proc, /sys and /dev.
    case "$script" in
      "$out"/*|"$repo"/*) ;;
      /tmp/*|/run/*|/proc/*|/sys/*|/dev/*|/var/run/*)
        die "script $script is not visible in the guest (fresh /tmp, /run): put it in the repo or in \$RISER_VM_OUT" ;;
    esac
  fi

  # The job for guest-run.sh, in bash syntax (printf %q quotes anything).
  {
    printf 'REPO=%q\nMODE=%q\nSCRIPT=%q\n' "$repo" "$mode" "$script"
    printf 'ARGS=('; [ $# -gt 0 ] && printf '%q ' "$@"; printf ')\n'
    local v
    for v in $(compgen -e | grep '^RISER_' | grep -v '^RISER_VM'); do
      printf 'export %s=%q\n' "$v" "${!v}"
    done
  } >"$out/.job"

  # The driver's poll queues for a script that asks for NVMe (see the header).
  local nvme_cmdline=
  if [ "$mode" = run ] && needs_nvme "$script"; then nvme_cmdline=" nvme.poll_queues=2"; fi

  local kernel_image="$cache/vmlinuz-$kernel_ver"
  [ -f "$cache/vmlinux-$kernel_ver" ] && kernel_image="$cache/vmlinux-$kernel_ver"
  # shellcheck disable=SC2054 # the commas are qemu's option syntax, not array separators
  local nic=(-nic none)
  if [ "$mode" = run ] && needs_net "$script"; then
    nic=(-nic user,model=virtio-net-pci,mac=52:54:00:12:34:56)
    say "network: qemu user networking (guest 10.0.2.15, gateway 10.0.2.2; connections leave as host sockets)"
  fi
  local qemu=(qemu-system-x86_64 -M q35 -cpu max -m "$mem" -smp "$smp" -no-reboot "${nic[@]}"
    -kernel "$kernel_image" -initrd "$initrd"
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
    -fsdev "local,id=riserout,path=$out,security_model=none,multidevs=remap"
    -device virtio-9p-pci,fsdev=riserout,mount_tag=riserout
    -fsdev "local,id=riserrepo,path=$repo,security_model=none,readonly=on,multidevs=remap"
    -device virtio-9p-pci,fsdev=riserrepo,mount_tag=riserrepo
    -append "console=ttyS0 quiet panic=-1${nvme_cmdline} riser.out=$out riser.repo=$repo riser.run=$here/vm/guest-run.sh")

  if [ -n "$nvme_cmdline" ]; then
    local img=${RISER_VM_NVME_IMG:-$out/nvme.img} cache_mode=none
    check_plain_path "NVMe backing file" "$img"
    [ -f "$img" ] || truncate -s "${RISER_VM_NVME_MIB:-1024}M" "$img" || die "cannot create the NVMe backing file $img"
    # cache=none opens the file O_DIRECT; a file system without it (tmpfs) gets writethrough.
    if ! dd if="$img" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then cache_mode=writethrough; fi
    qemu+=(-drive "file=$img,if=none,id=nvm0,format=raw,cache=$cache_mode" -device nvme,serial=riser-nvme0,drive=nvm0)
    say "NVMe: $img (cache=$cache_mode), nvme.poll_queues=2"
  fi

  if [ "$mode" = shell ]; then
    # -nographic: serial console and qemu monitor multiplexed on this terminal.
    "${qemu[@]}" -nographic
    return
  fi

  say "booting Debian $kernel_ver (TCG, ${smp} vCPUs, ${mem} MiB) to run ${script#"$repo"/}; results in $out; timeout ${timeout_s}s"
  local start=$SECONDS qrc=0
  # The serial console streams here and into console.log, without the serial line's CRs.
  # stdin is /dev/null: nothing may read this terminal in a batch run.
  set +e
  timeout -k 10 "$timeout_s" "${qemu[@]}" -display none -monitor none -serial stdio </dev/null 2>&1 \
    | sed -u 's/\r$//' | tee "$out/console.log"
  qrc=${PIPESTATUS[0]}
  set -e
  local took=$((SECONDS - start))

  local rc
  if [ -s "$out/exit_status" ]; then
    rc=$(cat "$out/exit_status")
    say "guest script exit status $rc (VM ran ${took}s)"
  elif [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
    say "FAILED: the VM did not finish within ${timeout_s}s (RISER_VM_TIMEOUT); qemu killed. Console: $out/console.log"
    rc=124; keep_out=1
  else
    say "FAILED: the VM ended (qemu status $qrc, after ${took}s) without reporting the script's exit status: boot failure or kernel panic? Console: $out/console.log"
    rc=125; keep_out=1
  fi
  if [ "$rc" -ne 0 ]; then keep_out=1; fi
  if [ "$keep_out" -eq 0 ]; then rm -rf "$out"; else say "results kept in $out"; fi
  return "$rc"
}

[ $# -ge 1 ] || usage
cmd=$1; shift
case "$cmd" in
  setup) [ $# -eq 0 ] || usage; prepare; say "ready: kernel $kernel_ver, $initrd" ;;
  run)   [ $# -ge 1 ] || usage; prepare "$1"; boot run "$@" ;;
  shell) [ $# -eq 0 ] || usage; prepare; boot shell ;;
  *) usage ;;
esac
