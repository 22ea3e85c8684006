#pragma once

// In-place recovery (dtrun --restart=in-place): what dtrun and a worker
// that can re-form its process group say to each other. Header-only, so
// that dtrun (which never links libtorch) and lib's trainer share it.
//
//   1. dtrun sets kRestartEnv=in-place in every worker's environment.
//   2. A worker able to re-form its group writes the file
//      <DTRUN_HEARTBEAT_FILE>.in_place once it is set up (MarkReady).
//      dtrun replaces a failed rank in place only when every worker of
//      the group wrote it; otherwise it restarts the whole group.
//   3. When a rank fails, dtrun sets RegroupKey(n) (n: the new restart
//      count) in the store to the failed rank, then starts its
//      replacement with TORCHELASTIC_RESTART_COUNT=n. The survivors, whose
//      collectives failed, wait for that key (at most kRegroupWait), then
//      build their process group again in attempt n's key space, where
//      the replacement builds its own; the replacement, finding the key,
//      takes its state from a survivor instead of a checkpoint.
//      On many nodes the failed worker's node claims n first (kClaimKey).
//   4. Many nodes, a new round (a node lost or joining) while this node's
//      workers run: a worker that can carry its state into another group
//      (another rank and world size) says so in its ready file (kRounds).
//      When all did, dtrun keeps them: it writes <beat file>.round, the
//      variables of their place in the new round (RoundVariables(), one
//      KEY=VALUE a line), and each builds its group there with the state
//      it holds, which the round's new workers take from it. Otherwise
//      dtrun stops them as for any new round.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

namespace dtrun::rendezvous::in_place {

inline constexpr const char* kRestartEnv = "DTRUN_RESTART";
inline constexpr const char* kInPlace = "in-place";
inline constexpr const char* kReadySuffix = ".in_place";
inline constexpr const char* kRoundSuffix = ".round";
inline constexpr const char* kRounds = "rounds";
// The variables a new round changes, which a kept worker takes from its
// round file.
inline const char* const* RoundVariables() {
  static const char* const names[] = {
      "RANK",        "WORLD_SIZE",       "GROUP_RANK",
      "ROLE_RANK",   "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT",      "TORCHELASTIC_RESTART_COUNT",
      nullptr};
  return names;
}
// How long a survivor waits for dtrun's word before it gives up and fails
// as it would without in-place recovery.
inline constexpr std::chrono::seconds kRegroupWait{60};
// How long after dtrun's word a survivor may go on before it starts to
// re-form: one that has not is stuck in a collective with another
// survivor (gloo cannot abort one), and exits, so that dtrun restarts
// the whole group instead of waiting on it. kStuckEnv (seconds) sets
// another.
inline constexpr std::chrono::seconds kStuckLimit{30};
inline constexpr const char* kStuckEnv = "DTRUN_IN_PLACE_STUCK_S";
inline std::chrono::seconds StuckLimit() {
  const char* v = std::getenv(kStuckEnv);
  const int s = v ? std::atoi(v) : 0;
  return s > 0 ? std::chrono::seconds(s) : kStuckLimit;
}

// On many nodes, the workers' store holds which attempt the newest
// replacement runs as, and whether it is under way ("busy N") or beat its
// first step ("idle N"): a node claims the next attempt with a
// compare-and-set, so that two nodes never replace a worker each at once.
inline constexpr const char* kClaimKey = "/worker/dtrun_in_place_claim";

// The store key that announces attempt `restart_count`'s in-place group.
inline std::string RegroupKey(int restart_count) {
  return "/worker/attempt_" + std::to_string(restart_count) + "/dtrun_regroup";
}

// The shared-memory segments in which survivors stage their state for a
// replacement are named after the store's port (then "<attempt>-<rank>");
// dtrun removes any left once its group restarts or the job ends (a
// survivor stopped mid-recovery leaves its own).
inline std::string StagePrefix(int master_port) {
  return "dtrun-inplace-" + std::to_string(master_port) + "-";
}

// Whether dtrun asked for in-place recovery.
inline bool Wanted() {
  const char* v = std::getenv(kRestartEnv);
  return v && std::string(v) == kInPlace;
}

// dtrun's beat file with `suffix`; "" without one.
inline std::string BeatFileWith(const char* suffix) {
  const char* beat = std::getenv("DTRUN_HEARTBEAT_FILE");
  return beat && *beat ? std::string(beat) + suffix : std::string();
}

// Step 2 above (`across_rounds`: step 4's word too): a no-op without
// dtrun's beat file.
inline void MarkReady(bool across_rounds = false) {
  const std::string path = BeatFileWith(kReadySuffix);
  if (path.empty()) return;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (across_rounds) {
    const std::string word = std::string(kRounds) + "\n";
    (void)!::write(fd, word.data(), word.size());
  }
  ::close(fd);
}

}  // namespace dtrun::rendezvous::in_place
