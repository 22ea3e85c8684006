#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/dtrun/beat_file.h"
#include "apps/dtrun/clock.h"

namespace dtrun::agent {

// How long workers may stay silent. Plain data, copied into HangMonitor.
struct HangOptions {
  std::chrono::milliseconds timeout{0};  // --hang-timeout; 0: off
  // Allowance before the first beat, counted from the group's start; the
  // caller resolves --hang-first-beat's default (max(60 s, 10 x timeout)).
  std::chrono::milliseconds first_beat{0};
  bool enabled() const { return timeout.count() > 0; }
};

// What the monitor knows of one worker's heartbeats.
struct BeatState {
  bool beaten = false;  // at least one beat this attempt
  TimePoint last{};     // the last beat, or the group's start before any
  int64_t step = -1;    // the step the last beat carried; -1: none
  bool exited = false;  // gone: never hung
};

// One worker at the moment a hang was declared.
struct RankSilence {
  int local_rank = 0;
  bool beaten = false;
  // seconds since the last beat (or the start, before any)
  double silent_s = 0;
  int64_t step = -1;
  bool hung = false;    // past its deadline
  bool exited = false;  // had exited already
  // Its stack waits inside a collective, a process-group wait or a store
  // wait (StackWaits, hang_report.h): it waits for another rank. Known once
  // the stacks are in; false before.
  bool in_collective = false;
};

// Decides which workers are hung from their heartbeats. Pure: beats and
// time come in as values. Owned and called by the agent's loop thread.
class HangMonitor {
 public:
  explicit HangMonitor(const HangOptions& options) : opts_(options) {}

  // A new attempt of `nproc` workers started at `now`: no beats yet.
  void Reset(int nproc, TimePoint now);
  // Worker `local_rank` beat at `when`, carrying `step` (-1: none;
  // kBeatDone: it is done, as if it had exited).
  void OnBeat(int local_rank, TimePoint when, int64_t step);
  // Worker `local_rank` exited: it is watched no more.
  void OnExit(int local_rank);
  // Local ranks past their deadline at `now`: silent longer than the
  // timeout after a beat, or than the first-beat allowance before any.
  std::vector<int> Hung(TimePoint now) const;
  // Every worker's silence at `now`, in local-rank order.
  std::vector<RankSilence> Snapshot(TimePoint now) const;
  // The earliest deadline on the caller's clock (TimePoint::max() when every
  // worker exited); none when off or no workers. Callers poll until then.
  std::optional<TimePoint> deadline() const;
  const std::vector<BeatState>& beats() const { return beats_; }

 private:
  TimePoint DeadlineOf(const BeatState& b) const;

  HangOptions opts_;
  std::vector<BeatState> beats_;
};

// Silences closer than this do not tell which rank stopped first: ranks
// leave a collective together, and their beats after it land within a few
// milliseconds (more on a loaded host). Then the stacks decide.
constexpr double kSameSilenceS = 1.0;

// Index (into `ranks`) of a collective hang's root cause: a worker that
// never beat, else the one at the lowest step. Among those at that step,
// the one silent longest, unless others were silent about as long
// (within `same_silence_s`): then one whose stack is not waiting in a
// collective comes first, since the ranks that are wait for it.
// `ranks` must not be empty.
size_t HangRootCause(const std::vector<RankSilence>& ranks,
                     double same_silence_s = kSameSilenceS);

// Marks as waiting (hung = false) every worker at a later step than the
// root cause, and every other worker whose stack waits in a collective:
// both wait for the root cause. Returns the root cause's index.
size_t MarkWaiting(std::vector<RankSilence>* ranks);

}  // namespace dtrun::agent
