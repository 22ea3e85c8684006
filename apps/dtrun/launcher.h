#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/dtrun/agent.h"
#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/log_mux.h"
#include "apps/dtrun/process_spawner.h"
#include "apps/dtrun/signals.h"
#include "apps/dtrun/worker_env.h"

namespace dtrun::rdzv {
class StoreServer;
}

namespace dtrun::agent {

// The agent's thin shell on one node: hosts the store, turns the Agent's
// actions into processes and signals, and feeds it child exits (SIGCHLD via
// signalfd), stop signals and deadlines from one poll loop. Runs on the
// main thread; the store's event loop runs on a thread of its own.
class Launcher {
 public:
  Launcher(const LaunchConfig& config, ProcessSpawner* spawner, const Clock* clock);
  ~Launcher();

  // Runs the job to the end; returns dtrun's exit code (see README).
  int Run();

 private:
  Status StartStore();
  Status MakeRunDir();
  void Apply(const std::vector<Action>& actions);
  void StartGroup(int restart_count);
  void OnSignals();
  void Finish(const Action& finish);
  int ReportFailure();
  void Drain();
  StreamRoute Route(int local_rank, int stream_bit, const std::string& attempt_dir);

  LaunchConfig config_;
  ProcessSpawner* spawner_;
  const Clock* clock_;
  Agent agent_;
  SignalFd signals_;
  LogMux mux_;
  std::unique_ptr<rdzv::StoreServer> store_;
  EnvMap base_env_;
  AttemptEnv attempt_;
  std::string run_dir_;
  bool run_dir_is_temp_ = false;
  std::map<int, int> pids_;               // local rank -> pid of this attempt
  std::map<int, double> exit_time_;       // pid -> unix seconds its exit was seen
  std::map<int, std::string> spawn_error_;  // local rank -> why exec failed
  bool finished_ = false;
  int exit_code_ = 0;
};

}  // namespace dtrun::agent
