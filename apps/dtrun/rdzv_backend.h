#pragma once

// Where the rendezvous store lives, behind one interface, chosen once at
// start (ConnectBackend): a c10d store (TCPStore's wire) that this node
// hosts or another does, or an etcd cluster. ElasticJob talks to the store,
// opens its watches, judges its trouble and cleans up after the job through
// this; it has no branch per backend. A new backend is one more subclass.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "apps/dtrun/clock.h"
#include "apps/dtrun/launch_config.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"
#include "rendezvous/util/status.h"

namespace dtrun::agent {

// Where a store is, as `dtrun --status` and `--stacks` reach it again:
// "host:port" for a TCP store, "http://m1:2379,m2:2379" (or https) for an
// etcd cluster, with the settings that secure it (etcd's cacert, cert, key,
// user and password_file, as --rdzv-conf names them; files, never secrets).
struct StoreLocation {
  std::string address;
  std::map<std::string, std::string> settings;
};

// A client of the store at `where`, each operation bounded by `timeout`.
// An address of neither form is Invalid, naming it.
Result<std::unique_ptr<rendezvous::Store>> OpenStoreAt(
    const StoreLocation& where, std::chrono::milliseconds timeout);

class RendezvousBackend {
 public:
  // Why a store operation failed, where the store can say.
  enum class Trouble {
    kNone,         // it answered (or failed for a reason of the request's)
    kUnreachable,  // nothing answers this node
    kNoQuorum,     // a replicated store answers but cannot commit
    kRefused,      // it refuses this node (TLS, authentication)
  };

  virtual ~RendezvousBackend() = default;

  // The store every rendezvous call goes to.
  virtual rendezvous::Store* store() = 0;
  // Where it is, for messages ("host:port", "https://a,b").
  const std::string& address() const { return address_; }
  // How `dtrun --status` on this host reaches the store (the registry
  // keeps it).
  virtual StoreLocation location() const { return {address_, {}}; }
  // This host's address on the link to the store: the workers of the rounds
  // it hosts are told it.
  virtual std::string LocalAddress() = 0;
  // A push channel for Rendezvous::Check.
  virtual Result<std::unique_ptr<rendezvous::KeyWatch>> OpenWatch() = 0;
  // What a failed call (`status`) says of the store now.
  virtual Trouble TroubleOf(const Status& status) const = 0;
  // A replicated service that runs before and after the job (etcd): its
  // outages are waited out by everyone, and its lost quorum is no node's
  // fault. A c10d store lives and dies with a node.
  virtual bool replicated() const = 0;
  // A retry after a failure can follow at once: the call waited out its
  // own deadline (etcd). A c10d connect to a host that is gone fails fast.
  virtual bool waits_out_failures() const = 0;
  // "etcd refuses this node", "the rendezvous store", ... for the log.
  virtual std::string Describe(Trouble trouble) const = 0;
  // The store this node serves (c10d host), for --metrics-port; or none.
  virtual rendezvous::StoreServer* hosted() { return nullptr; }
  // The job's keys outlive it in this store, so group rank 0 removes them
  // at the end (RemoveJobKeys).
  virtual bool keys_outlive_job() const { return false; }
  virtual void RemoveJobKeys(const std::string& /*run_id*/) {}

 protected:
  std::string address_;
};

// Connects to the store --rdzv-backend and --rdzv-endpoint name (hosting
// it when this node is the c10d endpoint's host or static node 0), within
// the join timeout. `stopped` says why to give up early ("stopped by
// SIGTERM"), "" to go on: a stop signal ends the wait with kCanceled.
// kInvalid: a usage error (exit 2); kUnavailable: the store is not there.
Result<std::unique_ptr<RendezvousBackend>> ConnectBackend(
    const LaunchConfig& config, const Clock* clock,
    const std::function<std::string()>& stopped);

}  // namespace dtrun::agent
