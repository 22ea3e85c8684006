// DDP: parameters broadcast from rank 0 once, gradients flattened into
// buckets and all-reduced as each bucket fills during backward (through
// shared memory on one host, else the process group), then averaged.
#include "lib/ddp.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <future>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "lib/process_group.h"
#include "lib/parallel/in_place.h"
#include "lib/parallel/shm_allreduce.h"
#include "rendezvous/util/log_line.h"
#include "rendezvous/util/memory_checkpoint.h"

namespace dtrun::train {

// Rank 0 creates the segment under a name unique to this run (pid and
// random bits: two jobs on one host never open each other's) and broadcasts
// it; an empty name means it could not. The MIN all-reduce makes the verdict
// unanimous: if any rank failed to open it, all use the process group, or
// some would wait in shared-memory barriers that others never enter. Rank 0
// removes the name once all have it mapped, or when a peer's failure breaks
// the collectives (a survivor in in-place recovery makes another).
std::unique_ptr<ShmAllreduce> OpenSharedMemoryAllreduce(ProcessGroup& pg,
                                                        size_t floats,
                                                        std::string* why) {
  const int world = pg.getSize(), rank = pg.getRank();
  std::unique_ptr<ShmAllreduce> seg;
  at::Tensor name = at::zeros({128}, at::kByte);
  if (rank == 0) {
    std::string n = "/" + memory_checkpoint::CollectiveSegmentPrefix(getpid()) +
                    "-" + std::to_string(std::random_device{}()) +
                    std::to_string(std::random_device{}());
    auto created = ShmAllreduce::Create(n, world, floats);
    if (created.ok()) {
      seg = std::move(*created);
      std::memcpy(name.data_ptr(), n.data(), n.size());
    } else {
      *why = created.status().message();
    }
  }
  std::vector<at::Tensor> ok{at::zeros({1}, at::kInt)};
  try {
    std::vector<at::Tensor> v{name};
    pg.broadcast(v)->wait();
    std::string n(static_cast<const char*>(name.data_ptr()));
    if (rank != 0 && !n.empty()) {
      auto opened = ShmAllreduce::Open(n, rank, world, floats);
      if (opened.ok()) {
        seg = std::move(*opened);
      } else {
        *why = opened.status().message();
      }
    }
    ok[0].fill_(seg ? 1 : 0);
    c10d::AllreduceOptions min;
    min.reduceOp = c10d::ReduceOp::MIN;
    pg.allreduce(ok, min)->wait();
  } catch (...) {
    if (rank == 0 && seg) seg->Unlink();
    throw;
  }
  if (rank == 0 && seg) seg->Unlink();  // everyone has it mapped, or gave up
  if (ok[0].item<int>() == 0) return nullptr;
  seg->set_abandoned(&GroupBroken);
  return seg;
}

namespace {

// Runs `fn` after autograd accumulated a parameter's gradient (a post hook
// on its AccumulateGrad node; libtorch 1.13 and 2.x alike).
class AccumulatedHook : public torch::autograd::FunctionPostHook {
 public:
  explicit AccumulatedHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

struct DistributedDataParallel::Impl {
  struct Bucket {
    std::vector<size_t> params;    // indices into Impl::params
    std::vector<int64_t> offsets;  // where each parameter sits in `flat`
    at::Tensor flat;
    size_t pending = 0;  // gradients not yet copied in this step
    c10::intrusive_ptr<c10d::Work> work;
    int64_t shm_offset = 0;  // where `flat` sits in this rank's shared region
    std::future<Status> shm_work;
    // A bfloat16 or float16 bucket on the CPU is summed in float32 (gloo
    // has no bfloat16 sum on every libtorch the project supports): this is
    // its float32 copy while its all-reduce runs.
    at::Tensor staged;
  };

  // before `buckets`: their flats may live in it
  std::unique_ptr<ShmQueue> shm;
  std::shared_ptr<torch::nn::Module> module;
  ProcessGroup* pg;
  DdpOptions opts;
  std::vector<at::Tensor> params;
  std::vector<size_t> bucket_of;
  std::vector<int64_t> offset_of;
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  size_t next_launch = 0;  // buckets start in index order on every rank
  bool sync = true;
  std::mutex mu;  // hooks may run on autograd's threads
  // Each parameter's gradient accumulator (kept alive: autograd holds it
  // weakly) and the key of the hook DDP put on it.
  // shared_ptr<Node> up to torch 2.6 at least, intrusive_ptr<Node> in 2.14:
  // the type grad_accumulator() returns, whichever it is.
  std::vector<decltype(torch::autograd::impl::grad_accumulator(
      std::declval<const at::Tensor&>()))>
      accumulators;
  std::vector<uintptr_t> hook_keys;

