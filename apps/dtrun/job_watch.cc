// The local group's watchers (job_watch.h): everything that looks at the
// workers and tells someone, moved out of the loop that runs them.
#include "apps/dtrun/job_watch.h"

#include <unistd.h>

#include <cstdio>

#include "apps/dtrun/error_report.h"
#include "apps/dtrun/events.h"
#include "apps/dtrun/outcome_metrics.h"
#include "apps/dtrun/run_layout.h"
#include "rendezvous/util/console.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

using std::chrono::milliseconds;

// How long the agent's loop may go without a pass (it passes at least once
// a second) while the workers run before the health port answers 503: the
// loop is wedged, and a kubelet's liveness probe should say so.
constexpr milliseconds kLoopSilentLimit{30000};

// A file written whole (a temporary name, then a rename), so a reader
// never sees half of it.
void Publish(const std::string& path, const std::string& text) {
  if (os::WriteFile(path + ".tmp", text).ok())
    std::rename((path + ".tmp").c_str(), path.c_str());
}

GroupObserver no_observer;  // a group's before a job gives its own

}  // namespace

JobWatch::JobWatch(const LaunchConfig& config, const Clock* clock)
    : config_(config), clock_(clock), observer_(&no_observer) {}

void JobWatch::Prepare(const std::string& run_dir) {
  run_dir_ = run_dir;
  started_at_ = clock_->UnixSeconds();
  // The progress line shares the terminal with the workers' output, never
  // with a session's console or a pipe.
  progress_line_ =
      config_.progress && !config_.interactive && console::EnableStatusLine(1);
}

// Started in Prepare, or before the rendezvous, before any worker: a port
// that cannot be served is a usage error, reported before the job costs
// anything.
Status JobWatch::StartServers() {
  if (servers_started_) return Status::Ok();
  servers_started_ = true;
  auto log = Logger("dtrun.agent");
  if (config_.metrics_port >= 0) {
    auto m = MetricsServer::Start(
        "", static_cast<uint16_t>(config_.metrics_port), false);
    if (!m.ok())
      return Status::Invalid("--metrics-port: " + m.status().message());
    metrics_ = std::move(*m);
    log->info("Prometheus metrics on port {} (GET /metrics)", metrics_->port());
  }
  if (config_.health_check_port >= 0) {
    auto h = MetricsServer::Start(
        "", static_cast<uint16_t>(config_.health_check_port), true);
    if (!h.ok()) {
      return Status::Invalid("TORCHELASTIC_HEALTH_CHECK_PORT: " +
                             h.status().message());
    }
    health_ = std::move(*h);
    log->info("health check on port {} (/healthz alive, /readyz ready)",
              health_->port());
  }
  return Status::Ok();
}

// A recovery runs from the failure the group reaped to the first step every
// new worker completes after its resume (recovery.h).
void JobWatch::OnWorkerFailed(const GroupView& view, double when) {
  FlushRecovery(view);
  BeginRecovery(when, 0);
}

void JobWatch::BeginRecovery(double failed, double decided) {
  recovery_ = RecoveryTimes();
  recovery_.failed = failed;
  recovery_.decided = decided;
  if (auto reached = pace_.Reached(config_.nproc_per_node)) {
    recovery_.reached_step = reached->first;
    recovery_.reached_at = reached->second;
    recovery_.step_s = pace_.StepSeconds();
  }
  recovering_ = true;
}

void JobWatch::FlushRecovery(const GroupView& view) {
  if (!recovering_) return;
  auto b = Breakdown(recovery_, config_.nproc_per_node);
  if (!b) return;
  recovering_ = false;
  ReportRecovery(view, *b);
}

void JobWatch::OnRestartDecided() {
  if (recovering_ && recovery_.decided == 0)
    recovery_.decided = clock_->UnixSeconds();
}

void JobWatch::OnRoundOver(const GroupView& view, double when) {
  FlushRecovery(view);
  if (recovering_) return;
  BeginRecovery(when, when);
}

void JobWatch::OnSpawning(int restart_count) {
  recovering_ = recovering_ && restart_count > 0 && recovery_.decided > 0;
  if (recovering_) recovery_.spawn_begin = clock_->UnixSeconds();
}

// The new attempt's workers run: new pids, new scores, the health port
// ready and the loop's passes watched from now.
void JobWatch::OnSpawned(double attempt_started) {
  attempt_started_ = attempt_started;
  if (recovering_) recovery_.spawn_end = clock_->UnixSeconds();
  pace_.Restart();
  sampler_.Reset();
  next_status_ = clock_->Now();  // the new pids at once
  stragglers_.Reset();
  straggler_named_ = -1;
  if (health_) health_->SetPhase(HealthPhase::kRunning, kLoopSilentLimit);
}

