#include "lib/trainer.h"

#include <signal.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "lib/checkpoint.h"
#include "lib/data.h"
#include "lib/ddp.h"
#include "lib/fsdp.h"
#include "lib/process_group.h"
#include "lib/sha256.h"
#include "rendezvous/heartbeat.h"

namespace dtrun::train {
namespace {

// Fault injection: stop beating and wait forever, as a wedged rank does.
[[gnu::noinline]] void HangForever(int rank, int64_t step) {
  std::fprintf(stderr, "fault injection: rank %d hangs after step %lld\n", rank, (long long)step);
  for (;;) pause();
}

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
  int in = features;  // "mlp" (ValidateConfig allows nothing else)
  for (int h : c.hidden) {
    seq->push_back(torch::nn::Linear(in, h));
    seq->push_back(torch::nn::ReLU());
    if (c.dropout > 0) seq->push_back(torch::nn::Dropout(c.dropout));
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
  if (c.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(  // "adamw", the one choice left
      params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
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

torch::Tensor Rows(const Dataset& d, const std::vector<int64_t>& idx, torch::Tensor* labels,
                   torch::Device device) {
  auto x = torch::empty({static_cast<int64_t>(idx.size()), d.features});
  auto y = torch::empty({static_cast<int64_t>(idx.size())}, torch::kLong);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (size_t i = 0; i < idx.size(); ++i) {
    std::copy_n(d.x.begin() + idx[i] * d.features, d.features, xp + i * d.features);
    yp[i] = d.y[static_cast<size_t>(idx[i])];
  }
  *labels = y.to(device);
  return x.to(device);
}

template <typename Forward>
double Accuracy(torch::nn::SequentialImpl& model, const Dataset& test, torch::Device device,
                Forward forward) {
  torch::NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> all(test.rows());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  torch::Tensor y;
  torch::Tensor x = Rows(test, all, &y, device);
  torch::Tensor pred = forward(x).argmax(1);
  model.train();
  return pred.eq(y).sum().item<double>() / static_cast<double>(test.rows());
}

std::string Sha256Of(const std::vector<torch::Tensor>& params) {
  Sha256 h;
  for (const auto& p : params) {
    auto c = p.detach().to(torch::kCPU).contiguous();
    h.Update(c.data_ptr(), c.numel() * c.element_size());
  }
  return h.HexDigest();
}

double AllMean(ProcessGroup& pg, double v, torch::Device device) {
  std::vector<torch::Tensor> t{torch::tensor({v}, torch::kDouble).to(device)};
  pg.allreduce(t)->wait();
  return t[0].item<double>() / pg.getSize();
}

// Every rank's CPU generator state, gathered (collective).
std::vector<torch::Tensor> GatherRngStates(ProcessGroup& pg, torch::Device device) {
  torch::Tensor mine = at::detail::getDefaultCPUGenerator().get_state().to(device);
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < pg.getSize(); ++r) out[0].push_back(torch::empty_like(mine));
  std::vector<torch::Tensor> in{mine};
  pg.allgather(out, in)->wait();
  for (auto& t : out[0]) t = t.to(torch::kCPU);
  return out[0];
}

std::string Serialize(const std::map<std::string, torch::Tensor>& tensors) {
  torch::serialize::OutputArchive archive;
  for (const auto& [key, t] : tensors) archive.write(key, t);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::map<std::string, torch::Tensor> Deserialize(const std::string& payload) {
  std::istringstream in(payload);
  torch::serialize::InputArchive archive;
  archive.load_from(in, torch::kCPU);
  std::map<std::string, torch::Tensor> out;
  for (const auto& key : archive.keys()) {
    torch::Tensor t;
    if (archive.try_read(key, t)) out[key] = t;
  }
  return out;
}

torch::Tensor Blob(const std::string& s) {
  auto t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

std::string Text(const torch::Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
}

// What differs between DDP and FSDP in the loop and in checkpoints.
class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual torch::Tensor Forward(const torch::Tensor& x) = 0;
  // One micro-batch's backward; `last`: the step's last micro-batch.
  virtual void Backward(const torch::Tensor& loss, bool last) = 0;
  virtual std::vector<torch::Tensor> OptimizerParams() = 0;
  // Full parameters in model->parameters() order (collective for FSDP).
  virtual std::vector<torch::Tensor> FullParams() = 0;
  // Whether evaluation is collective (every rank runs it).
  virtual bool CollectiveEval() const = 0;
  // Checkpoint (collective): writes any per-rank files, then returns the
  // tensors of the step's file, which rank 0 writes last.
  virtual std::map<std::string, torch::Tensor> Save(torch::optim::Optimizer& opt,
                                                    const CheckpointDir& dir, int64_t step) = 0;
  // Whether a checkpoint's other files are there and verify (every rank
  // reaches the same verdict: they read the same files). Restore() follows
  // the Complete() that accepted, for the same step.
  virtual Status Complete(const std::map<std::string, torch::Tensor>& main,
                          const CheckpointDir& dir, int64_t step) = 0;
  virtual void Restore(const std::map<std::string, torch::Tensor>& main, const CheckpointDir& dir,
                       int64_t step, torch::optim::Optimizer& opt) = 0;
};

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(std::shared_ptr<torch::nn::SequentialImpl> model, ProcessGroup* pg,
              const TrainConfig& c)
      : model_(model), ddp_(model, pg, Options(c)) {}

  torch::Tensor Forward(const torch::Tensor& x) override { return model_->forward(x); }
  void Backward(const torch::Tensor& loss, bool last) override {
    if (last) {
      loss.backward();
      ddp_.SyncGradients();
    } else {
      DistributedDataParallel::NoSync no_sync(ddp_);
      loss.backward();
    }
  }
  std::vector<torch::Tensor> OptimizerParams() override { return model_->parameters(); }
  std::vector<torch::Tensor> FullParams() override { return model_->parameters(); }
  bool CollectiveEval() const override { return false; }

  std::map<std::string, torch::Tensor> Save(torch::optim::Optimizer& opt, const CheckpointDir&,
                                            int64_t) override {
    torch::serialize::OutputArchive m, o;
    model_->save(m);
    opt.save(o);
    std::ostringstream ms, os;
    m.save_to(ms);
    o.save_to(os);
    return {{"model", Blob(ms.str())}, {"optimizer", Blob(os.str())}};
  }
  Status Complete(const std::map<std::string, torch::Tensor>& main, const CheckpointDir& dir,
                  int64_t) override {
    if (!main.count("model") || !main.count("optimizer")) {
      throw Error(dir.dir() + " holds checkpoints of an FSDP run (strategy = \"fsdp\"); resume "
                  "it with strategy.type=\"fsdp\" or give this DDP run another checkpoint.dir");
    }
    return Status::Ok();
  }
  void Restore(const std::map<std::string, torch::Tensor>& main, const CheckpointDir&, int64_t,
               torch::optim::Optimizer& opt) override {
    torch::Device device = model_->parameters().front().device();
    torch::serialize::InputArchive m, o;
    std::istringstream ms(Text(main.at("model"))), os(Text(main.at("optimizer")));
    m.load_from(ms, device);
    o.load_from(os, device);
    model_->load(m);
    opt.load(o);
  }

 private:
  static DdpOptions Options(const TrainConfig& c) {
    DdpOptions o;
    o.bucket_cap_mb = c.bucket_cap_mb;
    return o;
  }

  std::shared_ptr<torch::nn::SequentialImpl> model_;
  DistributedDataParallel ddp_;
};

class FsdpStrategy : public Strategy {
 public:
  FsdpStrategy(std::shared_ptr<torch::nn::SequentialImpl> model, ProcessGroup* pg,
               const TrainConfig& c)
      : pg_(pg), full_format_(c.checkpoint_format == "full"), fsdp_(model, pg, Options(c)) {}

  torch::Tensor Forward(const torch::Tensor& x) override { return fsdp_.Forward(x); }
  void Backward(const torch::Tensor& loss, bool) override {
    loss.backward();
    fsdp_.SyncGradients();  // every micro-batch's gradients accumulate in the shards
  }
  std::vector<torch::Tensor> OptimizerParams() override { return fsdp_.ShardParameters(); }
  std::vector<torch::Tensor> FullParams() override { return fsdp_.FullParameters(); }
  bool CollectiveEval() const override { return true; }

  std::map<std::string, torch::Tensor> Save(torch::optim::Optimizer& opt, const CheckpointDir& dir,
                                            int64_t step) override {
    if (full_format_) {
      auto state = fsdp_.StateDict(opt, /*full=*/true);
      state["fsdp_shards"] = torch::tensor(int64_t{0});
      return state;
    }
    const std::string path = dir.ShardPath(step, pg_->getRank());
    Status s = WriteCheckpointFile(path, Serialize(fsdp_.StateDict(opt, /*full=*/false)));
    if (!s.ok()) throw Error("rank " + std::to_string(pg_->getRank()) + ": " + s.message());
    pg_->barrier()->wait();  // every shard is durable before the step's file names them
    return {{"fsdp_shards", torch::tensor(int64_t{pg_->getSize()})}};
  }
  Status Complete(const std::map<std::string, torch::Tensor>& main, const CheckpointDir& dir,
                  int64_t step) override {
    if (!main.count("fsdp_shards")) {
      throw Error(dir.dir() + " holds checkpoints of a DDP run (strategy = \"ddp\"); resume it "
                  "with strategy.type=\"ddp\" or give this FSDP run another checkpoint.dir");
    }
    // Read and verified once; Restore() loads what this kept.
    verified_.clear();
    const int64_t shards = main.at("fsdp_shards").item<int64_t>();
    if (shards == 0) verified_.push_back(main);  // full format: the step's file holds it all
    for (int64_t j = 0; j < shards; ++j) {
      const std::string path = dir.ShardPath(step, static_cast<int>(j));
      auto shard = ReadCheckpointFile(path);
      if (!shard.ok()) {
        verified_.clear();
        return Status::Invalid("its shard " + path + " does not load: " + shard.status().message());
      }
      verified_.push_back(Deserialize(*shard));
    }
    return Status::Ok();
  }
  void Restore(const std::map<std::string, torch::Tensor>&, const CheckpointDir&, int64_t,
               torch::optim::Optimizer& opt) override {
    fsdp_.LoadStateDicts(verified_, opt);
    verified_.clear();
  }

 private:
  static FsdpOptions Options(const TrainConfig& c) {
    FsdpOptions o;
    o.min_unit_params = c.min_unit_params;
    o.reshard_after_forward = c.reshard_after_forward;
    o.prefetch = c.prefetch;
    o.param_dtype = c.param_dtype;
    o.reduce_dtype = c.reduce_dtype;
    o.cpu_offload = c.cpu_offload;
    return o;
  }

  ProcessGroup* pg_;
  bool full_format_;
  FullyShardedDataParallel fsdp_;
  std::vector<std::map<std::string, torch::Tensor>> verified_;  // by Complete(), for Restore()
};

std::unique_ptr<Strategy> MakeStrategy(std::shared_ptr<torch::nn::SequentialImpl> model,
                                       ProcessGroup* pg, const TrainConfig& c) {
  if (c.strategy == "fsdp") return std::make_unique<FsdpStrategy>(model, pg, c);
  return std::make_unique<DdpStrategy>(model, pg, c);  // "ddp" (validated)
}

// Each rank's own randomness (dropout) is seeded apart from the others'; a
// resume restores it from the checkpoint, or, when the world size changed,
// reseeds it from the step.
uint64_t RankSeed(const TrainConfig& c, int rank, int64_t step) {
  return c.seed * 1000003ULL + static_cast<uint64_t>(rank + 1) * 7919ULL +
         static_cast<uint64_t>(step) * 104729ULL;
}

std::string OneOf(const std::string& key, const std::string& value,
                  std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return "";
    list += std::string(list.empty() ? "" : " or ") + "\"" + a + "\"";
  }
  return key + " '" + value + "': use " + list;
}

}  // namespace

std::string ValidateConfig(const TrainConfig& c) {
  for (const std::string& err : {
           OneOf("model.type", c.model, {"mlp", "cnn"}),
           OneOf("data.source", c.data, {"digits", "synthetic"}),
           OneOf("strategy.type", c.strategy, {"ddp", "fsdp"}),
           OneOf("strategy.backend", c.backend, {"auto", "gloo", "nccl"}),
           OneOf("strategy.param_dtype", c.param_dtype, {"float32", "bfloat16"}),
           OneOf("strategy.reduce_dtype", c.reduce_dtype, {"float32", "bfloat16"}),
           OneOf("optimizer.type", c.optimizer, {"sgd", "adam", "adamw"}),
           OneOf("schedule.type", c.schedule, {"constant", "cosine"}),
           OneOf("checkpoint.format", c.checkpoint_format, {"sharded", "full"}),
       }) {
    if (!err.empty()) return err;
  }
  if (c.batch_size < 1 || c.steps < 1 || c.accumulate < 1) {
    return "train.batch_size, train.steps and train.accumulate must be >= 1";
  }
  if (c.dropout < 0 || c.dropout >= 1) return "model.dropout must be in [0, 1)";
  if (c.checkpoint_every < 1 || c.keep_checkpoints < 1) {
    return "checkpoint.every and checkpoint.keep must be >= 1";
  }
  if (c.test_fraction <= 0 || c.test_fraction >= 1) return "data.test_fraction must be in (0, 1)";
  return "";
}

int Train(const TrainConfig& c) {
  if (std::string err = ValidateConfig(c); !err.empty()) throw Error(err);
  torch::set_num_threads(1);
  ProcessGroupOptions popts;
  popts.backend = c.backend;
  auto dist = Distributed::FromEnv(popts);
  const int rank = dist->rank(), world = dist->world_size();
  const torch::Device device = dist->uses_cuda()
                                   ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dist->env().local_rank))
                                   : torch::Device(torch::kCPU);
  Dataset all;
  if (c.data == "digits") {
    auto loaded = LoadDigits(c.digits_path);
    if (!loaded.ok()) throw Error(loaded.status().message());
    all = std::move(*loaded);
  } else {  // "synthetic" (validated)
    all = MakeSynthetic(c.synthetic_samples, c.synthetic_features, c.synthetic_classes, c.seed);
  }
  Dataset train, test;
  SplitTrainTest(all, c.test_fraction, &train, &test);

