#!/usr/bin/env bash
# Builds dtrun's wheel into build-wheel/ from a Release build of the static
# dtrun and dtstore (build-wheel/release) and apps/dtrun/python: then
#   pip install build-wheel/dtrun-<version>-py3-none-manylinux_*_x86_64.whl
# puts dtrun and dtstore on PATH and makes `python -m dtrun` and
# `%load_ext dtrun` work. Usage: scripts/wheel.sh [BUILD_DIR]
# With BUILD_DIR, its binaries are taken as they are (no build here).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n ${1:-} ]]; then
  build=$1
else
  build=build-wheel/release
  DTRUN_BUILD_TARGETS="dtrun dtstore" scripts/build.sh "$build" \
    -DCMAKE_BUILD_TYPE=Release -DDTRUN_BUILD_TESTS=OFF -DDTRUN_FUZZ=OFF -DDTRUN_WITH_TORCH=OFF
fi
version=$(sed -n 's/^project(dtrun VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
/usr/bin/python3 scripts/wheel.py --dtrun "$build/apps/dtrun" --dtstore "$build/apps/dtstore" \
  --version "$version" --out build-wheel
