#!/usr/bin/env bash
# A checkpoint saved by one libtorch resumes under another: train_cfg (DDP
# and FSDP sharded, 2 ranks, CPU gloo) saves at step 10 with the host's
# torch 1.13, resumes to 20 with trixie's 2.6, to 30 with forky's 2.14,
# and back to 40 with 1.13. Each leg must say it resumed from the step
# before and finish. (lib's DDP checkpoint names every tensor; torch's own
# optimizer archive, its format before, did not load across 1.13 -> 2.x.)
# Usage (as root, after scripts/test.sh built build, build-torch2 and
# build-torch214): tests/lib/cross_version_resume_test.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
dtrun=$PWD/build/apps/dtrun
tmp=$(mktemp -d "$PWD/build/cross-version.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
leg() {  # leg RUNNER BUILD CONFIG DIR STEPS RESUMES_AT
  local out
  out=$($1 "$dtrun" --nproc-per-node=2 "$2/examples/train_cfg" "$3" \
    --set "checkpoint.dir=\"$4\"" --set "train.steps=$5" --set 'checkpoint.every=10' \
    --set 'train.eval_every=0' 2>&1) || {
    echo "$out"
    echo "cross_version_resume_test: $2 failed on $(basename "$3") at $5 steps" >&2
    exit 1
  }
  if [[ $6 -gt 0 ]] && ! grep -q "resumed from .* at step $6 " <<<"$out"; then
    echo "$out"
    echo "cross_version_resume_test: $2 did not resume from step $6 ($(basename "$3"))" >&2
    exit 1
  fi
  grep -q "^done: steps=$5 " <<<"$out" || {
    echo "$out"
    echo "cross_version_resume_test: $2 did not finish $5 steps" >&2
    exit 1
  }
}
host() { "$@"; }
trixie() { scripts/torch2.sh run "$@"; }
forky() { scripts/torch214.sh run "$@"; }
for config in examples/configs/digits_ddp.toml examples/configs/digits_fsdp.toml; do
  dir=$tmp/$(basename "$config" .toml)
  leg host build "$config" "$dir" 10 0
  leg trixie build-torch2 "$config" "$dir" 20 10
  leg forky build-torch214 "$config" "$dir" 30 20
  leg host build "$config" "$dir" 40 30
done
echo "cross_version_resume_test: DDP and FSDP checkpoints resumed 1.13 -> 2.6 -> 2.14 -> 1.13"
