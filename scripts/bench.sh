#!/usr/bin/env bash
# Builds the benchmarks and runs them against the real peers, printing the
# Markdown tables tests/bench/README.md carries. Usage: scripts/bench.sh [SECONDS_PER_CELL]
#
# The peers are Debian's torch 1.13 on the host and torch 2.6 in the trixie
# root made by scripts/torch2.sh (made here if missing; needs root). Debian's
# 2.6 lacks libuv while its TCPStore defaults to use_libuv=True, so every 2.6
# process runs with dtrun's own torch shim (apps/dtrun/python/dtrun_torch_shim)
# on PYTHONPATH, which retries a store without libuv only where torch refused it. DTRUN_BENCH_TORCH2=0 leaves the 2.6 columns out.
# Build folders: $DTRUN_BENCH_BUILD (default build-bench) on the host and
# $DTRUN_BENCH_BUILD_TORCH2 (default build-bench-torch2) in the root; only the
# programs run here are built.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
b=${DTRUN_BENCH_BUILD:-build-bench}
b2=${DTRUN_BENCH_BUILD_TORCH2:-build-bench-torch2}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
configure=(-G Ninja -DDTRUN_BUILD_BENCHMARKS=ON -DDTRUN_BUILD_TESTS=ON -DDTRUN_FUZZ=OFF
  -DCMAKE_BUILD_TYPE=Release)
cmake -S . -B "$b" "${configure[@]}" >/dev/null
ninja -C "$b" dtrun dtstore fake_worker store_bench store_load_bench fanin_bench rdzv_sim_bench \
  torch_store_host ddp_bench fsdp_bench hang_bench status_cost_bench train_cfg \
  payload_bench >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# DTRUN_BENCH_ONLY=store,launcher,... runs only those parts: store, store-load,
# launcher, multinode, rdzv-sim, rdzv-scale, etcd, ddp, fsdp, precision, gpt, interactive,
# hang, status, straggler, checkpoint, auto, torch-versions, wheel, fuzz,
# partition, soak, detect, in-place, py-restart.
want() { [[ -z ${DTRUN_BENCH_ONLY:-} || ",$DTRUN_BENCH_ONLY," == *",$1,"* ]]; }

torch2=${DTRUN_BENCH_TORCH2:-1}
if [[ $torch2 == 1 ]]; then
  scripts/torch2.sh >/dev/null
  # Programs that link libtorch 2.6 are built in the root, in a folder of their own.
  scripts/torch2.sh run sh -c "cmake -S . -B $b2 ${configure[*]} >/dev/null &&
    ninja -C $b2 dtstore store_bench store_load_bench torch_store_host ddp_bench >/dev/null"
  py2=scripts/torch2-python
  shim2=PYTHONPATH=$PWD/apps/dtrun/python/dtrun_torch_shim
  launch2=(--torch2 scripts/torch2.sh --torch2-python "$py2")
  fanin2=(--torch2-host "$py2 tests/bench/torch_store_host.py")
else
  launch2=()
  fanin2=()
fi

if want store; then
  echo "== store: dtstore vs libtorch's TCPStore server ($(nproc) cores, $(date -u +%F))"
  $b/tests/bench/store_bench --dtstore $b/apps/dtstore \
    --torch-host $b/tests/bench/torch_store_host --seconds "${1:-1}" | tee "$tmp/store113.md"
  if [[ $torch2 == 1 ]]; then
    # libtorch 1.13's client cannot talk to a 2.6 server (the opcodes moved),
    # so 2.6's own C++ client, built in the root, drives dtstore and 2.6's server.
    scripts/torch2.sh run $b2/tests/bench/store_bench \
      --dtstore $b2/apps/dtstore \
      --torch-host $b2/tests/bench/torch_store_host --seconds "${1:-1}" \
      | tee "$tmp/store26.md"
    echo "-- joined:"
    /usr/bin/python3 tests/bench/join_store_tables.py "$tmp/store113.md" "$tmp/store26.md"
  fi
