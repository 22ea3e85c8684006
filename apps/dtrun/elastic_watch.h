#pragma once

// The job's watcher on a node of a multi-node job: the local group's
// observer (group_observer.h) that carries what the group sees to the
// rendezvous store and back. Each second this node's status goes to the
// store (so `dtrun --status` on any host sees every node), group rank 0
// reads every node's back as one job, `dtrun --stacks` requests made
// through the store are found and answered, a hang declared here is
// weighed with the other nodes' ranks, and crashes reach an interactive
// console. It decides nothing about workers or rounds: ElasticJob tells it
// the round, the stores and whether the store answers. Not thread-safe:
// the job's thread calls it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/dtrun/clock.h"
#include "apps/dtrun/group_observer.h"
#include "apps/dtrun/launch_config.h"
#include "rendezvous/round_state.h"
#include "rendezvous/store.h"
#include "rendezvous/store_client.h"

namespace dtrun::rendezvous {
class StoreServer;
class StoreProxy;
}  // namespace dtrun::rendezvous

namespace dtrun::agent {

class ElasticWatch : public GroupObserver {
 public:
  // `config` and `clock` must outlive it.
  ElasticWatch(const LaunchConfig& config, const Clock* clock);

  // The rendezvous store, once the backend is up (null before).
  void set_store(rendezvous::Store* store) { store_ = store; }
  // The stores this node hosts or reaches, for --metrics-port (each may be
  // null): the rendezvous store, the round's workers' store, the proxy.
  void set_stores(rendezvous::StoreServer* rendezvous,
                  rendezvous::StoreServer* workers,
                  rendezvous::StoreProxy* proxy);
  // This node holds `assignment` (status is published from now on).
  void TakeRound(const rendezvous::Assignment& assignment);
  // The round's workers' store, as this node's workers reach it (its own
  // proxy on a node that has one): in-place recovery's claims go there.
  void set_worker_store(const std::string& host, uint16_t port);
  // Whether the last check of the round reached the store. While it does
  // not, nothing is published (each try would hold the loop for an
  // operation's deadline).
  void set_store_answers(bool answers) { store_answers_ = answers; }

  // A hang declared here (HangWatch::ShareFn): this node's ranks to the
  // others, and theirs back, within a few seconds.
  std::vector<std::string> ShareHang(const std::string& mine);

  // GroupObserver.
  bool wants_crashes() const override { return config_.interactive; }
  void OnWorkerCrash(const WorkerCrash& crash) override;
  // This node's status record under its group rank; rank 0 also names the
  // node count and the run.
  void OnStatus(const std::string& json) override;
  // Group rank 0: every node's record, scored as one job; none elsewhere,
  // or before every node of the round published one.
  std::vector<nlohmann::json> JobView() override;
  std::string StoreMetrics() override;
  // In-place recovery through the round's workers' store (claimed there,
  // one replacement at a time across the nodes).
  int ClaimReplacement(int current) override;
  bool OnReplacing(int restart_count, int rank) override;
  void OnReplaced(int restart_count) override;
  bool StacksWanted() override;
  void AnswerStacks(const std::string& json) override;

 private:
  bool publishing() const { return store_ && joined_ && store_answers_; }
  // Answers with `json` the store's stack requests not answered yet.
  Status AnswerStackRequests(const std::string& json);

  const LaunchConfig& config_;
  const Clock* clock_;
  rendezvous::Store* store_ = nullptr;
  rendezvous::StoreServer* rendezvous_server_ = nullptr;
  rendezvous::StoreServer* worker_server_ = nullptr;
  rendezvous::StoreProxy* proxy_ = nullptr;
  rendezvous::Assignment assignment_;
  std::string worker_host_;
  uint16_t worker_port_ = 0;
  // A connection of its own to the workers' store, opened at the first
  // claim of the round.
  std::unique_ptr<rendezvous::TcpStoreClient> worker_link_;
  rendezvous::TcpStoreClient* WorkerLink();
  bool joined_ = false;
  bool store_answers_ = true;
  int64_t stacks_served_ = -1;  // the last `dtrun --stacks` request answered
  int64_t stacks_asked_ = -1;   // the newest one seen, while unanswered
  int64_t crashes_ = 0;
};

}  // namespace dtrun::agent
