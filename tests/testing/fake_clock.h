#pragma once

#include <chrono>

#include "apps/dtrun/clock.h"

namespace dtrun::testing {

// A clock that moves only when the test says so.
class FakeClock : public agent::Clock {
 public:
  agent::TimePoint Now() const override { return now_; }
  void Advance(std::chrono::milliseconds by) { now_ += by; }

 private:
  agent::TimePoint now_{std::chrono::seconds(1000)};
};

}  // namespace dtrun::testing
