#pragma once

// A model of any kind for the training library: the module (its
// parameters, buffers and names, which DDP, FSDP and checkpoints work on)
// and how to run it on a batch's input. libtorch's modules have no common
// forward(), so the forward is carried beside the module.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dtrun::train {

struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  // Module types FSDP makes units of ("Block"), each run through
  // ShardedCall in the forward (lib/fsdp.h), unless strategy.unit_types
  // names others. Empty: one unit for the whole model.
  std::vector<std::string> shard_units;

  // Any module whose forward takes the batch's input tensor:
  // Model::Of(std::make_shared<MyNet>()),
  // Model::Of(torch::nn::Sequential(...)).
  template <typename M>
  static Model Of(std::shared_ptr<M> m) {
    return {m,
            [raw = m.get()](const torch::Tensor& x) { return raw->forward(x); },
            {}};
  }
  template <typename M>
  static Model Of(torch::nn::ModuleHolder<M> holder) {
    return Of(holder.ptr());
  }
};

}  // namespace dtrun::train
