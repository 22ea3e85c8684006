#pragma once

// This node's workers for one job: carries out the Agent's decisions through
// a WorkerGroup, watches for hangs and torch's file timers, and writes the
// failure summary. The jobs (SingleNodeJob, ElasticJob) own one and drive
// it; it knows nothing of stores or rounds. Not thread-safe: the job's
// thread calls it.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "apps/dtrun/agent.h"
#include "apps/dtrun/checkpoint_copies.h"
#include "apps/dtrun/error_report.h"
#include "apps/dtrun/hang_watch.h"
#include "apps/dtrun/job_status.h"
#include "apps/dtrun/metrics.h"
#include "apps/dtrun/recovery.h"
#include "apps/dtrun/run_report.h"
#include "apps/dtrun/straggler.h"
#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/signals.h"
#include "apps/dtrun/timer_pipe.h"
#include "apps/dtrun/worker_env.h"
#include "apps/dtrun/worker_group.h"
#include "rendezvous/rendezvous.h"

namespace dtrun::agent {

// A worker of the current attempt failed (for an interactive console that
// stops a crash loop, published through the store by the job).
struct WorkerCrash {
  int attempt = 0;  // restart count of the attempt it belonged to
  int rank = 0;
  std::string how;   // "exit code 1", "SIGKILL"
  std::string host;  // this host's name, and the address it advertises
                     // (--local-addr) if any
  std::string addr;
  std::string stderr_file;
  std::string stderr_tail;  // its last lines
};

// What a --log-line-prefix-template may name.
struct LinePrefixValues {
  std::string role;
  int rank = 0;  // global
  int local_rank = 0;
  std::string hostname;
};
// The template with ${role_name}, ${rank}, ${local_rank} and ${hostname}
// filled in; ${pid} and unknown names are left for later. Pure.
std::string ExpandLinePrefix(const std::string& text,
                             const LinePrefixValues& values);

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
  Status StartServers();
  // What workers are told about the store and the attempt; the job fills
  // the store's address.
  AttemptEnv& attempt() { return attempt_; }
  // Where the local ranks sit in the world (elastic: set every round).
  void set_assignment(const rendezvous::Assignment& a) { assignment_ = a; }
  const std::string& run_dir() const { return run_dir_; }

  // Called before each attempt's workers start, with its restart count.
  std::function<void(int restart_count)> before_start;
  // Called when a worker fails while the group runs.
  std::function<void(const WorkerCrash&)> on_worker_crash;
  // Called every second with this node's status (NodeStatusJson, dumped),
  // after it was written to <run folder>/status.json.
  std::function<void(const std::string& json)> on_status;
  // Every node's status record, scored as one job (ScoreJob), when this
  // node is the one that gathers them (elastic: group rank 0); else none.
  // Feeds the progress line and the dtrun_job_* metrics.
  std::function<std::vector<nlohmann::json>()> job_view;
  // The families of the stores this node hosts (StoreMetricsText).
  std::function<std::string()> store_metrics;

  // Single node: starts attempt 0; restarts follow failures by themselves.
  void Start();
  // Elastic: starts the group of `round` (the restart count workers see).
  void StartRound(int round);
  // Elastic: the rendezvous moved on; stop without counting a failure.
  void StopForNewRound();
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
  // Every live worker's stack now, the job going on (dtrun --stacks), as
  // StackAnswerJson (hang_report.h). Blocks a few seconds.
  std::string StacksJson();
  // With several nodes: how a hang declared here reaches the other nodes'
  // ranks (HangWatch::ShareFn); empty on one node.
  void set_hang_share(HangWatch::ShareFn share) {
    hang_.set_share(std::move(share));
  }
  // Whether the attempt that failed last is not to be restarted because
  // restarts made no progress (--max-restarts-without-progress), and why.
  bool gave_up() const { return agent_.gave_up(); }
  const std::string& why_gave_up() const { return no_progress_; }
  // Forwards the workers' last output and closes their pipes; removes a
  // temporary run folder when the job `succeeded`.
  void Finish(bool succeeded);

