#pragma once

// The trainer's half of in-place recovery (rendezvous/in_place.h has the
// protocol with dtrun): when a rank dies, each survivor's collective fails;
// it drops its process group, waits for dtrun's word that a replacement is
// starting, builds the group again around it, and the ranks behind (the
// replacement, a survivor whose last step did not complete) take the
// newest state a rank holds (lib/parallel/in_place.h moves it). Nobody
// stops, restarts or reads a checkpoint. That is DDP's, where every rank
// holds the whole state. FSDP's shards die with their rank: there every
// rank, the replacement too, goes back to the newest checkpoint (the
// node's memory copies first), the survivors in their processes. Gloo
// only.

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <functional>
#include <future>
#include <string>

#include "lib/formats/checkpoint_payload.h"
#include "lib/torch_compat.h"
#include "rendezvous/store_client.h"

namespace dtrun::train {

class Checkpointer;
class Distributed;
class Strategy;

class InPlaceRecovery {
 public:
  // Everything outlives it; `ckpt` may be null (no checkpoint.dir).
  // `skipped`: the loop's count of skipped steps, part of the state.
  struct Context {
    Distributed* dist = nullptr;
    Strategy* strategy = nullptr;
    torch::optim::Optimizer* opt = nullptr;
    Checkpointer* ckpt = nullptr;
    int64_t* skipped = nullptr;
    // Going back before the first checkpoint (FSDP): the strategy's state
    // made the model's as first made (Strategy::StartOver).
    std::function<void()> start_over;
  };
  // Whether dtrun asked for in-place recovery and this run can keep its
  // state through it (a strategy that can re-form, on gloo; FSDP with
  // checkpoints to go back to: `ckpt` non-null).
  static bool Possible(const Distributed& dist, const Strategy& strategy,
                       const Checkpointer* ckpt);
  // Why not, when dtrun asked for it ("" when possible or not asked).
  static std::string WhyNot(const Distributed& dist, const Strategy& strategy,
                            const Checkpointer* ckpt);
  // Starts watching for dtrun's word (a thread and a store connection of
  // its own), so that a survivor stops its step as soon as a rank died.
  explicit InPlaceRecovery(const Context& c);
  ~InPlaceRecovery();

  // Whether this process replaces a rank and takes a survivor's state
  // through Join() (DDP); an FSDP replacement resumes as any restart does.
  static bool JoinsFromPeer(Distributed& dist, const Strategy& strategy);
  // A replacement: the newest state from a survivor (collective); the
  // step it holds.
  int64_t Join();
  // After `failure` (a collective failed: a rank died) on a rank that
  // holds the state of step `held`: the group re-formed and the newest
  // state shared; the step to go on from, with the resume record written
  // for dtrun's recovery report. Throws Error naming `failure` when the
  // group does not re-form (nobody is replaced: it fails as it would have).
  int64_t Regroup(const std::string& failure, int64_t held);

 private:
  // A state copied into shared memory for the ranks behind, and its step;
  // none: an empty name, step -1.
  struct Staged {
    std::string name;
    int64_t step = -1;
  };
  int NodeOf(int rank) const;
  std::future<Staged> Stage(int replaced, int restart_count, int64_t held);
  // FSDP's Regroup: the group re-formed, every rank back at the newest
  // checkpoint.
  int64_t Rewind(const std::string& failure, int64_t held);
  void ReForm(int next, const std::function<void(int)>& meanwhile);
  TensorMap LiveState();
  // Collective on a re-formed group: the newest state any rank holds
  // (`held`: this rank's step, -1 for a replacement) to every rank behind
  // it; returns its step and says whether this rank `received` it.
  int64_t ShareState(int64_t held, const Staged& staged, bool* received);

  // The watcher's loop: waits, in slices, for the word of attempt
  // watching_ and announces it (lib/parallel/in_place.h's GroupBroken).
  void Watch();
  // After the word of attempt `next`: waits for Regroup() to begin, and
  // ends the process when it does not within kStuckLimit.
  void AwaitRegroup(int next);

  Context c_;
  std::unique_ptr<rendezvous::TcpStoreClient> watch_store_;
  std::atomic<int> watching_{0};
  std::atomic<bool> regrouping_{false};  // Regroup() has begun
  std::atomic<bool> stop_{false};
  std::thread watcher_;  // last: it uses the members above
};

}  // namespace dtrun::train
