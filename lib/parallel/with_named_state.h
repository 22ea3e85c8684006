#pragma once

// A strategy that also carries named state in each checkpoint: the
// trainer's wrapper for the user's state and fp16's loss scale.

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "lib/parallel/strategy.h"

namespace dtrun::train {

using NamedTensors = std::map<std::string, torch::Tensor>;

// Named state beside the strategy's own parts in each checkpoint's step
// file, as "<prefix><name>": the user's (TrainParts::save_state,
// load_state; "user.") and the loop's (fp16's loss scale; "scaler.").
// Every checkpoint mode saves and restores through the strategy, so every
// mode carries it. Rank 0's values are the ones saved.
class WithNamedState : public Strategy {
 public:
  WithNamedState(std::unique_ptr<Strategy> inner, std::string prefix,
                 std::function<NamedTensors()> save,
                 std::function<void(const NamedTensors&)> load)
      : inner_(std::move(inner)),
        prefix_(std::move(prefix)),
        save_(std::move(save)),
        load_(std::move(load)) {}

  torch::Tensor Forward(const torch::Tensor& x) override {
    return inner_->Forward(x);
  }
  void Backward(const torch::Tensor& loss, bool last) override {
    inner_->Backward(loss, last);
  }
  std::vector<torch::Tensor> OptimizerParams() override {
    return inner_->OptimizerParams();
  }
  std::vector<torch::Tensor> FullParams() override {
    return inner_->FullParams();
  }
  double GradNorm() override { return inner_->GradNorm(); }
  std::vector<torch::Tensor> MatrixMasks() override {
    return inner_->MatrixMasks();
  }
  bool CollectiveEval() const override { return inner_->CollectiveEval(); }
  double TakeCollectiveSeconds() override {
    return inner_->TakeCollectiveSeconds();
  }
  void StartFresh() override { inner_->StartFresh(); }
  bool CanRegroup() const override { return inner_->CanRegroup(); }
  bool EveryRankHoldsAll() const override {
    return inner_->EveryRankHoldsAll();
  }
  void StartOver(torch::nn::Module& drawn,
                 torch::optim::Optimizer& opt) override {
    inner_->StartOver(drawn, opt);
  }
  void Regroup(const std::function<ProcessGroup*()>& regroup) override {
    inner_->Regroup(regroup);
  }
  void Discard() override { inner_->Discard(); }
  TensorMap Save(torch::optim::Optimizer& opt, const CheckpointDir& dir,
                 int64_t step) override {
    TensorMap parts = inner_->Save(opt, dir, step);
    for (auto& [name, t] : save_())
      parts[prefix_ + name] = t.detach().to(torch::kCPU);
    return parts;
  }
  Snapshot Copy(torch::optim::Optimizer& opt, bool whole,
                const TensorCopier& copy) override {
    Snapshot snap = inner_->Copy(opt, whole, copy);
    if (!whole) return snap;  // this rank writes no step's file
    for (auto& [name, t] : save_())
      snap.parts[prefix_ + name] = copy(t.detach());
    return snap;
  }
  // The strategy sees its own parts only: DDP's restore reads every
  // tensor it finds as model or optimizer state, and FSDP's checks that a
  // full file's keys are its units'.
  Status Complete(const TensorMap& parts, const ShardSource& shards,
                  int64_t step) override {
    return inner_->Complete(Without(parts), shards, step);
  }
  Status Restore(const TensorMap& parts, torch::optim::Optimizer& opt,
                 const PayloadView* pending) override {
    Status s = inner_->Restore(Without(parts), opt, pending);
    if (!s.ok()) return s;  // the named state stays as it was
    // Clones: the parts may point into a mapped file or a memory copy
    // that goes once the resume is done.
    NamedTensors named;
    for (const auto& [name, t] : parts) {
      if (name.compare(0, prefix_.size(), prefix_) == 0)
        named[name.substr(prefix_.size())] = t.clone();
    }
    load_(named);
    return s;
  }

 private:
  TensorMap Without(const TensorMap& parts) const {
    TensorMap out;
    for (const auto& [name, t] : parts) {
      if (name.compare(0, prefix_.size(), prefix_) != 0) out[name] = t;
    }
    return out;
  }
  std::unique_ptr<Strategy> inner_;
  const std::string prefix_;
  std::function<NamedTensors()> save_;
  std::function<void(const NamedTensors&)> load_;
};

}  // namespace dtrun::train
