#!/usr/bin/env bash
# Formats the C++ sources with clang-format (.clang-format: Google, 80
# columns), or with --check lists the files that are not formatted and fails.
# Usage: scripts/format.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- \
  'apps/*.cc' 'apps/*.h' 'lib/*.cc' 'lib/*.h' 'rendezvous/*.cc' 'rendezvous/*.h' \
  'tests/*.cc' 'tests/*.h' 'examples/*.cc' 'examples/*.h')
if [[ "${1:-}" != "--check" ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'format.sh: not clang-format clean (run scripts/format.sh):\n' >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format.sh: ${#files[@]} files clang-format clean"
