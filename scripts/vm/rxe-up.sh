#!/usr/bin/env bash
# Soft-RoCE inside the test VM: loads the RDMA and iSCSI modules and creates rxe0 on a dummy
# interface with 192.0.2.1/24 (a documentation address; the guest has no network card, so
# nothing can leave it). In-guest scripts source it (`. scripts/vm/rxe-up.sh`) and then use
# $RXE_IP and $RXE_DEV; it can also run on its own. Running it again is harmless.
#
# Why a dummy interface: rxe on `lo` comes up, but rdma_cm cannot resolve 127.0.0.1 through
# it. On d0, rdma_cm to 192.0.2.1 loops back inside rxe.
#
# Sourced, it leaves the caller's shell options alone (an interactive `rxe-vm.sh shell` must
# not inherit `set -e`) and returns 1 on failure, which ends a `set -e` caller; so every step
# below checks its own status instead of relying on errexit.

RXE_IP=192.0.2.1
RXE_DEV=rxe0
RXE_NETDEV=d0

rxe_up() {
  rxe_err() { echo "rxe-up: error: $*" >&2; return 1; }

  # This creates network interfaces: never on the host, only in the VM guest-run.sh marks.
  if ! grep -q 'riser\.run=' /proc/cmdline || [ "${RISER_VM:-}" != 1 ]; then
    rxe_err "run inside the test VM only: scripts/rxe-vm.sh run SCRIPT"; return 1
  fi

  # rdma_rxe: the soft-RoCE driver; rdma_ucm, ib_uverbs: /dev/infiniband for user-space verbs
  # and rdma_cm; ib_iser, iscsi_tcp: the Linux initiator's transports; sd_mod: its disks.
  modprobe -a dummy rdma_rxe rdma_ucm ib_uverbs ib_iser iscsi_tcp sd_mod \
    || { rxe_err "modprobe failed: is /lib/modules/$(uname -r) on the host (scripts/rxe-vm.sh setup)?"; return 1; }

  if ! ip link show "$RXE_NETDEV" >/dev/null 2>&1; then
    ip link add "$RXE_NETDEV" type dummy \
      && ip addr add "$RXE_IP/24" dev "$RXE_NETDEV" \
      && ip link set "$RXE_NETDEV" up \
      || { rxe_err "cannot set up $RXE_NETDEV with $RXE_IP"; return 1; }
  fi
  if ! rdma link show "$RXE_DEV/1" >/dev/null 2>&1; then
    rdma link add "$RXE_DEV" type rxe netdev "$RXE_NETDEV" \
      || { rxe_err "rdma link add $RXE_DEV type rxe netdev $RXE_NETDEV failed"; return 1; }
  fi

  # Outputs are captured before grep -q looks at them: under pipefail, a grep that stops
  # reading early can fail the pipeline with the writer's SIGPIPE.
  local devs info _
  devs=$(ibv_devices 2>&1)
  if ! grep -qw "$RXE_DEV" <<<"$devs"; then
    echo "$devs" >&2
    rxe_err "ibv_devices does not list $RXE_DEV"; return 1
  fi
  # The port follows the netdev's state; give it a moment to turn ACTIVE.
  for _ in $(seq 50); do
    info=$(ibv_devinfo -d "$RXE_DEV" 2>&1)
    grep -q 'state:.*PORT_ACTIVE' <<<"$info" && break
    sleep 0.1
  done
  if ! grep -q 'state:.*PORT_ACTIVE' <<<"$info"; then
    echo "$info" >&2
    rxe_err "$RXE_DEV port is not ACTIVE"; return 1
  fi
  echo "rxe-up: $RXE_DEV on $RXE_NETDEV ($RXE_IP) is ACTIVE"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  rxe_up
else
  rxe_up || return 1
fi
