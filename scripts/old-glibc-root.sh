#!/usr/bin/env bash
# A Debian bullseye root (minbase: glibc 2.31, older than the build host's
# 2.36), where the wheel's static dtrun and dtstore must run as they do on
# the older distributions GPU clusters run (tests/install/old_glibc_test.sh).
#
# Usage (as root):
#   scripts/old-glibc-root.sh              make the root (idempotent)
#   scripts/old-glibc-root.sh run CMD...   run CMD in the root, in the current directory
#   scripts/old-glibc-root.sh path         print the root's folder
#   scripts/old-glibc-root.sh --remove     unmount and delete the root
#
# The root lives in $DTRUN_OLD_GLIBC_ROOT (default
# /var/cache/dtrun/old-glibc-bullseye); the first set-up downloads ~40 MB.
set -euo pipefail

name=old-glibc-root.sh
suite=bullseye
root=${DTRUN_OLD_GLIBC_ROOT:-/var/cache/dtrun/old-glibc-bullseye}
packages=(python3-minimal)
source "$(dirname "${BASH_SOURCE[0]}")/debian-root-lib.sh"
debian_root_main "$@"
