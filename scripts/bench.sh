#!/usr/bin/env bash
# Builds the benchmarks and runs them against the real peers, printing the
# Markdown tables README carries. Usage: scripts/bench.sh [SECONDS_PER_CELL]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build-bench -DDTRUN_BUILD_BENCHMARKS=ON -DDTRUN_BUILD_TESTS=ON -DDTRUN_FUZZ=OFF \
  -DCMAKE_BUILD_TYPE=Release
echo "== store: dtstore vs libtorch 1.13 TCPStore server ($(nproc) cores, $(date -u +%F))"
build-bench/tests/bench/store_bench --dtstore build-bench/apps/dtstore \
  --torch-host build-bench/tests/bench/torch_store_host --seconds "${1:-1}"

echo
echo "== launcher: dtrun vs torchrun 1.13 ($(nproc) cores; workers OMP_NUM_THREADS=1)"
ninja -C build-bench fake_worker dtrun >/dev/null
/usr/bin/python3 tests/bench/launch_bench.py --dtrun build-bench/apps/dtrun \
  --fake-worker build-bench/tests/apps/fake_worker

echo
echo "== multi-node: dtrun vs torchrun 1.13, c10d backend, agents on one machine"
/usr/bin/python3 tests/bench/multinode_bench.py --dtrun build-bench/apps/dtrun \
  --fake-worker build-bench/tests/apps/fake_worker

echo
echo "== DDP: our C++ DDP vs PyTorch's Python DDP, MLP 784-1024x3-10, batch 64/rank, 2 ranks"
echo "   (both launched by dtrun; gloo; 1 thread per rank; each BLAS installed, chosen per run"
echo "   with LD_LIBRARY_PATH for ours and PyTorch's alike)"
ninja -C build-bench ddp_bench >/dev/null
blas_dirs=(/usr/lib/x86_64-linux-gnu/blas)
if [[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ]]; then
  blas_dirs+=(/usr/lib/x86_64-linux-gnu/openblas-pthread)
else
  echo "   (install libopenblas0-pthread to compare under OpenBLAS too)"
fi
for dir in "${blas_dirs[@]}"; do
  echo "-- BLAS: $dir"
  for i in 1 2 3; do
    LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 build-bench/apps/dtrun --nproc-per-node=2 \
      --log-level=error build-bench/tests/bench/ddp_bench
    LD_LIBRARY_PATH=$dir OPENBLAS_NUM_THREADS=1 build-bench/apps/dtrun --nproc-per-node=2 \
      --log-level=error --python /usr/bin/python3 tests/bench/ddp_bench.py
  done
done

echo
echo "== FSDP vs our DDP: MLP 784-1024x3-10 (2.9M parameters), batch 32/rank, SGD momentum"
echo "   (dtrun; gloo; 1 thread per rank; same BLAS as above)"
ninja -C build-bench fsdp_bench >/dev/null
for n in 2 4; do
  for mode in ddp fsdp fsdp-noprefetch; do
    build-bench/apps/dtrun --nproc-per-node=$n --log-level=error build-bench/tests/bench/fsdp_bench $mode
  done
done

echo
echo "== interactive: empty cell round trip, console side (send, all results, format)"
/usr/bin/python3 tests/bench/interactive_bench.py --dtrun build-bench/apps/dtrun
