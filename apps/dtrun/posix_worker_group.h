#pragma once

#include <map>

#include "apps/dtrun/log_mux.h"
#include "apps/dtrun/worker_group.h"

namespace dtrun::agent {

// WorkerGroup on fork/exec. Workers get their own process group, a clean
// signal mask and PR_SET_PDEATHSIG=SIGKILL, so none outlives a kill -9 of
// dtrun; their pipes feed a LogMux. Must be used from the thread that lives
// as long as the workers (the death signal follows the forking thread).
// Not thread-safe.
class PosixWorkerGroup : public WorkerGroup {
 public:
  Result<int> Spawn(const WorkerSpec& spec) override;
  void Signal(int pid, int signo) override;
  std::vector<WorkerExit> Reap() override;
  std::vector<int> output_fds() const override { return mux_.fds(); }
  void OnReadable(int fd) override { mux_.OnReadable(fd); }
  void ReadPending(std::chrono::milliseconds limit) override;
  void Drain(std::chrono::milliseconds limit) override;
  void RunTools(const std::vector<ToolRun>& tools,
                std::chrono::milliseconds limit) override;

 private:
  Result<int> ForkExec(const WorkerSpec& spec, int out_fd, int err_fd);

  std::map<int, int> local_rank_of_;  // live pid -> local rank
  LogMux mux_;
};

}  // namespace dtrun::agent
