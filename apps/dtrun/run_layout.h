#pragma once

// The run folder's layout, spelled once. dtrun writes it, `dtrun --status`
// and `--stacks` read it, and the tests and docs describe it:
//
//   <run>/status.json            this node's status, rewritten every second
//   <run>/report.html            the run's report, at the end
//   <run>/stacks.request         `dtrun --stacks`: a request (its id inside)
//   <run>/stacks.<id>.json       ...and the agent's answer
//   <run>/python/                the torch compatibility shim
//   <run>/attempt_<n>/           one attempt (restart count n) of the group
//     filtered_stdout.log        --duplicate-stdout-filters' copy (and stderr)
//     <local rank>/heartbeat     the worker's beat line (beat_file.h)
//     <local rank>/heartbeat.resume   its resume record (recovery.h)
//     <local rank>/stdout.log    redirected or tee'd output (and stderr.log)
//     <local rank>/error.json    torch's error file
//     <local rank>/stack.txt     a hung or timed-out worker's stack
//     <local rank>/live_stack.txt      a stack the worker dumps on request
//     <local rank>/native_stack.txt    eu-stack's or gdb's view of it
//
// Paths only: nothing here touches the disk but MakeRunDir
// (run_layout.cc).

#include <string>

#include "rendezvous/util/status.h"

namespace dtrun::agent::layout {

inline constexpr char kStatusFile[] = "status.json";
inline constexpr char kReportFile[] = "report.html";
inline constexpr char kStackRequestFile[] = "stacks.request";
inline constexpr char kShimDir[] = "python";
inline constexpr char kStandbyDir[] = "standby";

inline std::string StatusFile(const std::string& run) {
  return run + "/" + kStatusFile;
}
inline std::string ReportFile(const std::string& run) {
  return run + "/" + kReportFile;
}
inline std::string StackRequest(const std::string& run) {
  return run + "/" + kStackRequestFile;
}
inline std::string StackAnswer(const std::string& run, const std::string& id) {
  return run + "/stacks." + id + ".json";
}
inline std::string ShimDir(const std::string& run) {
  return run + "/" + kShimDir;
}
inline std::string StandbyDir(const std::string& run) {
  return run + "/" + kStandbyDir;
}
inline std::string AttemptDir(const std::string& run, int restart_count) {
  return run + "/attempt_" + std::to_string(restart_count);
}
// stream_bit 1: stdout, 2: stderr (as --redirects and --tee count them).
inline std::string FilteredLog(const std::string& attempt, int stream_bit) {
  return attempt +
         (stream_bit == 1 ? "/filtered_stdout.log" : "/filtered_stderr.log");
}

inline std::string RankDir(const std::string& attempt, int local_rank) {
  return attempt + "/" + std::to_string(local_rank);
}
inline std::string BeatFile(const std::string& attempt, int local_rank) {
  return RankDir(attempt, local_rank) + "/heartbeat";
}
inline std::string ResumeFile(const std::string& attempt, int local_rank) {
  return BeatFile(attempt, local_rank) + ".resume";
}
inline std::string OutputLog(const std::string& attempt, int local_rank,
                             int stream_bit) {
  return RankDir(attempt, local_rank) +
         (stream_bit == 1 ? "/stdout.log" : "/stderr.log");
}
inline std::string ErrorFile(const std::string& attempt, int local_rank) {
  return RankDir(attempt, local_rank) + "/error.json";
}
inline std::string StackFile(const std::string& attempt, int local_rank) {
  return RankDir(attempt, local_rank) + "/stack.txt";
}
inline std::string LiveStackFile(const std::string& attempt, int local_rank) {
  return RankDir(attempt, local_rank) + "/live_stack.txt";
}
inline std::string NativeStackFile(const std::string& attempt, int local_rank) {
  return RankDir(attempt, local_rank) + "/native_stack.txt";
}

// Makes the run folder `name` under --log-dir `log_dir`, or a new
// temporary one when that is empty; Io naming what to do when it cannot.
Result<std::string> MakeRunDir(const std::string& log_dir,
                               const std::string& name);

}  // namespace dtrun::agent::layout
