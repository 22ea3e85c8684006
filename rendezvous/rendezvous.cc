// The round protocol. Every node runs the same code against one shared
// Store; there is no leader process, only a leader *role* per round (the
// closer) won by compare-and-set. Keys live under "rdzv/<run_id>/" (the
// table is in rendezvous.h and apps/dtrun/README.md, "Several nodes").
//
// State document. `state` holds {round, failures, closed, end}. It changes
// only by compare-and-set against the exact text read, and only to start a
// round (round+1) or to end the job (closed + end), so two nodes that both
// see a failure move the job once: the loser of the race re-reads and finds
// the round already moved. Whoever moves it sets round/<r>/over, the one key
// that nodes waiting for "anything to change" block on.
//
// Joining. A node ADDs round/<r>/n to take a slot (1, 2, ...) and writes
// round/<r>/node/<slot> with its rank hint. Slot min_nodes opens the last
// call: a unix-ms deadline after which any joiner may close the round with
// fewer than max_nodes. Slot max_nodes closes at once. Slots past max_nodes
// are queued (round/<r>/waiting) for the next round. Unix time is used here
// only because the deadline is shared between machines: clock skew shifts
// the moment the round closes, and every node still sees one outcome.
//
// Closing. Closers race on round/<r>/closing; the winner orders the joiners
// (static rank, else the previous round's rank, else join order), writes
// every rank/<slot> and hb/<rank> in one MULTI_SET, then round/<r>/final =
// count. Joiners WAIT on `final`, so they wake exactly when it is written;
// `final` = "-" means the job closed before the round did.
//
// Heartbeats and failure detection. Each node ADDs its own hb/<rank> every
// keep_alive_interval and watches the next rank's counter (a ring: n nodes,
// n watchers, O(1) keys each). A counter that has not moved for interval x
// max_attempt by the watcher's own steady clock means the node is dead, so
// clocks need not agree. Group rank 0 also polls `waiting` (start a round to
// let newcomers in) and `done` (every node finished).
//
// The end record. A failure past --max-restarts, disagreeing settings or a
// duplicate --node-rank set `closed` (a message) and `end` (EndReasonName),
// so every node exits for the same reason; "ok"/succeeded when all are done.
// Each node then ADDs round/<r>/ended, and the node hosting the store waits
// for all of them before the store goes away (AllEnded).

#include "rendezvous/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "rendezvous/util/check.h"
#include "rendezvous/util/describe.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"
#include "rendezvous/store_state.h"

namespace dtrun::rendezvous {
namespace {

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string JoinIds(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out.empty() ? "none" : out;
}

int64_t ToInt(const std::string& text, int64_t fallback) {
  int64_t v = 0;
  return ParseCounter(text, &v) ? v : fallback;
}

// "<number> <rest>" -> number, rest.
void SplitFirst(const std::string& text, int64_t* number, std::string* rest) {
  auto space = text.find(' ');
  *number = ToInt(text.substr(0, space), -1);
  *rest = space == std::string::npos ? "" : text.substr(space + 1);
}

constexpr struct {
  EndReason reason;
  const char* name;
} kEndReasonNames[] = {
    {EndReason::kNone, "none"},
    {EndReason::kSucceeded, "succeeded"},
    {EndReason::kWorkersFailed, "workers_failed"},
    {EndReason::kConfigMismatch, "config_mismatch"},
    {EndReason::kDuplicateNodeRank, "duplicate_node_rank"},
    {EndReason::kForeignState, "foreign_state"},
};

// A closed record from a dtrun that wrote no "end": the reason is read from
// the message, whose wording those versions never changed.
EndReason EndReasonOfMessage(const std::string& closed) {
  if (closed.empty()) return EndReason::kNone;
  if (closed == "ok") return EndReason::kSucceeded;
  if (closed.rfind("workers failed", 0) == 0) return EndReason::kWorkersFailed;
  if (closed.rfind("two nodes claim", 0) == 0)
    return EndReason::kDuplicateNodeRank;
  return EndReason::kConfigMismatch;
}

}  // namespace

const char* EndReasonName(EndReason reason) {
  for (const auto& entry : kEndReasonNames) {
    if (entry.reason == reason) return entry.name;
  }
  DTRUN_CHECK(false) << "EndReason " << static_cast<int>(reason)
                     << " has no name";
  return "";
}

bool ParseEndReason(const std::string& name, EndReason* reason) {
  for (const auto& entry : kEndReasonNames) {
    if (name == entry.name) {
      *reason = entry.reason;
      return true;
    }
  }
  return false;
}

// The shared state document: small, and changed only when a round starts or
// the job ends. `raw` is the exact text read, for compare-and-set.
struct Rendezvous::Doc {
  int round = 0;
  int failures = 0;
  std::string closed;                // "" open, "ok", or why the job failed
  EndReason end = EndReason::kNone;  // kNone exactly while `closed` is ""
  std::string raw;

