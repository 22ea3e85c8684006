// A model of one's own through the library's trainer, from an installed
// dtrun: a residual regression net (not a Sequential), batches drawn as a
// pure function of (seed, micro-batch, rank), a loss and a metric of its
// own, and its own state in every checkpoint (an exponential average of
// the loss). DDP, async checkpoints, the resume every rank agrees on, the
// heartbeat dtrun's --hang-timeout reads: the library's. Run as
//   dtrun --nproc-per-node=2 [--max-restarts=1] consumer_trainer CKPT_DIR
//   [KILL_AT_STEP [MODE]]
// With KILL_AT_STEP, rank 1 SIGKILLs itself after that step on the first
// attempt: the restart resumes, and the run ends on the same bits as an
// unbroken one. MODE: the checkpoint mode, async (the default), sync or
// memory. Rank 0's last lines:
//   done: steps=N loss=L val_mse=V params_sha256=H
//   consumer_trainer: loss_ema=E
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "lib/trainer.h"

namespace {

constexpr int kFeatures = 16;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : hidden(register_module("hidden", torch::nn::Linear(kFeatures, 32))),
        out(register_module("out", torch::nn::Linear(32, 1))),
        skip(register_module("skip", torch::nn::Linear(kFeatures, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return out(torch::tanh(hidden(x))) + skip(x);
  }
  torch::nn::Linear hidden, out, skip;
};
TORCH_MODULE(Net);

// Rows of a fixed target function with noise, from a generator seeded by
// what names the rows: the same rows on any attempt.
std::pair<torch::Tensor, torch::Tensor> Rows(uint64_t seed, int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({n, kFeatures}, gen);
  auto w = torch::linspace(-1, 1, kFeatures).unsqueeze(1);
  auto y = torch::sin(x.matmul(w)) + 0.05 * torch::randn({n, 1}, gen);
  return {x, y};
}

// The loop's settings: DDP on gloo, AdamW, checkpoints every 25 steps in
// `mode` (async unless given).
dtrun::train::TrainConfig Config(const char* dir) {
  dtrun::train::TrainConfig c;
  c.steps = 120;
  c.batch_size = 32;
  c.optimizer = dtrun::train::OptimizerKind::kAdamW;
  c.lr = 0.01;
  c.log_every = 40;
  c.eval_every = 40;
  c.checkpoint_dir = dir;
  c.checkpoint_every = 25;
  c.checkpoint_mode = dtrun::train::CheckpointMode::kAsync;
  c.backend = "gloo";
  c.device = "cpu";
  return c;
}

// The model, batches, loss, metric and state; `loss_ema` is the state, and
// rank 1 kills itself after step `kill_at` on the first attempt.
dtrun::train::TrainParts Parts(double* loss_ema, long kill_at, bool kill) {
  dtrun::train::TrainParts parts;
  parts.model = [] { return dtrun::train::Model::Of(Net()); };
  parts.batch = [](const dtrun::train::BatchRequest& r) {
    auto [x, y] =
        Rows(r.seed * 1000003 + r.micro, int64_t{r.world} * r.batch_size);
    return dtrun::train::Batch{
        x.narrow(0, int64_t{r.rank} * r.batch_size, r.batch_size),
        y.narrow(0, int64_t{r.rank} * r.batch_size, r.batch_size)};
  };
  parts.loss = [](const torch::Tensor& out, const torch::Tensor& y) {
    return torch::mse_loss(out, y);
  };
  parts.evaluate = [](const dtrun::train::Forward& forward, torch::Device) {
    auto [x, y] = Rows(7, 512);  // held out: a seed no batch uses
    return std::map<std::string, double>{
        {"val_mse", torch::mse_loss(forward(x), y).item<double>()}};
  };
  parts.on_step_end = [loss_ema, kill_at,
                       kill](const dtrun::train::StepEnd& s) {
    *loss_ema = s.step == 1 ? s.loss : 0.9 * *loss_ema + 0.1 * s.loss;
    if (kill && s.step == kill_at) raise(SIGKILL);
  };
  parts.save_state = [loss_ema] {
    return dtrun::train::UserState{
        {"loss_ema", torch::tensor({*loss_ema}, torch::kDouble)}};
  };
  parts.load_state = [loss_ema](const dtrun::train::UserState& s) {
    *loss_ema = s.at("loss_ema").item<double>();
  };
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: consumer_trainer CKPT_DIR [KILL_AT_STEP [MODE]]\n");
    return 2;
  }
  dtrun::train::TrainConfig c = Config(argv[1]);
  if (argc > 3) {
    std::string err = dtrun::train::ParseChoice("checkpoint.mode", argv[3],
                                                &c.checkpoint_mode);
    if (!err.empty()) {
      std::fprintf(stderr, "consumer_trainer: %s\n", err.c_str());
      return 2;
    }
  }
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const char* rank_env = std::getenv("RANK");
  const int rank = rank_env ? std::atoi(rank_env) : 0;
  const bool kill =
      argc > 2 && rank == 1 && (!restarts || std::string(restarts) == "0");
  double loss_ema = 0;
  try {
    const int rc = dtrun::train::Train(
        c, Parts(&loss_ema, argc > 2 ? std::atol(argv[2]) : -1, kill));
    if (rank == 0) std::printf("consumer_trainer: loss_ema=%.9g\n", loss_ema);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer_trainer: %s\n", e.what());
    return 1;
  }
}
