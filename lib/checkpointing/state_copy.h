#pragma once

// A model's and an optimizer's state as named tensors, and back: DDP's
// checkpoint (every tensor by name, nothing in torch's pickled archives,
// so a checkpoint saved by one libtorch loads in another), and the
// per-parameter optimizer state FSDP saves per shard. Copies are made
// with a TensorCopier (HostStaging's: from a GPU into pinned host memory),
// so that another thread may serialize them while training goes on.

#include <torch/torch.h>

#include <map>
#include <string>

#include "lib/checkpoint.h"
#include "lib/checkpointing/host_staging.h"

namespace dtrun::train {

// The optimizer state of `param` (SGD: momentum_buffer; Adam, AdamW:
// exp_avg, exp_avg_sq, max_exp_avg_sq when amsgrad, and step as an int64
// scalar), the live tensors; empty before its first step. Throws Error
// for another optimizer.
std::map<std::string, torch::Tensor> ParamOptimizerState(
    torch::optim::Optimizer& opt, const torch::Tensor& param);
// Sets it from such a map (nothing when empty). Throws Error for another
// optimizer or a field missing.
void SetParamOptimizerState(torch::optim::Optimizer& opt,
                            const torch::Tensor& param,
                            std::map<std::string, torch::Tensor> state);

// Empty tensors like each of `like`, on the CPU carved from one mapping
// whose pages are made in one call (MAP_POPULATE), so that writing them
// pays no fault per page; elsewhere (a GPU), empty_like.
std::vector<torch::Tensor> PopulatedLike(
    const std::vector<torch::Tensor>& like);

// DDP's checkpoint: "ddp.model.<name>" for each parameter and buffer of
// `model` (Module::named_parameters/named_buffers names) and
// "ddp.optim.<i>.<field>" for the optimizer state of model->parameters()[i],
// each tensor made by `copy`.
std::map<std::string, torch::Tensor> ModelAndOptimizerState(
    torch::nn::Module& model, torch::optim::Optimizer& opt,
    const TensorCopier& copy);
// Whether `parts` hold such a checkpoint.
bool HasModelAndOptimizerState(
    const std::map<std::string, torch::Tensor>& parts);
// Copies each src[i] into dst[i] (same shapes). CPU tensors of one dtype,
// both contiguous, are copied in 4 MiB pieces on up to four threads
// whatever OMP_NUM_THREADS says (a restore has the machine to itself: the
// loop waits for it); any other pair with copy_.
void CopyTensors(const std::vector<torch::Tensor>& dst,
                 const std::vector<torch::Tensor>& src);
// The same where the sources point into `from`, a payload whose blocks are
// still to verify: verified as copied (CopyVerifying, checkpoint.h). When
// a block does not match, Invalid, and dst holds a mix.
Status CopyTensors(const std::vector<torch::Tensor>& dst,
                   const std::vector<torch::Tensor>& src,
                   const PayloadView& from);

// Restores it into `model` (copied into its tensors, on their device) and
// `opt`, whose parameters are model.parameters(). Throws Error naming the
// first key missing or of another shape (a checkpoint of another model).
// `pending`: the payload `parts` point into, when its blocks are still to
// verify (they are, as they are copied); then Invalid when one does not
// match, leaving the model a mix of the two states (the optimizer as it
// was).
Status RestoreModelAndOptimizerState(
    const std::map<std::string, torch::Tensor>& parts, torch::nn::Module& model,
    torch::optim::Optimizer& opt, const PayloadView* pending = nullptr);

}  // namespace dtrun::train
