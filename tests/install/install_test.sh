#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then use only what was installed:
# the programs (--version, --help, completion), the libraries' SONAMEs, every
# public header on its own, pkg-config (a store client against the installed
# dtstore), and find_package(dtrun) (examples/consumer, a DDP trainer built
# outside the tree and run with the installed dtrun on 2 gloo ranks).
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$build/install-test   # fixed path: ccache can reuse the consumer's objects
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"
dtstore_pid=
trap '[[ -n $dtstore_pid ]] && kill "$dtstore_pid" 2>/dev/null; true' EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t=$(now)
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
echo "install_test: cmake --install took $(secs "$t") s"

libdir=$(cd "$prefix" && ls -d lib*/cmake/dtrun | sed 's|/cmake/dtrun||')
for f in bin/dtrun bin/dtstore bin/dtrun-srun share/man/man1/dtrun.1.gz share/man/man1/dtstore.1.gz \
         share/bash-completion/completions/dtrun share/zsh/vendor-completions/_dtrun \
         "$libdir/cmake/dtrun/dtrunConfig.cmake" "$libdir/cmake/dtrun/dtrunConfigVersion.cmake" \
         "$libdir/pkgconfig/dtrun.pc" "$libdir/pkgconfig/dtrun-store.pc" \
         include/dtrun/lib/ddp.h include/dtrun/rendezvous/store_client.h; do
  [[ -e $prefix/$f ]] || fail "$f was not installed"
done
ls "$prefix"/lib/python3*/dist-packages/dtrun/__init__.py >/dev/null || fail "no Python session package"
for lib in dtrun_store dtrun_train; do
  soname=$(readelf -d "$prefix/$libdir/lib$lib.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [[ $soname =~ ^lib$lib\.so\.[0-9]+\.[0-9]+$ ]] || fail "lib$lib.so has SONAME '$soname'"
done
ldd "$prefix/bin/dtrun" "$prefix/bin/dtstore" | grep -q 'libtorch\|libc10' && fail "dtrun or dtstore links torch"

# Programs.
"$prefix/bin/dtrun" --version | grep -qE '^dtrun [0-9]+\.[0-9]+\.[0-9]+ \(git ([0-9a-f]{12}|unknown)\)$' ||
  fail "dtrun --version: $("$prefix/bin/dtrun" --version)"
"$prefix/bin/dtstore" --version | grep -qE '^dtstore [0-9]+\.[0-9]+\.[0-9]+ \(git ' || fail "dtstore --version"
[[ $("$prefix/bin/dtrun" --help | grep -c 'Usage:') == 1 ]] || fail "dtrun --help has not one Usage line"
"$prefix/bin/dtrun" --help | grep -q "$build" && fail "dtrun --help names the build folder"

# The bash completion, sourced as bash-completion would.
# shellcheck disable=SC1090
source "$prefix/share/bash-completion/completions/dtrun"
COMP_WORDS=(dtrun --nproc); COMP_CWORD=1; _dtrun
[[ " ${COMPREPLY[*]} " == *" --nproc-per-node "* ]] || fail "completion of --nproc: ${COMPREPLY[*]}"
COMP_WORDS=(dtrun --log-level ""); COMP_CWORD=2; _dtrun
[[ " ${COMPREPLY[*]} " == *" debug "* ]] || fail "completion after --log-level: ${COMPREPLY[*]}"
if command -v zsh >/dev/null; then zsh -n "$prefix/share/zsh/vendor-completions/_dtrun"; fi

# Every public header compiles on its own with pkg-config's flags.
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
cflags=$(pkg-config --cflags dtrun)
for h in $(cd "$prefix/include/dtrun" && find . -name '*.h' | sort); do
  echo "#include \"${h#./}\"" | c++ -std=c++17 -fsyntax-only $cflags -x c++ - ||
    fail "installed header ${h#./} does not compile alone"
done

# pkg-config: a store client against the installed dtstore.
c++ -std=c++17 -o "$work/store_client" "$src/tests/install/store_client_main.cc" \
  $(pkg-config --cflags --libs dtrun-store) -Wl,-rpath,"$prefix/$libdir"
"$prefix/bin/dtstore" --host 127.0.0.1 --port 0 >"$work/dtstore.out" 2>"$work/dtstore.err" &
dtstore_pid=$!
for _ in $(seq 100); do grep -q listening "$work/dtstore.out" && break; sleep 0.05; done
port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/dtstore.out")
[[ -n $port ]] || fail "dtstore did not start: $(cat "$work/dtstore.err")"
"$work/store_client" 127.0.0.1 "$port" | tee "$work/store_client.out"
grep -q 'OK value=hello counter=42' "$work/store_client.out" || fail "store client"

# find_package(dtrun): the consumer, built outside the tree.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
t=$(now)
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  "${launcher[@]}" >"$work/consumer-configure.log" 2>&1 ||
  { cat "$work/consumer-configure.log"; fail "consumer: configure"; }
cmake --build "$work/consumer" >"$work/consumer-build.log" 2>&1 ||
  { cat "$work/consumer-build.log"; fail "consumer: build"; }
echo "install_test: consumer configured and built in $(secs "$t") s"
"$prefix/bin/dtrun" --nproc-per-node=2 "$work/consumer/consumer_train" | tee "$work/consumer.out"
python3 - "$work/consumer.out" <<'PY'
import re, sys
lines = re.findall(r"consumer: rank (\d) of 2 steps=\d+ loss=\S+ weights_sum=(\S+)", open(sys.argv[1]).read())
ranks = sorted(r for r, _ in lines)
sums = {s for _, s in lines}
if ranks != ["0", "1"] or len(sums) != 1:
    sys.exit(f"consumer: expected ranks 0 and 1 with equal weights, got {lines}")
PY
# Its own model through the installed trainer (lib/trainer.h): rank 1
# killed at step 60 resumes onto the bits and state of an unbroken run.
"$prefix/bin/dtrun" --nproc-per-node=2 --log-level=error "$work/consumer/consumer_trainer" \
  "$work/ct-clean" | grep -A1 '^done:' >"$work/ct-clean.out"
"$prefix/bin/dtrun" --nproc-per-node=2 --log-level=error --max-restarts=1 \
  "$work/consumer/consumer_trainer" "$work/ct-killed" 60 2>/dev/null | tee "$work/ct-killed.all" |
  grep -A1 '^done:' >"$work/ct-killed.out"
grep -q 'resumed from' "$work/ct-killed.all" && [[ -s $work/ct-clean.out ]] &&
  cmp -s "$work/ct-clean.out" "$work/ct-killed.out" ||
  fail "consumer_trainer: killed run $(cat "$work/ct-killed.out") vs clean $(cat "$work/ct-clean.out")"
rm -rf "$work/ct-clean" "$work/ct-killed"
cat "$work/ct-clean.out"
echo "install_test: OK"
