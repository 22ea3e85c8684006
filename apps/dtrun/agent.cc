// The local agent's lifecycle as a pure state machine (torchrun's monitor
// loop: start, watch, stop on the first failure, restart or finish). Events
// and `now` come in, actions go out; local_group.cc carries them out.
#include "apps/dtrun/agent.h"

#include <csignal>

namespace dtrun::agent {

std::vector<Action> Agent::Start(TimePoint) {
  phase_ = Phase::kRunning;
  return {{Action::Kind::kStartGroup, restart_count_}};
}

std::vector<Action> Agent::StartRound(int restart_count, TimePoint) {
  phase_ = Phase::kRunning;
  restart_count_ = restart_count;
  return {{Action::Kind::kStartGroup, restart_count_}};
}

bool Agent::ContinueRound(int restart_count) {
  if (phase_ != Phase::kRunning || replacing_ >= 0) return false;
  restart_count_ = restart_count;
  return true;
}

std::vector<Action> Agent::StopForNewRound(TimePoint now) {
  // A stop signal outranks a new round: the user asked for the job to end.
  if (phase_ == Phase::kShuttingDown) return {};
  if (alive_ == 0) {
    phase_ = Phase::kFinished;
    return {{Action::Kind::kGroupStopped, restart_count_}};
  }
  return Stop(Phase::kRestarting, SIGTERM, now);
}

void Agent::OnGroupStarted() {
  // The last attempt's failures stay readable until now, so the summary
  // printed after a stop or a final failure still has them.
  alive_ = opts_.nproc;
  replacing_ = -1;
  killed_ = false;
  hung_ = false;
  unhealthy_ = false;
  failures_.clear();
  d_since_.clear();
}

void Agent::OnAttemptFailing(int64_t highest_step) {
  const int limit = opts_.max_restarts_without_progress;
  if (limit <= 0) return;
  if (highest_step > highest_step_) {
    highest_step_ = highest_step;
    restarts_without_progress_ = 0;
    return;
  }
  if (restart_count_ == 0) return;  // the first attempt is no restart
  if (++restarts_without_progress_ < limit) return;
  why_gave_up_ = "restarts made no progress: " + std::to_string(limit) +
                 " restart(s) in a row beat no step past " +
                 (highest_step_ < 0 ? std::string("the start (no beat)")
                                    : "step " + std::to_string(highest_step_)) +
                 " (--max-restarts-without-progress=" + std::to_string(limit) +
                 "); not restarting, exit code 93: do not requeue";
  GiveUp();
}

// A worker in D state cannot be killed, so a restart would leave it behind
// holding its GPU: one seen in D for the whole timeout makes the group
// unhealthy (stopped, named, not restarted).
std::vector<Action> Agent::OnDState(const std::vector<int>& local_ranks,
                                    TimePoint now) {
  if (opts_.uninterruptible_timeout.count() <= 0 || phase_ != Phase::kRunning)
    return {};
  std::map<int, TimePoint> still;
  for (int lr : local_ranks) {
    auto seen = d_since_.find(lr);
    still[lr] = seen == d_since_.end() ? now : seen->second;
  }
  d_since_ = std::move(still);
  for (const auto& [lr, since] : d_since_) {
    if (now - since < opts_.uninterruptible_timeout) continue;
    stuck_ = Stuck{lr, since};
    return OnUnhealthy(now);
  }
  return {};
}

bool Agent::CouldReplace() const {
  const bool left = opts_.in_place_limit < 0
                        ? restart_count_ < opts_.max_restarts
                        : replaced_count_ < opts_.in_place_limit;
  return opts_.in_place && phase_ == Phase::kRunning && replacing_ < 0 &&
         alive_ > 1 && left && !give_up_;
}

std::vector<Action> Agent::OnWorkerExit(const WorkerExit& exit, TimePoint now,
                                        bool replaceable, int attempt) {
  const bool could_replace = CouldReplace();
  if (alive_ > 0) --alive_;
  if (phase_ == Phase::kRunning) {
    // In place: the survivors keep their processes and state; only the
    // failed worker starts again, into the group they re-form.
    if (exit.failed() && replaceable && could_replace) {
      // A restart like any other against --max-restarts; the replacement
      // counts as alive from now, as a restarted group's workers do.
      restart_count_ = attempt >= 0 ? attempt : restart_count_ + 1;
      ++replaced_count_;
      ++alive_;
      // Until it beats, a second failure stops the group: the survivors
      // may be half-way through re-forming around this one.
      replacing_ = exit.local_rank;
      replaced_exit_ = exit;
      Action replace{Action::Kind::kReplaceWorker, restart_count_};
      replace.local_rank = exit.local_rank;
      return {replace};
    }
    // As in torchrun, the first failure stops the siblings at once, while a
    // worker that exits 0 early just waits: the group succeeds only when every
    // worker has exited 0.
    if (exit.failed()) {
      failures_.push_back(exit);
      if (alive_ > 0) return Stop(Phase::kStopping, SIGTERM, now);
    }
    // A survivor that ends (its last collective done before the death)
    // while the others re-form around a replacement leaves it a group that
    // never forms: the death it replaced is then the attempt's failure,
    // and the group restarts from its checkpoint.
    if (replacing_ >= 0 && exit.local_rank != replacing_) {
      failures_.push_back(replaced_exit_);
      replacing_ = -1;
      if (alive_ > 0) return Stop(Phase::kStopping, SIGTERM, now);
    }
    return alive_ == 0 ? GroupGone() : std::vector<Action>{};
  }
  // Workers we are stopping: their exits are consequences, not causes. Not
  // recording them keeps the summary's root cause on the worker that failed.
  return alive_ == 0 ? GroupGone() : std::vector<Action>{};
}

std::vector<Action> Agent::OnSignal(int signo, TimePoint now, int forward) {
  if (phase_ == Phase::kFinished) return {};
  // A second signal while shutting down (Ctrl-C pressed again) means "now":
  // skip the rest of the grace period. During a failure stop, a signal takes
  // over instead: the job ends with it rather than restarting.
  if (phase_ == Phase::kShuttingDown && !killed_) return Kill(now);
  stop_signal_ = signo;
  if (alive_ == 0) {
    phase_ = Phase::kFinished;
    return {{Action::Kind::kFinish, restart_count_, signo}};
  }
  // The workers get the signal dtrun got, as torchrun forwards it: a worker
  // may treat SIGINT (save and exit) differently from SIGTERM.
  return Stop(Phase::kShuttingDown, forward ? forward : signo, now);
}

std::vector<Action> Agent::OnHang(int signo, TimePoint now) {
  // A group already being stopped is not hung: its exits are on their way.
  // `signo` is SIGABRT for Python workers, so their fault handler prints the
  // stacks before they die; SIGTERM for native ones, already inspected.
  if (phase_ != Phase::kRunning || alive_ == 0) return {};
  hung_ = true;
  return Stop(Phase::kStopping, signo, now);
}

std::vector<Action> Agent::OnUnhealthy(TimePoint now) {
  if (phase_ != Phase::kRunning || alive_ == 0) return {};
  unhealthy_ = true;
  // Stopping: SIGTERM cannot wake a process in D state any more than
  // SIGKILL can, so go straight to SIGKILL and the abandon deadline.
  phase_ = Phase::kStopping;
  return Kill(now);
}

std::vector<Action> Agent::Kill(TimePoint now) {
  // SIGKILL cannot reach a process in uninterruptible sleep (a dead NFS
  // server, a wedged GPU driver): after kill_wait dtrun stops waiting, so the
  // launcher itself never hangs.
  killed_ = true;
  abandon_at_ = now + opts_.kill_wait;
  return {{Action::Kind::kSignalGroup, 0, SIGKILL}};
}

std::vector<Action> Agent::OnTick(TimePoint now) {
  bool stopping = phase_ == Phase::kStopping ||
                  phase_ == Phase::kShuttingDown ||
                  phase_ == Phase::kRestarting;
  if (!stopping) return {};
  if (!killed_) return now < kill_at_ ? std::vector<Action>{} : Kill(now);
  if (now < abandon_at_ || alive_ == 0) return {};
  // The survivors are counted gone so the attempt can end (and restart);
  // kAbandonGroup lets the caller report them by pid.
  alive_ = 0;
  std::vector<Action> out = {{Action::Kind::kAbandonGroup, restart_count_}};
  for (const Action& a : GroupGone()) out.push_back(a);
  return out;
}

std::optional<TimePoint> Agent::deadline() const {
  // Only a stop has a deadline: a running group is event-driven (exits,
  // signals, beats), so the loop can sleep in poll() without waking.
  bool stopping = phase_ == Phase::kStopping ||
                  phase_ == Phase::kShuttingDown ||
                  phase_ == Phase::kRestarting;
  if (!stopping) return std::nullopt;
  return killed_ ? abandon_at_ : kill_at_;
}

std::vector<Action> Agent::Stop(Phase phase, int signo, TimePoint now) {
  // Every stop starts a fresh grace period (torchrun: 30 s) before SIGKILL;
  // the signal goes to each worker, then to the rest of its process group
  // (data loaders) once it exited, so its handler can still use them.
  phase_ = phase;
  kill_at_ = now + opts_.term_timeout;
  killed_ = false;
  return {{Action::Kind::kSignalGroup, 0, signo}};
}

std::vector<Action> Agent::GroupGone() {
  if (phase_ == Phase::kRestarting) {
    phase_ = Phase::kFinished;
    return {{Action::Kind::kGroupStopped, restart_count_}};
  }
  if (phase_ == Phase::kShuttingDown) {
    phase_ = Phase::kFinished;
    return {{Action::Kind::kFinish, restart_count_, stop_signal_}};
  }
  if (failures_.empty() && !hung_ && !unhealthy_) {
    phase_ = Phase::kFinished;
    return {{Action::Kind::kFinish, restart_count_}};
  }
  // A hang uses up a restart like a failed exit. A new round (kRestarting,
  // above) does not: membership changes are not the job's fault.
  if (restart_count_ < opts_.max_restarts && !unhealthy_ && !give_up_) {
    ++restart_count_;
    phase_ = Phase::kRunning;
    return {{Action::Kind::kStartGroup, restart_count_}};
  }
  phase_ = Phase::kFinished;
  Action finish{Action::Kind::kFinish, restart_count_};
  finish.failed = true;
  return {finish};
}

}  // namespace dtrun::agent
