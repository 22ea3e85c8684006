// FSDP's wrap policies: which parameters make up each unit. A
// Sequential's children (each, or grouped by size), or a module tree's
// modules of the types FsdpOptions::unit_types names, with the root unit
// for what no unit holds.
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lib/parallel/fsdp_impl.h"
#include "lib/process_group.h"

namespace dtrun::train {
namespace {

using Impl = FullyShardedDataParallel::Impl;

std::string Joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// A module's type as the policy names it: "dtrun::gpt::BlockImpl" matches
// "Block", "BlockImpl" and the whole name.
bool TypeMatches(const std::string& type, const std::string& wanted) {
  if (type == wanted) return true;
  const size_t colon = type.rfind("::");
  std::string shortname =
      colon == std::string::npos ? type : type.substr(colon + 2);
  if (shortname == wanted) return true;
  const size_t n = shortname.size();
  return n > 4 && shortname.compare(n - 4, 4, "Impl") == 0 &&
         shortname.substr(0, n - 4) == wanted;
}

// A parameter as the tree walk finds it: its first name and the units
// whose modules hold it (-1: a module in no unit).
struct TreeParam {
  at::Tensor t;
  std::string name;
  std::set<int> owners;
};

// The modules of the model, each parameter once with the units that hold
// it; unit modules in the order the tree lists them.
struct TreeWalk {
  const torch::nn::Module* root = nullptr;
  const std::vector<std::string>* unit_types = nullptr;
  std::vector<TreeParam> params;
  std::map<c10::TensorImpl*, size_t> index;
  std::vector<std::pair<std::string, const torch::nn::Module*>> unit_modules;
  std::map<const torch::nn::Module*, int> module_unit;
  std::set<std::string> types;

  // The innermost unit holding a module owns its parameters; a module
  // reached twice (shared) is one unit.
  void Walk(const torch::nn::Module& m, const std::string& prefix, int owner) {
    types.insert(m.name());
    if (&m != root) {
      for (const auto& want : *unit_types) {
        if (!TypeMatches(m.name(), want)) continue;
        auto [it, fresh] =
            module_unit.emplace(&m, static_cast<int>(unit_modules.size()));
        if (fresh) unit_modules.push_back({prefix, &m});
        owner = it->second;
        break;
      }
    }
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      auto [it, fresh] =
          index.emplace(p.value().unsafeGetTensorImpl(), params.size());
      if (fresh) params.push_back({p.value(), Joined(prefix, p.key()), {}});
      params[it->second].owners.insert(owner);
    }
    for (const auto& c : m.named_children())
      Walk(*c.value(), Joined(prefix, c.key()), owner);
  }

  // A type the policy names that no module has is a typo: named, with the
  // types there are.
  void CheckTypes() const {
    for (const auto& want : *unit_types) {
      bool found = false;
      for (const auto& t : types) found = found || TypeMatches(t, want);
      if (found) continue;
      std::string have;
      for (const auto& t : types) have += (have.empty() ? "" : ", ") + t;
      throw Error("FSDP unit_types names '" + want +
                  "', and no module of this model has that type (its types: " +
                  have + ")");
    }
  }
};

}  // namespace

// A Sequential's units, by the wrap policy: with min_unit_params <= 0 each
// child with parameters starts a unit; otherwise consecutive children join
// one until it holds min_unit_params. A parameter shared by two children
// belongs to the first (`seen`), so it is sharded and reduced once.
void Impl::BuildUnits() {
  const size_t n = seq->size();
  std::set<c10::TensorImpl*> seen;
  Unit current;
  int64_t current_params = 0;
  auto close = [&](size_t end) {
    current.end_child = end;
    current.name = "children " + std::to_string(current.first_child) + ".." +
                   std::to_string(end - 1);
    if (!current.params.empty()) units.push_back(std::move(current));
    current = Unit();
    current.first_child = end;
    current_params = 0;
  };
  for (size_t c = 0; c < n; ++c) {
    int64_t count = 0;
    bool own = false;
    for (const auto& p : seq->ptr(c)->named_parameters()) {
      if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
      if (!p.value().requires_grad()) {
        frozen.push_back(p.value());
        frozen_names.push_back(std::to_string(c) + "." + p.key());
        continue;
      }
      if (!own && opts.min_unit_params <= 0 && !current.params.empty())
        close(c);
      own = true;
      current.params.push_back(p.value());
      current.names.push_back(std::to_string(c) + "." + p.key());
      count += p.value().numel();
    }
    current_params += count;
    if (opts.min_unit_params > 0 && current_params >= opts.min_unit_params)
      close(c + 1);
  }
  if (current.params.empty() && !units.empty()) {
    units.back().end_child = n;  // trailing parameter-free children
  } else {
    close(n);
  }
  for (size_t k = 0; k < units.size(); ++k) prev_order.push_back(k);
}

// Any module tree: every module of a type the policy names is a unit (the
// innermost one holds a parameter); a parameter held by two units, or by
// none, belongs to the root unit (index 0, reduce-scattered last, as its
// gradients, an embedding's, come last). Parameters that do not train
// are kept whole (`frozen`).
void Impl::BuildTreeUnits() {
  TreeWalk walk;
  walk.root = module.get();
  walk.unit_types = &opts.unit_types;
  walk.Walk(*module, "", -1);
  walk.CheckTypes();
  std::vector<Unit> built(walk.unit_modules.size() + 1);
  built[0].name = "(root)";
  for (size_t j = 0; j < walk.unit_modules.size(); ++j)
    built[j + 1].name = walk.unit_modules[j].first;
  for (auto& p : walk.params) {
    if (!p.t.requires_grad()) {
      frozen.push_back(p.t);
      frozen_names.push_back(p.name);
      continue;
    }
    const int owner = p.owners.size() == 1 ? *p.owners.begin() : -1;
    Unit& u = built[static_cast<size_t>(owner + 1)];
    u.params.push_back(p.t);
    u.names.push_back(p.name);
  }
  for (size_t j = 0; j < built.size(); ++j) {
    if (built[j].params.empty()) continue;
    if (j == 0) root = static_cast<int>(units.size());
    if (j > 0) unit_of[walk.unit_modules[j - 1].second] = units.size();
    units.push_back(std::move(built[j]));
  }
}

// This rank's elements of the unit's flattened parameters (and zeros for
// the padding in them), copied from the parameters directly: without a
// broadcast from rank 0, the unit's whole flat buffer is never made, so a
// replacement's shards cost their own size, not the model's.
at::Tensor Impl::CutShard(const Unit& u, const at::TensorOptions& o) const {
  at::NoGradGuard no_grad;
  const int64_t lo = rank * u.shard_size, hi = lo + u.shard_size;
  at::Tensor shard = at::empty({u.shard_size}, o);
  for (size_t i = 0; i < u.params.size(); ++i) {
    const int64_t begin = u.offsets[i], end = begin + u.params[i].numel();
    const int64_t a = std::max(begin, lo), b = std::min(end, hi);
    if (a >= b) continue;
    shard.narrow(0, a - lo, b - a)
        .copy_(u.params[i].reshape({-1}).narrow(0, a - begin, b - a));
  }
  if (u.numel < hi) {
    const int64_t pad = std::max(u.numel, lo);
    shard.narrow(0, pad - lo, hi - pad).zero_();
  }
  return shard;
}

}  // namespace dtrun::train
