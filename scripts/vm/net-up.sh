# Sourced by in-guest scripts that declare `# rxe-vm: needs net` (scripts/rxe-vm.sh gives them
# a virtio-net card on qemu's user networking): brings the card up as 10.0.2.15/24 with the
# default route through qemu's gateway 10.0.2.2 (there is no DHCP client in the guest; these
# are slirp's fixed addresses). Sets net_if to the interface's name. Fails the sourcing script
# (return 1) when there is no card.
net_up() {
  local d
  modprobe virtio_net || { echo "net-up: cannot load virtio_net" >&2; return 1; }
  net_if=
  for _ in $(seq 50); do
    # Found by the MAC rxe-vm.sh gives it: the name depends on udev, which may or may not run.
    for d in /sys/class/net/*; do
      [ "$(cat "$d/address" 2>/dev/null)" = 52:54:00:12:34:56 ] && net_if=${d##*/}
    done
    [ -n "$net_if" ] && break
    sleep 0.1
  done
  [ -n "$net_if" ] || { echo "net-up: no network card (does the script have the line '# rxe-vm: needs net'?)" >&2; return 1; }
  ip link set "$net_if" up
  ip addr add 10.0.2.15/24 dev "$net_if"
  ip route add default via 10.0.2.2 dev "$net_if"
  echo "net-up: $net_if 10.0.2.15/24, default route via 10.0.2.2 (qemu user networking)"
}
net_up
