#include "apps/dtrun/straggler.h"

#include <algorithm>
#include <sstream>
#include <cstdlib>

namespace dtrun::agent {
namespace {

// The first quartile, not the median: a step the OS preempted is slow on
// any rank, and a loaded host preempts often; a slow rank is slow in its
// fastest steps too.
double FirstQuartile(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 4];
}

}  // namespace

// One sample per step: the same beat read twice (no new step) adds none.
// The beats are read some times a step, so the wait since the last one read
// is usually one step's; when steps were missed it is shared out evenly.
void StragglerScorer::OnBeat(int rank, int64_t step, double compute_s,
                             double run_wait_s) {
  Samples& s = samples_[rank];
  if (step <= s.last_step) return;
  double waited = 0;
  if (run_wait_s >= 0 && s.last_wait_s >= 0 && s.last_step >= 0) {
    waited = std::max(0.0, run_wait_s - s.last_wait_s) /
             static_cast<double>(step - s.last_step);
  }
  s.last_step = step;
  s.last_wait_s = run_wait_s;
  if (compute_s < 0 || step <= warmup_) return;
  s.compute_s.push_back(std::max(0.0, compute_s - waited));
  if (s.compute_s.size() > window_) s.compute_s.pop_front();
}

std::vector<RankScore> StragglerScorer::Scores() const {
  std::map<int, double> typical;
  for (const auto& [rank, s] : samples_) {
    typical[rank] = s.compute_s.size() < min_samples_
                        ? -1
                        : FirstQuartile(std::vector<double>(s.compute_s.begin(),
                                                            s.compute_s.end()));
  }
  return ScoreTypical(typical);
}

namespace {

// The worst of the ranks under `threshold`: with several slow ranks, the
// one the others wait for most.
std::optional<RankScore> Worst(const std::vector<RankScore>& scores,
                               double threshold) {
  std::optional<RankScore> worst;
  for (const RankScore& r : scores) {
    if (r.score >= 0 && r.score < threshold &&
        (!worst || r.score < worst->score))
      worst = r;
  }
  return worst;
}

}  // namespace

std::optional<RankScore> StragglerScorer::Straggler() const {
  return Worst(Scores(), threshold_);
}

// Persistence counted in the straggler's own steps, not in calls (the
// launcher reads beats at its own pace, which has nothing to do with how
// long a slow spell lasted), and in time: a host's noise that the wait
// for a core does not show (a hypervisor's steal) can last a second or two,
// forty steps of a small model.
std::optional<RankScore> StragglerScorer::Check(double now_s) {
  const std::vector<RankScore> scores = Scores();
  auto now = Worst(scores, threshold_);
  if (!now) {
    // Between the threshold and kRelease the streak goes on, unnamed.
    bool still_slow = false;
    for (const RankScore& r : scores) {
      still_slow |=
          r.rank == streak_rank_ && r.score >= 0 && r.score < kRelease;
    }
    if (!still_slow) streak_rank_ = -1;
    return std::nullopt;
  }
  const int64_t step = samples_[now->rank].last_step;
  if (now->rank != streak_rank_) {
    streak_rank_ = now->rank;
    streak_from_ = step;
    streak_since_s_ = now_s;
  }
  if (step - streak_from_ < confirm_ || now_s - streak_since_s_ < confirm_s_)
    return std::nullopt;
  return now;
}

// No rank is scored until every rank has a median: with one rank missing,
// the fastest could be the one not yet seen.
std::vector<RankScore> ScoreTypical(const std::map<int, double>& typical) {
  double fastest = -1;
  bool all = !typical.empty();
  for (const auto& [rank, m] : typical) {
    if (m < 0) all = false;
    if (m > 0 && (fastest < 0 || m < fastest)) fastest = m;
  }
  std::vector<RankScore> out;
  for (const auto& [rank, m] : typical) {
    RankScore r;
    r.rank = rank;
    r.typical_s = m;
    if (all && fastest > 0 && m > 0) r.score = fastest / m;
    out.push_back(r);
  }
  return out;
}

double ParseSchedstatWait(const std::string& text) {
  std::istringstream in(text);
  unsigned long long on_cpu = 0, waited = 0;
  if (!(in >> on_cpu >> waited)) return -1;
  return static_cast<double>(waited) * 1e-9;
}

}  // namespace dtrun::agent
