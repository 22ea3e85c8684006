// Run under dtrun with N ranks (the test uses 4). A 50.4M-parameter MLP
// trained two AdamW steps with our DDP and then with FSDP: the bytes each
// rank holds between steps in parameters + gradients + optimizer state
// (the tensors' own byte counts) must be <= DDP's / N + 10% with FSDP.
// FSDP's count includes every buffer it holds; DDP's leaves out its
// gradient buckets. Rank 0 prints both and the ranks' peak RSS.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <cstdio>

#include "lib/ddp.h"
#include "lib/fsdp.h"
#include "lib/process_group.h"
#include "tests/helpers/measure.h"

namespace {

using dtrun::testing::AllMax;
using dtrun::testing::PeakRssMb;

constexpr int kWidth = 4096, kBatch = 2;

std::shared_ptr<torch::nn::SequentialImpl> MakeModel() {
  torch::manual_seed(5);
  return std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
      torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
      torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
      torch::nn::Linear(kWidth, 10));
}

int64_t Bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * t.element_size() : 0;
}

int64_t OptimizerBytes(torch::optim::AdamW& opt) {
  int64_t n = 0;
  for (auto& [key, state] : opt.state()) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*state);
    n += Bytes(s.exp_avg()) + Bytes(s.exp_avg_sq()) + Bytes(s.max_exp_avg_sq());
  }
  return n;
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  const int n = dist->world_size();
  auto x = torch::randn({kBatch, kWidth});
  auto y = torch::randint(0, 10, {kBatch});
  int64_t params = 0, ddp_bytes = 0, fsdp_bytes = 0;
  // FSDP first, so that the peak RSS after it is FSDP's own.
  {
    auto model = MakeModel();
    for (const auto& p : model->parameters()) params += p.numel();
    dtrun::train::FullyShardedDataParallel fsdp(model, &dist->pg());
    torch::optim::AdamW opt(fsdp.ShardParameters(),
                            torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      torch::cross_entropy_loss(fsdp.Forward(x), y).backward();
      fsdp.SyncGradients();
      opt.step();
    }
    fsdp_bytes = fsdp.HeldBytes(opt);
  }
  const double fsdp_rss = AllMax(dist->pg(), PeakRssMb());
  fsdp_bytes =
      static_cast<int64_t>(AllMax(dist->pg(), static_cast<double>(fsdp_bytes)));
  {
    auto model = MakeModel();
    dtrun::train::DistributedDataParallel ddp(model, &dist->pg());
    torch::optim::AdamW opt(model->parameters(),
                            torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      torch::cross_entropy_loss(model->forward(x), y).backward();
      ddp.SyncGradients();
      opt.step();
    }
    for (const auto& p : model->parameters())
      ddp_bytes += Bytes(p) + Bytes(p.grad());
    ddp_bytes += OptimizerBytes(opt);
  }
  const double ddp_rss = AllMax(dist->pg(), PeakRssMb());
  const double limit = ddp_bytes / static_cast<double>(n) * 1.10;
  if (dist->rank() == 0) {
    std::printf(
        "fsdp_memory: %lld parameters, %d ranks; held between steps per rank: "
        "DDP %.1f MB, "
        "FSDP %.1f MB (%.3f of DDP; limit 1/%d + 10%% = %.1f MB); peak RSS per "
        "rank "
        "(max over ranks): FSDP %.0f MB, then after DDP too %.0f MB\n",
        (long long)params, n, ddp_bytes / 1e6, fsdp_bytes / 1e6,
        fsdp_bytes / static_cast<double>(ddp_bytes), n, limit / 1e6, fsdp_rss,
        ddp_rss);
    std::printf("fsdp_memory: %s\n",
                fsdp_bytes <= limit && params >= 50000000 ? "OK" : "FAILED");
  }
  return fsdp_bytes <= limit && params >= 50000000 ? 0 : 1;
}
