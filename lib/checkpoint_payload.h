#pragma once

// What a checkpoint file's payload holds (the file's frame and its crash
// safety are checkpoint.h's). Every payload is one map of named tensors in
// torch's archive format; lib/README.md, "Checkpoint format", lists the keys
// of the step's file and of FSDP's shard files.

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::train {

using TensorMap = std::map<std::string, torch::Tensor>;

// Named tensors -> bytes, and back. Decoding loads every tensor onto the CPU
// (a GPU run's checkpoint loads anywhere); bytes that are not such an
// archive are Invalid, naming what torch said.
std::string EncodeTensors(const TensorMap& tensors);
Result<TensorMap> DecodeTensors(const std::string& payload);

// Bytes carried as a uint8 tensor (DDP's model and optimizer archives travel
// in the step's file this way), and back.
torch::Tensor BytesTensor(const std::string& bytes);
std::string TensorBytes(const torch::Tensor& t);

// The step's file, ckpt_<step>.dtck, written by rank 0 once every other
// part of the checkpoint is durable. `parts` is what the strategy saved
// (DDP: "model" and "optimizer"; FSDP: "fsdp_shards" and, in the full
// format, the full state dict); the rest is the trainer's.
struct StepFile {
  int64_t step = 0;        // steps done: training resumes at this one
  int64_t world_size = 0;  // ranks that saved it
  int64_t epoch = 0;       // the folder's epoch that wrote it (checkpoint.h); 0
                           // in files written before epochs were kept
  std::vector<torch::Tensor> rng;  // each rank's CPU generator state
  TensorMap parts;

  TensorMap ToTensors() const;
  // Invalid when "step" or "world_size" is missing or not a scalar, naming
  // the key; "epoch" may be missing (0). rng holds the "rng_<r>" there are, for
  // r < world_size.
  static Result<StepFile> FromTensors(TensorMap tensors);
};

}  // namespace dtrun::train