  // Ends the job; the message and the reason always change together.
  void Close(EndReason reason, std::string why) {
    DTRUN_CHECK(reason != EndReason::kNone && !why.empty())
        << "closing with no reason";
    end = reason;
    closed = std::move(why);
  }
  std::string Serialize() const {
    return nlohmann::json{{"round", round},
                          {"failures", failures},
                          {"closed", closed},
                          {"end", EndReasonName(end)}}
        .dump();
  }
  static bool Parse(const std::string& text, Doc* d) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return false;
    try {
      d->round = j.at("round");
      d->failures = j.at("failures");
      d->closed = j.at("closed");
    } catch (const nlohmann::json::exception&) {
      return false;
    }
    // "end" is missing in records of older versions and may name a reason
    // this version does not know: the message then decides.
    auto end = j.find("end");
    bool named =
        end != j.end() && end->is_string() && ParseEndReason(*end, &d->end);
    if (d->closed.empty()) {
      d->end = EndReason::kNone;
    } else if (!named || d->end == EndReason::kNone) {
      d->end = EndReasonOfMessage(d->closed);
    }
    d->raw = text;
    return true;
  }
};

std::string MakeNodeId() {
  // The pid tells agents on one host apart; the random part tells apart a
  // restarted agent that got a recycled pid (or the same pid in a container).
  return os::HostName() + "_" + std::to_string(getpid()) + "_" +
         os::RandomHex(5);
}

Rendezvous::Rendezvous(Store* store, RendezvousOptions options)
    : store_(store), opts_(std::move(options)) {}

std::string Rendezvous::Key(const std::string& suffix) const {
  return "rdzv/" + opts_.run_id + "/" + suffix;
}

std::string Rendezvous::RoundKey(int round, const std::string& suffix) const {
  return Key("round/" + std::to_string(round) + "/" + suffix);
}

Result<Rendezvous::Doc> Rendezvous::ReadDoc() {
  // Read and create in one request: compare-and-set from "" creates the
  // document when missing and otherwise returns it, so the first nodes to
  // arrive cannot both create one.
  auto got = store_->CompareSet(Key("state"), "", Doc().Serialize());
  if (!got.ok()) return got.status();
  Doc d;
  if (!Doc::Parse(*got, &d)) {
    end_reason_ = EndReason::kForeignState;
    return Status::Invalid(
        "rendezvous state at key '" + Key("state") +
        "' is not dtrun's; is another program using --rdzv-id " + opts_.run_id +
        "?");
  }
  return d;
}

