// One rank's training run: the model, the data, the strategy and the
// optimizer set up from the config, then the loop (step, checkpoint, log,
// evaluate, inject faults). Checkpoints are the Checkpointer's
// (lib/checkpointing/checkpointer.h); what differs between DDP and FSDP is the
// Strategy.
#include "lib/trainer.h"
#include "lib/trainer_loop.h"

#include <malloc.h>
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
#include <optional>
#include <sstream>
#include <thread>

#include "lib/formats/checkpoint_payload.h"
#include "lib/in_place_recovery.h"
#include "lib/parallel/in_place.h"
#include "lib/checkpointing/checkpointer.h"
#include "lib/models/data.h"
#include "lib/faults.h"
#include "lib/optimizer.h"
#include "lib/loss_scaler.h"
#include "lib/precision.h"
#include "lib/process_group.h"
#include "lib/formats/sha256.h"
#include "lib/checkpointing/state_copy.h"
#include "lib/parallel/strategy.h"
#include "lib/train_plan.h"
#include "lib/parallel/with_named_state.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/util/os_util.h"
#include "rendezvous/in_place.h"

namespace dtrun::train {
namespace {

// Fault injection: stop beating and wait forever, as a wedged rank does.
[[gnu::noinline]] void HangForever(int rank, int64_t step) {
  std::fprintf(stderr, "fault injection: rank %d hangs after step %lld\n", rank,
               (long long)step);
  for (;;) pause();
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

}  // namespace

Trainer::Trainer(const TrainConfig& c, TrainParts parts,
                 std::unique_ptr<Distributed> dist,
                 std::optional<Carried> carried)
    : c_(c),
      parts_(std::move(parts)),
      dist_(std::move(dist)),
      rank_(dist_->rank()),
      world_(dist_->world_size()),
      device_(DeviceOf(*dist_, c_)),
      carried_(std::move(carried)) {
  if (!parts_.model || !parts_.batch)
    throw Error("TrainParts needs a model and a batch source");
  // Every rank starts from the same weights (seeded with train.seed)
  // before the strategy broadcasts or shards them.
  blank_ = StartsBlank();
  torch::manual_seed(c_.seed);
  model_ = blank_ ? parts_.model_for_resume() : parts_.model();
  if (!model_.module || !model_.forward)
    throw Error("TrainParts::model made no model (a module and its forward)");
  // Before the strategy: DDP broadcasts it, FSDP shards it.
  if (!c_.init_from.empty()) {
    LoadStateDict(*model_.module, c_.init_from,
                  "model.init_from '" + c_.init_from + "'");
  }
  model_.module->to(device_);
  // A replacement in place restores a checkpoint right after (FSDP),
  // with survivors that broadcast nothing.
  strategy_ =
      MakeStrategy(model_, &dist_->pg(), c_,
                   rendezvous::in_place::Wanted() && dist_->JoinsInPlace());
  if (parts_.save_state && parts_.load_state) {
    strategy_ = std::make_unique<WithNamedState>(
        std::move(strategy_), "user.", parts_.save_state, parts_.load_state);
  } else if (parts_.save_state || parts_.load_state) {
    throw Error("TrainParts: save_state and load_state go together");
  }
  if (c_.precision == "fp16") UseLossScaler();
  KeepSkippedInState();
  opt_ = MakeOptimizer(c_, strategy_->OptimizerParams());
  torch::manual_seed(RankSeed(c_, rank_, 0));
  ckpt_ = Checkpointer::Make(CheckpointContext{
      &c_, dist_.get(), strategy_.get(), opt_.get(), device_});
  SetUpInPlace();
  if (rank_ == 0) {
    std::printf("training on %s (backend %s, %d rank%s)\n",
                device_.str().c_str(), dist_->backend().c_str(), world_,
                world_ == 1 ? "" : "s");
  }
}

// A restarted worker on the CPU (DDP or FSDP, replaced in place or
// restarted with its group) nearly always resumes: a model's initial draws
// wait until the resume finds nothing, when the parts can make it without
// them (FSDP shards the blank model, and StartOver loads the drawn one into
// its shards). A rank carrying its state into a new round never needs them.
bool Trainer::StartsBlank() const {
  if (!parts_.model_for_resume) return false;
  if (carried_) return true;
  return dist_->env().restart_count > 0 && !c_.checkpoint_dir.empty() &&
         c_.init_from.empty() && device_.is_cpu();
}

// With dtrun's --restart=in-place: the watcher that lets this rank outlive
// a dead peer, when the run can keep its state through that; otherwise
// rank 0 says why a failure will restart the whole group (dtrun says it
// too, once a worker fails, but the user reads this at the start).
void Trainer::SetUpInPlace() {
  if (InPlaceRecovery::Possible(*dist_, *strategy_, ckpt_.get())) {
    in_place_ = std::make_unique<InPlaceRecovery>(
        InPlaceRecovery::Context{dist_.get(), strategy_.get(), opt_.get(),
                                 ckpt_.get(), [this] { StartOver(); }});
  } else if (const std::string why =
                 InPlaceRecovery::WhyNot(*dist_, *strategy_, ckpt_.get());
             !why.empty() && rank_ == 0) {
    std::fprintf(stderr,
                 "in-place recovery is off for this run: %s; a failure "
                 "restarts the whole group\n",
                 why.c_str());
  }
}

int Trainer::Run() {
  // For dtrun's recovery report: when this rank was set up (its process
  // group and model) and when its state was in place.
  const double init_unix = os::UnixNow();
  std::string source;
  const int64_t start = Resume(&source);
  rendezvous::Heartbeat::Resumed(start, source.c_str(), init_unix,
                                 os::UnixNow());
  if (in_place_)
    rendezvous::in_place::MarkReady(strategy_->EveryRankHoldsAll());
  if (rank_ == 0 && !c_.metrics_path.empty())
    metrics_.open(c_.metrics_path, std::ios::app);
  window_start_ = std::chrono::steady_clock::now();
  rendezvous::Heartbeat heartbeat;  // dtrun --hang-timeout: one pwrite per step
  held_ = start;
  for (int64_t step = start; step < c_.steps;) {
    try {
      if (RunStep(step, heartbeat)) return 0;
      ++step;
    } catch (const std::exception& e) {
      if (!in_place_) throw;
      step = held_ = in_place_->Regroup(e.what(), held_);
    }
  }
  heartbeat.Done();
  return Finish();
}

// A replacement in a group re-formed in place takes its state from a
// survivor (DDP); any other rank, and FSDP's replacement with the
// survivors, from the newest checkpoint, or starts fresh.
int64_t Trainer::Resume(std::string* source) {
  if (in_place_ && InPlaceRecovery::JoinsFromPeer(*dist_, *strategy_)) {
    *source = "peer";
    return in_place_->Join();
  }
  if (const int64_t step = ResumeFromPeers(source); step >= 0) return step;
  const int64_t start = ckpt_ ? ckpt_->Resume() : 0;
  if (start == 0) {
    if (blank_) DrawInitialWeights();
    strategy_->StartFresh();
  }
  *source = ckpt_ ? ckpt_->source() : "none";
  return start;
}

// A rank kept from the last round restores what it carried; then every
// rank of the attempt agrees (collective), the ranks behind taking the
// newest state. Before the step loop the state is whole again, whatever
// the world size: each step's batches are cut for this round's ranks.
int64_t Trainer::ResumeFromPeers(std::string* source) {
  if (!in_place_ || !InPlaceRecovery::TakesNewestAtStart(*dist_, *strategy_))
    return -1;
  int64_t held = -1;
  if (carried_) {
    Status s = strategy_->Restore(carried_->state, *opt_);
    if (!s.ok()) throw Error(s.message());
    held = carried_->step;
    if (ckpt_) ckpt_->JoinInPlace(carried_->epoch);
    carried_.reset();
  }
  bool received = false;
  const int64_t step = in_place_->TakeNewest(held, &received);
  if (step < 0) return -1;
  *source = received ? "peer" : "kept";
  if (rank_ == 0) {
    std::printf("in place: round %d goes on from step %lld with %d rank%s\n",
                dist_->env().restart_count, (long long)step, world_,
                world_ == 1 ? "" : "s");
  }
  return step;
}

bool Trainer::RunStep(int64_t step, rendezvous::Heartbeat& heartbeat) {
  loss_ = Step(step);
  if (!reserved_ && ckpt_) ckpt_->Reserve();
  reserved_ = true;
  window_samples_ +=
      static_cast<int64_t>(c_.batch_size) * c_.accumulate * world_;
  const int64_t done = step + 1;
  const StepActions actions = ActionsAfterStep(
      c_, InjectedFaults(), done, rank_, dist_->env().restart_count == 0);
  // The user's state is the step's before its checkpoint takes it.
  if (parts_.on_step_end) {
    parts_.on_step_end(
        StepEnd{done, loss_, LearningRate(c_, step), grad_norm_, applied_});
  }
  if (actions.checkpoint) {
    ckpt_->Save(done, actions);
    if (parts_.on_checkpoint) parts_.on_checkpoint(done);
  }
  if (actions.log) Log(done, LearningRate(c_, step));
  if (actions.eval && Evaluates()) Eval(done);
  InjectFaults(actions, done);
  heartbeat.Beat(done, compute_s_, c_.steps);
  if (!actions.stop) return false;
  if (ckpt_) ckpt_->Wait(-1);  // the stop's checkpoint is durable first
  if (rank_ == 0) std::printf("stopped after step %lld\n", (long long)done);
  return true;
}

// What a first attempt's model starts from (model()'s draws from the seed)
// into the blank one, and the generator left where the constructor leaves
// it: the run goes on bitwise as one that drew them at the start. FSDP's
// module holds no whole parameters once sharded: its shards take them.
void Trainer::DrawInitialWeights() {
  if (c_.strategy == StrategyKind::kFsdp) return StartOver();
  torch::NoGradGuard no_grad;
  torch::manual_seed(c_.seed);
  Model drawn = parts_.model();
  CopyTensors(model_.module->parameters(), drawn.module->parameters());
  torch::manual_seed(RankSeed(c_, rank_, 0));
}

// In place before the first checkpoint (FSDP): every rank back to the
// model model() first drew, as the replacement starts from.
void Trainer::StartOver() {
  torch::NoGradGuard no_grad;
  torch::manual_seed(c_.seed);
  Model drawn = parts_.model();
  if (!c_.init_from.empty()) {
    LoadStateDict(*drawn.module, c_.init_from,
                  "model.init_from '" + c_.init_from + "'");
  }
  strategy_->StartOver(*drawn.module, *opt_);
  torch::manual_seed(RankSeed(c_, rank_, 0));
}

// The optimizer's step, with the clipping's factor and the decay of
// matrices: one pass per parameter for AdamW on the CPU (optimizer.h),
// torch's own step otherwise (the gradients already clipped).
void Trainer::Update(int64_t step, const std::vector<torch::Tensor>& params) {
  StepArgs args;
  args.lr = LearningRate(c_, step);
  args.grad_scale = clip_factor_;
  if (c_.decay == "matrices") {
    if (matrix_masks_.empty()) matrix_masks_ = strategy_->MatrixMasks();
    args.decay_masks = &matrix_masks_;
    args.weight_decay = c_.weight_decay;
  }
  if (fused_) {
    FusedAdamWStep(*opt_, params, args);
  } else {
    if (args.decay_masks) DecayMatrices(params, args);
    opt_->step();
  }
}

// One optimizer step over `accumulate` micro-batches; the loss averaged
// over the ranks (collective).
// Also times the step's compute outside collectives (for the beat, which
// dtrun scores for stragglers): the step's time less the gradient
// collectives' waits, before the loss's all-reduce.
double Trainer::Step(int64_t step) {
  ThrowIfGroupBroken("the step");  // a rank died: no collective will complete
  const auto start = std::chrono::steady_clock::now();
  strategy_->TakeCollectiveSeconds();
  // The step's dropout draws depend on the step alone: a rank that joins
  // at any step (in place, or resumed on another world size) draws what
  // an unbroken run would.
  torch::manual_seed(RankSeed(c_, rank_, step));
  SetLearningRate(*opt_, LearningRate(c_, step));
  opt_->zero_grad();
  double step_loss = 0;
  for (int m = 0; m < c_.accumulate; ++m) {
    step_loss += MicroBatch(step * c_.accumulate + m, m + 1 == c_.accumulate);
  }
  const auto params = strategy_->OptimizerParams();
  fused_ = FusedAdamWApplies(*opt_, params);
  applied_ = CheckGradients(step);
  if (ckpt_) ckpt_->Fence();  // the last checkpoint's copies read it first
  if (applied_) Update(step, params);
  held_ = step + 1;
  compute_s_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count() -
      strategy_->TakeCollectiveSeconds();
  const Faults& f = InjectedFaults();
  if (rank_ == f.slow_rank && f.slow_factor > 1) {  // [fault] slow_rank
    std::this_thread::sleep_for(
        std::chrono::duration<double>(compute_s_ * (f.slow_factor - 1)));
    compute_s_ *= f.slow_factor;
  }
  return AllMean(dist_->pg(), step_loss, device_);
}

// fp16's loss scale, in each checkpoint as "scaler.scale" and
// "scaler.growth_tracker" (float64 scalars), restored with it.
void Trainer::UseLossScaler() {
  if (device_.is_cpu() && !AutocastSupports(device_.type(), torch::kHalf)) {
    throw Error(
        "train.precision = \"fp16\" on the CPU needs libtorch 2.4 or newer "
        "(this libtorch's CPU autocast has bfloat16 only): use \"bf16\", "
        "or train on a GPU");
  }
  scaler_.emplace(c_.init_scale, c_.growth_interval);
  auto save = [this] {
    auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    return UserState{
        {"scale", torch::scalar_tensor(scaler_->scale(), f64)},
        {"growth_tracker",
         torch::scalar_tensor(double(scaler_->growth_tracker()), f64)}};
  };
  auto load = [this](const UserState& s) {
    auto scale = s.find("scale"), tracker = s.find("growth_tracker");
    if (scale == s.end() || tracker == s.end()) {
      throw Error(
          "the checkpoint has no loss scale (scaler.scale): it was not "
          "saved by a train.precision = \"fp16\" run; resume it with the "
          "precision it was saved with");
    }
    scaler_->Restore(scale->second.item<double>(),
                     tracker->second.item<int64_t>());
  };
  strategy_ = std::make_unique<WithNamedState>(std::move(strategy_), "scaler.",
                                               save, load);
}

// The count of skipped steps belongs to the state it was counted in: a
// resume (from disk, a memory copy or a peer) takes the saved step's
// count, so steps redone after a failure are not counted twice. Saved as
// "trainer.skipped_steps" (int64) once a step was skipped; the checkpoints
// of runs that skipped none are unchanged.
void Trainer::KeepSkippedInState() {
  auto save = [this] {
    UserState s;
    if (skipped_ > 0) s["skipped_steps"] = torch::scalar_tensor(skipped_);
    return s;
  };
  auto load = [this](const UserState& s) {
    auto it = s.find("skipped_steps");
    skipped_ = it == s.end() ? 0 : it->second.item<int64_t>();
  };
  strategy_ = std::make_unique<WithNamedState>(std::move(strategy_), "trainer.",
                                               save, load);
}

// Whether step `step`'s gradients are applied: fp16's are divided by the
// loss scale first; with clipping or a loss scale, their global norm
// (collective: the same verdict on every rank) must be finite, and they
// are clipped to optimizer.max_grad_norm. A skipped step is counted; the
// loss scale halves on one and grows after growth_interval finite steps.
bool Trainer::CheckGradients(int64_t step) {
  if (scaler_) strategy_->ScaleGrads(1.0 / scaler_->scale());
  if (c_.max_grad_norm <= 0 && !scaler_) return true;
  const double norm = strategy_->GradNorm();
  if (c_.max_grad_norm > 0) grad_norm_ = norm;
  const bool finite = std::isfinite(norm);
  clip_factor_ = 1;
  if (finite && c_.max_grad_norm > 0 && fused_) {  // applied in its pass
    clip_factor_ = Strategy::ClipFactor(norm, c_.max_grad_norm);
  } else if (finite && c_.max_grad_norm > 0) {
    strategy_->ClipGrads(norm, c_.max_grad_norm);
  }
  if (!finite && ++skipped_ == 1 && rank_ == 0) {
    std::printf(
        "step %lld: gradient norm %g: step skipped, not applied (each skip "
        "is counted in the progress line)%s\n",
        (long long)step + 1, norm, scaler_ ? "; the loss scale halves" : "");
  }
  if (scaler_) scaler_->Update(finite);
  return finite;
}

// One micro-batch: the parts' batch (moved to the device when it is not
// there), the forward and the loss under the run's precision, the backward
// outside it (as torch.autocast has it), the last micro-batch's backward
// starting the gradient collectives.
double Trainer::MicroBatch(int64_t micro, bool last) {
  BatchRequest request;
  request.seed = c_.seed;
  request.micro = micro;
  request.rank = rank_;
  request.world = world_;
  request.batch_size = c_.batch_size;
  request.drop_last = c_.drop_last;
  request.device = device_;
  Batch b = parts_.batch(request);
  torch::Tensor loss;
  {
    AutocastScope autocast(device_.type(), ComputeDtype());
    torch::Tensor out = strategy_->Forward(b.input.to(device_));
    torch::Tensor target = b.target.to(device_);
    loss = (parts_.loss ? parts_.loss(out, target)
                        : torch::cross_entropy_loss(out, target)) /
           c_.accumulate;
  }
  const double value = loss.item<double>();
  // fp16: the backward of the scaled loss, so that small gradients survive
  // float16; CheckGradients divides them back.
  strategy_->Backward(scaler_ ? loss * scaler_->scale() : loss, last);
  return value;
}

void Trainer::Log(int64_t done, double lr) {
  const double secs = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - window_start_)
                          .count();
  const double rate = window_samples_ / std::max(secs, 1e-9);
  std::string clip;
  char s[80];
  if (c_.max_grad_norm > 0) {
    std::snprintf(s, sizeof s, " grad_norm %.4g", grad_norm_);
    clip = s;
  }
  if (scaler_) {
    std::snprintf(s, sizeof s, " loss_scale %g", scaler_->scale());
    clip += s;
  }
  if (skipped_ > 0) clip += " skipped " + std::to_string(skipped_);
  std::printf("step %lld loss %.6f lr %.5f samples/s %.0f%s\n", (long long)done,
              loss_, lr, rate, clip.c_str());
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
    }
    if (scaler_) metrics_ << ", \"loss_scale\": " << scaler_->scale();
    if (c_.max_grad_norm > 0 || scaler_)
      metrics_ << ", \"skipped_steps\": " << skipped_;
    metrics_ << "}\n";
    metrics_.flush();
  }
  window_start_ = std::chrono::steady_clock::now();
  window_samples_ = 0;
}

