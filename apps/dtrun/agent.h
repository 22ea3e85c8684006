#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/dtrun/clock.h"

namespace dtrun::agent {

struct AgentOptions {
  int nproc = 1;                                  // workers in the local group
  int max_restarts = 0;                           // group restarts allowed
  std::chrono::milliseconds term_timeout{30000};  // SIGTERM -> SIGKILL grace
  // After SIGKILL, how long to wait for workers before going on without
  // them (a worker in uninterruptible sleep survives SIGKILL).
  std::chrono::milliseconds kill_wait{10000};
  // TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT (0: not watched).
  std::chrono::milliseconds uninterruptible_timeout{0};
  // --max-restarts-without-progress (0: no limit).
  int max_restarts_without_progress = 0;
  // --restart=in-place: a failed worker is replaced alone while the others
  // run on, when they can (OnWorkerExit's `replaceable`).
  bool in_place = false;
  // Multi-node, where the rendezvous counts group restarts: how many
  // in-place replacements this node may make (-1: they share max_restarts
  // with the group's restarts, as on one node).
  int in_place_limit = -1;
};

// How one worker ended, as the spawner saw it.
struct WorkerExit {
  int local_rank = 0;
  int pid = 0;
  int exit_code = 0;         // when it exited
  int signal = 0;            // when a signal killed it (then exit_code is 0)
  bool core_dumped = false;  // ...and the kernel dumped its core
  // What the kernel says beyond the exit (KernelWitness::WhyDied): an OOM
  // kill, a fatal signal's meaning and core; "" when nothing.
  std::string cause{};
  bool oom = false;  // the kernel's OOM killer killed it
  bool failed() const { return exit_code != 0 || signal != 0; }
};

struct Action {
  enum class Kind {
    kStartGroup,   // spawn every local worker for attempt `restart_count`
    kSignalGroup,  // stop every live worker with `signo` (WorkerGroup::Stop)
    kFinish,  // exit: `failed` after the last attempt, or `signo` if stopped
    kGroupStopped,   // the group stopped for a new rendezvous round
                     // (StopForNewRound)
    kAbandonGroup,   // workers outlived SIGKILL by kill_wait: report them, stop
                     // waiting
    kReplaceWorker,  // spawn worker `local_rank` alone, for `restart_count`;
                     // the others run on (in-place recovery)
  };
  Kind kind;
  int restart_count = 0;
  int signo = 0;
  bool failed = false;
  int local_rank = -1;  // kReplaceWorker's
};

// How the local group's latest attempt (or round) ended, as the jobs see it.
enum class GroupOutcome {
  kRunning,    // not over yet
  kSucceeded,  // every worker exited 0
  kFailed,     // a worker failed and no restart is left (elastic: at once)
  kStopped,    // stopped for a new rendezvous round (StopForNewRound)
  kSignaled,   // dtrun got a stop signal; the workers are gone
};

enum class Phase {
  kIdle,          // before Start
  kRunning,       // the group runs
  kStopping,      // a worker failed: the others are being stopped
  kShuttingDown,  // dtrun got a stop signal: every worker is being stopped
  kRestarting,    // stopping the group because the rendezvous moved on
  kFinished,
};

// The local agent's state machine: events in, actions out. No I/O, no clock
// of its own (callers pass `now`), never blocks. Owned and called by one
// thread (LocalGroup's loop); the caller must perform each action in order.
class Agent {
 public:
  explicit Agent(const AgentOptions& options) : opts_(options) {}

