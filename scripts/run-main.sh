#!/usr/bin/env bash
# The main job: installs what is missing, builds, then runs dtstore serving a
# real 4-rank gloo all_reduce of Debian's Python torch, exactly as PyTorch
# workers use torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True).
# Usage: scripts/run-main.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build

world=4
out=$(mktemp -d)
build/apps/dtstore --host 127.0.0.1 --port 0 >"$out/store.out" &
store_pid=$!
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  kill "$store_pid" 2>/dev/null || true
  wait "$store_pid" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
for _ in $(seq 100); do
  grep -q '^listening on ' "$out/store.out" && break
  sleep 0.05
done
port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$out/store.out")
echo "dtstore listening on 127.0.0.1:$port; starting $world gloo ranks"
for ((rank = 0; rank < world; rank++)); do
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 OMP_NUM_THREADS=1 \
    /usr/bin/python3 examples/allreduce_check.py &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
pids=()
[[ $rc -eq 0 ]] && echo "main job: OK" || echo "main job: FAILED" >&2
exit $rc
