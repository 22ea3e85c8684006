#pragma once

// This node's workers for one job: carries out the Agent's decisions through
// a WorkerGroup, watches for hangs and torch's file timers, and writes the
// failure summary; its JobWatch (job_watch.h) reports on it. The jobs
// (SingleNodeJob, ElasticJob) own one and drive it; it knows nothing of
// stores or rounds. Not thread-safe: the job's thread calls it.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/dtrun/agent.h"
#include "apps/dtrun/beat_file.h"
#include "apps/dtrun/checkpoint_copies.h"
#include "apps/dtrun/error_report.h"
#include "apps/dtrun/failure_report.h"
#include "apps/dtrun/hang_watch.h"
#include "apps/dtrun/job_watch.h"
#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/signals.h"
#include "apps/dtrun/timer_pipe.h"
#include "apps/dtrun/output_route.h"
#include "apps/dtrun/worker_env.h"
#include "apps/dtrun/worker_group.h"
#include "rendezvous/rendezvous.h"

namespace dtrun::agent {

class LocalGroup {
 public:
  using Outcome = GroupOutcome;

  // `signals` may be null (tests): then PollOnce watches no signals. With
  // `elastic`, restarts are the rendezvous' to count, not the Agent's.
  LocalGroup(const LaunchConfig& config, WorkerGroup* workers,
             const Clock* clock, SignalFd* signals, bool elastic);

  // Takes the environment and makes the run folder (under --log-dir, else a
  // temporary one) named after `run_id`. Status::Io names the folder.
  Status Prepare(const std::string& run_id);
  // The metrics and health ports (Prepare starts them too, if not yet):
  // a job that meets other nodes first starts them before, so the health
  // port answers through the rendezvous. A port that cannot be served is
  // Invalid, naming its flag. Idempotent.
  Status StartServers() { return watch_.StartServers(); }
  // What workers are told about the store and the attempt; the job fills
  // the store's address.
  AttemptEnv& attempt() { return attempt_; }
  // Where the local ranks sit in the world (elastic: set every round).
  void set_assignment(const rendezvous::Assignment& a) { assignment_ = a; }
  const std::string& run_dir() const { return run_dir_; }

  // The job's observer (group_observer.h): told of each attempt's start
  // and of crashes, and lent to the watchers. Must outlive the group.
  void set_observer(GroupObserver* observer) {
    observer_ = observer;
    watch_.set_observer(observer);
  }
  // The status, metrics, events and report of this group.
  JobWatch& watch() { return watch_; }

  // Single node: starts attempt 0; restarts follow failures by themselves.
  void Start();
  // Elastic: starts the group of `round` (the restart count workers see).
  void StartRound(int round);
  // Elastic: the rendezvous moved on; stop without counting a failure.
  void StopForNewRound();
  // Elastic, --restart=in-place (local_group_in_place.cc): whether the
  // workers can be kept for the next round (every one alive and able to
  // carry its state into another group), and then, once it is joined,
  // their places in `round` given to them instead of new workers; false
  // when they could not be (then StartRound).
  bool KeepForNewRound();
  bool ContinueRound(int round);
  // A kept worker that has not read its round file KeptStuckLimit after it
  // was written is stuck in a collective with a lost node (gloo cannot
  // abort one): it is killed and a new worker takes its place.
  void CheckKeptWorkers();
  // Stops every worker (SIGTERM, then SIGKILL after --term-timeout) and
  // returns once none is alive.
  void StopAndWait();

  // Waits up to `timeout_ms` (-1: for the next event) for a signal, output,
  // a timer request or a deadline, and handles what came.
  void PollOnce(int timeout_ms);
  // The events PollOnce dispatches (tests call them directly).
  void OnSignal(int signo);  // any signal dtrun took (signals.h's SignalUse)
  void OnStopSignal(int signo);
  void OnChildExits();
  void OnTick();
  // Reads pending signals without handling children; true once a stop
  // signal came (it is then stop_signal()). For waits outside the loop.
  bool Interrupted();

