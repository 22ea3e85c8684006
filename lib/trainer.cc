#include "lib/trainer.h"

#include <signal.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <chrono>
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
#include "lib/train_plan.h"
#include "rendezvous/util/check.h"
#include "rendezvous/heartbeat.h"

namespace dtrun::train {
namespace {

// Fault injection: stop beating and wait forever, as a wedged rank does.
[[gnu::noinline]] void HangForever(int rank, int64_t step) {
  std::fprintf(stderr, "fault injection: rank %d hangs after step %lld\n", rank,
               (long long)step);
  for (;;) pause();
}

// A Sequential, because FSDP wraps consecutive children into units.
std::shared_ptr<torch::nn::SequentialImpl> MakeModel(const TrainConfig& c,
                                                     int features,
                                                     int classes) {
  torch::manual_seed(c.seed);
  auto seq = std::make_shared<torch::nn::SequentialImpl>();
  if (c.model == "cnn") {
    if (features != 64)
      throw Error("model 'cnn' needs 8x8 inputs (data = \"digits\")");
    seq->push_back(
        torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {1, 8, 8})));
    seq->push_back(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)));
    seq->push_back(torch::nn::ReLU());
    seq->push_back(torch::nn::MaxPool2d(2));
    seq->push_back(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
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

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const TrainConfig& c, std::vector<torch::Tensor> params) {
  if (c.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr)
                    .momentum(c.momentum)
                    .weight_decay(c.weight_decay));
  }
  if (c.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(  // "adamw", the one choice left
      params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
}

void SetLearningRate(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

// The batch's rows copied into one CPU tensor, then moved to the device in
// one transfer.
torch::Tensor Rows(const Dataset& d, const std::vector<int64_t>& idx,
                   torch::Tensor* labels, torch::Device device) {
  auto x = torch::empty({static_cast<int64_t>(idx.size()), d.features});
  auto y = torch::empty({static_cast<int64_t>(idx.size())}, torch::kLong);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (size_t i = 0; i < idx.size(); ++i) {
    std::copy_n(d.x.begin() + idx[i] * d.features, d.features,
                xp + i * d.features);
    yp[i] = d.y[static_cast<size_t>(idx[i])];
  }
  *labels = y.to(device);
  return x.to(device);
}

// Accuracy on the whole test set in one batch. Through the strategy's
// Forward(), since FSDP must gather its units; eval mode switches dropout off.
template <typename Forward>
double Accuracy(torch::nn::SequentialImpl& model, const Dataset& test,
                torch::Device device, Forward forward) {
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

// The hash of the parameters' bytes: runs that should be bitwise equal
// (resumed, restarted) print the same one.
std::string Sha256Of(const std::vector<torch::Tensor>& params) {
  Sha256 h;
  for (const auto& p : params) {
    auto c = p.detach().to(torch::kCPU).contiguous();
    h.Update(c.data_ptr(), c.numel() * c.element_size());
  }
  return h.HexDigest();
}

// Every rank's loss averaged, so rank 0 prints the loss of the global batch.
double AllMean(ProcessGroup& pg, double v, torch::Device device) {
  std::vector<torch::Tensor> t{torch::tensor({v}, torch::kDouble).to(device)};
  pg.allreduce(t)->wait();
  return t[0].item<double>() / pg.getSize();
}

// Every rank's CPU generator state, gathered (collective).
std::vector<torch::Tensor> GatherRngStates(ProcessGroup& pg,
                                           torch::Device device) {
  torch::Tensor mine =
      at::detail::getDefaultCPUGenerator().get_state().to(device);
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < pg.getSize(); ++r)
    out[0].push_back(torch::empty_like(mine));
  std::vector<torch::Tensor> in{mine};
  pg.allgather(out, in)->wait();
  for (auto& t : out[0]) t = t.to(torch::kCPU);
  return out[0];
}

// A checkpoint's payload: named tensors in torch's archive format.
// Deserialize() loads them onto the CPU, so GPU checkpoints load anywhere.
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

// The step's file is one map of named tensors for both strategies: DDP's
// model and optimizer archives travel in it as byte tensors.
torch::Tensor Blob(const std::string& s) {
  auto t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

std::string Text(const torch::Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()),
                     static_cast<size_t>(t.numel()));
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
  virtual std::map<std::string, torch::Tensor> Save(
      torch::optim::Optimizer& opt, const CheckpointDir& dir, int64_t step) = 0;
  // Whether a checkpoint's other files are there and verify (every rank
  // reaches the same verdict: they read the same files). Restore() follows
  // the Complete() that accepted, for the same step.
  virtual Status Complete(const std::map<std::string, torch::Tensor>& main,
                          const CheckpointDir& dir, int64_t step) = 0;
  virtual void Restore(const std::map<std::string, torch::Tensor>& main,
                       const CheckpointDir& dir, int64_t step,
                       torch::optim::Optimizer& opt) = 0;
};

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(std::shared_ptr<torch::nn::SequentialImpl> model,
              ProcessGroup* pg, const TrainConfig& c)
      : model_(model), ddp_(model, pg, Options(c)) {}

  torch::Tensor Forward(const torch::Tensor& x) override {
    return model_->forward(x);
  }
  // Only the step's last micro-batch all-reduces; the others accumulate in
  // .grad under NoSync, and the last one's hooks add them into the buckets.
  void Backward(const torch::Tensor& loss, bool last) override {
    if (last) {
      loss.backward();
      ddp_.SyncGradients();
    } else {
      DistributedDataParallel::NoSync no_sync(ddp_);
      loss.backward();
    }
  }
  std::vector<torch::Tensor> OptimizerParams() override {
    return model_->parameters();
  }
  std::vector<torch::Tensor> FullParams() override {
    return model_->parameters();
  }
  bool CollectiveEval() const override { return false; }

  std::map<std::string, torch::Tensor> Save(torch::optim::Optimizer& opt,
                                            const CheckpointDir&,
                                            int64_t) override {
    torch::serialize::OutputArchive m, o;
    model_->save(m);
    opt.save(o);
    std::ostringstream ms, os;
    m.save_to(ms);
    o.save_to(os);
    return {{"model", Blob(ms.str())}, {"optimizer", Blob(os.str())}};
  }
  Status Complete(const std::map<std::string, torch::Tensor>& main,
                  const CheckpointDir& dir, int64_t) override {
    if (!main.count("model") || !main.count("optimizer")) {
      throw Error(
          dir.dir() +
          " holds checkpoints of an FSDP run (strategy = \"fsdp\"); resume "
          "it with strategy.type=\"fsdp\" or give this DDP run another "
          "checkpoint.dir");
    }
    return Status::Ok();
  }
  void Restore(const std::map<std::string, torch::Tensor>& main,
               const CheckpointDir&, int64_t,
               torch::optim::Optimizer& opt) override {
    torch::Device device = model_->parameters().front().device();
    torch::serialize::InputArchive m, o;
    std::istringstream ms(Text(main.at("model"))),
        os(Text(main.at("optimizer")));
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
  FsdpStrategy(std::shared_ptr<torch::nn::SequentialImpl> model,
               ProcessGroup* pg, const TrainConfig& c)
      : pg_(pg),
        full_format_(c.checkpoint_format == "full"),
        fsdp_(model, pg, Options(c)) {}

  torch::Tensor Forward(const torch::Tensor& x) override {
    return fsdp_.Forward(x);
  }
  void Backward(const torch::Tensor& loss, bool) override {
    loss.backward();
    fsdp_.SyncGradients();  // every micro-batch's gradients accumulate in the
                            // shards
  }
  std::vector<torch::Tensor> OptimizerParams() override {
    return fsdp_.ShardParameters();
  }
  std::vector<torch::Tensor> FullParams() override {
    return fsdp_.FullParameters();
  }
  bool CollectiveEval() const override { return true; }

  std::map<std::string, torch::Tensor> Save(torch::optim::Optimizer& opt,
                                            const CheckpointDir& dir,
                                            int64_t step) override {
    if (full_format_) {
      auto state = fsdp_.StateDict(opt, /*full=*/true);
      state["fsdp_shards"] = torch::tensor(int64_t{0});
      return state;
    }
    // Sharded: each rank writes its own file, so no rank ever holds the
    // full state; the step's file only records how many shards there are.
    const std::string path = dir.ShardPath(step, pg_->getRank());
    Status s = WriteCheckpointFile(
        path, Serialize(fsdp_.StateDict(opt, /*full=*/false)));
    if (!s.ok())
      throw Error("rank " + std::to_string(pg_->getRank()) + ": " +
                  s.message());
    pg_->barrier()
        ->wait();  // every shard is durable before the step's file names them
    return {{"fsdp_shards", torch::tensor(int64_t{pg_->getSize()})}};
  }
  Status Complete(const std::map<std::string, torch::Tensor>& main,
                  const CheckpointDir& dir, int64_t step) override {
    if (!main.count("fsdp_shards")) {
      throw Error(
          dir.dir() +
          " holds checkpoints of a DDP run (strategy = \"ddp\"); resume it "
          "with strategy.type=\"ddp\" or give this FSDP run another "
          "checkpoint.dir");
    }
    // Read and verified once; Restore() loads what this kept.
    verified_.clear();
    const int64_t shards = main.at("fsdp_shards").item<int64_t>();
    if (shards == 0)
      verified_.push_back(main);  // full format: the step's file holds it all
    for (int64_t j = 0; j < shards; ++j) {
      const std::string path = dir.ShardPath(step, static_cast<int>(j));
      auto shard = ReadCheckpointFile(path);
      if (!shard.ok()) {
        verified_.clear();
        return Status::Invalid("its shard " + path +
                               " does not load: " + shard.status().message());
      }
      verified_.push_back(Deserialize(*shard));
    }
    return Status::Ok();
  }
  void Restore(const std::map<std::string, torch::Tensor>&,
               const CheckpointDir&, int64_t,
               torch::optim::Optimizer& opt) override {
    DTRUN_CHECK(!verified_.empty())
        << "FSDP Restore() without a Complete() that accepted";
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
  // by Complete(), for Restore()
  std::vector<std::map<std::string, torch::Tensor>> verified_;
};

std::unique_ptr<Strategy> MakeStrategy(
    std::shared_ptr<torch::nn::SequentialImpl> model, ProcessGroup* pg,
    const TrainConfig& c) {
  if (c.strategy == "fsdp") return std::make_unique<FsdpStrategy>(model, pg, c);
  return std::make_unique<DdpStrategy>(model, pg, c);  // "ddp" (validated)
}

torch::Device DeviceOf(const Distributed& dist) {
  if (!dist.uses_cuda()) return torch::Device(torch::kCPU);
  return torch::Device(torch::kCUDA,
                       static_cast<c10::DeviceIndex>(dist.env().local_rank));
}

Dataset LoadDataset(const TrainConfig& c) {
  if (c.data == "synthetic") {
    return MakeSynthetic(c.synthetic_samples, c.synthetic_features,
                         c.synthetic_classes, c.seed);
  }
  auto loaded = LoadDigits(c.digits_path);  // "digits" (validated)
  if (!loaded.ok()) throw Error(loaded.status().message());
  return std::move(*loaded);
}

// One rank's training run: set up from the config and the launcher's
// environment, then Run() steps through resume, step, checkpoint, log, eval
// and fault injection; what differs between DDP and FSDP is the Strategy.
// Owns the process group and everything built on it. Single-threaded.
class Trainer {
 public:
  Trainer(const TrainConfig& c, std::unique_ptr<Distributed> dist);
  // The process exit code.
  int Run();

 private:
  int64_t Resume();
  void RestoreRng(const std::map<std::string, torch::Tensor>& main,
                  int64_t start);
  double Step(int64_t step);
  double MicroBatch(int64_t micro, bool last);
  void Checkpoint(int64_t done);
  void Log(int64_t done, double lr);
  void Eval(int64_t done);
  void InjectFaults(const StepActions& actions, int64_t done);
  int Finish();
  double Evaluate();
  bool Evaluates() const { return rank_ == 0 || strategy_->CollectiveEval(); }

  const TrainConfig& c_;
  std::unique_ptr<Distributed> dist_;
  const int rank_, world_;
  const torch::Device device_;
  Dataset train_, test_;
  std::shared_ptr<torch::nn::SequentialImpl> model_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::unique_ptr<CheckpointDir> ckpt_;  // null without checkpoint_dir
  std::ofstream metrics_;                // rank 0, with metrics_path
  double loss_ = 0;                      // the last step's, averaged over ranks
  // Throughput since the last progress line.
  std::chrono::steady_clock::time_point window_start_;
  int64_t window_samples_ = 0;
};

Trainer::Trainer(const TrainConfig& c, std::unique_ptr<Distributed> dist)
    : c_(c),
      dist_(std::move(dist)),
      rank_(dist_->rank()),
      world_(dist_->world_size()),
      device_(DeviceOf(*dist_)) {
  Dataset all = LoadDataset(c_);
  SplitTrainTest(all, c_.test_fraction, &train_, &test_);
  // MakeModel seeds the shared generator with c.seed, so every rank starts
  // from the same weights before the strategy broadcasts or shards them.
  model_ = MakeModel(c_, all.features, all.classes);
  model_->to(device_);
  strategy_ = MakeStrategy(model_, &dist_->pg(), c_);
  opt_ = MakeOptimizer(c_, strategy_->OptimizerParams());
  torch::manual_seed(RankSeed(c_, rank_, 0));
}

int Trainer::Run() {
  if (!c_.checkpoint_dir.empty()) {
    ckpt_ =
        std::make_unique<CheckpointDir>(c_.checkpoint_dir, c_.keep_checkpoints);
  }
  const int64_t start = ckpt_ ? Resume() : 0;
  if (rank_ == 0 && !c_.metrics_path.empty())
    metrics_.open(c_.metrics_path, std::ios::app);
  const bool first_attempt = dist_->env().restart_count == 0;
  window_start_ = std::chrono::steady_clock::now();
  rendezvous::Heartbeat heartbeat;  // dtrun --hang-timeout: one pwrite per step
  for (int64_t step = start; step < c_.steps; ++step) {
    loss_ = Step(step);
    window_samples_ +=
        static_cast<int64_t>(c_.batch_size) * c_.accumulate * world_;
    const int64_t done = step + 1;
    const StepActions actions =
        ActionsAfterStep(c_, done, rank_, first_attempt);
    if (actions.checkpoint) Checkpoint(done);
    if (actions.log) Log(done, LearningRate(c_, step));
    if (actions.eval && Evaluates()) Eval(done);
    InjectFaults(actions, done);
    heartbeat.Beat(done);
    if (actions.stop) {
      if (rank_ == 0) std::printf("stopped after step %lld\n", (long long)done);
      return 0;
    }
  }
  heartbeat.Done();
  return Finish();
}

// The newest checkpoint that loads and whose other files verify; the step
// to start from (0 when there is none).
int64_t Trainer::Resume() {
  std::vector<std::string> skipped;
  std::map<std::string, torch::Tensor> main;
  auto loaded =
      ckpt_->LoadLatest(&skipped, [&](const CheckpointDir::Loaded& l) {
        main = Deserialize(l.payload);
        return strategy_->Complete(main, *ckpt_, l.step);
      });
  if (rank_ == 0) {
    for (const auto& s : skipped)
      std::fprintf(stderr, "checkpoint skipped: %s\n", s.c_str());
  }
  if (!loaded) return 0;
  strategy_->Restore(main, *ckpt_, loaded->step, *opt_);
  const int64_t start = main.at("step").item<int64_t>();
  RestoreRng(main, start);
  if (rank_ == 0) {
    std::printf("resumed from %s at step %lld (saved on %lld ranks)\n",
                loaded->path.c_str(), (long long)start,
                (long long)main.at("world_size").item<int64_t>());
  }
  return start;
}

// Bitwise resume needs each rank's generator exactly where it was (dropout
// draws from it). On another world size rank r's saved stream belongs to a
// different slice of the batch, so the ranks reseed from the step instead.
void Trainer::RestoreRng(const std::map<std::string, torch::Tensor>& main,
                         int64_t start) {
  const std::string mine = "rng_" + std::to_string(rank_);
  if (main.at("world_size").item<int64_t>() == world_ && main.count(mine)) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(main.at(mine));
  } else {
    torch::manual_seed(RankSeed(c_, rank_, start));
  }
}

// One optimizer step over `accumulate` micro-batches; the loss averaged
// over the ranks (collective).
double Trainer::Step(int64_t step) {
  SetLearningRate(*opt_, LearningRate(c_, step));
  opt_->zero_grad();
  double step_loss = 0;
  for (int m = 0; m < c_.accumulate; ++m) {
    step_loss += MicroBatch(step * c_.accumulate + m, m + 1 == c_.accumulate);
  }
  opt_->step();
  return AllMean(dist_->pg(), step_loss, device_);
}

// The sampler is indexed by micro-batch, not by step, so a run with
// accumulate = k sees the same samples as one with k times the batch.
double Trainer::MicroBatch(int64_t micro, bool last) {
  torch::Tensor y;
  auto idx = StepIndices(train_.rows(), c_.batch_size, world_, rank_, micro,
                         c_.seed, c_.drop_last);
  auto x = Rows(train_, idx, &y, device_);
  auto loss =
      torch::cross_entropy_loss(strategy_->Forward(x), y) / c_.accumulate;
  const double value = loss.item<double>();
  strategy_->Backward(loss, last);
  return value;
}

// The strategy writes its part first (FSDP: every shard, durable), then the
// RNG gather, then rank 0 writes the step's file last: a step counts only
// once that file exists, so a crash anywhere before leaves the previous
// checkpoint the newest that loads.
void Trainer::Checkpoint(int64_t done) {
  auto main = strategy_->Save(*opt_, *ckpt_, done);
  // The generators as the next step finds them: restored, a resumed run's
  // dropout masks are those of an unbroken one.
  auto rng = GatherRngStates(dist_->pg(), device_);
  if (rank_ == 0) {
    main["step"] = torch::tensor(done);
    main["world_size"] = torch::tensor(int64_t{world_});
    for (int r = 0; r < world_; ++r)
      main["rng_" + std::to_string(r)] = rng[static_cast<size_t>(r)];
    Status s = ckpt_->Write(done, Serialize(main));
    if (!s.ok())
      throw Error("checkpoint at step " + std::to_string(done) + ": " +
                  s.message());
  }
  dist_->pg()
      .barrier()
      ->wait();  // nobody runs ahead of a checkpoint in progress
}

void Trainer::Log(int64_t done, double lr) {
  const double secs = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - window_start_)
                          .count();
  const double rate = window_samples_ / std::max(secs, 1e-9);
  std::printf("step %lld loss %.6f lr %.5f samples/s %.0f\n", (long long)done,
              loss_, lr, rate);
  std::fflush(stdout);
  if (metrics_) {
    metrics_ << "{\"step\": " << done << ", \"loss\": " << loss_
             << ", \"samples_per_s\": " << rate << "}\n";
    metrics_.flush();
  }
  window_start_ = std::chrono::steady_clock::now();
  window_samples_ = 0;
}

