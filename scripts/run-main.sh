#!/usr/bin/env bash
# The main job: installs what is missing, builds, then dtrun launches
# train_cfg on sklearn's 8x8 digits with 2 workers on CPU gloo. Rank 1 is
# killed with SIGKILL after step 170 (fault injection in the config); dtrun
# restarts the group, which resumes from the step-150 checkpoint and
# finishes. Passes when held-out accuracy >= 95%.
# Usage: scripts/run-main.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the job needs: the tests' packages (SLURM, Prometheus, etcd,
# clang, Jupyter, the Debian roots) and targets are scripts/test.sh's.
scripts/install-deps.sh --main
# Optimized without debug info: generating it for the translation units
# that include torch took a third of a cold build (180 s -> 117 s).
DTRUN_BUILD_TARGETS="dtrun train_cfg" scripts/build.sh build-main \
  -DDTRUN_BUILD_TESTS=OFF -DDTRUN_FUZZ=OFF -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG"

ckpt=$(mktemp -d)
out=$(mktemp)
trap 'rm -rf "$ckpt" "$out"' EXIT
echo "== dtrun --nproc-per-node=2 --max-restarts=1 train_cfg examples/configs/digits_ddp.toml" \
     "(rank 1 killed after step 170)"
build-main/apps/dtrun --nproc-per-node=2 --max-restarts=1 \
  build-main/examples/train_cfg examples/configs/digits_ddp.toml \
  --set checkpoint.dir="\"$ckpt\"" --set fault.kill_rank=1 --set fault.kill_at_step=170 \
  | tee "$out"
acc=$(sed -n 's/.*done: .*eval_accuracy=\([0-9.]*\).*/\1/p' "$out")
if ! grep -q "resumed from" "$out"; then
  echo "main job: FAILED (the group did not resume from its checkpoint)" >&2
  exit 1
fi
if [[ -z $acc ]] || ! awk -v a="$acc" 'BEGIN { exit !(a >= 0.95) }'; then
  echo "main job: FAILED (held-out accuracy ${acc:-none} < 0.95)" >&2
  exit 1
fi
echo "main job: OK (recovered from a killed worker; held-out accuracy $acc)"
