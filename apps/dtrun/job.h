#pragma once

// A job is what one dtrun process runs to the end: SingleNodeJob (its own
// store, restarts counted here) or ElasticJob (rendezvous rounds across
// nodes). main() picks one; the interactive session runs one in a child.

#include <cstdint>
#include <functional>
#include <string>

#include "apps/dtrun/local_group.h"

namespace dtrun::rendezvous {
class TcpStoreClient;
}

namespace dtrun::agent {

// Owned by main's RunJob and run on its thread. Not thread-safe.
class Job {
 public:
  virtual ~Job() = default;
  // Runs the job to the end; returns dtrun's exit code (exit_code.h).
  // Blocks for the whole job, through every restart or round. Call once.
  virtual int Run() = 0;

  // Called once the store the session's console attaches to is reachable
  // (single node: the workers' store; several nodes: the rendezvous store)
  // and the run folder exists, before any worker starts.
  using StoreReady = std::function<void(const std::string& host, uint16_t port,
                                        const std::string& run_dir)>;
  StoreReady on_store_ready;
};

// Where an interactive console finds the latest worker crash: JSON
// {"attempt", "rank", "how", "host", "addr", "stderr_file", "stderr_tail"}
// under `prefix`+"crash", and the number of crashes so far under
// `prefix`+"crash_count", so a console can stop a crash loop without knowing
// the log layout.
Status PublishCrash(rendezvous::Store* store, const std::string& prefix,
                    const WorkerCrash& crash, int64_t count);

}  // namespace dtrun::agent
