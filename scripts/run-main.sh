#!/usr/bin/env bash
# The main job: installs what is missing, builds, then
#  1. dtrun launches 4 Debian Python torch workers that init gloo through the
#     store dtrun hosts and all_reduce;
#  2. the standalone dtstore serves the same 4 ranks started by hand, exactly
#     as PyTorch workers use torchrun's agent store.
# Usage: scripts/run-main.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build

echo "== dtrun --nproc-per-node=4 examples/allreduce_check.py"
build/apps/dtrun --nproc-per-node=4 --python /usr/bin/python3 examples/allreduce_check.py

echo "== dtstore serving 4 hand-started ranks"
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
