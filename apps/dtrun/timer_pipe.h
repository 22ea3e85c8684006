#pragma once

// The shell of torch's file-timer watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1):
// the named pipe FileTimerClient writes to, and the kill of a worker whose
// timer expired. Bookkeeping is FileTimers' (pure). Owned by LocalGroup;
// not thread-safe.

#include <map>
#include <string>

#include "apps/dtrun/clock.h"
#include "apps/dtrun/error_report.h"
#include "apps/dtrun/file_timer.h"
#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/log_mux.h"
#include "apps/dtrun/worker_env.h"

namespace dtrun::agent {

class TimerPipe {
 public:
  // Expiries are read on `clock`'s wall clock (the clients' time.time());
  // both must outlive it.
  TimerPipe(const LaunchConfig& config, const Clock* clock)
      : config_(config), clock_(clock) {}
  ~TimerPipe();
  TimerPipe(const TimerPipe&) = delete;
  TimerPipe& operator=(const TimerPipe&) = delete;

  // Makes the pipe (once; $TORCHELASTIC_TIMER_FILE or one in `run_dir`) when
  // the file timer is on. A failure is logged and leaves it off.
  void Open(const std::string& run_dir);
  int fd() const { return fd_; }
  // TORCHELASTIC_TIMER_FILE for a worker, when the pipe is open.
  void AddEnv(EnvMap* env) const;
  // Registers the requests waiting in the pipe.
  void OnReadable();
  // Milliseconds until the next expiry; -1 when none is pending.
  int NextMs() const;
  // Kills the processes whose timers expired (`pids`: local rank -> pid of
  // our workers, which get SIGABRT for their stack when `python`).
  void Check(const std::map<int, int>& pids, bool python);
  // Names the expired timer in `f`'s message, with the worker's stack.
  void Describe(const std::string& attempt_dir, WorkerFailure* f) const;

 private:
  const LaunchConfig& config_;
  const Clock* clock_;
  int fd_ = -1;  // the pipe's read end
  std::string path_;
  FileTimers timers_;
  LineSplitter lines_;
  std::map<int, std::string> expired_;  // pid -> scope that expired
};

}  // namespace dtrun::agent
