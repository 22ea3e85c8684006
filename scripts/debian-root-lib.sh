# Sourced by scripts/torch2.sh and scripts/deb-root.sh: a cached Debian root
# made with debootstrap, the mounts that let the host's programs and files be
# used inside it, and `run`/`path`/`--remove`/make dispatch.
#
# The sourcing script sets, before calling debian_root_main "$@":
#   name      its own name, for messages (torch2.sh)
#   suite     the Debian suite to bootstrap (trixie)
#   root      the root's folder (kept between runs)
#   packages  array: what the root holds beyond minbase (may be empty; a
#             torch peer sets it from torch_peer_packages after sourcing)
#   script    optional: the debootstrap script for a suite newer than the
#             host's debootstrap knows (forky: sid's)
#   takes_packages=1  to accept more package names as arguments
# The root is never deleted while anything is mounted below it: a recursive
# delete would walk into the host's /tmp and checkout.

# What a torch peer's root holds (torch2.sh, torch214.sh): that release's
# torch for Python and C++, and the project's build dependencies in its
# versions.
torch_peer_packages=(
  python3-torch python3-numpy python3-sklearn python3-ipython libtorch-dev
  cmake ninja-build g++ ccache pkg-config libgloo-dev
  libcli11-dev libspdlog-dev libasio-dev nlohmann-json3-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  procps iproute2 libhwloc-dev libssl-dev libzstd-dev libxxhash-dev
)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lock=${root%/}.lock

die() { echo "$name: $*" >&2; exit 1; }

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

# Device and inode of a folder: a bind mount is current when its target shows
# the same pair as its source.
ident() { stat -L -c '%d:%i' "$1" 2>/dev/null; }

# A bind mount left from an earlier run can hold a folder that has since been
# deleted and made anew at the same path (a fresh clone of the checkout): it
# is then a mount point that shows the old, empty folder. Such a mount is
# replaced, never trusted by path alone.
bind() {  # bind SRC DST_INSIDE_ROOT
  local dst=$root$2
  mkdir -p "$dst"
  if mountpoint -q "$dst"; then
    [[ $(ident "$1") == "$(ident "$dst")" ]] && return 0
    umount "$dst" 2>/dev/null || umount -l "$dst"
  fi
  mount --bind "$1" "$dst"
}

# What mount_all binds at the same path inside the root, parents first.
bound() { printf '%s\n' /proc /sys /dev /dev/shm /dev/pts /tmp "$here"; }

# Whether every bind mount_all makes is in place and current.
all_mounted() {
  local m
  for m in $(bound); do
    mountpoint -q "$root$m" && [[ $(ident "$m") == "$(ident "$root$m")" ]] || return 1
  done
}

# /proc /sys /dev for the programs, /tmp and the checkout at the same paths
# so both sides see the same files; hosts too, or name lookups of this
# machine hang (torchrun --standalone does one).
mount_all() {
  local m
  for m in $(bound); do bind "$m" "$m"; done
  cp -f /etc/resolv.conf /etc/hosts "$root/etc/"
}

unmount_all() {
  local m
  for m in $(mounts_below_root); do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
}

bootstrap() {
  command -v debootstrap >/dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
  }
  [[ -f $root/.dtrun-bootstrapped ]] && return 0
  # A half-made root from an interrupted run: start it over.
  unmount_all
  [[ -z $(mounts_below_root) ]] || die "$root still has mounts below it; not removing it"
  rm -rf "$root"
  mkdir -p "$root"
  echo "$name: debootstrap $suite into $root (first run: a few minutes)"
  debootstrap --variant=minbase "$suite" "$root" "$(mirror)" \
    ${script:+/usr/share/debootstrap/scripts/$script} >"$root.debootstrap.log" 2>&1 ||
    die "debootstrap failed; see $root.debootstrap.log"
  # A testing suite's Release file is valid for a week; a mirror that lags
  # behind must not stop the root's apt.
  echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99dtrun-valid-until"
  # No services start inside the root.
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod +x "$root/usr/sbin/policy-rc.d"
  touch "$root/.dtrun-bootstrapped"
}

# Installs PACKAGEs unless this exact list was installed before. apt's output
# goes to a log, shown only when it fails.
install_packages() {
  (($# > 0)) || return 0
  local want
  want=$(printf '%s\n' "$@" | sort -u | sha256sum | cut -c1-16)
  grep -qx "$want" "$root/.dtrun-packages" 2>/dev/null && return 0
  echo "$name: installing $# packages in the root"
  if ! {
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
      chroot "$root" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "$@" &&
      chroot "$root" apt-get clean
  } >"$root.apt.log" 2>&1; then
    tail -20 "$root.apt.log" >&2
    die "installing packages in the root failed; see $root.apt.log"
  fi
  echo "$want" >>"$root/.dtrun-packages"
}

ready() {
  [[ -f $root/.dtrun-bootstrapped ]] &&
    { ((${#packages[@]} == 0)) || [[ -f $root/.dtrun-packages ]]; }
}

debian_root_main() {
  # The lock sits beside the root, in a folder that a new machine lacks.
  [[ ${1:-} == path ]] || mkdir -p "$(dirname "$lock")" 2>/dev/null || true
  case ${1:-} in
    run)
      shift
      [[ $# -gt 0 ]] || die "usage: $name run CMD [ARGS...]"
      need_root
      ready || die "no root at $root; make it first: scripts/$name"
      # Concurrent callers (ctest -j) must not race on the mounts.
      { flock 9; all_mounted || mount_all; } 9>"$lock"
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
      echo "$name: removed $root"
      ;;
    -*)
      die "unknown argument '$1'; usage: $name [run CMD...|path|--remove]"
      ;;
    *)
      if (($# > 0)) && [[ ${takes_packages:-0} != 1 ]]; then
        die "unknown argument '$1'; usage: $name [run CMD...|path|--remove]"
      fi
      need_root
      { flock 9; bootstrap; mount_all; install_packages "${packages[@]}" "$@"; } 9>"$lock"
      echo "$root"
      ;;
  esac
}
