// FSDP's state out and in: full parameters gathered, sharded and full
// state dicts (a unit's flat range of parameters and optimizer state, with
// the frozen parameters and buffers every rank holds whole), resharded on
// load from any number of ranks' dicts.
#include <torch/torch.h>

#include "lib/fsdp.h"
#include "lib/parallel/fsdp_impl.h"
#include "lib/checkpointing/state_copy.h"

namespace dtrun::train {
namespace {

using Impl = FullyShardedDataParallel::Impl;

constexpr char kFrozen[] = "frozen.";
constexpr char kBuffer[] = "buffer.";

int64_t Bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  return static_cast<int64_t>(t.storage().nbytes());
}

// The first dict holding `key`, or null.
const at::Tensor* Find(const Impl::StateDicts& dicts, const std::string& key) {
  for (const auto& dict : dicts) {
    auto it = dict.find(key);
    if (it != dict.end()) return &it->second;
  }
  return nullptr;
}

}  // namespace

// Gathers a float32 tensor of `s` elements per rank into [s * world].
// Shards and optimizer state are float32 whatever param_dtype is.
at::Tensor Impl::GatherFloat(const at::Tensor& part) {
  at::Tensor src = part.detach().to(device).contiguous();
  if (world == 1) return src.clone();
  at::Tensor out = at::empty({src.numel() * world}, src.options());
  net->AllGather(out, src)->wait();
  return out;
}

// The names saved for unit k ("param", optimizer state), after checking
// that every dict holds a unit of this model's size.
std::set<std::string> Impl::SavedNames(size_t k,
                                       const StateDicts& dicts) const {
  const Unit& u = units[k];
  const std::string pre = "u" + std::to_string(k) + ".";
  std::set<std::string> names;
  for (const auto& dict : dicts) {
    auto numel = dict.find(pre + "numel");
    if (numel == dict.end() || numel->second.item<int64_t>() != u.numel) {
      throw Error("FSDP checkpoint: unit " + std::to_string(k) + " holds " +
                  (numel == dict.end()
                       ? std::string("nothing")
                       : std::to_string(numel->second.item<int64_t>()) +
                             " parameters") +
                  ", this model's holds " + std::to_string(u.numel) +
                  ": the model or the wrap policy changed since it was saved");
    }
    for (const auto& [key, t] : dict) {
      if (key.compare(0, pre.size(), pre) == 0)
        names.insert(key.substr(pre.size()));
    }
  }
  names.erase("begin");
  names.erase("numel");
  return names;
}

// This rank's shard of unit k's `name`, copied from the saved pieces that
// overlap it.
at::Tensor Impl::Reassemble(size_t k, const std::string& name,
                            const StateDicts& dicts) const {
  const Unit& u = units[k];
  const std::string pre = "u" + std::to_string(k) + ".";
  // The elements this rank owns now, clipped to the real (unpadded) ones.
  const int64_t lo = rank * u.shard_size;
  const int64_t hi = std::min(lo + u.shard_size, u.numel);
  at::Tensor dest = at::zeros({u.shard_size}, at::kFloat);
  int64_t covered = 0;
  for (const auto& dict : dicts) {
    auto it = dict.find(pre + name);
    if (it == dict.end()) continue;
    const int64_t b = dict.at(pre + "begin").item<int64_t>();
    const int64_t e = std::min(b + it->second.numel(), u.numel);
    const int64_t from = std::max(lo, b), to = std::min(hi, e);
    if (from >= to) continue;
    dest.narrow(0, from - lo, to - from)
        .copy_(it->second.narrow(0, from - b, to - from));
    covered += to - from;
  }
  if (covered != std::max<int64_t>(0, hi - lo)) {
    throw Error("FSDP checkpoint: elements [" + std::to_string(lo) + ", " +
                std::to_string(hi) + ") of unit " + std::to_string(k) + "'s " +
                name + " are missing (" + std::to_string(covered) +
                " found): a shard file of the checkpoint is missing");
  }
  return dest.to(u.shard.device());
}

// Each unit gathered once, then cut into the model's parameters; frozen
// ones are whole already.
std::vector<at::Tensor> FullyShardedDataParallel::FullParameters() {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flats;
  for (auto& u : d.units) flats.push_back(d.GatherFloat(u.shard).to(at::kCPU));
  std::vector<at::Tensor> out;
  for (const auto& [k, i] : d.param_slot) {
    if (k == d.units.size()) {
      out.push_back(d.frozen[i].detach().to(at::kCPU, at::kFloat, false, true));
      continue;
    }
    const auto& p = d.units[k].params[i];
    out.push_back(flats[k]
                      .narrow(0, d.units[k].offsets[i], p.numel())
                      .view(p.sizes())
                      .clone());
  }
  return out;
}

