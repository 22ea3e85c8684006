#pragma once

// The rendezvous round's decisions, apart from the store: what the state
// document says, who gets which group rank, what a node's slot in a closed
// round means, when a round may close, and when a silent node is dead. Every
// function here takes the store's replies and the time as values and reads
// neither, so the protocol's rules are tested on simulated time
// (tests/rendezvous/round_state_test.cc); Rendezvous (rendezvous.h) is the
// shell that reads and writes the keys.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/util/clock.h"

namespace dtrun::rendezvous {

// Where this node landed in a completed round.
struct Assignment {
  int round = 0;     // same on every node; workers' TORCHELASTIC_RESTART_COUNT
  int failures = 0;  // rounds started because of failures so far
  int group_rank = 0;
  int group_world_size = 1;
  int base_rank = 0;  // global rank of this node's local rank 0
  int world_size = 1;
  // the node whose heartbeat this one watches ("" alone), and the slot it
  // joined the round in (its connection's close is counted by slot)
  std::string next_node;
  int64_t next_slot = 0;
};

// Why the job ended, as recorded in the state document so every node reads
// the same value (the message alone is for people: rewording it changes
// nothing here). The launcher maps it to an exit code.
enum class EndReason {
  kNone,            // the job is still open
  kSucceeded,       // every node of the last round finished ("ok")
  kWorkersFailed,   // failures went past --max-restarts: exit 1
  kConfigMismatch,  // a node's --nproc-per-node/--max-restarts differ: exit 2
  kDuplicateNodeRank,  // two nodes claim one --node-rank: exit 2
  // The state key holds something that is not dtrun's (another program on
  // the same --rdzv-id). Seen by this node only; nothing is closed. Exit 2.
  kForeignState,
  // A node's restarts made no progress (--max-restarts-without-progress):
  // every node exits 93, "do not requeue".
  kNoProgress,
};

// Stable lower-case name as stored in the state document ("workers_failed").
const char* EndReasonName(EndReason reason);
// The reason named `name`; false when the name is unknown.
bool ParseEndReason(const std::string& name, EndReason* reason);

// The shared state document under "state": small, and changed only when a
// round starts or the job ends. `raw` is the exact text read, for
// compare-and-set.
struct StateDoc {
  int round = 0;
  int failures = 0;
  // The nodes the round expects: the last round's that live on (a node
  // declared dead is not), plus those that waited to join; the round
  // closes once that many joined, without waiting for the last call. 0:
  // not known (the first round, or a state of an older version).
  int expect = 0;
  std::string closed;                // "" open, "ok", or why the job failed
  EndReason end = EndReason::kNone;  // kNone exactly while `closed` is ""
  std::string raw;

  // Ends the job; the message and the reason always change together.
  void Close(EndReason reason, std::string why);
  std::string Serialize() const;
  // False for text that is not a state document (another program's key);
  // "" (no state written yet) is round 0, open.
  // Records of older versions without "end" get it from the message.
  static bool Parse(const std::string& text, StateDoc* doc);
};

// The keys of one job, all under "rdzv/<run_id>/" (rendezvous/README.md,
// "The rendezvous protocol", lists them).
class RoundKeys {
 public:
  explicit RoundKeys(std::string run_id) : run_id_(std::move(run_id)) {}
  // "rdzv/<run_id>/<suffix>"
  std::string Job(const std::string& suffix) const;
  // "rdzv/<run_id>/round/<round>/<suffix>"
  std::string Round(int round, const std::string& suffix) const;
  // Round(round, "<name>/<index>"), for per-slot and per-rank keys.
  std::string Round(int round, const std::string& name, int64_t index) const;

