// What the job-wide view costs the node that gathers it (group rank 0),
// once a second, as the job grows: N ranks' status records (nodes of 8, as
// the store hands them over) parsed, scored as one job, summed up into the
// progress line and the dtrun_job_* metrics; and one node's own metrics
// text. The store's MULTI_GET of the records is measured apart, by
// `dtrun --status HOST:PORT` (status_bench.py).
// Usage: status_cost_bench [REPEAT]; prints one table row per size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/dtrun/job_status.h"
#include "apps/dtrun/metrics.h"
#include "apps/dtrun/progress.h"

namespace {

using dtrun::agent::JobProgress;

// One node's record as agents publish it: 8 ranks, every field set.
std::string NodeRecord(int group_rank, int nodes) {
  nlohmann::json ranks = nlohmann::json::array();
  for (int lr = 0; lr < 8; ++lr) {
    ranks.push_back({{"rank", group_rank * 8 + lr},
                     {"local_rank", lr},
                     {"pid", 1000 + lr},
                     {"state", "running"},
                     {"step", 1234},
                     {"total_steps", 100000},
                     {"beat_age_s", 0.1},
                     {"step_time_last_s", 0.01},
                     {"step_time_median_s", 0.01 + 0.0001 * lr},
                     {"rss_mb", 1024.0},
                     {"cpu_pct", 99.0},
                     {"compute_typical_s", 0.008 + 0.0001 * lr},
                     {"straggler_score", 1.0}});
  }
  return nlohmann::json{{"run_id", "bench"},
                        {"host", "node" + std::to_string(group_rank)},
                        {"group_rank", group_rank},
                        {"group_world_size", nodes},
                        {"restarts", 0},
                        {"ranks", ranks}}
      .dump();
}

// Microseconds of one pass of what the gathering node does each second.
double OnePass(const std::vector<std::string>& records) {
  auto start = std::chrono::steady_clock::now();
  std::vector<nlohmann::json> nodes;
  for (const std::string& r : records)
    nodes.push_back(nlohmann::json::parse(r));
  dtrun::agent::ScoreJob(&nodes);
  JobProgress p = dtrun::agent::JobProgressOf(nodes);
  std::string text = dtrun::agent::JobMetricsText(p, "bench") +
                     dtrun::agent::ProgressText(p, 100) +
                     dtrun::agent::MetricsText(nodes[0], {});
  auto us = std::chrono::duration<double, std::micro>(
                std::chrono::steady_clock::now() - start)
                .count();
  return text.empty() ? -1 : us;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeat = argc > 1 ? std::atoi(argv[1]) : 200;
  const std::vector<int> sizes = {64, 512, 4096};
  std::vector<std::vector<std::string>> records(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int g = 0; g < sizes[i] / 8; ++g)
      records[i].push_back(NodeRecord(g, sizes[i] / 8));
  }
  std::vector<std::vector<double>> us(sizes.size());
  for (int r = 0; r < repeat; ++r) {
    for (size_t i = 0; i < sizes.size(); ++i)  // the sizes take turns
      us[i].push_back(OnePass(records[i]));
  }
  std::printf(
      "| ranks (nodes of 8) | job view on group rank 0, one pass: "
      "median (min-max) | share of a core at one pass a second |\n");
  std::printf("|---|---|---|\n");
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<double>& t = us[i];
    std::sort(t.begin(), t.end());
    std::printf("| %d (%d) | %.0f us (%.0f-%.0f) | %.3f%% |\n", sizes[i],
                sizes[i] / 8, t[t.size() / 2], t.front(), t.back(),
                t[t.size() / 2] / 1e4);
  }
  return 0;
}
