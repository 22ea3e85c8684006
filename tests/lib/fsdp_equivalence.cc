// Run under dtrun with N ranks. Same model, data and seed trained with our
// DDP and with FSDP for 20 steps; after SGD with momentum and after AdamW
// (and Adam with amsgrad) the gathered FSDP parameters match DDP's (relative
// error <= 1e-5). The model's parameter count is not divisible by 2 or 4 and
// the units have odd sizes, so every shard boundary and padding path runs.
// Also: two micro-batches per step, every wrap policy and reshard setting, a
// sharded state dict round trip, and bfloat16 compute staying close. On
// one host FSDP's collectives go through shared memory: the same bits as
// through gloo, checked exactly. And a model that is no Sequential (TreeNet:
// nested units, a module run twice, a tied weight, a frozen parameter and
// a buffer that differ by rank until rank 0's are taken), units by type,
// against DDP, with and without gradient sync between micro-batches. Prints
// "fsdp_equivalence: ... OK" on rank 0; exits 1 on a mismatch.
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <set>

#include "lib/ddp.h"
#include "lib/fsdp.h"
#include "lib/process_group.h"

namespace {

using dtrun::train::DistributedDataParallel;
using dtrun::train::FsdpOptions;
using dtrun::train::FullyShardedDataParallel;

constexpr int kBatch = 8, kIn = 13, kOut = 5, kSteps = 20;

std::shared_ptr<torch::nn::SequentialImpl> MakeModel() {
  torch::manual_seed(4321);
  // 13*17+17 = 238, 17*7+7 = 126, 7*5+5 = 40: 404 parameters in 3 units.
  return std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(kIn, 17), torch::nn::Tanh(), torch::nn::Linear(17, 7),
      torch::nn::ReLU(), torch::nn::Linear(7, kOut));
}

// This rank's rows of step `step`'s batch (each rank different).
std::pair<torch::Tensor, torch::Tensor> Batch(int step, int rank, int micro) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7000 + 100 * step +
                                                      10 * rank + micro);
  return {torch::randn({kBatch, kIn}, gen), torch::randn({kBatch, kOut}, gen)};
}

// Units by type: each Block, and the Inner inside it (one Inner module
// shared by both blocks: one unit run twice). The root holds `in` (its
// weight also the output projection: tied), `fixed` (frozen) and `scale`
// (a buffer).
struct InnerImpl : torch::nn::Module {
  InnerImpl() : a(register_module("a", torch::nn::Linear(9, 9))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(a(x)); }
  torch::nn::Linear a;
};
TORCH_MODULE(Inner);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(Inner shared)
      : fc(register_module("fc", torch::nn::Linear(9, 9))),
        inner(register_module("inner", shared)) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x + dtrun::train::ShardedCall(inner, fc(x));
  }
  torch::nn::Linear fc;
  Inner inner;
};
TORCH_MODULE(Block);

struct TreeNetImpl : torch::nn::Module {
  explicit TreeNetImpl(int rank) {
    in = register_module("in", torch::nn::Linear(kIn, 9));
    fixed = register_parameter("fixed", torch::randn({9}) + rank, false);
    scale = register_buffer("scale", torch::full({9}, 0.5 + rank));
    Inner shared;
    for (int b = 0; b < 2; ++b)
      blocks.push_back(register_module("b" + std::to_string(b), Block(shared)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = in(x)*scale + fixed;
    for (auto& b : blocks) h = dtrun::train::ShardedCall(b, h);
    return torch::nn::functional::linear(h, in->weight.t());
  }
  torch::nn::Linear in{nullptr};
  torch::Tensor fixed, scale;
  std::vector<Block> blocks;
};
TORCH_MODULE(TreeNet);

std::pair<torch::Tensor, torch::Tensor> TreeBatch(int step, int rank,
                                                  int micro) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9000 + 100 * step +
                                                      10 * rank + micro);
  return {torch::randn({kBatch, kIn}, gen), torch::randn({kBatch, kIn}, gen)};
}

