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
// clocks need not agree. Group rank 0 also polls `waiting` (start a round to
// let newcomers in) and `done` (every node finished).
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

int64_t ToInt(const std::string& text, int64_t fallback) {
  int64_t v = 0;
  return ParseCounter(text, &v) ? v : fallback;
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
      keys_(opts_.run_id) {
  last_call_.max_nodes = opts_.max_nodes;
}

Result<StateDoc> Rendezvous::ReadDoc() {
  // One read for the state and the job's settings (CheckConfig's); only a
  // missing state costs a write: compare-and-set from "" creates it, so the
  // first nodes to arrive cannot both create one. On a replicated store a
  // write is a consensus round and a read is not, and thousands of joiners
  // read the state at once.
  auto got = store_->MultiGet({keys_.Job("state"), keys_.Job("config")});
  if (!got.ok()) return got.status();
  DTRUN_CHECK(got->size() == 2) << "MULTI_GET of 2 keys gave " << got->size();
  std::string text = std::move((*got)[0]);
  job_config_ = std::move((*got)[1]);
  if (text.empty()) {
    auto created =
        store_->CompareSet(keys_.Job("state"), "", StateDoc().Serialize());
    if (!created.ok()) return created.status();
    text = std::move(*created);
  }
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
Status Rendezvous::CheckConfig(const StateDoc& doc) {
  std::string mine = std::to_string(opts_.nproc_per_node) + " " +
                     std::to_string(opts_.max_restarts);
  // ReadDoc read the settings; the first node writes them.
  std::string job = job_config_;
  if (job.empty()) {
    auto set = store_->CompareSet(keys_.Job("config"), "", mine);
    if (!set.ok()) return set.status();
    job = std::move(*set);
  }
  config_checked_ = true;
  if (job == mine) return Status::Ok();
  int64_t nproc = 0;
  std::string restarts;
  SplitRecord(job, &nproc, &restarts);
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
  // The ADD is the join: slots are dense and unique, so the round's size is
  // simply the counter, with no list to read and merge.
  auto slot = store_->Add(keys_.Round(r, "n"), 1);
  if (!slot.ok()) return slot.status();
  joined_round_ = r;
  // One node of each elastic job says the store hosts it (a round that
  // closes short then names the other jobs there); best effort. A job of a
  // fixed size cannot close short: it costs that nothing.
  if (r == 0 && *slot == 1 && opts_.min_nodes < opts_.max_nodes) NoteRunId();
  last_call_ = LastCall{*slot, opts_.max_nodes};
  // The nodes the round expects are all in: no last call to wait out.
  if (doc.expect >= opts_.min_nodes) last_call_.expect = doc.expect;
  if (*slot > opts_.max_nodes) {
    waiting_round_ = r;
    return store_->Add(keys_.Round(r, "waiting"), 1).status();
  }
  // Static ranks, else the previous round's order: newcomers sort after.
  return Enter(r, opts_.node_rank >= 0
                      ? opts_.node_rank
                      : (last_round_ == r - 1 ? last_rank_ : -1));
}

Status Rendezvous::Enter(int r, int64_t hint) {
  const int64_t slot = last_call_.slot;
  // One request for both, the preference first: WriteRanks waits for the
  // node key (a store without MULTI_SET sets them in this order).
  Status s = store_->MultiSet(
      {keys_.Round(r, "pref", slot), keys_.Round(r, "node", slot)},
      {std::to_string(opts_.preferred_rank), NodeRecord(hint, opts_.node_id)});
  if (!s.ok() || slot < opts_.min_nodes || opts_.min_nodes == opts_.max_nodes)
    return s;
  if (slot > opts_.min_nodes) {  // the node at slot min_nodes sets it now
    auto at = store_->Get(keys_.Round(r, "last_call"));
    if (!at.ok()) return at.status();
    last_call_.deadline_ms = ToInt(*at, 0);
    return Status::Ok();
  }
  last_call_.deadline_ms =
      clock_.UnixMillis() + opts_.last_call_timeout.count();
  return store_->Set(keys_.Round(r, "last_call"),
                     std::to_string(last_call_.deadline_ms));
}

// Several nodes may decide at once that the round can close; the closing
// key elects one. Its claim carries the count it saw, and joiners after
// that count learn from `final` that they are out and wait for the next.
Status Rendezvous::TryClose(int round) {
  auto joined = store_->Add(keys_.Round(round, "n"), 0);
  if (!joined.ok()) return joined.status();
  int count = static_cast<int>(std::min<int64_t>(*joined, opts_.max_nodes));
  if (count < opts_.min_nodes) return Status::Ok();
  last_call_.close_tried = true;
  std::string claim = std::to_string(count) + " " + opts_.node_id;
  auto closer = store_->CompareSet(keys_.Round(round, "closing"), "", claim);
  if (!closer.ok()) return closer.status();
  if (*closer != claim) return Status::Ok();  // another node closes it
  const TimePoint started = clock_.Now();
  Status s = WriteRanks(round, count);
  if (s.ok()) {
    s = store_
            ->CompareSet(keys_.Round(round, "final"), "", std::to_string(count))
            .status();
  }
  if (!s.ok()) return s;
  Logger("dtrun.rdzv")
      ->info("round {}: closed with {} node(s), ranks written in {}", round,
             count, DescribeSeconds(clock_.Now() - started));
  if (count < opts_.max_nodes) SayShortRound(round, count);
  return Status::Ok();
}

// Bounded: a few jobs registering at once on one store retry a few times.
void Rendezvous::NoteRunId() {
  std::string seen;
  for (int i = 0; i < 5; ++i) {
    std::string next = RunIdsWith(seen, opts_.run_id, clock_.UnixMillis());
    auto now = store_->CompareSet(keys::kRunIds, seen, next);
    if (!now.ok() || *now == next) return;
    seen = *now;
  }
}

// An elastic round that closed below its maximum after its last call: how
// many came and were waited for, and the other jobs that rendezvoused on
// this store lately (a per-node --rdzv-id, a typo: each node then makes a
// world of its own without a word).
void Rendezvous::SayShortRound(int round, int count) {
  auto log = Logger("dtrun.rdzv");
  log->warn(
      "round {}: {} of up to {} node(s) (--nnodes={}:{}) came within the "
      "last call's {}; the job runs with {}",
      round, count, opts_.max_nodes, opts_.min_nodes, opts_.max_nodes,
      DescribeSeconds(opts_.last_call_timeout), count);
  auto list = store_->Get(keys::kRunIds);
  if (!list.ok()) return;
  const int64_t now = clock_.UnixMillis();
  for (const auto& [id, ms] :
       OtherRunIds(*list, opts_.run_id, now - opts_.join_timeout.count())) {
    log->warn(
        "another job, rdzv id '{}', rendezvoused on this store {} ago while "
        "this one ('{}') waited for nodes: if they are one job, give every "
        "node the same --rdzv-id",
        id, DescribeSeconds(std::chrono::milliseconds(now - ms)), opts_.run_id);
  }
}

// Ranks: the closer reads every joiner's records and writes every rank
// (OrderRanks decides), 64 to a key, in one MULTI_SET. The heartbeat
// counters are not written: a node's first beat makes its own, and a
// counter not there yet reads as empty, as one that does not move.
Status Rendezvous::WriteRanks(int round, int count) {
  std::vector<std::string> node_keys, pref_keys;
  for (int slot = 1; slot <= count; ++slot) {
    node_keys.push_back(keys_.Round(round, "node", slot));
    pref_keys.push_back(keys_.Round(round, "pref", slot));
  }
  // A joiner sets its key right after taking its slot.
  Status s = store_->Wait(node_keys, opts_.join_timeout);
  if (!s.ok()) return s;
  auto entries = store_->MultiGet(node_keys);
  if (!entries.ok()) return entries.status();
  auto prefs = store_->MultiGet(pref_keys);
  if (!prefs.ok()) return prefs.status();
  RankTable table = OrderRanks(*entries, *prefs);
  if (!table.by_preference && opts_.preferred_rank >= 0) {
    Logger("dtrun.rdzv")
        ->info(
            "round {}: not every node gave a distinct --node-rank; group "
            "ranks follow the join order",
            round);
  }
  std::vector<std::string> keys, values = PackRankRecords(table);
  for (size_t k = 0; k < values.size(); ++k)
    keys.push_back(keys_.Round(round, "ranks", static_cast<int64_t>(k)));
  return store_->MultiSet(keys, values);
}

Result<std::optional<Assignment>> Rendezvous::Outcome(const StateDoc& doc) {
  const int r = doc.round;
  // One request for both: the closer writes ranks/ before final, so a set
  // final means this node's rank is there too.
  const int64_t slot = last_call_.slot;
  auto got = store_->MultiGet(
      {keys_.Round(r, "final"), keys_.Round(r, "ranks", RankPackOf(slot))});
  if (!got.ok()) return got.status();
  Assignment a;
  switch (PlaceInRound(doc, slot, (*got)[0], RecordInPack((*got)[1], slot),
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
  std::vector<std::string> keys;
  for (int64_t slot = 1; slot <= n; ++slot) {
    keys.push_back(keys_.Round(round, "node", slot));
  }
  last_participants_.clear();
  auto entries = store_->MultiGet(keys);
  for (const auto& e : entries.ok() ? *entries : std::vector<std::string>()) {
    int64_t hint = 0;
    std::string id;
    SplitRecord(e, &hint, &id);
    if (!id.empty()) last_participants_.push_back(id);
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
  return TryClose(joined_round_);
}

Result<std::optional<Assignment>> Rendezvous::Look(int* round,
                                                   bool final_written) {
  // Woken by its round's `final`: the state read before still holds for
  // the round (it changes only to move the round on or to close the job,
  // and a job closed first writes final "-"), so one read tells the
  // outcome. Anything else reads the state again.
  if (final_written && round_doc_.round == *round && joined_round_ == *round &&
      waiting_round_ != *round) {
    auto quick = Outcome(round_doc_);
    if (!quick.ok() || *quick || waiting_round_ == *round) return quick;
  }
  auto doc = ReadDoc();
  if (!doc.ok()) return doc.status();
  round_doc_ = *doc;
  if (!doc->closed.empty()) return ClosedStatus(*doc);
  if (!config_checked_) {
    Status s = CheckConfig(*doc);
    if (!s.ok()) return s;
  }
  *round = doc->round;
  const bool registered = joined_round_ != doc->round;
  if (registered) {
    Status s = Register(*doc);
    if (!s.ok()) return s;
  }
  if (waiting_round_ == doc->round) return std::optional<Assignment>();
  Status s = MaybeClose();
  if (!s.ok()) return s;
  // A node that just took its slot and did not close learns the outcome
  // when `final` wakes it (at once if the round closed before it came):
  // a read now would find the round open.
  if (registered && !last_call_.close_tried) return std::optional<Assignment>();
  return Outcome(*doc);
}

Result<Assignment> Rendezvous::Join(const std::function<bool()>& interrupted) {
  // The last round's pushes are of no use any more; its connection goes now,
  // not at the first check of the next round.
  watch_.reset();
  watch_conn_round_ = -1;
  const TimePoint started = clock_.Now();
  const TimePoint deadline = started + opts_.join_timeout;
  int r = -1;
  bool look = true, woken_in_round = false;
  SafetyNet net;
  int polls = 0;  // poll intervals waited, for the safety net
  int quiet = 0;  // waits in the round in a row that nothing woke
  for (;;) {
    if (interrupted && interrupted())
      return Status::Canceled("rendezvous interrupted");
    if (look) {
      auto outcome = Look(&r, woken_in_round);
      if (!outcome.ok()) return outcome.status();
      if (*outcome) {
        last_round_ = r;
        last_rank_ = (*outcome)->group_rank;
        next_.Reset();
        next_gone_ = false;
        next_leased_ = false;
        BindGone(**outcome);
        Heartbeat(**outcome, true);
        return **outcome;
      }
    } else if (waiting_round_ != r) {
      Status s = MaybeClose();  // the last call may be over
      if (!s.ok()) return s;
    }
    const TimePoint now = clock_.Now();
    if (now >= deadline) return Timeout(r, started);
    bool in_round = waiting_round_ != r;
    auto woken = WaitForChange(r, in_round, quiet, deadline - now, &polls);
    if (!woken.ok()) return woken.status();
    quiet = in_round && !*woken ? quiet + 1 : 0;
    // Woken, something changed; timed out, nothing did (the wakes cover every
    // change), so the state is read again only as a safety net.
    look = *woken || net.Due(polls);
    woken_in_round = *woken && in_round;
  }
}

// One wait for round `r`'s `final` (in it) or `over` (not let in): true
// when the store woke it. In a round the store's wake says when it
// completes: the waits grow (1, 2, then 4 poll intervals), and so does the
// time a stop signal waits to be seen. A round of thousands of nodes would
// otherwise have each of them ask the store twice a second while the
// others join. Adds the poll intervals waited to *polls.
Result<bool> Rendezvous::WaitForChange(int r, bool in_round, int quiet,
                                       std::chrono::steady_clock::duration left,
                                       int* polls) {
  const auto poll = in_round ? opts_.poll_interval * (1 << std::min(quiet, 2))
                             : opts_.poll_interval;
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

// The store counts this node's connection closing in round/<r>/gone/<rank>
// and its (re)binds in round/<r>/bound/<rank> (Store::BindOnClose): the
// node watching this one knows at once that its dtrun is gone (killed,
// crashed, its host down) instead of after the missed heartbeats. A store
// that sees no connection close (etcd) keeps round/<r>/alive/<rank> under a
// lease of the silent limit instead: the watching node sees it deleted a
// TTL after this node stops renewing (dead, stopped or cut off), and this
// node writes no heartbeats (the renewals cost etcd no consensus round).
// A store with neither leaves the heartbeats to tell.
void Rendezvous::BindGone(const Assignment& a) {
  leased_ = false;
  Status s = store_->BindOnClose(keys_.Round(a.round, "gone", a.group_rank),
                                 keys_.Round(a.round, "bound", a.group_rank));
  lease_store_ = store_->has_leases();
  if (lease_store_) {
    s = store_->LeaseKey(
        keys_.Round(a.round, "alive", a.group_rank),
        opts_.keep_alive_interval * opts_.keep_alive_max_attempt);
    leased_ = s.ok();
  }
  if (!s.ok() && s.code() != Status::Code::kInvalid) {
    Logger("dtrun.rdzv")
        ->warn(
            "round {}: the store will not say when this node is gone ({}); "
            "heartbeats alone tell",
            a.round, s.message());
  }
}

void Rendezvous::Unbind() {
  (void)store_->BindOnClose("", "");
  if (lease_store_) (void)store_->LeaseKey("", std::chrono::milliseconds(0));
  leased_ = false;
}

// The watched node's key present means it holds a lease; deleted (pushed,
// or read missing after it was seen) means the lease ended.
void Rendezvous::SeeLease(const std::string& value, bool deleted) {
  if (!deleted && !value.empty()) {
    next_leased_ = true;
  } else if (next_leased_) {
    next_gone_ = true;
    gone_why_ =
        "lease in the store ended (its dtrun exited, was killed "
        "or stopped, or lost the store for the lease's time); "
        "declared dead";
  }
}

Result<RoundEvent> Rendezvous::DeclareGone(const Assignment& current) {
  next_gone_ = false;
  std::string why = gone_why_.empty()
                        ? "connection to the store closed (its dtrun "
                          "exited or was killed, or its host went down); "
                          "declared dead"
                        : gone_why_;
  gone_why_.clear();
  return StartNextRound(current, "node " + current.next_node + "'s " + why,
                        current.group_world_size - 1);
}

// An ADD rather than a timestamp: the watcher only needs to see the value
// change, so no clock has to agree with another machine's.
Status Rendezvous::Heartbeat(const Assignment& current, bool force) {
  if (leased_) {
    store_->StillAlive();
    return Status::Ok();
  }
  if (!beat_.Due(clock_.Now(), opts_.keep_alive_interval, force))
    return Status::Ok();
  return store_->Add(keys_.Round(current.round, "hb", current.group_rank), 1)
      .status();
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
  return RoundEvent::kRestart;
}

Result<RoundEvent> Rendezvous::Check(const Assignment& current) {
  auto event = CheckRound(current);
  // While this node cannot reach the store it cannot see the watched node
  // beat either (nor could that node beat, if the store itself was down):
  // its silence is timed afresh once the store answers again.
  if (!event.ok()) next_.Reset();
  return event;
}

Result<RoundEvent> Rendezvous::CheckRound(const Assignment& current) {
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
  if (next_gone_) return DeclareGone(current);
  return WatchNext(current, count.empty() ? next_.count() : count);
}

Result<RoundEvent> Rendezvous::ReadRound(const Assignment& current,
                                         std::string* count) {
  const int r = current.round;
  const int n = current.group_world_size;
  const int next = (current.group_rank + 1) % n;
  std::vector<std::string> keys = {keys_.Job("state")};
  if (n > 1) {
    keys.push_back(keys_.Round(r, "hb", next));
    keys.push_back(keys_.Round(r, "gone", next));
    keys.push_back(keys_.Round(r, "bound", next));
    if (lease_store_) keys.push_back(keys_.Round(r, "alive", next));
  }
  auto got = store_->MultiGet(keys);
  if (!got.ok()) return got.status();
  DTRUN_CHECK(got->size() == keys.size())
      << "MULTI_GET of " << keys.size() << " keys gave " << got->size()
      << " values";
  StateDoc s;
  if (!StateDoc::Parse((*got)[0], &s)) return CorruptState();
  if (!s.closed.empty()) return Ended(s);
  if (s.round != r) return RoundEvent::kRestart;
  if (n > 1) {
    *count = (*got)[1];
    // Every connection it bound has closed: its dtrun is gone.
    next_gone_ = next_gone_ || GoneOf((*got)[2], (*got)[3]);
    if (lease_store_) SeeLease((*got)[4], false);
  }
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
  std::vector<std::string> watched = {keys_.Round(r, "over")};
  if (n > 1) {
    watched.push_back(keys_.Round(r, "hb", (current.group_rank + 1) % n));
    watched.push_back(keys_.Round(r, "gone", (current.group_rank + 1) % n));
    if (lease_store_)
      watched.push_back(keys_.Round(r, "alive", (current.group_rank + 1) % n));
  }
  Status s = watch_->WatchKeys(watched);
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
  const std::string over = keys_.Round(current.round, "over");
  const int next =
      (current.group_rank + 1) % std::max(1, current.group_world_size);
  const std::string gone = keys_.Round(current.round, "gone", next);
  const std::string alive = keys_.Round(current.round, "alive", next);
  bool read = read_due_;
  for (const auto& c : changes) {
    if (c.key == alive) {
      SeeLease(c.value, c.kind == KeyChange::Kind::kDeleted);
    } else if (c.key == over || c.key == gone) {
      read = true;  // a close: read whether every bound connection closed
    } else if (c.kind != KeyChange::Kind::kDeleted) {
      *count = c.value;  // the only other key watched: the next node's beat
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
  const auto limit = opts_.keep_alive_interval * opts_.keep_alive_max_attempt;
  if (next_leased_) {
    // Its lease says when it is gone; a pushed round reads the key once a
    // silent limit in case the stream quietly stopped.
    if (!pushed(current) || clock_.Now() < next_lease_read_)
      return RoundEvent::kNone;
    next_lease_read_ = clock_.Now() + limit;
    std::string read;
    auto moved = ReadRound(current, &read);
    if (!moved.ok() || *moved != RoundEvent::kNone) return moved;
    return next_gone_ ? DeclareGone(current) : RoundEvent::kNone;
  }
  auto silent = next_.Observe(current.round, count, clock_.Now(), limit);
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
    if (next_gone_) return DeclareGone(current);
    if (next_leased_) return RoundEvent::kNone;
    silent = next_.Observe(current.round, read, clock_.Now(), limit);
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
  return doc->failures;
}

Status Rendezvous::AckEnd(const Assignment& current) {
  Unbind();
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
  Unbind();
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
