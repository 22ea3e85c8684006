// Our C++ DDP on an MLP 784-1024-1024-1024-10, batch 64 per rank. Run under
// dtrun; rank 0 prints one JSON line per transport (shared memory, the
// default on one host; then the process group, gloo): median step time, the
// same step's compute alone (a local model, no communication), the all-reduce
// of every gradient alone, and the share of that all-reduce hidden behind
// backward.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "lib/ddp.h"
#include "lib/process_group.h"
#include "lib/parallel/shm_allreduce.h"
#include "tests/helpers/measure.h"

namespace {

using dtrun::testing::MedianMs;

std::shared_ptr<torch::nn::SequentialImpl> Mlp() {
  torch::manual_seed(0);
  return std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(784, 1024), torch::nn::ReLU(),
      torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
      torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
      torch::nn::Linear(1024, 10));
}

// The all-reduce of every gradient on its own, through `transport`.
double AllreduceMs(dtrun::train::Distributed& dist, int64_t n,
                   bool shared_memory) {
  auto flat = torch::zeros({n});
  if (!shared_memory) {
    return MedianMs(3, 20, [&] {
      std::vector<torch::Tensor> v{flat};
      dist.pg().allreduce(v)->wait();
    });
  }
  std::string why;
  auto shm = dtrun::train::OpenSharedMemoryAllreduce(
      dist.pg(), static_cast<size_t>(n), &why);
  if (!shm)
    throw std::runtime_error("shared-memory all-reduce unavailable: " + why);
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

Run Measure(dtrun::train::Distributed& dist, const torch::Tensor& x,
            const torch::Tensor& y, bool shared_memory) {
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
  return {step, AllreduceMs(dist, n, ddp.transport() == "shared memory"),
          ddp.transport(), ddp.num_buckets()};
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  auto x = torch::randn({64, 784});
  auto y = torch::randint(0, 10, {64});
  // `ddp_bench profile [STEPS] [local]`: only the DDP step (shared memory), or
  // the same step on a local model, STEPS times, for a profiler.
  if (argc > 1 && std::string(argv[1]) == "profile") {
    const int steps = argc > 2 ? std::stoi(argv[2]) : 300;
    const bool local = argc > 3 && std::string(argv[3]) == "local";
    auto model = Mlp();
    std::unique_ptr<dtrun::train::DistributedDataParallel> ddp;
    if (!local)
      ddp = std::make_unique<dtrun::train::DistributedDataParallel>(
          model, &dist->pg());
    torch::optim::SGD opt(model->parameters(), 0.01);
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      torch::cross_entropy_loss(model->forward(x), y).backward();
      if (ddp) ddp->SyncGradients();
      opt.step();
    }
    return 0;
  }
  auto local = Mlp();
  torch::optim::SGD local_opt(local->parameters(), 0.01);
  double compute = MedianMs(5, 30, [&] {
    local_opt.zero_grad();
    torch::cross_entropy_loss(local->forward(x), y).backward();
    local_opt.step();
  });
  for (bool shm : {true, false}) {
    Run r = Measure(*dist, x, y, shm);
    double hidden =
        std::clamp((compute + r.allreduce - r.step) / r.allreduce, 0.0, 1.0);
    if (dist->rank() == 0) {
      std::printf(
          "{\"impl\": \"dtrun C++ DDP\", \"transport\": \"%s\", \"step_ms\": "
          "%.2f, "
          "\"compute_ms\": %.2f, \"allreduce_ms\": %.2f, \"hidden\": %.3f, "
          "\"buckets\": %zu}\n",
          r.transport.c_str(), r.step, compute, r.allreduce, hidden, r.buckets);
      std::fflush(stdout);
    }
  }
  return 0;
}
