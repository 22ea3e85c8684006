#pragma once

#include <chrono>

namespace dtrun::agent {

using TimePoint = std::chrono::steady_clock::time_point;

// Source of "now" for code that keeps deadlines; tests use a fake.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SteadyClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace dtrun::agent
