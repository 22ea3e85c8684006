// One rank's training run: the model, the data, the strategy and the
// optimizer set up from the config, then the loop (step, checkpoint, log,
// evaluate, inject faults). Checkpoints are the Checkpointer's
// (lib/checkpointer.h); what differs between DDP and FSDP is the Strategy.
#include "lib/trainer.h"

#include <signal.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>

#include "lib/checkpoint_payload.h"
#include "lib/checkpointer.h"
#include "lib/data.h"
#include "lib/precision.h"
#include "lib/process_group.h"
#include "lib/sha256.h"
#include "lib/state_copy.h"
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

// A Linear layer whose parameters are given, not drawn: torch::nn::Linear's
// constructor draws its weights (0.34 s for 96 M parameters), which a
// restarted worker's resume overwrites at once. Same names and forward.
class BlankLinearImpl : public torch::nn::Module {
 public:
  BlankLinearImpl(torch::Tensor w, torch::Tensor b)
      : weight(register_parameter("weight", std::move(w))),
        bias(register_parameter("bias", std::move(b))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(x, weight, bias);
  }
  torch::Tensor weight, bias;
};

// MakeModel's MLP with its parameters left undrawn, carved from one
// mapping populated in one call (the restore then writes them without a
// fault per page); DrawInitialWeights fills them when nothing is resumed.
std::shared_ptr<torch::nn::SequentialImpl> MakeBlankMlp(const TrainConfig& c,
                                                        int features,
                                                        int classes) {
  std::vector<int64_t> widths{features};
  for (int h : c.hidden) widths.push_back(h);
  widths.push_back(classes);
  std::vector<torch::Tensor> like;  // not touched: only their shapes count
  for (size_t i = 1; i < widths.size(); ++i) {
    like.push_back(torch::empty({widths[i], widths[i - 1]}));
    like.push_back(torch::empty({widths[i]}));
  }
  const std::vector<torch::Tensor> params = PopulatedLike(like);
  auto seq = std::make_shared<torch::nn::SequentialImpl>();
  for (size_t i = 1; i < widths.size(); ++i) {
    seq->push_back(std::make_shared<BlankLinearImpl>(params[2 * i - 2],
                                                     params[2 * i - 1]));
    if (i + 1 == widths.size()) break;
    seq->push_back(torch::nn::ReLU());
    if (c.dropout > 0) seq->push_back(torch::nn::Dropout(c.dropout));
  }
  return seq;
}

// The named tensors of model.init_from: a .dtck file (a DDP step's file, or
// one `python -m dtrun.checkpoint import` wrote from any torch.save file),
// or a torch.save'd plain dict of tensors (libtorch's reader takes no
// OrderedDict, which model.state_dict() is).
std::map<std::string, torch::Tensor> ReadStateDictFile(const std::string& path) {
  const std::string what = "model.init_from '" + path + "'";
  const std::string fix =
      "; convert it with python -m dtrun.checkpoint import " + path +
      " OUT.dtck (or save dict(model.state_dict()))";
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(what + ": cannot be read: " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)),
                          std::istreambuf_iterator<char>());
  std::map<std::string, torch::Tensor> given;
  if (bytes.size() >= 6 && std::memcmp(bytes.data(), "DTCKPT", 6) == 0) {
    auto view = VerifyCheckpointBytes(std::string(bytes.begin(), bytes.end()));
    if (!view.ok()) throw Error(what + ": " + view.status().message());
    auto tensors = DecodeTensors(*view);
    if (!tensors.ok()) throw Error(what + ": " + tensors.status().message());
    if (tensors->count("fsdp_shards"))
      throw Error(what + " is an FSDP step's file, whose shards hold the "
                         "weights; convert the folder with python -m "
                         "dtrun.checkpoint convert DIR OUT.pt, then import it");
    const std::string ddp = "ddp.model.";
    bool step_file = tensors->count("step") > 0;
    for (auto& [name, t] : *tensors) {
      if (!step_file) {
        given[name] = t.clone();
      } else if (name.compare(0, ddp.size(), ddp) == 0) {
        given[name.substr(ddp.size())] = t.clone();
      }
    }
    return given;
  }
  c10::IValue v;
  try {
    v = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    // The reader turns collections.OrderedDict into None, then fails to
    // fill it: the pickle names the class.
    static const std::string kOrdered = "collections\nOrderedDict";
    if (std::search(bytes.begin(), bytes.end(), kOrdered.begin(),
                    kOrdered.end()) != bytes.end())
      v = c10::IValue();
    else {
      std::string why = e.what();
      throw Error(what + ": neither a .dtck file nor one of torch.save (" +
                  why.substr(0, why.find('\n')) + ")" + fix);
    }
  }
  if (v.isNone())
    throw Error(what + " holds an OrderedDict (as torch.save(model.state_dict()) "
                       "writes), which libtorch's reader cannot take" + fix);
  if (!v.isGenericDict())
    throw Error(what + " holds a " + std::string(v.tagKind()) +
                ", not a state dict (a dict of tensors by name)" + fix);
  for (const auto& e : v.toGenericDict()) {
    if (!e.key().isString() || !e.value().isTensor())
      throw Error(what + ": an entry that is not a name and a tensor" + fix);
    given[e.key().toStringRef()] = e.value().toTensor();
  }
  return given;
}

