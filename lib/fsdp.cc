// FSDP: the model cut into units (the wrap policy), each unit's parameters
// one flat tensor sharded across ranks, gathered for its forward and
// backward and freed after; gradients reduce-scattered into the shards as
// each unit's backward ends. fsdp_transport.cc moves the bytes.
#include "lib/fsdp.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <set>

#include "lib/ddp.h"
#include "lib/fsdp_transport.h"
#include "lib/process_group.h"
#include "lib/shm_allreduce.h"
#include "lib/state_copy.h"
#include "rendezvous/util/check.h"

namespace dtrun::train {
namespace {

using Clock = std::chrono::steady_clock;

at::ScalarType DtypeNamed(const std::string& name, const char* option) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  throw Error(std::string("FSDP ") + option + " '" + name +
              "': use \"float32\" or \"bfloat16\"");
}

// A unit's gathered buffer lives in one storage that FSDP frees and refills;
// the module's parameters are views of it, so autograd's saved tensors see
// the refilled data without their version counters moving.
void FreeStorage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void AllocStorage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  size_t n = static_cast<size_t>(t.numel()) * t.element_size();
  if (s->nbytes() == n) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(n));
  s->set_nbytes(n);
}

int64_t Bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  return static_cast<int64_t>(t.storage().nbytes());
}

}  // namespace

struct FullyShardedDataParallel::Impl {
  using StateDicts = std::vector<std::map<std::string, at::Tensor>>;

  struct Unit {
    size_t first_child = 0, end_child = 0;
    std::vector<at::Tensor> params;  // the module's parameters: views of `full`
    std::vector<std::string> names;  // theirs in the model's named_parameters()
    std::vector<int64_t> offsets;
    int64_t numel = 0, padded = 0, shard_size = 0;
    at::Tensor shard;  // float32 master, a leaf the optimizer steps
    at::Tensor full;   // param_dtype, [padded]; storage freed when not gathered
    bool gathered = false;
    c10::intrusive_ptr<c10d::Work> gather_work;
    at::Tensor gather_input;
    at::Tensor grad_full;  // reduce_dtype, [padded], during backward
    std::vector<bool> ready;
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> rs_work;
    at::Tensor rs_out;
    bool clear_param_grads = false;
  };

  std::shared_ptr<torch::nn::SequentialImpl> model;
  ProcessGroup* pg = nullptr;
  FsdpOptions opts;
  int rank = 0, world = 1;
  bool nccl = false;
  at::ScalarType param_dtype = at::kFloat, reduce_dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::vector<Unit> units;
  // model->parameters() index -> (unit, i)
  std::vector<std::pair<size_t, size_t>> param_slot;
  // reduce-scatters start in this (descending) order on every rank
  int next_rs = -1;
  std::mutex mu;  // hooks may run on autograd's threads
  CommStats stats;
  // The process group or, with FsdpOptions::shared_memory, one segment
  // every collective goes through in the order launched.
  std::unique_ptr<FsdpTransport> net;

  // Shared memory when every rank can open rank 0's segment and units
  // compute and reduce in float32 on the CPU; its regions hold the largest
  // unit, padded (a reduce-scatter's input). Collective.
  void OpenSharedMemory() {
    if (!opts.shared_memory || world == 1 || nccl || !device.is_cpu() ||
        param_dtype != at::kFloat || reduce_dtype != at::kFloat) {
      return;
    }
    int64_t floats = 0;
    for (const Unit& u : units) floats = std::max(floats, u.padded);
    net->OpenSharedMemory(floats, opts.prefetch);
  }

  void Wait(const c10::intrusive_ptr<c10d::Work>& work) {
    auto t0 = Clock::now();
    work->wait();
    stats.wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Asynchronous, so that a prefetched unit's parameters arrive while the
  // current unit computes; EnsureGathered() waits.
  void LaunchGather(Unit& u) {
    if (u.gathered || u.gather_work) return;
    // EnsureGathered() gathers it here
    if (net->shared_memory() && !net->overlaps()) return;
    AllocStorage(u.full);
    at::Tensor src = u.shard.detach();
    if (src.device() != device) src = src.to(device);
    if (src.scalar_type() != param_dtype) src = src.to(param_dtype);
    ++stats.gathers;
    if (world == 1) {
      u.full.copy_(src);
      u.gathered = true;
      return;
    }
    u.gather_input = src;
    u.gather_work = net->AllGather(u.full, src);
  }

  // A gather nobody prefetched runs on this thread, which would only wait
  // for it (ShmQueue::RunHere): no hand-off to the queue's thread and back.
  bool GatherHere(Unit& u) {
    if (!net->shared_memory() || u.gathered || u.gather_work || world == 1)
      return false;
    AllocStorage(u.full);
    ++stats.gathers;
    const auto t0 = Clock::now();
    Status s = net->GatherHere(u.full, u.shard.detach());
    stats.wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.ok()) throw Error("FSDP through shared memory: " + s.message());
    u.gathered = true;
    return true;
  }

