#!/usr/bin/env bash
# lib and train_cfg built against a Torch laid out like pip's CUDA wheels,
# emulated from the forky root's torch 2.14 (scripts/torch214.sh): the
# three things that broke lib's build against pip's torch 2.11, each made
# true here, so the build fails again if any comes back.
#  1. No gloo headers, though torch has gloo and its ProcessGroupGloo.hpp
#     includes them: the root's /usr/include/gloo is hidden (an empty folder
#     bound over it, in a mount namespace of this test's own).
#  2. torch's own fmt first on torch's include path, which spdlog's headers
#     cannot use: a fmt folder at the front of the Torch target's include
#     directories whose headers refuse to be reached through spdlog (spdlog
#     defines SPDLOG_API before it includes fmt) and pass through otherwise.
#  3. c10d::Store::clone() pure virtual: torch >= 2.7, so 2.14 has it.
# Then the gloo-less train_cfg, asked for gloo under DTRUN (static: it runs
# in the root as it is), exits naming why. Last, gloo's headers given in a
# folder of their own (-DDTRUN_GLOO_INCLUDE_DIR, as scripts/gpu-check.sh
# gives forky's to pip's torch): lib has gloo again and trains with it.
# Usage (as root): tests/lib/pip_layout_test.sh BUILD_DIR DTRUN
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: pip_layout_test.sh BUILD_DIR DTRUN}
dtrun=$(readlink -f "${2:?usage: pip_layout_test.sh BUILD_DIR DTRUN}")
root=$(scripts/torch214.sh path)
[[ -f $root/.dtrun-packages ]] || {
  echo "pip_layout_test: no forky root at $root; make it first: scripts/torch214.sh" >&2
  exit 1
}
torch_cmake=/usr/lib/x86_64-linux-gnu/cmake/Torch  # inside the root
# In the checkout (the same path inside the root), at a fixed place, so
# that ccache finds the same include paths on every run.
# BUILD_DIR may be absolute (ctest gives the checkout's build-pip) or
# relative to the checkout.
case $build in
  /*) wheel=${build%/}.wheel ;;
  *) wheel=$PWD/${build%/}.wheel ;;
esac
rm -rf "$wheel"
mkdir -p "$build"
mkdir -p "$wheel/torch/include/fmt" "$wheel/torch/share/cmake/Torch" "$wheel/empty"
mkdir -p "$wheel/gloo-include" && cp -r "$root/usr/include/gloo" "$wheel/gloo-include/"

for header in "$root"/usr/include/fmt/*.h; do
  name=$(basename "$header")
  cat >"$wheel/torch/include/fmt/$name" <<HEADER
#pragma once
#ifdef SPDLOG_API
#error "spdlog reached torch's own fmt (pip's wheels put theirs first on torch's include path): a translation unit that includes torch includes spdlog"
#endif
#include_next <fmt/$name>
HEADER
done
cat >"$wheel/torch/share/cmake/Torch/TorchConfig.cmake" <<CONFIG
include($torch_cmake/TorchConfig.cmake)
list(PREPEND TORCH_INCLUDE_DIRS "$wheel/torch/include")
target_include_directories(torch BEFORE INTERFACE "$wheel/torch/include")
CONFIG
cat >"$wheel/torch/share/cmake/Torch/TorchConfigVersion.cmake" <<CONFIG
include($torch_cmake/TorchConfigVersion.cmake)
CONFIG

# A build in the root with gloo's headers hidden: build DIR MUST_SAY [ARGS].
build_hidden() {
  local dir=$1 says=$2
  shift 2
  mkdir -p "$dir"
  unshare --mount --propagation private bash -c '
    mount --bind "$1/empty" "$2/usr/include/gloo"
    shift 2
    exec scripts/torch214.sh run "$@"' sh "$wheel" "$root" \
    sh -c "export CCACHE_BASEDIR=\$PWD CCACHE_NOHASHDIR=1 &&
           cmake -S . -B '$dir' -G Ninja -DTorch_DIR='$wheel/torch/share/cmake/Torch' \
             -DDTRUN_WERROR=ON -DDTRUN_FUZZ=OFF -DDTRUN_BUILD_TESTS=OFF $* >'$dir/configure.log' &&
           grep -q '$says' '$dir/configure.log' &&
           ninja -C '$dir' train_cfg" || {
    cat "$dir/configure.log" >&2 2>/dev/null || true
    echo "pip_layout_test: lib did not build against the pip-like Torch (see above)" >&2
    exit 1
  }
}
build_hidden "$build" 'no gloo headers'

# Gloo asked for, in a build without it: exit non-zero, the reason named.
out=$(scripts/torch214.sh run "$dtrun" --nproc-per-node=1 \
  "$build/examples/train_cfg" examples/configs/digits_ddp.toml \
  --set 'strategy.backend="gloo"' --set "checkpoint.dir=\"$wheel/ckpt\"" 2>&1) && {
  echo "$out"
  echo "pip_layout_test: train_cfg without gloo ran a gloo job" >&2
  exit 1
}
grep -q 'this build of lib has no gloo' <<<"$out" || {
  echo "$out"
  echo "pip_layout_test: train_cfg without gloo failed without saying why" >&2
  exit 1
}
# gloo's headers in a folder of their own: found, and a gloo job trains.
build_hidden "$build-gloo" 'process groups use gloo' "-DDTRUN_GLOO_INCLUDE_DIR=$wheel/gloo-include"
out=$(scripts/torch214.sh run "$dtrun" --nproc-per-node=2 \
  "$build-gloo/examples/train_cfg" examples/configs/digits_ddp.toml \
  --set 'strategy.backend="gloo"' --set 'train.steps=20' \
  --set "checkpoint.dir=\"$wheel/ckpt-gloo\"" 2>&1) &&
  grep -q 'training on cpu (backend gloo, 2 ranks)' <<<"$out" || {
  echo "$out"
  echo "pip_layout_test: train_cfg with gloo's headers from their own folder did not train on gloo" >&2
  exit 1
}
echo "pip_layout_test: lib and train_cfg built against a pip-like torch 2.14; gloo refused by name; with gloo's headers given, trained on gloo"