void Trainer::Eval(int64_t done) {
  metrics_last_ = Evaluate();
  if (rank_ != 0) return;
  for (const auto& [name, value] : metrics_last_) {
    std::printf("step %lld %s %.4f\n", (long long)done, name.c_str(), value);
    if (metrics_)
      metrics_ << "{\"step\": " << done << ", \"" << name << "\": " << value
               << "}\n";
  }
  std::fflush(stdout);
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
  if (Evaluates()) metrics_last_ = Evaluate();
  auto params = strategy_->FullParams();
  if (rank_ == 0) {
    std::string metrics;
    for (const auto& [name, value] : metrics_last_) {
      char v[64];
      std::snprintf(v, sizeof v, "%.4f", value);
      metrics += " " + name + "=" + v;
    }
    std::printf("done: steps=%lld loss=%.9g%s params_sha256=%s%s\n",
                (long long)c_.steps, loss_, metrics.c_str(),
                Sha256Of(params).c_str(),
                c_.max_grad_norm > 0
                    ? (" skipped_steps=" + std::to_string(skipped_)).c_str()
                    : "");
    std::fflush(stdout);
  }
  return 0;
}

// Through the strategy's Forward(), since FSDP must gather its units; eval
// mode switches dropout off.
std::map<std::string, double> Trainer::Evaluate() {
  torch::NoGradGuard no_grad;
  model_.module->eval();
  auto metrics = parts_.evaluate(
      [&](const torch::Tensor& x) {
        AutocastScope autocast(device_.type(), ComputeDtype());
        torch::Tensor out = strategy_->Forward(x.to(device_));
        // Out of autocast in float32, as FSDP returns it: a metric
        // computed from it (a loss) is then the same under DDP and FSDP.
        const auto dtype = out.scalar_type();
        return dtype == torch::kBFloat16 || dtype == torch::kHalf
                   ? out.to(torch::kFloat)
                   : out;
      },
      device_);
  model_.module->train();
  return metrics;
}

