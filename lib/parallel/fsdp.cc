// FSDP: the model cut into units (the wrap policy), each unit's parameters
// one flat tensor sharded across ranks, gathered for its forward and
// backward and freed after; gradients reduce-scattered into the shards as
// each unit's backward ends. fsdp_transport.cc moves the bytes;
// fsdp_state.cc saves and loads the shards.
#include "lib/fsdp.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <set>

#include "lib/parallel/fsdp_impl.h"
#include "lib/parallel/in_place.h"
#include "lib/process_group.h"
#include "rendezvous/util/check.h"

namespace dtrun::train {
namespace {

using SteadyClock = std::chrono::steady_clock;
using Impl = FullyShardedDataParallel::Impl;

// The FSDP forward running on this thread, for ShardedCall.
thread_local Impl* current_forward = nullptr;

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

}  // namespace

void BroadcastFromRank0(ProcessGroup* pg, const at::Tensor& t) {
  const bool bytes = t.device().is_cpu() && t.scalar_type() == at::kBFloat16;
  at::Tensor moved = t.contiguous();
  std::vector<at::Tensor> v{bytes ? moved.reshape({-1}).view(at::kByte)
                                  : moved};
  c10d::BroadcastOptions o;
  o.rootRank = 0;
  pg->broadcast(v, o)->wait();
  if (!moved.is_same(t)) t.copy_(moved);
}

// Shared memory when every rank can open rank 0's segment and units
// compute and reduce in float32 on the CPU; its regions hold the largest
// unit, padded (a reduce-scatter's input). Collective.
void Impl::OpenSharedMemory() {
  if (!opts.shared_memory || world == 1 || nccl || !device.is_cpu() ||
      param_dtype != at::kFloat || reduce_dtype != at::kFloat) {
    return;
  }
  int64_t floats = 0;
  for (const Unit& u : units) floats = std::max(floats, u.padded);
  net->OpenSharedMemory(floats, opts.prefetch);
}

// Waits for a collective, counting the time as FSDP's exposed
// communication (TakeCommStats).
void Impl::Wait(const c10::intrusive_ptr<c10d::Work>& work) {
  auto t0 = SteadyClock::now();
  WaitUnlessGroupBroken(work, !nccl, "FSDP");
  stats.wait_s +=
      std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Asynchronous, so that a prefetched unit's parameters arrive while the
// current unit computes; EnsureGathered() waits.
void Impl::LaunchGather(Unit& u) {
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
bool Impl::GatherHere(Unit& u) {
  if (!net->shared_memory() || u.gathered || u.gather_work || world == 1)
    return false;
  AllocStorage(u.full);
  ++stats.gathers;
  const auto t0 = SteadyClock::now();
  Status s = net->GatherHere(u.full, u.shard.detach());
  stats.wait_s +=
      std::chrono::duration<double>(SteadyClock::now() - t0).count();
  if (!s.ok()) throw Error("FSDP through shared memory: " + s.message());
  u.gathered = true;
  return true;
}

void Impl::EnsureGathered(Unit& u) {
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
void Impl::Free(Unit& u) {
  if (!u.gathered) return;
  FreeStorage(u.full);
  u.gathered = false;
}

// A unit's forward begins: its parameters gathered, and the unit the last
// forward ran next prefetched. Returns its place in this forward.
size_t Impl::EnterUnit(size_t k) {
  ThrowIfGroupBroken("FSDP");  // a rank died: no gather will complete
  std::lock_guard<std::mutex> lock(mu);
  const size_t pos = order.size();
  order.push_back(k);
  EnsureGathered(units[k]);
  if (opts.prefetch && pos + 1 < prev_order.size() && prev_order[pos] == k)
    LaunchGather(units[prev_order[pos + 1]]);
  return pos;
}

// A unit's forward ends. Without autograd (evaluation) nothing comes back
// for its parameters: freed at once. In training the unit whose backward
// comes first (the last one run) stays gathered; the others are freed with
// reshard_after_forward, and a hook on the output, run when backward
// reaches it (just before the unit's own backward), gathers the unit
// again and prefetches the one run before it.
at::Tensor Impl::ExitUnit(size_t pos, at::Tensor h) {
  Unit& u = units[order[pos]];
  if (discovering) return h;
  if (!at::GradMode::is_enabled()) {
    std::lock_guard<std::mutex> lock(mu);
    Free(u);
    return h;
  }
  const bool last =
      pos + 1 == prev_order.size() && prev_order[pos] == order[pos];
  if (opts.reshard_after_forward && !last) {
    std::lock_guard<std::mutex> lock(mu);
    Free(u);
  }
  if (h.requires_grad()) {
    h.register_hook([this, pos](const at::Tensor& g) {
      PreBackward(pos);
      return g;
    });
  }
  return h;
}

// Backward reached the output of the unit run at `pos`: that unit is
// gathered (again) before its own backward, and the one run before it is
// prefetched, unless its backward is already done.
void Impl::PreBackward(size_t pos) {
  std::lock_guard<std::mutex> lock(mu);
  EnsureGathered(units[order[pos]]);
  if (opts.prefetch && pos > 0) {
    Unit& before = units[order[pos - 1]];
    if (!before.backward_done) LaunchGather(before);
  }
}

// Autograd writes a parameter's .grad only after its hook returns, so the
// full-size .grad of a unit already reduced is dropped at the next hook
// (or in SyncGradients), not in the hook that launched its reduce-scatter.
// Kept, those would hold a full copy of every unit's gradients.
void Impl::ClearParamGrads() {
  for (Unit& u : units) {
    if (!u.clear_param_grads) continue;
    for (at::Tensor& p : u.params) p.mutable_grad() = at::Tensor();
    u.clear_param_grads = false;
  }
}

// Each gradient adds into the unit's whole-gradient buffer (zeros at
// first): a backward without gradient sync leaves its sum there for the
// next. Once the unit's last gradient is in, it is reduce-scattered (in
// the order every rank keeps) or, without sync, just freed.
void Impl::OnGrad(size_t k, size_t i, const at::Tensor& grad) {
  ThrowIfGroupBroken("FSDP");
  at::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mu);
  ClearParamGrads();
  Unit& u = units[k];
  if (!u.grad_full.defined()) {
    u.grad_full = at::zeros(
        {u.padded}, at::TensorOptions().dtype(reduce_dtype).device(device));
  }
  u.grad_full.narrow(0, u.offsets[i], u.params[i].numel())
      .add_(grad.reshape({-1}));
  if (!u.ready[i]) {
    u.ready[i] = true;
    --u.pending;
  }
  if (gradient_sync) {
    LaunchReadyReduceScatters();
  } else if (u.pending == 0) {
    u.backward_done = true;
    if (static_cast<int>(k) != root || opts.reshard_after_forward) Free(u);
    u.clear_param_grads = true;
  }
}

// In descending unit order on every rank, however the hooks interleave:
// collectives pair up across ranks by the order they are issued in.
void Impl::LaunchReadyReduceScatters() {
  while (next_rs >= 0 && units[static_cast<size_t>(next_rs)].pending == 0) {
    LaunchReduceScatter(units[static_cast<size_t>(next_rs)]);
    --next_rs;
  }
}

void Impl::LaunchReduceScatter(Unit& u) {
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
  u.backward_done = true;
  Free(u);
  u.clear_param_grads = true;
}

// Every parameter of the unit awaits its gradient again.
void Impl::ResetBackward(Unit& u) {
  u.ready.assign(u.params.size(), false);
  u.pending = u.params.size();
  u.backward_done = false;
}

// Averages over ranks and adds into the shard's gradient: with gradient
// accumulation each micro-batch's share sums up, as .grad does in DDP.
void Impl::FinishReduceScatter(Unit& u) {
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
  ResetBackward(u);
}

// Each unit's parameters become one flat tensor, padded to a multiple of
// the world size so every rank's shard has the same size (collectives
// need equal parts), cut from rank 0's values (broadcast) so the shards
// fit together. The module's parameters become views of `full`, whose
// storage is then freed: between gathers a rank holds only its shard.
// Frozen parameters and buffers take rank 0's values.
void Impl::Shard() {
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
    at::Tensor shard;
    if (world > 1 && opts.broadcast_at_start) {
      at::Tensor flat = at::zeros({u.padded}, fopts);
      for (size_t i = 0; i < u.params.size(); ++i) {
        flat.narrow(0, u.offsets[i], u.params[i].numel())
            .copy_(u.params[i].reshape({-1}));
      }
      BroadcastFromRank0(pg, flat);
      shard = flat.narrow(0, rank * u.shard_size, u.shard_size).clone();
    } else {
      shard = CutShard(u, fopts);
    }
    if (opts.cpu_offload) shard = shard.to(at::kCPU);
    u.shard = shard.set_requires_grad(true);
    u.full = at::empty({u.padded}, fopts.dtype(param_dtype));
    for (size_t i = 0; i < u.params.size(); ++i) {
      at::Tensor& p = u.params[i];
      p.set_data(u.full.narrow(0, u.offsets[i], p.numel()).view(p.sizes()));
    }
    FreeStorage(u.full);
    ResetBackward(u);
  }
  if (world > 1 && opts.broadcast_at_start) {
    for (auto& f : frozen) BroadcastFromRank0(pg, f.detach());
    for (auto& b : buffers) BroadcastFromRank0(pg, b.second);
  }
}

// From the options and the model: the transport, the units of the policy,
// the shards, a gradient hook on every parameter that trains, and where
// each of model->parameters() lies (FullParameters' order).
void Impl::Setup() {
  rank = pg->getRank();
  world = pg->getSize();
  net = std::make_unique<FsdpTransport>(pg, opts.timeout);
  nccl = net->nccl();
  param_dtype = DtypeNamed(opts.param_dtype, "param_dtype");
  reduce_dtype = DtypeNamed(opts.reduce_dtype, "reduce_dtype");
  auto params = module->parameters();
  if (params.empty()) throw Error("FSDP: the model has no parameters");
  device = params.front().device();
  if (opts.cpu_offload && device.is_cpu()) {
    throw Error(
        "FSDP cpu_offload keeps GPU parameter shards in CPU memory; this model "
        "is on the CPU already: leave cpu_offload off");
  }
  for (const auto& b : module->named_buffers())
    if (b.value().defined()) buffers.push_back({b.key(), b.value()});
  if (seq) {
    BuildUnits();
  } else {
    BuildTreeUnits();
  }
  if (!frozen.empty() && param_dtype != at::kFloat) {
    throw Error("FSDP param_dtype " + opts.param_dtype + " with parameters " +
                "that do not train ('" + frozen_names.front() +
                "' has requires_grad false): use param_dtype float32, or "
                "train.precision = \"bf16\"");
  }
  Shard();
  OpenSharedMemory();
  next_rs = static_cast<int>(units.size()) - 1;
  std::map<c10::TensorImpl*, std::pair<size_t, size_t>> where;
  for (size_t k = 0; k < units.size(); ++k) {
    for (size_t i = 0; i < units[k].params.size(); ++i) {
      at::Tensor& p = units[k].params[i];
      where[p.unsafeGetTensorImpl()] = {k, i};
      p.register_hook([this, k, i](const at::Tensor& g) { OnGrad(k, i, g); });
    }
  }
  for (size_t i = 0; i < frozen.size(); ++i)
    where[frozen[i].unsafeGetTensorImpl()] = {units.size(), i};
  for (const auto& p : module->parameters())
    param_slot.push_back(where.at(p.unsafeGetTensorImpl()));
}

// The user's forward with the root unit gathered throughout and each unit
// gathered by ShardedCall. The first one gathers every unit up front and
// keeps them, then checks that each ran through ShardedCall (a unit that
// did not would have read freed memory in any later forward).
at::Tensor Impl::RunTree(const at::Tensor& input) {
  struct Current {
    explicit Current(Impl* d) { current_forward = d; }
    ~Current() { current_forward = nullptr; }
  } current(this);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (root >= 0) EnsureGathered(units[static_cast<size_t>(root)]);
    discovering = !discovered;
    if (discovering) {
      for (Unit& u : units) EnsureGathered(u);
    } else if (opts.prefetch && !prev_order.empty()) {
      LaunchGather(units[prev_order.front()]);
    }
  }
  at::Tensor out = forward(input);
  if (discovering) CheckDiscovered();
  if (!at::GradMode::is_enabled()) {
    std::lock_guard<std::mutex> lock(mu);
    for (Unit& u : units) Free(u);
  }
  return out;
}

// After the first forward: every unit must have run through ShardedCall.
// Otherwise all are freed and the error names the first missing one.
void Impl::CheckDiscovered() {
  discovering = false;
  discovered = true;
  std::set<size_t> entered(order.begin(), order.end());
  for (size_t k = 0; k < units.size(); ++k) {
    if (static_cast<int>(k) == root || entered.count(k)) continue;
    std::lock_guard<std::mutex> lock(mu);
    for (Unit& u : units) Free(u);
    discovered = false;
    throw Error("FSDP unit '" + units[k].name +
                "' (a module of a type in unit_types) did not run through "
                "dtrun::train::ShardedCall in the model's forward: call it "
                "as `x = dtrun::train::ShardedCall(module, x)`, or leave its "
                "type out of unit_types");
  }
}

namespace fsdp_detail {

int EnterUnit(const torch::nn::Module* module) {
  Impl* d = current_forward;
  if (!d) return -1;
  auto it = d->unit_of.find(module);
  if (it == d->unit_of.end()) return -1;
  return static_cast<int>(d->EnterUnit(it->second));
}

at::Tensor ExitUnit(int token, const at::Tensor& output) {
  if (token < 0 || !current_forward) return output;
  return current_forward->ExitUnit(static_cast<size_t>(token), output);
}

}  // namespace fsdp_detail

FullyShardedDataParallel::FullyShardedDataParallel(
    std::shared_ptr<torch::nn::SequentialImpl> model, ProcessGroup* pg,
    FsdpOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!options.unit_types.empty()) {
    throw Error(
        "FSDP unit_types picks units in a module tree; a Sequential's units "
        "are its children (min_unit_params groups them): leave unit_types "
        "empty");
  }
  impl_->seq = model;
  impl_->module = std::move(model);
  impl_->pg = pg;
  impl_->opts = std::move(options);
  impl_->Setup();
}

