// dtrun's half of in-place recovery: files in the run folder and one
// variable; the decisions are the Agent's.
#include "apps/dtrun/in_place.h"

#include <dirent.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

#include "apps/dtrun/run_layout.h"
#include "rendezvous/in_place.h"
#include "rendezvous/util/log.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent::in_place {
namespace {

std::string ReadyFile(const std::string& attempt_dir, int local_rank) {
  return layout::BeatFile(attempt_dir, local_rank) +
         rendezvous::in_place::kReadySuffix;
}

std::string RoundFile(const std::string& attempt_dir, int local_rank) {
  return layout::BeatFile(attempt_dir, local_rank) +
         rendezvous::in_place::kRoundSuffix;
}

}  // namespace

void AddEnv(const LaunchConfig& config, EnvMap* env) {
  if (config.restart == RestartMode::kInPlace)
    (*env)[rendezvous::in_place::kRestartEnv] = rendezvous::in_place::kInPlace;
}

// A ready file is written once a worker is set up, so a worker that dies
// during its start (before its group could re-form) restarts the group.
bool CanReplace(const LaunchConfig& config, const std::string& attempt_dir,
                const std::map<int, int>& pids,
                const std::map<int, double>& exit_time, int failed_pid) {
  if (config.restart != RestartMode::kInPlace) return false;
  std::string why;
  for (const auto& [lr, pid] : pids) {
    if (::access(ReadyFile(attempt_dir, lr).c_str(), F_OK) != 0) {
      why = "local_rank " + std::to_string(lr) +
            " never said it can re-form its group (lib's trainer says so "
            "for DDP on gloo and for FSDP on gloo with checkpoint.dir, a "
            "Python worker through dtrun.in_place)";
      break;
    }
    if (pid != failed_pid && exit_time.count(pid)) {
      why = "local_rank " + std::to_string(lr) + " is gone too";
      break;
    }
  }
  if (why.empty()) return true;
  // Said at each failure: the user asked for in place and gets the whole
  // group restarted, which costs the survivors their processes.
  Logger("dtrun.agent")
      ->warn("--restart=in-place: {}; the whole group restarts", why);
  return false;
}

bool CanKeepForRound(const LaunchConfig& config, const std::string& attempt_dir,
                     const std::map<int, int>& pids,
                     const std::map<int, double>& exit_time) {
  if (config.restart != RestartMode::kInPlace || pids.empty()) return false;
  for (const auto& [lr, pid] : pids) {
    const std::string word = os::ReadFileOrEmpty(ReadyFile(attempt_dir, lr));
    if (exit_time.count(pid) ||
        word.compare(0, std::strlen(rendezvous::in_place::kRounds),
                     rendezvous::in_place::kRounds) != 0)
      return false;
  }
  return true;
}

// Written whole, then renamed: the worker never reads half of it.
Status WriteRound(const std::string& attempt_dir, int local_rank,
                  const EnvMap& env) {
  std::string text;
  for (const char* const* name = rendezvous::in_place::RoundVariables(); *name;
       ++name) {
    auto it = env.find(*name);
    if (it != env.end()) text += it->first + "=" + it->second + "\n";
  }
  const std::string path = RoundFile(attempt_dir, local_rank);
  const std::string tmp = path + ".tmp";
  Status s = os::WriteFile(tmp, text);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    s = Status::Io("renaming " + tmp + ": " + std::strerror(errno));
  return s;
}

std::chrono::milliseconds KeptStuckLimit(double slowest_step_s) {
  const auto base = std::chrono::milliseconds(kKeptStuck);
  if (!(slowest_step_s > 0)) return base;
  return base + std::chrono::milliseconds(static_cast<int64_t>(
                    2 * 1000 * std::min(slowest_step_s, 3600.0)));
}

bool RoundUnread(const std::string& attempt_dir, int local_rank) {
  return ::access(RoundFile(attempt_dir, local_rank).c_str(), F_OK) == 0;
}

bool AllResumed(const std::string& attempt_dir,
                const std::map<int, int>& pids) {
  for (const auto& [lr, pid] : pids) {
    if (::access(layout::ResumeFile(attempt_dir, lr).c_str(), F_OK) != 0)
      return false;
  }
  return true;
}

void ForgetRound(const std::string& attempt_dir, int local_rank) {
  ::unlink(RoundFile(attempt_dir, local_rank).c_str());
}

void ForgetRecords(const std::string& attempt_dir,
                   const std::map<int, int>& pids, int replaced) {
  // A survivor's old record would pass for its new one, and the recovery
  // would be reported before it is over.
  for (const auto& [lr, pid] : pids)
    ::unlink(layout::ResumeFile(attempt_dir, lr).c_str());
  if (replaced >= 0) ::unlink(ReadyFile(attempt_dir, replaced).c_str());
}

// First the claim of an attempt's first replacement, then, when the key
// holds another's, the next after an idle one's. The value names the node
// (`who`): a compare-and-set answers the value it finds, which is the one
// asked for when another node asked for the same.
int Claim(rendezvous::Store* store, int current, const std::string& who) {
  using rendezvous::in_place::kClaimKey;
  if (!store) return -1;
  auto busy = [&](int attempt) {
    return "busy " + std::to_string(attempt) + " " + who;
  };
  auto seen = store->CompareSet(kClaimKey, "", busy(current + 1));
  if (seen.ok() && *seen == busy(current + 1)) return current + 1;
  int idle = -1;
  if (seen.ok() && std::sscanf(seen->c_str(), "idle %d", &idle) == 1) {
    auto claimed = store->CompareSet(kClaimKey, *seen, busy(idle + 1));
    if (claimed.ok() && *claimed == busy(idle + 1)) return idle + 1;
    if (!claimed.ok()) seen = claimed;
  }
  if (!seen.ok())
    Logger("dtrun.agent")
        ->error("in-place recovery: the workers' store: {}",
                seen.status().message());
  return -1;
}

bool Announce(rendezvous::Store* store, int restart_count, int rank) {
  Status s = store ? store->Set(rendezvous::in_place::RegroupKey(restart_count),
                                std::to_string(rank))
                   : Status::Unavailable("no connection to the workers' store");
  if (!s.ok())
    Logger("dtrun.agent")->error("in-place recovery: {}", s.message());
  return s.ok();
}

void Release(rendezvous::Store* store, int restart_count) {
  if (!store) return;
  Status s = store->Set(rendezvous::in_place::kClaimKey,
                        "idle " + std::to_string(restart_count));
  if (!s.ok())
    Logger("dtrun.agent")->warn("in-place recovery: {}", s.message());
}

void RemoveStaged(const LaunchConfig& config, int master_port) {
  if (config.restart != RestartMode::kInPlace || master_port <= 0) return;
  const std::string prefix = rendezvous::in_place::StagePrefix(master_port);
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  while (dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0)
      ::shm_unlink(("/" + name).c_str());
  }
  ::closedir(dir);
}

void SayReplacing(int lr, int rank, int restart_count, int max_restarts,
                  int others) {
  Logger("dtrun.agent")
      ->warn(
          "replacing worker local_rank {} (rank {}) in place: attempt {} of "
          "{}; the other {} worker(s) keep running",
          lr, rank, restart_count + 1, max_restarts + 1, others);
}

void SayReplaced(int lr, int pid, int restart_count, bool warm) {
  Logger("dtrun.agent")
      ->info("attempt {}: replaced local_rank {} with pid {}{}", restart_count,
             lr, pid, warm ? " (from the standby)" : "");
}

}  // namespace dtrun::agent::in_place
