// The model's and optimizer's state as named tensors, and back: the keys a
// checkpoint holds are the parameters' names and indices, not addresses,
// so a checkpoint loads into any process and any libtorch version.
#include "lib/checkpointing/state_copy.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "lib/process_group.h"
#include "lib/torch_compat.h"

namespace dtrun::train {
namespace {

constexpr char kModelPrefix[] = "ddp.model.";
constexpr char kOptimPrefix[] = "ddp.optim.";

const char kOptimizers[] =
    "checkpoints hold SGD, Adam and AdamW optimizer state only";

// Adam's and AdamW's per-parameter state share their fields; max_exp_avg_sq
// exists only with amsgrad.
template <typename AdamState>
void AdamFields(const AdamState& a, std::map<std::string, torch::Tensor>* out) {
  (*out)["exp_avg"] = a.exp_avg();
  (*out)["exp_avg_sq"] = a.exp_avg_sq();
  if (a.max_exp_avg_sq().defined())
    (*out)["max_exp_avg_sq"] = a.max_exp_avg_sq();
  (*out)["step"] = torch::tensor(a.step(), torch::kLong);
}

// The inverse of AdamFields; a missing field throws out_of_range, which
// SetParamOptimizerState names as a checkpoint of another optimizer.
template <typename S>
std::unique_ptr<S> AdamState(std::map<std::string, torch::Tensor>& state) {
  auto a = std::make_unique<S>();
  a->exp_avg(state.at("exp_avg"));
  a->exp_avg_sq(state.at("exp_avg_sq"));
  if (state.count("max_exp_avg_sq"))
    a->max_exp_avg_sq(state.at("max_exp_avg_sq"));
  a->step(state.at("step").item<int64_t>());
  return a;
}

// The saved tensor at `key` for `live`: there, and of its shape.
const torch::Tensor& Saved(const std::map<std::string, torch::Tensor>& parts,
                           const std::string& key, const torch::Tensor& live) {
  auto it = parts.find(key);
  if (it == parts.end()) {
    throw Error("the checkpoint has no '" + key +
                "': it was saved from another model (model.type and "
                "model.hidden must be the run's)");
  }
  if (it->second.sizes() != live.sizes()) {
    throw Error("the checkpoint's '" + key + "' has shape " +
                c10::str(it->second.sizes()) + ", this model's " +
                c10::str(live.sizes()) + ": it was saved from another model");
  }
  return it->second;
}

}  // namespace

// Empty tensors like each of `like`, on the CPU carved from one mapping
// whose pages are made in one call (MAP_POPULATE): a restarted worker's
// optimizer state is all fresh memory, and touching it page by page cost a
// fault per 4 KiB (0.40 s for 0.77 GB on the development VM, 0.17 s
// populated). Elsewhere (a GPU), empty_like.
std::vector<torch::Tensor> PopulatedLike(
    const std::vector<torch::Tensor>& like) {
  constexpr size_t kAlign = 64;
  size_t total = 0;
  bool cpu = true;
  for (const auto& t : like) {
    cpu = cpu && t.device().is_cpu();
    total += (static_cast<size_t>(t.numel()) * t.element_size() + kAlign - 1) /
             kAlign * kAlign;
  }
  void* map = cpu && total > 0
                  ? ::mmap(nullptr, total, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0)
                  : MAP_FAILED;
  std::vector<torch::Tensor> out;
  if (map == MAP_FAILED) {
    for (const auto& t : like) out.push_back(torch::empty_like(t));
    return out;
  }
  std::shared_ptr<void> region(map, [total](void* p) { ::munmap(p, total); });
  char* at = static_cast<char*>(map);
  for (const auto& t : like) {
    out.push_back(torch::from_blob(
        at, t.sizes(), [region](void*) {},
        torch::TensorOptions().dtype(t.scalar_type())));
    at += (static_cast<size_t>(t.numel()) * t.element_size() + kAlign - 1) /
          kAlign * kAlign;
  }
  return out;
}

// The optimizer keeps no state for a parameter before its first step: an
// empty map then, which restores to no state.
std::map<std::string, torch::Tensor> ParamOptimizerState(
    torch::optim::Optimizer& opt, const torch::Tensor& param) {
  std::map<std::string, torch::Tensor> out;
  auto it = opt.state().find(OptimizerStateKey(opt, param));
  if (it == opt.state().end()) return out;
  torch::optim::OptimizerParamState* s = it->second.get();
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(s)) {
    if (sgd->momentum_buffer().defined())
      out["momentum_buffer"] = sgd->momentum_buffer();
  } else if (auto* aw = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
    AdamFields(*aw, &out);
  } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
    AdamFields(*a, &out);
  } else {
    throw Error(kOptimizers);
  }
  return out;
}

void SetParamOptimizerState(torch::optim::Optimizer& opt,
                            const torch::Tensor& param,
                            std::map<std::string, torch::Tensor> state) {
  if (state.empty()) return;
  const auto key = OptimizerStateKey(opt, param);
  try {
    if (dynamic_cast<torch::optim::SGD*>(&opt)) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(state.at("momentum_buffer"));
      opt.state()[key] = std::move(s);
    } else if (dynamic_cast<torch::optim::AdamW*>(&opt)) {
      opt.state()[key] = AdamState<torch::optim::AdamWParamState>(state);
    } else if (dynamic_cast<torch::optim::Adam*>(&opt)) {
      opt.state()[key] = AdamState<torch::optim::AdamParamState>(state);
    } else {
      throw Error(kOptimizers);
    }
  } catch (const std::out_of_range&) {
    throw Error(
        "the checkpoint's optimizer state lacks a field this "
        "optimizer keeps: it was saved with another optimizer.type");
  }
}

