// The round protocol. Every node runs the same code against one shared
// Store; there is no leader process, only a leader *role* per round (the
// closer) won by compare-and-set. Keys live under "rdzv/<run_id>/" (the
// table is in rendezvous.h and rendezvous/README.md, "The rendezvous
// protocol").
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
// clocks need not agree; its connections closing or its lease ending tell
// sooner (liveness.h). Group rank 0 also polls `waiting` (start a round to
// let newcomers in) and `done` (every node finished). Running rounds are
// followed through the store's pushes where it has them (round_watch.h).
//
// The end record. A failure past --max-restarts, disagreeing settings or a
// duplicate --node-rank set `closed` (a message) and `end` (EndReasonName),
// so every node exits for the same reason; "ok"/succeeded when all are done.
// Each node then ADDs round/<r>/ended, and the node hosting the store waits
// for all of them before the store goes away (AllEnded).
//
// What each reply means and what follows from it (the state document, the
// rank order, a slot's placement, the last call, a silent node) is decided
// by the pure functions of round_state.h, on time read from the injected
// Clock; this file is the shell that reads and writes the keys.

#include "rendezvous/rendezvous.h"

#include <unistd.h>

#include <algorithm>

#include "rendezvous/store_keys.h"
#include "rendezvous/util/check.h"
#include "rendezvous/util/describe.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"
#include "rendezvous/store_state.h"