  void EnsureGathered(Unit& u) {
    if (GatherHere(u)) return;
    LaunchGather(u);
    if (u.gather_work) {
      Wait(u.gather_work);
      u.gather_work.reset();
      u.gather_input = at::Tensor();
    }
    u.gathered = true;
  }

  // Frees the storage but keeps the tensor: the parameters stay valid views
  // for the module and autograd, and the next gather refills them.
  void Free(Unit& u) {
    if (!u.gathered) return;
    FreeStorage(u.full);
    u.gathered = false;
  }

  // Backward visits units in reverse: unit k is gathered again (forward may
  // have freed it) and unit k - 1, next in backward, is prefetched.
  void PreBackward(size_t k) {
    std::lock_guard<std::mutex> lock(mu);
    EnsureGathered(units[k]);
    if (opts.prefetch && k > 0) LaunchGather(units[k - 1]);
  }

  // Autograd writes a parameter's .grad only after its hook returns, so the
  // full-size .grad of a unit already reduced is dropped at the next hook
  // (or in SyncGradients), not in the hook that launched its reduce-scatter.
  // Kept, those would hold a full copy of every unit's gradients.
  void ClearParamGrads() {
    for (Unit& u : units) {
      if (!u.clear_param_grads) continue;
      for (at::Tensor& p : u.params) p.mutable_grad() = at::Tensor();
      u.clear_param_grads = false;
    }
  }

  void OnGrad(size_t k, size_t i, const at::Tensor& grad) {
    at::NoGradGuard no_grad;
    std::lock_guard<std::mutex> lock(mu);
    ClearParamGrads();
    Unit& u = units[k];
    if (!u.grad_full.defined()) {
      u.grad_full = at::zeros(
          {u.padded}, at::TensorOptions().dtype(reduce_dtype).device(device));
    }
    u.grad_full.narrow(0, u.offsets[i], u.params[i].numel())
        .copy_(grad.reshape({-1}));
    if (!u.ready[i]) {
      u.ready[i] = true;
      --u.pending;
    }
    LaunchReadyReduceScatters();
  }

  // In descending unit order on every rank, however the hooks interleave:
  // collectives pair up across ranks by the order they are issued in.
  void LaunchReadyReduceScatters() {
    while (next_rs >= 0 && units[static_cast<size_t>(next_rs)].pending == 0) {
      LaunchReduceScatter(units[static_cast<size_t>(next_rs)]);
      --next_rs;
    }
  }

  void LaunchReduceScatter(Unit& u) {
    if (!u.grad_full.defined()) {
      u.grad_full = at::zeros(
          {u.padded}, at::TensorOptions().dtype(reduce_dtype).device(device));
    }
    ++stats.reduce_scatters;
    if (world == 1) {
      u.rs_out = u.grad_full;
    } else {
      u.rs_out = net->ReduceScatterOutput(u.grad_full, u.shard_size);
      u.rs_work = net->ReduceScatter(u.rs_out, u.grad_full);
    }
    // Every gradient of the unit is computed: its parameters are not needed
    // again this step.
    Free(u);
    u.clear_param_grads = true;
  }

  // Averages over ranks and adds into the shard's gradient: with gradient
  // accumulation each micro-batch's share sums up, as .grad does in DDP.
  void FinishReduceScatter(Unit& u) {
    if (u.rs_work) {
      Wait(u.rs_work);
      u.rs_work.reset();
    }
    at::Tensor g = net->SummedChunk(u.rs_out, u.shard_size);
    g = g.to(at::kFloat).div_(world);
    if (g.device() != u.shard.device()) g = g.to(u.shard.device());
    if (u.shard.grad().defined()) {
      u.shard.mutable_grad().add_(g);
    } else {
      u.shard.mutable_grad() = g;
    }
    u.grad_full = at::Tensor();
    u.rs_out = at::Tensor();
    u.ready.assign(u.params.size(), false);
    u.pending = u.params.size();
  }

