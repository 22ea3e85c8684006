#pragma once

// Straggler scores from the workers' beats: each beat carries the seconds
// its step spent outside collectives (its own compute). A rank's typical
// compute is the first quartile of its recent steps (robust to the steps
// the OS preempted); its score is the fastest rank's typical compute over
// its own. One under the threshold is a straggler (nvidia-resiliency-ext's
// rule and threshold, with medians there). Scored here, in the launcher, from
// data the workers send anyway: no collective is added, so sub-groups cannot
// deadlock on it.
//
// The host's own noise is taken out first: a step's compute is wall time,
// and a rank that waited for a core (another program on the host, or the
// other ranks sharing too few cores) looks slow without being so. The kernel
// counts that wait per thread (/proc/<pid>/schedstat, run_delay); the
// launcher passes it with each beat and the scorer takes each step's share
// of the wait off its compute. A rank is then named only when it stayed the
// straggler for a whole window of its steps (persistence), so a burst of
// noise the wait does not explain (a hypervisor's steal) names nobody.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrun::agent {

// One rank's place in the scores.
struct RankScore {
  int rank = 0;
  double typical_s = -1;  // typical compute seconds per step; -1: too few
  double score = -1;      // fastest typical / own typical; -1: not scored
};

class StragglerScorer {
 public:
  // `window`: the steps kept per rank; `min_samples`: needed per rank
  // before any rank is scored; `threshold`: a score under it is a straggler;
  // `warmup`: the first steps, slower on every rank (allocations, caches),
  // are not scored; `confirm`: Check() names a straggler only once the
  // same rank has been the straggler, without a break, over this many of
  // its own steps and for `confirm_s` seconds at least (steps of some
  // milliseconds make 40 steps a spell of the host's noise).
  explicit StragglerScorer(size_t window = 20, size_t min_samples = 8,
                           double threshold = 0.75, int64_t warmup = 3,
                           int64_t confirm = 40, double confirm_s = 5)
      : window_(window),
        min_samples_(min_samples),
        threshold_(threshold),
        warmup_(warmup),
        confirm_(confirm),
        confirm_s_(confirm_s) {}

  // Rank `rank` beat `step` having computed `compute_s` in it, its main
  // thread having waited `run_wait_s` seconds in all for a core since it
  // started (-1: unknown). The wait since the last beat, spread over the
  // steps since then, is taken off the compute. A beat of a step already
  // seen, of a warm-up step, or without a compute time (< 0) is not scored.
  void OnBeat(int rank, int64_t step, double compute_s, double run_wait_s = -1);
  // Forgets every rank (a new attempt).
  void Reset() {
    samples_.clear();
    streak_rank_ = -1;
    streak_from_ = 0;
  }
  // Call after new beats, `now_s` a monotonic clock's seconds: the
  // straggler once the same rank has stayed slow over `confirm` of its
  // steps and `confirm_s` seconds, and Straggler() names it now (a noisy
  // spell names nobody). Slow: under the threshold when the streak began,
  // and since then never back to kRelease (a score flickering over the
  // threshold does not start the streak again; a rank as fast as the
  // others, or another straggler, does).
  std::optional<RankScore> Check(double now_s);
  static constexpr double kRelease = 0.85;
  // Every rank seen, in rank order; scores only once every rank has
  // min_samples.
  std::vector<RankScore> Scores() const;
  // The rank with the lowest score under the threshold, if any.
  std::optional<RankScore> Straggler() const;
  double threshold() const { return threshold_; }

 private:
  struct Samples {
    int64_t last_step = -1;
    double last_wait_s = -1;  // the run wait at last_step
    std::deque<double> compute_s;
  };
  size_t window_, min_samples_;
  double threshold_;
  int64_t warmup_;
  int64_t confirm_;
  double confirm_s_;
  std::map<int, Samples> samples_;
  int streak_rank_ = -1;
  int64_t streak_from_ = 0;    // the straggler's step when its streak began
  double streak_since_s_ = 0;  // and the time
};

// Scores from typical times already known (each node's status record
// carries its ranks'): `typical` by rank, -1 for too few. Pure.
std::vector<RankScore> ScoreTypical(const std::map<int, double>& typical);

// The seconds a thread has waited on a run queue, from the text of
// /proc/<pid>/schedstat ("<on-cpu ns> <run-queue ns> <slices>"); -1 when
// the text is not that.
double ParseSchedstatWait(const std::string& text);

}  // namespace dtrun::agent