std::vector<torch::Tensor> RunTree(dtrun::train::Distributed& dist,
                                   bool fsdp_on, int micro, bool sync_each) {
  torch::manual_seed(99);
  TreeNet net(dist.rank());
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  std::vector<torch::Tensor> params;
  if (fsdp_on) {
    FsdpOptions o;
    o.unit_types = {"Block", "Inner"};
    fsdp = std::make_unique<FullyShardedDataParallel>(
        net.ptr(), [&net](const torch::Tensor& x) { return net->forward(x); },
        &dist.pg(), o);
    params = fsdp->ShardParameters();
  } else {
    ddp = std::make_unique<DistributedDataParallel>(net.ptr(), &dist.pg());
    std::set<c10::TensorImpl*> seen;  // the shared Inner's, once
    for (auto& p : net->parameters())
      if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second)
        params.push_back(p);
  }
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(0.01));
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    for (int m = 0; m < micro; ++m) {
      auto [x, y] = TreeBatch(step, dist.rank(), m);
      const bool last = m + 1 == micro;
      if (fsdp) {
        fsdp->SetGradientSync(last || sync_each);
        torch::mse_loss(fsdp->Forward(x), y).div(micro).backward();
        fsdp->SyncGradients();
      } else if (!last) {
        DistributedDataParallel::NoSync no_sync(*ddp);
        torch::mse_loss(net->forward(x), y).div(micro).backward();
      } else {
        torch::mse_loss(net->forward(x), y).div(micro).backward();
        ddp->SyncGradients();
      }
    }
    opt.step();
    if (fsdp && step == kSteps / 2) {
      auto state = fsdp->StateDict(opt, /*full=*/false);
      fsdp->LoadStateDicts({state}, opt);
    }
  }
  if (fsdp) {
    torch::NoGradGuard no_grad;  // evaluation: every unit gathered and freed
    fsdp->Forward(TreeBatch(0, 0, 0).first);
    return fsdp->FullParameters();
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

using MakeOpt = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::Tensor>)>;