// model.init_from into the model's parameters and buffers by name. Every
// name must match, with its shape: a partial load would train a model that
// is half drawn.
void LoadStateDictFile(torch::nn::Module& model, const std::string& path) {
  const std::string what = "model.init_from '" + path + "'";
  std::map<std::string, torch::Tensor> given = ReadStateDictFile(path);
  torch::NoGradGuard no_grad;
  std::string names;
  auto take = [&](const std::string& name, torch::Tensor& into) {
    names += (names.empty() ? "" : ", ") + name;
    auto it = given.find(name);
    if (it == given.end())
      throw Error(what + " has no '" + name + "' (the model's " + name +
                  " would stay drawn)");
    if (it->second.sizes() != into.sizes()) {
      std::ostringstream s;
      s << what << ": '" << name << "' is " << it->second.sizes()
        << ", the model's is " << into.sizes();
      throw Error(s.str());
    }
    into.copy_(it->second);
    given.erase(it);
  };
  for (auto& p : model.named_parameters()) take(p.key(), p.value());
  for (auto& b : model.named_buffers()) take(b.key(), b.value());
  if (!given.empty())
    throw Error(what + ": '" + given.begin()->first +
                "' is not in this model (its names: " + names + ")");
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
  double Step(int64_t step);
  double MicroBatch(int64_t micro, bool last);
  void Log(int64_t done, double lr);
  void Eval(int64_t done);
  void InjectFaults(const StepActions& actions, int64_t done);
  int Finish();
  double Evaluate();
  bool Evaluates() const { return rank_ == 0 || strategy_->CollectiveEval(); }
  // train.precision's dtype for autocast (float32: none).
  torch::ScalarType ComputeDtype() const {
    return c_.precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  }
  void DrawInitialWeights();

  const TrainConfig& c_;
  std::unique_ptr<Distributed> dist_;
  const int rank_, world_;
  const torch::Device device_;
  Dataset train_, test_;
  int features_ = 0, classes_ = 0;
  // The model was made without its initial draws (a restart, which
  // resumes; see MakeBlankMlp).
  bool blank_ = false;
  std::shared_ptr<torch::nn::SequentialImpl> model_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::ofstream metrics_;  // rank 0, with metrics_path
  double loss_ = 0;        // the last step's, averaged over ranks
  double grad_norm_ = -1;  // the last step's, before clipping; -1: not taken
  int64_t skipped_ = 0;    // steps not applied: their gradients not finite
  double compute_s_ = 0;   // the last step's time outside collectives
  // Throughput since the last progress line.
  std::chrono::steady_clock::time_point window_start_;
  int64_t window_samples_ = 0;
  // null without checkpoint.dir; last, so that its saver is joined first
  std::unique_ptr<Checkpointer> ckpt_;
};

Trainer::Trainer(const TrainConfig& c, std::unique_ptr<Distributed> dist)
    : c_(c),
      dist_(std::move(dist)),
      rank_(dist_->rank()),
      world_(dist_->world_size()),
      device_(DeviceOf(*dist_, c_)) {
  Dataset all = LoadDataset(c_);
  SplitTrainTest(all, c_.test_fraction, &train_, &test_);
  // MakeModel seeds the shared generator with c.seed, so every rank starts
  // from the same weights before the strategy broadcasts or shards them.
  // A restarted DDP worker on the CPU nearly always resumes: its MLP's
  // initial draws wait until the resume finds nothing.
  features_ = all.features;
  classes_ = all.classes;
  blank_ = dist_->env().restart_count > 0 && !c_.checkpoint_dir.empty() &&
           c_.init_from.empty() &&
           c_.strategy == StrategyKind::kDdp && c_.model == ModelKind::kMlp &&
           device_.is_cpu();
  model_ = blank_ ? MakeBlankMlp(c_, features_, classes_)
                  : MakeModel(c_, features_, classes_);
  // Before the strategy: DDP broadcasts it, FSDP shards it.
  if (!c_.init_from.empty()) LoadStateDictFile(*model_, c_.init_from);
  model_->to(device_);
  strategy_ = MakeStrategy(model_, &dist_->pg(), c_);
  opt_ = MakeOptimizer(c_, strategy_->OptimizerParams());
  torch::manual_seed(RankSeed(c_, rank_, 0));
  ckpt_ = Checkpointer::Make(CheckpointContext{
      &c_, dist_.get(), strategy_.get(), opt_.get(), device_});
  if (rank_ == 0) {
    std::printf("training on %s (backend %s, %d rank%s)\n",
                device_.str().c_str(), dist_->backend().c_str(), world_,
                world_ == 1 ? "" : "s");
  }
}