  // Builds the units of the wrap policy: with min_unit_params <= 0 each
  // child with parameters starts a unit; otherwise consecutive children join
  // one until it holds min_unit_params. A parameter shared by two children
  // belongs to the first (`seen`), so it is sharded and reduced once.
  void BuildUnits() {
    const size_t n = model->size();
    std::set<c10::TensorImpl*> seen;
    Unit current;
    int64_t current_params = 0;
    auto close = [&](size_t end) {
      current.end_child = end;
      if (!current.params.empty()) units.push_back(std::move(current));
      current = Unit();
      current.first_child = end;
      current_params = 0;
    };
    for (size_t c = 0; c < n; ++c) {
      std::vector<at::Tensor> own;
      std::vector<std::string> names;
      for (const auto& p : model->ptr(c)->named_parameters()) {
        if (seen.insert(p.value().unsafeGetTensorImpl()).second) {
          own.push_back(p.value());
          names.push_back(std::to_string(c) + "." + p.key());
        }
      }
      int64_t count = 0;
      for (const auto& p : own) count += p.numel();
      if (opts.min_unit_params <= 0 && !own.empty() && !current.params.empty())
        close(c);
      for (auto& p : own) current.params.push_back(p);
      for (auto& name : names) current.names.push_back(std::move(name));
      current_params += count;
      if (opts.min_unit_params > 0 && current_params >= opts.min_unit_params)
        close(c + 1);
    }
    if (current.params.empty() && !units.empty()) {
      units.back().end_child = n;  // trailing parameter-free children
    } else {
      close(n);
    }
  }

  // Each unit's parameters become one flat tensor, padded to a multiple of
  // the world size so every rank's shard has the same size (collectives
  // need equal parts), cut from rank 0's values (broadcast) so the shards
  // fit together. The module's parameters become views of `full`, whose
  // storage is then freed: between gathers a rank holds only its shard.
  void Shard() {
    at::NoGradGuard no_grad;
    for (Unit& u : units) {
      u.numel = 0;
      for (const auto& p : u.params) {
        u.offsets.push_back(u.numel);
        u.numel += p.numel();
      }
      u.padded = (u.numel + world - 1) / world * world;
      u.shard_size = u.padded / world;
      auto fopts = at::TensorOptions().dtype(at::kFloat).device(device);
      at::Tensor flat = at::zeros({u.padded}, fopts);
      for (size_t i = 0; i < u.params.size(); ++i) {
        flat.narrow(0, u.offsets[i], u.params[i].numel())
            .copy_(u.params[i].reshape({-1}));
      }
      if (world > 1) {
        std::vector<at::Tensor> v{flat};
        c10d::BroadcastOptions o;
        o.rootRank = 0;
        pg->broadcast(v, o)->wait();
      }
      at::Tensor shard =
          flat.narrow(0, rank * u.shard_size, u.shard_size).clone();
      if (opts.cpu_offload) shard = shard.to(at::kCPU);
      u.shard = shard.set_requires_grad(true);
      u.full = at::empty({u.padded}, fopts.dtype(param_dtype));
      for (size_t i = 0; i < u.params.size(); ++i) {
        at::Tensor& p = u.params[i];
        p.set_data(u.full.narrow(0, u.offsets[i], p.numel()).view(p.sizes()));
      }
      FreeStorage(u.full);
      u.ready.assign(u.params.size(), false);
      u.pending = u.params.size();
    }
  }

  // Gathers a float32 tensor of `s` elements per rank into [s * world].
  // Shards and optimizer state are float32 whatever param_dtype is.
  at::Tensor GatherFloat(const at::Tensor& part) {
    at::Tensor src = part.detach().to(device).contiguous();
    if (world == 1) return src.clone();
    at::Tensor out = at::empty({src.numel() * world}, src.options());
    net->AllGather(out, src)->wait();
    return out;
  }

