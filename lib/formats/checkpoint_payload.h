#pragma once

// What a checkpoint file's payload holds (the file's frame and its crash
// safety are checkpoint.h's). Every payload is one map of named tensors,
// in the raw format below or, in files written before it (or when
// checkpoint.payload = "torch"), torch's archive format; lib/README.md,
// "Checkpoint format", lists the keys of the step's file and of FSDP's
// shard files.

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lib/checkpoint.h"
#include "rendezvous/util/status.h"

namespace dtrun::train {

using TensorMap = std::map<std::string, torch::Tensor>;

// The raw format: the tensors' bytes as they lie in memory behind a small
// index, so that writing is one copy (or none: the payload's pieces point
// into the tensors) and reading is none (the tensors point into the
// mapped file):
// clang-format off
//   "DTRAW1\n\0" | u64 index length | index | zeros to 64 | each tensor's bytes at a multiple of 64
//   index: u32 count, then per tensor: u16 name length | name | u8 dtype | u8 dims | i64 size of each | u64 offset in the payload | u64 bytes
// clang-format on
// (little endian; dtype codes in raw_index.h, never renumbered).
// PayloadFormat (checkpoint.h) picks it or torch's archive.

// Named tensors -> a payload. Raw: each tensor's bytes one piece, pointing
// into the tensor (CPU and contiguous; one that is not is copied first),
// which the payload keeps alive; a dtype the format has no code for makes
// the whole map a torch archive. kTorch: libtorch's archive, one string.
Payload EncodeTensors(const TensorMap& tensors,
                      PayloadFormat format = PayloadFormat::kRaw);
// Either format, told by its first bytes. Raw: tensors of 64 KiB and more
// point into the payload and keep it alive (no copy; writing to one
// changes only this process's copy of a page), smaller ones are copies;
// an index that does not fit the bytes is Invalid, naming the tensor.
// Torch archives load onto the CPU (a GPU run's checkpoint loads
// anywhere); bytes that are neither are Invalid, naming what torch said.
Result<TensorMap> DecodeTensors(const PayloadView& payload);
Result<TensorMap> DecodeTensors(std::string payload);

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
  // each rank's GPU generator state (runs on CUDA: GPU dropout), else none
  std::vector<torch::Tensor> cuda_rng;
  TensorMap parts;
  // Where the tensors point into a payload whose blocks are still to
  // verify (a memory copy): that payload, which the restore verifies as it
  // copies; else empty (`pending` null). Set by the reader.
  PayloadView unverified;

  TensorMap ToTensors() const;
  // Invalid when "step" or "world_size" is missing or not a scalar, naming
  // the key; "epoch" may be missing (0). rng holds the "rng_<r>" there are, for
  // r < world_size, cuda_rng the "cuda_rng_<r>".
  static Result<StepFile> FromTensors(TensorMap tensors);
};

}  // namespace dtrun::train
