// The GPT of lib/models/gpt.h against nanoGPT's model.py (its parameter
// names and counts, its initialisation, the tie, causality) and the text
// data of lib/models/text_data.h (the vocabulary, the split, the windows).
#include "lib/models/gpt.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "lib/models/text_data.h"

namespace dtrun::train {
namespace {

GptConfig Small(bool bias) {
  GptConfig c;
  c.vocab_size = 65;
  c.block_size = 64;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  c.bias = bias;
  return c;
}

// nanoGPT prints "number of parameters: 0.80M" for this config
// (get_num_params: every parameter once, less the position embedding).
TEST(GptTest, ParameterCountsAndNamesAreNanoGpts) {
  GptImpl gpt(Small(false));
  const int64_t block =
      128 + 128 * 384 + 128 * 128 + 128 + 128 * 512 + 512 * 128;
  EXPECT_EQ(gpt.NumParams(/*non_embedding=*/false),
            4 * block + 65 * 128 + 64 * 128 + 128);
  EXPECT_EQ(gpt.NumParams(), 4 * block + 65 * 128 + 128);  // 795,904
  std::set<std::string> names;
  for (const auto& p : gpt.named_parameters()) names.insert(p.key());
  for (const char* n :
       {"transformer.wte.weight", "transformer.wpe.weight",
        "transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.weight",
        "transformer.h.0.attn.c_proj.weight", "transformer.h.3.ln_2.weight",
        "transformer.h.3.mlp.c_fc.weight", "transformer.h.3.mlp.c_proj.weight",
        "transformer.ln_f.weight"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  EXPECT_EQ(names.size(), 4u * 6 + 3);  // no biases, one tied embedding
  GptImpl biased(Small(true));
  EXPECT_EQ(biased.NumParams(false) - gpt.NumParams(false),
            4 * (128 + 384 + 128 + 128 + 512 + 128) + 128);
}

TEST(GptTest, InitialisationIsNanoGpts) {
  torch::manual_seed(3);
  GptImpl gpt(Small(false));
  for (const auto& p : gpt.named_parameters()) {
    const std::string& n = p.key();
    const double sd = p.value().std().item<double>();
    if (n.find("ln_") != std::string::npos) {
      EXPECT_EQ(p.value().min().item<double>(), 1.0) << n;
    } else if (n.find("c_proj.weight") != std::string::npos) {
      EXPECT_NEAR(sd, 0.02 / std::sqrt(8.0), 0.001) << n;
    } else {
      EXPECT_NEAR(sd, 0.02, 0.002) << n;
    }
  }
}

TEST(GptTest, TheHeadIsTheTokenEmbeddingAndAttentionIsCausal) {
  torch::manual_seed(4);
  GptImpl gpt(Small(false));
  gpt.eval();
  auto idx = torch::randint(65, {2, 16}, torch::kLong);
  auto logits = gpt.forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 16, 65}));
  // a later token changes no earlier position's logits
  auto changed = idx.clone();
  changed.index_put_({0, 10}, (idx[0][10].item<int64_t>() + 1) % 65);
  auto again = gpt.forward(changed);
  EXPECT_TRUE(torch::equal(again.narrow(1, 0, 10), logits.narrow(1, 0, 10)));
  EXPECT_FALSE(torch::equal(again.narrow(1, 10, 6), logits.narrow(1, 10, 6)));
  // the head's gradient lands on the one embedding parameter
  auto loss = GptLoss(gpt.forward(idx), idx);
  loss.backward();
  auto& wte = gpt.transformer->wte->weight;
  ASSERT_TRUE(wte.grad().defined());
  // rows of tokens absent from the input get gradient from the head only
  std::set<int64_t> used;
  for (int64_t i = 0; i < idx.numel(); ++i)
    used.insert(idx.view({-1})[i].item<int64_t>());
  for (int64_t t = 0; t < 65; ++t) {
    if (!used.count(t)) {
      EXPECT_GT(wte.grad()[t].abs().sum().item<double>(), 0) << t;
      break;
    }
  }
}

// The attention, written as nanoGPT's model.py writes it (split, heads,
// q k^T * scale, masked_fill, softmax, @ v), gives the same output and the
// same gradients as the module's (a fused product and mask on 1.13,
// scaled_dot_product_attention on 2.x), up to float rounding.
TEST(GptTest, AttentionIsNanoGptsFormula) {
  torch::manual_seed(6);
  const GptConfig c = Small(true);
  CausalSelfAttention attn(c);
  attn->train();
  const int64_t B = 3, T = 20, C = c.n_embd, nh = c.n_head;
  auto x = torch::randn({B, T, C}, torch::requires_grad());
  auto ours = attn->forward(x);
  auto g = torch::randn_like(ours);
  auto ours_grads = torch::autograd::grad(
      {ours}, {x, attn->c_attn->weight, attn->c_proj->weight}, {g});

  auto qkv = attn->c_attn(x).split(C, 2);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({B, T, nh, C / nh}).transpose(1, 2);
  };
  auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  auto att = torch::matmul(q, k.transpose(-2, -1)) *
             (1.0 / std::sqrt(static_cast<double>(C / nh)));
  auto future = torch::ones({T, T}).tril().eq(0);
  att = torch::softmax(
      att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
  auto ref = attn->c_proj(
      torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C}));
  auto ref_grads = torch::autograd::grad(
      {ref}, {x, attn->c_attn->weight, attn->c_proj->weight}, {g});

  EXPECT_TRUE(torch::allclose(ours, ref, 1e-5, 1e-6));
  for (size_t i = 0; i < ref_grads.size(); ++i)
    EXPECT_TRUE(torch::allclose(ours_grads[i], ref_grads[i], 1e-4, 1e-5)) << i;
}

