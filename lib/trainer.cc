#include "lib/trainer.h"

#include <signal.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include "lib/async_save.h"
#include "lib/checkpoint.h"
#include "lib/checkpoint_payload.h"
#include "lib/data.h"
#include "lib/host_staging.h"
#include "lib/node_copies.h"
#include "lib/process_group.h"
#include "lib/sha256.h"
#include "lib/strategy.h"
#include "lib/train_plan.h"
#include "rendezvous/heartbeat.h"

namespace dtrun::train {
namespace {

double UnixSeconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

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
  if (c.model == ModelKind::kCnn) {
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
  int in = features;  // kMlp
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
  if (c.optimizer == OptimizerKind::kSgd) {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr)
                    .momentum(c.momentum)
                    .weight_decay(c.weight_decay));
  }
  if (c.optimizer == OptimizerKind::kAdam) {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(  // kAdamW
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

// The smallest of every rank's `v` (collective).
int64_t AllMin(ProcessGroup& pg, int64_t v, torch::Device device) {
  std::vector<torch::Tensor> t{torch::tensor({v}, torch::kLong).to(device)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MIN;
  pg.allreduce(t, opts)->wait();
  return t[0].item<int64_t>();
}

[[noreturn]] void KillSelf(int rank, int64_t step, const char* where) {
  std::fprintf(stderr,
               "fault injection: rank %d kills itself %s of step %lld\n", rank,
               where, (long long)step);
  std::fflush(stderr);
  raise(SIGKILL);
  std::abort();
}

// Milliseconds since `start`.
double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - start)
      .count();
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

// strategy.device resolved (ChooseDevice); a GPU becomes the current one.
torch::Device DeviceOf(const Distributed& dist, const TrainConfig& c) {
  const int gpus = static_cast<int>(torch::cuda::device_count());
  DeviceChoice d =
      ChooseDevice(c.device, dist.backend(), dist.env().local_rank, gpus);
  if (!d.error.empty())
    throw Error("rank " + std::to_string(dist.rank()) + ": " + d.error);
  if (d.index < 0) return torch::Device(torch::kCPU);
  torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(d.index));
  c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
  return device;
}

Dataset LoadDataset(const TrainConfig& c) {
  if (c.data == DataSource::kSynthetic) {
    return MakeSynthetic(c.synthetic_samples, c.synthetic_features,
                         c.synthetic_classes, c.seed);
  }
  auto loaded = LoadDigits(c.digits_path);  // kDigits
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
  // mode = "memory": the step every rank resumed from its node's copies,
  // or -1 (then from the folder). Collective.
  int64_t ResumeFromMemory();
  // The files rank `rank_` needs of `step` to resume from memory.
  std::vector<std::string> MemoryFilesOf(int64_t step) const;
  // Reads them and has the strategy check them; *file gets the step's.
  Status LoadFromMemory(int64_t step, StepFile* file);
  void RestoreRng(const StepFile& file);
  // Records the folder's next epoch, resumed from `start` (rank 0), and
  // shares its number with every rank. Collective.
  void BeginEpoch(int64_t start);
  double Step(int64_t step);
  double MicroBatch(int64_t micro, bool last);
  void Checkpoint(int64_t done, const StepActions& actions);
  // A background checkpoint (async, memory): what the saver's thread writes.
  struct SaveJob {
    int64_t step = 0;
    bool persist = true;  // to disk too (memory mode: not every time)
    bool kill = false;    // fault.kill_in = "write"
    bool whole = false;   // this rank writes a step's file
    StepFile file;
    std::optional<TensorMap> shard;
    std::function<TensorMap()> encode;
    HostStaging::Ready ready;  // the copies' arrival in host memory
  };
  // Starts `job` on the saver's thread; WaitForSave() before the next.
  void StartSave(SaveJob job);
  // The saver's thread: memory copies (mode = "memory"), then the disk.
  Status WriteSave(SaveJob& job);
  Status WriteToDisk(const SaveJob& job, const std::string& shard_payload,
                     const std::string& shard_header,
                     const std::string& step_payload,
                     const std::string& step_header,
                     const std::function<void()>& halfway);
  void WaitForSave(int64_t due);
  // "checkpoint at step N not saved: WHY. The newest checkpoint in DIR is
  // ...": what a failed write says, so that a full or read-only disk is
  // named with what still loads.
  std::string NotSaved(int64_t step, const std::string& why) const;
  void Log(int64_t done, double lr);
  void Eval(int64_t done);
  void InjectFaults(const StepActions& actions, int64_t done);
  // Background checkpoints from a GPU: the pinned buffers made once, after
  // the first step (when the optimizer's state exists), not at the first
  // checkpoint, which then waits only for its copies to be enqueued.
  void ReserveStaging();
  int Finish();
  double Evaluate();
  bool Evaluates() const { return rank_ == 0 || strategy_->CollectiveEval(); }

  const TrainConfig& c_;
  std::unique_ptr<Distributed> dist_;
  const int rank_, world_;
  const torch::Device device_;
  HostStaging staging_;  // background checkpoints' copies
  Dataset train_, test_;
  std::shared_ptr<torch::nn::SequentialImpl> model_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::unique_ptr<CheckpointDir> ckpt_;  // null without checkpoint_dir
  std::unique_ptr<NodeCopies> copies_;   // mode = "memory" under dtrun
  std::ofstream metrics_;                // rank 0, with metrics_path
  double loss_ = 0;                      // the last step's, averaged over ranks
  double compute_s_ = 0;  // the last step's time outside collectives
  std::string resumed_from_ = "disk";  // "memory", "disk" or "none"
  std::vector<EpochRecord> epochs_;    // the folder's, read at the resume
  int64_t epoch_ = 0;                  // this run's, in every step's file
  // Throughput since the last progress line.
  std::chrono::steady_clock::time_point window_start_;
  int64_t window_samples_ = 0;
  // async checkpoints: the store connection of the saver's thread (made at
  // the first), and the saver, last so that it is joined first
  std::unique_ptr<rendezvous::TcpStoreClient> save_store_;
  // memory mode: why the last background write's copy did not reach the
  // disk (it is in memory); written by the saver's thread, read by the
  // loop after it joined
  std::string unpersisted_;
  AsyncSave saver_;
};

Trainer::Trainer(const TrainConfig& c, std::unique_ptr<Distributed> dist)
    : c_(c),
      dist_(std::move(dist)),
      rank_(dist_->rank()),
      world_(dist_->world_size()),
      device_(DeviceOf(*dist_, c_)),
      staging_(device_) {
  Dataset all = LoadDataset(c_);
  SplitTrainTest(all, c_.test_fraction, &train_, &test_);
  // MakeModel seeds the shared generator with c.seed, so every rank starts
  // from the same weights before the strategy broadcasts or shards them.
  model_ = MakeModel(c_, all.features, all.classes);
  model_->to(device_);
  strategy_ = MakeStrategy(model_, &dist_->pg(), c_);
  opt_ = MakeOptimizer(c_, strategy_->OptimizerParams());
  torch::manual_seed(RankSeed(c_, rank_, 0));
  if (rank_ == 0) {
    std::printf("training on %s (backend %s, %d rank%s)\n",
                device_.str().c_str(), dist_->backend().c_str(), world_,
                world_ == 1 ? "" : "s");
  }
}

int Trainer::Run() {
  if (!c_.checkpoint_dir.empty()) {
    ckpt_ =
        std::make_unique<CheckpointDir>(c_.checkpoint_dir, c_.keep_checkpoints);
  }
  if (ckpt_ && c_.checkpoint_mode == CheckpointMode::kMemory) {
    copies_ = NodeCopies::FromEnv(dist_->env().local_rank, c_.checkpoint_dir);
    if (!copies_ && rank_ == 0) {
      std::fprintf(stderr,
                   "checkpoint.mode = \"memory\": this launcher keeps no "
                   "shared-memory copies (dtrun does); checkpoints are "
                   "written as in \"async\" mode\n");
    }
  }
  // For dtrun's recovery report: when this rank was set up (its process
  // group and model) and when its state was in place.
  const double init_unix = UnixSeconds();
  const int64_t start = ckpt_ ? Resume() : 0;
  if (start == 0) resumed_from_ = "none";
  if (ckpt_) BeginEpoch(start);
  rendezvous::Heartbeat::Resumed(start, resumed_from_.c_str(), init_unix,
                                 UnixSeconds());
  if (rank_ == 0 && !c_.metrics_path.empty())
    metrics_.open(c_.metrics_path, std::ios::app);
  const bool first_attempt = dist_->env().restart_count == 0;
  window_start_ = std::chrono::steady_clock::now();
  rendezvous::Heartbeat heartbeat;  // dtrun --hang-timeout: one pwrite per step
  for (int64_t step = start; step < c_.steps; ++step) {
    loss_ = Step(step);
    if (step == start) ReserveStaging();
    window_samples_ +=
        static_cast<int64_t>(c_.batch_size) * c_.accumulate * world_;
    const int64_t done = step + 1;
    const StepActions actions =
        ActionsAfterStep(c_, done, rank_, first_attempt);
    if (actions.checkpoint) Checkpoint(done, actions);
    if (actions.log) Log(done, LearningRate(c_, step));
    if (actions.eval && Evaluates()) Eval(done);
    InjectFaults(actions, done);
    heartbeat.Beat(done, compute_s_, c_.steps);
    if (actions.stop) {
      WaitForSave(-1);  // the stop's checkpoint is durable before exit 0
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
  epochs_ = ckpt_->Epochs();
  if (c_.checkpoint_mode == CheckpointMode::kMemory) {
    const int64_t step = ResumeFromMemory();
    resumed_from_ = "memory";
    if (step >= 0) return step;
    resumed_from_ = "disk";
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> skipped;
  StepFile file;
  auto loaded =
      ckpt_->LoadLatest(&skipped, [&](const CheckpointDir::Loaded& l) {
        auto tensors = DecodeTensors(l.payload);
        auto parsed = tensors.ok() ? StepFile::FromTensors(std::move(*tensors))
                                   : Result<StepFile>(tensors.status());
        if (!parsed.ok()) return parsed.status();
        const std::string stale = AbandonedBy(epochs_, parsed->epoch, l.step);
        if (!stale.empty()) return Status::Invalid(stale);
        file = std::move(*parsed);
        return strategy_->Complete(file.parts, Strategy::FolderShards(*ckpt_),
                                   l.step);
      });
  if (rank_ == 0) {
    for (const auto& s : skipped)
      std::fprintf(stderr, "checkpoint skipped: %s\n", s.c_str());
  }
  if (!loaded) return 0;
  strategy_->Restore(file.parts, *opt_);
  RestoreRng(file);
  if (rank_ == 0) {
    std::printf(
        "resumed from %s at step %lld (saved on %lld ranks; read in %.1f "
        "ms)\n",
        loaded->path.c_str(), (long long)file.step, (long long)file.world_size,
        MsSince(start));
  }
  return file.step;
}

std::vector<std::string> Trainer::MemoryFilesOf(int64_t step) const {
  std::vector<std::string> names{CheckpointDir::StepName(step)};
  if (c_.strategy == StrategyKind::kFsdp)
    names.push_back(CheckpointDir::ShardName(step, rank_));
  return names;
}

// Every rank must find the same step on its node, none older than the
// folder's newest: the step is the smallest of the ranks' newest, and any
// rank that cannot read it sends every rank to the folder.
// Two all-reduces decide it, so every rank takes the same path even when
// the nodes' memories differ (a node that was replaced has none): a rank
// that holds nothing says -1 and the whole group reads the folder. A copy
// is trusted only after its SHA-256 verifies, as a file's would be.
int64_t Trainer::ResumeFromMemory() {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> on_disk = ckpt_->Steps();
  const int64_t disk = on_disk.empty() ? 0 : on_disk.front();
  int64_t mine = -1;
  if (copies_) {
    copies_->Scan();
    mine = copies_->Newest([this](int64_t s) { return MemoryFilesOf(s); },
                           std::max<int64_t>(disk, 1), world_);
    if (dist_->env().local_rank == 0) {
      for (const auto& u : copies_->unusable())
        std::fprintf(stderr, "checkpoint copy not used: %s\n", u.c_str());
    }
  }
  const int64_t step = AllMin(dist_->pg(), mine, device_);
  StepFile file;
  Status loaded = Status::Invalid("not every rank holds a copy of a step");
  if (step > 0) loaded = LoadFromMemory(step, &file);
  const std::string stale =
      loaded.ok() ? AbandonedBy(epochs_, file.epoch, step) : "";
  if (!stale.empty()) loaded = Status::Invalid(stale);
  // Every rank's copy of the step must be of one history: a node that was
  // cut off keeps copies of the one the others gave up.
  const int64_t none = std::numeric_limits<int64_t>::max();
  const int64_t newest =
      -AllMin(dist_->pg(), loaded.ok() ? -file.epoch : -none, device_);
  if (loaded.ok() && file.epoch < newest) {
    loaded = Status::Invalid("written in epoch " + std::to_string(file.epoch) +
                             ", other ranks' copies in epoch " +
                             std::to_string(newest) +
                             ": a history given up (a node cut off from the "
                             "job kept it)");
  }
  if (!loaded.ok() && step > 0)
    std::fprintf(stderr, "rank %d: memory copy of step %lld: %s\n", rank_,
                 (long long)step, loaded.message().c_str());
  if (AllMin(dist_->pg(), loaded.ok() ? 1 : 0, device_) == 0) {
    if (rank_ == 0 && copies_ && dist_->env().restart_count > 0) {
      std::printf(
          "no memory copy to resume from (%s; the folder's newest "
          "is step %lld): resuming from disk\n",
          step > 0 ? "a rank's copy does not load"
                   : "not every rank's node holds one",
          (long long)disk);
    }
    return -1;
  }
  strategy_->Restore(file.parts, *opt_);
  RestoreRng(file);
  if (rank_ == 0) {
    std::printf(
        "resumed from memory at step %lld (copies in %s; the folder's newest "
        "is step %lld; read in %.1f ms)\n",
        (long long)step, copies_->where().c_str(), (long long)disk,
        MsSince(start));
  }
  return step;
}

Status Trainer::LoadFromMemory(int64_t step, StepFile* file) {
  auto payload = copies_->Read(step, CheckpointDir::StepName(step));
  auto tensors = payload.ok() ? DecodeTensors(*payload)
                              : Result<TensorMap>(payload.status());
  auto parsed = tensors.ok() ? StepFile::FromTensors(std::move(*tensors))
                             : Result<StepFile>(tensors.status());
  if (!parsed.ok()) return parsed.status();
  *file = std::move(*parsed);
  Strategy::ShardSource source;
  source.read = [this](int64_t s, int r) {
    return copies_->Read(s, CheckpointDir::ShardName(s, r));
  };
  source.own_only = true;
  source.where = copies_->where();
  return strategy_->Complete(file->parts, source, step);
}

// Without the record (a full or read-only folder) the epoch is still one
// more than the newest read, but a file it writes cannot be told from a
// cut-off node's: said once.
void Trainer::BeginEpoch(int64_t start) {
  int64_t epoch = 0;
  if (rank_ == 0) {
    auto begun = ckpt_->BeginEpoch(start, world_);
    epoch =
        begun.ok() ? *begun : (epochs_.empty() ? 0 : epochs_.back().epoch) + 1;
    if (!begun.ok()) {
      std::fprintf(stderr, "epoch %lld not recorded in %s: %s\n",
                   (long long)epoch, ckpt_->dir().c_str(),
                   begun.status().message().c_str());
    }
  }
  epoch_ = -AllMin(dist_->pg(), -epoch, device_);
}

// Bitwise resume needs each rank's generator exactly where it was (dropout
// draws from it). On another world size rank r's saved stream belongs to a
// different slice of the batch, so the ranks reseed from the step instead.
void Trainer::RestoreRng(const StepFile& file) {
  if (file.world_size == world_ &&
      static_cast<size_t>(rank_) < file.rng.size()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(file.rng[static_cast<size_t>(rank_)]);
  } else {
    torch::manual_seed(RankSeed(c_, rank_, file.step));
  }
}

// One optimizer step over `accumulate` micro-batches; the loss averaged
// over the ranks (collective).
// Also times the step's compute outside collectives (for the beat, which
// dtrun scores for stragglers): the step's time less the gradient
// collectives' waits, before the loss's all-reduce.
double Trainer::Step(int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  strategy_->TakeCollectiveSeconds();
  SetLearningRate(*opt_, LearningRate(c_, step));
  opt_->zero_grad();
  double step_loss = 0;
  for (int m = 0; m < c_.accumulate; ++m) {
    step_loss += MicroBatch(step * c_.accumulate + m, m + 1 == c_.accumulate);
  }
  staging_.Fence();  // the last checkpoint's copies read the state first
  opt_->step();
  compute_s_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count() -
      strategy_->TakeCollectiveSeconds();
  if (rank_ == c_.slow_rank && c_.slow_factor > 1) {  // [fault] slow_rank
    std::this_thread::sleep_for(
        std::chrono::duration<double>(compute_s_ * (c_.slow_factor - 1)));
    compute_s_ *= c_.slow_factor;
  }
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
// checkpoint the newest that loads. In the background modes the loop only
// copies, and the saver's thread writes in the same order.
void Trainer::Checkpoint(int64_t done, const StepActions& actions) {
  const auto start = std::chrono::steady_clock::now();
  const bool background = c_.checkpoint_mode != CheckpointMode::kSync;
  if (background) WaitForSave(done);
  SaveJob job;
  // The generators as the next step finds them: restored, a resumed run's
  // dropout masks are those of an unbroken one. Gathered before the copy,
  // whose device-to-host transfer the gather's own small one would queue
  // behind.
  job.file.rng = GatherRngStates(dist_->pg(), device_);
  if (background) {
    // DDP: rank 0 writes the folder's step file; in memory, so does each
    // node's first rank, so that every node can resume from its own copy.
    job.whole = rank_ == 0 || (copies_ && dist_->env().local_rank == 0);
    staging_.Begin();
    Strategy::Snapshot copy =
        strategy_->Copy(*opt_, job.whole, staging_.copier());
    job.ready = staging_.End();
    job.file.parts = std::move(copy.parts);
    job.shard = std::move(copy.shard);
    job.encode = std::move(copy.encode);
  } else {
    job.file.parts = strategy_->Save(*opt_, *ckpt_, done);
  }
  job.file.step = done;
  job.file.world_size = world_;
  job.file.epoch = epoch_;
  if (background) {
    // fault.kill_in = "copy": the copy is made and nothing of it written,
    // so the newest copy anywhere is the previous checkpoint's.
    if (actions.kill_in_checkpoint && c_.kill_in == KillPoint::kCopy)
      KillSelf(rank_, done, "once it copied the checkpoint");
    job.step = done;
    job.persist = actions.persist;
    job.kill = actions.kill_in_checkpoint;  // kill_in = "write"
    StartSave(std::move(job));
  } else {
    if (rank_ == 0) {
      Status s = ckpt_->Write(done, EncodeTensors(job.file.ToTensors()));
      if (!s.ok()) throw Error(NotSaved(done, s.message()));
    }
    // nobody runs ahead of a checkpoint in progress
    dist_->pg().barrier()->wait();
  }
  if (rank_ == 0) {
    static const char* const kHow[] = {
        "sync", "async: the copy; written in the background",
        "memory: the copy; written to shared memory in the background"};
    std::printf("checkpoint step %lld: training waited %.1f ms (%s%s)\n",
                (long long)done, MsSince(start),
                kHow[static_cast<int>(c_.checkpoint_mode)],
                copies_ && actions.persist ? ", and to disk" : "");
  }
}

// At most one write in flight: one still running when the next checkpoint
// is due is waited for and said, never skipped; one that failed fails the
// run as a sync write would (the last good checkpoint stays the newest).
void Trainer::WaitForSave(int64_t due) {
  const bool was_running = saver_.running();
  AsyncSave::Finished f = saver_.Wait();
  if (f.step < 0) return;
  if (!f.status.ok())
    throw Error(NotSaved(f.step, f.status.message() + " (in the background)"));
  if (!unpersisted_.empty()) {
    const std::string why = std::move(unpersisted_);
    unpersisted_.clear();
    // The run's end (or a stop) must leave it on disk; until then the copy
    // in this node's memory holds it, and the next persist retries.
    if (due < 0) throw Error(NotSaved(f.step, why + " (kept in memory)"));
    std::fprintf(stderr,
                 "rank %d: checkpoint step %lld is in this node's memory but "
                 "not on disk: %s; the next persist (checkpoint.persist_every) "
                 "retries\n",
                 rank_, (long long)f.step, why.c_str());
  }
  if (rank_ != 0) return;
  if (was_running) {
    std::printf(
        "checkpoint step %lld: still being written when %s; training waited "
        "%.1f ms for it (write %.1f ms)\n",
        (long long)f.step,
        due < 0 ? "the run ended"
                : ("step " + std::to_string(due) + " was due").c_str(),
        f.waited_s * 1000, f.write_s * 1000);
  } else {
    std::printf("checkpoint step %lld: written in the background in %.1f ms\n",
                (long long)f.step, f.write_s * 1000);
  }
}

std::string Trainer::NotSaved(int64_t step, const std::string& why) const {
  const std::vector<int64_t> steps = ckpt_->Steps();
  std::string newest = "none";
  for (int64_t s : steps) {
    if (s < step) {
      newest = "step " + std::to_string(s) + " (it still loads)";
      break;
    }
  }
  return "checkpoint at step " + std::to_string(step) + " not saved: " + why +
         ". The newest checkpoint in " + ckpt_->dir() + " is " + newest +
         "; free space there (or make it writable), or set checkpoint.dir to "
         "another folder, then resume";
}

void Trainer::ReserveStaging() {
  if (!staging_.staged() || !ckpt_ ||
      c_.checkpoint_mode == CheckpointMode::kSync)
    return;
  const auto start = std::chrono::steady_clock::now();
  const bool whole = rank_ == 0 || (copies_ && dist_->env().local_rank == 0);
  staging_.Begin();
  strategy_->Copy(*opt_, whole, staging_.copier());
  staging_.End().Wait();
  staging_.Fence();
  if (rank_ == 0) {
    std::printf(
        "checkpoint buffers: %.1f MB of pinned host memory, made in "
        "%.1f ms\n",
        static_cast<double>(staging_.pinned_bytes()) / 1e6, MsSince(start));
  }
}

void Trainer::StartSave(SaveJob job) {
  if (job.shard && !save_store_) save_store_ = dist_->ConnectStore();
  saver_.Start(job.step, [this, job = std::move(job)]() mutable {
    return WriteSave(job);
  });
}

// The saver's thread. Serialized and checksummed once for both the memory
// copy and the disk. In memory mode the copy comes first and alone on most
// checkpoints: a worker that dies later still leaves it to dtrun, which
// persists it; every persist_every-th one then also goes to disk, exactly
// as an async checkpoint would, so a node that dies loses at most the
// steps since then.
Status Trainer::WriteSave(SaveJob& job) {
  job.ready.Wait();
  if (c_.save_delay_ms > 0) {  // [fault] save_delay_ms: a slow disk
    std::this_thread::sleep_for(std::chrono::milliseconds(c_.save_delay_ms));
  }
  std::string shard_payload, shard_header, step_payload, step_header;
  if (job.shard) {
    shard_payload = EncodeTensors(*job.shard);
    shard_header = CheckpointHeader(shard_payload);
  }
  if (job.whole) {
    if (job.encode) {
      for (auto& [name, t] : job.encode()) job.file.parts[name] = std::move(t);
    }
    step_payload = EncodeTensors(job.file.ToTensors());
    step_header = CheckpointHeader(step_payload);
  }
  // fault.kill_in = "write": halfway through this rank's first write,
  // the memory copy's in memory mode, else the file's.
  std::function<void()> halfway;
  if (job.kill)
    halfway = [this, &job] {
      KillSelf(rank_, job.step, "halfway through the write");
    };
  if (copies_) {
    namespace mc = memory_checkpoint;
    std::vector<mc::FileToWrite> files;
    if (job.shard) {
      files.push_back({CheckpointDir::ShardName(job.step, rank_), shard_header,
                       shard_payload, 0});
    }
    if (job.whole) {
      files.push_back({CheckpointDir::StepName(job.step), step_header,
                       step_payload, job.shard ? world_ : 0});
    }
    if (!files.empty()) {
      Status s = copies_->Write(job.step, world_, rank_, files, halfway);
      if (!s.ok()) return s;
    }
    if (!job.persist) return Status::Ok();
    Status disk = WriteToDisk(job, shard_payload, shard_header, step_payload,
                              step_header, nullptr);
    if (!disk.ok()) unpersisted_ = disk.message();
    return Status::Ok();
  }
  return WriteToDisk(job, shard_payload, shard_header, step_payload,
                     step_header, halfway);
}

// Each rank's shard is durable before the step's file names it: the
// saver's thread says so through the store (a key per rank and step), and
// rank 0's thread waits for every rank's key before it writes the step's
// file. No collective runs off the loop's thread.
Status Trainer::WriteToDisk(const SaveJob& job,
                            const std::string& shard_payload,
                            const std::string& shard_header,
                            const std::string& step_payload,
                            const std::string& step_header,
                            const std::function<void()>& halfway) {
  const std::string key = dist_->attempt_prefix() + "dtrun_ckpt/" +
                          std::to_string(job.step) + "/durable/";
  // fault.kill_in = "write": once half of this rank's first file is out
  auto half = [&halfway](size_t total) -> std::function<void(size_t)> {
    if (!halfway) return nullptr;
    return [&halfway, total](size_t written) {
      if (written >= total / 2) halfway();
    };
  };
  // A shard that could not be written is said too ("failed"), so that
  // rank 0 does not wait for it.
  if (job.shard) {
    Status s =
        WriteCheckpointFile(ckpt_->ShardPath(job.step, rank_), shard_payload,
                            half(shard_payload.size()), shard_header);
    Status said =
        save_store_->Set(key + std::to_string(rank_), s.ok() ? "1" : "failed");
    if (!s.ok()) return s;
    if (!said.ok()) return said;
  }
  if (rank_ != 0) return Status::Ok();
  if (job.shard) {
    std::vector<std::string> keys;
    for (int r = 0; r < world_; ++r) keys.push_back(key + std::to_string(r));
    Status s = save_store_->Wait(keys, save_store_->timeout());
    if (!s.ok()) return s;
    for (int r = 0; r < world_; ++r) {
      Result<std::string> v = save_store_->Get(keys[static_cast<size_t>(r)]);
      if (!v.ok()) return v.status();
      if (*v != "1") {
        return Status::Io("rank " + std::to_string(r) +
                          " could not write its shard (its log says why)");
      }
    }
  }
  ckpt_->on_chunk = job.shard ? nullptr : half(step_payload.size());
  return ckpt_->Write(job.step, step_payload, step_header);
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
  WaitForSave(-1);  // the last checkpoint is durable before "done"
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
  // "auto" picks NCCL when a GPU is visible; asked to train on the CPU, it
  // means gloo (NCCL moves GPU tensors only).
  if (c.backend == "auto" && c.device == "cpu") popts.backend = "gloo";
  Trainer trainer(c, Distributed::FromEnv(popts));
  try {
    return trainer.Run();
  } catch (const std::exception& e) {
    // Before the unwinding closes the process group: the peers' errors
    // (a closed connection) come after this one, in time and in the
    // launcher's choice of the root cause.
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    WriteWorkerErrorFile(path ? path : "",
                         dynamic_cast<const Error*>(&e) ? "dtrun::train::Error"
                                                        : "std::exception",
                         e.what());
    throw;
  }
}

}  // namespace dtrun::train
