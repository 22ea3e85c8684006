#include "apps/dtrun/cli.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace dtrun::agent {
namespace {

CliResult Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dtrun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(CliTest, AcceptsDashAndUnderscoreSpellings) {
  auto a = Parse({"--nproc-per-node=3", "--max_restarts", "2", "true"});
  ASSERT_EQ(a.exit_code, -1);
  EXPECT_EQ(a.config.nproc_per_node, 3);
  EXPECT_EQ(a.config.max_restarts, 2);
  auto b = Parse({"--nproc_per_node", "2", "--max-restarts=1", "true"});
  ASSERT_EQ(b.exit_code, -1);
  EXPECT_EQ(b.config.nproc_per_node, 2);
}

TEST(CliTest, EverythingAfterTheProgramIsItsOwn) {
  auto a = Parse(
      {"--nproc-per-node=2", "true", "--nproc-per-node=9", "--lr", "0.1"});
  ASSERT_EQ(a.exit_code, -1);
  EXPECT_EQ(a.config.nproc_per_node, 2);
  EXPECT_EQ(a.config.worker_argv.size(), 4u);
  EXPECT_EQ(a.config.worker_argv[1], "--nproc-per-node=9");
}

TEST(CliTest, PythonScriptsRunUnbufferedThroughPython) {
  auto a = Parse({"--python", "sh", "CMakeLists.txt.py"});
  EXPECT_EQ(a.exit_code, 2);  // not found
  auto m = Parse({"--python", "sh", "-m", "pkg.train", "x"});
  ASSERT_EQ(m.exit_code, -1);
  EXPECT_EQ(m.config.worker_argv[1], "-u");
  EXPECT_EQ(m.config.worker_argv[2], "-m");
  EXPECT_EQ(m.config.worker_argv[3], "pkg.train");
}

TEST(CliTest, BadValuesExitTwo) {
  EXPECT_EQ(Parse({"--nproc-per-node=zero", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--nnodes=3:2", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--redirects=7", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--max-restarts=-1", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--master-port=70000", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"--bogus-flag", "true"}).exit_code, 2);
  EXPECT_EQ(
      Parse({"--nproc-per-node=2", "--local-ranks-filter=5", "true"}).exit_code,
      2);
  EXPECT_EQ(Parse({"--no-python", "-m", "true"}).exit_code, 2);
  EXPECT_EQ(Parse({"no-such-program-anywhere"}).exit_code, 2);
  EXPECT_EQ(Parse({}).exit_code, 2);
}

TEST(CliTest, HelpExitsZero) { EXPECT_EQ(Parse({"--help"}).exit_code, 0); }

TEST(CliTest, PetEnvironmentFillsUnsetFlags) {
  setenv("PET_NPROC_PER_NODE", "4", 1);
  auto a = Parse({"true"});
  auto b = Parse({"--nproc-per-node=2", "true"});
  unsetenv("PET_NPROC_PER_NODE");
  EXPECT_EQ(a.config.nproc_per_node, 4);
  EXPECT_EQ(b.config.nproc_per_node, 2);
}

TEST(CliTest, StreamSpecsAndRendezvousSettingsParse) {
  auto a = Parse({"-r", "3", "-t", "0:1,1:2", "--rdzv-conf",
                  "join_timeout=5,is_host=1", "--nnodes", "1:4",
                  "--local-ranks-filter", "0", "true"});
  ASSERT_EQ(a.exit_code, -1);
  EXPECT_EQ(a.config.redirects.For(7), 3);
  EXPECT_EQ(a.config.tee.For(1), 2);
  EXPECT_EQ(a.config.tee.For(2), 0);
  EXPECT_EQ(a.config.rdzv_conf.join_timeout, std::chrono::milliseconds(5000));
  EXPECT_EQ(a.config.rdzv_conf.is_host, std::optional<bool>(true));
  EXPECT_EQ(a.config.min_nodes, 1);
  EXPECT_EQ(a.config.max_nodes, 4);
}

TEST(CliTest, BadRendezvousSettingsExitTwoNamingTheKey) {
  ::testing::internal::CaptureStderr();
  auto bad = Parse({"--rdzv-conf", "join_timeout=abc", "true"});
  auto typo = Parse({"--rdzv-conf", "join_timout=60", "true"});
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(err.find("join_timeout='abc' is not a number of seconds"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("unknown key 'join_timout'"), std::string::npos) << err;
}

TEST(CliTest, AnInteractiveSessionUnderSrunHasItsConsoleOnNodeZeroOnly) {
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_NNODES", "2", 1);
  setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
  setenv("SLURM_NODEID", "1", 1);
  auto node1 = Parse({"--interactive", "--nproc-per-node=2"});
  setenv("SLURM_NODEID", "0", 1);
  auto node0 = Parse({"--interactive", "--nproc-per-node=2"});
  for (const char* v :
       {"SLURM_JOB_ID", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODEID"}) {
    unsetenv(v);
  }
  ASSERT_EQ(node1.exit_code, -1);
  ASSERT_EQ(node0.exit_code, -1);
  EXPECT_TRUE(node1.config.no_console);
  EXPECT_FALSE(node0.config.no_console);
  EXPECT_EQ(node1.config.node_rank, 1);
  EXPECT_EQ(node0.config.master_addr, "n1");
}

TEST(NprocTest, NamedCountsResolve) {
  EXPECT_EQ(*ParseNprocPerNode("cpu", 8, 0), 8);
  EXPECT_EQ(*ParseNprocPerNode("auto", 8, 0), 8);
  EXPECT_EQ(*ParseNprocPerNode("auto", 8, 2), 2);
  EXPECT_EQ(*ParseNprocPerNode("gpu", 8, 2), 2);
  EXPECT_FALSE(ParseNprocPerNode("gpu", 8, 0).ok());
  EXPECT_FALSE(ParseNprocPerNode("0", 8, 0).ok());
}

}  // namespace
}  // namespace dtrun::agent
