#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/liveness.h"
#include "rendezvous/round_closer.h"
#include "rendezvous/round_state.h"
#include "rendezvous/round_watch.h"
#include "rendezvous/util/clock.h"
#include "rendezvous/util/status.h"
#include "rendezvous/store.h"
#include "rendezvous/store_client.h"

namespace dtrun::rendezvous {

struct RendezvousOptions {
  std::string run_id = "none";
  std::string node_id;  // unique per agent process (host_pid_random)
  int node_rank = -1;   // static backend: this node's fixed rank; -1 = dynamic
  // c10d: the --node-rank the user gave, -1 for none. When every node of a
  // round gives a distinct one, group ranks follow it (rank 0 lands where
  // the user put it); otherwise the dynamic order.
  int preferred_rank = -1;
  int min_nodes = 1, max_nodes = 1;
  int nproc_per_node = 1;                          // must agree on every node
  int max_restarts = 0;                            // must agree on every node
  std::chrono::milliseconds join_timeout{600000};  // default 600 s
  std::chrono::milliseconds last_call_timeout{30000};   // default 30 s
  std::chrono::milliseconds keep_alive_interval{1000};  // default 1 s
  int keep_alive_max_attempt = 3;                       // misses before "dead"
  // A joining node is woken by the store when the round it waits for
  // completes; it also looks again this often (signals, the last call).
  std::chrono::milliseconds poll_interval{500};
  // Opens a stream on which the store pushes changes of watched keys
  // (TcpStoreClient's 1.13 dialect, or EtcdStore::OpenWatch). With it, Check
  // learns of a new round and of the watched node's heartbeats from the store's
  // pushes instead of reading them every call; without it, or when it fails,
  // Check reads (rendezvous/README.md, "The rendezvous protocol": push load).
  std::function<Result<std::unique_ptr<KeyWatch>>()> open_watch;
};

// What a running node learns from Check().
enum class RoundEvent {
  kNone,
  kRestart,  // a new round started (failure, dead node, or a node waiting to
             // join)
  kClosed,   // the job ended elsewhere (final failure or config error)
  kAllDone,  // every node of the round finished successfully
};

// Elastic rendezvous of agents over a Store (static = min = max with fixed
// ranks): the shell around round_state.h's rules. Every operation of a node
// touches O(1) keys of O(1) size under "rdzv/<run_id>/", except the one node
// that closes a round, which reads the joiners and writes their ranks in one
// request each; rendezvous/README.md, "The rendezvous protocol", lists every
// key. Each node watches the heartbeat of the next group rank only (a
// ring), so some live node sees any dead one; it is declared dead by the
// observer's own clock when the counter stops moving for
// keep_alive_interval x keep_alive_max_attempt, so clocks need not agree
// (except for the last-call deadline). Not thread-safe: one agent thread
// owns it.
class Rendezvous {
 public:
  // Deadlines, heartbeats and the last call read `clock` (tests pass a fake
  // one and run rounds on simulated time); it must outlive the Rendezvous.
  Rendezvous(Store* store, RendezvousOptions options,
             const Clock& clock = SystemClock::Get());

  // Joins the next round and blocks until it completes. Returns Timeout after
  // join_timeout (naming who came), Invalid when this node's settings differ
  // from the job's (and closes the job so the others stop too), Canceled
  // when `interrupted` returns true, or Unavailable when the job is closed.
  Result<Assignment> Join(const std::function<bool()>& interrupted);

  // Called periodically while workers run or wait at the exit barrier:
  // sends a heartbeat when due, watches the round, declares silent nodes
  // dead and starts a new round when a node waits to join.
  Result<RoundEvent> Check(const Assignment& current);
  // Whether Check follows `current`'s round through pushed changes (after
  // at least one Check of it), rather than by reading every call.
  bool pushed(const Assignment& current) const {
    return watch_.following(current.round);
  }

  // This node's workers failed: start a new round counting a failure, or,
  // past max_restarts or when `give_up` (no progress), close the job as
  // failed (kWorkersFailed, kNoProgress). Returns the failure count after
  // the call; a round already moved on by another node is not counted twice.
  Result<int> ReportFailure(const Assignment& current, const std::string& why,
                            bool give_up = false);

  // This node's workers all succeeded in `current`'s round.
  Status MarkDone(const Assignment& current);
  // Blocks up to `timeout` (in the store, without polling) until `current`'s
  // round is over: a new round started or the job ended. True when it is, so
  // a node at the exit barrier learns of the job's end at once.
  Result<bool> AwaitRoundOver(const Assignment& current,
                              std::chrono::milliseconds timeout);

  // This node has seen the job end (kAllDone or kClosed).
  Status AckEnd(const Assignment& current);
  // Whether every node of `current`'s round has acknowledged the end. The
  // node hosting the store waits for it before the store goes away.
  bool AllEnded(const Assignment& current);

