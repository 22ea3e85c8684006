// The two strategies behind lib/parallel/strategy.h: each says how it saves and
// restores its part of a checkpoint (DDP: rank 0's full state; FSDP: a
// shard per rank, or the whole state gathered on rank 0).
#include "lib/parallel/strategy.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "lib/ddp.h"
#include "lib/fsdp.h"
#include "lib/process_group.h"
#include "lib/checkpointing/state_copy.h"
#include "rendezvous/util/check.h"

namespace dtrun::train {
namespace {

// The sum of the gradients' squared L2 norms (each norm in the gradient's
// dtype, as clip_grad_norm_; the sum in float64). A parameter without a
// gradient adds nothing.
double SquaredNorm(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    // every square summed in float64: DDP's whole tensors and FSDP's
    // shards then agree to float64 rounding, and so clip by the same
    // float32 coefficient (the same bits)
    sum += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  return sum;
}

// Step-file keys of each strategy (lib/README.md, "Checkpoint format").
constexpr char kModel[] = "model";
constexpr char kOptimizer[] = "optimizer";
constexpr char kFsdpShards[] = "fsdp_shards";
constexpr char kFsdpLayout[] = "fsdp_layout";

// A JSON string's body: the quote, the backslash and control characters
// escaped.
std::string JsonEscaped(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char u[8];
      std::snprintf(u, sizeof u, "\\u%04x", ch);
      out += u;
    } else {
      out += ch;
    }
  }
  return out;
}

// FSDP's layout as the step's file carries it ("fsdp_layout"):
// {"format": 1, "units": [{"numel": N, "params": [{"name": "0.weight",
// "offset": 0, "shape": [64, 64]}, ...]}, ...]}.
std::string LayoutJson(
    const std::vector<FullyShardedDataParallel::UnitLayout>& units) {
  std::string out = "{\"format\": 1, \"units\": [";
  for (size_t k = 0; k < units.size(); ++k) {
    const auto& u = units[k];
    out += std::string(k ? ", " : "") +
           "{\"numel\": " + std::to_string(u.numel) + ", \"params\": [";
    for (size_t i = 0; i < u.names.size(); ++i) {
      out += std::string(i ? ", " : "") + "{\"name\": \"" +
             JsonEscaped(u.names[i]) +
             "\", \"offset\": " + std::to_string(u.offsets[i]) +
             ", \"shape\": [";
      for (size_t j = 0; j < u.shapes[i].size(); ++j)
        out += std::string(j ? ", " : "") + std::to_string(u.shapes[i][j]);
      out += "]}";
    }
    out += "]}";
  }
  return out + "]}";
}

// Text as a uint8 tensor of its bytes.
torch::Tensor TextTensor(const std::string& text) {
  return torch::from_blob(const_cast<char*>(text.data()),
                          {static_cast<int64_t>(text.size())}, torch::kUInt8)
      .clone();
}

// DDP's checkpoint is the model's and the optimizer's tensors by name in
// the step's file: every rank holds the full state.
class DdpStrategy : public Strategy {
 public:
  DdpStrategy(Model model, ProcessGroup* pg, const TrainConfig& c)
      : model_(model.module),
        forward_(std::move(model.forward)),
        options_(Options(c)) {
    ddp_.emplace(model_, pg, options_);
  }

