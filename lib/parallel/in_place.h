#pragma once

// In-place recovery's collectives (rendezvous/in_place.h has the protocol
// with dtrun): once the group is re-formed, the ranks agree on the newest
// state one of them holds, and each rank behind it (the replacement, or a
// survivor whose last step did not complete) takes that state from a rank
// holding it, for Strategy::Restore: from the shared-memory segment that
// rank staged it in while the replacement started (a rank on the same
// node), else tensor by tensor over the process group.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "lib/formats/checkpoint_payload.h"
#include "lib/torch_compat.h"
#include "rendezvous/util/status.h"

namespace dtrun::train {

// Whether dtrun announced a group past the one this process runs (a rank
// died; RegroupWatch sees the announcement): the current group's
// collectives are doomed, so the loop and DDP's gradient hooks throw at
// their next check instead of computing on. Process-wide.
bool GroupBroken();
// The attempt this process's group runs, and one dtrun announced.
void SetGroupAttempt(int attempt);
void AnnounceAttempt(int attempt);
// A new round (numbered afresh): both, the group not broken.
void ResetGroupAttempts(int attempt);
// Throws Error naming `where` when the group is broken.
void ThrowIfGroupBroken(const char* where);
// Waits for `work` to end (rethrowing its error). `sliced` (a gloo group):
// in slices, throwing as ThrowIfGroupBroken once the group is broken,
// since a collective that a live rank elsewhere left (it saw the dead
// rank; this one's part of the ring did not) never ends on gloo. The work
// stays in flight until the old group goes (Strategy::Regroup). NCCL's
// waits are NCCL's own (its abort).
void WaitUnlessGroupBroken(const c10::intrusive_ptr<c10d::Work>& work,
                           bool sliced, const char* where);

// Who holds what: `held` is each rank's step (-1: nothing, a
// replacement), `staged` the step it staged in shared memory (-1: none).
struct HeldState {
  std::vector<int64_t> held, staged;  // by rank
  int64_t newest = -1;
  // The lowest rank that staged `newest`, else the lowest holding it.
  int source = -1;
  bool behind(int rank) const { return held[rank] < newest; }
  bool from_stage() const { return staged[source] == newest; }
};

// Every rank's `held` and `staged` gathered (collective); `newest` is -1
// when no rank holds any state.
HeldState AgreeOnState(ProcessGroup& pg, int64_t held, int64_t staged);

// The segment rank `rank` stages its state in, unique to the store (its
// port) and the attempt.
std::string StageName(int master_port, int restart_count, int rank);
// Writes `state` into a new segment `name`, copied on up to four threads;
// Io naming why not (a /dev/shm too small).
Status StageState(const std::string& name, const TensorMap& state);
// The staged state as CPU tensors that view the segment, which stays
// mapped while any of them lives.
Result<TensorMap> MapState(const std::string& name);
void Unstage(const std::string& name);

// `state` (any device; sent from host memory) to rank `dst`, which calls
// ReceiveState: the names, dtypes and shapes first, then each tensor.
void SendState(ProcessGroup& pg, int dst, const TensorMap& state);
// What rank `src` sends, in CPU tensors of their own.
TensorMap ReceiveState(ProcessGroup& pg, int src);

}  // namespace dtrun::train
