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
  return b;
}

std::string RecoveryLine(const RecoveryBreakdown& b) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "recovered in %.2f s: detect %.3f, regroup %.3f, start %.3f, "
                "init %.2f, load %.2f, first step %.2f (from step %lld, %s)",
                b.total, b.detect, b.regroup, b.start, b.init, b.load,
                b.first_step, static_cast<long long>(b.step), b.source.c_str());
  return buf;
}

}  // namespace dtrun::agent
