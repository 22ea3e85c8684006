// A failed attempt in words (failure_report.h).
#include "apps/dtrun/failure_report.h"

#include <string>

#include "apps/dtrun/death_cause.h"
#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/log_mux.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {
namespace {

// A failure of local rank `local_rank` with exit code 1, as the summary
// shows a worker that did not exit by itself.
WorkerFailure FailureOf(const FailedAttempt& a, int local_rank) {
  WorkerFailure f;
  f.local_rank = local_rank;
  f.rank = a.base_rank + local_rank;
  auto pid = a.pids.find(local_rank);
  f.pid = pid == a.pids.end() ? 0 : pid->second;
  f.exit_code = 1;
  return f;
}

template <typename K, typename V>
V ValueOr(const std::map<K, V>& m, const K& key, V fallback) {
  auto it = m.find(key);
  return it == m.end() ? fallback : it->second;
}

}  // namespace

std::vector<WorkerFailure> FailuresOf(const FailedAttempt& a,
                                      const Annotate& annotate) {
  std::vector<WorkerFailure> failures = a.hung_ranks;
  if (a.stuck_local_rank) {
    WorkerFailure f = FailureOf(a, *a.stuck_local_rank);
    f.timestamp = a.now;
    f.message = a.stuck_report;
    failures.push_back(f);
  }
  for (const WorkerExit& e : a.exits) {
    WorkerFailure f;
    f.local_rank = e.local_rank;
    f.rank = a.base_rank + e.local_rank;
    f.pid = e.pid;
    f.exit_code = e.exit_code;
    f.signal = e.signal;
    f.timestamp = ValueOr(a.exit_time, e.pid, a.now);
    annotate(&f);
    f.cause = ValueOr(a.cause, e.pid, f.cause);
    if (f.message.empty())
      f.message = ValueOr(a.spawn_error, e.local_rank, std::string());
    failures.push_back(f);
  }
  for (const auto& [local_rank, pid] : a.pids) {
    bool listed = false;
    for (const WorkerFailure& f : failures)
      listed = listed || f.local_rank == local_rank;
    if (listed) continue;
    WorkerFailure f = FailureOf(a, local_rank);
    annotate(&f);
    if (!f.error_file.empty()) failures.push_back(f);
  }
  return failures;
}

std::string AttemptCauseOf(const FailedAttempt& a) {
  if (a.gave_up) return "no progress: " + a.why_gave_up;
  if (a.stuck_local_rank) return "unhealthy: " + a.stuck_report;
  if (a.hung) return "hung (no heartbeat within --hang-timeout)";
  if (a.exits.empty()) return "succeeded";
  const WorkerExit& e = a.exits.front();
  const std::string cause = ValueOr(a.cause, e.pid, std::string());
  return "failed: rank " + std::to_string(a.base_rank + e.local_rank) + " " +
         (e.signal ? SignalName(e.signal)
                   : "exit code " + std::to_string(e.exit_code)) +
         (cause.empty() ? "" : ": " + cause);
}

std::string StuckReport(int local_rank, int rank, int pid, int64_t seconds,
                        const std::string& wchan) {
  return "worker local_rank " + std::to_string(local_rank) + " (rank " +
         std::to_string(rank) + ", pid " + std::to_string(pid) +
         ") has been in uninterruptible sleep (D state) for " +
         std::to_string(seconds) + " s, in kernel function '" + wchan +
         "'; the group is unhealthy and is not restarted "
         "(TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT)";
}

std::string GaveUpLine(const std::string& why_gave_up,
                       const WorkerFailure& root) {
  // Restarts cannot cure a worker that outgrows its memory: say it is that.
  const bool oom = root.cause.rfind(kOomKilledBy, 0) == 0;
  return "dtrun: " + why_gave_up +
         (oom ? "; the last root cause was " + root.cause +
                    ": give the workers more memory or make them use less "
                    "(a smaller batch), restarting will not help"
              : "") +
         "\n";
}

int ExitCodeOfSummary(const WorkerFailure& root, const std::string& error_file,
                      bool gave_up, const std::string& why_gave_up) {
  if (!error_file.empty()) (void)os::WriteFile(error_file, RootCauseJson(root));
  if (!gave_up) return ExitCodeFor(root);
  WriteAll(2, GaveUpLine(why_gave_up, root));
  return kExitNoProgress;
}

}  // namespace dtrun::agent
