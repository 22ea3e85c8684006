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

std::vector<Action> Agent::StopForNewRound(TimePoint now) {
  if (phase_ == Phase::kShuttingDown) return {};
  if (alive_ == 0) {
    phase_ = Phase::kFinished;
    return {{Action::Kind::kGroupStopped, restart_count_}};
  }
  return Stop(Phase::kRestarting, SIGTERM, now);
}

void Agent::OnGroupStarted() {
  alive_ = opts_.nproc;
  killed_ = false;
  hung_ = false;
  failures_.clear();
}

std::vector<Action> Agent::OnWorkerExit(const WorkerExit& exit, TimePoint now) {
  if (alive_ > 0) --alive_;
  if (phase_ == Phase::kRunning) {
    if (exit.failed()) {
      failures_.push_back(exit);
      if (alive_ > 0) return Stop(Phase::kStopping, SIGTERM, now);
    }
    return alive_ == 0 ? GroupGone() : std::vector<Action>{};
  }
  // Workers we are stopping: their exits are consequences, not causes.
  return alive_ == 0 ? GroupGone() : std::vector<Action>{};
}

std::vector<Action> Agent::OnSignal(int signo, TimePoint now) {
  if (phase_ == Phase::kFinished) return {};
  if (phase_ == Phase::kShuttingDown && !killed_) return Kill(now);
  stop_signal_ = signo;
  if (alive_ == 0) {
    phase_ = Phase::kFinished;
    return {{Action::Kind::kFinish, restart_count_, signo}};
  }
  return Stop(Phase::kShuttingDown, signo, now);
}

std::vector<Action> Agent::OnHang(int signo, TimePoint now) {
  if (phase_ != Phase::kRunning || alive_ == 0) return {};
  hung_ = true;
  return Stop(Phase::kStopping, signo, now);
}

std::vector<Action> Agent::Kill(TimePoint now) {
  killed_ = true;
  abandon_at_ = now + opts_.kill_wait;
  return {{Action::Kind::kSignalGroup, 0, SIGKILL}};
}

std::vector<Action> Agent::OnTick(TimePoint now) {
  bool stopping = phase_ == Phase::kStopping || phase_ == Phase::kShuttingDown ||
                  phase_ == Phase::kRestarting;
  if (!stopping) return {};
  if (!killed_) return now < kill_at_ ? std::vector<Action>{} : Kill(now);
  if (now < abandon_at_ || alive_ == 0) return {};
  alive_ = 0;
  std::vector<Action> out = {{Action::Kind::kAbandonGroup, restart_count_}};
  for (const Action& a : GroupGone()) out.push_back(a);
  return out;
}

std::optional<TimePoint> Agent::deadline() const {
  bool stopping = phase_ == Phase::kStopping || phase_ == Phase::kShuttingDown ||
                  phase_ == Phase::kRestarting;
  if (!stopping) return std::nullopt;
  return killed_ ? abandon_at_ : kill_at_;
}

std::vector<Action> Agent::Stop(Phase phase, int signo, TimePoint now) {
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
  if (failures_.empty() && !hung_) {
    phase_ = Phase::kFinished;
    return {{Action::Kind::kFinish, restart_count_}};
  }
  if (restart_count_ < opts_.max_restarts) {
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
