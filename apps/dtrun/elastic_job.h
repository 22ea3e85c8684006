#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "apps/dtrun/elastic_watch.h"
#include "apps/dtrun/job.h"
#include "apps/dtrun/rdzv_backend.h"
#include "apps/dtrun/round_policy.h"
#include "apps/dtrun/signals.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/store_proxy.h"

namespace dtrun::agent {

// Several nodes (or the c10d backend): joins rendezvous rounds, hosts each
// round's workers' store when it is group rank 0, runs the local group and
// follows the round; RoundPolicy makes every decision. The node that hosts
// the rendezvous store keeps it up until every node read the end. Stores run
// on threads of their own; everything else on the caller's.
class ElasticJob : public Job {
 public:
  ElasticJob(const LaunchConfig& config, WorkerGroup* workers,
             const Clock* clock);
  ~ElasticJob() override;
  int Run() override;

 private:
  Status SetUpWorkerStore();
  // Group rank 0: starts the round's workers' store and publishes its
  // address (under `key`); that address.
  Result<std::string> HostRoundStore(const std::string& key, bool proxied);
  rendezvous::RendezvousOptions RendezvousOptionsOf(
      const std::string& run_id) const;
  // How a round ended for this node: join the next one, or exit.
  struct RoundEnd {
    bool rejoin = false;
    int exit_code = 0;  // when not rejoining
    bool kept = false;  // rejoining with the workers kept (in place)
  };
  // Servers, store and run folder; 0, or the exit code.
  int Start();
  int JoinRounds();
  void TakeRound(const rendezvous::Assignment& assignment);
  // `kept`: the workers of the last round go on into this one.
  RoundEnd FollowRound(bool kept);
  // Carries out `step`; returns how the round ended, or nothing to go on.
  std::optional<RoundEnd> Carry(const RoundStep& step, RoundPolicy* policy,
                                TimePoint* next_check);
  bool ReportFailure();
  // Stops the workers of a node cut off from the store; the round's end.
  RoundEnd Fence(const std::string& why);
  std::optional<RoundEnd> StopForNewRound(const std::string& why);
  void WaitTurn(const RoundPolicy& policy, TimePoint* next_check);
  void Linger();
  // Says when the store stops and starts answering (`status` of a
  // request): a replicated one's (etcd) outage always, a c10d store's once
  // this node is fenced.
  void NoteStore(const Status& status);
  template <typename Op>
  auto UntilStoreAnswers(Op op) -> decltype(op());
  // Whether a failed rendezvous call is the store's trouble, to be waited
  // out: a replicated store's (no quorum, no member reached), or, once
  // this node was fenced, a c10d store it cannot reach.
  bool StoreTrouble(const Status& status) const;
  void NotifyStoreReady();
  // --event-log-handler: a rendezvous event in torch's RdzvEvent schema.
  void RecordRdzv(const std::string& name, const std::string& node_state,
                  const std::string& message);

  LaunchConfig config_;
  const Clock* clock_;
  // first: blocks the signals before any store thread starts
  SignalFd signals_;
  // The group's observer (status, stacks, hangs and crashes through the
  // rendezvous store); declared before the group, so it outlives it.
  ElasticWatch node_watch_;
  LocalGroup group_;
  // The rendezvous store, whichever backend serves it.
  std::unique_ptr<RendezvousBackend> backend_;
  // group rank 0: this round's workers' store
  std::unique_ptr<rendezvous::StoreServer> worker_store_;
  // other group ranks (--store-proxy): this node's way to it
  std::unique_ptr<rendezvous::StoreProxy> worker_proxy_;
  bool said_accept_queue_ = false;             // AcceptQueueAdvice logged
  std::optional<TimePoint> store_lost_since_;  // the store's outage, if one
  std::unique_ptr<rendezvous::Rendezvous> rdzv_;
  rendezvous::Assignment assignment_;
  bool joined_ = false;  // assignment_ is a round's (status is published)
  // Cut off from the store past the silent limit: the workers were
  // stopped, and the node waits for the store to rejoin as a new one.
  bool fenced_ = false;
};

}  // namespace dtrun::agent
