#pragma once

// Copies of a model's and an optimizer's state that serialize exactly as
// the originals would, made fast on the training loop's thread (a memcpy
// per tensor) and serialized later on another (async checkpoints): torch's
// serializer is several times slower than the copy.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/host_staging.h"

namespace dtrun::train {

// A module tree's parameters and buffers, cloned, with the tree's names.
struct ModuleCopy {
  std::vector<std::pair<std::string, torch::Tensor>> params, buffers;
  std::vector<std::pair<std::string, ModuleCopy>> children;
  // Every parameter in Module::parameters() order (pre-order).
  std::vector<torch::Tensor> AllParams() const;
};

// Copies `m`'s state with `copy` (children that are not serializable are
// left out, as Module::save leaves them). Default: clones.
ModuleCopy CopyModule(const torch::nn::Module& m,
                      const TensorCopier& copy = nullptr);

// Writes `c` as Module::save writes the module it was copied from.
void SaveModuleCopy(const ModuleCopy& c, torch::serialize::OutputArchive& out);

// An optimizer of `live`'s kind (SGD, Adam, AdamW) over `params`, clones of
// live's parameters in the same order, with copies of its options and of
// its per-parameter state (tensors copied with `copy`, default clones):
// saved, it writes what `live` would. Null for another kind or more than
// one parameter group; then the caller serializes `live` itself.
std::unique_ptr<torch::optim::Optimizer> CopyOptimizer(
    torch::optim::Optimizer& live, const std::vector<torch::Tensor>& params,
    const TensorCopier& copy = nullptr);

}  // namespace dtrun::train
