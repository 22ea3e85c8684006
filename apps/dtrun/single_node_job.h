#pragma once

#include <memory>
#include <optional>

#include "apps/dtrun/job.h"
#include "apps/dtrun/signals.h"

namespace dtrun::rendezvous {
class StoreServer;
}

namespace dtrun::agent {

// One node, no rendezvous: hosts the workers' store, runs the local group
// and restarts it up to --max-restarts (the Agent counts). The store's
// event loop runs on a thread of its own; everything else on the caller's.
class SingleNodeJob : public Job, private GroupObserver {
 public:
  SingleNodeJob(const LaunchConfig& config, WorkerGroup* workers,
                const Clock* clock);
  ~SingleNodeJob() override;
  int Run() override;

 private:
  Status StartStore();
  void PublishLastCrash();
  // The group's observer: a fresh key space per attempt, crashes for the
  // console, the store's metrics.
  void OnAttemptStarting(int restart_count) override;
  bool wants_crashes() const override { return config_.interactive; }
  void OnWorkerCrash(const WorkerCrash& crash) override;
  // In-place recovery's word to the survivors (rendezvous/in_place.h).
  bool OnReplacing(int restart_count, int rank) override;
  std::string StoreMetrics() override;
  // A client connection of dtrun's own to the workers' store, opened on
  // first use; null when it cannot be.
  rendezvous::TcpStoreClient* Link();

  LaunchConfig config_;
  // first: blocks the signals before the store's thread starts
  SignalFd signals_;
  LocalGroup group_;
  std::unique_ptr<rendezvous::StoreServer> store_;
  // publishes crashes (interactive) and in-place recovery's word
  std::unique_ptr<rendezvous::TcpStoreClient> console_link_;
  std::optional<WorkerCrash> last_crash_;
  int64_t crashes_ = 0;
};

}  // namespace dtrun::agent
