#pragma once

// A failed attempt in words: which workers failed and how (the failure
// summary's rows, whose earliest is the root cause), and the one-line
// cause an attempt's record keeps. Pure but for `annotate`, through which
// the group adds what a worker left on disk (its error file, a torch file
// timer's expiry); LocalGroup gathers the facts and prints.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/dtrun/agent.h"
#include "apps/dtrun/error_report.h"

namespace dtrun::agent {

// What the group knows of an attempt when it reports its failure.
struct FailedAttempt {
  int base_rank = 0;                      // global rank of local rank 0
  std::map<int, int> pids;                // local rank -> pid, of this attempt
  bool hung = false;                      // no heartbeat within --hang-timeout
  std::vector<WorkerFailure> hung_ranks;  // ...and its ranks
  // A worker stuck in uninterruptible sleep, when the attempt was
  // unhealthy, and the report on it.
  std::optional<int> stuck_local_rank;
  std::string stuck_report;
  std::vector<WorkerExit> exits;           // the failed exits, in order
  std::map<int, double> exit_time;         // pid -> unix seconds, reaped
  std::map<int, std::string> cause;        // pid -> its death in words
  std::map<int, std::string> spawn_error;  // local rank -> why it never ran
  double now = 0;                          // unix seconds
  // Whether the Agent gave up (no progress), and why.
  bool gave_up = false;
  std::string why_gave_up;
};

// Fills in what worker `f` left on disk (its error file first).
using Annotate = std::function<void(WorkerFailure* f)>;

// The summary's rows: hung ranks, the stuck worker, each failed exit, and
// the workers stopped with the group after writing an error file (a peer
// that lost them exited first; their file's time decides the root cause).
std::vector<WorkerFailure> FailuresOf(const FailedAttempt& a,
                                      const Annotate& annotate);

// Why the attempt ended, in one line: no progress, unhealthy, hung, its
// first failure, or "succeeded".
std::string AttemptCauseOf(const FailedAttempt& a);

// Why a group whose worker has slept uninterruptibly (D state) for
// `seconds`, in kernel function `wchan`, is unhealthy. Pure.
std::string StuckReport(int local_rank, int rank, int pid, int64_t seconds,
                        const std::string& wchan);

// The line after the summary when restarts made no progress; an OOM kill
// as the root cause says that restarting will not help. Pure.
std::string GaveUpLine(const std::string& why_gave_up,
                       const WorkerFailure& root);

// After the summary: the root cause's record to `error_file` (dtrun's
// --error-file, when given) and, when restarts made no progress, the line
// that says so; returns dtrun's exit code (ExitCodeFor the root cause, or
// 93: do not requeue).
int ExitCodeOfSummary(const WorkerFailure& root, const std::string& error_file,
                      bool gave_up, const std::string& why_gave_up);

}  // namespace dtrun::agent
