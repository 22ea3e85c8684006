#!/usr/bin/env bash
# A Debian trixie root with torch 2.6 (python3-torch, libtorch-dev) and what
# dtrun needs to build inside it: the project's second real PyTorch peer.
#
# Usage (as root):
#   scripts/torch2.sh              make the root, or bring it up to date (idempotent)
#   scripts/torch2.sh run CMD...   run CMD in the root, in the current directory
#   scripts/torch2.sh path         print the root's folder
#   scripts/torch2.sh --remove     unmount and delete the root
#
# The root lives in $DTRUN_TORCH2_ROOT (default /var/cache/dtrun/torch2-trixie)
# and is kept between runs: the first set-up downloads ~1 GB and takes a few
# minutes, later calls take milliseconds. `run` bind-mounts /proc /sys /dev
# /dev/shm /dev/pts, the host's /tmp and this checkout at the same paths, so a
# dtrun on the host can launch workers that run inside the root
# (scripts/torch2-python is such an interpreter) and both sides see the same
# files. The network namespace is the host's: 127.0.0.1 is the same loopback.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=${DTRUN_TORCH2_ROOT:-/var/cache/dtrun/torch2-trixie}
lock=${root%/}.lock

# What the root holds beyond minbase: torch 2.6 for Python and C++, and the
# project's build dependencies in trixie's versions.
packages=(
  python3-torch python3-numpy python3-sklearn libtorch-dev
  cmake ninja-build g++ ccache pkg-config libgloo-dev
  libcli11-dev libspdlog-dev libasio-dev nlohmann-json3-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  procps iproute2
)

die() { echo "torch2.sh: $*" >&2; exit 1; }

need_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, chroot and mounts need it)"
}

# The Debian mirror the host's apt uses, so the root comes from the same place.
mirror() {
  local uri
  uri=$(grep -hE '^\s*URIs:.*/debian/?\s*$' /etc/apt/sources.list.d/*.sources 2>/dev/null |
    head -1 | awk '{print $2}')
  if [[ -z $uri ]]; then
    uri=$(grep -hE '^\s*deb\s+\S+/debian/?\s' /etc/apt/sources.list 2>/dev/null |
      head -1 | awk '{print $2}')
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

# Mounts below the root, deepest first (the order to unmount them in).
mounts_below_root() {
  awk -v r="$root/" 'index($2 "/", r) == 1 { print $2 }' /proc/self/mounts | sort -r
}

bind() {  # bind SRC DST_INSIDE_ROOT
  local dst=$root$2
  mkdir -p "$dst"
  mountpoint -q "$dst" || mount --bind "$1" "$dst"
}

mount_all() {
  local m
  for m in /proc /sys /dev /dev/shm /dev/pts /tmp; do bind "$m" "$m"; done
  bind "$here" "$here"
  cp -f /etc/resolv.conf /etc/hosts "$root/etc/"
}

unmount_all() {
  local m
  for m in $(mounts_below_root); do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
}

make_root() {
  need_root
  command -v debootstrap >/dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
  }
  if [[ ! -f $root/.dtrun-bootstrapped ]]; then
    # A half-made root from an interrupted run: start it over, but never
    # while anything is mounted below it (that would delete the host's files).
    unmount_all
    [[ -z $(mounts_below_root) ]] || die "$root still has mounts below it; not removing it"
    rm -rf "$root"
    mkdir -p "$root"
    echo "torch2.sh: debootstrap trixie into $root (first run: a few minutes)"
    debootstrap --variant=minbase trixie "$root" "$(mirror)" >"$root.debootstrap.log" 2>&1 ||
      die "debootstrap failed; see $root.debootstrap.log"
    touch "$root/.dtrun-bootstrapped"
  fi
  mount_all
  local want
  want=$(printf '%s\n' "${packages[@]}" | sort | sha256sum | cut -c1-16)
  if [[ $(cat "$root/.dtrun-packages" 2>/dev/null) != "$want" ]]; then
    echo "torch2.sh: installing torch 2.6 and build tools in the root"
    # No services start inside the root.
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod +x "$root/usr/sbin/policy-rc.d"
    if ! {
      chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        chroot "$root" env DEBIAN_FRONTEND=noninteractive \
          apt-get install -y -q --no-install-recommends "${packages[@]}" &&
        chroot "$root" apt-get clean
    } >"$root.apt.log" 2>&1; then
      tail -20 "$root.apt.log" >&2
      die "installing packages in the root failed; see $root.apt.log"
    fi
    echo "$want" >"$root/.dtrun-packages"
  fi
}

ready() {
  [[ -f $root/.dtrun-bootstrapped && -f $root/.dtrun-packages ]]
}

case ${1:-} in
  run)
    shift
    [[ $# -gt 0 ]] || die "usage: torch2.sh run CMD [ARGS...]"
    need_root
    ready || die "no torch 2.6 root at $root; make it first: scripts/torch2.sh"
    # Concurrent callers (ctest -j) must not race on the mounts.
    { flock 9; mountpoint -q "$root$here" || mount_all; } 9>"$lock"
    # chroot execs the command, which keeps this process's pid: signals and
    # PR_SET_PDEATHSIG from a launcher reach the real program.
    exec chroot "$root" /bin/sh -c 'cd "$1" && shift && exec "$@"' sh "$PWD" "$@"
    ;;
  path)
    echo "$root"
    ;;
  --remove)
    need_root
    { flock 9; unmount_all; } 9>"$lock"
    [[ -z $(mounts_below_root) ]] || die "could not unmount everything below $root; not removing it"
    rm -rf "$root" "$root.debootstrap.log" "$root.apt.log" "$lock"
    echo "torch2.sh: removed $root"
    ;;
  "")
    { flock 9; make_root; } 9>"$lock"
    echo "$root"
    ;;
  *)
    die "unknown argument '$1'; usage: torch2.sh [run CMD...|path|--remove]"
    ;;
esac
