// Device counting for --nproc-per-node (devices.h): /dev and /sys read
// directly, no CUDA or vendor library loaded.
#include "apps/dtrun/devices.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace dtrun::agent {
namespace {

// A whole non-negative decimal number ("2x" and "" are not).
bool ParseIndex(const std::string& text, int* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || v < 0 || v > INT32_MAX) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

Result<int> ParseNprocPerNode(const std::string& text,
                              const DeviceCounts& devices) {
  // torchrun's words: an accelerator name fails when none is there (torchrun:
  // "Cuda is not available"), "auto" falls back to one worker per CPU.
  struct Named {
    const char* word;
    int count;
    const char* what;
  };
  const Named accelerators[] = {
      {"gpu", devices.gpu, "NVIDIA GPU (check CUDA_VISIBLE_DEVICES)"},
      {"cuda", devices.gpu, "NVIDIA GPU (check CUDA_VISIBLE_DEVICES)"},
      {"xpu", devices.xpu, "Intel XPU (/dev/dri render node of i915 or xe)"},
      {"hpu", devices.hpu, "Gaudi HPU (/dev/accel/accelN)"},
      {"npu", devices.npu, "Ascend NPU (/dev/davinciN)"},
  };
  if (text == "cpu") return devices.cpu;
  for (const Named& a : accelerators) {
    if (text != a.word) continue;
    if (a.count == 0) {
      return Status::Invalid("--nproc-per-node=" + text + ": no " + a.what +
                             " found on this host; use a number or 'cpu'");
    }
    return a.count;
  }
  if (text == "auto") {
    for (const Named& a : accelerators) {
      if (a.count > 0) return a.count;
    }
    return devices.cpu;
  }
  int n = 0;
  if (!ParseIndex(text, &n) || n < 1) {
    return Status::Invalid("--nproc-per-node: '" + text +
                           "' is not a positive integer, 'cpu', 'gpu', "
                           "'xpu', 'hpu', 'npu' or 'auto'");
  }
  return n;
}

namespace {

// Entries of `folder` named `prefix` + digits.
int CountNumbered(const std::string& folder, const std::string& prefix) {
  int count = 0;
  if (DIR* dir = opendir(folder.c_str())) {
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      int index = 0;
      if (name.rfind(prefix, 0) == 0 &&
          ParseIndex(name.substr(prefix.size()), &index))
        ++count;
    }
    closedir(dir);
  }
  return count;
}

// Intel GPUs: DRM render nodes whose driver is i915 or xe.
int CountXpus() {
  int count = 0;
  if (DIR* dir = opendir("/sys/class/drm")) {
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      if (name.rfind("renderD", 0) != 0) continue;
      char target[256] = {};
      std::string link = "/sys/class/drm/" + name + "/device/driver";
      ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      std::string driver =
          n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
      driver = driver.substr(driver.rfind('/') + 1);
      if (driver == "i915" || driver == "xe") ++count;
    }
    closedir(dir);
  }
  return count;
}

}  // namespace

DeviceCounts CountDevices(int cpu_count, int gpu_count) {
  DeviceCounts d;
  d.cpu = cpu_count;
  d.gpu = gpu_count;
  d.xpu = CountXpus();
  d.hpu = CountNumbered("/dev/accel", "accel");
  d.npu = CountNumbered("/dev", "davinci");
  return d;
}

int CountGpus(const std::map<std::string, std::string>& environment) {
  // Counting /dev/nvidiaN nodes needs no CUDA library: dtrun links none and
  // must start in milliseconds on machines without drivers. The numeric
  // suffix test skips nvidiactl, nvidia-uvm and nvidia-modeset.
  auto visible = environment.find("CUDA_VISIBLE_DEVICES");
  int devices = 0;
  if (DIR* dir = opendir("/dev")) {
    while (dirent* e = readdir(dir)) {
      std::string name = e->d_name;
      int index = 0;
      if (name.rfind("nvidia", 0) == 0 && ParseIndex(name.substr(6), &index))
        ++devices;
    }
    closedir(dir);
  }
  if (visible == environment.end()) return devices;
  // CUDA_VISIBLE_DEVICES entries (indices or GPU-UUIDs) are counted, not
  // matched: it can only narrow what exists. "-1", the usual "hide every
  // GPU", and an empty value count as none.
  int listed = 0;
  std::stringstream list(visible->second);
  for (std::string item; std::getline(list, item, ',');) {
    if (!item.empty() && item != "-1") ++listed;
  }
  return std::min(listed, devices);
}

}  // namespace dtrun::agent
