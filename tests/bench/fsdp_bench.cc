// FSDP vs our DDP on one model. Run under dtrun:
//   fsdp_bench ddp|fsdp|fsdp-noprefetch|fsdp-gloo [WIDTH] [BATCH] [REPS]
// (fsdp-gloo: FSDP's collectives through the process group rather than
// shared memory)
// on an MLP 784-WIDTH-WIDTH-WIDTH-10 (default 1024: 2.9M parameters), batch
// BATCH (default 32) per rank, SGD with momentum. Rank 0 prints one JSON
// line: median step time; bytes held between steps per rank (parameters +
// gradients + optimizer state; DDP's gradient buckets apart); peak RSS (max
// over ranks); for FSDP the time blocked on all-gathers/reduce-scatters per
// step, the same collectives' time on their own, and the share hidden.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "lib/ddp.h"
#include "lib/fsdp.h"
#include "lib/process_group.h"
#include "lib/parallel/shm_allreduce.h"
#include "tests/helpers/measure.h"

namespace {

using dtrun::testing::AllMax;
using dtrun::testing::MedianMs;
using dtrun::testing::PeakRssMb;

std::shared_ptr<torch::nn::SequentialImpl> Mlp(int width) {
  torch::manual_seed(0);
  return std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(784, width), torch::nn::ReLU(),
      torch::nn::Linear(width, width), torch::nn::ReLU(),
      torch::nn::Linear(width, width), torch::nn::ReLU(),
      torch::nn::Linear(width, 10));
}

int64_t Bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * t.element_size() : 0;
}

// FSDP's collectives of one step on their own, one after another: per unit
// an all-gather for forward, one for backward (all but the last unit are
// freed after forward) and a reduce-scatter, through `shm` (FSDP's own
// shared-memory collectives) or, when null, the process group (all-gather
// and all-to-all, as FSDP on gloo).
double CommAloneMs(dtrun::train::ProcessGroup& pg,
                   const std::vector<torch::Tensor>& shards,
                   dtrun::train::ShmAllreduce* shm) {
  const int64_t n = pg.getSize();
  return MedianMs(1, 5, [&] {
    for (size_t k = 0; k < shards.size(); ++k) {
      const int64_t s = shards[k].numel();
      auto full = torch::empty({s * n});
      for (int g = 0; g < (k + 1 < shards.size() ? 2 : 1); ++g) {
        if (shm) {
          std::memcpy(shm->region(), shards[k].data_ptr(), s * sizeof(float));
          shm->AllGather(s, full.data_ptr<float>(), std::chrono::seconds(60));
          continue;
        }
        std::vector<std::vector<torch::Tensor>> out(1);
        for (int64_t j = 0; j < n; ++j)
          out[0].push_back(full.narrow(0, j * s, s));
        std::vector<torch::Tensor> in{shards[k].detach()};
        pg.allgather(out, in)->wait();
      }
      if (shm) {
        auto mine = torch::empty({s});
        std::memcpy(shm->region(), full.data_ptr(), s * n * sizeof(float));
        shm->ReduceScatter(s, mine.data_ptr<float>(), std::chrono::seconds(60));
        continue;
      }
      auto recv = torch::empty({s * n});
      std::vector<int64_t> equal;
      pg.alltoall_base(recv, full, equal, equal)->wait();
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "fsdp";
  const int width = argc > 2 ? std::stoi(argv[2]) : 1024;
  const int batch = argc > 3 ? std::stoi(argv[3]) : 32;
  // REPS (default 15): the steps timed; more for a profiler
  const int reps = argc > 4 ? std::stoi(argv[4]) : 15;
  if (mode != "ddp" && mode != "fsdp" && mode != "fsdp-noprefetch" &&
      mode != "fsdp-gloo") {
    std::fprintf(stderr,
                 "usage: fsdp_bench ddp|fsdp|fsdp-noprefetch|fsdp-gloo [WIDTH] "
                 "[BATCH]\n");
    return 2;
  }
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  auto& pg = dist->pg();
  auto x = torch::randn({batch, 784});
  auto y = torch::randint(0, 10, {batch});
  auto model = Mlp(width);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  constexpr int kWarmup = 3;
  const int kReps = reps;
  double step_ms = 0, held = 0, exposed_ms = 0, comm_ms = 0;
  std::string transport;
  if (mode == "ddp") {
    dtrun::train::DistributedDataParallel ddp(model, &pg);
    transport = ddp.transport();
    torch::optim::SGD opt(model->parameters(),
                          torch::optim::SGDOptions(0.01).momentum(0.9));
    step_ms = MedianMs(kWarmup, kReps, [&] {
      opt.zero_grad();
      torch::cross_entropy_loss(model->forward(x), y).backward();
      ddp.SyncGradients();
      opt.step();
    });
    for (const auto& p : model->parameters())
      held += Bytes(p) + Bytes(p.grad());
    for (auto& [key, state] : opt.state()) {
      held += Bytes(
          static_cast<torch::optim::SGDParamState&>(*state).momentum_buffer());
    }
  } else {
    dtrun::train::FsdpOptions o;
    o.prefetch = mode != "fsdp-noprefetch";
    o.shared_memory = mode != "fsdp-gloo";
    dtrun::train::FullyShardedDataParallel fsdp(model, &pg, o);
    transport = fsdp.transport();
    torch::optim::SGD opt(fsdp.ShardParameters(),
                          torch::optim::SGDOptions(0.01).momentum(0.9));
    auto step = [&] {
      opt.zero_grad();
      torch::cross_entropy_loss(fsdp.Forward(x), y).backward();
      fsdp.SyncGradients();
      opt.step();
    };
    for (int i = 0; i < kWarmup; ++i) step();
    fsdp.TakeCommStats();
    step_ms = MedianMs(0, kReps, step);
    exposed_ms = fsdp.TakeCommStats().wait_s * 1000 / kReps;
    held = static_cast<double>(fsdp.HeldBytes(opt));
    auto shards = fsdp.ShardParameters();
    int64_t largest = 0;
    for (const auto& sh : shards) largest = std::max(largest, sh.numel());
    std::string why;
    std::unique_ptr<dtrun::train::ShmAllreduce> seg;
    if (transport == "shared memory") {
      seg = dtrun::train::OpenSharedMemoryAllreduce(
          pg, static_cast<size_t>(largest * pg.getSize()), &why);
    }
    comm_ms = CommAloneMs(pg, shards, seg.get());
  }
  held = AllMax(pg, held);
  step_ms = AllMax(pg, step_ms);
  const double rss = AllMax(pg, PeakRssMb());
  if (dist->rank() == 0) {
    std::printf(
        "{\"impl\": \"%s\", \"transport\": \"%s\", \"ranks\": %d, "
        "\"params\": %lld, \"step_ms\": %.2f, \"held_mb\": %.2f, "
        "\"peak_rss_mb\": %.0f",
        mode.c_str(), transport.c_str(), pg.getSize(), (long long)params,
        step_ms, held / 1e6, rss);
    if (mode != "ddp") {
      std::printf(
          ", \"comm_exposed_ms\": %.2f, \"comm_alone_ms\": %.2f, \"hidden\": "
          "%.3f",
          exposed_ms, comm_ms, std::clamp(1 - exposed_ms / comm_ms, 0.0, 1.0));
    }
    std::printf("}\n");
  }
  return 0;
}
