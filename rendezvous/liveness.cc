// One node's part of the round's liveness (liveness.h).
//
// Each node ADDs its own hb/<rank> every keep_alive_interval (an ADD, not a
// timestamp: the watcher only needs to see the value change, so no clock
// has to agree with another machine's) and watches the next rank's counter.
// It also gives the store its connections (Store::BindOnClose: round/<r>/
// gone/<rank> counts their closes, bound/<rank> their binds), so the node
// watching it knows at once that its dtrun is gone (killed, crashed, its
// host down) instead of after the missed heartbeats. A store that sees no
// connection close (etcd) keeps round/<r>/alive/<rank> under a lease of the
// silent limit instead: the watching node sees it deleted a TTL after this
// node stops renewing (dead, stopped or cut off), and this node writes no
// heartbeats (the renewals cost etcd no consensus round). A store with
// neither leaves the heartbeats to tell.
#include "rendezvous/liveness.h"

#include <algorithm>

#include "rendezvous/util/check.h"
#include "rendezvous/util/log.h"

namespace dtrun::rendezvous {

Liveness::Liveness(Store* store, const RoundKeys& keys,
                   std::chrono::milliseconds interval,
                   std::chrono::milliseconds limit, const Clock& clock)
    : store_(store),
      keys_(keys),
      interval_(interval),
      limit_(limit),
      clock_(clock) {}

// A new round watches a new node (or the same one under new keys): what
// was seen of the last one must not count against it.
Status Liveness::Enter(const Assignment& a, int64_t slot, const std::string& id,
                       bool bound) {
  next_.Reset();
  next_gone_ = false;
  next_leased_ = false;
  leased_ = false;
  lease_store_ = store_->has_leases();
  Status s = bound || lease_store_
                 ? Status::Ok()
                 : store_->BindOnClose(keys_.Round(a.round, "gone", slot),
                                       keys_.Round(a.round, "bound", slot));
  if (lease_store_) {
    s = bound ? Status::Ok() : store_->LeaseKey(AliveKey(a.round, id), limit_);
    leased_ = s.ok();
  }
  if (!s.ok() && s.code() != Status::Code::kInvalid) {
    Logger("dtrun.rdzv")
        ->warn(
            "round {}: the store will not say when this node is gone ({}); "
            "heartbeats alone tell",
            a.round, s.message());
  }
  return Beat(a, true);
}

void Liveness::Leave() {
  (void)store_->BindOnClose("", "");
  if (lease_store_) (void)store_->LeaseKey("", std::chrono::milliseconds(0));
  leased_ = false;
}

// A leased node's renewals are its beats: writing counters too would cost
// etcd a consensus round per node and beat for nothing.
Status Liveness::Beat(const Assignment& current, bool force) {
  if (leased_) {
    store_->StillAlive();
    return Status::Ok();
  }
  if (!beat_.Due(clock_.Now(), interval_, force)) return Status::Ok();
  return store_->Add(keys_.Round(current.round, "hb", current.group_rank), 1)
      .status();
}

// The counter and the lease by group rank, the connections by the slot the
// node joined in (they were bound as it joined, before it had a rank).
std::vector<std::string> Liveness::WatchedKeys(const Assignment& a) const {
  const int next_rank = (a.group_rank + 1) % std::max(1, a.group_world_size);
  std::vector<std::string> keys = {keys_.Round(a.round, "hb", next_rank),
                                   keys_.Round(a.round, "gone", a.next_slot),
                                   keys_.Round(a.round, "bound", a.next_slot)};
  if (lease_store_) keys.push_back(AliveKey(a.round, a.next_node));
  return keys;
}

std::string Liveness::AliveKey(int round, const std::string& id) const {
  return keys_.Round(round, "alive") + "/" + id;
}

std::string Liveness::ReadWatched(const std::vector<std::string>& values) {
  DTRUN_CHECK(values.size() == (lease_store_ ? 4u : 3u))
      << "the watched node's keys read as " << values.size() << " values";
  // Every connection it bound has closed: its dtrun is gone.
  next_gone_ = next_gone_ || GoneOf(values[1], values[2]);
  if (lease_store_) SeeLease(values[3], false);
  return values[0];
}

// The watched node's key present means it holds a lease; deleted (pushed,
// or read missing after it was seen) means the lease ended.
void Liveness::SeeLease(const std::string& value, bool deleted) {
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

std::optional<std::string> Liveness::TakeGone() {
  if (!next_gone_) return std::nullopt;
  next_gone_ = false;
  std::string why = gone_why_.empty()
                        ? "connection to the store closed (its dtrun "
                          "exited or was killed, or its host went down); "
                          "declared dead"
                        : gone_why_;
  gone_why_.clear();
  return why;
}

bool Liveness::LeaseReadDue() {
  if (clock_.Now() < next_lease_read_) return false;
  next_lease_read_ = clock_.Now() + limit_;
  return true;
}

std::optional<std::chrono::steady_clock::duration> Liveness::Silent(
    int round, const std::string& count) {
  return next_.Observe(round, count, clock_.Now(), limit_);
}

}  // namespace dtrun::rendezvous
