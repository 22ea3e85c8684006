// The Prometheus text of a node's status record.
#include "apps/dtrun/metrics.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

nlohmann::json Node() {
  return {{"run_id", "job\"7"},
          {"host", "node3"},
          {"ranks",
           {{{"rank", 4},
             {"local_rank", 0},
             {"state", "running"},
             {"step", 120},
             {"beat_age_s", 0.5},
             {"step_time_median_s", 0.01},
             {"compute_typical_s", 0.008},
             {"straggler_score", 1.0},
             {"rss_mb", 2.0},
             {"cpu_pct", 50.0},
             {"cpu_seconds", 1234567890123.0}},
            {{"rank", 5},
             {"local_rank", 1},
             {"state", "exited"},
             {"step", -1},
             {"beat_age_s", -1.0},
             {"rss_mb", 0.0},
             {"cpu_pct", 0.0}}}}};
}

TEST(MetricsTextTest, OneSamplePerKnownValueWithItsLabels) {
  JobCounts counts;
  counts.restarts = 2;
  counts.hangs = 1;
  counts.recovery_seconds = {0.8, 3.5};
  std::string text = MetricsText(Node(), counts);
  const std::string labels =
      "{run_id=\"job\\\"7\",host=\"node3\",rank=\"4\",local_rank=\"0\"}";
  EXPECT_NE(text.find("dtrun_worker_step" + labels + " 120\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("dtrun_worker_up" + labels + " 1\n"), std::string::npos);
  EXPECT_NE(text.find("dtrun_worker_resident_bytes" + labels + " 2097152\n"),
            std::string::npos);
  // CPU as a counter of seconds, exact past 10^9 (no precomputed rate).
  EXPECT_NE(text.find("# TYPE dtrun_worker_cpu_seconds_total counter\n"),
            std::string::npos);
  EXPECT_NE(
      text.find("dtrun_worker_cpu_seconds_total" + labels + " 1234567890123\n"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("cpu_ratio"), std::string::npos);
  EXPECT_NE(text.find("dtrun_build_info{version=\""), std::string::npos);
  // Each recovery's seconds in a histogram.
  EXPECT_NE(text.find("# TYPE dtrun_recovery_seconds histogram\n"),
            std::string::npos);
  EXPECT_NE(text.find("dtrun_recovery_seconds_bucket{run_id=\"job\\\"7\","
                      "le=\"1\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("dtrun_recovery_seconds_count{run_id=\"job\\\"7\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("dtrun_restarts_total{run_id=\"job\\\"7\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE dtrun_hangs_total counter\n"), std::string::npos);
  // Rank 5 exited and never beat: up 0, and no step or beat-age sample.
  EXPECT_NE(text.find("dtrun_worker_up{run_id=\"job\\\"7\",host=\"node3\","
                      "rank=\"5\",local_rank=\"1\"} 0\n"),
            std::string::npos);
  EXPECT_EQ(text.find("dtrun_worker_step{run_id=\"job\\\"7\",host=\"node3\","
                      "rank=\"5\""),
            std::string::npos);
}

// Values not known yet have no sample, never a stand-in -1 or 0.
TEST(MetricsTextTest, UnknownJobValuesHaveNoSample) {
  JobProgress p;
  p.nodes = 1;
  p.step_time_s = -1;
  p.eta_s = -1;
  p.slowest_rank = -1;
  p.total_steps = 0;
  std::string text = JobMetricsText(p, "r");
  for (const char* name :
       {"dtrun_job_eta_seconds", "dtrun_job_step_seconds",
        "dtrun_job_slowest_rank", "dtrun_job_steps_planned"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " gauge\n"),
              std::string::npos);
    EXPECT_EQ(text.find(std::string(name) + "{"), std::string::npos) << name;
  }
  p.eta_s = 12.5;
  EXPECT_NE(
      JobMetricsText(p, "r").find("dtrun_job_eta_seconds{run_id=\"r\"} 12.5\n"),
      std::string::npos);
  EXPECT_EQ(StoreMetricsText({}, -1, "r").find("dtrun_rendezvous_round{"),
            std::string::npos);
}

// A proxied node says how many workers its proxy carries and how its
// frames went up (batched: fewer writes than frames).
TEST(MetricsTest, AProxiedNodeCountsItsProxy) {
  std::string text = ProxyMetricsText({8, 24, 5, false}, "r");
  EXPECT_NE(text.find("dtrun_store_proxy_workers{run_id=\"r\"} 8\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE dtrun_store_proxy_frames_total counter\n"
                      "dtrun_store_proxy_frames_total{run_id=\"r\"} 24\n"),
            std::string::npos);
  EXPECT_NE(text.find("dtrun_store_proxy_writes_total{run_id=\"r\"} 5\n"),
            std::string::npos);
  EXPECT_NE(text.find("dtrun_store_proxy_up{run_id=\"r\"} 1\n"),
            std::string::npos);
  EXPECT_NE(ProxyMetricsText({0, 0, 0, true}, "r")
                .find("dtrun_store_proxy_up{run_id=\"r\"} 0\n"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrun::agent
