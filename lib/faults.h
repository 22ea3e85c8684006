#pragma once

// Fault injection for tests and demos: a rank that kills itself, hangs, runs
// slow, or damages its checkpoint, at a chosen step. Not part of the
// installed API: a training run is described by TrainConfig alone, and
// train_cfg's [fault] table reaches the loop through SetFaults. No torch.

#include <cstdint>
#include <string>

#include "lib/train_config.h"

namespace dtrun::train {

enum class KillPoint { kStep, kCopy, kWrite };  // fault.kill_in

struct Faults {
  // rank `kill_rank` SIGKILLs itself after step `kill_at_step` on the first
  // attempt only.
  int kill_rank = -1;
  int64_t kill_at_step = -1;
  // where that kill lands: after the step [step]; at that step's checkpoint
  // (async and memory modes), once its copy is taken and before any of it
  // is written (copy), or halfway through its write (write)
  KillPoint kill_in = KillPoint::kStep;
  // rank `hang_rank` stops (no heartbeat, no collective) after step
  // `hang_at_step`, on the first attempt only.
  int hang_rank = -1;
  int64_t hang_at_step = -1;
  // rank `slow_rank`'s compute (outside collectives) takes `slow_factor`
  // times as long, every step: a straggler. 1: off.
  int slow_rank = -1;
  double slow_factor = 1.0;
  // async and memory checkpoints: each background write first waits this
  // long (a slow disk), so that a fault lands while a write is in flight.
  // 0: off.
  int save_delay_ms = 0;
  // memory mode: the node's copy of this step's file gets one payload byte
  // flipped after its checksum is taken (first attempt only), so that the
  // restart finds it damaged. -1: off.
  int64_t damage_copy_at_step = -1;
};

// The faults every later Train() in this process injects (none until set).
void SetFaults(const Faults& faults);
const Faults& InjectedFaults();

// The first fault that cannot fire under `config` (a delay of a sync
// checkpoint, a kill in a checkpoint that is not taken), naming its
// fault.* key, or "". Pure.
std::string ValidateFaults(const TrainConfig& config, const Faults& faults);

std::string ParseChoice(const std::string& key, const std::string& value,
                        KillPoint* out);

}  // namespace dtrun::train
