// Pinned host buffers and a side stream on a GPU; plain clones on the CPU,
// where a copy costs what it costs and nothing can overlap it.
#include "lib/checkpointing/host_staging.h"

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <thread>

#include "rendezvous/util/check.h"

namespace dtrun::train {

// The streams and buffers behind HostStaging. The side stream is one of
// torch's pooled streams of the device, so that the copies neither wait
// for nor hold up the loop's kernels; the loop's stream is remembered at
// Begin() because Fence() must make that very stream wait.
struct HostStaging::Impl {
  explicit Impl(torch::Device device)
      : guard(device.type()),
        side(guard.getStreamFromGlobalPool(device)),
        loop(guard.getStream(device)) {}
  c10::impl::VirtualGuardImpl guard;
  c10::Stream side;  // where the copies run
  c10::Stream loop;  // the loop's (current) stream when Begin() ran
  // One pinned buffer per Copy() of a checkpoint, in call order; refilled
  // by the next checkpoint when its tensor has the same dtype and size.
  std::vector<torch::Tensor> buffers;
  size_t next = 0;
  std::shared_ptr<c10::Event> done;  // End()'s, until Fence()
  bool open = false;
};

HostStaging::HostStaging(torch::Device device) : device_(device) {
  if (staged()) impl_ = std::make_unique<Impl>(device);
}

HostStaging::~HostStaging() = default;

void HostStaging::Ready::Wait() const {
  if (!event_) return;
  // c10::Event::synchronize() is missing from libtorch 1.13; a copy takes
  // milliseconds, so polling every 100 us costs nothing that matters.
  const auto* event = static_cast<const c10::Event*>(event_.get());
  while (!event->query())
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

void HostStaging::Begin() {
  if (!impl_) return;
  DTRUN_CHECK(!impl_->open) << "HostStaging::Begin() twice";
  impl_->open = true;
  impl_->next = 0;
  // The side stream starts after the loop's work so far: the state it
  // copies is the state as of now.
  impl_->loop = impl_->guard.getStream(device_);
  c10::Event begun(device_.type());
  begun.record(impl_->loop);
  impl_->side.wait(begun);
}

// A buffer is kept from one checkpoint to the next when its tensor has the
// same dtype and size (the usual case: the state's shapes do not change),
// so that pinning memory, which takes hundreds of milliseconds for
// hundreds of megabytes, happens once.
torch::Tensor HostStaging::Copy(const torch::Tensor& t) {
  if (!impl_ || !t.defined() || t.device().is_cpu())
    return t.defined() ? t.detach().clone() : t;
  DTRUN_CHECK(impl_->open) << "HostStaging::Copy() outside Begin()..End()";
  const torch::Tensor src = t.detach().contiguous();
  const size_t k = impl_->next++;
  if (k == impl_->buffers.size()) impl_->buffers.emplace_back();
  torch::Tensor& buf = impl_->buffers[k];
  if (!buf.defined() || buf.scalar_type() != src.scalar_type() ||
      buf.numel() != src.numel()) {
    buf = torch::empty(
        {src.numel()},
        torch::TensorOptions().dtype(src.scalar_type()).pinned_memory(true));
  }
  {
    c10::StreamGuard on_side(impl_->side);
    buf.copy_(src.view({-1}), /*non_blocking=*/true);
  }
  // `src` may be a temporary of the loop's stream (a gathered full
  // state): its memory is not reused before the side stream is done.
  src.record_stream(impl_->side);
  return buf.view(src.sizes());
}

HostStaging::Ready HostStaging::End() {
  Ready r;
  if (!impl_) return r;
  DTRUN_CHECK(impl_->open) << "HostStaging::End() without Begin()";
  impl_->open = false;
  auto event = std::make_shared<c10::Event>(device_.type());
  event->record(impl_->side);
  impl_->done = event;
  r.event_ = event;
  return r;
}

void HostStaging::Fence() {
  if (!impl_ || !impl_->done) return;
  impl_->loop.wait(*impl_->done);
  impl_->done.reset();
}

int64_t HostStaging::pinned_bytes() const {
  int64_t n = 0;
  if (impl_) {
    for (const torch::Tensor& b : impl_->buffers)
      n += b.defined() ? b.numel() * static_cast<int64_t>(b.element_size()) : 0;
  }
  return n;
}

}  // namespace dtrun::train
