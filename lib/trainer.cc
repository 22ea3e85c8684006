#include "lib/trainer.h"

#include <signal.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "lib/checkpoint.h"
#include "lib/data.h"
#include "lib/ddp.h"
#include "lib/process_group.h"
#include "lib/sha256.h"

namespace dtrun::train {
namespace {

std::shared_ptr<torch::nn::SequentialImpl> MakeModel(const TrainConfig& c, int features,
                                                     int classes) {
  torch::manual_seed(c.seed);
  auto seq = std::make_shared<torch::nn::SequentialImpl>();
  if (c.model == "cnn") {
    if (features != 64) throw Error("model 'cnn' needs 8x8 inputs (data = \"digits\")");
    seq->push_back(torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {1, 8, 8})));
    seq->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)));
    seq->push_back(torch::nn::ReLU());
    seq->push_back(torch::nn::MaxPool2d(2));
    seq->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
    seq->push_back(torch::nn::ReLU());
    seq->push_back(torch::nn::Flatten());
    seq->push_back(torch::nn::Linear(32 * 4 * 4, classes));
    return seq;
  }
  if (c.model != "mlp") throw Error("model.type '" + c.model + "': use \"mlp\" or \"cnn\"");
  int in = features;
  for (int h : c.hidden) {
    seq->push_back(torch::nn::Linear(in, h));
    seq->push_back(torch::nn::ReLU());
    in = h;
  }
  seq->push_back(torch::nn::Linear(in, classes));
  return seq;
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const TrainConfig& c,
                                                       std::vector<torch::Tensor> params) {
  if (c.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  }
  if (c.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  throw Error("optimizer.type '" + c.optimizer + "': use \"sgd\" or \"adamw\"");
}

double LearningRate(const TrainConfig& c, int64_t step) {
  double lr = c.lr;
  if (c.warmup_steps > 0 && step < c.warmup_steps) return lr * (step + 1) / c.warmup_steps;
  if (c.schedule == "cosine") {
    double t = double(step - c.warmup_steps) / std::max<int64_t>(1, c.steps - c.warmup_steps);
    lr *= 0.5 * (1 + std::cos(M_PI * std::min(1.0, t)));
  }
  return lr;
}

void SetLearningRate(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

torch::Tensor Rows(const Dataset& d, const std::vector<int64_t>& idx, torch::Tensor* labels) {
  auto x = torch::empty({static_cast<int64_t>(idx.size()), d.features});
  auto y = torch::empty({static_cast<int64_t>(idx.size())}, torch::kLong);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (size_t i = 0; i < idx.size(); ++i) {
    std::copy_n(d.x.begin() + idx[i] * d.features, d.features, xp + i * d.features);
    yp[i] = d.y[static_cast<size_t>(idx[i])];
  }
  *labels = y;
  return x;
}

double Accuracy(torch::nn::SequentialImpl& model, const Dataset& test) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> all(test.rows());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  torch::Tensor y;
  torch::Tensor x = Rows(test, all, &y);
  auto pred = model.forward(x).argmax(1);
  return pred.eq(y).sum().item<double>() / static_cast<double>(test.rows());
}

std::string ParamsSha256(torch::nn::Module& model) {
  Sha256 h;
  for (const auto& p : model.parameters()) {
    auto c = p.detach().contiguous();
    h.Update(c.data_ptr(), c.numel() * c.element_size());
  }
  return h.HexDigest();
}

std::string Save(torch::nn::Module& model, torch::optim::Optimizer& opt, int64_t step) {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive m, o;
  model.save(m);
  opt.save(o);
  archive.write("model", m);
  archive.write("optimizer", o);
  archive.write("step", torch::tensor(step));
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

int64_t Restore(const std::string& payload, torch::nn::Module& model,
                torch::optim::Optimizer& opt) {
  std::istringstream in(payload);
  torch::serialize::InputArchive archive, m, o;
  archive.load_from(in);
  archive.read("model", m);
  archive.read("optimizer", o);
  model.load(m);
  opt.load(o);
  torch::Tensor step;
  archive.read("step", step);
  return step.item<int64_t>();
}

double AllMean(c10d::ProcessGroup& pg, double v) {
  std::vector<torch::Tensor> t{torch::tensor({v}, torch::kDouble)};
  pg.allreduce(t)->wait();
  return t[0].item<double>() / pg.getSize();
}

}  // namespace

int Train(const TrainConfig& c) {
  torch::set_num_threads(1);
  auto dist = Distributed::FromEnv();
  const int rank = dist->rank(), world = dist->world_size();
  Dataset all;
  if (c.data == "digits") {
    auto loaded = LoadDigits(c.digits_path);
    if (!loaded.ok()) throw Error(loaded.status().message());
    all = std::move(*loaded);
  } else if (c.data == "synthetic") {
    all = MakeSynthetic(c.synthetic_samples, c.synthetic_features, c.synthetic_classes, c.seed);
  } else {
    throw Error("data.source '" + c.data + "': use \"digits\" or \"synthetic\"");
  }
  Dataset train, test;
  SplitTrainTest(all, c.test_fraction, &train, &test);

  auto model = MakeModel(c, all.features, all.classes);
  DdpOptions dopts;
  dopts.bucket_cap_mb = c.bucket_cap_mb;
  DistributedDataParallel ddp(model, &dist->pg(), dopts);
  auto opt = MakeOptimizer(c, model->parameters());

  int64_t start = 0;
  std::unique_ptr<CheckpointDir> ckpt;
  if (!c.checkpoint_dir.empty()) {
    ckpt = std::make_unique<CheckpointDir>(c.checkpoint_dir, c.keep_checkpoints);
    std::vector<std::string> skipped;
    auto loaded = ckpt->LoadLatest(&skipped);
    for (const auto& s : skipped) std::fprintf(stderr, "checkpoint skipped: %s\n", s.c_str());
    if (loaded) {
      start = Restore(loaded->payload, *model, *opt);
      if (rank == 0) std::printf("resumed from %s at step %lld\n", loaded->path.c_str(), (long long)start);
    }
  }
  std::ofstream metrics;
  if (rank == 0 && !c.metrics_path.empty()) metrics.open(c.metrics_path, std::ios::app);
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  bool first_attempt = !restart || std::string(restart) == "0";

  double loss_value = 0;
  auto window_start = std::chrono::steady_clock::now();
  int64_t window_samples = 0;
  for (int64_t step = start; step < c.steps; ++step) {
    SetLearningRate(*opt, LearningRate(c, step));
    opt->zero_grad();
    double step_loss = 0;
    for (int m = 0; m < c.accumulate; ++m) {
      torch::Tensor y;
      auto idx = StepIndices(train.rows(), c.batch_size, world, rank, step * c.accumulate + m,
                             c.seed, c.drop_last);
      auto x = Rows(train, idx, &y);
      auto loss = torch::cross_entropy_loss(model->forward(x), y) / c.accumulate;
      step_loss += loss.item<double>();
      if (m + 1 < c.accumulate) {
        DistributedDataParallel::NoSync no_sync(ddp);
        loss.backward();
      } else {
        loss.backward();
      }
    }
    ddp.SyncGradients();
    opt->step();
    loss_value = AllMean(dist->pg(), step_loss);
    window_samples += static_cast<int64_t>(c.batch_size) * c.accumulate * world;
    const int64_t done = step + 1;
    if (ckpt && (done % c.checkpoint_every == 0 || done == c.steps)) {
      if (rank == 0) {
        Status s = ckpt->Write(done, Save(*model, *opt, done));
        if (!s.ok()) throw Error("checkpoint at step " + std::to_string(done) + ": " + s.message());
      }
      dist->pg().barrier()->wait();  // nobody runs ahead of a checkpoint in progress
    }
    if (rank == 0 && (done % c.log_every == 0 || done == c.steps)) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      std::printf("step %lld loss %.6f lr %.5f samples/s %.0f\n", (long long)done, loss_value,
                  LearningRate(c, step), window_samples / std::max(secs, 1e-9));
      std::fflush(stdout);
      if (metrics) {
        metrics << "{\"step\": " << done << ", \"loss\": " << loss_value
                << ", \"samples_per_s\": " << window_samples / std::max(secs, 1e-9) << "}\n";
        metrics.flush();
      }
      window_start = std::chrono::steady_clock::now();
      window_samples = 0;
    }
    if (c.eval_every > 0 && done % c.eval_every == 0 && rank == 0) {
      double acc = Accuracy(*model, test);
      std::printf("step %lld eval_accuracy %.4f\n", (long long)done, acc);
      std::fflush(stdout);
      if (metrics) metrics << "{\"step\": " << done << ", \"eval_accuracy\": " << acc << "}\n";
    }
    if (first_attempt && rank == c.kill_rank && done == c.kill_at_step) {
      std::fprintf(stderr, "fault injection: rank %d kills itself after step %lld\n", rank,
                   (long long)done);
      raise(SIGKILL);
    }
    if (done == c.stop_after_step) {
      if (rank == 0) std::printf("stopped after step %lld\n", (long long)done);
      return 0;
    }
  }
  if (rank == 0) {
    std::printf("done: steps=%lld loss=%.9g eval_accuracy=%.4f params_sha256=%s\n",
                (long long)c.steps, loss_value, Accuracy(*model, test),
                ParamsSha256(*model).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace dtrun::train
