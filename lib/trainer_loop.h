#pragma once

// The training loop's class, inside lib (trainer.cc defines it; Train()
// is the public entry, lib/trainer.h).

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/checkpointing/checkpointer.h"
#include "lib/in_place_recovery.h"
#include "lib/loss_scaler.h"
#include "lib/parallel/strategy.h"
#include "lib/process_group.h"
#include "lib/train_plan.h"
#include "lib/trainer.h"
#include "rendezvous/heartbeat.h"

namespace dtrun::train {

// One rank's training run: set up from the config, the parts and the
// launcher's environment, then Run() steps through resume, step,
// checkpoint, log, eval and fault injection; what differs between DDP and
// FSDP is the Strategy. Owns the process group and everything built on it.
// Single-threaded.
class Trainer {
 public:
  // `carried`: what this rank held in the last round, when it outlived
  // that round's group (InPlaceRecovery::Carry).
  Trainer(const TrainConfig& c, TrainParts parts,
          std::unique_ptr<Distributed> dist,
          std::optional<Carried> carried = std::nullopt);
  // The process exit code. Throws NewRound when dtrun keeps this rank for
  // a new round: then Carry() what it holds into the next trainer.
  int Run();
  // ...and its group is abandoned (Distributed::Abandon) before the
  // trainer goes: gloo's threads may wait on the lost node for good.
  Carried Carry() {
    Carried k = in_place_->Carry(held_);
    dist_->Abandon();
    return k;
  }

 private:
  // The state every rank starts from, and where it came from.
  int64_t Resume(std::string* source);
  // A restarted attempt under in-place recovery: the newest state a rank
  // holds (the one carried here first), or -1 (none: the checkpoint's).
  int64_t ResumeFromPeers(std::string* source);
  // One step and what follows it; true when the run stops there.
  bool RunStep(int64_t step, rendezvous::Heartbeat& heartbeat);
  double Step(int64_t step);
  double MicroBatch(int64_t micro, bool last);
  void Log(int64_t done, double lr);
  void Eval(int64_t done);
  void InjectFaults(const StepActions& actions, int64_t done);
  int Finish();
  std::map<std::string, double> Evaluate();
  bool Evaluates() const {
    return parts_.evaluate && (rank_ == 0 || strategy_->CollectiveEval());
  }
  bool StartsBlank() const;
  void DrawInitialWeights();
  void StartOver();
  void SetUpInPlace();
  void Update(int64_t step, const std::vector<torch::Tensor>& params);
  // train.precision's dtype for autocast (float32: none).
  torch::ScalarType ComputeDtype() const {
    if (c_.precision == "fp16") return torch::kHalf;
    return c_.precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  }
  void UseLossScaler();
  void KeepSkippedInState();
  bool CheckGradients(int64_t step);

  const TrainConfig& c_;
  TrainParts parts_;
  std::unique_ptr<Distributed> dist_;
  const int rank_, world_;
  const torch::Device device_;
  std::optional<Carried> carried_;  // until Resume restored it
  // The model was made without its initial draws (a restart, which
  // resumes; TrainParts::model_for_resume).
  bool blank_ = false;
  // dtrun asked for in-place recovery and this run can keep its state
  // through it (rendezvous/in_place.h); else null.
  std::unique_ptr<InPlaceRecovery> in_place_;
  int64_t held_ = 0;  // steps whose update is in this rank's model
  bool reserved_ = false;
  Model model_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::ofstream metrics_;   // rank 0, with metrics_path
  double loss_ = 0;         // the last step's, averaged over ranks
  double grad_norm_ = -1;   // the last step's, before clipping; -1: not taken
  int64_t skipped_ = 0;     // steps not applied: their gradients not finite
  bool applied_ = true;     // the last step's
  bool fused_ = false;      // the last step's: FusedAdamWStep applies
  double clip_factor_ = 1;  // the last step's, for FusedAdamWStep
  std::map<std::string, double> metrics_last_;  // the last evaluation's
  double compute_s_ = 0;  // the last step's time outside collectives
  std::vector<torch::Tensor> matrix_masks_;  // optimizer.decay = "matrices"
  std::optional<LossScaler> scaler_;         // train.precision = "fp16"
  // Throughput since the last progress line.
  std::chrono::steady_clock::time_point window_start_;
  int64_t window_samples_ = 0;
  // null without checkpoint.dir; last, so that its saver is joined first
  std::unique_ptr<Checkpointer> ckpt_;
};

}  // namespace dtrun::train