  auto model = MakeModel(c, all.features, all.classes);
  model->to(device);
  auto strategy = MakeStrategy(model, &dist->pg(), c);
  auto opt = MakeOptimizer(c, strategy->OptimizerParams());
  torch::manual_seed(RankSeed(c, rank, 0));

  int64_t start = 0;
  std::unique_ptr<CheckpointDir> ckpt;
  if (!c.checkpoint_dir.empty()) {
    ckpt = std::make_unique<CheckpointDir>(c.checkpoint_dir, c.keep_checkpoints);
    std::vector<std::string> skipped;
    std::map<std::string, torch::Tensor> main;
    auto loaded = ckpt->LoadLatest(&skipped, [&](const CheckpointDir::Loaded& l) {
      main = Deserialize(l.payload);
      return strategy->Complete(main, *ckpt, l.step);
    });
    if (rank == 0) {
      for (const auto& s : skipped) std::fprintf(stderr, "checkpoint skipped: %s\n", s.c_str());
    }
    if (loaded) {
      strategy->Restore(main, *ckpt, loaded->step, *opt);
      start = main.at("step").item<int64_t>();
      const std::string mine = "rng_" + std::to_string(rank);
      if (main.at("world_size").item<int64_t>() == world && main.count(mine)) {
        at::Generator gen = at::detail::getDefaultCPUGenerator();
        gen.set_state(main.at(mine));
      } else {
        torch::manual_seed(RankSeed(c, rank, start));
      }
      if (rank == 0) {
        std::printf("resumed from %s at step %lld (saved on %lld ranks)\n", loaded->path.c_str(),
                    (long long)start, (long long)main.at("world_size").item<int64_t>());
      }
    }
  }
  std::ofstream metrics;
  if (rank == 0 && !c.metrics_path.empty()) metrics.open(c.metrics_path, std::ios::app);
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  bool first_attempt = !restart || std::string(restart) == "0";
  auto evaluate = [&] {
    return Accuracy(*model, test, device, [&](const torch::Tensor& x) { return strategy->Forward(x); });
  };

