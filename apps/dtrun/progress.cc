// One line and a handful of gauges out of every node's status record. The
// job's step is its lowest rank's, and its speed its slowest rank's: in a
// collective job the others wait for them anyway.
#include "apps/dtrun/progress.h"

#include <algorithm>
#include <cstdio>

namespace dtrun::agent {
namespace {

std::string Format(const char* fmt, double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// Ranks are compared by score once scored, else by step time: the one
// that holds the job back most so far is kept in `p`.
void Weigh(const nlohmann::json& r, JobProgress* p, double* slowest_time) {
  const double score = r.value("straggler_score", -1.0);
  const double time = r.value("step_time_median_s", -1.0);
  if (score >= 0) {
    if (p->slowest_score < 0 || score < p->slowest_score) {
      p->slowest_score = score;
      p->slowest_rank = r.value("rank", -1);
    }
  } else if (p->slowest_score < 0 && time > *slowest_time) {
    *slowest_time = time;
    p->slowest_rank = r.value("rank", -1);
  }
  p->step_time_s = std::max(p->step_time_s, time);
}

}  // namespace

// Exited ranks do not count for the step: a finished rank (or one that
// failed and is being restarted) would otherwise pin the job's step.
JobProgress JobProgressOf(const std::vector<nlohmann::json>& nodes) {
  JobProgress p;
  double slowest_time = -1;
  for (const nlohmann::json& node : nodes) {
    ++p.nodes;
    p.restarts = std::max(p.restarts, node.value("restarts", 0));
    if (!node.contains("ranks") || !node["ranks"].is_array()) continue;
    for (const nlohmann::json& r : node["ranks"]) {
      ++p.ranks;
      if (r.value("state", std::string()) != "running") continue;
      ++p.running;
      const int64_t step = r.value("step", int64_t{-1});
      if (step >= 0) p.step = p.step < 0 ? step : std::min(p.step, step);
      p.total_steps =
          std::max(p.total_steps, r.value("total_steps", int64_t{0}));
      Weigh(r, &p, &slowest_time);
    }
  }
  if (p.total_steps > 0 && p.step >= 0 && p.step_time_s > 0)
    p.eta_s = std::max<int64_t>(0, p.total_steps - p.step) * p.step_time_s;
  return p;
}

std::string ShortDuration(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, s % 3600 / 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lds", s);
  }
  return buf;
}

// Plain text, no colour: the line is also what a screen reader or a
// terminal recorder gets.
std::string ProgressText(const JobProgress& p, double elapsed_s) {
  const std::string up =
      std::to_string(p.running) + "/" + std::to_string(p.ranks) + " up";
  if (p.step < 0)
    return up + ", no step yet (" + ShortDuration(elapsed_s) + ")";
  std::string out = "step " + std::to_string(p.step);
  if (p.total_steps > 0) {
    out +=
        "/" + std::to_string(p.total_steps) + " (" +
        std::to_string(100 * std::min(p.step, p.total_steps) / p.total_steps) +
        "%)";
  }
  // Most telling first: a narrow terminal cuts the end of the line.
  if (p.step_time_s > 0)
    out += " | " + Format("%.3g", 1 / p.step_time_s) + " steps/s";
  if (p.eta_s >= 0) out += " | ETA " + ShortDuration(p.eta_s);
  out += " | " + up;
  if (p.slowest_rank >= 0 && p.ranks > 1) {
    out += " | slowest rank " + std::to_string(p.slowest_rank);
    if (p.slowest_score >= 0)
      out += " (score " + Format("%.2f", p.slowest_score) + ")";
  }
  if (p.restarts > 0) out += " | " + std::to_string(p.restarts) + " restarts";
  return out;
}

}  // namespace dtrun::agent
