#include "apps/dtrun/recovery.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace dtrun::agent {

std::optional<ResumeRecord> ParseResumeRecord(const std::string& text) {
  if (text.empty() || text.back() != '\n') return std::nullopt;
  std::istringstream in(text);
  ResumeRecord r;
  if (!(in >> r.step >> r.source >> r.init_unix >> r.load_unix))
    return std::nullopt;
  if (r.step < 0 || r.init_unix <= 0 || r.load_unix < r.init_unix)
    return std::nullopt;
  return r;
}

void StepPace::OnBeat(int local_rank, int64_t step, double at) {
  if (step < 0) return;  // no step yet, or "done"
  auto it = last_.find(local_rank);
  // A whole step: the one after the last seen. A resume's first beats go
  // back or jump and time nothing.
  if (it != last_.end() && step == it->second.first + 1 &&
      at >= it->second.second) {
    durations_.push_back(at - it->second.second);
    if (durations_.size() > 64) durations_.pop_front();
  }
  last_[local_rank] = {step, at};
}

// The job's step is its slowest rank's: the faster ones wait for it at the
// next collective, so that step is done only when the last of them beat it.
std::optional<std::pair<int64_t, double>> StepPace::Reached(int ranks) const {
  if (ranks <= 0 || static_cast<int>(last_.size()) < ranks) return std::nullopt;
  std::pair<int64_t, double> reached{-1, 0};
  for (const auto& [lr, beat] : last_) {
    if (reached.first < 0 || beat.first < reached.first) {
      reached = beat;
    } else if (beat.first == reached.first) {
      reached.second = std::max(reached.second, beat.second);
    }
  }
  return reached;
}

// The median, not the mean: the slow first steps after a resume and a
// step that waited on a checkpoint do not make the undisturbed pace.
double StepPace::StepSeconds() const {
  if (durations_.empty()) return 0;
  std::deque<double> sorted = durations_;
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];
}

std::optional<RecoveryBreakdown> Breakdown(const RecoveryTimes& t, int ranks) {
  if (t.failed <= 0 || t.spawn_end <= 0 || ranks <= 0) return std::nullopt;
  if (static_cast<int>(t.resumed.size()) < ranks ||
      static_cast<int>(t.first_step.size()) < ranks)
    return std::nullopt;
  double init = 0, load = 0, first = 0;
  RecoveryBreakdown b;
  for (const auto& [lr, r] : t.resumed) {
    init = std::max(init, r.init_unix);
    load = std::max(load, r.load_unix);
    if (b.step < 0 || r.step < b.step) b.step = r.step;
    if (b.source.empty() || lr == 0) b.source = r.source;
  }
  for (const auto& [lr, s] : t.first_step) first = std::max(first, s);
  // Each phase's end no earlier than the last one's: clocks of different
  // grain (a beat file's mtime is the kernel's coarse time) never make a
  // phase negative, and the phases add up to the whole.
  double ends[] = {t.failed, t.decided, t.spawn_begin, t.spawn_end,
                   init,     load,      first};
  for (size_t i = 1; i < sizeof(ends) / sizeof(ends[0]); ++i)
    ends[i] = std::max(ends[i], ends[i - 1]);
  b.detect = ends[1] - ends[0];
  b.regroup = ends[2] - ends[1];
  b.start = ends[3] - ends[2];
  b.init = ends[4] - ends[3];
  b.load = ends[5] - ends[4];
  b.first_step = ends[6] - ends[5];
  b.total = ends[6] - ends[0];
  if (t.reached_step >= 0 && static_cast<int>(t.back.size()) >= ranks) {
    // The latest rank against its own step's undisturbed time.
    b.lost = 0;
    for (const auto& [lr, back] : t.back) {
      const auto [step, at] = back;
      const double late =
          at - (t.reached_at +
                static_cast<double>(step - t.reached_step) * t.step_s);
      if (late >= b.lost) {
        b.lost = late;
        b.back_step = step;
      }
    }
    if (b.back_step < 0) b.back_step = t.reached_step + 1;
  }
  return b;
}

std::string RecoveryLine(const RecoveryBreakdown& b) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "recovered in %.2f s: detect %.3f, regroup %.3f, start %.3f, "
                "init %.2f, load %.2f, first step %.2f (from step %lld, %s)",
                b.total, b.detect, b.regroup, b.start, b.init, b.load,
                b.first_step, static_cast<long long>(b.step), b.source.c_str());
  std::string line = buf;
  if (b.lost >= 0) {
    std::snprintf(buf, sizeof(buf), "; time lost %.2f s (back at step %lld)",
                  b.lost, static_cast<long long>(b.back_step));
    line += buf;
  }
  return line;
}

}  // namespace dtrun::agent
