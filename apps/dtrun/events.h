#pragma once

// torchrun's --event-log-handler: the agent's events in torch's schema
// (torch.distributed.elastic.events.Event), one JSON object a line, to
// nowhere ("null"), stderr ("console") or a file ("file:PATH").

#include <string>

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

// Appends `line` + '\n' for `handler` ("null", "console", "file:PATH");
// errors are logged, never fatal.
void WriteEvent(const std::string& handler, const std::string& line);

}  // namespace dtrun::agent
