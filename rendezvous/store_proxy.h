#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/util/status.h"

namespace asio {
class io_context;
}  // namespace asio

namespace dtrun::rendezvous {

struct StoreProxyOptions {
  // The workers' store: a dtrun agent's or dtstore (any that knows the
  // multiplexed hello of store_mux.h).
  std::string upstream_host;
  uint16_t upstream_port = 0;
  // Where this node's workers connect. Default 127.0.0.1, a free port.
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  // Connecting to the store and its answer to the hello. Default 30 s.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  // Replies a worker has not read, past which its connection is closed (one
  // worker that stops reading must not hold its node's other workers).
  // Default 256 MiB.
  size_t max_worker_backlog = 256u << 20;
};

// A node's store proxy. The workers of a node connect to it as to a
// TCPStore (torch 1.13, 2.x clients unchanged: it never decodes their
// requests) and it carries every one of their connections to the workers'
// store over one multiplexed TCP connection (store_mux.h), so that store
// accepts one connection per node instead of one per worker, and what
// arrives from several workers at once goes up in one write. A worker's
// connection closing closes its stream there (its waits are dropped as for
// a connection that dropped); the store's connection lost closes every
// worker connection of the node and the listener (the workers fail as they
// would had the store died under them).
//
// Start() connects and exchanges the hello before it listens, so a caller
// learns at once that a store is unreachable or too old and can point its
// workers at the store itself instead.
class StoreProxy {
 public:
  // Without `io`, the proxy owns a loop (RunInBackground runs it); with
  // `io`, it joins the caller's, which may carry many proxies on one
  // thread.
  static Result<std::unique_ptr<StoreProxy>> Start(
      const StoreProxyOptions& options, asio::io_context* io = nullptr);
  ~StoreProxy();

  // The port workers connect to.
  uint16_t port() const;
  // Runs the proxy's own loop on a thread of its own. REQUIRES: no `io`.
  void RunInBackground();
  // Closes every connection and the listener. Idempotent. With the
  // caller's loop, call it from another thread while that loop runs, or
  // after it stopped.
  void Stop();

  struct Counts {
    size_t workers = 0;            // worker connections open now
    uint64_t accepted = 0;         // worker connections since Start
    uint64_t upstream_writes = 0;  // writes to the store (frames batch)
    uint64_t frames_up = 0;        // frames sent to the store
    bool upstream_lost = false;
  };
  Counts GetCounts() const;

  class Impl;

 private:
  explicit StoreProxy(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace dtrun::rendezvous