namespace dtrun::rendezvous {
namespace {

std::string JoinIds(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out.empty() ? "none" : out;
}

}  // namespace

std::string MakeNodeId() {
  // The pid tells agents on one host apart; the random part tells apart a
  // restarted agent that got a recycled pid (or the same pid in a container).
  return os::HostName() + "_" + std::to_string(getpid()) + "_" +
         os::RandomHex(5);
}

Rendezvous::Rendezvous(Store* store, RendezvousOptions options,
                       const Clock& clock)
    : store_(store),
      opts_(std::move(options)),
      clock_(clock),
      keys_(opts_.run_id),
      closer_(store, opts_, keys_, clock),
      liveness_(store, keys_, opts_.keep_alive_interval,
                opts_.keep_alive_interval * opts_.keep_alive_max_attempt,
                clock),
      watch_(opts_.open_watch, keys_) {
  last_call_.max_nodes = opts_.max_nodes;
}

Result<StateDoc> Rendezvous::ReadDoc() {
  // A missing state is round 0, open: nobody writes it until something
  // must change (the first compare-and-set expects it missing), so the
  // first nodes to arrive do not all race to create it.
  auto got = store_->MultiGet({keys_.Job("state")});
  if (!got.ok()) return got.status();
  DTRUN_CHECK(got->size() == 1) << "MULTI_GET of 1 key gave " << got->size();
  return ParseDoc((*got)[0]);
}

Result<StateDoc> Rendezvous::ParseDoc(const std::string& text) {
  StateDoc d;
  if (!StateDoc::Parse(text, &d)) {
    end_reason_ = EndReason::kForeignState;
    return Status::Invalid(
        "rendezvous state at key '" + keys_.Job("state") +
        "' is not dtrun's; is another program using --rdzv-id " + opts_.run_id +
        "?");
  }
  return d;
}

Result<StateDoc> Rendezvous::ChangeDoc(
    int round, const std::function<void(StateDoc&)>& mutate) {
  auto current = ReadDoc();
  if (!current.ok()) return current;
  StateDoc cur = *current;
  while (cur.round == round && cur.closed.empty()) {
    StateDoc next = cur;
    mutate(next);
    std::string text = next.Serialize();
    auto got = store_->CompareSet(keys_.Job("state"), cur.raw, text);
    if (!got.ok()) return got.status();
    if (*got == text) {
      next.raw = text;
      // Wake the nodes waiting on the round: those that could not get in,
      // and (when the job closed before the round did) its joiners.
      Status s = store_->Set(keys_.Round(round, "over"), "1");
      auto abandoned =
          s.ok() ? store_->CompareSet(keys_.Round(round, "final"), "", "-")
                 : Result<std::string>(s);
      if (!abandoned.ok()) return abandoned.status();
      return next;
    }
    if (!StateDoc::Parse(*got, &cur)) return CorruptState();
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
    auto doc = ChangeDoc(round, [&](StateDoc& d) { d.Close(reason, why); });
    if (!doc.ok()) return doc.status();
    if (!doc->closed.empty()) return ClosedStatus(*doc);
    round = doc->round;
  }
}

Status Rendezvous::ClosedStatus(const StateDoc& doc) {
  closed_reason_ = doc.closed;
  end_reason_ = doc.end;
  if (doc.end == EndReason::kSucceeded) {
    return Status::Unavailable(
        "rendezvous '" + opts_.run_id +
        "' belongs to a job that already finished; use a new --rdzv-id");
  }
  return Status::Invalid(doc.closed);
}

// A joiner's settings travel in its record and the closer compares them
// (RoundCloser): workers with different world sizes or restart budgets
// would hang or diverge rather than fail cleanly, so the job closes.
Status Rendezvous::MaybeCloseMismatch(int round, const Status& closed) {
  if (closer_.mismatch().empty()) return closed;
  return CloseJob(round, EndReason::kConfigMismatch, closer_.mismatch());
}

// This node's entry in round r: its record (static rank, else the previous
// round's, as the order's hint; its --node-rank; its settings, which the
// closer compares) and how the store is to tell that it is gone.
Store::Enlistment Rendezvous::EntryOf(int r) const {
  JoinRecord record;
  record.hint = opts_.node_rank >= 0 ? opts_.node_rank
                                     : (last_round_ == r - 1 ? last_rank_ : -1);
  record.preferred = opts_.preferred_rank;
  record.nproc = opts_.nproc_per_node;
  record.max_restarts = opts_.max_restarts;
  record.node_id = opts_.node_id;
  Store::Enlistment e;
  e.counter = keys_.Round(r, "n");
  e.records = keys_.Round(r, "node") + "/";
  e.id = opts_.node_id;
  e.record = record.Text();
  e.closes = keys_.Round(r, "gone") + "/";
  e.rebinds = keys_.Round(r, "bound") + "/";
  if (store_->has_leases()) {  // etcd: the lease's key in the same write
    e.alive = keys_.Round(r, "alive") + "/";
    e.alive_ttl = opts_.keep_alive_interval * opts_.keep_alive_max_attempt;
  }
  return e;
}

// Takes a slot in the doc's round (or, past max_nodes, a place in the queue
// for the next one).
Status Rendezvous::Register(const StateDoc& doc) {
  const int r = doc.round;
  const std::string& me = opts_.node_id;
  if (opts_.node_rank >= 0) {
    auto owner =
        store_->CompareSet(keys_.Round(r, "static", opts_.node_rank), "", me);
    if (!owner.ok()) return owner.status();
    if (*owner != me) {
      return CloseJob(
          r, EndReason::kDuplicateNodeRank,
          "two nodes claim --node-rank=" + std::to_string(opts_.node_rank) +
              " (" + *owner + " and " + me + "); give each node its own rank");
    }
  }
  // The join is one request (Store::Enlist): the slot's ADD, the record the
  // closer reads, and the binding of this node's connection to the slot's
  // `gone` key. Slots are dense and unique, so the round's size is simply
  // the counter, with no list to read and merge.
  const Store::Enlistment e = EntryOf(r);
  auto enlisted = store_->Enlist(e);
  if (!enlisted.ok()) return enlisted.status();
  const int64_t* slot = &enlisted->slot;
  bound_ = enlisted->bound;
  joined_round_ = r;
  // One node of each elastic job says the store hosts it (a round that
  // closes short then names the other jobs there); best effort. A job of a
  // fixed size cannot close short: it costs that nothing.
  if (r == 0 && *slot == 1 && opts_.min_nodes < opts_.max_nodes)
    closer_.NoteRunId();
  last_call_ = LastCall{*slot, opts_.max_nodes};
  // The nodes the round expects are all in: no last call to wait out.
  if (doc.expect >= opts_.min_nodes) last_call_.expect = doc.expect;
  if (*slot > opts_.max_nodes) {
    waiting_round_ = r;
    return store_->Add(keys_.Round(r, "waiting"), 1).status();
  }
  return StartLastCall(r);
}

// Slot min_nodes of an elastic round opens the last call; a later slot
// takes its own arrival + the last call as its deadline rather than read
// that node's: it can only be later, and the node at min_nodes closes on
// time unless it died.
Status Rendezvous::StartLastCall(int r) {
  const int64_t slot = last_call_.slot;
  if (slot < opts_.min_nodes || opts_.min_nodes == opts_.max_nodes)
    return Status::Ok();
  last_call_.deadline_ms =
      clock_.UnixMillis() + opts_.last_call_timeout.count();
  if (slot > opts_.min_nodes) return Status::Ok();
  return store_->Set(keys_.Round(r, "last_call"),
                     std::to_string(last_call_.deadline_ms));
}

Result<std::optional<Assignment>> Rendezvous::Outcome(int r) {
  // One request for the state and the outcome: the closer writes ranks/
  // before final, so a set final means this node's rank is there too.
  const int64_t slot = last_call_.slot;
  auto got = store_->MultiGet({keys_.Job("state"), keys_.Round(r, "final"),
                               keys_.Round(r, "ranks", RankPackOf(slot))});
  if (!got.ok()) return got.status();
  auto doc = ParseDoc((*got)[0]);
  if (!doc.ok()) return doc.status();
  round_doc_ = *doc;
  if (!doc->closed.empty()) return ClosedStatus(*doc);
  if (doc->round != r) {  // moved on (or joined a round long over): again
    doc_known_ = true;
    return std::optional<Assignment>();
  }
  Assignment a;
  switch (PlaceInRound(*doc, slot, (*got)[1], RecordInPack((*got)[2], slot),
                       opts_.nproc_per_node, &a)) {
    case Placement::kOpen:
      return std::optional<Assignment>();
    case Placement::kLeftOut: {  // closed without us: wait for the next
      waiting_round_ = r;
      Status s = store_->Add(keys_.Round(r, "waiting"), 1).status();
      if (!s.ok()) return s;
      return std::optional<Assignment>();
    }
    case Placement::kAssigned:
      break;
  }
  return std::optional<Assignment>(a);
}

Status Rendezvous::Timeout(int round, TimePoint started) {
  auto joined = store_->Add(keys_.Round(round, "n"), 0);
  int64_t n = joined.ok() ? std::min<int64_t>(*joined, opts_.max_nodes) : 0;
  last_participants_.clear();
  auto entries = store_->ReadEnlisted(keys_.Round(round, "node") + "/", n,
                                      std::chrono::milliseconds(0));
  for (const auto& e : entries.ok() ? *entries : std::vector<std::string>()) {
    JoinRecord record;
    if (JoinRecord::Parse(e, &record))
      last_participants_.push_back(record.node_id);
  }
  return Status::Timeout(
      "rendezvous '" + opts_.run_id + "' round " + std::to_string(round) +
      " timed out after " + DescribeSeconds(clock_.Now() - started) + ": " +
      std::to_string(n) + " of min " + std::to_string(opts_.min_nodes) +
      " nodes joined (" + JoinIds(last_participants_) +
      "); check --nnodes, that every node uses the same --rdzv-id, and that "
      "all reach the "
      "endpoint");
}

Status Rendezvous::MaybeClose() {
  if (!last_call_.MayClose(clock_.UnixMillis())) return Status::Ok();
  return MaybeCloseMismatch(joined_round_,
                            closer_.TryClose(joined_round_, &last_call_));
}

Result<std::optional<Assignment>> Rendezvous::Look(int* round,
                                                   bool final_written) {
  // Woken by its round's `final`: one read tells the state and the
  // outcome. When that finds the state moved on, the state it read is
  // the one to join.
  if (final_written && joined_round_ == *round && waiting_round_ != *round) {
    auto quick = Outcome(*round);
    if (!quick.ok() || *quick || !doc_known_) return quick;
  }
  // The state as this node last saw it move (a round it saw start, or
  // none yet: round 0) is joined without reading it first: the outcome's
  // read checks it. Anything else reads the state again.
  if (!doc_known_) {
    auto doc = ReadDoc();
    if (!doc.ok()) return doc.status();
    round_doc_ = *doc;
  }
  doc_known_ = false;
  const StateDoc doc = round_doc_;
  if (!doc.closed.empty()) return ClosedStatus(doc);
  *round = doc.round;
  const bool registered = joined_round_ != doc.round;
  if (registered) {
    Status s = Register(doc);
    if (!s.ok()) return s;
  }
  if (waiting_round_ == doc.round) return std::optional<Assignment>();
  Status s = MaybeClose();
  if (!s.ok()) return s;
  // A node that just took its slot and did not close learns the outcome
  // when `final` wakes it (at once if the round closed before it came):
  // a read now would find the round open.
  if (registered && !last_call_.close_tried) return std::optional<Assignment>();
  auto outcome = Outcome(doc.round);
  if (outcome.ok() && !*outcome && doc_known_) return Look(round, false);
  return outcome;
}

Result<Assignment> Rendezvous::Join(const std::function<bool()>& interrupted) {
  // The last round's pushes are of no use any more; its connection goes now,
  // not at the first check of the next round.
  watch_.Close();
  const TimePoint started = clock_.Now();
  const TimePoint deadline = started + opts_.join_timeout;
  int r = -1;
  bool look = true, woken_in_round = false;
  SafetyNet net;
  int polls = 0;  // poll intervals waited, for the safety net
  for (;;) {
    if (interrupted && interrupted())
      return Status::Canceled("rendezvous interrupted");
    if (look) {
      auto outcome = Look(&r, woken_in_round);
      if (!outcome.ok()) return outcome.status();
      if (*outcome) {
        last_round_ = r;
        last_rank_ = (*outcome)->group_rank;
        (void)liveness_.Enter(**outcome, last_call_.slot, opts_.node_id,
                              bound_);
        return **outcome;
      }
    } else if (waiting_round_ != r) {
      Status s = MaybeClose();  // the last call may be over
      if (!s.ok()) return s;
    }
    const TimePoint now = clock_.Now();
    if (now >= deadline) return Timeout(r, started);
    bool in_round = waiting_round_ != r;
    auto woken = WaitForChange(r, in_round, deadline - now, &polls);
    if (!woken.ok()) return woken.status();
    // Woken, something changed; timed out, nothing did (the wakes cover every
    // change), so the state is read again only as a safety net.
    look = *woken || net.Due(polls);
    woken_in_round = *woken && in_round;
  }
}

// One wait for round `r`'s `final` (in it) or `over` (not let in): true
// when the store woke it. In a round the store's wake says when it
// completes, so a wait lasts 4 poll intervals (2 s: a stop signal is seen
// within that): a round of thousands of nodes costs each of them one wait
// rather than one every half second. Adds the poll intervals waited to
// *polls.
Result<bool> Rendezvous::WaitForChange(int r, bool in_round,
                                       std::chrono::steady_clock::duration left,
                                       int* polls) {
  const auto poll = in_round ? opts_.poll_interval * 4 : opts_.poll_interval;
  auto wait = last_call_.WaitStep(
      poll, clock_.UnixMillis(), in_round,
      std::chrono::duration_cast<std::chrono::milliseconds>(left));
  Status s = store_->Wait({keys_.Round(r, in_round ? "final" : "over")}, wait);
  if (!s.ok() && s.code() != Status::Code::kTimeout) return s;
  *polls += std::max<int>(
      1, static_cast<int>(wait.count() /
                          std::max<int64_t>(1, opts_.poll_interval.count())));
  return s.ok();
}

std::string Rendezvous::DescribeParticipants() const {
  return JoinIds(last_participants_);
}

Result<RoundEvent> Rendezvous::DeclareGone(const Assignment& current,
                                           const std::string& why) {
  return StartNextRound(current, "node " + current.next_node + "'s " + why,
                        current.group_world_size - 1);
}

Result<RoundEvent> Rendezvous::StartNextRound(const Assignment& current,
                                              const std::string& why,
                                              int expect) {
  auto doc = ChangeDoc(current.round, [expect](StateDoc& d) {
    ++d.round;
    d.expect = expect;
  });
  if (!doc.ok()) return doc.status();
  Logger("dtrun.rdzv")->warn("starting round {}: {}", current.round + 1, why);
  return Moved(*doc);
}

Result<RoundEvent> Rendezvous::Check(const Assignment& current) {
  auto event = CheckRound(current);
  // While this node cannot reach the store it cannot see the watched node
  // beat either (nor could that node beat, if the store itself was down):
  // its silence is timed afresh once the store answers again.
  if (!event.ok()) liveness_.Forget();
  return event;
}

Result<RoundEvent> Rendezvous::CheckRound(const Assignment& current) {
  Status beat = liveness_.Beat(current, false);
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
  if (auto why = liveness_.TakeGone()) return DeclareGone(current, *why);
  return WatchNext(current, count.empty() ? liveness_.last_count() : count);
}

Result<RoundEvent> Rendezvous::ReadRound(const Assignment& current,
                                         std::string* count) {
  const int r = current.round;
  const int n = current.group_world_size;
  std::vector<std::string> keys = {keys_.Job("state")};
  if (n > 1) {
    for (std::string& k : liveness_.WatchedKeys(current))
      keys.push_back(std::move(k));
  }
  auto got = store_->MultiGet(keys);
  if (!got.ok()) return got.status();
  DTRUN_CHECK(got->size() == keys.size())
      << "MULTI_GET of " << keys.size() << " keys gave " << got->size()
      << " values";
  StateDoc s;
  if (!StateDoc::Parse((*got)[0], &s)) return CorruptState();
  if (!s.closed.empty()) return Ended(s);
  if (s.round != r) return Moved(s);
  if (n > 1) *count = liveness_.ReadWatched({got->begin() + 1, got->end()});
  return RoundEvent::kNone;
}

// Push mode (round_watch.h): the round's `over` key and the watched node's
// counter, closes and lease, as the store pushes them.
bool Rendezvous::WatchRound(const Assignment& current) {
  const int n = current.group_world_size;
  std::vector<std::string> watched;
  if (n > 1) {
    watched = liveness_.WatchedKeys(current);
    watched.erase(watched.begin() + 2);  // `bound` only matters when read
  }
  return watch_.Follow(current.round, watched);
}

bool Rendezvous::NeedsRead(const Assignment& current, std::string* count) {
  const int r = current.round;
  const int next =
      (current.group_rank + 1) % std::max(1, current.group_world_size);
  RoundWatch::Pushed pushed = watch_.Take(
      r, keys_.Round(r, "hb", next), keys_.Round(r, "gone", current.next_slot),
      liveness_.AliveKey(r, current.next_node));
  for (const auto& [value, deleted] : pushed.lease)
    liveness_.SeeLease(value, deleted);
  if (!pushed.count.empty()) *count = pushed.count;
  return pushed.read;
}

// The state moved on (or closed) as this node saw it: the next Join takes
// its slot in that round without reading the state first.
RoundEvent Rendezvous::Moved(const StateDoc& doc) {
  round_doc_ = doc;
  doc_known_ = true;
  return doc.closed.empty() ? RoundEvent::kRestart : Ended(doc);
}

RoundEvent Rendezvous::Ended(const StateDoc& doc) {
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
  auto waiting = store_->Add(keys_.Round(r, "waiting"), 0);
  if (!waiting.ok()) return waiting.status();
  if (*waiting > 0 && n < opts_.max_nodes) {
    return StartNextRound(
        current, std::to_string(*waiting) + " node(s) waiting to join",
        static_cast<int>(std::min<int64_t>(n + *waiting, opts_.max_nodes)));
  }
  auto done = store_->Add(keys_.Round(r, "done"), 0);
  if (!done.ok()) return done.status();
  if (*done < n) return RoundEvent::kNone;
  // MarkDone of the last node normally ends the job; this covers a last
  // node that died between its ADD and its compare-and-set.
  auto doc =
      ChangeDoc(r, [](StateDoc& d) { d.Close(EndReason::kSucceeded, "ok"); });
  if (!doc.ok()) return doc.status();
  return doc->closed.empty() ? RoundEvent::kRestart : Ended(*doc);
}

// Failure detection: the next node's heartbeat counter, timed by this
// node's own steady clock from when the value was last seen to change.
Result<RoundEvent> Rendezvous::WatchNext(const Assignment& current,
                                         const std::string& count) {
  if (liveness_.next_leased()) {
    // Its lease says when it is gone; a pushed round reads the key once a
    // silent limit in case the stream quietly stopped.
    if (!pushed(current) || !liveness_.LeaseReadDue()) return RoundEvent::kNone;
    std::string read;
    auto moved = ReadRound(current, &read);
    if (!moved.ok() || *moved != RoundEvent::kNone) return moved;
    auto why = liveness_.TakeGone();
    return why ? DeclareGone(current, *why) : RoundEvent::kNone;
  }
  auto silent = liveness_.Silent(current.round, count);
  if (!silent) return RoundEvent::kNone;
  if (pushed(current)) {
    // Pushes stop both when the node does and when the stream quietly
    // does (an etcd member stopped or cut off): read before declaring it.
    std::string read;
    auto moved = ReadRound(current, &read);
    if (!moved.ok() || *moved != RoundEvent::kNone) return moved;
    // The read may be the first to see its lease (a store outage before
    // any read of the round came through) or its end: they tell, not
    // heartbeats a leased node never writes.
    if (auto why = liveness_.TakeGone()) return DeclareGone(current, *why);
    if (liveness_.next_leased()) return RoundEvent::kNone;
    silent = liveness_.Silent(current.round, read);
    if (!silent) return RoundEvent::kNone;
  }
  return StartNextRound(current,
                        "node " + current.next_node +
                            " sent no heartbeat for " +
                            DescribeSeconds(*silent) + "; declared dead",
                        current.group_world_size - 1);
}

// ChangeDoc applies the change only while the state is still at this round,
// so when every node of a failed round reports, the failure counts once.
Result<int> Rendezvous::ReportFailure(const Assignment& current,
                                      const std::string& why, bool give_up) {
  auto doc = ChangeDoc(current.round, [&](StateDoc& d) {
    ++d.failures;
    if (give_up) {
      d.Close(EndReason::kNoProgress,
              "workers failed on node " + opts_.node_id + " (" + why + ")");
    } else if (d.failures > opts_.max_restarts) {
      d.Close(EndReason::kWorkersFailed,
              "workers failed on node " + opts_.node_id + " (" + why +
                  ") after " + std::to_string(opts_.max_restarts) +
                  " restart(s)");
    } else {
      ++d.round;
      d.expect = current.group_world_size;  // every node restarts its group
    }
  });
  if (!doc.ok()) return doc.status();
  closed_reason_ = doc->closed;
  end_reason_ = doc->end;
  (void)Moved(*doc);
  return doc->failures;
}

Status Rendezvous::AckEnd(const Assignment& current) {
  liveness_.Leave();
  return store_->Add(keys_.Round(current.round, "ended"), 1).status();
}

// A store error counts as "not yet": the host keeps the store up until its
// own grace period ends rather than cut others off early.
bool Rendezvous::AllEnded(const Assignment& current) {
  auto n = store_->Add(keys_.Round(current.round, "ended"), 0);
  return n.ok() && *n >= current.group_world_size;
}

// This node leaves on purpose from here: its connection closing is no
// longer news.
Status Rendezvous::MarkDone(const Assignment& current) {
  liveness_.Leave();
  auto done = store_->Add(keys_.Round(current.round, "done"), 1);
  if (!done.ok()) return done.status();
  // The last node to finish ends the job at once.
  if (*done < current.group_world_size) return Status::Ok();
  return ChangeDoc(current.round,
                   [](StateDoc& d) { d.Close(EndReason::kSucceeded, "ok"); })
      .status();
}

Result<bool> Rendezvous::AwaitRoundOver(const Assignment& current,
                                        std::chrono::milliseconds timeout) {
  Status s = store_->Wait({keys_.Round(current.round, "over")}, timeout);
  if (s.ok()) return true;
  if (s.code() == Status::Code::kTimeout) return false;
  return s;
}

}  // namespace dtrun::rendezvous
