#pragma once

// How many CPUs this process may really use: what `--nproc-per-node=cpu`
// (and `auto` without an accelerator) counts. A Kubernetes pod with a 4-CPU
// limit on a 128-core node sees 128 cores, and torchrun starts 128 workers
// there; the limit is the container's cgroup CPU quota (cgroup v2:
// `cpu.max`; v1: `cpu.cfs_quota_us` / `cpu.cfs_period_us`), and a CPU set
// (`taskset`, a cpuset) shows in the affinity mask.

#include <functional>
#include <string>

namespace dtrun::agent {

// The CPU quota of the cgroup that `proc_self_cgroup` (the text of
// /proc/self/cgroup) names, and of each of its ancestors, the smallest one
// rounded up to whole CPUs; 0 when none is set. `read` gives a file's text
// ("" when there is none), under `sysfs_cgroup` (/sys/fs/cgroup). Pure.
int CgroupCpuLimit(const std::string& proc_self_cgroup,
                   const std::string& sysfs_cgroup,
                   const std::function<std::string(const std::string&)>& read);

// min(the host's CPUs, the affinity mask, the cgroup's quota), at least 1.
int UsableCpus();

}  // namespace dtrun::agent
