#pragma once

#include <map>

#include "apps/dtrun/process_spawner.h"

namespace dtrun::agent {

// fork/exec spawner. Workers get their own process group, a clean signal
// mask, and PR_SET_PDEATHSIG=SIGKILL, so none outlives a kill -9 of dtrun.
// Must be used from the thread that lives as long as the workers (the
// death signal follows the forking thread). Not thread-safe.
class PosixSpawner : public ProcessSpawner {
 public:
  Result<int> Spawn(const WorkerSpec& spec) override;
  void Signal(int pid, int signo) override;
  std::vector<WorkerExit> Reap() override;

 private:
  std::map<int, int> local_rank_of_;  // live pid -> local rank
};

}  // namespace dtrun::agent