  torch::Tensor Forward(const torch::Tensor& x) override { return forward_(x); }
  // Only the step's last micro-batch all-reduces; the others accumulate in
  // .grad under NoSync, and the last one's hooks add them into the buckets.
  void Backward(const torch::Tensor& loss, bool last) override {
    if (last) {
      loss.backward();
      TimedSync([this] { ddp_->SyncGradients(); });
    } else {
      DistributedDataParallel::NoSync no_sync(*ddp_);
      loss.backward();
    }
  }
  // Each parameter once (a tied one is registered twice) and only those
  // that train.
  std::vector<torch::Tensor> OptimizerParams() override {
    std::vector<torch::Tensor> out;
    std::set<c10::TensorImpl*> seen;
    for (auto& p : model_->parameters()) {
      if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second)
        out.push_back(p);
    }
    return out;
  }
  std::vector<torch::Tensor> FullParams() override {
    return model_->parameters();
  }
  bool CollectiveEval() const override { return false; }
  void StartFresh() override { ddp_->BroadcastState(); }
  bool CanRegroup() const override { return true; }
  // The old DDP goes before its group does (it holds the group), and the
  // new one broadcasts nothing: the state is the caller's to share.
  // The gradients go first: they are the failed step's, and the old DDP
  // would copy them out of its buckets.
  void Regroup(const std::function<ProcessGroup*()>& regroup) override {
    for (auto& p : model_->parameters()) p.mutable_grad() = torch::Tensor();
    ddp_.reset();
    ddp_.emplace(model_, regroup(), options_);
  }
  double GradNorm() override {
    return std::sqrt(SquaredNorm(OptimizerParams()));
  }

  // Every parameter, buffer and optimizer state tensor by name
  // (state_copy.h), so that any libtorch loads it: torch's own optimizer
  // archive does not survive 1.13 -> 2.x (its parameter keys change form).
  TensorMap Save(torch::optim::Optimizer& opt, const CheckpointDir&,
                 int64_t) override {
    return ModelAndOptimizerState(*model_, opt, [](const torch::Tensor& t) {
      return t.detach();  // encoded before the loop goes on
    });
  }
  // Every rank holds the same state; those that write no step's file copy
  // nothing.
  Snapshot Copy(torch::optim::Optimizer& opt, bool whole,
                const TensorCopier& copy) override {
    if (!whole) return {};
    return {ModelAndOptimizerState(*model_, opt, copy), std::nullopt, {}};
  }
  Status Complete(const TensorMap& parts, const ShardSource& shards,
                  int64_t) override {
    const bool archives = parts.count(kModel) && parts.count(kOptimizer);
    if (!archives && !HasModelAndOptimizerState(parts)) {
      throw Error(
          shards.where +
          " holds checkpoints of an FSDP run (strategy = \"fsdp\"); resume "
          "it with strategy.type=\"fsdp\" or give this DDP run another "
          "checkpoint.dir");
    }
    return Status::Ok();
  }
  // Named tensors, or, from checkpoints written before them, the model's
  // and the optimizer's torch archives (loadable by the libtorch that
  // wrote them).
  Status Restore(const TensorMap& parts, torch::optim::Optimizer& opt,
                 const PayloadView* pending) override {
    if (!parts.count(kModel))
      return RestoreModelAndOptimizerState(parts, *model_, opt, pending);
    if (pending) {  // the archives are read whole: verified first
      Status s = CopyVerifying(*pending, {});
      if (!s.ok()) return s;
    }
    torch::Device device = model_->parameters().front().device();
    torch::serialize::InputArchive m, o;
    std::istringstream ms(TensorBytes(parts.at(kModel))),
        os(TensorBytes(parts.at(kOptimizer)));
    m.load_from(ms, device);
    o.load_from(os, device);
    model_->load(m);
    opt.load(o);
    return Status::Ok();
  }

 private:
  static DdpOptions Options(const TrainConfig& c) {
    DdpOptions o;
    o.bucket_cap_mb = c.bucket_cap_mb;
    o.shared_memory = c.shared_memory;
    o.broadcast_at_start = false;  // StartFresh, when nothing is restored
    return o;
  }

  std::shared_ptr<torch::nn::Module> model_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
  DdpOptions options_;
  std::optional<DistributedDataParallel> ddp_;  // re-made by Regroup
};

// FSDP's checkpoint is sharded (each rank's own file, ckpt_<step>.shard_<r>,
// so no rank ever holds the full state) or full (the whole state dict in
// the step's file). "fsdp_shards" says which: the shard count, 0 for full.
class FsdpStrategy : public Strategy {
 public:
  FsdpStrategy(std::shared_ptr<torch::nn::SequentialImpl> model,
               ProcessGroup* pg, const TrainConfig& c, bool restore_follows)
      : pg_(pg),
        full_format_(c.checkpoint_format == CheckpointFormat::kFull),
        checksum_(c.checksum),
        payload_format_(c.payload_format),
        fsdp_(std::move(model), pg, Options(c, {}, restore_follows)) {}
  FsdpStrategy(Model model, ProcessGroup* pg, const TrainConfig& c,
               bool restore_follows)
      : pg_(pg),
        full_format_(c.checkpoint_format == CheckpointFormat::kFull),
        checksum_(c.checksum),
        payload_format_(c.payload_format),
        fsdp_(
            model.module, model.forward, pg,
            Options(c, c.unit_types.empty() ? model.shard_units : c.unit_types,
                    restore_follows)) {}

