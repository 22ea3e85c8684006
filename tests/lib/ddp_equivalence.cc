// Run under dtrun with N ranks. Checks, on every rank:
//  1. DDP with batch B per rank for 20 SGD steps ends with the parameters of
//     one process trained on the whole N*B batch (relative error <= 1e-5);
//  2. no_sync accumulation over k micro-batches equals one step on the
//     k-times batch;
// both with the shared-memory all-reduce (ranks on one host) and through
// the process group;
//  3. a model whose layers are float64, bfloat16 and float32 (each rank
//     initialised differently: the broadcast must carry every dtype) ends a
//     step with each gradient the mean of every rank's own, computed here:
//     float64 and float32 to 1e-12 and 1e-6, bfloat16 within one unit in
//     its last place;
//  4. a wait in slices (WaitUnlessGroupBroken: DDP's and FSDP's on gloo)
//     outlasts its slices: the last rank joins an all-reduce 350 ms late,
//     and every rank gets the sum.
// Prints "ddp_equivalence: ... OK" on rank 0; exits 1 on a mismatch.
// With --torch DIR, runs 3. only and rank 0 writes, for PyTorch's own DDP to
// be run on the same start and batch (tests/lib/ddp_torch_peer.py):
// DIR/start.pt (rank 0's parameters, the batch) and DIR/ours.pt (the
// gradients after DDP's all-reduce), torch.save's format.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "lib/ddp.h"
#include "lib/parallel/in_place.h"
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

// Three layers of three dtypes; the input is cast to each layer's.
struct MixedImpl : torch::nn::Module {
  explicit MixedImpl(int seed) {
    torch::manual_seed(seed);
    a = register_module("a", torch::nn::Linear(kIn, 9));
    b = register_module("b", torch::nn::Linear(9, 7));
    c = register_module("c", torch::nn::Linear(7, kOut));
    a->to(torch::kFloat64);
    b->to(torch::kBFloat16);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(a->forward(x.to(torch::kFloat64)));
    x = torch::tanh(b->forward(x.to(torch::kBFloat16)));
    return c->forward(x.to(torch::kFloat32));
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(Mixed);

// `tensors` by name into `path` as torch.save writes a dict of them.
void SaveForTorch(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().clone());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
      std::fclose(f) != 0) {
    std::fprintf(stderr, "ddp_equivalence: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// The worst error of DDP's gradients against the mean of each rank's own,
// relative to the gradient's scale, by dtype; "" when all are in bounds.
// `torch_dir`: rank 0 also writes the start and the gradients there.
std::string MixedDtypes(dtrun::train::Distributed& dist,
                        const std::string& torch_dir = "") {
  const int n = dist.world_size(), r = dist.rank();
  Mixed model(1234 + r), reference(1234);
  auto [x, y] = Batch(0, n * kBatch);
  if (!torch_dir.empty() && r == 0) {
    auto start = model->named_parameters().pairs();
    start.push_back({"x", x});
    start.push_back({"y", y});
    SaveForTorch({start.begin(), start.end()}, torch_dir + "/start.pt");
  }
  dtrun::train::DdpOptions opts;
  opts.bucket_cap_mb = 0.0005;
  DistributedDataParallel ddp(model.ptr(), &dist.pg(), opts);
  auto rows = [&](const torch::Tensor& t, int rank) {
    return t.view({n, kBatch, t.size(1)}).select(0, rank);
  };
  torch::mse_loss(model->forward(rows(x, r)), rows(y, r)).backward();
  ddp.SyncGradients();
  if (!torch_dir.empty() && r == 0) {
    std::vector<std::pair<std::string, at::Tensor>> grads;
    for (const auto& p : model->named_parameters())
      grads.push_back({p.key(), p.value().grad()});
    SaveForTorch(grads, torch_dir + "/ours.pt");
  }
  auto mine = model->parameters(), ref = reference->parameters();
  std::vector<torch::Tensor> sum(ref.size());
  for (int rank = 0; rank < n; ++rank) {
    for (auto& p : ref) p.mutable_grad() = torch::Tensor();
    torch::mse_loss(reference->forward(rows(x, rank)), rows(y, rank))
        .backward();
    for (size_t i = 0; i < ref.size(); ++i) {
      auto g = ref[i].grad().to(torch::kFloat64);
      sum[i] = rank == 0 ? g : sum[i] + g;
    }
  }
  std::string bad;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!torch::equal(mine[i].detach(), ref[i].detach())) {
      bad += " parameter " + std::to_string(i) + " not rank 0's;";
      continue;
    }
    auto want = (sum[i] / n).to(ref[i].scalar_type()).to(torch::kFloat64);
    double scale = std::max(want.abs().max().item<double>(), 1e-12);
    double err =
        (mine[i].grad().to(torch::kFloat64) - want).abs().max().item<double>() /
        scale;
    const auto t = ref[i].scalar_type();
    double bound = t == torch::kFloat64 ? 1e-12
                   : t == torch::kFloat32
                       ? 1e-6
                       : 1.0 / 128;  // 2 bf16 ulps of the max
    if (err > bound) {
      char line[96];
      std::snprintf(line, sizeof line, " parameter %zu (%s): error %.3g;", i,
                    c10::toString(t), err);
      bad += line;
    }
  }
  return bad;
}

bool SlicedWaitOutlastsItsSlices(dtrun::train::Distributed& dist) {
  if (dist.rank() == dist.world_size() - 1 && dist.world_size() > 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
  std::vector<at::Tensor> t{torch::ones({4})};
  dtrun::train::WaitUnlessGroupBroken(dist.pg().allreduce(t), true, "test");
  return t[0].eq(dist.world_size()).all().item<bool>();
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  if (argc == 3 && std::string(argv[1]) == "--torch") {
    const std::string bad = MixedDtypes(*dist, argv[2]);
    if (!bad.empty())
      std::printf("ddp_equivalence: MISMATCH:%s\n", bad.c_str());
    return bad.empty() ? 0 : 1;
  }
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
  const bool sliced = SlicedWaitOutlastsItsSlices(*dist);
  std::printf("ddp_equivalence: rank %d of %d: a wait in slices %s\n",
              dist->rank(), dist->world_size(),
              sliced ? "outlasts its slices OK" : "MISMATCH");
  ok = ok && sliced;
  const std::string mixed = MixedDtypes(*dist);
  std::printf(
      "ddp_equivalence: rank %d of %d: float64, bfloat16 and float32 "
      "layers: %s\n",
      dist->rank(), dist->world_size(),
      mixed.empty() ? "each gradient the mean of the ranks' OK"
                    : ("MISMATCH:" + mixed).c_str());
  return ok && mixed.empty() ? 0 : 1;
}