FullyShardedDataParallel::FullyShardedDataParallel(
    std::shared_ptr<torch::nn::Module> model,
    std::function<at::Tensor(const at::Tensor&)> forward, ProcessGroup* pg,
    FsdpOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->module = std::move(model);
  impl_->forward = std::move(forward);
  impl_->pg = pg;
  impl_->opts = std::move(options);
  impl_->Setup();
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

at::Tensor FullyShardedDataParallel::Forward(const at::Tensor& input) {
  Impl& d = *impl_;
  // The input follows param_dtype, so mixed-precision layers see one dtype;
  // the output goes back to float32 for the loss.
  at::Tensor h =
      input.scalar_type() == at::kFloat && d.param_dtype != at::kFloat
          ? input.to(d.param_dtype)
          : input;
  d.order.clear();
  if (d.seq) {
    for (size_t k = 0; k < d.units.size(); ++k) {
      const size_t pos = d.EnterUnit(k);
      for (size_t c = d.units[k].first_child; c < d.units[k].end_child; ++c)
        h = (d.seq->begin() + c)->forward(h);
      h = d.ExitUnit(pos, h);
    }
  } else {
    h = d.RunTree(h);
  }
  d.prev_order = d.order;
  return h.scalar_type() == at::kFloat ? h : h.to(at::kFloat);
}

// Read by the hooks of the next backward (OnGrad) and by SyncGradients.
void FullyShardedDataParallel::SetGradientSync(bool sync) {
  impl_->gradient_sync = sync;
}

void FullyShardedDataParallel::SyncGradients() {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.gradient_sync) {  // the sums stay in grad_full for the next
    for (auto& u : d.units) {
      d.Free(u);
      u.clear_param_grads = true;
      d.ResetBackward(u);
    }
    d.ClearParamGrads();
    return;
  }
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
  for (auto& u : d.units) d.Free(u);
  d.next_rs = static_cast<int>(d.units.size()) - 1;
}

