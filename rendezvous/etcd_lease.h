#pragma once

// A node's liveness on etcd, which keeps no state per connection: the node
// puts a key under a lease of a short TTL that a thread of its own renews.
// When the node dies, is stopped (SIGSTOP) or cut off from etcd, renewals
// stop and etcd deletes its keys one TTL later, pushing the deletion to
// every watcher at once (rendezvous/README.md, "Rendezvous on etcd").
// Renewals also stop once the holder has not called Touch() for a TTL, so
// a wedged agent loop is a silent node as well. Renewing costs etcd no
// consensus round (the leader keeps leases), unlike a heartbeat's put.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "rendezvous/etcd_client.h"
#include "rendezvous/util/status.h"

namespace dtrun::rendezvous {

class EtcdLease {
 public:
  // Grants a lease of `ttl` (whole seconds, rounded up; etcd raises it to
  // its own minimum, 2 s with default timings) on a client of its own to
  // the members of `options`, and renews it every third of the TTL etcd
  // granted.
  static Result<std::unique_ptr<EtcdLease>> Grant(
      const EtcdOptions& options, std::chrono::milliseconds ttl);
  // Stops renewing and revokes the lease: keys still under it go now.
  ~EtcdLease();

  int64_t id() const { return id_; }
  // The TTL etcd granted.
  std::chrono::milliseconds ttl() const { return ttl_; }
  // The TTL asked for.
  std::chrono::milliseconds asked() const { return asked_; }
  // The holder is alive: renewals go on for one TTL from now.
  void Touch();
  // False once the lease may have expired: a renewal found it gone, or
  // none succeeded for a TTL (the holder silent, or no member answered);
  // its keys are then gone, or about to be.
  bool alive() const;

 private:
  using SteadyClock = std::chrono::steady_clock;
  EtcdLease(std::unique_ptr<EtcdClient> client, int64_t id,
            std::chrono::milliseconds ttl, std::chrono::milliseconds asked);
  void Run();
  // One renewal: held, gone (etcd says so), or unknown (no answer).
  enum class Held { kYes, kGone, kUnknown };
  Held Renew();

  std::unique_ptr<EtcdClient> client_;
  const int64_t id_;
  const std::chrono::milliseconds ttl_, asked_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  SteadyClock::time_point touched_;
  SteadyClock::time_point renewed_;  // when the last renewal that held was sent
  bool stop_ = false;
  bool lost_ = false;
  std::thread thread_;  // last: started once the rest is set
};

}  // namespace dtrun::rendezvous
