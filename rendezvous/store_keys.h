#pragma once

// Every key dtrun keeps in a rendezvous store, spelled once (the
// interactive session's keys are interactive_protocol.h's, shared with its
// Python half). A job's keys sit under two prefixes that a store shared by
// many jobs keeps apart by run id:
//
//   rdzv/<run>/...                 the rendezvous' own (rendezvous/README.md,
//                                  "The rendezvous protocol")
//   rdzv/<run>/round/<n>/master    the round's workers' store, host:port
//   dtrun/status/<run>/node/<g>    node g's status record, every second
//   dtrun/status/<run>/nodes       the round's node count (group rank 0)
//   dtrun/status/last_run          the run `dtrun --status` shows by default
//   dtrun/rdzv_ids                 the run ids that rendezvoused here lately,
//                                  "<id>@<unix ms>" (RunIdsWith)
//   dtrun/stacks/<run>/request     `dtrun --stacks`: the request counter
//   dtrun/stacks/<run>/<r>/node/<g>  node g's answer to request r
//
// Names only: nothing here talks to a store.

#include <cstdint>
#include <string>
#include <vector>

namespace dtrun::rendezvous::keys {

inline std::string JobPrefix(const std::string& run) {
  return "rdzv/" + run + "/";
}
inline std::string RoundKey(const std::string& run, int round,
                            const std::string& suffix) {
  return JobPrefix(run) + "round/" + std::to_string(round) + "/" + suffix;
}
inline std::string WorkerStore(const std::string& run, int round) {
  return RoundKey(run, round, "master");
}

inline std::string StatusPrefix(const std::string& run) {
  return "dtrun/status/" + run + "/";
}
inline std::string NodeStatus(const std::string& run, int group_rank) {
  return StatusPrefix(run) + "node/" + std::to_string(group_rank);
}
inline std::string StatusNodes(const std::string& run) {
  return StatusPrefix(run) + "nodes";
}
inline constexpr char kLastRun[] = "dtrun/status/last_run";
inline constexpr char kRunIds[] = "dtrun/rdzv_ids";

inline std::string StacksPrefix(const std::string& run) {
  return "dtrun/stacks/" + run + "/";
}
inline std::string StackRequest(const std::string& run) {
  return StacksPrefix(run) + "request";
}
inline std::string StackAnswer(const std::string& run, int64_t request,
                               int group_rank) {
  return StacksPrefix(run) + std::to_string(request) + "/node/" +
         std::to_string(group_rank);
}

// Every prefix a job's keys live under: what a store that outlives the job
// (etcd) has removed at its end.
inline std::vector<std::string> JobPrefixes(const std::string& run) {
  return {JobPrefix(run), StatusPrefix(run), StacksPrefix(run)};
}

}  // namespace dtrun::rendezvous::keys
