#include "lib/ddp.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include <mutex>
#include <sstream>

#include "lib/process_group.h"

namespace dtrun::train {

struct DistributedDataParallel::Impl {
  struct Bucket {
    std::vector<size_t> params;    // indices into Impl::params
    std::vector<int64_t> offsets;  // where each parameter sits in `flat`
    at::Tensor flat;
    size_t pending = 0;            // gradients not yet copied in this step
    c10::intrusive_ptr<c10d::Work> work;
  };

  std::shared_ptr<torch::nn::Module> module;
  c10d::ProcessGroup* pg;
  DdpOptions opts;
  std::vector<at::Tensor> params;
  std::vector<size_t> bucket_of;
  std::vector<int64_t> offset_of;
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  size_t next_launch = 0;  // buckets start in index order on every rank
  bool sync = true;
  std::mutex mu;           // hooks may run on autograd's threads

  void Broadcast(const at::Tensor& t) {
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = 0;
    pg->broadcast(v, o)->wait();
  }

  void BuildBuckets() {
    const int64_t cap = static_cast<int64_t>(opts.bucket_cap_mb * 1024 * 1024);
    // The first bucket (the last layers, whose gradients come first) is small,
    // as in PyTorch's DDP, so its all-reduce starts early in backward.
    const int64_t first_cap = std::min<int64_t>(cap, 1 << 20);
    bucket_of.assign(params.size(), 0);
    offset_of.assign(params.size(), 0);
    int64_t bytes = 0;
    for (size_t k = params.size(); k-- > 0;) {  // reverse registration order
      const at::Tensor& p = params[k];
      int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
      int64_t limit = buckets.size() <= 1 ? first_cap : cap;
      if (buckets.empty() || (bytes + size > limit && bytes > 0)) {
        buckets.emplace_back();
        bytes = 0;
      }
      Bucket& b = buckets.back();
      bucket_of[k] = buckets.size() - 1;
      offset_of[k] = b.offsets.empty() ? 0 : b.offsets.back() + params[b.params.back()].numel();
      b.params.push_back(k);
      b.offsets.push_back(offset_of[k]);
      bytes += size;
    }
    for (Bucket& b : buckets) {
      int64_t n = b.offsets.back() + params[b.params.back()].numel();
      b.flat = at::zeros({n}, params[b.params.front()].options().requires_grad(false));
      b.pending = b.params.size();
    }
  }

  void OnGrad(size_t k, const at::Tensor& grad) {
    if (!sync) return;
    at::NoGradGuard no_grad;
    std::lock_guard<std::mutex> lock(mu);
    const at::Tensor& p = params[k];
    // The hook sees this pass's gradient before it is accumulated; add what
    // earlier (NoSync) passes left in .grad.
    Bucket& b = buckets[bucket_of[k]];
    at::Tensor slice = b.flat.narrow(0, offset_of[k], p.numel());
    if (p.grad().defined()) {
      at::add_out(slice, p.grad().reshape({-1}), grad.reshape({-1}));  // one pass, no temporary
    } else {
      slice.copy_(grad.reshape({-1}));
    }
    if (!ready[k]) {
      ready[k] = true;
      --b.pending;
    }
    LaunchReady();
  }

  void LaunchReady() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      std::vector<at::Tensor> v{buckets[next_launch].flat};
      buckets[next_launch].work = pg->allreduce(v);
      ++next_launch;
    }
  }

  void FillUnused() {
    for (size_t k = 0; k < params.size(); ++k) {
      if (ready[k]) continue;
      if (!opts.find_unused_parameters) {
        std::ostringstream shape;
        shape << params[k].sizes();
        throw Error("DDP: parameter #" + std::to_string(k) + " (shape " + shape.str() +
                    ") got no gradient in this step; construct DDP with "
                    "find_unused_parameters=true if some parameters are unused");
      }
      Bucket& b = buckets[bucket_of[k]];
      at::Tensor slice = b.flat.narrow(0, offset_of[k], params[k].numel());
      if (params[k].grad().defined()) {
        slice.copy_(params[k].grad().reshape({-1}));
      } else {
        slice.zero_();
      }
      ready[k] = true;
      --b.pending;
    }
  }
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 c10d::ProcessGroup* pg, DdpOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.module = std::move(module);
  d.pg = pg;
  d.opts = options;
  {
    at::NoGradGuard no_grad;
    for (auto& p : d.module->parameters()) d.Broadcast(p.data());
    if (options.broadcast_buffers) {
      for (auto& b : d.module->buffers()) d.Broadcast(b);
    }
  }
  for (auto& p : d.module->parameters()) {
    if (p.requires_grad()) d.params.push_back(p);
  }
  d.ready.assign(d.params.size(), false);
  d.BuildBuckets();
  Impl* raw = impl_.get();
  for (size_t k = 0; k < d.params.size(); ++k) {
    d.params[k].register_hook([raw, k](const at::Tensor& grad) { raw->OnGrad(k, grad); });
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::SyncGradients() {
  Impl& d = *impl_;
  if (!d.sync) return;
  at::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(d.mu);
  d.FillUnused();
  d.LaunchReady();
  const double world = d.pg->getSize();
  for (auto& b : d.buckets) {
    b.work->wait();
    b.work.reset();
    b.flat.div_(world);
    for (size_t i = 0; i < b.params.size(); ++i) {
      at::Tensor& p = d.params[b.params[i]];
      at::Tensor avg = b.flat.narrow(0, b.offsets[i], p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(avg);
      } else {
        p.mutable_grad() = avg.clone();
      }
    }
    b.pending = b.params.size();
  }
  d.ready.assign(d.params.size(), false);
  d.next_launch = 0;
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(ddp) {
  ddp_.impl_->sync = false;
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.impl_->sync = true; }

size_t DistributedDataParallel::num_buckets() const { return impl_->buckets.size(); }
torch::nn::Module& DistributedDataParallel::module() { return *impl_->module; }

}  // namespace dtrun::train