  // The bucket's memory for parameter k, shaped as the parameter. Not an
  // autograd view (from_blob aliases the memory): libtorch's zero_grad()
  // detaches .grad in place, which a view refuses.
  // A bucket holds one dtype (its parameters'), so the address is counted
  // in that dtype's elements.
  void* SliceOf(size_t k) {
    Bucket& b = buckets[bucket_of[k]];
    return static_cast<char*>(b.flat.data_ptr()) +
           offset_of[k] * static_cast<int64_t>(b.flat.element_size());
  }
  at::Tensor GradAlias(size_t k) {
    const at::Tensor& p = params[k];
    Bucket& b = buckets[bucket_of[k]];
    return at::from_blob(SliceOf(k), p.sizes(), b.flat.options());
  }
  // Makes parameter k's .grad the bucket's memory again, its values kept
  // (zeros when it has none).
  void IntoBucket(size_t k) {
    if (Aliased(k)) return;
    at::Tensor& g = params[k].mutable_grad();
    at::Tensor alias = GradAlias(k);
    if (g.defined()) {
      alias.copy_(g);
    } else {
      alias.zero_();
    }
    g = alias;
  }
  // Puts the hook on parameter k's gradient accumulator; true when that is
  // a new accumulator: the parameter's data was replaced since (loading a
  // torch archive into the model does that), its gradient accumulated
  // without a word to DDP.
  bool Hook(size_t k) {
    auto acc = torch::autograd::impl::grad_accumulator(params[k]);
    if (k < accumulators.size() && accumulators[k] == acc) return false;
    Impl* self = this;
    const uintptr_t key = acc->add_post_hook(std::make_unique<AccumulatedHook>(
        [self, k] { self->OnAccumulated(k); }));
    if (k < accumulators.size()) {
      accumulators[k]->del_post_hook(hook_keys[k]);
      accumulators[k] = std::move(acc);
      hook_keys[k] = key;
      return true;
    }
    accumulators.push_back(std::move(acc));
    hook_keys.push_back(key);
    return false;
  }
  bool Aliased(size_t k) {
    const at::Tensor& g = params[k].grad();
    return g.defined() && g.data_ptr() == SliceOf(k);
  }

  // Broadcast moves bytes: a bfloat16 tensor on the CPU goes as its bytes
  // (gloo refuses bfloat16 on libtorch 1.13, int16 there too, and float16
  // on 2.14; uint8 everywhere). Parameters and buffers are contiguous, so
  // the byte view aliases them.
  void Broadcast(const at::Tensor& t) {
    const bool bytes = t.device().is_cpu() &&
                       t.scalar_type() == at::kBFloat16 && t.is_contiguous();
    std::vector<at::Tensor> v{bytes ? t.reshape({-1}).view(at::kByte) : t};
    c10d::BroadcastOptions o;
    o.rootRank = 0;
    pg->broadcast(v, o)->wait();
  }

  // Buckets depend only on the parameters' sizes, dtypes, devices and the
  // cap, so every rank builds the same ones: collectives pair up across
  // ranks by the order they are issued in, so every rank must issue the
  // same ones. One bucket holds one dtype on one device (as PyTorch's DDP):
  // a parameter goes into the open bucket of its kind.
  void BuildBuckets() {
    const int64_t cap = static_cast<int64_t>(opts.bucket_cap_mb * 1024 * 1024);
    // The first bucket (the last layers, whose gradients come first) is small,
    // as in PyTorch's DDP, so its all-reduce starts early in backward.
    const int64_t first_cap = std::min<int64_t>(cap, 1 << 20);
    bucket_of.assign(params.size(), 0);
    offset_of.assign(params.size(), 0);
    struct Open {
      size_t bucket;
      int64_t bytes;
    };
    std::map<std::pair<int, std::string>, Open> open;  // by dtype, device
    // Reverse registration order: backward produces the last layers'
    // gradients first, so buckets fill (and start) one after another.
    for (size_t k = params.size(); k-- > 0;) {
      const at::Tensor& p = params[k];
      int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
      int64_t limit = buckets.size() <= 1 ? first_cap : cap;
      const std::pair<int, std::string> kind{static_cast<int>(p.scalar_type()),
                                             p.device().str()};
      auto it = open.find(kind);
      if (it == open.end() ||
          (it->second.bytes + size > limit && it->second.bytes > 0)) {
        buckets.emplace_back();
        it = open.insert_or_assign(kind, Open{buckets.size() - 1, 0}).first;
      }
      it->second.bytes += size;
      Bucket& b = buckets[it->second.bucket];
      bucket_of[k] = it->second.bucket;
      offset_of[k] = b.offsets.empty()
                         ? 0
                         : b.offsets.back() + params[b.params.back()].numel();
      b.params.push_back(k);
      b.offsets.push_back(offset_of[k]);
    }
  }

