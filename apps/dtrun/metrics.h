#pragma once

// --metrics-port: Prometheus metrics of this node's workers, in the text
// exposition format, over HTTP (GET /metrics), and the liveness answer of
// TORCHELASTIC_HEALTH_CHECK_PORT (GET on any path: 200 while the workers
// make progress, 503 when they do not). The text is made from the status
// the agent samples every second (job_status.h), so a scrape costs the
// agent nothing: the server answers with the last text from a thread of its
// own. apps/dtrun/README.md, "Metrics", lists the metrics.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/dtrun/progress.h"
#include "rendezvous/util/status.h"

namespace dtrun::rendezvous {
class StoreServer;
}

namespace dtrun::agent {

// What the status record does not carry: counts over the whole job.
struct JobCounts {
  int64_t restarts = 0;    // attempts after the first
  int64_t hangs = 0;       // attempts stopped as hung
  int64_t stragglers = 0;  // stragglers named
};

// The text of one scrape from a node's status record (NodeStatusJson with
// scores). Pure.
std::string MetricsText(const nlohmann::json& node, const JobCounts& counts);

// Families of the job as a whole (dtrun_job_*: nodes, running ranks, the
// job's step, planned steps, step time, time left, slowest rank), served by
// the node that sees every node's status (group rank 0). Pure.
std::string JobMetricsText(const JobProgress& p, const std::string& run);

// One store this node hosts, for StoreMetricsText.
struct StoreSample {
  std::string role;  // "rendezvous" or "workers"
  size_t connections = 0;
  size_t keys = 0;
  uint64_t requests = 0;
};

// What `server` holds and has served now; blocks for a turn of its loop.
StoreSample SampleStore(const std::string& role,
                        rendezvous::StoreServer* server);

// The families of the stores this node hosts (dtrun_store_*, labelled by
// role) and of its rendezvous round (dtrun_rendezvous_round, -1: none, as
// on one node). Pure.
std::string StoreMetricsText(const std::vector<StoreSample>& stores,
                             int64_t round, const std::string& run);

// A small HTTP/1.0 server on its own thread: GET /metrics answers the last
// text given to Update; with `health`, GET on any path answers 200 "ok"
// while SetHealthy(true), else 503. Every other request gets 404. One
// request per connection.
class MetricsServer {
 public:
  // Listens on `host`:`port` (0: a free one); Unavailable naming the
  // address when it cannot.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& host,
                                                      uint16_t port,
                                                      bool health);
  ~MetricsServer();
  uint16_t port() const;
  void Update(std::string text);
  void SetHealthy(bool healthy);

  struct Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrun::agent