Result<Rendezvous::Doc> Rendezvous::ChangeDoc(
    int round, const std::function<void(Doc&)>& mutate) {
  auto current = ReadDoc();
  if (!current.ok()) return current;
  Doc cur = *current;
  while (cur.round == round && cur.closed.empty()) {
    Doc next = cur;
    mutate(next);
    std::string text = next.Serialize();
    auto got = store_->CompareSet(Key("state"), cur.raw, text);
    if (!got.ok()) return got.status();
    if (*got == text) {
      next.raw = text;
      // Wake the nodes waiting on the round: those that could not get in,
      // and (when the job closed before the round did) its joiners.
      Status s = store_->Set(RoundKey(round, "over"), "1");
      auto abandoned =
          s.ok() ? store_->CompareSet(RoundKey(round, "final"), "", "-")
                 : Result<std::string>(s);
      if (!abandoned.ok()) return abandoned.status();
      return next;
    }
    if (!Doc::Parse(*got, &cur)) return CorruptState();
  }
  return cur;
}

Status Rendezvous::CorruptState() {
  end_reason_ = EndReason::kForeignState;
  return Status::Invalid("rendezvous state is corrupt");
}

Status Rendezvous::CloseJob(int round, EndReason reason,
                            const std::string& why) {
  for (;;) {  // whatever round the job is in by now
    auto doc = ChangeDoc(round, [&](Doc& d) { d.Close(reason, why); });
    if (!doc.ok()) return doc.status();
    if (!doc->closed.empty()) return ClosedStatus(*doc);
    round = doc->round;
  }
}

Status Rendezvous::ClosedStatus(const Doc& doc) {
  closed_reason_ = doc.closed;
  end_reason_ = doc.end;
  if (doc.closed == "ok") {
    return Status::Unavailable(
        "rendezvous '" + opts_.run_id +
        "' belongs to a job that already finished; use a new --rdzv-id");
  }
  return Status::Invalid(doc.closed);
}

// The first node to arrive fixes the job's settings; any later node that
// disagrees closes the whole job, since workers with different world sizes
// or restart budgets would hang or diverge rather than fail cleanly.
Status Rendezvous::CheckConfig(const Doc& doc) {
  std::string mine = std::to_string(opts_.nproc_per_node) + " " +
                     std::to_string(opts_.max_restarts);
  auto job = store_->CompareSet(Key("config"), "", mine);
  if (!job.ok()) return job.status();
  config_checked_ = true;
  if (*job == mine) return Status::Ok();
  int64_t nproc = 0;
  std::string restarts;
  SplitFirst(*job, &nproc, &restarts);
  return CloseJob(
      doc.round, EndReason::kConfigMismatch,
      "node " + opts_.node_id +
          " has --nproc-per-node=" + std::to_string(opts_.nproc_per_node) +
          " --max-restarts=" + std::to_string(opts_.max_restarts) +
          " but the job runs with --nproc-per-node=" + std::to_string(nproc) +
          " --max-restarts=" + restarts +
          "; every node must pass the same values");
}

// Takes a slot in the doc's round (or, past max_nodes, a place in the queue
// for the next one).
Status Rendezvous::Register(const Doc& doc) {
  const int r = doc.round;
  const std::string& me = opts_.node_id;
  if (opts_.node_rank >= 0) {
    auto owner = store_->CompareSet(
        RoundKey(r, "static/" + std::to_string(opts_.node_rank)), "", me);
    if (!owner.ok()) return owner.status();
    if (*owner != me) {
      return CloseJob(
          r, EndReason::kDuplicateNodeRank,
          "two nodes claim --node-rank=" + std::to_string(opts_.node_rank) +
              " (" + *owner + " and " + me + "); give each node its own rank");
    }
  }
  // The ADD is the join: slots are dense and unique, so the round's size is
  // simply the counter, with no list to read and merge.
  auto slot = store_->Add(RoundKey(r, "n"), 1);
  if (!slot.ok()) return slot.status();
  joined_round_ = r;
  slot_ = *slot;
  last_call_ms_ = 0;
  close_tried_ = false;
  if (slot_ > opts_.max_nodes) {
    waiting_round_ = r;
    return store_->Add(RoundKey(r, "waiting"), 1).status();
  }
  // Static ranks, else the previous round's order: newcomers sort after.
  int hint = opts_.node_rank >= 0 ? opts_.node_rank
                                  : (last_round_ == r - 1 ? last_rank_ : -1);
  // The preference before the node key: WriteRanks waits for the latter.
  Status s = store_->Set(RoundKey(r, "pref/" + std::to_string(slot_)),
                         std::to_string(opts_.preferred_rank));
  if (!s.ok()) return s;
  s = store_->Set(RoundKey(r, "node/" + std::to_string(slot_)),
                  std::to_string(hint) + " " + me);
  if (!s.ok() || slot_ < opts_.min_nodes || opts_.min_nodes == opts_.max_nodes)
    return s;
  if (slot_ > opts_.min_nodes) {  // the node at slot min_nodes sets it now
    auto at = store_->Get(RoundKey(r, "last_call"));
    if (!at.ok()) return at.status();
    last_call_ms_ = ToInt(*at, 0);
    return Status::Ok();
  }
  last_call_ms_ = UnixMillis() + opts_.last_call_timeout.count();
  return store_->Set(RoundKey(r, "last_call"), std::to_string(last_call_ms_));
}

