// The loop's optimizer (lib/optimizer.cc): made from the config, its
// learning rate set, and its step: AdamW's in one pass over each parameter
// on the CPU, with the clipping's factor and the decay of matrices in it.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "lib/train_config.h"

namespace dtrun::train {

// optimizer.type's optimizer over `params`; with optimizer.decay =
// "matrices", an AdamW without decay of its own (the step applies it).
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const TrainConfig& c, std::vector<torch::Tensor> params);

void SetLearningRate(torch::optim::Optimizer& opt, double lr);

// What the loop hands the step besides the optimizer's own options.
struct StepArgs {
  double lr = 0;
  // FusedAdamWStep multiplies each gradient by it first (the clipping's
  // factor; 1: none).
  double grad_scale = 1;
  // optimizer.decay = "matrices": for each parameter, which of its elements
  // decay (a bool scalar for the whole tensor, or one per element), with
  // `weight_decay`; null: the optimizer's own weight_decay on every element.
  const std::vector<torch::Tensor>* decay_masks = nullptr;
  double weight_decay = 0;
};

// Whether FusedAdamWStep can run on these parameters: float32, contiguous,
// on the CPU, with an AdamW of one parameter group, without amsgrad.
bool FusedAdamWApplies(const torch::optim::Optimizer& opt,
                       const std::vector<torch::Tensor>& params);

// torch::optim::AdamW::step() for the parameters FusedAdamWApplies to, made
// in one loop per parameter where torch makes eight passes (and two
// temporaries): decoupled weight decay, the two moments, the bias-corrected
// update, in the same order and float32 roundings. The state is AdamW's own
// (exp_avg, exp_avg_sq, step), so checkpoints, resumes and torch's own step
// read it; parameters without a gradient are left alone, as torch's.
void FusedAdamWStep(torch::optim::Optimizer& opt,
                    const std::vector<torch::Tensor>& params,
                    const StepArgs& args);

// The unfused path's decay of matrices (args.decay_masks, before torch's
// step): p *= 1 - lr * weight_decay where a mask says, on parameters that
// have a gradient: the same bits as AdamW's own decay on a parameter group
// of the matrices, under DDP and FSDP alike.
void DecayMatrices(const std::vector<torch::Tensor>& params,
                   const StepArgs& args);

}  // namespace dtrun::train
