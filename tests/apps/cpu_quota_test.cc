// The CPUs a container's cgroup allows, from /proc/self/cgroup and the
// cgroup files (given as a map: pure); UsableCpus on this host.
#include "apps/dtrun/cpu_quota.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

namespace dtrun::agent {
namespace {

int Limit(const std::string& self,
          const std::map<std::string, std::string>& files) {
  return CgroupCpuLimit(self, "/sys/fs/cgroup", [&](const std::string& p) {
    auto it = files.find(p);
    return it == files.end() ? std::string() : it->second;
  });
}

TEST(CpuQuotaTest, CgroupV2CpuMax) {
  // A pod's container, its own cgroup namespace: the path is "/".
  EXPECT_EQ(Limit("0::/\n", {{"/sys/fs/cgroup/cpu.max", "400000 100000\n"}}),
            4);
  EXPECT_EQ(Limit("0::/\n", {{"/sys/fs/cgroup/cpu.max", "max 100000\n"}}), 0);
  EXPECT_EQ(Limit("0::/\n", {{"/sys/fs/cgroup/cpu.max", "150000 100000\n"}}),
            2);
  EXPECT_EQ(Limit("0::/\n", {{"/sys/fs/cgroup/cpu.max", "50000 100000\n"}}), 1);
  EXPECT_EQ(Limit("0::/\n", {}), 0);  // no file: no limit
}

TEST(CpuQuotaTest, TheSmallestOfTheCgroupAndItsAncestors) {
  EXPECT_EQ(Limit("0::/kubepods/pod1/c1\n",
                  {{"/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000"},
                   {"/sys/fs/cgroup/kubepods/pod1/cpu.max", "300000 100000"},
                   {"/sys/fs/cgroup/kubepods/cpu.max", "800000 100000"}}),
            3);
}

TEST(CpuQuotaTest, CgroupV1CfsQuota) {
  const std::string self =
      "4:memory:/x\n2:cpu,cpuacct:/job\n1:cpuset:/\n0::/\n";
  EXPECT_EQ(
      Limit(self,
            {{"/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us", "200000\n"},
             {"/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us", "100000\n"}}),
      2);
  // The controller mounted on its own, as on this project's machines.
  EXPECT_EQ(Limit("1:cpu:/job\n",
                  {{"/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us", "100000"},
                   {"/sys/fs/cgroup/cpu/job/cpu.cfs_period_us", "100000"}}),
            1);
  EXPECT_EQ(
      Limit("1:cpu:/\n", {{"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1"},
                          {"/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000"}}),
      0);
  // cpuacct alone is not the cpu controller.
  EXPECT_EQ(Limit("2:cpuacct:/job\n",
                  {{"/sys/fs/cgroup/cpuacct/job/cpu.cfs_quota_us", "100000"},
                   {"/sys/fs/cgroup/cpuacct/job/cpu.cfs_period_us", "100000"}}),
            0);
}

TEST(CpuQuotaTest, MalformedTextIsNoLimit) {
  EXPECT_EQ(Limit("garbage\n::\n0::/\n", {{"/sys/fs/cgroup/cpu.max", "x y"}}),
            0);
  EXPECT_EQ(Limit("0::/\n", {{"/sys/fs/cgroup/cpu.max", "0 100000"}}), 0);
}

TEST(CpuQuotaTest, UsableCpusIsWithinTheHost) {
  int n = UsableCpus();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace dtrun::agent
