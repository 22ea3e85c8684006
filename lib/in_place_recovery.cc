// In-place recovery, the trainer's half (in_place_recovery.h).
#include "lib/in_place_recovery.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <unistd.h>

#include "lib/checkpointing/checkpointer.h"
#include "lib/parallel/in_place.h"
#include "lib/parallel/strategy.h"
#include "lib/process_group.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/in_place.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::train {

bool InPlaceRecovery::Possible(const Distributed& dist,
                               const Strategy& strategy,
                               const Checkpointer* ckpt) {
  return rendezvous::in_place::Wanted() && WhyNot(dist, strategy, ckpt).empty();
}

std::string InPlaceRecovery::WhyNot(const Distributed& dist,
                                    const Strategy& strategy,
                                    const Checkpointer* ckpt) {
  if (!rendezvous::in_place::Wanted()) return "";
  if (!strategy.CanRegroup())
    return "this strategy cannot re-form its process group";
  if (dist.backend() != "gloo")
    return "it re-forms gloo groups only, this one runs " + dist.backend();
  if (!strategy.EveryRankHoldsAll() && !ckpt) {
    return "FSDP's shards die with their rank, and without checkpoint.dir "
           "there is no checkpoint to go back to";
  }
  return "";
}

bool InPlaceRecovery::JoinsFromPeer(Distributed& dist,
                                    const Strategy& strategy) {
  return strategy.EveryRankHoldsAll() && dist.JoinsInPlace();
}

// A wait in slices, so that the thread notices the end of the run soon
// (the destructor joins it); each slice costs the store a wait and its
// cancel.
constexpr std::chrono::milliseconds kWatchSlice{100};

InPlaceRecovery::InPlaceRecovery(const Context& c)
    : c_(c),
      watch_store_(c.dist->ConnectStore(rendezvous::Dialect::kTorch2)),
      watching_(c.dist->env().restart_count + 1),
      round_file_(rendezvous::in_place::BeatFileWith(
          rendezvous::in_place::kRoundSuffix)) {
  SetGroupAttempt(c.dist->env().restart_count);
  watcher_ = std::thread([this] { Watch(); });
}

InPlaceRecovery::~InPlaceRecovery() {
  stop_ = true;
  watcher_.join();
}

// Two words: the store's key (a replacement in this group) and the round
// file (a new round elsewhere). A store that is gone (its node lost, or
// the job ending) leaves the round file to watch.
void InPlaceRecovery::Watch() {
  bool store_answers = true;
  while (!stop_) {
    const int next = watching_.load();
    if (!round_file_.empty() && ::access(round_file_.c_str(), F_OK) == 0) {
      new_round_ = true;
      AnnounceAttempt(next);
      AwaitRegroup(next);
      return;  // the new round's trainer watches for itself
    }
    if (!store_answers) {
      std::this_thread::sleep_for(kWatchSlice);
      continue;
    }
    Status s = watch_store_->Wait({rendezvous::in_place::RegroupKey(next)},
                                  kWatchSlice);
    if (s.ok()) {
      key_seen_ = next;
      AnnounceAttempt(next);
      AwaitRegroup(next);
    } else if (s.code() != Status::Code::kTimeout) {
      store_answers = false;
    }
  }
}

