#pragma once

// What a training run is asked to do: the config train_cfg fills from its
// TOML file, its choices, and their check. Pure data; no torch.

#include <cstdint>
#include <string>
#include <vector>

#include "lib/checkpoint.h"

namespace dtrun::train {

// The config's choices, each read from its TOML string by ParseChoice.
enum class ModelKind { kMlp, kCnn, kGpt };             // model.type
enum class DataSource { kDigits, kSynthetic, kText };  // data.source
enum class StrategyKind { kDdp, kFsdp };               // strategy.type
enum class OptimizerKind { kSgd, kAdam, kAdamW };      // optimizer.type
enum class Schedule { kConstant, kCosine };            // schedule.type
enum class CheckpointFormat { kSharded, kFull };       // checkpoint.format
enum class CheckpointMode { kSync, kAsync, kMemory };  // checkpoint.mode
// checkpoint.checksum and checkpoint.payload: Checksum and PayloadFormat
// (checkpoint.h).

// Sets *out to the choice named `value` (as in TOML: "ddp", "adamw", ...)
// and returns "", or returns what is wrong, naming `key` and the choices
// ("strategy.type 'zero': use \"ddp\" or \"fsdp\""). Pure.
std::string ParseChoice(const std::string& key, const std::string& value,
                        ModelKind* out);
std::string ParseChoice(const std::string& key, const std::string& value,
                        DataSource* out);
std::string ParseChoice(const std::string& key, const std::string& value,
                        StrategyKind* out);
std::string ParseChoice(const std::string& key, const std::string& value,
                        OptimizerKind* out);
std::string ParseChoice(const std::string& key, const std::string& value,
                        Schedule* out);
std::string ParseChoice(const std::string& key, const std::string& value,
                        CheckpointFormat* out);
std::string ParseChoice(const std::string& key, const std::string& value,
                        CheckpointMode* out);
std::string ParseChoice(const std::string& key, const std::string& value,
                        Checksum* out);
std::string ParseChoice(const std::string& key, const std::string& value,
                        PayloadFormat* out);

// Everything a training run needs; train_cfg fills it from TOML. Defaults in
// brackets.
struct TrainConfig {
  // model
  // mlp [mlp] | cnn (for 8x8 images) | gpt (nanoGPT's, data.source text)
  ModelKind model = ModelKind::kMlp;
  std::vector<int> hidden = {64, 64};  // MLP hidden layer widths
  // MLP: dropout after each hidden layer; GPT: nanoGPT's dropout [0]
  double dropout = 0.0;
  // GPT: nanoGPT's GPTConfig names and defaults (vocab_size from the data)
  int64_t n_layer = 12, n_head = 12, n_embd = 768, block_size = 1024;
  bool bias = true;
  // a torch.save'd state dict (Python's model.state_dict()) the model
  // starts from, its names and shapes the model's; a resume's checkpoint
  // wins over it. Empty: drawn from the seed.
  std::string init_from;
  // data
  // digits (sklearn's 8x8 digits) [digits] | synthetic
  DataSource data = DataSource::kDigits;
  std::string digits_path =
      "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
  int synthetic_samples = 2048, synthetic_features = 32, synthetic_classes = 4;
  // text: a text file (characters, 90/10 split) or nanoGPT's prepared
  // folder (train.bin, val.bin, meta.pkl); data.path
  std::string text_path;
  double test_fraction = 0.2;  // held out for evaluation [0.2]
  // strategy
  StrategyKind strategy = StrategyKind::kDdp;  // ddp [ddp] | fsdp
  // gloo | nccl | auto (nccl if built and a GPU is visible)
  std::string backend = "auto";
  // where the model and the batches live: auto [auto] (GPU LOCAL_RANK with
  // nccl, the CPU with gloo) | cpu | cuda (with gloo too: GPU LOCAL_RANK
  // modulo the GPUs visible, so several ranks can share one GPU)
  std::string device = "auto";
  double bucket_cap_mb = 25;    // ddp
  int64_t min_unit_params = 0;  // fsdp wrap policy (see FsdpOptions)
  // fsdp: the module types that are units (a model other than a
  // Sequential); empty: the model's own choice (Model::shard_units)
  std::vector<std::string> unit_types;
  bool reshard_after_forward = true;  // fsdp
  bool prefetch = true;               // fsdp
  std::string param_dtype = "float32",
              reduce_dtype = "float32";  // fsdp mixed precision
  bool cpu_offload = false;              // fsdp, GPU builds
  // collectives through shared memory when every rank is on this host (DDP's
  // all-reduce, FSDP's all-gathers and reduce-scatters) [true]
  bool shared_memory = true;
  // optimizer and schedule
  OptimizerKind optimizer = OptimizerKind::kSgd;  // sgd [sgd] | adam | adamw
  double lr = 0.05, momentum = 0.9, weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999;  // adam, adamw
  // which parameters weight_decay shrinks: all [all] | matrices (those of 2
  // or more dimensions, as nanoGPT's configure_optimizers; adamw only)
  std::string decay = "all";
  // Clip the gradients' global L2 norm (over every rank's, as
  // torch.nn.utils.clip_grad_norm_ on the whole model) to this; 0: off [0].
  // On, each step's norm is in the progress line and a step whose norm is
  // not finite is skipped (not applied) and counted.
  double max_grad_norm = 0;
  Schedule schedule = Schedule::kConstant;  // constant [constant] | cosine
  int warmup_steps = 0;
  // cosine: from lr down to min_lr [0] at step decay_steps (0: train.steps),
  // min_lr after (nanoGPT's lr_decay_iters and min_lr)
  double min_lr = 0;
  int64_t decay_steps = 0;
  // loop
  // fp32 [fp32] | bf16: the forward and the loss under autocast in
  // bfloat16 (CPU and CUDA); parameters, gradients and the optimizer stay
  // float32 | fp16: autocast in float16 (CUDA; the CPU on libtorch 2.4+)
  // with a dynamic loss scale (torch.amp.GradScaler's): a step whose
  // gradients are not finite is skipped and the scale halved; after
  // growth_interval finite steps it doubles; the scale is in checkpoints
  std::string precision = "fp32";
  double init_scale = 65536;       // fp16: the first loss scale [2^16]
  int64_t growth_interval = 2000;  // fp16 [2000]
  int batch_size = 32;             // per rank
  int64_t steps = 200;
  int accumulate = 1;     // micro-batches per step (no_sync between)
  bool drop_last = true;  // drop each epoch's remainder [true], or pad it
  int eval_every = 50, log_every = 20;
  int eval_iters = 20;  // gpt: batches of each split an evaluation averages
  uint64_t seed = 1;
  // checkpoints
  std::string checkpoint_dir;  // empty: no checkpoints
  int checkpoint_every = 50, keep_checkpoints = 2;
  // fsdp: sharded (each rank its shard) [sharded] | full
  CheckpointFormat checkpoint_format = CheckpointFormat::kSharded;
  // sync [sync]: the loop waits until the checkpoint is durable; async: it
  // waits only for a copy of the state in memory, a thread writes it;
  // memory: as async, but the thread writes the copy to shared memory that
  // outlives the worker (under dtrun) and to disk every persist_every-th
  // checkpoint.
  CheckpointMode checkpoint_mode = CheckpointMode::kSync;
  // each file's frame: xxh3 [xxh3] (per 4 MiB block) | sha256
  Checksum checksum = Checksum::kXxh3;
  // tensors as raw bytes [raw] | torch (torch's archives, the format
  // before raw)
  PayloadFormat payload_format = PayloadFormat::kRaw;
  int persist_every = 4;  // memory mode [4]; the run's last one always
  // stop (as if preempted) after this step; -1 never
  int64_t stop_after_step = -1;
  std::string metrics_path;  // JSON lines; empty: none
  // train_cfg --sample N: text from the GPT of the newest checkpoint in
  // checkpoint.dir, or of sample.from (a state dict file)
  std::string sample_prompt = "\n", sample_from;
  double sample_temperature = 0.8;  // nanoGPT's sample.py defaults
  int64_t sample_top_k = 200;       // 0: every token
};

// The first thing wrong with a config's values (a backend or dtype that is
// not a choice, a number out of range), or "" when it is fine. Pure; Train()
// checks too.
std::string ValidateConfig(const TrainConfig& config);

}  // namespace dtrun::train
