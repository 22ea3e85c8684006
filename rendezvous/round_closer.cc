// The closer's role in a round (round_closer.h).
#include "rendezvous/round_closer.h"

#include <algorithm>

#include "rendezvous/rendezvous.h"
#include "rendezvous/store_keys.h"
#include "rendezvous/util/describe.h"
#include "rendezvous/util/log.h"

namespace dtrun::rendezvous {

RoundCloser::RoundCloser(Store* store, const RendezvousOptions& opts,
                         const RoundKeys& keys, const Clock& clock)
    : store_(store), opts_(opts), keys_(keys), clock_(clock) {}

// Several nodes may decide at once that the round can close; the closing
// key elects one. Its claim carries the count it saw, and joiners after
// that count learn from `final` that they are out and wait for the next.
Status RoundCloser::TryClose(int round, LastCall* last_call) {
  auto joined = store_->Add(keys_.Round(round, "n"), 0);
  if (!joined.ok()) return joined.status();
  int count = static_cast<int>(std::min<int64_t>(*joined, opts_.max_nodes));
  if (count < opts_.min_nodes) return Status::Ok();
  last_call->close_tried = true;
  std::string claim = std::to_string(count) + " " + opts_.node_id;
  auto closer = store_->CompareSet(keys_.Round(round, "closing"), "", claim);
  if (!closer.ok()) return closer.status();
  if (*closer != claim) return Status::Ok();  // another node closes it
  const TimePoint started = clock_.Now();
  Status s = WriteRanks(round, count);
  const std::string final_key = keys_.Round(round, "final");
  auto final_set =
      s.ok() ? store_->CompareSet(final_key, "", std::to_string(count))
             : Result<std::string>(s);
  if (!final_set.ok()) return final_set.status();
  // torch's own store without libuv wakes no waiter on a compare-and-set:
  // the same value SET again does (dtrun's store has woken them already).
  if (*final_set == std::to_string(count)) {
    s = store_->Set(final_key, *final_set);
    if (!s.ok()) return s;
  }
  Logger("dtrun.rdzv")
      ->info("round {}: closed with {} node(s), ranks written in {}", round,
             count, DescribeSeconds(clock_.Now() - started));
  if (count < opts_.max_nodes) SayShortRound(round, count);
  return Status::Ok();
}

// Bounded: a few jobs registering at once on one store retry a few times.
void RoundCloser::NoteRunId() {
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
void RoundCloser::SayShortRound(int round, int count) {
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

// Ranks: the closer reads every joiner's record (Store::ReadEnlisted)
// and writes every rank (OrderRanks decides), 64 to a key, in one
// MULTI_SET. The heartbeat counters are not written: a node's first beat
// makes its own, and a counter not there yet reads as empty, as one that
// does not move. A joiner whose settings differ from the first slot's
// stops here: the job is closed instead (mismatch()).
Status RoundCloser::WriteRanks(int round, int count) {
  auto entries = store_->ReadEnlisted(keys_.Round(round, "node") + "/", count,
                                      opts_.join_timeout);
  if (!entries.ok()) return entries.status();
  std::vector<std::string> node_records, prefs;
  JoinRecord first;
  for (int slot = 1; slot <= count; ++slot) {
    JoinRecord r;
    if (!JoinRecord::Parse((*entries)[slot - 1], &r)) {
      return Status::Invalid("round " + std::to_string(round) + ": slot " +
                             std::to_string(slot) +
                             " holds no joiner's record; is another program "
                             "using --rdzv-id " +
                             opts_.run_id + "?");
    }
    // The first slot's settings are the job's: the node that differs is
    // named, with the one it differs from, so the user knows which to fix.
    if (slot == 1) first = r;
    if (r.nproc != first.nproc || r.max_restarts != first.max_restarts) {
      mismatch_ = "node " + r.node_id + " has " + r.Settings() +
                  " but the job runs with " + first.Settings() + " (node " +
                  first.node_id + "); every node must pass the same values";
      return Status::Invalid(mismatch_);
    }
    node_records.push_back(NodeRecord(r.hint, r.node_id));
    prefs.push_back(std::to_string(r.preferred));
  }
  RankTable table = OrderRanks(node_records, prefs);
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

}  // namespace dtrun::rendezvous
