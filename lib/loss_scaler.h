#pragma once

// train.precision = "fp16"'s dynamic loss scale, as torch.amp.GradScaler
// keeps it: the loss is multiplied by the scale before the backward (so
// that float16's small gradients do not flush to zero), the gradients
// divided by it before the step; a step whose gradients are not finite is
// skipped and the scale halved, and after `growth_interval` finite steps in
// a row the scale doubles. Pure (no torch): the loop does the tensor work.

#include <cstdint>

namespace dtrun::train {

class LossScaler {
 public:
  // GradScaler's defaults: 2^16, x2 after 2,000 finite steps, x0.5 on one
  // that is not.
  explicit LossScaler(double init_scale = 65536.0,
                      int64_t growth_interval = 2000)
      : scale_(init_scale), growth_interval_(growth_interval) {}

  double scale() const { return scale_; }
  // Finite steps since the scale last changed.
  int64_t growth_tracker() const { return tracker_; }

  // After a step whose unscaled gradients were `finite` (the same verdict
  // on every rank) or not (then it was skipped).
  void Update(bool finite) {
    if (!finite) {
      scale_ *= 0.5;
      tracker_ = 0;
      return;
    }
    if (++tracker_ >= growth_interval_) {
      scale_ *= 2.0;
      tracker_ = 0;
    }
  }

  // Back to a checkpoint's state (its scale and growth tracker).
  void Restore(double scale, int64_t growth_tracker) {
    scale_ = scale;
    tracker_ = growth_tracker;
  }

 private:
  double scale_;
  int64_t growth_interval_;
  int64_t tracker_ = 0;
};

}  // namespace dtrun::train