  int64_t BucketNumel(const Bucket& b) const {
    return b.offsets.back() + params[b.params.back()].numel();
  }

  // Each bucket's storage, once: in this rank's shared region when the
  // group shares memory, else its own tensor.
  void AllocateBuckets() {
    int64_t total = 0;
    bool shareable = pg->getSize() > 1 && opts.shared_memory;
    for (const auto& p : params) {
      shareable =
          shareable && p.device().is_cpu() && p.scalar_type() == at::kFloat;
      total += p.numel();
    }
    if (shareable) {  // the same verdict on every rank: the collective below is
                      // entered by all
      std::string why;
      auto seg =
          OpenSharedMemoryAllreduce(*pg, static_cast<size_t>(total), &why);
      if (seg) {
        shm = std::make_unique<ShmQueue>(std::move(seg));
      } else if (!why.empty()) {
        LogLine("dtrun.ddp", LogLevel::kInfo,
                "rank " + std::to_string(pg->getRank()) +
                    ": all-reduce through the process group (" + why + ")");
      }
    }
    int64_t at = 0;
    for (Bucket& b : buckets) {
      const int64_t n = BucketNumel(b);
      if (shm) {
        b.shm_offset = at;
        b.flat = at::from_blob(shm->shm().region() + at, {n},
                               at::TensorOptions().dtype(at::kFloat));
        b.flat.zero_();
      } else {
        b.flat = at::zeros(
            {n}, params[b.params.front()].options().requires_grad(false));
      }
      b.pending = b.params.size();
      at += n;
    }
  }

  // After autograd accumulated parameter k's gradient into its .grad,
  // which is the bucket's memory (GradAlias): nothing to copy. A .grad that
  // is not (zero_grad(set_to_none), Torch 2.x's default, leaves autograd a
  // fresh tensor to store) is copied in once and pointed back at the bucket.
  void OnAccumulated(size_t k) {
    // A rank died (in-place recovery): the backward stops here rather than
    // computing gradients no all-reduce will take.
    ThrowIfGroupBroken("DDP");
    if (!sync) return;  // NoSync: it accumulates in .grad, which is the bucket
    at::NoGradGuard no_grad;
    std::lock_guard<std::mutex> lock(mu);
    IntoBucket(k);
    Bucket& b = buckets[bucket_of[k]];
    if (!ready[k]) {
      ready[k] = true;
      --b.pending;
    }
    LaunchReady();
  }

  // Strictly in bucket order, even when a later bucket fills first (autograd
  // may finish gradients in another order on another rank): a bucket waits
  // for its predecessors, so the all-reduces match up across ranks.
  void LaunchReady() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch];
      if (shm) {
        const size_t offset = static_cast<size_t>(b.shm_offset),
                     n = static_cast<size_t>(b.flat.numel());
        const float world = static_cast<float>(pg->getSize());
        b.shm_work = shm->Launch(
            [offset, n, world, timeout = opts.timeout](ShmAllreduce& seg) {
              return seg.Allreduce(offset, n, timeout, world);
            });
      } else if (Staged(b)) {
        b.staged = b.flat.to(at::kFloat);
        std::vector<at::Tensor> v{b.staged};
        b.work = pg->allreduce(v);
      } else {
        std::vector<at::Tensor> v{b.flat};
        b.work = pg->allreduce(v);
      }
      ++next_launch;
    }
  }

  static bool Staged(const Bucket& b) {
    return b.flat.device().is_cpu() && (b.flat.scalar_type() == at::kBFloat16 ||
                                        b.flat.scalar_type() == at::kHalf);
  }