  // Why the job was closed ("" while open): a message for people.
  const std::string& closed_reason() const { return closed_reason_; }
  // Why the job ended, for decisions such as the exit code. Set where
  // closed_reason() is, and also on kAllDone (kSucceeded) and when Join
  // returns Invalid for a foreign state key (kForeignState).
  EndReason end_reason() const { return end_reason_; }
  // Nodes that have joined the open round, for messages.
  std::string DescribeParticipants() const;

 private:
  // The state document (round 0 while nobody wrote one).
  Result<StateDoc> ReadDoc();
  Result<StateDoc> ParseDoc(const std::string& text);
  // While the state is still at `round` and open, applies `mutate` with
  // compare-and-set until it sticks, then wakes whoever waits on the round.
  // Returns the state as it is afterwards.
  Result<StateDoc> ChangeDoc(int round,
                             const std::function<void(StateDoc&)>& mutate);
  Status CloseJob(int round, EndReason reason, const std::string& why);
  Status ClosedStatus(const StateDoc& doc);
  // Invalid for a state key that is not dtrun's; sets kForeignState.
  Status CorruptState();
  // The event for a closed state document; records why it closed.
  RoundEvent Ended(const StateDoc& doc);
  // kRestart (or how the job ended) for a state seen moved on; remembers it.
  RoundEvent Moved(const StateDoc& doc);
  // Check, but for what a failed store request leaves behind.
  Result<RoundEvent> CheckRound(const Assignment& current);
  Result<RoundEvent> WatchCounters(const Assignment& current);
  // Reads the state and the watched node's counter (into *count): kNone
  // while `current`'s round stands, else how it ended.
  Result<RoundEvent> ReadRound(const Assignment& current, std::string* count);
  // Whether `current`'s round is followed through pushes (the watch opened
  // for it when it has none); false when it is checked by reading instead.
  bool WatchRound(const Assignment& current);
  // Takes what the store pushed; true when the round must be read. Sets
  // *count to the watched node's latest pushed heartbeat count, if one came.
  bool NeedsRead(const Assignment& current, std::string* count);
  // `count` is the watched node's heartbeat counter as just read.
  Result<RoundEvent> WatchNext(const Assignment& current,
                               const std::string& count);
  // `closed`, or the job closed when the closer found settings that differ.
  Status MaybeCloseMismatch(int round, const Status& closed);
  Store::Enlistment EntryOf(int round) const;
  Status Register(const StateDoc& doc);
  // The last call of an elastic round, from the slot this node took.
  Status StartLastCall(int round);
  // TryClose when this node may close its round: it took the last slot, or
  // the last call is over.
  Status MaybeClose();
  Result<bool> WaitForChange(int r, bool in_round,
                             std::chrono::steady_clock::duration left,
                             int* polls);
  // Reads the state, takes a slot in a round new to this node, closes the
  // round when it may, and returns the assignment once the round is final.
  // `final_written`: woken by the round's `final` key (*round's).
  Result<std::optional<Assignment>> Look(int* round, bool final_written);
  // The assignment once round `r` is final, nullopt while it is not (or
  // when this node did not make it in and now waits for the next round,
  // or the state moved past `r`: then doc_known_).
  Result<std::optional<Assignment>> Outcome(int r);
  Status Timeout(int round, TimePoint started);
  // Moves the state on from `current`'s round, expecting `expect` nodes
  // in the next (StateDoc::expect).
  Result<RoundEvent> StartNextRound(const Assignment& current,
                                    const std::string& why, int expect);
  // A new round for the watched node gone (`why`: how it was seen).
  Result<RoundEvent> DeclareGone(const Assignment& current,
                                 const std::string& why);

  Store* store_;
  RendezvousOptions opts_;
  const Clock& clock_;
  RoundKeys keys_;
  std::string closed_reason_;
  EndReason end_reason_ = EndReason::kNone;
  std::vector<std::string> last_participants_;
  StateDoc round_doc_;      // the state as this node last saw it
  bool doc_known_ = true;   // round_doc_ is the round to join (no read)
  bool bound_ = false;      // the slot's Enlist bound this node's connection
  int joined_round_ = -1;   // round this node holds a slot in
  LastCall last_call_;      // its slot and the round's last call
  int waiting_round_ = -1;  // round this node could not get into
  int last_round_ = -1, last_rank_ = -1;  // this node's last completed round
  RoundCloser closer_;  // the closer's role, when this node wins it
  Liveness liveness_;   // this node's signs of life and its watched node's
  RoundWatch watch_;    // push mode: the round's changes as the store sends
};

// A node id: "<host>_<pid>_<random>".
std::string MakeNodeId();

}  // namespace dtrun::rendezvous
