#pragma once

// The interactive session's protocol, the launcher's half: the store keys
// dtrun itself writes for the console and the notebook, and the line a
// headless session prints. The Python half (every other key: cells,
// results, statuses, streams) is apps/dtrun/python/dtrun/protocol.py, which
// spells these same keys; tests/apps/interactive_protocol_test.py runs
// `interactive_protocol_dump` (this header's values as JSON) and checks
// that both sides agree. apps/dtrun/python/README.md describes the protocol.

#include <cstdint>
#include <string>

namespace dtrun::interactive_protocol {

// Every session key starts with this, in the workers' store.
inline constexpr char kPrefix[] = "dtrun/i/";

// The crash record (JSON: attempt, rank, how, host, addr, stderr_file,
// stderr_tail) and the crash counter, under a crash prefix.
inline constexpr char kCrash[] = "crash";
inline constexpr char kCrashCount[] = "crash_count";

// One node: dtrun publishes crashes in the workers' store, under this.
inline constexpr char kLocalCrashPrefix[] = "dtrun/";

// Several nodes: the run's keys in the rendezvous store, which outlives
// every round's workers' store.
inline std::string RunPrefix(const std::string& run_id) {
  return kPrefix + run_id + "/";
}
// Where the console finds the current round's workers' store:
// "<round> <world size> <host>:<port>".
inline std::string CurrentRoundKey(const std::string& run_id) {
  return RunPrefix(run_id) + "current";
}
inline std::string CurrentRoundValue(int round, int world_size,
                                     const std::string& store_address) {
  return std::to_string(round) + " " + std::to_string(world_size) + " " +
         store_address;
}
// Crashes of any node's workers, in the rendezvous store.
inline std::string NodesCrashPrefix(const std::string& run_id) {
  return RunPrefix(run_id);
}

// A headless session's (--no-console) first line on stdout, read by the
// notebook's %dist_init:
//   dtrun-interactive: host H port P world W dir D [key CURRENT_ROUND_KEY]
inline constexpr char kSessionLineTag[] = "dtrun-interactive:";
inline std::string SessionLine(const std::string& host, uint16_t port,
                               int world, const std::string& dir,
                               const std::string& round_key) {
  std::string line = std::string(kSessionLineTag) + " host " + host + " port " +
                     std::to_string(port) + " world " + std::to_string(world) +
                     " dir " + dir;
  if (!round_key.empty()) line += " key " + round_key;
  return line;
}

}  // namespace dtrun::interactive_protocol