  Outcome outcome() const { return outcome_; }
  int stop_signal() const { return stop_signal_; }
  int alive() const { return agent_.alive(); }
  const std::map<int, int>& pids() const { return pids_; }
  // Prints the failure summary of the attempt that ended last and writes
  // $TORCHELASTIC_ERROR_FILE; returns the root cause's exit code.
  int ReportFailure();
  // With several nodes: how a hang declared here reaches the other nodes'
  // ranks (HangWatch::ShareFn); empty on one node.
  void set_hang_share(HangWatch::ShareFn share) {
    hang_.set_share(std::move(share));
  }
  // Whether the attempt that failed last is not to be restarted because
  // restarts made no progress (--max-restarts-without-progress), and why.
  bool gave_up() const { return agent_.gave_up(); }
  const std::string& why_gave_up() const { return agent_.why_gave_up(); }
  // Forwards the workers' last output and closes their pipes; removes a
  // temporary run folder when the job `succeeded`.
  void Finish(bool succeeded);

 private:
  // The attempt that ended last, as its report needs it.
  FailedAttempt Facts() const;
  void Apply(const std::vector<Action>& actions);
  void StartWorkers(int restart_count);
  // In place (local_group_in_place.cc): the attempt failed worker `e`'s
  // replacement runs as, -1 when the group restarts whole; then local rank
  // `lr` spawned alone for `restart_count` into the running group (its
  // survivors re-form around it).
  int ReplacementAttempt(const WorkerExit& e);
  void ReplaceWorker(int lr, int restart_count);
  // Spawns local rank `lr` of the current attempt: its pid, or 0 when it
  // could not be (spawn_error_ says why).
  int SpawnRank(int lr);
  WorkerSpec SpecFor(int local_rank, const std::string& attempt_dir);
  OutputRoute Route(int local_rank, int stream_bit) const;
  void OnFinished(const Action& finish);
  void AbandonSurvivors();
  void PublishCrash(const WorkerExit& e, const std::string& how);
  // TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: looks at each worker's
  // /proc state once a second for the Agent.
  void CheckUninterruptible();
  // --max-restarts-without-progress, when an attempt fails.
  void CheckProgress();
  std::string AttemptCause() const { return AttemptCauseOf(Facts()); }
  void NoteGpuErrors();
  // Every 10 ms while the group runs: new beats to the hang watch and the
  // watchers.
  void ReadBeats();
  int PollTimeout(int timeout_ms) const;
  // Every live worker's stack now, the job going on (dtrun --stacks), as
  // StackAnswerJson (hang_report.h). Blocks a few seconds.
  std::string StacksJson();
  // Once a second: `dtrun --stacks` requests, from the run folder (while
  // the workers are `running`) or through the job, answered with one
  // capture.
  void AnswerStackRequests(bool running);
  GroupView View() const;

  LaunchConfig config_;
  WorkerGroup* workers_;
  const Clock* clock_;
  SignalFd* signals_;
  bool elastic_;
  GroupObserver no_observer_;
  GroupObserver* observer_ = &no_observer_;
  Agent agent_;
  HangWatch hang_;
  TimerPipe timer_;
  BeatReader beats_;
  JobWatch watch_;
  EnvMap base_env_;
  AttemptEnv attempt_;
  rendezvous::Assignment assignment_;
  std::string run_dir_;
  bool run_dir_is_temp_ = false;
  static constexpr std::chrono::milliseconds kDStateCheck{1000};
  TimePoint next_d_check_{};
  std::string d_report_;  // why the group was unhealthy
  static constexpr std::chrono::milliseconds kBeatReadEvery{10};
  TimePoint next_beat_read_{};
  std::vector<std::vector<int>> cpu_plan_;  // --numa-binding, by local rank
  std::string attempt_dir_;
  Outcome outcome_ = Outcome::kRunning;
  int stop_signal_ = 0;
  // Signals read while a restart waited for the standby, handled next.
  std::vector<int> deferred_signals_;
  std::map<int, int> pids_;          // local rank -> pid of this attempt
  std::map<int, double> exit_time_;  // pid -> unix seconds its exit was seen
  std::map<int, std::string> spawn_error_;  // local rank -> why exec failed
  int staged_port_ = 0;  // the workers' store port of the last attempt
  std::optional<TimePoint> keep_check_at_;   // CheckKeptWorkers' time
  std::chrono::milliseconds keep_limit_{0};  // its wait (KeptStuckLimit)
  bool round_settling_ = false;              // kept workers not yet re-formed
  std::map<int, bool> abandoned_;            // pids that outlived SIGKILL
  std::map<int, std::string> cause_;     // pid -> what the kernel said of it
  std::vector<std::string> gpu_errors_;  // this attempt's Xid lines
  // [checkpoint] mode = "memory": the workers' copies in shared memory
  CheckpointCopies copies_;
};

}  // namespace dtrun::agent
