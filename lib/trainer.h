#pragma once

// The training loop as a library: the user's model, batches, loss and
// evaluation (TrainParts), and the loop's own (TrainConfig): DDP or FSDP,
// precision, clipping, the schedule, checkpoints in three modes with the
// resume every rank agrees on, RNG capture, the heartbeat dtrun's hang and
// straggler checks read, and the standby.
//
//   dtrun::train::TrainParts parts;
//   parts.model = [] { return dtrun::train::Model::Of(std::make_shared<Net>());
//   }; parts.batch = [&](const dtrun::train::BatchRequest& r) { return
//   MyBatch(r); }; return dtrun::train::Train(config, std::move(parts));

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "lib/model.h"
#include "lib/train_config.h"

namespace dtrun::train {

// What the loop asks the batch source for: micro-batch `micro` (counted
// from the run's start: step * accumulate + m) of rank `rank` of `world`,
// `batch_size` rows. A pure function of these (and the seed) makes a
// resume, on any attempt, see exactly the batches an unbroken run would.
struct BatchRequest {
  uint64_t seed = 0;
  int64_t micro = 0;
  int rank = 0, world = 1;
  int batch_size = 1;
  bool drop_last = true;  // train.drop_last, for sources that have epochs
  torch::Device device = torch::kCPU;  // where the loop runs the model
};

struct Batch {
  torch::Tensor input, target;  // moved to the device by the loop if not there
};

// After each step, on every rank, before the step's checkpoint (which then
// holds what the callback changed).
struct StepEnd {
  int64_t step = 0;       // steps done
  double loss = 0;        // the step's loss, averaged over the ranks
  double lr = 0;          // the learning rate it stepped with
  double grad_norm = -1;  // before clipping (optimizer.max_grad_norm); -1: off
  bool applied = true;    // false: its gradients were not finite, skipped
};

// Named tensors (a schedule's state, a data position, an EMA): the user's
// part of each checkpoint, the same on every rank.
using UserState = std::map<std::string, torch::Tensor>;
// The model run on an input through the strategy (TrainParts::evaluate).
using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

struct TrainParts {
  // The model, built the same on every rank: the loop seeds torch's
  // generator with train.seed first (and DDP broadcasts rank 0's anyway).
  std::function<Model()> model;
  std::function<Batch(const BatchRequest&)> batch;
  // loss(output, target), a scalar; unset: cross-entropy.
  std::function<torch::Tensor(const torch::Tensor& output,
                              const torch::Tensor& target)>
      loss;
  // Named metrics ("eval_accuracy", "val_loss"), with `forward` running the
  // model through the strategy (under no_grad, eval mode and the run's
  // precision). Called on rank 0, and on every rank under FSDP, whose
  // forward is collective. Printed as "step N name value" and in the
  // metrics file, the last evaluation's in the "done:" line. Unset: none.
  std::function<std::map<std::string, double>(const Forward& forward,
                                              torch::Device device)>
      evaluate;
  std::function<void(const StepEnd&)> on_step_end;
  // After each checkpoint is saved (sync: durable; async and memory: its
  // copy taken, its write under way), with the step.
  std::function<void(int64_t step)> on_checkpoint;
  // The user's state into each checkpoint and back at a resume.
  std::function<UserState()> save_state;
  std::function<void(const UserState&)> load_state;
  // Optional: the model without its initial draws, for a restarted worker
  // that will resume (its weights come from the checkpoint); when nothing
  // is resumed, model()'s draws are copied in.
  std::function<Model()> model_for_resume;
};

// Runs (or resumes, from the newest good checkpoint) the run `config`
// describes on `parts`, in the process group of the launcher's
// environment. Rank 0 prints progress lines and a last line
//   done: steps=N loss=L [metric=V ...] params_sha256=H
// Returns the process exit code. Throws dtrun::train::Error on setup errors
// (a missing part, a config the parts cannot run); an error of the run
// itself is also written to $TORCHELASTIC_ERROR_FILE (torchrun's format,
// dist_env.h) before the process group closes, so that the launcher names
// this rank, not a peer that lost its connection.
int Train(const TrainConfig& config, TrainParts parts);

// The built-in parts the config names (model.type mlp or cnn, data.source
// digits or synthetic, accuracy on the held-out rows): what train_cfg
// trains. A checkpoint holds the model, the optimizer, the step (which
// fixes the sampler's position) and every rank's RNG state; an FSDP
// sharded checkpoint saved on N ranks resumes on any number of ranks.
TrainParts BuiltinParts(const TrainConfig& config);
int Train(const TrainConfig& config);

// `path`'s named tensors into `module`'s parameters and buffers by name:
// a .dtck file (a DDP step's file, or named tensors as python -m
// dtrun.checkpoint convert/import writes them) or a torch.save'd plain
// dict. Every name must match, with its shape; throws Error naming the
// first that does not (`what` begins each message).
void LoadStateDict(torch::nn::Module& module, const std::string& path,
                   const std::string& what);

// train_cfg --sample N: prints `n` characters the config's GPT generates
// after config.sample_prompt, from the newest checkpoint in
// checkpoint.dir (or config.sample_from). Returns the exit code.
int SampleGpt(const TrainConfig& config, int64_t n);

}  // namespace dtrun::train
