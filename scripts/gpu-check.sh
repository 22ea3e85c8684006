#!/usr/bin/env bash
# The checks of a GPU machine, as one script: builds lib and train_cfg
# against whatever CUDA torch the machine has (pip's wheels: no gloo headers,
# their own fmt) and runs, within about 8 minutes, the launcher on the GPU,
# train_cfg's DDP and FSDP on NCCL in the three checkpoint modes with a
# SIGKILL each (same hash as an undisturbed run), DDP and FSDP with gloo on
# CUDA tensors (two ranks on one GPU), the checkpoint stall against one
# device-to-host copy of the same bytes and against DCP's async_save, and
# train_cfg's step against PyTorch's DDP on the same model; then prints one
# table (README.md, "On a GPU", keeps the last).
#
# A GPU machine has no network: what the build needs comes from here.
#   scripts/gpu-check.sh --fetch     on this Debian machine (apt): downloads
#                                    the -dev packages the GPU machine lacks
#                                    into build-gpu-debs/ (gloo's headers
#                                    from Debian forky, through the forky
#                                    root of scripts/torch214.sh: pip's
#                                    torch ships none) and builds the
#                                    static dtrun, stripped
#                                    (build-gpu-bin/dtrun)
#   scripts/gpu-check.sh             on the GPU machine, with build-gpu-debs/
#                                    and build-gpu-bin/ carried there
# PYTHON (default: python3 on PATH) is the interpreter with the CUDA torch.
# Exit 0 when every check passed, 1 when one failed (its row says which).
set -uo pipefail
cd "$(dirname "$0")/.."
debs=build-gpu-debs
deps=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev
  libasio-dev libhwloc-dev libhwloc15 libssl-dev libssl3 zlib1g-dev zlib1g pkgconf libxxhash-dev
  pkgconf-bin libpkgconf3 libtomlplusplus-dev libtomlplusplus3)

if [[ ${1:-} == --fetch ]]; then
  set -e
  mkdir -p "$debs"
  (cd "$debs" && apt-get download "${deps[@]}")
  mkdir -p "$debs/gloo"
  scripts/torch214.sh >/dev/null
  scripts/torch214.sh run sh -c "cd $debs/gloo && apt-get download libgloo-dev"
  scripts/build.sh build >/dev/null
  mkdir -p build-gpu-bin
  strip -o build-gpu-bin/dtrun build/apps/dtrun  # 8 MB, not 70
  echo "gpu-check: carry $debs/ and build-gpu-bin/ to the GPU machine"
  exit 0
fi

py=${PYTHON:-python3}
dtrun=${DTRUN:-$PWD/build-gpu-bin/dtrun}
out=build-gpu/check
rm -rf "$out"
mkdir -p "$out"
rows=()
failed=0
# Each row is printed as it is made too, so a run cut short still says
# how far it got.
row() {
  rows+=("| $1 | $2 | $3 |")
  echo "gpu-check: | $1 | $2 | $3 |"
  [[ $2 == ok ]] || failed=1
}