void JobWatch::OnHang(int restart_count) {
  ++counts_.hangs;
  report_events_.push_back(
      {clock_->UnixSeconds(), "hang",
       "attempt " + std::to_string(restart_count) + " hung", -1});
}

void JobWatch::OnOomKill() { ++counts_.oom_kills; }

void JobWatch::OnFinished() {
  if (health_) health_->SetPhase(HealthPhase::kStarting, kLoopSilentLimit);
}

// --event-log-handler: dtrun's record of the attempt that just ended.
void JobWatch::OnAttemptEnded(const GroupView& view, const std::string& cause) {
  FlushRecovery(view);
  if (attempt_started_ == 0) return;
  report_events_.push_back({clock_->UnixSeconds(), "attempt",
                            "attempt " +
                                std::to_string(view.attempt.restart_count) +
                                " ended: " + cause,
                            -1});
  const double started = attempt_started_;
  attempt_started_ = 0;  // recorded once
  if (config_.event_log_handler == "null") return;
  AttemptRecord a;
  a.run_id = view.attempt.run_id;
  a.hostname = os::HostName();
  a.attempt = view.attempt.restart_count;
  a.group_rank = view.assignment.group_rank;
  a.nodes = view.assignment.group_world_size;
  a.ranks = view.assignment.world_size;
  a.start = started;
  a.end = clock_->UnixSeconds();
  a.cause = cause;
  WriteEvent(config_.event_log_handler, AttemptJson(a));
}

// Each new beat once: its compute time into the straggler scores (with the
// worker's wait for a core taken off) and, while a recovery is under way,
// its step into the recovery's moments.
void JobWatch::OnBeats(const GroupView& view,
                       const std::vector<int>& local_ranks) {
  for (int lr : local_ranks) {
    const Beat& beat = view.beats.last(lr);
    if (recovering_) NoteRecovery(view, lr);
    pace_.OnBeat(lr, beat.line.step, beat.unix_s());
    auto pid = view.pids.find(lr);
    if (pid == view.pids.end()) continue;
    // The main thread's wait for a core: the host's noise, taken off.
    double waited = ParseSchedstatWait(os::ReadFileOrEmpty(
        "/proc/" + std::to_string(pid->second) + "/schedstat"));
    stragglers_.OnBeat(view.assignment.base_rank + lr, beat.line.step,
                       beat.line.compute_s, waited);
  }
  if (!local_ranks.empty()) CheckStragglers();
}

void JobWatch::CheckStragglers() {
  auto straggler = stragglers_.Check(
      std::chrono::duration<double>(clock_->Now().time_since_epoch()).count());
  if (!straggler || straggler->rank == straggler_named_) return;
  straggler_named_ = straggler->rank;
  ++counts_.stragglers;
  double fastest = straggler->typical_s * straggler->score;
  report_events_.push_back({clock_->UnixSeconds(), "straggler",
                            "rank " + std::to_string(straggler->rank) +
                                ", score " +
                                std::to_string(straggler->score).substr(0, 4),
                            straggler->rank});
  Logger("dtrun.agent")
      ->warn(
          "straggler: rank {} computes {:.4f} s a step outside collectives, "
          "the fastest rank {:.4f} s (score {:.2f}, under {:.2f})",
          straggler->rank, straggler->typical_s, fastest, straggler->score,
          stragglers_.threshold());
}

// A new worker's beat while a recovery is under way: its resume record
// (beside its beat file) once written, then its first step past it.
void JobWatch::NoteRecovery(const GroupView& view, int local_rank) {
  if (!recovery_.resumed.count(local_rank)) {
    auto r = ParseResumeRecord(
        os::ReadFileOrEmpty(layout::ResumeFile(view.attempt_dir, local_rank)));
    if (!r) return;
    recovery_.resumed[local_rank] = *r;
  }
  const Beat& beat = view.beats.last(local_rank);
  if (beat.line.step > recovery_.resumed[local_rank].step &&
      !recovery_.first_step.count(local_rank))
    recovery_.first_step[local_rank] = beat.unix_s();
  if (recovery_.reached_step >= 0 && beat.line.step > recovery_.reached_step &&
      !recovery_.back.count(local_rank))
    recovery_.back[local_rank] = {beat.line.step, beat.unix_s()};
  auto b = Breakdown(recovery_, config_.nproc_per_node);
  // Reported once the job is back where it stood (its time lost known),
  // or as it is when it never will be (FlushRecovery).
  if (!b || (b->lost < 0 && recovery_.reached_step >= 0)) return;
  recovering_ = false;
  ReportRecovery(view, *b);
}

