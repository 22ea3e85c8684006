#pragma once

// The standby of Python workers (--standby-import): one process per node
// that has imported torch and the modules the user named, and forks a
// worker when dtrun asks, so a restarted worker skips seconds of imports.
// The Python side is apps/dtrun/python/dtrun_standby/dtrun_standby.py,
// which says how the worker is made; this is dtrun's end of their socket,
// whose messages rendezvous/standby_protocol.h spells.
// A native program on dtrun's lib is its own standby (--standby): started
// as the workers are, with DTRUN_STANDBY_FD, it serves the same requests
// from main() (lib/standby_worker.h), libtorch loaded.
//
// Workers it forks become dtrun's children (dtrun is a child subreaper once
// a standby starts), so PosixWorkerGroup reaps and signals them as its own.
// Every failure (an import that fails, threads or CUDA after the imports, a
// worker the standby cannot make, the standby gone) is a Status saying why;
// the group then starts workers cold.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "apps/dtrun/clock.h"
#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/signals.h"
#include "apps/dtrun/worker_env.h"
#include "apps/dtrun/worker_group.h"
#include "rendezvous/util/status.h"

namespace dtrun::agent {

struct StandbyPlan {
  std::string interpreter;  // the workers' --python interpreter
  // A native standby: the worker's own command; empty for Python's.
  std::vector<std::string> argv;
  std::string dir;                   // where dtrun_standby.py is written
  std::vector<std::string> modules;  // --standby-import
  std::vector<std::string> env;      // "K=V": what every worker has
  std::string log_file;              // the standby's stdout and stderr
};

// How long a restarted worker on a node alone waits for a standby still
// starting (StandbyWait).
constexpr std::chrono::milliseconds kStandbyWaitAlone{20000};

class Standby {
 public:
  // Writes the standby's file and starts it; its imports then run while
  // dtrun goes on.
  static Result<std::unique_ptr<Standby>> Start(const StandbyPlan& plan);
  ~Standby();
  Standby(const Standby&) = delete;
  Standby& operator=(const Standby&) = delete;

  // Whether its imports are done; never blocks (a wait for it polls fd()).
  // An error: it refused (an import failed, threads or CUDA after them) or
  // died, and why.
  Result<bool> Ready();
  // Whether Ready() said so already.
  bool ready() const { return ready_; }
  // Forks the worker `spec` describes, with `out_fd` and `err_fd` as its
  // stdout and stderr; its pid (a child of this process), or why not.
  Result<int> Fork(const WorkerSpec& spec, int out_fd, int err_fd);

  int pid() const { return pid_; }
  // Its socket: readable when Ready() has news.
  int fd() const { return sock_; }
  // The group reaped the standby's own exit (its pid is no longer ours).
  void OnExited() { exited_ = true; }
  // Seconds its imports (a native one: its start) took, once ready.
  double import_seconds() const { return import_seconds_; }
  // The flag that asked for it, for what the log says of it.
  const char* flag() const {
    return native_ ? "--standby" : "--standby-import";
  }
  bool native() const { return native_; }
  // How long a restart may wait for it to be ready (StandbyWait).
  std::chrono::milliseconds restart_wait() const { return restart_wait_; }
  void set_restart_wait(std::chrono::milliseconds wait) {
    restart_wait_ = wait;
  }

 private:
  Standby(int pid, int sock, std::string log_file, bool native)
      : pid_(pid),
        sock_(sock),
        log_file_(std::move(log_file)),
        native_(native) {}
  Result<std::string> Receive(std::chrono::milliseconds limit);

  int pid_;
  int sock_;
  std::string log_file_;
  bool native_;
  bool ready_ = false;
  bool exited_ = false;
  double import_seconds_ = 0;
  std::chrono::milliseconds restart_wait_ = kStandbyWaitAlone;
};

// How long a restart waits for a standby still starting before its workers
// start cold: what the standby has left is less than a cold start. Output
// and signals are handled meanwhile (LocalGroup::AwaitStandby), but not the
// beats to other nodes: with peers at most half the keep-alive interval,
// alone 20 s. Once per standby: a restart that started cold does not wait
// again.
std::chrono::milliseconds StandbyWait(const LaunchConfig& config);

// Workers started again whose standby is still starting wait for it a
// while (StandbyWait) and then start cold, but not deaf: their output goes
// on being forwarded, and a signal other than SIGCHLD ends the wait at
// once. The signals read meanwhile go to `deferred`, for the group's loop
// to handle once the workers are started. `signals` may be null.
void AwaitWarmStandby(WorkerGroup* workers, SignalFd* signals,
                      const Clock* clock, const std::vector<int>& handled,
                      std::vector<int>* deferred);

// The job's standby (--standby-import, or --standby for a program on
// dtrun's lib), its files in `run_dir`, its
// environment `base_env` and what every worker adds; nullptr, said in the
// log, when it cannot start (the workers then start cold, as without it).
std::unique_ptr<Standby> StartStandby(const LaunchConfig& config,
                                      const EnvMap& base_env,
                                      const std::string& run_dir);

}  // namespace dtrun::agent
