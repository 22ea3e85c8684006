#pragma once

#include <map>
#include <string>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::agent {

// Where one worker sits in the job; the agent fills it for each rank.
struct WorkerPlace {
  int local_rank = 0;
  int rank = 0;        // global rank
  int group_rank = 0;  // this node's rank
  int role_rank = 0;
  int local_world_size = 1;
  int world_size = 1;
  int group_world_size = 1;
  int role_world_size = 1;
};

// Local rank `local_rank` of a node holding group rank `group_rank` of
// `group_world_size`, its ranks from `base_rank`, of `world_size` workers
// (`nproc` a node). Pure.
WorkerPlace PlaceOf(int local_rank, int nproc, int base_rank, int group_rank,
                    int group_world_size, int world_size);

// What is the same for every worker of one attempt. restart_count is the
// attempt's number: restarts so far on one node; with a rendezvous, the round,
// so it is the same on every node (torchrun's per-agent count is not).
struct AttemptEnv {
  std::string role = "default";
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id = "none";
  std::string error_file_dir;  // <attempt dir>; error file =
                               // dir/<local_rank>/error.json
  // TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun exports it to its workers.
  std::string signals_to_handle;
  // --virtual-local-rank: LOCAL_RANK=0 and one GPU per worker.
  bool virtual_local_rank = false;
};

using EnvMap = std::map<std::string, std::string>;

// The environment of one worker: `base` (the agent's own) overridden with
// torchrun's variables. Pure function.
//  - OMP_NUM_THREADS=1 when local_world_size > 1 and base has none.
//  - TORCH_NCCL_ASYNC_ERROR_HANDLING keeps the base value, else "1"; the
//    deprecated NCCL_ASYNC_ERROR_HANDLING is never added (torch >= 2.2 warns
//    about it; older torch gets it from the shim or lib).
//  - virtual_local_rank: LOCAL_RANK=0, CUDA_VISIBLE_DEVICES the local rank's
//    entry of base's list (its index when base has none).
EnvMap WorkerEnv(const EnvMap& base, const AttemptEnv& attempt,
                 const WorkerPlace& place);

// The error file of a worker of an attempt: <attempt dir>/<local_rank>/
// error.json, where torch's @record writes and error_report.cc reads. Pure.
std::string ErrorFilePath(const AttemptEnv& attempt, int local_rank);

// The environment of the Python workers' standby (standby.h): `base` and
// the defaults every worker of a node of `local_world_size` gets
// (OMP_NUM_THREADS, ...), none of the variables that differ per worker.
EnvMap StandbyEnv(const EnvMap& base, int local_world_size);

// map -> "K=V" strings for execve, sorted by name (the map's order), so two
// workers' environments compare line by line. Pure.
std::vector<std::string> ToEnvStrings(const EnvMap& env);

// The torch compatibility shim: a sitecustomize (apps/dtrun/python/
// dtrun_torch_shim, embedded in the binary) that lets a torch built without
// libuv (Debian's 2.6) join the agent's store; apps/dtrun/README.md,
// "Torch 2.x workers".
// "0" turns it off
inline constexpr char kTorchShimSwitch[] = "DTRUN_TORCH_SHIM";
// the folder in use
inline constexpr char kTorchShimDir[] = "DTRUN_TORCH_SHIM_DIR";

// Whether `env` should get the shim: not turned off, and no shim already on
// its PYTHONPATH (an interactive console's, or an outer dtrun's). Pure.
bool WantsTorchShim(const EnvMap& env);

// `env` with `dir` first on PYTHONPATH (the user's entries kept after it)
// and DTRUN_TORCH_SHIM_DIR=dir. Pure; callers check WantsTorchShim first.
EnvMap WithTorchShim(const EnvMap& env, const std::string& dir);

// If WantsTorchShim(*env): writes the shim into `dir` (created if missing)
// and applies WithTorchShim to *env. The error names the file.
Status InstallTorchShim(const std::string& dir, EnvMap* env);

}  // namespace dtrun::agent
