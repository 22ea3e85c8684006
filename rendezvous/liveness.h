#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/round_state.h"
#include "rendezvous/store.h"
#include "rendezvous/util/clock.h"
#include "rendezvous/util/status.h"

namespace dtrun::rendezvous {

// Whether the nodes of a round are alive, one node's part of it: this
// node's own signs of life (heartbeats, the connections it binds, its
// lease) and what it sees of the node it watches (the next group rank:
// its counter, its connections closing, its lease ending). Decides nothing
// about rounds: Rendezvous asks it and moves the state. Keys are
// round/<r>/hb|gone|bound|alive/<rank> (rendezvous/README.md, "The
// rendezvous protocol"). Not thread-safe: the agent's thread owns it.
class Liveness {
 public:
  // `store` and `clock` must outlive it; `limit` is the silent limit
  // (keep_alive_interval x keep_alive_max_attempt).
  Liveness(Store* store, const RoundKeys& keys,
           std::chrono::milliseconds interval, std::chrono::milliseconds limit,
           const Clock& clock);

  // This node holds group rank `a.group_rank` of round `a.round`: forgets
  // the previous round's watched node, binds this node's connections (or
  // leases its key where the store sees no connection close) and beats.
  // `slot`, `id`: this node's slot in the round and its node id; `bound`:
  // its connection was bound to the slot's `gone` key, or its `alive` key
  // put under its lease, as it joined (Store::Enlist).
  Status Enter(const Assignment& a, int64_t slot, const std::string& id,
               bool bound);
  // This node leaves on purpose: its connection or lease ending is no news.
  void Leave();
  // A heartbeat when one is due (or `force`); a leased node's renewal.
  Status Beat(const Assignment& current, bool force);

  // Whether the store has leases (etcd): its `alive` key is then read and
  // watched too.
  bool lease_store() const { return lease_store_; }
  // The watched node's keys of `round` to read, in ReadWatched's order.
  std::vector<std::string> WatchedKeys(const Assignment& a) const;
  // round/<r>/alive/<node id>: under that node's lease (etcd).
  std::string AliveKey(int round, const std::string& id) const;
  // What a read of WatchedKeys gave (values[0] is the counter); returns it.
  std::string ReadWatched(const std::vector<std::string>& values);
  // The watched node's lease key as read or pushed ("" when missing).
  void SeeLease(const std::string& value, bool deleted);
  // Its every connection closed or its lease ended: why, in words, and the
  // news is taken (nullopt while it stands).
  std::optional<std::string> TakeGone();
  // Whether it holds a lease: then its lease tells, not its counter.
  bool next_leased() const { return next_leased_; }
  // A pushed round reads a leased node's key once a silent limit, in case
  // the stream quietly stopped: true when that read is due (and restarts
  // the interval).
  bool LeaseReadDue();
  // Records the watched node's counter; how long it has stood still when
  // past the silent limit.
  std::optional<std::chrono::steady_clock::duration> Silent(
      int round, const std::string& count);
  // The counter last seen, "" before any.
  const std::string& last_count() const { return next_.count(); }
  // Its silence is timed afresh (this node could not reach the store).
  void Forget() { next_.Reset(); }

 private:
  Store* store_;
  const RoundKeys& keys_;
  std::chrono::milliseconds interval_, limit_;
  const Clock& clock_;
  BeatTimer beat_;
  HeartbeatWatch next_;     // the watched node's heartbeat counter
  bool next_gone_ = false;  // its every store connection closed, or its
                            // lease ended
  std::string gone_why_;    // which of the two, for the log
  // Leases (a store that sees no connection close: etcd): whether the
  // store has them, whether this node's key is under one (then it writes
  // no heartbeats: the lease's renewals are its beats), whether the
  // watched node's key was seen, and when a pushed round reads it again.
  bool lease_store_ = false;
  bool leased_ = false;
  bool next_leased_ = false;
  TimePoint next_lease_read_{};
};

}  // namespace dtrun::rendezvous
