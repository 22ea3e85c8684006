#pragma once

// How FSDP's collectives move a unit's parameters and gradients: through
// the process group (NCCL's base collectives; gloo's all-gather into slices
// and, having no reduce-scatter in 1.13, an all-to-all whose chunks the
// receiver sums) or, when every rank is on this host and computes in
// float32 on the CPU, through one shared-memory segment (ShmQueue), in the
// order launched. lib/parallel/fsdp.cc decides what to move when; this moves
// it.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <chrono>
#include <memory>

#include "lib/process_group.h"
#include "lib/parallel/shm_allreduce.h"

namespace dtrun::train {

class FsdpTransport {
 public:
  using Work = c10::intrusive_ptr<c10d::Work>;

  FsdpTransport(ProcessGroup* pg, std::chrono::milliseconds timeout);

  // Shared memory for `floats` (the largest unit, padded) when every rank
  // can open rank 0's segment; collective. With `prefetch`, gathers may run
  // on the queue's thread, when there is a core to spare for it.
  void OpenSharedMemory(int64_t floats, bool prefetch);
  bool shared_memory() const { return shm_ != nullptr; }
  bool nccl() const { return nccl_; }
  // Whether a prefetched gather may run ahead on the queue's thread:
  // only with 2 cores per rank. Without, the thread takes its core from a
  // rank's compute and the hand-offs cost more than the overlap gains
  // (tests/bench/README.md, "FSDP through shared memory").
  bool overlaps() const { return shm_overlap_; }

  // All-gathers `src` ([S] per rank) into `dst` ([S * world]), both kept
  // alive by the caller until waited for.
  Work AllGather(const at::Tensor& dst, const at::Tensor& src);
  // The same on this thread, for a gather the caller would wait for at
  // once (shared memory only): no hand-off to the queue's thread and back.
  Status GatherHere(const at::Tensor& dst, const at::Tensor& src);
  // Reduce-scatters `in` ([padded]): the output to pass to ReduceScatter,
  // then this rank's chunk summed over ranks ([shard_size]) once waited for.
  at::Tensor ReduceScatterOutput(const at::Tensor& in, int64_t shard_size);
  Work ReduceScatter(const at::Tensor& out, const at::Tensor& in);
  at::Tensor SummedChunk(const at::Tensor& out, int64_t shard_size) const;

 private:
  // The gather of `src` into `dst` as a job for the shared-memory queue.
  std::function<Status(ShmAllreduce&)> GatherJob(const at::Tensor& dst,
                                                 const at::Tensor& src) const;
  // Gloo's 16-bit types differ by build: flat tensors of them go as bytes.
  at::Tensor Wire(const at::Tensor& t) const;

  ProcessGroup* pg_;
  const bool nccl_;
  const int world_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<ShmQueue> shm_;
  bool shm_overlap_ = false;
};

}  // namespace dtrun::train
