// The live status' pure parts (sampler, formats) and the host's registry.
#include "apps/dtrun/job_status.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

WorkerObservation Seen(int pid, int64_t step, double beat, double cpu) {
  WorkerObservation w;
  w.local_rank = 0;
  w.rank = 4;
  w.pid = pid;
  w.state = "running";
  w.step = step;
  w.beat_unix = beat;
  w.cpu_seconds = cpu;
  w.rss_mb = 512;
  return w;
}

TEST(StatusSamplerTest, StepTimeFromTheStepsBetweenTwoObservations) {
  StatusSampler sampler;
  auto first = sampler.Sample({Seen(10, 100, 1000.0, 5.0)}, 1000.5);
  EXPECT_EQ(first[0].step_time_last_s, -1);  // one observation: no interval
  EXPECT_DOUBLE_EQ(first[0].beat_age_s, 0.5);
  // 20 steps in 2 s of beats; 1.5 CPU seconds in 2 s of wall time.
  auto second = sampler.Sample({Seen(10, 120, 1002.0, 6.5)}, 1002.5);
  EXPECT_DOUBLE_EQ(second[0].step_time_last_s, 0.1);
  EXPECT_DOUBLE_EQ(second[0].step_time_median_s, 0.1);
  EXPECT_DOUBLE_EQ(second[0].cpu_pct, 75);
  // No new step: the last step time stands, the beat ages.
  auto third = sampler.Sample({Seen(10, 120, 1002.0, 6.5)}, 1005.0);
  EXPECT_DOUBLE_EQ(third[0].step_time_last_s, 0.1);
  EXPECT_DOUBLE_EQ(third[0].beat_age_s, 3.0);
  auto fourth = sampler.Sample({Seen(10, 121, 1006.0, 7.0)}, 1006.0);
  EXPECT_DOUBLE_EQ(fourth[0].step_time_last_s, 4.0);
  EXPECT_DOUBLE_EQ(fourth[0].step_time_median_s, 4.0);  // of {0.1, 4.0}
}

TEST(StatusSamplerTest, ANewProcessInTheSlotStartsOver) {
  StatusSampler sampler;
  sampler.Sample({Seen(10, 100, 1000.0, 5.0)}, 1000.0);
  sampler.Sample({Seen(10, 110, 1001.0, 6.0)}, 1001.0);
  auto restarted = sampler.Sample({Seen(11, 50, 1002.0, 0.1)}, 1002.0);
  EXPECT_EQ(restarted[0].step_time_last_s, -1);
  EXPECT_EQ(restarted[0].cpu_pct, 0);
}

TEST(StatusSamplerTest, NoBeatNoStepNoAge) {
  StatusSampler sampler;
  auto s = sampler.Sample({Seen(10, -1, 0, 1.0)}, 1000.0);
  EXPECT_EQ(s[0].beat_age_s, -1);
  EXPECT_EQ(s[0].step_time_median_s, -1);
}

TEST(JobStatusFormatTest, OneLinePerRankWithDashesForTheUnknown) {
  StatusSampler sampler;
  NodeFacts facts{"job7", "node3", 1, 2, 3, 5, 900.0};
  auto workers =
      sampler.Sample({Seen(10, 100, 1000.0, 5.0), Seen(11, -1, 0, 0)}, 1001.0);
  nlohmann::json node = NodeStatusJson(facts, workers, 1001.0);
  EXPECT_EQ(node["run_id"], "job7");
  EXPECT_EQ(node["ranks"].size(), 2u);
  EXPECT_EQ(node["ranks"][0]["step"], 100);
  std::string table = FormatJobStatus({node});
  EXPECT_NE(table.find("node 1 of 2 on node3: attempt 3, 3 restart(s)"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("  4     10       running                100       "
                       "1.0s  -/-"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("11       running                -         -"),
            std::string::npos)
      << table;
}

// A job on etcd keeps the cluster's address and the files that secure it
// (never a secret) for `dtrun --status` to reach it again.
TEST(JobRegistryTest, AnEtcdJobKeepsItsClusterAndSettings) {
  auto dir = os::MakeTempDir("registry_test");
  ASSERT_TRUE(dir.ok());
  RegistryEntry me{getpid(),
                   "job8",
                   "/logs/job8_cd",
                   "https://127.0.0.2:2379,127.0.0.3:2379",
                   {{"cacert", "/etc/ca.pem"}, {"user", "u"}},
                   true,
                   1000.0};
  {
    Registration registered(*dir, me);
    auto jobs = ReadRegistry(*dir);
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].store, me.store);
    EXPECT_EQ(jobs[0].store_settings, me.store_settings);
  }
  os::RemoveTree(*dir);
}

TEST(JobRegistryTest, LiveEntriesAreListedAndRemovedWithTheirOwner) {
  auto dir = os::MakeTempDir("registry_test");
  ASSERT_TRUE(dir.ok());
  RegistryEntry me{getpid(), "job7", "/logs/job7_ab", "10.0.0.1:29400",
                   {},       true,   1000.0};
  {
    Registration registered(*dir, me);
    // A dead process' entry (kill -9 left it) is not listed.
    RegistryEntry gone = me;
    gone.pid = 999999;
    ASSERT_TRUE(
        os::WriteFile(*dir + "/999999.json", RegistryJson(gone).dump()).ok());
    auto jobs = ReadRegistry(*dir);
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].run_id, "job7");
    EXPECT_EQ(jobs[0].store, "10.0.0.1:29400");
    EXPECT_TRUE(jobs[0].elastic);
    EXPECT_TRUE(jobs[0].store_settings.empty());
    std::string list = FormatJobList(jobs, 1060.0);
    EXPECT_NE(list.find("job7"), std::string::npos) << list;
    EXPECT_NE(list.find("60s"), std::string::npos) << list;
  }
  EXPECT_TRUE(ReadRegistry(*dir).empty());
  EXPECT_EQ(FormatJobList({}, 0), "no dtrun job runs on this host\n");
  os::RemoveTree(*dir);
}

TEST(JobRegistryTest, UnderTheRuntimeFolderElsePerUserInTmp) {
  EXPECT_EQ(RegistryDir({{"XDG_RUNTIME_DIR", "/run/user/7"}}),
            "/run/user/7/dtrun");
  EXPECT_EQ(RegistryDir({}), "/tmp/dtrun-" + std::to_string(getuid()));
}

}  // namespace
}  // namespace dtrun::agent
