#!/usr/bin/env bash
# Builds the Debian packages dtrun_<version>_<arch>.deb and
# dtrun-dev_<version>_<arch>.deb with CPack, in a build folder of their own
# configured for /usr (ccache makes it cheap next to an existing build).
# Usage: scripts/package.sh [BUILD_DIR]   (default build-pkg; prints the .deb paths)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-pkg}
scripts/build.sh "$build_dir" -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDTRUN_BUILD_TESTS=OFF -DDTRUN_FUZZ=OFF -DDTRUN_WERROR=ON >/dev/null
rm -f "$build_dir"/*.deb
(cd "$build_dir" && cpack -G DEB >cpack.log 2>&1) || {
  cat "$build_dir/cpack.log" >&2
  echo "package.sh: cpack failed; see $build_dir/cpack.log" >&2
  exit 1
}
ls "$(cd "$build_dir" && pwd)"/*.deb