// Several nodes may decide at once that the round can close; the closing
// key elects one. Its claim carries the count it saw, and joiners after
// that count learn from `final` that they are out and wait for the next.
Status Rendezvous::TryClose(int round) {
  auto joined = store_->Add(RoundKey(round, "n"), 0);
  if (!joined.ok()) return joined.status();
  int count = static_cast<int>(std::min<int64_t>(*joined, opts_.max_nodes));
  if (count < opts_.min_nodes) return Status::Ok();
  close_tried_ = true;
  std::string claim = std::to_string(count) + " " + opts_.node_id;
  auto closer = store_->CompareSet(RoundKey(round, "closing"), "", claim);
  if (!closer.ok()) return closer.status();
  if (*closer != claim) return Status::Ok();  // another node closes it
  Status s = WriteRanks(round, count);
  if (!s.ok()) return s;
  return store_->CompareSet(RoundKey(round, "final"), "", std::to_string(count))
      .status();
}

// Whether the c10d nodes' --node-rank preferences decide the order: every
// node gave one, and no two the same.
static bool PreferencesDecide(const std::vector<std::string>& prefs) {
  std::set<int64_t> seen;
  for (const std::string& p : prefs) {
    int64_t rank = ToInt(p, -1);
    if (rank < 0 || !seen.insert(rank).second) return false;
  }
  return !prefs.empty();
}

// Ranks: --node-rank (static, or c10d when every node gave a distinct
// one), else nodes of the previous round keep their order and newcomers
// follow in join order.
Status Rendezvous::WriteRanks(int round, int count) {
  std::vector<std::string> node_keys;
  for (int slot = 1; slot <= count; ++slot) {
    node_keys.push_back(RoundKey(round, "node/" + std::to_string(slot)));
  }
  // A joiner sets its key right after taking its slot.
  Status s = store_->Wait(node_keys, opts_.join_timeout);
  if (!s.ok()) return s;
  auto entries = store_->MultiGet(node_keys);
  if (!entries.ok()) return entries.status();
  std::vector<std::string> pref_keys;
  for (int slot = 1; slot <= count; ++slot) {
    pref_keys.push_back(RoundKey(round, "pref/" + std::to_string(slot)));
  }
  auto prefs = store_->MultiGet(pref_keys);
  if (!prefs.ok()) return prefs.status();
  bool by_pref = PreferencesDecide(*prefs);
  if (!by_pref && opts_.preferred_rank >= 0) {
    Logger("dtrun.rdzv")
        ->info(
            "round {}: not every node gave a distinct --node-rank; group "
            "ranks follow the join order",
            round);
  }
  std::vector<std::tuple<int64_t, int, std::string>> order;  // hint, slot, id
  for (int slot = 1; slot <= count; ++slot) {
    int64_t hint = 0;
    std::string id;
    SplitFirst((*entries)[slot - 1], &hint, &id);
    if (by_pref) hint = ToInt((*prefs)[slot - 1], -1);
    order.emplace_back(hint < 0 ? INT64_MAX : hint, slot, id);
  }
  // Hint, then slot: the slot breaks ties and orders newcomers (hint -1
  // sorts last as INT64_MAX), so the order depends on the store alone.
  std::sort(order.begin(), order.end());
  std::vector<std::string> keys, values;
  for (int g = 0; g < count; ++g) {
    const auto& next = std::get<2>(order[(g + 1) % count]);
    keys.push_back(
        RoundKey(round, "rank/" + std::to_string(std::get<1>(order[g]))));
    values.push_back(std::to_string(g) + " " + (count > 1 ? next : ""));
    keys.push_back(RoundKey(round, "hb/" + std::to_string(g)));
    values.push_back("0");
  }
  return store_->MultiSet(keys, values);
}