double MaxRelativeError(const std::vector<torch::Tensor>& a,
                        const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double diff = (a[i] - b[i]).abs().max().item<double>();
    double scale = std::max(b[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

std::vector<torch::Tensor> RunDdp(dtrun::train::Distributed& dist,
                                  const MakeOpt& make_opt, int micro) {
  auto model = MakeModel();
  DistributedDataParallel ddp(model, &dist.pg());
  auto opt = make_opt(model->parameters());
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    for (int m = 0; m < micro; ++m) {
      auto [x, y] = Batch(step, dist.rank(), m);
      auto loss = torch::mse_loss(model->forward(x), y) / micro;
      if (m + 1 < micro) {
        DistributedDataParallel::NoSync no_sync(ddp);
        loss.backward();
      } else {
        loss.backward();
      }
    }
    ddp.SyncGradients();
    opt->step();
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

std::vector<torch::Tensor> RunFsdp(dtrun::train::Distributed& dist,
                                   const MakeOpt& make_opt, int micro,
                                   FsdpOptions options,
                                   size_t* units = nullptr) {
  auto model = MakeModel();
  FullyShardedDataParallel fsdp(model, &dist.pg(), options);
  if (units) *units = fsdp.num_units();
  auto opt = make_opt(fsdp.ShardParameters());
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    for (int m = 0; m < micro; ++m) {
      auto [x, y] = Batch(step, dist.rank(), m);
      torch::mse_loss(fsdp.Forward(x), y).div(micro).backward();
      fsdp.SyncGradients();
    }
    opt->step();
    if (step == kSteps / 2) {
      // A sharded state dict round trip in mid-run changes nothing.
      auto state = fsdp.StateDict(*opt, /*full=*/false);
      fsdp.LoadStateDicts({state}, *opt);
    }
  }
  return fsdp.FullParameters();
}

int failures = 0;

void Expect(dtrun::train::Distributed& dist, const char* what, double err,
            double limit) {
  if (dist.rank() == 0) {
    std::printf("fsdp_equivalence: %-56s max rel. error %.3g (limit %.0e)\n",
                what, err, limit);
    std::fflush(stdout);
  }
  if (!(err <= limit)) ++failures;
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  auto dist = dtrun::train::Distributed::FromEnv();
  MakeOpt sgd = [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(
        p, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  MakeOpt adamw = [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(
        p, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  };
  size_t units = 0;
  auto ddp_sgd = RunDdp(*dist, sgd, 1);
  Expect(*dist, "SGD momentum, per-child units",
         MaxRelativeError(RunFsdp(*dist, sgd, 1, {}, &units), ddp_sgd), 1e-5);
  if (units != 3) ++failures;
  FsdpOptions keep;
  keep.reshard_after_forward = false;
  keep.prefetch = false;
  Expect(*dist, "SGD, no reshard after forward, no prefetch",
         MaxRelativeError(RunFsdp(*dist, sgd, 1, keep), ddp_sgd), 1e-5);
  FsdpOptions grouped;
  grouped.min_unit_params = 300;  // units {238+126, 40}
  Expect(*dist, "SGD, units by parameter count",
         MaxRelativeError(RunFsdp(*dist, sgd, 1, grouped, &units), ddp_sgd),
         1e-5);
  if (units != 2) ++failures;
  MakeOpt adam = [](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(
        p, torch::optim::AdamOptions(0.01).amsgrad(true));
  };
  Expect(*dist, "Adam (amsgrad)",
         MaxRelativeError(RunFsdp(*dist, adam, 1, {}), RunDdp(*dist, adam, 1)),
         1e-5);
  auto ddp_adamw = RunDdp(*dist, adamw, 1);
  Expect(*dist, "AdamW",
         MaxRelativeError(RunFsdp(*dist, adamw, 1, {}), ddp_adamw), 1e-5);
  Expect(
      *dist, "AdamW, 2 micro-batches per step",
      MaxRelativeError(RunFsdp(*dist, adamw, 2, {}), RunDdp(*dist, adamw, 2)),
      1e-5);
  {
    FullyShardedDataParallel probe(MakeModel(), &dist->pg());
    if (dist->world_size() > 1 && probe.transport() != "shared memory") {
      std::printf("fsdp_equivalence: rank %d: transport is %s\n", dist->rank(),
                  probe.transport().c_str());
      ++failures;
    }
  }
  FsdpOptions gloo;
  gloo.shared_memory = false;
  Expect(*dist, "SGD, shared memory vs gloo (bitwise)",
         MaxRelativeError(RunFsdp(*dist, sgd, 1, {}),
                          RunFsdp(*dist, sgd, 1, gloo)),
         0);
  Expect(*dist, "AdamW, 2 micro-batches, shared memory vs gloo (bitwise)",
         MaxRelativeError(RunFsdp(*dist, adamw, 2, {}),
                          RunFsdp(*dist, adamw, 2, gloo)),
         0);
  FsdpOptions bf16;
  bf16.param_dtype = "bfloat16";
  Expect(*dist, "SGD, bfloat16 compute (loose)",
         MaxRelativeError(RunFsdp(*dist, sgd, 1, bf16), ddp_sgd), 5e-2);
  bf16.reduce_dtype = "bfloat16";
  Expect(*dist, "SGD, bfloat16 compute and reduction (loose)",
         MaxRelativeError(RunFsdp(*dist, sgd, 1, bf16), ddp_sgd), 5e-2);
  auto ddp_tree = RunTree(*dist, false, 1, true);
  Expect(*dist, "a module tree: nested units by type, tied, frozen, buffer",
         MaxRelativeError(RunTree(*dist, true, 1, true), ddp_tree), 1e-5);
  auto ddp_tree2 = RunTree(*dist, false, 2, true);
  Expect(*dist, "the tree, 2 micro-batches, one reduce-scatter per step",
         MaxRelativeError(RunTree(*dist, true, 2, false), ddp_tree2), 1e-5);
  Expect(*dist, "the tree, 2 micro-batches, reduce-scatter each",
         MaxRelativeError(RunTree(*dist, true, 2, true), ddp_tree2), 1e-5);
  if (dist->rank() == 0)
    std::printf("fsdp_equivalence: %s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