 private:
  std::string run_id_;
};

// keys::kRunIds's value with `run_id` registered at `now_ms` (its older
// entry dropped), the newest `keep` kept. Pure.
std::string RunIdsWith(const std::string& list, const std::string& run_id,
                       int64_t now_ms, size_t keep = 32);
// `list` without `run_id`'s entry. Pure.
std::string RunIdsWithout(const std::string& list, const std::string& run_id);
// The run ids of `list` other than `run_id` registered at `since_ms` or
// later, with when. Pure.
std::vector<std::pair<std::string, int64_t>> OtherRunIds(
    const std::string& list, const std::string& run_id, int64_t since_ms);

// A joiner's node record, "<rank hint> <node id>" (hint -1: none).
std::string NodeRecord(int64_t hint, const std::string& node_id);
// What a joiner tells the closer in its one request (Store::Enlist):
// "<rank hint> <--node-rank given, -1> <nproc> <max restarts> <node id>".
// The closer checks the settings against the first slot's.
struct JoinRecord {
  int64_t hint = -1, preferred = -1;
  int64_t nproc = 0, max_restarts = 0;
  std::string node_id;
  std::string Text() const;
  // False for text that is not a record (a missing one reads as "").
  static bool Parse(const std::string& text, JoinRecord* record);
  // "--nproc-per-node=N --max-restarts=M", for messages.
  std::string Settings() const;
};
// "<number> <rest>" -> number (-1 when not a number), rest.
void SplitRecord(const std::string& text, int64_t* number, std::string* rest);

// The closer's decision: slot s (1-based) of `count` gets group rank
// ranks[s-1].rank and watches ranks[s-1].next_node.
struct RankEntry {
  int rank = 0;
  std::string next_node;  // "" for a round of one
  int64_t next_slot = 0;  // that node's slot
};
struct RankTable {
  std::vector<RankEntry> by_slot;
  // Whether every node gave a distinct --node-rank preference that decided
  // the order; when some did and not all, the join order decides.
  bool by_preference = false;
};
// Orders the joiners from their node records and preferences, one of each
// per slot: --node-rank hints (static, or c10d when every node gave a
// distinct preference), else the previous round's rank, else join order.
// Ties and newcomers go by slot, so the order depends on the replies alone.
RankTable OrderRanks(const std::vector<std::string>& node_records,
                     const std::vector<std::string>& preferences);
// A slot's rank record: "<group rank> <next node id> <its slot>".
std::string RankRecord(const RankEntry& entry);
// The records travel in packs: round/<r>/ranks/<k> holds those of slots
// k * kRanksPerKey + 1 ... (k + 1) * kRanksPerKey, one a line, so that
// the closer writes N / 64 keys for N nodes (etcd: one transaction holds
// at most 128 puts) and each joiner reads one value of ~2 KB at most.
constexpr int64_t kRanksPerKey = 64;
int64_t RankPackOf(int64_t slot);
// The packs of `table`, in order.
std::vector<std::string> PackRankRecords(const RankTable& table);
// The record of `slot` in its pack's value; "" when it holds none.
std::string RecordInPack(const std::string& pack, int64_t slot);

// What a node's slot means once it reads round/<r>/final and its rank.
enum class Placement {
  kOpen,      // the round is not final yet (or the job closed before it was)
  kLeftOut,   // the round closed without this slot: wait for the next one
  kAssigned,  // *assignment is filled
};
Placement PlaceInRound(const StateDoc& doc, int64_t slot,
                       const std::string& final_value,
                       const std::string& rank_record, int nproc_per_node,
                       Assignment* assignment);

// The last call of an elastic round: slot min_nodes sets a shared unix-ms
// deadline; after it any joiner may close the round with what came.
struct LastCall {
  int64_t slot = 0;  // this node's slot in the round
  int max_nodes = 1;
  int64_t expect = 0;       // StateDoc::expect, when at least the minimum
  int64_t deadline_ms = 0;  // unix ms, 0 while not known
  bool close_tried = false;

  // Whether this node should try to close the round now.
  bool MayClose(int64_t now_unix_ms) const;
  // How long the next wait for the round may block: `poll`, shortened to
  // the deadline when this node may have to close then (nothing in the
  // store changes at that moment, so nothing would wake it), and to
  // `left` (the join timeout's rest); at least 1 ms.
  std::chrono::milliseconds WaitStep(std::chrono::milliseconds poll,
                                     int64_t now_unix_ms, bool in_round,
                                     std::chrono::milliseconds left) const;
};

// When a joiner that nothing woke reads the round anyway: after 10 poll
// intervals of waiting, then 20, 40, ... at most 120 apart (0.5 s each: 5
// s, then 10, 20 ... a minute). Thousands of joiners each reading every 5 s
// were most of a slow store's load while one node closed.
class SafetyNet {
 public:
  // Whether the wait that brought the poll intervals waited to `step`
  // (counted from 1) is followed by a read.
  bool Due(int step) {
    if (step < next_) return false;
    every_ = std::min(every_ * 2, kMaxEvery);
    next_ = step + every_;
    return true;
  }

 private:
  static constexpr int kMaxEvery = 120;
  int every_ = 10, next_ = 10;
};

// Whether a node is gone by its store connections: `closes` (the store's
// count of its bound connections that closed) and `rebinds` (its own count
// of connections it bound again after a reconnect; the first binding is
// implied), as read; missing reads as 0. Gone once every connection it
// bound has closed.
bool GoneOf(const std::string& closes, const std::string& rebinds);

// Failure detection: the watched node's heartbeat counter, timed by this
// node's own steady clock from when its value was last seen to change, so
// no two machines' clocks need agree.
class HeartbeatWatch {
 public:
  // Records `count` as seen at `now` in `round`. Returns how long the
  // counter has stood still when that is more than `limit` (the node is
  // dead), nullopt otherwise.
  std::optional<std::chrono::steady_clock::duration> Observe(
      int round, const std::string& count, TimePoint now,
      std::chrono::steady_clock::duration limit);
  // Forgets what was seen (a new round starts from scratch).
  void Reset() { round_ = -1; }
  // The count last seen, "" before any.
  const std::string& count() const { return count_; }

 private:
  int round_ = -1;
  std::string count_;
  TimePoint since_{};
};

// When this node's own heartbeat is due.
class BeatTimer {
 public:
  // True (and the interval restarts) when `force` or `interval` has passed.
  bool Due(TimePoint now, std::chrono::steady_clock::duration interval,
           bool force);

 private:
  TimePoint last_{};
};

}  // namespace dtrun::rendezvous
