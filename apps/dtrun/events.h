#pragma once

// torchrun's --event-log-handler: the agent's events in torch's schema
// (torch.distributed.elastic.events.Event), one JSON object a line, to
// nowhere ("null"), stderr ("console") or a file ("file:PATH").

#include <string>

#include "apps/dtrun/recovery.h"

namespace dtrun::agent {

// One torchelastic event: "torchelastic.worker.status.<state>" from the
// AGENT (the job as a whole) or a WORKER.
struct ElasticEvent {
  std::string state;   // SUCCEEDED, FAILED, ...
  bool agent = false;  // source AGENT, else WORKER
  std::string run_id, role, hostname, rdzv_backend, entry_point;
  int global_rank = -1;  // -1: none (the agent's own event)
  int group_rank = 0, group_world_size = 1, agent_restarts = 0;
  int worker_id = -1;         // the worker's pid; -1: none
  double total_run_time = 0;  // seconds
  std::string raw_error;      // the root cause's error, if any
  double timestamp = 0;       // unix seconds
};

// The event as torch's Event.serialize() writes it. Pure.
std::string EventJson(const ElasticEvent& e);

// A rendezvous event in torch's RdzvEvent schema (name, run_id, message,
// hostname, pid, node_state, master_endpoint, rank, local_id, error_trace):
// joining a round, the round complete, a failure reported, the job's end.
struct RdzvRecord {
  std::string name;  // "next_rendezvous", "report_failure", ...
  std::string run_id, message, hostname;
  int pid = 0;
  std::string node_state;  // INIT, RUNNING, SUCCEEDED, FAILED
  std::string master_endpoint;
  int rank = -1;  // the node's group rank; -1: none yet
  std::string error_trace;
};
std::string RdzvEventJson(const RdzvRecord& r);

// dtrun's own record of one attempt of the worker group, written when it
// ends: where, how many nodes and ranks, when, and why it ended.
struct AttemptRecord {
  std::string run_id, hostname;
  int attempt = 0;  // the restart count (elastic: the round)
  int group_rank = 0, nodes = 1, ranks = 1;
  double start = 0, end = 0;  // unix seconds
  // "succeeded", "failed: rank 3 exit code 1", "hung: ...", "stopped by
  // SIGTERM", "new round", "no progress: ..."
  std::string cause;
};
std::string AttemptJson(const AttemptRecord& a);

// Appends `line` + '\n' for `handler` ("null", "console", "file:PATH");
// errors are logged, never fatal.
void WriteEvent(const std::string& handler, const std::string& line);

// A recovery's event: name "dtrun.recovery", source AGENT, its breakdown
// in seconds in the metadata.
std::string RecoveryEventJson(const RecoveryBreakdown& b,
                              const std::string& run_id, int group_rank,
                              int attempt, double timestamp);

}  // namespace dtrun::agent
