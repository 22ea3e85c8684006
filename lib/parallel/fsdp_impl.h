#pragma once

// FullyShardedDataParallel's insides, shared by fsdp.cc (units, gathers,
// hooks) and fsdp_state.cc (checkpoints, full parameters). Not installed.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "lib/fsdp.h"
#include "lib/parallel/fsdp_transport.h"

namespace dtrun::train {

struct FullyShardedDataParallel::Impl {
  using StateDicts = std::vector<std::map<std::string, at::Tensor>>;

  struct Unit {
    std::string name;  // the module's path, "(root)", or "children a..b"
    size_t first_child = 0, end_child = 0;  // a Sequential's children
    std::vector<at::Tensor> params;  // the module's parameters: views of `full`
    std::vector<std::string> names;  // theirs in the model's named_parameters()
    std::vector<int64_t> offsets;
    int64_t numel = 0, padded = 0, shard_size = 0;
    at::Tensor shard;  // float32 master, a leaf the optimizer steps
    at::Tensor full;   // param_dtype, [padded]; storage freed when not gathered
    bool gathered = false;
    c10::intrusive_ptr<c10d::Work> gather_work;
    at::Tensor gather_input;
    at::Tensor grad_full;  // reduce_dtype, [padded], during backward
    std::vector<bool> ready;
    size_t pending = 0;
    bool backward_done = false;  // this backward computed all its gradients
    c10::intrusive_ptr<c10d::Work> rs_work;
    at::Tensor rs_out;
    bool clear_param_grads = false;
  };

  // The model: a Sequential whose children FSDP runs, or any module whose
  // forward (the user's) runs its units through ShardedCall.
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<torch::nn::SequentialImpl> seq;
  std::function<at::Tensor(const at::Tensor&)> forward;
  ProcessGroup* pg = nullptr;
  FsdpOptions opts;
  int rank = 0, world = 1;
  bool nccl = false;
  at::ScalarType param_dtype = at::kFloat, reduce_dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::vector<Unit> units;
  int root = -1;  // the unit of what no other unit holds (any module), or -1
  std::map<const torch::nn::Module*, size_t> unit_of;
  // Units as this forward entered them, and as the last one did (forward
  // prefetches the next; backward, in reverse, the previous).
  std::vector<size_t> order, prev_order;
  bool discovered = false;   // a model's first forward checked its units
  bool discovering = false;  // that first forward: every unit kept gathered
  bool gradient_sync = true;
  // Parameters with requires_grad false: whole on every rank, no gradient.
  std::vector<at::Tensor> frozen;
  std::vector<std::string> frozen_names;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  // model->parameters() index -> (unit, i); unit == units.size(): frozen[i]
  std::vector<std::pair<size_t, size_t>> param_slot;
  // reduce-scatters start in this (descending) order on every rank
  int next_rs = -1;
  std::mutex mu;  // hooks may run on autograd's threads
  CommStats stats;
  // The process group or, with FsdpOptions::shared_memory, one segment
  // every collective goes through in the order launched.
  std::unique_ptr<FsdpTransport> net;

  // fsdp.cc
  void Setup();
  void BuildUnits();
  void BuildTreeUnits();
  void Shard();
  at::Tensor CutShard(const Unit& u, const at::TensorOptions& o) const;
  void OpenSharedMemory();
  void Wait(const c10::intrusive_ptr<c10d::Work>& work);
  void LaunchGather(Unit& u);
  bool GatherHere(Unit& u);
  void EnsureGathered(Unit& u);
  void Free(Unit& u);
  size_t EnterUnit(size_t k);
  at::Tensor ExitUnit(size_t pos, at::Tensor h);
  void PreBackward(size_t pos);
  void ClearParamGrads();
  void OnGrad(size_t k, size_t i, const at::Tensor& grad);
  void LaunchReadyReduceScatters();
  void LaunchReduceScatter(Unit& u);
  void FinishReduceScatter(Unit& u);
  void ResetBackward(Unit& u);
  at::Tensor RunTree(const at::Tensor& input);
  void CheckDiscovered();

  // fsdp_state.cc
  at::Tensor GatherFloat(const at::Tensor& part);
  std::set<std::string> SavedNames(size_t k, const StateDicts& dicts) const;
  at::Tensor Reassemble(size_t k, const std::string& name,
                        const StateDicts& dicts) const;
};

// Broadcasts rank 0's `t` into every rank's, in place; bfloat16 on the CPU
// as its bytes (gloo refuses it on libtorch 1.13).
void BroadcastFromRank0(ProcessGroup* pg, const at::Tensor& t);

}  // namespace dtrun::train
