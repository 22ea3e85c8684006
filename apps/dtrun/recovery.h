#pragma once

// Where the time from a failure to the next completed step went: what a
// user waits for after a worker dies, not just how soon a replacement
// started. The local group feeds the moments it sees (the failure reaped,
// the new workers spawned, each rank's resume record and its first step
// after it); the breakdown is pure arithmetic on them.
//
// A worker's resume record is one line in the file beside its beat file
// (<DTRUN_HEARTBEAT_FILE>.resume), written once the state is loaded:
//   "<step> <source> <init unix seconds> <load unix seconds>\n"
// source: "disk", "memory" or "none"; init: when the process group was up;
// load: when the state was in place. lib's loop writes it
// (rendezvous/heartbeat.h); apps/dtrun/README.md shows a Python worker's.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace dtrun::agent {

struct ResumeRecord {
  int64_t step = -1;
  std::string source;
  double init_unix = 0, load_unix = 0;
};

// The record's text; nullopt until it is one whole line of that form.
std::optional<ResumeRecord> ParseResumeRecord(const std::string& text);

// The job's pace on this node: each rank's last beat, and how long its
// recent whole steps took, so that a recovery can be set against the run
// it interrupted.
class StepPace {
 public:
  // `local_rank` beat `step` (a step number; others are ignored) at unix
  // seconds `at`.
  void OnBeat(int local_rank, int64_t step, double at);
  // A new attempt's ranks start over (the durations seen are kept).
  void Restart() { last_.clear(); }
  // Where the job stood: the step every one of `ranks` local ranks had
  // completed, and when the last of them completed it; nullopt while one
  // has not beaten yet.
  std::optional<std::pair<int64_t, double>> Reached(int ranks) const;
  // One undisturbed step: the median of the last 64 whole steps' times; 0
  // before any.
  double StepSeconds() const;

 private:
  std::map<int, std::pair<int64_t, double>> last_;  // rank -> step, when
  std::deque<double> durations_;
};

// The moments of one recovery, unix seconds.
struct RecoveryTimes {
  double failed = 0;       // the failed worker's exit, as reaped
  double decided = 0;      // the restart decided (the group's stop began)
  double spawn_begin = 0;  // the new workers' spawning began...
  double spawn_end = 0;    // ...and ended
  std::map<int, ResumeRecord> resumed;  // by local rank
  std::map<int, double> first_step;     // the first beat past the resume
  // Where the job stood when it failed (StepPace::Reached; -1: unknown),
  // one undisturbed step then, and each rank's first beat past that step
  // after the resume (the step, when): a rank that took a survivor's newer
  // state (in place) comes back past reached_step + 1.
  int64_t reached_step = -1;
  double reached_at = 0, step_s = 0;
  std::map<int, std::pair<int64_t, double>> back;
};

struct RecoveryBreakdown {
  double total = 0;  // failure -> the last rank's first step after resume
  double detect = 0, regroup = 0, start = 0, init = 0, load = 0, first_step = 0;
  int64_t step = -1;   // the step resumed from (the lowest rank's)
  std::string source;  // rank 0's, else the first rank's
  // The time the failure cost the run: when the step after the one it had
  // reached completed again (its last rank's), minus when it would have
  // undisturbed (reached_at + one step; a rank back at a later step: that
  // many steps). -1 while the job is not back there, or when where it
  // stood is unknown.
  double lost = -1;
  int64_t back_step = -1;  // the step whose completion measured it
};

// The breakdown once every one of `ranks` local ranks resumed and finished
// a step after it; nullopt before. `lost` once every rank is back past
// reached_step. Each phase ends when its last rank's
// ends: detect = decided - failed; regroup = spawn_begin - decided; start
// = spawn_end - spawn_begin; init = the last init - spawn_end; load = the
// last load - the last init; first step = the last first step - the last
// load. A phase that seems to end before the one before it counts 0, so
// the phases add up to the total.
std::optional<RecoveryBreakdown> Breakdown(const RecoveryTimes& t, int ranks);

// "recovered in 0.84 s: detect 0.002, regroup 0.010, start 0.031, init
// 0.21, load 0.18, first step 0.39 (from step 150, memory); time lost 1.12
// s (back at step 153)", the last part once the time lost is known.
std::string RecoveryLine(const RecoveryBreakdown& b);

}  // namespace dtrun::agent
