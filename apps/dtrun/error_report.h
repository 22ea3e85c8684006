#pragma once

#include <string>
#include <vector>

namespace dtrun::agent {

// One failed worker, with what its error file said (torchrun's @record
// format) when it wrote one.
struct WorkerFailure {
  int local_rank = 0;
  int rank = 0;
  int pid = 0;
  int exit_code = 0;       // exit status, when it exited
  int signal = 0;          // signal that killed it, else 0
  double timestamp = 0;    // unix seconds: from the error file, else detection
  std::string error_file;  // path, or empty when none was written
  std::string message;     // "<ExceptionType>: <text>" from the file
  std::string traceback;   // py_callstack from the file
  // What the kernel said of its death (KernelWitness): an OOM kill, a fatal
  // signal's meaning and core; "" when nothing.
  std::string cause{};
};

// Reads `path` (torchrun's error-file JSON) into `f` when it exists and
// parses; sets f->error_file. A file that does not parse is reported in
// f->message rather than dropped; a missing file leaves `f` unchanged.
// Reads the file once and never blocks on anything else.
void ReadErrorFile(const std::string& path, WorkerFailure* f);

// Index of the root cause: the failure with the earliest timestamp (the
// first one on a tie). REQUIRES: `failures` is not empty.
size_t RootCause(const std::vector<WorkerFailure>& failures);

// dtrun's exit code for a failed run: the root cause's own exit code, or
// 128 + signal when a signal killed it.
int ExitCodeFor(const WorkerFailure& f);

// "SIGSEGV" for 11; "signal 64" when unnamed.
std::string SignalName(int signo);

// The summary printed when the last attempt failed (torchrun's layout, with
// the signal named and the log folder given). `attempts` counts the first
// run; `host` is printed as given; `max_restarts` is the flag's value
// (-1: attempts - 1, all used); `gpu_errors`, the kernel's Xid lines of
// the attempt, are quoted after the root cause. REQUIRES: `failures` is not
// empty.
std::string FormatFailureSummary(
    const std::string& entrypoint, const std::string& host,
    const std::vector<WorkerFailure>& failures, int attempts,
    const std::string& log_dir, int max_restarts = -1,
    const std::vector<std::string>& gpu_errors = {});

// torchrun's own @record behaviour: the root cause's error JSON, with
// "errorCode" added, for the scheduler's $TORCHELASTIC_ERROR_FILE.
std::string RootCauseJson(const WorkerFailure& f);

}  // namespace dtrun::agent
