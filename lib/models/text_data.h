#pragma once

// Character-level text for a language model, as nanoGPT's shakespeare_char
// prepares it: a text file (its distinct bytes, sorted, are the
// vocabulary; the first 90% trains, the rest validates) or nanoGPT's
// prepared folder (train.bin and val.bin of uint16 token ids, meta.pkl's
// vocab_size and itos read without Python). Batches are random windows
// drawn from a generator seeded by (seed, micro-batch, rank), so a resume
// sees the windows an unbroken run would.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::train {

struct TextData {
  std::vector<uint16_t> train, val;
  int64_t vocab_size = 0;
  std::vector<std::string> itos;  // token -> its text; empty: unknown

  // Tokens [N] -> text (ids without an entry as "<id>").
  std::string Decode(const torch::Tensor& tokens) const;
  // Text -> tokens [1, N]; Invalid naming the first character not in the
  // vocabulary.
  Result<torch::Tensor> Encode(const std::string& text) const;
};

// `path`: a text file or a folder holding train.bin and val.bin.
Result<TextData> LoadTextData(const std::string& path);

// `batch` windows of `block` tokens from `data` at offsets drawn with a
// generator seeded by `seed`: x [batch, block] and y (x shifted by one),
// int64 on `device`.
void TextWindows(const std::vector<uint16_t>& data, int64_t block, int batch,
                 uint64_t seed, torch::Device device, torch::Tensor* x,
                 torch::Tensor* y);

}  // namespace dtrun::train
