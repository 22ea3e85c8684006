#pragma once

// The job's progress in one glance, from the status records every node
// publishes (job_status.h): the one-line display dtrun keeps at the bottom
// of its terminal, and the job-wide metrics (metrics.h) of the node that
// sees every node's record. Pure.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtrun::agent {

struct JobProgress {
  int nodes = 0;
  int ranks = 0;
  int running = 0;
  // The job's step: the lowest step any running rank beat (a collective
  // job is as far as its last rank); -1 before any beat.
  int64_t step = -1;
  int64_t total_steps = 0;  // the largest total a beat named; 0: unknown
  double step_time_s = -1;  // the slowest rank's median seconds per step
  double eta_s = -1;        // (total - step) x step time, when both known
  // The rank that holds the job back: the lowest straggler score once
  // scored (compute outside collectives), else the longest step time.
  int slowest_rank = -1;
  double slowest_score = -1;  // its straggler score; -1: not scored
  int restarts = 0;           // the highest restart count of any node
};

// Summarises node status records (NodeStatusJson, with scores).
JobProgress JobProgressOf(const std::vector<nlohmann::json>& nodes);

// "step 120/1000 (12%) | 12.3 steps/s | ETA 1m13s | 8/8 up | slowest rank
// 3 (score 0.62)", or "8/8 up, no step yet (12s)" before any beat.
// `elapsed_s` counts from the job's start.
std::string ProgressText(const JobProgress& p, double elapsed_s);

// "1h02m", "3m05s", "42s": short enough for one line.
std::string ShortDuration(double seconds);

}  // namespace dtrun::agent
