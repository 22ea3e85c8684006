#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "rendezvous/util/status.h"
#include "rendezvous/wire.h"

namespace dtrun::rendezvous {

class StoreState;

struct StoreServerOptions {
  // Address to bind. Default "::" (IPv6 dual-stack), falling back to 0.0.0.0
  // where IPv6 is unavailable, as c10d's server does.
  std::string host = "::";
  uint16_t port = 0;    // 0 = let the kernel pick one; default 0
  WireLimits limits;    // caps on lengths read from the wire
  int backlog = 16384;  // listen backlog (the kernel caps it at somaxconn)
  // A connection whose unsent replies exceed this is not read from until
  // they drain. Default 256 MiB.
  size_t max_pending_reply_bytes = 256u << 20;
};

// TCP server for the c10d TCPStore protocol (both dialects, chosen per
// connection). One asio event loop on one thread serves every connection:
// no thread per client, partial frames buffered, many requests per read,
// replies written asynchronously. A malformed frame closes only the
// connection that sent it, with one warning naming the peer and the reason.
//
// Start() binds and listens; the loop then runs in a background thread
// (RunInBackground) or in the caller's (Run). All public methods except Run
// are thread-safe.
class StoreServer {
 public:
  static Result<std::unique_ptr<StoreServer>> Start(
      const StoreServerOptions& options);
  ~StoreServer();

  // The bound address and port (the real port when options.port was 0).
  const std::string& host() const;
  uint16_t port() const;

  // Runs the event loop in the calling thread until Stop().
  void Run();
  // Runs the event loop in a thread owned by the server.
  void RunInBackground();
  // Closes every connection and ends the loop; joins the background thread.
  // Idempotent.
  void Stop();

  // Runs `fn` on the loop thread with the store's state and waits for it
  // (e.g. StoreState::Clear between attempts). REQUIRES: the loop runs.
  void WithState(const std::function<void(StoreState&)>& fn);

  // Connections now open (for tests and diagnostics).
  size_t NumConnections();

  // What the server holds and has served, for metrics.
  struct Counts {
    size_t connections = 0;  // open now
    size_t keys = 0;         // stored now
    uint64_t requests = 0;   // answered since Start
  };
  Counts GetCounts();

  class Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Why `connections` (workers, or nodes' proxies) arriving at once would
// wait on a listen queue the
// kernel caps at `somaxconn` (a burst beyond it has its SYNs dropped and
// retried after 1 s, then 3 s: tests/bench/README.md, "The workers'
// store"), with what to do; "" when they fit. Pure.
std::string AcceptQueueAdvice(int64_t connections, int64_t somaxconn);
// net.core.somaxconn of this host (its network namespace); -1 if unknown.
int64_t SystemSomaxconn();

}  // namespace dtrun::rendezvous