// The log line, the event, the histogram and the run's table.
void JobWatch::ReportRecovery(const GroupView& view,
                              const RecoveryBreakdown& b) {
  const std::string line = RecoveryLine(b);
  Logger("dtrun.agent")->info("{}", line);
  report_events_.push_back({clock_->UnixSeconds(), "recovery", line, -1});
  counts_.recovery_seconds.push_back(b.total);
  recoveries_.push_back({view.attempt.restart_count, b});
  WriteEvent(
      config_.event_log_handler,
      RecoveryEventJson(b, view.attempt.run_id, view.assignment.group_rank,
                        view.attempt.restart_count, clock_->UnixSeconds()));
}

int JobWatch::NextMs(Phase phase) const {
  if (phase == Phase::kIdle || phase == Phase::kFinished) return -1;
  auto left =
      std::chrono::duration_cast<milliseconds>(next_status_ - clock_->Now());
  return static_cast<int>(std::max<int64_t>(0, left.count()) + 1);
}

bool JobWatch::OnTick(const GroupView& view) {
  if (clock_->Now() < next_status_) return false;
  PublishStatus(view);
  return !run_dir_.empty();
}

std::vector<WorkerObservation> JobWatch::Observe(const GroupView& view) const {
  std::vector<WorkerObservation> out;
  for (const auto& [local_rank, pid] : view.pids) {
    WorkerObservation w;
    w.local_rank = local_rank;
    w.rank = view.assignment.base_rank + local_rank;
    w.pid = pid;
    const bool exited = view.exit_time.count(pid) > 0;
    w.state = exited ? "exited" : "running";
    if (view.phase == Phase::kStopping && !exited) w.state = "stopping";
    ObserveBeat(view.beats.last(local_rank), &w);
    if (!exited) ObserveProcess(pid, &w);
    out.push_back(w);
  }
  return out;
}

bool JobWatch::Healthy(const std::vector<WorkerStatus>& workers) const {
  const double limit =
      config_.hang_timeout.count() > 0
          ? std::chrono::duration<double>(config_.hang_timeout).count()
          : 300.0;
  bool beaten = false;
  for (const WorkerStatus& w : workers) {
    if (w.beat_age_s < 0) continue;
    beaten = true;
    if (w.beat_age_s <= limit) return true;
  }
  return !beaten;
}

// `dtrun --stacks` left a request (its id inside) in the run folder.
std::optional<std::string> JobWatch::TakeStackRequest() {
  if (run_dir_.empty()) return std::nullopt;
  const std::string request = layout::StackRequest(run_dir_);
  std::string id = os::ReadFileOrEmpty(request);
  if (id.empty()) return std::nullopt;
  ::unlink(request.c_str());
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  if (id.find('/') != std::string::npos) return std::nullopt;  // not dtrun's
  return id;
}

void JobWatch::AnswerStackRequest(const std::string& id,
                                  const std::string& json) {
  Publish(layout::StackAnswer(run_dir_, id), json);
}

void JobWatch::PublishStatus(const GroupView& view) {
  next_status_ = clock_->Now() + kStatusEvery;
  if (run_dir_.empty()) return;
  const double now = clock_->UnixSeconds();
  NodeFacts facts{view.attempt.run_id,
                  os::HostName(),
                  view.assignment.group_rank,
                  view.assignment.group_world_size,
                  view.attempt.restart_count,
                  config_.max_restarts,
                  started_at_};
  std::vector<WorkerStatus> workers = sampler_.Sample(Observe(view), now);
  for (const WorkerStatus& w : workers) {
    report_samples_.push_back(
        {now, w.seen.rank, w.seen.step, w.step_time_last_s});
  }
  Thin(&report_samples_, 2000);
  nlohmann::json node = NodeStatusJson(facts, workers, now);
  AddScores(stragglers_.Scores(), &node);
  std::string json = node.dump();
  Publish(layout::StatusFile(run_dir_), json);
  observer_->OnStatus(json);
  Present(view, node, workers, now);
}

// One node sees only its own ranks; the node that gathers every node's
// record (the observer's JobView) shows and serves the job's progress.
void JobWatch::Present(const GroupView& view, const nlohmann::json& node,
                       const std::vector<WorkerStatus>& workers, double now) {
  std::vector<nlohmann::json> job = observer_->JobView();
  const bool whole_job = !job.empty() || view.assignment.group_world_size <= 1;
  if (job.empty()) job.push_back(node);
  const JobProgress progress = JobProgressOf(job);
  counts_.restarts = view.attempt.restart_count;
  if (metrics_) {
    std::string text = MetricsText(node, counts_);
    if (whole_job) text += JobMetricsText(progress, view.attempt.run_id);
    text += observer_->StoreMetrics();
    metrics_->Update(std::move(text));
  }
  if (health_) health_->SetHealthy(Healthy(workers));
  if (progress_line_) {
    std::string who =
        whole_job
            ? "dtrun: "
            : "dtrun node " + std::to_string(view.assignment.group_rank) + ": ";
    console::SetStatusLine(who + ProgressText(progress, now - started_at_));
  }
}