  // A failed shared-memory all-reduce (a local rank died or hangs) throws,
  // as a failed gloo collective does, so the trainer fails the same way.
  void Wait(Bucket& b) {
    if (!shm) {
      WaitUnlessGroupBroken(b.work, pg->getBackendName() != "nccl", "DDP");
      b.work.reset();
      return;
    }
    Status s = b.shm_work.get();
    if (!s.ok())
      throw Error("DDP: rank " + std::to_string(pg->getRank()) + ": " +
                  s.message());
  }

  // Parameters that got no gradient this step (an unused branch) would keep
  // their bucket from ever launching, and every rank would wait for it.
  // With find_unused_parameters they contribute what .grad holds (or zeros).
  void FillUnused() {
    for (size_t k = 0; k < params.size(); ++k) {
      if (ready[k]) continue;
      if (Hook(k)) {  // it accumulated unseen, into whatever .grad was
        IntoBucket(k);
        ready[k] = true;
        --buckets[bucket_of[k]].pending;
        continue;
      }
      if (!opts.find_unused_parameters) {
        std::ostringstream shape;
        shape << params[k].sizes();
        throw Error(
            "DDP: parameter #" + std::to_string(k) + " (shape " + shape.str() +
            ") got no gradient in this step; construct DDP with "
            "find_unused_parameters=true if some parameters are unused");
      }
      IntoBucket(k);
      ready[k] = true;
      --buckets[bucket_of[k]].pending;
    }
  }
};

// Rank 0's weights everywhere: replicas start identical whatever each
// rank's initialisation did.
void DistributedDataParallel::BroadcastState() {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  for (auto& p : d.module->parameters()) d.Broadcast(p.data());
  if (d.opts.broadcast_buffers) {
    for (auto& b : d.module->buffers()) d.Broadcast(b);
  }
}

DistributedDataParallel::DistributedDataParallel(
    std::shared_ptr<torch::nn::Module> module, ProcessGroup* pg,
    DdpOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.module = std::move(module);
  d.pg = pg;
  d.opts = options;
  if (options.broadcast_at_start) BroadcastState();
  // A parameter registered twice (a tied embedding and head) is one
  // gradient: reduced once.
  std::set<c10::TensorImpl*> seen;
  for (auto& p : d.module->parameters()) {
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second)
      d.params.push_back(p);
  }
  d.ready.assign(d.params.size(), false);
  d.BuildBuckets();
  d.AllocateBuckets();
  // Gradients live in the buckets from the start: autograd accumulates
  // into them, and the hook after each accumulation only counts.
  for (size_t k = 0; k < d.params.size(); ++k) {
    d.IntoBucket(k);
    d.Hook(k);
  }
}

// The hooks go, and gradients that alias the buckets (maybe shared memory
// about to be unmapped) become copies of their own.
DistributedDataParallel::~DistributedDataParallel() {
  Impl& d = *impl_;
  for (size_t k = 0; k < d.params.size(); ++k) {
    d.accumulators[k]->del_post_hook(d.hook_keys[k]);
    if (d.Aliased(k)) d.params[k].mutable_grad() = d.params[k].grad().clone();
  }
}

void DistributedDataParallel::SyncGradients() {
  Impl& d = *impl_;
  if (!d.sync) return;
  at::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(d.mu);
  d.FillUnused();
  d.LaunchReady();
  const double world = d.pg->getSize();
  // The sum divided by the world size: the mean gradient, as PyTorch's DDP.
  // .grad is the bucket's memory, so the mean is made in place, with no
  // copy; the next backward accumulates into it after zero_grad(), and no
  // other rank reads this rank's region between all-reduces. The shared
  // memory's all-reduce divides as it sums (the same bits).
  for (auto& b : d.buckets) {
    d.Wait(b);
    if (b.staged.defined()) {  // the mean in float32, rounded once
      b.flat.copy_(b.staged.div_(world));
      b.staged = at::Tensor();
    } else if (!d.shm) {
      b.flat.div_(world);
    }
    b.pending = b.params.size();
  }
  d.ready.assign(d.params.size(), false);
  d.next_launch = 0;
}

// While off, hooks return at once and gradients accumulate in .grad (the
// buckets) on this rank; the next synced backward adds to them and reduces.
DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp) {
  ddp_.impl_->sync = false;
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.impl_->sync = true; }

size_t DistributedDataParallel::num_buckets() const {
  return impl_->buckets.size();
}
std::string DistributedDataParallel::transport() const {
  return impl_->shm ? "shared memory" : "process group";
}
torch::nn::Module& DistributedDataParallel::module() { return *impl_->module; }

}  // namespace dtrun::train
