// The job's progress from node status records: the progress line's text and
// the job-wide and store metrics made from it.
#include "apps/dtrun/progress.h"

#include <gtest/gtest.h>

#include "apps/dtrun/metrics.h"

namespace dtrun::agent {
namespace {

nlohmann::json Rank(int rank, const char* state, int64_t step, int64_t total,
                    double step_time, double score) {
  return {{"rank", rank},
          {"state", state},
          {"step", step},
          {"total_steps", total},
          {"step_time_median_s", step_time},
          {"straggler_score", score}};
}

// Two nodes of two ranks: rank 3 lags (step 118, 0.05 s a step, score 0.6),
// rank 1 has exited.
std::vector<nlohmann::json> TwoNodes() {
  return {{{"restarts", 1},
           {"ranks",
            {Rank(0, "running", 120, 1000, 0.04, 1.0),
             Rank(1, "exited", 90, 1000, -1, -1)}}},
          {{"restarts", 1},
           {"ranks",
            {Rank(2, "running", 121, 1000, 0.04, 0.95),
             Rank(3, "running", 118, 1000, 0.05, 0.6)}}}};
}

TEST(ProgressTest, TheJobIsAsFarAndAsFastAsItsSlowestRank) {
  JobProgress p = JobProgressOf(TwoNodes());
  EXPECT_EQ(p.nodes, 2);
  EXPECT_EQ(p.ranks, 4);
  EXPECT_EQ(p.running, 3);
  EXPECT_EQ(p.step, 118);  // the exited rank's 90 does not hold it back
  EXPECT_EQ(p.total_steps, 1000);
  EXPECT_DOUBLE_EQ(p.step_time_s, 0.05);
  EXPECT_DOUBLE_EQ(p.eta_s, (1000 - 118) * 0.05);
  EXPECT_EQ(p.slowest_rank, 3);
  EXPECT_DOUBLE_EQ(p.slowest_score, 0.6);
  EXPECT_EQ(p.restarts, 1);
  EXPECT_EQ(ProgressText(p, 10),
            "step 118/1000 (11%) | 20 steps/s | ETA 44s | 3/4 up | slowest "
            "rank 3 (score 0.60) | 1 restarts");
}

TEST(ProgressTest, UnscoredRanksAreWeighedByStepTime) {
  std::vector<nlohmann::json> node = {{{"ranks",
                                        {Rank(0, "running", 5, 0, 0.2, -1),
                                         Rank(1, "running", 5, 0, 0.3, -1)}}}};
  JobProgress p = JobProgressOf(node);
  EXPECT_EQ(p.slowest_rank, 1);
  EXPECT_LT(p.slowest_score, 0);
  EXPECT_LT(p.eta_s, 0);  // no total: no time left
  EXPECT_EQ(ProgressText(p, 3),
            "step 5 | 3.33 steps/s | 2/2 up | slowest rank 1");
}

TEST(ProgressTest, BeforeAnyBeatTheLineSaysHowLongItHasBeen) {
  std::vector<nlohmann::json> node = {
      {{"ranks", {Rank(0, "running", -1, 0, -1, -1)}}}};
  EXPECT_EQ(ProgressText(JobProgressOf(node), 75),
            "1/1 up, no step yet (1m15s)");
  EXPECT_EQ(ProgressText(JobProgressOf({}), 0), "0/0 up, no step yet (0s)");
}

TEST(ProgressTest, ShortDurations) {
  EXPECT_EQ(ShortDuration(0.4), "0s");
  EXPECT_EQ(ShortDuration(59.6), "1m00s");
  EXPECT_EQ(ShortDuration(3725), "1h02m");
}

TEST(ProgressTest, JobAndStoreMetrics) {
  std::string job = JobMetricsText(JobProgressOf(TwoNodes()), "r1");
  EXPECT_NE(
      job.find(
          "# TYPE dtrun_job_step gauge\ndtrun_job_step{run_id=\"r1\"} 118\n"),
      std::string::npos)
      << job;
  EXPECT_NE(job.find("dtrun_job_slowest_rank{run_id=\"r1\"} 3\n"),
            std::string::npos);
  EXPECT_NE(job.find("dtrun_job_eta_seconds{run_id=\"r1\"} 44.1\n"),
            std::string::npos);
  std::string stores = StoreMetricsText(
      {{"rendezvous", 3, 10, 500}, {"workers", 5, 7, 90}}, 2, "r1");
  EXPECT_NE(stores.find("dtrun_rendezvous_round{run_id=\"r1\"} 2\n"),
            std::string::npos);
  EXPECT_NE(
      stores.find(
          "# TYPE dtrun_store_requests_total counter\n"
          "dtrun_store_requests_total{run_id=\"r1\",store=\"rendezvous\"} 500\n"
          "dtrun_store_requests_total{run_id=\"r1\",store=\"workers\"} 90\n"),
      std::string::npos)
      << stores;
  // One node without a rendezvous: the round is -1 and no store family
  // is empty.
  EXPECT_EQ(StoreMetricsText({}, -1, "r1").find("dtrun_store_"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrun::agent