Result<std::optional<Assignment>> Rendezvous::Outcome(const Doc& doc) {
  const int r = doc.round;
  // One request for both: the closer writes rank/ before final, so a set
  // final means this node's rank is there too.
  auto got = store_->MultiGet(
      {RoundKey(r, "final"), RoundKey(r, "rank/" + std::to_string(slot_))});
  if (!got.ok()) return got.status();
  const std::string& closed_with = (*got)[0];
  if (closed_with.empty() || closed_with == "-")
    return std::optional<Assignment>();
  int64_t count = ToInt(closed_with, 0);
  if (slot_ > count) {  // the round closed without us: wait for the next
    waiting_round_ = r;
    Status s = store_->Add(RoundKey(r, "waiting"), 1).status();
    if (!s.ok()) return s;
    return std::optional<Assignment>();
  }
  Assignment a;
  int64_t rank = 0;
  SplitFirst((*got)[1], &rank, &a.next_node);
  a.round = r;
  a.failures = doc.failures;
  a.group_world_size = static_cast<int>(count);
  a.group_rank = static_cast<int>(rank);
  a.world_size = a.group_world_size * opts_.nproc_per_node;
  a.base_rank = a.group_rank * opts_.nproc_per_node;
  return std::optional<Assignment>(a);
}

Status Rendezvous::Timeout(int round, Clock::time_point started) {
  auto joined = store_->Add(RoundKey(round, "n"), 0);
  int64_t n = joined.ok() ? std::min<int64_t>(*joined, opts_.max_nodes) : 0;
  std::vector<std::string> keys;
  for (int64_t slot = 1; slot <= n; ++slot) {
    keys.push_back(RoundKey(round, "node/" + std::to_string(slot)));
  }
  last_participants_.clear();
  auto entries = store_->MultiGet(keys);
  for (const auto& e : entries.ok() ? *entries : std::vector<std::string>()) {
    int64_t hint = 0;
    std::string id;
    SplitFirst(e, &hint, &id);
    if (!id.empty()) last_participants_.push_back(id);
  }
  return Status::Timeout(
      "rendezvous '" + opts_.run_id + "' round " + std::to_string(round) +
      " timed out after " + DescribeSeconds(Clock::now() - started) + ": " +
      std::to_string(n) + " of min " + std::to_string(opts_.min_nodes) +
      " nodes joined (" + JoinIds(last_participants_) +
      "); check --nnodes, that every node uses the same --rdzv-id, and that "
      "all reach the "
      "endpoint");
}

// How long one WAIT in Join may block: a poll interval, shortened to the
// end of the last call when this node may have to close the round then
// (nothing in the store changes at that moment, so nothing would wake us).
Rendezvous::Clock::duration Rendezvous::WaitStep(
    Clock::time_point deadline) const {
  Clock::duration step = opts_.poll_interval;
  if (last_call_ms_ > 0 && waiting_round_ != joined_round_ && !close_tried_) {
    step = std::min<Clock::duration>(
        step, std::chrono::milliseconds(
                  std::max<int64_t>(1, last_call_ms_ - UnixMillis())));
  }
  return std::max<Clock::duration>(std::min(step, deadline - Clock::now()),
                                   std::chrono::milliseconds(1));
}

