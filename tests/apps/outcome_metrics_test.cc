#include "apps/dtrun/outcome_metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace dtrun::agent {
namespace {

RunOutcome Outcome(bool succeeded, int restarts) {
  RunOutcome o;
  o.run_id = "job\"1";
  o.succeeded = succeeded;
  o.restarts = restarts;
  o.start = 1000.5;
  o.end = 1012.25;
  return o;
}

TEST(OutcomeMetricsTest, EverySeriesFromTheFirstRunAndTheRunCounted) {
  const std::string text = OutcomeTextfile(Outcome(true, 0), "");
  EXPECT_NE(text.find("# TYPE dtrun_runs_total counter\n"), std::string::npos);
  EXPECT_NE(
      text.find(
          "dtrun_runs_total{outcome=\"success\",retries=\"no_retries\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find(
          "dtrun_runs_total{outcome=\"failure\",retries=\"with_retries\"} 0\n"),
      std::string::npos);
  EXPECT_NE(text.find("dtrun_last_run_success{run_id=\"job\\\"1\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("dtrun_last_run_end_timestamp_seconds{run_id="
                      "\"job\\\"1\"} 1012.250\n"),
            std::string::npos);
}

TEST(OutcomeMetricsTest, CountsCarryOnFromThePreviousTextAndGarbageIsDropped) {
  std::string text = OutcomeTextfile(Outcome(true, 0), "");
  text = OutcomeTextfile(Outcome(false, 2),
                         text + "dtrun_runs_total{oops 9\nnot a metric\n");
  text = OutcomeTextfile(Outcome(false, 1), text);
  EXPECT_NE(
      text.find(
          "dtrun_runs_total{outcome=\"success\",retries=\"no_retries\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find(
          "dtrun_runs_total{outcome=\"failure\",retries=\"with_retries\"} 2\n"),
      std::string::npos);
  EXPECT_EQ(text.find("oops"), std::string::npos);
  EXPECT_NE(text.find("dtrun_last_run_restarts{run_id=\"job\\\"1\"} 1\n"),
            std::string::npos);
}

TEST(OutcomeMetricsTest, TheEventSaysTorchrunsOutcome) {
  auto j = nlohmann::json::parse(RunOutcomeEventJson(Outcome(false, 3)));
  EXPECT_EQ(j["name"], "dtrun.run");
  EXPECT_EQ(j["source"], "AGENT");
  EXPECT_EQ(j["metadata"]["outcome"], "failure");
  EXPECT_EQ(j["metadata"]["retries"], "with_retries");
  EXPECT_EQ(j["metadata"]["restarts"], 3);
  EXPECT_DOUBLE_EQ(j["metadata"]["duration"].get<double>(), 11.75);
}

}  // namespace
}  // namespace dtrun::agent
