#pragma once

#include <map>
#include <optional>
#include <set>

#include "apps/dtrun/kernel_witness.h"
#include "apps/dtrun/log_mux.h"
#include "apps/dtrun/standby.h"
#include "apps/dtrun/worker_group.h"

namespace dtrun::agent {

// WorkerGroup on fork/exec. Workers get their own process group, a clean
// signal mask and PR_SET_PDEATHSIG=SIGKILL, so none outlives a kill -9 of
// dtrun; their pipes feed a LogMux. Each exit it reaps carries what the
// kernel said of it (KernelWitness). Must be used from the thread that lives
// as long as the workers (the death signal follows the forking thread).
// Not thread-safe.
class PosixWorkerGroup : public WorkerGroup {
 public:
  Result<int> Spawn(const WorkerSpec& spec) override;
  void Signal(int pid, int signo) override;
  void Stop(int pid, int signo) override;
  std::vector<WorkerExit> Reap() override;
  // The standby's socket too, until it said whether it is ready.
  std::vector<int> output_fds() const override;
  void OnReadable(int fd) override;
  void ReadPending(std::chrono::milliseconds limit) override;
  void Drain(std::chrono::milliseconds limit) override;
  void RunTools(const std::vector<ToolRun>& tools,
                std::chrono::milliseconds limit) override;
  void UseStandby(std::unique_ptr<Standby> standby) override;
  bool spawned_warm() const override { return warm_; }
  std::chrono::milliseconds standby_wait() const override;
  std::vector<std::string> KernelErrors() override;
  std::vector<std::string> LogErrors() const override;

 private:
  Result<int> ForkExec(const WorkerSpec& spec, int out_fd, int err_fd);
  std::optional<Result<int>> FromStandby(const WorkerSpec& spec, int out_fd,
                                         int err_fd);
  void DropStandby(const std::string& why);
  void WatchStandby();
  void KillLingering();

  std::unique_ptr<Standby> standby_;
  bool warm_ = false;  // the last Spawn's worker came from the standby
  std::set<int> spawned_ranks_;  // local ranks started before: a restart
  bool standby_said_ = false;    // its readiness was logged
  // A restart started cold after waiting for it: later ones do not wait.
  bool standby_missed_ = false;

  std::map<int, int> local_rank_of_;  // live pid -> local rank
  LogMux mux_;
  KernelWitness witness_;
  // Workers sent a stop signal alone: their groups get it at their exit,
  // then SIGKILL at the next start or at the end (KillLingering).
  std::map<int, int> group_signal_;
  std::set<int> lingering_;
};

}  // namespace dtrun::agent
