// LocalGroup's account of a failed attempt (local_group.h): the failure
// summary with every failed rank's error file, the root cause and its exit
// code, and the one-line cause the attempt's record keeps.
#include <string>
#include <vector>

#include "apps/dtrun/death_cause.h"
#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/local_group.h"
#include "rendezvous/util/check.h"
#include "rendezvous/util/console.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {

// A worker that wrote its error file and was stopped with the group
// before it exited (a peer that lost its connection to it exited first)
// failed too, and earlier: its file's time decides the root cause.
void LocalGroup::AddStoppedAfterError(std::vector<WorkerFailure>* failures) {
  for (const auto& [local_rank, pid] : pids_) {
    bool listed = false;
    for (const WorkerFailure& f : *failures)
      listed = listed || f.local_rank == local_rank;
    if (listed) continue;
    WorkerFailure f;
    f.local_rank = local_rank;
    f.rank = assignment_.base_rank + local_rank;
    f.pid = pid;
    f.exit_code = 1;
    ReadErrorFile(ErrorFilePath(attempt_, local_rank), &f);
    if (!f.error_file.empty()) failures->push_back(f);
  }
}

// The failure summary of a failed attempt (hung ranks, a D-state worker,
// failed exits with their error files), the root cause's error file for
// --error-file, and the exit code that root cause maps to.
std::vector<WorkerFailure> LocalGroup::Failures() {
  std::vector<WorkerFailure> failures;
  if (agent_.hung()) failures = hang_.Failures();
  if (agent_.unhealthy()) {
    WorkerFailure f;
    f.local_rank = agent_.stuck().local_rank;
    f.rank = assignment_.base_rank + f.local_rank;
    f.pid = pids_.count(f.local_rank) ? pids_[f.local_rank] : 0;
    f.exit_code = 1;
    f.timestamp = os::UnixNow();
    f.message = d_report_;
    failures.push_back(f);
  }
  for (const WorkerExit& e : agent_.failures()) {
    WorkerFailure f;
    f.local_rank = e.local_rank;
    f.rank = assignment_.base_rank + e.local_rank;
    f.pid = e.pid;
    f.exit_code = e.exit_code;
    f.signal = e.signal;
    f.timestamp = exit_time_.count(e.pid) ? exit_time_[e.pid] : os::UnixNow();
    ReadErrorFile(ErrorFilePath(attempt_, e.local_rank), &f);
    if (cause_.count(e.pid)) f.cause = cause_[e.pid];
    timer_.Describe(attempt_dir_, &f);
    if (f.message.empty() && spawn_error_.count(e.local_rank))
      f.message = spawn_error_[e.local_rank];
    failures.push_back(f);
  }
  AddStoppedAfterError(&failures);
  return failures;
}

int LocalGroup::ReportFailure() {
  std::vector<WorkerFailure> failures = Failures();
  DTRUN_CHECK(!failures.empty()) << "a failed attempt with no failed worker";
  NoteGpuErrors();
  const std::string& program = config_.entrypoint[0];
  WriteAll(2, FormatFailureSummary(program.substr(program.rfind('/') + 1),
                                   os::HostName(), failures,
                                   agent_.restart_count() + 1, run_dir_,
                                   config_.max_restarts, gpu_errors_));
  const WorkerFailure& root = failures[RootCause(failures)];
  if (!config_.error_file.empty())
    (void)os::WriteFile(config_.error_file, RootCauseJson(root));
  if (agent_.gave_up()) {
    // Restarts cannot cure a worker that outgrows its memory: say it is that.
    bool oom = root.cause.rfind(kOomKilledBy, 0) == 0;
    WriteAll(2, "dtrun: " + agent_.why_gave_up() +
                    (oom ? "; the last root cause was " + root.cause +
                               ": give the workers more memory or make them "
                               "use less (a smaller batch), restarting will "
                               "not help"
                         : "") +
                    "\n");
    return kExitNoProgress;
  }
  return ExitCodeFor(root);
}

// Why the attempt that just ended did: its first failure, a hang, an
// unhealthy worker, no progress, or success.
std::string LocalGroup::AttemptCause() const {
  if (agent_.gave_up()) return "no progress: " + agent_.why_gave_up();
  if (agent_.unhealthy()) return "unhealthy: " + d_report_;
  if (agent_.hung()) return "hung (no heartbeat within --hang-timeout)";
  if (agent_.failures().empty()) return "succeeded";
  const WorkerExit& e = agent_.failures().front();
  auto cause = cause_.find(e.pid);
  return "failed: rank " +
         std::to_string(assignment_.base_rank + e.local_rank) + " " +
         (e.signal ? SignalName(e.signal)
                   : "exit code " + std::to_string(e.exit_code)) +
         (cause == cause_.end() ? "" : ": " + cause->second);
}

void LocalGroup::NoteGpuErrors() {
  for (std::string& x : workers_->KernelErrors()) {
    Logger("dtrun.agent")->error("the kernel logged a GPU error: {}", x);
    gpu_errors_.push_back(std::move(x));
  }
}

}  // namespace dtrun::agent
