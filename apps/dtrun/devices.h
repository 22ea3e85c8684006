#pragma once

// This host's accelerators, counted without loading any driver library
// (dtrun links none and must start in milliseconds on machines without
// one), and the words of --nproc-per-node that name them. The CPUs are
// cpu_quota.h's; which CPUs sit near which GPU is numa_binding.h's.

#include <map>
#include <string>

#include "rendezvous/util/status.h"

namespace dtrun::agent {

// Accelerators of this host by torch's device-type name ("gpu" is CUDA's).
struct DeviceCounts {
  int cpu = 1, gpu = 0, xpu = 0, hpu = 0, npu = 0;
};
// int, "cpu", "gpu", "xpu", "hpu", "npu" or "auto" -> worker count; error
// names what was wrong.
Result<int> ParseNprocPerNode(const std::string& text,
                              const DeviceCounts& devices);
// Counts xpu (Intel: /dev/dri render nodes of the i915/xe drivers), hpu
// (/dev/accel/accelN) and npu (/dev/davinciN) devices; `gpu` from CountGpus.
DeviceCounts CountDevices(int cpu_count, int gpu_count);

// Number of usable NVIDIA GPUs on this host (honours CUDA_VISIBLE_DEVICES):
// counts /dev/nvidiaN, so it reads 0 in a container that does not expose
// the device nodes.
int CountGpus(const std::map<std::string, std::string>& environment);

}  // namespace dtrun::agent