Status Rendezvous::MaybeClose() {
  if (close_tried_) return Status::Ok();
  if (slot_ == opts_.max_nodes ||
      (last_call_ms_ > 0 && UnixMillis() >= last_call_ms_)) {
    return TryClose(joined_round_);
  }
  return Status::Ok();
}

Result<std::optional<Assignment>> Rendezvous::Look(int* round) {
  auto doc = ReadDoc();
  if (!doc.ok()) return doc.status();
  if (!doc->closed.empty()) return ClosedStatus(*doc);
  if (!config_checked_) {
    Status s = CheckConfig(*doc);
    if (!s.ok()) return s;
  }
  *round = doc->round;
  if (joined_round_ != doc->round) {
    Status s = Register(*doc);
    if (!s.ok()) return s;
  }
  if (waiting_round_ == doc->round) return std::optional<Assignment>();
  Status s = MaybeClose();
  if (!s.ok()) return s;
  return Outcome(*doc);
}

Result<Assignment> Rendezvous::Join(const std::function<bool()>& interrupted) {
  auto started = Clock::now();
  auto deadline = started + opts_.join_timeout;
  int r = -1;
  bool look = true;
  for (int step = 1;; ++step) {
    if (interrupted && interrupted())
      return Status::Canceled("rendezvous interrupted");
    if (look) {
      auto outcome = Look(&r);
      if (!outcome.ok()) return outcome.status();
      if (*outcome) {
        last_round_ = r;
        last_rank_ = (*outcome)->group_rank;
        watch_round_ = -1;
        Heartbeat(**outcome, true);
        return **outcome;
      }
    } else if (waiting_round_ != r) {
      Status s = MaybeClose();  // the last call may be over
      if (!s.ok()) return s;
    }
    if (Clock::now() >= deadline) return Timeout(r, started);
    bool in_round = waiting_round_ != r;
    Status s =
        store_->Wait({RoundKey(r, in_round ? "final" : "over")},
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         WaitStep(deadline)));
    if (!s.ok() && s.code() != Status::Code::kTimeout) return s;
    // Woken, something changed; timed out, nothing did (the wakes cover every
    // change), so the state is read again only now and then.
    look = s.ok() || step % 10 == 0;
  }
}

std::string Rendezvous::DescribeParticipants() const {
  return JoinIds(last_participants_);
}

// An ADD rather than a timestamp: the watcher only needs to see the value
// change, so no clock has to agree with another machine's.
Status Rendezvous::Heartbeat(const Assignment& current, bool force) {
  auto now = Clock::now();
  if (!force && now - last_beat_ < opts_.keep_alive_interval)
    return Status::Ok();
  last_beat_ = now;
  return store_
      ->Add(RoundKey(current.round, "hb/" + std::to_string(current.group_rank)),
            1)
      .status();
}

Result<RoundEvent> Rendezvous::StartNextRound(const Assignment& current,
                                              const std::string& why) {
  auto doc = ChangeDoc(current.round, [](Doc& d) { ++d.round; });
  if (!doc.ok()) return doc.status();
  Logger("dtrun.rdzv")->warn("starting round {}: {}", current.round + 1, why);
  return RoundEvent::kRestart;
}