// The collectives in flight are kept, not waited for (one may wait on a
// survivor that stopped elsewhere), until the old transport and group are
// gone: their threads end with them, and only then is the memory they
// write into freed. Those that ended (failed) go first: each holds its
// gloo context, whose sockets must close with the old group for a peer
// still blocked in that collective to see it fail.
void FullyShardedDataParallel::Regroup(
    const std::function<ProcessGroup*()>& regroup) {
  Impl& d = *impl_;
  std::vector<c10::intrusive_ptr<c10d::Work>> in_flight;
  for (auto& u : d.units) {
    for (auto* w : {&u.gather_work, &u.rs_work}) {
      if (*w && !(*w)->isCompleted()) in_flight.push_back(std::move(*w));
      w->reset();
    }
  }
  d.net.reset();  // its queue's jobs fail on the dead rank's absence
  ProcessGroup* pg = regroup();
  in_flight.clear();
  if (pg->getSize() != d.world) {
    throw Error("FSDP regroup: the new group has " +
                std::to_string(pg->getSize()) +
                " ranks, the shards were cut "
                "for " +
                std::to_string(d.world));
  }
  at::NoGradGuard no_grad;
  for (auto& u : d.units) {
    FreeStorage(u.full);
    u.gathered = false;
    u.gather_input = u.rs_out = u.grad_full = at::Tensor();
    for (at::Tensor& p : u.params) p.mutable_grad() = at::Tensor();
    u.shard.mutable_grad() = at::Tensor();
    u.clear_param_grads = false;
    d.ResetBackward(u);
  }
  // As a replacement's first forward runs (a Sequential's in its
  // children's order; a tree's with every unit gathered up front, nothing
  // prefetched), so that both launch the same collectives in the same
  // order.
  d.order.clear();
  d.prev_order.clear();
  if (d.seq) {
    for (size_t k = 0; k < d.units.size(); ++k) d.prev_order.push_back(k);
  }
  d.discovered = false;
  d.gradient_sync = true;
  d.next_rs = static_cast<int>(d.units.size()) - 1;
  d.pg = pg;
  d.rank = pg->getRank();
  d.net = std::make_unique<FsdpTransport>(pg, d.opts.timeout);
  d.OpenSharedMemory();
}

std::vector<at::Tensor> FullyShardedDataParallel::ShardParameters() const {
  std::vector<at::Tensor> out;
  for (const auto& u : impl_->units) out.push_back(u.shard);
  return out;
}

std::string FullyShardedDataParallel::transport() const {
  return impl_->net->shared_memory() ? "shared memory" : "process group";
}

size_t FullyShardedDataParallel::num_units() const {
  return impl_->units.size();
}

FullyShardedDataParallel::CommStats FullyShardedDataParallel::TakeCommStats() {
  CommStats s = impl_->stats;
  impl_->stats = CommStats();
  return s;
}

}  // namespace dtrun::train
