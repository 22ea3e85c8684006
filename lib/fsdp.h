#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/torch_compat.h"

namespace at {
class Tensor;
}
namespace torch::nn {
class SequentialImpl;
}
namespace torch::optim {
class Optimizer;
}

namespace dtrun::train {

struct FsdpOptions {
  // Wrap policy. 0: every child of the Sequential that has parameters is its
  // own unit (parameter-free children join the unit before them). > 0:
  // consecutive children are grouped until a unit holds at least this many
  // parameters.
  int64_t min_unit_params = 0;
  // Free each unit's gathered parameters after its forward (and gather them
  // again for backward); false keeps them until the unit's backward is done.
  bool reshard_after_forward = true;
  // Start the next unit's all-gather while the current one computes.
  bool prefetch = true;
  // Mixed precision: the dtype units compute in ("float32" or "bfloat16";
  // the master shards stay float32) and the dtype gradients are reduced in.
  std::string param_dtype = "float32";
  std::string reduce_dtype = "float32";
  // GPU builds: keep parameter shards, their gradients and the optimizer
  // state in CPU memory; each unit's shard is copied to the GPU to gather.
  bool cpu_offload = false;
  // When every rank runs on this host and units compute and reduce in
  // float32 on the CPU: all-gathers and reduce-scatters through a POSIX
  // shared-memory segment (as DDP's all-reduce), on a thread of each rank,
  // with the same overlap and the same bits as through the process group.
  // Otherwise, or false: through the process group.
  bool shared_memory = true;
  // How long a shared-memory collective waits for the other ranks before
  // it fails naming them.
  std::chrono::milliseconds timeout{30 * 60 * 1000};
};

// Fully sharded data parallelism for a torch::nn::Sequential (libtorch has
// no module forward hooks, so FSDP runs the Sequential's children itself:
// call Forward(), not the model's forward()).
//
// Each unit's parameters are flattened into one buffer padded to a multiple
// of the world size; rank r keeps only elements [r*S, (r+1)*S), its shard
// (a float32 leaf tensor, the optimizer's parameter). Forward all-gathers a
// unit's full parameters just before it runs (prefetching the next one) and
// frees them after; backward gathers again where freed, and as soon as every
// gradient of a unit is ready reduce-scatters them, so each rank keeps only
// the averaged gradient of its shard. Gradients of successive backward
// passes accumulate into the shard gradients (gradient accumulation needs
// no no_sync scope).
//
// On gloo (no reduce-scatter in Torch 1.13) the reduce-scatter is an
// all-to-all plus a local sum; on NCCL it is NCCL's reduce-scatter; on one
// host (FsdpOptions::shared_memory) both collectives go through shared
// memory instead of gloo.
// Not thread-safe: one training thread; the hooks run inside backward.
class FullyShardedDataParallel {
 public:
  FullyShardedDataParallel(std::shared_ptr<torch::nn::SequentialImpl> model,
                           ProcessGroup* pg, FsdpOptions options = {});
  ~FullyShardedDataParallel();

  // The model's forward, unit by unit. Under torch::NoGradGuard (evaluation)
  // every unit is gathered and freed again. Collective: every rank calls it.
  at::Tensor Forward(const at::Tensor& input);

  // After backward, before the optimizer step: waits for the reduce-scatters
  // and sets each shard's gradient to its part of the average over ranks.
  void SyncGradients();

  // The optimizer's parameters: one float32 shard per unit.
  std::vector<at::Tensor> ShardParameters() const;

  // The full parameters, float32, in model->parameters() order (gathered:
  // collective). For checksums, full checkpoints and tests.
  std::vector<at::Tensor> FullParameters();

  // Checkpoint state as named tensors. Sharded: this rank's range of every
  // unit's parameters and optimizer state ("u<k>.param", "u<k>.<state>",
  // plus "u<k>.begin", "u<k>.numel", "u<k>.padded"). Full: the same with
  // every range complete (gathered: collective; every rank gets it).
  // Optimizers: SGD (momentum buffer), Adam and AdamW (step, exp_avg,
  // exp_avg_sq, max_exp_avg_sq with amsgrad). Every tensor is a copy of
  // its own: training may go on while it is written (async checkpoints),
  // on the CPU; `copy` makes it (HostStaging's copier: into pinned host
  // memory on a side stream), or, when null, a synchronous copy to the CPU.
  std::map<std::string, at::Tensor> StateDict(
      torch::optim::Optimizer& opt, bool full,
      const std::function<at::Tensor(const at::Tensor&)>& copy = nullptr);
  // Restores this rank's shards and optimizer state from one or more state
  // dicts of either kind, saved on any number of ranks: each element is
  // taken from whichever dict holds its range. Throws Error when a range is
  // missing or the units differ from this model's.
  void LoadStateDicts(
      const std::vector<std::map<std::string, at::Tensor>>& dicts,
      torch::optim::Optimizer& opt);

  // Where each model parameter lies in its unit's flat tensor, names as
  // the model's named_parameters() has them. Checkpoints carry it
  // ("fsdp_layout"), so a reader (dtrun.checkpoint in Python) rebuilds the
  // model's state dict.
  struct UnitLayout {
    int64_t numel = 0;
    std::vector<std::string> names;
    std::vector<int64_t> offsets;
    std::vector<std::vector<int64_t>> shapes;
  };
  std::vector<UnitLayout> Layout() const;

  size_t num_units() const;
  // Bytes of every tensor FSDP holds now: shards, their gradients, the
  // optimizer's state, and any gathered unit or gradient buffer.
  // "shared memory" or "process group": where the collectives run.
  std::string transport() const;
  int64_t HeldBytes(torch::optim::Optimizer& opt) const;

  // Since the last call: seconds spent blocked on all-gathers and
  // reduce-scatters (what prefetch and overlap did not hide), and how many
  // of each were started.
  struct CommStats {
    double wait_s = 0;
    int64_t gathers = 0, reduce_scatters = 0;
  };
  CommStats TakeCommStats();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrun::train
