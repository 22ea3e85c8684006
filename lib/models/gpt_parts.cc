// train_cfg's GPT on text (lib/models/gpt.h, GptParts): a user of the
// public trainer, as any other model would be.
#include <cstdio>
#include <memory>

#include "lib/checkpoint.h"
#include "lib/models/gpt.h"
#include "lib/models/text_data.h"
#include "lib/process_group.h"

namespace dtrun::train {

// The [model] keys, nanoGPT's names, and the data's vocabulary.
static GptConfig GptConfigOf(const TrainConfig& c, int64_t vocab_size) {
  GptConfig g;
  g.vocab_size = vocab_size;
  g.block_size = c.block_size;
  g.n_layer = c.n_layer;
  g.n_head = c.n_head;
  g.n_embd = c.n_embd;
  g.dropout = c.dropout;
  g.bias = c.bias;
  return g;
}

TrainParts GptParts(const TrainConfig& c) {
  auto loaded = LoadTextData(c.text_path);
  if (!loaded.ok()) throw Error(loaded.status().message());
  auto data = std::make_shared<TextData>(std::move(*loaded));
  const GptConfig g = GptConfigOf(c, data->vocab_size);
  TrainParts parts;
  parts.model = [g] { return GptModel(g); };
  // Each micro-batch's windows from their own generator: a pure function
  // of (seed, micro-batch, rank).
  parts.batch = [data, g](const BatchRequest& r) {
    const uint64_t seed = r.seed * 1000003ULL +
                          static_cast<uint64_t>(r.micro) * 7919ULL +
                          static_cast<uint64_t>(r.rank) * 104729ULL;
    Batch b;
    TextWindows(data->train, g.block_size, r.batch_size, seed, r.device,
                &b.input, &b.target);
    return b;
  };
  parts.loss = GptLoss;
  // Fresh windows each evaluation (as nanoGPT's), drawn apart from the
  // training batches by the steps done, so that a resumed run evaluates on
  // the windows an unbroken one does.
  auto steps = std::make_shared<uint64_t>(0);
  parts.on_step_end = [steps](const StepEnd& s) { *steps = s.step; };
  const uint64_t seed = c.seed;
  const int iters = c.eval_iters, batch = c.batch_size;
  parts.evaluate = [data, g, steps, seed, iters, batch](const Forward& forward,
                                                        torch::Device device) {
    const uint64_t round = *steps;
    std::map<std::string, double> out;
    for (const auto* split : {&data->train, &data->val}) {
      double sum = 0;
      for (int i = 0; i < iters; ++i) {
        torch::Tensor x, y;
        TextWindows(*split, g.block_size, batch,
                    ~seed ^ (round * 1000003ULL + static_cast<uint64_t>(i)),
                    device, &x, &y);
        sum += GptLoss(forward(x), y).item<double>();
      }
      out[split == &data->train ? "train_loss" : "val_loss"] = sum / iters;
    }
    return out;
  };
  return parts;
}

}  // namespace dtrun::train

namespace dtrun::train {

// The newest step's file in the checkpoint folder (a DDP run's holds the
// whole model; an FSDP run's weights are in its shards, which
// python -m dtrun.checkpoint convert merges into one file).
int SampleGpt(const TrainConfig& c, int64_t n) {
  auto loaded = LoadTextData(c.text_path);
  if (!loaded.ok()) throw Error(loaded.status().message());
  std::string from = c.sample_from;
  if (from.empty()) {
    if (c.checkpoint_dir.empty())
      throw Error("--sample: no checkpoint.dir and no sample.from to read");
    const auto steps = CheckpointDir(c.checkpoint_dir, 1).Steps();
    if (steps.empty())
      throw Error("--sample: no checkpoint in " + c.checkpoint_dir +
                  " yet: train first, or give sample.from");
    from = c.checkpoint_dir + "/" + CheckpointDir::StepName(steps.front());
  }
  torch::manual_seed(c.seed);
  auto gpt = std::make_shared<GptImpl>(GptConfigOf(c, loaded->vocab_size));
  try {
    LoadStateDict(*gpt, from, "--sample: " + from);
  } catch (const Error& e) {
    if (std::string(e.what()).find("FSDP") == std::string::npos) throw;
    throw Error(std::string(e.what()) + "; then train_cfg CONFIG --sample N " +
                "--set sample.from='\"OUT.dtck\"'");
  }
  auto prompt = loaded->Encode(c.sample_prompt);
  if (!prompt.ok()) throw Error("sample.prompt: " + prompt.status().message());
  auto out = gpt->Generate(*prompt, n, c.sample_temperature, c.sample_top_k);
  std::printf("%s\n", loaded->Decode(out.select(0, 0)).c_str());
  return 0;
}

}  // namespace dtrun::train
