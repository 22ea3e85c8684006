#pragma once

// report.html: the picture of a run that dtrun leaves in its log folder at
// the end of every job. Each rank's step time over the run as an SVG line
// (from the status samples, one a second), with the attempts, hangs and
// stragglers marked on the time axis. One self-contained file: no script,
// no network, any browser shows it. Pure: samples and events in, text out.

#include <cstdint>
#include <string>
#include <vector>

namespace dtrun::agent {

struct ReportSample {
  double t = 0;  // unix seconds
  int rank = 0;
  int64_t step = -1;
  double step_time_s = -1;  // -1: not known at that moment
};

struct ReportEvent {
  double t = 0;      // unix seconds
  std::string kind;  // "attempt", "hang", "straggler", "end"
  std::string text;  // what happened, for people
  int rank = -1;     // the rank it names, if any
};

// The page for run `run_id`. Ranks a "straggler" event names are drawn
// thicker and named in the legend.
std::string RunReportHtml(const std::string& run_id,
                          const std::vector<ReportSample>& samples,
                          const std::vector<ReportEvent>& events);

// Keeps a run's samples bounded: past `max_per_rank` samples of one rank,
// every other one of its older half is dropped (the picture keeps its
// shape; a day-long run stays a few hundred kilobytes).
void Thin(std::vector<ReportSample>* samples, size_t max_per_rank);

}  // namespace dtrun::agent