// The optimizer's state is keyed by the parameter's index in
// model.parameters(), not by the address torch's own archive keys it by:
// an index means the same parameter in any process and any libtorch.
std::map<std::string, torch::Tensor> ModelAndOptimizerState(
    torch::nn::Module& model, torch::optim::Optimizer& opt,
    const TensorCopier& copy) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model.named_parameters())
    out[kModelPrefix + p.key()] = copy(p.value());
  for (const auto& b : model.named_buffers())
    out[kModelPrefix + b.key()] = copy(b.value());
  const std::vector<torch::Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    for (const auto& [field, t] : ParamOptimizerState(opt, params[i]))
      out[kOptimPrefix + std::to_string(i) + "." + field] = copy(t);
  }
  return out;
}

bool HasModelAndOptimizerState(
    const std::map<std::string, torch::Tensor>& parts) {
  auto it = parts.lower_bound(kModelPrefix);
  return it != parts.end() && it->first.rfind(kModelPrefix, 0) == 0;
}

namespace {

// The pairs that copy as bytes (CPU tensors of one dtype, both
// contiguous), one copy each; the indices of the others in *others.
std::vector<ByteCopy> ByteCopies(const std::vector<torch::Tensor>& dst,
                                 const std::vector<torch::Tensor>& src,
                                 std::vector<size_t>* others) {
  std::vector<ByteCopy> out;
  for (size_t i = 0; i < dst.size(); ++i) {
    const torch::Tensor &d = dst[i], &s = src[i];
    if (!d.device().is_cpu() || !s.device().is_cpu() ||
        d.scalar_type() != s.scalar_type() || !d.is_contiguous() ||
        !s.is_contiguous() || d.numel() != s.numel()) {
      others->push_back(i);
      continue;
    }
    out.push_back({static_cast<char*>(d.data_ptr()),
                   static_cast<const char*>(s.data_ptr()),
                   static_cast<size_t>(d.numel()) * d.element_size()});
  }
  return out;
}

}  // namespace

// The copies are cut in 4 MiB pieces, dealt to the threads in runs so
// that each streams through memory.
void CopyTensors(const std::vector<torch::Tensor>& dst,
                 const std::vector<torch::Tensor>& src) {
  constexpr size_t kPiece = 4 << 20;
  std::vector<size_t> others;
  std::vector<ByteCopy> pieces;
  for (const ByteCopy& c : ByteCopies(dst, src, &others)) {
    for (size_t at = 0; at < c.n; at += kPiece)
      pieces.push_back({c.to + at, c.from + at, std::min(kPiece, c.n - at)});
  }
  for (size_t i : others) dst[i].copy_(src[i]);
  const size_t threads =
      std::min<size_t>({4, std::max(1u, std::thread::hardware_concurrency()),
                        (pieces.size() + 3) / 4});
  auto run = [&pieces, threads](size_t t) {
    for (size_t i = pieces.size() * t / threads;
         i < pieces.size() * (t + 1) / threads; ++i)
      std::memcpy(pieces[i].to, pieces[i].from, pieces[i].n);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(run, t);
  if (threads > 0) run(0);
  for (auto& th : pool) th.join();
}

// The pairs that are not bytes (another device) read the source only once
// it is verified.
Status CopyTensors(const std::vector<torch::Tensor>& dst,
                   const std::vector<torch::Tensor>& src,
                   const PayloadView& from) {
  std::vector<size_t> others;
  Status s = CopyVerifying(from, ByteCopies(dst, src, &others));
  if (!s.ok()) return s;
  for (size_t i : others) dst[i].copy_(src[i]);
  return Status::Ok();
}

Status RestoreModelAndOptimizerState(
    const std::map<std::string, torch::Tensor>& parts, torch::nn::Module& model,
    torch::optim::Optimizer& opt, const PayloadView* pending) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> dst, src;
  for (const auto& p : model.named_parameters()) {
    dst.push_back(p.value());
    src.push_back(Saved(parts, kModelPrefix + p.key(), p.value()));
  }
  for (const auto& b : model.named_buffers()) {
    dst.push_back(b.value());
    src.push_back(Saved(parts, kModelPrefix + b.key(), b.value()));
  }
  // Each parameter's fields, then fresh tensors for them all at once: a
  // fresh optimizer has no state to copy into, and one mapping populated
  // in one call costs less than a fault per page of many allocations.
  // "step" (Adam's) is a scalar the optimizer reads, not a buffer.
  const std::vector<torch::Tensor> params = model.parameters();
  std::vector<std::map<std::string, torch::Tensor>> states(params.size());
  std::vector<std::pair<torch::Tensor*, const torch::Tensor*>> fill;
  std::vector<torch::Tensor> like;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string pre = kOptimPrefix + std::to_string(i) + ".";
    for (auto it = parts.lower_bound(pre);
         it != parts.end() && it->first.rfind(pre, 0) == 0; ++it) {
      const std::string field = it->first.substr(pre.size());
      states[i][field] = it->second;
      if (field == "step") continue;
      fill.push_back({&states[i][field], &Saved(parts, it->first, params[i])});
      like.push_back(params[i]);
    }
  }
  std::vector<torch::Tensor> fresh = PopulatedLike(like);
  for (size_t k = 0; k < fill.size(); ++k) {
    *fill[k].first = fresh[k];
    dst.push_back(fresh[k]);
    src.push_back(*fill[k].second);
  }
  if (pending) {
    Status s = CopyTensors(dst, src, *pending);
    if (!s.ok()) return s;
  } else {
    CopyTensors(dst, src);
  }
  for (size_t i = 0; i < params.size(); ++i)
    SetParamOptimizerState(opt, params[i], std::move(states[i]));
  return Status::Ok();
}

}  // namespace dtrun::train