Result<RoundEvent> Rendezvous::Check(const Assignment& current) {
  Status beat = Heartbeat(current, false);
  if (!beat.ok()) return beat;
  // The watched node's count: as read, as last pushed, or as last seen.
  std::string count;
  if (!WatchRound(current) || NeedsRead(current, &count)) {
    auto moved = ReadRound(current, &count);
    if (!moved.ok() || *moved != RoundEvent::kNone) return moved;
  }
  if (current.group_rank == 0) {  // one node watches the round's counters
    auto event = WatchCounters(current);
    if (!event.ok() || *event != RoundEvent::kNone) return event;
  }
  if (current.group_world_size == 1) return RoundEvent::kNone;
  return WatchNext(current, count.empty() ? watch_count_ : count);
}

Result<RoundEvent> Rendezvous::ReadRound(const Assignment& current,
                                         std::string* count) {
  const int r = current.round;
  const int n = current.group_world_size;
  std::vector<std::string> keys = {Key("state")};
  if (n > 1)
    keys.push_back(
        RoundKey(r, "hb/" + std::to_string((current.group_rank + 1) % n)));
  auto got = store_->MultiGet(keys);
  if (!got.ok()) return got.status();
  DTRUN_CHECK(got->size() == keys.size())
      << "MULTI_GET of " << keys.size() << " keys gave " << got->size()
      << " values";
  Doc s;
  if (!Doc::Parse((*got)[0], &s)) return CorruptState();
  if (!s.closed.empty()) return Ended(s);
  if (s.round != r) return RoundEvent::kRestart;
  if (n > 1) *count = (*got)[1];
  return RoundEvent::kNone;
}

// Push mode. Reading the state and the next node's counter on every check
// costs the store one request per node twice a second: 8,000 a second at
// 4,096 nodes, most of its load. Instead each node keeps one more
// connection on which the store pushes the two changes that matter, this
// round's `over` key (set whenever the state moves) and the watched node's
// heartbeat counter, so a quiet round costs the store only the heartbeat
// ADDs. The watch is registered before the first read of the round, so no
// change can fall between the read and the first push.
bool Rendezvous::WatchRound(const Assignment& current) {
  const int r = current.round;
  if (!opts_.open_watch || watch_off_round_ == r) return false;
  if (watch_ && watch_conn_round_ == r) return true;
  // A new connection per round: the old one's registrations go with it.
  watch_.reset();
  watch_conn_round_ = -1;
  auto opened = opts_.open_watch();
  if (!opened.ok()) {
    DropWatch(r, opened.status().message());
    return false;
  }
  watch_ = std::move(*opened);
  const int n = current.group_world_size;
  Status s = watch_->WatchKey(RoundKey(r, "over"));
  if (s.ok() && n > 1) {
    s = watch_->WatchKey(
        RoundKey(r, "hb/" + std::to_string((current.group_rank + 1) % n)));
  }
  if (!s.ok()) {
    DropWatch(r, s.message());
    return false;
  }
  watch_conn_round_ = r;
  read_due_ = true;
  return true;
}

bool Rendezvous::NeedsRead(const Assignment& current, std::string* count) {
  std::vector<KeyChange> changes;
  Status s = watch_->TakeChanges(&changes);
  if (!s.ok()) {
    DropWatch(current.round, s.message());
    return true;
  }
  // Pushes come in order on one TCP connection, so none is lost while the
  // connection stands; a failed connection sends this node back to reading.
  const std::string over = RoundKey(current.round, "over");
  bool read = read_due_;
  for (const auto& c : changes) {
    if (c.key == over) {
      read = true;
    } else if (c.kind != KeyChange::Kind::kDeleted) {
      *count = c.value;  // the only other key watched: the next node's
    }
  }
  read_due_ = false;
  return read;
}

void Rendezvous::DropWatch(int round, const std::string& why) {
  watch_.reset();
  watch_conn_round_ = -1;
  watch_off_round_ = round;
  Logger("dtrun.rdzv")
      ->warn(
          "round {}: the store pushes no changes here ({}); reading the "
          "round on every check instead",
          round, why);
}

RoundEvent Rendezvous::Ended(const Doc& doc) {
  end_reason_ = doc.end;
  if (doc.end == EndReason::kSucceeded) return RoundEvent::kAllDone;
  closed_reason_ = doc.closed;
  return RoundEvent::kClosed;
}