int Trainer::Run() {
  // For dtrun's recovery report: when this rank was set up (its process
  // group and model) and when its state was in place.
  const double init_unix = UnixSeconds();
  const int64_t start = ckpt_ ? ckpt_->Resume() : 0;
  if (start == 0) {
    if (blank_) DrawInitialWeights();
    strategy_->StartFresh();
  }
  rendezvous::Heartbeat::Resumed(start,
                                 ckpt_ ? ckpt_->source().c_str() : "none",
                                 init_unix, UnixSeconds());
  if (rank_ == 0 && !c_.metrics_path.empty())
    metrics_.open(c_.metrics_path, std::ios::app);
  const bool first_attempt = dist_->env().restart_count == 0;
  window_start_ = std::chrono::steady_clock::now();
  rendezvous::Heartbeat heartbeat;  // dtrun --hang-timeout: one pwrite per step
  for (int64_t step = start; step < c_.steps; ++step) {
    loss_ = Step(step);
    if (step == start && ckpt_) ckpt_->Reserve();
    window_samples_ +=
        static_cast<int64_t>(c_.batch_size) * c_.accumulate * world_;
    const int64_t done = step + 1;
    const StepActions actions =
        ActionsAfterStep(c_, done, rank_, first_attempt);
    if (actions.checkpoint) ckpt_->Save(done, actions);
    if (actions.log) Log(done, LearningRate(c_, step));
    if (actions.eval && Evaluates()) Eval(done);
    InjectFaults(actions, done);
    heartbeat.Beat(done, compute_s_, c_.steps);
    if (actions.stop) {
      if (ckpt_) ckpt_->Wait(-1);  // the stop's checkpoint is durable first
      if (rank_ == 0) std::printf("stopped after step %lld\n", (long long)done);
      return 0;
    }
  }
  heartbeat.Done();
  return Finish();
}

// What a first attempt's model starts from (MakeModel's draws from c.seed)
// into the blank one, and the generator left where the constructor leaves
// it: the run goes on bitwise as one that drew them at the start.
void Trainer::DrawInitialWeights() {
  torch::NoGradGuard no_grad;
  auto drawn = MakeModel(c_, features_, classes_);
  CopyTensors(model_->parameters(), drawn->parameters());
  torch::manual_seed(RankSeed(c_, rank_, 0));
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
  bool apply = true;
  if (c_.max_grad_norm > 0) {  // the same verdict on every rank
    grad_norm_ = strategy_->GradNorm();
    if (std::isfinite(grad_norm_)) {
      strategy_->ClipGrads(grad_norm_, c_.max_grad_norm);
    } else {
      apply = false;
      if (++skipped_ == 1 && rank_ == 0) {
        std::printf("step %lld: gradient norm %g: step skipped, not applied "
                    "(each skip is counted in the progress line)\n",
                    (long long)step + 1, grad_norm_);
      }
    }
  }
  if (ckpt_) ckpt_->Fence();  // the last checkpoint's copies read it first
  if (apply) opt_->step();
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
  torch::Tensor loss;
  {
    AutocastScope autocast(device_.type(), ComputeDtype());
    loss = torch::cross_entropy_loss(strategy_->Forward(x), y) / c_.accumulate;
  }
  const double value = loss.item<double>();
  strategy_->Backward(loss, last);
  return value;
}

void Trainer::Log(int64_t done, double lr) {
  const double secs = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - window_start_)
                          .count();
  const double rate = window_samples_ / std::max(secs, 1e-9);
  std::string clip;
  if (c_.max_grad_norm > 0) {
    char s[80];
    std::snprintf(s, sizeof s, " grad_norm %.4g", grad_norm_);
    clip = s;
    if (skipped_ > 0) clip += " skipped " + std::to_string(skipped_);
  }
  std::printf("step %lld loss %.6f lr %.5f samples/s %.0f%s\n",
              (long long)done, loss_, lr, rate, clip.c_str());
  std::fflush(stdout);
  if (metrics_) {
    metrics_ << "{\"step\": " << done << ", \"loss\": " << loss_
             << ", \"samples_per_s\": " << rate;
    if (c_.max_grad_norm > 0) {
      // JSON has no nan: a norm that is not finite is null
      metrics_ << ", \"grad_norm\": ";
      if (std::isfinite(grad_norm_)) {
        metrics_ << grad_norm_;
      } else {
        metrics_ << "null";
      }
      metrics_ << ", \"skipped_steps\": " << skipped_;
    }
    metrics_ << "}\n";
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
  if (ckpt_) ckpt_->Wait(-1);  // the last checkpoint is durable before "done"
  const double acc = Evaluates() ? Evaluate() : 0;
  auto params = strategy_->FullParams();
  if (rank_ == 0) {
    std::printf(
        "done: steps=%lld loss=%.9g eval_accuracy=%.4f params_sha256=%s%s\n",
        (long long)c_.steps, loss_, acc, Sha256Of(params).c_str(),
        c_.max_grad_norm > 0
            ? (" skipped_steps=" + std::to_string(skipped_)).c_str()
            : "");
    std::fflush(stdout);
  }
  return 0;
}

double Trainer::Evaluate() {
  return Accuracy(*model_, test_, device_, [&](const torch::Tensor& x) {
    AutocastScope autocast(device_.type(), ComputeDtype());
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
