#pragma once

#include <chrono>
#include <future>
#include <string>

#include "rendezvous/rendezvous.h"

namespace dtrun::testing {

// A node's options for the rendezvous tests: job "job", 2 workers, 1
// restart, and times short enough for tests (a 100 ms last call, beats
// every 20 ms, dead after 3 missed).
inline rendezvous::RendezvousOptions NodeOptions(const std::string& id,
                                                 int min_nodes, int max_nodes) {
  using std::chrono::milliseconds;
  rendezvous::RendezvousOptions o;
  o.run_id = "job";
  o.node_id = id;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.nproc_per_node = 2;
  o.max_restarts = 1;
  o.join_timeout = milliseconds(2000);
  o.last_call_timeout = milliseconds(100);
  o.keep_alive_interval = milliseconds(20);
  o.keep_alive_max_attempt = 3;
  o.poll_interval = milliseconds(5);
  return o;
}

// Joins on a thread of its own, as another node would.
inline std::future<Result<rendezvous::Assignment>> JoinAsync(
    rendezvous::Rendezvous* r) {
  return std::async(std::launch::async, [r] { return r->Join(nullptr); });
}

}  // namespace dtrun::testing
