// The one-pass AdamW step against torch::optim::AdamW's own: the same
// parameters and state after several steps (bitwise, or within a float's
// last bits where torch's kernels round otherwise), with decoupled weight
// decay, a clipping factor, per-tensor and per-element decay masks, a
// parameter without a gradient, and a state torch's own step then carries
// on from.
#include "lib/optimizer.h"

#include <gtest/gtest.h>

#include <vector>

namespace dtrun::train {
namespace {

// A matrix, a vector and a tensor that gets no gradient.
std::vector<torch::Tensor> Params() {
  torch::manual_seed(7);
  return {torch::randn({37, 19}).requires_grad_(),
          torch::randn({53}).requires_grad_(),
          torch::randn({5, 3}).requires_grad_()};
}

void SetGrads(std::vector<torch::Tensor>& ps, int step, double scale) {
  torch::manual_seed(100 + step);
  for (size_t i = 0; i + 1 < ps.size(); ++i)
    ps[i].mutable_grad() = torch::randn(ps[i].sizes()) * scale;
}

double MaxDiff(const std::vector<torch::Tensor>& a,
               const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

torch::optim::AdamWOptions Options(double wd) {
  return torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).weight_decay(wd);
}

TEST(FusedAdamWTest, StepsAsTorchsAdamWWithDecayOnEveryElement) {
  auto ours = Params(), theirs = Params();
  torch::optim::AdamW a(ours, Options(0.1)), b(theirs, Options(0.1));
  ASSERT_TRUE(FusedAdamWApplies(a, ours));
  for (int step = 0; step < 6; ++step) {
    SetGrads(ours, step, 1);
    SetGrads(theirs, step, 1);
    StepArgs args;
    args.lr = 1e-2;
    FusedAdamWStep(a, ours, args);
    b.step();
  }
  EXPECT_LT(MaxDiff(ours, theirs), 1e-6);
  EXPECT_EQ(ours[2].grad().defined(), false);
  // the state is AdamW's: torch's own step carries on from it
  auto& s =
      static_cast<torch::optim::AdamWParamState&>(*a.state().begin()->second);
  EXPECT_EQ(s.step(), 6);
  SetGrads(ours, 6, 1);
  SetGrads(theirs, 6, 1);
  a.step();
  b.step();
  EXPECT_LT(MaxDiff(ours, theirs), 1e-6);
}

// The trainer's "matrices" decay and clipping: torch's AdamW without decay,
// the matrices multiplied by (1 - lr wd) and the gradients by the factor
// first, as the unfused path does.
TEST(FusedAdamWTest, DecaysOnlyWhereTheMasksSayAndScalesTheGradients) {
  for (bool per_element : {false, true}) {
    auto ours = Params(), theirs = Params();
    torch::optim::AdamW a(ours, Options(0)), b(theirs, Options(0));
    std::vector<torch::Tensor> masks;
    for (const auto& p : ours) {
      const bool matrix = p.dim() >= 2;
      masks.push_back(per_element
                          ? torch::full({p.numel()}, matrix).view(p.sizes())
                          : torch::scalar_tensor(matrix, torch::kBool));
    }
    if (per_element) {  // a mask may cut a tensor anywhere (an FSDP shard)
      masks[1].view(-1).narrow(0, 10, 20).fill_(true);
    }
    for (int step = 0; step < 5; ++step) {
      SetGrads(ours, step, 3);
      SetGrads(theirs, step, 3);
      StepArgs args;
      args.lr = 1e-2;
      args.grad_scale = 0.25;
      args.decay_masks = &masks;
      args.weight_decay = 0.1;
      FusedAdamWStep(a, ours, args);
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < theirs.size(); ++i) {
        if (!theirs[i].grad().defined()) continue;
        theirs[i].mutable_grad().mul_(0.25);
        theirs[i].mul_(torch::where(masks[i],
                                    torch::scalar_tensor(1 - 1e-2 * 0.1),
                                    torch::scalar_tensor(1.0)));
      }
      b.step();
    }
    EXPECT_LT(MaxDiff(ours, theirs), 1e-6) << "per element: " << per_element;
    EXPECT_GT(MaxDiff(ours, Params()), 1e-3);  // it did train
  }
}

TEST(FusedAdamWTest, DoesNotApplyToOtherTypesOrOptimizers) {
  auto ps = Params();
  torch::optim::SGD sgd(ps, torch::optim::SGDOptions(0.1));
  EXPECT_FALSE(FusedAdamWApplies(sgd, ps));
  std::vector<torch::Tensor> doubles{torch::randn({4}, torch::kDouble)};
  torch::optim::AdamW a(doubles, Options(0));
  EXPECT_FALSE(FusedAdamWApplies(a, doubles));
  std::vector<torch::Tensor> strided{torch::randn({4, 4}).t()};
  torch::optim::AdamW c(strided, Options(0));
  EXPECT_FALSE(FusedAdamWApplies(c, strided));
  torch::optim::AdamW d(ps, Options(0).amsgrad(true));
  EXPECT_FALSE(FusedAdamWApplies(d, ps));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{ps[0]},
      std::make_unique<torch::optim::AdamWOptions>(Options(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{ps[1]},
                      std::make_unique<torch::optim::AdamWOptions>(Options(0)));
  torch::optim::AdamW two_groups(groups, Options(0));
  EXPECT_FALSE(FusedAdamWApplies(two_groups, ps));
}

}  // namespace
}  // namespace dtrun::train
