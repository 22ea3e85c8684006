#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrun::agent {

// One request of torch's FileTimerClient (torch 1.13
// torch/distributed/elastic/timer/file_based_local_timer.py): a JSON line
// {"version": 1, "pid": P, "scope_id": S, "expiration_time": T, "signal": N}
// on the named pipe; a negative expiration_time releases the scope.
struct TimerRequest {
  int pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // unix seconds (time.time())
  int signal = 0;
};

// Parses one request line; none (with *error set) when it is not one.
std::optional<TimerRequest> ParseTimerRequest(const std::string& line,
                                              std::string* error);

// A worker whose timer expired, and the signal torch's server would send.
struct ExpiredTimer {
  int pid = 0;
  std::string scope_id;  // the earliest expired scope with a signal > 0
  int signal = 0;        // 0: no signal requested; torch does not reap it
  double expiration_time = 0;
};

// torch's FileTimerServer bookkeeping: timers per (pid, scope). Pure; time
// is a value. Called by the agent's loop thread.
class FileTimers {
 public:
  // Sets (or moves) the timer of (pid, scope_id); a negative expiration_time
  // removes it. Timers of a pid that exited stay until they expire or Clear().
  void Register(const TimerRequest& request);
  // Workers with an expired timer at `now`; their timers are cleared, as
  // torch's server clears the timers of each worker it reaps.
  // `now` is unix seconds, like the requests' expiration_time.
  std::vector<ExpiredTimer> Reap(double now);
  // The earliest expiration_time held (unix seconds); none when no timers.
  std::optional<double> next_expiry() const;
  void Clear() { timers_.clear(); }

 private:
  std::map<std::pair<int, std::string>, TimerRequest> timers_;
};

}  // namespace dtrun::agent
