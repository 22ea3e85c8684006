#pragma once

// A training run's checkpoints, in the mode its config asks for
// (checkpoint.mode), behind one interface the loop calls:
//   sync    the loop waits until the checkpoint is durable;
//   async   it waits for a copy of the state only; a thread writes it;
//   memory  as async, and the thread writes the copy first to shared memory
//           that outlives the worker (NodeCopies, kept by dtrun), to disk
//           every persist_every-th time.
// Every mode resumes from the newest checkpoint every rank can read (the
// node's memory copies first in memory mode), refuses a history given up
// (checkpoint epochs) and writes in the order that keeps the last good
// checkpoint the newest that loads after a crash anywhere.

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/checkpoint.h"
#include "lib/process_group.h"
#include "lib/parallel/strategy.h"
#include "lib/train_config.h"
#include "lib/train_plan.h"

namespace dtrun::train {

// What a checkpointer works on; everything outlives it.
struct CheckpointContext {
  const TrainConfig* config = nullptr;
  Distributed* dist = nullptr;
  Strategy* strategy = nullptr;
  torch::optim::Optimizer* opt = nullptr;
  torch::Device device = torch::kCPU;
};

class Checkpointer {
 public:
  // The checkpointer of the config's mode; null without checkpoint.dir.
  static std::unique_ptr<Checkpointer> Make(const CheckpointContext& ctx);
  virtual ~Checkpointer() = default;

  // Restores the newest good checkpoint and returns its step (0: none),
  // then records this run's epoch (rank 0) and shares it. Collective.
  int64_t Resume();
  // Where the state came from: "memory", "disk" or "none".
  const std::string& source() const { return source_; }
  // In-place recovery: a replacement takes the run's epoch from the rank
  // that gave it its state, instead of resuming.
  int64_t epoch() const { return epoch_; }
  void JoinInPlace(int64_t epoch) {
    epoch_ = epoch;
    source_ = "peer";
  }

  // The checkpoint after step `done` (the plan's `actions` say whether it
  // persists and where a fault lands). Collective.
  virtual void Save(int64_t done, const StepActions& actions) = 0;
  // Waits for a write in flight: before the checkpoint of step `due`, or
  // at the run's end or a stop (due < 0), when the last one must be on
  // disk. A write that failed throws, naming what still loads.
  virtual void Wait(int64_t /*due*/) {}
  // In-place recovery going back to a checkpoint: the write in flight
  // ends, done or given up (rank 0 stops waiting for the shard of a rank
  // that died), without throwing: the Resume() that follows takes the
  // newest checkpoint every rank can read.
  virtual void Settle() {}
  // Before the optimizer changes the state: the last checkpoint's copies
  // have read it.
  virtual void Fence() {}
  // After the first step (the optimizer's state exists): buffers made
  // once, so the first checkpoint waits only for its copies.
  virtual void Reserve() {}

 protected:
  explicit Checkpointer(const CheckpointContext& ctx);

  // Memory mode: the step every rank resumed from its node's copies, or -1
  // (then the folder). Collective.
  virtual int64_t ResumeFromCopies() { return -1; }
  int64_t ResumeFromFolder();
  // The folder's newest checkpoint that `accept` takes, the same step on
  // every rank (collective).
  std::optional<CheckpointDir::Loaded> AgreedLatest(
      std::vector<std::string>* skipped,
      const std::function<Status(const CheckpointDir::Loaded&)>& accept);
  // The state `file` holds into the model, the optimizer and this rank's
  // generator; Invalid when its payload was still to verify and did not
  // (then only the model was touched: see Strategy::Restore).
  Status Restore(const StepFile& file);
  void RestoreRng(const StepFile& file);
  void BeginEpoch(int64_t start);
  // "checkpoint at step N not saved: WHY. The newest checkpoint in DIR is
  // ...": what a failed write says, so that a full or read-only disk is
  // named with what still loads.
  std::string NotSaved(int64_t step, const std::string& why) const;
  // Every rank's CPU generator state, gathered (collective).
  // Every rank's generators into `file` (collective).
  void GatherRngStates(StepFile* file);
  // The smallest of every rank's `v` (collective).
  int64_t AllMin(int64_t v);
  // The step's file: `parts` and what every checkpoint records beside.
  void Stamp(int64_t done, StepFile* file) const;

  const TrainConfig& c_;
  Distributed& dist_;
  Strategy& strategy_;
  torch::optim::Optimizer& opt_;
  const torch::Device device_;
  const int rank_, world_;
  CheckpointDir dir_;
  std::vector<EpochRecord> epochs_;  // the folder's, read at the resume
  int64_t epoch_ = 0;                // this run's, in every step's file
  std::string source_ = "disk";
  // The step of a memory copy whose restore failed part way (every rank's
  // model was touched), or -1: only a restore from the folder mends it.
  int64_t restore_spoiled_ = -1;
};

// Milliseconds since `start`.
double MsSince(std::chrono::steady_clock::time_point start);
// Fault injection: SIGKILLs this rank, saying where.
[[noreturn]] void KillSelf(int rank, int64_t step, const char* where);

}  // namespace dtrun::train
