#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: unit, component,
# compat (libtorch 1.13 C++ and Python), a bounded fuzz run, and the store's
# unit + component tests again under ThreadSanitizer.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

scripts/build.sh build -DDTRUN_WERROR=ON -DDTRUN_FUZZ_SECONDS=${DTRUN_FUZZ_SECONDS:-30}
(cd build && ctest --output-on-failure -j2)

echo "== ThreadSanitizer: store unit and component tests"
scripts/build.sh build-tsan -DDTRUN_WITH_TORCH=OFF -DDTRUN_FUZZ=OFF \
  -DDTRUN_SANITIZE=thread -DDTRUN_WERROR=ON -DCMAKE_BUILD_TYPE=Debug
(cd build-tsan && ctest --output-on-failure -j2 -L 'unit|component')