 private:
  // ReportFailure(): the workers stopped with the group after they wrote
  // their error file.
  void AddStoppedAfterError(std::vector<WorkerFailure>* failures);
  void Apply(const std::vector<Action>& actions);
  void StartWorkers(int restart_count);
  WorkerSpec SpecFor(int local_rank, const std::string& attempt_dir);
  OutputRoute Route(int local_rank, int stream_bit,
                    const std::string& attempt_dir) const;
  void OnFinished(const Action& finish);
  void AbandonSurvivors();
  void PublishCrash(const WorkerExit& e, const std::string& how);
  // --event-log-handler: one event per worker of the last attempt and one
  // for the job, in torch's schema.
  void RecordOutcome(bool succeeded);
  void RecordEvents(bool succeeded);
  // TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: looks at each worker's
  // /proc state once a second; one in D state that long ends the group.
  void CheckUninterruptible();
  // --numa-binding: each local rank's CPUs from hwloc's topology.
  Status PlanCpus();
  // --max-restarts-without-progress, when an attempt fails.
  void CheckProgress();
  // report.html at the end of the job.
  void WriteReport(bool succeeded);
  // --event-log-handler: the attempt that ended, and why.
  void RecordAttempt(const std::string& cause);
  std::string AttemptCause() const;
  // Every 10 ms while the group runs: new beats' compute times into the
  // straggler scores; a new straggler is logged.
  void ReadComputeBeats();
  // Every second: answers a `dtrun --stacks` request left in the run folder
  // (stacks.request, holding its id) with stacks.<id>.json.
  void ServeStackRequest();
  // Every second: this node's status to status.json and on_status.
  void PublishStatus();
  // Then what is made of it: metrics, health, the progress line.
  void Present(const nlohmann::json& node,
               const std::vector<WorkerStatus>& workers, double now);
  std::vector<WorkerObservation> Observe() const;
  int PollTimeout(int timeout_ms) const;

  LaunchConfig config_;
  WorkerGroup* workers_;
  const Clock* clock_;
  SignalFd* signals_;
  bool elastic_;
  Agent agent_;
  HangWatch hang_;
  TimerPipe timer_;
  EnvMap base_env_;
  AttemptEnv attempt_;
  rendezvous::Assignment assignment_;
  std::string run_dir_;
  bool run_dir_is_temp_ = false;
  double started_at_ = 0;       // unix seconds, at Prepare
  double attempt_started_ = 0;  // unix seconds; 0 once recorded
  static constexpr std::chrono::milliseconds kDStateCheck{1000};
  TimePoint next_d_check_{};
  std::map<int, TimePoint> d_since_;  // pid -> first seen in D state
  std::string d_report_;              // why the group was unhealthy
  int d_rank_ = 0;                    // local rank of that worker
  // --max-restarts-without-progress: the highest step beaten by any attempt,
  // the failed restarts in a row that beat none past it, and why the job
  // gave up ("" while it has not).
  StatusSampler sampler_;
  bool progress_line_ = false;  // dtrun's stdout is a terminal
  // --metrics-port and TORCHELASTIC_HEALTH_CHECK_PORT, fed every second.
  std::unique_ptr<MetricsServer> metrics_, health_;
  bool servers_started_ = false;
  JobCounts counts_;
  // Healthy: some worker beat within the hang timeout (else 300 s), or
  // none beat yet.
  bool Healthy(const std::vector<WorkerStatus>& workers) const;
  // report.html: the status samples and the events of the whole run.
  std::vector<ReportSample> report_samples_;
  std::vector<ReportEvent> report_events_;
  StragglerScorer stragglers_;
  static constexpr std::chrono::milliseconds kBeatReadEvery{10};
  TimePoint next_beat_read_{};
  std::map<int, int64_t> beat_mtime_ns_;  // local rank -> last beat read
  int straggler_named_ = -1;              // rank last logged as straggler
  // The recovery under way after a failure this node saw: its moments, to
  // the first step every new worker completes after its resume.
  RecoveryTimes recovery_;
  bool recovering_ = false;
  struct Recovered {
    int attempt = 0;
    RecoveryBreakdown breakdown;
  };
  std::vector<Recovered> recoveries_;  // for the run's summary
  void NoteRecovery(int local_rank, int64_t step, double beat_unix);
  void ReportRecovery(const RecoveryBreakdown& b);
  void SummarizeRecoveries() const;
  static constexpr std::chrono::milliseconds kStatusEvery{1000};
  TimePoint next_status_{};
  int64_t highest_step_ = -1;
  int restarts_without_progress_ = 0;
  std::string no_progress_;
  std::vector<std::vector<int>> cpu_plan_;  // --numa-binding, by local rank
  std::string attempt_dir_;
  Outcome outcome_ = Outcome::kRunning;
  int stop_signal_ = 0;
  std::map<int, int> pids_;          // local rank -> pid of this attempt
  std::map<int, double> exit_time_;  // pid -> unix seconds its exit was seen
  std::map<int, std::string> spawn_error_;  // local rank -> why exec failed
  std::map<int, bool> abandoned_;           // pids that outlived SIGKILL
  // [checkpoint] mode = "memory": the workers' copies in shared memory
  CheckpointCopies copies_;
};

}  // namespace dtrun::agent
