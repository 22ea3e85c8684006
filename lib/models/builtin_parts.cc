// The built-in parts train_cfg trains (lib/trainer.h, BuiltinParts): an MLP
// or an 8x8 CNN by name, sklearn's digits or synthetic blobs, cross-entropy,
// accuracy on the held-out rows. A user of the library brings their own.
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "lib/models/data.h"
#include "lib/models/gpt.h"
#include "lib/checkpointing/state_copy.h"
#include "lib/trainer.h"
#include "lib/process_group.h"

namespace dtrun::train {
namespace {

// A Sequential, because FSDP wraps consecutive children into units.
std::shared_ptr<torch::nn::SequentialImpl> MakeMlpOrCnn(const TrainConfig& c,
                                                        int features,
                                                        int classes) {
  torch::manual_seed(c.seed);
  auto seq = std::make_shared<torch::nn::SequentialImpl>();
  if (c.model == ModelKind::kCnn) {
    if (features != 64)
      throw Error("model 'cnn' needs 8x8 inputs (data = \"digits\")");
    seq->push_back(
        torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {1, 8, 8})));
    seq->push_back(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)));
    seq->push_back(torch::nn::ReLU());
    seq->push_back(torch::nn::MaxPool2d(2));
    seq->push_back(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
    seq->push_back(torch::nn::ReLU());
    seq->push_back(torch::nn::Flatten());
    seq->push_back(torch::nn::Linear(32 * 4 * 4, classes));
    return seq;
  }
  int in = features;  // kMlp
  for (int h : c.hidden) {
    seq->push_back(torch::nn::Linear(in, h));
    seq->push_back(torch::nn::ReLU());
    if (c.dropout > 0) seq->push_back(torch::nn::Dropout(c.dropout));
    in = h;
  }
  seq->push_back(torch::nn::Linear(in, classes));
  return seq;
}

// A Linear layer whose parameters are given, not drawn: torch::nn::Linear's
// constructor draws its weights (0.34 s for 96 M parameters), which a
// restarted worker's resume overwrites at once. Same names and forward.
class BlankLinearImpl : public torch::nn::Module {
 public:
  BlankLinearImpl(torch::Tensor w, torch::Tensor b)
      : weight(register_parameter("weight", std::move(w))),
        bias(register_parameter("bias", std::move(b))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(x, weight, bias);
  }
  torch::Tensor weight, bias;
};

// The MLP with its parameters left undrawn, carved from one mapping
// populated in one call (the restore then writes them without a fault per
// page).
std::shared_ptr<torch::nn::SequentialImpl> MakeBlankMlp(const TrainConfig& c,
                                                        int features,
                                                        int classes) {
  std::vector<int64_t> widths{features};
  for (int h : c.hidden) widths.push_back(h);
  widths.push_back(classes);
  std::vector<torch::Tensor> like;  // not touched: only their shapes count
  for (size_t i = 1; i < widths.size(); ++i) {
    like.push_back(torch::empty({widths[i], widths[i - 1]}));
    like.push_back(torch::empty({widths[i]}));
  }
  const std::vector<torch::Tensor> params = PopulatedLike(like);
  auto seq = std::make_shared<torch::nn::SequentialImpl>();
  for (size_t i = 1; i < widths.size(); ++i) {
    seq->push_back(std::make_shared<BlankLinearImpl>(params[2 * i - 2],
                                                     params[2 * i - 1]));
    if (i + 1 == widths.size()) break;
    seq->push_back(torch::nn::ReLU());
    if (c.dropout > 0) seq->push_back(torch::nn::Dropout(c.dropout));
  }
  return seq;
}

// The batch's rows copied into one CPU tensor, then moved to the device in
// one transfer.
torch::Tensor Rows(const Dataset& d, const std::vector<int64_t>& idx,
                   torch::Tensor* labels, torch::Device device) {
  auto x = torch::empty({static_cast<int64_t>(idx.size()), d.features});
  auto y = torch::empty({static_cast<int64_t>(idx.size())}, torch::kLong);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (size_t i = 0; i < idx.size(); ++i) {
    std::copy_n(d.x.begin() + idx[i] * d.features, d.features,
                xp + i * d.features);
    yp[i] = d.y[static_cast<size_t>(idx[i])];
  }
  *labels = y.to(device);
  return x.to(device);
}

Dataset LoadDataset(const TrainConfig& c) {
  if (c.data == DataSource::kSynthetic) {
    return MakeSynthetic(c.synthetic_samples, c.synthetic_features,
                         c.synthetic_classes, c.seed);
  }
  auto loaded = LoadDigits(c.digits_path);  // kDigits
  if (!loaded.ok()) throw Error(loaded.status().message());
  return std::move(*loaded);
}

}  // namespace

// The data set is loaded once and shared by the parts' closures, which
// the trainer may copy; the config is copied into them (the trainer keeps
// its own reference to the caller's).
TrainParts BuiltinParts(const TrainConfig& c) {
  if (c.model == ModelKind::kGpt) return GptParts(c);
  struct Data {
    Dataset train, test;
    int features = 0, classes = 0;
  };
  auto data = std::make_shared<Data>();
  {
    Dataset all = LoadDataset(c);
    data->features = all.features;
    data->classes = all.classes;
    SplitTrainTest(all, c.test_fraction, &data->train, &data->test);
  }
  TrainParts parts;
  parts.model = [c, data] {
    return Model::Of(MakeMlpOrCnn(c, data->features, data->classes));
  };
  // Only the MLP has a blank twin: its Linear layers are all there is to
  // draw, and a 96 M parameter restart spends 0.34 s drawing them.
  if (c.model == ModelKind::kMlp) {
    parts.model_for_resume = [c, data] {
      return Model::Of(MakeBlankMlp(c, data->features, data->classes));
    };
  }
  // The sampler is indexed by micro-batch, not by step, so a run with
  // accumulate = k sees the same samples as one with k times the batch.
  parts.batch = [data](const BatchRequest& r) {
    auto idx = StepIndices(data->train.rows(), r.batch_size, r.world, r.rank,
                           r.micro, r.seed, r.drop_last);
    Batch b;
    b.input = Rows(data->train, idx, &b.target, r.device);
    return b;
  };
  // Accuracy on the whole test set in one batch.
  parts.evaluate = [data](const Forward& forward, torch::Device device) {
    std::vector<int64_t> all(data->test.rows());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    torch::Tensor y;
    torch::Tensor x = Rows(data->test, all, &y, device);
    torch::Tensor pred = forward(x).argmax(1);
    return std::map<std::string, double>{
        {"eval_accuracy", pred.eq(y).sum().item<double>() /
                              static_cast<double>(data->test.rows())}};
  };
  return parts;
}

int Train(const TrainConfig& c) {
  if (std::string err = ValidateConfig(c); !err.empty()) throw Error(err);
  return Train(c, BuiltinParts(c));
}

}  // namespace dtrun::train