  torch::Tensor Forward(const torch::Tensor& x) override {
    return fsdp_.Forward(x);
  }
  // Micro-batches before the step's last keep their gradients whole; the
  // last one's backward reduce-scatters the sum once (as DDP's no_sync).
  void Backward(const torch::Tensor& loss, bool last) override {
    fsdp_.SetGradientSync(last);
    loss.backward();
    TimedSync([this] { fsdp_.SyncGradients(); });
  }
  std::vector<torch::Tensor> OptimizerParams() override {
    return fsdp_.ShardParameters();
  }
  std::vector<torch::Tensor> FullParams() override {
    return fsdp_.FullParameters();
  }
  bool CollectiveEval() const override { return true; }
  // In place, the group goes back to the newest checkpoint: each rank's
  // shards are all there is of them.
  bool CanRegroup() const override { return true; }
  bool EveryRankHoldsAll() const override { return false; }
  void Regroup(const std::function<ProcessGroup*()>& regroup) override {
    fsdp_.Regroup([&] { return pg_ = regroup(); });
  }
  void StartOver(torch::nn::Module& drawn,
                 torch::optim::Optimizer& opt) override {
    std::map<std::string, torch::Tensor> named;
    for (const auto& p : drawn.named_parameters()) named[p.key()] = p.value();
    for (const auto& b : drawn.named_buffers()) named[b.key()] = b.value();
    fsdp_.LoadWhole(named);
    opt.state().clear();
  }
  // From the layout: the elements of this rank's shard of each unit that
  // lie in a parameter of 2 or more dimensions.
  std::vector<torch::Tensor> MatrixMasks() override {
    const auto shards = fsdp_.ShardParameters();
    const auto layout = fsdp_.Layout();
    std::vector<torch::Tensor> out;
    for (size_t k = 0; k < shards.size(); ++k) {
      const int64_t size = shards[k].numel(), lo = pg_->getRank() * size;
      auto mask = torch::zeros({size}, torch::kBool);
      for (size_t i = 0; i < layout[k].names.size(); ++i) {
        if (layout[k].shapes[i].size() < 2) continue;
        int64_t n = 1;
        for (int64_t d : layout[k].shapes[i]) n *= d;
        const int64_t from = std::max(lo, layout[k].offsets[i]);
        const int64_t to = std::min(lo + size, layout[k].offsets[i] + n);
        if (from < to) mask.narrow(0, from - lo, to - from).fill_(true);
      }
      out.push_back(mask.to(shards[k].device()));
    }
    return out;
  }
  double GradNorm() override {
    const auto shards = OptimizerParams();
    std::vector<torch::Tensor> sum{
        torch::tensor({SquaredNorm(shards)}, torch::kDouble)
            .to(shards.front().device())};
    TimedSync([&] { pg_->allreduce(sum)->wait(); });
    return std::sqrt(sum[0].item<double>());
  }

  TensorMap Save(torch::optim::Optimizer& opt, const CheckpointDir& dir,
                 int64_t step) override {
    if (full_format_) {
      TensorMap state = fsdp_.StateDict(opt, /*full=*/true);
      state[kFsdpShards] = torch::tensor(int64_t{0});
      state[kFsdpLayout] = TextTensor(LayoutJson(fsdp_.Layout()));
      return state;
    }
    const std::string path = dir.ShardPath(step, pg_->getRank());
    const Payload shard =
        EncodeTensors(fsdp_.StateDict(opt, /*full=*/false), payload_format_);
    Status s = WriteCheckpointFile(path, shard, nullptr,
                                   CheckpointHeader(shard, checksum_));
    if (!s.ok())
      throw Error("rank " + std::to_string(pg_->getRank()) + ": " +
                  s.message());
    // every shard is durable before the step's file names them
    pg_->barrier()->wait();
    return {{kFsdpShards, torch::tensor(int64_t{pg_->getSize()})},
            {kFsdpLayout, TextTensor(LayoutJson(fsdp_.Layout()))}};
  }
  // The state dict is already a copy (FullyShardedDataParallel::StateDict
  // copies every tensor): cloning it again doubled FSDP's async stall.
  Snapshot Copy(torch::optim::Optimizer& opt, bool,
                const TensorCopier& copy) override {
    TensorMap state = fsdp_.StateDict(opt, /*full=*/full_format_, copy);
    if (full_format_) {
      state[kFsdpShards] = torch::tensor(int64_t{0});
      state[kFsdpLayout] = TextTensor(LayoutJson(fsdp_.Layout()));
      return {std::move(state), std::nullopt, {}};
    }
    return {{{kFsdpShards, torch::tensor(int64_t{pg_->getSize()})},
             {kFsdpLayout, TextTensor(LayoutJson(fsdp_.Layout()))}},
            std::move(state),
            {}};
  }
  Status Complete(const TensorMap& parts, const ShardSource& source,
                  int64_t step) override {
    if (!parts.count(kFsdpShards)) {
      throw Error(
          source.where +
          " holds checkpoints of a DDP run (strategy = \"ddp\"); resume it "
          "with strategy.type=\"ddp\" or give this FSDP run another "
          "checkpoint.dir");
    }
    // Read and verified once; Restore() loads what this kept.
    verified_.clear();
    const int64_t shards = parts.at(kFsdpShards).item<int64_t>();
    if (shards == 0) verified_.push_back(parts);  // full: all in the step's
    for (int64_t j = 0; j < shards; ++j) {
      const int r = static_cast<int>(j);
      if (source.own_only && r != pg_->getRank()) continue;
      Status s =
          LoadShard(source.read(step, r),
                    source.where + "/" + CheckpointDir::ShardName(step, r));
      if (!s.ok()) {
        verified_.clear();
        return s;
      }
    }
    return Status::Ok();
  }
  void Discard() override { verified_.clear(); }
  Status Restore(const TensorMap&, torch::optim::Optimizer& opt,
                 const PayloadView* pending) override {
    DTRUN_CHECK(!verified_.empty())
        << "FSDP Restore() without a Complete() that accepted";
    if (pending) {  // the step's file: verified before anything is loaded
      Status s = CopyVerifying(*pending, {});
      if (!s.ok()) {
        verified_.clear();
        return s;
      }
    }
    fsdp_.LoadStateDicts(verified_, opt);
    verified_.clear();
    return Status::Ok();
  }

