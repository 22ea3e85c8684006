#!/usr/bin/env bash
# Configures (once) and builds dtrun with CMake + ninja, ccache when present.
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake -D options...]
# DTRUN_BUILD_TARGETS="a b" builds only those targets (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths relative to the checkout, so a fresh clone reuses the cache. With -g
# ccache would also hash the folder it compiles in, which differs for every
# clone (CI's included): NOHASHDIR leaves it out; only the compile folder
# recorded in the debug info may then name another clone.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
cmake -S . -B "$build_dir" -G Ninja "$@" >/dev/null
# shellcheck disable=SC2086 # a list of target names
ninja -C "$build_dir" ${DTRUN_BUILD_TARGETS:-}
