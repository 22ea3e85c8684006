#pragma once

#include <atomic>
#include <chrono>

#include "rendezvous/util/clock.h"

namespace dtrun::testing {

// A clock that moves only when the test says so. Its wall clock moves with
// its steady clock, from an arbitrary fixed epoch. Safe to read from several
// threads (nodes of one simulated job share it).
class FakeClock : public Clock {
 public:
  TimePoint Now() const override {
    return TimePoint(std::chrono::nanoseconds(ns_.load()));
  }
  int64_t UnixMillis() const override {
    return kEpochMillis + ns_.load() / 1'000'000;
  }
  void Advance(std::chrono::nanoseconds by) { ns_ += by.count(); }
  // Time advanced since the clock was made.
  std::chrono::milliseconds Elapsed() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::nanoseconds(ns_.load() - kStartNs));
  }

 private:
  static constexpr int64_t kEpochMillis = 1'790'000'000'000;  // 2026-09
  static constexpr int64_t kStartNs = 1'000'000'000'000;      // 1000 s
  std::atomic<int64_t> ns_{kStartNs};
};

}  // namespace dtrun::testing
