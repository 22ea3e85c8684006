#pragma once

// dtrun's half of in-place recovery (--restart=in-place; the protocol with
// the workers is rendezvous/in_place.h): the workers' word, whether the
// group can re-form around a replacement, and the run folder's records
// that a replacement makes stale. The Agent decides (agent.h); the local
// group spawns the replacement and the job tells the survivors.

#include <map>
#include <string>

#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/worker_env.h"

namespace dtrun::agent::in_place {

// The workers' environment asks for it (one node); a job that meets other
// nodes through rendezvous is told it restarts whole there.
void AddEnv(const LaunchConfig& config, bool elastic, EnvMap* env);
// Under --restart=in-place, whether every worker of the attempt in
// `attempt_dir` (`pids`: local rank -> pid, those reaped in `exit_time`)
// said it can re-form its group, and `failed_pid` is the only one gone;
// when not, the log says why the group restarts whole.
bool CanReplace(const LaunchConfig& config, const std::string& attempt_dir,
                const std::map<int, int>& pids,
                const std::map<int, double>& exit_time, int failed_pid);
// Before local rank `replaced` starts again: every rank's resume record
// goes (the survivors write new ones once re-formed, which the recovery
// report waits for), and the replaced rank's word that it can re-form.
void ForgetRecords(const std::string& attempt_dir,
                   const std::map<int, int>& pids, int replaced);

// Under --restart=in-place, removes the state survivors of the job whose
// store listens on `master_port` staged for a replacement and left (they
// were stopped mid-recovery).
void RemoveStaged(const LaunchConfig& config, int master_port);
// The log's lines: local rank `lr` (global `rank`) is being replaced as
// attempt `restart_count` while `others` run on; it started as `pid`.
void SayReplacing(int lr, int rank, int restart_count, int max_restarts,
                  int others);
void SayReplaced(int lr, int pid, int restart_count, bool warm);

}  // namespace dtrun::agent::in_place
