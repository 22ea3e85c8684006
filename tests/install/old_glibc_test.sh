#!/usr/bin/env bash
# The static dtrun and dtstore on an older glibc than the one they were built
# with: in a Debian bullseye root (glibc 2.31; scripts/old-glibc-root.sh,
# made once and cached), as the wheel's manylinux2014 tag promises for the
# distributions GPU clusters run. There: --version, a c10d job of two
# workers (the store hosted and joined on a name from /etc/hosts, a Python
# worker of bullseye's own reading torchrun's environment), dtstore serving.
# Usage: old_glibc_test.sh BUILD_DIR SOURCE_DIR   (exits 77 without root or debootstrap)
set -euo pipefail
build=$(readlink -f "$1")
src=$(readlink -f "$2")
[[ $(id -u) -eq 0 ]] || { echo "old_glibc_test: needs root (chroot); skipped"; exit 77; }
command -v debootstrap >/dev/null || { echo "old_glibc_test: no debootstrap; skipped"; exit 77; }
fail() { echo "old_glibc_test: FAIL: $*" >&2; exit 1; }
in_root() { (cd "$src" && scripts/old-glibc-root.sh run "$@"); }
(cd "$src" && scripts/old-glibc-root.sh) >/dev/null

glibc=$(in_root getconf GNU_LIBC_VERSION)
host_glibc=$(getconf GNU_LIBC_VERSION)
[[ $(printf '%s\n' "${glibc#glibc }" "${host_glibc#glibc }" | sort -V | head -1) == "${glibc#glibc }" &&
   $glibc != "$host_glibc" ]] || fail "the root's $glibc is not older than the host's $host_glibc"

in_root "$build/apps/dtrun" --version | grep -q '^dtrun ' || fail "dtrun --version in the root"
in_root "$build/apps/dtstore" --version | grep -q '^dtstore ' || fail "dtstore --version in the root"

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(in_root "$build/apps/dtrun" --nnodes=1 --rdzv-backend=c10d --rdzv-endpoint="localhost:$port" \
  --nproc-per-node=2 /usr/bin/python3 -c \
  'import os, sys; print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], sys.version.split()[0])' \
  2>&1) || { echo "$out"; fail "the c10d job in the root failed"; }
[[ $(grep -c 'rank [01] of 2 3\.9' <<<"$out") == 2 ]] || { echo "$out"; fail "workers' output"; }

# dtstore serves a dtrun in the root: a c10d rendezvous of one node on it.
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
in_root "$build/apps/dtstore" --host 127.0.0.1 --port "$port" >/dev/null 2>&1 &
store=$!
trap 'kill "$store" 2>/dev/null || true' EXIT
out=$(in_root "$build/apps/dtrun" --nnodes=1 --rdzv-backend=c10d --rdzv-endpoint="127.0.0.1:$port" \
  --rdzv-conf=is_host=0,join_timeout=20 --nproc-per-node=1 \
  sh -c 'echo "joined dtstore as rank $RANK"' 2>&1) || { echo "$out"; fail "a job on dtstore in the root failed"; }
grep -q "joined dtstore as rank 0" <<<"$out" || { echo "$out"; fail "no output from the job on dtstore"; }
echo "old_glibc_test: dtrun and dtstore (built on $host_glibc) ran a job on $glibc"
