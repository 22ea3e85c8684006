// The local group's half of in-place recovery (--restart=in-place): whether
// a failed worker is replaced alone, and its replacement's start.
#include <signal.h>

#include <algorithm>
#include <map>

#include "apps/dtrun/in_place.h"
#include "apps/dtrun/local_group.h"
#include "apps/dtrun/standby.h"
#include "rendezvous/util/log.h"

namespace dtrun::agent {

// In place only when every worker said it can re-form and only this one is
// gone, and the job gives the replacement an attempt (on many nodes, one
// replacement at a time): the Agent decides from that.
int LocalGroup::ReplacementAttempt(const WorkerExit& e) {
  // Until every kept worker re-formed in the new round (its resume record
  // written), a replacement's group would not be theirs.
  if (round_settling_)
    round_settling_ = !in_place::AllResumed(attempt_dir_, pids_);
  if (round_settling_ || !agent_.CouldReplace() ||
      !in_place::CanReplace(config_, attempt_dir_, pids_, exit_time_, e.pid))
    return -1;
  const int attempt = observer_->ClaimReplacement(agent_.restart_count());
  if (attempt < 0) {
    Logger("dtrun.agent")
        ->warn(
            "--restart=in-place: no attempt for a replacement (another "
            "node's is under way, or the workers' store did not answer); the "
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

// The recovery report counts from here, as from a round that stops them.
bool LocalGroup::KeepForNewRound() {
  if (!elastic_ || agent_.phase() != Phase::kRunning || agent_.replacing() ||
      !in_place::CanKeepForRound(config_, attempt_dir_, pids_, exit_time_))
    return false;
  watch_.OnRoundOver(View(), clock_->UnixSeconds());
  return true;
}

// Each kept worker finds its place in its round file, re-forms there and
// goes on with the state it holds; the new workers of other nodes take it.
bool LocalGroup::ContinueRound(int round) {
  if (!agent_.ContinueRound(round)) return false;
  outcome_ = Outcome::kRunning;
  attempt_.restart_count = round;
  if (staged_port_ != attempt_.master_port)
    in_place::RemoveStaged(config_, staged_port_);
  staged_port_ = attempt_.master_port;
  for (const auto& [lr, pid] : pids_) {
    const EnvMap env =
        WorkerEnv(base_env_, attempt_,
                  PlaceOf(lr, config_.nproc_per_node, assignment_.base_rank,
                          assignment_.group_rank, assignment_.group_world_size,
                          assignment_.world_size));
    Status s = in_place::WriteRound(attempt_dir_, lr, env);
    if (!s.ok()) {
      Logger("dtrun.agent")->error("in-place recovery: {}", s.message());
      return false;
    }
  }
  // Their resume records of this round, not the last one's, are the
  // recovery's (the report waits for them).
  in_place::ForgetRecords(attempt_dir_, pids_, -1);
  watch_.OnSpawning(round);
  hang_.Reset(config_.nproc_per_node, attempt_dir_, round);
  // The kept workers' last steps, read before the reset: a slow model's
  // worker may be a whole step away from its next collective when its
  // round file lands, and is not stuck for that (KeptStuckLimit).
  double slowest = -1;
  for (int lr = 0; lr < beats_.size(); ++lr)
    slowest = std::max(slowest, beats_.last(lr).line.compute_s);
  keep_limit_ = in_place::KeptStuckLimit(slowest);
  beats_.Reset(attempt_dir_, config_.nproc_per_node);
  watch_.OnSpawned(clock_->UnixSeconds());
  keep_check_at_ = clock_->Now() + keep_limit_;
  round_settling_ = true;
  Logger("dtrun.agent")
      ->info("round {}: kept the {} worker(s) in place as ranks {}..{} of {}",
             round, pids_.size(), assignment_.base_rank,
             assignment_.base_rank + config_.nproc_per_node - 1,
             assignment_.world_size);
  return true;
}

// Its exit is then no failure (abandoned_), and the new worker, of this
// round from its start, takes the state from the others as new workers of
// other nodes do.
void LocalGroup::CheckKeptWorkers() {
  if (!keep_check_at_ || clock_->Now() < *keep_check_at_) return;
  keep_check_at_.reset();
  if (agent_.phase() != Phase::kRunning) return;
  for (const auto& [lr, pid] : std::map<int, int>(pids_)) {
    if (exit_time_.count(pid) || !in_place::RoundUnread(attempt_dir_, lr))
      continue;
    Logger("dtrun.agent")
        ->warn(
            "local_rank {} (pid {}) did not take its place in round {} "
            "within {:.1f} s (stuck in a collective with a lost node?): a "
            "new worker takes it",
            lr, pid, attempt_.restart_count, keep_limit_.count() / 1000.0);
    abandoned_[pid] = true;
    ::kill(pid, SIGKILL);
    in_place::ForgetRound(attempt_dir_, lr);
    AwaitWarmStandby(workers_, signals_, clock_, config_.handled_signals,
                     &deferred_signals_);
    SpawnRank(lr);
  }
}

}  // namespace dtrun::agent
