#pragma once

// The processes of one node's workers, behind an interface: the jobs and
// LocalGroup decide, a WorkerGroup runs processes (ninja's CommandRunner).
// PosixWorkerGroup is the only code that forks workers; tests use
// FakeWorkerGroup (tests/testing/fake_worker_group.h).

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "apps/dtrun/agent.h"
#include "rendezvous/util/status.h"

namespace dtrun::agent {

// Where one of a worker's streams goes, line by line.
struct OutputRoute {
  int console_fd = -1;  // 1 or 2 to show on the console; -1 to not
  std::string prefix;   // e.g. "[default3]:", prepended on the console only;
                        // "${pid}" in it becomes the worker's pid
  std::string file;     // a log file (created, truncated); empty for none
  // Lines holding any of `filters` are also appended, prefixed as on the
  // console, to `filtered_file` (shared by the attempt's workers).
  std::vector<std::string> filters;
  std::string filtered_file;
};

struct WorkerSpec {
  int local_rank = 0;
  std::vector<std::string> argv;  // argv[0] is the program path
  std::vector<std::string> env;   // "K=V"
  OutputRoute out, err;           // the worker's stdout and stderr
  std::vector<int> cpus;          // --numa-binding: its CPUs; empty: any
};

// A helper program run to completion with its output in a file (a stack
// dumper).
struct ToolRun {
  std::vector<std::string> argv;  // argv[0] is the program path
  std::string output_file;        // stdout and stderr
};

class Standby;

class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;
  // Python workers come from `standby` once it is ready (standby.h); a
  // group that cannot use one (tests' fakes) drops it.
  virtual void UseStandby(std::unique_ptr<Standby> standby);
  // Whether the last Spawn forked its worker from the standby.
  virtual bool spawned_warm() const { return false; }
  // How long workers about to be started again may wait for a standby still
  // starting (StandbyWait), its socket among output_fds(); zero with none,
  // a ready one, a first start, or once a restart waited and started cold.
  virtual std::chrono::milliseconds standby_wait() const { return {}; }
  // What the kernel logged of GPU failures (NVIDIA's Xid lines) since the
  // last call, described (death_cause.h); none where nothing reads it.
  virtual std::vector<std::string> KernelErrors() { return {}; }
  // Each worker log file that could not be opened or written ("PATH:
  // why"), in the order it happened; said once in the log when it did.
  virtual std::vector<std::string> LogErrors() const { return {}; }
  // Starts one worker leading a process group of its own, its output
  // forwarded whole lines at a time. Returns its pid, or why it could not be
  // started (then nothing of it runs).
  virtual Result<int> Spawn(const WorkerSpec& spec) = 0;
  // Sends `signo` to the process group led by `pid`; a no-op once reaped.
  virtual void Signal(int pid, int signo) = 0;
  // Stops the worker `pid` with `signo`: the worker first, the rest of the
  // process group it leads once it exited (its handler may still need its
  // children to save); SIGKILL to the whole group at once. A no-op once
  // reaped.
  virtual void Stop(int pid, int signo) { Signal(pid, signo); }
  // Every worker that exited since the last call; never blocks.
  virtual std::vector<WorkerExit> Reap() = 0;

  // The workers' output pipes to poll, and the call when one is readable.
  virtual std::vector<int> output_fds() const = 0;
  virtual void OnReadable(int fd) = 0;
  // Forwards what the workers already wrote, for at most `limit` (a dying
  // worker's last lines, its stack).
  virtual void ReadPending(std::chrono::milliseconds limit) = 0;
  // Forwards output until every pipe closes or `limit` passes, then closes
  // them all (a grandchild holding a pipe must not keep dtrun alive).
  virtual void Drain(std::chrono::milliseconds limit) = 0;

  // Runs `tools` side by side and waits for them for at most `limit`,
  // killing those still running. Blocks.
  virtual void RunTools(const std::vector<ToolRun>& tools,
                        std::chrono::milliseconds limit) = 0;
};

}  // namespace dtrun::agent