# --- build: the -dev packages unpacked into a prefix, torch from $py
build_lib() {
  local prefix=$PWD/build-gpu/deps torch_cmake
  mkdir -p "$prefix"
  for d in "$debs"/*.deb; do dpkg -x "$d" "$prefix"; done
  # gloo's headers alone, in a folder of their own: the rest of that
  # prefix (fmt 9) must not come before torch's own headers
  rm -rf build-gpu/gloo && mkdir -p build-gpu/gloo
  for d in "$debs"/gloo/*.deb; do dpkg -x "$d" build-gpu/gloo; done
  torch_cmake=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  export PKG_CONFIG=$prefix/usr/bin/pkgconf PKG_CONFIG_SYSROOT_DIR=$prefix
  export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake -S . -B build-gpu/lib -G Ninja -DDTRUN_STATIC_RUNTIME=OFF -DDTRUN_BUILD_TESTS=OFF \
    -DDTRUN_FUZZ=OFF -DDTRUN_WERROR=ON -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_cmake" \
    -DOPENSSL_ROOT_DIR="$prefix/usr" -DZLIB_INCLUDE_DIR="$prefix/usr/include" \
    -DZLIB_LIBRARY=/usr/lib/x86_64-linux-gnu/libz.so.1 -DASIO_INCLUDE_DIR="$prefix/usr/include" \
    -DDTRUN_GLOO_INCLUDE_DIR="${gloo_dir:-$PWD/build-gpu/gloo/usr/include}" \
    -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" >"$out/configure.log" 2>&1 &&
    grep -q 'building the NCCL process group' "$out/configure.log" &&
    ninja -C build-gpu/lib train_cfg >"$out/build.log" 2>&1
}
start=$(date +%s)
built=build_lib
if ! build_lib; then
  # gloo's headers from Debian may not fit this torch's ProcessGroupGloo.hpp:
  # then the rest without gloo, and the gloo rows say so
  cp "$out/build.log" "$out/build-with-gloo.log" 2>/dev/null
  rm -rf build-gpu/lib
  gloo_dir=DTRUN_GLOO_INCLUDE_DIR-NOTFOUND built=
  build_lib && built=build_lib
fi
if [[ -n $built ]]; then
  gloo="gloo on"
  grep -q "no gloo headers" "$out/configure.log" && gloo="no gloo"
  [[ -f $out/build-with-gloo.log ]] && gloo="no gloo: with Debian's gloo headers it failed, see $out/build-with-gloo.log"
  row "lib + train_cfg built against $("$py" -c 'import torch; print(torch.__version__)')" ok \
    "$(($(date +%s) - start)) s, NCCL on, $gloo"
else
  row "lib + train_cfg built" FAILED "see $out/configure.log, $out/build.log"
  printf '%s\n' "${rows[@]}"
  exit 1
fi
train_cfg=$PWD/build-gpu/lib/examples/train_cfg

# --- train_cfg runs: NAME STRATEGY MODE [--set ...]; nproc and backend from the environment
hash_of() { sed -n 's/.*params_sha256=\([0-9a-f]*\).*/\1/p' "$1" | tail -1; }
train() {  # train NAME STRATEGY MODE [--set ...]
  local name=$1 strategy=$2 mode=$3
  shift 3
  timeout 120 "$dtrun" --nproc-per-node="${nproc:-1}" --max-restarts=1 "$train_cfg" \
    examples/configs/digits_ddp.toml --set 'data.source="synthetic"' \
    --set 'data.samples=4096' --set 'data.features=64' --set 'data.classes=10' \
    --set "strategy.type=\"$strategy\"" --set "strategy.backend=\"${backend:-nccl}\"" \
    --set "checkpoint.mode=\"$mode\"" --set "checkpoint.dir=\"$out/ckpt_$name\"" \
    --set 'train.steps=200' --set 'checkpoint.every=50' "$@" \
    >"$out/$name.out" 2>"$out/$name.err"
}

# GPU_CHECK_ONLY=stall: the stall, DCP and step rows alone (a rerun)
if [[ ${GPU_CHECK_ONLY:-} != stall ]]; then
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

cat >"$out/placement.py" <<'EOF'
import os, torch
print(f"LOCAL_RANK={os.environ['LOCAL_RANK']} "
      f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '-')} "
      f"gpus={torch.cuda.device_count()}")
EOF
if timeout 120 "$dtrun" --nproc-per-node=gpu --virtual-local-rank --python "$py" \
  "$out/placement.py" >"$out/placement.out" 2>"$out/placement.err" &&
  grep -q "LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=0 gpus=1" "$out/placement.out"; then
  row "dtrun --virtual-local-rank" ok "$(head -1 "$out/placement.out")"
else
  row "dtrun --virtual-local-rank" FAILED "see $out/placement.out"
fi

# --- the launcher beside torchrun on this machine: NUMA binding, gloo
# through dtrun's store, GPU DDP ending with torchrun's parameters, and 8
# workers of `true` (whole process, median of 5, taking turns)
torchrun=$(dirname "$py")/torchrun
if numa_out=$(timeout 60 "$dtrun" --nproc-per-node=gpu --numa-binding=node --no-python \
  sh -c 'grep Cpus_allowed_list /proc/self/status' 2>"$out/numa.err"); then
  row "dtrun --numa-binding=node" ok "$(tr -s ' \t' ' ' <<<"$numa_out" | head -1)"
