// FSDP's collectives, through the process group or shared memory
// (fsdp_transport.h).
#include "lib/parallel/fsdp_transport.h"

#include <sched.h>

#include <cstring>
#include <future>
#include <thread>

#include "lib/ddp.h"
#include "rendezvous/util/check.h"

namespace dtrun::train {
namespace {

// A collective running on a ShmQueue, as the process group's Work: the
// units wait for it as they wait for gloo's. A failure (a rank died or
// hangs) throws, naming what happened.
class ShmWork : public c10d::Work {
 public:
  explicit ShmWork(std::future<Status> done) : done_(done.share()) {}
  bool isCompleted() override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  bool wait(std::chrono::milliseconds) override {
    const Status& s = done_.get();
    if (!s.ok()) throw Error("FSDP through shared memory: " + s.message());
    return true;
  }

 private:
  std::shared_future<Status> done_;
};

}  // namespace

FsdpTransport::FsdpTransport(ProcessGroup* pg,
                             std::chrono::milliseconds timeout)
    : pg_(pg),
      nccl_(pg->getBackendName() == "nccl"),
      world_(pg->getSize()),
      timeout_(timeout) {}

void FsdpTransport::OpenSharedMemory(int64_t floats, bool prefetch) {
  std::string why;
  auto seg = OpenSharedMemoryAllreduce(*pg_, static_cast<size_t>(floats), &why);
  if (!seg) return;
  shm_ = std::make_unique<ShmQueue>(std::move(seg));
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                        ? CPU_COUNT(&cpus)
                        : static_cast<int>(std::thread::hardware_concurrency());
  shm_overlap_ = prefetch && cores >= 2 * world_;
}

// The job copies `src` into this rank's region when its turn comes (an
// earlier job may still be using the region), so `src` and `dst` must
// live until it is waited for: the unit keeps both, as it does for gloo,
// which reads them asynchronously too.
std::function<Status(ShmAllreduce&)> FsdpTransport::GatherJob(
    const at::Tensor& dst, const at::Tensor& src) const {
  float* out = dst.data_ptr<float>();
  const float* in = src.data_ptr<float>();
  const size_t n = static_cast<size_t>(src.numel());
  return [out, in, n, timeout = timeout_](ShmAllreduce& seg) {
    std::memcpy(seg.region(), in, n * sizeof(float));
    return seg.AllGather(n, out, timeout);
  };
}

// Torch 1.13's gloo moves no bfloat16, Debian forky's 2.14 neither bfloat16
// nor float16 ("Invalid scalar type"). Data movement (all-gather,
// all-to-all) copies bits without looking at them, so 16-bit tensors go as
// their bytes, which every gloo moves; flat tensors only, as FSDP's are.
at::Tensor FsdpTransport::Wire(const at::Tensor& t) const {
  const auto type = t.scalar_type();
  return !nccl_ && (type == at::kBFloat16 || type == at::kHalf)
             ? t.view(at::kByte)
             : t;
}

// Gloo's allgather wants a list of outputs: they are slices of `dst`, so
// the result lands in place with no copy afterwards.
FsdpTransport::Work FsdpTransport::AllGather(const at::Tensor& dst_,
                                             const at::Tensor& src_) {
  if (shm_) {
    DTRUN_CHECK(src_.is_contiguous() && dst_.is_contiguous())
        << "FSDP all-gather of a strided tensor";
    return c10::make_intrusive<ShmWork>(shm_->Launch(GatherJob(dst_, src_)));
  }
  at::Tensor dst = Wire(dst_), src = Wire(src_);
  if (nccl_) {
    at::Tensor out = dst;
    at::Tensor in = src;
    return pg_->_allgather_base(out, in);
  }
  std::vector<std::vector<at::Tensor>> out(1);
  const int64_t s = src.numel();
  for (int j = 0; j < world_; ++j) out[0].push_back(dst.narrow(0, j * s, s));
  std::vector<at::Tensor> in{src};
  return pg_->allgather(out, in);
}

Status FsdpTransport::GatherHere(const at::Tensor& dst, const at::Tensor& src) {
  return shm_->RunHere(GatherJob(dst, src));
}

// Shared memory and NCCL hand back this rank's chunk, already summed; gloo's
// all-to-all hands back every rank's chunk for this rank ([padded]).
at::Tensor FsdpTransport::ReduceScatterOutput(const at::Tensor& in,
                                              int64_t shard_size) {
  return at::empty({shm_ || nccl_ ? shard_size : in.numel()}, in.options());
}

FsdpTransport::Work FsdpTransport::ReduceScatter(const at::Tensor& out_,
                                                 const at::Tensor& in_) {
  if (shm_) {
    float* out = out_.data_ptr<float>();
    const float* in = in_.data_ptr<float>();
    const size_t n = static_cast<size_t>(out_.numel());
    const size_t total = static_cast<size_t>(in_.numel());
    return c10::make_intrusive<ShmWork>(shm_->Launch(
        [out, in, n, total, timeout = timeout_](ShmAllreduce& seg) {
          std::memcpy(seg.region(), in, total * sizeof(float));
          return seg.ReduceScatter(n, out, timeout);
        }));
  }
  if (nccl_) {
    at::Tensor out = out_;
    at::Tensor in = in_;
    return pg_->_reduce_scatter_base(out, in);
  }
  // Chunk j of every rank's gradient goes to rank j; rank j sums them
  // (SummedChunk). Gloo in 1.13 has no reduce-scatter.
  std::vector<int64_t> equal_splits;
  at::Tensor out = Wire(out_), in = Wire(in_);
  return pg_->alltoall_base(out, in, equal_splits, equal_splits);
}

at::Tensor FsdpTransport::SummedChunk(const at::Tensor& out,
                                      int64_t shard_size) const {
  if (nccl_ || shm_ || world_ == 1) return out;
  return out.view({world_, shard_size}).sum(0);
}

}  // namespace dtrun::train