void InPlaceRecovery::AwaitRegroup(int next) {
  const auto stuck = rendezvous::in_place::StuckLimit();
  const auto limit = std::chrono::steady_clock::now() + stuck;
  // Until the group re-formed as `next` (or the run ends, or this rank
  // left for a new round).
  while (!stop_ && !leaving_ && watching_.load() == next) {
    if (!regrouping_ && std::chrono::steady_clock::now() >= limit) {
      std::fprintf(stderr,
                   "rank %d: still in a collective %lld s after dtrun said a "
                   "rank died (a peer that will not answer it): exiting, so "
                   "that the whole group restarts\n",
                   c_.dist->rank(), (long long)stuck.count());
      std::fflush(stderr);
      // Not exit(): its destructors would join the process group's
      // threads, blocked in the very collective this gets out of.
      std::_Exit(75);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int64_t InPlaceRecovery::Join() {
  bool received = false;
  return ShareState(-1, Staged{}, &received);
}

bool InPlaceRecovery::TakesNewestAtStart(Distributed& dist,
                                         const Strategy& strategy) {
  return dist.env().restart_count > 0 && strategy.EveryRankHoldsAll();
}

int64_t InPlaceRecovery::TakeNewest(int64_t held, bool* received) {
  return ShareState(held, Staged{}, received, /*none_held_ok=*/true);
}

// The watcher reads both words; this rank's collective failed already, so
// whichever comes first decides: a replacement re-forms this group, a
// new round builds another one (NewRound leaves the trainer).
bool InPlaceRecovery::AwaitWord(int next, const std::string& failure) {
  const auto until =
      std::chrono::steady_clock::now() + rendezvous::in_place::kRegroupWait;
  while (std::chrono::steady_clock::now() < until) {
    if (new_round_) {
      leaving_ = true;
      throw NewRound(failure);
    }
    if (key_seen_.load() >= next) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// What the survivor holds, taken once its writes in flight ended: views of
// its tensors, which outlive the trainer they came from.
Carried InPlaceRecovery::Carry(int64_t held) {
  if (c_.ckpt) c_.ckpt->Settle();
  Carried k;
  k.state = c_.strategy
                ->Copy(*c_.opt, true,
                       [](const torch::Tensor& t) { return t.detach(); })
                .parts;
  k.step = held;
  k.epoch = c_.ckpt ? c_.ckpt->epoch() : 0;
  return k;
}

// Every variable the round changes must be there: a worker that went on
// with the last round's MASTER_PORT or RANK would wait in a store or a
// group nobody else joins. The file goes once read, so that the next
// round's word is a new file. The attempt counters start again at the
// round's number: the old round's announcements mean nothing in it.
int InPlaceRecovery::EnterNewRound() {
  const std::string path =
      rendezvous::in_place::BeatFileWith(rendezvous::in_place::kRoundSuffix);
  std::FILE* f = path.empty() ? nullptr : std::fopen(path.c_str(), "r");
  if (!f) throw Error("the new round's variables: cannot read " + path);
  std::map<std::string, std::string> vars;
  char line[4096];
  while (std::fgets(line, sizeof(line), f)) {
    std::string kv(line);
    while (!kv.empty() && (kv.back() == '\n' || kv.back() == '\r'))
      kv.pop_back();
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  std::fclose(f);
  ::unlink(path.c_str());
  for (const char* const* name = rendezvous::in_place::RoundVariables(); *name;
       ++name) {
    auto it = vars.find(*name);
    if (it == vars.end())
      throw Error(path + " does not name " + std::string(*name));
    ::setenv(*name, it->second.c_str(), 1);
  }
  return std::atoi(vars["TORCHELASTIC_RESTART_COUNT"].c_str());
}

int64_t InPlaceRecovery::Regroup(const std::string& failure, int64_t held) {
  const int next = c_.dist->env().restart_count + 1;
  if (!AwaitWord(next, failure)) {
    throw Error(failure +
                "; no word from dtrun of a replacement or a new "
                "round within " +
                std::to_string(rendezvous::in_place::kRegroupWait.count()) +
                " s");
  }
  std::fprintf(stderr,
               "rank %d: %s\nrank %d: re-forming the group in place after "
               "step %lld (attempt %d)\n",
               c_.dist->rank(), failure.c_str(), c_.dist->rank(),
               (long long)held, next);
  std::fflush(stderr);
  regrouping_ = true;
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag = false; }
  } done{regrouping_};
  if (!c_.strategy->EveryRankHoldsAll()) return Rewind(failure, held);
  std::future<Staged> staging;
  Staged staged;
  try {
    ReForm(next, [&](int replaced) { staging = Stage(replaced, next, held); });
    if (staging.valid()) staged = staging.get();
    const double init_unix = os::UnixNow();
    bool received = false;
    const int64_t step = ShareState(held, staged, &received);
    rendezvous::Heartbeat::Resumed(step, received ? "peer" : "kept", init_unix,
                                   os::UnixNow());
    return step;
  } catch (const std::exception& e) {
    if (staging.valid()) staged = staging.get();
    if (!staged.name.empty()) Unstage(staged.name);
    FollowNewRound(failure);
    throw Error(failure + "; the group did not re-form in place: " + e.what());
  }
}

// The strategy's group dropped and built again as attempt `next` once
// dtrun named the replaced rank (`meanwhile` runs then); the watcher then
// waits for the attempt after it.
void InPlaceRecovery::ReForm(int next,
                             const std::function<void(int)>& meanwhile) {
  c_.strategy->Regroup([&] {
    c_.dist->Regroup(next, rendezvous::in_place::kRegroupWait, meanwhile);
    return &c_.dist->pg();
  });
  SetGroupAttempt(next);
  watching_ = next + 1;
}

// The write in flight ends first (its thread reads the shards the resume
// overwrites); then the group as above, with nothing staged, and the
// resume every rank makes, the replacement at its start.
int64_t InPlaceRecovery::Rewind(const std::string& failure, int64_t held) {
  const int next = c_.dist->env().restart_count + 1;
  int replaced = 0;
  try {
    c_.ckpt->Settle();
    ReForm(next, [&](int r) { replaced = r; });
    const double init_unix = os::UnixNow();
    const int64_t step = c_.ckpt->Resume();
    if (step == 0) c_.start_over();  // the replacement starts fresh too
    if (c_.dist->rank() == (replaced == 0 ? 1 : 0)) {
      std::printf(
          "in place: back to step %lld from %s (%lld step(s) to do "
          "again)\n",
          (long long)step,
          step == 0 ? "the start (no checkpoint yet)"
                    : c_.ckpt->source().c_str(),
          (long long)(held - step));
    }
    rendezvous::Heartbeat::Resumed(step, c_.ckpt->source().c_str(), init_unix,
                                   os::UnixNow());
    return step;
  } catch (const std::exception& e) {
    FollowNewRound(failure);
    throw Error(failure + "; the group did not re-form in place: " + e.what());
  }
}

// dtrun writes the round file when the new round closes, and closes the
// old round's store about then: either may come first.
constexpr std::chrono::seconds kRoundFileWait{2};

void InPlaceRecovery::FollowNewRound(const std::string& failure) {
  if (round_file_.empty()) return;
  const auto until = std::chrono::steady_clock::now() + kRoundFileWait;
  do {
    if (::access(round_file_.c_str(), F_OK) == 0) {
      new_round_ = true;
      leaving_ = true;
      throw NewRound(failure);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < until);
}

// What a rank behind needs: the strategy's state (model, optimizer, the
// user's, the loss scale's and the count of skipped steps) and the
// checkpoints' epoch, the live tensors. Each step reseeds its generator (Step),
// so none is sent.
TensorMap InPlaceRecovery::LiveState() {
  TensorMap state =
      c_.strategy
          ->Copy(*c_.opt, true,
                 [](const torch::Tensor& t) { return t.detach(); })
          .parts;
  state["trainer.epoch"] =
      torch::tensor({c_.ckpt ? c_.ckpt->epoch() : int64_t{0}}, torch::kLong);
  return state;
}

// The node rank `rank` runs on: every node runs as many ranks, in a row.
int InPlaceRecovery::NodeOf(int rank) const {
  return rank / std::max(1, c_.dist->env().local_world_size);
}

// While the replacement starts, the lowest-ranked survivor on its node
// copies its state into shared memory, where the replacement will read it:
// on a thread of its own, while this one builds the group again (which
// only touches the gradients). Where no survivor shares the replacement's
// node, or /dev/shm is too small, the process group's sends do it.
std::future<InPlaceRecovery::Staged> InPlaceRecovery::Stage(int replaced,
                                                            int restart_count,
                                                            int64_t held) {
  const int first = NodeOf(replaced) * c_.dist->env().local_world_size;
  const int stager = replaced == first ? first + 1 : first;
  if (c_.dist->rank() != stager || NodeOf(stager) != NodeOf(replaced))
    return {};
  Staged staged{
      StageName(c_.dist->env().master_port, restart_count, c_.dist->rank()),
      held};
  return std::async(std::launch::async,
                    [this, staged, state = LiveState()]() -> Staged {
                      Status s = StageState(staged.name, state);
                      if (s.ok()) return staged;
                      std::fprintf(stderr,
                                   "rank %d: %s; the state goes over the "
                                   "process group\n",
                                   c_.dist->rank(), s.message().c_str());
                      return {};
                    });
}

// Collective on a re-formed group: the ranks behind take the newest state
// from a rank that holds it, staged (on its node) or sent, and restore it
// as from a checkpoint.
int64_t InPlaceRecovery::ShareState(int64_t held, const Staged& staged,
                                    bool* received, bool none_held_ok) {
  ProcessGroup& pg = c_.dist->pg();
  const HeldState s = AgreeOnState(pg, held, staged.step);
  *received = false;
  if (s.newest < 0 && none_held_ok) return -1;
  if (s.newest < 0) {
    throw Error("rank " + std::to_string(c_.dist->rank()) +
                ": the group re-formed in place, but no rank holds the run's "
                "state (every rank is new)");
  }
  auto staged_for = [&](int r) {
    return s.from_stage() && NodeOf(r) == NodeOf(s.source);
  };
  if (c_.dist->rank() == s.source) {
    TensorMap state;
    for (int r = 0; r < c_.dist->world_size(); ++r) {
      if (!s.behind(r) || staged_for(r)) continue;
      if (state.empty()) state = LiveState();
      SendState(pg, r, state);
    }
  }
  *received = s.behind(c_.dist->rank());
  if (*received) {
    Result<TensorMap> state =
        staged_for(c_.dist->rank())
            ? MapState(StageName(c_.dist->env().master_port,
                                 c_.dist->env().restart_count, s.source))
            : Result<TensorMap>(ReceiveState(pg, s.source));
    if (!state.ok()) throw Error(state.status().message());
    if (c_.ckpt)
      c_.ckpt->JoinInPlace(state->at("trainer.epoch").item<int64_t>());
    state->erase("trainer.epoch");
    if (c_.ckpt) c_.ckpt->Fence();
    Status restored = c_.strategy->Restore(*state, *c_.opt);
    if (!restored.ok()) throw Error(restored.message());
  }
  // The staged copies go once every rank behind has read one.
  if (std::find_if(s.staged.begin(), s.staged.end(),
                   [](int64_t v) { return v >= 0; }) != s.staged.end()) {
    pg.barrier()->wait();
    if (!staged.name.empty()) Unstage(staged.name);
  }
  return s.newest;
}

}  // namespace dtrun::train
