// report.html: the page's content from samples and events.
#include "apps/dtrun/run_report.h"

#include <gtest/gtest.h>

namespace dtrun::agent {
namespace {

TEST(RunReportTest, OneLinePerRankEventsMarkedStragglerNamed) {
  std::vector<ReportSample> samples;
  for (int t = 0; t < 10; ++t) {
    samples.push_back({1000.0 + t, 0, t * 10, 0.010});
    samples.push_back({1000.0 + t, 1, t * 10, 0.015});
  }
  std::vector<ReportEvent> events = {
      {1002, "straggler", "rank 1, score 0.67", 1},
      {1005, "attempt", "attempt 0 ended: failed: rank 0 exit code 1", -1},
      {1009, "end", "the job <succeeded>", -1}};
  std::string html = RunReportHtml("job7", samples, events);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  size_t lines = 0;
  for (size_t at = html.find("<polyline"); at != std::string::npos;
       at = html.find("<polyline", at + 1))
    ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(html.find("stroke-width=\"4\" points"), std::string::npos);
  EXPECT_NE(html.find("straggler: rank 1"), std::string::npos);
  EXPECT_NE(html.find("attempt 0 ended"), std::string::npos);
  EXPECT_NE(html.find("the job &lt;succeeded&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<succeeded>"), std::string::npos);  // escaped
}

TEST(RunReportTest, AnEmptyRunStillMakesAPage) {
  std::string html = RunReportHtml("job7", {}, {});
  EXPECT_NE(html.find("</svg>"), std::string::npos);
  EXPECT_EQ(html.find("<polyline"), std::string::npos);
}

TEST(RunReportTest, ThinningKeepsEachRankBoundedAndTheNewestWhole) {
  std::vector<ReportSample> samples;
  for (int t = 0; t < 100; ++t) {
    samples.push_back({double(t), 0, t, 0.01});
    samples.push_back({double(t), 1, t, 0.01});
  }
  Thin(&samples, 60);
  size_t rank0 = 0;
  for (const auto& s : samples) rank0 += s.rank == 0;
  EXPECT_EQ(rank0, 75u);  // half of the older 50 dropped
  EXPECT_EQ(samples.back().t, 99);
  Thin(&samples, 1000);  // under the bound: nothing dropped
  EXPECT_EQ(samples.size(), 150u);
}

}  // namespace
}  // namespace dtrun::agent
