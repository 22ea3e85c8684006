#pragma once

#include "rendezvous/round_state.h"
#include "rendezvous/store.h"
#include "rendezvous/util/clock.h"
#include "rendezvous/util/status.h"

namespace dtrun::rendezvous {

struct RendezvousOptions;

// The closer of a round: the one node, elected by compare-and-set on the
// round's `closing` key, that orders the joiners and writes every rank and
// then `final`, which wakes them all. Also keeps the store's list of the
// jobs that rendezvoused on it, so a round that closes short can name the
// other jobs there (a per-node --rdzv-id, a typo). Decides nothing about
// whether a round may close (LastCall does); not thread-safe.
class RoundCloser {
 public:
  // Everything given must outlive it.
  RoundCloser(Store* store, const RendezvousOptions& opts,
              const RoundKeys& keys, const Clock& clock);

  // Closes round `round` when at least min_nodes joined and no other node
  // is closing it; marks `last_call` as tried once the round may close.
  Status TryClose(int round, LastCall* last_call);
  // This job's run id into the store's list (keys::kRunIds).
  void NoteRunId();
  // Set when the last TryClose found a joiner whose settings differ from
  // the first slot's: the message that closes the job ("" otherwise).
  const std::string& mismatch() const { return mismatch_; }

 private:
  Status WriteRanks(int round, int count);
  // A round closed with `count` < max_nodes: said, with the other jobs the
  // store saw lately.
  void SayShortRound(int round, int count);

  Store* store_;
  const RendezvousOptions& opts_;
  const RoundKeys& keys_;
  const Clock& clock_;
  std::string mismatch_;
};

}  // namespace dtrun::rendezvous
