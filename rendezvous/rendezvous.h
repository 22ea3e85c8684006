#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "rendezvous/status.h"
#include "rendezvous/store.h"

namespace dtrun::rdzv {

struct RendezvousOptions {
  std::string run_id = "none";
  std::string node_id;          // unique per agent process (host_pid_random)
  int node_rank = -1;           // static backend: this node's fixed rank; -1 = dynamic
  int min_nodes = 1, max_nodes = 1;
  int nproc_per_node = 1;       // must agree on every node
  int max_restarts = 0;         // must agree on every node
  std::chrono::milliseconds join_timeout{600000};       // default 600 s
  std::chrono::milliseconds last_call_timeout{30000};   // default 30 s
  std::chrono::milliseconds keep_alive_interval{5000};  // default 5 s
  int keep_alive_max_attempt = 3;                       // misses before "dead"
  std::chrono::milliseconds poll_interval{50};          // state polling while joining
};

// Where this node landed in a completed round.
struct Assignment {
  int round = 0;             // same on every node; workers' TORCHELASTIC_RESTART_COUNT
  int failures = 0;          // rounds started because of failures so far
  int group_rank = 0;
  int group_world_size = 1;
  int base_rank = 0;         // global rank of this node's local rank 0
  int world_size = 1;
  std::vector<std::string> nodes;  // node ids by group rank
};

// What a running node learns from Check().
enum class RoundEvent {
  kNone,
  kRestart,     // a new round started (failure, dead node, or a node waiting to join)
  kClosed,      // the job ended elsewhere (final failure or config error)
  kAllDone,     // every node of the round finished successfully
};

// Elastic rendezvous of agents over a Store (static = min = max with fixed
// ranks). All agents share one JSON state document under
// "rdzv/<run_id>/state", changed only by compare-and-set, plus a heartbeat
// counter per node. Nodes are declared dead by the observer's own clock when
// their counter stops moving for keep_alive_interval x keep_alive_max_attempt,
// so clocks need not agree (except for the last-call deadline). Not
// thread-safe: one agent thread owns it.
class Rendezvous {
 public:
  Rendezvous(Store* store, RendezvousOptions options);

  // Joins the next round and blocks until it completes. Returns Timeout after
  // join_timeout (naming who came), Invalid when this node's settings differ
  // from the job's (and closes the job so the others stop too), Canceled
  // when `interrupted` returns true, or Unavailable when the job is closed.
  Result<Assignment> Join(const std::function<bool()>& interrupted);

  // Called periodically while workers run or wait at the exit barrier:
  // sends a heartbeat when due, watches the round, declares silent nodes
  // dead and starts a new round when a node waits to join.
  Result<RoundEvent> Check(const Assignment& current);

  // This node's workers failed: start a new round counting a failure, or,
  // past max_restarts, close the job as failed. Returns the failure count
  // after the call; a round already moved on by another node is not
  // counted twice.
  Result<int> ReportFailure(const Assignment& current, const std::string& why);

  // This node's workers all succeeded in `current`'s round.
  Status MarkDone(const Assignment& current);

  // This node has seen the job end (kAllDone or kClosed).
  Status AckEnd(const Assignment& current);
  // Whether every node of `current`'s round has acknowledged the end. The
  // node hosting the store waits for it before the store goes away.
  bool AllEnded(const Assignment& current);

  // Why the job was closed ("" while open).
  const std::string& closed_reason() const { return closed_reason_; }
  // Nodes that have joined the open round, for messages.
  std::string DescribeParticipants() const;

 private:
  struct State;
  Result<State> Read();
  // Applies `mutate` with compare-and-set until it sticks; `mutate` returns
  // false to leave the state as it is.
  Result<State> Update(const std::function<bool(State&)>& mutate);
  Status Heartbeat(bool force);
  bool JoinStep(State& s, int64_t now_ms);
  std::string Key(const std::string& suffix) const;

  Store* store_;
  RendezvousOptions opts_;
  std::string closed_reason_;
  std::vector<std::string> last_participants_;
  std::chrono::steady_clock::time_point last_beat_{};
  // node -> (last heartbeat count seen, when it last changed)
  std::map<std::string, std::pair<int64_t, std::chrono::steady_clock::time_point>> seen_;
};

// A node id: "<host>_<pid>_<random>".
std::string MakeNodeId();

}  // namespace dtrun::rdzv