void JobWatch::Finish() {
  if (health_) health_->SetPhase(HealthPhase::kStopping, kLoopSilentLimit);
  SummarizeRecoveries();
  console::DisableStatusLine();
}

void JobWatch::RecordEnd(const GroupView& view,
                         const std::vector<WorkerExit>& failures,
                         bool succeeded) {
  FlushRecovery(view);
  RecordEvents(view, failures, succeeded);
  RecordOutcome(view, succeeded);
  WriteReport(view, succeeded);
}

// The run's recoveries, one row each, at the end (the log lines came one by
// one, mixed with the workers' output).
void JobWatch::SummarizeRecoveries() const {
  if (recoveries_.empty()) return;
  std::string table =
      "recoveries (seconds from the failure to the next step of every new "
      "worker):\n  attempt   total  detect regroup   start    init    load "
      "first-step  from";
  for (const Recovered& r : recoveries_) {
    const RecoveryBreakdown& b = r.breakdown;
    char row[200];
    std::snprintf(row, sizeof(row),
                  "\n  %7d %7.2f %7.3f %7.3f %7.3f %7.2f %7.2f %10.2f  step "
                  "%lld (%s)",
                  r.attempt, b.total, b.detect, b.regroup, b.start, b.init,
                  b.load, b.first_step, static_cast<long long>(b.step),
                  b.source.c_str());
    table += row;
  }
  Logger("dtrun.agent")->info("{}", table);
}

// --event-log-handler: one event per worker and one for the agent, in the
// fields and states torch's elastic events use.
void JobWatch::RecordEvents(const GroupView& view,
                            const std::vector<WorkerExit>& failures,
                            bool succeeded) {
  if (config_.event_log_handler == "null") return;
  ElasticEvent e;
  e.run_id = view.attempt.run_id;
  e.role = config_.role;
  e.hostname = os::HostName();
  e.rdzv_backend = RdzvBackendName(
      config_.uses_rendezvous() ? config_.rdzv_backend : RdzvBackend::kStatic);
  const std::string& program = config_.entrypoint[0];
  e.entry_point = program.substr(program.rfind('/') + 1);
  e.group_rank = view.assignment.group_rank;
  e.group_world_size = view.assignment.group_world_size;
  e.agent_restarts = view.attempt.restart_count;
  e.total_run_time = clock_->UnixSeconds() - started_at_;
  e.timestamp = clock_->UnixSeconds();
  // torch's worker states: the failed ones FAILED, the others of a failed
  // group TERMINATED, all SUCCEEDED otherwise.
  std::map<int, std::string> failed;  // local rank -> how
  for (const WorkerExit& x : failures) {
    failed[x.local_rank] =
        (x.signal ? SignalName(x.signal)
                  : "exit code " + std::to_string(x.exit_code)) +
        (x.cause.empty() ? "" : ": " + x.cause);
  }
  for (const auto& [local_rank, pid] : view.pids) {
    ElasticEvent w = e;
    w.global_rank = view.assignment.base_rank + local_rank;
    w.worker_id = pid;
    auto f = failed.find(local_rank);
    w.state = succeeded           ? "SUCCEEDED"
              : f != failed.end() ? "FAILED"
                                  : "TERMINATED";
    if (f != failed.end()) w.raw_error = f->second;
    WriteEvent(config_.event_log_handler, EventJson(w));
  }
  e.agent = true;
  e.state = succeeded ? "SUCCEEDED" : "FAILED";
  WriteEvent(config_.event_log_handler, EventJson(e));
}

// How the run ended, as torchrun counts runs: an event, and
// --metrics-textfile for node_exporter.
void JobWatch::RecordOutcome(const GroupView& view, bool succeeded) {
  RunOutcome o;
  o.run_id = view.attempt.run_id;
  o.succeeded = succeeded;
  o.restarts = view.attempt.restart_count;
  o.start = started_at_;
  o.end = clock_->UnixSeconds();
  if (config_.event_log_handler != "null")
    WriteEvent(config_.event_log_handler, RunOutcomeEventJson(o));
  if (config_.metrics_textfile.empty()) return;
  Status s = WriteOutcomeTextfile(config_.metrics_textfile, o);
  if (!s.ok()) Logger("dtrun.agent")->error("{}", s.message());
}

// report.html in the run folder, whole.
void JobWatch::WriteReport(const GroupView& view, bool succeeded) {
  if (run_dir_.empty()) return;
  report_events_.push_back({clock_->UnixSeconds(), "end",
                            succeeded ? "the job succeeded" : "the job failed",
                            -1});
  Publish(layout::ReportFile(run_dir_),
          RunReportHtml(view.attempt.run_id, report_samples_, report_events_));
}

}  // namespace dtrun::agent