else
  row "dtrun --numa-binding=node" FAILED "see $out/numa.err"
fi
cat >"$out/gloo_worker.py" <<'EOF'
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
print(f"gloo sum {t[0].item():g} over {dist.get_world_size()}")
dist.destroy_process_group()
EOF
if out2=$(timeout 120 "$dtrun" --nproc-per-node=4 --python "$py" "$out/gloo_worker.py" \
  2>"$out/gloo.err") && grep -q "gloo sum 4 over 4" <<<"$out2"; then
  row "dtrun, 4 gloo ranks through its store (torch's client)" ok "$(head -1 <<<"$out2")"
else
  row "dtrun, 4 gloo ranks through its store" FAILED "see $out/gloo.err"
fi
cat >"$out/ddp_hash.py" <<'EOF'
import hashlib, os, torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(m)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
for _ in range(50):
    x, y = torch.randn(32, 64, generator=g).cuda(), torch.randint(0, 10, (32,), generator=g).cuda()
    opt.zero_grad(); torch.nn.functional.cross_entropy(ddp(x), y).backward(); opt.step()
if dist.get_rank() == 0:
    h = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in m.parameters()))
    print("params_sha256", h.hexdigest())
dist.destroy_process_group()
EOF
export CUBLAS_WORKSPACE_CONFIG=:4096:8
a=$(timeout 120 "$dtrun" --nproc-per-node=1 --python "$py" "$out/ddp_hash.py" 2>"$out/ddp_dtrun.err" |
  sed -n 's/^params_sha256 //p')
b=$(timeout 120 "$torchrun" --nproc_per_node=1 "$out/ddp_hash.py" 2>"$out/ddp_torchrun.err" |
  sed -n 's/^params_sha256 //p')
if [[ -n $a && $a == "$b" ]]; then
  row "GPU DDP (Python) under dtrun and under torchrun" ok "same params_sha256 ${a:0:12}"
else
  row "GPU DDP (Python) under dtrun and under torchrun" FAILED "${a:0:12} vs ${b:0:12} (see $out/ddp_*.err)"
fi
launch_ms() {  # median ms of 5 whole-process runs of "$@"
  local i t0 times=()
  for i in 1 2 3 4 5; do
    t0=$(date +%s%N)
    "$@" >/dev/null 2>&1 || return 1
    times+=($((($(date +%s%N) - t0) / 1000000)))
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 3p
}
d=$(launch_ms "$dtrun" --nproc-per-node=8 --no-python true) &&
  t=$(launch_ms "$torchrun" --nproc_per_node=8 --no_python true) &&
  row "8 workers of true: dtrun vs torchrun $("$py" -c 'import torch; print(torch.__version__)')" \
    ok "$d ms vs $t ms" ||
  row "8 workers of true: dtrun vs torchrun" FAILED "a launch failed"

# --- train_cfg on NCCL: each strategy and mode undisturbed, then killed
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

# --- gloo on CUDA tensors: two ranks share the one GPU, DDP and FSDP
for strategy in ddp fsdp; do
  what="train_cfg $strategy, gloo on CUDA tensors, 2 ranks on GPU 0, SIGKILL at step 120"
  if [[ $gloo != "gloo on" ]]; then
    row "$what" FAILED "this build has no gloo"
    continue
  fi
  if ! nproc=2 backend=gloo train "gloo_${strategy}_clean" "$strategy" async \
    --set 'strategy.device="cuda"'; then
    row "$what" FAILED "undisturbed run failed: $out/gloo_${strategy}_clean.err"
    continue
  fi
  if ! nproc=2 backend=gloo train "gloo_${strategy}_kill" "$strategy" async \
    --set 'strategy.device="cuda"' --set 'fault.kill_rank=1' --set 'fault.kill_at_step=120'; then
    row "$what" FAILED "killed run failed: $out/gloo_${strategy}_kill.err"
    continue
  fi
  clean=$(hash_of "$out/gloo_${strategy}_clean.out")
  killed=$(hash_of "$out/gloo_${strategy}_kill.out")
  where=$(sed -n 's/^training on \([^ ]*\).*/\1/p' "$out/gloo_${strategy}_clean.out" | head -1)
  if [[ -z $clean || $clean != "$killed" ]]; then
    row "$what" FAILED "hash ${clean:0:12} vs ${killed:0:12}"
  elif [[ $where != cuda:0 ]]; then
    row "$what" FAILED "trained on '${where}', not cuda:0"
  else
    row "$what" ok "same hash ${clean:0:12}, on $where"
  fi
