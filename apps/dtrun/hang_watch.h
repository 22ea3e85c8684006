#pragma once

// The shell of hang detection for one node's group: takes the workers'
// beats (the group's BeatReader reads them), captures stacks, prints the hang
// report. Who is hung and the root cause are HangMonitor's (pure) decisions.
// Owned by LocalGroup; not thread-safe.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "apps/dtrun/beat_file.h"
#include "apps/dtrun/clock.h"
#include "apps/dtrun/error_report.h"
#include "apps/dtrun/hang_monitor.h"
#include "apps/dtrun/hang_report.h"
#include "apps/dtrun/job_status.h"
#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/worker_env.h"
#include "apps/dtrun/worker_group.h"

namespace dtrun::agent {

class HangWatch {
 public:
  // Shares this node's ranks (StackAnswerJson) with the other nodes of the
  // round and returns their answers; blocks a few seconds at most. Set by
  // a job with several nodes.
  using ShareFn =
      std::function<std::vector<std::string>(const std::string& mine)>;

  HangWatch(const LaunchConfig& config, const Clock* clock,
            WorkerGroup* workers);

  bool enabled() const { return config_.hang_timeout.count() > 0; }
  // A worker's heartbeat file (DTRUN_HEARTBEAT_FILE), always: its beats
  // feed the live status, the straggler scores and the progress check.
  // With --hang-timeout also Python's fault handler, so its stack can be
  // had with SIGABRT.
  void AddEnv(int local_rank, const std::string& attempt_dir,
              EnvMap* env) const;
  // A new attempt's group started: every rank silent from now.
  void Reset(int nproc, const std::string& attempt_dir, int restart_count);
  void OnExit(int local_rank) { monitor_.OnExit(local_rank); }
  // A new beat of `local_rank`: its mtime, mapped onto the steady clock,
  // is when the worker was last alive.
  void OnBeat(int local_rank, const Beat& beat);
  // Milliseconds until Check() has work; -1 when not watching.
  int NextCheckMs(bool running) const;
  // Looks at the beats when due. When a rank is newly hung, records
  // every rank's silence and stack (native stacks are captured here, which
  // blocks up to 20 s) and returns the signal to stop the group with:
  // SIGABRT for Python workers (their fault handler prints the stack), else
  // SIGTERM. Returns 0 otherwise.
  int Check(bool running, const std::map<int, int>& pids, int base_rank);
  // Prints the report of the latest hang, once (after the group stopped:
  // Python stacks are in the workers' stderr logs by then).
  void Report();
  // Every live worker's stack now, the job going on (dtrun --stacks), by
  // global rank: a Python worker whose interpreter registered dtrun's stack
  // signal (the torch shim does) prints its own; any other gets a native
  // stack (eu-stack or gdb, which pause it for a moment). Blocks up to a
  // few seconds.
  // LiveStacks of `live` with each rank's step and silence beside its
  // stack (from `seen`; `started_at`: the run's start, for ranks never
  // beaten), as StackAnswerJson: a node that declared a hang weighs them
  // with its own ranks'.
  std::string StacksAnswer(const std::map<int, int>& live, int base_rank,
                           const std::vector<WorkerObservation>& seen,
                           double started_at);
  std::map<int, std::string> LiveStacks(const std::map<int, int>& pids,
                                        int base_rank);
  // With several nodes: a hang declared here weighs every node's ranks.
  void set_share(ShareFn share) { share_ = std::move(share); }
  // The latest hang's ranks as failures for the failure summary.
  std::vector<WorkerFailure> Failures() const;

 private:
  void Snapshot(TimePoint now, const std::map<int, int>& pids, int base_rank);
  void CaptureNativeStacks();
  // Marks the ranks whose stacks wait in a collective, and who is hung.
  void ClassifyStacks();
  // Before any worker is stopped: this node's live stacks, then the other
  // nodes' ranks through share_, so that the root cause is the job's.
  void ShareWithNodes(int base_rank);

  const LaunchConfig& config_;
  const Clock* clock_;
  WorkerGroup* workers_;
  HangMonitor monitor_;
  std::string attempt_dir_;
  int restart_count_ = 0;
  TimePoint next_check_{};
  // The latest hang's ranks: this node's, then other nodes' (host set).
  std::vector<RankStack> stacks_;
  ShareFn share_;
  bool reported_ = true;
};

// Whether the workers run the Python interpreter (their stacks come from
// faulthandler, not from a debugger).
bool PythonWorkers(const LaunchConfig& config);

}  // namespace dtrun::agent
