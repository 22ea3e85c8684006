#pragma once

#include <map>
#include <string>
#include <vector>

namespace dtrun::agent {

// Where one worker sits in the job; the agent fills it for each rank.
struct WorkerPlace {
  int local_rank = 0;
  int rank = 0;             // global rank
  int group_rank = 0;       // this node's rank
  int role_rank = 0;
  int local_world_size = 1;
  int world_size = 1;
  int group_world_size = 1;
  int role_world_size = 1;
};

// What is the same for every worker of one attempt.
struct AttemptEnv {
  std::string role = "default";
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id = "none";
  std::string error_file_dir;  // <attempt dir>; error file = dir/<local_rank>/error.json
};

using EnvMap = std::map<std::string, std::string>;

// The environment of one worker: `base` (the agent's own) overridden with
// torchrun's variables. Pure function.
//  - OMP_NUM_THREADS=1 when local_world_size > 1 and base has none.
//  - NCCL_ASYNC_ERROR_HANDLING and TORCH_NCCL_ASYNC_ERROR_HANDLING keep the
//    base value, else "1".
EnvMap WorkerEnv(const EnvMap& base, const AttemptEnv& attempt, const WorkerPlace& place);

// The error file of a worker of an attempt.
std::string ErrorFilePath(const AttemptEnv& attempt, int local_rank);

// map -> "K=V" strings for execve.
std::vector<std::string> ToEnvStrings(const EnvMap& env);

}  // namespace dtrun::agent
