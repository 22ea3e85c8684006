// Our C++ DDP on an MLP 784-1024-1024-1024-10, batch 64 per rank. Run under
// dtrun; rank 0 prints one JSON line per transport (shared memory, the
// default on one host; then the process group, gloo): median step time, the same step's
// compute alone (a local model, no communication), the all-reduce of every
// gradient alone, and the share of that all-reduce hidden behind backward.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "lib/ddp.h"
#include "lib/process_group.h"
#include "lib/shm_allreduce.h"

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

// The all-reduce of every gradient on its own, through `transport`.
double AllreduceMs(dtrun::train::Distributed& dist, int64_t n, bool shared_memory) {
  auto flat = torch::zeros({n});
  if (!shared_memory) {
    return MedianMs(3, 20, [&] {
      std::vector<torch::Tensor> v{flat};
      dist.pg().allreduce(v)->wait();
    });
  }
  // The same segment protocol as DDP's: rank 0 creates, broadcasts the name.
  auto name = torch::zeros({128}, torch::kByte);
  std::unique_ptr<dtrun::train::ShmAllreduce> shm;
  if (dist.rank() == 0) {
    std::string s = "/dtrun-bench-" + std::to_string(getpid());
    shm = std::move(*dtrun::train::ShmAllreduce::Create(s, dist.world_size(), n));
    std::memcpy(name.data_ptr(), s.data(), s.size());
  }
  std::vector<torch::Tensor> v{name};
  dist.pg().broadcast(v)->wait();
  if (dist.rank() != 0) {
    shm = std::move(*dtrun::train::ShmAllreduce::Open(static_cast<const char*>(name.data_ptr()),
                                                     dist.rank(), dist.world_size(), n));
  }
  dist.pg().barrier()->wait();
  if (dist.rank() == 0) shm->Unlink();
  return MedianMs(3, 20, [&] {
    std::memcpy(shm->region(), flat.data_ptr(), n * sizeof(float));
    shm->Allreduce(0, n, std::chrono::seconds(60));
  });
}

struct Run {
  double step, allreduce;
  std::string transport;
  size_t buckets;
};

Run Measure(dtrun::train::Distributed& dist, const torch::Tensor& x, const torch::Tensor& y,
            bool shared_memory) {
  auto model = Mlp();
  dtrun::train::DdpOptions o;
  o.shared_memory = shared_memory;
  dtrun::train::DistributedDataParallel ddp(model, &dist.pg(), o);
  torch::optim::SGD opt(model->parameters(), 0.01);
  double step = MedianMs(5, 30, [&] {
    opt.zero_grad();
    torch::cross_entropy_loss(model->forward(x), y).backward();
    ddp.SyncGradients();
    opt.step();
  });
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return {step, AllreduceMs(dist, n, ddp.transport() == "shared memory"), ddp.transport(),
          ddp.num_buckets()};
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  auto x = torch::randn({64, 784});
  auto y = torch::randint(0, 10, {64});
  auto local = Mlp();
  torch::optim::SGD local_opt(local->parameters(), 0.01);
  double compute = MedianMs(5, 30, [&] {
    local_opt.zero_grad();
    torch::cross_entropy_loss(local->forward(x), y).backward();
    local_opt.step();
  });
  for (bool shm : {true, false}) {
    Run r = Measure(*dist, x, y, shm);
    double hidden = std::clamp((compute + r.allreduce - r.step) / r.allreduce, 0.0, 1.0);
    if (dist->rank() == 0) {
      std::printf("{\"impl\": \"dtrun C++ DDP\", \"transport\": \"%s\", \"step_ms\": %.2f, "
                  "\"compute_ms\": %.2f, \"allreduce_ms\": %.2f, \"hidden\": %.3f, "
                  "\"buckets\": %zu}\n",
                  r.transport.c_str(), r.step, compute, r.allreduce, hidden, r.buckets);
      std::fflush(stdout);
    }
  }
  return 0;
}
