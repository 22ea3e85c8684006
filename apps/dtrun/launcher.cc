#include "apps/dtrun/launcher.h"

#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "apps/dtrun/error_report.h"
#include "rendezvous/environment.h"
#include "rendezvous/log.h"
#include "rendezvous/store_client.h"
#include "rendezvous/store_server.h"
#include "rendezvous/store_state.h"

namespace dtrun::agent {
namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string RandomHex(int digits) {
  std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < digits; ++i) out += kHex[rng() % 16];
  return out;
}

bool MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      partial = path.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  }
  return true;
}

void RemoveTree(const std::string& path) {
  nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

HangOptions HangOptionsOf(const LaunchConfig& c) {
  using std::chrono::milliseconds;
  milliseconds first = c.hang_first_beat;
  if (first.count() == 0) first = std::max(milliseconds(60000), 10 * c.hang_timeout);
  return HangOptions{c.hang_timeout, first};
}

std::string Hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, with ${role_name}, ${rank} and
// ${local_rank}; default "[rank${rank}]:".
std::string LinePrefix(const std::string& role, int rank, int local_rank) {
  const char* env = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  std::string out = env ? env : "[rank${rank}]:";
  auto replace = [&out](const std::string& key, const std::string& value) {
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + value.size())) {
      out.replace(at, key.size(), value);
    }
  };
  replace("${role_name}", role);
  replace("${rank}", std::to_string(rank));
  replace("${local_rank}", std::to_string(local_rank));
  return out;
}

}  // namespace

Launcher::Launcher(const LaunchConfig& config, ProcessSpawner* spawner, const Clock* clock)
    : config_(config),
      spawner_(spawner),
      clock_(clock),
      // With rendezvous, restarts are counted by the rendezvous, the same
      // on every node; the local agent only reports that its group failed.
      agent_(AgentOptions{config.nproc_per_node,
                          config.uses_rendezvous() ? 0 : config.max_restarts,
                          config.term_timeout}),
      hang_(HangOptionsOf(config)) {}

Launcher::~Launcher() {
  if (store_) store_->Stop();
}

Status Launcher::StartStore() {
  rdzv::StoreServerOptions opts;
  opts.host = config_.master_addr;
  uint16_t port = config_.master_port.value_or(0);
  if (config_.standalone) port = 0;
  opts.port = port;
  auto server = rdzv::StoreServer::Start(opts);
  if (!server.ok()) return server.status();
  store_ = std::move(*server);
  store_->RunInBackground();
  attempt_.master_addr = config_.master_addr;
  attempt_.master_port = store_->port();
  return Status::Ok();
}

Status Launcher::MakeRunDir() {
  std::string name = attempt_.run_id + "_" + RandomHex(8);
  if (config_.log_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/dtrun-" + name + "-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) {
      return Status::Io("cannot create a temporary log folder '" + templ + "': " +
                        std::strerror(errno) + "; set TMPDIR or --log-dir");
    }
    run_dir_ = buf.data();
    run_dir_is_temp_ = true;
  } else {
    run_dir_ = config_.log_dir + "/" + name;
    if (!MakeDirs(run_dir_)) {
      return Status::Io("--log-dir: cannot create '" + run_dir_ + "': " + std::strerror(errno));
    }
  }
  // Python workers get the torch compatibility shim (worker_env.h), once per run.
  if (config_.python_worker) return InstallTorchShim(run_dir_ + "/python", &base_env_);
  return Status::Ok();
}

int Launcher::Run() {
  attempt_.run_id = config_.standalone ? RandomHex(12) : config_.rdzv_id;
  attempt_.role = config_.role;
  attempt_.max_restarts = config_.max_restarts;
  assignment_.world_size = config_.nproc_per_node;
  base_env_ = ProcessEnvironment();
  config_.file_timer = base_env_.count("TORCHELASTIC_ENABLE_FILE_TIMER") &&
                       base_env_["TORCHELASTIC_ENABLE_FILE_TIMER"] == "1";
  if (base_env_.count("TORCHELASTIC_TIMER_FILE")) config_.timer_file = base_env_["TORCHELASTIC_TIMER_FILE"];
  if (config_.nproc_per_node > 1 && !base_env_.count("OMP_NUM_THREADS")) {
    Logger("dtrun.agent")->warn("setting OMP_NUM_THREADS=1 for each worker to avoid "
                                "overloading the host; set it yourself to tune");
  }
  int rc = config_.uses_rendezvous() ? RunMultiNode() : RunSingleNode();
  Drain();
  if (rc == 0 && run_dir_is_temp_) RemoveTree(run_dir_);
  return rc;
}

