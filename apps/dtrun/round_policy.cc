// The multi-node decision table, pure. Each branch mirrors one case torchrun's
// agent handles in its monitor loop (a local failure, a new round elsewhere,
// the job closed, the store lost); the exit codes are dtrun's own
// (exit_code.h), never derived from a message's wording.
#include "apps/dtrun/round_policy.h"

#include <cstdio>

#include "apps/dtrun/exit_code.h"

namespace dtrun::agent {
namespace {

using Kind = RoundStep::Kind;

RoundStep Step(Kind kind, std::string why = "") {
  RoundStep s;
  s.kind = kind;
  s.why = std::move(why);
  return s;
}

RoundStep Exit(int code, bool stop_workers, std::string why) {
  RoundStep s = Step(Kind::kExit, std::move(why));
  s.exit_code = code;
  s.stop_workers = stop_workers;
  return s;
}

}  // namespace

RoundStep RoundPolicy::OnLocal(GroupOutcome outcome, int stop_signal) {
  switch (outcome) {
    case GroupOutcome::kSignaled:
      return Exit(ExitBySignal(stop_signal), false, "");
    case GroupOutcome::kStopped:
      return Step(Kind::kRejoin);
    case GroupOutcome::kFailed:
      return Step(Kind::kReportFailure);
    case GroupOutcome::kSucceeded:
      return done_marked_ ? Step(Kind::kWait) : Step(Kind::kMarkDone);
    case GroupOutcome::kRunning:
      break;
  }
  return Step(Kind::kWait);
}

RoundStep RoundPolicy::OnFailureReported(bool job_goes_on) {
  // Restarts left: every node meets again in the next round. Otherwise this
  // node's failure ended the job, and its summary is the one that counts.
  return job_goes_on ? Step(Kind::kRejoin) : Step(Kind::kExitWithSummary);
}

RoundStep RoundPolicy::OnCheck(const Result<rendezvous::RoundEvent>& event,
                               GroupOutcome outcome, TimePoint now,
                               bool no_quorum) {
  if (!event.ok()) {
    // The store's host may be gone, or only our link. By the silent limit
    // the others have declared this node dead and run a round without it.
    auto silent = now - last_ok_;
    // etcd without quorum: no new round can start anywhere, but nothing is
    // known to be wrong with the job; the workers run on.
    if ((replicated_ && no_quorum) || silent <= silent_limit_)
      return Step(Kind::kWait);
    char why[256];
    std::snprintf(why, sizeof(why),
                  "cut off from the rendezvous store for %.1f s (the other "
                  "nodes have declared this node dead by now): stopping the "
                  "workers; this node rejoins as a new one when the store "
                  "answers again: ",
                  std::chrono::duration<double>(silent).count());
    return Step(Kind::kFence, why + event.status().message());
  }
  last_ok_ = now;
  bool succeeded = outcome == GroupOutcome::kSucceeded;
  switch (event.value()) {
    case rendezvous::RoundEvent::kNone:
      break;
    case rendezvous::RoundEvent::kAllDone:
      if (succeeded) return Exit(kExitSuccess, false, "all nodes succeeded");
      break;
    case rendezvous::RoundEvent::kRestart:
      // Done here already: nothing to stop, the next round takes this node.
      if (succeeded) return Step(Kind::kRejoin);
      if (stopping_) break;
      stopping_ = true;
      return Step(
          Kind::kStopWorkers,
          "the round is over elsewhere; stopping local workers to rejoin");
    case rendezvous::RoundEvent::kClosed:
      return Exit(kExitFailedElsewhere, true, "the job failed");
  }
  return Step(Kind::kWait);
}

int JoinFailedExitCode(const Status& status, rendezvous::EndReason reason,
                       int stop_signal) {
  switch (status.code()) {
    case Status::Code::kCanceled:
      return ExitBySignal(stop_signal);
    case Status::Code::kInvalid:
      // The job was closed before this node could join: by failures past
      // --max-restarts (like any node of a failed job), or by a
      // configuration the nodes disagree on.
      if (reason == rendezvous::EndReason::kNoProgress) return kExitNoProgress;
      return reason == rendezvous::EndReason::kWorkersFailed
                 ? kExitFailedElsewhere
                 : kExitUsage;
    default:
      return kExitRendezvous;
  }
}

}  // namespace dtrun::agent
