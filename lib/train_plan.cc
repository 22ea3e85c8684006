// The loop's plan as pure functions of the config: the choices' names, the
// config's checks, the learning rate, the seeds and the actions after each
// step. No libtorch, so all of it is unit-tested and fuzzed on its own.
#include "lib/train_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <initializer_list>
#include <string>

namespace dtrun::train {
namespace {

std::string OneOf(const std::string& key, const std::string& value,
                  std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return "";
    list += std::string(list.empty() ? "" : " or ") + "\"" + a + "\"";
  }
  return key + " '" + value + "': use " + list;
}

// The TOML names of one enum's choices, in the enum's order.
template <typename E, size_t N>
std::string ParseNamed(const std::string& key, const std::string& value,
                       const char* const (&names)[N], E* out) {
  for (size_t i = 0; i < N; ++i) {
    if (value == names[i]) {
      *out = static_cast<E>(i);
      return "";
    }
  }
  std::string list;
  for (const char* a : names)
    list += std::string(list.empty() ? "" : " or ") + "\"" + a + "\"";
  return key + " '" + value + "': use " + list;
}

bool Every(int64_t done, int64_t every) {
  return every > 0 && done % every == 0;
}

}  // namespace

std::string ParseChoice(const std::string& key, const std::string& value,
                        ModelKind* out) {
  static const char* const kNames[] = {"mlp", "cnn", "gpt"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        DataSource* out) {
  static const char* const kNames[] = {"digits", "synthetic", "text"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        StrategyKind* out) {
  static const char* const kNames[] = {"ddp", "fsdp"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        OptimizerKind* out) {
  static const char* const kNames[] = {"sgd", "adam", "adamw"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        Schedule* out) {
  static const char* const kNames[] = {"constant", "cosine"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        CheckpointFormat* out) {
  static const char* const kNames[] = {"sharded", "full"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        CheckpointMode* out) {
  static const char* const kNames[] = {"sync", "async", "memory"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        Checksum* out) {
  static const char* const kNames[] = {"xxh3", "sha256"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        PayloadFormat* out) {
  static const char* const kNames[] = {"raw", "torch"};
  return ParseNamed(key, value, kNames, out);
}

std::string ParseChoice(const std::string& key, const std::string& value,
                        KillPoint* out) {
  static const char* const kNames[] = {"step", "copy", "write"};
  return ParseNamed(key, value, kNames, out);
}

// The [checkpoint] values that only make sense together: a sharded format
// for memory copies of FSDP.
static std::string ValidateCheckpointing(const TrainConfig& c) {
  if (c.checkpoint_every < 1 || c.keep_checkpoints < 1 || c.persist_every < 1) {
    return "checkpoint.every, checkpoint.keep and checkpoint.persist_every "
           "must be >= 1";
  }
  if (c.checkpoint_mode == CheckpointMode::kMemory &&
      c.strategy == StrategyKind::kFsdp &&
      c.checkpoint_format == CheckpointFormat::kFull) {
    return "checkpoint.mode = \"memory\" keeps each rank's shard in its "
           "node's memory, and checkpoint.format = \"full\" gathers the "
           "whole state on rank 0: use format = \"sharded\" with it";
  }
  return "";
}

namespace {
Faults& TheFaults() {
  static Faults faults;
  return faults;
}
}  // namespace

void SetFaults(const Faults& faults) { TheFaults() = faults; }
const Faults& InjectedFaults() { return TheFaults(); }

// What delays or kills a background write needs a background mode.
std::string ValidateFaults(const TrainConfig& c, const Faults& f) {
  if (f.slow_factor < 1) return "fault.slow_factor must be >= 1";
  if (f.save_delay_ms < 0) return "fault.save_delay_ms must be >= 0";
  const bool background = c.checkpoint_mode != CheckpointMode::kSync;
  if (f.save_delay_ms > 0 && !background) {
    return "fault.save_delay_ms delays background writes only: set "
           "checkpoint.mode = \"async\" or \"memory\", or drop it";
  }
  if (f.damage_copy_at_step >= 0 &&
      c.checkpoint_mode != CheckpointMode::kMemory) {
    return "fault.damage_copy_at_step damages a memory copy: set "
           "checkpoint.mode = \"memory\", or drop it";
  }
  if (f.kill_in == KillPoint::kStep) return "";
  if (!background)
    return "fault.kill_in = \"copy\" or \"write\" needs checkpoint.mode "
           "= \"async\" or \"memory\" (a sync checkpoint has no copy)";
  if (c.checkpoint_dir.empty() || c.checkpoint_every < 1 ||
      (f.kill_at_step % c.checkpoint_every != 0 && f.kill_at_step != c.steps)) {
    return "fault.kill_in = \"copy\" or \"write\" kills during the "
           "checkpoint of fault.kill_at_step, which must be a checkpoint's "
           "step (a multiple of checkpoint.every, with checkpoint.dir set)";
  }
  return "";
}

// Declared in train_config.h; defined here so that it builds and is tested
// without libtorch.
// The GPT's and the text data's keys, and what they need of each other.
static std::string ValidateGpt(const TrainConfig& c) {
  if ((c.model == ModelKind::kGpt) != (c.data == DataSource::kText)) {
    return "model.type = \"gpt\" trains on data.source = \"text\" (and "
           "text data needs the gpt model): set both";
  }
  if (c.n_layer < 1 || c.n_head < 1 || c.n_embd < 1 || c.block_size < 1)
    return "model.n_layer, n_head, n_embd and block_size must be >= 1";
  if (c.n_embd % c.n_head != 0) {
    return "model.n_embd (" + std::to_string(c.n_embd) +
           ") must be a multiple of model.n_head (" + std::to_string(c.n_head) +
           ")";
  }
  if (c.data == DataSource::kText && c.text_path.empty())
    return "data.source = \"text\" needs data.path (a text file or nanoGPT's "
           "prepared folder)";
  if (c.eval_iters < 1) return "train.eval_iters must be >= 1";
  if (!(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1))
    return "optimizer.beta1 and beta2 must be in [0, 1)";
  if (c.decay != "all" && c.decay != "matrices")
    return "optimizer.decay '" + c.decay + "': use \"all\" or \"matrices\"";
  if (c.decay == "matrices" && c.optimizer != OptimizerKind::kAdamW) {
    return "optimizer.decay = \"matrices\" is AdamW's decoupled weight "
           "decay: use optimizer.type = \"adamw\"";
  }
  if (c.min_lr < 0 || c.decay_steps < 0)
    return "schedule.min_lr and schedule.decay_steps must be >= 0";
  if (!(c.sample_temperature > 0) || c.sample_top_k < 0)
    return "sample.temperature must be > 0 and sample.top_k >= 0";
  return "";
}

std::string ValidateConfig(const TrainConfig& c) {
  for (const std::string& err : {
           OneOf("strategy.backend", c.backend, {"auto", "gloo", "nccl"}),
           OneOf("strategy.device", c.device, {"auto", "cpu", "cuda"}),
           OneOf("strategy.param_dtype", c.param_dtype,
                 {"float32", "bfloat16"}),
           OneOf("strategy.reduce_dtype", c.reduce_dtype,
                 {"float32", "bfloat16"}),
           OneOf("train.precision", c.precision, {"fp32", "bf16", "fp16"}),
       }) {
    if (!err.empty()) return err;
  }
  if (c.backend == "nccl" && c.device == "cpu") {
    return "strategy.device = \"cpu\" with backend \"nccl\": NCCL moves GPU "
           "tensors only; use backend \"gloo\" on the CPU";
  }
  if (c.batch_size < 1 || c.steps < 1 || c.accumulate < 1) {
    return "train.batch_size, train.steps and train.accumulate must be >= 1";
  }
  if (c.dropout < 0 || c.dropout >= 1) return "model.dropout must be in [0, 1)";
  if (std::string err = ValidateGpt(c); !err.empty()) return err;
  if (!c.init_from.empty() && access(c.init_from.c_str(), R_OK) != 0) {
    return "model.init_from '" + c.init_from + "': cannot be read (" +
           std::strerror(errno) +
           "); give the path of a torch.save'd state dict";
  }
  if (!(c.init_scale > 0) || !std::isfinite(c.init_scale) ||
      c.growth_interval < 1) {
    return "train.init_scale must be a finite number > 0 and "
           "train.growth_interval >= 1";
  }
  if (!(c.max_grad_norm >= 0))
    return "optimizer.max_grad_norm must be >= 0 (0: no clipping)";
  if (std::string err = ValidateCheckpointing(c); !err.empty()) return err;
  if (c.test_fraction <= 0 || c.test_fraction >= 1)
    return "data.test_fraction must be in (0, 1)";
  return "";
}

// What the loop does after step `done`: pure, so each cadence and fault is
// tested without training (tests/lib/train_plan_test.cc).
StepActions ActionsAfterStep(const TrainConfig& c, const Faults& f,
                             int64_t done, int rank, bool first_attempt) {
  const bool last = done == c.steps;
  StepActions a;
  // The last step always checkpoints and logs: a finished run's folder holds
  // its final state, and its last loss is printed whatever the cadence.
  a.checkpoint =
      !c.checkpoint_dir.empty() && (Every(done, c.checkpoint_every) || last);
  a.log = rank == 0 && (Every(done, c.log_every) || last);
  a.eval = Every(done, c.eval_every);
  a.persist =
      a.checkpoint && (c.checkpoint_mode != CheckpointMode::kMemory || last ||
                       done == c.stop_after_step ||
                       (done / c.checkpoint_every) % c.persist_every == 0);
  const bool kill =
      first_attempt && rank == f.kill_rank && done == f.kill_at_step;
  a.kill = kill && f.kill_in == KillPoint::kStep;
  a.kill_in_checkpoint = kill && a.checkpoint && f.kill_in != KillPoint::kStep;
  a.hang = first_attempt && rank == f.hang_rank && done == f.hang_at_step;
  a.stop = done == c.stop_after_step;
  return a;
}

// nanoGPT's get_lr (and torchtitan's warmup): linear warmup, lr (step + 1)
// / (warmup_steps + 1) over the first warmup_steps, then constant or a
// half cosine from lr down to min_lr at decay_steps (the last step by
// default), min_lr after.
double LearningRate(const TrainConfig& c, int64_t step) {
  double lr = c.lr;
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return lr * (step + 1) / (c.warmup_steps + 1);
  if (c.schedule == Schedule::kCosine) {
    const int64_t end = c.decay_steps > 0 ? c.decay_steps : c.steps;
    double t = double(step - c.warmup_steps) /
               std::max<int64_t>(1, end - c.warmup_steps);
    lr = c.min_lr +
         (lr - c.min_lr) * 0.5 * (1 + std::cos(M_PI * std::min(1.0, t)));
  }
  return lr;
}

// Each rank's own randomness (dropout) is seeded apart from the others'; a
// resume restores it from the checkpoint, or, when the world size changed,
// reseeds it from the step.
uint64_t RankSeed(const TrainConfig& c, int rank, int64_t step) {
  return c.seed * 1000003ULL + static_cast<uint64_t>(rank + 1) * 7919ULL +
         static_cast<uint64_t>(step) * 104729ULL;
}

DeviceChoice ChooseDevice(const std::string& wanted, const std::string& backend,
                          int local_rank, int visible_gpus) {
  DeviceChoice d;
  if (backend == "nccl") {
    if (wanted == "cpu") {
      d.error =
          "strategy.device = \"cpu\" with backend \"nccl\": NCCL "
          "moves GPU tensors only; use backend \"gloo\" on the CPU";
    } else if (local_rank >= visible_gpus) {
      d.error = "LOCAL_RANK " + std::to_string(local_rank) + " but only " +
                std::to_string(visible_gpus) + " GPU(s) visible";
    } else {
      d.index = local_rank;
    }
    return d;
  }
  if (wanted != "cuda") return d;
  if (visible_gpus < 1) {
    d.error =
        "strategy.device = \"cuda\", but no GPU is visible (this libtorch "
        "was built without CUDA, or CUDA_VISIBLE_DEVICES hides every GPU); "
        "use device \"cpu\" or \"auto\" here";
    return d;
  }
  d.index = local_rank % visible_gpus;
  return d;
}

}  // namespace dtrun::train
