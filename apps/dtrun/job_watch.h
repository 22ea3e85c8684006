#pragma once

// Watching the local group apart from running it: the status (status.json,
// the stores, the progress line), the metrics and health ports, the
// straggler scores, the recovery report, the event log and report.html.
// The local group tells it what happened (an attempt started or ended, a
// worker failed, beats came) and lends it a view of its workers; nothing
// here starts, signals or decides about a worker. A new status field is
// one observation here and one record in job_status. Not thread-safe: the
// job's thread calls it.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/dtrun/agent.h"
#include "apps/dtrun/beat_file.h"
#include "apps/dtrun/clock.h"
#include "apps/dtrun/group_observer.h"
#include "apps/dtrun/job_status.h"
#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/metrics.h"
#include "apps/dtrun/recovery.h"
#include "apps/dtrun/run_report.h"
#include "apps/dtrun/straggler.h"
#include "apps/dtrun/worker_env.h"
#include "rendezvous/rendezvous.h"

namespace dtrun::agent {

// The local group's workers of the current attempt, as the watchers see
// them at one moment (references into the group).
struct GroupView {
  const std::map<int, int>& pids;          // local rank -> pid
  const std::map<int, double>& exit_time;  // pid -> unix seconds, reaped
  const BeatReader& beats;                 // each rank's last beat
  const rendezvous::Assignment& assignment;
  const AttemptEnv& attempt;
  const std::string& attempt_dir;  // run_layout.h's AttemptDir
  Phase phase;
};

class JobWatch {
 public:
  JobWatch(const LaunchConfig& config, const Clock* clock);

  // The job's observer (the group's): told the status every second, and
  // asked for the job's view and the hosted stores' metrics. Never null;
  // it must outlive the watch.
  void set_observer(GroupObserver* observer) { observer_ = observer; }

  // The run folder is made: the run's clock starts, and the progress line
  // takes the terminal when it may.
  void Prepare(const std::string& run_dir);
  // The metrics and health ports; a port that cannot be served is Invalid,
  // naming its flag. Idempotent.
  Status StartServers();
  double started_at() const { return started_at_; }

  // The group's moments, in the order they come.
  // A worker failed while the group ran, at `when`.
  void OnWorkerFailed(const GroupView& view, double when);
  void OnRestartDecided();  // ...and the Agent acted on it
  // A new round stops the group (a node lost, or one joining): a recovery
  // from `when`, this node's learning of it, unless a failure here began
  // one.
  void OnRoundOver(const GroupView& view, double when);
  void OnSpawning(int restart_count);
  void OnSpawned(double attempt_started);  // unix seconds
  void OnHang(int restart_count);
  void OnOomKill();   // the kernel's OOM killer killed a worker
  void OnFinished();  // the attempt is over; what comes next is starting
  // --event-log-handler and the report: the attempt of `view` ended.
  void OnAttemptEnded(const GroupView& view, const std::string& cause);
  // New beats of these local ranks (view.beats has them).
  void OnBeats(const GroupView& view, const std::vector<int>& local_ranks);

  // Milliseconds until OnTick has work in `phase`; -1: none.
  int NextMs(Phase phase) const;
  // Every second: status.json, the observer's OnStatus, metrics, health
  // and the progress line. True when this tick published them (once the
  // run folder is made).
  bool OnTick(const GroupView& view);
  // The id of a `dtrun --stacks` request left in the run folder, taken
  // (the group captures the stacks; the watch only reads and writes).
  std::optional<std::string> TakeStackRequest();
  // Its answer (StackAnswerJson), where `dtrun --stacks` reads it.
  void AnswerStackRequest(const std::string& id, const std::string& json);
  // What /proc and the last beats say of each worker.
  std::vector<WorkerObservation> Observe(const GroupView& view) const;
  // The job is over: the health port says so, the recoveries' table is
  // logged and the progress line goes.
  void Finish();
  // Then, the workers' output drained: the events, the outcome and
  // report.html. `failures`: the last attempt's.
  void RecordEnd(const GroupView& view, const std::vector<WorkerExit>& failures,
                 bool succeeded);

 private:
  void PublishStatus(const GroupView& view);
  void Present(const GroupView& view, const nlohmann::json& node,
               const std::vector<WorkerStatus>& workers, double now);
  // Healthy: some worker beat within the hang timeout (else 300 s), or
  // none beat yet.
  bool Healthy(const std::vector<WorkerStatus>& workers) const;
  void CheckStragglers();
  void NoteRecovery(const GroupView& view, int local_rank);
  // A recovery begins at `failed`: where the job stood, from the pace.
  void BeginRecovery(double failed, double decided);
  // A recovery whose breakdown is complete but whose time lost is not yet
  // known (the job not back where it stood) is reported as it is.
  void FlushRecovery(const GroupView& view);
  void ReportRecovery(const GroupView& view, const RecoveryBreakdown& b);
  void SummarizeRecoveries() const;
  void RecordEvents(const GroupView& view,
                    const std::vector<WorkerExit>& failures, bool succeeded);
  void RecordOutcome(const GroupView& view, bool succeeded);
  void WriteReport(const GroupView& view, bool succeeded);

  const LaunchConfig& config_;
  const Clock* clock_;
  GroupObserver* observer_;
  std::string run_dir_;
  double started_at_ = 0;       // unix seconds, at Prepare
  double attempt_started_ = 0;  // unix seconds; 0 once recorded
  StatusSampler sampler_;
  static constexpr std::chrono::milliseconds kStatusEvery{1000};
  TimePoint next_status_{};
  bool progress_line_ = false;  // dtrun's stdout is a terminal
  // --metrics-port and TORCHELASTIC_HEALTH_CHECK_PORT, fed every second.
  std::unique_ptr<MetricsServer> metrics_, health_;
  bool servers_started_ = false;
  JobCounts counts_;
  // report.html: the status samples and the events of the whole run.
  std::vector<ReportSample> report_samples_;
  std::vector<ReportEvent> report_events_;
  StragglerScorer stragglers_;
  int straggler_named_ = -1;  // rank last logged as straggler
  // The recovery under way after a failure this node saw: its moments, to
  // the first step every new worker completes after its resume.
  RecoveryTimes recovery_;
  bool recovering_ = false;
  StepPace pace_;  // the steps' times, for what a failure cost
  struct Recovered {
    int attempt = 0;
    RecoveryBreakdown breakdown;
  };
  std::vector<Recovered> recoveries_;  // for the run's summary
};

}  // namespace dtrun::agent