// A CPU step frees and allocates the same activation-sized blocks over and
// over; glibc gives each block over its mmap threshold back to the kernel
// at free and maps it again, zeroed, at the next allocation, so a GPT's
// step spent a third of its time in page faults (tests/bench/README.md,
// "A GPT from nanoGPT"). Blocks up to 32 MiB now stay in the heap for
// reuse, and the heap is not trimmed under 1 GiB free. A process that sets
// glibc's malloc tunables itself keeps them.
static void KeepFreedMemory() {
  for (const char* v :
       {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}) {
    if (std::getenv(v)) return;
  }
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int Train(const TrainConfig& c, TrainParts parts) {
  if (std::string err = ValidateConfig(c); !err.empty()) throw Error(err);
  if (std::string err = ValidateFaults(c, InjectedFaults()); !err.empty())
    throw Error(err);
  torch::set_num_threads(1);  // ranks share the host's cores; one thread each
  KeepFreedMemory();
  ProcessGroupOptions popts;
  popts.backend = c.backend;
  // "auto" picks NCCL when a GPU is visible; asked to train on the CPU, it
  // means gloo (NCCL moves GPU tensors only).
  if (c.backend == "auto" && c.device == "cpu") popts.backend = "gloo";
  // A rank dtrun keeps for a new round (rendezvous/in_place.h, step 4)
  // leaves its trainer with its state, and builds it again there.
  std::optional<Carried> carried;
  for (int round = -1;;) {
    if (round >= 0) ResetGroupAttempts(round);  // the old trainer is gone
    Trainer trainer(c, parts, Distributed::FromEnv(popts), std::move(carried));
    try {
      return trainer.Run();
    } catch (const NewRound& e) {
      carried = trainer.Carry();
      std::fprintf(stderr,
                   "rank %s: %s\nrank %s: kept for a new round, with step "
                   "%lld\n",
                   std::getenv("RANK"), e.what(), std::getenv("RANK"),
                   (long long)carried->step);
      round = InPlaceRecovery::EnterNewRound();
    } catch (const std::exception& e) {
      // Before the unwinding closes the process group: the peers' errors
      // (a closed connection) come after this one, in time and in the
      // launcher's choice of the root cause.
      const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
      WriteWorkerErrorFile(path ? path : "",
                           dynamic_cast<const Error*>(&e)
                               ? "dtrun::train::Error"
                               : "std::exception",
                           e.what());
      throw;
    }
  }
}

}  // namespace dtrun::train