fi

if want store-load; then
  echo
  echo "== store, server-bound: raw-protocol load generator (one epoll thread, 8 connections x"
  echo "   depth 32), dtstore vs libtorch 1.13's server, 3 paired rounds"
  $b/tests/bench/store_load_bench --dtstore $b/apps/dtstore \
    --torch-host $b/tests/bench/torch_store_host --seconds "${1:-1}" --rounds 3
  if [[ $torch2 == 1 ]]; then
    echo "-- the same generator in the 2.x dialect: dtstore vs libtorch 2.6's server (in the root)"
    scripts/torch2.sh run $b2/tests/bench/store_load_bench --dtstore $b2/apps/dtstore \
      --torch-host $b2/tests/bench/torch_store_host --seconds "${1:-1}" --rounds 3 --dialect 2
  fi
  # Unpinned, the scheduler puts each server beside the generator or across
  # from it run by run, and the two cost very differently: each placement
  # pinned, the same for both servers (client CPU, server CPU).
  if (( $(nproc) >= 2 )); then
    for pin in 0,0 0,1; do
      echo "-- pinned: generator on CPU ${pin%,*}, servers on CPU ${pin#*,}"
      $b/tests/bench/store_load_bench --dtstore $b/apps/dtstore \
        --torch-host $b/tests/bench/torch_store_host --seconds "${1:-1}" --rounds 3 --pin $pin
      if [[ $torch2 == 1 ]]; then
        scripts/torch2.sh run $b2/tests/bench/store_load_bench --dtstore $b2/apps/dtstore \
          --torch-host $b2/tests/bench/torch_store_host --seconds "${1:-1}" --rounds 3 \
          --dialect 2 --pin $pin
      fi
    done
  fi
fi

if want launcher; then
  echo
  echo "== launcher: dtrun vs torchrun 1.13 and 2.6 ($(nproc) cores; workers OMP_NUM_THREADS=1)"
  /usr/bin/python3 tests/bench/launch_bench.py --dtrun $b/apps/dtrun \
    --fake-worker $b/tests/apps/fake_worker "${launch2[@]}"
fi

if want fanin; then
  echo
  echo "== the workers' store at scale: N workers' init_process_group traffic at once"
  $b/tests/bench/fanin_bench --dtstore $b/apps/dtstore \
    --torch-host $b/tests/bench/torch_store_host \
    "${fanin2[@]}" \
    --workers 1024,4096,8192,16384,65536,100000 --rounds 2 --limit 60
fi

if want multinode; then
  echo
  echo "== multi-node: dtrun vs torchrun 1.13 and 2.6, c10d backend, agents on one machine"
  /usr/bin/python3 tests/bench/multinode_bench.py --dtrun $b/apps/dtrun \
    --fake-worker $b/tests/apps/fake_worker "${launch2[@]:0:2}"
fi

if want rdzv-sim; then
  echo
  echo "== rendezvous at scale: N simulated agents (fibers on an event loop running the real"
  echo "   rendezvous, one connection each, and a watch connection for pushed checks) at a real"
  echo "   dtstore; requests and bytes per agent by operation on stderr. Keep-alive 1 s, then the"
  echo "   default 5 s with checks pushed, then 64-16,384 agents with checks reading the round"
  echo "   (--watch 0: one socket an agent), twice"
  $b/tests/bench/rdzv_sim_bench --dtstore $b/apps/dtstore
  $b/tests/bench/rdzv_sim_bench --dtstore $b/apps/dtstore --keep-alive-ms 5000 --steady-s 30
  for run in 1 2; do
    $b/tests/bench/rdzv_sim_bench --dtstore $b/apps/dtstore --nodes 64,512,4096,16384 \
      --keep-alive-ms 5000 --steady-s 2 --watch 0
  done
fi

