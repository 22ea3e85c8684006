#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lib/torch_compat.h"

namespace torch::nn {
class Module;
}

namespace dtrun::train {

class ShmAllreduce;

// Collective: a shared-memory all-reduce of `floats` floats for every rank
// of `pg` (rank 0 creates the segment, the others open it by the name it
// broadcasts, rank 0 unlinks the name), or nullptr on every rank when any
// rank could not (another host, a small /dev/shm); *why then says why, on
// the rank that failed.
std::unique_ptr<ShmAllreduce> OpenSharedMemoryAllreduce(ProcessGroup& pg,
                                                        size_t floats,
                                                        std::string* why);

struct DdpOptions {
  double bucket_cap_mb = 25;  // gradient bucket cap, MiB; default 25
                              // (the first bucket: at most 1 MiB)
  // a parameter with no gradient in a step contributes zeros (else
  // SyncGradients throws)
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;  // buffers too come from rank 0 at start
  // false: nothing is broadcast at construction; the caller calls
  // BroadcastState() when the replicas' state is not already the same (a
  // resume restores every rank's from one checkpoint: 0.4 s less of a
  // restart of 96 M parameters on 2 CPU ranks).
  bool broadcast_at_start = true;
  // When every rank runs on this host (they can all open one POSIX
  // shared-memory segment) and the gradients are float32 on the CPU, sum
  // them through /dev/shm (see ShmAllreduce) instead of the process group;
  // otherwise, or when /dev/shm is too small, the process group.
  bool shared_memory = true;
  std::chrono::milliseconds timeout{30 * 60 *
                                    1000};  // of a shared-memory all-reduce
};

// Data parallelism for any torch::nn::Module. At construction, parameters
// (and buffers) are broadcast from rank 0 and gradients are packed into
// buckets of at most bucket_cap_mb, in reverse registration order (the order
// backward produces them), one dtype and device per bucket (bfloat16 and
// float16 buckets on the CPU are summed in float32). Each parameter's .grad is
// its slice of its bucket, so autograd accumulates into the buckets and nothing
// is copied. During backward, each bucket's all-reduce starts asynchronously
// the moment its last gradient is accumulated (hooks on the gradient
// accumulators), in bucket order on every rank, overlapping the rest of
// backward. SyncGradients() waits for them and averages in place. When DDP
// goes, .grad becomes a copy of its own.
// Not thread-safe: one training thread; the hooks run inside backward.
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          ProcessGroup* pg, DdpOptions options = {});
  ~DistributedDataParallel();

  // Call after backward() and before the optimizer step: waits for every
  // bucket's all-reduce and sets each parameter's grad to the average over
  // ranks. Does nothing inside a NoSync scope.
  void SyncGradients();
  // Rank 0's parameters (and buffers, with broadcast_buffers) to every
  // rank. Collective.
  void BroadcastState();

  // Gradient accumulation: backward passes inside the scope only accumulate
  // locally; the first synchronized backward after it reduces the sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
  };

  size_t num_buckets() const;
  // "shared memory" or "process group": how buckets are all-reduced.
  std::string transport() const;
  torch::nn::Module& module();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrun::train