  double loss_value = 0;
  auto window_start = std::chrono::steady_clock::now();
  int64_t window_samples = 0;
  rdzv::Heartbeat heartbeat;  // dtrun --hang-timeout: one pwrite per step
  for (int64_t step = start; step < c.steps; ++step) {
    SetLearningRate(*opt, LearningRate(c, step));
    opt->zero_grad();
    double step_loss = 0;
    for (int m = 0; m < c.accumulate; ++m) {
      torch::Tensor y;
      auto idx = StepIndices(train.rows(), c.batch_size, world, rank, step * c.accumulate + m,
                             c.seed, c.drop_last);
      auto x = Rows(train, idx, &y, device);
      auto loss = torch::cross_entropy_loss(strategy->Forward(x), y) / c.accumulate;
      step_loss += loss.item<double>();
      strategy->Backward(loss, m + 1 == c.accumulate);
    }
    opt->step();
    loss_value = AllMean(dist->pg(), step_loss, device);
    window_samples += static_cast<int64_t>(c.batch_size) * c.accumulate * world;
    const int64_t done = step + 1;
    if (ckpt && (done % c.checkpoint_every == 0 || done == c.steps)) {
      auto main = strategy->Save(*opt, *ckpt, done);
      auto rng = GatherRngStates(dist->pg(), device);
      if (rank == 0) {
        main["step"] = torch::tensor(done);
        main["world_size"] = torch::tensor(int64_t{world});
        for (int r = 0; r < world; ++r) main["rng_" + std::to_string(r)] = rng[static_cast<size_t>(r)];
        Status s = ckpt->Write(done, Serialize(main));
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
    if (c.eval_every > 0 && done % c.eval_every == 0 && (rank == 0 || strategy->CollectiveEval())) {
      double acc = evaluate();
      if (rank == 0) {
        std::printf("step %lld eval_accuracy %.4f\n", (long long)done, acc);
        std::fflush(stdout);
        if (metrics) metrics << "{\"step\": " << done << ", \"eval_accuracy\": " << acc << "}\n";
      }
    }
    if (first_attempt && rank == c.kill_rank && done == c.kill_at_step) {
      std::fprintf(stderr, "fault injection: rank %d kills itself after step %lld\n", rank,
                   (long long)done);
      raise(SIGKILL);
    }
    if (first_attempt && rank == c.hang_rank && done == c.hang_at_step) HangForever(rank, done);
    heartbeat.Beat(done);
    if (done == c.stop_after_step) {
      if (rank == 0) std::printf("stopped after step %lld\n", (long long)done);
      return 0;
    }
  }
  heartbeat.Done();
  double acc = rank == 0 || strategy->CollectiveEval() ? evaluate() : 0;
  auto params = strategy->FullParams();
  if (rank == 0) {
    std::printf("done: steps=%lld loss=%.9g eval_accuracy=%.4f params_sha256=%s\n",
                (long long)c.steps, loss_value, acc, Sha256Of(params).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace dtrun::train