  // The names saved for unit k ("param", optimizer state), after checking
  // that every dict holds a unit of this model's size.
  std::set<std::string> SavedNames(size_t k, const StateDicts& dicts) const {
    const Unit& u = units[k];
    const std::string pre = "u" + std::to_string(k) + ".";
    std::set<std::string> names;
    for (const auto& dict : dicts) {
      auto numel = dict.find(pre + "numel");
      if (numel == dict.end() || numel->second.item<int64_t>() != u.numel) {
        throw Error(
            "FSDP checkpoint: unit " + std::to_string(k) + " holds " +
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
  at::Tensor Reassemble(size_t k, const std::string& name,
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
                  std::to_string(hi) + ") of unit " + std::to_string(k) +
                  "'s " + name + " are missing (" + std::to_string(covered) +
                  " found): a shard file of the checkpoint is missing");
    }
    return dest.to(u.shard.device());
  }
};

FullyShardedDataParallel::FullyShardedDataParallel(
    std::shared_ptr<torch::nn::SequentialImpl> model, ProcessGroup* pg,
    FsdpOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.model = std::move(model);
  d.pg = pg;
  d.opts = options;
  d.rank = pg->getRank();
  d.world = pg->getSize();
  d.net = std::make_unique<FsdpTransport>(pg, options.timeout);
  d.nccl = d.net->nccl();
  d.param_dtype = DtypeNamed(options.param_dtype, "param_dtype");
  d.reduce_dtype = DtypeNamed(options.reduce_dtype, "reduce_dtype");
  auto params = d.model->parameters();
  if (params.empty()) throw Error("FSDP: the model has no parameters");
  d.device = params.front().device();
  if (options.cpu_offload && d.device.is_cpu()) {
    throw Error(
        "FSDP cpu_offload keeps GPU parameter shards in CPU memory; this model "
        "is on the "
        "CPU already: leave cpu_offload off");
  }
  d.BuildUnits();
  d.Shard();
  d.OpenSharedMemory();
  d.next_rs = static_cast<int>(d.units.size()) - 1;
  std::map<c10::TensorImpl*, std::pair<size_t, size_t>> where;
  Impl* raw = impl_.get();
  for (size_t k = 0; k < d.units.size(); ++k) {
    for (size_t i = 0; i < d.units[k].params.size(); ++i) {
      at::Tensor& p = d.units[k].params[i];
      where[p.unsafeGetTensorImpl()] = {k, i};
      p.register_hook(
          [raw, k, i](const at::Tensor& grad) { raw->OnGrad(k, i, grad); });
    }
  }
  for (const auto& p : d.model->parameters())
    d.param_slot.push_back(where.at(p.unsafeGetTensorImpl()));
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

at::Tensor FullyShardedDataParallel::Forward(const at::Tensor& input) {
  Impl& d = *impl_;
  // The input follows param_dtype, so mixed-precision layers see one dtype;
  // the output goes back to float32 for the loss.
  const bool grad = at::GradMode::is_enabled();
  at::Tensor h =
      input.scalar_type() == at::kFloat && d.param_dtype != at::kFloat
          ? input.to(d.param_dtype)
          : input;
  Impl* raw = impl_.get();
  for (size_t k = 0; k < d.units.size(); ++k) {
    Impl::Unit& u = d.units[k];
    {
      std::lock_guard<std::mutex> lock(d.mu);
      d.EnsureGathered(u);
      if (d.opts.prefetch && k + 1 < d.units.size())
        d.LaunchGather(d.units[k + 1]);
    }
    for (size_t c = u.first_child; c < u.end_child; ++c)
      h = (d.model->begin() + c)->forward(h);
    // Without autograd (evaluation) nothing comes back for the parameters:
    // free at once. In training the last unit stays gathered, since its
    // backward comes first.
    const bool last = k + 1 == d.units.size();
    if (!grad) {
      d.Free(u);
    } else {
      if (d.opts.reshard_after_forward && !last) d.Free(u);
      // A hook on the unit's output runs when backward reaches it, just
      // before this unit's own backward: gather it again if freed, and
      // prefetch the unit before it.
      if (h.requires_grad()) {
        h.register_hook([raw, k](const at::Tensor& g) {
          raw->PreBackward(k);
          return g;
        });
      }
    }
  }
  return h.scalar_type() == at::kFloat ? h : h.to(at::kFloat);
}

void FullyShardedDataParallel::SyncGradients() {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(d.mu);
  // Parameters that got no gradient contribute zeros; launch what is left
  // in the same order as every other rank.
  while (d.next_rs >= 0) {
    Impl::Unit& u = d.units[static_cast<size_t>(d.next_rs)];
    u.pending = 0;
    d.LaunchReduceScatter(u);
    --d.next_rs;
  }
  for (size_t k = d.units.size(); k-- > 0;) d.FinishReduceScatter(d.units[k]);
  d.ClearParamGrads();
  d.next_rs = static_cast<int>(d.units.size()) - 1;
}

std::vector<at::Tensor> FullyShardedDataParallel::ShardParameters() const {
  std::vector<at::Tensor> out;
  for (const auto& u : impl_->units) out.push_back(u.shard);
  return out;
}

std::vector<at::Tensor> FullyShardedDataParallel::FullParameters() {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flats;
  for (auto& u : d.units) flats.push_back(d.GatherFloat(u.shard).to(at::kCPU));
  std::vector<at::Tensor> out;
  for (const auto& [k, i] : d.param_slot) {
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
  return out;
}

// Resharding N -> M: every dict holds [begin, begin + len) of each unit's
// flat tensors. This rank copies the overlap of each with its own [lo, hi)
// and checks that the pieces cover it exactly, so that a missing shard file
// is an error rather than zeros in the model.
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

std::string FullyShardedDataParallel::transport() const {
  return impl_->net->shared_memory() ? "shared memory" : "process group";
}

size_t FullyShardedDataParallel::num_units() const {
  return impl_->units.size();
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
  return total;
}

FullyShardedDataParallel::CommStats FullyShardedDataParallel::TakeCommStats() {
  CommStats s = impl_->stats;
  impl_->stats = CommStats();
  return s;
}

}  // namespace dtrun::train