 private:
  static FsdpOptions Options(const TrainConfig& c,
                             std::vector<std::string> unit_types,
                             bool restore_follows) {
    FsdpOptions o;
    o.broadcast_at_start = !restore_follows;
    o.min_unit_params = c.min_unit_params;
    o.unit_types = std::move(unit_types);
    o.reshard_after_forward = c.reshard_after_forward;
    o.prefetch = c.prefetch;
    o.param_dtype = c.param_dtype;
    o.reduce_dtype = c.reduce_dtype;
    o.cpu_offload = c.cpu_offload;
    o.shared_memory = c.shared_memory;
    return o;
  }
  // Decodes one shard file's verified payload into verified_.
  Status LoadShard(const Result<PayloadView>& shard, const std::string& path) {
    auto decoded =
        shard.ok() ? DecodeTensors(*shard) : Result<TensorMap>(shard.status());
    if (!decoded.ok()) {
      return Status::Invalid("its shard " + path +
                             " does not load: " + decoded.status().message());
    }
    verified_.push_back(std::move(*decoded));
    return Status::Ok();
  }

  ProcessGroup* pg_;
  bool full_format_;
  Checksum checksum_;
  PayloadFormat payload_format_;
  FullyShardedDataParallel fsdp_;
  // by Complete(), for Restore()
  std::vector<TensorMap> verified_;
};

}  // namespace

Strategy::ShardSource Strategy::FolderShards(const CheckpointDir& dir) {
  ShardSource source;
  source.read = [&dir](int64_t step, int rank) {
    return ReadCheckpointFile(dir.ShardPath(step, rank));
  };
  source.where = dir.dir();
  return source;
}

std::vector<torch::Tensor> Strategy::MatrixMasks() {
  std::vector<torch::Tensor> out;
  for (const auto& p : OptimizerParams())
    out.push_back(
        torch::scalar_tensor(p.dim() >= 2, torch::kBool).to(p.device()));
  return out;
}

void Strategy::Regroup(const std::function<ProcessGroup*()>&) {
  throw Error(
      "this strategy cannot re-form its group in place (its state is "
      "sharded across the ranks)");
}

void Strategy::StartOver(torch::nn::Module&, torch::optim::Optimizer&) {
  throw Error("this strategy cannot go back to the model as first made");
}

double Strategy::ClipFactor(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1 ? coef : 1.0;
}

bool Strategy::ClipGrads(double norm, double max_norm) {
  const double coef = ClipFactor(norm, max_norm);
  if (coef == 1.0) return false;
  torch::NoGradGuard no_grad;
  for (auto& p : OptimizerParams()) {
    if (p.grad().defined()) p.mutable_grad().mul_(coef);
  }
  return true;
}

void Strategy::ScaleGrads(double factor) {
  torch::NoGradGuard no_grad;
  for (auto& p : OptimizerParams()) {
    if (p.grad().defined()) p.mutable_grad().mul_(factor);
  }
}

// The one place that picks a concrete strategy: the trainer sees only the
// interface.
std::unique_ptr<Strategy> MakeStrategy(Model model, ProcessGroup* pg,
                                       const TrainConfig& c,
                                       bool restore_follows) {
  if (c.strategy == StrategyKind::kFsdp) {
    // A Sequential's units are its children; any other model's, the
    // modules of the types the policy names.
    auto seq =
        std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model.module);
    if (seq && c.unit_types.empty())
      return std::make_unique<FsdpStrategy>(seq, pg, c, restore_follows);
    return std::make_unique<FsdpStrategy>(std::move(model), pg, c,
                                          restore_follows);
  }
  return std::make_unique<DdpStrategy>(std::move(model), pg, c);
}

std::unique_ptr<Strategy> MakeStrategy(
    std::shared_ptr<torch::nn::SequentialImpl> model, ProcessGroup* pg,
    const TrainConfig& c) {
  return MakeStrategy(Model::Of(model), pg, c);
}

}  // namespace dtrun::train
