#pragma once

#include <chrono>
#include <cstdint>

namespace dtrun {

using TimePoint = std::chrono::steady_clock::time_point;

// Where code that keeps deadlines reads the time, so that tests can run it
// on simulated time (tests/testing/fake_clock.h) instead of sleeping. Now()
// is monotonic, for intervals measured on this machine; UnixMillis() and
// UnixSeconds() are wall-clock time, for deadlines that several machines
// share and for the times reports carry.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  virtual int64_t UnixMillis() const = 0;
  // Wall-clock seconds, for the times a report or an event carries.
  virtual double UnixSeconds() const { return UnixMillis() / 1e3; }
};

// The machine's clocks.
class SystemClock : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  int64_t UnixMillis() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  double UnixSeconds() const override {
    return std::chrono::duration<double>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // One shared instance for callers that take no clock of their own.
  static const SystemClock& Get() {
    static const SystemClock clock;
    return clock;
  }
};

}  // namespace dtrun
