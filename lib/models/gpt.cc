// nanoGPT's GPT in libtorch (lib/models/gpt.h).
#include "lib/models/gpt.h"

#include <cmath>
#include <set>
#include <string>

#include "lib/fsdp.h"
#include "lib/torch_compat.h"

namespace dtrun::train {

// nanoGPT's LayerNorm exists for one reason: torch's takes no "bias=False".
// Ones and zeros at the start, as torch's own.
GptLayerNormImpl::GptLayerNormImpl(int64_t n, bool with_bias) {
  weight = register_parameter("weight", torch::ones({n}));
  if (with_bias) bias = register_parameter("bias", torch::zeros({n}));
}

torch::Tensor GptLayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {weight.size(0)}, weight, bias, 1e-5);
}

// One Linear makes q, k and v for every head at once (c_attn), as
// nanoGPT's; c_proj mixes the heads back, and is the residual projection
// the initialisation scales down.
CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c)
    : n_head_(c.n_head), dropout_(c.dropout) {
  c_attn = register_module(
      "c_attn",
      torch::nn::Linear(
          torch::nn::LinearOptions(c.n_embd, 3 * c.n_embd).bias(c.bias)));
  c_proj = register_module(
      "c_proj", torch::nn::Linear(
                    torch::nn::LinearOptions(c.n_embd, c.n_embd).bias(c.bias)));
  attn_dropout = register_module("attn_dropout", torch::nn::Dropout(c.dropout));
  resid_dropout =
      register_module("resid_dropout", torch::nn::Dropout(c.dropout));
}

// q, k, v for every head; scaled_dot_product_attention where the libtorch
// has it (2.0 on), nanoGPT's masked softmax otherwise (1.13, and nanoGPT
// itself on a torch without it).
torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const int64_t hs = C / n_head_;
  torch::Tensor y;
#if TORCH_VERSION_MAJOR >= 2
  auto qkv = c_attn(x).split(C, 2);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({B, T, n_head_, hs}).transpose(1, 2);
  };
  y = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]),
                                       heads(qkv[2]), c10::nullopt,
                                       is_training() ? dropout_ : 0.0, true);
  y = y.transpose(1, 2);
#else
  // nanoGPT's q k^T * scale, masked_fill and softmax, in fewer passes: one
  // copy lays q, k and v out head by head ([3, B*heads, T, hs]; unbind's
  // backward is one stack), and one baddbmm adds the scaled scores to the
  // causal mask as a bias (0 on and below the diagonal, -inf above), where
  // the product, the scaling and the fill each made a new tensor.
  auto qkv = c_attn(x)
                 .view({B, T, 3, n_head_, hs})
                 .permute({2, 0, 3, 1, 4})
                 .contiguous()
                 .view({3, B * n_head_, T, hs})
                 .unbind(0);
  if (!mask_.defined() || mask_.size(0) < T || mask_.device() != x.device() ||
      mask_.scalar_type() != x.scalar_type()) {
    mask_ = torch::full({T, T}, -std::numeric_limits<float>::infinity(),
                        x.options().requires_grad(false))
                .triu(1);
  }
  auto att = torch::baddbmm(
      mask_.narrow(0, 0, T).narrow(1, 0, T).expand({B * n_head_, T, T}), qkv[0],
      qkv[1].transpose(1, 2), /*beta=*/1.0,
      /*alpha=*/1.0 / std::sqrt(static_cast<double>(hs)));
  att = attn_dropout(torch::softmax(att, -1));
  y = torch::bmm(att, qkv[2]).view({B, n_head_, T, hs}).transpose(1, 2);
#endif
  y = y.contiguous().view({B, T, C});
  return resid_dropout(c_proj(y));
}

// Four times as wide inside, exact GELU (nanoGPT's nn.GELU()), dropout on
// the way back into the residual stream.
GptMlpImpl::GptMlpImpl(const GptConfig& c) {
  c_fc = register_module(
      "c_fc",
      torch::nn::Linear(
          torch::nn::LinearOptions(c.n_embd, 4 * c.n_embd).bias(c.bias)));
  c_proj = register_module(
      "c_proj",
      torch::nn::Linear(
          torch::nn::LinearOptions(4 * c.n_embd, c.n_embd).bias(c.bias)));
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
}

torch::Tensor GptMlpImpl::forward(const torch::Tensor& x) {
  return dropout(c_proj(torch::gelu(c_fc(x))));
}

