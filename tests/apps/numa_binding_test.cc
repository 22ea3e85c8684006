#include "apps/dtrun/numa_binding.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace dtrun::agent {
namespace {

using Cpus = std::vector<int>;

// hwloc's own synthetic machines: the same loader dtrun uses at start.
Topology Synthetic(const char* description) {
  setenv("HWLOC_SYNTHETIC", description, 1);
  auto t = LoadTopology();
  unsetenv("HWLOC_SYNTHETIC");
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.status().message());
  return t.ok() ? *t : Topology{};
}

// 2 packages x 2 NUMA nodes x 2 L3 x 2 cores x 2 PUs: 32 CPUs, 8 a node.
constexpr char kTwoSockets[] = "pack:2 numa:2 l3:2 core:2 pu:2";

TEST(NumaTopologyTest, HwlocSyntheticMachinesLoad) {
  Topology t = Synthetic(kTwoSockets);
  ASSERT_EQ(t.numa.size(), 4u);
  EXPECT_EQ(t.numa[1].cpus, (Cpus{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(t.numa[1].socket_cpus.size(), 16u);
  EXPECT_EQ(t.numa[1].socket_cpus.front(), 0);
  EXPECT_EQ(t.numa[2].socket_cpus.front(), 16);
  EXPECT_EQ(t.numa[1].cores.size(), 4u);
  EXPECT_EQ(t.numa[1].complexes.size(), 2u);
  EXPECT_TRUE(t.gpu_numa.empty());
}

TEST(NumaPlanTest, CpuJobsSpreadOverNodesInBlocks) {
  Topology t = Synthetic(kTwoSockets);
  auto node = PlanBinding("node", t, 4, {});
  ASSERT_TRUE(node.ok());
  EXPECT_EQ((*node)[0].front(), 0);
  EXPECT_EQ((*node)[1].front(), 8);
  EXPECT_EQ((*node)[3].front(), 24);
  auto eight = PlanBinding("node", t, 8, {});
  ASSERT_TRUE(eight.ok());
  EXPECT_EQ((*eight)[0], (*eight)[1]);  // two workers a node
  auto socket = PlanBinding("socket", t, 4, {});
  ASSERT_TRUE(socket.ok());
  EXPECT_EQ((*socket)[1].size(), 16u);
  EXPECT_EQ((*socket)[2].front(), 16);
}

TEST(NumaPlanTest, ExclusiveSharesTheNodesCoresWithoutOverlap) {
  Topology t = Synthetic(kTwoSockets);
  auto plan = PlanBinding("exclusive", t, 8, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)[0], (Cpus{0, 1, 2, 3}));
  EXPECT_EQ((*plan)[1], (Cpus{4, 5, 6, 7}));
  EXPECT_EQ((*plan)[7], (Cpus{28, 29, 30, 31}));
  auto crowded = PlanBinding("exclusive", t, 32, {});
  ASSERT_FALSE(crowded.ok());
  EXPECT_NE(crowded.status().message().find("has 4 cores"), std::string::npos);
}

TEST(NumaPlanTest, CoreComplexGivesEachWorkerAnL3Domain) {
  Topology t = Synthetic(kTwoSockets);
  auto plan = PlanBinding("core-complex", t, 8, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)[0], (Cpus{0, 1, 2, 3}));
  EXPECT_EQ((*plan)[1], (Cpus{4, 5, 6, 7}));
}

TEST(NumaPlanTest, GpuJobsFollowTheirGpusNode) {
  Topology t = Synthetic(kTwoSockets);
  t.gpu_numa = {3, 3, 0, 0};  // GPUs 0-1 hang off node 3, 2-3 off node 0
  auto plan = PlanBinding("node", t, 2, GpuOfLocalRanks("2,1", 4, 2));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)[0].front(), 0);   // GPU 2: node 0
  EXPECT_EQ((*plan)[1].front(), 24);  // GPU 1: node 3
}

// A hwloc XML export of a 2-package machine with two NVIDIA GPUs, GPU 0
// (bus 18) on package 1 and GPU 1 (bus af) on package 0.
TEST(NumaTopologyTest, GpusAreFoundInAnXmlTopologyWithTheirNode) {
  setenv("HWLOC_XMLFILE", DTRUN_TEST_FIXTURES "/two_gpu_topology.xml", 1);
  auto t = LoadTopology();
  unsetenv("HWLOC_XMLFILE");
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->numa.size(), 2u);
  EXPECT_EQ(t->gpu_numa, (std::vector<int>{1, 0}));
  // Two workers, one per GPU: each on its GPU's package.
  auto plan = PlanBinding("node", *t, 2, GpuOfLocalRanks("", 2, 2));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)[0], (Cpus{4, 5, 6, 7}));
  EXPECT_EQ((*plan)[1], (Cpus{0, 1, 2, 3}));
  // CUDA_VISIBLE_DEVICES=1 for one worker: GPU 1's node.
  auto one = PlanBinding("exclusive", *t, 1, GpuOfLocalRanks("1", 2, 1));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0], (Cpus{0, 1, 2, 3}));
}

TEST(NumaPlanTest, GpusOfLocalRanks) {
  EXPECT_EQ(GpuOfLocalRanks("", 4, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(GpuOfLocalRanks("3,1", 4, 2), (std::vector<int>{3, 1}));
  EXPECT_TRUE(GpuOfLocalRanks("", 1, 2).empty());  // a CPU job
  EXPECT_TRUE(GpuOfLocalRanks("GPU-aa,GPU-bb", 2, 2).empty());
}

TEST(NumaPlanTest, CpuListText) {
  EXPECT_EQ(CpuListText({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(CpuListText({}), "");
}

}  // namespace
}  // namespace dtrun::agent
