#!/usr/bin/env bash
# The checks of a GPU machine, as one script: builds lib and train_cfg
# against whatever CUDA torch the machine has (pip's wheels: no gloo headers,
# their own fmt) and runs, within about 8 minutes, the launcher on the GPU,
# train_cfg's DDP and FSDP on NCCL in the three checkpoint modes with a
# SIGKILL each (same hash as an undisturbed run), and the checkpoint stall
# against one device-to-host copy of the same bytes; then prints one table.
#
# A GPU machine has no network: what the build needs comes from here.
#   scripts/gpu-check.sh --fetch     on this Debian machine (apt): downloads
#                                    the -dev packages the GPU machine lacks
#                                    into build-gpu-debs/ and builds the
#                                    static dtrun (build/apps/dtrun)
#   scripts/gpu-check.sh             on the GPU machine, with build-gpu-debs/
#                                    and build/apps/dtrun carried there
# PYTHON (default: python3 on PATH) is the interpreter with the CUDA torch.
# Exit 0 when every check passed, 1 when one failed (its row says which).
set -uo pipefail
cd "$(dirname "$0")/.."
debs=build-gpu-debs
deps=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev
  libasio-dev libhwloc-dev libhwloc15 libssl-dev libssl3 zlib1g-dev zlib1g pkgconf
  pkgconf-bin libpkgconf3 libtomlplusplus-dev libtomlplusplus3)

if [[ ${1:-} == --fetch ]]; then
  set -e
  mkdir -p "$debs"
  (cd "$debs" && apt-get download "${deps[@]}")
  scripts/build.sh build >/dev/null
  echo "gpu-check: carry $debs/ and build/apps/dtrun to the GPU machine"
  exit 0
fi

py=${PYTHON:-python3}
dtrun=$PWD/build/apps/dtrun
out=build-gpu/check
rm -rf "$out"
mkdir -p "$out"
rows=()
failed=0
row() { rows+=("| $1 | $2 | $3 |"); [[ $2 == ok ]] || failed=1; }

