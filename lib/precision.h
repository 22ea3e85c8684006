#pragma once

// Mixed precision for the training loop: train.precision = "bf16" runs the
// forward and the loss under autocast (CPU and CUDA, libtorch 1.13 and 2.x
// alike), the parameters, their gradients and the optimizer staying
// float32, as torch.autocast does in Python.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace dtrun::train {

// Autocast on `device` in `dtype` while it lives (nested scopes are fine);
// the state before it comes back, and the cast cache goes with the
// outermost. kFloat: does nothing.
// Whether this libtorch's autocast on `device` casts to `dtype` (the CPU's
// float16 came with libtorch 2.4's device-generic autocast; 1.13's CPU
// autocast has bfloat16 only).
bool AutocastSupports(c10::DeviceType device, c10::ScalarType dtype);

class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, c10::ScalarType dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_ = false;
  c10::DeviceType device_;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::kFloat;
};

}  // namespace dtrun::train
