#!/usr/bin/env bash
# A clean Debian bookworm root (minbase) to install dtrun's .deb packages into,
# as a new machine would. Made once and cached; the test that uses it
# (tests/install/deb_test.sh) only installs and removes the packages.
#
# Usage (as root):
#   scripts/deb-root.sh [PACKAGE...]    make the root; with PACKAGEs, make sure
#                                       they are installed (apt, once per list)
#   scripts/deb-root.sh run CMD...      run CMD in the root, in the current directory
#   scripts/deb-root.sh path            print the root's folder
#   scripts/deb-root.sh --remove        unmount and delete the root
#
# The root lives in $DTRUN_DEB_ROOT (default /var/cache/dtrun/deb-bookworm).
# `run` bind-mounts /proc /sys /dev /dev/shm /dev/pts, the host's /tmp and this
# checkout at the same paths; the network is the host's (same code as
# scripts/torch2.sh: scripts/debian-root-lib.sh).
set -euo pipefail

name=deb-root.sh
suite=bookworm
root=${DTRUN_DEB_ROOT:-/var/cache/dtrun/deb-bookworm}
packages=()
takes_packages=1
source "$(dirname "${BASH_SOURCE[0]}")/debian-root-lib.sh"
debian_root_main "$@"
