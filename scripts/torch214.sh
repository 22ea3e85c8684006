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
source "$(dirname "${BASH_SOURCE[0]}")/debian-root-lib.sh"
packages=("${torch_peer_packages[@]}")
debian_root_main "$@"
