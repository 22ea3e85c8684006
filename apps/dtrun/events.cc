// torchelastic's events in torch's JSON schema, for --event-log-handler.
#include "apps/dtrun/events.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "apps/dtrun/log_mux.h"
#include "rendezvous/util/log.h"

namespace dtrun::agent {

std::string EventJson(const ElasticEvent& e) {
  // torch's metadata keeps its own "metadata" as a JSON string, and leaves
  // fields it has no value for as null.
  nlohmann::json inner = {{"group_world_size", e.group_world_size},
                          {"entry_point", e.entry_point}};
  auto or_null = [](int v) {
    return v < 0 ? nlohmann::json() : nlohmann::json(v);
  };
  nlohmann::json md = {
      {"run_id", e.run_id},
      {"global_rank", or_null(e.global_rank)},
      {"group_rank", e.group_rank},
      {"worker_id", e.worker_id < 0
                        ? nlohmann::json()
                        : nlohmann::json(std::to_string(e.worker_id))},
      {"role", e.role},
      {"hostname", e.hostname},
      {"state", e.state},
      {"total_run_time", static_cast<int64_t>(e.total_run_time)},
      {"rdzv_backend", e.rdzv_backend},
      {"raw_error",
       e.raw_error.empty() ? nlohmann::json() : nlohmann::json(e.raw_error)},
      {"metadata", inner.dump()},
      {"agent_restarts", e.agent_restarts}};
  nlohmann::json j = {{"name", "torchelastic.worker.status." + e.state},
                      {"source", e.agent ? "AGENT" : "WORKER"},
                      {"timestamp", static_cast<int64_t>(e.timestamp)},
                      {"metadata", md}};
  return j.dump();
}

std::string RdzvEventJson(const RdzvRecord& r) {
  auto or_null = [](int v) {
    return v < 0 ? nlohmann::json() : nlohmann::json(v);
  };
  return nlohmann::json{{"name", r.name},
                        {"run_id", r.run_id},
                        {"message", r.message},
                        {"hostname", r.hostname},
                        {"pid", r.pid},
                        {"node_state", r.node_state},
                        {"master_endpoint", r.master_endpoint},
                        {"rank", or_null(r.rank)},
                        {"local_id", nlohmann::json()},
                        {"error_trace", r.error_trace}}
      .dump();
}

// Shaped as torch's events (name, source, timestamp, metadata) so one
// reader takes both; the name says it is dtrun's.
std::string AttemptJson(const AttemptRecord& a) {
  nlohmann::json md = {{"run_id", a.run_id},   {"hostname", a.hostname},
                       {"attempt", a.attempt}, {"group_rank", a.group_rank},
                       {"nodes", a.nodes},     {"ranks", a.ranks},
                       {"start", a.start},     {"end", a.end},
                       {"cause", a.cause}};
  return nlohmann::json{{"name", "dtrun.attempt"},
                        {"source", "AGENT"},
                        {"timestamp", static_cast<int64_t>(a.end)},
                        {"metadata", md}}
      .dump();
}

// A file handler opens, appends and closes per event: events are rare
// (a few per attempt), and O_APPEND keeps several dtruns' lines whole.
void WriteEvent(const std::string& handler, const std::string& line) {
  if (handler == "console") {
    WriteAll(2, line + "\n");
    return;
  }
  if (handler.rfind("file:", 0) != 0) return;  // "null"
  std::string path = handler.substr(5);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    Logger("dtrun.agent")
        ->warn("--event-log-handler: cannot open {}; event dropped", path);
    return;
  }
  WriteAll(fd, line + "\n");
  close(fd);
}

}  // namespace dtrun::agent

namespace dtrun::agent {

std::string RecoveryEventJson(const RecoveryBreakdown& b,
                              const std::string& run_id, int group_rank,
                              int attempt, double timestamp) {
  nlohmann::json md = {{"run_id", run_id},   {"group_rank", group_rank},
                       {"attempt", attempt}, {"total", b.total},
                       {"detect", b.detect}, {"regroup", b.regroup},
                       {"start", b.start},   {"init", b.init},
                       {"load", b.load},     {"first_step", b.first_step},
                       {"step", b.step},     {"source", b.source}};
  // What the failure cost the run against the undisturbed one; null when
  // the job never got back to where it stood.
  md["lost"] = b.lost >= 0 ? nlohmann::json(b.lost) : nlohmann::json();
  nlohmann::json j = {{"name", "dtrun.recovery"},
                      {"source", "AGENT"},
                      {"timestamp", static_cast<int64_t>(timestamp)},
                      {"metadata", md}};
  return j.dump();
}

}  // namespace dtrun::agent
