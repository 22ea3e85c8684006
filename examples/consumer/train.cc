// A small trainer of its own, using an installed dtrun: linear regression
// with DDP on the process group dtrun's environment describes. Each rank
// trains on its own slice of every batch; DDP averages the gradients, so all
// ranks end with the same weights. Prints, per rank,
//   consumer: rank R of N steps=S loss=L weights_sum=W
// and exits 1 when the loss did not fall 100-fold.
#include <torch/torch.h>

#include <cstdio>

#include "lib/ddp.h"
#include "lib/process_group.h"

namespace {

constexpr int kFeatures = 16, kBatchPerRank = 32, kSteps = 200;

// Every rank draws the same global batch of `step` and keeps its own rows.
std::pair<torch::Tensor, torch::Tensor> Slice(int step, int rank, int world,
                                              const torch::Tensor& w_true) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  auto x = torch::randn({world * kBatchPerRank, kFeatures}, gen);
  auto y = x.matmul(w_true) + 0.5;
  return {x.narrow(0, rank * kBatchPerRank, kBatchPerRank),
          y.narrow(0, rank * kBatchPerRank, kBatchPerRank)};
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  const int rank = dist->rank(), world = dist->world_size();

  torch::manual_seed(
      rank);  // different starts: DDP broadcasts rank 0's weights
  auto model = std::make_shared<torch::nn::LinearImpl>(kFeatures, 1);
  dtrun::train::DistributedDataParallel ddp(model, &dist->pg());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  auto w_true = torch::linspace(-1, 1, kFeatures).unsqueeze(1);

  double first = 0, last = 0;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = Slice(step, rank, world, w_true);
    opt.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    ddp.SyncGradients();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  double weights_sum = 0;
  for (const auto& p : model->parameters())
    weights_sum += p.sum().item<double>();
  std::printf("consumer: rank %d of %d steps=%d loss=%.6g weights_sum=%.9g\n",
              rank, world, kSteps, last, weights_sum);
  if (!(last * 100 < first)) {
    std::fprintf(
        stderr,
        "consumer: rank %d: loss went from %g to %g, not 100-fold down\n", rank,
        first, last);
    return 1;
  }
  return 0;
}