done
fi  # GPU_CHECK_ONLY

# --- the checkpoint stall: the steps around each checkpoint against the
# steps without one (log every step), against one D2H copy of the same
# state and against DCP's async_save of it. Checkpoints 1200 steps apart:
# a background write (~3 s for these 368 MB) ends before the next is due,
# as a run's checkpoint interval would have it (one due earlier waits for
# it, and says so).
big=(--set 'model.hidden=[4096, 4096, 4096]' --set 'data.features=2048'
  --set 'data.classes=1000' --set 'train.steps=2600' --set 'train.log_every=1'
  --set 'train.batch_size=32' --set 'train.eval_every=0')
cat >"$out/stall.py" <<'EOF'
import re, statistics, sys
every = int(sys.argv[2])
t = {}
for line in open(sys.argv[1]):
    m = re.match(r"step (\d+) loss \S+ lr \S+ samples/s (\S+)", line)
    if m:
        t[int(m.group(1))] = 32.0 / float(m.group(2)) * 1000
ckpt = [c for c in range(every, max(t), every)]
near = set(ckpt) | {c + 1 for c in ckpt}
base = statistics.median(v for s, v in t.items() if s > 5 and s not in near)
stall = statistics.median(t[c] + t[c + 1] - 2 * base for c in ckpt) if ckpt else 0.0
print(f"{stall:.2f} {base:.3f}")
EOF
declare -A stall
for mode in none sync async memory; do
  every=1200
  [[ $mode == none ]] && every=100000
  if ! train "stall_$mode" ddp "${mode/none/sync}" "${big[@]}" --set "checkpoint.every=$every"; then
    row "checkpoint stall, $mode" FAILED "see $out/stall_$mode.err"
    continue
  fi
  read -r stall[$mode] step_ms < <("$py" "$out/stall.py" "$out/stall_$mode.out" "$every")
  [[ $mode == none ]] && base_ms=$step_ms
done
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
print(f"{sorted(times)[2] * 1000:.2f}")
EOF
bytes=$("$py" -c 'print(2 * 4 * (2048*4096 + 4096 + 2*(4096*4096 + 4096) + 4096*1000 + 1000))')
copy=$("$py" "$out/d2h.py" "$bytes" 2>"$out/d2h.err") || copy=
if [[ -n $copy ]]; then
  row "one D2H copy of the state ($((bytes / 1000000)) MB, pinned)" ok "$copy ms"
else
  row "one D2H copy of the state" FAILED "see $out/d2h.err"
fi
buffers=$(sed -n 's/^checkpoint buffers: //p' "$out/stall_async.out" | head -1)
for mode in sync async memory; do
  [[ -n ${stall[$mode]:-} ]] || continue
  waited=$(sed -n 's/.*step \(1200\|2400\): training waited \([0-9.]*\) ms.*/\2/p' \
    "$out/stall_$mode.out" | sort -n | tail -1)
  detail="${stall[$mode]} ms per checkpoint (step ${base_ms:-?} ms; in the call ${waited:-?} ms)"
  if [[ $mode == sync || -z $copy ]]; then
    row "checkpoint stall, $mode" ok "$detail"
  elif "$py" -c "import sys; sys.exit(0 if ${stall[$mode]} <= 1.2 * $copy else 1)"; then
    row "checkpoint stall, $mode (target <= 1.2 x copy)" ok "$detail; $buffers"
  else
    row "checkpoint stall, $mode (target <= 1.2 x copy)" FAILED "$detail; $buffers"
  fi
