# Sourced by scripts/vm/build-rxe.sh and build-siw.sh: building one of the kernel's software
# RDMA drivers (drivers/infiniband/sw/NAME) out of tree from Debian's linux-source-X.Y against
# linux-headers-VER. The caller defines say, die, kver, series (X.Y) and cache.

# Installs what the build needs, then extracts drivers/infiniband/sw/$1 into $cache/tmp.$1.
# Sets: build (the headers' build directory), tarball, tmp, src (the driver's sources).
kmod_extract() {
  local name=$1 p
  local headers=linux-headers-$kver source=linux-source-$series
  local missing=()
  for p in "$headers" "$source" make gcc binutils xz-utils; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || die "apt-get install ${missing[*]} failed: $name cannot be built for $kver"
  fi
  build=/lib/modules/$kver/build
  [ -f "$build/Makefile" ] || die "$build/Makefile missing after installing $headers"
  tarball=$(ls /usr/src/linux-source-"$series".tar.* 2>/dev/null | head -n1 || true)
  [ -n "$tarball" ] || die "no /usr/src/linux-source-$series.tar.* after installing $source"
  tmp=$cache/tmp.$name
  rm -rf "$tmp"
  mkdir -p "$tmp"
  tar -C "$tmp" -xf "$tarball" --wildcards "linux-source-$series/drivers/infiniband/sw/$name/*" \
    || die "cannot extract drivers/infiniband/sw/$name from $tarball"
  src=$tmp/linux-source-$series/drivers/infiniband/sw/$name
}

# Builds $src with CONFIG_$2=m into $src/$3.ko and keeps it, without its debug information
# (megabytes less for the guest to read over 9p), as $4; checks the vermagic with the
# caller's function $5. Removes the build tree.
kmod_build() {
  local name=$1 config=$2 ko=$src/$3.ko dest=$4 check=$5
  make -C "$build" M="$src" "CONFIG_$config=m" modules >"$tmp/build.log" 2>&1 \
    || { tail -n 30 "$tmp/build.log" >&2; die "building $name against $build failed (log above)"; }
  [ -f "$ko" ] || die "the build left no $3.ko"
  "$check" "$ko" || die "$3.ko has vermagic '$(modinfo -F vermagic "$ko")', not $kver"
  strip --strip-debug -o "$dest.tmp" "$ko" || cp "$ko" "$dest.tmp"
  mv "$dest.tmp" "$dest"
  rm -rf "$tmp"
}