if want etcd; then
  echo
  echo "== rendezvous on etcd (3 members on 127.0.0.2-4, etcd's default timings): dtrun on"
  echo "   etcd vs dtrun on its c10d store vs torchrun 1.13's etcd-v2 backend (shim), alternating;"
  echo "   then the simulator's agents on etcd, checks pushed through etcd watches"
  /usr/bin/python3 tests/bench/etcd_bench.py --dtrun $b/apps/dtrun \
    --fake-worker $b/tests/apps/fake_worker
  /usr/bin/python3 tests/bench/etcd_sim_bench.py --sim $b/tests/bench/rdzv_sim_bench \
    --nodes 64,512 --keep-alive-ms 5000 --steady-s 30
  # Each agent's lease has a client of its own: 4,096 in one process would
  # pass this machine's 20,000-descriptor limit, so they beat instead, and
  # their checks read the round rather than hold a watch stream each.
  /usr/bin/python3 tests/bench/etcd_sim_bench.py --sim $b/tests/bench/rdzv_sim_bench \
    --nodes 4096 --keep-alive-ms 5000 --steady-s 5 --leases 0 --watch 0
fi

if want rdzv-scale; then
  echo
  echo "== rendezvous at scale: N real dtrun agents (1 x /bin/true each) at a standalone dtstore"
  /usr/bin/python3 tests/bench/rdzv_scale_bench.py --dtrun $b/apps/dtrun
fi

if want ddp; then
  echo
  echo "== DDP: our C++ DDP vs PyTorch's Python DDP, on 1.13 and (reference BLAS only) 2.6,"
  echo "   MLP 784-1024x3-10, batch 64/rank, 2 ranks"
  echo "   (all launched by dtrun; gloo; 1 thread per rank; each BLAS installed, chosen per run"
  echo "   with LD_LIBRARY_PATH for ours and PyTorch's alike; the root has only the reference BLAS)"
  blas_dirs=(/usr/lib/x86_64-linux-gnu/blas)
  if [[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ]]; then
    blas_dirs+=(/usr/lib/x86_64-linux-gnu/openblas-pthread)
  else
    echo "   (install libopenblas0-pthread to compare under OpenBLAS too)"
  fi
  for dir in "${blas_dirs[@]}"; do
    echo "-- BLAS: $dir"
    for i in 1 2 3; do
      LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 $b/apps/dtrun --nproc-per-node=2 \
        --log-level=error $b/tests/bench/ddp_bench
      LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 $b/apps/dtrun --nproc-per-node=2 \
        --log-level=error --python /usr/bin/python3 tests/bench/ddp_bench.py
      if [[ $torch2 == 1 && $dir == */blas ]]; then
        # Ours built against libtorch 2.6 runs in the root too (one process each).
        LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 $b/apps/dtrun --nproc-per-node=2 \
          --log-level=error --no-python scripts/torch2.sh run $b2/tests/bench/ddp_bench
        env "$shim2" LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 $b/apps/dtrun \
          --nproc-per-node=2 --log-level=error --python "$py2" tests/bench/ddp_bench.py
      fi
    done
  done
fi

if want fsdp; then
  echo
  echo "== FSDP vs our DDP: MLP 784-1024x3-10 (2.9M parameters), batch 32/rank, SGD momentum"
  echo "   (dtrun; 1 thread per rank; each BLAS installed, as above; FSDP's collectives through"
  echo "   shared memory (fsdp) or gloo (fsdp-gloo); PyTorch 2.6's FSDP2 fully_shard on CPU where"
  echo "   it can run)"
  fsdp_blas=(/usr/lib/x86_64-linux-gnu/blas)
  [[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ]] &&
    fsdp_blas+=(/usr/lib/x86_64-linux-gnu/openblas-pthread)
  for dir in "${fsdp_blas[@]}"; do
    echo "-- BLAS: $dir (three rounds, the runs alternating; 40 timed steps each)"
    for n in 2 4; do
      for round in 1 2 3; do
      for mode in ddp fsdp fsdp-gloo fsdp-noprefetch; do
        LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 $b/apps/dtrun --nproc-per-node=$n \
          --log-level=error $b/tests/bench/fsdp_bench $mode 1024 32 40
        if [[ $torch2 == 1 && $dir == */blas && ($mode == fsdp || $mode == fsdp-noprefetch) ]]; then
          # Prints its error as JSON when 2.6 cannot run it; the rest goes on.
          env "$shim2" $b/apps/dtrun --nproc-per-node=$n --log-level=error --python "$py2" \
            tests/bench/fsdp2_bench.py $mode 2>/dev/null || true
        fi
      done
      done
    done
  done
