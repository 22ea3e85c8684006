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

// A survivor's state carried into a new round of a multi-node job (another
// rank, another world size; rendezvous/in_place.h step 4), across the
// trainer built again in the same process.
struct Carried {
  TensorMap state;  // the strategy's, as Strategy::Restore takes it
  int64_t step = 0;
  int64_t epoch = 0;
};

// Thrown out of the loop when dtrun's word is a new round: the trainer is
// built again there (Train) with what Carry() took.
class NewRound : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Checkpointer;
class Distributed;
class Strategy;

class InPlaceRecovery {
 public:
  // Everything outlives it; `ckpt` may be null (no checkpoint.dir). The
  // loop's count of skipped steps is in the strategy's state
  // ("trainer.skipped_steps", Trainer::KeepSkippedInState).
  struct Context {
    Distributed* dist = nullptr;
    Strategy* strategy = nullptr;
    torch::optim::Optimizer* opt = nullptr;
    Checkpointer* ckpt = nullptr;
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
  // Whether every rank of this attempt begins by agreeing on the newest
  // state one holds (TakeNewest): a restarted DDP attempt, whose ranks may
  // include survivors of the last round, kept in their processes.
  static bool TakesNewestAtStart(Distributed& dist, const Strategy& strategy);
  // Collective: the newest state any rank holds (`held`: this rank's
  // step, -1 for none) to every rank behind it; -1 when no rank holds one
  // (every rank then resumes from its checkpoint). `received`: this rank
  // took it.
  int64_t TakeNewest(int64_t held, bool* received);
  // After NewRound: this rank's state, to carry into the new round.
  Carried Carry(int64_t held);
  // After NewRound: the new round's variables (dtrun's round file) into
  // this process's environment, for Distributed::FromEnv; the file goes.
  // The round's restart count; the group attempt counters start again
  // there (ResetGroupAttempts) once the old trainer is gone: until then
  // its threads must see their group given up. Throws Error when the
  // file cannot be read.
  static int EnterNewRound();
  // After `failure` (a collective failed: a rank died) on a rank that
  // holds the state of step `held`: the group re-formed and the newest
  // state shared; the step to go on from, with the resume record written
  // for dtrun's recovery report. Throws Error naming `failure` when the
  // group does not re-form (nobody is replaced: it fails as it would have),
  // or NewRound when the regroup failed because dtrun went to a new round
  // meanwhile and kept this rank for it.
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
  int64_t ShareState(int64_t held, const Staged& staged, bool* received,
                     bool none_held_ok = false);
  // Until dtrun's word of attempt `next` (a replacement: true) or of a new
  // round (throws NewRound naming `failure`); false after kRegroupWait.
  bool AwaitWord(int next, const std::string& failure);
  // A regroup that failed: throws NewRound naming `failure` when dtrun's
  // round file comes within kRoundFileWait (the store the regroup waited
  // in closed as this node's dtrun went to a new round, keeping this
  // rank); returns otherwise.
  void FollowNewRound(const std::string& failure);

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
  std::atomic<int> key_seen_{0};         // the newest attempt's key seen
  std::atomic<bool> new_round_{false};   // dtrun's round file seen
  std::atomic<bool> leaving_{false};     // NewRound thrown
  std::string round_file_;               // its path ("" without dtrun)
  std::atomic<bool> stop_{false};
  std::thread watcher_;  // last: it uses the members above
};

}  // namespace dtrun::train
