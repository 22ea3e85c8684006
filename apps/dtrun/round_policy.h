#pragma once

// Every decision an elastic node makes while a round runs and when a join
// fails: rejoin, give up, and with which exit code. Pure: outcomes, round
// events and time in, steps out; ElasticJob carries the steps out. Tests
// drive it with time as a value (tests/apps/round_policy_test.cc).

#include <chrono>
#include <optional>
#include <string>

#include "apps/dtrun/agent.h"
#include "apps/dtrun/clock.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/util/status.h"

namespace dtrun::agent {

struct RoundStep {
  enum class Kind {
    kWait,           // nothing to do now
    kMarkDone,       // the local workers succeeded: tell the rendezvous
    kReportFailure,  // the local workers failed: tell the rendezvous, then
                     // OnFailureReported
    kStopWorkers,    // the round ended elsewhere: stop the local workers (not a
                     // failure)
    kFence,          // cut off from the store past the silent limit: stop the
                     // local workers, wait for the store, rejoin as a new node
    kRejoin,         // join the next round
    kExit,           // the job is over here: exit with `exit_code`
    kExitWithSummary,  // the job failed here: print the failure summary, exit
                       // with its code
  };
  Kind kind = Kind::kWait;
  int exit_code = 0;          // kExit
  bool stop_workers = false;  // kExit: stop the local workers first
  std::string why;            // for the log; empty when there is nothing to say

  bool operator==(Kind k) const { return kind == k; }
};

class RoundPolicy {
 public:
  // A node may lose the rendezvous store for `silent_limit` (the time the
  // others take to declare it dead); then it is fenced: its workers stop
  // (the others are running a round without it) and it rejoins when the
  // store answers again. A `replicated` store (etcd) that answers without
  // quorum is every node's trouble, not this node's: it waits however
  // long, its workers running; one it cannot reach at all fences it.
  RoundPolicy(std::chrono::milliseconds silent_limit, TimePoint start,
              bool replicated = false)
      : silent_limit_(silent_limit), last_ok_(start), replicated_(replicated) {}

  // The local group's outcome after a turn of the loop (`stop_signal` when
  // it is kSignaled).
  RoundStep OnLocal(GroupOutcome outcome, int stop_signal);
  // The failure report was taken; `job_goes_on` when the rendezvous will
  // run another round (restarts left), false when the job is closed.
  RoundStep OnFailureReported(bool job_goes_on);
  // The done mark was written (false: the store was not reached; marked
  // again on the next turn).
  void OnMarkedDone(bool ok) { done_marked_ = ok; }
  // A check of the round at `now`: its event, or Status when the store could
  // not be reached (`no_quorum`: a replicated store's member answered, but
  // the store cannot commit).
  RoundStep OnCheck(const Result<rendezvous::RoundEvent>& event,
                    GroupOutcome outcome, TimePoint now,
                    bool no_quorum = false);

  bool done_marked() const { return done_marked_; }

 private:
  std::chrono::milliseconds silent_limit_;
  TimePoint last_ok_;
  bool replicated_ = false;
  bool done_marked_ = false;
  bool stopping_ = false;
};

// The exit code when joining a round failed: a stop signal, the job closed
// for a reason every node agrees on, or the store lost (rendezvous failure).
int JoinFailedExitCode(const Status& status, rendezvous::EndReason reason,
                       int stop_signal);

}  // namespace dtrun::agent
