#!/usr/bin/env bash
# Installs what is missing, checks the formatting, builds, and runs every
# test: unit, component, compat (libtorch 1.13 C++ and Python; torch 2.6 and
# 2.14 from Debian roots), a bounded fuzz run, the tree built and tested
# inside each root, and the store's unit + component tests again under
# ThreadSanitizer.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/format.sh --check

# The Debian roots of the torch 2.6 and 2.14 peers (scripts/torch2.sh,
# scripts/torch214.sh) must exist before the host's ctest: its compat2 and
# compat214 tests drive the roots from the host. Making them is mostly
# download, so it runs beside the host build. A root that cannot be made is
# an error: no torch peer is ever skipped. Each step's output is shown only
# when it fails.
step_log=$(mktemp)
root_log=$(mktemp)
root214_log=$(mktemp)
trap 'rm -f "$step_log" "$root_log" "$root214_log"' EXIT
scripts/torch2.sh >"$root_log" 2>&1 &
root_pid=$!
scripts/torch214.sh >"$root214_log" 2>&1 &
root214_pid=$!

scripts/build.sh build -DDTRUN_WERROR=ON -DDTRUN_FUZZ_SECONDS=${DTRUN_FUZZ_SECONDS:-30}
wait "$root_pid" || {
  cat "$root_log"
  echo "test.sh: torch 2.6 peer: making the trixie root (scripts/torch2.sh) failed" >&2
  exit 1
}
wait "$root214_pid" || {
  cat "$root214_log"
  echo "test.sh: torch 2.14 peer: making the forky root (scripts/torch214.sh) failed" >&2
  exit 1
}
(cd build && ctest --output-on-failure -j2)

quietly() {  # quietly WHAT CMD [ARGS...]
  local what=$1
  shift
  "$@" >"$step_log" 2>&1 || {
    cat "$step_log"
    echo "test.sh: $what failed" >&2
    exit 1
  }
}
# Each root builds the whole tree against its libtorch into a folder of its
# own and runs the tests that must pass against that torch (labels torch2
# and compat2: lib, train_cfg, libtorch's C++ store both ways).
for peer in "torch2 2.6 trixie" "torch214 2.14 forky"; do
  read -r script version suite <<<"$peer"
  echo "== torch $version peer (Debian $suite root, scripts/$script.sh)"
  quietly "torch $version peer: building build-$script in the root" scripts/$script.sh run \
    scripts/build.sh build-$script -DDTRUN_WERROR=ON -DDTRUN_FUZZ=OFF
  quietly "torch $version peer: ctest -L 'torch2|compat2' in the root" scripts/$script.sh run \
    ctest --test-dir build-$script --output-on-failure --no-tests=error -j2 -L 'torch2|compat2'
  grep -E 'tests passed|Total Test time' "$step_log"
done

echo "== checkpoints across torch versions (1.13 -> 2.6 -> 2.14 -> 1.13)"
quietly "resuming checkpoints across torch versions" tests/lib/cross_version_resume_test.sh
tail -1 "$step_log"

echo "== ThreadSanitizer: store unit and component tests"
scripts/build.sh build-tsan -DDTRUN_WITH_TORCH=OFF -DDTRUN_FUZZ=OFF \
  -DDTRUN_SANITIZE=thread -DDTRUN_WERROR=ON -DCMAKE_BUILD_TYPE=Debug
(cd build-tsan && ctest --output-on-failure -j2 -L 'unit|component')
