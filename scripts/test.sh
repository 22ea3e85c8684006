#!/usr/bin/env bash
# Installs what is missing, checks the formatting, builds, and runs every
# test: unit, component, compat (libtorch 1.13 C++ and Python), a bounded fuzz
# run, and the store's unit + component tests again under ThreadSanitizer.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/format.sh --check

# The torch 2.6 peer's trixie root (scripts/torch2.sh) must exist before the
# host's ctest: its compat2 tests drive the root from the host. Making it is
# mostly download, so it runs beside the host build. A root that cannot be
# made is an error: the torch 2 peer is never skipped. Each step's output is
# shown only when it fails.
torch2_log=$(mktemp)
root_log=$(mktemp)
trap 'rm -f "$torch2_log" "$root_log"' EXIT
scripts/torch2.sh >"$root_log" 2>&1 &
root_pid=$!

scripts/build.sh build -DDTRUN_WERROR=ON -DDTRUN_FUZZ_SECONDS=${DTRUN_FUZZ_SECONDS:-30}
wait "$root_pid" || {
  cat "$root_log"
  echo "test.sh: torch 2.6 peer: making the trixie root (scripts/torch2.sh) failed" >&2
  exit 1
}
(cd build && ctest --output-on-failure -j2)

echo "== torch 2.6 peer (Debian trixie root, scripts/torch2.sh)"
quietly() {  # quietly WHAT CMD [ARGS...]
  local what=$1
  shift
  "$@" >"$torch2_log" 2>&1 || {
    cat "$torch2_log"
    echo "test.sh: torch 2.6 peer: $what failed" >&2
    exit 1
  }
}
quietly "building build-torch2 in the root" scripts/torch2.sh run \
  scripts/build.sh build-torch2 -DDTRUN_WERROR=ON -DDTRUN_FUZZ=OFF
quietly "ctest -L 'torch2|compat2' in the root" scripts/torch2.sh run \
  ctest --test-dir build-torch2 --output-on-failure --no-tests=error -j2 -L 'torch2|compat2'
grep -E 'tests passed|Total Test time' "$torch2_log"

echo "== ThreadSanitizer: store unit and component tests"
scripts/build.sh build-tsan -DDTRUN_WITH_TORCH=OFF -DDTRUN_FUZZ=OFF \
  -DDTRUN_SANITIZE=thread -DDTRUN_WERROR=ON -DCMAKE_BUILD_TYPE=Debug
(cd build-tsan && ctest --output-on-failure -j2 -L 'unit|component')
