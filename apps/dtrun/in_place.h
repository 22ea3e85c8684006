#pragma once

// dtrun's half of in-place recovery (--restart=in-place; the protocol with
// the workers is rendezvous/in_place.h): the workers' word, whether the
// group can re-form around a replacement, and the run folder's records
// that a replacement makes stale. The Agent decides (agent.h); the local
// group spawns the replacement and the job tells the survivors.

#include <chrono>
#include <map>
#include <string>

#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/worker_env.h"
#include "rendezvous/store.h"

namespace dtrun::agent::in_place {

// The workers' environment asks for it.
void AddEnv(const LaunchConfig& config, EnvMap* env);
// Under --restart=in-place, whether every worker of the attempt in
// `attempt_dir` (`pids`: local rank -> pid, those reaped in `exit_time`)
// said it can re-form its group, and `failed_pid` is the only one gone;
// when not, the log says why the group restarts whole.
bool CanReplace(const LaunchConfig& config, const std::string& attempt_dir,
                const std::map<int, int>& pids,
                const std::map<int, double>& exit_time, int failed_pid);
// Many nodes, a new round: whether every worker of `pids` is alive and
// said it can carry its state into another group (rendezvous/in_place.h,
// step 4); then each one's place there, written to its round file.
bool CanKeepForRound(const LaunchConfig& config, const std::string& attempt_dir,
                     const std::map<int, int>& pids,
                     const std::map<int, double>& exit_time);
Status WriteRound(const std::string& attempt_dir, int local_rank,
                  const EnvMap& env);
// Whether local rank `local_rank` has not read its round file yet (it
// removes it then); ForgetRound removes it for a worker that never will.
bool RoundUnread(const std::string& attempt_dir, int local_rank);
// Whether every worker of `pids` wrote its resume record.
bool AllResumed(const std::string& attempt_dir, const std::map<int, int>& pids);
void ForgetRound(const std::string& attempt_dir, int local_rank);
// How long a kept worker may take to read its round file: a healthy one
// reads it within 0.1 s and leaves its step at the next collective; one
// stuck in a collective with a SIGSTOPped or cut-off node never does. A
// healthy one taken for stuck costs its own restart, which takes the
// state from the others.
inline constexpr std::chrono::seconds kKeptStuck{2};
// That wait for workers whose slowest last step computed `slowest_step_s`
// seconds (-1: not known): a kept worker in the middle of a step reads its
// round file at the step's next collective, so a model whose step takes
// longer than kKeptStuck gets twice its step on top. Pure.
std::chrono::milliseconds KeptStuckLimit(double slowest_step_s);
// Before local rank `replaced` (-1: none) starts again: every rank's resume
// record goes (the survivors write new ones once re-formed, which the recovery
// report waits for), and the replaced rank's word that it can re-form.
void ForgetRecords(const std::string& attempt_dir,
                   const std::map<int, int>& pids, int replaced);

// The workers' store's side (rendezvous/in_place.h). Claim: the attempt a
// node's replacement runs as, after this node's newest `current`; -1 when
// another node's replacement is under way or the store does not answer
// (said); `who` names this node. Announce: the survivors are told.
// Release: the replacement of `restart_count` is back in step; another
// may start.
int Claim(rendezvous::Store* store, int current, const std::string& who);
bool Announce(rendezvous::Store* store, int restart_count, int rank);
void Release(rendezvous::Store* store, int restart_count);

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
