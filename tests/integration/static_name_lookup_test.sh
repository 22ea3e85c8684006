#!/usr/bin/env bash
# The static dtrun and dtstore with an nsswitch.conf as Ubuntu, Fedora and
# RHEL ship them (mdns4_minimal, resolve, myhostname before dns), in a mount
# namespace of the test's own whose /etc/nsswitch.conf and /etc/hosts are
# the test's. The hosts line also names dtrunprobe, a module of the test's
# (tests/helpers/nss_probe.cc) on LD_LIBRARY_PATH, which a static glibc
# would load as it would load the system's: the binaries must never load
# it, must resolve names from /etc/hosts and DNS, and must say what to do
# about a name that only a module they skip knows.
# Usage: static_name_lookup_test.sh DTRUN DTSTORE PROBE_MODULE
# (exits 77 without root or unshare).
set -euo pipefail
dtrun=$(readlink -f "$1")
dtstore=$(readlink -f "$2")
probe=$(readlink -f "$3")
[[ $(id -u) -eq 0 ]] || { echo "static_name_lookup_test: needs root (mount namespace); skipped"; exit 77; }
command -v unshare >/dev/null || { echo "static_name_lookup_test: no unshare; skipped"; exit 77; }
fail() { echo "static_name_lookup_test: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

mkdir "$tmp/lib"
cp "$probe" "$tmp/lib/libnss_dtrunprobe.so.2"
echo 'hosts: files mdns4_minimal [NOTFOUND=return] dtrunprobe resolve [!UNAVAIL=return] myhostname dns' \
  >"$tmp/nsswitch.conf"
{ cat /etc/hosts; echo "127.0.0.9 dtrun-hosts-only"; } >"$tmp/hosts"
export DTRUN_NSS_PROBE_LOG=$tmp/probe.log LD_LIBRARY_PATH=$tmp/lib
in_ns() {  # in_ns CMD...: CMD with the test's nsswitch.conf and hosts
  unshare -m sh -c 'mount --bind "$1" /etc/nsswitch.conf && mount --bind "$2" /etc/hosts &&
    shift 2 && exec "$@"' sh "$tmp/nsswitch.conf" "$tmp/hosts" "$@"
}
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.9", 0)); print(s.getsockname()[1])'
}

# The module works: a dynamically linked getent loads it and resolves the
# probe's name (so the checks below can fail).
in_ns getent hosts probe-only-host | grep -q '^127.0.0.1 ' || fail "getent did not resolve through the probe module"
grep -q getent "$tmp/probe.log" || fail "the probe module logged no load"

# A c10d job whose endpoint is a name from /etc/hosts: dtrun hosts the store
# there, connects to it and runs two workers.
port=$(free_port)
out=$(in_ns "$dtrun" --nnodes=1 --rdzv-backend=c10d --rdzv-endpoint="dtrun-hosts-only:$port" \
  --nproc-per-node=2 --no-python sh -c 'echo "rank $RANK of $WORLD_SIZE at $MASTER_ADDR"' 2>"$tmp/err") ||
  { cat "$tmp/err"; fail "the c10d job on a name from /etc/hosts failed"; }
[[ $(grep -c 'rank [01] of 2' <<<"$out") == 2 ]] || { cat "$tmp/err"; fail "workers' output: $out"; }

# dtstore listens on a name from /etc/hosts.
port=$(free_port)
in_ns "$dtstore" --host dtrun-hosts-only --port "$port" >"$tmp/store.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  /usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.9', $port), 1)" 2>/dev/null && break
  kill -0 "${pids[-1]}" 2>/dev/null || { cat "$tmp/store.out"; fail "dtstore exited"; }
  sleep 0.1
done
/usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.9', $port), 1)" ||
  { cat "$tmp/store.out"; fail "dtstore does not listen on dtrun-hosts-only:$port"; }
kill "${pids[-1]}"

# A name only the probe knows: not resolved, and the message says why and
# what to do, within the join timeout.
port=$(free_port)
rc=0
in_ns "$dtrun" --nnodes=1 --rdzv-backend=c10d --rdzv-endpoint="probe-only-host:$port" \
  --rdzv-conf=join_timeout=3 --nproc-per-node=1 --no-python true >"$tmp/out" 2>"$tmp/err" || rc=$?
((rc != 0)) || fail "dtrun joined probe-only-host: the probe module was loaded"
grep -q "hosts line also names mdns4_minimal, dtrunprobe, resolve, myhostname" "$tmp/err" ||
  { cat "$tmp/err"; fail "no word of the skipped modules"; }
grep -q "put the name in /etc/hosts" "$tmp/err" || { cat "$tmp/err"; fail "no word of what to do"; }

# Neither binary ever loaded a module.
if grep -E "/(dtrun|dtstore)$" "$tmp/probe.log"; then
  fail "a static binary loaded the probe module"
fi
echo "static_name_lookup_test: /etc/hosts names resolved, no module loaded, the skipped ones named"
