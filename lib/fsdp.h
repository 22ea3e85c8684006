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
class Module;
class SequentialImpl;
}  // namespace torch::nn
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
  // Wrap policy for a model of any other shape: every module whose type is
  // named here ("Block" matches a BlockImpl in any namespace) is a unit of
  // its own, nested ones too; what no unit holds (embeddings, a head, a
  // parameter two units share) is the root unit, gathered for the whole
  // step. Empty: the root unit holds everything.
  std::vector<std::string> unit_types;
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
  // Rank 0's values into every rank's shards, frozen parameters and
  // buffers at construction (collective). false: each rank cuts its shard
  // from its own values, for a state restored right after (a replacement
  // in in-place recovery, whose survivors broadcast nothing in Regroup).
  bool broadcast_at_start = true;
};

// Fully sharded data parallelism for a torch::nn::Sequential (FSDP runs
// its children: call Forward(), not the model's forward()) or for any
// module tree, whose units the policy picks (FsdpOptions::unit_types) and
// whose own forward runs each unit through ShardedCall (libtorch has no
// module hooks: that call is where a unit is gathered and its backward
// hooked; the rest of the forward is the user's, unchanged).
//
// Each unit's parameters are flattened into one buffer padded to a multiple
// of the world size; rank r keeps only elements [r*S, (r+1)*S), its shard
// (a float32 leaf tensor, the optimizer's parameter). Forward all-gathers a
// unit's full parameters just before it runs (prefetching the next one) and
// frees them after; backward gathers again where freed, and as soon as every
// gradient of a unit is ready reduce-scatters them, so each rank keeps only
// the averaged gradient of its shard. Gradients of successive backward
// passes accumulate into the shard gradients; with SetGradientSync(false)
// they accumulate unsharded instead and the next synced backward
// reduce-scatters their sum once (as DDP's no_sync).
//
// A parameter two units share (a tied embedding and head) belongs to the
// root unit; parameters with requires_grad false stay whole on every rank
// (rank 0's values), without gradients and outside the optimizer; buffers
// are rank 0's at the start and are saved with the state.
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
  // Any module; `forward` runs it on an input (its own forward, which calls
  // ShardedCall for each unit). The first Forward() keeps every unit
  // gathered and checks that each ran through ShardedCall (Error naming the
  // first that did not); later ones gather and free unit by unit.
  FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> model,
                           std::function<at::Tensor(const at::Tensor&)> forward,
                           ProcessGroup* pg, FsdpOptions options = {});
  ~FullyShardedDataParallel();

  // The model's forward, unit by unit. Under torch::NoGradGuard (evaluation)
  // every unit is gathered and freed again. Collective: every rank calls it.
  at::Tensor Forward(const at::Tensor& input);

  // false: the following backward passes keep each unit's gradient whole
  // and unreduced (no collective); the first with true again
  // reduce-scatters the sum. Costs a full gradient's memory meanwhile.
  void SetGradientSync(bool sync);

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

  // This rank's shards, the frozen parameters and the buffers cut from a
  // whole model's tensors, by the names named_parameters() and
  // named_buffers() give them (a model as first made). Throws Error naming
  // one missing.
  void LoadWhole(const std::map<std::string, at::Tensor>& named);

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

  // In-place recovery (lib/in_place_recovery.h): drops every collective
  // in flight on the old group (a rank died mid-step: they fail as its
  // sockets close), calls `regroup` for the new group of the same size and
  // moves to it. The shards, gradients cleared, are the caller's to
  // restore (LoadStateDicts); a replacement joins with broadcast_at_start
  // false. Collective on the new group (its shared memory).
  void Regroup(const std::function<ProcessGroup*()>& regroup);

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

namespace fsdp_detail {
// The FSDP forward running on this thread gathers `module`'s unit and
// returns its place in the forward, or -1: no FSDP forward runs here or
// the module is no unit (so the same model code runs under DDP).
int EnterUnit(const torch::nn::Module* module);
// Frees the unit (unless its backward comes next) and hooks `output` so
// that backward gathers it again first. -1: returns `output`.
at::Tensor ExitUnit(int token, const at::Tensor& output);
}  // namespace fsdp_detail

// `module->forward(args...)`, as an FSDP unit when the model is sharded with
// the module's type in FsdpOptions::unit_types, a plain call otherwise:
//   for (auto& block : blocks_) x = dtrun::train::ShardedCall(block, x);
// `module`: a ModuleHolder (Block) or a std::shared_ptr<BlockImpl>; its
// forward returns one tensor.
template <typename M, typename... Args>
auto ShardedCall(M& module, Args&&... args)
    -> decltype(module->forward(std::forward<Args>(args)...)) {
  const int token = fsdp_detail::EnterUnit(&*module);
  return fsdp_detail::ExitUnit(token,
                               module->forward(std::forward<Args>(args)...));
}

}  // namespace dtrun::train
