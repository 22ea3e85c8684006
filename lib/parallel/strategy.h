#pragma once

// What differs between DDP and FSDP in the training loop and in its
// checkpoints, behind one interface, so that trainer.cc holds the loop
// alone and each strategy is tested on its own (tests/lib/strategy_test.cc).

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "lib/checkpoint.h"
#include "lib/formats/checkpoint_payload.h"
#include "lib/checkpointing/host_staging.h"
#include "lib/model.h"
#include "lib/torch_compat.h"
#include "lib/train_config.h"
#include "rendezvous/util/status.h"

namespace dtrun::train {

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual torch::Tensor Forward(const torch::Tensor& x) = 0;
  // One micro-batch's backward; `last`: the step's last micro-batch.
  virtual void Backward(const torch::Tensor& loss, bool last) = 0;
  virtual std::vector<torch::Tensor> OptimizerParams() = 0;
  // Full parameters in model->parameters() order (collective for FSDP).
  virtual std::vector<torch::Tensor> FullParams() = 0;
  // The L2 norm of the gradients the optimizer steps on, over every rank's:
  // DDP's every rank holds the whole averaged gradient; FSDP's shards'
  // squared norms are summed by one all-reduce (collective). Every square
  // is summed in float64, so both give the same clip coefficient.
  virtual double GradNorm() = 0;
  // clip_grad_norm_'s rule: every gradient the optimizer steps on times
  // max_norm / (norm + 1e-6) when that is under 1. Returns whether it
  // scaled them.
  bool ClipGrads(double norm, double max_norm);
  // That rule's factor: max_norm / (norm + 1e-6), or 1 when not under 1.
  static double ClipFactor(double norm, double max_norm);
  // Every gradient the optimizer steps on times `factor` (fp16's unscale).
  void ScaleGrads(double factor);
  // For each OptimizerParams() tensor, which of its elements belong to a
  // parameter of 2 or more dimensions (a matrix, an embedding): a bool
  // tensor that broadcasts to it (optimizer.decay = "matrices"). This
  // default: one flag per tensor, by its own dimensions.
  virtual std::vector<torch::Tensor> MatrixMasks();
  // Whether evaluation is collective (every rank runs it).
  virtual bool CollectiveEval() const = 0;
  // Checkpoint (collective): writes any per-rank files of `step` in `dir`,
  // durable on every rank when it returns, then returns this strategy's
  // parts of the step's file (StepFile::parts), which rank 0 writes last.
  virtual TensorMap Save(torch::optim::Optimizer& opt, const CheckpointDir& dir,
                         int64_t step) = 0;
  // What Save writes, copied out of the live state and not written
  // (collective for FSDP's full format): `parts` for the step's file, and
  // this rank's shard file (CheckpointDir::ShardPath), when the strategy
  // has one. Nothing of it shares memory with the model or the optimizer,
  // so training may go on while another thread writes it (async and memory
  // checkpoints); the copy costs as much memory as the state. `whole`:
  // whether this rank writes a step's file (DDP: its parts are the whole
  // state, copied only by ranks that write one; the others' Snapshot is
  // empty).
  struct Snapshot {
    TensorMap parts;
    std::optional<TensorMap> shard;
    // When set, more of `parts`, made from the copy off the loop's thread
    // (DDP: torch's serializer, several times slower than the copy).
    std::function<TensorMap()> encode;
  };
  // Every tensor is copied with `copy` (HostStaging's: device tensors into
  // pinned host memory on a side stream; the caller waits for it before
  // reading them).
  virtual Snapshot Copy(torch::optim::Optimizer& opt, bool whole,
                        const TensorCopier& copy) = 0;
  // Where Complete() reads a step's shard files from.
  struct ShardSource {
    // Shard `rank` of `step`: its payload, verified, or why not.
    std::function<Result<PayloadView>(int64_t step, int rank)> read;
    // Whether this rank's own shard is all it reads (copies in memory, of
    // the same world size) or every shard the step names (the folder: any
    // world size).
    bool own_only = false;
    std::string where;  // the folder, for messages
  };
  static ShardSource FolderShards(const CheckpointDir& dir);
  // Whether a checkpoint's other files are there and verify (from the
  // folder every rank reaches the same verdict: they read the same files).
  // Throws Error when `parts` were saved by the other strategy (the folder
  // belongs to another run). Restore() follows the Complete() that
  // accepted, for the same step.
  virtual Status Complete(const TensorMap& parts, const ShardSource& shards,
                          int64_t step) = 0;
  // `pending`: the payload `parts` point into when its blocks are still to
  // verify (a memory copy read with VerifyWhen::kAsCopied), else null; it
  // is verified as the state is copied out of it, and when a block does
  // not match Restore() returns Invalid: this rank's model is then a mix
  // that only another Restore() mends.
  virtual Status Restore(const TensorMap& parts, torch::optim::Optimizer& opt,
                         const PayloadView* pending = nullptr) = 0;
  // Training starts from no checkpoint: every rank's state is made the
  // same (DDP: rank 0's broadcast, which a resume does not need: every
  // rank restored the same checkpoint). Collective; after the resume.
  virtual void StartFresh() {}
  // A Complete() that accepted is not followed by Restore() (another rank's
  // copy did not load): what it kept goes. Its tensors may point into a
  // memory copy, whose lock they hold while they live.
  virtual void Discard() {}

  // In-place recovery: whether Regroup() can keep this rank's state, and
  // Regroup itself: drops what the strategy holds of its process group
  // (collectives in flight, gradient buckets), calls `regroup` for the new
  // group and sets up on it again, the model and the optimizer's state
  // kept (collective on the new group).
  virtual bool CanRegroup() const { return false; }
  // Whether every rank holds the whole state (DDP), so that a survivor's
  // is the replacement's; else (FSDP: a dead rank's shards died with it)
  // the re-formed group goes back to the newest checkpoint, in place.
  virtual bool EveryRankHoldsAll() const { return true; }
  // In place before the first checkpoint (FSDP): the state back to
  // `drawn`'s, the model as first made, and the optimizer's dropped.
  virtual void StartOver(torch::nn::Module& drawn,
                         torch::optim::Optimizer& opt);
  virtual void Regroup(const std::function<ProcessGroup*()>& regroup);

  // Seconds spent waiting for gradient collectives (SyncGradients) since
  // the last call: the loop subtracts them to time its own compute.
  virtual double TakeCollectiveSeconds() {
    double s = collective_s_;
    collective_s_ = 0;
    return s;
  }

 protected:
  // Runs `sync` (a gradient collective's wait) and counts its time.
  template <typename F>
  void TimedSync(F&& sync) {
    auto start = std::chrono::steady_clock::now();
    sync();
    collective_s_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }

 private:
  double collective_s_ = 0;
};

// The strategy the config names, around `model` (already on its device),
// over `pg`, which must outlive it. DDP takes any module and broadcasts
// rank 0's parameters; FSDP shards them (`model` keeps no full copy): a
// Sequential's children as units, any other model's the modules its
// shard_units (or strategy.unit_types) name.
// `restore_follows`: a checkpoint's state is restored right after, on a
// group whose other ranks broadcast nothing (a replacement in in-place
// recovery): FSDP then cuts its shards without rank 0's broadcast.
std::unique_ptr<Strategy> MakeStrategy(Model model, ProcessGroup* pg,
                                       const TrainConfig& config,
                                       bool restore_follows = false);
std::unique_ptr<Strategy> MakeStrategy(
    std::shared_ptr<torch::nn::SequentialImpl> model, ProcessGroup* pg,
    const TrainConfig& config);

}  // namespace dtrun::train
