#pragma once

// What a job learns from its local group, given to the group as an
// observer (as ninja's Builder holds a Status*): the group decides and
// acts on its workers; an observer sees what happened, reports it and
// publishes what the job beyond this node needs (the rendezvous store, the
// console), and lends the watchers what only the job knows. Nothing here
// starts, signals or stops a worker. Every method has a default that does
// nothing, so a job implements what it uses.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtrun::agent {

// A worker of the current attempt failed (for an interactive console that
// stops a crash loop, published through the store by the job).
struct WorkerCrash {
  int attempt = 0;  // restart count of the attempt it belonged to
  int rank = 0;
  std::string how;   // "exit code 1", "SIGKILL"
  std::string host;  // this host's name, and the address it advertises
                     // (--local-addr) if any
  std::string addr;
  std::string stderr_file;
  std::string stderr_tail;  // its last lines
};

class GroupObserver {
 public:
  virtual ~GroupObserver() = default;

  // An attempt's workers are about to start, with this restart count.
  virtual void OnAttemptStarting(int /*restart_count*/) {}
  // In-place recovery: global rank `rank` is about to be replaced, the
  // group re-forming as attempt `restart_count`; the job tells the
  // survivors through the workers' store (rendezvous/in_place.h). False:
  // it could not (then they fail at their wait's end).
  virtual bool OnReplacing(int /*restart_count*/, int /*rank*/) {
    return false;
  }
  // In-place recovery, before OnReplacing: the attempt the replacement of
  // a worker may run as, this node's newest being `current`; -1 when it
  // may not (another node's replacement is under way: the group restarts
  // whole). One node owns its numbers: the next.
  virtual int ClaimReplacement(int current) { return current + 1; }
  // The replacement of attempt `restart_count` beat its first step: the
  // next failure may be replaced too.
  virtual void OnReplaced(int /*restart_count*/) {}
  // Whether OnWorkerCrash is wanted (reading a crash's last lines costs
  // the group a moment).
  virtual bool wants_crashes() const { return false; }
  // A worker failed while the group ran.
  virtual void OnWorkerCrash(const WorkerCrash& /*crash*/) {}

  // This node's status record (NodeStatusJson, dumped), every second,
  // after it was written to status.json.
  virtual void OnStatus(const std::string& /*json*/) {}
  // Every node's status record, scored as one job (ScoreJob), when this
  // node is the one that gathers them (elastic: group rank 0); else none.
  // Feeds the progress line and the dtrun_job_* metrics.
  virtual std::vector<nlohmann::json> JobView() { return {}; }
  // The families of the stores this node hosts (StoreMetricsText).
  virtual std::string StoreMetrics() { return ""; }

  // Whether `dtrun --stacks` asked through the job (its store) for this
  // node's stacks since the last answer; asked once a second while the
  // workers run. The group then takes them and answers every request, the
  // run folder's too, with one capture.
  virtual bool StacksWanted() { return false; }
  virtual void AnswerStacks(const std::string& /*json*/) {}
};

}  // namespace dtrun::agent
