#include "lib/state_copy.h"

#include <sstream>
#include <type_traits>

namespace dtrun::train {
namespace {

// The optimizer's state map key for a parameter: its TensorImpl's address,
// as a string in libtorch 1.13 (c10::guts::to_string of the pointer) and
// as the pointer itself in 2.x.
template <typename Key>
Key StateKey(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

torch::Tensor CopyIfDefined(const torch::Tensor& t, const TensorCopier& copy) {
  return t.defined() ? copy(t) : t;
}

void DeepCopy(torch::optim::SGDParamState& s, const TensorCopier& copy) {
  s.momentum_buffer(CopyIfDefined(s.momentum_buffer(), copy));
}
template <typename AdamState>
void DeepCopyAdam(AdamState& s, const TensorCopier& copy) {
  s.exp_avg(CopyIfDefined(s.exp_avg(), copy));
  s.exp_avg_sq(CopyIfDefined(s.exp_avg_sq(), copy));
  s.max_exp_avg_sq(CopyIfDefined(s.max_exp_avg_sq(), copy));
}
void DeepCopy(torch::optim::AdamParamState& s, const TensorCopier& copy) {
  DeepCopyAdam(s, copy);
}
void DeepCopy(torch::optim::AdamWParamState& s, const TensorCopier& copy) {
  DeepCopyAdam(s, copy);
}

TensorCopier OrClone(const TensorCopier& copy) {
  if (copy) return copy;
  return [](const torch::Tensor& t) { return t.detach().clone(); };
}

// The copy for one optimizer kind; null when `live` is not of it. The
// state's clone() copies the struct (tensor handles shared); DeepCopy
// then gives it tensors of its own.
template <typename Opt, typename Options, typename State>
std::unique_ptr<torch::optim::Optimizer> CopyAs(
    torch::optim::Optimizer& live, const std::vector<torch::Tensor>& params,
    const TensorCopier& copy) {
  if (!dynamic_cast<Opt*>(&live)) return nullptr;
  const auto& group = live.param_groups().at(0);
  auto out = std::make_unique<Opt>(
      params, static_cast<const Options&>(group.options()));
  using Key = typename std::decay_t<decltype(live.state())>::key_type;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = live.state().find(StateKey<Key>(group.params()[i]));
    if (it == live.state().end()) continue;
    std::unique_ptr<torch::optim::OptimizerParamState> state =
        it->second->clone();
    DeepCopy(static_cast<State&>(*state), copy);
    out->state()[StateKey<Key>(params[i])] = std::move(state);
  }
  return out;
}

}  // namespace

std::vector<torch::Tensor> ModuleCopy::AllParams() const {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : params) out.push_back(t);
  for (const auto& [name, child] : children) {
    for (torch::Tensor& t : child.AllParams()) out.push_back(std::move(t));
  }
  return out;
}

ModuleCopy CopyModule(const torch::nn::Module& m, const TensorCopier& copy) {
  const TensorCopier copier = OrClone(copy);
  ModuleCopy c;
  torch::NoGradGuard no_grad;
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    c.params.emplace_back(p.key(), copier(p.value()));
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    c.buffers.emplace_back(b.key(), copier(b.value()));
  for (const auto& child : m.named_children()) {
    if (child.value()->is_serializable())
      c.children.emplace_back(child.key(), CopyModule(*child.value(), copier));
  }
  return c;
}

// Module::save's layout: own parameters, own buffers, then one nested
// archive per serializable child under its name.
void SaveModuleCopy(const ModuleCopy& c, torch::serialize::OutputArchive& out) {
  for (const auto& [name, t] : c.params) out.write(name, t);
  for (const auto& [name, t] : c.buffers)
    out.write(name, t, /*is_buffer=*/true);
  for (const auto& [name, child] : c.children) {
    torch::serialize::OutputArchive nested(out.compilation_unit());
    SaveModuleCopy(child, nested);
    out.write(name, nested);
  }
}

std::unique_ptr<torch::optim::Optimizer> CopyOptimizer(
    torch::optim::Optimizer& live, const std::vector<torch::Tensor>& params,
    const TensorCopier& copy) {
  if (live.param_groups().size() != 1 ||
      live.param_groups()[0].params().size() != params.size())
    return nullptr;
  const TensorCopier copier = OrClone(copy);
  if (auto c = CopyAs<torch::optim::SGD, torch::optim::SGDOptions,
                      torch::optim::SGDParamState>(live, params, copier))
    return c;
  if (auto c = CopyAs<torch::optim::AdamW, torch::optim::AdamWOptions,
                      torch::optim::AdamWParamState>(live, params, copier))
    return c;
  return CopyAs<torch::optim::Adam, torch::optim::AdamOptions,
                torch::optim::AdamParamState>(live, params, copier);
}

}  // namespace dtrun::train
