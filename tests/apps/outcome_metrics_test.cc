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

// The sample line of dtrun_runs_total{outcome, retries} with count n.
std::string Runs(const char* outcome, const char* retries, int n) {
  return std::string("dtrun_runs_total{outcome=\"") + outcome +
         "\",retries=\"" + retries + "\"} " + std::to_string(n) + "\n";
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(OutcomeMetricsTest, EverySeriesFromTheFirstRunAndTheRunCounted) {
  const std::string text = OutcomeTextfile(Outcome(true, 0), "");
  EXPECT_TRUE(Has(text, "# TYPE dtrun_runs_total counter\n"));
  EXPECT_TRUE(Has(text, Runs("success", "no_retries", 1))) << text;
  EXPECT_TRUE(Has(text, Runs("failure", "with_retries", 0))) << text;
  EXPECT_TRUE(Has(text, "dtrun_last_run_success{run_id=\"job\\\"1\"} 1\n"));
  EXPECT_TRUE(Has(text,
                  "dtrun_last_run_end_timestamp_seconds{run_id=\"job\\\"1\"} "
                  "1012.250\n"));
}

TEST(OutcomeMetricsTest, CountsCarryOnFromThePreviousTextAndGarbageIsDropped) {
  std::string text = OutcomeTextfile(Outcome(true, 0), "");
  text = OutcomeTextfile(Outcome(false, 2),
                         text + "dtrun_runs_total{oops 9\nnot a metric\n");
  text = OutcomeTextfile(Outcome(false, 1), text);
  EXPECT_TRUE(Has(text, Runs("success", "no_retries", 1))) << text;
  EXPECT_TRUE(Has(text, Runs("failure", "with_retries", 2))) << text;
  EXPECT_FALSE(Has(text, "oops"));
  EXPECT_TRUE(Has(text, "dtrun_last_run_restarts{run_id=\"job\\\"1\"} 1\n"));
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
