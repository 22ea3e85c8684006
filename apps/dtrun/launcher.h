#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/dtrun/agent.h"
#include "apps/dtrun/error_report.h"
#include "apps/dtrun/file_timer.h"
#include "apps/dtrun/hang_monitor.h"
#include "apps/dtrun/hang_report.h"
#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/log_mux.h"
#include "apps/dtrun/process_spawner.h"
#include "apps/dtrun/signals.h"
#include "apps/dtrun/worker_env.h"

#include "rendezvous/rendezvous.h"

namespace dtrun::rdzv {
class StoreServer;
class TcpStoreClient;
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

  // Called once the single-node store listens (with several nodes: once the
  // rendezvous store is reached) and the run folder exists, before any worker
  // starts (the interactive session hands the address to its console).
  using StoreReady =
      std::function<void(const std::string& host, uint16_t port, const std::string& run_dir)>;
  StoreReady on_store_ready;

 private:
  // How the local group's latest round ended (multi-node).
  enum class Outcome { kRunning, kSucceeded, kFailed, kStopped, kSignaled };

  int RunSingleNode();
  int RunMultiNode();
  Status ConnectRendezvous();
  Status SetUpWorkerStore();
  int JoinFailed(const Status& status);
  int FollowRound();
  void Linger();
  void StopGroupAndWait();
  bool Interrupted();
  void PollOnce(int timeout_ms);
  Status StartStore();
  Status MakeRunDir();
  void Apply(const std::vector<Action>& actions);
  void StartGroup(int restart_count);
  void OnSignals();
  void Finish(const Action& finish);
  int ReportFailure();
  void Drain();
  StreamRoute Route(int local_rank, int stream_bit, const std::string& attempt_dir);
  // Hangs (launcher_hang.cc): heartbeat files, stacks, the hang report.
  void AddHangEnv(int local_rank, const std::string& attempt_dir, EnvMap* env);
  void AddWatchEnv(int local_rank, const std::string& attempt_dir, EnvMap* env);
  int NextHangCheckMs() const;
  void CheckHeartbeats();
  void DeclareHang(TimePoint now);
  bool PythonWorkers() const;
  void CaptureNativeStacks();
  void ReportHang();
  void ReadPendingOutput();
  void AbandonSurvivors();
  std::vector<WorkerFailure> HangFailures() const;
  bool KeepsStderr() const;
  void OpenTimerPipe();
  void ReadTimerPipe();
  void CheckTimers();
  int NextTimerMs() const;
  void DescribeTimerExpiry(WorkerFailure* f);

  LaunchConfig config_;
  ProcessSpawner* spawner_;
  const Clock* clock_;
  Agent agent_;
  SignalFd signals_;
  LogMux mux_;
  std::unique_ptr<rdzv::StoreServer> store_;         // single node: the only store
  std::unique_ptr<rdzv::StoreServer> rdzv_store_;    // multi-node: hosted rendezvous store
  std::unique_ptr<rdzv::StoreServer> worker_store_;  // multi-node, group rank 0: this round's
  std::unique_ptr<rdzv::TcpStoreClient> rdzv_client_;
  std::unique_ptr<rdzv::Rendezvous> rdzv_;
  rdzv::Assignment assignment_;
  Outcome outcome_ = Outcome::kRunning;
  int stop_signal_ = 0;
  EnvMap base_env_;
  AttemptEnv attempt_;
  std::string run_dir_;
  bool run_dir_is_temp_ = false;
  std::map<int, int> pids_;               // local rank -> pid of this attempt
  std::map<int, double> exit_time_;       // pid -> unix seconds its exit was seen
  std::map<int, std::string> spawn_error_;  // local rank -> why exec failed
  bool finished_ = false;
  int exit_code_ = 0;
  HangMonitor hang_;
  std::string attempt_dir_;
  std::map<int, int64_t> beat_mtime_ns_;    // local rank -> heartbeat file's mtime
  TimePoint next_hang_check_{};
  std::vector<RankStack> hang_stacks_;      // the latest hang's ranks
  bool hang_reported_ = true;
  std::map<int, bool> abandoned_;           // pids that outlived SIGKILL
  FileTimers timers_;                       // torch's watchdog, served
  int timer_fd_ = -1;                       // its named pipe, read end
  std::string timer_path_;
  LineSplitter timer_lines_;
  std::map<int, std::string> timer_expired_;  // pid -> scope that expired
};

}  // namespace dtrun::agent
