#pragma once

#include <optional>
#include <string>
#include <vector>

#include "apps/dtrun/worker_env.h"

namespace dtrun::agent {

// What SLURM's environment says about this job step, for the flags the
// user did not give. Pure: built from an environment map.
struct SlurmJob {
  std::string job_id;  // SLURM_JOB_ID -> --rdzv-id
  int nnodes = 0;      // SLURM_NNODES / SLURM_JOB_NUM_NODES -> --nnodes
  int node_id = -1;    // SLURM_NODEID -> --node-rank
  std::vector<std::string> hosts;  // SLURM_JOB_NODELIST, expanded
  int gpus_on_node = 0;            // SLURM_GPUS_ON_NODE
  int cpus_on_node = 0;            // SLURM_CPUS_ON_NODE
  // The store host: the first host of the node list (SLURM_NODEID 0's).
  std::string master_addr() const { return hosts.empty() ? "" : hosts.front(); }
  // A port derived from the job id, so jobs sharing nodes do not collide:
  // 20000 + job_id % 20000.
  int master_port() const;
};

// Returns the job when SLURM_JOB_ID is set (and DTRUN_IGNORE_SLURM is not),
// or an error message for a malformed node list.
std::optional<SlurmJob> ReadSlurmJob(const EnvMap& env, std::string* error);

// "n[1-3,07-08],gpu1" -> n1 n2 n3 n07 n08 gpu1 (zero padding kept). One
// bracket group per name. False on bad syntax, an empty list or a range of
// more than 100000 names. Pure.
bool ExpandNodelist(const std::string& list, std::vector<std::string>* hosts);

}  // namespace dtrun::agent