std::map<std::string, at::Tensor> FullyShardedDataParallel::StateDict(
    torch::optim::Optimizer& opt, bool full,
    const std::function<at::Tensor(const at::Tensor&)>& copy_) {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  // A host tensor of its own: a new one (gathered) is kept when on the CPU.
  auto copy = [&copy_](const at::Tensor& t, bool fresh) {
    if (t.is_cpu() && fresh) return t;
    if (copy_) return copy_(t);
    return t.is_cpu() ? t.clone() : t.to(at::kCPU);
  };
  std::map<std::string, at::Tensor> out;
  for (size_t k = 0; k < d.units.size(); ++k) {
    Impl::Unit& u = d.units[k];
    const std::string pre = "u" + std::to_string(k) + ".";
    std::map<std::string, at::Tensor> tensors =
        ParamOptimizerState(opt, u.shard);
    tensors["param"] = u.shard.detach();
    // "step" is a scalar, the same on every rank. A full state gathers the
    // shards and drops the padding; a sharded one keeps this rank's slice
    // and where it begins, from which any world size can reassemble it.
    for (auto& [name, t] : tensors) {
      if (name == "step") {
        out[pre + name] = copy(t.detach(), false);
      } else if (full) {  // gathered into a new tensor
        out[pre + name] = copy(d.GatherFloat(t).narrow(0, 0, u.numel), true);
      } else {
        out[pre + name] = copy(t.detach(), false);
      }
    }
    out[pre + "begin"] =
        torch::tensor(full ? int64_t{0} : d.rank * u.shard_size, torch::kLong);
    out[pre + "numel"] = torch::tensor(u.numel, torch::kLong);
  }
  // Whole on every rank: each shard file carries them, so any one restores.
  for (size_t i = 0; i < d.frozen.size(); ++i)
    out[kFrozen + d.frozen_names[i]] = copy(d.frozen[i].detach(), false);
  for (const auto& [name, b] : d.buffers)
    out[kBuffer + name] = copy(b.detach(), false);
  return out;
}

// Resharding N -> M: every dict holds [begin, begin + len) of each unit's
// flat tensors. This rank copies the overlap of each with its own [lo, hi)
// and checks that the pieces cover it exactly, so that a missing shard file
// is an error rather than zeros in the model. Frozen parameters and buffers
// come from the first dict that has them (checkpoints from before they were
// saved have none: the model keeps its own).
// Each rank lays the whole unit out as Shard() did, padding included, and
// keeps its own slice: every rank's slices fit together as the first ones
// did, with no collective.
void FullyShardedDataParallel::LoadWhole(
    const std::map<std::string, at::Tensor>& named) {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  auto take = [&](const std::string& name) -> const at::Tensor& {
    auto it = named.find(name);
    if (it == named.end())
      throw Error("FSDP: no tensor named '" + name + "' to load");
    return it->second;
  };
  for (auto& u : d.units) {
    at::Tensor flat = at::zeros({u.padded}, at::kFloat);
    for (size_t i = 0; i < u.names.size(); ++i) {
      flat.narrow(0, u.offsets[i], u.params[i].numel())
          .copy_(take(u.names[i]).reshape({-1}));
    }
    u.shard.detach().copy_(flat.narrow(0, d.rank * u.shard_size, u.shard_size));
  }
  for (size_t i = 0; i < d.frozen.size(); ++i)
    d.frozen[i].detach().copy_(take(d.frozen_names[i]));
  for (auto& [name, b] : d.buffers) b.copy_(take(name));
}

void FullyShardedDataParallel::LoadStateDicts(
    const std::vector<std::map<std::string, at::Tensor>>& dicts,
    torch::optim::Optimizer& opt) {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  if (dicts.empty()) throw Error("FSDP: no state to load");
  for (size_t k = 0; k < d.units.size(); ++k) {
    Impl::Unit& u = d.units[k];
    const std::string pre = "u" + std::to_string(k) + ".";
    std::map<std::string, at::Tensor> state;
    for (const auto& name : d.SavedNames(k, dicts)) {
      state[name] = name == "step" ? dicts.front().at(pre + name)
                                   : d.Reassemble(k, name, dicts);
    }
    if (!state.count("param"))
      throw Error("FSDP checkpoint: unit " + std::to_string(k) +
                  " has no parameters");
    u.shard.detach().copy_(state["param"]);
    state.erase("param");
    SetParamOptimizerState(opt, u.shard, std::move(state));
  }
  auto restore = [&](const std::string& key, const at::Tensor& into) {
    const at::Tensor* saved = Find(dicts, key);
    if (!saved) return;
    if (saved->sizes() != into.sizes()) {
      throw Error("FSDP checkpoint: " + key + " has shape " +
                  c10::str(saved->sizes()) + ", this model's " +
                  c10::str(into.sizes()) + ": the model changed");
    }
    into.copy_(*saved);
  };
  for (size_t i = 0; i < d.frozen.size(); ++i)
    restore(kFrozen + d.frozen_names[i], d.frozen[i].detach());
  for (const auto& [name, b] : d.buffers) restore(kBuffer + name, b);
}

std::vector<FullyShardedDataParallel::UnitLayout>
FullyShardedDataParallel::Layout() const {
  std::vector<UnitLayout> out;
  for (const Impl::Unit& u : impl_->units) {
    UnitLayout l{u.numel, u.names, u.offsets, {}};
    for (const auto& p : u.params) l.shapes.push_back(p.sizes().vec());
    out.push_back(std::move(l));
  }
  return out;
}

// Storage bytes, as the allocator sees them (a view counts its whole
// storage), so the number is comparable with the process's memory.
int64_t FullyShardedDataParallel::HeldBytes(
    torch::optim::Optimizer& opt) const {
  Impl& d = *impl_;
  int64_t total = 0;
  for (const auto& u : d.units) {
    total += Bytes(u.shard) + Bytes(u.shard.grad()) + Bytes(u.grad_full) +
             Bytes(u.rs_out) + Bytes(u.gather_input) +
             (u.gathered || u.gather_work ? Bytes(u.full) : 0);
    for (const auto& p : u.params) total += Bytes(p.grad());
    for (const auto& [name, t] : ParamOptimizerState(opt, u.shard)) {
      if (name != "step") total += Bytes(t);
    }
  }
  for (const auto& f : d.frozen) total += Bytes(f);
  return total;
}

}  // namespace dtrun::train
