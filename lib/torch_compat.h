#pragma once

// Where lib/ meets the differences between libtorch 1.x (Debian bookworm:
// 1.13) and 2.x (Debian trixie: 2.6), so that the rest of lib/ reads the
// same against both. Light enough for public headers: <torch/version.h>
// holds macros only.

#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>

// True when the libtorch compiled against is at least MAJOR.MINOR.
#define DTRUN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if TORCH_VERSION_MAJOR >= 2
namespace c10d {
class Backend;
}
#else
namespace c10d {
class ProcessGroup;
}
#endif

namespace dtrun::train {

// What lib/ runs collectives on. In 1.x ProcessGroupGloo and
// ProcessGroupNCCL derive from c10d::ProcessGroup. In 2.x they derive from
// c10d::Backend, and c10d::ProcessGroup became a dispatcher front end over
// one backend per device type, which lib/ does not need: it calls the
// backend directly. Both types have the members lib/ uses (getRank,
// getSize, getBackendName, broadcast, allreduce, allgather,
// _allgather_base, alltoall_base, _reduce_scatter_base, barrier) with the
// same signatures, returning c10::intrusive_ptr<c10d::Work>.
#if TORCH_VERSION_MAJOR >= 2
using ProcessGroup = c10d::Backend;
#else
using ProcessGroup = c10d::ProcessGroup;
#endif

// The key torch::optim::Optimizer::state() files a parameter's state under:
// the text of its TensorImpl's address in 1.x, the address itself (void*)
// in 2.x. Taken from the map's own key type, so no version needs naming.
template <typename Optimizer, typename Tensor>
auto OptimizerStateKey(Optimizer& opt, const Tensor& param) {
  using Key = typename std::decay_t<decltype(opt.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    // what 1.x's c10::guts::to_string(TensorImpl*) writes
    std::ostringstream text;
    text << param.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

}  // namespace dtrun::train