  // -> StartGroup(0).
  std::vector<Action> Start(TimePoint now);
  // Multi-node: start the group of a rendezvous round (after kFinish or
  // kGroupStopped). -> StartGroup(restart_count).
  std::vector<Action> StartRound(int restart_count, TimePoint now);
  // Multi-node, --restart=in-place: the running group goes on into the
  // round `restart_count` (its workers kept, re-forming there). False
  // when it is not running.
  bool ContinueRound(int restart_count);
  // Multi-node: the rendezvous moved on; stop the group without counting a
  // failure. -> SignalGroup(SIGTERM) ... GroupStopped, or GroupStopped now.
  std::vector<Action> StopForNewRound(TimePoint now);
  // The spawner started the group of the last StartGroup: all `nproc`
  // workers count as alive, and the previous attempt's failures are dropped.
  void OnGroupStarted();
  // A worker was reaped. While running, its failure is kept in failures() and
  // stops the others (-> SignalGroup(SIGTERM)); exits of workers being stopped
  // are not failures. The last exit -> StartGroup(n+1), Finish or GroupStopped.
  // With in_place, a failure the others can survive (`replaceable`: every
  // worker can re-form its group) while restarts are left and no other
  // replacement is under way -> ReplaceWorker(n+1) instead: it counts as a
  // restart, not as the attempt's failure. A failure while a replacement
  // is under way stops the group as any other. `attempt` (multi-node: the
  // one the job claimed for it) numbers the replacement's attempt; -1:
  // the next of this node's.
  std::vector<Action> OnWorkerExit(const WorkerExit& exit, TimePoint now,
                                   bool replaceable = false, int attempt = -1);
  // Whether a failure now, of a worker of the running group, could be
  // replaced in place (the restarts left, no replacement under way),
  // asked before the exit is given to OnWorkerExit.
  bool CouldReplace() const;
  // Local rank `local_rank` beat a step. The replacement's first beat: it
  // is back in step, and the next failure may be replaced too.
  void OnBeat(int local_rank) {
    if (local_rank == replacing_) replacing_ = -1;
  }
  bool replacing() const { return replacing_ >= 0; }
  // SIGINT/SIGTERM/... to dtrun. The workers get `forward` (0: signo); the
  // job ends with signo. A second one while stopping escalates to SIGKILL at
  // once.
  std::vector<Action> OnSignal(int signo, TimePoint now, int forward = 0);
  // The group is hung (heartbeats or a timer): a failure like an exit.
  // -> SignalGroup(signo) (SIGABRT dumps Python stacks), SIGKILL after
  // term_timeout, then restart or finish as after a failure.
  std::vector<Action> OnHang(int signo, TimePoint now);
  // A worker has been in uninterruptible sleep (D state) too long
  // (TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT): the group is unhealthy
  // and, as under torchrun, not restarted. -> SignalGroup(SIGKILL), then
  // Finish(failed) once the group is gone or abandoned.
  std::vector<Action> OnUnhealthy(TimePoint now);
  // The attempt now failing must not be restarted, whatever restarts are
  // left (no progress: --max-restarts-without-progress). Its end is
  // Finish(failed).
  void GiveUp() { give_up_ = true; }
  bool gave_up() const { return give_up_; }
  // --max-restarts-without-progress, as an attempt fails: progress is a
  // beat past `highest_step` of every earlier attempt (a resumed run redoes
  // the steps after its checkpoint, which is no progress by itself). After
  // that many restarts in a row without, it gives up (GiveUp) and says why.
  void OnAttemptFailing(int64_t highest_step);
  const std::string& why_gave_up() const { return why_gave_up_; }
  // TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: the local ranks of the
  // running workers seen in uninterruptible sleep (D state) now. One seen
  // there for the whole timeout -> OnUnhealthy's actions, and stuck() says
  // which and since when.
  std::vector<Action> OnDState(const std::vector<int>& local_ranks,
                               TimePoint now);
  struct Stuck {
    int local_rank = -1;
    TimePoint since{};
  };
  const Stuck& stuck() const { return stuck_; }
  // Call at deadline() (or later): escalates a stop to SIGKILL.
  std::vector<Action> OnTick(TimePoint now);

  // When OnTick must run next; none while nothing is pending.
  std::optional<TimePoint> deadline() const;
  Phase phase() const { return phase_; }
  int restart_count() const { return restart_count_; }
  int alive() const { return alive_; }
  // Failures of the attempt that ended last, in the order they were seen.
  const std::vector<WorkerExit>& failures() const { return failures_; }
  // Whether the attempt that ended last was stopped as hung.
  bool hung() const { return hung_; }
  // Whether the attempt that ended last was stopped as unhealthy.
  bool unhealthy() const { return unhealthy_; }

 private:
  std::vector<Action> Stop(Phase phase, int signo, TimePoint now);
  std::vector<Action> GroupGone();
  std::vector<Action> Kill(TimePoint now);

  AgentOptions opts_;
  Phase phase_ = Phase::kIdle;
  int restart_count_ = 0;
  int alive_ = 0;
  int stop_signal_ = 0;
  bool killed_ = false;
  bool hung_ = false;
  bool unhealthy_ = false;
  bool give_up_ = false;
  int replacing_ = -1;        // the local rank being replaced in place
  int replaced_count_ = 0;    // replacements made (against in_place_limit)
  WorkerExit replaced_exit_;  // and how its predecessor failed
  TimePoint kill_at_{};
  TimePoint abandon_at_{};
  std::vector<WorkerExit> failures_;
  std::map<int, TimePoint> d_since_;  // local rank -> first seen in D state
  Stuck stuck_;
  int64_t highest_step_ = -1;  // the highest step beaten by any attempt
  int restarts_without_progress_ = 0;
  std::string why_gave_up_;
};

}  // namespace dtrun::agent