void Trainer::Eval(int64_t done) {
  const double acc = Evaluate();
  if (rank_ != 0) return;
  std::printf("step %lld eval_accuracy %.4f\n", (long long)done, acc);
  std::fflush(stdout);
  if (metrics_)
    metrics_ << "{\"step\": " << done << ", \"eval_accuracy\": " << acc
             << "}\n";
}

void Trainer::InjectFaults(const StepActions& actions, int64_t done) {
  if (actions.kill) {
    std::fprintf(stderr,
                 "fault injection: rank %d kills itself after step %lld\n",
                 rank_, (long long)done);
    raise(SIGKILL);
  }
  if (actions.hang) HangForever(rank_, done);
}

// The final evaluation and the hash of the full parameters (collective for
// FSDP), which tests compare across runs.
int Trainer::Finish() {
  const double acc = Evaluates() ? Evaluate() : 0;
  auto params = strategy_->FullParams();
  if (rank_ == 0) {
    std::printf(
        "done: steps=%lld loss=%.9g eval_accuracy=%.4f params_sha256=%s\n",
        (long long)c_.steps, loss_, acc, Sha256Of(params).c_str());
    std::fflush(stdout);
  }
  return 0;
}

double Trainer::Evaluate() {
  return Accuracy(*model_, test_, device_, [&](const torch::Tensor& x) {
    return strategy_->Forward(x);
  });
}

}  // namespace

int Train(const TrainConfig& c) {
  if (std::string err = ValidateConfig(c); !err.empty()) throw Error(err);
  torch::set_num_threads(1);  // ranks share the host's cores; one thread each
  ProcessGroupOptions popts;
  popts.backend = c.backend;
  Trainer trainer(c, Distributed::FromEnv(popts));
  return trainer.Run();
}

}  // namespace dtrun::train
