#pragma once

#include <string>
#include <vector>

#include "apps/dtrun/agent.h"
#include "rendezvous/status.h"

namespace dtrun::agent {

struct WorkerSpec {
  int local_rank = 0;
  std::vector<std::string> argv;  // argv[0] is the program path
  std::vector<std::string> env;   // "K=V"
  int stdout_fd = -1;             // becomes the worker's fd 1 (-1: inherit)
  int stderr_fd = -1;             // becomes the worker's fd 2 (-1: inherit)
};

// Starts and signals worker processes. Each worker leads its own process
// group, so a signal reaches its children too.
class ProcessSpawner {
 public:
  virtual ~ProcessSpawner() = default;
  // Returns the pid, or why the process could not be started.
  virtual Result<int> Spawn(const WorkerSpec& spec) = 0;
  // Sends `signo` to the process group led by `pid`.
  virtual void Signal(int pid, int signo) = 0;
  // Collects every worker that has exited since the last call; never blocks.
  virtual std::vector<WorkerExit> Reap() = 0;
};

}  // namespace dtrun::agent
