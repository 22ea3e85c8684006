// The --hang-timeout decision as a pure core: per-worker deadlines from
// heartbeats and a clock value, and the root-cause ordering of a collective
// hang. hang_watch.cc feeds it file mtimes and acts on what it says.
#include "apps/dtrun/hang_monitor.h"

#include <cstdlib>

namespace dtrun::agent {

void HangMonitor::Reset(int nproc, TimePoint now) {
  // The silence before the first beat counts from the group's start, so a
  // worker stuck in imports is caught by the first-beat allowance.
  beats_.assign(static_cast<size_t>(nproc), BeatState{false, now, -1});
}

void HangMonitor::OnBeat(int local_rank, TimePoint when, int64_t step) {
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= beats_.size())
    return;
  BeatState& b = beats_[local_rank];
  // "done" ends the watch like an exit: teardown after the loop (saving,
  // destroying the process group) may legitimately take longer than a step.
  if (step == kBeatDone) b.exited = true;
  b.beaten = true;
  // Beat times come from file mtimes mapped onto the steady clock, which can
  // jitter by a few ms; never move a worker's last beat backwards. A beat
  // whose text was unreadable (caught mid-rewrite) proves life but keeps the
  // step already known.
  if (when > b.last) b.last = when;
  if (step >= 0) b.step = step;
}

void HangMonitor::OnExit(int local_rank) {
  if (local_rank >= 0 && static_cast<size_t>(local_rank) < beats_.size()) {
    beats_[local_rank].exited = true;
  }
}

TimePoint HangMonitor::DeadlineOf(const BeatState& b) const {
  // An exited worker is the exit path's business (a crash is seen at once);
  // it can never be hung.
  if (b.exited) return TimePoint::max();
  return b.last + (b.beaten ? opts_.timeout : opts_.first_beat);
}

std::vector<int> HangMonitor::Hung(TimePoint now) const {
  std::vector<int> out;
  if (!opts_.enabled()) return out;
  for (size_t i = 0; i < beats_.size(); ++i) {
    if (DeadlineOf(beats_[i]) <= now) out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<RankSilence> HangMonitor::Snapshot(TimePoint now) const {
  std::vector<RankSilence> out;
  for (size_t i = 0; i < beats_.size(); ++i) {
    const BeatState& b = beats_[i];
    RankSilence r;
    r.local_rank = static_cast<int>(i);
    r.beaten = b.beaten;
    r.silent_s = std::chrono::duration<double>(now - b.last).count();
    r.step = b.step;
    r.exited = b.exited;
    r.hung = opts_.enabled() && DeadlineOf(b) <= now;
    out.push_back(r);
  }
  return out;
}

std::optional<TimePoint> HangMonitor::deadline() const {
  if (!opts_.enabled() || beats_.empty()) return std::nullopt;
  TimePoint first = DeadlineOf(beats_[0]);
  for (const BeatState& b : beats_) first = std::min(first, DeadlineOf(b));
  return first;
}

size_t HangRootCause(const std::vector<RankSilence>& ranks,
                     double same_silence_s) {
  // First by: never beat, lower step. In a collective every rank blocks on
  // the slowest, so the rank that never reached its first step (or reached
  // the fewest) is the one the others wait for. Exited ranks go last: they
  // are not hung.
  auto earlier = [](const RankSilence& a, const RankSilence& b) {
    if (a.exited != b.exited) return !a.exited;
    if (a.beaten != b.beaten) return !a.beaten;
    return a.step < b.step;
  };
  size_t best = 0;
  for (size_t i = 1; i < ranks.size(); ++i) {
    if (earlier(ranks[i], ranks[best]) ||
        (!earlier(ranks[best], ranks[i]) &&
         ranks[i].silent_s > ranks[best].silent_s)) {
      best = i;
    }
  }
  // Among equals the one silent longest stopped first, unless the beats are
  // too close to tell: then a rank outside a collective is the one the
  // others (inside, waiting) wait for.
  if (!ranks[best].in_collective) return best;
  size_t outside = best;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankSilence& r = ranks[i];
    bool equal = !earlier(r, ranks[best]) && !earlier(ranks[best], r);
    if (!equal || r.in_collective ||
        ranks[best].silent_s - r.silent_s > same_silence_s)
      continue;
    if (outside == best || r.silent_s > ranks[outside].silent_s) outside = i;
  }
  return outside;
}

size_t MarkWaiting(std::vector<RankSilence>* ranks) {
  size_t root = HangRootCause(*ranks);
  const RankSilence& r = (*ranks)[root];
  // Only ranks that beat carry a step to compare: a rank that never beat keeps
  // its own verdict, and if the root cause never beat, no step shows anyone
  // waiting for it.
  for (size_t i = 0; i < ranks->size(); ++i) {
    RankSilence& s = (*ranks)[i];
    if (r.beaten && s.beaten && s.step > r.step) s.hung = false;
    if (i != root && s.in_collective) s.hung = false;
  }
  return root;
}

}  // namespace dtrun::agent
