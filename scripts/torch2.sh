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
# and is kept between runs: the first set-up downloads ~330 MB and takes a few
# minutes, later calls take milliseconds. `run` bind-mounts /proc /sys /dev
# /dev/shm /dev/pts, the host's /tmp and this checkout at the same paths, so a
# dtrun on the host can launch workers that run inside the root
# (scripts/torch2-python is such an interpreter) and both sides see the same
# files. The network namespace is the host's: 127.0.0.1 is the same loopback.
set -euo pipefail

name=torch2.sh
suite=trixie
root=${DTRUN_TORCH2_ROOT:-/var/cache/dtrun/torch2-trixie}
source "$(dirname "${BASH_SOURCE[0]}")/debian-root-lib.sh"
packages=("${torch_peer_packages[@]}")
debian_root_main "$@"