TEST(GptTest, GenerateExtendsThePrompt) {
  torch::manual_seed(5);
  GptImpl gpt(Small(false));
  auto out = gpt.Generate(torch::zeros({1, 3}, torch::kLong), 70, 0.8, 10);
  EXPECT_EQ(out.size(1), 73);  // past block_size: the context is cut
  EXPECT_LT(out.max().item<int64_t>(), 65);
}

class TextDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/text_data_test_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(TextDataTest, ATextFileSplitsNinetyTenOverItsSortedBytes) {
  std::ofstream(dir_ + "/t.txt") << "hello world, hello text!";  // 24 bytes
  auto d = LoadTextData(dir_ + "/t.txt");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->vocab_size, 12);  // " !,dehlortwx"
  EXPECT_EQ(d->itos.front(), " ");
  EXPECT_EQ(d->train.size(), 21u);  // int(24 * 0.9)
  EXPECT_EQ(d->val.size(), 3u);
  auto enc = d->Encode("hello");
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(d->Decode(enc->view({-1})), "hello");
  EXPECT_FALSE(d->Encode("HELLO").ok());
  EXPECT_FALSE(LoadTextData(dir_ + "/missing").ok());
}

TEST_F(TextDataTest, WindowsAreAPureFunctionOfTheSeedAndShiftByOne) {
  std::vector<uint16_t> data(500);
  for (size_t i = 0; i < data.size(); ++i) data[i] = i % 97;
  torch::Tensor x1, y1, x2, y2, x3, y3;
  TextWindows(data, 16, 4, 7, torch::kCPU, &x1, &y1);
  TextWindows(data, 16, 4, 7, torch::kCPU, &x2, &y2);
  TextWindows(data, 16, 4, 8, torch::kCPU, &x3, &y3);
  EXPECT_TRUE(torch::equal(x1, x2));
  EXPECT_FALSE(torch::equal(x1, x3));
  EXPECT_TRUE(torch::equal(x1.narrow(1, 1, 15), y1.narrow(1, 0, 15)));
  EXPECT_THROW(TextWindows(data, 500, 1, 1, torch::kCPU, &x1, &y1),
               std::invalid_argument);
}

}  // namespace
}  // namespace dtrun::train
