#pragma once

// --metrics-port: Prometheus metrics of this node's workers, in the text
// exposition format, over HTTP (GET /metrics), and the liveness answer of
// TORCHELASTIC_HEALTH_CHECK_PORT (GET on any path: 200 while the workers
// make progress, 503 when they do not). The text is made from the status
// the agent samples every second (job_status.h), so a scrape costs the
// agent nothing: the server answers with the last text from a thread of its
// own. apps/dtrun/README.md, "Metrics", lists the metrics.

#include <cstdint>
#include <chrono>
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
  int64_t oom_kills = 0;   // workers the kernel's OOM killer killed
  std::vector<double> recovery_seconds;  // failure -> next step, each time
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

// This node's store proxy (--store-proxy): the worker connections it
// carries to the workers' store and what went up, for
// ProxyMetricsText.
struct ProxySample {
  size_t workers = 0;
  uint64_t frames = 0;  // frames sent to the store
  uint64_t writes = 0;  // writes that carried them (fewer: batched)
  bool lost = false;    // the store's connection is gone
};

// dtrun_store_proxy_*: the families of this node's proxy. Pure.
std::string ProxyMetricsText(const ProxySample& p, const std::string& run);

// Where the job is, for the health port's answers.
enum class HealthPhase { kStarting, kRunning, kStopping };

// A small HTTP/1.0 server on its own thread. GET or HEAD of /metrics
// answers the last text given to Update. With `health`: /healthz answers
// 200 while the agent is alive (while the workers run: its loop called
// SetHealthy within the pass timeout), /readyz while the workers run and
// make progress, and any other path (torch's one health path) while both
// alive and progressing; else 503 with the reason. Other methods 405, a
// malformed request 400, other paths 404. One request per connection, at
// most 64 connections, 10 s to send a request.
class MetricsServer {
 public:
  // Listens on `host`:`port` (0: a free one; "" for host: "::" taking IPv4
  // too, else 0.0.0.0); Unavailable naming the address when it cannot.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& host,
                                                      uint16_t port,
                                                      bool health);
  ~MetricsServer();
  uint16_t port() const;
  void Update(std::string text);
  // One pass of the agent's loop: the workers make progress or not.
  void SetHealthy(bool progressing);
  // The job's phase; `pass_timeout`: how long the loop may stay silent
  // while the workers run.
  void SetPhase(HealthPhase phase, std::chrono::milliseconds pass_timeout =
                                       std::chrono::milliseconds(30000));

  struct Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrun::agent
