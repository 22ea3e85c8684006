#include "lib/precision.h"

#include <ATen/autocast_mode.h>

#include "lib/torch_compat.h"

namespace dtrun::train {
namespace {

// libtorch 2.4 named autocast's switches by device type; 1.13 has one per
// device (CUDA's unnamed).
#if DTRUN_TORCH_AT_LEAST(2, 4)
bool Enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void Enable(c10::DeviceType d, bool on) {
  at::autocast::set_autocast_enabled(d, on);
}
c10::ScalarType Dtype(c10::DeviceType d) {
  return at::autocast::get_autocast_dtype(d);
}
void SetDtype(c10::DeviceType d, c10::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
bool Enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                   : at::autocast::is_enabled();
}
void Enable(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
}
c10::ScalarType Dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                   : at::autocast::get_autocast_gpu_dtype();
}
void SetDtype(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(t);
  } else {
    at::autocast::set_autocast_gpu_dtype(t);
  }
}
#endif

}  // namespace

bool AutocastSupports(c10::DeviceType device, c10::ScalarType dtype) {
  if (device != c10::DeviceType::CPU || dtype != c10::kHalf) return true;
  return DTRUN_TORCH_AT_LEAST(2, 4);
}

// As torch.autocast's __enter__: the switch and the dtype set, the nesting
// counted so that only the outermost scope's exit drops the cast cache
// (the float32 weights' bfloat16 copies, made once per forward).
AutocastScope::AutocastScope(c10::DeviceType device, c10::ScalarType dtype)
    : on_(dtype != c10::kFloat), device_(device) {
  if (!on_) return;
  was_enabled_ = Enabled(device_);
  was_dtype_ = Dtype(device_);
  Enable(device_, true);
  SetDtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  Enable(device_, was_enabled_);
  SetDtype(device_, was_dtype_);
}

}  // namespace dtrun::train