fi

if want precision; then
  echo
  echo "== bf16 vs float32 on the CPU: train_cfg's DDP and FSDP (train.precision) and PyTorch's"
  echo "   DDP under torch.autocast; MLP 784-1024x3-10, batch 64/rank, 2 ranks, gloo, 1 thread"
  echo "   each, reference BLAS for float32 (bfloat16 matmuls do not go through it)"
  /usr/bin/python3 tests/bench/precision_bench.py --build "$b" --rounds 3
fi

if want gpt; then
  echo
  echo "== nanoGPT's train.py (torchrun 1.13, shim) vs train_cfg's GPT (dtrun), DDP and FSDP:"
  echo "   shakespeare_char's CPU line, 2 ranks, gloo, OpenBLAS with one thread, 3 seeds"
  if [[ -f ${DTRUN_BENCH_SHAKESPEARE:-} && -f ${DTRUN_BENCH_NANOGPT:-}/train.py ]]; then
    /usr/bin/python3 tests/bench/gpt_bench.py --build "$b" --text "$DTRUN_BENCH_SHAKESPEARE" \
      --nanogpt "$DTRUN_BENCH_NANOGPT"
  else
    echo "   skipped: set DTRUN_BENCH_SHAKESPEARE (char-rnn's data/tinyshakespeare/input.txt)"
    echo "   and DTRUN_BENCH_NANOGPT (a checkout of karpathy/nanoGPT)"
  fi
fi

if want interactive; then
  echo
  echo "== interactive: empty cell round trip (console, notebook), pull of a 100 MB tensor"
  /usr/bin/python3 tests/bench/interactive_bench.py --dtrun $b/apps/dtrun
  if [[ $torch2 == 1 ]]; then
    echo "-- the same console round trip with torch 2.6 workers (PET_PYTHON=$py2)"
    env "$shim2" PET_PYTHON="$py2" /usr/bin/python3 tests/bench/interactive_bench.py \
      --dtrun $b/apps/dtrun --only console
    echo "-- the notebook's overhead with torch 2.6 workers (%dist_init --python $py2)"
    /usr/bin/python3 tests/bench/interactive_bench.py --dtrun $b/apps/dtrun --only notebook \
      --sizes 2,8 --python "$py2"
  fi
fi

if want checkpoint; then
  echo
  echo "== checkpoints: the loop's wait, sync vs async vs memory, train_cfg vs PyTorch 2.6's DCP (96.4 M parameters)"
  args=()
  [[ $torch2 == 1 ]] && args=(--torch2-python "$py2" --torch2-shim "${shim2#PYTHONPATH=}")
  /usr/bin/python3 tests/bench/checkpoint_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg "${args[@]}"
  echo
  echo "== a checkpoint's save and load vs a memcpy of its bytes and vs DCP (0.77 GB)"
  args=()
  [[ $torch2 == 1 ]] && args=(--torch2-python "$py2")
  /usr/bin/python3 tests/bench/payload_bench.py --bench $b/tests/bench/payload_bench \
    "${args[@]}"
  echo
  echo "== restart to the first step after a SIGKILL: resume from disk (warm, cold) vs memory"
  /usr/bin/python3 tests/bench/restart_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg --payloads raw,torch
fi

