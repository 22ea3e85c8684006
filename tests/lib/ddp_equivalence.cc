// Run under dtrun with N ranks. Checks, on every rank:
//  1. DDP with batch B per rank for 20 SGD steps ends with the parameters of
//     one process trained on the whole N*B batch (relative error <= 1e-5);
//  2. no_sync accumulation over k micro-batches equals one step on the
//     k-times batch;
// both with the shared-memory all-reduce (ranks on one host) and through
// the process group.
// Prints "ddp_equivalence: ... OK" on rank 0; exits 1 on a mismatch.
#include <torch/torch.h>

#include <cstdio>

#include "lib/ddp.h"
#include "lib/process_group.h"

namespace {

using dtrun::train::DistributedDataParallel;

constexpr int kBatch = 8, kIn = 12, kOut = 3, kSteps = 20;

std::shared_ptr<torch::nn::SequentialImpl> MakeModel() {
  torch::manual_seed(
      1234);  // identical start on every rank (and DDP broadcasts anyway)
  // 12*33+33 + 33*17+17 + 17*3+3 = 1032 parameters: not a multiple of N.
  return std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(kIn, 33), torch::nn::Tanh(), torch::nn::Linear(33, 17),
      torch::nn::Tanh(), torch::nn::Linear(17, kOut));
}

// The global batch of step `step`: the same on every rank.
std::pair<torch::Tensor, torch::Tensor> Batch(int step, int rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  auto x = torch::randn({rows, kIn}, gen);
  auto y = torch::randn({rows, kOut}, gen);
  return {x, y};
}

double MaxRelativeError(torch::nn::Module& a, torch::nn::Module& b) {
  double worst = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    double diff = (pa[i] - pb[i]).abs().max().item<double>();
    double scale = std::max(pb[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

double TrainAndCompare(dtrun::train::Distributed& dist, int accumulate,
                       bool shared_memory) {
  const int n = dist.world_size(), r = dist.rank();
  auto model = MakeModel();
  auto reference = MakeModel();
  dtrun::train::DdpOptions opts;
  opts.bucket_cap_mb = 0.002;  // several buckets even for this small model
  opts.shared_memory = shared_memory;
  DistributedDataParallel ddp(model, &dist.pg(), opts);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(),
                            torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = Batch(step, n * kBatch * accumulate);
    // Reference: one process, the whole batch.
    ref_opt.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    ref_opt.step();
    // DDP: this rank's rows, in `accumulate` micro-batches.
    opt.zero_grad();
    auto mine_x = x.view({accumulate, n, kBatch, kIn}).select(1, r);
    auto mine_y = y.view({accumulate, n, kBatch, kOut}).select(1, r);
    for (int m = 0; m < accumulate; ++m) {
      auto loss =
          torch::mse_loss(model->forward(mine_x[m]), mine_y[m]) / accumulate;
      if (m + 1 < accumulate) {
        DistributedDataParallel::NoSync no_sync(ddp);
        loss.backward();
      } else {
        loss.backward();
      }
    }
    ddp.SyncGradients();
    opt.step();
  }
  if (r == 0) {
    std::printf("ddp_equivalence: %zu buckets, all-reduced through %s\n",
                ddp.num_buckets(), ddp.transport().c_str());
  }
  // One process needs no all-reduce; two or more on this host share memory.
  if (ddp.transport() !=
      (shared_memory && n > 1 ? "shared memory" : "process group"))
    return 1.0;
  return MaxRelativeError(*model, *reference);
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  bool ok = true;
  for (bool shm : {true, false}) {
    double plain = TrainAndCompare(*dist, 1, shm);
    double accumulated = TrainAndCompare(*dist, 3, shm);
    bool good = plain <= 1e-5 && accumulated <= 1e-5;
    ok = ok && good;
    std::printf(
        "ddp_equivalence: rank %d of %d (%s): max relative error %.3g (batch "
        "%d per "
        "rank), %.3g (no_sync, 3 micro-batches) %s\n",
        dist->rank(), dist->world_size(),
        shm ? "shared memory allowed" : "process group", plain, kBatch,
        accumulated, good ? "OK" : "MISMATCH");
  }
  return ok ? 0 : 1;
}
