#include "apps/dtrun/cpu_quota.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>
#include <vector>

#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

// CPUs a quota of `quota` per `period` allows (rounded up: 1.5 CPUs can keep
// two workers busy half the time); 0 for none.
int FromQuota(double quota, double period) {
  if (quota <= 0 || period <= 0) return 0;
  return std::max(1, static_cast<int>(std::ceil(quota / period - 1e-9)));
}

// cgroup v2's cpu.max: "max 100000" (none) or "400000 100000".
int FromCpuMax(const std::string& text) {
  std::istringstream in(text);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max") return 0;
  char* end = nullptr;
  double q = std::strtod(quota.c_str(), &end);
  return end == quota.c_str() ? 0 : FromQuota(q, period);
}

// v1's pair of files; a quota of -1 is none.
int FromCfs(const std::string& quota, const std::string& period) {
  if (quota.empty() || period.empty()) return 0;
  return FromQuota(std::strtod(quota.c_str(), nullptr),
                   std::strtod(period.c_str(), nullptr));
}

// `path` and its ancestors up to the mount's root: "/a/b" -> "/a/b", "/a", "".
std::vector<std::string> SelfAndAncestors(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path != "/") {
    out.push_back(path);
    path = path.substr(0, path.find_last_of('/'));
  }
  out.push_back("");
  return out;
}

int Smaller(int a, int b) { return a == 0 ? b : b == 0 ? a : std::min(a, b); }

}  // namespace

// Each line of /proc/self/cgroup is "ID:CONTROLLERS:PATH"; v2's is "0::PATH",
// v1's cpu controller sits at /sys/fs/cgroup/<its controllers> (cpu,cpuacct
// on most hosts) or /sys/fs/cgroup/cpu. Inside a container with its own
// cgroup namespace PATH is "/", the container's own cgroup.
int CgroupCpuLimit(const std::string& proc_self_cgroup,
                   const std::string& sysfs_cgroup,
                   const std::function<std::string(const std::string&)>& read) {
  int limit = 0;
  std::istringstream lines(proc_self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (controllers.empty()) {
      for (const std::string& p : SelfAndAncestors(path))
        limit = Smaller(limit, FromCpuMax(read(sysfs_cgroup + p + "/cpu.max")));
      continue;
    }
    std::string list = "," + controllers + ",";
    if (list.find(",cpu,") == std::string::npos) continue;
    for (const std::string& mount : {controllers, std::string("cpu")}) {
      for (const std::string& p : SelfAndAncestors(path)) {
        const std::string dir = sysfs_cgroup + "/" + mount + p;
        limit = Smaller(limit, FromCfs(read(dir + "/cpu.cfs_quota_us"),
                                       read(dir + "/cpu.cfs_period_us")));
      }
    }
  }
  return limit;
}

int UsableCpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0)
    cpus = Smaller(cpus, CPU_COUNT(&mask));
  cpus = Smaller(cpus, CgroupCpuLimit(os::ReadFileOrEmpty("/proc/self/cgroup"),
                                      "/sys/fs/cgroup", os::ReadFileOrEmpty));
  return std::max(1, cpus);
}

}  // namespace dtrun::agent
