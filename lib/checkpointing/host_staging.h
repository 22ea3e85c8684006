#pragma once

// Checkpoint copies of device tensors, made into pinned host buffers on a
// stream of their own, so that the training loop does not wait for them:
// the loop only enqueues the copies (Begin, Copy, End), its stream waits on
// the device for them before the state next changes (Fence, before the
// optimizer step), and the thread that serializes waits for them on the
// host (Ready::Wait). The buffers are kept and refilled by the next
// checkpoint, so pinned memory is allocated once (Reserve, after the first
// step), not at each checkpoint. CPU tensors are cloned, as before: on a
// CPU-only run this class is a clone per tensor.
//
// Written against c10's device-generic streams and events, so it builds
// against every libtorch, CUDA or not. Not thread-safe: the loop owns it;
// Ready may move to another thread.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace dtrun::train {

// A copy of a tensor that shares nothing with it, as a checkpoint keeps.
using TensorCopier = std::function<torch::Tensor(const torch::Tensor&)>;

class HostStaging {
 public:
  // `device`: where the training state lives. On a CPU device every copy
  // is a clone and nothing is pinned.
  explicit HostStaging(torch::Device device);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // When the copies of one checkpoint are complete.
  class Ready {
   public:
    Ready() = default;
    // Blocks until every copy made between Begin() and End() landed in
    // host memory. Any thread.
    void Wait() const;

   private:
    friend class HostStaging;
    std::shared_ptr<void> event_;  // c10::Event; null: nothing to wait for
  };

  // Starts one checkpoint's copies: they follow everything the loop's
  // stream has enqueued so far.
  void Begin();
  // A host copy of `t` (between Begin and End). Device tensors: a pinned
  // buffer of this object's, filled on the side stream; the previous
  // checkpoint's copy in that buffer must no longer be read (the loop
  // waits for the previous write before the next checkpoint).
  torch::Tensor Copy(const torch::Tensor& t);
  // Ends them; the loop's stream will wait for them at Fence().
  Ready End();
  // The copier Begin..End hands to a strategy.
  TensorCopier copier() {
    return [this](const torch::Tensor& t) { return Copy(t); };
  }
  // Makes the loop's stream wait (on the device, not the host) for the
  // last End()'s copies, once: call before the state changes.
  void Fence();
  // Whether copies go through pinned buffers (a device that is not CPU).
  bool staged() const { return !device_.is_cpu(); }
  // Pinned bytes held for the next checkpoint.
  int64_t pinned_bytes() const;

 private:
  struct Impl;
  torch::Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrun::train
