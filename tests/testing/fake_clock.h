#pragma once

#include <chrono>

#include "rendezvous/util/clock.h"

namespace dtrun::testing {

// A clock that moves only when the test says so. Its wall clock moves with
// its steady clock, from an arbitrary fixed epoch.
class FakeClock : public Clock {
 public:
  TimePoint Now() const override { return now_; }
  int64_t UnixMillis() const override {
    return kEpochMillis + std::chrono::duration_cast<std::chrono::milliseconds>(
                              now_.time_since_epoch())
                              .count();
  }
  void Advance(std::chrono::milliseconds by) { now_ += by; }

 private:
  static constexpr int64_t kEpochMillis = 1'790'000'000'000;  // 2026-09
  TimePoint now_{std::chrono::seconds(1000)};
};

}  // namespace dtrun::testing