done
cat >"$out/dcp.py" <<'EOF'
import statistics, sys, time, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
dist.init_process_group("cpu:gloo,cuda:nccl")
torch.cuda.set_device(0)
L = torch.nn.Linear
m = torch.nn.Sequential(L(2048, 4096), torch.nn.ReLU(), L(4096, 4096), torch.nn.ReLU(),
                        L(4096, 4096), torch.nn.ReLU(), L(4096, 1000)).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(32, 2048, device="cuda"); y = torch.randint(0, 1000, (32,), device="cuda")
def step():
    opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()
step(); torch.cuda.synchronize()
# A stager per save: torch 2.11's DefaultStager fails when reused
# (pytorch/pytorch#183413), so its pinned buffers are made at every save.
def stager():
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        return {"async_stager": DefaultStager(StagingOptions(
            use_pinned_memory=True, use_shared_memory=False,
            use_async_staging=True, use_non_blocking_copy=True))}
    except Exception:
        return {}
how = "async_save, pinned DefaultStager" if stager() else "async_save"
def state_of():  # tensors only: the stager refuses the optimizer's options
    s = {f"model.{k}": v for k, v in m.state_dict().items()}
    for i, p in enumerate(m.parameters()):
        s[f"optim.{i}.momentum_buffer"] = opt.state[p]["momentum_buffer"]
    return s
waits = []
for i in range(5):
    state = state_of()
    t = time.perf_counter()
    r = dcp.async_save(state, checkpoint_id=f"{sys.argv[1]}/step{i}", **stager())
    if hasattr(r, "staging_completion"):
        r.staging_completion.result()
    waits.append((time.perf_counter() - t) * 1000)
    step(); torch.cuda.synchronize()
    getattr(r, "upload_completion", r).result()
print(f"{statistics.median(waits[1:]):.1f} ms ({how}; first {waits[0]:.1f} ms)")
dist.destroy_process_group()
EOF
if dcp=$(timeout 180 "$dtrun" --nproc-per-node=1 --python "$py" "$out/dcp.py" "$out/dcp_ckpt" \
  2>"$out/dcp.err" | tail -1) && [[ $dcp == *ms* ]]; then
  row "DCP async_save of the same state, loop blocked (torch's own)" ok "$dcp"
else
  row "DCP async_save of the same state" FAILED "see $out/dcp.err"
fi

# --- train_cfg's step against PyTorch's DDP on the same model (NCCL, 1 GPU)
cat >"$out/torch_ddp.py" <<'EOF'
import os, statistics, time, torch, torch.distributed as dist
import torch.nn.functional as F
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(1)
L = torch.nn.Linear
m = torch.nn.Sequential(L(2048, 4096), torch.nn.ReLU(), L(4096, 4096), torch.nn.ReLU(),
                        L(4096, 4096), torch.nn.ReLU(), L(4096, 1000)).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(m, device_ids=[torch.cuda.current_device()])
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
X, Y = torch.randn(4096, 2048), torch.randint(0, 1000, (4096,))
times = []
for s in range(100):
    t = time.perf_counter()
    idx = torch.randint(0, 4096, (32,))
    x, y = X[idx].cuda(), Y[idx].cuda()
    opt.zero_grad()
    loss = F.cross_entropy(ddp(x), y)
    v = loss.item()
    loss.backward()
    opt.step()
    mean = torch.tensor([v], dtype=torch.float64, device="cuda")
    dist.all_reduce(mean)
    mean.item()
    times.append((time.perf_counter() - t) * 1000)
print(f"{statistics.median(times[5:]):.3f}")
dist.destroy_process_group()
EOF
if torch_ms=$(timeout 180 "$dtrun" --nproc-per-node=1 --python "$py" "$out/torch_ddp.py" \
  2>"$out/torch_ddp.err" | tail -1) && [[ -n ${base_ms:-} && -n $torch_ms ]]; then
  row "train_cfg DDP step vs PyTorch DDP (same MLP, batch 32, NCCL)" ok \
    "$base_ms ms vs $torch_ms ms: $("$py" -c "print(f'{$base_ms / $torch_ms:.2f}x')")"
else
  row "train_cfg DDP step vs PyTorch DDP" FAILED "see $out/torch_ddp.err"
fi

echo "gpu-check: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F)"
echo "| check | result | detail |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$failed"
