#pragma once

// A GPT as nanoGPT builds it (model.py): token and position embeddings,
// n_layer pre-LayerNorm blocks of causal self-attention and a GELU MLP, a
// final LayerNorm and an LM head that is the token embedding (tied: one
// parameter, "transformer.wte.weight"); nanoGPT's parameter names and
// initialisation (normal 0.02, the residual projections 0.02/sqrt(2
// n_layer)). Each block runs through ShardedCall, so FSDP makes it a unit
// (Model::shard_units = {"Block"}); under DDP it is a plain call.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "lib/model.h"
#include "lib/trainer.h"

namespace dtrun::train {

struct GptConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 1024;
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  double dropout = 0.0;
  bool bias = true;  // in the Linears and LayerNorms
};

// nanoGPT's LayerNorm: a weight, and a bias only when `bias`.
class GptLayerNormImpl : public torch::nn::Module {
 public:
  GptLayerNormImpl(int64_t n, bool bias);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
};
TORCH_MODULE(GptLayerNorm);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout attn_dropout{nullptr}, resid_dropout{nullptr};

 private:
  int64_t n_head_;
  double dropout_;
  torch::Tensor
      mask_;  // [T, T] causal bias, 0 / -inf (not a buffer: not saved)
};
TORCH_MODULE(CausalSelfAttention);

class GptMlpImpl : public torch::nn::Module {
 public:
  explicit GptMlpImpl(const GptConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(GptMlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  GptLayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  GptMlp mlp{nullptr};
};
TORCH_MODULE(Block);

// nanoGPT's `transformer` container, so that the names are its own
// ("transformer.h.0.attn.c_attn.weight").
class GptTransformerImpl : public torch::nn::Module {
 public:
  explicit GptTransformerImpl(const GptConfig& c);
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<Block> blocks;  // h's, typed
  GptLayerNorm ln_f{nullptr};
};
TORCH_MODULE(GptTransformer);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptConfig& c);
  // Token ids [B, T] (T <= block_size) -> logits [B, T, vocab_size].
  torch::Tensor forward(const torch::Tensor& idx);
  // Parameters, each once; without the position embedding when
  // `non_embedding` (as nanoGPT's get_num_params, which it prints).
  int64_t NumParams(bool non_embedding = true) const;
  // `n` tokens after `prompt` ([1, T]), each drawn from the softmax of the
  // last logits / temperature, cut to the top_k (0: all); eval mode, no
  // gradients; uses torch's generator.
  torch::Tensor Generate(torch::Tensor prompt, int64_t n, double temperature,
                         int64_t top_k);

  GptConfig config;
  GptTransformer transformer{nullptr};
};
TORCH_MODULE(Gpt);

// The GPT as the trainer's Model: forward, and its blocks as FSDP's units.
Model GptModel(const GptConfig& c);

// Cross-entropy of logits [B, T, V] against targets [B, T], the mean over
// every token (nanoGPT's loss).
torch::Tensor GptLoss(const torch::Tensor& logits, const torch::Tensor& target);

// train_cfg's model.type = "gpt" on data.source = "text": the GPT the
// config's [model] keys describe, windows of the text, its loss, and an
// evaluation of train_loss and val_loss (the mean over train.eval_iters
// batches of each split, as nanoGPT's estimate_loss).
TrainParts GptParts(const TrainConfig& c);

}  // namespace dtrun::train
