#include "apps/dtrun/slurm_env.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "apps/dtrun/cli.h"

namespace dtrun::agent {
namespace {

std::vector<std::string> Expand(const std::string& list) {
  std::vector<std::string> out;
  EXPECT_TRUE(ExpandNodelist(list, &out)) << list;
  return out;
}

TEST(SlurmEnvTest, ExpandsNodeLists) {
  EXPECT_EQ(Expand("node1"), std::vector<std::string>{"node1"});
  EXPECT_EQ(Expand("n[1-3]"), (std::vector<std::string>{"n1", "n2", "n3"}));
  EXPECT_EQ(
      Expand("gpu[07-09,11],cpu5"),
      (std::vector<std::string>{"gpu07", "gpu08", "gpu09", "gpu11", "cpu5"}));
  EXPECT_EQ(Expand("a[1-2]-ib,b"),
            (std::vector<std::string>{"a1-ib", "a2-ib", "b"}));
  std::vector<std::string> out;
  EXPECT_FALSE(ExpandNodelist("n[3-1]", &out));
  EXPECT_FALSE(ExpandNodelist("n[1-2", &out));
  EXPECT_FALSE(ExpandNodelist("n[x]", &out));
  EXPECT_FALSE(ExpandNodelist("", &out));
}

TEST(SlurmEnvTest, ReadsTheJob) {
  std::string error;
  auto job = ReadSlurmJob({{"SLURM_JOB_ID", "4242"},
                           {"SLURM_NNODES", "2"},
                           {"SLURM_NODEID", "1"},
                           {"SLURM_JOB_NODELIST", "h[0-1]"},
                           {"SLURM_GPUS_ON_NODE", "4"},
                           {"SLURM_CPUS_ON_NODE", "16"}},
                          &error);
  ASSERT_TRUE(job.has_value()) << error;
  EXPECT_EQ(job->nnodes, 2);
  EXPECT_EQ(job->node_id, 1);
  EXPECT_EQ(job->master_addr(), "h0");
  EXPECT_EQ(job->master_port(), 20000 + 4242);
  EXPECT_EQ(job->gpus_on_node, 4);
  EXPECT_FALSE(ReadSlurmJob({{"PATH", "/bin"}}, &error).has_value());
  EXPECT_FALSE(ReadSlurmJob(
      {{"SLURM_JOB_ID", "1"}, {"DTRUN_IGNORE_SLURM", "1"}}, &error));
}

TEST(SlurmEnvTest, BadNodeListIsAnError) {
  std::string error;
  EXPECT_FALSE(ReadSlurmJob(
      {{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "n[1-"}}, &error));
  EXPECT_NE(error.find("SLURM_JOB_NODELIST"), std::string::npos);
}

// The command line under SLURM: the job's values fill what flags leave out.
class SlurmCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_NNODES", "3", 1);
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURM_JOB_NODELIST", "c[10-12]", 1);
    setenv("SLURM_CPUS_ON_NODE", "6", 1);
  }
  void TearDown() override {
    for (const char* k : {"SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID",
                          "SLURM_JOB_NODELIST", "SLURM_CPUS_ON_NODE"}) {
      unsetenv(k);
    }
  }
  CliResult Parse(std::vector<const char*> args) {
    args.insert(args.begin(), "dtrun");
    return ParseCommandLine(static_cast<int>(args.size()), args.data());
  }
};

TEST_F(SlurmCliTest, FillsNodesRankHostPortAndId) {
  auto r = Parse({"true"});
  ASSERT_EQ(r.exit_code, std::nullopt);
  EXPECT_EQ(r.config.max_nodes, 3);
  EXPECT_EQ(r.config.node_rank, 2);
  EXPECT_EQ(r.config.master_addr, "c10");
  EXPECT_EQ(*r.config.master_port, 20077);
  EXPECT_EQ(r.config.rdzv_id, "77");
}

TEST_F(SlurmCliTest, FlagsWinAndCpuCountsComeFromSlurm) {
  auto r = Parse({"--nnodes=1", "--node-rank=0", "--master-addr=x",
                  "--nproc-per-node=cpu", "true"});
  ASSERT_EQ(r.exit_code, std::nullopt);
  EXPECT_EQ(r.config.max_nodes, 1);
  EXPECT_EQ(r.config.master_addr, "x");
  EXPECT_EQ(r.config.nproc_per_node, 6);
}

}  // namespace
}  // namespace dtrun::agent