int Launcher::RunSingleNode() {
  auto log = Logger("dtrun.agent");
  Status s = StartStore();
  if (!s.ok()) {
    log->error("{}", s.message());
    return 3;
  }
  s = MakeRunDir();
  if (!s.ok()) {
    log->error("{}", s.message());
    return 2;
  }
  log->info("store at {}:{}; run id {}; {} worker(s) of {}; logs in {}", attempt_.master_addr,
            attempt_.master_port, attempt_.run_id, config_.nproc_per_node,
            config_.entrypoint[0], run_dir_);
  if (on_store_ready) on_store_ready(attempt_.master_addr, attempt_.master_port, run_dir_);
  Apply(agent_.Start(clock_->Now()));
  while (!finished_) PollOnce(-1);
  return exit_code_;
}

void Launcher::PollOnce(int timeout_ms) {
  std::vector<pollfd> fds = {{signals_.fd(), POLLIN, 0}};
  for (int fd : mux_.fds()) fds.push_back({fd, POLLIN, 0});
  if (timer_fd_ >= 0) fds.push_back({timer_fd_, POLLIN, 0});
  int timeout = timeout_ms;
  if (auto deadline = agent_.deadline()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - clock_->Now());
    int until = static_cast<int>(std::max<int64_t>(0, left.count()) + 1);
    timeout = timeout < 0 ? until : std::min(timeout, until);
  }
  for (int check : {NextHangCheckMs(), NextTimerMs()}) {
    if (check >= 0) timeout = timeout < 0 ? check : std::min(timeout, check);
  }
  int n = poll(fds.data(), fds.size(), timeout);
  if (n < 0) return;
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents && fds[i].fd == timer_fd_) {
      ReadTimerPipe();
    } else if (fds[i].revents) {
      mux_.OnReadable(fds[i].fd);
    }
  }
  if (fds[0].revents) OnSignals();
  if (!finished_) Apply(agent_.OnTick(clock_->Now()));
  if (!finished_) CheckHeartbeats();
  if (!finished_) CheckTimers();
}

void Launcher::OnSignals() {
  for (int signo : signals_.Read()) {
    if (signo != SIGCHLD) {
      Logger("dtrun.agent")->warn("received {}; stopping workers", SignalName(signo));
      Apply(agent_.OnSignal(signo, clock_->Now()));
      continue;
    }
    for (const WorkerExit& e : spawner_->Reap()) {
      if (abandoned_.erase(e.pid)) continue;  // counted as gone already
      exit_time_[e.pid] = UnixNow();
      hang_.OnExit(e.local_rank);
      if (e.failed() && agent_.phase() == Phase::kRunning) {
        std::string how = e.signal ? SignalName(e.signal) : "exit code " + std::to_string(e.exit_code);
        Logger("dtrun.agent")->warn("worker local_rank {} (pid {}) failed: {}", e.local_rank, e.pid, how);
      }
      Apply(agent_.OnWorkerExit(e, clock_->Now()));
    }
  }
}

void Launcher::Apply(const std::vector<Action>& actions) {
  for (const Action& a : actions) {
    if (a.kind != Action::Kind::kSignalGroup && agent_.hung()) ReportHang();
    switch (a.kind) {
      case Action::Kind::kAbandonGroup:
        AbandonSurvivors();
        break;
      case Action::Kind::kStartGroup:
        StartGroup(a.restart_count);
        break;
      case Action::Kind::kSignalGroup:
        for (const auto& [local_rank, pid] : pids_) spawner_->Signal(pid, a.signo);
        break;
      case Action::Kind::kFinish:
        if (rdzv_) {  // multi-node: the rendezvous decides what happens next
          outcome_ = a.signo ? Outcome::kSignaled : a.failed ? Outcome::kFailed : Outcome::kSucceeded;
          stop_signal_ = a.signo;
        } else {
          Finish(a);
        }
        break;
      case Action::Kind::kGroupStopped:
        outcome_ = Outcome::kStopped;
        break;
    }
  }
}

