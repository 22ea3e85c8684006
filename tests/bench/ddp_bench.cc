// Our C++ DDP on an MLP 784-1024-1024-1024-10, batch 64 per rank. Run under
// dtrun; rank 0 prints one JSON line: median step time, the same step's
// compute alone (a local model, no communication), the all-reduce of every
// gradient alone, and the share of that all-reduce hidden behind backward.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "lib/ddp.h"
#include "lib/process_group.h"

namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<torch::nn::SequentialImpl> Mlp() {
  torch::manual_seed(0);
  return std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(784, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
      torch::nn::ReLU(), torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
      torch::nn::Linear(1024, 10));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Fn>
double MedianMs(int warmup, int reps, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
  }
  return Median(t);
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  auto x = torch::randn({64, 784});
  auto y = torch::randint(0, 10, {64});
  auto model = Mlp();
  dtrun::train::DistributedDataParallel ddp(model, &dist->pg());
  torch::optim::SGD opt(model->parameters(), 0.01);
  double step = MedianMs(5, 30, [&] {
    opt.zero_grad();
    torch::cross_entropy_loss(model->forward(x), y).backward();
    ddp.SyncGradients();
    opt.step();
  });
  auto local = Mlp();
  torch::optim::SGD local_opt(local->parameters(), 0.01);
  double compute = MedianMs(5, 30, [&] {
    local_opt.zero_grad();
    torch::cross_entropy_loss(local->forward(x), y).backward();
    local_opt.step();
  });
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  auto flat = torch::zeros({n});
  double allreduce = MedianMs(3, 20, [&] {
    std::vector<torch::Tensor> v{flat};
    dist->pg().allreduce(v)->wait();
  });
  double hidden = std::clamp((compute + allreduce - step) / allreduce, 0.0, 1.0);
  if (dist->rank() == 0) {
    std::printf("{\"impl\": \"dtrun C++ DDP\", \"step_ms\": %.2f, \"compute_ms\": %.2f, "
                "\"allreduce_ms\": %.2f, \"hidden\": %.3f, \"buckets\": %zu}\n",
                step, compute, allreduce, hidden, ddp.num_buckets());
  }
  return 0;
}