// Pre-LayerNorm: each half reads a normalised copy of the residual stream
// and adds its output to it.
BlockImpl::BlockImpl(const GptConfig& c) {
  ln_1 = register_module("ln_1", GptLayerNorm(c.n_embd, c.bias));
  attn = register_module("attn", CausalSelfAttention(c));
  ln_2 = register_module("ln_2", GptLayerNorm(c.n_embd, c.bias));
  mlp = register_module("mlp", GptMlp(c));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn(ln_1(x));
  return h + mlp(ln_2(h));
}

// The blocks are registered in a ModuleList ("h.0", "h.1", ...) for their
// names and kept typed beside it for the forward.
GptTransformerImpl::GptTransformerImpl(const GptConfig& c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  drop = register_module("drop", torch::nn::Dropout(c.dropout));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    blocks.push_back(Block(c));
    h->push_back(blocks.back());
  }
  ln_f = register_module("ln_f", GptLayerNorm(c.n_embd, c.bias));
}

// nanoGPT's _init_weights, then its scaled residual projections.
GptImpl::GptImpl(const GptConfig& c) : config(c) {
  if (c.n_embd % c.n_head != 0) {
    throw std::invalid_argument("model.n_embd (" + std::to_string(c.n_embd) +
                                ") must be a multiple of model.n_head (" +
                                std::to_string(c.n_head) + ")");
  }
  transformer = register_module("transformer", GptTransformer(c));
  torch::NoGradGuard no_grad;
  const double proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* lin = m->as<torch::nn::Linear>()) {
      lin->weight.normal_(0.0, 0.02);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = m->as<torch::nn::Embedding>()) {
      emb->weight.normal_(0.0, 0.02);
    }
  }
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    const std::string tail = "c_proj.weight";
    if (name.size() >= tail.size() &&
        name.compare(name.size() - tail.size(), tail.size(), tail) == 0) {
      p.value().normal_(0.0, proj_std);
    }
  }
}

// Embeddings, the blocks (each an FSDP unit when sharded), the last
// LayerNorm and the logits of every position (training wants them all).
torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  if (T > config.block_size) {
    throw std::invalid_argument("a sequence of " + std::to_string(T) +
                                " tokens is longer than model.block_size (" +
                                std::to_string(config.block_size) + ")");
  }
  auto& t = *transformer;
  auto pos = torch::arange(
      T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = t.drop(t.wte(idx) + t.wpe(pos));
  for (auto& block : t.blocks) x = ShardedCall(block, x);
  x = t.ln_f(x);
  // the LM head is the token embedding (nanoGPT ties lm_head.weight to it)
  return torch::nn::functional::linear(x, t.wte->weight);
}

// parameters() lists a parameter each time a module registers it, so the
// count goes by tensor.
int64_t GptImpl::NumParams(bool non_embedding) const {
  std::set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  if (non_embedding) n -= transformer->wpe->weight.numel();
  return n;
}

// nanoGPT's generate(): the context cut to the last block_size tokens,
// temperature, top-k, one draw per token from torch's generator.
torch::Tensor GptImpl::Generate(torch::Tensor idx, int64_t n,
                                double temperature, int64_t top_k) {
  torch::NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  for (int64_t i = 0; i < n; ++i) {
    auto cond =
        idx.size(1) <= config.block_size
            ? idx
            : idx.narrow(1, idx.size(1) - config.block_size, config.block_size);
    auto logits = forward(cond).select(1, cond.size(1) - 1) / temperature;
    if (top_k > 0 && top_k < logits.size(-1)) {
      auto kth = std::get<0>(logits.topk(top_k)).select(-1, top_k - 1);
      logits = logits.masked_fill(logits < kth.unsqueeze(-1),
                                  -std::numeric_limits<float>::infinity());
    }
    auto next = torch::multinomial(torch::softmax(logits, -1), 1);
    idx = torch::cat({idx, next}, 1);
  }
  train(was_training);
  return idx;
}

// The blocks are the units FSDP shards one by one (the embeddings and the
// last LayerNorm form the root unit).
Model GptModel(const GptConfig& c) {
  Model m = Model::Of(std::make_shared<GptImpl>(c));
  m.shard_units = {"Block"};
  return m;
}

torch::Tensor GptLoss(const torch::Tensor& logits,
                      const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

}  // namespace dtrun::train