StreamRoute Launcher::Route(int local_rank, int stream_bit, const std::string& attempt_dir) {
  StreamRoute route;
  bool redirected = config_.redirects.For(local_rank) & stream_bit;
  // Watching for hangs, stderr is kept too: a Python worker's stack lands there.
  bool teed = (config_.tee.For(local_rank) & stream_bit) || (stream_bit == 2 && KeepsStderr());
  const auto& filter = config_.local_ranks_filter;
  bool shown = filter.empty() || std::find(filter.begin(), filter.end(), local_rank) != filter.end();
  if (!redirected && shown) route.console_fd = stream_bit == 1 ? 1 : 2;
  route.prefix = LinePrefix(config_.role, local_rank, local_rank);
  if (redirected || teed) {
    std::string path = attempt_dir + "/" + std::to_string(local_rank) +
                       (stream_bit == 1 ? "/stdout.log" : "/stderr.log");
    route.file_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  return route;
}

void Launcher::StartGroup(int restart_count) {
  auto log = Logger("dtrun.agent");
  if (restart_count > 0 && store_) {
    // A fresh key space: >= 2.x workers use no per-attempt prefix, so keys of
    // the failed attempt (e.g. a stale NCCL unique id) must not survive.
    // (With rendezvous, each round has a new store instead.)
    store_->WithState([](rdzv::StoreState& state) { state.Clear(); });
  }
  if (restart_count > 0 && !rdzv_) {
    log->warn("restarting the worker group: attempt {} of {}", restart_count + 1,
              config_.max_restarts + 1);
  }
  attempt_.restart_count = restart_count;
  std::string attempt_dir = run_dir_ + "/attempt_" + std::to_string(restart_count);
  attempt_.error_file_dir = attempt_dir;
  attempt_dir_ = attempt_dir;
  OpenTimerPipe();
  pids_.clear();
  spawn_error_.clear();
  int n = config_.nproc_per_node;
  std::string pid_list;
  for (int lr = 0; lr < n; ++lr) {
    MakeDirs(attempt_dir + "/" + std::to_string(lr));
    ::unlink(ErrorFilePath(attempt_, lr).c_str());
    const rdzv::Assignment& a = assignment_;
    WorkerPlace place{lr, a.base_rank + lr, a.group_rank, a.base_rank + lr,
                      n, a.world_size, a.group_world_size, a.world_size};
    WorkerSpec spec;
    spec.local_rank = lr;
    spec.argv = config_.worker_argv;
    EnvMap env = WorkerEnv(base_env_, attempt_, place);
    AddWatchEnv(lr, attempt_dir, &env);
    spec.env = ToEnvStrings(env);
    int out[2], err[2];
    pipe2(out, O_CLOEXEC | O_NONBLOCK);
    pipe2(err, O_CLOEXEC | O_NONBLOCK);
    spec.stdout_fd = out[1];
    spec.stderr_fd = err[1];
    Result<int> pid = spawner_->Spawn(spec);
    close(out[1]);
    close(err[1]);
    mux_.Add(out[0], Route(lr, 1, attempt_dir));
    mux_.Add(err[0], Route(lr, 2, attempt_dir));
    if (!pid.ok()) {
      spawn_error_[lr] = pid.status().message();
      log->error("local_rank {}: {}", lr, pid.status().message());
      continue;
    }
    pids_[lr] = *pid;
    pid_list += (pid_list.empty() ? "" : ",") + std::to_string(*pid);
  }
  agent_.OnGroupStarted();
  hang_.Reset(n, clock_->Now());
  beat_mtime_ns_.clear();
  next_hang_check_ = clock_->Now();
  log->info("attempt {}: started {} worker(s), pids {}", restart_count, n, pid_list);
}

void Launcher::Finish(const Action& finish) {
  finished_ = true;
  auto log = Logger("dtrun.agent");
  if (finish.signo) {
    exit_code_ = 128 + finish.signo;
    log->warn("workers stopped after {}; exit code {}", SignalName(finish.signo), exit_code_);
  } else if (finish.failed) {
    exit_code_ = ReportFailure();
  } else {
    log->info("all {} worker(s) succeeded", config_.nproc_per_node);
  }
}

int Launcher::ReportFailure() {
  std::vector<WorkerFailure> failures;
  if (agent_.hung()) failures = HangFailures();
  for (const WorkerExit& e : agent_.failures()) {
    WorkerFailure f;
    f.local_rank = e.local_rank;
    f.rank = assignment_.base_rank + e.local_rank;
    f.pid = e.pid;
    f.exit_code = e.exit_code;
    f.signal = e.signal;
    f.timestamp = exit_time_.count(e.pid) ? exit_time_[e.pid] : UnixNow();
    ReadErrorFile(ErrorFilePath(attempt_, e.local_rank), &f);
    DescribeTimerExpiry(&f);
    if (f.message.empty() && spawn_error_.count(e.local_rank)) f.message = spawn_error_[e.local_rank];
    failures.push_back(f);
  }
  const std::string& program = config_.entrypoint[0];
  std::string summary = FormatFailureSummary(program.substr(program.rfind('/') + 1), Hostname(),
                                             failures, agent_.restart_count() + 1, run_dir_);
  WriteAll(2, summary);
  const WorkerFailure& root = failures[RootCause(failures)];
  if (const char* path = std::getenv("TORCHELASTIC_ERROR_FILE")) {
    std::ofstream(path) << RootCauseJson(root);
  }
  return ExitCodeFor(root);
}

void Launcher::Drain() {
  // Workers are gone, but a grandchild holding a pipe open must not keep
  // dtrun alive: read what is there for up to a second, then close.
  auto until = clock_->Now() + std::chrono::seconds(1);
  while (!mux_.fds().empty() && clock_->Now() < until) {
    std::vector<pollfd> fds;
    for (int fd : mux_.fds()) fds.push_back({fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), 50) <= 0) continue;
    for (const auto& p : fds) {
      if (p.revents) mux_.OnReadable(p.fd);
    }
  }
  mux_.CloseAll();
}

}  // namespace dtrun::agent