if want detect; then
  echo
  echo "== a lost node declared dead: SIGKILL vs SIGSTOP, on c10d and on etcd (its lease)"
  ninja -C "$b" fake_worker >/dev/null
  for backend in c10d etcd; do
    /usr/bin/python3 tests/bench/detect_bench.py --dtrun $b/apps/dtrun \
      --fake-worker $b/tests/apps/fake_worker --backend $backend
  done
  echo
  echo "== a whole node SIGKILLed or SIGSTOPped mid-training: the survivor's next step"
  /usr/bin/python3 tests/bench/node_loss_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg
  echo
  echo "== the same, the survivor kept in place (--restart=in-place) beside the whole group"
  /usr/bin/python3 tests/bench/node_loss_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg --repeat 3 --faults kill,stop \
    --sides dtrun-in-place,dtrun --dtrun-flags=--standby
  echo
  echo "== the same, and one worker of two SIGKILLed: cold vs --standby (the program's own),"
  echo "   under each BLAS installed (one thread), taking turns"
  restart_blas=(/usr/lib/x86_64-linux-gnu/blas)
  [[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ]] &&
    restart_blas+=(/usr/lib/x86_64-linux-gnu/openblas-pthread)
  for round in 1 2 3; do
    for dir in "${restart_blas[@]}"; do
      for flags in "" --standby; do
        echo "-- round $round, BLAS $dir, flags '${flags}'"
        LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 /usr/bin/python3 \
          tests/bench/node_loss_bench.py --dtrun $b/apps/dtrun --train-cfg $b/examples/train_cfg \
          --repeat 1 --faults kill --dtrun-flags="$flags"
        LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 DTRUN_BENCH_TMP=/var/tmp /usr/bin/python3 \
          tests/bench/restart_bench.py --dtrun $b/apps/dtrun --train-cfg $b/examples/train_cfg \
          --strategies ddp --sides memory --payloads raw --repeat 1 --dtrun-flags="$flags"
      done
    done
  done
  # PyTorch's own: torchrun from the roots, PyTorch's DDP, dcp (reference BLAS
  # everywhere, as the roots have it).
  torchruns=()
  torch_in() { [[ -d $(scripts/$1 path)/usr/lib/python3/dist-packages/torch ]]; }
  torch_in torch2.sh && torchruns+=(torchrun-2.6)
  torch_in torch214.sh && torchruns+=(torchrun-2.14)
  if ((${#torchruns[@]})); then
    echo
    echo "== the same failures under torchrun (${torchruns[*]}) beside dtrun --standby, taking turns"
    sides=$(IFS=,; echo "dtrun,${torchruns[*]}")
    /usr/bin/python3 tests/bench/node_loss_bench.py --dtrun $b/apps/dtrun \
      --train-cfg $b/examples/train_cfg --repeat 2 --faults kill,stop --sides "$sides" \
      --torchrun-cap 60 --dtrun-flags=--standby
    sides=$(IFS=';'; echo "memory;${torchruns[*]}")
    /usr/bin/python3 tests/bench/restart_bench.py --dtrun $b/apps/dtrun \
      --train-cfg $b/examples/train_cfg --strategies ddp --sides "$sides" --payloads raw \
      --repeat 3 --dtrun-flags=--standby
  fi
fi

if want in-place; then
  echo
  echo "== --restart=in-place vs the whole-group restart from memory: a SIGKILLed worker, taking turns"
  /usr/bin/python3 tests/bench/restart_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg --strategies ddp,fsdp --sides "in-place;memory" \
    --payloads raw --repeat 3 --dtrun-flags=--standby
  echo
  echo "== chaos under --restart=in-place: random workers SIGKILLed from outside, bitwise at the end"
  /usr/bin/python3 tests/bench/in_place_chaos_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg --runs 50 --kills 2
  /usr/bin/python3 tests/bench/in_place_chaos_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg --strategy fsdp --mode memory --steps 600 --runs 30 \
    --kills 2 --seed 1
fi

if want py-restart; then
  echo
  echo "== a Python torch worker SIGKILLed: to its next step, cold vs --standby-import vs torchrun"
  /usr/bin/python3 tests/bench/py_restart_bench.py --dtrun $b/apps/dtrun
fi

if want hang; then
  echo
  echo "== hangs: detection latency, heartbeat cost, torch's FileTimerServer vs dtrun"
  echo "| measure | value |"
  echo "|---|---|"
  /usr/bin/python3 tests/bench/hang_bench.py --dtrun $b/apps/dtrun --cpp-bench $b/tests/bench/hang_bench
fi

if want straggler; then
  echo
  echo "== stragglers: false alarms and detections, 2 ranks, another suite beside"
  /usr/bin/python3 tests/bench/straggler_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg --runs 50 \
    --load "ctest --test-dir $PWD/$b -L unit -j2 >/dev/null 2>&1"
fi

if want status; then
  echo
  echo "== live status: dtrun --status against 64 and 512 ranks' records"
  /usr/bin/python3 tests/bench/status_bench.py --dtrun $b/apps/dtrun --dtstore $b/apps/dtstore
  echo
  echo "== the job-wide view on group rank 0 (progress line, dtrun_job_* metrics)"
  $b/tests/bench/status_cost_bench
  echo
  echo "== metrics scrapes, and train_cfg watched vs torchrun 1.13 (via torchrun_shim.py)"
  /usr/bin/python3 tests/bench/observe_bench.py --dtrun $b/apps/dtrun \
    --fake-worker $b/tests/apps/fake_worker --train-cfg $b/examples/train_cfg
fi

if want auto; then
  echo
  echo "== --nproc-per-node=auto under a 1-CPU quota: dtrun vs torchrun 1.13 (via torchrun_shim.py)"
  /usr/bin/python3 tests/bench/auto_cgroup_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg --cpus 1 --reps 5
fi
if want torch-versions; then
  echo
  echo "== train_cfg on torch 1.13, 2.6 and 2.14 (scripts/test.sh's builds)"
  /usr/bin/python3 tests/bench/lib_torch_versions_bench.py
fi
if want wheel; then
  echo
  echo "== dtrun from the build tree, from the wheel, and as python -m dtrun"
  /usr/bin/python3 tests/bench/wheel_launch_bench.py --build $b
fi
if want fuzz; then
  echo
  echo "== the parsers of outside bytes fuzzed, 10^6 inputs (ASan + UBSan)"
  cmake -S . -B build-fuzz -G Ninja -DDTRUN_FUZZ=ON -DDTRUN_WITH_TORCH=OFF \
    -DDTRUN_BUILD_TESTS=ON >/dev/null
  ninja -C build-fuzz parsers_fuzz_build etcd_fuzz_build >/dev/null
  for target in parsers:parser_seeds etcd:etcd_seeds; do
    name=${target%%:*}
    rm -rf "$tmp/${name}_corpus" && cp -r "tests/fuzz/${target#*:}" "$tmp/${name}_corpus"
    echo "-- $name"
    start=$(date +%s.%N)
    "build-fuzz/tests/fuzz/${name}_fuzzer" -runs=1000000 -max_len=4096 \
      -artifact_prefix="$tmp/" "$tmp/${name}_corpus" 2>&1 | grep -E "^Done|ERROR|SUMMARY"
    awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f s\n", e - s }'
  done
fi
if want partition; then
  echo
  echo "== partitions: a node's switch port down, fenced and rejoined (3 rounds, c10d and etcd)"
  for round in 1 2 3; do
    /usr/bin/python3 tests/netns/partition_test.py --dtrun $b/apps/dtrun \
      --train-cfg $b/examples/train_cfg 2>&1 | grep -E "fenced in|FAIL|Error"
  done
fi
if want soak; then
  echo
  echo "== the soak: 10 minutes of mixed faults on three nodes over etcd"
  /usr/bin/python3 tests/bench/soak_bench.py --dtrun $b/apps/dtrun \
    --train-cfg $b/examples/train_cfg --minutes "${DTRUN_SOAK_MINUTES:-10}"
fi