# --- build: the -dev packages unpacked into a prefix, torch from $py
build_lib() {
  local prefix=$PWD/build-gpu/deps torch_cmake
  mkdir -p "$prefix"
  for d in "$debs"/*.deb; do dpkg -x "$d" "$prefix"; done
  torch_cmake=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  export PKG_CONFIG=$prefix/usr/bin/pkgconf PKG_CONFIG_SYSROOT_DIR=$prefix
  export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake -S . -B build-gpu/lib -G Ninja -DDTRUN_STATIC_RUNTIME=OFF -DDTRUN_BUILD_TESTS=OFF \
    -DDTRUN_FUZZ=OFF -DDTRUN_WERROR=ON -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_cmake" \
    -DOPENSSL_ROOT_DIR="$prefix/usr" -DZLIB_INCLUDE_DIR="$prefix/usr/include" \
    -DZLIB_LIBRARY=/usr/lib/x86_64-linux-gnu/libz.so.1 -DASIO_INCLUDE_DIR="$prefix/usr/include" \
    -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" >"$out/configure.log" 2>&1 &&
    grep -q 'building the NCCL process group' "$out/configure.log" &&
    ninja -C build-gpu/lib train_cfg >"$out/build.log" 2>&1
}
start=$(date +%s)
if build_lib; then
  row "lib + train_cfg built against $("$py" -c 'import torch; print(torch.__version__)')" ok \
    "$(($(date +%s) - start)) s, NCCL on"
else
  row "lib + train_cfg built" FAILED "see $out/configure.log, $out/build.log"
  printf '%s\n' "${rows[@]}"
  exit 1
fi
train_cfg=$PWD/build-gpu/lib/examples/train_cfg

# --- the launcher on the GPU: a Python NCCL worker, torch's warnings absent
cat >"$out/nccl_worker.py" <<'EOF'
import os, torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
print(f"rank {dist.get_rank()} cuda {os.environ.get('CUDA_VISIBLE_DEVICES', '-')} sum {t[0].item():g}")
dist.destroy_process_group()
EOF
if timeout 120 "$dtrun" --nproc-per-node=gpu --python "$py" "$out/nccl_worker.py" \
  >"$out/launcher.out" 2>"$out/launcher.err"; then
  if grep -q "NCCL_ASYNC_ERROR_HANDLING is deprecated" "$out/launcher.err"; then
    row "dtrun --nproc-per-node=gpu, Python NCCL worker" FAILED "torch warned of NCCL_ASYNC_ERROR_HANDLING"
  else
    row "dtrun --nproc-per-node=gpu, Python NCCL worker" ok "$(head -1 "$out/launcher.out")"
  fi
else
  row "dtrun --nproc-per-node=gpu, Python NCCL worker" FAILED "see $out/launcher.err"
fi

# --- train_cfg on NCCL: each strategy and mode undisturbed, then killed
hash_of() { sed -n 's/.*params_sha256=\([0-9a-f]*\).*/\1/p' "$1" | tail -1; }
train() {  # train NAME STRATEGY MODE [--set ...]
  local name=$1 strategy=$2 mode=$3
  shift 3
  timeout 120 "$dtrun" --nproc-per-node=1 --max-restarts=1 "$train_cfg" \
    examples/configs/digits_ddp.toml --set 'data.source="synthetic"' \
    --set 'data.samples=4096' --set 'data.features=64' --set 'data.classes=10' \
    --set "strategy.type=\"$strategy\"" --set 'strategy.backend="nccl"' \
    --set "checkpoint.mode=\"$mode\"" --set "checkpoint.dir=\"$out/ckpt_$name\"" \
    --set 'train.steps=200' --set 'checkpoint.every=50' "$@" \
    >"$out/$name.out" 2>"$out/$name.err"
}
for strategy in ddp fsdp; do
  for mode in sync async memory; do
    what="train_cfg $strategy, $mode checkpoints, SIGKILL at step 120"
    if ! train "${strategy}_${mode}_clean" "$strategy" "$mode"; then
      row "$what" FAILED "undisturbed run failed: $out/${strategy}_${mode}_clean.err"
      continue
    fi
    if ! train "${strategy}_${mode}_kill" "$strategy" "$mode" \
      --set 'fault.kill_rank=0' --set 'fault.kill_at_step=120'; then
      row "$what" FAILED "killed run failed: $out/${strategy}_${mode}_kill.err"
      continue
    fi
    clean=$(hash_of "$out/${strategy}_${mode}_clean.out")
    killed=$(hash_of "$out/${strategy}_${mode}_kill.out")
    if [[ -z $clean || $clean != "$killed" ]]; then
      row "$what" FAILED "hash ${clean:0:12} vs ${killed:0:12}"
    elif grep -q "destroy_process_group() was not called" "$out/${strategy}_${mode}"_*.err; then
      row "$what" FAILED "torch warned: destroy_process_group() was not called"
    else
      row "$what" ok "same hash ${clean:0:12}, resumed"
    fi
  done
done

# --- the checkpoint stall against one device-to-host copy of the state
cat >"$out/d2h.py" <<'EOF'
import sys, time, torch
n = int(sys.argv[1])
src = torch.empty(n, dtype=torch.uint8, device="cuda")
dst = torch.empty(n, dtype=torch.uint8, pin_memory=True)
dst.copy_(src); torch.cuda.synchronize()
times = []
for _ in range(5):
    t = time.perf_counter(); dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
print(f"{sorted(times)[2] * 1000:.1f}")
EOF
for mode in sync async memory; do
  train "stall_$mode" ddp "$mode" --set 'model.hidden=[4096, 4096, 4096]' \
    --set 'data.features=2048' --set 'data.classes=1000' --set 'train.steps=60' \
    --set 'checkpoint.every=20' || { row "checkpoint stall, $mode" FAILED "see $out/stall_$mode.err"; continue; }
  waited=$(sed -n 's/.*training waited \([0-9.]*\) ms.*/\1/p' "$out/stall_$mode.out" | sort -n | tail -1)
  row "checkpoint stall, $mode (longest wait of the loop)" ok "${waited:-?} ms"
done
bytes=$("$py" -c 'print(2 * 4 * (2048*4096 + 4096 + 2*(4096*4096 + 4096) + 4096*1000 + 1000))')
copy=$("$py" "$out/d2h.py" "$bytes" 2>"$out/d2h.err") &&
  row "one D2H copy of the same state ($((bytes / 1000000)) MB, pinned)" ok "$copy ms" ||
  row "one D2H copy" FAILED "see $out/d2h.err"

echo "gpu-check: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F)"
echo "| check | result | detail |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$failed"