// Group rank 0 only: newcomers waiting to join start a round (there is room
// for them), and the last `done` of the round ends the job.
Result<RoundEvent> Rendezvous::WatchCounters(const Assignment& current) {
  const int r = current.round;
  const int n = current.group_world_size;
  auto waiting = store_->Add(RoundKey(r, "waiting"), 0);
  if (!waiting.ok()) return waiting.status();
  if (*waiting > 0 && n < opts_.max_nodes) {
    return StartNextRound(
        current, std::to_string(*waiting) + " node(s) waiting to join");
  }
  auto done = store_->Add(RoundKey(r, "done"), 0);
  if (!done.ok()) return done.status();
  if (*done < n) return RoundEvent::kNone;
  // MarkDone of the last node normally ends the job; this covers a last
  // node that died between its ADD and its compare-and-set.
  auto doc = ChangeDoc(r, [](Doc& d) { d.Close(EndReason::kSucceeded, "ok"); });
  if (!doc.ok()) return doc.status();
  return doc->closed.empty() ? RoundEvent::kRestart : Ended(*doc);
}

// Failure detection: the next node's heartbeat counter, timed by this
// node's own steady clock from when the value was last seen to change.
Result<RoundEvent> Rendezvous::WatchNext(const Assignment& current,
                                         const std::string& count) {
  auto now = Clock::now();
  if (watch_round_ != current.round || watch_count_ != count) {
    watch_round_ = current.round;
    watch_count_ = count;
    watch_since_ = now;
  } else if (now - watch_since_ >
             opts_.keep_alive_interval * opts_.keep_alive_max_attempt) {
    return StartNextRound(
        current, "node " + current.next_node + " sent no heartbeat for " +
                     DescribeSeconds(now - watch_since_) + "; declared dead");
  }
  return RoundEvent::kNone;
}

// ChangeDoc applies the change only while the state is still at this round,
// so when every node of a failed round reports, the failure counts once.
Result<int> Rendezvous::ReportFailure(const Assignment& current,
                                      const std::string& why) {
  auto doc = ChangeDoc(current.round, [&](Doc& d) {
    ++d.failures;
    if (d.failures > opts_.max_restarts) {
      d.Close(EndReason::kWorkersFailed,
              "workers failed on node " + opts_.node_id + " (" + why +
                  ") after " + std::to_string(opts_.max_restarts) +
                  " restart(s)");
    } else {
      ++d.round;
    }
  });
  if (!doc.ok()) return doc.status();
  closed_reason_ = doc->closed;
  end_reason_ = doc->end;
  return doc->failures;
}

Status Rendezvous::AckEnd(const Assignment& current) {
  return store_->Add(RoundKey(current.round, "ended"), 1).status();
}

// A store error counts as "not yet": the host keeps the store up until its
// own grace period ends rather than cut others off early.
bool Rendezvous::AllEnded(const Assignment& current) {
  auto n = store_->Add(RoundKey(current.round, "ended"), 0);
  return n.ok() && *n >= current.group_world_size;
}

Status Rendezvous::MarkDone(const Assignment& current) {
  auto done = store_->Add(RoundKey(current.round, "done"), 1);
  if (!done.ok()) return done.status();
  // The last node to finish ends the job at once.
  if (*done < current.group_world_size) return Status::Ok();
  return ChangeDoc(current.round,
                   [](Doc& d) { d.Close(EndReason::kSucceeded, "ok"); })
      .status();
}

Result<bool> Rendezvous::AwaitRoundOver(const Assignment& current,
                                        std::chrono::milliseconds timeout) {
  Status s = store_->Wait({RoundKey(current.round, "over")}, timeout);
  if (s.ok()) return true;
  if (s.code() == Status::Code::kTimeout) return false;
  return s;
}

}  // namespace dtrun::rendezvous
