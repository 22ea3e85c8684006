#!/usr/bin/env bash
# The .deb packages on a clean Debian bookworm: build them (scripts/package.sh),
# install them into a cached minbase root (scripts/deb-root.sh; their
# dependencies are installed there once, from the packages' own Depends),
# then, with nothing but the packages: dtrun --version, a 2-rank Python gloo
# job, `import dtrun` without PYTHONPATH, the consumer trainer built with
# find_package(dtrun) and run on 2 ranks; then remove them and check that
# nothing they installed is left.
# Usage: deb_test.sh PACKAGE_BUILD_DIR SOURCE_DIR   (exits 77 without root or debootstrap)
set -euo pipefail
pkg_build=$1
src=$(cd "$2" && pwd)
[[ $(id -u) -eq 0 ]] || { echo "deb_test: needs root (chroot, dpkg); skipped"; exit 77; }
command -v debootstrap >/dev/null || { echo "deb_test: no debootstrap; skipped"; exit 77; }
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
in_root() { (cd "$src" && scripts/deb-root.sh run "$@"); }

# One test at a time in the shared cached root (other build folders run it too).
lock=$(cd "$src" && scripts/deb-root.sh path).test.lock
mkdir -p "$(dirname "$lock")"
exec 8>"$lock"
flock 8

t=$(now)
mapfile -t debs < <("$src/scripts/package.sh" "$pkg_build")
((${#debs[@]} == 2)) || fail "package.sh made ${#debs[@]} packages: ${debs[*]}"
echo "deb_test: packages built in $(secs "$t") s"
for d in "${debs[@]}"; do
  echo "deb_test: $(basename "$d"): $(du -k "$d" | cut -f1) KiB;" \
       "Depends: $(dpkg-deb -f "$d" Depends)"
done

# The root gets what the packages depend on, plus the consumer's build tools
# and torch for Python (dtrun recommends it), once per list.
deps=$(for d in "${debs[@]}"; do dpkg-deb -f "$d" Depends; echo ,; done |
  tr ',' '\n' | sed 's/([^)]*)//; s/|.*//; s/^ *//; s/ *$//' | grep -v '^dtrun$' | grep -v '^$' | sort -u)
# shellcheck disable=SC2086
(cd "$src" && scripts/deb-root.sh $deps cmake make g++ python3-torch) >/dev/null

work=$(mktemp -d /tmp/dtrun-deb-test.XXXXXX)
trap 'in_root dpkg --purge dtrun-dev dtrun >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
cp "${debs[@]}" "$work/"
in_root dpkg --purge dtrun-dev dtrun >/dev/null 2>&1 || true   # a run that was cut off
t=$(now)
in_root dpkg -i "$work"/*.deb >"$work/dpkg-install.log" || { cat "$work/dpkg-install.log"; fail "dpkg -i"; }
echo "deb_test: dpkg -i of both packages took $(secs "$t") s"
in_root dpkg -L dtrun dtrun-dev | sort -u >"$work/files"

in_root dtrun --version | tee "$work/version"
grep -qE '^dtrun [0-9.]+ \(git ' "$work/version" || fail "dtrun --version"
in_root dtstore --version | grep -q '^dtstore ' || fail "dtstore --version"
in_root test -x /usr/bin/dtrun-srun || fail "no /usr/bin/dtrun-srun"
in_root test -f /usr/share/bash-completion/completions/dtrun || fail "no bash completion"
in_root test -f /usr/share/man/man1/dtrun.1.gz || fail "no dtrun(1)"

# A 2-rank gloo job of Python workers; the session package without PYTHONPATH.
in_root env -u PYTHONPATH dtrun --nproc-per-node=2 examples/allreduce_check.py | tee "$work/gloo"
grep -q 'all_reduce over 2 ranks: sum=3 expected=3 OK' "$work/gloo" || fail "2-rank gloo job"
in_root env -u PYTHONPATH python3 -c \
  'import dtrun; assert callable(dtrun.load_ipython_extension); print(dtrun.__file__)' | tee "$work/py"
grep -q '^/usr/lib/python3/dist-packages/dtrun/__init__.py$' "$work/py" || fail "import dtrun"

# The consumer, built against the installed dtrun-dev, run by the installed dtrun.
t=$(now)
in_root cmake -S examples/consumer -B "$work/consumer" >"$work/consumer.log" 2>&1 &&
  in_root cmake --build "$work/consumer" >>"$work/consumer.log" 2>&1 ||
  { cat "$work/consumer.log"; fail "consumer build in the root"; }
echo "deb_test: consumer configured and built in the root in $(secs "$t") s"
in_root dtrun --nproc-per-node=2 "$work/consumer/consumer_train" | tee "$work/consumer.out"
[[ $(grep -c 'consumer: rank [01] of 2' "$work/consumer.out") == 2 ]] || fail "consumer run"
# Its own model through the installed trainer: rank 1 killed at step 60,
# resumed from the async checkpoint onto an unbroken run's bits and state.
in_root dtrun --nproc-per-node=2 --log-level=error "$work/consumer/consumer_trainer" \
  "$work/ct-clean" | grep -A1 '^done:' >"$work/ct-clean.out"
in_root dtrun --nproc-per-node=2 --log-level=error --max-restarts=1 \
  "$work/consumer/consumer_trainer" "$work/ct-killed" 60 2>/dev/null | tee "$work/ct-killed.all" |
  grep -A1 '^done:' >"$work/ct-killed.out"
grep -q 'resumed from' "$work/ct-killed.all" && [[ -s $work/ct-clean.out ]] &&
  cmp -s "$work/ct-clean.out" "$work/ct-killed.out" ||
  fail "consumer_trainer: killed run $(cat "$work/ct-killed.out") vs clean $(cat "$work/ct-clean.out")"

# Removal leaves none of the packages' files (folders shared with others may stay).
t=$(now)
in_root dpkg --purge dtrun-dev dtrun >/dev/null
echo "deb_test: dpkg --purge took $(secs "$t") s"
root=$(cd "$src" && scripts/deb-root.sh path)
left=$(while read -r f; do if [[ -e $root$f && ! -d $root$f ]]; then echo "$f"; fi; done <"$work/files")
[[ -z $left ]] || fail "left after removal: $left"
[[ ! -e $root/usr/lib/python3/dist-packages/dtrun ]] || fail "the Python package's folder is left"
echo "deb_test: OK"
