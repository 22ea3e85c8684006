// The local group's half of in-place recovery (--restart=in-place): whether
// a failed worker is replaced alone, and its replacement's start.
#include "apps/dtrun/in_place.h"
#include "apps/dtrun/local_group.h"
#include "apps/dtrun/standby.h"
#include "rendezvous/util/log.h"

namespace dtrun::agent {

// In place only when every worker said it can re-form and only this one is
// gone, and the job gives the replacement an attempt (on many nodes, one
// replacement at a time): the Agent decides from that.
int LocalGroup::ReplacementAttempt(const WorkerExit& e) {
  if (!agent_.CouldReplace() ||
      !in_place::CanReplace(config_, attempt_dir_, pids_, exit_time_, e.pid))
    return -1;
  const int attempt = observer_->ClaimReplacement(agent_.restart_count());
  if (attempt < 0) {
    Logger("dtrun.agent")
        ->warn(
            "--restart=in-place: another node's worker is being replaced; the "
            "whole group restarts");
  }
  return attempt;
}

// The survivors learn of the replacement from the job (the store) before
// it starts, so that the group they re-form is the one it joins; the
// recovery report then reads their new resume records as it reads a
// restarted group's.
void LocalGroup::ReplaceWorker(int lr, int restart_count) {
  watch_.OnRestartDecided();
  const int rank = assignment_.base_rank + lr;
  in_place::ForgetRecords(attempt_dir_, pids_, lr);
  // Unheard, the survivors fail after in_place::kRegroupWait, and the
  // group restarts whole then.
  if (!observer_->OnReplacing(restart_count, rank))
    Logger("dtrun.agent")
        ->error("the survivors were not told of the replacement");
  in_place::SayReplacing(lr, rank, restart_count, config_.max_restarts,
                         static_cast<int>(pids_.size()) - 1);
  watch_.OnSpawning(restart_count);
  attempt_.restart_count = restart_count;
  const double started = clock_->UnixSeconds();
  AwaitWarmStandby(workers_, signals_, clock_, config_.handled_signals,
                   &deferred_signals_);
  const int pid = SpawnRank(lr);
  hang_.Reset(config_.nproc_per_node, attempt_dir_, restart_count);
  beats_.Reset(attempt_dir_, config_.nproc_per_node);
  watch_.OnSpawned(started);
  if (pid)
    in_place::SayReplaced(lr, pid, restart_count, workers_->spawned_warm());
}

}  // namespace dtrun::agent
