#!/usr/bin/env bash
# A Debian forky root with torch 2.14 (python3-torch, libtorch-dev) and what
# dtrun needs to build inside it: the project's third real PyTorch peer, the
# newest torch Debian ships. Same commands and mounts as scripts/torch2.sh
# (scripts/debian-root-lib.sh), in its own folder:
#
# Usage (as root):
#   scripts/torch214.sh              make the root, or bring it up to date (idempotent)
#   scripts/torch214.sh run CMD...   run CMD in the root, in the current directory
#   scripts/torch214.sh path         print the root's folder
#   scripts/torch214.sh --remove     unmount and delete the root
#
# The root lives in $DTRUN_TORCH214_ROOT (default
# /var/cache/dtrun/torch214-forky) and is kept between runs. Bookworm's
# debootstrap predates forky, so the root is made with sid's script (the
# same layout); forky is Debian's testing suite, whose Release file expires
# weekly, so the root's apt does not check that date.
set -euo pipefail

name=torch214.sh
suite=forky
script=sid
root=${DTRUN_TORCH214_ROOT:-/var/cache/dtrun/torch214-forky}
# torch 2.14 for Python and C++, and the project's build dependencies in
# forky's versions.
packages=(
  python3-torch python3-numpy python3-sklearn python3-ipython libtorch-dev
  cmake ninja-build g++ ccache pkg-config libgloo-dev
  libcli11-dev libspdlog-dev libasio-dev nlohmann-json3-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  procps iproute2 libhwloc-dev libssl-dev libzstd-dev
)
source "$(dirname "${BASH_SOURCE[0]}")/debian-root-lib.sh"
debian_root_main "$@"
