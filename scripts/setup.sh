#!/usr/bin/env bash
# Installs what riser needs to build and test on a Debian machine, as root. Idempotent:
# runs apt-get only when a package is missing. Usage: scripts/setup.sh [build|test|bench|bench-cost|bench-rbd|vm|ceph]...
set -euo pipefail

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(build)

# The single-node Ceph cluster of the RBD tests (scripts/ceph-test-cluster.sh).
ceph_pkgs=(ceph-mon ceph-osd ceph-mgr ceph-common)

pkgs=()
for g in "${groups[@]}"; do
  case "$g" in
    build) pkgs+=(build-essential pkg-config libibverbs-dev librdmacm-dev libclang-dev librbd-dev) ;;
    test)  pkgs+=(build-essential pkg-config libibverbs-dev librdmacm-dev libclang-dev librbd-dev python3 libiscsi-bin libiscsi-dev sg3-utils tgt tmux systemd prometheus "${ceph_pkgs[@]}") ;;
    ceph)  pkgs+=("${ceph_pkgs[@]}" librbd-dev) ;;
    bench) pkgs+=(build-essential pkg-config libiscsi-bin tgt util-linux python3 valgrind strace) ;;
    # make bench-cost: callgrind counts riser's instructions per I/O.
    bench-cost) pkgs+=(valgrind) ;;
    # make bench-rbd: the test cluster, and tgt with its rbd backing store to compare with.
    bench-rbd) pkgs+=("${ceph_pkgs[@]}" tgt tgt-rbd util-linux python3) ;;
    vm)    pkgs+=(qemu-system-x86 busybox-static kmod cpio rdma-core ibverbs-providers ibverbs-utils rdmacm-utils
                  open-iscsi libiscsi-bin fio e2fsprogs multipath-tools udev python3) ;;
    *) echo "setup.sh: unknown group $g (build, test, bench, bench-cost, bench-rbd, vm, ceph)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: missing packages ${missing[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup.sh: no cargo found; installing Debian's rust toolchain"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq cargo rustc >/dev/null
fi
command -v cargo >/dev/null || { echo "setup.sh: cargo is still missing" >&2; exit 1; }
# make test lints with clippy: rustup's component, or Debian's package beside Debian's cargo.
if [[ " ${groups[*]} " == *" test "* ]] && ! cargo clippy --version >/dev/null 2>&1; then
  if command -v rustup >/dev/null 2>&1; then
    echo "setup.sh: no clippy found; adding rustup's clippy component"
    rustup component add clippy
  else
    echo "setup.sh: no clippy found; installing Debian's rust-clippy"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq rust-clippy >/dev/null
  fi
fi
[[ " ${groups[*]} " != *" test "* ]] || cargo clippy --version >/dev/null 2>&1 || { echo "setup.sh: cargo clippy is still missing" >&2; exit 1; }
# The workspace's rust-version (Cargo.toml): what the locked dependencies need.
need=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$(dirname "$0")/../Cargo.toml")
have=$(rustc --version | awk '{print $2}')
if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  echo "setup.sh: rustc $have is older than the $need riser needs (Cargo.toml rust-version); install a newer toolchain (rustup) and put it first in PATH" >&2
  exit 1
fi
