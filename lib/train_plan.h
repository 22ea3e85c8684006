#pragma once

// The training loop's decisions that need no libtorch: the learning rate of
// a step, each rank's seed, and what happens after each step. Pure
// functions of the config, so they are unit-tested without a process group.

#include <cstdint>
#include <string>

#include "lib/faults.h"
#include "lib/train_config.h"

namespace dtrun::train {

// What the loop does once a step is complete, in this order.
struct StepActions {
  bool checkpoint = false;  // every rank takes part (collective)
  // memory mode: this checkpoint also goes to disk (every other mode: always)
  bool persist = false;
  bool log = false;   // rank 0 prints progress and metrics
  bool eval = false;  // rank 0 evaluates, or every rank if the strategy's eval
                      // is collective
  bool kill = false;  // fault injection: this rank SIGKILLs itself
  // fault injection: ... during this step's checkpoint (fault.kill_in)
  bool kill_in_checkpoint = false;
  // fault injection: this rank stops beating and waits forever
  bool hang = false;
  bool stop = false;  // stop as if preempted (after the checkpoint, if any)
};

// The actions after step `done` (1-based: `done` steps are complete) on
// `rank`. Checkpoints need checkpoint_dir; log_every or eval_every <= 0
// turn those off (the last step still logs). `faults` fire only when
// `first_attempt` (TORCHELASTIC_RESTART_COUNT 0), so the restarted group
// runs through.
StepActions ActionsAfterStep(const TrainConfig& config, const Faults& faults,
                             int64_t done, int rank, bool first_attempt);

// The learning rate of 0-based `step`: linear warmup over warmup_steps, then
// constant or cosine to 0 at `steps`.
double LearningRate(const TrainConfig& config, int64_t step);

// The seed of `rank`'s own generator (dropout) at `step`: distinct per rank
// and per step, the same on every run.
uint64_t RankSeed(const TrainConfig& config, int rank, int64_t step);

// The device a rank trains on: the CPU (index -1) or CUDA device `index`
// among those CUDA_VISIBLE_DEVICES leaves, from strategy.device (`wanted`:
// "auto", "cpu" or "cuda"), the backend the process group runs ("gloo" or
// "nccl"), LOCAL_RANK and the GPUs visible. NCCL: GPU LOCAL_RANK, as
// torchrun's workers take it. Gloo: the CPU unless "cuda" is asked for,
// then GPU LOCAL_RANK modulo the GPUs visible, so that several ranks share
// one GPU. `error` names what cannot be done, or is empty.
struct DeviceChoice {
  int index = -1;
  std::string error;
};
DeviceChoice ChooseDevice(const std::string& wanted, const std::string& backend,
                          int local_rank, int visible_gpus);

}  // namespace dtrun::train
